"""The fine-tune recipe: what trains, from which teacher, for how long, on what.

One frozen dataclass, checked once when it is built, recorded with every network it trained
(``to_dict``), so a stitched network and a zoo model fine-tuned as the control can be shown to
have had the identical recipe. The training keys are named as timm's ``train.py`` names them
(``opt``, ``lr``, ``min_lr``, ``warmup_epochs``, ``warmup_lr``, ``mixup``, ``cutmix``,
``smoothing``, ``aa``, ``scale``, ``model_ema``, ``model_ema_decay``, ``grad_accum_steps``,
``amp``, ``channels_last``), and timm's own pieces run them (:mod:`._train`); the defaults are the
CPU recipe the stage has always run (SGD with Nesterov momentum, cosine to 0, float32).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from stitch_nas.errors import ConfigError

__all__ = ["FinetuneRecipe", "JUDGES", "KEEPS", "TRAINS"]

#: what trains: the stitching layers only (ReStNet), everything after the first joint, or
#: every weight of the network (SN-Net's fine-tune; the zoo's shared models are never touched:
#: the network trains on its own copy of them)
TRAINS = ("adapter", "suffix", "all")
#: which weights a fine-tune returns: the best on the held-out slice (the start included), or
#: those after the last epoch
KEEPS = ("best", "last")
#: the split whose images judge each epoch (early stopping, the weights kept): the search's
#: validation split, which no zoo model trained on, or a slice held out of the train split
JUDGES = ("val", "train")


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def _at_least_zero(value: Any) -> bool:
    return not isinstance(value, bool) and (value == 0 or _positive(value))


def _whole(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


@dataclass(frozen=True)
class FinetuneRecipe:
    """How the networks of the front are trained further.

    Attributes:
        train: What trains: ``adapter`` (the stitching layers only), ``suffix`` (everything
            after the first fragment) or ``all`` (every weight, on the network's own copy).
        teacher: ``"ensemble"`` (the mean of the softened outputs of the ``k`` zoo models most
            accurate on validation) or a zoo model's name.
        k: Members of the ensemble teacher.
        temperature: Softening temperature of the distillation (Hinton et al.: the loss is
            ``T^2 * KL(teacher || student)`` on outputs softened by ``T``).
        ce_weight: Weight of the cross-entropy with the labels added to the distillation loss.
        epochs: Passes over the training images (a held-out slice of them excluded).
        steps: Optimiser steps at most (None: no limit beside ``epochs``).
        seconds: Wall time at most per network (None: no limit).
        opt: Any optimizer of ``timm.optim.create_optimizer_v2`` (``timm.optim.
            list_optimizers()``): ``sgd`` (Nesterov momentum), ``adamw``, ``lamb``, ``lion``...
            The learning rate follows timm's cosine schedule, per step, to ``min_lr``.
        lr: Peak learning rate.
        min_lr: Learning rate at the last step.
        warmup_epochs: Epochs (fractions allowed) of linear warm-up from ``warmup_lr`` to
            ``lr`` at the start of the schedule.
        warmup_lr: Learning rate the warm-up starts from.
        weight_decay: Weight decay.
        momentum: The optimizer's momentum (SGD's; 0: plain SGD).
        batch_size: Images per batch; the only images in memory at once.
        grad_accum_steps: Batches whose gradients add up to one optimizer step.
        mixup: timm's ``Mixup`` alpha (0: off): training batches mixed pairwise, the student
            and the teacher seeing the same mixed images, and the labels' cross-entropy
            (``ce_weight``) taken against the mixed labels.
        cutmix: timm's CutMix alpha (0: off); with both, each batch is one or the other.
        smoothing: Label smoothing of the labels' cross-entropy.
        model_ema: Keep timm's exponential moving average of the weights
            (``ModelEmaV3``); the held-out slice scores, and the stage keeps, the average.
        model_ema_decay: Its decay per step.
        amp: Forward passes under bfloat16 autocast (for a GPU; no loss scaling is needed).
        channels_last: Train in channels-last memory format (faster convolutions on a GPU).
        augment: Padded random crop (4 pixels) and horizontal flip of training batches, on the
            device; never applied to the held-out slice, validation or test. It suits natural
            images; turn it off where a mirror image means something else (digits, text).
        aa: timm's auto-augment policy, as its ``train.py``'s ``--aa`` names it
            (``rand-m9-mstd0.5`` for RandAugment, ``augmix-m5-w3``, ``original``, ``v0``;
            None: none; ``-inc1`` is refused where Pillow refuses its 0-bit posterize). With
            ``aa`` or ``scale`` set, timm's own training transform
            (``create_transform(is_training=True)``) replaces the padded crop and flip: a random
            resized crop back to the images' size, a horizontal flip, then the policy.
        scale: The random resized crop's range of the image's area (``[0.35, 1.0]``; None:
            timm's ``[0.08, 1.0]`` where ``aa`` is set).
        judge: The split whose held-out slice scores each epoch (early stopping and the
            weights kept): ``val``, the search's validation split (it already chooses the
            front, and no zoo model trained on it), or ``train``, a slice held out of the train
            split, which flatters the starting weights of a zoo trained on that split (public
            models are). The test split is never used.
        holdout: Fraction of the judging split held out to score each epoch (seeded): with
            ``val``, up to 1 (all of it); with ``train``, below 1, and those images are not
            trained on.
        patience: Epochs without a better held-out accuracy before stopping.
        stop_unmoved: Stop after the first epoch when it did not raise the held-out accuracy
            above the 95 % interval of the start's, so a network training cannot lift costs
            one epoch, not ``patience + 1``. Off by default: a first epoch at the peak
            learning rate can lower a network that later epochs lift (a least-squares
            stitch of the digits mini zoo: 0.727 at the start, 0.700 after epoch 1, 0.843
            after epoch 4, on 300 validation images).
        keep: ``best``: the weights the held-out slice scores highest, the starting ones
            included, so a network never comes back worse there. ``last``: those after the
            last epoch, every epoch run (no early stopping, no ``stop_unmoved``), for
            ``judge: train`` on a zoo trained on the train split, whose held-out slice
            favours the starting weights; the network still joins the front only where its
            validation accuracy earns it.
        seed: Seeds the held-out slice, the order of the batches and the augmentation.
    """

    train: str = "all"
    teacher: str = "ensemble"
    k: int = 3
    temperature: float = 4.0
    ce_weight: float = 0.0
    epochs: int = 10
    steps: int | None = None
    seconds: float | None = None
    opt: str = "sgd"
    lr: float = 0.01
    min_lr: float = 0.0
    warmup_epochs: float = 0.0
    warmup_lr: float = 0.0
    weight_decay: float = 5e-4
    momentum: float = 0.9
    batch_size: int = 128
    grad_accum_steps: int = 1
    mixup: float = 0.0
    cutmix: float = 0.0
    smoothing: float = 0.0
    model_ema: bool = False
    model_ema_decay: float = 0.9998
    amp: bool = False
    channels_last: bool = False
    augment: bool = True
    aa: str | None = None
    scale: tuple[float, float] | None = None
    judge: str = "val"
    holdout: float = 1.0
    patience: int = 3
    stop_unmoved: bool = False
    keep: str = "best"
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.scale, list):  # YAML and JSON give a list
            object.__setattr__(self, "scale", tuple(self.scale))
        checks: dict[str, tuple[bool, str]] = {
            "train": (self.train in TRAINS, f"one of {', '.join(TRAINS)}"),
            "teacher": (
                isinstance(self.teacher, str) and bool(self.teacher),
                "'ensemble' or a zoo model's name",
            ),
            "k": (_whole(self.k, 1), "an integer >= 1"),
            "temperature": (_positive(self.temperature), "a number > 0"),
            "ce_weight": (
                self.ce_weight == 0 or _positive(self.ce_weight),
                "a number >= 0",
            ),
            "epochs": (_whole(self.epochs, 1), "an integer >= 1"),
            "steps": (self.steps is None or _whole(self.steps, 1), "an integer >= 1, or null"),
            "seconds": (self.seconds is None or _positive(self.seconds), "a number > 0, or null"),
            "opt": (
                isinstance(self.opt, str) and bool(self.opt),
                "a timm optimizer's name (timm.optim.list_optimizers())",
            ),
            "lr": (_positive(self.lr), "a number > 0"),
            "min_lr": (
                _at_least_zero(self.min_lr) and self.min_lr < self.lr,
                "a number in [0, lr)",
            ),
            "warmup_epochs": (_at_least_zero(self.warmup_epochs), "a number >= 0"),
            "warmup_lr": (_at_least_zero(self.warmup_lr), "a number >= 0"),
            "weight_decay": (
                self.weight_decay == 0 or _positive(self.weight_decay),
                "a number >= 0",
            ),
            "momentum": (
                isinstance(self.momentum, (int, float)) and 0 <= self.momentum < 1,
                "a number in [0, 1)",
            ),
            "batch_size": (_whole(self.batch_size, 1), "an integer >= 1"),
            "grad_accum_steps": (_whole(self.grad_accum_steps, 1), "an integer >= 1"),
            "mixup": (_at_least_zero(self.mixup), "an alpha >= 0 (0: off)"),
            "cutmix": (_at_least_zero(self.cutmix), "an alpha >= 0 (0: off)"),
            "smoothing": (
                isinstance(self.smoothing, (int, float)) and 0 <= self.smoothing < 1,
                "a fraction in [0, 1)",
            ),
            "model_ema": (isinstance(self.model_ema, bool), "true or false"),
            "model_ema_decay": (
                isinstance(self.model_ema_decay, (int, float)) and 0 < self.model_ema_decay < 1,
                "a number in (0, 1)",
            ),
            "amp": (isinstance(self.amp, bool), "true or false"),
            "channels_last": (isinstance(self.channels_last, bool), "true or false"),
            "augment": (isinstance(self.augment, bool), "true or false"),
            "aa": (
                self.aa is None or (isinstance(self.aa, str) and bool(self.aa)),
                "a timm auto-augment policy such as rand-m9-mstd0.5, or null",
            ),
            "scale": (
                self.scale is None
                or (
                    isinstance(self.scale, tuple)
                    and len(self.scale) == 2
                    and all(_positive(v) for v in self.scale)
                    and self.scale[0] <= self.scale[1] <= 1
                ),
                "two fractions of the area, low <= high <= 1, such as [0.35, 1.0], or null",
            ),
            "judge": (self.judge in JUDGES, f"one of {', '.join(JUDGES)}"),
            "holdout": (
                _positive(self.holdout)
                and (self.holdout < 1 or (self.holdout == 1 and self.judge == "val")),
                "a fraction in (0, 1] with judge: val, in (0, 1) with judge: train",
            ),
            "patience": (_whole(self.patience, 0), "an integer >= 0"),
            "stop_unmoved": (isinstance(self.stop_unmoved, bool), "true or false"),
            "keep": (self.keep in KEEPS, f"one of {', '.join(KEEPS)}"),
            "seed": (_whole(self.seed, 0), "an integer >= 0"),
        }
        for name, (ok, rule) in checks.items():
            if not ok:
                value = repr(getattr(self, name))[:80]
                raise ConfigError(f"finetune.recipe.{name}={value} is invalid; use {rule}")
        if self.aa is not None:
            _check_policy(self.aa)

    @property
    def timm_transform(self) -> bool:
        """Whether training batches go through timm's training transform (``aa`` or ``scale``)."""
        return self.augment and (self.aa is not None or self.scale is not None)

    def to_dict(self) -> dict[str, Any]:
        """The recipe as JSON-ready values (what a fine-tuned trial records)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FinetuneRecipe:
        """A recipe from ``to_dict``'s output or a YAML ``finetune:`` section."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"unknown finetune.recipe key {unknown[0]!r}; use any of {', '.join(sorted(known))}"
            )
        return cls(**data)


def _check_policy(aa: str) -> None:
    """A one-line error for a policy timm cannot build, before any work (timm raises bare
    asserts and KeyErrors from deep in its parser)."""
    from PIL import Image, ImageOps

    from ._augment import timm_train_transform

    if "inc1" in aa.split("-"):  # timm's increasing posterize keeps 4 down to 0 bits
        try:
            ImageOps.posterize(Image.new("RGB", (1, 1)), 0)
        except ValueError:
            raise ConfigError(
                f"finetune.recipe.aa={aa!r}: timm's increasing posterize (inc1) asks for 0 "
                "bits, which this Pillow refuses mid-training; drop -inc1 (rand-m9-mstd0.5)"
            ) from None
    try:
        timm_train_transform((32, 32), aa, None)
    except Exception as error:  # noqa: BLE001 - timm's parser raises asserts, KeyErrors...
        raise ConfigError(
            f"finetune.recipe.aa={aa!r} is not a policy timm can build ({type(error).__name__}); "
            "use one as timm's train.py --aa, such as rand-m9-mstd0.5, augmix-m5-w3 or "
            "original"
        ) from None
