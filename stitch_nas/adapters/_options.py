"""The built-in adapter kinds' options, declared without torch, and the one reading of a list
of adapters to refine with.

Each built-in kind registers with the options declared here (``register_adapter`` refuses other
options under a built-in name), and the settings check reads them from here, through the lazy
face of :mod:`stitch_nas.adapters`: a misspelt adapter, option or value in a YAML file is
answered before torch loads, by the same declarations the fitting code resolves.
:func:`refined_adapters` reads ``refine_adapters`` against any table of kinds: the
declarations before torch loads, the registry's (:func:`registered_kinds`) when refining.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stitch_nas.errors import ConfigError
from stitch_nas.registry import Option, check_options, choice, integer, number, unknown_name

__all__ = [
    "BUILTIN_KINDS",
    "CLS_MODES",
    "INIT_MODES",
    "LOSSES",
    "RESIZE_MODES",
    "TRAINS",
    "TRAIN_OPTIONS",
    "KindOptions",
    "refined_adapter",
    "refined_adapters",
]

RESIZE_MODES = ("bilinear", "none", "integrated")
CLS_MODES = ("fold", "drop")
INIT_MODES = ("lstsq", "identity", "random")
LOSSES = ("none", "match", "task", "distill", "feature")
TRAINS = ("adapter", "suffix", "all")

#: how every trained kind is initialised and trained (read by the fitting code)
TRAIN_OPTIONS: dict[str, Option] = {
    "init": choice("lstsq", *INIT_MODES),
    "ridge": number(None, 0.0, optional=True),
    "loss": choice("match", *LOSSES),
    "train": choice("adapter", *TRAINS),
    "temperature": Option(
        1.0,
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf,
        "a number > 0 (distill's softening temperature)",
    ),
    "teacher": Option(
        "destination",
        lambda v: isinstance(v, str) and bool(v),
        "'destination', 'best' or a zoo model name (distill's teacher)",
    ),
    "steps": integer(200, 1),
    "seconds": number(None, 0.0, optional=True),
    "lr": number(2e-3, 0.0),
    "weight_decay": number(0.05, 0.0),
    "batch_size": integer(64, 1),
    "patience": integer(5, 0),
    "eval_every": integer(20, 1),
    "split": choice("train", "train", "probe"),
    "device": Option(
        "auto", lambda v: isinstance(v, str), "'auto' or a device name ('cpu', 'cuda')"
    ),
    "seed": integer(0, 0),
}

#: the Traft & Cheney kinds: layout conversion and norms around the body, then training
_COMMON_OPTIONS: dict[str, Option] = {
    "resize": choice("bilinear", *RESIZE_MODES, structural=True),
    "norm": choice("batch", "batch", "layer", "none", structural=True),
    "cls": choice("fold", *CLS_MODES, structural=True),
    "pos": choice("learned", "learned", "none", structural=True),
    **TRAIN_OPTIONS,
}

_BOTTLENECK_OPTIONS = {
    **_COMMON_OPTIONS,
    "width": integer(None, 1, optional=True, structural=True),
}

_BLOCK_OPTIONS = {
    **_COMMON_OPTIONS,
    "heads": integer(None, 1, optional=True, structural=True),
    "mlp_ratio": number(4.0, 0.25, structural=True),
}

#: a usual LoRA rank; the seed papers give none for SN-Netv2's or ESTA's stitches
_DEFAULT_RANK = 8

_LOWRANK_OPTIONS = {
    **TRAIN_OPTIONS,
    "rank": integer(_DEFAULT_RANK, 1, structural=True),
    "resize": choice("bilinear", *RESIZE_MODES, structural=True),
    # the base is the least-squares map by definition; other inits have no meaning here
    "init": choice("lstsq", "lstsq"),
    "loss": choice("task", *LOSSES),
}

_LSTSQ_OPTIONS = {
    "ridge": number(None, 0.0, optional=True),
    "fuse": Option(False, lambda v: isinstance(v, bool), "true or false"),
}


@dataclass(frozen=True)
class KindOptions:
    """An adapter kind's options and whether it trains: what a built-in kind declares, and
    what ``registered_kinds`` gives for every registered kind."""

    options: Mapping[str, Option]
    trainable: bool = True


#: every built-in adapter kind, by name
BUILTIN_KINDS: dict[str, KindOptions] = {
    "lstsq": KindOptions(_LSTSQ_OPTIONS, trainable=False),
    "linear": KindOptions(_COMMON_OPTIONS),
    "linear_relu": KindOptions(_COMMON_OPTIONS),
    "conv3x3": KindOptions(_COMMON_OPTIONS),
    "bottleneck": KindOptions(_BOTTLENECK_OPTIONS),
    "transformer_block": KindOptions(_BLOCK_OPTIONS),
    "lowrank": KindOptions(_LOWRANK_OPTIONS),
}


def refined_adapters(
    specs: Any, kinds: Mapping[str, KindOptions], where: str
) -> list[tuple[str, dict[str, Any]]]:
    """``specs``, a non-empty list of ``{"kind": ..., **options}`` mappings of trained kinds,
    checked against ``kinds`` (the kind, then the options' names and values): each as its kind
    and given options. Every error is one line naming ``where[i]``."""
    if not isinstance(specs, (list, tuple)) or not specs:
        raise ConfigError(
            f"{where}={specs!r}: give a non-empty list of adapters, e.g. [{{kind: linear}}]"
        )
    return [refined_adapter(spec, kinds, f"{where}[{i}]") for i, spec in enumerate(specs)]


def refined_adapter(
    spec: Any, kinds: Mapping[str, KindOptions], where: str
) -> tuple[str, dict[str, Any]]:
    """One item of :func:`refined_adapters`."""
    if not isinstance(spec, Mapping) or not isinstance(spec.get("kind"), str):
        raise ConfigError(f"{where}={spec!r}: give a mapping with a kind, e.g. {{kind: lowrank}}")
    name = spec["kind"]
    if name not in kinds:
        raise unknown_name("adapter", name, kinds)
    kind = kinds[name]
    if not kind.trainable or "loss" not in kind.options:
        raise ConfigError(
            f"{where}.kind={name!r} does not train; use a trained kind such as lowrank, "
            "linear or conv3x3"
        )
    options = {k: v for k, v in spec.items() if k != "kind"}
    check_options(kind.options, options, f"adapter {name!r}")
    return name, options
