"""Routes and cuts of the ``pairwise`` space: which ordered model pairs (and, with ``skips``,
which models to themselves) one of the allowed adapters can join, at which cuts, and how a
trial's cut parameters are named so that each keeps a fixed set of choices."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna

from stitch_nas.activations import Memo, StitchContext, zoo_models
from stitch_nas.adapters import joinable
from stitch_nas.config import DIRECTIONS
from stitch_nas.errors import ConfigError
from stitch_nas.fragments import CutPoint
from stitch_nas.stitching import model_macs, piece_roles

from ._adapter_choice import AdapterChoices, can_join

__all__ = [
    "CUT_PARAMS",
    "SKIP",
    "allowed_routes",
    "destination_cuts",
    "destination_param",
    "joins",
    "source_cuts",
    "suggest_cut",
]

CUT_PARAMS = ("named", "depth")
#: the direction of a route from a model to itself (``skips``)
SKIP = "skip"

#: the ordered model pairs a zoo can join, by models and adapter kinds
_ROUTES: Memo[tuple[Any, ...], list[tuple[str, str, str]]] = Memo("pairwise routes")


def allowed_routes(
    ctx: StitchContext,
    models: Sequence[str] | None,
    directions: Sequence[str],
    choices: AdapterChoices,
    cut_params: str,
    skips: bool = False,
) -> list[tuple[str, str, str]]:
    """The routes the space samples from: checked options, at least one route."""
    if cut_params not in CUT_PARAMS:
        raise ConfigError(f"unknown cut_params {cut_params!r}; use one of {CUT_PARAMS}")
    names = zoo_models(ctx, models, 2)
    bad = set(directions) - set(DIRECTIONS)
    if bad:
        raise ConfigError(f"unknown direction(s) {sorted(bad)}; use {DIRECTIONS}")
    wanted = (*directions, SKIP) if skips else tuple(directions)
    routes = [r for r in _routes(ctx, names, choices.kinds) if r[2] in wanted]
    if not routes:
        raise ConfigError(
            f"no two of {names} can be joined by {list(choices.kinds)} in directions "
            f"{list(directions)}; add CNN models, other adapters, or allow both directions"
        )
    return routes


def _routes(
    ctx: StitchContext, names: list[str], kinds: tuple[str, ...] = ("lstsq",)
) -> list[tuple[str, str, str]]:
    """Ordered (source, destination, direction) pairs with at least one joinable cut pair (a
    model to itself too, direction :data:`SKIP`)."""
    return _ROUTES.fetch(ctx, (tuple(names), kinds), lambda: _find_routes(ctx, names, kinds))


def _find_routes(
    ctx: StitchContext, names: list[str], kinds: tuple[str, ...]
) -> list[tuple[str, str, str]]:
    routes = []
    for src in names:
        for dst in names:
            if not source_cuts(ctx, kinds, src, dst):
                continue
            if src == dst:
                routes.append((src, dst, SKIP))
                continue
            fast = (model_macs(ctx, src), src) <= (model_macs(ctx, dst), dst)
            routes.append((src, dst, "fast_to_slow" if fast else "slow_to_fast"))
    return routes


def source_cuts(ctx: StitchContext, kinds: Sequence[str], src: str, dst: str) -> list[CutPoint]:
    """The cuts of ``src`` that some cut of ``dst`` joins (:func:`destination_cuts`)."""
    return [c for c in ctx.cuts(src) if destination_cuts(ctx, kinds, src, c, dst)]


def destination_cuts(
    ctx: StitchContext, kinds: Sequence[str], src: str, src_cut: CutPoint, dst: str
) -> list[CutPoint]:
    """The cuts of ``dst`` that ``src_cut`` joins; in its own model, only those past at least one
    block with weights (a skip of a normalisation layer or an activation is the model itself,
    and in :func:`~stitch_nas.stitching.network_kind`'s terms no block is skipped)."""
    if src != dst:
        return [d for d in ctx.cuts(dst) if joins(kinds, src_cut, d)]
    roles = piece_roles(ctx, src)  # piece i runs from cut i - 1 to cut i
    return [
        d
        for d in ctx.cuts(dst)
        if roles.contributes(range(src_cut.index + 1, d.index + 1)) and joins(kinds, src_cut, d)
    ]


def destination_param(src: str, src_cut: CutPoint, dst: str) -> str:
    """The name of the destination cut's parameter. Each keeps a fixed set of choices, as
    Optuna requires: one per kind of source layout (what joins a grid joins any grid), and per
    source cut in a skip (only cuts deeper than it)."""
    if src == dst:
        return f"dst_{dst}_after_{src_cut.name}"
    return f"dst_{dst}_from_{_layout_group(src_cut)}"


def _names(cuts: list[CutPoint]) -> list[str]:
    return [c.name for c in cuts]


def suggest_cut(
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
