"""Activations batch by batch: read from the cache, or computed and stored as they stream.

Where an activation is served from, in order: the cache's memory, its spill folder (a memory
map read batch by batch), else it is computed batch by batch from the nearest earlier cut of
the same model that is cached (the model's input if none) and stored while it streams: into a
buffer reserved against a memory budget when it fits (on the GPU that computes it while the
device budget has room, else in host memory), else into a spill file written through a memory
map, else nowhere (it is recomputed the next time). So at no moment does more than one batch
exist outside the cache's budgets, and no code path holds every cut of a model over a whole
split. A few rows of a split that are read again and again (the fidelity gate's slices, the
checks' fixed sample) are computed and stored the same way, for those rows only, under a key
of their own (:func:`rows_split`, :func:`computed_rows`).

An activation is defined cut by cut: the output of every cut on the way from the input is
rounded to the cache's storage dtype and handed on as a read from the cache hands it, whether
or not that cut is cached (:func:`cut_by_cut`). So the value at a cut is the same whichever
earlier cut, or the input, a computation starts from, and what a network measures does not
depend on what the cache held when it ran (its budget, what it evicted, which worker ran it).
Every batch handed out, fresh or cached, is that rounded value in float32.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from stitch_nas.errors import check_finite
from stitch_nas.machine import release_freed_memory

if TYPE_CHECKING:
    from stitch_nas.activations._keys import ActivationKey

    from ._view import ContextView

__all__ = [
    "stored_batches",
    "compute_batches",
    "computed_rows",
    "rows_split",
    "Rounding",
    "cut_by_cut",
    "fill_every_cut",
    "gathered_batches",
]

Stored = torch.Tensor | np.ndarray


def stored(ctx: ContextView, key: ActivationKey) -> Stored | None:
    """The cached activation for ``key``: a tensor in memory, a memory map, or None."""
    hit = ctx.cache.get(key)
    if hit is not None:
        return hit
    return ctx.cache.mapped(key)


def stored_batches(ctx: ContextView, model: str, values: Stored) -> Iterator[torch.Tensor]:
    """``values`` batch by batch, as float32 on the context's device."""
    for i in range(0, len(values), ctx.batch_size):
        part = values[i : i + ctx.batch_size]
        batch = torch.from_numpy(np.array(part)) if isinstance(part, np.ndarray) else part
        yield ctx.for_compute(model, batch)


def gathered_batches(
    ctx: ContextView, model: str, values: Stored, index: torch.Tensor
) -> Iterator[torch.Tensor]:
    """The rows ``index`` (sorted) of ``values``, batch by batch, as :func:`stored_batches`."""
    for i in range(0, len(index), ctx.batch_size):
        part = index[i : i + ctx.batch_size]
        if isinstance(values, np.ndarray):
            batch = torch.from_numpy(np.asarray(values[part.numpy()]))
        else:
            batch = _same_layout(values[part.to(values.device)], values)
        yield ctx.for_compute(model, batch)


def _same_layout(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    # picked rows keep the source's channels-last layout: the kernels (and their rounding)
    # must be those the whole batch would run
    if like.dim() == 4 and like.is_contiguous(memory_format=torch.channels_last):
        return rows.contiguous(memory_format=torch.channels_last)
    return rows


class Rounding:
    """Hands a computed batch on as a read from the cache would: rounded to the storage dtype,
    float32, channels-last for such models (:meth:`StitchContext.for_compute`).

    In place, through one reused half-precision buffer per batch shape: allocating two new
    tensors at every cut cost about 40 % of a CIFAR ResNet-56's forward pass on a CPU (page
    faults on fresh memory), this costs about 3 %. Only a batch a piece computed, which nothing
    else holds, is rounded in place; a view or an autocast output is converted as a copy.
    """

    def __init__(self, ctx: ContextView, model: str) -> None:
        self.ctx, self.model, self.dtype = ctx, model, ctx.cache.dtype
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x._base is not None:
            return self.ctx.for_compute(self.model, x.to(self.dtype))
        if x.dim() == 4 and self.model in self.ctx.channels_last_models:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.dtype != torch.float32:
            key = (x.shape, x.stride(), x.device)
            buffer = self._buffers.get(key)
            if buffer is None:
                buffer = torch.empty_strided(x.shape, x.stride(), dtype=self.dtype, device=x.device)
                self._buffers[key] = buffer
            buffer.copy_(x)
            x.copy_(buffer)
        return x


def cut_by_cut(
    ctx: ContextView, model: str, start: str | None, end: str | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``model`` from cut ``start`` to ``end`` (None: the input; the output) as an activation is
    defined: piece by piece, each cut passed on the way rounded to the storage dtype and handed
    to the next piece as a read from the cache would hand it (:class:`Rounding`). Run it inside
    ``ctx.frozen()``; the output at ``end`` itself is left for the caller to round."""
    names = [c.name for c in ctx.cuts(model)]
    first = 0 if start is None else names.index(start) + 1
    last = len(names) if end is None else names.index(end)
    pieces = [ctx.segment(model, a, b) for a, b in pairwise([start, *names[first:last], end])]
    rounding = Rounding(ctx, model)

    def run(x: torch.Tensor) -> torch.Tensor:
        x = pieces[0](x)
        for piece in pieces[1:]:
            x = piece(rounding(x))
        return x

    return run


def rows_split(split: str, index: torch.Tensor) -> str:
    """The name under which the rows ``index`` of ``split`` are cached apart from the whole
    split: the split's name with the rows' count and a digest of the rows themselves."""
    rows = np.ascontiguousarray(index.cpu().numpy(), dtype=np.int64)
    return f"{split}[{len(rows)} rows {hashlib.sha256(rows.tobytes()).hexdigest()[:16]}]"


def _source(
    ctx: ContextView,
    model: str,
    cut: str | None,
    split: str,
    rows: tuple[torch.Tensor, str] | None = None,
) -> tuple[str | None, Iterator[torch.Tensor]]:
    """The nearest cut before ``cut`` cached for the rows wanted (``rows``: a sorted index and
    its :func:`rows_split` name, read under that name or gathered from the whole split's; None:
    the whole split), and its batches of them (``None`` and the images when none is cached)."""
    names = [c.name for c in ctx.cuts(model)]
    end = len(names) if cut is None else names.index(cut)
    for name in reversed(names[:end]):
        own = None if rows is None else stored(ctx, ctx.activation_key(model, name, rows[1]))
        if own is not None:
            return name, stored_batches(ctx, model, own)
        whole = stored(ctx, ctx.activation_key(model, name, split))
        if whole is not None:
            if rows is None:
                return name, stored_batches(ctx, model, whole)
            return name, gathered_batches(ctx, model, whole, rows[0])
    if rows is None:
        return None, ctx.input_batches(model, split)
    return None, ctx.input_rows(model, split, rows[0])


def computed_rows(
    ctx: ContextView, model: str, cut: str | None, split: str, index: torch.Tensor
) -> Iterator[torch.Tensor]:
    """The rows ``index`` (sorted) of ``model`` at ``cut`` on ``split``, batch by batch: read
    from their own cache entry (:func:`rows_split`), else computed for those rows only, as
    :func:`compute_batches` computes them (from the nearest earlier cut cached for them or for
    the whole split, rounded to the storage dtype), and stored under that entry as they stream.

    The fidelity gate's slices and the checks' sample are the same rows every time, so a config
    whose first fragment an earlier one shared reads them, and one that stops after a slice
    costs that slice's forward passes, not the whole split's.
    """
    part = rows_split(split, index)  # hashed once: the search below looks it up at every cut
    key = ctx.activation_key(model, cut, part)
    values = stored(ctx, key)
    if values is not None:
        yield from stored_batches(ctx, model, values)
        return
    yield from _streamed(ctx, key, len(index), *_source(ctx, model, cut, split, (index, part)))


class _Sink:
    """Where a streamed activation is stored: a reserved buffer, a spill file, or nowhere."""

    def __init__(self, ctx: ContextView, key: ActivationKey, n: int, first: torch.Tensor):
        self.cache, self.key = ctx.cache, key
        shape, dtype = (n, *first.shape[1:]), ctx.cache.dtype
        self.nbytes = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
        self.buffer: torch.Tensor | None = None
        self.writer = None
        place = self.cache.reserve(self.nbytes, first.device)
        if place is not None:
            layout = torch.contiguous_format
            if first.dim() == 4 and first.is_contiguous(memory_format=torch.channels_last):
                layout = torch.channels_last
            self.buffer = torch.empty(shape, dtype=dtype, device=place, memory_format=layout)
        else:
            self.writer = self.cache.spill_writer(key, shape, dtype)

    def write(self, start: int, batch: torch.Tensor) -> None:
        if self.buffer is not None:
            self.buffer[start : start + len(batch)].copy_(batch)
        elif self.writer is not None:
            self.writer.write(start, batch.detach().to(self.cache.dtype).cpu().numpy())

    def close(self, complete: bool) -> None:
        if self.buffer is not None:
            self.cache.release(self.nbytes, self.buffer.device)
            if complete:
                self.cache.put(self.key, self.buffer)
            self.buffer = None
        elif self.writer is not None:
            if complete:
                self.cache.commit_spill(self.writer)
            else:
                self.writer.abort()
            self.writer = None


def compute_batches(
    ctx: ContextView, model: str, cut: str | None, split: str
) -> Iterator[torch.Tensor]:
    """Compute ``model`` at ``cut`` on ``split`` batch by batch, storing it as it streams.

    Stored only when the whole split went through (a caller that stops early stores nothing).
    """
    key = ctx.activation_key(model, cut, split)
    yield from _streamed(ctx, key, len(ctx.split(split)), *_source(ctx, model, cut, split))


def _streamed(
    ctx: ContextView,
    key: ActivationKey,
    n: int,
    start: str | None,
    source: Iterator[torch.Tensor],
) -> Iterator[torch.Tensor]:
    """``key``'s activation (``n`` rows) computed from ``source``, the batches at cut ``start``
    (None: the images), cut by cut, handed on batch by batch and stored when all ``n`` went
    through."""
    model, cut, split = key.model, key.cut, key.split
    ctx.cache.count_miss()
    piece, rounding = cut_by_cut(ctx, model, start, cut), Rounding(ctx, model)
    done, sink = 0, None
    try:
        for x in source:
            with ctx.frozen():  # x is a copy (for_compute, input_batches): in-place is safe
                out = piece(x)
            check_finite(out, f"activations of {model!r} at {cut or 'output'!r} on {split}")
            rounded = rounding(out)
            if sink is None:
                sink = _Sink(ctx, key, n, rounded)
            sink.write(done, rounded)  # a copy: the consumer may change ``rounded`` in place
            done += len(rounded)
            yield rounded
            release_freed_memory()  # holes that add up batch after batch, not only per pass
    finally:
        if sink is not None:
            sink.close(complete=done == n)
        release_freed_memory()  # what this pass's batches freed, beyond what is kept for reuse


def fill_fits(ctx: ContextView, model: str, split: str) -> bool:
    """Whether :func:`fill_every_cut` would keep what it computes: every cut of ``model`` on
    ``split`` not cached yet fits in half the memory the cache may hold (host and device).

    Otherwise (224-px activations of a large probe) the pass would evict what it had just
    stored, and the entries a stitch needs from the other model, and then store no more; each
    cut is then computed when asked for, from the nearest cached earlier one.
    """
    element = torch.empty(0, dtype=ctx.cache.dtype).element_size()
    n = len(ctx.split(split))
    wanted = [
        math.prod(cut.shape) * n * element
        for cut in ctx.cuts(model)
        if stored(ctx, ctx.activation_key(model, cut.name, split)) is None
    ]
    return sum(wanted) <= (ctx.cache.budget_bytes + ctx.cache.device_budget_bytes) / 2


def fill_every_cut(ctx: ContextView, model: str, split: str) -> None:
    """Store every cut of ``model`` on ``split`` (the probe) in one chained pass, batch by batch.

    Each batch runs piece by piece, each cut's output is written into that cut's buffer (or
    spill file) before the next piece runs; cuts already cached are skipped as targets.
    """
    bounds: list[str | None] = [None, *(c.name for c in ctx.cuts(model))]
    keys = [ctx.activation_key(model, end, split) for end in (*bounds[1:], None)]
    wanted = [stored(ctx, key) is None for key in keys]
    if not any(wanted):
        return
    pieces = [ctx.segment(model, a, b) for a, b in zip(bounds, (*bounds[1:], None), strict=True)]
    last = max(i for i, w in enumerate(wanted) if w)  # no need to run past the deepest wanted
    n, done, rounding = len(ctx.split(split)), 0, Rounding(ctx, model)
    sinks: list[_Sink | None] = [None] * len(keys)
    ctx.cache.count_miss()
    try:
        for x in ctx.input_batches(model, split):
            with ctx.frozen():
                for i, piece in enumerate(pieces[: last + 1]):
                    x = piece(x)
                    what = f"activations of {model!r} at {keys[i].cut or 'output'!r} on {split}"
                    check_finite(x, what)
                    x = rounding(x)  # handed on as cut_by_cut hands it on
                    if wanted[i]:
                        if sinks[i] is None:
                            sinks[i] = _Sink(ctx, keys[i], n, x)
                        sinks[i].write(done, x)  # type: ignore[union-attr]
            done += len(x)
            release_freed_memory()  # holes that add up batch after batch, not only per pass
    finally:
        for sink in sinks:
            if sink is not None:
                sink.close(complete=done == n)
        release_freed_memory()
