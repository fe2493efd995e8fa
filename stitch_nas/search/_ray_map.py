"""Independent jobs on Ray workers, each on its own copy of the driver's context.

The search's trials need a pool of actors that the driver keeps busy; a list of jobs known up
front (the fine-tune stage's networks) needs only tasks: each rebuilds the context the driver
shared once through the object store (:class:`~._ray_shared.SharedContext`), runs its job and
returns what the job returns. At most ``running`` are in flight, so each gets the CPUs (and
GPU share) a search's worker gets. A job's result is the same as in this process for the same
seed and thread count: nothing it computes depends on the process it runs in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from stitch_nas.errors import StitchNASError

from ._evaluate import exception_line
from ._ray_shared import SharedContext, import_ray

__all__ = ["map_on_workers"]

Item = TypeVar("Item")
Result = TypeVar("Result")


def map_on_workers(
    shared: SharedContext,
    fn: Callable[[Any, Item], Result],
    items: Sequence[Item],
    running: int,
    resources: dict[str, float],
) -> list[Result]:
    """``fn(context, item)`` for each of ``items`` in Ray tasks, ``running`` at once; the
    results in the order of ``items``.

    Raises:
        StitchNASError: A job raised one (as it did), or another exception (its first line,
            and which job), or its worker died.
    """
    ray = import_ray()
    task = ray.remote(_run).options(**resources, max_retries=0)
    cpus = max(1, int(resources["num_cpus"]))
    results: list[Any] = [None] * len(items)
    waiting = list(range(len(items)))
    pending: dict[Any, int] = {}
    while waiting or pending:
        while waiting and len(pending) < running:
            index = waiting.pop(0)
            pending[task.remote(shared, fn, items[index], cpus)] = index
        (ready,), _ = ray.wait(list(pending), num_returns=1)
        index = pending.pop(ready)
        try:
            results[index] = ray.get(ready)
        except ray.exceptions.RayError as exc:
            for ref in pending:  # the others' work is lost with the run: stop it now
                ray.cancel(ref, force=True)
            cause = getattr(exc, "cause", None) or exc
            if isinstance(cause, StitchNASError):  # the job's own one-line error, as in here
                raise cause from exc
            raise StitchNASError(
                f"job {index + 1} of {len(items)} failed on a Ray worker: {exception_line(cause)}"
            ) from exc
    return results


#: the context this worker process rebuilt last, by the shared bundle and device: Ray runs a
#: map's tasks in the same few processes, so a worker's second job finds the zoo, the data and
#: the activations its first one cached (one context a process, as an actor holds)
_held: dict[tuple[str, str], Any] = {}


def _run(shared: SharedContext, fn: Callable[[Any, Any], Any], item: Any, cpus: int) -> Any:
    """In a Ray task: the context rebuilt on this worker's device (or the one this process
    rebuilt for an earlier job of the same map), then the job."""
    ray = import_ray()
    device = "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"
    key = (shared.bundle.hex(), device)
    if key not in _held:
        _held.clear()
        _held[key] = shared.materialize(device, cpus=cpus)
    return fn(_held[key], item)
