"""``pairwise``: two zoo models, one cut each (SN-Net / ReStNet style).

The front of one model up to a cut, a least-squares stitch, and the back of another model from a
cut. ``direction`` picks which of the two goes first: ``fast_to_slow`` starts with the model of
fewer MACs (SN-Net's choice), ``slow_to_fast`` with the larger one (ReStNet's default).
"""

from __future__ import annotations

from collections.abc import Sequence

import optuna

from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from stitch_nas.context import StitchContext
from stitch_nas.errors import ConfigError, LayoutError
from stitch_nas.fragments import CutPoint
from stitch_nas.lstsq import check_pair

from ._registry import register_space

DIRECTIONS = ("fast_to_slow", "slow_to_fast")


def model_macs(ctx: StitchContext, name: str) -> int:
    """MACs of one zoo model on its own input size (memoised in the context)."""
    from stitch_nas.measure import fragment_macs

    return fragment_macs(ctx, name, None, None)


def zoo_models(ctx: StitchContext, models: Sequence[str] | None, minimum: int) -> list[str]:
    names = list(models) if models else list(ctx.zoo.names())
    for name in names:
        ctx.entry(name)  # unknown names raise UnknownModelError here
    if len(set(names)) < minimum:
        raise ConfigError(f"this search space needs at least {minimum} models, got {names}")
    return sorted(set(names))


@register_space("pairwise")
def pairwise(
    trial: optuna.Trial,
    ctx: StitchContext,
    *,
    models: Sequence[str] | None = None,
    directions: Sequence[str] = DIRECTIONS,
    adapter: str = "lstsq",
) -> StitchConfig:
    """Sample ``A[input:cut_a] -stitch-> B[cut_b:output]`` from two different models."""
    names = zoo_models(ctx, models, 2)
    bad = set(directions) - set(DIRECTIONS)
    if bad:
        raise ConfigError(f"unknown direction(s) {sorted(bad)}; use {DIRECTIONS}")
    pairs = [f"{a}+{b}" for i, a in enumerate(names) for b in names[i + 1 :]]
    a, b = trial.suggest_categorical("pair", pairs).split("+")
    direction = trial.suggest_categorical("direction", list(directions))
    fast, slow = sorted((a, b), key=lambda n: (model_macs(ctx, n), n))
    src, dst = (fast, slow) if direction == "fast_to_slow" else (slow, fast)
    src_cuts = [c for c in ctx.cuts(src) if any(joinable(c, d) for d in ctx.cuts(dst))]
    src_cut = ctx.cut(src, trial.suggest_categorical(f"src_{src}_to_{dst}", _names(src_cuts)))
    # one parameter per kind of source layout, so each parameter keeps a fixed set of choices
    dst_cuts = [d for d in ctx.cuts(dst) if joinable(src_cut, d)]
    group = _layout_group(src_cut)
    dst_cut = ctx.cut(dst, trial.suggest_categorical(f"dst_{dst}_from_{group}", _names(dst_cuts)))
    return StitchConfig(
        (Fragment(src, None, src_cut.name), Fragment(dst, dst_cut.name, None)),
        (AdapterSpec(adapter),),
    )


def _names(cuts: list[CutPoint]) -> list[str]:
    return [c.name for c in cuts]


def _layout_group(cut: CutPoint) -> str:
    if cut.layout in ("nchw", "nhwc"):
        return "grid"
    return f"tokens{cut.prefix_tokens}" if cut.layout == "tokens" else cut.layout


def joinable(src: CutPoint, dst: CutPoint) -> bool:
    """Whether a least-squares stitch can join these two cut points (see stitch_nas.lstsq)."""
    try:
        check_pair(src, dst)
    except LayoutError:
        return False
    return True
