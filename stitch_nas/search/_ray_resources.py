"""What a Ray search may start: workers capped by the trials left, the CPUs there are and the
memory free (the cluster's address: :func:`stitch_nas.ray_address.check_ray_address`, torch-free
so the CLI asks it before any slow work).

Each worker holds a copy of the zoo and the in-memory data besides a Python process with torch
and Ray (:data:`WORKER_BASE_BYTES`): ``--workers 64`` on a 2-core machine starts 2, with one
warning.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from stitch_nas.ray_address import CONNECT_TIMEOUT_S, check_ray_address

__all__ = [
    "CONNECT_TIMEOUT_S",
    "WORKER_BASE_BYTES",
    "check_ray_address",
    "context_bytes",
    "fit_workers",
    "local_cpus",
]

#: what a worker process holds besides its copy of the zoo and the data: Python, torch and
#: Ray's own (0.5 to 1 GB a worker measured on a 2-core machine, issue 35)
WORKER_BASE_BYTES = 512 * 2**20


def fit_workers(
    asked: int,
    trials_left: int,
    cpus: float,
    cpus_per_worker: float,
    memory_bytes: float,
    worker_bytes: float,
) -> tuple[int, list[str]]:
    """How many workers to start: ``asked``, but no more than the trials left, the CPUs there
    are (``cpus_per_worker`` each) and the memory free (``worker_bytes`` each; 0: unknown).
    Returns the number and what held it down (empty: nothing did); always at least one."""
    n, why = asked, []
    limits = [(trials_left, f"{trials_left} trial(s) left")]
    limits.append((int(cpus // cpus_per_worker), f"{cpus:g} CPU(s), {cpus_per_worker:g} each"))
    if memory_bytes > 0:
        each = f"about {worker_bytes / 2**30:.1f} GB each"
        limits.append(
            (
                int(memory_bytes // worker_bytes),
                f"{memory_bytes / 2**30:.1f} GB of memory free, {each}",
            )
        )
    for limit, reason in limits:
        if max(1, limit) < n:
            n = max(1, limit)
            why.append(reason)
    return n, why


def context_bytes(ctx: Any) -> int:
    """Bytes of the zoo's weights and the in-memory images a worker gets a copy of."""
    total = 0
    for name in ctx.zoo.names():
        total += sum(
            t.numel() * t.element_size() for t in ctx.zoo[name].model.state_dict().values()
        )
    for split in ctx.data.splits().values():
        images = getattr(split.x, "pixels", split.x)  # uint8 sources hold their pixels
        if isinstance(images, torch.Tensor):
            total += images.numel() * images.element_size()
    return total


def local_cpus() -> int:
    """The CPUs this process may run on (a container's or taskset's limit, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1
