"""Pareto front, hypervolume and dominance of a multi-objective search's Optuna study.

Everything is read from the study: objective names in ``study.user_attrs[attrs.OBJECTIVES]``,
the zoo's own models in ``study.user_attrs[attrs.REFERENCES]``, per-trial metrics, config and
description in each trial's ``user_attrs``, feasibility in its constraints.

Hypervolumes are normalised to [0, 1]: per objective, the worst corner (the reference point) is
0 for maximised objectives (accuracy, CKA) and 1.1 x the largest value over completed trials and
references for minimised ones (MACs, params, latency); the best corner is 1 for maximised
objectives (or the largest value seen, if above 1) and 0 for minimised ones.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from stitch_nas import attrs
from stitch_nas.errors import ConfigError

__all__ = [
    "as_losses",
    "cheapest_first",
    "dominated_references",
    "finite_number",
    "first_of_each_network",
    "front_hypervolume",
    "hypervolume",
    "hypervolume_box",
    "is_feasible",
    "lookup_metric",
    "n_fragments",
    "network_key",
    "normalised_hypervolume",
    "objective_names",
    "pareto_trials",
    "reference_values",
    "trial_config",
    "trial_metric",
    "zoo_references",
]

logger = logging.getLogger(__name__)

_COST_MARGIN = 1.1  # so the costliest point still spans a nonzero slab of the normalised box
_MAX, _MIN = StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE


def objective_names(study: optuna.Study) -> list[str]:
    """The objective names stored on ``study``, one per direction (``objective_<i>`` if none)."""
    names = study.user_attrs.get(attrs.OBJECTIVES)
    if names is None:
        return [f"objective_{i}" for i in range(len(study.directions))]
    if len(names) != len(study.directions):
        raise ConfigError(
            f"study.user_attrs['objectives'] = {names} names {len(names)} objectives but the "
            f"study has {len(study.directions)} directions; store one name per direction"
        )
    return [str(n) for n in names]


def zoo_references(study: optuna.Study) -> list[dict[str, Any]]:
    """The zoo's own models as measured by the search: dicts with a ``name`` and metrics."""
    refs = study.user_attrs.get(attrs.REFERENCES) or []
    if not isinstance(refs, list) or not all(isinstance(r, dict) and "name" in r for r in refs):
        raise ConfigError("study.user_attrs['references'] must be a list of dicts with a 'name'")
    return refs


def finite_number(value: Any) -> float | int | None:
    """The value if it is a finite number, else None (keeps NaN out of JSON and tables)."""
    if isinstance(value, np.number):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def lookup_metric(mapping: dict[str, Any], name: str) -> float | int | None:
    """The finite number stored under ``name`` (or ``<name>_ms``) in ``mapping``, else None."""
    # An objective called "latency" is stored as "latency_ms" in user_attrs and references.
    for key in (name, f"{name}_ms"):
        if finite_number(mapping.get(key)) is not None:
            return finite_number(mapping[key])
    return None


def is_feasible(trial: FrozenTrial) -> bool:
    """Whether every constraint of ``trial`` is satisfied (no constraint: feasible)."""
    # As Optuna 5 decides (FrozenTrial.constraints reads both storage formats): feasible when
    # every constraint is <= 0, so a trial without constraints is feasible.
    return all(v <= 0.0 for v in trial.constraints.values())


def trial_config(trial: FrozenTrial) -> dict[str, Any]:
    """The ``StitchConfig`` dict the trial recorded, or ``{}``."""
    config = trial.user_attrs.get(attrs.CONFIG)
    return config if isinstance(config, dict) else {}


def n_fragments(trial: FrozenTrial) -> int:
    """Number of fragments of the trial's network (more than one: a stitched network)."""
    fragments = trial_config(trial).get("fragments")
    if isinstance(fragments, list):
        return len(fragments)
    return len(trial.user_attrs.get(attrs.MODELS, []))


def trial_metric(trial: FrozenTrial, name: str, objectives: list[str]) -> float | int | None:
    """A measured metric of ``trial``: its user attribute, else its objective value."""
    value = lookup_metric(trial.user_attrs, name)
    if value is None and name in objectives and trial.values is not None:
        return finite_number(trial.values[objectives.index(name)])
    return value


def _as_direction(direction: StudyDirection | str) -> StudyDirection:
    if isinstance(direction, StudyDirection):
        return direction
    if str(direction).lower() in ("maximize", "minimize"):
        return StudyDirection[str(direction).upper()]
    raise ConfigError(f"unknown direction {direction!r}; use 'maximize' or 'minimize'")


def as_losses(points: np.ndarray, directions: Sequence[StudyDirection | str]) -> np.ndarray:
    """Points as losses: maximised objectives negated so that smaller is better everywhere."""
    return points * np.asarray([-1.0 if _as_direction(d) == _MAX else 1.0 for d in directions])


def _dominates(a: Sequence[float], b: Sequence[float], directions: Sequence[Any]) -> bool:
    la, lb = as_losses(np.asarray([a, b], dtype=float), directions)
    return bool(np.all(la <= lb) and np.any(la < lb))


def pareto_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The non-dominated feasible completed trials, sorted by the first minimised objective.

    This is ``study.best_trials`` with each network once: a search records a repeated config as
    a PRUNED trial, but older studies recorded it as a COMPLETE copy (``duplicate_of``); of a
    trial and its copies the first on the front is kept.
    Optuna 5 keeps only COMPLETE trials and, as soon as any trial of the study has a
    constraint, first drops those with a constraint value > 0 (a trial with no constraint
    counts as feasible), so an infeasible trial never knocks a feasible one off.

    Args:
        study: A multi-objective study.

    Returns:
        Front trials, cheapest first (best first on the first objective if none is minimised).
    """
    return cheapest_first(first_of_each_network(study.best_trials), study.directions)


def cheapest_first(
    trials: Sequence[FrozenTrial], directions: Sequence[StudyDirection]
) -> list[FrozenTrial]:
    """Trials sorted by the first minimised objective (best first on the first objective if
    none is minimised), then by number."""
    mins = [i for i, d in enumerate(directions) if d == _MIN]
    if mins:
        return sorted(trials, key=lambda t: (t.values[mins[0]], t.number))
    return sorted(trials, key=lambda t: (-t.values[0], t.number))


def network_key(trial: FrozenTrial) -> int:
    """The trial that first measured ``trial``'s network: the one it copies, else itself."""
    source = trial.user_attrs.get(attrs.DUPLICATE_OF)
    return source if isinstance(source, int) and not isinstance(source, bool) else trial.number


def first_of_each_network(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """``trials`` with one trial per network (a trial and its copies): the lowest-numbered."""
    first: dict[int, FrozenTrial] = {}
    for trial in sorted(trials, key=lambda t: t.number):
        first.setdefault(network_key(trial), trial)
    return list(first.values())


def hypervolume(
    points: Sequence[Sequence[float]] | np.ndarray,
    directions: Sequence[StudyDirection | str],
    reference_point: Sequence[float],
) -> float:
    """Exact hypervolume dominated by ``points`` and bounded by ``reference_point``.

    Optuna 5 has no public hypervolume function (only the private ``optuna._hypervolume``), so
    this is a 2-D sweep, with more objectives sliced along the last one down to 2-D.

    Args:
        points: One row of objective values per point; dominated points and points not strictly
            better than the reference point on every objective add nothing.
        directions: ``StudyDirection`` or "maximize"/"minimize" per objective.
        reference_point: The worst corner of the measured box, in raw units.

    Returns:
        The volume, in the product of the objectives' units.

    Raises:
        ConfigError: If shapes disagree or values are not finite.
    """
    ref = np.asarray(reference_point, dtype=float).ravel()
    pts = np.asarray(points, dtype=float)
    pts = pts.reshape(0, len(ref)) if pts.size == 0 else pts
    if len(ref) == 0 or len(directions) != len(ref) or pts.ndim != 2 or pts.shape[1] != len(ref):
        raise ConfigError(
            f"need points of shape (n, {len(directions)}) and one reference value per direction; "
            f"got points {pts.shape} and {len(ref)} reference values"
        )
    if not (np.all(np.isfinite(pts)) and np.all(np.isfinite(ref))):
        raise ConfigError("hypervolume points and reference point must be finite")
    losses, ref_loss = as_losses(pts, directions), as_losses(ref[None, :], directions)[0]
    return _hv_min(losses[np.all(losses < ref_loss, axis=1)], ref_loss)


def _hv_min(points: np.ndarray, ref: np.ndarray) -> float:
    """Hypervolume for minimisation; every point strictly dominates ``ref``."""
    if len(points) == 0:
        return 0.0
    if points.shape[1] == 1:
        return float(ref[0] - points[:, 0].min())
    if points.shape[1] == 2:
        # Sweep by increasing x: each point adds the slab between its y and the best y so far.
        total, best_y = 0.0, ref[1]
        for x, y in points[np.lexsort((points[:, 1], points[:, 0]))]:
            if y < best_y:
                total += (ref[0] - x) * (best_y - y)
                best_y = y
        return float(total)
    # Between consecutive levels of the last objective the cross-section is constant: the
    # (d-1)-D hypervolume of the points at or below the lower level.
    levels = np.append(np.unique(points[:, -1]), ref[-1])
    slabs = zip(levels[:-1], levels[1:], strict=True)
    return float(
        sum((hi - lo) * _hv_min(points[points[:, -1] <= lo, :-1], ref[:-1]) for lo, hi in slabs)
    )


def reference_values(ref: dict[str, Any], objectives: list[str]) -> list[float] | None:
    """A zoo reference's value of each objective, or None if it lacks one."""
    values = [lookup_metric(ref, name) for name in objectives]
    present = [float(v) for v in values if v is not None]
    return None if len(present) != len(values) else present


def hypervolume_box(study: optuna.Study) -> tuple[list[float], list[float]]:
    """The normalisation box of ``study``'s hypervolumes, in raw units: (worst, ideal) corners.

    Per objective the worst corner is 0 for maximised objectives and 1.1 x the largest value over
    completed trials and zoo references for minimised ones; the ideal corner is 1 (or the largest
    value seen, if above 1) for maximised objectives and 0 for minimised ones.
    """
    objectives, directions = objective_names(study), study.directions
    refs = [v for r in zoo_references(study) if (v := reference_values(r, objectives)) is not None]
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    seen = np.asarray([t.values for t in done] + refs, dtype=float).reshape(-1, len(directions))
    tops = seen.max(axis=0) if len(seen) else np.ones(len(directions))
    pairs = list(zip(directions, tops, strict=True))
    worst = [0.0 if d == _MAX else (_COST_MARGIN * t if t > 0 else 1.0) for d, t in pairs]
    ideal = [max(1.0, float(t)) if d == _MAX else 0.0 for d, t in pairs]
    return worst, ideal


def normalised_hypervolume(
    points: Sequence[Sequence[float]],
    directions: Sequence[StudyDirection | str],
    worst: Sequence[float],
    ideal: Sequence[float],
) -> float:
    """Hypervolume of ``points`` as a fraction of the box between ``worst`` and ``ideal``."""
    if len(points) == 0:
        return 0.0
    box = float(np.prod(np.abs(np.subtract(ideal, worst))))
    return min(1.0, hypervolume(points, directions, worst) / box)


def front_hypervolume(study: optuna.Study) -> dict[str, Any]:
    """Normalised hypervolume of the front, of the zoo references alone, and of both together.

    Each value is a fraction in [0, 1] of the box of :func:`hypervolume_box`, computed on the
    objective values the search optimised (validation accuracy). The union's hypervolume exceeds
    the zoo's exactly when some front network is not dominated by the zoo's models.

    Args:
        study: A multi-objective study.

    Returns:
        ``hypervolume``, ``reference_hypervolume``, ``combined_hypervolume``, ``extends_front``
        and, in raw units, ``reference_point`` (worst corner) and ``ideal_point`` (best corner).
    """
    objectives, directions = objective_names(study), study.directions
    front = [list(t.values) for t in pareto_trials(study)]
    refs = [v for r in zoo_references(study) if (v := reference_values(r, objectives)) is not None]
    worst, ideal = hypervolume_box(study)
    hv, ref_hv, both = (
        normalised_hypervolume(points, directions, worst, ideal)
        for points in (front, refs, front + refs)
    )
    return {
        "hypervolume": hv,
        "reference_hypervolume": ref_hv,
        "combined_hypervolume": both,
        "extends_front": both > ref_hv + 1e-12,
        "reference_point": worst,
        "ideal_point": ideal,
    }


def dominated_references(study: optuna.Study) -> list[dict[str, Any]]:
    """For each zoo reference, the front trials that dominate it on the search's objective values.

    This is plain Pareto dominance on validation figures, with no allowance for noise: the
    report's claims use :func:`~stitch_nas.report.zoo_claims` (test split, 95 % intervals)
    instead.

    Args:
        study: A multi-objective study with ``user_attrs[attrs.REFERENCES]``.

    Returns:
        One dict per reference: ``reference`` (name), ``dominated_by`` (trial numbers) and
        ``dominated_by_stitched`` (those of them whose kind is "stitched": every model
        contributes a block, see :mod:`stitch_nas.stitching._kinds`). A reference that
        lacks an objective value cannot be compared and gets empty lists.
    """
    objectives, directions = objective_names(study), study.directions
    front, out = pareto_trials(study), []
    recorded = study.user_attrs.get(attrs.KINDS) or {}  # kinds the test pass filled in
    for ref in zoo_references(study):
        point = reference_values(ref, objectives)
        if point is None:
            logger.warning("reference %s lacks one of %s; not compared", ref["name"], objectives)
        wins = [t for t in front if point and _dominates(t.values, point, directions)]
        out.append(
            {
                "reference": str(ref["name"]),
                "dominated_by": [t.number for t in wins],
                "dominated_by_stitched": [t.number for t in wins if _stitched(t, recorded)],
            }
        )
    return out


def _stitched(trial: FrozenTrial, recorded: dict[str, Any]) -> bool:
    """Whether ``trial``'s network is a real stitch (its own kind, else the test pass's)."""
    return trial.user_attrs.get(attrs.KIND, recorded.get(str(trial.number))) == "stitched"
