"""Training adapters: AdamW with a cosine schedule, a step or time budget, early stopping.

Defaults are Traft & Cheney's (AdamW, lr 2e-3, weight decay 0.05, cosine annealing to 0).
Four losses: ``match`` (mean squared error to the destination model's own activations at its
cut: label-free, nothing runs after the adapter), ``task`` (cross-entropy through the
destination's frozen suffix), ``distill`` (knowledge distillation through that suffix:
``T^2 * KL(teacher || student)`` on logits softened by the ``temperature`` T, Hinton et al.'s
form; the teacher is the destination model itself by default, or any zoo model, or ``"best"``,
the strongest one, as SN-Net distils from RegNetY-160) and ``feature`` (mean squared error to
the destination's own features at its penultimate layer, through the suffix up to there).
SN-Net gives no temperature (it follows DeiT's training recipe), so the default is 1.0.
Early stopping watches the same loss on a held-out set (the probe split, which no accuracy is
measured on) and restores the best weights seen. A NaN or Inf loss raises
:class:`~stitch_nas.errors.NonFiniteError`, which the runner records as a failed trial.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stitch_nas.activations import Rows, in_order, take
from stitch_nas.errors import NonFiniteError

__all__ = [
    "training_loss",
    "TrainData",
    "TrainReport",
    "cosine_schedule",
    "only_training",
    "take_step",
    "train",
]

logger = logging.getLogger(__name__)


@dataclass
class TrainData:
    """Training and held-out pairs: inputs of the trained chain and what its output should be.

    Targets are destination activations (``match``; ``feature``: at the penultimate layer),
    class labels (``task``) or the teacher's logits (``distill``).
    """

    inputs: torch.Tensor | Rows  #: a whole tensor, or rows fetched per mini-batch
    targets: torch.Tensor | Rows
    val_inputs: torch.Tensor | Rows
    val_targets: torch.Tensor | Rows


@dataclass
class TrainReport:
    """What one training run did, each figure measured during the run."""

    steps: int  #: optimiser steps taken
    seconds: float  #: wall time of the loop
    first_loss: float  #: mean training loss over the first evaluation interval
    last_loss: float  #: mean training loss over the last evaluation interval
    initial_val: float  #: held-out loss before training
    best_val: float  #: best held-out loss seen (its weights are the ones kept)
    stopped: str  #: "steps", "seconds" or "patience"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def training_loss(
    loss: str, out: torch.Tensor, target: torch.Tensor, temperature: float
) -> torch.Tensor:
    """One of :data:`LOSSES` (but "none") of a batch: ``target`` is features (match,
    feature), class labels (task) or the teacher's logits (distill)."""
    if loss in ("match", "feature"):
        return F.mse_loss(out, target)
    if loss == "task":
        return F.cross_entropy(out, target)
    # distill: T^2 keeps the gradient scale of the soft targets independent of T (Hinton et al.)
    student = F.log_softmax(out / temperature, dim=1)
    teacher = F.log_softmax(target.float() / temperature, dim=1)
    kl = F.kl_div(student, teacher, reduction="batchmean", log_target=True)
    return kl * temperature**2


def _held_out(
    model: nn.Module,
    data: TrainData,
    loss: str,
    temperature: float,
    size: int,
    device: torch.device,
) -> float:
    """Mean held-out loss, in eval mode (running BatchNorm statistics)."""
    was = model.training
    model.eval()
    total = 0.0
    with torch.no_grad():
        for xb, yb in zip(
            in_order(data.val_inputs, size), in_order(data.val_targets, size), strict=True
        ):
            out = model(xb.to(device))
            total += float(training_loss(loss, out, yb.to(device), temperature)) * xb.shape[0]
    model.train(was)
    return total / max(len(data.val_inputs), 1)


@contextlib.contextmanager
def only_training(model: nn.Module, params: list[nn.Parameter]) -> Iterator[None]:
    """Freeze every parameter of ``model`` but ``params`` for the duration, then restore.

    The frozen parts may be the zoo's shared modules: their weights are never stepped, and
    freezing them also keeps gradients from piling up on them.
    """
    keep = {id(p) for p in params}
    frozen = [p for p in model.parameters() if id(p) not in keep and p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(True)


def cosine_schedule(
    optimiser: torch.optim.Optimizer, steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Cosine annealing of every parameter group's learning rate to 0 over ``steps``."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda k: 0.5 * (1.0 + math.cos(math.pi * min(k, steps) / steps))
    )


def take_step(
    loss: torch.Tensor,
    optimiser: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    *,
    what: str,
    step: int,
    fix: str,
) -> float:
    """One optimiser and schedule step on ``loss``; returns its value.

    Raises:
        NonFiniteError: the loss is NaN or Inf (the message names ``what`` and ``fix``).
    """
    value = float(loss.detach())
    if not math.isfinite(value):
        raise NonFiniteError(f"training loss of {what} became {value} at step {step}; {fix}")
    optimiser.zero_grad(set_to_none=True)
    loss.backward()
    optimiser.step()
    schedule.step()
    return value


def _snapshot(modules: list[nn.Module]) -> list[dict[str, torch.Tensor]]:
    return [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in modules]


def train(
    model: nn.Module,
    params: list[nn.Parameter],
    modules: list[nn.Module],
    data: TrainData,
    opts: dict[str, Any],
    *,
    device: torch.device,
    what: str = "adapter",
) -> TrainReport:
    """Train ``params`` of ``model`` on ``data`` with the loss and budget in ``opts``.

    Args:
        model: the chain the loss is computed on (prefix copy?, adapter, frozen suffix?).
        params: the parameters that train; every other parameter of ``model`` stays frozen.
        modules: modules whose state is snapshotted for early stopping; the adapter among
            them runs in train mode (batch statistics), all else in eval mode.
        opts: resolved adapter options (loss, temperature, steps, seconds, lr, weight_decay,
            batch_size, patience, eval_every, seed).
    """
    loss_name, steps = str(opts["loss"]), int(opts["steps"])
    temperature = float(opts["temperature"])
    optimiser = torch.optim.AdamW(params, lr=float(opts["lr"]), weight_decay=opts["weight_decay"])
    schedule = cosine_schedule(optimiser, steps)
    model.eval()
    modules[0].train()
    generator = torch.Generator().manual_seed(int(opts["seed"]))
    size, n = int(opts["batch_size"]), len(data.inputs)
    every, patience = int(opts["eval_every"]), int(opts["patience"])
    best = initial = _held_out(model, data, loss_name, temperature, size, device)
    best_state, stale, stopped = _snapshot(modules), 0, "steps"
    losses: list[float] = []
    start = time.perf_counter()
    order, cursor = torch.arange(n), n  # the first step draws a fresh order
    # enable_grad: a caller may build networks under no_grad, training needs gradients anyway
    with only_training(model, params), torch.enable_grad():
        for step in range(steps):
            if opts["seconds"] is not None and time.perf_counter() - start > opts["seconds"]:
                stopped = "seconds"
                break
            if cursor + min(size, n) > n:  # a new epoch: a new order
                order, cursor = torch.randperm(n, generator=generator), 0
            index = order[cursor : cursor + size]
            cursor += size
            out = model(take(data.inputs, index).to(device))
            loss = training_loss(loss_name, out, take(data.targets, index).to(device), temperature)
            fix = f"lower lr (now {opts['lr']}) or use init='lstsq'"
            losses.append(take_step(loss, optimiser, schedule, what=what, step=step, fix=fix))
            if (step + 1) % every == 0 or step + 1 == steps:
                val = _held_out(model, data, loss_name, temperature, size, device)
                if val < best:
                    best, best_state, stale = val, _snapshot(modules), 0
                else:
                    stale += 1
                if patience and stale >= patience:
                    stopped = "patience"
                    break
    for module, state in zip(modules, best_state, strict=True):
        module.load_state_dict(state)
    model.eval()
    window = losses[:every] or [initial]
    tail = losses[-every:] or [initial]
    return TrainReport(
        steps=len(losses),
        seconds=time.perf_counter() - start,
        first_loss=sum(window) / len(window),
        last_loss=sum(tail) / len(tail),
        initial_val=initial,
        best_val=best,
        stopped=stopped,
    )
