"""Trained adapter kinds (Traft & Cheney): linear, linear_relu, conv3x3, bottleneck, transformer.

Each is ``ToGrid -> norm -> body -> norm -> FromGrid`` (see :mod:`._convert`). ``norm="batch"``
(the default, for every layout) puts BatchNorm before and after the body, as Traft & Cheney do;
on tokens it normalises each channel over all tokens, which keeps every token's own scale, so a
least-squares initialisation stays exact. ``norm="layer"`` puts a LayerNorm over channels in
front instead (what a ViT block does per token) and nothing behind, where a LayerNorm would
erase the per-token scale the destination's residual stream carries; the transformer block
also has its own two LayerNorms inside. Every body has one linear part (``linear_part``) that
least squares initialises; residual branches start at zero, so an adapter initialised with
``norm="batch"`` or ``"none"`` computes its least-squares map exactly.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
from torch import nn

from stitch_nas.errors import LayoutError
from stitch_nas.fragments import CutPoint

from ._convert import FromGrid, ToGrid, folds, plan, prefix
from ._registry import register_adapter

__all__ = ["StitchAdapter"]


class StitchAdapter(nn.Module):
    """A trained adapter: layout conversion, normalised body, conversion to the destination."""

    def __init__(
        self,
        src: CutPoint,
        dst: CutPoint,
        body: nn.Module,
        *,
        size: tuple[int, int],
        stride: int,
        cls: str,
        pos: bool,
        pre: nn.Module,
        post: nn.Module,
    ) -> None:
        super().__init__()
        self.src, self.dst = src, dst
        self.to_grid = ToGrid(src, size, stride, cls, pool=dst.join_layout == "vector")
        self.pre, self.body, self.post = pre, body, post
        self.from_grid = FromGrid(dst, src, pos)
        # A bilinear resize mixes each channel's positions with weights that sum to one, so it
        # commutes with a per-position affine map: a BatchNorm (as it stands) and a body's first
        # 1x1 conv. Mapping first resizes the map's channels rather than the source's: an
        # efficientnet_b0 head (1,280 channels at 7x7) into a resnet18 stem (64 at 112x112)
        # would otherwise hold 20 times the destination activation per image, which the batch
        # size does not count (as LinearStitch does). A LayerNorm does not commute; a 3x3 conv
        # or a bottleneck's normalised branch reads the resized grid.
        self.map_first = (
            isinstance(body, (LinearBody, TransformerBody))
            and isinstance(pre, (nn.BatchNorm2d, nn.Identity))
            and stride == 1
            and not self.to_grid.pool
            and self.to_grid.side != size
            and dst.channels < self.to_grid.channels
        )
        self.to_grid.defer = self.map_first

    @property
    def widest_per_image(self) -> int:
        """Elements per image of the source resized onto a larger grid before the body, where
        that is wider than the destination's activation (which a batch size counts); else 0."""
        grid = self.to_grid
        if grid.defer or grid.pool or grid.stride != 1 or grid.channels <= self.dst.channels:
            return 0
        positions = math.prod(grid.size)
        return grid.channels * positions if positions > math.prod(grid.side) else 0

    def inner(self, grid: torch.Tensor) -> torch.Tensor:
        """The body on ``to_grid``'s output after the pre-norm, resized where it maps first."""
        if not self.map_first:
            return self.body(grid)
        body = cast("LinearBody | TransformerBody", self.body)
        return body.after_map(self.to_grid.resize(body.linear_part()(grid)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.post(self.inner(self.pre(self.to_grid(x))))
        return self.from_grid(z, prefix(x, self.src))


def _build(
    src: CutPoint,
    dst: CutPoint,
    make_body: Any,
    *,
    resize: str,
    norm: str,
    cls: str,
    pos: str,
) -> StitchAdapter:
    """Shared assembly: plan the geometry, then make the body for (c_in, c_out, stride)."""
    size, stride = plan(src, dst, resize)
    c_in = src.channels * (2 if folds(src, cls) else 1)
    c_out = dst.channels
    body = make_body(c_in, c_out, stride)
    pre: nn.Module = nn.Identity()
    post: nn.Module = nn.Identity()
    if norm == "batch":
        pre, post = nn.BatchNorm2d(c_in), nn.BatchNorm2d(c_out)
    elif norm == "layer":
        from timm.layers import LayerNorm2d  # timm loads when used: the CLI's checks stay quick

        pre = LayerNorm2d(c_in)
    return StitchAdapter(
        src, dst, body, size=size, stride=stride, cls=cls, pos=pos == "learned", pre=pre, post=post
    )


def block_kernel(stride: int) -> int:
    """Kernel of a linear map that downsamples by ``stride`` (``resize="integrated"``).

    It covers the ``stride`` x ``stride`` block of source positions under each destination
    position (padding 0), so every source position is read once and output ``i`` is centred
    where bilinear resizing centres it (``stride * i + (stride - 1) / 2``). A 1x1 kernel at
    that stride reads only the block's top-left position: a quarter of the source at stride 2,
    one corner of an 8x8 map at stride 8, which cost 23 to 45 points of accuracy against
    bilinear resizing (mini zoo and real zoo stitches initialised by least squares).
    """
    return stride


def neighbourhood_kernel(stride: int) -> int:
    """Kernel (padding 1) of a 3x3 convolution that downsamples by ``stride``: the block under
    each destination position plus a one-position border, centred as bilinear resizing is (at
    stride 1, the 3x3 kernel itself; a 3x3 kernel at stride 4 would skip half the source)."""
    return stride + 2


class LinearBody(nn.Module):
    """A 1x1 convolution (a Linear per position), optionally followed by a ReLU; downsampling,
    a linear map of each block of source positions (:func:`block_kernel`)."""

    def __init__(self, c_in: int, c_out: int, stride: int, relu: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, block_kernel(stride), stride=stride)
        self.act = nn.ReLU() if relu else nn.Identity()

    def linear_part(self) -> nn.Conv2d:
        return self.conv

    def after_map(self, z: torch.Tensor) -> torch.Tensor:
        """What follows the linear part (``StitchAdapter.inner``)."""
        return self.act(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after_map(self.conv(x))


class Conv3x3Body(nn.Module):
    """A 3x3 convolution and a ReLU (least squares fits all nine taps); downsampling, the
    kernel of :func:`neighbourhood_kernel`."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, neighbourhood_kernel(stride), stride, padding=1)
        self.act = nn.ReLU()

    def linear_part(self) -> nn.Conv2d:
        return self.conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(x))


class BottleneckBody(nn.Module):
    """ResNet's bottleneck block (1x1 reduce, 3x3, 1x1 expand) with a 1x1 projection shortcut.

    The last BatchNorm starts at zero (timm's ``zero_init_last``), so the block starts as
    ``ReLU(shortcut(x))``; least squares fits the shortcut.
    """

    def __init__(self, c_in: int, c_out: int, stride: int, width: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c_in, width, 1, bias=False), nn.BatchNorm2d(width)
        kernel = neighbourhood_kernel(stride)  # downsampling: see the kernel functions
        self.conv2 = nn.Conv2d(width, width, kernel, stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, c_out, 1, bias=False), nn.BatchNorm2d(c_out)
        nn.init.zeros_(self.bn3.weight)
        self.shortcut = nn.Conv2d(c_in, c_out, block_kernel(stride), stride=stride)
        self.act = nn.ReLU()

    def linear_part(self) -> nn.Conv2d:
        return self.shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.bn1(self.conv1(x)))
        y = self.act(self.bn2(self.conv2(y)))
        return self.act(self.bn3(self.conv3(y)) + self.shortcut(x))


class TransformerBody(nn.Module):
    """A 1x1 projection to the destination width, then one pre-norm ViT block over positions.

    The block's two residual branches start at zero, so it starts as the identity.
    """

    def __init__(self, c_in: int, c_out: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        from timm.models.vision_transformer import Block  # see LayerNorm2d above

        self.proj = nn.Conv2d(c_in, c_out, 1)
        self.block = Block(c_out, heads, mlp_ratio=mlp_ratio, qkv_bias=True)
        for layer in (cast(nn.Linear, self.block.attn.proj), cast(nn.Linear, self.block.mlp.fc2)):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def linear_part(self) -> nn.Conv2d:
        return self.proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after_map(self.proj(x))

    def after_map(self, z: torch.Tensor) -> torch.Tensor:
        """What follows the linear part (``StitchAdapter.inner``)."""
        n, c, h, w = z.shape
        tokens = self.block(z.flatten(2).transpose(1, 2))
        return tokens.transpose(1, 2).reshape(n, c, h, w)


def _heads(c_out: int, heads: int | None) -> int:
    if heads is None:  # widest split that keeps heads of at least 16 channels
        return next(h for h in (8, 4, 2, 1) if (c_out % h == 0 and c_out // h >= 16) or h == 1)
    if c_out % heads:
        raise LayoutError(
            f"heads={heads} does not divide the destination's {c_out} channels; use a divisor"
        )
    return heads


_LINEAR_DOC = "1x1 convolution (Linear per position); least-squares initialised"


@register_adapter("linear", description=_LINEAR_DOC)
def _linear(src: CutPoint, dst: CutPoint, **opts: Any) -> nn.Module:
    return _build(src, dst, lambda i, o, s: LinearBody(i, o, s, relu=False), **opts)


@register_adapter("linear_relu", description=_LINEAR_DOC + ", then ReLU")
def _linear_relu(src: CutPoint, dst: CutPoint, **opts: Any) -> nn.Module:
    return _build(src, dst, lambda i, o, s: LinearBody(i, o, s, relu=True), **opts)


@register_adapter("conv3x3", description="3x3 convolution + ReLU; least squares init")
def _conv3x3(src: CutPoint, dst: CutPoint, **opts: Any) -> nn.Module:
    return _build(src, dst, Conv3x3Body, **opts)


@register_adapter(
    "bottleneck",
    description="ResNet bottleneck block (width: destination channels / 4 by default)",
)
def _bottleneck(src: CutPoint, dst: CutPoint, *, width: int | None, **opts: Any) -> nn.Module:
    return _build(
        src, dst, lambda i, o, s: BottleneckBody(i, o, s, width or max(o // 4, 8)), **opts
    )


@register_adapter(
    "transformer_block",
    description="1x1 projection + one ViT block over positions (for token layouts)",
)
def _transformer_block(
    src: CutPoint, dst: CutPoint, *, heads: int | None, mlp_ratio: float, **opts: Any
) -> nn.Module:
    if opts["resize"] == "integrated":
        raise LayoutError(
            "transformer_block has no strided convolution for resize='integrated'; "
            "use resize='bilinear' or 'none'"
        )
    n_heads = _heads(dst.channels, heads)
    return _build(
        src,
        dst,
        lambda i, o, s: TransformerBody(i, o, n_heads, float(mlp_ratio)),
        **opts,
    )
