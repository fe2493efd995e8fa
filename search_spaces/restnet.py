"""``restnet``: ReStNet's stitching-point choice (seed 004, Sec. III-A/B, Alg. 1).

ReStNet computes the CKA between every layer pair of two pretrained models (here: every pair of
cut points, :meth:`StitchContext.cka_matrix`), then takes the pair of highest CKA whose
stitched network fits the parameter budget ``epsilon``: ``Params(front prefix) + Params(S) +
Params(back suffix) <= epsilon`` (Alg. 1 lines 13-24). Defaults from the paper:

- direction ``slow_to_fast``: the front comes from the model of larger capacity (more
  parameters; ReStNet's Sec. III-B "retaining early layers from a larger-capacity model and
  appending deeper layers from a smaller one"), the back from the smaller;
- the stitching layer ``S`` alone is fine-tuned on the task loss, all other weights frozen
  (Sec. III-C "only the stitching layer is fine-tuned"): adapter ``linear`` with
  ``loss="task"``, ``train="adapter"``. The optimiser is the adapters' AdamW (ReStNet used SGD,
  lr 0.01, momentum 0.9, 150 epochs on CIFAR), with the step budget of ``adapter_options``.

The paper gives no default budget; the space samples it as a fraction of the front model's
parameters (``budget_fractions``), so one study spans ReStNet's range of budgets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from stitch_nas import adapters as registry
from stitch_nas.activations import Memo, StitchContext
from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from stitch_nas.errors import BudgetError, ConfigError, LayoutError
from stitch_nas.fragments import count_params

from ._registry import register_space
from .pairwise import DIRECTIONS, joinable, zoo_models

__all__ = ["restnet_select", "restnet_spec", "RESTNET_BUDGET_FRACTIONS"]

#: Budgets the ``restnet`` space offers, as fractions of the front model's parameters
#: (not from the paper, which reports several budgets per model pair).
RESTNET_BUDGET_FRACTIONS = (0.25, 0.5, 0.75, 1.0)


_PARAMS: Memo[tuple[str, str | None, str | None], int] = Memo("fragment parameters")
_JOINS: Memo[tuple[Any, str, str], bool] = Memo("model pairs with a joint")


def restnet_spec(adapter: str = "linear", options: Mapping[str, Any] | None = None) -> AdapterSpec:
    """ReStNet's stitching layer: ``adapter`` trained alone on the task loss (Sec. III-C)."""
    if adapter == "lstsq":
        return AdapterSpec("lstsq")
    options = {"loss": "task", "train": "adapter", **dict(options or {})}
    return AdapterSpec(adapter, tuple(sorted(options.items())))


def _params(ctx: StitchContext, model: str, start: str | None, end: str | None) -> int:
    segment = ctx.segment
    return _PARAMS.fetch(ctx, (model, start, end), lambda: count_params(segment(model, start, end)))


def _joins(spec: AdapterSpec, ctx: StitchContext, a: str, i: int, b: str, j: int) -> int | None:
    """Parameters of the stitching layer from cut i of a to cut j of b; None if it can't join."""
    src, dst = ctx.cuts(a)[i], ctx.cuts(b)[j]
    if spec.kind == "lstsq":
        return src.channels * dst.channels + dst.channels if joinable(src, dst) else None
    structural = {k: v for k, v in spec.options if k not in registry.TRAIN_OPTIONS}
    try:
        return count_params(registry.create(spec.kind, src, dst, **structural))
    except LayoutError:
        return None


def order(ctx: StitchContext, a: str, b: str, direction: str) -> tuple[str, str]:
    """(front, back) of two models: ``slow_to_fast`` puts the one with more parameters first."""
    if direction not in DIRECTIONS:
        raise ConfigError(f"unknown direction {direction!r}; use one of {DIRECTIONS}")
    big, small = sorted((a, b), key=lambda m: (-_params(ctx, m, None, None), m))
    return (big, small) if direction == "slow_to_fast" else (small, big)


def restnet_select(
    ctx: StitchContext,
    front: str,
    back: str,
    *,
    param_budget: float | None = None,
    spec: AdapterSpec | None = None,
) -> StitchConfig:
    """ReStNet's Alg. 1: the highest-CKA cut pair ``front[:i] -S-> back[j:]`` within budget.

    Args:
        front: model whose prefix runs first.
        back: model whose suffix (and classifier) runs last.
        param_budget: ``epsilon``, the most parameters the stitched network may have (None:
            no budget, the best CKA pair overall).
        spec: the stitching layer (default: :func:`restnet_spec`).

    Raises:
        BudgetError: no joinable pair fits the budget (the message names the smallest).
    """
    if front == back:
        raise ConfigError(f"ReStNet stitches two different models, got {front!r} twice")
    spec = spec or restnet_spec()
    matrix = ctx.cka_matrix(front, back)
    cuts_a, cuts_b = ctx.cuts(front), ctx.cuts(back)
    pairs = []
    for i, a in enumerate(cuts_a):
        for j, b in enumerate(cuts_b):
            s_params = _joins(spec, ctx, front, i, back, j)
            if s_params is None:
                continue
            total = _params(ctx, front, None, a.name) + s_params + _params(ctx, back, b.name, None)
            pairs.append((float(matrix[i, j]), total, a.name, b.name))
    if not pairs:
        raise ConfigError(f"no cut of {front!r} can be joined to one of {back!r} by {spec.kind!r}")
    fitting = [p for p in pairs if param_budget is None or p[1] <= param_budget]
    if not fitting:
        smallest = min(p[1] for p in pairs)
        raise BudgetError(
            f"param_budget={param_budget:.4g} is below every {front}->{back} stitch (the "
            f"smallest has {smallest} parameters); raise the budget"
        )
    cka, _, i_name, j_name = max(fitting, key=lambda p: (p[0], -p[1]))
    return StitchConfig((Fragment(front, None, i_name), Fragment(back, j_name, None)), (spec,))


@register_space("restnet")
def restnet(
    trial: optuna.Trial,
    ctx: StitchContext,
    *,
    models: Sequence[str] | None = None,
    direction: str = "slow_to_fast",
    budget_fractions: Sequence[float] = RESTNET_BUDGET_FRACTIONS,
    adapter: str = "linear",
    adapter_options: Mapping[str, Any] | None = None,
) -> StitchConfig:
    """Sample a model pair and a budget; ReStNet picks the stitch (:func:`restnet_select`).

    Args:
        models: zoo models to pair (default: all).
        direction: "slow_to_fast" (ReStNet's default) or "fast_to_slow".
        budget_fractions: parameter budgets offered, as fractions of the front model's
            parameters.
        adapter: the stitching layer kind ("linear" as in ReStNet, or "lstsq": no training).
        adapter_options: fixed options of a trained stitching layer (e.g. ``{"steps": 100}``).
    """
    if not budget_fractions or any(not 0 < f for f in budget_fractions):
        raise ConfigError(f"budget_fractions must be positive numbers, got {budget_fractions}")
    spec = restnet_spec(adapter, adapter_options)
    names = zoo_models(ctx, models, 2)
    pairs = sorted({order(ctx, a, b, direction) for a in names for b in names if a != b})
    feasible = [p for p in pairs if _has_join(ctx, spec, *p)]
    if not feasible:
        raise ConfigError(f"no two of {names} can be joined by {adapter!r}; allow other models")
    front, back = trial.suggest_categorical("pair", [f"{a}>{b}" for a, b in feasible]).split(">")
    fraction = float(trial.suggest_categorical("budget_fraction", list(budget_fractions)))
    budget = fraction * _params(ctx, front, None, None)
    trial.set_user_attr("param_budget", budget)
    try:
        return restnet_select(ctx, front, back, param_budget=budget, spec=spec)
    except BudgetError as exc:  # no network of this pair fits: an infeasible point, not a bug
        raise optuna.TrialPruned(str(exc)) from exc


def _has_join(ctx: StitchContext, spec: AdapterSpec, a: str, b: str) -> bool:
    def joins() -> bool:
        return any(
            _joins(spec, ctx, a, i, b, j) is not None
            for i in range(len(ctx.cuts(a)))
            for j in range(len(ctx.cuts(b)))
        )

    return _JOINS.fetch(ctx, (spec, a, b), joins)
