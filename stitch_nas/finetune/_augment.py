"""Augmentation of training batches: a padded random crop and flip, or timm's own transform.

The standard CIFAR recipe (pad 4, crop back, flip half the images), done on a whole batch of
``[0, 1]`` images at once with one ``torch.Generator``, so a seed fixes every crop and flip; or,
where the recipe names timm's training keys (``aa``, ``scale``), timm's
``create_transform(is_training=True)`` at the batch's own size, image by image. Either is
applied to training batches only: the held-out slice, validation and test never see it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from stitch_nas.errors import DataError

__all__ = ["Augment", "TimmTrainTransform", "pad_crop_flip"]

#: a user's own augmentation: (images in [0, 1], generator) -> images of the same shape
Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def pad_crop_flip(images: torch.Tensor, generator: torch.Generator, pad: int = 4) -> torch.Tensor:
    """Each image padded by ``pad`` zeros, cropped back at a random offset, flipped at p=0.5."""
    n, _, h, w = images.shape
    padded = F.pad(images, (pad, pad, pad, pad))
    # one offset and one flip per image, drawn on the CPU so a seed gives the same batch on
    # every device
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    flip = torch.rand(n, generator=generator) < 0.5
    rows = (torch.arange(h).view(1, h) + dy.view(n, 1)).to(images.device)  # (n, h)
    cols = (torch.arange(w).view(1, w) + dx.view(n, 1)).to(images.device)  # (n, w)
    cols = torch.where(flip.to(images.device).view(n, 1), cols.flip(1), cols)
    index = torch.arange(n, device=images.device).view(n, 1, 1)
    # gather (n, c, h, w) from padded (n, c, h + 2p, w + 2p)
    out = padded.permute(0, 2, 3, 1)[index, rows.view(n, h, 1), cols.view(n, 1, w)]
    return out.permute(0, 3, 1, 2).contiguous()


@functools.lru_cache(maxsize=8)
def timm_train_transform(
    size: tuple[int, int], aa: str | None, scale: tuple[float, float] | None
) -> Callable[[Any], Any]:
    """timm's training transform at ``size``, without normalisation: a PIL image in, a uint8
    ``(3, *size)`` tensor out (random resized crop over ``scale`` of the area, timm's default
    0.08-1 when None; a horizontal flip at p=0.5; the auto-augment policy ``aa``; no colour
    jitter, which timm's ``train.py`` adds where no policy is named)."""
    from timm.data import create_transform

    return create_transform(  # type: ignore[no-any-return]
        input_size=(3, *size),
        is_training=True,
        scale=scale,
        auto_augment=aa,
        color_jitter=None,  # type: ignore[arg-type]  # timm reads None as off
        normalize=False,
    )


class TimmTrainTransform:
    """timm's ``create_transform(is_training=True)`` applied to a batch of ``[0, 1]`` images.

    timm's transforms take one PIL image at a time and draw from Python's, NumPy's and torch's
    global generators, which :func:`stitch_nas.finetune.finetune` seeds from the recipe's seed
    (and restores afterwards), so ``generator`` is not used: a seed still fixes every crop and
    policy. The batch's size is kept, so a network trains at the size it was searched at.
    """

    def __init__(self, aa: str | None, scale: tuple[float, float] | None) -> None:
        self.aa, self.scale = aa, scale

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        from PIL import Image

        _, c, h, w = images.shape
        if c != 3:
            raise DataError(
                f"finetune.recipe.aa / scale take RGB images, but the train split's have {c} "
                "channels; set both to null (or augment: false)"
            )
        transform = timm_train_transform((h, w), self.aa, self.scale)
        pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)
        out = [transform(Image.fromarray(p.numpy())) for p in pixels.cpu()]
        return (torch.stack(out).to(images.device, images.dtype) / 255).contiguous()
