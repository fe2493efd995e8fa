"""The fine-tune stage of a search: the front's networks trained further, and the control.

After the search and its refinements, :func:`finetune_front` takes up to ``networks`` stitched
networks (:func:`choose`: validation accuracy at least ``floor``, the most accurate in each of
``networks`` bands of cost, one per set of fragments), trains each further
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from stitch_nas import attrs
from stitch_nas.activations import StitchContext
from stitch_nas.config import StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.report import (
    accuracy_on,
    objective_names,
    rebuild,
    rebuild_checked,
    reference_values,
    stitched_trials,
    trial_config,
    trial_weights,
    zoo_references,
)
from stitch_nas.stitching import (
    SAMPLE_IMAGES,
    StitchedNet,
    fit_net_head,
    sample_correct,
    save_tuned,
)

from ._recipe import FinetuneRecipe
from ._teacher import Teacher, make_teacher
from ._train import FinetuneReport, finetune, trained_parts

__all__ = ["FLOOR_BELOW_BEST", "FinetuneStage", "Tuned", "check_stage", "choose", "finetune_front"]

logger = logging.getLogger(__name__)

WEIGHTS_DIR = "finetuned"


@dataclass(frozen=True)
class Tuned:
    """One network the stage trained: ``source`` is a trial number or a zoo model's name."""

    source: int | str
    before: float  #: validation accuracy it started from
    after: float  #: validation accuracy of the weights kept
    report: FinetuneReport
    trial: int | None = None  #: the trial that records it (None: a control zoo model)


@dataclass
class FinetuneStage:
    """What :func:`finetune_front` did."""

    networks: list[Tuned] = field(default_factory=list)
    control: list[Tuned] = field(default_factory=list)
    already: int = 0  #: networks fine-tuned with this recipe before (``--resume``)
    teacher: str = ""
    seconds: float = 0.0

    def describe(self) -> str:
        """One line for the terminal."""
        if not self.networks and not self.control:
            if self.already:
                return f"fine-tune: all {self.already} chosen networks already fine-tuned"
            return "fine-tune: no stitched network on the front to fine-tune"

        def gains(items: list[Tuned]) -> str:
            return ", ".join(
                f"{_name(t.source)} {t.before:.4f}->{t.after:.4f}"
                + ("" if t.report.best_epoch else " (kept its weights)")
                for t in items
            )

        line = f"fine-tuned {len(self.networks)} network(s) from {self.teacher}"
        if self.networks:
            line += f" (validation {gains(self.networks)})"
        if self.control:
            line += f"; control, the zoo's front fine-tuned alike: {gains(self.control)}"
        return line + f" in {self.seconds:.1f} s"


def _name(source: int | str) -> str:
    return f"#{source}" if isinstance(source, int) else str(source)


#: the default floor of :func:`choose`: this far below the most accurate zoo model on validation.
#: Measured on the ten-model real zoo (H100, ``benchmarks/finetune.py``): fine-tuning lifted a
#: stitched network from 0.81 to 0.92 and one from 0.36 to 0.91, while every network whose
#: zoo models were weak (LeNet-5, the all-conv CNN) stayed far below the strong models.
FLOOR_BELOW_BEST = 0.15


def choose(
    trials: list[FrozenTrial], count: int, floor: float, accuracy: int, cost: int | None
) -> list[FrozenTrial]:
    """Up to ``count`` of the stitched ``trials`` to fine-tune, cheapest first.

    Only networks at or above ``floor`` (``values[accuracy]``, validation) take part, and of
    networks with the same fragments (they differ in the adapter only, and training every
    weight makes them nearly the same network) the most accurate. The range of ``values[cost]``
    they span is cut into ``count`` bands of equal ratio (MACs span decades), and the most
    accurate network of each band is chosen; bands left empty give their place to the most
    accurate networks not yet chosen. The stitched front alone would be a poor choice: before
    fine-tuning a cheap network with a weak zoo model's tail dominates a dearer one that
    fine-tuning lifts far above it. ``cost`` None (no cost objective): the most accurate.
    """
    best: dict[str, FrozenTrial] = {}
    for trial in trials:
        if trial.values[accuracy] < floor:
            continue
        key = json.dumps(trial_config(trial).get("fragments"), sort_keys=True)
        if key not in best or trial.values[accuracy] > best[key].values[accuracy]:
            best[key] = trial
    ranked = sorted(best.values(), key=lambda t: (-t.values[accuracy], t.number))
    if count >= len(ranked):
        chosen = ranked
    else:
        chosen = []
        if cost is not None:
            low = max(min(t.values[cost] for t in ranked), 1e-12)
            ratio = max(max(t.values[cost] for t in ranked), low) / low
            for band in range(count):
                top = low * ratio ** ((band + 1) / count)
                inside = [
                    t
                    for t in ranked
                    if t not in chosen
                    and low * ratio ** (band / count) <= t.values[cost]
                    and (t.values[cost] < top or band == count - 1)
                ]
                chosen += inside[:1]  # ranked: the most accurate first
        chosen += [t for t in ranked if t not in chosen][: count - len(chosen)]
    if cost is None:
        return chosen
    return sorted(chosen, key=lambda t: (t.values[cost], t.number))


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
        networks: How many stitched networks, chosen by :func:`choose`.
        floor: The validation accuracy they need at least; None: ``FLOOR_BELOW_BEST`` below
            the most accurate zoo model's.
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
    digest, stage = _digest(recipe), FinetuneStage(teacher=teacher.describe())
    trials = study.get_trials(deepcopy=False)
    done = {
        t.user_attrs[attrs.FINETUNES]
        for t in trials
        if attrs.FINETUNES in t.user_attrs
        and (t.user_attrs.get(attrs.FINETUNED) or {}).get("recipe") == recipe.to_dict()
    }
    if floor is None:
        floor = max(val.values(), default=0.0) - FLOOR_BELOW_BEST
    costs = [i for i, d in enumerate(study.directions) if d == optuna.study.StudyDirection.MINIMIZE]
    cost = names.index("macs") if "macs" in names else (costs[0] if costs else None)
    pool = stitched_trials(study, keep=lambda t: attrs.FINETUNES not in t.user_attrs)
    chosen = choose(pool, networks, floor, names.index("accuracy"), cost)
    if progress:
        by = (
            f"the most accurate per band of {names[cost]}"
            if cost is not None
            else "the most accurate"
        )
        echo(
            f"fine-tune: {len(chosen)} of {len(pool)} stitched networks chosen (validation >= "
            f"{floor:.4f}, {by})"
        )
    for source in chosen:
        if source.number in done:
            stage.already += 1
            continue
        config = StitchConfig.from_dict(trial_config(source))
        checked = rebuild_checked(
            ctx,
            config,
            source.user_attrs,
            f"trial {source.number}",
            "fine-tune with the zoo, data and fuse setting of the search",
            fuse=fuse,
            weights=trial_weights(source, folder),
        )
        net, before = checked.net, checked.accuracy
        relative = f"{WEIGHTS_DIR}/trial_{source.number}_{digest}.safetensors"
        what = f"trial #{source.number}: {config.describe()}"
        tuned, report = _train(ctx, net, teacher, recipe, folder / relative, what, progress, echo)
        after = accuracy_on(ctx, tuned, "val") if report.best_epoch else before
        sample = _sample(ctx, tuned) if report.best_epoch else None
        number = _record(study, source, names, after, recipe, report, relative, sample)
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
    names: list[str],
    accuracy: float,
    recipe: FinetuneRecipe,
    report: FinetuneReport,
    weights: str,
    sample: dict[str, int] | None = None,
) -> int:
    """Add the fine-tuned network to ``study`` as a COMPLETE trial; return its number.

    A fine-tune that kept the starting weights (no epoch beat them on the held-out slice) made
    no new network: it is recorded PRUNED, saying so, so that ``--resume`` does not repeat it.
    """
    values = list(source.values)
    values[names.index("accuracy")] = accuracy
    user_attrs = {
        k: v
        for k, v in source.user_attrs.items()
        if k not in (attrs.DUPLICATE_OF, attrs.REFINES, attrs.PARTIAL_ACCURACY, attrs.WEIGHTS)
        and k not in ("sample_correct", "sample_images")  # the source's, not this network's
    }
    user_attrs.update(
        {
            "accuracy": accuracy,
            attrs.DESCRIBE: f"fine-tuned {source.user_attrs.get(attrs.DESCRIBE, '')}".strip(),
            attrs.FINETUNES: source.number,
            attrs.FINETUNED: {"recipe": recipe.to_dict(), "report": report.to_dict()},
        }
    )
    kept = report.best_epoch > 0
    if kept:
        user_attrs[attrs.WEIGHTS] = weights
        user_attrs.update(sample or {})
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
            constraints=dict(source.constraints) or None,
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
