"""One network of the fine-tune stage, trained in whichever process runs it.

The stage (:mod:`._stage`) decides in the driver which networks train and records what they
became; everything between (rebuild the network as its trial measured it, train it, keep its
weights, measure it again) is a :class:`Job` that :func:`run_job` runs on a context: the
driver's own, one network after the other, or a Ray worker's (``RayExecutor.map``), several at
once. A job is data (JSON-ready values and a path), so it pickles to a worker; its result is
the same wherever it runs for the same seed and thread count (:func:`~._train.finetune` seeds
everything it draws).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stitch_nas.activations import StitchContext
from stitch_nas.config import StitchConfig
from stitch_nas.report import accuracy_on, rebuild, rebuild_checked
from stitch_nas.stitching import (
    SAMPLE_IMAGES,
    StitchedNet,
    fit_net_head,
    sample_correct,
    save_tuned,
)

from ._recipe import FinetuneRecipe
from ._teacher import make_teacher
from ._train import FinetuneReport, finetune, trained_parts

__all__ = ["Job", "JobResult", "StageSetup", "run_job"]


@dataclass(frozen=True)
class StageSetup:
    """What every job of one stage shares.

    Attributes:
        recipe: How each network trains.
        val: The zoo models' validation accuracies (the ensemble teacher's choice).
        fuse: The search's ``fuse`` setting (networks are rebuilt as it measured them).
        progress: Print a line per epoch.
    """

    recipe: FinetuneRecipe
    val: dict[str, float]
    fuse: bool
    progress: bool = False


@dataclass(frozen=True)
class Job:
    """One network to train further.

    Attributes:
        name: What it is in one-line errors: ``trial 3``, ``zoo model resnet``.
        what: What it is in progress lines: the trial and its config.
        config: The network's ``StitchConfig.to_dict()``.
        file: Where its fine-tuned weights are written (absolute).
        recorded: Its trial's user attributes, which the rebuilt network must reproduce; None:
            measured again on the whole validation split (a network the fidelity gate scored
            on a slice only, or a zoo model for the control).
        weights: The trial's own weights file (trained or fine-tuned adapters), if any.
        control: A zoo model trained as the control: measured on the test split too.
    """

    name: str
    what: str
    config: dict[str, Any]
    file: str
    recorded: dict[str, Any] | None = None
    weights: str | None = None
    control: bool = False


@dataclass(frozen=True)
class JobResult:
    """What a job did.

    Attributes:
        before: Validation accuracy of the network it was given.
        after: Validation accuracy of the weights kept (``before`` when they are the start).
        report: What the training did (None: nothing trained, see ``skipped``).
        measured: The rebuilt network's ``Measurement.to_dict()`` when it was measured again.
        sample: ``sample_correct`` and ``sample_images`` of the weights kept, when new.
        test: Test accuracy of the weights kept (control jobs).
        skipped: Why nothing trained (a zoo model without weights of the recipe's kind).
    """

    before: float
    after: float
    report: FinetuneReport | None
    measured: dict[str, Any] | None = None
    sample: dict[str, int] | None = None
    test: float | None = None
    skipped: str | None = None


def run_job(
    ctx: StitchContext, job: Job, setup: StageSetup, echo: Callable[[str], Any]
) -> JobResult:
    """Rebuild ``job``'s network on ``ctx``, train it as ``setup`` says, keep and measure it."""
    recipe = setup.recipe
    config = StitchConfig.from_dict(job.config)
    weights = None if job.weights is None else Path(job.weights)
    measured = None
    if job.recorded is not None:
        fix = "fine-tune with the zoo, data and fuse setting of the search"
        checked = rebuild_checked(
            ctx, config, job.recorded, job.name, fix, fuse=setup.fuse, weights=weights
        )
        net, before = checked.net, checked.accuracy
    else:
        net, measurement = rebuild(ctx, config, fuse=setup.fuse and not job.control)
        before, measured = measurement.accuracy, measurement.to_dict()
    if not any(p.numel() for part in trained_parts(net, recipe.train) for p in part.parameters()):
        why = f"{job.name} has no {recipe.train} weights to train; it is its own control"
        return JobResult(before, before, None, measured, skipped=why)
    if setup.progress:
        echo(f"fine-tuning {job.what}")
    teacher = make_teacher(ctx.zoo, recipe.teacher, recipe.k, recipe.temperature, setup.val)
    tuned, report = finetune(ctx, net, teacher, recipe, progress=echo if setup.progress else None)
    if report.kept_start:  # the network it started from: nothing new to keep
        test = accuracy_on(ctx, net, "test") if job.control else None
        return JobResult(before, before, report, measured, test=test)
    save_tuned(tuned, Path(job.file))
    return JobResult(
        before,
        accuracy_on(ctx, tuned, "val"),
        report,
        measured,
        sample=_sample(ctx, tuned),
        test=accuracy_on(ctx, tuned, "test") if job.control else None,  # no choice reads it
    )


def run_in_worker(ctx: StitchContext, item: tuple[Job, StageSetup]) -> JobResult:
    """:func:`run_job` in a Ray worker, its progress lines on the worker's output (Ray shows
    them in the driver's, marked with the worker)."""
    job, setup = item
    return run_job(ctx, job, setup, lambda line: print(line, flush=True))


def _sample(ctx: StitchContext, net: StitchedNet) -> dict[str, int]:
    """The fixed sample of validation images the export checks ``net`` on, as a trial records
    it (``Measurement.sample_correct`` of ``sample_images``)."""
    images = min(SAMPLE_IMAGES, len(ctx.labels("val")))
    correct = sample_correct(ctx, net, fit_net_head(ctx, net), images)
    return {"sample_correct": correct, "sample_images": images}
