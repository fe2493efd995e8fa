"""``gap``: keep the start of one model and the end of another (or the same) and bridge the gap.

Traft & Cheney's protocol: cut model A at a shallow cut i, cut model B at a deeper cut j (by
relative depth; in the same model, at least ``min_gap`` cut points later), drop what lies
between, and join the two with an adapter. The adapter kind, spatial rescaling, training loss
and what trains are search choices (see :class:`AdapterChoices`); only combinations that can
join the sampled cuts are offered. Cut parameters are named by route (and source cut) by default;
``cut_params="depth"`` samples relative depths shared by every route instead, as ``pairwise``
does, so that NSGA-II's crossover has parameters every trial shares (see ``pairwise``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from stitch_nas import adapters as registry
from stitch_nas.activations import Memo, StitchContext
from stitch_nas.config import Fragment, StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.fragments import CutPoint

from ._adapter_choice import ADAPTER_KINDS, AdapterChoices, can_join, suggest_adapter
from ._registry import register_space
from ._routes import CUT_PARAMS, suggest_cut
from .pairwise import zoo_models

_MODEL_RULES = ("any", "same", "different")


#: the source cuts of each model pair with a reachable target, by the space's options
_ROUTES: Memo[tuple[Any, ...], dict[str, list[str]]] = Memo("gap routes")


def _targets(
    ctx: StitchContext, src_model: str, src: CutPoint, dst_model: str, min_gap: int, kinds: tuple
) -> list[CutPoint]:
    """Cuts of ``dst_model`` deeper than ``src`` that at least one adapter kind can reach."""
    cuts = ctx.cuts(dst_model)
    if dst_model == src_model:
        deeper = [c for c in cuts if c.index >= src.index + min_gap]
    else:
        deeper = [c for c in cuts if c.depth > src.depth]
    return [c for c in deeper if any(can_join(k, src, c) for k in kinds)]


@register_space("gap")
def gap(
    trial: optuna.Trial,
    ctx: StitchContext,
    *,
    models: Sequence[str] | None = None,
    model_rule: str = "any",
    min_gap: int = 1,
    adapters: Sequence[str] = ADAPTER_KINDS,
    resizes: Sequence[str] = registry.RESIZE_MODES,
    losses: Sequence[str] = ("none", "match", "task"),
    trains: Sequence[str] = registry.TRAINS,
    adapter_options: Mapping[str, Any] | None = None,
    cut_params: str = "named",
) -> StitchConfig:
    """Sample ``A[input:i] -adapter-> B[j:output]`` with j deeper than i.

    Args:
        models: zoo models to take both ends from (default: all).
        model_rule: "any", "same" (A is B: skip blocks of one model) or "different".
        min_gap: in the same model, how many cut points j lies after i at least.
        adapters, resizes, losses, trains: the choices offered per joint.
        adapter_options: fixed options of every trained adapter (e.g. ``{"steps": 100}``).
        cut_params: "named" (categoricals per route and source cut) or "depth" (relative
            depths ``src_depth`` and ``dst_depth``, shared by every route).
    """
    if cut_params not in CUT_PARAMS:
        raise ConfigError(f"unknown cut_params {cut_params!r}; use one of {CUT_PARAMS}")
    if model_rule not in _MODEL_RULES:
        raise ConfigError(f"unknown model_rule {model_rule!r}; use one of {_MODEL_RULES}")
    if min_gap < 1:
        raise ConfigError(f"min_gap must be >= 1 (0 would rebuild model A), got {min_gap}")
    names = zoo_models(ctx, models, 2 if model_rule == "different" else 1)
    choices = AdapterChoices(adapters, resizes, losses, trains, adapter_options)
    routes = _routes(ctx, names, model_rule, min_gap, choices.kinds)
    if not routes:
        raise ConfigError(
            f"no cut of {names} has a deeper cut reachable by {list(choices.kinds)} under "
            f"model_rule={model_rule!r}; allow more adapters or models"
        )
    route = trial.suggest_categorical("route", sorted(routes))
    src_model, dst_model = route.split(">")
    sources = [ctx.cut(src_model, name) for name in routes[route]]
    src = suggest_cut(trial, cut_params, f"src_{route}", "src_depth", sources)
    targets = _targets(ctx, src_model, src, dst_model, min_gap, choices.kinds)
    dst = suggest_cut(trial, cut_params, f"dst_{route}_{src.name}", "dst_depth", targets)
    spec = suggest_adapter(trial, ctx, choices, src, dst, dst_model)
    trial.set_user_attr("gap", [src.depth, dst.depth])
    return StitchConfig(
        (Fragment(src_model, None, src.name), Fragment(dst_model, dst.name)), (spec,)
    )


def _routes(
    ctx: StitchContext, names: list[str], rule: str, min_gap: int, kinds: tuple
) -> dict[str, list[str]]:
    """``"A>B" -> source cuts of A`` that have at least one reachable target cut in B."""

    def find() -> dict[str, list[str]]:
        routes = {}
        for a in names:
            for b in names:
                if (rule == "same" and a != b) or (rule == "different" and a == b):
                    continue
                sources = [c.name for c in ctx.cuts(a) if _targets(ctx, a, c, b, min_gap, kinds)]
                if sources:
                    routes[f"{a}>{b}"] = sources
        return routes

    return _ROUTES.fetch(ctx, (tuple(names), rule, min_gap, kinds), find)
