"""A model traced once into pieces between consecutive cut points; fragments are runs of pieces.

Searching builds many fragments of the same models. Tracing each fragment anew would compile a
new graph every trial, so each model is cut once into its pieces (input → cut 0 → cut 1 → ... →
output) and a fragment is the Sequential of the pieces it spans. The search context and the
loader of exported networks both build fragments here, so an exported network has exactly the
module structure (and state-dict keys) of the network that was measured.
"""

from __future__ import annotations

import torch.fx as fx
from torch import nn

from stitch_nas.errors import UnknownCutError

from ._cuts import CutPoint, cut_points, get_cut, segment

__all__ = ["PieceChain"]


class PieceChain:
    """The pieces of one model, traced lazily and memoised.

    Args:
        model: the model; pieces share its parameters.
        input_shape: full input shape (batch of 1) used to read shapes at each cut.
    """

    def __init__(self, model: nn.Module, input_shape: tuple[int, ...]) -> None:
        self.model = model
        self.input_shape = tuple(input_shape)
        self.cuts: list[CutPoint] = cut_points(model, input_shape=self.input_shape)
        self._names = [c.name for c in self.cuts]
        self._pieces: dict[int, fx.GraphModule] = {}

    def cut(self, name: str) -> CutPoint:
        """The cut point called ``name`` (an unknown name lists the valid ones)."""
        return get_cut(self.model, name, input_shape=self.input_shape)

    def piece(self, index: int) -> fx.GraphModule:
        """The run between cut ``index - 1`` (or the input) and cut ``index`` (or the output)."""
        if index not in self._pieces:
            bounds: list[str | None] = [None, *self._names, None]
            self._pieces[index] = segment(
                self.model, bounds[index], bounds[index + 1], input_shape=self.input_shape
            )
        return self._pieces[index]

    def fragment(self, start: str | None, end: str | None) -> nn.Module:
        """The model from cut ``start`` (None: input) to ``end`` (None: output), as its pieces."""
        first = 0 if start is None else self._names.index(self.cut(start).name) + 1
        last = len(self._names) + 1 if end is None else self._names.index(self.cut(end).name) + 1
        if last <= first:
            raise UnknownCutError(
                f"cut {end!r} does not come after {start!r} in {type(self.model).__name__}; "
                "pick a deeper end cut"
            )
        pieces = [self.piece(i) for i in range(first, last)]
        return pieces[0] if len(pieces) == 1 else nn.Sequential(*pieces)
