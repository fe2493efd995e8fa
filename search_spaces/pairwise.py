"""``pairwise``: two zoo models, one cut each (SN-Net / ReStNet style).

The front of one model up to a cut, a least-squares stitch, and the back of another model from a
cut. The sampled ``route`` ("src>dst") fixes which goes first; ``directions`` restricts routes
to ``fast_to_slow`` (start with the model of fewer MACs, SN-Net's choice) and/or
``slow_to_fast`` (start with the larger one, ReStNet's default). Only routes and cuts that one
of the allowed adapters can join are offered, so no trial is spent on an impossible pair. With
``adapters`` beyond ``["lstsq"]``, the adapter kind, rescaling, loss and what trains are search
choices too (see :class:`search_spaces.AdapterChoices`).

Cut parameters: each model has its own cut points, so by default (``cut_params="named"``) the
cuts are categorical parameters named by route (``src_resnet_to_vit``), which leaves ``route``
the only parameter every trial shares. That suits TPE, but NSGA-II crosses over shared
parameters only and mutates each with probability 1 / (their number), so it degenerates into
random search. ``cut_params="depth"`` samples ``src_depth`` and ``dst_depth`` in [0, 1) instead,
the relative position among the route's joinable cuts, shared by every route.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from stitch_nas import adapters as registry
from stitch_nas.activations import StitchContext, zoo_models
from stitch_nas.adapters import joinable
from stitch_nas.config import DIRECTIONS, AdapterSpec, Fragment, StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.fragments import CutPoint
from stitch_nas.stitching import model_macs

from ._adapter_choice import AdapterChoices, can_join, suggest_adapter
from ._registry import register_space

CUT_PARAMS = ("named", "depth")


@register_space("pairwise")
def pairwise(
    trial: optuna.Trial,
    ctx: StitchContext,
    *,
    models: Sequence[str] | None = None,
    directions: Sequence[str] = DIRECTIONS,
    adapter: str = "lstsq",
    adapters: Sequence[str] | None = None,
    resizes: Sequence[str] = registry.RESIZE_MODES,
    losses: Sequence[str] = ("match",),
    trains: Sequence[str] = ("adapter",),
    adapter_options: Mapping[str, Any] | None = None,
    cut_params: str = "named",
) -> StitchConfig:
    """Sample ``A[input:cut_a] -stitch-> B[cut_b:output]`` from two different models.

    Args:
        adapter: the one adapter kind to use, when ``adapters`` is not given.
        adapters, resizes, losses, trains: per-joint choices (see ``AdapterChoices``).
        adapter_options: fixed options of every trained adapter (e.g. ``{"steps": 100}``).
        cut_params: "named" (a categorical per route) or "depth" (relative depth, shared by
            all routes; lets NSGA-II's crossover work, see the module docstring).
    """
    if cut_params not in CUT_PARAMS:
        raise ConfigError(f"unknown cut_params {cut_params!r}; use one of {CUT_PARAMS}")
    choices = AdapterChoices(adapters or (adapter,), resizes, losses, trains, adapter_options)
    names = zoo_models(ctx, models, 2)
    bad = set(directions) - set(DIRECTIONS)
    if bad:
        raise ConfigError(f"unknown direction(s) {sorted(bad)}; use {DIRECTIONS}")
    routes = [r for r in _routes(ctx, names, choices.kinds) if r[2] in directions]
    if not routes:
        raise ConfigError(
            f"no two of {names} can be joined by {list(choices.kinds)} in directions "
            f"{list(directions)}; add CNN models, other adapters, or allow both directions"
        )
    choice = trial.suggest_categorical("route", [f"{src}>{dst}" for src, dst, _ in routes])
    src, dst = choice.split(">")
    trial.set_user_attr("direction", next(r[2] for r in routes if r[:2] == (src, dst)))
    kinds = choices.kinds
    src_cuts = [c for c in ctx.cuts(src) if any(joins(kinds, c, d) for d in ctx.cuts(dst))]
    src_cut = _suggest_cut(trial, cut_params, f"src_{src}_to_{dst}", "src_depth", src_cuts)
    # one parameter per kind of source layout, so each parameter keeps a fixed set of choices
    dst_cuts = [d for d in ctx.cuts(dst) if joins(kinds, src_cut, d)]
    group = _layout_group(src_cut)
    dst_cut = _suggest_cut(trial, cut_params, f"dst_{dst}_from_{group}", "dst_depth", dst_cuts)
    spec = (
        AdapterSpec("lstsq")
        if choices.only_lstsq
        else suggest_adapter(trial, ctx, choices, src_cut, dst_cut, dst)
    )
    return StitchConfig(
        (Fragment(src, None, src_cut.name), Fragment(dst, dst_cut.name, None)), (spec,)
    )


def _routes(
    ctx: StitchContext, names: list[str], kinds: tuple[str, ...] = ("lstsq",)
) -> list[tuple[str, str, str]]:
    """Ordered (source, destination, direction) pairs with at least one joinable cut pair."""
    key = ("pairwise_routes", tuple(names), kinds)
    if key in ctx.memo:
        return ctx.memo[key]
    routes = []
    for src in names:
        for dst in names:
            if src == dst:
                continue
            if not any(joins(kinds, a, b) for a in ctx.cuts(src) for b in ctx.cuts(dst)):
                continue
            fast = (model_macs(ctx, src), src) <= (model_macs(ctx, dst), dst)
            routes.append((src, dst, "fast_to_slow" if fast else "slow_to_fast"))
    ctx.memo[key] = routes
    return routes


def _names(cuts: list[CutPoint]) -> list[str]:
    return [c.name for c in cuts]


def _suggest_cut(
    trial: optuna.Trial, mode: str, name: str, depth_name: str, cuts: list[CutPoint]
) -> CutPoint:
    """One of ``cuts``: by its name, or by a relative depth (equal odds for every cut)."""
    if mode == "named":
        chosen = trial.suggest_categorical(name, _names(cuts))
        return next(c for c in cuts if c.name == chosen)
    depth = trial.suggest_float(depth_name, 0.0, 1.0)
    return cuts[min(int(depth * len(cuts)), len(cuts) - 1)]


def _layout_group(cut: CutPoint) -> str:
    layout = cut.join_layout  # a 1x1 grid joins what a vector joins
    if layout in ("nchw", "nhwc"):
        return "grid"
    return f"tokens{cut.prefix_tokens}" if layout == "tokens" else layout


def joins(kinds: Sequence[str], src: CutPoint, dst: CutPoint) -> bool:
    """Whether any adapter of ``kinds`` can join ``src`` to ``dst``."""
    return any(joinable(src, dst) if k == "lstsq" else can_join(k, src, dst) for k in kinds)
