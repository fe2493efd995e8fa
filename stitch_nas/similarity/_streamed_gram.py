"""The Gram matrix of an activation read batch by batch (the probe's, at any size), without
holding it whole and computing it once."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import torch

from stitch_nas.errors import DataError

from ._cka import _finite64, _rows

__all__ = ["PANEL_BYTES", "gram_of_batches"]

#: float64 bytes of the rows :func:`gram_of_batches` holds at once, beside its n x n result
PANEL_BYTES = 32 * 2**20


class _ReadOnce:
    """The batches of ``read()``, computed once: when a Gram needs more than one panel of
    rows, the first pass also writes each batch's rows, in their own dtype, to a temporary file
    (in ``TMPDIR``, deleted when done), and later panels read them back from it.

    Why: on the probe, ``read()`` runs the model up to the cut whenever the activation cache
    does not hold it, and a wide map needs many panels (64 x 56 x 56 float64 features are
    1.6 MB a row: 20 rows a panel, 100 panels for 2,000 images). ``benchmarks/probe_gram.py``
    (resnet18 at that map, 400 probe images outgrowing the cache) took 231 s re-running the
    prefix for each panel and 24 s with this file. The file is read, not mapped, so its pages
    count against no process's memory.
    """

    def __init__(self, read: Callable[[], Iterator[Any]], n: int, panel_bytes: int) -> None:
        self.read, self.n, self.panel_bytes = read, n, panel_bytes
        self.file: Any = None  # the rows of a complete first pass
        self.dtype, self.width = torch.float64, 0

    def __call__(self) -> Iterator[torch.Tensor]:
        if self.file is not None:
            yield from self._replay()
            return
        file, seen = None, 0
        for batch in self.read():
            rows = _rows(batch, "x", 1)
            if seen == 0 and 8 * max(rows.shape[1], 1) * self.n > self.panel_bytes:
                file, self.dtype, self.width = tempfile.TemporaryFile(), rows.dtype, rows.shape[1]
            seen += rows.shape[0]
            if file is not None and seen <= self.n:
                file.write(rows.cpu().contiguous().view(torch.uint8).numpy().tobytes())
            yield rows
        if file is not None and seen == self.n:
            self.file = file
        elif file is not None:
            file.close()

    def _replay(self) -> Iterator[torch.Tensor]:
        item = torch.empty((), dtype=self.dtype).element_size()
        chunk = max(1, self.panel_bytes // (8 * max(self.width, 1)))
        self.file.seek(0)
        for start in range(0, self.n, chunk):
            count = min(chunk, self.n - start)
            data = bytearray(self.file.read(count * self.width * item))
            yield torch.frombuffer(data, dtype=self.dtype).reshape(count, self.width)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def gram_of_batches(
    read: Callable[[], Iterator[Any]], n: int, panel_bytes: int = PANEL_BYTES
) -> torch.Tensor:
    """:func:`gram` of an activation of ``n`` samples that ``read()`` yields batch by batch
    (samples on the first axis, the rest flattened), without ever holding it whole.

    Rows are shifted by the first sample (exact for constant features, which stay exactly zero)
    and multiplied in float64 a panel of rows at a time, the panel at most ``panel_bytes``.
    ``read()`` is called once: when the rows need more than one panel, the later panels read
    them from a temporary file the first pass wrote (:class:`_ReadOnce`). The centred Gram is
    ``H K H`` of the shifted one (centring removes any shift).

    Raises:
        NonFiniteError: If a batch has NaN or Inf.
        DataError: If the batches hold other than ``n`` samples, or n < 2.
    """
    if n < 2:
        raise DataError(f"x has {n} samples; CKA here needs at least 2 samples")
    source = _ReadOnce(read, n, panel_bytes)
    try:
        k = _shifted_gram(source, n, panel_bytes)
    finally:
        source.close()
    k -= k.mean(dim=0, keepdim=True)  # H K H in place: k is this function's own
    return k.sub_(k.mean(dim=1, keepdim=True))


def _shifted_gram(read: Callable[[], Iterator[Any]], n: int, panel_bytes: int) -> torch.Tensor:
    """``K`` of the rows shifted by the first one, a panel of rows per ``read()``."""
    k = torch.zeros(n, n, dtype=torch.float64)
    start, per_row = 0, 0
    shift: torch.Tensor | None = None
    while start < n:
        pieces: list[torch.Tensor] = []
        panel: torch.Tensor | None = None  # the rows start.. of this pass, once all are in
        filled = seen = 0
        for batch in read():
            rows = _rows(batch, "x", 1)
            at, seen = seen, seen + rows.shape[0]
            if seen > n:
                break  # more samples than n: named below
            if seen <= start:  # before this panel: those products were made by earlier ones
                continue
            rows = _finite64(rows[max(start - at, 0) :], "x")
            if shift is None:
                shift, per_row = rows[:1].clone(), 8 * max(rows.shape[1], 1)
            rows = rows - shift
            if panel is None:
                size = min(max(1, panel_bytes // per_row), n - start)
                pieces.append(rows[: size - filled])
                rows, filled = rows[size - filled :], filled + len(pieces[-1])
                if filled == size:
                    panel = torch.cat(pieces)
                    _put(k, panel @ panel.T, start, start)
            if len(rows) and panel is not None:
                _put(k, panel @ rows.T, start, seen - len(rows))
        if seen != n or panel is None:
            raise DataError(
                f"the batches hold {'at least ' if seen > n else ''}{seen} samples, not {n}; "
                "read one activation"
            )
        start += len(panel)
    return k


def _put(k: torch.Tensor, block: torch.Tensor, row: int, col: int) -> None:
    """Write ``block`` at (``row``, ``col``) of the symmetric ``k``, and its transpose."""
    rows, cols = block.shape
    block = block.cpu()
    k[row : row + rows, col : col + cols] = block
    k[col : col + cols, row : row + rows] = block.T
