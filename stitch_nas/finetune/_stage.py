"""The fine-tune stage of a search: the front's networks trained further, and the control.

After the search and its refinements, :func:`finetune_front` takes up to ``networks`` stitched
networks (:func:`~stitch_nas.finetune.choose`: validation accuracy at least ``floor``, the most
accurate in each of ``networks`` bands of cost, one per set of fragments), trains each further
(:func:`~stitch_nas.finetune.finetune`) from the teacher the recipe names, and records the
result as a trial of its own: the same config, parameters and costs as the trial it started
from, its own validation accuracy, the recipe and what the training did (``attrs.FINETUNED``),
the trial it trains further (``attrs.FINETUNES``) and its weights (``attrs.WEIGHTS``, a
safetensors file under ``<folder>/finetuned/``). The test pass, the report and the export then
treat it like any other trial.

With ``control``, the zoo's own front models (non-dominated among the zoo on validation), and
any zoo models it names, are fine-tuned with the identical recipe and teacher (a claim against
a model off the front, say a costlier one a network beats, is honest only if that model was
trained as much too): a fine-tuned stitched network is then
compared with the zoo as given *and* with the zoo trained as much as it was
(``attrs.FINETUNE_CONTROL`` on the study; the report states the claims against both).

A network already fine-tuned with the same recipe is not trained again (``--resume``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial

from stitch_nas import attrs
from stitch_nas.activations import StitchContext
from stitch_nas.config import StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.plugins import OBJECTIVES
from stitch_nas.report import (
    objective_names,
    reference_values,
    trial_config,
    trial_weights,
    zoo_references,
)
from stitch_nas.stitching import STITCHED, Measurement

from ._choose import FLOOR_BELOW_BEST, candidates, choose
from ._jobs import Job, JobResult, StageSetup, run_in_worker, run_job
from ._recipe import FinetuneRecipe
from ._summary import FinetuneStage, Tuned
from ._teacher import make_teacher
from ._train import FinetuneReport

__all__ = ["check_stage", "finetune_front"]

logger = logging.getLogger(__name__)

WEIGHTS_DIR = "finetuned"


class Workers(Protocol):
    """Where several jobs run at once: ``stitch_nas.search.RayExecutor``."""

    workers: int

    def map(
        self, ctx: StitchContext, fn: Callable[[StitchContext, Any], Any], items: Sequence[Any]
    ) -> list[Any]: ...


def _digest(recipe: FinetuneRecipe) -> str:
    text = json.dumps(recipe.to_dict(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def check_stage(
    zoo_names: list[str], recipe: FinetuneRecipe, control: bool | Sequence[str] = False
) -> None:
    """What can be checked of the stage once the zoo is known, before any search work."""
    for name in [] if isinstance(control, bool) else control:
        if name not in zoo_names:
            raise ConfigError(
                f"finetune.control names {name!r}, not a zoo model; use true or names of "
                f"{', '.join(zoo_names)}"
            )
    if recipe.teacher != "ensemble" and recipe.teacher not in zoo_names:
        raise ConfigError(
            f"finetune.teacher={recipe.teacher!r} is not a zoo model; use 'ensemble' or one "
            f"of {', '.join(zoo_names)}"
        )
    from timm.optim import list_optimizers

    if recipe.opt not in list_optimizers():
        raise ConfigError(
            f"finetune.recipe.opt={recipe.opt!r} is not one of timm's optimizers; use sgd, "
            "adamw, lamb, lion... (timm.optim.list_optimizers())"
        )
    if recipe.teacher == "ensemble" and recipe.k > len(zoo_names):
        raise ConfigError(
            f"finetune.k={recipe.k} but the zoo has {len(zoo_names)} model(s); use k <= "
            f"{len(zoo_names)}"
        )


def control_models(study: optuna.Study, control: bool | Sequence[str]) -> list[dict[str, Any]]:
    """The zoo references the control trains: none, the front's (``True``), or the front's and
    those named."""
    if not control:
        return []
    front = _zoo_front(study)
    named = set() if control is True else set(control) - {str(r["name"]) for r in front}
    return front + [r for r in zoo_references(study) if r["name"] in named]


def _zoo_front(study: optuna.Study) -> list[dict[str, Any]]:
    """The zoo references no other reference dominates on validation."""
    names = objective_names(study)
    signs = [-1.0 if d == optuna.study.StudyDirection.MAXIMIZE else 1.0 for d in study.directions]
    refs = [
        (r, [s * x for s, x in zip(signs, v, strict=True)])
        for r in zoo_references(study)
        if (v := reference_values(r, names))
    ]

    def dominated(loss: list[float]) -> bool:
        return any(
            all(a <= b for a, b in zip(other, loss, strict=True)) and other != loss
            for _, other in refs
        )

    return [r for r, loss in refs if not dominated(loss)]


def finetune_front(
    study: optuna.Study,
    ctx: StitchContext,
    recipe: FinetuneRecipe,
    folder: Path,
    *,
    networks: int = 4,
    floor: float | None = None,
    budgets: Mapping[str, float] | None = None,
    control: bool | Sequence[str] = False,
    fuse: bool = False,
    progress: bool = False,
    echo: Callable[[str], Any] = logger.info,
    workers: Workers | None = None,
) -> FinetuneStage:
    """Fine-tune up to ``networks`` stitched networks (module docstring).

    Args:
        study: The search's study (its zoo references and trials).
        ctx: The zoo and data the search ran on.
        recipe: How they train; recorded with each.
        folder: The search's folder: weights go to ``folder/finetuned/``.
        networks: How many stitched networks, chosen by :func:`~stitch_nas.finetune.choose`.
        floor: The validation accuracy they need at least; None: ``FLOOR_BELOW_BEST`` below
            the most accurate zoo model's.
        budgets: The search's budgets (a network the gate pruned for one is not chosen).
        control: Also fine-tune zoo models with the same recipe: the front's (``True``), or
            the front's and those named (:func:`control_models`).
        fuse: The search's ``fuse`` setting (the networks are rebuilt as it measured them).
        workers: Train the networks there, several at once (``RayExecutor``: one network per
            worker), each with the result it has when trained here; None: one after the
            other in this process.
    """
    start = time.perf_counter()
    names = objective_names(study)
    if "accuracy" not in names:
        raise ConfigError("the fine-tune stage needs accuracy among the objectives")
    refs = zoo_references(study)
    val = {str(r["name"]): float(r["accuracy"]) for r in refs if "accuracy" in r}
    teacher = make_teacher(ctx.zoo, recipe.teacher, recipe.k, recipe.temperature, val)
    digest = _digest(recipe)
    stage = FinetuneStage(teacher=teacher.describe(), val_images=len(ctx.labels("val")))
    trials = study.get_trials(deepcopy=False)
    done = {
        t.user_attrs[attrs.FINETUNES]
        for t in trials
        if attrs.FINETUNES in t.user_attrs
        and (t.user_attrs.get(attrs.FINETUNED) or {}).get("recipe") == recipe.to_dict()
    }
    if floor is None:
        floor = max(val.values(), default=0.0) - FLOOR_BELOW_BEST
    pool = candidates(study, ctx, budgets)
    zoo = [(float(r["accuracy"]), float(r["macs"])) for r in refs if {"accuracy", "macs"} <= set(r)]
    chosen = choose(pool, networks, floor, zoo if "macs" in names else None)  # MACs: the cost
    if progress:
        pruned = sum(not c.whole for c in pool)
        echo(
            f"fine-tune: {len(chosen)} of {len(pool)} stitched networks chosen ({pruned} of "
            f"them pruned by the fidelity gate on a slice), validation >= {floor:.4f}, the "
            "most accurate per band of cost after the one that fills most of the gaps between "
            "the zoo's models"
        )
    jobs: list[Job] = []
    sources: dict[int, FrozenTrial] = {}  # job index -> the trial it trains further
    for candidate in chosen:
        source = candidate.trial
        if source.number in done:
            stage.already += 1
            continue
        sources[len(jobs)] = source
        weights = trial_weights(source, folder) if candidate.whole else None
        jobs.append(
            Job(
                name=f"trial {source.number}",
                what=f"trial #{source.number}: {source.user_attrs.get(attrs.DESCRIBE, '')}",
                config=trial_config(source),
                file=str(folder / f"{WEIGHTS_DIR}/trial_{source.number}_{digest}.safetensors"),
                recorded=dict(source.user_attrs) if candidate.whole else None,
                weights=None if weights is None else str(weights),
            )
        )
    if control:
        recorded = study.user_attrs.get(attrs.FINETUNE_CONTROL) or {}
        for ref in control_models(study, control):
            name = str(ref["name"])
            if (recorded.get(name) or {}).get("finetuned", {}).get("recipe") == recipe.to_dict():
                continue  # trained with this recipe before (--resume)
            safe = re.sub(r"[^\w.-]", "_", name)
            file = folder / f"{WEIGHTS_DIR}/zoo_{safe}_{digest}.safetensors"
            jobs.append(
                Job(
                    name=f"zoo model {name}",
                    what=f"zoo model {name} (control)",
                    config=StitchConfig.single(name).to_dict(),
                    file=str(file),
                    control=True,
                )
            )
    setup = StageSetup(recipe, val, fuse, progress)

    def record(index: int, result: JobResult) -> None:
        job = jobs[index]
        if job.control:
            tuned = _record_control(study, job, result, recipe, folder)
            stage.control += [tuned] if tuned is not None else []
            return
        tuned = _record_network(study, sources[index], job, result, names, budgets, recipe, folder)
        stage.networks += [tuned] if tuned is not None else []

    if workers is None or len(jobs) < 2:  # each recorded once trained: --resume skips it
        for index, job in enumerate(jobs):
            record(index, run_job(ctx, job, setup, echo))
    else:  # one network per worker (Ray's progress lines come marked with the worker)
        if progress:
            echo(f"fine-tune: {len(jobs)} networks on up to {workers.workers} Ray workers")
        for index, result in enumerate(workers.map(ctx, run_in_worker, [(j, setup) for j in jobs])):
            record(index, result)
    stage.seconds = time.perf_counter() - start
    return stage


def _record_network(
    study: optuna.Study,
    source: FrozenTrial,
    job: Job,
    result: JobResult,
    names: list[str],
    budgets: Mapping[str, float] | None,
    recipe: FinetuneRecipe,
    folder: Path,
) -> Tuned | None:
    """Record what ``job`` made of ``source`` as a trial of ``study`` (:func:`_record`)."""
    if result.report is None:
        logger.info("fine-tune: %s", result.skipped)
        return None
    if result.measured is None:  # checked to reproduce its trial: the trial's figures stand
        values, constraints, measurement = list(source.values), dict(source.constraints), {}
    else:  # measured on a slice only: measured on the whole split before it trained
        measured = Measurement(**result.measured)
        values = [float(OBJECTIVES.get(n).value(measured)) for n in names]
        # as the search records a budget: value - limit, feasible when <= 0
        # (latency is not timed again: the trial's own figure, where it has one)
        constraints = {
            k: measured.budget_value(k) - v
            if k != "latency"
            else source.constraints.get(k, math.nan)
            for k, v in (budgets or {}).items()
        }
        # what a completed trial records of its measurement, less the figures it replaces
        measurement = {
            k: v
            for k, v in result.measured.items()
            if k not in ("accuracy", "sample_correct", "sample_images")
        }
    values[names.index("accuracy")] = result.after
    kept = None
    if result.sample is not None:  # new weights (else the start was kept)
        kept = {**measurement, **result.sample, attrs.KIND: STITCHED}
    relative = Path(job.file).relative_to(folder).as_posix()
    number = _record(study, source, values, constraints, recipe, result.report, relative, kept)
    return Tuned(source.number, result.before, result.after, result.report, number)


def _record(
    study: optuna.Study,
    source: FrozenTrial,
    values: list[float],
    constraints: dict[str, float],
    recipe: FinetuneRecipe,
    report: FinetuneReport,
    weights: str,
    kept: dict[str, Any] | None,
) -> int:
    """Add the fine-tuned network to ``study`` as a COMPLETE trial; return its number.

    ``values`` are the source's objectives with the accuracy after fine-tuning, ``constraints``
    its budget constraints, ``kept`` what the new network records beside them (None: the
    fine-tune kept the starting weights and made no new network: it is recorded PRUNED, saying
    so, so that ``--resume`` does not repeat it). The source may be a trial the search's
    fidelity gate pruned: its slice's figures are not the new network's.
    """
    accuracy = values[objective_names(study).index("accuracy")]
    dropped = {
        attrs.DUPLICATE_OF,
        attrs.REFINES,
        attrs.PARTIAL_ACCURACY,
        attrs.PARTIAL_INTERVAL,
        attrs.SLICE_IMAGES,
        attrs.PRUNE_REASON,
        attrs.WEIGHTS,
        "sample_correct",  # the source's, not this network's
        "sample_images",
    }
    user_attrs = {k: v for k, v in source.user_attrs.items() if k not in dropped}
    user_attrs.update(
        {
            "accuracy": accuracy,
            attrs.DESCRIBE: f"fine-tuned {source.user_attrs.get(attrs.DESCRIBE, '')}".strip(),
            attrs.FINETUNES: source.number,
            attrs.FINETUNED: {"recipe": recipe.to_dict(), "report": report.to_dict()},
        }
    )
    if kept is not None:
        user_attrs[attrs.WEIGHTS] = weights
        user_attrs.update(kept)
    else:
        split = "validation" if report.judged_on == "val" else "train"
        user_attrs[attrs.PRUNE_REASON] = (
            "fine-tuning kept the starting weights: no epoch beat them on the held-out slice "
            f"of the {split} split ({report.initial_holdout:.4f}, {report.stopped})"
        )
    study.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE if kept else optuna.trial.TrialState.PRUNED,
            values=values if kept else None,
            params=source.params,
            distributions=source.distributions,
            user_attrs=user_attrs,
            constraints=constraints or None,
        )
    )
    # add_trial returns nothing: the last trial that fine-tunes this source with this recipe
    return max(
        t.number
        for t in study.get_trials(deepcopy=False)
        if t.user_attrs.get(attrs.FINETUNES) == source.number
        and t.user_attrs[attrs.FINETUNED]["recipe"] == recipe.to_dict()
    )


def _record_control(
    study: optuna.Study, job: Job, result: JobResult, recipe: FinetuneRecipe, folder: Path
) -> Tuned | None:
    """Record the zoo model ``job`` fine-tuned as the control (``attrs.FINETUNE_CONTROL``)."""
    if result.report is None:
        logger.info("control: %s", result.skipped)
        return None
    name = StitchConfig.from_dict(job.config).models[0]
    recorded = dict(study.user_attrs.get(attrs.FINETUNE_CONTROL) or {})
    kept = Path(job.file).relative_to(folder).as_posix() if not result.report.kept_start else None
    recorded[name] = {
        "accuracy": result.after,
        attrs.TEST_ACCURACY: result.test,  # no choice depends on it
        "finetuned": {"recipe": recipe.to_dict(), "report": result.report.to_dict()},
        attrs.WEIGHTS: kept,  # None: kept its own weights
    }
    study.set_user_attr(attrs.FINETUNE_CONTROL, recorded)
    return Tuned(name, result.before, result.after, result.report)
