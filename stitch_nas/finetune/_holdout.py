"""The held-out slice that judges each epoch of a fine-tune: which rows of which split.

By default the slice is the search's validation split (``judge: val``); ``judge: train`` holds
a seeded slice out of the train split instead, which a zoo trained on that split favours
(:func:`stitch_nas.finetune.holdout_flatters` says when it did).
"""

from __future__ import annotations

import torch

from stitch_nas.activations import StitchContext

from ._recipe import FinetuneRecipe

__all__ = ["holdout_rows", "judging_rows", "nearest_share"]


def nearest_share(accuracy: float, n: int) -> float:
    """``accuracy`` as the nearest whole count of ``n`` images, over ``n`` (a figure rounded on
    its way, e.g. a float32 mean, must not stop a printout)."""
    return min(max(round(accuracy * n), 0), n) / n


def holdout_rows(n: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted row indices of a split of ``n``: (the rest, the held-out rows), seeded."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    held = max(1, min(n - 1, round(n * fraction)))
    return order[held:].sort().values, order[:held].sort().values


def judging_rows(ctx: StitchContext, recipe: FinetuneRecipe) -> tuple[torch.Tensor, torch.Tensor]:
    """(Rows of the train split trained on, rows of the ``recipe.judge`` split that judge)."""
    n = len(ctx.split("train"))
    if recipe.judge == "train":
        return holdout_rows(n, recipe.holdout, recipe.seed)
    val = len(ctx.split("val"))
    held = (
        torch.arange(val)
        if recipe.holdout == 1
        else holdout_rows(val, recipe.holdout, recipe.seed)[1]
    )
    return torch.arange(n), held
