"""Closed-form least-squares stitching (StitchNet eq. 2, with a bias and a ridge term).

An affine map ``y = A x + b`` from the activation at cut i of model A to the activation model B
expects at cut j, fitted on the probe set. Each spatial position (or token) is one row of the
system, so on image layouts the map is a 1x1 convolution. Spatial sizes are matched by bilinear
resizing; a grid entering a vector cut, or a 1x1 grid cut (a vector in disguise, such as a
pooled ``C x 1 x 1`` output), is average-pooled first (StitchNet, conv -> linear).

Where the first layer after cut j is a conv or linear layer that alone consumes the cut, the map
can be fused into that layer's weights (``W' = W A``), removing the stitch as a separate layer.
Fusion saves MACs when the source cut has fewer channels than the destination cut; otherwise the
widened layer costs more than the separate 1x1 map (the cost tables count either exactly).

Fits accumulate the normal equations chunk by chunk (:class:`NormalEquations`), so the rows of a
system (every position of every probe image, or a conv's unfolded patches) never exist whole.
"""

from __future__ import annotations

import logging
from typing import cast

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from stitch_nas.errors import (
    LayoutError,
    SingularSystemError,
    TraceError,
    check_finite,
)
from stitch_nas.fragments import CutPoint

__all__ = [
    "LinearStitch",
    "FusedStitch",
    "NormalEquations",
    "chunk_images",
    "fit_lstsq",
    "fuse_into_segment",
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0, got {ridge}; use e.g. 1e-4")
    check_finite(src_act, f"activations at {src.name!r}")
    check_finite(dst_act, f"activations at {dst.name!r}")
    stitch = LinearStitch(src, dst).to(src_act.device)
    with torch.no_grad():
        per_x = stitch.align(src_act[:1]).numel() // src.channels
    per_y = dst_act[:1].numel() // dst.channels
    rows_x, rows_y = per_x * src_act.shape[0], per_y * dst_act.shape[0]
    if rows_x != rows_y:
        raise LayoutError(
            f"cut {src.name!r} gives {rows_x} rows but {dst.name!r} gives {rows_y}; "
            "both activations must come from the same samples"
        )
    equations = NormalEquations()
    step = chunk_images(max(src_act[:1].numel(), per_x * src.channels, dst_act[:1].numel()))
    for xa, ya in zip(src_act.split(step), dst_act.split(step), strict=True):
        with torch.no_grad():
            x = stitch.align(xa).reshape(-1, src.channels).float()
            y = _channels_last(ya, dst.layout).reshape(-1, dst.channels).float()
        equations.add(x, y)
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
    with it to float32 rounding of nearly centred data, far below the ridge term.
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
            self._shift = (x.double().mean(0).float(), y.double().mean(0).float())
        xs, ys = x - self._shift[0], y - self._shift[1]
        parts = [xs.double().sum(0), ys.double().sum(0), (xs.T @ xs).double(), (xs.T @ ys).double()]
        self._sums = (
            parts if not self._sums else [a + b for a, b in zip(self._sums, parts, strict=True)]
        )
        self.rows += x.shape[0]
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


def solve_normal(
    x: torch.Tensor, y: torch.Tensor, ridge: float, what: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ridge regression with an unpenalised bias on all rows at once (one chunk)."""
    return NormalEquations().add(x, y).solve(ridge, what)


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


class FusedStitch(nn.Module):
    """A LinearStitch folded into the conv/linear layer that consumes the destination cut."""

    def __init__(self, stitch: LinearStitch, consumer: nn.Module) -> None:
        super().__init__()
        self.align = stitch.align
        a, b = stitch.weight.detach(), stitch.bias.detach()
        if isinstance(consumer, nn.Linear):
            self.layer: nn.Module = nn.Linear(a.shape[1], consumer.out_features)
            with torch.no_grad():
                self.layer.weight.copy_(consumer.weight @ a)
                extra = consumer.weight @ b
                base = consumer.bias if consumer.bias is not None else 0.0
                self.layer.bias.copy_(base + extra)
            bias_map = None
        elif isinstance(consumer, nn.Conv2d):
            self.layer, bias_map = _fused_conv(consumer, a, b, stitch.align.dst_size())
        else:  # fusable_consumer admits only these two
            raise LayoutError(f"cannot fuse a stitch into {type(consumer).__name__}")
        self.register_buffer("bias_map", bias_map)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        aligned = self.align(x)
        if isinstance(self.layer, nn.Linear):
            return self.layer(aligned)
        out = self.layer(aligned.permute(0, 3, 1, 2))
        return out if self.bias_map is None else out + self.bias_map


def _fused_conv(
    conv: nn.Conv2d, a: torch.Tensor, b: torch.Tensor, spatial: tuple[int, int]
) -> tuple[nn.Conv2d, torch.Tensor | None]:
    """``conv(A x + b) = conv'(x) + conv(b)``; conv(b) is position-dependent under zero padding."""
    # torch types the size attributes of every _ConvNd as tuple[int, ...]; a Conv2d's are pairs
    pair = tuple[int, int]
    fused = nn.Conv2d(
        a.shape[1],
        conv.out_channels,
        cast(pair, conv.kernel_size),
        cast(pair, conv.stride),
        cast("str | tuple[int, int]", conv.padding),
        cast(pair, conv.dilation),
        bias=True,
    ).to(a.device)
    # torch types Conv2d.bias as Optional; built with bias=True it is always a parameter
    fused_bias = cast(nn.Parameter, fused.bias)
    with torch.no_grad():
        fused.weight.copy_(torch.einsum("ojmn,jk->okmn", conv.weight, a))
        constant = b.view(1, -1, 1, 1).expand(1, -1, *spatial)
        bias_map = F.conv2d(
            constant, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation
        )[0]
    flat = bias_map.flatten(1)
    if torch.allclose(flat, flat[:, :1].expand_as(flat), atol=1e-6, rtol=1e-5):
        with torch.no_grad():
            fused_bias.copy_(flat[:, 0])
        return fused, None
    with torch.no_grad():
        fused_bias.zero_()
    return fused, bias_map


def fusable_consumer(segment: fx.GraphModule) -> fx.Node | None:
    """The conv/linear node that alone consumes the segment's input, if there is one."""
    placeholder = next(n for n in segment.graph.nodes if n.op == "placeholder")
    users = list(placeholder.users)
    if len(users) != 1 or users[0].op != "call_module" or users[0].args[:1] != (placeholder,):
        return None
    layer = segment.get_submodule(str(users[0].target))
    if isinstance(layer, nn.Linear):
        return users[0]
    if isinstance(layer, nn.Conv2d) and layer.groups == 1 and layer.padding_mode == "zeros":
        return users[0]
    return None


def fuse_into_segment(stitch: LinearStitch, segment: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``segment`` whose first layer absorbs ``stitch`` (the original is untouched).

    Raises:
        LayoutError: the segment does not start with a lone conv/linear layer.
    """
    consumer = fusable_consumer(segment)
    if consumer is None:
        raise LayoutError(
            "the destination fragment does not start with a single conv/linear layer that alone "
            "reads the cut, so the stitch cannot be fused; use fuse=False"
        )
    fused = FusedStitch(stitch, segment.get_submodule(str(consumer.target)))
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in segment.graph.nodes:
        if node is consumer:
            source = node.args[0]
            if not isinstance(source, fx.Node):  # fusable_consumer checked it is the input
                raise TraceError(f"the first argument of {node.name!r} is not a graph node")
            env[node] = graph.call_module("stitch_fused", (env[source],))
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    root = nn.Module()
    for name, module in segment.named_children():
        root.add_module(name, module)
    for name, value in segment.__dict__.get("_parameters", {}).items():
        root.register_parameter(name, value)
    for name, value in segment.__dict__.get("_buffers", {}).items():
        root.register_buffer(name, value)
    root.add_module("stitch_fused", fused)
    return fx.GraphModule(root, graph, class_name="FusedSegment")
