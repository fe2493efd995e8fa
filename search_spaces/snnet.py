"""``snnet``: SN-Net's stitching configuration set (Pan et al., seed 001, Sec. 3.2-3.3).

**Anchors.** SN-Net stitches pretrained models of one family that differ in size (DeiT-Ti/S/B).
A zoo rarely holds a family, and the embedded one holds one model per architecture, so here the
anchors are an ordered list the user gives (``anchors=[...]``, e.g. three widths of one
family); by default, every zoo model ordered by MACs, smallest first.

**Stitches** (Sec. 3.2): with *nearest stitching* (the default) only neighbouring anchors in that
order are stitched; each pair goes *fast-to-slow* (the smaller anchor first, SN-Net's default)
or slow-to-fast. An anchor's "layers" are its cut points. With equal depths (*paired*), cut
points are grouped in sliding windows of ``kernel`` cuts moved by ``stride`` (SN-Net's defaults
``kernel=2``, ``stride=1``, Sec. 4): inside a window, every cut of the front anchor may feed every
cut of the back anchor, and the window shares one stitching layer. With unequal depths
(*unpaired*), the back anchor's cuts are mapped onto the front anchor's by nearest
interpolation, and cut ``i`` of the front feeds each back cut mapped to ``i`` (one stitching
layer per front cut). Pairs no adapter can join (e.g. a ViT token cut into a CNN map with
least squares) are left out.

**Stitching layer**: least-squares initialised (SN-Net Sec. 3.2's default); ``adapter="lstsq"``
evaluates each stitch at its least-squares solution ("LS Init", SN-Net Fig. 8), ``"linear"``
(a 1x1 conv, as in SN-Net) trains it afterwards per stitch, on its own.

**Joint training** (SN-Net Alg. 1): ``joint={...}`` (or ``joint=True`` for the defaults) trains
all stitching layers, and by default the anchors, together as one network, drawing a random
stitch at every step (:mod:`stitch_nas.snnet`); stitches with the same ``SNStitch.layer``
share a stitching layer. The space then samples stitches of that trained SN-Net; it is trained
once per search, on the first trial that needs it. ``train_snnet`` is the same as a procedure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import optuna

from stitch_nas.activations import StitchContext
from stitch_nas.config import AdapterSpec, StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.snnet import (
    KERNEL_DEFAULT,
    STRIDE_DEFAULT,
    SNStitch,
    joint_spec,
    joint_stitches,
    paired_stitching,
    snnet_stitches,
    train_snnet,
    unpaired_stitching,
)

from ._procedure import memoised
from ._registry import register_space

__all__ = [
    "SNStitch",
    "paired_stitching",
    "snnet_stitches",
    "train_snnet",
    "unpaired_stitching",
]


@register_space("snnet")
def snnet(
    trial: optuna.Trial,
    ctx: StitchContext,
    *,
    anchors: Sequence[str] | None = None,
    kernel: int = KERNEL_DEFAULT,
    stride: int = STRIDE_DEFAULT,
    nearest: bool = True,
    direction: str = "fast_to_slow",
    adapter: str = "lstsq",
    adapter_options: Mapping[str, Any] | None = None,
    include_anchors: bool = False,
    joint: bool | Mapping[str, Any] | None = None,
) -> StitchConfig:
    """Sample one stitch of SN-Net's configuration set (``snnet_stitch`` = its index).

    Args:
        anchors, kernel, stride, nearest, direction: see :func:`snnet_stitches`.
        adapter: "lstsq" (the least-squares solution alone) or a trained kind such as
            "linear" (SN-Net's 1x1 conv), least-squares initialised and trained per stitch.
        adapter_options: options of a trained stitching layer (e.g. ``{"steps": 100}``).
        include_anchors: also offer each anchor on its own (SN-Net counts them as stitches);
            these are the zoo's models, also with ``joint`` (its fine-tuned anchors are
            ``train_snnet(...).anchor(name)``).
        joint: train every stitch together (SN-Net Alg. 1) with these options of
            :data:`stitch_nas.snnet.JOINT_OPTIONS` (e.g. ``{"steps": 300}``; True: the
            defaults); the stitching layer is then SN-Net's 1x1 conv, set by ``joint``'s
            ``norm`` / ``resize``, so ``adapter`` must stay "lstsq" and ``adapter_options`` unset.
    """
    if joint:
        if adapter != "lstsq" or adapter_options:
            raise ConfigError(
                "snnet with joint training uses SN-Net's 1x1 conv stitching layer; set its "
                "options in joint (norm, resize, ...), not adapter / adapter_options"
            )
        configs = _joint_configs(ctx, anchors, kernel, stride, nearest, direction, joint)
        return _pick(trial, ctx, anchors, include_anchors, configs, "joint")
    options = dict(adapter_options or {})
    spec = AdapterSpec(adapter, tuple(sorted(options.items())))
    stitches: list[SNStitch] = memoised(
        ctx,
        snnet_stitches,
        anchors=anchors,
        kernel=kernel,
        stride=stride,
        nearest=nearest,
        direction=direction,
        adapter=spec,
    )
    configs = [s.config for s in stitches]
    return _pick(trial, ctx, anchors, include_anchors, configs, repr(adapter))


def _joint_configs(
    ctx: StitchContext,
    anchors: Sequence[str] | None,
    kernel: int,
    stride: int,
    nearest: bool,
    direction: str,
    joint: bool | Mapping[str, Any],
) -> list[StitchConfig]:
    """The stitches of the SN-Net ``joint`` describes; nothing is trained to list them."""
    given = {} if joint is True else dict(cast(Mapping[str, Any], joint))
    procedure = {"kernel": kernel, "stride": stride, "nearest": nearest, "direction": direction}
    twice = sorted(set(given) & {"anchors", *procedure})
    if twice:
        raise ConfigError(f"set {', '.join(twice)} as options of the snnet space, not inside joint")
    spec = joint_spec(anchors=list(anchors or ()), **procedure, **given)
    stitches: list[SNStitch] = memoised(ctx, joint_stitches, spec=spec)
    return [StitchConfig(s.config.fragments, (spec,)) for s in stitches]


def _pick(
    trial: optuna.Trial,
    ctx: StitchContext,
    anchors: Sequence[str] | None,
    include_anchors: bool,
    configs: list[StitchConfig],
    joined_by: str,
) -> StitchConfig:
    if include_anchors:
        names = anchors or ctx.zoo.names()
        configs = [StitchConfig.single(n) for n in names] + configs
    if not configs:
        raise ConfigError(f"no stitch of anchors {anchors} can be joined by {joined_by}")
    return configs[trial.suggest_int("snnet_stitch", 0, len(configs) - 1)]
