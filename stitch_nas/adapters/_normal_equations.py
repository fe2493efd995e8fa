"""The normal equations of a least-squares fit, accumulated chunk by chunk of rows.

Every closed-form fit of the package (least-squares stitches, trained adapters' starts, conv
taps) sums its rows' products here rather than holding the rows: :meth:`NormalEquations.add`
takes rows as they are, :meth:`NormalEquations.add_resized` the rows of a grid resized onto a
larger one without making them (a bilinear resize is one :func:`bilinear_matrix` per axis).
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from stitch_nas.errors import LayoutError, SingularSystemError, check_finite

__all__ = ["SUM_BLOCK_ROWS", "NormalEquations", "bilinear_matrix"]


@lru_cache(maxsize=64)  # the same few sizes for every chunk of every fit
def bilinear_matrix(size_in: int, size_out: int) -> torch.Tensor:
    """``(size_out, size_in)``: the weights of a bilinear resize along one axis, as the stitches
    resize (``F.interpolate``, ``align_corners=False``). A 2-D resize is the product of one such
    matrix per axis; each row sums to one. Shared between callers: read it, never write to it."""
    eye = torch.eye(size_in).reshape(size_in, 1, size_in, 1)
    return F.interpolate(eye, size=(size_out, 1), mode="bilinear", align_corners=False)[
        :, 0, :, 0
    ].T


class NormalEquations:
    """A ridge regression with an unpenalised bias, accumulated chunk by chunk of rows.

    Rows are shifted by the first chunk's column means before the products, which run in
    float32 and are summed in float64; :meth:`solve` centres exactly by subtracting the small
    remaining mean. On one chunk this is the plain centred solution; over many chunks it agrees
    with it to float32 rounding of nearly centred data, far below the ridge term. Column sums
    are float32 within blocks of :data:`SUM_BLOCK_ROWS` rows and float64 across them
    (:func:`_column_sums`).
    """

    def __init__(self) -> None:
        self.rows = 0
        self._shift: tuple[torch.Tensor, torch.Tensor] | None = None
        self._sums: list[torch.Tensor] = []  # shifted column sums of x and y, XᵀX, Xᵀy

    def add(self, x: torch.Tensor, y: torch.Tensor) -> NormalEquations:
        """Add rows ``x`` (n, features) with targets ``y`` (n, outputs)."""
        if x.shape[0] != y.shape[0]:
            raise LayoutError(f"{x.shape[0]} input rows but {y.shape[0]} target rows")
        x, y = x.float(), y.float()
        if self._shift is None:
            n = x.shape[0]
            self._shift = ((_column_sums(x) / n).float(), (_column_sums(y) / n).float())
        xs, ys = x - self._shift[0], y - self._shift[1]
        parts = [_column_sums(xs), _column_sums(ys), (xs.T @ xs).double(), (xs.T @ ys).double()]
        self._sums = (
            parts if not self._sums else [a + b for a, b in zip(self._sums, parts, strict=True)]
        )
        self.rows += x.shape[0]
        return self

    def add_resized(self, x: torch.Tensor, y: torch.Tensor) -> NormalEquations:
        """Add the rows of ``x`` (NCHW) resized bilinearly to ``y``'s grid (NCHW targets), one
        row per position of ``y``, without making them.

        The resize is ``R = Rh ⊗ Rw`` (:func:`bilinear_matrix`), so the products are
        ``(RX)ᵀ(RX) = Xᵀ(RᵀR)X`` and ``(RX)ᵀY = Xᵀ(RᵀY)``, with ``RᵀR`` and ``Rᵀ`` applied one
        axis at a time on the source's grid; the rows' column sums are ``X`` weighted by
        ``Rᵀ1``. Each row of ``R`` sums to one, so shifting ``X`` by a per-channel vector
        shifts the resized rows by it: the shift of :meth:`add` carries over.
        """
        (n, _, h, w), (height, width) = x.shape, y.shape[-2:]
        x, y = x.float(), y.float()
        rh, rw = (bilinear_matrix(a, b).to(x.device) for a, b in ((h, height), (w, width)))
        wh, ww = rh.sum(0), rw.sum(0)  # Rᵀ1 along each axis
        rows = n * height * width
        if self._shift is None:
            self._shift = (
                torch.einsum("nchw,h,w->c", x, wh, ww) / rows,
                y.mean(dim=(0, 2, 3)),
            )
        xs = x - self._shift[0][:, None, None]
        ys = y - self._shift[1][:, None, None]
        gram_x = torch.einsum("ah,nchw,wb->ncab", rh.T @ rh, xs, rw.T @ rw)  # (RᵀR) X
        back_y = torch.einsum("Hh,ndHW,Ww->ndhw", rh, ys, rw)  # Rᵀ Y
        parts = [
            torch.einsum("nchw,h,w->c", xs, wh, ww).double(),
            ys.sum(dim=(0, 2, 3), dtype=torch.float64),
            torch.einsum("nchw,ndhw->cd", xs, gram_x).double(),
            torch.einsum("nchw,ndhw->cd", xs, back_y).double(),
        ]
        self._sums = (
            parts if not self._sums else [a + b for a, b in zip(self._sums, parts, strict=True)]
        )
        self.rows += rows
        return self

    def solve(self, ridge: float, what: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The weight (features, outputs) and bias (outputs,) in float64."""
        if self._shift is None or self.rows == 0:
            raise SingularSystemError(f"least-squares system for {what} has no rows")
        sum_x, sum_y, xx, xy = self._sums
        mean_x, mean_y = sum_x / self.rows, sum_y / self.rows
        gram = xx - self.rows * torch.outer(mean_x, mean_x)
        cross = xy - self.rows * torch.outer(mean_x, mean_y)
        weight = _solve_centred(gram, cross, ridge, what, self.rows)
        x_mean = self._shift[0].double() + mean_x
        y_mean = self._shift[1].double() + mean_y
        return weight, y_mean - x_mean @ weight


#: rows summed in float32 at a time by :func:`_column_sums` (cascaded: error far below the ridge)
SUM_BLOCK_ROWS = 8192


def _column_sums(t: torch.Tensor) -> torch.Tensor:
    """Column sums of ``t`` (rows, columns) in float64: float32 within blocks of rows, float64
    across them. Casting every row to float64 first (``t.double().sum(0)``) cost 20 times a
    float32 sum, two thirds of a fit's products (343 ms against 110 ms for 262,144 rows of 64
    features and 32 targets, two cores)."""
    if not len(t):  # no rows: zeros, as a float64 sum of none (the solve then names it)
        return torch.zeros(t.shape[1:], dtype=torch.float64, device=t.device)
    blocks = torch.stack([block.sum(0) for block in t.split(SUM_BLOCK_ROWS)])
    return blocks.sum(0, dtype=torch.float64)


def _solve_centred(
    gram: torch.Tensor, cross: torch.Tensor, ridge: float, what: str, rows: int
) -> torch.Tensor:
    """Solve the centred normal equations (float64) with a relative ridge term."""
    scale = float(gram.diagonal().mean()) if gram.numel() else 0.0
    if ridge > 0:
        eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
        gram = gram + ridge * max(scale, 1e-12) * eye
    # gelsd reports the rank; it is CPU-only, hence the move
    solution = torch.linalg.lstsq(gram.cpu(), cross.cpu(), driver="gelsd") if ridge == 0 else None
    if solution is not None:
        rank = int(solution.rank) if solution.rank.numel() else gram.shape[0]
        if rank < gram.shape[0]:
            raise SingularSystemError(
                f"least-squares system for {what} is singular (rank {rank} of "
                f"{gram.shape[0]}, {rows} rows); use ridge > 0 (e.g. 1e-4) or more "
                "probe samples"
            )
        weight = solution.solution.to(gram.device)
    else:
        try:
            weight = torch.linalg.solve(gram, cross)
        except RuntimeError as exc:  # only when XᵀX is exactly zero
            raise SingularSystemError(
                f"least-squares system for {what} is singular ({exc}); the source "
                "activations are constant on the probe set; pick another cut"
            ) from exc
    check_finite(weight, f"least-squares map {what}")
    return weight
