"""The Gram matrix of an activation read batch by batch (the probe's, at any size): read once,
with at most one block of its features in memory.

A linear CKA Gram ``Xc Xcᵀ`` adds up over blocks of features, and centring is per feature, so
:func:`~stitch_nas.similarity.gram` makes it a block of columns at a time (all ``n`` rows, 32 MiB
of float64 features). Batches come by rows (images), so their rows are first laid out by those
blocks: in memory when the activation is one block, else in a temporary file (in ``TMPDIR``,
deleted when the Gram is made) where each block's rows lie together. Each block is then read
once, converted to float64 once and multiplied in one ``n x n`` product: the blocks and
operations of :func:`gram` on the whole activation, so the two Grams are equal.

Why not panels of rows, as before: a wide map's panel held few rows (64 x 56 x 56 float64
features are 1.6 MB a row, 20 rows in 32 MiB), and each of the ``n / 20`` panels read and
converted every later row again to multiply it by those 20. At 2,000 probe images that was 100
passes over the activation, in products too thin to run at the machine's speed
(``benchmarks/probe_gram.py``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import torch

from stitch_nas.errors import DataError

from ._cka import _BLOCK_BYTES, _rows, feature_step, gram_of_blocks

__all__ = ["gram_of_batches"]


class _ColumnBlocks:
    """The rows of an ``n``-sample activation, added a batch at a time and kept by blocks of
    features: in memory when there is one block, else in a temporary file, block after block,
    each block's ``n`` rows together (block ``b`` starts at feature ``b * step``, so ``n * start``
    values precede it). Kept in ``values`` (None: the rows' own dtype); read back one block at a
    time."""

    def __init__(self, n: int, block_bytes: int, values: torch.dtype | None) -> None:
        self.n, self.step, self.seen = n, feature_step(n, block_bytes), 0
        self.values = values
        self.width, self.dtype, self.device = -1, torch.float32, torch.device("cpu")
        self.kept: list[torch.Tensor] = []
        self.file: Any = None

    def add(self, rows: torch.Tensor) -> None:
        if self.width < 0:
            self.width, self.device = rows.shape[1], rows.device
            self.dtype = self.values or rows.dtype
            if self.width > self.step:
                self.file = tempfile.TemporaryFile()
        elif rows.shape[1] != self.width:
            raise DataError(
                f"a batch has {rows.shape[1]} features after {self.width}; read one activation"
            )
        at, self.seen = self.seen, self.seen + rows.shape[0]
        if self.seen > self.n:
            raise DataError(
                f"the batches hold at least {self.seen} samples, not {self.n}; read one activation"
            )
        if self.file is None:
            self.kept.append(rows.to(self.dtype))
            return
        host = rows.to("cpu", self.dtype)
        for start in range(0, self.width, self.step):
            block = host[:, start : start + self.step].contiguous()
            self.file.seek(self._offset(start, at))
            self.file.write(block.view(torch.uint8).numpy())  # its buffer, not a copy

    def _offset(self, start: int, row: int) -> int:
        """Byte offset of ``row`` in the block of features from ``start``."""
        width = min(self.step, self.width - start)
        return (self.n * start + row * width) * self.dtype.itemsize

    def blocks(self) -> Iterator[torch.Tensor]:
        """Each block of features, ``(n, width)``, in turn."""
        if self.seen != self.n:
            raise DataError(
                f"the batches hold {self.seen} samples, not {self.n}; read one activation"
            )
        if self.file is None:
            yield torch.cat(self.kept)
            return
        for start in range(0, self.width, self.step):
            width = min(self.step, self.width - start)
            self.file.seek(self._offset(start, 0))
            block = torch.empty(self.n, width, dtype=self.dtype)
            self.file.readinto(block.view(torch.uint8).numpy())  # straight into the tensor
            yield block

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def gram_of_batches(
    read: Callable[[], Iterator[Any]],
    n: int,
    block_bytes: int = _BLOCK_BYTES,
    *,
    values: torch.dtype | None = None,
) -> torch.Tensor:
    """:func:`gram` of an activation of ``n`` samples that ``read()`` yields batch by batch
    (samples on the first axis, the rest flattened), calling ``read()`` once and holding at most
    one block of ``block_bytes`` of float64 features (and the ``n x n`` result) in memory.

    ``values`` is the precision the activation was kept in (the cache's storage dtype: its
    float16 activations are read as float32): the rows are stored in it, and half-precision
    rows are multiplied in float32 (:func:`gram_of_blocks`). None: the batches' own dtype.

    Raises:
        NonFiniteError: If a batch has NaN or Inf.
        DataError: If the batches hold other than ``n`` samples, or n < 2.
    """
    if n < 2:
        raise DataError(f"x has {n} samples; CKA here needs at least 2 samples")
    store = _ColumnBlocks(n, block_bytes, values)
    try:
        for batch in read():
            store.add(_rows(batch, "x", 1))
        return gram_of_blocks(store.blocks(), n, store.device, "x").cpu()
    finally:
        store.close()
