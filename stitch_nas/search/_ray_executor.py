"""Run a search on Ray workers: N trials in flight, fed by Optuna's ask/tell.

The driver asks the study for a trial and plans it (:meth:`StitchObjective.plan`: samples its
:class:`~stitch_nas.config.StitchConfig`, cheap, since the search space only reads cut lists
and MAC tables; checks it is new; takes the front its gate compares with), and sends the
:class:`~stitch_nas.search.TrialPlan` to an idle worker. Workers are Ray actors that each hold
the zoo (put in the object store once) and their own bounded activation cache, filled on demand
as the local executor's is (:mod:`._ray_shared`); a worker evaluates the plan
(:func:`~stitch_nas.search.evaluate_plan`: CKA-prunes, fits and measures the config) and sends
back a :class:`~stitch_nas.search.TrialOutcome`. The driver records it with
the same bookkeeping as the local executor (:meth:`StitchObjective.finish`) and tells the study
(:mod:`._ray_driver`).
TPE's constant liar handles the trials still in flight. A config evaluated before or in flight
(here or in another driver on the study) is told PRUNED at once as a repeat and does not count
(:meth:`StitchObjective.duplicate`); the driver knows its own trials at once and reads other
drivers' at most once a second.

A stitch of a jointly trained network (SN-Net's) is trained once here, on the driver, when the
first such config is sampled, and its weights reach the workers through the object store
(:class:`~stitch_nas.search._ray_shared.NetworkShipper`); a failed training fails that trial.

Failures are isolated: a trial that raises or returns NaN is recorded FAIL with its reason; a
worker that dies (killed, out of memory) fails only its trial and is replaced. A run stops with
an error when ``max_failures_in_a_row`` trials fail in a row, rather than spin.

The zoo's models on their own (the study's references) are measured on the workers too, spread
over them before the first trial: where trials run, timed on the workers' hardware as trials are,
and so that the driver runs no network (on a cluster its node may have no GPU). Its memory then
does not grow with the validation split: in ``benchmarks/imagenet_scale.py`` (code ``7679bee``) the
driver, which measured them then, peaked 16 % higher at 5,000 validation images than at 1,000.

The driver writes each trial's user attributes in one write, twice per trial (the config
when it is sent, the measurement when it is back), and records Optuna heartbeats for the trials
in flight when the storage has them (a killed driver's trials then become FAIL for the others).
Each finished trial records the Ray node it ran on (``ray_node``).

That is ``mode="driver"``. With ``mode="workers"`` the workers ask and tell the study themselves
and the driver only watches (:mod:`._ray_study_workers`): no process is a bottleneck, but every
worker must reach the study's storage. ``mode="auto"`` (the default) picks the workers mode where
it pays: a study on a database server, or in an SQLite file while Ray runs on this machine only,
and a space without a jointly trained SN-Net (shipped once in driver mode). On a journal file it
keeps the driver mode, which measured as fast or faster there.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import optuna
import torch

from stitch_nas import attrs
from stitch_nas.activations import StitchContext
from stitch_nas.choices import (
    RAY_MODES,
    check_at_least,
    check_gpus_per_worker,
    check_one_of,
    check_positive,
)
from stitch_nas.errors import ConfigError
from stitch_nas.machine import available_memory_bytes
from stitch_nas.stitching import NETWORKS

from ._ray_driver import drive_trials
from ._ray_map import map_on_workers
from ._ray_resources import (
    CONNECT_TIMEOUT_S,
    WORKER_BASE_BYTES,
    check_ray_address,
    context_bytes,
    fit_workers,
    local_cpus,
)
from ._ray_shared import import_ray, share_context
from ._ray_study_workers import StudyWorker, StudyWorkerRun
from ._ray_workers import TrialWorker, _Pool
from ._runner import StitchObjective
from ._storage import (
    DEFAULT_HEARTBEAT_S,
    heartbeat_of,
    is_file_storage,
    storage_url_of,
)
from ._studies import completed_count

__all__ = ["RAY_MODES", "RAY_NODE", "RayExecutor", "StudyWorker", "TrialWorker"]

logger = logging.getLogger(__name__)

#: trial user attribute: the Ray node id the trial ran on
RAY_NODE = attrs.RAY_NODE


@dataclass
class RayExecutor:
    """Runs trials on ``workers`` Ray actors (``run_search(..., executor=RayExecutor(...))``).

    Attributes:
        workers: Number of actors, i.e. trials in flight.
        address: Ray cluster to join (``"auto"``, ``"ray://host:10001"``...); None starts a
            local Ray with ``workers * cpus_per_worker`` CPUs and no dashboard.
        cpus_per_worker: CPUs reserved by each actor (and its torch threads).
        gpus_per_worker: GPUs per actor, fractions allowed; None: when the context's device is
            CUDA, the visible GPUs shared out (at most 1 each), else 0.
        max_failures_in_a_row: Stop with an error after this many consecutive failed trials;
            None: ``max(10, 2 * workers)``.
        mode: ``"driver"``: the driver asks and tells, workers evaluate; ``"workers"``: each
            worker asks and tells a study it opens itself; ``"auto"``: see the module docstring.
        connect_timeout_s: Seconds ``address`` has to answer as Ray before it is joined
            (``search.ray_connect_timeout_s``).
        worker_class: The actor body; a subclass of :class:`TrialWorker`, or of
            :class:`StudyWorker` for the workers mode (tests inject faults this way).
        last_run: Figures of the latest :meth:`run` (trials, seconds, restarts, trials per
            Ray node...).
    """

    workers: int = 2
    address: str | None = None
    cpus_per_worker: float = 1.0
    gpus_per_worker: float | None = None
    max_failures_in_a_row: int | None = None
    mode: str = "auto"
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    worker_class: type[TrialWorker] = StudyWorker
    last_run: dict[str, Any] = field(default_factory=dict)
    #: workers the latest :meth:`run` started: ``workers`` capped by what there is
    running: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        # the checks the settings file's values meet (stitch_nas.settings.FIELD_CHECKS)
        check_at_least(self.workers, "workers", 1)
        check_positive(self.cpus_per_worker, "cpus_per_worker")
        check_gpus_per_worker(self.gpus_per_worker, "gpus_per_worker")
        check_one_of(self.mode, "mode", RAY_MODES)
        check_positive(self.connect_timeout_s, "connect_timeout_s")
        if self.mode == "workers" and not issubclass(self.worker_class, StudyWorker):
            raise ConfigError("mode='workers' needs a worker_class derived from StudyWorker")
        import_ray()  # a missing Ray extra fails here, before the zoo and the data load

    def mode_for(self, objective: StitchObjective, study: optuna.Study) -> str:
        """The mode a search of ``objective`` on ``study`` runs in: ``"driver"`` or ``"workers"``.

        Raises:
            ConfigError: ``mode="workers"`` on a study no worker can open (in memory, or a
                user's own study object).
        """
        url = storage_url_of(study)
        if self.mode == "driver":
            return "driver"
        if self.mode == "workers":
            if url is None:
                raise ConfigError(
                    "Ray mode 'workers' needs a study that every worker can open (DIR/study.db, "
                    "--storage URL or journal file); this one was not opened from one; use "
                    "mode 'driver'"
                )
            return "workers"
        # a journal file: the driver's ask and tell are cheap (~2 ms) and every process replays
        # the others' appends, so workers that open it themselves measured slower (README)
        rdb = url is not None and "://" in url
        shared = rdb and (self.address is None or not is_file_storage(cast(str, url)))
        studies = issubclass(self.worker_class, StudyWorker)
        # a jointly trained network (SN-Net's) is trained once, on the driver, and shipped
        joint = any(
            NETWORKS.get(kind).searched_by(objective.space_name, objective.space_options)
            for kind in NETWORKS
        )
        return "workers" if shared and studies and not joint else "driver"

    def run(
        self, objective: StitchObjective, study: optuna.Study, n_trials: int, *, progress: bool
    ) -> optuna.Study:
        """Run until ``study`` holds ``n_trials`` finished (complete or pruned) networks, the
        zoo's references first where the study lacks them (:meth:`_Pool.references`)."""
        mode = self.mode_for(objective, study)  # a bad mode fails before Ray starts
        with self._pool(objective, max(1, n_trials - completed_count(study))) as pool:
            before = time.perf_counter()
            if attrs.REFERENCES not in study.user_attrs:  # before any worker opens the study
                study.set_user_attr(attrs.REFERENCES, pool.references(objective.ctx.zoo.names()))
            start = time.perf_counter()
            session = None
            if mode == "workers":  # each worker opens the study: start-up, like the pool's
                session = self._session(pool.ray, objective, study, pool)
                session.open()
            ready, cpu = time.perf_counter(), time.process_time()
            if session is not None:
                counts = session.drive(n_trials, progress)
            else:
                counts = drive_trials(
                    pool.ray,
                    objective,
                    study,
                    n_trials,
                    pool,
                    progress,
                    workers=self.running,
                    limit=self._limit(),
                )
            end = time.perf_counter()
            self.last_run = {
                **counts,
                "mode": mode,
                "workers": self.running,
                "startup_seconds": pool.startup_seconds + ready - start,
                "references_seconds": start - before,
                "search_seconds": end - ready,
                # the driver's own CPU time (asking, sampling, recording): what limits scaling
                "driver_cpu_seconds": time.process_time() - cpu,
                "worker_restarts": pool.restarts,
                "worker_cache": pool.cache_stats(),
            }
        return study

    def references(self, objective: StitchObjective) -> list[dict[str, Any]]:
        """The zoo's models on their own, measured on the workers (:meth:`_Pool.references`),
        for a study that needs them before its first trial (seeding's proposals)."""
        names = objective.ctx.zoo.names()
        with self._pool(objective, len(names)) as pool:
            return pool.references(names)

    @contextlib.contextmanager
    def _pool(self, objective: StitchObjective, left: int) -> Iterator[_Pool]:
        """Ray started or joined, :attr:`running` workers started for ``left`` trials or
        jobs; on the way out the workers stopped and a Ray of our own shut down."""
        ray = import_ray()
        started = self._start(ray, objective.ctx, left)
        pool: _Pool | None = None
        try:
            start = time.perf_counter()
            pool = _Pool(
                ray,
                share_context(objective.ctx),
                objective.evaluation_options(),
                self._resources(objective.ctx),
                self.worker_class,
            )
            pool.start(self.running)
            pool.startup_seconds = time.perf_counter() - start
            yield pool
        finally:
            if pool is not None:
                pool.stop()
            if started:
                ray.shutdown()

    def map(
        self, ctx: StitchContext, fn: Callable[[StitchContext, Any], Any], items: Sequence[Any]
    ) -> list[Any]:
        """``fn(context, item)`` for each of ``items`` on ``workers`` Ray workers at once, each
        on its own copy of ``ctx`` (:func:`._ray_map.map_on_workers`); the results in order."""
        ray = import_ray()
        started = self._start(ray, ctx, len(items))
        try:
            shared = share_context(ctx)
            return map_on_workers(shared, fn, items, self.running, self._resources(ctx))
        finally:
            if started:
                ray.shutdown()

    def _start(self, ray: Any, ctx: StitchContext, left: int) -> bool:
        """Size :attr:`running` for ``left`` trials or jobs and start or join Ray; True if
        we started it."""
        here = self.address is None and not ray.is_initialized()  # a Ray of our own
        if here:  # sized before it starts: it gets as many CPUs as workers need
            self.running = self._fit(ctx, left, local_cpus(), available_memory_bytes())
        started = self._init_ray(ray)
        if not here:  # a cluster (or a Ray already running): what it has
            have = ray.cluster_resources()
            self.running = self._fit(ctx, left, have.get("CPU", 1), have.get("memory", 0))
        return started

    def _init_ray(self, ray: Any) -> bool:
        """Start or join Ray unless it is running in this process; True if we started it."""
        if ray.is_initialized():
            return False
        # ray.init would retry an unreachable one for minutes
        check_ray_address(self.address, self.connect_timeout_s)
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
        if self.address is None:
            kwargs["num_cpus"] = max(1, math.ceil(self.running * self.cpus_per_worker))
        try:
            ray.init(address=self.address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            where = f"the Ray cluster at {self.address!r}" if self.address else "a local Ray"
            raise ConfigError(f"could not start {where}: {first}; check --ray-address") from exc
        return True

    def _fit(self, ctx: StitchContext, left: int, cpus: float, memory: float) -> int:
        """:func:`fit_workers` for ``left`` jobs, with a one-line warning when it caps them."""
        # each worker holds a copy of the zoo and the data, and a cache as large as the driver's
        each = WORKER_BASE_BYTES + context_bytes(ctx) + ctx.cache.budget_bytes
        n, why = fit_workers(self.workers, left, cpus, self.cpus_per_worker, memory, each)
        if why:
            logger.warning("starting %d Ray worker(s), not %d: %s", n, self.workers, "; ".join(why))
        return n

    def _resources(self, ctx: StitchContext) -> dict[str, float]:
        gpus = self.gpus_per_worker
        if gpus is None:
            cuda = ctx.device.type == "cuda" and torch.cuda.is_available()
            gpus = min(1.0, torch.cuda.device_count() / self.running) if cuda else 0.0
        return {"num_cpus": self.cpus_per_worker, "num_gpus": gpus}

    def _limit(self) -> int:
        return self.max_failures_in_a_row or max(10, 2 * self.running)

    def _session(
        self, ray: Any, objective: StitchObjective, study: optuna.Study, pool: _Pool
    ) -> StudyWorkerRun:
        beat = heartbeat_of(study)
        return StudyWorkerRun(
            ray,
            pool,
            objective,
            study,
            storage=cast(str, storage_url_of(study)),
            heartbeat_s=DEFAULT_HEARTBEAT_S if beat is None else round(beat.interval),
            max_failures_in_a_row=self._limit(),
        )
