"""The built-in search spaces' options, declared without torch.

Each space registers under a name declared here, and :func:`._registry.register_space` refuses
one whose keyword options or defaults differ from its declaration. The settings check reads
these through the entry point ``stitch_nas.space_options:builtin``, without importing the
spaces (and so torch): a misspelt space option or a bad list in a YAML file is answered at once.
"""

from __future__ import annotations

from typing import Any

from stitch_nas.adapters import RESIZE_MODES

__all__ = ["ADAPTER_KINDS", "SPACE_OPTIONS", "TRAFT_ADAPTERS"]

#: the adapter kinds a space chooses among (``gap``'s ``adapters``), cheapest first
ADAPTER_KINDS = (
    "lstsq",
    "linear",
    "linear_relu",
    "conv3x3",
    "bottleneck",
    "transformer_block",
    "lowrank",
)
#: the Traft & Cheney kinds (``traft``'s grid)
TRAFT_ADAPTERS = ("linear", "linear_relu", "conv3x3", "bottleneck", "transformer_block")

#: the adapter options of the spaces that stitch by least squares unless told otherwise
_LSTSQ_FIRST = {
    "adapter": "lstsq",
    "adapters": None,
    "resizes": RESIZE_MODES,
    "losses": ("match",),
    "trains": ("adapter",),
    "adapter_options": None,
}

#: every built-in search space: its keyword options and their defaults
SPACE_OPTIONS: dict[str, dict[str, Any]] = {
    "chain": {"models": None, "max_fragments": 3, **_LSTSQ_FIRST},
    "gap": {
        "models": None,
        "model_rule": "any",
        "min_gap": 1,
        "adapters": ADAPTER_KINDS,
        "resizes": RESIZE_MODES,
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
        "end_seeds": True,
        "skips": False,
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
        "adapters": TRAFT_ADAPTERS,
        "resizes": RESIZE_MODES,
        "adapter_options": None,
    },
}
