"""How many images a forward pass over a split takes, when the caller does not say.

The cache's budget bounds what is kept; a forward pass also holds a few tensors of one batch at
a time beside it. At 32x32 a batch of 256 is a few MB; at 224x224 one batch of a ResNet-50
layer-1 activation is 822 MB in float32, and with the tensors around it a pass took about 4 GB.
So the default batch shrinks with the zoo's largest activation.

On a GPU the batch is the largest that fits the GPU: its free memory, less what the cache's
device budget may still take there, shared by ``LIVE_ACTIVATIONS`` copies of one batch of the
largest activation, up to ``GPU_MAX_BATCH`` and to what one batch of either cache budget (host
and device) may hold. The host budget takes nothing from the GPU: its buffers live in host
memory. It is chosen once, from the free memory when the first pass starts, and never retried
after an out-of-memory error: a GPU shared with other work should be given ``batch_size``.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ._view import ContextView

__all__ = [
    "GPU_MAX_BATCH",
    "LIVE_ACTIVATIONS",
    "MAX_BATCH",
    "WORK_BATCH_BYTES",
    "auto_batch_size",
    "largest_activations",
]

logger = logging.getLogger(__name__)

MAX_BATCH = 256  #: the default batch size where images are small
#: the float32 bytes one batch of the zoo's largest activation may take by default; a forward
#: pass holds a few such tensors at once, beside the cache's budget
WORK_BATCH_BYTES = 128 * 2**20
#: the largest default batch on a GPU (beyond it a pass gains little and the host's copy of a
#: batch of images grows: 0.6 GB at 224x224 in float32)
GPU_MAX_BATCH = 1024
#: batches of the largest activation a forward pass holds at once on a GPU, with room to spare:
#: its input, its output, a residual branch, and the kernels' workspace
LIVE_ACTIVATIONS = 4


def largest_activations(ctx: ContextView) -> tuple[int, int]:
    """Elements per image of the zoo's largest activation (at a cut or at a model's input) and
    of its largest at a cut: what a batch size is chosen for."""
    largest = largest_cut = 1
    for name in ctx.zoo.names():
        cuts = [math.prod(c.shape) for c in ctx.cuts(name)]
        largest = max(largest, math.prod(ctx.input_shape(name)), *cuts)
        largest_cut = max([largest_cut, *cuts])
    return largest, largest_cut


def auto_batch_size(ctx: ContextView) -> int:
    """``MAX_BATCH``, or fewer (at least 1) so that one batch of the largest activation of any
    zoo model, at a cut or at its input, stays within ``WORK_BATCH_BYTES`` in float32."""
    largest, largest_cut = largest_activations(ctx)
    if ctx.device.type == "cuda":
        return _gpu_batch_size(ctx, largest, largest_cut)
    batch = max(1, min(MAX_BATCH, WORK_BATCH_BYTES // (4 * largest)))
    if batch < MAX_BATCH:
        logger.info(
            "batch size %d: one batch of the zoo's largest activation fits in %d MiB",
            batch,
            WORK_BATCH_BYTES // 2**20,
        )
    return batch


def _gpu_batch_size(ctx: ContextView, largest: int, largest_cut: int) -> int:
    """The largest batch whose ``LIVE_ACTIVATIONS`` float32 copies of the zoo's largest
    activation fit the GPU's free memory beside the cache (see the module's docstring)."""
    cache = ctx.cache
    free, _ = torch.cuda.mem_get_info(ctx.device)
    # what the cache holds on the GPU is not free already; what it may still take is set aside
    room = max(0, free - max(0, cache.device_budget_bytes - cache.device_memory_bytes))
    batch = min(GPU_MAX_BATCH, room // (LIVE_ACTIVATIONS * 4 * largest))
    element = torch.empty(0, dtype=cache.dtype).element_size()
    for budget in (cache.budget_bytes, cache.device_budget_bytes):
        if budget > 0:  # each budget takes one batch of a cut or more (check_budget)
            batch = min(batch, budget // (element * largest_cut))
    batch = max(1, batch)
    logger.info(
        "batch size %d on %s: %.1f GiB free beside the cache's %.1f GiB there",
        batch,
        ctx.device,
        room / 2**30,
        cache.device_budget_bytes / 2**30,
    )
    return batch
