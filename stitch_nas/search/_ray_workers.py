"""The Ray side of a search: the worker actors and the pool that keeps them alive.

A :class:`TrialWorker` holds one StitchContext rebuilt from the driver's zoo and data, with its
own activation cache bounded as the driver's is, and evaluates the trial plans it is sent
(:class:`~._evaluate.TrialPlan`, pickled by Ray); the pool starts N of them, submits plans,
turns a raised task or a dead worker into a "fail" outcome
and replaces a dead worker in its slot. :mod:`._ray_executor` drives them from the study.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import optuna
import torch

from stitch_nas.config import StitchConfig
from stitch_nas.errors import StitchNASError
from stitch_nas.machine import reuse_freed_memory
from stitch_nas.stitching import fragment_macs

from ._evaluate import (
    EvaluationOptions,
    TrialOutcome,
    TrialPlan,
    evaluate_plan,
    exception_line,
)
from ._loop import measure_references
from ._ray_shared import SharedContext, import_ray, install_shipped

__all__ = ["START_TIMEOUT_S", "TrialWorker"]

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0  # workers that cannot be placed (too few CPUs/GPUs) fail the run


class TrialWorker:
    """A Ray actor body: one StitchContext rebuilt from the shared one, evaluating configs.

    The context's activation cache is the worker's own, filled on demand as a local run's is.

    Args:
        shared: The driver's shared context.
        evaluation: How the search evaluates every config.
        cpus: The CPUs this worker reserved, shared by its torch threads and the processes
            that decode image files (:meth:`SharedContext.materialize`).
    """

    def __init__(
        self,
        shared: SharedContext,
        evaluation: EvaluationOptions,
        cpus: int,
    ) -> None:
        ray = import_ray()
        reuse_freed_memory()  # as the driver's command line does: the same values, faster
        device = "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"
        self.ctx = shared.materialize(device, cpus=cpus)
        for name in self.ctx.zoo.names():  # trace each model and fill its MAC table up front
            fragment_macs(self.ctx, name, None, None)
        self.evaluation = evaluation
        self.node = ray.get_runtime_context().get_node_id()

    def ready(self) -> int:
        """The worker's process id, once it is built (used to wait for start-up)."""
        return os.getpid()

    def evaluate(
        self, number: int, plan: TrialPlan, networks: list[tuple[Any, Any]] | None = None
    ) -> dict[str, Any]:
        """Evaluate the driver's ``plan`` of trial ``number`` (:func:`evaluate_plan`); the
        outcome as a dict.

        ``networks``: the jointly trained networks the config names, as the driver shipped them
        (:class:`NetworkShipper`). The dict also holds ``"node"``, the Ray node id of this
        worker.
        """
        install_shipped(self.ctx, networks or [])
        outcome = evaluate_plan(self.ctx, plan, self.evaluation)
        return {**outcome.to_dict(), "node": self.node}

    def reference(self, name: str) -> dict[str, Any]:
        """Zoo model ``name`` on its own, measured here as the search's trials are
        (:func:`~stitch_nas.search.measure_references`): its row of the study's references."""
        return measure_references(self.ctx, [name], latency=self.evaluation.latency)[0]

    def cache_stats(self) -> dict[str, int]:
        """Counters of this worker's activation cache (:meth:`ActivationCache.stats`)."""
        return self.ctx.cache.stats()


@dataclass
class _Pending:
    trial: optuna.Trial
    config: StitchConfig
    worker: int
    node: str | None = None


class _Pool:
    """The worker actors; a dead one is replaced by a fresh one in the same slot."""

    def __init__(
        self,
        ray: Any,
        shared: SharedContext,
        evaluation: EvaluationOptions,
        resources: dict[str, float],
        worker_class: type[TrialWorker] = TrialWorker,
    ) -> None:
        self.ray, self.shared, self.evaluation = ray, shared, evaluation
        self.resources = resources
        self.actor_class = ray.remote(worker_class)
        self.actors: list[Any] = []
        self.restarts = 0
        self.startup_seconds = 0.0  #: sharing the context and starting the actors

    def _new(self) -> Any:
        cpus = max(1, int(self.resources["num_cpus"]))
        options = {**self.resources, "max_restarts": 0}
        return self.actor_class.options(**options).remote(self.shared, self.evaluation, cpus)

    def start(self, n: int) -> None:
        self.actors = [self._new() for _ in range(n)]
        try:
            self.ray.get([actor.ready.remote() for actor in self.actors], timeout=START_TIMEOUT_S)
        except self.ray.exceptions.GetTimeoutError as exc:
            raise StitchNASError(
                f"{n} Ray workers did not start within {START_TIMEOUT_S:.0f} s; the cluster may "
                f"lack {n} x {self.resources} free; lower --workers or add resources"
            ) from exc
        except self.ray.exceptions.RayError as exc:
            raise StitchNASError(f"Ray workers could not start: {exception_line(exc)}") from exc

    def submit(
        self,
        index: int,
        number: int,
        plan: TrialPlan,
        networks: list[tuple[Any, Any]] | None = None,
    ) -> Any:
        return self.actors[index].evaluate.remote(number, plan, networks)

    def result(self, ref: Any, pending: _Pending) -> TrialOutcome:
        """The trial's outcome; a raised task or a dead worker becomes a "fail" outcome."""
        exceptions = self.ray.exceptions
        try:
            result = dict(self.ray.get(ref))
            pending.node = result.pop("node", None)
            return TrialOutcome.from_dict(result)
        except exceptions.RayTaskError as exc:  # the trial raised; the worker lives on
            return TrialOutcome.failed(exc.cause or exc, "worker raised: ")
        except exceptions.RayError as exc:  # the worker died (killed, out of memory...)
            logger.warning(
                "worker %d died in trial %d: %s",
                pending.worker,
                pending.trial.number,
                exception_line(exc),
            )
            self.replace(pending.worker)
            return TrialOutcome("fail", reason=f"worker died: {type(exc).__name__}")

    def references(self, names: list[str]) -> list[dict[str, Any]]:
        """Each of the zoo models ``names`` on its own (:meth:`TrialWorker.reference`), spread
        over the workers (an actor runs its calls one by one); the rows in that order.

        Raises:
            StitchNASError: A worker raised or died; no trial has started.
        """
        refs = [
            self.actors[i % len(self.actors)].reference.remote(name) for i, name in enumerate(names)
        ]
        try:
            return list(self.ray.get(refs))
        except self.ray.exceptions.RayError as exc:
            raise StitchNASError(
                f"measuring the zoo's models on the Ray workers failed: {exception_line(exc)}"
            ) from exc

    def replace(self, index: int) -> None:
        try:
            self.ray.kill(self.actors[index], no_restart=True)
        except Exception as exc:  # noqa: BLE001 - it is dead already, most likely
            logger.debug("killing worker %d: %s", index, exc)
        self.actors[index] = self._new()
        self.restarts += 1

    def cache_stats(self) -> list[dict[str, int]] | None:
        """Each worker's activation-cache counters; None if a worker cannot answer."""
        try:
            return list(self.ray.get([actor.cache_stats.remote() for actor in self.actors]))
        except self.ray.exceptions.RayError as exc:
            logger.debug("cache stats: %s", exc)
            return None

    def stop(self) -> None:
        for actor in self.actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception as exc:  # noqa: BLE001 - best effort on the way out
                logger.debug("stopping a worker: %s", exc)
        self.actors = []
