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

With ``control``, the zoo's own front models (non-dominated among the zoo on validation) are
fine-tuned with the identical recipe and teacher: a fine-tuned stitched network is then
compared with the zoo as given *and* with the zoo trained as much as it was
(``attrs.FINETUNE_CONTROL`` on the study; the report states the claims against both).

A network already fine-tuned with the same recipe is not trained again (``--resume``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from stitch_nas import attrs
from stitch_nas.activations import StitchContext
from stitch_nas.config import StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.plugins import OBJECTIVES
from stitch_nas.report import (
    accuracy_on,
    objective_names,
    rebuild,
    rebuild_checked,
    reference_values,
    trial_config,
    trial_weights,
    zoo_references,
)
from stitch_nas.stitching import (
    SAMPLE_IMAGES,
    STITCHED,
    StitchedNet,
    fit_net_head,
    sample_correct,
    save_tuned,
)

from ._choose import FLOOR_BELOW_BEST, candidates, choose
from ._recipe import FinetuneRecipe
from ._summary import FinetuneStage, Tuned
from ._teacher import Teacher, make_teacher
from ._train import FinetuneReport, finetune, trained_parts

__all__ = ["check_stage", "finetune_front"]

logger = logging.getLogger(__name__)

WEIGHTS_DIR = "finetuned"


def _digest(recipe: FinetuneRecipe) -> str:
    text = json.dumps(recipe.to_dict(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def check_stage(zoo_names: list[str], recipe: FinetuneRecipe) -> None:
    """What can be checked of the stage once the zoo is known, before any search work."""
    if recipe.teacher != "ensemble" and recipe.teacher not in zoo_names:
        raise ConfigError(
            f"finetune.teacher={recipe.teacher!r} is not a zoo model; use 'ensemble' or one "
            f"of {', '.join(zoo_names)}"
        )
    if recipe.teacher == "ensemble" and recipe.k > len(zoo_names):
        raise ConfigError(
            f"finetune.k={recipe.k} but the zoo has {len(zoo_names)} model(s); use k <= "
            f"{len(zoo_names)}"
        )


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


def _train(
    ctx: StitchContext,
    net: StitchedNet,
    teacher: Teacher,
    recipe: FinetuneRecipe,
    file: Path,
    what: str,
    progress: bool,
    echo: Callable[[str], Any],
) -> tuple[StitchedNet, FinetuneReport]:
    if progress:
        echo(f"fine-tuning {what}")
    tuned, report = finetune(ctx, net, teacher, recipe, progress=echo if progress else None)
    if report.best_epoch > 0:  # else it is the network it started from: nothing new to keep
        save_tuned(tuned, file)
    return tuned, report


def finetune_front(
    study: optuna.Study,
    ctx: StitchContext,
    recipe: FinetuneRecipe,
    folder: Path,
    *,
    networks: int = 4,
    floor: float | None = None,
    budgets: Mapping[str, float] | None = None,
    control: bool = False,
    fuse: bool = False,
    progress: bool = False,
    echo: Callable[[str], Any] = logger.info,
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
        control: Also fine-tune the zoo's front models with the same recipe.
        fuse: The search's ``fuse`` setting (the networks are rebuilt as it measured them).
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
    chosen = choose(pool, networks, floor)
    if progress:
        pruned = sum(not c.whole for c in pool)
        echo(
            f"fine-tune: {len(chosen)} of {len(pool)} stitched networks chosen ({pruned} of "
            f"them pruned by the fidelity gate on a slice), validation >= {floor:.4f}, the "
            "most accurate per band of cost"
        )
    for candidate in chosen:
        source = candidate.trial
        if source.number in done:
            stage.already += 1
            continue
        config = StitchConfig.from_dict(trial_config(source))
        if candidate.whole:
            checked = rebuild_checked(
                ctx,
                config,
                source.user_attrs,
                f"trial {source.number}",
                "fine-tune with the zoo, data and fuse setting of the search",
                fuse=fuse,
                weights=trial_weights(source, folder),
            )
            net, before, values = checked.net, checked.accuracy, list(source.values)
            constraints, measurement = dict(source.constraints), {}
        else:  # measured on a slice only: built and measured on the whole split now
            net, measured = rebuild(ctx, config, fuse=fuse)
            before = measured.accuracy
            values = [float(OBJECTIVES.get(n).value(measured)) for n in names]
            # as the search records a budget: value - limit, feasible when <= 0
            constraints = {k: float(getattr(measured, k)) - v for k, v in (budgets or {}).items()}
            # what a completed trial records of its measurement, less the figures it replaces
            measurement = {
                k: v
                for k, v in measured.to_dict().items()
                if k not in ("accuracy", "sample_correct", "sample_images")
            }
        relative = f"{WEIGHTS_DIR}/trial_{source.number}_{digest}.safetensors"
        what = f"trial #{source.number}: {config.describe()}"
        tuned, report = _train(ctx, net, teacher, recipe, folder / relative, what, progress, echo)
        after = accuracy_on(ctx, tuned, "val") if report.best_epoch else before
        values[names.index("accuracy")] = after
        kept = (
            {**measurement, **_sample(ctx, tuned), attrs.KIND: STITCHED}
            if report.best_epoch
            else None
        )
        number = _record(study, source, values, constraints, recipe, report, relative, kept)
        stage.networks.append(Tuned(source.number, before, after, report, number))
    if control:
        for ref in _zoo_front(study):
            name = str(ref["name"])
            tuned_ref = _control(ctx, study, name, teacher, recipe, folder, digest, progress, echo)
            if tuned_ref is not None:
                stage.control.append(tuned_ref)
    stage.seconds = time.perf_counter() - start
    return stage


def _sample(ctx: StitchContext, net: StitchedNet) -> dict[str, int]:
    """The fixed sample of validation images the export checks ``net`` on, as a trial records
    it (``Measurement.sample_correct`` of ``sample_images``)."""
    images = min(SAMPLE_IMAGES, len(ctx.labels("val")))
    correct = sample_correct(ctx, net, fit_net_head(ctx, net), images)
    return {"sample_correct": correct, "sample_images": images}


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
        user_attrs[attrs.PRUNE_REASON] = (
            "fine-tuning kept the starting weights: no epoch beat them on the held-out slice "
            f"of the train split ({report.initial_holdout:.4f})"
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


def _control(
    ctx: StitchContext,
    study: optuna.Study,
    name: str,
    teacher: Teacher,
    recipe: FinetuneRecipe,
    folder: Path,
    digest: str,
    progress: bool,
    echo: Callable[[str], Any],
) -> Tuned | None:
    """The zoo model ``name`` fine-tuned with ``recipe``, measured on validation and test."""
    recorded = dict(study.user_attrs.get(attrs.FINETUNE_CONTROL) or {})
    earlier = recorded.get(name)
    if earlier is not None and earlier.get("finetuned", {}).get("recipe") == recipe.to_dict():
        return None
    config = StitchConfig.single(name)
    net, measured = rebuild(ctx, config, fuse=False)
    if not any(p.numel() for part in trained_parts(net, recipe.train) for p in part.parameters()):
        logger.info(
            "control: %s has no %s weights to train; it is its own control", name, recipe.train
        )
        return None
    safe = re.sub(r"[^\w.-]", "_", name)
    relative = f"{WEIGHTS_DIR}/zoo_{safe}_{digest}.safetensors"
    tuned, report = _train(
        ctx, net, teacher, recipe, folder / relative, f"zoo model {name} (control)", progress, echo
    )
    after = accuracy_on(ctx, tuned, "val")
    recorded[name] = {
        "accuracy": after,
        attrs.TEST_ACCURACY: accuracy_on(ctx, tuned, "test"),  # no choice depends on it
        "finetuned": {"recipe": recipe.to_dict(), "report": report.to_dict()},
        attrs.WEIGHTS: relative if report.best_epoch else None,  # None: kept its own weights
    }
    study.set_user_attr(attrs.FINETUNE_CONTROL, recorded)
    return Tuned(name, measured.accuracy, after, report)
