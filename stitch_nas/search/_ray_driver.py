"""The Ray executor's driver mode: the driver asks the study, plans each trial and tells it.

The driver asks the study for a trial and plans it (:meth:`StitchObjective.plan`: samples its
config, checks that it is new, takes the front its gate compares with), sends the
:class:`~stitch_nas.search.TrialPlan` to an idle worker of the pool, and records each outcome
with the local executor's bookkeeping (:meth:`StitchObjective.finish`) before telling the study.
A config evaluated before or in flight is told PRUNED at once as a repeat and does not count; a
trial that fails before reaching a worker is settled before more are asked. Used by
:class:`~stitch_nas.search.RayExecutor` (``mode="driver"``).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, cast

import optuna

from stitch_nas import attrs
from stitch_nas.errors import StitchNASError

from ._evaluate import Repeat, TrialOutcome
from ._ray_shared import NetworkShipper
from ._ray_workers import _Pending, _Pool
from ._runner import StitchObjective
from ._storage import heartbeat_of
from ._studies import completed_count
from ._user_attrs import BufferedTrial

__all__ = ["drive_trials"]

logger = logging.getLogger(__name__)

_TrialState = optuna.trial.TrialState
# the driver reads what other drivers sent at most this often: with cheap trials it asks many
# times a second, and each read is an Optuna query over every running trial (see ._seen)
_SEEN_MAX_AGE_S = 1.0


def drive_trials(
    ray: Any,
    objective: StitchObjective,
    study: optuna.Study,
    n_trials: int,
    pool: _Pool,
    progress: bool,
    *,
    workers: int,
    limit: int,
) -> dict[str, Any]:
    """Ask, plan and tell ``study``'s trials here while ``pool``'s ``workers`` evaluate them,
    until it holds ``n_trials`` finished networks; what ran, by outcome and by node. Stops with
    an error after ``limit`` failed trials in a row."""
    from tqdm.auto import tqdm

    counts: dict[str, Any] = {"complete": 0, "pruned": 0, "failed": 0, "duplicates": 0}
    nodes: dict[str, int] = {}
    in_flight: dict[Any, _Pending] = {}
    idle = list(range(workers))
    heartbeat = heartbeat_of(study)
    wait_s = None if heartbeat is None else heartbeat.interval / 2
    done, failed_in_a_row, told = completed_count(study), 0, 0
    shipper = NetworkShipper(objective.ctx, ray.put)
    unsent: list[tuple[_Pending, TrialOutcome]] = []  # failed before reaching a worker
    bar = tqdm(total=n_trials, initial=min(done, n_trials), desc="trials", disable=not progress)
    try:
        while True:
            # a trial failed before reaching a worker is settled before asking for more
            while (
                idle
                and not unsent
                and done + len(in_flight) < n_trials
                and not objective.exhausted()
            ):
                trial = _ask(study)
                buffered = BufferedTrial(trial)
                view = cast(optuna.Trial, buffered)  # a Trial to the objective
                try:
                    plan = objective.plan(view, max_age_s=_SEEN_MAX_AGE_S)
                except BaseException:  # a broken space is the user's error, as locally
                    study.tell(trial, state=_TrialState.FAIL)
                    raise
                buffered.flush()
                if isinstance(plan, Repeat):  # evaluated before: no worker, does not count
                    study.tell(trial, state=_TrialState.PRUNED)
                    counts["duplicates"] += 1
                    continue
                try:  # a joint network trains here, once, not on every worker
                    networks = shipper.refs(plan.config)
                except Exception as exc:  # noqa: BLE001 - the trial fails, as it would locally
                    unsent.append((_Pending(trial, plan.config, -1), TrialOutcome.failed(exc)))
                    continue
                except BaseException:  # interrupted while training: not left RUNNING
                    study.tell(trial, state=_TrialState.FAIL)
                    raise
                worker = idle.pop()
                ref = pool.submit(worker, trial.number, plan, networks)
                in_flight[ref] = _Pending(trial, plan.config, worker)
            if not in_flight and not unsent:
                break
            ready = []
            if in_flight:
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=wait_s)
            if heartbeat is not None and heartbeat.due():
                heartbeat.beat(p.trial.number for p in in_flight.values())
            settled = [*unsent, *((in_flight[r], pool.result(r, in_flight[r])) for r in ready)]
            unsent = []
            for ref in ready:
                in_flight.pop(ref)
            for pending, outcome in settled:
                if pending.worker >= 0:
                    idle.append(pending.worker)
                state = _tell(objective, study, pending, outcome)
                counts[_COUNT_KEY[state]] += 1
                if pending.node is not None:
                    nodes[pending.node] = nodes.get(pending.node, 0) + 1
                if state == _TrialState.FAIL:
                    failed_in_a_row += 1
                else:
                    failed_in_a_row, done = 0, done + 1
                    bar.update(1)
                if failed_in_a_row >= limit:
                    raise StitchNASError(
                        f"the last {failed_in_a_row} trials all failed (latest: "
                        f"{outcome.reason}); see fail_reason in trials.csv for the cause"
                    )
            told += len(settled)
            if settled and (told % 10 == 0 or done + len(in_flight) >= n_trials):
                done = completed_count(study)  # other drivers may share the study
    finally:
        bar.close()
        for pending in [*in_flight.values(), *(p for p, _ in unsent)]:  # not left RUNNING
            pending.trial.set_user_attr(attrs.FAIL_REASON, "driver stopped mid-trial")
            study.tell(pending.trial, state=_TrialState.FAIL)
    if objective.exhausted():
        logger.warning(objective.exhausted_message(study, n_trials))
    counts["trials_per_node"] = nodes
    return counts


def _tell(
    objective: StitchObjective, study: optuna.Study, pending: _Pending, outcome: TrialOutcome
) -> optuna.trial.TrialState:
    buffered = BufferedTrial(pending.trial)
    if pending.node is not None:
        buffered.set_user_attr(attrs.RAY_NODE, pending.node)
    state, values = objective.finish(cast(optuna.Trial, buffered), pending.config, outcome)
    buffered.flush()
    if state == _TrialState.COMPLETE:
        study.tell(pending.trial, values)
    else:
        if state == _TrialState.FAIL:
            logger.warning("trial %d failed: %s", pending.trial.number, outcome.reason)
        study.tell(pending.trial, state=state)
    return state


def _ask(study: optuna.Study) -> optuna.Trial:
    with warnings.catch_warnings():  # the driver sends the heartbeats optimize() would
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
        return study.ask()


_COUNT_KEY = {
    _TrialState.COMPLETE: "complete",
    _TrialState.PRUNED: "pruned",
    _TrialState.FAIL: "failed",
}
