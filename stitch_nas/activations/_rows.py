"""Rows of a split fetched by index, so training reads a batch at a time, never a whole split.

Adapter and SN-Net training draw random mini-batches from the train split. Holding its
activations whole (10,000 CIFAR images at a 16x32x32 cut: 655 MB in float32, per joint) would
sit outside the cache's budget. A row source reads only the rows a step needs: from the cache
(its memory, or a spill file through a memory map) when the activation is stored there, else by
running the model's frozen prefix over those images again. A row is handed out as the stream
hands it out (:meth:`StitchContext.activation_batches`): the cache's rounded value in float32,
so training sees the same numbers whether the row was cached or recomputed (up to the kernels'
batch-size rounding).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from . import _stream

if TYPE_CHECKING:
    from ._view import ContextView

__all__ = ["ActivationRows", "ChainRows", "InputRows", "Rows", "in_order", "take"]


class Rows(Protocol):
    """A split's rows, fetched by index (what training draws its mini-batches from)."""

    def __len__(self) -> int: ...

    def take(self, index: torch.Tensor) -> torch.Tensor:
        """The rows ``index`` (any order), float32 on the context's device."""
        ...


def take(source: torch.Tensor | Rows, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` of a whole tensor (a small split, labels, logits) or of a row source."""
    if isinstance(source, torch.Tensor):
        return source[index.to(source.device)]
    return source.take(index)


def in_order(source: torch.Tensor | Rows, size: int) -> Iterator[torch.Tensor]:
    """All rows of ``source``, ``size`` at a time in order: a pass over a split that reads a
    batch's rows at a time (initialising an adapter, its held-out loss), never the whole."""
    for start in range(0, len(source), size):
        yield take(source, torch.arange(start, min(start + size, len(source))))


class ActivationRows:
    """``model``'s activation at ``cut`` (None: its output) on ``split``, row by row.

    Building it streams the activation once, which stores it where the cache's budget or spill
    folder allows (a cache with neither keeps nothing, so the pass is skipped); rows evicted
    since (or never stored) are recomputed from the images.
    """

    def __init__(self, ctx: ContextView, model: str, cut: str | None, split: str) -> None:
        self.ctx, self.model, self.cut, self.split = ctx, model, cut, split
        self.key = ctx.activation_key(model, cut, split)
        self.n = len(ctx.split(split))
        cache = ctx.cache
        keeps = cache.budget_bytes + cache.device_budget_bytes > 0 or cache.spill_dir is not None
        if keeps and _stream.stored(ctx, self.key) is None:
            for _ in ctx.activation_batches(model, cut, split):
                pass
        self._prefix: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __len__(self) -> int:
        return self.n

    def take(self, index: torch.Tensor) -> torch.Tensor:
        ctx = self.ctx
        values = _stream.stored(ctx, self.key)
        if values is None:
            return self._recompute(index)
        order = torch.argsort(index)  # sorted reads suit a memory map; then back in order
        rows = torch.cat(list(_stream.gathered_batches(ctx, self.model, values, index[order])))
        return rows[torch.argsort(order).to(rows.device)]

    def _recompute(self, index: torch.Tensor) -> torch.Tensor:
        ctx = self.ctx
        if self._prefix is None:
            self._prefix = _stream.cut_by_cut(ctx, self.model, None, self.cut)
        rounding, out = _stream.Rounding(ctx, self.model), []
        for x in ctx.input_rows(self.model, self.split, index):
            with ctx.frozen():
                y = self._prefix(x)
            out.append(rounding(y))
        return torch.cat(out)


class InputRows:
    """``split``'s images preprocessed for ``model``, row by row."""

    def __init__(self, ctx: ContextView, model: str, split: str) -> None:
        self.ctx, self.model, self.split = ctx, model, split
        self.n = len(ctx.split(split))

    def __len__(self) -> int:
        return self.n

    def take(self, index: torch.Tensor) -> torch.Tensor:
        return torch.cat(list(self.ctx.input_rows(self.model, self.split, index)))


class ChainRows:
    """Rows of ``source`` run through the frozen ``module`` (a network built so far), as a
    frozen pass of ``ctx`` (under its autocast, if any); float32 rows."""

    def __init__(self, source: Rows, module: nn.Module, ctx: ContextView) -> None:
        self.source, self.module, self.ctx = source, module, ctx

    def __len__(self) -> int:
        return len(self.source)

    def take(self, index: torch.Tensor) -> torch.Tensor:
        rows = self.source.take(index)
        with self.ctx.frozen():
            return self.module(rows).float()
