"""How many images a forward pass over a split takes, when the caller does not say.

The cache's budget bounds what is kept; a forward pass also holds a few tensors of one batch at
a time beside it. At 32x32 a batch of 256 is a few MB; at 224x224 one batch of a ResNet-50
layer-1 activation is 822 MB in float32, and with the tensors around it a pass took about 4 GB.
So the default batch shrinks with the zoo's largest activation.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._context import StitchContext

__all__ = ["MAX_BATCH", "WORK_BATCH_BYTES", "auto_batch_size"]

logger = logging.getLogger(__name__)

MAX_BATCH = 256  #: the default batch size where images are small
#: the float32 bytes one batch of the zoo's largest activation may take by default; a forward
#: pass holds a few such tensors at once, beside the cache's budget
WORK_BATCH_BYTES = 128 * 2**20


def auto_batch_size(ctx: StitchContext) -> int:
    """``MAX_BATCH``, or fewer (at least 1) so that one batch of the largest activation of any
    zoo model, at a cut or at its input, stays within ``WORK_BATCH_BYTES`` in float32."""
    largest = 1
    for name in ctx.zoo.names():
        sizes = [math.prod(ctx.input_shape(name)), *(math.prod(c.shape) for c in ctx.cuts(name))]
        largest = max(largest, *sizes)
    batch = max(1, min(MAX_BATCH, WORK_BATCH_BYTES // (4 * largest)))
    if batch < MAX_BATCH:
        logger.info(
            "batch size %d: one batch of the zoo's largest activation fits in %d MiB",
            batch,
            WORK_BATCH_BYTES // 2**20,
        )
    return batch
