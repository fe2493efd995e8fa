"""What an activation depends on (:class:`ActivationKey`), weight fingerprints, and the
cache's defaults: its two memory budgets (:func:`cache_budgets`) and the dtypes activations may
be stored in.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

import torch
from torch import nn

from stitch_nas.choices import check_memory_gb
from stitch_nas.errors import ConfigError
from stitch_nas.machine import machine_memory_bytes, memory_limit_bytes

__all__ = [
    "DEFAULT_DEVICE_MEMORY_FRACTION",
    "DEFAULT_MEMORY_FRACTION",
    "FORMAT",
    "STORAGE_DTYPES",
    "ActivationKey",
    "cache_budgets",
    "default_device_memory_gb",
    "default_memory_gb",
    "machine_memory_bytes",
    "memory_limit_bytes",
    "storage_dtype",
    "weights_fingerprint",
]

# bump when the digest recipe, the file layout or how activations are computed changes, to
# orphan old files (2: activations at a cut followed by an in-place op were overwritten;
# 3: the storage dtype joined the key; 4: the autocast dtype joined it)
FORMAT = 4


@dataclass(frozen=True)
class ActivationKey:
    """Everything an activation depends on; any change gives a new digest and a fresh entry.

    Attributes:
        model: Zoo name of the model.
        weights: Fingerprint of the model's weights (see :func:`weights_fingerprint`).
        cut: Cut point name, or None for the model's output.
        split: Data split name (``"probe"``, ``"val"``...).
        data: Fingerprint of the data set.
        preprocess: ``repr`` of the input spec (resize, normalisation...).
        dtype: Storage dtype of the cached values (``"float16"`` rounds them).
        autocast: The dtype the forward pass ran in under autocast (None: float32).
    """

    model: str
    weights: str
    cut: str | None
    split: str
    data: str
    preprocess: str
    dtype: str = "float32"
    autocast: str | None = None

    def digest(self) -> str:
        """Return the first 32 hex characters of the sha256 of a canonical form of the key."""
        # JSON keeps None apart from the string "None" and cannot confuse field boundaries
        canonical = json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def weights_fingerprint(module: nn.Module) -> str:
    """Return the sha256 hex digest of a module's parameters and buffers.

    Names, shapes, dtypes and raw bytes are hashed in name order, so a change to any weight or
    buffer (a BatchNorm running mean, for example) changes the fingerprint. It reads every byte
    (about 3 ms per million float32 parameters on a CPU, plus the copy of GPU tensors to the
    host), so callers should compute it once per model and memoise it.

    Args:
        module: The model to fingerprint.

    Raises:
        ConfigError: If a tensor lives on the meta device and so has no data to hash.
    """
    digest = hashlib.sha256(f"stitch_nas.weights.v{FORMAT}\0".encode())
    tensors: dict[str, torch.Tensor] = dict(module.named_parameters())
    tensors.update(module.named_buffers())
    for name in sorted(tensors):
        tensor = tensors[name].detach()
        if tensor.is_meta:
            raise ConfigError(
                f"tensor {name!r} is on the meta device; load real weights before fingerprinting"
            )
        # viewing the bytes as uint8 avoids a numpy round trip for dtypes numpy lacks (bfloat16)
        raw = tensor.cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        header = f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0{raw.nbytes}\0"
        digest.update(header.encode())
        digest.update(raw.data)
    return digest.hexdigest()


#: fraction of the memory this process may use (:func:`~stitch_nas.machine.memory_limit_bytes`:
#: physical memory, or a container's cgroup limit where lower) that the cache may hold in host
#: memory by default. The cache fills
#: with the validation activations of the cuts trials use, so below its budget the peak memory
#: grows with the data; 5 % (1.18 GiB on a 24 GB machine) is about what the probe at every cut
#: and ten trials' cuts take at the smallest CIFAR size of ``benchmarks/scale.py``, so the peak
#: stays within +9 % from 1,250 to 5,000 images there, and within a sixth of the machine at
#: ImageNet size. Users with memory to spare raise ``memory_gb`` and recompute less
DEFAULT_MEMORY_FRACTION = 0.05
#: fraction of a GPU's free memory (when the cache is made) that the cache may hold on it by
#: default; the zoo's weights and the forward passes take the rest, their batch sized from what
#: is free beside the cache (:func:`~stitch_nas.activations.auto_batch_size`)
DEFAULT_DEVICE_MEMORY_FRACTION = 0.25

#: storage dtypes of cached activations (numpy has no bfloat16, so spill files could not hold it)
STORAGE_DTYPES = {"float16": torch.float16, "float32": torch.float32}


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


def storage_dtype(name: str | torch.dtype) -> torch.dtype:
    """The torch dtype for a storage dtype name; ConfigError names the valid ones."""
    for key, dtype in STORAGE_DTYPES.items():
        if name in (key, dtype):
            return dtype
    raise ConfigError(f"cache dtype {name!r} is not supported; use one of {sorted(STORAGE_DTYPES)}")
