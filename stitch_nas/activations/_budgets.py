"""The activation cache's two memory budgets, host and device, and their defaults: the one
rule (:func:`cache_budgets`) every cache follows, a search's and each Ray worker's."""

from __future__ import annotations

import torch

from stitch_nas.choices import check_memory_gb
from stitch_nas.machine import memory_limit_bytes

__all__ = [
    "DEFAULT_DEVICE_MEMORY_FRACTION",
    "DEFAULT_MEMORY_FRACTION",
    "cache_budgets",
    "default_device_memory_gb",
    "default_memory_gb",
]

#: fraction of the memory this process may use (:func:`~stitch_nas.machine.memory_limit_bytes`:
#: physical memory, or a container's cgroup limit where lower) that the cache may hold in host
#: memory by default. The cache fills with the validation activations of the cuts trials use, so
#: below its budget the peak memory grows with the data; 5 % (1.18 GiB on a 24 GB machine) is
#: about what the probe at every cut and ten trials' cuts take at the smallest CIFAR size of
#: ``benchmarks/scale.py``, so the peak stays within +9 % from 1,250 to 5,000 images there,
#: and within a sixth of the machine at ImageNet size. Users with memory to spare raise
#: ``memory_gb`` and recompute less
DEFAULT_MEMORY_FRACTION = 0.05
#: fraction of a GPU's free memory (when the cache is made) that the cache may hold on it by
#: default; the zoo's weights and the forward passes take the rest, their batch sized from what
#: is free beside the cache (:func:`~stitch_nas.activations.auto_batch_size`)
DEFAULT_DEVICE_MEMORY_FRACTION = 0.25


def default_memory_gb() -> float:
    """The default host budget in GiB: :data:`DEFAULT_MEMORY_FRACTION` of the memory this
    process may use (a cgroup's limit where lower than physical memory), else 2."""
    total = memory_limit_bytes()
    return DEFAULT_MEMORY_FRACTION * total / 2**30 if total else 2.0


def default_device_memory_gb(device: str | torch.device) -> float:
    """The default device budget in GiB: :data:`DEFAULT_DEVICE_MEMORY_FRACTION` of a CUDA
    device's free memory now; 0 on any other device (no default there, entries stay on the
    host)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0.0
    free, _ = torch.cuda.mem_get_info(device)
    return DEFAULT_DEVICE_MEMORY_FRACTION * free / 2**30


def cache_budgets(
    memory_gb: float | None, device_memory_gb: float | None, device: str | torch.device
) -> tuple[float, float]:
    """An activation cache's two budgets in GiB, ``(host, device)``: host memory, and the
    memory of ``device`` (a GPU) for entries kept there.

    The one rule every cache follows (a search's, each Ray worker's for its own device): a
    value given is checked and kept; None is the default, :func:`default_memory_gb` for the
    host and :func:`default_device_memory_gb` for the device. On the CPU the device part is 0:
    everything lives in host memory.

    Raises:
        ConfigError: If a value given is negative or not finite.
    """
    host = default_memory_gb() if memory_gb is None else check_memory_gb(memory_gb)
    on_device = None
    if device_memory_gb is not None:
        on_device = check_memory_gb(device_memory_gb, "device_memory_gb")
    if torch.device(device).type == "cpu":
        return host, 0.0
    return host, default_device_memory_gb(device) if on_device is None else on_device
