"""Layout conversion and spatial rescaling around an adapter's body.

Every trained adapter works on an NCHW grid. :class:`ToGrid` brings the source activation there
(NHWC is permuted; a ViT's patch tokens are laid back on their square grid and its class
token(s) are dropped or folded in by concatenation onto every patch token, as Traft & Cheney
do; a vector is a 1x1 grid, and a 1x1 grid destination is joined as the vector it is: the
source is averaged over its positions) and rescales it to the destination's grid (bilinear, or
left to a strided conv in the body: "integrated"; or after the body's channel map, see
:class:`~._bodies.StitchAdapter`). :class:`FromGrid` writes the body's output in the
destination's layout; entering a ViT it adds a per-position bias that stands in for the
destination's position embedding (fitted by least squares) and makes the class token(s) from
the mean of the patch tokens and the source's own prefix tokens (a linear map, also fitted).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from stitch_nas.errors import LayoutError
from stitch_nas.fragments import CutPoint

__all__ = [
    "ToGrid",
    "FromGrid",
    "plan",
    "folds",
    "grid_target",
    "prefix",
]

_GRID = ("nchw", "nhwc")


def _side(cut: CutPoint) -> tuple[int, int]:
    """Spatial size of a grid or token cut; a vector is a 1x1 grid."""
    if cut.layout == "vector":
        return (1, 1)
    if cut.layout == "tokens":
        patches = cut.shape[0] - cut.prefix_tokens
        side = math.isqrt(patches)
        if side * side != patches:
            raise LayoutError(
                f"token cut {cut.name!r} has {patches} patch tokens, not a square grid; "
                "adapters need square token grids (pick another cut)"
            )
        return (side, side)
    return cut.spatial or (1, 1)


def plan(src: CutPoint, dst: CutPoint, resize: str) -> tuple[tuple[int, int], int]:
    """Where the body works: the grid it reads (after resizing) and its stride.

    Raises:
        LayoutError: the pair or the resize mode cannot work, with the reason.
    """
    if src.join_layout == "vector" and dst.join_layout != "vector":  # a 1x1 grid is a vector
        raise LayoutError(
            f"{'vector' if src.layout == 'vector' else '1x1 grid'} cut {src.name!r} has no "
            f"positions to spread over the {dst.layout} cut "
            f"{dst.name!r}; pick a grid or token cut as source"
        )
    have, want = _side(src), _side(dst)
    if dst.join_layout == "vector":  # pooled first: the body then works on one position
        return (1, 1), 1
    if resize == "bilinear":
        return want, 1
    if resize == "none":
        if have != want:
            raise LayoutError(
                f"resize='none' but {src.name!r} is {have[0]}x{have[1]} and {dst.name!r} is "
                f"{want[0]}x{want[1]}; use resize='bilinear' or 'integrated'"
            )
        return have, 1
    factor = have[0] // want[0]
    if factor < 1 or have != (want[0] * factor, want[1] * factor):
        raise LayoutError(
            f"resize='integrated' needs {src.name!r} ({have[0]}x{have[1]}) to be an integer "
            f"multiple of {dst.name!r} ({want[0]}x{want[1]}); use resize='bilinear'"
        )
    return have, factor


def folds(src: CutPoint, cls: str) -> bool:
    """Whether the source's class token(s) are concatenated onto its patch tokens."""
    return cls == "fold" and src.layout == "tokens" and src.prefix_tokens > 0


def prefix(x: torch.Tensor, cut: CutPoint) -> torch.Tensor | None:
    """The prefix (class/register) tokens of a token activation, flattened; else None."""
    if cut.layout != "tokens" or cut.prefix_tokens == 0:
        return None
    return x[:, : cut.prefix_tokens].flatten(1)


def grid_target(y: torch.Tensor, cut: CutPoint) -> torch.Tensor:
    """A destination activation as an NCHW grid (patch tokens only), for fitting."""
    if cut.layout == "nchw":
        return y
    if cut.layout == "nhwc":
        return y.permute(0, 3, 1, 2)
    if cut.layout == "vector":
        return y[:, :, None, None]
    h, w = _side(cut)
    return y[:, cut.prefix_tokens :].transpose(1, 2).reshape(y.shape[0], -1, h, w)


class ToGrid(nn.Module):
    """Source layout -> NCHW grid of ``size`` (bilinear) or the source grid (integrated)."""

    def __init__(
        self, src: CutPoint, size: tuple[int, int], stride: int, cls: str, *, pool: bool
    ) -> None:
        super().__init__()
        self.layout, self.prefix_tokens = src.layout, src.prefix_tokens
        self.side = _side(src)
        self.size = size
        self.pool = pool  # a vector destination: average over positions, as least squares does
        self.fold = folds(src, cls)
        self.stride = stride
        self.channels = src.channels * (2 if self.fold else 1)
        #: leave the resize to :meth:`resize`, after the body's channel map (``StitchAdapter``)
        self.defer = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout == "nhwc":
            x = x.permute(0, 3, 1, 2)
        elif self.layout == "vector":
            x = x[:, :, None, None]
        elif self.layout == "tokens":
            cls = x[:, : self.prefix_tokens].mean(1)
            x = x[:, self.prefix_tokens :].transpose(1, 2).reshape(x.shape[0], -1, *self.side)
            if self.fold:  # Traft & Cheney: the class token concatenated onto every token
                x = torch.cat([x, cls[:, :, None, None].expand(-1, -1, *self.side)], dim=1)
        if self.pool:
            return x.mean(dim=(2, 3), keepdim=True)
        return x if self.defer else self.resize(x)

    def resize(self, x: torch.Tensor) -> torch.Tensor:
        """An NCHW grid at ``size`` (bilinear), where the body does not downsample it itself."""
        if self.pool or self.stride != 1 or tuple(x.shape[-2:]) == self.size:
            return x
        return F.interpolate(x, size=self.size, mode="bilinear", align_corners=False)


class FromGrid(nn.Module):
    """NCHW grid -> destination layout; makes a ViT's prefix tokens and position bias."""

    def __init__(self, dst: CutPoint, src: CutPoint, pos: bool) -> None:
        super().__init__()
        self.layout, self.prefix_tokens = dst.layout, dst.prefix_tokens
        channels = dst.channels
        tokens = dst.layout == "tokens"
        patches = dst.shape[0] - dst.prefix_tokens if tokens else 0
        self.pos_bias = nn.Parameter(torch.zeros(patches, channels)) if tokens and pos else None
        self.make_prefix: nn.Linear | None = None
        if tokens and dst.prefix_tokens > 0:
            src_prefix = src.prefix_tokens * src.channels if src.layout == "tokens" else 0
            self.make_prefix = nn.Linear(channels + src_prefix, dst.prefix_tokens * channels)

    def patches(self, z: torch.Tensor) -> torch.Tensor:
        """Patch tokens (N, HW, C) of an output grid, with the position bias."""
        tokens = z.flatten(2).transpose(1, 2)
        return tokens if self.pos_bias is None else tokens + self.pos_bias

    def prefix_input(self, tokens: torch.Tensor, src_prefix: torch.Tensor | None) -> torch.Tensor:
        """What the prefix tokens are made from: the mean patch token and the source's prefix."""
        mean = tokens.mean(1)
        return mean if src_prefix is None else torch.cat([mean, src_prefix], dim=1)

    def forward(self, z: torch.Tensor, src_prefix: torch.Tensor | None) -> torch.Tensor:
        if self.layout == "nchw":
            return z
        if self.layout == "nhwc":
            return z.permute(0, 2, 3, 1)
        if self.layout == "vector":
            return z.flatten(1)
        tokens = self.patches(z)
        if self.make_prefix is None:
            return tokens
        made = self.make_prefix(self.prefix_input(tokens, src_prefix))
        return torch.cat([made.view(z.shape[0], self.prefix_tokens, -1), tokens], dim=1)
