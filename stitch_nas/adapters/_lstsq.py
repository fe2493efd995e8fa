"""Closed-form least-squares stitching (StitchNet eq. 2, with a bias and a ridge term).

An affine map ``y = A x + b`` from the activation at cut i of model A to the activation model B
expects at cut j, fitted on the probe set. Each spatial position (or token) is one row of the
system, so on image layouts the map is a 1x1 convolution. Spatial sizes are matched by bilinear
resizing; a grid entering a vector cut, or a 1x1 grid cut (a vector in disguise, such as a
pooled ``C x 1 x 1`` output), is average-pooled first (StitchNet, conv -> linear).

Where the first layer after cut j is a conv or linear layer that alone consumes the cut, the map
can be fused into that layer's weights (:mod:`stitch_nas.adapters._fuse`).

Fits accumulate the normal equations chunk by chunk
(:class:`~._normal_equations.NormalEquations`), so the rows of a system (every position of
every probe image, or a conv's unfolded patches) never exist whole;
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
    check_finite,
)
from stitch_nas.fragments import CutPoint

from ._convert import grid_target
from ._normal_equations import NormalEquations

__all__ = [
    "LinearStitch",
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
                    equations.add_resized(grid_target(xa, src), grid_target(ya, dst))
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
