"""Ray workers that ask and tell the study themselves (``RayExecutor(mode="workers")``).

In the driver mode (:mod:`._ray_executor`) one process asks Optuna for every trial and tells
every result, so on a 2-core machine its ~35 SQL statements per trial hold one core while the
workers wait for it. Here each worker opens the study itself, from the URL or journal file the
driver's study was opened from, and runs trials one after another as ``stitch-nas search --join``
runs a driver: sample, repeat check, multi-fidelity gate, fit, measure, record, tell. The driver
only starts the workers, shows progress and handles a worker that dies.

- **Storage.** Every worker must open the same study: a database server, or a file (SQLite,
  journal) that every node reads; ``mode="auto"`` picks this mode only where that holds, and
  not on a journal file, where the driver's own ask and tell are cheap.
- **Samplers.** Each worker has a copy of the study's sampler. The search's first worker keeps
  its seeded state, so a search on one worker proposes what the local executor would; every
  other worker reseeds its copy from the operating system, so workers propose different configs
  (a seeded search on several workers is not reproducible in either mode). TPE's constant liar
  sees the other workers' running trials in the study. A :class:`ProxySampler` travels as its
  base sampler and is wrapped again in the worker, so it scores candidates on the worker's own
  context (the driver's holds locks and its activation cache, and stays on the driver).
- **The total.** A worker starts a trial only while finished plus running trials of this search
  stay below the requested total, and only with a ticket from one counter the driver holds
  (:class:`_Tickets`): reading the study and then asking it for a trial are two steps, so two
  workers reading at nearly the same instant could otherwise both start the last trial. So a
  search reaches its total without running over (drivers joining one study each count their
  own tickets).
- **Failures.** Each trial records its worker (``ray_worker``, ``<run>-<slot>-<start>``) and its
  node (``ray_node``). A worker that dies has its running trial marked FAIL by the driver at
  once, on any storage, and is replaced; a worker that sees ``max_failures_in_a_row`` of its
  trials fail in a row stops the search with an error.
- **SN-Net.** A jointly trained SN-Net is trained by each worker that samples a stitch of it
  (seeded, so identically); the driver mode trains it once and ships it, which is why
  ``mode="auto"`` keeps the driver mode for such spaces.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import time
import uuid
from typing import Any

import optuna

from stitch_nas import attrs
from stitch_nas.errors import StitchNASError

from ._evaluate import exception_line
from ._proxy_sampler import ProxySampler, proxy_sampler
from ._ray_shared import import_ray
from ._ray_workers import TrialWorker, _Pool
from ._runner import ObjectiveSettings, StitchObjective
from ._storage import fail_running, open_storage, remember_storage
from ._studies import completed_count, is_repeat

__all__ = ["StudyWorker", "StudyWorkerRun"]

logger = logging.getLogger(__name__)

_TrialState = optuna.trial.TrialState
# how long a worker waits, when the running trials may reach the total, before it looks again
_WAIT_S = 0.05
# how often a worker reads the study's progress, and other workers' configs, when not near the end
_READ_EVERY_S = 1.0


class StudyWorker(TrialWorker):
    """A Ray actor that runs trials of a study it opens itself (see the module docstring)."""

    def open_study(
        self,
        storage: str,
        study_name: str,
        heartbeat_s: int,
        sampler: optuna.samplers.BaseSampler,
        objective: ObjectiveSettings,
        worker_id: str,
        reseed: bool = True,
        proxy: tuple[int, int | None] | None = None,
    ) -> None:
        """Open the study this worker will run trials of (part of the search's start-up).

        ``objective``: :meth:`StitchObjective.portable` of the driver's; ``worker_id``:
        ``<run>-<slot>-<start>``, recorded on each trial, whose ``<run>`` prefix marks the
        search's own running trials; ``reseed``: reseed the copy of the driver's sampler from
        the operating system (every worker but the search's first); ``proxy``: the driver's
        :class:`ProxySampler` wrapped ``sampler`` with these ``(candidates, seed)``, and the
        worker wraps its copy again around its own objective (the driver's scores candidates
        on the driver's context, which is not shipped).
        """
        backend = open_storage(storage, heartbeat_s=heartbeat_s)
        if reseed:  # a copy of the driver's: would propose what another worker proposes
            sampler.reseed_rng()
        self.study = optuna.load_study(study_name=study_name, storage=backend, sampler=sampler)
        remember_storage(self.study, backend, storage)
        self.objective = StitchObjective.on_context(objective, self.ctx)
        self.objective.trial_attrs = {attrs.RAY_NODE: self.node, attrs.RAY_WORKER: worker_id}
        # other workers' configs are read at most once a second; its own are known at once
        self.objective.seen_max_age_s = _READ_EVERY_S
        if proxy is not None:
            candidates, seed = proxy
            self.study.sampler = proxy_sampler(
                self.objective, sampler, candidates, seed=None if reseed else seed
            )
        self.tally = _Tally(self.study, worker_id.split("-", 1)[0] + "-")
        self.worker_id = worker_id
        self.study.get_trials(deepcopy=False)  # the first read, its SQL compiled, before the clock

    def drive(self, n_trials: int, max_failures_in_a_row: int, tickets: Any) -> dict[str, Any]:
        """Run trials of the opened study until it holds ``n_trials`` finished networks, each
        started with a ticket from ``tickets`` (a :class:`_Tickets` actor); whether the space
        ran out of new configs (``{"exhausted": bool}``)."""
        study, stitch, tally, me = self.study, self.objective, self.tally, self.worker_id
        get = import_ray().get
        failed_in_a_row = 0

        def stop_on_failures(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
            nonlocal failed_in_a_row
            counted = trial.state != _TrialState.FAIL and not is_repeat(trial)
            get((tickets.spend if counted else tickets.give_back).remote(me))
            if trial.state != _TrialState.FAIL:
                failed_in_a_row = failed_in_a_row if is_repeat(trial) else 0
                return
            failed_in_a_row += 1
            reason = trial.user_attrs.get(attrs.FAIL_REASON, "no reason recorded")
            logger.warning("trial %d failed: %s", trial.number, reason)
            if failed_in_a_row >= max_failures_in_a_row:
                raise StitchNASError(
                    f"the last {failed_in_a_row} trials all failed (latest: {reason}); "
                    "see fail_reason in trials.csv for the cause"
                )

        while not stitch.exhausted():
            finished, running = tally.read(n_trials)
            if finished >= n_trials:
                break
            # the trials in flight may finish the search (or give a ticket back)
            if finished + running >= n_trials or not get(tickets.take.remote(me)):
                time.sleep(_WAIT_S)
                continue
            study.optimize(stitch, n_trials=1, callbacks=[stop_on_failures], catch=())
            tally.own += 1
        return {"exhausted": stitch.exhausted()}


class _Tickets:
    """The trials a search may still start, one ticket each, handed out by one Ray actor.

    A trial that does not count (a repeat, a failure) gives its ticket back; a counted one
    spends it; the driver releases the tickets of a worker that died holding them.
    """

    def __init__(self, left: int) -> None:
        self.left, self.held = left, collections.Counter[str]()

    def take(self, worker: str) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        self.held[worker] += 1
        return True

    def spend(self, worker: str) -> None:
        self.held[worker] -= 1

    def give_back(self, worker: str) -> None:
        self.held[worker] -= 1
        self.left += 1

    def release(self, worker: str) -> None:
        self.left += self.held.pop(worker, 0)


class _Tally:
    """How far the search is: finished distinct networks, and this search's running trials.

    Reading it means reading every trial of the study, as much SQL as a trial's own ask, so it
    is read at most once a second, with this worker's own trials counted in between; but at
    every trial once the search is so close to the total that a second of the study's progress
    (all workers, at its rate so far) could reach it, and during the first second.
    """

    def __init__(self, study: optuna.Study, run: str) -> None:
        self.study, self.run = study, run
        # trials this worker ran since the last read; repeats too, so it may overcount, which
        # only makes a read exact sooner: a worker stops or waits on exact reads alone
        self.own = 0
        self._finished, self._running, self._at = 0, 0, -math.inf
        self._first: tuple[float, int] | None = None  # (time, finished) at the first read
        self._step = math.inf  # finished trials a second may add; unknown until a second passed

    def read(self, n_trials: int) -> tuple[int, int]:
        """(finished, running): read exactly when a second of the study's progress could reach
        ``n_trials`` from the last read, else estimated."""
        estimate = self._finished + self.own
        near = estimate + self._running + self._step >= n_trials
        if not near and time.monotonic() - self._at < _READ_EVERY_S:
            return estimate, self._running
        states = (_TrialState.COMPLETE, _TrialState.PRUNED, _TrialState.RUNNING)
        trials = self.study.get_trials(deepcopy=False, states=states)
        finished = sum(t.state != _TrialState.RUNNING and not is_repeat(t) for t in trials)
        running = sum(
            t.state == _TrialState.RUNNING
            and str(t.user_attrs.get(attrs.RAY_WORKER, "")).startswith(self.run)
            for t in trials
        )
        now = time.monotonic()
        if self._first is None:
            self._first = (now, finished)
        elif now - self._first[0] >= _READ_EVERY_S:
            rate = (finished - self._first[1]) / (now - self._first[0])
            self._step = math.ceil(rate * _READ_EVERY_S) + 1
        self._finished, self._running, self._at, self.own = finished, running, now, 0
        return finished, running


class StudyWorkerRun:
    """One search on :class:`StudyWorker` actors: :meth:`open` the study in each (start-up),
    then :meth:`drive` it to the requested total.

    Args:
        ray: The ``ray`` module.
        pool: The started actors.
        objective: The driver's objective (its settings go to the workers).
        study: The driver's study; ``storage`` is where every worker opens it.
        heartbeat_s: Heartbeat interval of the workers' storage.
        max_failures_in_a_row: Failed trials in a row in one worker, or workers died in the
            search, that stop it with an error.
    """

    def __init__(
        self,
        ray: Any,
        pool: _Pool,
        objective: StitchObjective,
        study: optuna.Study,
        *,
        storage: str,
        heartbeat_s: int,
        max_failures_in_a_row: int,
    ) -> None:
        self.ray, self.pool, self.objective, self.study = ray, pool, objective, study
        self.storage, self.heartbeat_s = storage, heartbeat_s
        self.max_failures_in_a_row = max_failures_in_a_row
        self.run, self._starts = uuid.uuid4().hex[:8], itertools.count()
        self._portable = objective.portable()
        self._ids: dict[int, str] = {}  # slot -> the id of the worker there now

    def _open(self, slot: int) -> Any:
        start = next(self._starts)
        worker_id = self._ids[slot] = f"{self.run}-{slot}-{start}"
        sampler, proxy = self.study.sampler, None
        if isinstance(sampler, ProxySampler):  # its scoring holds the driver's context
            proxy = (sampler.candidates, sampler.seed)
            sampler = sampler.base
        return self.pool.actors[slot].open_study.remote(
            self.storage,
            self.study.study_name,
            self.heartbeat_s,
            sampler,
            self._portable,
            worker_id,
            start > 0,  # the first worker samples as the driver would have: one is seeded
            proxy,
        )

    def open(self) -> None:
        """Open the study in every worker; a worker that cannot stops the search here."""
        refs = [self._open(slot) for slot in range(len(self.pool.actors))]
        try:
            self.ray.get(refs)
        except self.ray.exceptions.RayError as exc:
            cause = getattr(exc, "cause", None) or exc
            if isinstance(cause, StitchNASError):  # the storage cannot be opened there, say
                raise cause from exc
            first = exception_line(cause)
            raise StitchNASError(f"a Ray worker could not open the study: {first}") from exc

    def drive(self, n_trials: int, progress: bool) -> dict[str, Any]:
        """Run every worker until the study holds ``n_trials`` finished networks.

        A worker that dies has its running trials marked FAIL and is replaced, its slot started
        again while the total is not reached; more than ``max_failures_in_a_row`` deaths stop
        the search. Returns this search's trials by outcome and by Ray node, read from the study.
        """
        from tqdm.auto import tqdm

        ray, study, limit = self.ray, self.study, self.max_failures_in_a_row
        in_flight: dict[Any, int] = {}  # ObjectRef of a drive() -> its slot

        def start(slot: int) -> None:
            in_flight[self.pool.actors[slot].drive.remote(n_trials, limit, tickets)] = slot

        exhausted, died = False, 0
        done = completed_count(study)
        tickets = ray.remote(num_cpus=0)(_Tickets).remote(max(0, n_trials - done))
        bar = tqdm(total=n_trials, initial=min(done, n_trials), desc="trials", disable=not progress)
        try:
            for slot in range(len(self.pool.actors)):
                start(slot)
            while in_flight:
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
                for ref in ready:
                    slot = in_flight.pop(ref)
                    try:
                        exhausted = exhausted or bool(ray.get(ref)["exhausted"])
                    except ray.exceptions.RayTaskError as exc:  # it raised: the search stops
                        if isinstance(exc.cause, StitchNASError):  # too many failed trials
                            raise exc.cause from exc
                        raise StitchNASError(
                            f"a Ray worker raised {exception_line(exc.cause or exc)}"
                        ) from exc
                    except ray.exceptions.RayError as exc:  # it died (killed, out of memory...)
                        reason = f"worker died: {type(exc).__name__}"
                        failed = fail_running(study, reason, self._ids[slot])
                        logger.warning("worker %d died in trials %s: %s", slot, failed, exc)
                        died += 1
                        if died > limit:
                            raise StitchNASError(
                                f"{died} Ray workers died in this search (latest: "
                                f"{exception_line(exc)}); see the Ray logs for the cause"
                            ) from exc
                        tickets.release.remote(self._ids[slot])  # before _open renames it
                        self.pool.replace(slot)
                        if completed_count(study) < n_trials:
                            self._open(slot)  # the actor runs it before the drive() below
                            start(slot)
                bar.update(min(completed_count(study), n_trials) - bar.n)
        finally:
            bar.close()
            if in_flight:  # stopped early: the workers go, their trials are not left RUNNING
                self.pool.stop()
                for slot in in_flight.values():
                    fail_running(study, "driver stopped mid-trial", self._ids[slot])
        if exhausted:
            logger.warning(self.objective.exhausted_message(study, n_trials))
        return _counts(study, self.run + "-")


def _counts(study: optuna.Study, run: str) -> dict[str, Any]:
    """What this search's workers did, read from the study: trials by outcome and by node."""
    counts: dict[str, Any] = {"complete": 0, "pruned": 0, "failed": 0, "duplicates": 0}
    nodes: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False):
        if not str(trial.user_attrs.get(attrs.RAY_WORKER, "")).startswith(run):
            continue
        repeat = is_repeat(trial)
        key = "duplicates" if repeat else _COUNT_KEY.get(trial.state)
        if key is None:  # still running: another driver's worker cannot be; ours are done
            continue
        counts[key] += 1
        if not repeat:
            node = str(trial.user_attrs.get(attrs.RAY_NODE))
            nodes[node] = nodes.get(node, 0) + 1
    counts["trials_per_node"] = nodes
    return counts


_COUNT_KEY = {
    _TrialState.COMPLETE: "complete",
    _TrialState.PRUNED: "pruned",
    _TrialState.FAIL: "failed",
}
