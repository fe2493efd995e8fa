"""What the activation stream, the row sources, the batch sizing and the memos read of a
StitchContext.

They are written against this protocol rather than the class: ``_context`` imports them, and
they never import ``_context`` back, not even for type checking, so the package has no import
circle. :class:`~stitch_nas.activations.StitchContext` satisfies it (mypy checks each call).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch

from stitch_nas.fragments import CutPoint
from stitch_nas.zoo import Zoo

from ._cache import ActivationCache, ActivationKey

__all__ = ["ContextView", "MemoHolder"]


class MemoHolder(Protocol):
    """What a :class:`~stitch_nas.activations.Memo` stores its values in: a context's memos."""

    memos: dict[Any, dict[Any, Any]]


class ContextView(Protocol):
    """The parts of a :class:`~stitch_nas.activations.StitchContext` its helpers use."""

    zoo: Zoo
    device: torch.device
    cache: ActivationCache

    @property
    def batch_size(self) -> int: ...
    @property
    def channels_last_models(self) -> frozenset[str]: ...
    def cuts(self, model: str) -> list[CutPoint]: ...
    def input_shape(self, model: str) -> tuple[int, int, int, int]: ...
    def segment(self, model: str, start: str | None, end: str | None) -> torch.nn.Module: ...
    def split(self, name: str) -> Any: ...
    def input_batches(self, model: str, split: str) -> Iterator[torch.Tensor]: ...
    def input_rows(self, model: str, split: str, index: torch.Tensor) -> Iterator[torch.Tensor]: ...
    def frozen(self) -> Any: ...
    def activation_key(self, model: str, cut: str | None, split: str) -> ActivationKey: ...
    def for_compute(self, model: str, batch: torch.Tensor) -> torch.Tensor: ...
    def activation_batches(
        self, model: str, cut: str | None, split: str
    ) -> Iterator[torch.Tensor]: ...
