"""Fine-tuning one network: distillation from a teacher on augmented training batches.

The network trains on its own copy (``copy.deepcopy``): a stitched network's fragments are the
zoo's shared modules, and the zoo is never modified. Images stream from the train split batch
by batch (a seeded permutation, ``batch_size`` images in memory at a time), the teacher's soft
targets are computed per batch on the same augmented images, and after every epoch the network
is measured on a held-out slice (``recipe.judge``: of the validation split by default, of the
train split if asked). The weights kept are the best seen on that slice, the starting weights
included, so a fine-tune never returns a network that is worse there than the one it was
given (on the development zoo, distilling an ensemble into an already converged ResNet-20
lowered it: 93.02 to 92.06 % test at lr 0.01). The slice comes from the validation split by
default because a zoo trained on the train split scores its own training images too well: a
slice of them kept the starting weights of 10 of 11 networks of an unseen public CIFAR-10 zoo.

The parts that train run in train mode (BatchNorm normalises by the batch and updates its
statistics, as in the zoo models' own training: with frozen statistics, SGD at lr 0.01 made a
converged MobileNet's logits explode within four steps); the frozen parts stay in eval mode,
so a frozen first fragment still equals the zoo's own and its cached activations stand for it.
"""

from __future__ import annotations

import copy
import logging
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from stitch_nas.activations import StitchContext, to_device
from stitch_nas.report import wilson_interval
from stitch_nas.stitching import StitchedNet

from ._augment import Augment, TimmTrainTransform, pad_crop_flip
from ._holdout import judging_rows, nearest_share
from ._recipe import FinetuneRecipe
from ._teacher import Teacher

__all__ = [
    "FinetuneReport",
    "distillation_loss",
    "finetune",
    "holdout_flatters",
    "trained_parts",
]

logger = logging.getLogger(__name__)

#: part kinds of a StitchedNet (``part_info`` keys) that are stitching layers
_ADAPTER_PARTS = ("stitch", "adapter", "fused")


@dataclass(frozen=True)
class FinetuneReport:
    """What one fine-tune did, each figure measured during it."""

    recipe: dict[str, Any]  #: ``FinetuneRecipe.to_dict()``
    teacher: str  #: who taught, e.g. "ensemble of a, b, c (T=4)"
    train_images: int  #: training images per epoch (the held-out slice excluded)
    holdout_images: int  #: images of the held-out slice that judged each epoch
    steps: int
    images_seen: int  #: training images the steps took (an image twice in two epochs)
    epochs: int  #: epochs run (complete or not)
    seconds: float
    initial_holdout: float  #: held-out accuracy of the network it was given
    best_holdout: float  #: held-out accuracy of the weights kept
    best_epoch: int  #: the epoch whose weights were kept (0: the starting weights)
    #: "epochs", "steps", "seconds", "patience", "unmoved" (``recipe.stop_unmoved``) or
    #: "diverged" (a non-finite loss)
    stopped: str
    judged_on: str = "train"  #: the split of the held-out slice ("val" or "train")

    @property
    def kept_start(self) -> bool:
        """Whether the fine-tune returned the weights it was given."""
        return self.best_epoch == 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def holdout_flatters(report: FinetuneReport, validation: float, val_images: int) -> bool:
    """Whether the held-out slice scored the network it was given above its ``validation``
    accuracy beyond both 95 % intervals: the slice is then no fair sample of unseen images (the
    zoo was trained on the train split, as public CIFAR-10 models were), and keeping the best
    epoch there favours the starting weights."""
    if report.holdout_images < 1 or val_images < 1:
        return False
    low, _ = wilson_interval(
        nearest_share(report.initial_holdout, report.holdout_images), report.holdout_images
    )
    _, high = wilson_interval(nearest_share(validation, val_images), val_images)
    return low > high


def trained_parts(net: StitchedNet, train: str) -> list[nn.Module]:
    """The parts of ``net`` whose weights ``train`` names (see ``FinetuneRecipe.train``)."""
    parts = list(net.parts)
    if train == "all":
        return parts
    if train == "suffix":
        return parts[1:]
    return [
        part
        for part, info in zip(parts, net.part_info, strict=True)
        if info[0][0] in _ADAPTER_PARTS
    ]


def distillation_loss(
    logits: torch.Tensor,
    soft_targets: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    ce_weight: float,
    smoothing: float = 0.0,
) -> torch.Tensor:
    """``T^2 * KL(teacher || student)`` on outputs softened by ``T``, plus weighted CE with
    ``labels``: class indices (smoothed by ``smoothing``), or one row of class weights per
    image (mixup's mixed labels, smoothed already)."""
    log_student = F.log_softmax(logits / temperature, dim=1)
    loss = F.kl_div(log_student, soft_targets, reduction="batchmean") * temperature**2
    if ce_weight:
        loss = loss + ce_weight * F.cross_entropy(logits, labels, label_smoothing=smoothing)
    return loss


def _batches(
    ctx: StitchContext,
    rows: torch.Tensor,
    batch_size: int,
    generator: torch.Generator | None,
    split_name: str = "train",
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(images, labels) of a split's ``rows``, shuffled when a generator is given."""
    split = ctx.split(split_name)
    order = rows[torch.randperm(len(rows), generator=generator)] if generator is not None else rows
    for i in range(0, len(order), batch_size):
        index = order[i : i + batch_size].sort().values  # sources read sorted rows fastest
        yield to_device(split.read(index), ctx.device), to_device(split.y[index], ctx.device)


@torch.no_grad()
def _accuracy(
    ctx: StitchContext, net: nn.Module, split: str, rows: torch.Tensor, batch_size: int
) -> float:
    correct = 0
    for images, labels in _batches(ctx, rows, batch_size, None, split):
        correct += int((net(images).argmax(1) == labels).sum())
    return correct / max(1, len(rows))


def _optimizer(recipe: FinetuneRecipe, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """timm's optimizer ``recipe.opt`` (its ``sgd`` has Nesterov momentum, which needs some:
    without, plain SGD, timm's ``momentum`` at 0)."""
    from timm.optim import create_optimizer_v2

    name = "momentum" if recipe.opt == "sgd" and recipe.momentum == 0 else recipe.opt
    return create_optimizer_v2(
        params, opt=name, lr=recipe.lr, weight_decay=recipe.weight_decay, momentum=recipe.momentum
    )


def lr_schedule(
    recipe: FinetuneRecipe, optimizer: torch.optim.Optimizer, total: int, per_epoch: int
) -> Any:
    """timm's cosine schedule over ``total`` optimizer steps to ``recipe.min_lr``, after a
    linear warm-up of ``recipe.warmup_epochs`` epochs (``per_epoch`` steps each); stepped with
    ``step_update(steps done)``."""
    from timm.scheduler import CosineLRScheduler

    return CosineLRScheduler(
        optimizer,
        t_initial=total,
        lr_min=recipe.min_lr,
        warmup_t=round(recipe.warmup_epochs * per_epoch),
        warmup_lr_init=recipe.warmup_lr,
        t_in_epochs=False,
    )


def _mixup(recipe: FinetuneRecipe, classes: int) -> Any:
    """timm's ``Mixup`` (mixup / CutMix, labels smoothed), or None when both are off."""
    if not (recipe.mixup or recipe.cutmix):
        return None
    from timm.data import Mixup

    return Mixup(
        mixup_alpha=recipe.mixup,
        cutmix_alpha=recipe.cutmix,
        label_smoothing=recipe.smoothing,
        num_classes=classes,
    )


def finetune(
    ctx: StitchContext,
    net: StitchedNet,
    teacher: Teacher,
    recipe: FinetuneRecipe,
    *,
    augment: Augment | None = None,
    progress: Callable[[str], Any] | None = None,
) -> tuple[StitchedNet, FinetuneReport]:
    """Train a copy of ``net`` by distillation from ``teacher``; return the copy kept.

    Args:
        ctx: The context whose train split and device are used.
        net: The network to start from (left as it is).
        teacher: Soft targets per batch.
        recipe: What trains and how.
        augment: Replaces the padded crop and flip, or timm's transform (``recipe.aa``,
            ``recipe.scale``), when ``recipe.augment`` is on (a user's own transform:
            ``(images, generator) -> images``).
        progress: Called with one line per epoch.
    """
    cuda = [ctx.device] if ctx.device.type == "cuda" else []
    # timm's Mixup draws from NumPy's global generator, its training transform from Python's,
    # NumPy's and torch's
    numpy_state, python_state = np.random.get_state(), random.getstate()
    with torch.random.fork_rng(devices=cuda):  # the caller's random state is left as it was
        torch.manual_seed(recipe.seed)  # dropout, drop-path: the same draws in any process
        np.random.seed(recipe.seed)
        random.seed(recipe.seed)
        try:
            return _train_copy(ctx, net, teacher, recipe, augment, progress)
        finally:
            np.random.set_state(numpy_state)
            random.setstate(python_state)


def _train_copy(
    ctx: StitchContext,
    net: StitchedNet,
    teacher: Teacher,
    recipe: FinetuneRecipe,
    augment: Augment | None,
    progress: Callable[[str], Any] | None,
) -> tuple[StitchedNet, FinetuneReport]:
    student = copy.deepcopy(net).to(ctx.device)
    if recipe.train == "all":  # its first fragment is its own copy now, not the cached one
        student.cached_prefix = False
    student.requires_grad_(False)
    training = trained_parts(student, recipe.train)
    params: list[nn.Parameter] = []
    for part in training:
        for p in part.parameters():
            p.requires_grad_(True)
            params.append(p)

    train_rows, held_rows = judging_rows(ctx, recipe)
    batches = math.ceil(len(train_rows) / recipe.batch_size)
    per_epoch = max(1, batches // recipe.grad_accum_steps)  # optimizer steps an epoch
    total = (
        per_epoch * recipe.epochs
        if recipe.steps is None
        else min(recipe.steps, per_epoch * recipe.epochs)
    )
    optimizer = _optimizer(recipe, params)
    schedule = lr_schedule(recipe, optimizer, total, per_epoch)
    mixing = _mixup(recipe, ctx.num_classes)
    shuffle = torch.Generator().manual_seed(recipe.seed)
    crops = torch.Generator().manual_seed(recipe.seed + 1)
    transform = augment or (
        TimmTrainTransform(recipe.aa, recipe.scale) if recipe.timm_transform else pad_crop_flip
    )
    if recipe.channels_last:  # else each part keeps the layout the context gave its model
        student = student.to(memory_format=torch.channels_last)
    ema = None
    if recipe.model_ema:
        from timm.utils import ModelEmaV3

        ema = ModelEmaV3(student, decay=recipe.model_ema_decay)
    scored = student if ema is None else ema.module  # what the held-out slice scores, and kept

    student.eval()
    initial = best = _accuracy(ctx, student, recipe.judge, held_rows, recipe.batch_size)
    # beyond the start's interval, an epoch moved it (stop_unmoved)
    _, moved = wilson_interval(nearest_share(initial, len(held_rows)), len(held_rows))
    best_state = copy.deepcopy(student.state_dict())
    best_epoch, since_best, steps, seen, stopped = 0, 0, 0, 0, "epochs"
    start = time.perf_counter()
    epoch = 0
    for epoch in range(1, recipe.epochs + 1):
        for part in training:  # the rest stays in eval mode (module docstring)
            part.train()
        optimizer.zero_grad(set_to_none=True)
        pending = 0  # images of batches whose gradients wait for the next step
        for batch, (images, labels) in enumerate(
            _batches(ctx, train_rows, recipe.batch_size, shuffle)
        ):
            if recipe.augment:
                images = transform(images, crops)
            if mixing is not None and len(images) % 2 == 0:  # timm mixes pairs of images
                images, labels = mixing(images, labels)  # labels: mixed and smoothed rows
            if recipe.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            with torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=recipe.amp):
                targets = teacher.soft_targets(images).float()
                loss = distillation_loss(
                    student(images).float(),
                    targets,
                    labels,
                    recipe.temperature,
                    recipe.ce_weight,
                    0.0 if labels.is_floating_point() else recipe.smoothing,
                )
            if not bool(torch.isfinite(loss.detach())):  # diverged: keep the best so far
                logger.warning(
                    "fine-tuning %s stopped at step %d: the loss is not finite (lower "
                    "finetune.lr, now %g); keeping the best weights seen",
                    net.config.describe(),
                    steps,
                    recipe.lr,
                )
                stopped = "diverged"
                break
            (loss / recipe.grad_accum_steps).backward()
            pending += len(images)  # counted when a step applies their gradients
            if (batch + 1) % recipe.grad_accum_steps:
                continue  # gradients add up over grad_accum_steps batches
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps, seen, pending = steps + 1, seen + pending, 0
            schedule.step_update(steps)
            if ema is not None:
                ema.update(student, step=steps)
            if steps >= total:
                stopped = "steps" if recipe.steps is not None else stopped
                break
            if recipe.seconds is not None and time.perf_counter() - start > recipe.seconds:
                stopped = "seconds"
                break
        student.eval()
        accuracy = _accuracy(ctx, scored, recipe.judge, held_rows, recipe.batch_size)
        if progress is not None:
            progress(
                f"  epoch {epoch}: held-out {recipe.judge} accuracy {accuracy:.4f} (start "
                f"{initial:.4f}), "
                f"{steps} steps, {time.perf_counter() - start:.0f} s"
            )
        if accuracy > best or (recipe.keep == "last" and stopped != "diverged"):
            best, best_epoch, since_best = accuracy, epoch, 0
            best_state = copy.deepcopy(scored.state_dict())
        else:
            since_best += 1
        if stopped in ("steps", "seconds", "diverged") or steps >= total:
            break
        if since_best > recipe.patience:
            stopped = "patience"
            break
        if epoch == 1 and recipe.stop_unmoved and recipe.keep == "best" and accuracy <= moved:
            stopped = "unmoved"
            break
    student.load_state_dict(best_state)
    student.requires_grad_(False)
    student.eval()
    report = FinetuneReport(
        recipe=recipe.to_dict(),
        teacher=teacher.describe(),
        train_images=len(train_rows),
        holdout_images=len(held_rows),
        steps=steps,
        images_seen=seen,
        epochs=epoch,
        seconds=time.perf_counter() - start,
        initial_holdout=initial,
        best_holdout=best,
        best_epoch=best_epoch,
        stopped=stopped,
        judged_on=recipe.judge,
    )
    return student, report
