"""CKA between cut points of the zoo, on the probe split's cached activations: how two cuts
are compared (per position on a common grid, or pooled), and the probe's Gram matrices,
memoised per context. :class:`~stitch_nas.activations.StitchContext` has these methods.

A Gram is made from the probe's activation read batch by batch
(:func:`~stitch_nas.similarity.gram_of_batches`), so no float32 copy of the whole activation is
made: what grows with the probe is the ``n x n`` float64 Gram kept per cut and row rule (32 MiB
at 2,048 images), and, for a wide map, a temporary file of its rows laid out by blocks of
features, each multiplied once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from stitch_nas import similarity
from stitch_nas.fragments import CutPoint

from ._cache import ActivationCache
from ._memo import Memo

__all__ = ["CutSimilarity"]

_GRIDS = ("nchw", "nhwc")
#: the probe's Gram matrix of a model at a cut, by (model, cut, row mode, grid)
_GRAMS: Memo[tuple[str, str, str, tuple[int, int] | None], torch.Tensor] = Memo("probe Grams")


class CutSimilarity:
    """CKA on a context's cached probe activations (a base of StitchContext, which supplies
    the attributes and methods declared here)."""

    cka_rows: str
    memos: dict[Any, dict[Any, Any]]
    cache: ActivationCache

    if TYPE_CHECKING:

        def cut(self, model: str, name: str) -> CutPoint: ...
        def cuts(self, model: str) -> list[CutPoint]: ...
        def activation_batches(
            self, model: str, cut: str | None, split: str
        ) -> Iterator[torch.Tensor]: ...
        def labels(self, split: str) -> torch.Tensor: ...

    def row_rule(self, a: CutPoint, b: CutPoint) -> tuple[str, tuple[int, int] | None]:
        """How two cuts are compared: per-position rows on a common grid, else pooled rows
        (a 1x1 grid is a vector here too: resizing a map to 1x1 would read its centre only)."""
        sa, sb = a.spatial, b.spatial
        grids = a.join_layout in _GRIDS and b.join_layout in _GRIDS
        if grids and sa is not None and sb is not None:
            return self.cka_rows, similarity.common_spatial((1, 1, *sa), (1, 1, *sb))
        return "pooled", None

    def rows(
        self, act: torch.Tensor, cut: CutPoint, mode: str, spatial: tuple[int, int] | None
    ) -> torch.Tensor:
        """``act`` (laid out as ``cut``) as CKA rows under a rule from :meth:`row_rule`."""
        return similarity.to_rows(act, cut.layout, spatial=spatial, mode=mode)

    def probe_gram(
        self, model: str, cut: CutPoint, mode: str, spatial: tuple[int, int] | None
    ) -> torch.Tensor:
        """The memoised Gram matrix of ``model`` at ``cut`` on the probe, under one row rule."""

        def read() -> Iterator[torch.Tensor]:
            for batch in self.activation_batches(model, cut.name, "probe"):
                yield self.rows(batch, cut, mode, spatial)

        def gram() -> torch.Tensor:
            # in the cache's precision: rows resized to a common grid are rounded to it too,
            # as the activation they come from carries no more
            n = len(self.labels("probe"))
            return similarity.gram_of_batches(read, n, values=self.cache.dtype)

        return _GRAMS.fetch(self, (model, cut.name, mode, spatial), gram)

    def joint_cka(self, src_model: str, src_cut: str, dst_model: str, dst_cut: str) -> float:
        """CKA on the probe set between A's output at ``src_cut`` and B's input at ``dst_cut``.

        Grid layouts are compared per position after resizing both maps to the smaller grid
        (``cka_rows="flatten"``) or after global pooling; tokens and vectors are mean-pooled.
        """
        a, b = self.cut(src_model, src_cut), self.cut(dst_model, dst_cut)
        mode, spatial = self.row_rule(a, b)
        return similarity.cka_from_grams(
            self.probe_gram(src_model, a, mode, spatial),
            self.probe_gram(dst_model, b, mode, spatial),
        )

    def cka_matrix(self, model_a: str, model_b: str) -> torch.Tensor:
        """ReStNet's matrix: CKA between every cut of ``model_a`` (rows) and of ``model_b``."""
        cuts_a, cuts_b = self.cuts(model_a), self.cuts(model_b)
        matrix = torch.zeros(len(cuts_a), len(cuts_b), dtype=torch.float64)
        for i, a in enumerate(cuts_a):
            for j, b in enumerate(cuts_b):
                matrix[i, j] = self.joint_cka(model_a, a.name, model_b, b.name)
        return matrix

    def cka_to(
        self,
        x: torch.Tensor,
        x_cut: CutPoint,
        model: str,
        cut: CutPoint,
        *,
        x_grams: dict[tuple, torch.Tensor] | None = None,
    ) -> float:
        """CKA between a probe activation ``x`` (laid out as ``x_cut``) and B at ``cut``.

        Scoring one ``x`` against many cuts, pass the same dict as ``x_grams``: ``x``'s Gram
        matrix is then computed once per row rule instead of once per cut.
        """
        rule = self.row_rule(x_cut, cut)
        grams = {} if x_grams is None else x_grams
        if rule not in grams:
            grams[rule] = similarity.gram(self.rows(x, x_cut, *rule))
        return similarity.cka_from_grams(grams[rule], self.probe_gram(model, cut, *rule))
