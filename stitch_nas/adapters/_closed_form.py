"""``lstsq``: the closed-form affine stitch (StitchNet), registered beside the trained kinds.

Created unfitted (zeros); :func:`~stitch_nas.adapters.initialise` fits it by least squares
exactly as :func:`stitch_nas.adapters.fit_lstsq` does. ``fuse=True`` folds it into the next
conv/linear layer when the network is built (see :func:`stitch_nas.adapters.fuse_into_segment`).
Least squares joins the layout pairs in :data:`stitch_nas.adapters.SUPPORTED_PAIRS`; for other
pairs (CNN -> ViT, ViT -> CNN, ...) use ``linear`` with ``loss='none'``, which is fitted by
least squares too and converts layouts.
"""

from __future__ import annotations

from torch import nn

from stitch_nas.fragments import CutPoint

from ._lstsq import LinearStitch
from ._registry import register_adapter

__all__: list[str] = []


@register_adapter(
    "lstsq",
    description="closed-form affine map (least squares with bias and ridge); fusable",
)
def _lstsq(src: CutPoint, dst: CutPoint) -> nn.Module:
    return LinearStitch(src, dst)
