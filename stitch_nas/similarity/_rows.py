"""The row rule of CKA: each activation as ``(n, d)`` sample rows, two maps on one grid.

* ``"nhwc"`` maps are permuted to NCHW first.
* A 4-D map is resized bilinearly (``align_corners=False``) to ``spatial`` when given. The common
  size of two maps (:func:`common_spatial`) is **the smaller of the two spatial sizes**, per
  axis: the larger map is resized down, and no map is ever upsampled (which invents positions).
* ``mode="pooled"`` averages over positions or tokens -> ``(n, C)``; ``mode="flatten"`` keeps
  them -> ``(n, C*h*w)`` or ``(n, L*C)``, as Kornblith et al. do with conv maps.
* ``"vector"`` ``(n, C)`` passes through unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from stitch_nas.errors import ConfigError, DataError

__all__ = ["LAYOUTS", "MODES", "common_spatial", "to_rows"]

_LAYOUT_NDIM = {"nchw": 4, "nhwc": 4, "tokens": 3, "vector": 2}
LAYOUTS: tuple[str, ...] = tuple(_LAYOUT_NDIM)
MODES: tuple[str, ...] = ("pooled", "flatten")


def common_spatial(shape_a: Sequence[int], shape_b: Sequence[int]) -> tuple[int, int]:
    """Common spatial size of two maps: ``(min(h_a, h_b), min(w_a, w_b))``, never upsampling.

    Args:
        shape_a: ``(h, w)`` or a full NCHW shape of the first map (NHWC callers pass ``(h, w)``).
        shape_b: Same for the second map.

    Raises:
        DataError: If a shape has neither 2 nor 4 entries.
    """
    sizes = []
    for name, shape in (("shape_a", shape_a), ("shape_b", shape_b)):
        if len(shape) not in (2, 4):
            raise DataError(f"{name}={tuple(shape)} is neither (h, w) nor NCHW; pass one of them")
        sizes.append((int(shape[-2]), int(shape[-1])))
    return min(sizes[0][0], sizes[1][0]), min(sizes[0][1], sizes[1][1])


def to_rows(
    act: Any,
    layout: str,
    *,
    spatial: tuple[int, int] | None = None,
    mode: str = "pooled",
) -> torch.Tensor:
    """Turns an activation into ``(n, d)`` sample rows by the module's row rule.

    Args:
        act: Activation tensor (or numpy array) with samples on the first axis.
        layout: One of ``"nchw"``, ``"nhwc"``, ``"tokens"`` (``(n, L, C)``), ``"vector"``.
        spatial: ``(h, w)`` to resize 4-D maps to (bilinear, ``align_corners=False``), usually
            from :func:`common_spatial`; only valid for map layouts.
        mode: ``"pooled"`` (mean over positions/tokens) or ``"flatten"`` (keep positions).

    Returns:
        A floating tensor ``(n, d)`` on the input's device; floating inputs keep their dtype.

    Raises:
        ConfigError: If ``layout`` or ``mode`` is unknown, or ``spatial`` is given for a layout
            without a spatial grid or is not two positive ints.
        DataError: If the tensor rank does not match ``layout``.
    """
    if layout not in _LAYOUT_NDIM:
        raise ConfigError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    if mode not in MODES:
        raise ConfigError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")
    t = act if isinstance(act, torch.Tensor) else torch.as_tensor(np.asarray(act))
    if t.ndim != _LAYOUT_NDIM[layout]:
        want = _LAYOUT_NDIM[layout]
        raise DataError(f"layout {layout!r} needs a {want}-D tensor, got {tuple(t.shape)}; fix it")
    if not t.is_floating_point():
        t = t.float()
    if spatial is not None:
        if layout not in ("nchw", "nhwc"):
            raise ConfigError(f"spatial={spatial!r} given for layout {layout!r}; drop it")
        if len(spatial) != 2 or any(int(s) != s or s < 1 for s in spatial):
            raise ConfigError(f"spatial={spatial!r} is not (h, w) of positive ints; fix it")
    if layout == "vector":
        return t
    if layout == "tokens":
        return t.mean(dim=1) if mode == "pooled" else t.reshape(t.shape[0], -1)
    if layout == "nhwc":
        t = t.permute(0, 3, 1, 2)
    if spatial is not None and tuple(t.shape[2:]) != tuple(spatial):
        size = (int(spatial[0]), int(spatial[1]))
        t = F.interpolate(t, size=size, mode="bilinear", align_corners=False)
    if mode == "pooled":
        return t.mean(dim=(2, 3))
    return t.reshape(t.shape[0], -1)
