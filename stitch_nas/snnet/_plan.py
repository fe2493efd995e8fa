"""SN-Net's configuration set: which stitches join which anchors (Sec. 3.2-3.3).

Anchors are ordered smallest first (by MACs); nearest stitching joins each anchor to the next
only. Anchors of equal depth are paired by sliding windows (kernel 2, stride 1): the stitches a
window adds share one stitching layer. Anchors of unequal depth are matched by nearest
interpolation of the back anchor's cut points onto the front anchor's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stitch_nas import adapters
from stitch_nas.activations import StitchContext, zoo_models
from stitch_nas.config import DIRECTIONS, AdapterSpec, Fragment, StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.stitching import model_macs

__all__ = [
    "KERNEL_DEFAULT",
    "STRIDE_DEFAULT",
    "SNStitch",
    "paired_stitching",
    "snnet_stitches",
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
        return adapters.joinable(src, dst)
    return adapters.can_join(adapter.kind, src, dst, adapter.option("resize"))


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
