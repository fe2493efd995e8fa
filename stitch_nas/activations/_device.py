"""Speed on the device: passes over frozen weights under bfloat16 autocast, and copies from the
host to a GPU through pinned memory that do not block.

Autocast (``StitchContext(autocast="bfloat16")``, ``search.autocast``) runs the convolutions and
matrix products of every pass that trains nothing in bfloat16: the zoo models' activations, the
rows that feed adapter training, and a network's measurement (its fitted stitches and head
included, since nothing trains there either). Least-squares fits, head fits and adapter
training stay float32, and every activation handed on is float32. bfloat16 keeps float32's
range, so nothing overflows, but it rounds to 8 bits of mantissa: a few near-tie predictions
flip. How many, on the real zoo, is measured by ``benchmarks/autocast.py`` and quoted in the
README. Off by default: a CPU without bfloat16 instructions runs it slower than float32, and
results should not change because a machine has a GPU.

The device itself defaults to ``"auto"`` (:func:`resolve_device`): CUDA where there is one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from stitch_nas import choices

__all__ = [
    "AUTOCAST_DTYPES",
    "check_autocast",
    "frozen_pass",
    "is_convolutional",
    "resolve_device",
    "to_device",
]

#: the dtypes frozen passes may run in, by name (``stitch_nas.choices.AUTOCAST_DTYPES``)
AUTOCAST_DTYPES = {name: getattr(torch, name) for name in choices.AUTOCAST_DTYPES}


def resolve_device(device: str | torch.device) -> torch.device:
    """``device`` as a torch device, ``"auto"`` as CUDA when this machine has it, else the CPU
    (not MPS, which lacks the float64 that CKA scores use)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def check_autocast(name: str | None, device: torch.device) -> str | None:
    """``name`` (None: off) if frozen passes on ``device`` can run in it; else ConfigError."""
    if name is None:
        return None
    choices.check_autocast_name(name)  # search.autocast's checks
    choices.check_autocast_device(name, device.type)
    return name


@contextlib.contextmanager
def frozen_pass(device: torch.device, autocast: str | None) -> Iterator[None]:
    """No autograd, and autocast to ``autocast`` (None: float32) on ``device``'s type."""
    with torch.no_grad():
        if autocast is None:
            yield
        else:
            with torch.autocast(device.type, dtype=AUTOCAST_DTYPES[autocast]):
                yield


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``x`` on ``device``: from the host to a GPU through pinned memory, without blocking.

    The host goes on (reading and preparing the next batch) while the copy runs; kernels that
    use the copy queue behind it on the same stream, and the pinned buffer is released only
    once the copy is done (PyTorch's caching host allocator records the stream).
    """
    if device.type == "cuda" and x.device.type == "cpu":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def is_convolutional(model: torch.nn.Module) -> bool:
    """Three or more Conv2d layers: such models run faster channels-last on the CPU."""
    return sum(isinstance(m, torch.nn.Conv2d) for m in model.modules()) >= 3
