"""Image sources: splits whose images are made float32 batch by batch, e.g. from uint8 arrays.

:class:`ImageSource` is what a split's ``x`` may be besides a float32 tensor (files,
:mod:`stitch_nas.data._files`; uint8 arrays, :class:`ArrayImages`).

A torchvision data set stores its images as uint8 at their native size. Converted whole to
float32 at the size a zoo wants, CIFAR-10 (60,000 images) takes 0.74 GB at 32x32 and 36 GB at
224x224; kept as uint8, 0.18 GB at any output size. :class:`ArrayImages` keeps them so and
scales (and resizes) one batch at a time, with the same conversion the whole-array path did
(``/ 255`` in float32, then :func:`resize_images`), so the pixels are equal.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F

from stitch_nas.errors import DataError

__all__ = [
    "ArrayImages",
    "ImageSource",
    "channels_first",
    "check_finite_rows",
    "is_channels_last",
    "resize_images",
    "stored_side",
    "transform_images",
]

_CHUNK = 4096  # images resized per call, to bound peak memory on large data sets


def resize_images(x: torch.Tensor, size: int) -> torch.Tensor:
    """Resize a float batch to ``size`` x ``size`` (bilinear; antialiased when shrinking)."""
    if tuple(x.shape[-2:]) == (size, size):
        return x
    shrink = x.shape[-1] > size or x.shape[-2] > size
    out = [
        F.interpolate(chunk, (size, size), mode="bilinear", align_corners=False, antialias=shrink)
        for chunk in x.split(_CHUNK)
    ]
    return torch.cat(out).clamp_(0.0, 1.0)


def transform_images(stored: torch.Tensor, transform: Callable[[Any], Any]) -> torch.Tensor:
    """A model's eval transform (:meth:`~stitch_nas.zoo.InputSpec.image_transform`) over stored
    images ``(n, C, h, w)`` (C = 1 or 3), as float32 ``(n, 3, H, W)`` in ``[0, 1]``.

    uint8 images go through it one PIL image at a time, as timm's own eval pipeline reads
    them, so the pixels are timm's; float images (no PIL image holds them exactly) go through
    it as one tensor batch (torchvision's tensor resize, antialiased).
    """
    if stored.dtype != torch.uint8:
        return transform(stored.float().expand(-1, 3, -1, -1)).clamp_(0.0, 1.0)  # type: ignore[no-any-return]
    from PIL import Image

    out = []
    for image in stored.permute(0, 2, 3, 1).numpy():  # (h, w, C): PIL's layout
        pil = Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
        out.append(transform(pil.convert("RGB")))
    return torch.stack(out).float().div_(255.0)


def check_finite_rows(
    x: np.ndarray | torch.Tensor, what: str, rows: np.ndarray | None = None
) -> None:
    """Refuse float images holding NaN or Inf, naming the first such row (``rows``: the file
    rows ``x`` holds, in order; None: ``x`` starts at row 0).

    A NaN passes a ``[0, 1]`` range check (every comparison with it is false) and only shows up
    once the whole search has run, as accuracies that make no sense: refused at load instead.

    Raises:
        DataError: an image holds NaN or Inf.
    """
    t = torch.as_tensor(x)
    # a float64 sum is NaN or Inf exactly when an element is: one pass, no boolean copy
    if not t.is_floating_point() or bool(t.sum(dtype=torch.float64).isfinite()):
        return
    bad = int((~t.isfinite()).flatten(1).any(1).nonzero()[0])
    row = bad if rows is None else int(rows[bad])
    raise DataError(
        f"{what} holds NaN or Inf in row {row} (the first such row); store finite pixel "
        "values in [0, 1], or drop that image"
    )


def is_channels_last(shape: tuple[int, ...], what: str) -> bool:
    """Whether images of ``shape`` are ``(N, H, W, C)``; else ``(N, C, H, W)`` or ``(N, H, W)``.

    Raises:
        DataError: no such layout with 1 or 3 channels.
    """
    last = len(shape) == 4 and shape[-1] in (1, 3) and shape[1] not in (1, 3)
    if not (len(shape) == 3 or (len(shape) == 4 and (shape[-1] if last else shape[1]) in (1, 3))):
        raise DataError(
            f"{what} has shape {tuple(shape)}; store images as (N, H, W, C), (N, C, H, W) or "
            "(N, H, W) with 1 or 3 channels"
        )
    return last


def channels_first(x: np.ndarray, what: str) -> np.ndarray:
    """``(N, H, W, C)``, ``(N, C, H, W)`` or ``(N, H, W)`` images as ``(N, C, H, W)``."""
    if is_channels_last(x.shape, what):
        return x.transpose(0, 3, 1, 2)
    return x[:, None] if x.ndim == 3 else x


@runtime_checkable
class ImageSource(Protocol):
    """Images of one split that are read in batches rather than held as a float32 tensor."""

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(N, 3, H, W)`` of the float32 images it yields."""
        ...

    def __len__(self) -> int: ...

    def batches(
        self,
        size: int,
        index: torch.Tensor | None = None,
        transform: Callable[[Any], Any] | None = None,
    ) -> Iterator[torch.Tensor]:
        """Float32 images in ``[0, 1]``: rows ``index`` (sorted; None: all), ``size`` at a time;
        with ``transform`` (a model's eval transform, :func:`transform_images`), made from the
        stored images by it rather than resized to :attr:`shape`."""
        ...

    def fingerprint(self) -> str:
        """A digest that changes when the images do (keys the on-disk activation cache)."""
        ...


def stored_side(images: torch.Tensor | ImageSource) -> int:
    """The largest input side images may be given to a model at without upsampling them: an
    image source's ``stored_side`` where it has one, else the shorter side of its shape."""
    side = getattr(images, "stored_side", None)
    return int(side) if side is not None else int(min(images.shape[-2:]))


class ArrayImages:
    """uint8 images ``(N, C, h, w)`` (C = 1 or 3) in memory, yielded as float32 ``(n, 3, size,
    size)`` in ``[0, 1]`` (or through a model's eval transform), one batch at a time."""

    def __init__(self, pixels: torch.Tensor, size: int) -> None:
        if pixels.dtype != torch.uint8 or pixels.ndim != 4 or pixels.shape[1] not in (1, 3):
            got = f"{pixels.dtype} {tuple(pixels.shape)}"
            raise ValueError(f"pixels must be uint8 (N, 1|3, h, w), got {got}")
        self.pixels, self.size = pixels.contiguous(), size

    def __len__(self) -> int:
        return len(self.pixels)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self.pixels), 3, self.size, self.size)

    @property
    def stored_side(self) -> int:
        """The largest side a model may take without upsampling: the stored images' shorter
        side, at most :attr:`size`."""
        return min(self.size, *self.pixels.shape[-2:])

    def rows(self, index: torch.Tensor) -> ArrayImages:
        """The images ``index`` as a new source (a copy of their uint8 pixels)."""
        return ArrayImages(self.pixels[index], self.size)

    def batches(
        self,
        size: int,
        index: torch.Tensor | None = None,
        transform: Callable[[Any], Any] | None = None,
    ) -> Iterator[torch.Tensor]:
        n = len(self) if index is None else len(index)
        for start in range(0, n, size):
            part = slice(start, start + size)
            pixels = self.pixels[part] if index is None else self.pixels[index[part]]
            if transform is not None:
                yield transform_images(pixels, transform)
                continue
            images = resize_images(pixels.float().div_(255.0), self.size)
            yield images.expand(-1, 3, -1, -1).contiguous()

    def fingerprint(self) -> str:
        digest = hashlib.sha256(f"uint8{tuple(self.pixels.shape)}:{self.size}".encode())
        digest.update(memoryview(self.pixels.numpy()))  # type: ignore[arg-type]
        return digest.hexdigest()
