"""Multi-fidelity evaluation: a new config is scored on a slice of the validation split first.

Optuna cannot prune a multi-objective trial (``report``/``should_prune`` are single-objective;
its RFC, optuna#3450, is open), so the objective gates itself, with one rule:

    A new config is scored on growing slices of the validation split, each the first images
    of one seeded shuffle of the split (so a slice is a fair sample even of a class-ordered
    split, and every config sees the same images): ``fidelity`` of its images (default 15 %),
    then three times as many, and so on while a slice is at most half the split (15 %, 45 %),
    then the whole split. After each slice, from its k right out of m, the 95 % Wilson
    interval of its accuracy is computed, and each objective is taken at its best over that
    interval (accuracy at the upper end; the costs, MACs and parameters, are known before any
    accuracy pass). If the study has a front (its non-dominated feasible COMPLETE trials, plus
    the zoo's own models within the budgets when the study records them) and a point of it
    dominates that optimistic point, or the config is over a budget, the trial is PRUNED with
    the slice's accuracy, its size and the interval as user attributes. Otherwise the next
    slice is scored; the accuracy of a config that reaches the end is over the whole split, the
    same correct images as without the gate. Until a trial of the study completes, nothing is
    pruned (the zoo alone never prunes), so a search always measures a network. The gate needs
    a first slice of at least ``MIN_SLICE_IMAGES`` images (1,330 validation images at 15 %); a
    smaller split is scored whole.

Slices grow threefold so that a config the first slice could not judge (its interval still
reaches the front) is judged again, on an interval about 1.7 times narrower, before the rest of
the split is spent on it. Each slice extends the last, so a config that completes costs what it
costs without the gate.

On a small slice the interval is too wide (about +-0.15 at 45 images) to drop more than
hopeless configs, yet every trial it prunes changes what the sampler learns from: on the
digits demo (300 validation images, 45-image slices) the gate pruned 29 of 50 TPE trials and
the front fell from 8 networks to 2, so below the minimum the whole split is cheaper than the
risk. Benchmarks of the mechanism pass ``min_slice=0``.

A config with trained adapters meets the gate twice: its least-squares version (already built
by the probe proxy, with the same structure and costs) is scored on the slice before anything
trains, and a config whose untrained stitch cannot reach the front even at the upper end of its
interval is pruned there (:func:`screen_before_training`), so training is spent only where it
could pay. The rule does not credit training with any gain, so a stitch that training would
lift past the front from far below it is lost; in exchange a trial that cannot pay costs one
slice pass instead of a training run.

A stitched config (:func:`~stitch_nas.stitching.network_kind`) is gated against the front it
can join in the report, where stitched networks are counted apart: the study's stitched
networks with the zoo's models. On the real CIFAR-10 zoo, models with a new stem dominate every
stitched network on validation, and gated against them a trained stitch at 0.81 on its slice,
cheaper than any stitched network measured, was pruned.

``fidelity: 0`` turns the gate off. The front travels with each config (a list of objective
vectors), so a Ray worker applies the same rule as the local loop.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import optuna
import torch

from stitch_nas import attrs
from stitch_nas.activations import StitchContext
from stitch_nas.errors import StitchNASError
from stitch_nas.fragments import count_params_of
from stitch_nas.plugins import OBJECTIVES
from stitch_nas.stitching import (
    Measurement,
    StitchedNet,
    count_correct,
    fit_net_head,
    network_macs,
)

__all__ = [
    "DEFAULT_FIDELITY",
    "MIN_SLICE_IMAGES",
    "Fidelity",
    "FidelityGate",
    "Front",
    "SliceStop",
    "current_front",
    "gates_training",
    "objective_values",
    "reference_points",
    "screen_before_training",
    "slice_size",
]

#: share of the validation split a new config is scored on before the rest
DEFAULT_FIDELITY = 0.15
#: the smallest slice the gate works on (95 % interval about +-0.07 at accuracy 0.5)
MIN_SLICE_IMAGES = 200
#: each slice of the split is this many times the last ...
SLICE_GROWTH = 3
#: ... while it is at most this share of the split; then the whole split is scored
MAX_SLICE_SHARE = 0.5
_SEED = 0  # one fixed shuffle: every config is scored first on the same images

#: a front: one objective vector per point, in the study's objective order
Front = list[list[float]]


class SliceStop(StitchNASError):
    """A slice showed the config cannot reach the front: prune it."""

    def __init__(self, reason: str, record: dict[str, Any]) -> None:
        super().__init__(reason)
        self.reason, self.record = reason, record


def slice_size(n: int, fidelity: float) -> int:
    return max(1, min(n, round(fidelity * n)))


@dataclass(frozen=True)
class Fidelity:
    """A search's multi-fidelity rule, before any front is known.

    Attributes:
        share: share of the validation split a new config is scored on first, in (0, 1).
        objectives: the study's objective names, in order.
        budgets: ``{"macs": ..., "params": ...}`` limits.
    """

    share: float
    objectives: tuple[str, ...]
    budgets: Mapping[str, float]

    def gate(self, front: Sequence[Sequence[float]]) -> FidelityGate:
        """The rule for a config planned when the study's front was ``front``."""
        return FidelityGate(self.share, self.objectives, front, self.budgets)


@dataclass(frozen=True)
class FidelityGate:
    """The rule of this module for one config (a ``Screen`` of ``stitching.measure``).

    Attributes:
        fidelity: share of the split scored first.
        objectives: the study's objective names, in order.
        front: the current front's objective vectors, in that order.
        budgets: ``{"macs": ..., "params": ...}`` limits.
    """

    fidelity: float
    objectives: Sequence[str]
    front: Sequence[Sequence[float]]
    budgets: Mapping[str, float]

    def slices(self, n: int) -> list[torch.Tensor]:
        """The rule's slices of a split of ``n``, as the images each adds to the last (sorted
        indices; together, every image once)."""
        order = torch.randperm(n, generator=torch.Generator().manual_seed(_SEED))
        ends, share = [slice_size(n, self.fidelity)], self.fidelity * SLICE_GROWTH
        while share <= MAX_SLICE_SHARE:
            ends.append(slice_size(n, share))
            share *= SLICE_GROWTH
        bounds = [0, *sorted(set(ends) - {n}), n]
        # sorted: rows are read from the cache (or a memory map) in split order
        return [order[a:b].sort().values for a, b in zip(bounds, bounds[1:], strict=False)]

    def check(self, costs: Measurement, correct: int, images: int) -> None:
        from stitch_nas.report import wilson_interval  # the report's face is heavy: on use

        low, high = wilson_interval(correct / images, images)
        best = optimistic(self.objectives, costs, low, high)
        over = [k for k, limit in self.budgets.items() if costs.budget_value(k) > limit]
        above = next((p for p in self.front if dominates(p, best, self.objectives)), None)
        if not self.front or (above is None and not over):
            return
        why = f"over the {over[0]} budget" if over else f"dominated by the front point {above}"
        reason = (
            f"fidelity: {correct}/{images} right on a slice, 95 % interval "
            f"[{low:.3f}, {high:.3f}]; even at its upper end {why}"
        )
        record = {
            attrs.PARTIAL_ACCURACY: correct / images,
            attrs.SLICE_IMAGES: images,
            attrs.PARTIAL_INTERVAL: [low, high],
            "macs": costs.macs,
            "params": costs.params,
        }
        raise SliceStop(reason, record)


def gates_training(trial: optuna.Trial) -> bool:
    """Whether the trial's trained adapters wait for the gate before training: not for a
    refinement (``search._refine``), which was chosen to be trained by its measured accuracy."""
    return attrs.REFINES not in trial.user_attrs


def screen_before_training(gate: FidelityGate, ctx: StitchContext, net: StitchedNet) -> None:
    """Score ``net``, a config's least-squares version, on ``gate``'s slice of the validation
    split and raise :class:`SliceStop` where the gate's rule prunes it (see the module doc)."""
    costs = Measurement(
        accuracy=math.nan, macs=network_macs(ctx, net), params=count_params_of([net]), cka=math.nan
    )
    first = gate.slices(len(ctx.labels("val")))[0]
    # only the slice's images run: most configs stop here (see measure's first slice)
    correct, seen = count_correct(ctx, net, "val", fit_net_head(ctx, net), first)
    try:
        gate.check(costs, correct, seen)
    except SliceStop as stop:
        raise SliceStop(f"before training, least squares: {stop.reason}", stop.record) from None


def optimistic(
    objectives: Sequence[str], costs: Measurement, low: float, high: float
) -> list[float]:
    """Each objective at its best over accuracies in [low, high] (NaN where it has none)."""
    out = []
    for name in objectives:
        objective = OBJECTIVES.get(name)
        ends = [float(objective.value(replace(costs, accuracy=a))) for a in (low, high)]
        best = max(ends) if objective.direction == "maximize" else min(ends)
        out.append(best)
    return out


def dominates(a: Sequence[float], b: Sequence[float], objectives: Sequence[str]) -> bool:
    """``a`` at least as good as ``b`` everywhere and better somewhere (NaN never dominated)."""
    if not all(math.isfinite(v) for v in (*a, *b)):
        return False
    signs = [1.0 if OBJECTIVES.get(n).direction == "maximize" else -1.0 for n in objectives]
    pairs = [(s * x, s * y) for s, x, y in zip(signs, a, b, strict=True)]
    return all(x >= y for x, y in pairs) and any(x > y for x, y in pairs)


def reference_points(
    study: optuna.Study, objectives: Sequence[str], budgets: Mapping[str, float]
) -> Front:
    """Objective vectors of the zoo models recorded on ``study`` that are within the budgets."""
    points: Front = []
    known = {f.name for f in fields(Measurement)}
    for ref in study.user_attrs.get(attrs.REFERENCES) or []:
        try:
            m = Measurement(**{k: v for k, v in ref.items() if k in known})
            values = objective_values(m, objectives, budgets)
        except (TypeError, ValueError):  # a reference measured by another version: skip it
            continue
        if values is not None:
            points.append(values)
    return points


def objective_values(
    m: Measurement, objectives: Sequence[str], budgets: Mapping[str, float]
) -> list[float] | None:
    """``m``'s objective vector, or None when it is over a budget or lacks an objective."""
    if any(m.budget_value(k) > limit for k, limit in budgets.items()):
        return None
    values = [float(OBJECTIVES.get(n).value(m)) for n in objectives]
    return values if all(math.isfinite(v) for v in values) else None


def current_front(
    study: optuna.Study,
    objectives: Sequence[str],
    budgets: Mapping[str, float],
    kind: str | None = None,
) -> Front:
    """Objective vectors of ``study``'s front: its non-dominated feasible COMPLETE trials (as
    Optuna's ``best_trials`` decides: every constraint <= 0), and the zoo references recorded
    on the study that are within the budgets. Empty until a trial completes. With ``kind``,
    only trials of that kind (``attrs.KIND``) count, and the front is empty until one of them
    completes."""
    # read without copies: study.best_trials deep-copies every trial, most of a fast trial
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if kind is not None:
        done = [t for t in done if t.user_attrs.get(attrs.KIND) == kind]
    if not done:  # the zoo alone prunes nothing: a search always measures at least one network
        return []
    feasible = (t for t in done if all(c <= 0 for c in t.constraints.values()))
    points = [list(t.values) for t in feasible if t.values is not None]
    points += reference_points(study, objectives, budgets)
    if not points:
        return []
    signs = [1.0 if OBJECTIVES.get(n).direction == "maximize" else -1.0 for n in objectives]
    gains = np.asarray(points, dtype=float) * np.asarray(signs)
    above = np.all(gains[None, :, :] >= gains[:, None, :], axis=2)
    strictly = np.any(gains[None, :, :] > gains[:, None, :], axis=2)
    kept = ~np.any(above & strictly, axis=1)  # no point dominates it
    unique = {tuple(p) for p, k in zip(points, kept, strict=True) if k}
    return [list(p) for p in sorted(unique)]
