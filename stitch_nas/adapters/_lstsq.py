"""Closed-form least-squares stitching (StitchNet eq. 2, with a bias and a ridge term).

An affine map ``y = A x + b`` from the activation at cut i of model A to the activation model B
expects at cut j, fitted on the probe set. Each spatial position (or token) is one row of the
system, so on image layouts the map is a 1x1 convolution. Spatial sizes are matched by bilinear
resizing; a grid entering a vector cut, or a 1x1 grid cut (a vector in disguise, such as a
pooled ``C x 1 x 1`` output), is average-pooled first (StitchNet, conv -> linear).

Where the first layer after cut j is a conv or linear layer that alone consumes the cut, the map
can be fused into that layer's weights (:mod:`stitch_nas.adapters._fuse`).

Fits accumulate the normal equations chunk by chunk (:class:`NormalEquations`), so the rows of a
system (every position of every probe image, or a conv's unfolded patches) never exist whole;
:func:`fit_lstsq_batches` takes the activations batch by batch, so they need not either.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from stitch_nas.errors import (
    LayoutError,
    SingularSystemError,
    check_finite,
)
from stitch_nas.fragments import CutPoint

__all__ = [
    "LinearStitch",
    "NormalEquations",
    "chunk_images",
    "fit_lstsq",
    "fit_lstsq_batches",
    "joinable",
]

logger = logging.getLogger(__name__)

_GRID = ("nchw", "nhwc")

#: float32 elements of the rows of one chunk of a least-squares fit (64 MiB)
CHUNK_ELEMENTS = 2**24


def chunk_images(elements_per_image: int, limit: int | None = None) -> int:
    """How many images a chunk of a fit takes so its rows hold at most ``limit`` elements
    (default :data:`CHUNK_ELEMENTS`)."""
    limit = CHUNK_ELEMENTS if limit is None else limit
    return max(1, limit // max(elements_per_image, 1))


SUPPORTED_PAIRS = (
    "nchw/nhwc -> nchw/nhwc",
    "nchw/nhwc -> vector",
    "vector -> vector",
    "tokens -> tokens (same number of prefix tokens)",
    "a 1x1 grid counts as a vector (CutPoint.join_layout)",
)


def check_pair(src: CutPoint, dst: CutPoint) -> None:
    s, d = src.join_layout, dst.join_layout
    ok = (
        (s in _GRID and d in (*_GRID, "vector"))
        or (s == d == "vector")
        or (s == d == "tokens" and src.prefix_tokens == dst.prefix_tokens)
    )
    if not ok:
        raise LayoutError(
            f"least squares cannot join {_what(src)} to {_what(dst)}; "
            f"supported pairs: {'; '.join(SUPPORTED_PAIRS)}"
        )


def joinable(src: CutPoint, dst: CutPoint) -> bool:
    """Whether a least-squares stitch can join these two cut points (see :func:`check_pair`)."""
    try:
        check_pair(src, dst)
    except LayoutError:
        return False
    return True


def _what(cut: CutPoint) -> str:
    tokens = f" with {cut.prefix_tokens} prefix token(s)" if cut.layout == "tokens" else ""
    return f"{cut.layout} cut {cut.name!r}{tokens}"


def _channels_last(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x.permute(0, 2, 3, 1) if layout == "nchw" else x


def _nchw(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x.permute(0, 3, 1, 2) if layout == "nhwc" else x


def _resize_grid(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bilinear resize of an NCHW map to ``size`` (no-op when equal)."""
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return F.interpolate(x, size=size, mode="bilinear", align_corners=False)


class _Align(nn.Module):
    """Brings the source activation onto the destination's positions, channels last."""

    def __init__(self, src: CutPoint, dst: CutPoint) -> None:
        super().__init__()
        check_pair(src, dst)
        self.src_layout, self.dst_layout = src.layout, dst.layout
        self.dst_joins = dst.join_layout
        self.dst_spatial = dst.spatial
        self.prefix = src.prefix_tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.src_layout in _GRID:
            grid = x.permute(0, 3, 1, 2) if self.src_layout == "nhwc" else x
            if self.dst_joins == "vector":  # a vector, or a 1x1 grid: pooled, not resized
                pooled = grid.mean(dim=(2, 3))
                return pooled if self.dst_layout == "vector" else pooled[:, None, None, :]
            return _resize_grid(grid, self.dst_size()).permute(0, 2, 3, 1)
        if self.src_layout == "tokens":
            return self._align_tokens(x)
        # a vector: as it is, or on the one position of a 1x1 grid
        return x if self.dst_layout == "vector" else x[:, None, None, :]

    def dst_size(self) -> tuple[int, int]:
        """Height and width of the destination grid (grid and token cuts only)."""
        if self.dst_spatial is None:  # check_pair lets no vector cut reach a resize
            raise LayoutError(f"a {self.dst_layout} cut has no spatial size to align to")
        return self.dst_spatial

    def _align_tokens(self, x: torch.Tensor) -> torch.Tensor:
        prefix, patches = x[:, : self.prefix], x[:, self.prefix :]
        side = int(patches.shape[1] ** 0.5)
        if (side, side) == tuple(self.dst_size()):
            return x
        grid = patches.transpose(1, 2).reshape(x.shape[0], -1, side, side)
        patches = _resize_grid(grid, self.dst_size()).flatten(2).transpose(1, 2)
        return torch.cat([prefix, patches], dim=1)


class LinearStitch(nn.Module):
    """Affine stitch between two cut points: align, then ``y = x A^T + b`` per position."""

    def __init__(self, src: CutPoint, dst: CutPoint) -> None:
        super().__init__()
        self.align = _Align(src, dst)
        self.dst_layout = dst.layout
        self.weight = nn.Parameter(torch.zeros(dst.channels, src.channels))
        self.bias = nn.Parameter(torch.zeros(dst.channels))
        # A bilinear resize mixes each channel's positions with weights that sum to one, so it
        # commutes with the per-position affine map. Mapping first resizes the destination's
        # channels rather than the source's: an efficientnet_b0 head (1280 channels at 7x7)
        # into a resnet18 stem (64 at 112x112) would otherwise hold 20 times the destination
        # activation per image, beyond what the batch size was chosen for.
        self.map_first = (
            src.layout in _GRID
            and dst.join_layout != "vector"
            and src.spatial != dst.spatial
            and dst.channels < src.channels
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.map_first:
            rows = x if self.align.src_layout == "nhwc" else x.permute(0, 2, 3, 1)
            mapped = F.linear(rows, self.weight, self.bias).permute(0, 3, 1, 2)
            y = _resize_grid(mapped, self.align.dst_size())
            return y if self.dst_layout == "nchw" else y.permute(0, 2, 3, 1)
        y = F.linear(self.align(x), self.weight, self.bias)
        return y.permute(0, 3, 1, 2) if self.dst_layout == "nchw" else y


def fit_lstsq(
    src_act: torch.Tensor,
    dst_act: torch.Tensor,
    src: CutPoint,
    dst: CutPoint,
    *,
    ridge: float = 1e-4,
) -> LinearStitch:
    """Fit a LinearStitch so that ``stitch(src_act) ≈ dst_act`` in the least-squares sense.

    Args:
        src_act: activations at cut ``src`` on the probe set.
        dst_act: activations at cut ``dst`` of the destination model on the same samples.
        ridge: Tikhonov term relative to the mean eigenvalue of the centred XᵀX
            (0 for the plain pseudo-inverse solution of StitchNet eq. 2).
    """
    if len(src_act) != len(dst_act):
        raise LayoutError(
            f"{len(src_act)} images at {src.name!r} but {len(dst_act)} at {dst.name!r}; "
            "both activations must come from the same samples"
        )
    return fit_lstsq_batches([(src_act, dst_act)], src, dst, ridge=ridge)


def _upsamples(src: CutPoint, dst: CutPoint) -> bool:
    """Whether the fit resizes a source grid onto a destination grid of more positions."""
    return (
        src.layout in _GRID
        and dst.layout in _GRID
        and dst.join_layout != "vector"
        and math.prod(src.spatial or (1, 1)) < math.prod(dst.spatial or (1, 1))
    )


def bilinear_matrix(size_in: int, size_out: int) -> torch.Tensor:
    """``(size_out, size_in)``: the weights of :func:`_resize_grid` along one axis (a bilinear
    resize is the product of one such matrix per axis; each row sums to one)."""
    eye = torch.eye(size_in).reshape(size_in, 1, size_in, 1)
    return F.interpolate(eye, size=(size_out, 1), mode="bilinear", align_corners=False)[
        :, 0, :, 0
    ].T


def fit_lstsq_batches(
    pairs: Iterable[tuple[torch.Tensor, torch.Tensor]],
    src: CutPoint,
    dst: CutPoint,
    *,
    ridge: float = 1e-4,
) -> LinearStitch:
    """:func:`fit_lstsq` from ``(src_act, dst_act)`` batches of the same images, in any number:
    the normal equations are summed batch by batch, so no whole activation need exist.

    Onto a destination grid of more positions the resized rows are not made: their products
    are taken on the source's grid (:meth:`NormalEquations.add_resized`), the same system.
    An efficientnet_b0 head (1,280 channels at 7x7) into a resnet18 stem (112x112) has 256
    destination positions per source position, and its resized rows cost 256 times the
    products."""
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0, got {ridge}; use e.g. 1e-4")
    stitch: LinearStitch | None = None
    equations = NormalEquations()
    upsamples = _upsamples(src, dst)
    for src_act, dst_act in pairs:
        check_finite(src_act, f"activations at {src.name!r}")
        check_finite(dst_act, f"activations at {dst.name!r}")
        if stitch is None:
            stitch = LinearStitch(src, dst).to(src_act.device)
        if upsamples:
            per_x = math.prod(stitch.align.dst_size())
        else:
            with torch.no_grad():
                per_x = stitch.align(src_act[:1]).numel() // src.channels
        per_y = dst_act[:1].numel() // dst.channels
        rows_x, rows_y = per_x * src_act.shape[0], per_y * dst_act.shape[0]
        if rows_x != rows_y:
            raise LayoutError(
                f"cut {src.name!r} gives {rows_x} rows but {dst.name!r} gives {rows_y}; "
                "both activations must come from the same samples"
            )
        aligned = 0 if upsamples else per_x * src.channels
        step = chunk_images(max(src_act[:1].numel(), aligned, dst_act[:1].numel()))
        for xa, ya in zip(src_act.split(step), dst_act.split(step), strict=True):
            with torch.no_grad():
                if upsamples:
                    equations.add_resized(_nchw(xa, src.layout), _nchw(ya, dst.layout))
                    continue
                x = stitch.align(xa).reshape(-1, src.channels).float()
                y = _channels_last(ya, dst.layout).reshape(-1, dst.channels).float()
            equations.add(x, y)
    if stitch is None:
        raise LayoutError(f"no activations to fit {src.name!r} -> {dst.name!r} on")
    weight, bias = equations.solve(ridge, f"{src.name!r} -> {dst.name!r}")
    with torch.no_grad():
        stitch.weight.copy_(weight.T.float())
        stitch.bias.copy_(bias.float())
    return stitch


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
