"""Augmentation of training batches, on the device: padded random crop and horizontal flip.

The standard CIFAR recipe (pad 4, crop back, flip half the images), done on a whole batch of
``[0, 1]`` images at once with one ``torch.Generator``, so a seed fixes every crop and flip.
It is applied to training batches only: the held-out slice, validation and test never see it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = ["Augment", "pad_crop_flip"]

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
