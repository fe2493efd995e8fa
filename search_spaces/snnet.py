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
stitch at every step (:mod:`stitch_nas.snnet_joint`); stitches with the same ``SNStitch.layer``
share a stitching layer. The space then samples stitches of that trained SN-Net; it is trained
once per search, on the first trial that needs it. ``train_snnet`` is the same as a procedure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import optuna

from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from stitch_nas.context import StitchContext
from stitch_nas.errors import ConfigError
from stitch_nas.snnet_joint import joint_stitches, train_snnet
from stitch_nas.snnet_spec import joint_spec

from ._adapter_choice import can_join
from ._procedure import memoised
from ._registry import register_space
from .pairwise import DIRECTIONS, joinable, model_macs, zoo_models

__all__ = [
    "SNStitch",
    "paired_stitching",
    "snnet_stitches",
    "train_snnet",
    "unpaired_stitching",
]

#: SN-Net Sec. 4 "Implementation details": sliding kernel size 2, stride 1 for paired stitching.
KERNEL_DEFAULT, STRIDE_DEFAULT = 2, 1


@dataclass(frozen=True)
class SNStitch:
    """One stitch of the configuration set; stitches with equal ``layer`` share a layer."""

    config: StitchConfig
    front: str
    back: str
    front_cut: int  #: index of the front anchor's cut point
    back_cut: int  #: index of the back anchor's cut point
    layer: int  #: stitching-layer id within the (front, back) pair (window or front cut)


def paired_stitching(depth: int, kernel: int = KERNEL_DEFAULT, stride: int = STRIDE_DEFAULT):
    """``(front_cut, back_cut, window)`` for two anchors of equal depth, by sliding windows.

    A window ``[i, i + kernel)`` moves by ``stride``; every (j, k) inside it not yet listed is
    a stitch, and the stitches a window adds share its stitching layer.
    """
    if kernel < 1 or stride < 1:
        raise ConfigError(f"kernel and stride must be >= 1, got kernel={kernel}, stride={stride}")
    seen: set[tuple[int, int]] = set()
    out: list[tuple[int, int, int]] = []
    window = -1
    for i in range(0, depth, stride):
        ids = range(i, min(i + kernel, depth))
        new = [(j, k) for j in ids for k in ids if (j, k) not in seen]
        if new:
            window += 1
        for pair in new:
            seen.add(pair)
            out.append((*pair, window))
    return out


def unpaired_stitching(front_depth: int, back_depth: int) -> list[tuple[int, int, int]]:
    """``(front_cut, back_cut, layer)`` for unequal depths: back cuts matched by nearest
    interpolation (back cut ``k`` maps to front cut ``floor(k * front_depth / back_depth)``);
    the stitching layer is the front cut's."""
    return [
        (k * front_depth // back_depth, k, k * front_depth // back_depth) for k in range(back_depth)
    ]


def _joins(adapter: AdapterSpec, src: Any, dst: Any) -> bool:
    if adapter.kind == "lstsq":
        return joinable(src, dst)
    return can_join(adapter.kind, src, dst, adapter.option("resize"))


def snnet_stitches(
    ctx: StitchContext,
    *,
    anchors: Sequence[str] | None = None,
    kernel: int = KERNEL_DEFAULT,
    stride: int = STRIDE_DEFAULT,
    nearest: bool = True,
    direction: str = "fast_to_slow",
    adapter: AdapterSpec | None = None,
) -> list[SNStitch]:
    """SN-Net's configuration set over ``anchors`` (see the module docstring).

    Args:
        anchors: ordered anchors, smallest first (default: the zoo ordered by MACs).
        kernel, stride: sliding windows of paired stitching (SN-Net: 2 and 1).
        nearest: stitch only neighbouring anchors (SN-Net's nearest stitching); False: all pairs.
        direction: "fast_to_slow" (SN-Net's default: the smaller anchor first) or
            "slow_to_fast".
        adapter: the stitching layer (default: least squares).
    """
    if direction not in DIRECTIONS:
        raise ConfigError(f"unknown direction {direction!r}; use one of {DIRECTIONS}")
    spec = adapter or AdapterSpec("lstsq")
    if anchors:
        names = list(anchors)
        if len(set(names)) != len(names):
            raise ConfigError(f"anchors must be distinct, got {names}")
        zoo_models(ctx, names, 2)  # checks the names
    else:
        names = sorted(zoo_models(ctx, None, 2), key=lambda m: (model_macs(ctx, m), m))
    pairs = [(names[i], names[i + 1]) for i in range(len(names) - 1)]
    if not nearest:
        pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    out: list[SNStitch] = []
    for small, large in pairs:
        front, back = (small, large) if direction == "fast_to_slow" else (large, small)
        cuts_f, cuts_b = ctx.cuts(front), ctx.cuts(back)
        if len(cuts_f) == len(cuts_b):
            plan = paired_stitching(len(cuts_f), kernel, stride)
        else:
            plan = unpaired_stitching(len(cuts_f), len(cuts_b))
        for i, j, layer in plan:
            if not _joins(spec, cuts_f[i], cuts_b[j]):
                continue
            config = StitchConfig(
                (Fragment(front, None, cuts_f[i].name), Fragment(back, cuts_b[j].name, None)),
                (spec,),
            )
            out.append(SNStitch(config, front, back, i, j, layer))
    return out


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
            :data:`stitch_nas.snnet_spec.JOINT_OPTIONS` (e.g. ``{"steps": 300}``; True: the
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
