"""The front's networks and the zoo's models re-measured on the test split, after the search.

The search chooses its front on the validation split: with many configs scored on a few hundred
images, the best validation scores are biased upward. The test split is used by nothing the
search decides, so measuring the chosen networks on it afterwards gives figures a reader can
trust. :func:`measure_holdout` rebuilds each front network (the study's front and the front of
its stitched networks alone, :func:`holdout_trials`), and each zoo model, exactly as the
search measured it, checks that it reproduces what the search recorded (on the fixed sample of
validation images each trial counted, :func:`rebuild_checked`), and records its test accuracy
on the study:

- ``study.user_attrs[attrs.TEST_RESULTS]``: ``{"<trial number>": test accuracy}`` (Optuna
  refuses to change a finished trial's own user attributes, so they live on the study);
- ``attrs.TEST_ACCURACY`` in each dict of ``study.user_attrs[attrs.REFERENCES]``;
- ``study.user_attrs[attrs.SPLIT_SIZES]``: the data set's name and the number of validation and
  test images, which the accuracy intervals are computed on;
- ``study.user_attrs[attrs.KINDS]``: the kind (:func:`~stitch_nas.stitching.network_kind`) of
  each front network whose trial was recorded without one, by an older version.

Figures already recorded are kept, so after ``--resume`` only new front networks are measured.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import torch
from optuna.trial import FrozenTrial

from stitch_nas import attrs
from stitch_nas.activations import Memo, StitchContext
from stitch_nas.config import StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.stitching import (
    Measurement,
    StitchedNet,
    build,
    fit_net_head,
    load_tuned,
    measure,
    net_outputs,
    network_kind,
    reproduces,
    reproduces_count,
    sample_correct,
)

from ._kinds import recorded_kinds, stitched_front
from ._pareto import (
    finite_number,
    pareto_trials,
    trial_config,
    zoo_references,
)

__all__ = [
    "HoldoutPass",
    "accuracy_on",
    "holdout_accuracies",
    "holdout_missing",
    "holdout_trials",
    "measure_holdout",
    "Rechecked",
    "rebuild",
    "rebuild_checked",
    "split_sizes",
    "trial_weights",
]

logger = logging.getLogger(__name__)

HOLDOUT_SPLIT = "test"


@dataclass
class HoldoutPass:
    """What :func:`measure_holdout` measured."""

    trials: list[int] = field(default_factory=list)  #: front trials newly measured on test
    references: list[str] = field(default_factory=list)  #: zoo models newly measured on test
    n_images: int = 0  #: images in the test split
    seconds: float = 0.0

    def describe(self) -> str:
        """One line for the terminal."""
        if not self.trials and not self.references:
            return "test split: every front network and zoo model already measured"
        return (
            f"test split ({self.n_images} images, used by no choice of the search): measured "
            f"{len(self.trials)} front network(s) and {len(self.references)} zoo model(s) in "
            f"{self.seconds:.1f} s"
        )


def accuracy_on(
    ctx: StitchContext, net: StitchedNet, split: str, head: torch.nn.Module | None = None
) -> float:
    """Top-1 accuracy of a built network on ``split``, exactly ``correct / images``, scored as
    :func:`stitch_nas.measure` scores it (a fitted head is fitted on the probe split; pass
    ``head`` when it is fitted already)."""
    if head is None:
        head = fit_net_head(ctx, net)
    outputs = net_outputs(ctx, net, split)
    scores = outputs if head is None else ctx.run(head, outputs)
    labels = ctx.labels(split)
    return int((scores.argmax(1).cpu() == labels).sum()) / len(labels)


def holdout_accuracies(study: optuna.Study) -> dict[int, float]:
    """Test accuracy of each trial measured on the test split, by trial number."""
    raw = study.user_attrs.get(attrs.TEST_RESULTS) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"study.user_attrs[{attrs.TEST_RESULTS!r}] must be a dict")
    out = {}
    for number, value in raw.items():
        accuracy = finite_number(value)
        if accuracy is not None:
            out[int(number)] = float(accuracy)
    return out


def split_sizes(study: optuna.Study) -> dict[str, Any]:
    """``{"data": name, "val": n, "test": n}`` as recorded by the test pass, or ``{}``."""
    sizes = study.user_attrs.get(attrs.SPLIT_SIZES)
    return dict(sizes) if isinstance(sizes, dict) else {}


def holdout_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The networks the test pass measures: the study's front, then those of the front of the
    stitched networks alone (:func:`~stitch_nas.report.stitched_front`) not on it."""
    front = pareto_trials(study)
    numbers = {t.number for t in front}
    return front + [t for t in stitched_front(study) if t.number not in numbers]


def holdout_missing(study: optuna.Study) -> tuple[list[FrozenTrial], list[str]]:
    """Networks of :func:`holdout_trials` and zoo models that have no test accuracy yet."""
    done = holdout_accuracies(study)
    trials = [t for t in holdout_trials(study) if t.number not in done]
    refs = [str(r["name"]) for r in zoo_references(study) if attrs.TEST_ACCURACY not in r]
    return trials, refs


def trial_weights(trial: FrozenTrial, folder: Path | None) -> Path | None:
    """The file of a trial's weights: a fine-tuned network's, or the trained adapters a trial
    kept (``stitching.load_tuned`` loads either); None when its config alone rebuilds it.

    Trained adapters train again from their seed when their file cannot be had (no
    ``folder``, or a file written on another machine of a Ray cluster), saying so in one line.
    """
    name = trial.user_attrs.get(attrs.WEIGHTS)
    if name is None:
        return None
    if attrs.FINETUNES not in trial.user_attrs:  # trained adapters, which can train again
        file = None if folder is None else Path(folder) / str(name)
        if file is None or not file.is_file():
            logger.warning(
                "trial %d: its trained adapters %s are not at hand; training them again "
                "from their seed",
                trial.number,
                name if file is None else file,
            )
            return None
        return file
    if folder is None:
        raise ConfigError(
            f"trial {trial.number} was fine-tuned and its weights are in the search's folder; "
            "pass that folder (folder=...)"
        )
    return Path(folder) / str(name)


def rebuild(
    ctx: StitchContext, config: StitchConfig, *, fuse: bool, weights: Path | None = None
) -> tuple[StitchedNet, Measurement]:
    """A network as the search measured it, measured again on validation: ``config`` built,
    with the fine-tuned ``weights`` loaded when it has them."""
    if weights is None:
        return measure(ctx, config, fuse=fuse)
    return measure(ctx, config, net=load_tuned(ctx, config, weights, fuse=fuse))


@dataclass(frozen=True)
class Rechecked:
    """A network rebuilt as its trial measured it, and shown to measure the same."""

    net: StitchedNet
    head: torch.nn.Module | None  #: its fitted head (None: native)
    accuracy: float  #: its validation accuracy: the recorded one, or measured again
    #: the whole validation pass, when the check needed one (None: checked on the sample)
    measurement: Measurement | None = None


#: networks rebuilt and checked on a context, by what they were rebuilt from and checked
#: against: the export that follows a search's test pass writes the networks that pass checked
_CHECKED: Memo[tuple[Any, ...], Rechecked] = Memo("rebuilt and checked networks")


def rebuild_checked(
    ctx: StitchContext,
    config: StitchConfig,
    recorded: Mapping[str, Any],
    what: str,
    fix: str,
    *,
    fuse: bool,
    weights: Path | None = None,
) -> Rechecked:
    """``config`` rebuilt as the search measured it (``weights`` loaded when it has them,
    else built again, trained adapters training again from their seed), refused unless it
    reproduces what its trial ``recorded`` (a trial's user attributes or a zoo reference).

    Where the trial counted its fixed sample (``sample_correct`` of ``sample_images``), the
    check runs on that sample: the search measured the whole validation split already, and
    the first images tell another zoo, data or fuse setting from the same one at a tenth of
    the cost. A record without one (an older study) is measured on the whole split again.

    A network checked on ``ctx`` before against the same record (the test pass's, when the
    export runs after it) is handed out again, not rebuilt: a caller that trains one trains a
    copy (the fine-tune stage does).

    Raises:
        ConfigError: ``what`` does not reproduce its record, saying how to ``fix`` it.
    """
    accuracy = finite_number(recorded.get("accuracy"))
    sample = recorded.get("sample_correct"), recorded.get("sample_images")
    key = (config.stable_hash(), fuse, None if weights is None else str(weights), accuracy, sample)
    done = _CHECKED.get(ctx, key)
    if done is not None:
        return done
    return _CHECKED.put(
        ctx, key, _rebuild_checked(ctx, config, accuracy, sample, what, fix, fuse, weights)
    )


def _rebuild_checked(
    ctx: StitchContext,
    config: StitchConfig,
    accuracy: float | None,
    sample: tuple[Any, Any],
    what: str,
    fix: str,
    fuse: bool,
    weights: Path | None,
) -> Rechecked:
    if accuracy is None or sample[0] is None or not sample[1]:
        net, result = rebuild(ctx, config, fuse=fuse, weights=weights)
        if accuracy is not None and not reproduces(ctx, result.accuracy, accuracy):
            raise ConfigError(
                f"{what}: the rebuilt network measures validation accuracy "
                f"{result.accuracy:.4f}, the search recorded {accuracy:.4f}; {fix}"
            )
        return Rechecked(net, fit_net_head(ctx, net), result.accuracy, result)
    correct, images = int(sample[0]), int(sample[1])
    if images > len(ctx.labels("val")):
        raise ConfigError(
            f"{what}: its trial was checked on {images} validation images, this data has "
            f"{len(ctx.labels('val'))}; {fix}"
        )
    if weights is None:
        net = build(ctx, config, fuse=fuse)
    else:
        try:
            net = load_tuned(ctx, config, weights, fuse=fuse)
        except ConfigError as exc:  # a file of another network: named with what it was for
            raise ConfigError(f"{what}: {exc}") from None
    head = fit_net_head(ctx, net)
    now = sample_correct(ctx, net, head, images)
    if not reproduces_count(ctx, now, correct, images):
        stale = (
            "" if weights is None else f" (the weights file {weights} is stale or another search's)"
        )
        raise ConfigError(
            f"{what}: the rebuilt network measures validation accuracy {now / images:.4f} on "
            f"the first {images} images ({now} right), the search recorded "
            f"{correct / images:.4f} ({correct} right){stale}; {fix}"
        )
    return Rechecked(net, head, float(accuracy))


#: what to do when a network rebuilt for the test pass does not measure what was recorded
_FIX = (
    "re-measure with the zoo, data and fuse setting of the search (or skip the test pass "
    "with `stitch-nas report --no-test`)"
)


def _test_accuracy(
    ctx: StitchContext,
    config: StitchConfig,
    recorded: Mapping[str, Any],
    what: str,
    fuse: bool,
    weights: Path | None = None,
) -> float:
    """Rebuild ``config``, check it against the search's record, return its test accuracy."""
    checked = rebuild_checked(ctx, config, recorded, what, _FIX, fuse=fuse, weights=weights)
    return accuracy_on(ctx, checked.net, HOLDOUT_SPLIT, checked.head)


def _record_kinds(study: optuna.Study, ctx: StitchContext) -> None:
    """Work out the kinds of front networks whose trials lack one (cuts only, no measuring)."""
    kinds = {str(k): v for k, v in recorded_kinds(study).items()}
    for trial in pareto_trials(study):
        if attrs.KIND not in trial.user_attrs and str(trial.number) not in kinds:
            config = StitchConfig.from_dict(trial_config(trial))
            kinds[str(trial.number)] = network_kind(ctx, config)
    if kinds:
        study.set_user_attr(attrs.KINDS, kinds)


def measure_holdout(
    study: optuna.Study, ctx: StitchContext, *, fuse: bool = False, folder: Path | None = None
) -> HoldoutPass:
    """Measure the fronts' networks (:func:`holdout_trials`) and the zoo's models on the test
    split; record on ``study``.

    Args:
        study: The search's study, with its zoo references.
        ctx: The zoo and data the search ran on (the same data: the check below fails otherwise).
        fuse: The search's ``fuse`` setting, so the rebuilt networks are the measured ones.
        folder: The search's folder, where fine-tuned networks keep their weights.

    Returns:
        What was measured now (figures already on the study are kept, not measured again).

    Raises:
        ConfigError: If a rebuilt network does not reproduce the validation accuracy the search
            recorded for it (another zoo, data or fuse setting).
    """
    start = time.perf_counter()
    n_val, n_test = len(ctx.labels("val")), len(ctx.labels(HOLDOUT_SPLIT))
    sizes = {"data": ctx.data.name, "val": n_val, "test": n_test}
    recorded = split_sizes(study)
    if recorded and (recorded.get("val"), recorded.get("test")) != (n_val, n_test):
        raise ConfigError(
            f"the study's test figures were measured on {recorded.get('val')} validation and "
            f"{recorded.get('test')} test images, this data has {n_val} and {n_test}; "
            "re-measure with the data of the search"
        )
    study.set_user_attr(attrs.SPLIT_SIZES, sizes)
    trials, names = holdout_missing(study)
    results = {str(k): v for k, v in holdout_accuracies(study).items()}
    for trial in trials:
        config = StitchConfig.from_dict(trial_config(trial))
        what, weights = f"trial {trial.number}", trial_weights(trial, folder)
        results[str(trial.number)] = _test_accuracy(
            ctx, config, trial.user_attrs, what, fuse, weights
        )
        logger.info("trial %d: test accuracy %.4f", trial.number, results[str(trial.number)])
    refs = zoo_references(study)
    for ref in refs:
        if str(ref["name"]) in names:
            config = StitchConfig.single(str(ref["name"]))
            ref[attrs.TEST_ACCURACY] = _test_accuracy(ctx, config, ref, str(ref["name"]), False)
    study.set_user_attr(attrs.TEST_RESULTS, results)
    study.set_user_attr(attrs.REFERENCES, refs)
    _record_kinds(study, ctx)
    return HoldoutPass(
        [t.number for t in trials], names, n_test, seconds=time.perf_counter() - start
    )
