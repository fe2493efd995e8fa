"""``lowrank``: a frozen least-squares stitch plus a trained low-rank update (SN-Netv2, ESTA).

The output is ``W0 x + b0 + B (A x)`` per position: ``W0, b0`` are the closed-form map that
``lstsq`` fits on the probe split, and ``B A`` is a LoRA-style update of rank ``rank`` that the
trainer learns on top of it. ``B`` starts at zero, so before training the adapter computes the
least-squares stitch exactly, and training starts from the best linear map rather than from
scratch. Layout conversion (resizing, pooling into a vector, token grids) is the wrapped
:class:`~stitch_nas.adapters.LinearStitch`'s, so this kind joins the pairs least squares joins.

``W0, b0`` are parameters with ``requires_grad=False``: they are in the state dict (so exports
carry them) and in :func:`~stitch_nas.fragments.count_params` (which counts parameters, not
buffers), yet get no gradient, so AdamW, which skips parameters without one, never moves them
(weight decay included). Only ``A`` and ``B`` train.

The default loss is ``task`` (as SN-Netv2 trains its stitches): the base already minimises the
``match`` loss over all affine maps on the probe split, which is also the held-out split early
stopping watches, so a ``match``-trained update is kept only where it beats least squares on the
very samples least squares was fitted to; on the digits zoo it never did (four joints, 60 steps:
the least-squares map came back unchanged), while ``task`` raised validation accuracy on all
four (e.g. 0.81 -> 0.88). ``loss='match'`` stays available for a destination whose classifier
predicts other labels, where ``task`` is refused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from stitch_nas.errors import LayoutError
from stitch_nas.fragments import CutPoint

from ._convert import _side
from ._lstsq import LinearStitch
from ._registry import register_adapter

__all__ = ["LowRankStitch"]


class LowRankStitch(nn.Module):
    """``y = (W0 + B A) x + b0`` per position: frozen least-squares ``base``, trained ``A, B``.

    ``rank`` is clamped to ``min(source channels, destination channels)``: a product ``B A`` of
    higher rank spans no more maps, so the excess would only add parameters and MACs. Clamping
    (rather than refusing) lets one ``rank`` serve every joint of a search, narrow cuts included;
    equal cuts and options still give equal state-dict shapes, which is all exports need.
    """

    def __init__(self, src: CutPoint, dst: CutPoint, rank: int) -> None:
        super().__init__()
        self.base = LinearStitch(src, dst)  # refuses pairs least squares cannot join
        self.base.requires_grad_(False)
        self.rank = min(rank, src.channels, dst.channels)
        self.down = nn.Parameter(_lora_a(self.rank, src.channels))  # A
        self.up = nn.Parameter(torch.zeros(dst.channels, self.rank))  # B

    def reset_update(self) -> None:
        """Zero ``B``, so the adapter equals its base (``A`` keeps its random directions)."""
        with torch.no_grad():
            self.up.zero_()

    def fit_base(self, fitted: LinearStitch) -> None:
        """Take ``fitted``'s least-squares map as the base and restart the update from zero."""
        with torch.no_grad():
            self.base.weight.copy_(fitted.weight)
            self.base.bias.copy_(fitted.bias)
        self.reset_update()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        aligned = self.base.align(x)  # channels last, on the destination's positions
        update = F.linear(F.linear(aligned, self.down), self.up)
        y = F.linear(aligned, self.base.weight, self.base.bias) + update
        return y.permute(0, 3, 1, 2) if self.base.dst_layout == "nchw" else y


def _lora_a(rank: int, channels: int) -> torch.Tensor:
    """LoRA's ``A``: nn.Linear's default init (uniform, bound ``1/sqrt(channels)``), drawn
    from a fixed seed. Every build then trains from the same start, so a rebuilt network
    (an export re-measures its trial) gets the same weights; the global RNG is left alone."""
    generator = torch.Generator().manual_seed(0)
    bound = channels**-0.5
    return (torch.rand(rank, channels, generator=generator) * 2 - 1) * bound


@register_adapter(
    "lowrank",
    description="frozen least-squares map + trained rank-r (LoRA) update; rank 8 by default",
)
def _lowrank(src: CutPoint, dst: CutPoint, *, rank: int, resize: str) -> nn.Module:
    stitch = LowRankStitch(src, dst, rank)
    if resize == "integrated":
        raise LayoutError(
            "lowrank has no strided convolution for resize='integrated'; "
            "use resize='bilinear' or 'none'"
        )
    if resize == "none" and dst.join_layout != "vector":  # into a vector, the source is pooled
        _check_same_size(src, dst)
    return stitch


def _check_same_size(src: CutPoint, dst: CutPoint) -> None:
    """``resize='none'``: the stitch may not rescale, so both grids must have one size."""
    have, want = _side(src), _side(dst)
    if have != want:
        raise LayoutError(
            f"resize='none' but {src.name!r} is {have[0]}x{have[1]} and {dst.name!r} is "
            f"{want[0]}x{want[1]}; use resize='bilinear'"
        )
