"""The last step of every trial: its outcome written on the trial.

Whichever executor evaluated a config (this process, a Ray worker, a Tune trainable), the side
that asks the study records what came back in one place: CKA, probe accuracy, the slice of a
fidelity prune, prune and fail reasons, the measurement as user attributes, budget
constraints, and a trained network's adapters kept in the search's folder, so the test pass
and the export load them rather than train them again.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import optuna

from stitch_nas import attrs
from stitch_nas.plugins import Objective
from stitch_nas.stitching import TRAINED_DIR, Measurement, save_trained

from ._evaluate import TrialOutcome

__all__ = ["keep_weights", "record_measurement", "record_outcome"]

logger = logging.getLogger(__name__)


def record_outcome(
    trial: optuna.Trial,
    outcome: TrialOutcome,
    objectives: Sequence[Objective],
    budgets: Mapping[str, float],
    folder: Path | None,
) -> tuple[optuna.trial.TrialState, tuple[float, ...] | None]:
    """Write ``outcome`` on ``trial``; return the state to tell and, if COMPLETE, the values
    of ``objectives``. A trained network's adapters go to ``folder`` (None: not kept)."""
    if outcome.cka is not None:
        trial.set_user_attr(attrs.CKA, outcome.cka)
    if outcome.probe is not None:
        trial.set_user_attr(attrs.PROBE_ACCURACY, outcome.probe)
    for key, value in (outcome.partial or {}).items():  # the slice of a fidelity prune
        trial.set_user_attr(key, value)
    if outcome.status == "pruned":
        trial.set_user_attr(attrs.PRUNE_REASON, outcome.reason)
        return optuna.trial.TrialState.PRUNED, None
    if outcome.status != "complete" or outcome.measurement is None:
        trial.set_user_attr(attrs.FAIL_REASON, outcome.reason or "no measurement")
        return optuna.trial.TrialState.FAIL, None
    values = record_measurement(trial, outcome.measurement, objectives, budgets)
    if not all(math.isfinite(v) for v in values):  # record_measurement wrote the fail_reason
        return optuna.trial.TrialState.FAIL, None
    if outcome.weights is not None and folder is not None:
        keep_weights(trial, outcome.weights, Path(folder))
    return optuna.trial.TrialState.COMPLETE, values


def record_measurement(
    trial: optuna.Trial,
    result: Measurement,
    objectives: Sequence[Objective],
    budgets: Mapping[str, float],
) -> tuple[float, ...]:
    """Write ``result`` and the budgets' constraints on ``trial``; return the objective values
    (a non-finite one is written as the trial's fail reason)."""
    for key, value in result.to_dict().items():
        trial.set_user_attr(key, value)
    for key, limit in budgets.items():
        trial.set_constraint(key, result.budget_value(key) - limit)
    values = tuple(float(o.value(result)) for o in objectives)
    if any(math.isnan(v) or math.isinf(v) for v in values):
        trial.set_user_attr(attrs.FAIL_REASON, f"non-finite objective values {values}")
    return values


def keep_weights(trial: optuna.Trial, data: bytes, folder: Path) -> None:
    """Write a trial's trained adapters into the search's folder and name the file on the
    trial; a failed write is logged, and the network is then trained again when needed."""
    digest = hashlib.sha256(data).hexdigest()[:10]
    relative = f"{TRAINED_DIR}/trial_{trial.number}_{digest}.safetensors"
    try:
        save_trained(data, folder / relative)
    except OSError as exc:
        logger.warning("trial %d: its trained adapters were not kept (%s)", trial.number, exc)
        return
    trial.set_user_attr(attrs.WEIGHTS, relative)
