"""Ray Tune integration: the search space, trainable and searcher for your own ``tune.Tuner``.

Three pieces, each usable on its own::

    objective = stitch_nas.make_objective(zoo, data, objectives=["accuracy", "macs"],
                                          budgets={"macs": 2e6})
    searcher = StitchOptunaSearch(objective, sampler=optuna.samplers.TPESampler(seed=0))
    tuner = tune.Tuner(make_trainable(objective),
                       tune_config=tune.TuneConfig(search_alg=searcher, num_samples=50))
    tuner.fit()
    searcher.study.best_trials            # the Pareto front, budgets respected

- :class:`StitchTuneSpace` is a define-by-run function for
  ``OptunaSearch(space=StitchTuneSpace(objective), metric=objective.names,
  mode=tune_modes(objective))``. It samples a StitchConfig in the driver and hands it to the
  trainable as JSON under ``config["stitch_config"]``. A config the study evaluated before
  (or has in flight) is marked a repeat (``config["stitch_repeat"]``, the reason), and the
  trainable reports it pruned at once without evaluating it, as the other executors do.
- :func:`make_trainable` returns the function trainable, with the zoo and the data (the same
  :class:`~stitch_nas.search._ray_shared.SharedContext` the Ray executor ships) passed once
  through ``tune.with_parameters`` (the object store), not per trial; each Tune worker process
  fills its own activation cache, bounded as the objective's is, as a local run does. It
  reports the objective values, ``cka``, and ``stitch_*`` fields with ``ray.tune.report``.
- :class:`StitchOptunaSearch` is ``OptunaSearch`` plus what it lacks: Ray's ``OptunaSearch`` has
  no notion of constraints, so this subclass records each finished trial through
  :meth:`StitchObjective.finish` before telling Optuna. That sets the budget constraints
  (``trial.set_constraint``, which Optuna's samplers and ``best_trials`` respect), the measurements
  as user attributes, PRUNED for CKA-pruned configs and FAIL with its reason for failed ones.
  With plain ``OptunaSearch`` the space and trainable work, but pruned and failed trials both
  become FAIL (their reported values are NaN) and budgets are not enforced.
"""

from __future__ import annotations

import json
import logging
import math
import pickle
import uuid
from typing import Any, cast

import optuna
import torch

from stitch_nas import attrs
from stitch_nas.activations import StitchContext
from stitch_nas.config import StitchConfig
from stitch_nas.extras import require
from stitch_nas.machine import reuse_freed_memory
from stitch_nas.plugins import OBJECTIVES
from stitch_nas.stitching import Measurement, fragment_macs

from ._evaluate import EvaluationOptions, Repeat, TrialOutcome, TrialPlan, evaluate_plan
from ._ray_shared import SharedContext, import_ray, models_on_cpu, share_context
from ._runner import StitchObjective
from ._user_attrs import BufferedTrial

# This module subclasses Ray's OptunaSearch, so it needs Ray Tune at import time;
# stitch_nas.search imports it only when one of its names is first used.
require(
    "ray", "ray.tune.search.optuna", "the Ray Tune helpers (StitchOptunaSearch, make_trainable...)"
)
from ray import tune  # noqa: E402
from ray.tune.search.optuna import OptunaSearch  # noqa: E402

__all__ = [
    "CONFIG_KEY",
    "REPEAT_KEY",
    "StitchOptunaSearch",
    "StitchTuneSpace",
    "make_trainable",
    "stitch_trainable",
    "tune_modes",
]

logger = logging.getLogger(__name__)

CONFIG_KEY = "stitch_config"  #: where the sampled StitchConfig (JSON) sits in the Tune config
REPEAT_KEY = "stitch_repeat"  #: why the sampled config is not evaluated (a repeat), if it is


def tune_modes(objective: StitchObjective) -> list[str]:
    """Tune's ``mode`` list ("max"/"min") matching ``objective.names``."""
    return ["max" if d == "maximize" else "min" for d in objective.directions]


class StitchTuneSpace:
    """Define-by-run space for ``OptunaSearch(space=...)``: ``trial -> {"stitch_config": json}``.

    Sampling runs in the Tune driver and needs only the objective's context for cut lists and
    MAC tables, which are filled here so that suggestions are fast; the config's JSON,
    description and models are stored as user attributes.
    """

    def __init__(self, objective: StitchObjective) -> None:
        self.objective = objective
        for name in objective.ctx.zoo.names():
            fragment_macs(objective.ctx, name, None, None)  # traces the model, fills its table

    def __call__(self, trial: optuna.Trial) -> dict[str, str]:
        # the trial's first step, as under every executor; Tune has no fidelity gate (the
        # trainable cannot read the study's front), so the plan carries none
        plan = self.objective.plan(trial, gate=False)  # a repeat records the earlier figures
        out = {CONFIG_KEY: json.dumps(plan.config.to_dict(), sort_keys=True)}
        if isinstance(plan, Repeat):
            out[REPEAT_KEY] = plan.reason
        return out


def make_trainable(objective: StitchObjective) -> Any:
    """The function trainable for ``tune.Tuner``, large read-only data attached once.

    The zoo and the data are passed with ``tune.with_parameters``, so Ray stores them once in
    the object store; each Tune worker process builds its :class:`StitchContext` once, with an
    activation cache of the objective's budget, storage dtype and spill folder, and fills it on
    demand as a local run does (no activation is computed here or shipped). Starts a local Ray
    (no dashboard) if none is running.
    """
    ray = import_ray()
    if not ray.is_initialized():
        ray.init(include_dashboard=False)
    ctx = objective.ctx
    # the values themselves: with_parameters puts the whole handle in the object store once
    shared = share_context(ctx, put=lambda value: value)
    with models_on_cpu(ctx):  # pickled here, so with CPU weights
        return tune.with_parameters(
            stitch_trainable,
            token=uuid.uuid4().hex,
            shared=shared,
            evaluation=objective.evaluation_options(),
            names=list(objective.names),
        )


_CONTEXTS: dict[str, StitchContext] = {}  # per worker process: built once, reused by trials


def stitch_trainable(
    config: dict[str, Any],
    *,
    token: str,
    shared: SharedContext,
    evaluation: EvaluationOptions,
    names: list[str],
) -> None:
    """Evaluate the StitchConfig in ``config["stitch_config"]`` and report it to Tune.

    Reported: each objective by name (NaN when pruned or failed), ``cka``, ``stitch_status``
    ("complete", "pruned", "fail"), ``stitch_reason`` and ``stitch_measurement`` (JSON).
    A repeat (``config["stitch_repeat"]``) is reported pruned at once, evaluating nothing.
    """
    if REPEAT_KEY in config:
        tune.report(outcome_metrics(TrialOutcome("pruned", reason=config[REPEAT_KEY]), names))
        return
    ctx = _CONTEXTS.get(token)
    if ctx is None:  # this worker process's first trial of the search
        ray = import_ray()
        reuse_freed_memory()  # as the driver's command line does: the same values, faster
        device = "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"
        ctx = shared.materialize(device)
        _CONTEXTS.clear()  # one search per process at a time; drop an earlier one's memory
        _CONTEXTS[token] = ctx
    plan = TrialPlan(StitchConfig.from_dict(json.loads(config[CONFIG_KEY])))
    tune.report(outcome_metrics(evaluate_plan(ctx, plan, evaluation), names))


def outcome_metrics(outcome: TrialOutcome, names: list[str]) -> dict[str, Any]:
    """The metrics dict a trainable reports for ``outcome``."""
    values = [math.nan] * len(names)
    if outcome.status == "complete" and outcome.measurement is not None:
        values = [float(OBJECTIVES.get(n).value(outcome.measurement)) for n in names]
    return {
        **dict(zip(names, values, strict=True)),
        "cka": math.nan if outcome.cka is None else outcome.cka,
        "stitch_status": outcome.status,
        "stitch_reason": outcome.reason or "",
        "stitch_measurement": json.dumps(
            None if outcome.measurement is None else outcome.measurement.to_dict()
        ),
    }


def _outcome_from(result: dict[str, Any]) -> TrialOutcome:
    cka = result.get("cka")
    measured = json.loads(result.get("stitch_measurement") or "null")
    return TrialOutcome(
        status=str(result["stitch_status"]),
        measurement=None if measured is None else Measurement(**measured),
        cka=None if cka is None or math.isnan(cka) else float(cka),
        reason=result.get("stitch_reason") or None,
    )


class StitchOptunaSearch(OptunaSearch):
    """``OptunaSearch`` over :class:`StitchTuneSpace` that records trials like the runner.

    Args:
        objective: The objective whose space, objectives and budgets to search.
        **kwargs: Passed to ``OptunaSearch`` (``sampler``, ``storage``, ``study_name``,
            ``seed``...); ``space``, ``metric`` and ``mode`` are set from ``objective``.
    """

    def __init__(self, objective: StitchObjective, **kwargs: Any) -> None:
        self._objective = objective
        super().__init__(
            space=StitchTuneSpace(objective),
            metric=list(objective.names),
            mode=tune_modes(objective),
            **kwargs,
        )

    @property
    def study(self) -> optuna.Study:
        """The Optuna study behind the search (``best_trials`` is the Pareto front)."""
        return cast(optuna.Study, self._ot_study)  # set up in __init__: the space is given

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None or trial_id in self._completed_trials:
            return super().on_trial_complete(trial_id, result, error)
        if error or not result or "stitch_status" not in result:
            reason = "the Tune trial raised or its worker died" if error else "no result"
            ot_trial.set_user_attr(attrs.FAIL_REASON, reason)
            self.study.tell(ot_trial, state=optuna.trial.TrialState.FAIL)
            self._completed_trials.add(trial_id)
            return None
        if attrs.DUPLICATE_OF in ot_trial.user_attrs or attrs.REFERENCE_OF in ot_trial.user_attrs:
            # a repeat: the space recorded why and the earlier figures; nothing was measured
            self.study.tell(ot_trial, state=optuna.trial.TrialState.PRUNED)
            self._completed_trials.add(trial_id)
            return None
        config = StitchConfig.from_dict(ot_trial.user_attrs[attrs.CONFIG])
        buffered = BufferedTrial(ot_trial)  # the result's attributes in one write
        outcome = _outcome_from(result)
        state, values = self._objective.finish(cast(optuna.Trial, buffered), config, outcome)
        buffered.flush()
        if state == optuna.trial.TrialState.COMPLETE:
            self.study.tell(ot_trial, values)
        else:
            self.study.tell(ot_trial, state=state)
        self._completed_trials.add(trial_id)
        return None

    def __getstate__(self) -> dict[str, Any]:
        # The objective holds the zoo, locks and traced graphs: it is not searcher state.
        # Tune pickles the searcher into its experiment folder; to restore an experiment,
        # build the searcher again with the objective, then restore into it.
        return {k: v for k, v in self.__dict__.items() if k not in ("_objective", "_space")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"_objective": None, "_space": None, **state})

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as handle:
            pickle.dump(self.__getstate__(), handle)
