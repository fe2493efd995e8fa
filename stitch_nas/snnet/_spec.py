"""The adapter spec that names one jointly trained SN-Net, and its stitching layer's structure.

A stitch of a jointly trained SN-Net (:mod:`stitch_nas.snnet`) is a StitchConfig whose
one adapter is ``AdapterSpec("snnet", options)``: the options are everything that determines
the SN-Net (anchors, sliding windows, the stitching layer, training), all resolved, so equal
SN-Nets have equal specs. The export loader only needs :func:`joint_layer` from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from stitch_nas import adapters
from stitch_nas.config import AdapterSpec
from stitch_nas.errors import ConfigError
from stitch_nas.fragments import CutPoint
from stitch_nas.registry import Option, check_options, choice, integer, number

__all__ = [
    "JOINT_KIND",
    "JOINT_OPTIONS",
    "LAYER_OPTIONS",
    "joint_layer",
    "joint_spec",
    "resolve_joint_options",
]

JOINT_KIND = "snnet"
#: options of the stitching layer itself (the ``linear`` adapter's structural options)
LAYER_OPTIONS = ("resize", "norm", "cls", "pos")

JOINT_OPTIONS: dict[str, Option] = {
    "anchors": Option(
        "", lambda v: isinstance(v, str), "zoo names joined by commas ('' = the zoo by MACs)"
    ),
    "kernel": integer(2, 1),
    "stride": integer(1, 1),
    "nearest": choice(True, True, False),
    "direction": choice("fast_to_slow", "fast_to_slow", "slow_to_fast"),
    "resize": choice("bilinear", *adapters.RESIZE_MODES),
    "norm": choice("none", "none", "batch", "layer"),
    "cls": choice("fold", *adapters.CLS_MODES),
    "pos": choice("learned", "learned", "none"),
    "train": choice("all", "all", "adapter"),
    # SN-Net distils from a stronger teacher (RegNetY-160 for DeiT); here a zoo model's logits
    "loss": choice("task", "task", "distill"),
    "teacher": Option(
        "best", lambda v: isinstance(v, str) and bool(v), "'best', 'destination' or a zoo name"
    ),
    "temperature": number(1.0, 1e-6),
    "steps": integer(300, 1),
    "lr": number(1e-4, 0.0),
    "anchor_lr_scale": number(1.0, 0.0),
    "weight_decay": number(0.05, 0.0),
    "batch_size": integer(64, 1),
    "seed": integer(0, 0),
}


def resolve_joint_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Every SN-Net joint training option: the given ones, checked, and defaults for the rest."""
    return check_options(JOINT_OPTIONS, options, "SN-Net joint training")


def joint_spec(**options: Any) -> AdapterSpec:
    """The adapter spec naming one SN-Net: every option resolved, so equal nets, equal specs.

    ``anchors`` may be a list of zoo names (stored joined by commas).
    """
    anchors = options.get("anchors")
    if isinstance(anchors, (list, tuple)):
        if any("," in str(a) for a in anchors):
            raise ConfigError(f"anchors {list(anchors)}: a name with a comma cannot be an anchor")
        options["anchors"] = ",".join(anchors)
    return AdapterSpec(JOINT_KIND, tuple(resolve_joint_options(options).items()))


def joint_layer(spec: AdapterSpec, src: CutPoint, dst: CutPoint) -> nn.Module:
    """An unfitted stitching layer of the SN-Net ``spec`` from ``src`` to ``dst``."""
    opts = resolve_joint_options(dict(spec.options))
    return adapters.create("linear", src, dst, **{k: opts[k] for k in LAYER_OPTIONS})
