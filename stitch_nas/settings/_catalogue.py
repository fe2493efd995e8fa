"""The built-in plug-ins' names and options, torch-free, so a bad name answers at once.

Learning them from the registries means importing the plug-ins, and so torch: about 3 s before
a misspelt space or adapter could be reported. This module holds what the built-in plug-ins
register (``tests/test_cli_errors.py`` checks it equals the registries, so a change there
fails a test until it is copied here). When a third-party plug-in is installed (an entry point
the project does not ship), a name missing here may be its, so only the registries can say it
is unknown: the names are then left to :func:`~stitch_nas.pipeline._preflight.check_plugins`.
Option *values* (``steps: -1``) are checked there too, from the options' own definitions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

from stitch_nas.errors import ConfigError, UnknownNameError

__all__ = [
    "ADAPTERS",
    "BUILTIN_ENTRY_POINTS",
    "HEADS",
    "LOSSES",
    "RESIZE_MODES",
    "SPACES",
    "TRAINED",
    "TRAINS",
    "check_builtin_names",
    "check_lists",
    "name_list",
    "third_party_plugins",
]

_RESIZES = ("bilinear", "none", "integrated")
_ALL_ADAPTERS = (
    "lstsq",
    "linear",
    "linear_relu",
    "conv3x3",
    "bottleneck",
    "transformer_block",
    "lowrank",
)
_TRAINED_ADAPTERS = ("linear", "linear_relu", "conv3x3", "bottleneck", "transformer_block")

#: the adapter options of the spaces that stitch by least squares unless told otherwise
_LSTSQ_FIRST = {
    "adapter": "lstsq",
    "adapters": None,
    "resizes": _RESIZES,
    "losses": ("match",),
    "trains": ("adapter",),
    "adapter_options": None,
}

#: every built-in search space: its keyword options and their defaults
SPACES: dict[str, dict[str, Any]] = {
    "chain": {"models": None, "max_fragments": 3, **_LSTSQ_FIRST},
    "gap": {
        "models": None,
        "model_rule": "any",
        "min_gap": 1,
        "adapters": _ALL_ADAPTERS,
        "resizes": _RESIZES,
        "losses": ("none", "match", "task"),
        "trains": ("adapter", "suffix", "all"),
        "adapter_options": None,
        "cut_params": "named",
    },
    "pairwise": {
        "models": None,
        "directions": ("fast_to_slow", "slow_to_fast"),
        **_LSTSQ_FIRST,
        "cut_params": "named",
        "matched_seeds": False,
        "matched_margin": 0.0,
    },
    "restnet": {
        "models": None,
        "direction": "slow_to_fast",
        "budget_fractions": (0.25, 0.5, 0.75, 1.0),
        "adapter": "linear",
        "adapter_options": None,
    },
    "snnet": {
        "anchors": None,
        "kernel": 2,
        "stride": 1,
        "nearest": True,
        "direction": "fast_to_slow",
        "adapter": "lstsq",
        "adapter_options": None,
        "include_anchors": False,
        "joint": None,
    },
    "stitchnet": {
        "models": None,
        "starts": None,
        "K": 2,
        "T": 0.5,
        "L": 16,
        "max_joints": None,
        "same_model_jumps": False,
        "fuse": True,
        "head": "native",
        "k_neighbours": 5,
    },
    "traft": {
        "models": None,
        "scenario": "same",
        "adapters": _TRAINED_ADAPTERS,
        "resizes": _RESIZES,
        "adapter_options": None,
    },
}

_TRAINING = (
    "batch_size",
    "device",
    "eval_every",
    "init",
    "loss",
    "lr",
    "patience",
    "resize",
    "ridge",
    "seconds",
    "seed",
    "split",
    "steps",
    "teacher",
    "temperature",
    "train",
    "weight_decay",
)
_LAYOUT = ("cls", "norm", "pos")

#: every built-in adapter kind: its option names
ADAPTERS: dict[str, tuple[str, ...]] = {
    "bottleneck": tuple(sorted((*_TRAINING, *_LAYOUT, "width"))),
    "conv3x3": tuple(sorted((*_TRAINING, *_LAYOUT))),
    "linear": tuple(sorted((*_TRAINING, *_LAYOUT))),
    "linear_relu": tuple(sorted((*_TRAINING, *_LAYOUT))),
    "lowrank": tuple(sorted((*_TRAINING, "rank"))),
    "lstsq": ("fuse", "ridge"),
    "transformer_block": tuple(sorted((*_TRAINING, *_LAYOUT, "heads", "mlp_ratio"))),
}
#: the built-in kinds that train (``AdapterKind.trainable``)
TRAINED = ("bottleneck", "conv3x3", "linear", "linear_relu", "lowrank", "transformer_block")
HEADS = ("knn", "linear_probe")  #: built-in heads for a new label space
RESIZE_MODES = _RESIZES  #: stitch_nas.adapters.RESIZE_MODES
LOSSES = ("none", "match", "task", "distill", "feature")  #: stitch_nas.adapters.LOSSES
TRAINS = ("adapter", "suffix", "all")  #: stitch_nas.adapters.TRAINS

#: the entry points the project itself declares (pyproject.toml), per group
BUILTIN_ENTRY_POINTS = {
    "stitch_nas.spaces": {"builtin"},
    "stitch_nas.objectives": {"builtin"},
    "stitch_nas.heads": {"builtin"},
    "stitch_nas.networks": {"snnet"},
    "stitch_nas.adapters": set(),
}


def third_party_plugins() -> list[str]:
    """Installed plug-ins the project does not ship (``group:name``), found without importing."""
    return [
        f"{group}:{ep.name}"
        for group, ours in BUILTIN_ENTRY_POINTS.items()
        for ep in entry_points(group=group)
        if ep.name not in ours
    ]


def name_list(key: str, value: Any) -> list[str]:
    """A name or list of names (None: none), else a one-line error."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ConfigError(f"search.space_options.{key}={value!r}: give a name or a list of names")


def check_lists(value: Callable[[str], Any]) -> None:
    """The option lists every built-in space reads the same way (``value(key)``: given, else
    the space's default): resizes, losses, trains."""
    for key, valid in (("resizes", RESIZE_MODES), ("losses", LOSSES), ("trains", TRAINS)):
        bad = sorted(set(name_list(key, value(key))) - set(valid))
        if bad:
            raise ConfigError(
                f"search.space_options.{key}: unknown {bad}; use some of {', '.join(valid)}"
            )


def _unknown(kind: str, name: str, known: Any) -> UnknownNameError:
    """The registry's own message (stitch_nas.registry.Registry.get)."""
    return UnknownNameError(f"unknown {kind} {name!r}; available: {', '.join(sorted(known))}")


def check_builtin_names(search: Any) -> None:
    """Space, space options, head, adapters, adapter options and refine adapters, by name.

    Does nothing when a third-party plug-in is installed (its names are not listed here).
    """
    if third_party_plugins():
        return
    if search.space not in SPACES:
        raise _unknown("search space", search.space, SPACES)
    defaults = SPACES[search.space]
    options = dict(search.space_options)
    unknown = sorted(set(options) - set(defaults))
    if unknown:  # stitch_nas.registry.keyword_options's message
        raise ConfigError(
            f"unknown option(s) {unknown} for search space {search.space!r}; "
            f"valid: {', '.join(defaults)}"
        )

    def value(key: str) -> Any:
        return options[key] if key in options else defaults.get(key)

    head = value("head")
    if isinstance(head, str) and head != "native" and head not in HEADS:
        raise _unknown("head", head, HEADS)
    kinds = name_list("adapters", value("adapters")) or name_list("adapter", value("adapter"))
    for kind in kinds:
        if kind not in ADAPTERS:
            raise _unknown("adapter", kind, ADAPTERS)
    check_lists(value)
    extra = value("adapter_options") or {}
    if not isinstance(extra, Mapping):
        raise ConfigError(f"search.space_options.adapter_options must be a mapping, got {extra!r}")
    for kind in (k for k in kinds if k in TRAINED):  # the spaces pass them to every trained kind
        _check_option_names(kind, extra, "search.space_options.adapter_options")
    if search.refine_trials and isinstance(search.refine_adapters, (list, tuple)):
        for i, spec in enumerate(search.refine_adapters):
            refined = spec.get("kind") if isinstance(spec, Mapping) else None
            if isinstance(refined, str):  # the shape of each entry is checked with its values
                if refined not in ADAPTERS:
                    raise _unknown("adapter", refined, ADAPTERS)
                if refined not in TRAINED:  # stitch_nas.search.refine_adapter's message
                    raise ConfigError(
                        f"search.refine_adapters[{i}].kind={refined!r} does not train; use a "
                        "trained kind such as lowrank, linear or conv3x3"
                    )
                rest = {k: v for k, v in spec.items() if k != "kind"}
                _check_option_names(refined, rest, f"search.refine_adapters[{i}]")


def _check_option_names(kind: str, options: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(options) - set(ADAPTERS[kind]))
    if unknown:  # stitch_nas.registry.check_options's message
        raise ConfigError(
            f"unknown option(s) {unknown} for adapter {kind!r} ({where}); "
            f"valid: {', '.join(ADAPTERS[kind])}"
        )
