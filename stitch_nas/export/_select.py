"""Pick trials of a study and export them: the Pareto front by default, or trials by number."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from stitch_nas import attrs
from stitch_nas.activations import StitchContext
from stitch_nas.choices import DEFAULT_EXPORT_FORMATS
from stitch_nas.config import StitchConfig
from stitch_nas.errors import ConfigError, ExportError
from stitch_nas.report import (
    first_of_each_network,
    holdout_accuracies,
    is_feasible,
    pareto_trials,
    trial_weights,
)
from stitch_nas.stitching import Measurement

from ._artifacts import artifact_store as open_store
from ._artifacts import upload_folder
from ._write import FORMATS, ExportItem, export_elastic, export_network

__all__ = ["FORMATS", "ExportSummary", "export_items", "export_study", "select_trials"]

logger = logging.getLogger(__name__)

# a trial records every Measurement field as a user attribute (StitchObjective.record)
_METRICS = tuple(f.name for f in fields(Measurement))


@dataclass
class ExportSummary:
    """Where the networks went and what their weights cost on disk."""

    folders: list[Path] = field(default_factory=list)
    elastic: Path | None = None
    weights_bytes: int = 0  #: model.safetensors of the individual exports, summed
    elastic_bytes: int = 0  #: model.safetensors of the elastic package
    #: network name -> why not exported ("": why nothing was)
    skipped: dict[str, str] = field(default_factory=dict)
    #: folder name -> Optuna artifact id of its archive (with an artifact store)
    artifacts: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        skipped = "".join(f"\nnot exported: {why}" for k, why in self.skipped.items() if k)
        if not self.folders:  # the key "": why nothing at all was exported
            why = f": {self.skipped['']}" if "" in self.skipped else ""
            return f"nothing exported{why}" + skipped
        root = self.folders[0].parent
        weights = _mb(self.weights_bytes)
        line = f"exported {len(self.folders)} networks to {root}/ (weights {weights})"
        if self.elastic is not None:
            line += (
                f"; elastic package {self.elastic.name}/ stores them in {_mb(self.elastic_bytes)}"
            )
        line += f"; load one with stitch_nas.load('{self.folders[0]}')"
        if self.artifacts:
            name, artifact = next(iter(self.artifacts.items()))
            line += (
                f"\nuploaded {len(self.artifacts)} archives as artifacts of the study; load "
                f"{name} with stitch_nas.load(artifact_id='{artifact}', artifact_store=...)"
            )
        return line + skipped


def _mb(size: int) -> str:
    return f"{size / 1e6:.2f} MB"


def select_trials(study: optuna.Study, trials: str | Sequence[int]) -> list[FrozenTrial]:
    """``"pareto"`` (the front) or trial numbers, each of which must have completed.

    Each network is exported once: of a trial and its copies (``duplicate_of``, recorded as
    COMPLETE by older searches) the lowest-numbered is kept.
    """
    if isinstance(trials, str):
        if trials != "pareto":
            raise ExportError(f"trials={trials!r}: use 'pareto' or a list of trial numbers")
        return pareto_trials(study)
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    chosen = []
    for number in trials:
        trial = by_number.get(number)
        if trial is None:
            last = len(by_number) - 1
            raise ExportError(f"trial {number} does not exist; the study has trials 0..{last}")
        if trial.state != TrialState.COMPLETE:
            reason = trial.user_attrs.get(attrs.PRUNE_REASON) or trial.user_attrs.get(
                attrs.FAIL_REASON
            )
            raise ExportError(
                f"trial {number} is {trial.state.name}{f' ({reason})' if reason else ''}; "
                'export a COMPLETE trial, e.g. one on the Pareto front (trials="pareto")'
            )
        chosen.append(trial)
    first, kept = {t.number for t in first_of_each_network(chosen)}, []
    for trial in chosen:
        if trial.number in first:
            first.discard(trial.number)
            kept.append(trial)
        else:
            logger.info("trial %d repeats an earlier trial's network; exported once", trial.number)
    return kept


def export_items(
    study: optuna.Study, trials: str | Sequence[int], folder: Path | None = None
) -> list[ExportItem]:
    """What :func:`export_study` would export, read from the study alone (no zoo needed), so
    a trial that cannot be exported is refused before any model loads (``folder``: the
    search's, where fine-tuned networks keep their weights).

    Raises:
        ExportError: a trial that does not exist or did not complete, or nothing to export
            (saying why: no completed trial, or none that meets the budgets).
    """
    tests = holdout_accuracies(study)  # what the test pass measured, from the same weights
    items = [_item(t, folder, tests.get(t.number)) for t in select_trials(study, trials)]
    if items:
        return items
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        raise ExportError("no completed trial to export; run more trials first")
    if not any(is_feasible(t) for t in complete):
        budgets = study.user_attrs.get(attrs.BUDGETS) or {}
        given = ", ".join(f"{k}={v}" for k, v in budgets.items()) or "its budgets"
        raise ExportError(
            f"none of the {len(complete)} completed trials meets {given}, so nothing is "
            "exported; the report lists what each one costs; relax the budget and search again"
        )
    raise ExportError("no completed trial on the Pareto front to export")


def _item(trial: FrozenTrial, folder: Path | None, test: float | None) -> ExportItem:
    ua = trial.user_attrs
    if attrs.CONFIG not in ua:
        raise ExportError(f"trial {trial.number} records no config; it was not run by stitch_nas")
    metrics = {k: ua[k] for k in _METRICS if k in ua}
    if test is not None:
        metrics[attrs.TEST_ACCURACY] = test
    config = StitchConfig.from_dict(ua[attrs.CONFIG])
    try:
        weights = trial_weights(trial, folder)
    except ConfigError as exc:
        raise ExportError(str(exc)) from None
    if weights is not None and not weights.is_file():
        raise ExportError(
            f"trial {trial.number} was fine-tuned but its weights {weights} are missing; export "
            "from the folder the search wrote"
        )
    return ExportItem(f"trial_{trial.number}", config, metrics, trial.number, weights)


def export_study(
    study: optuna.Study,
    ctx: StitchContext,
    dest: Path,
    *,
    trials: str | Sequence[int] = "pareto",
    formats: Sequence[str] = DEFAULT_EXPORT_FORMATS,
    elastic: bool = False,
    fuse: bool = False,
    progress: bool = False,
    skip_failures: bool = False,
    folder: Path | None = None,
    artifact_store: Any = None,
) -> ExportSummary:
    """Export the chosen trials of ``study`` to ``dest/trial_<n>/`` (and ``dest/elastic/``).

    Args:
        folder: the search's folder, where fine-tuned networks keep their weights.
        artifact_store: a folder or an Optuna artifact store: each exported folder is also
            uploaded there as one tar archive, an artifact of ``study`` named after the folder
            (``stitch_nas.export._artifacts``); ``summary.artifacts`` and the study user
            attribute ``artifacts`` map folder names to artifact ids.
        skip_failures: a network that cannot be exported (it no longer measures as its trial
            did, e.g. an adapter trained under a ``seconds`` budget) is named in
            ``summary.skipped`` and the others are exported; otherwise its error is raised.
    """
    from tqdm.auto import tqdm

    store = None if artifact_store is None else open_store(artifact_store)
    try:
        items = export_items(study, trials, folder)
    except ExportError as exc:
        if not skip_failures:
            raise
        logger.warning("nothing exported: %s", exc)
        return ExportSummary(skipped={"": str(exc)})
    summary = ExportSummary()
    exported = []
    for item in tqdm(items, desc="export", unit="net", disable=not progress):
        try:
            folder = export_network(ctx, item, dest, fuse=fuse, formats=formats)
        except ExportError as exc:
            if not skip_failures:
                raise
            summary.skipped[item.name] = str(exc)
            logger.warning("not exported: %s", exc)
            continue
        exported.append(item)
        summary.folders.append(folder)
        summary.weights_bytes += (folder / "model.safetensors").stat().st_size
        _upload(study, folder, store, summary, skip_failures)
    if elastic and exported:
        summary.elastic = export_elastic(ctx, exported, dest / "elastic", fuse=fuse)
        summary.elastic_bytes = (summary.elastic / "model.safetensors").stat().st_size
        _upload(study, summary.elastic, store, summary, skip_failures)
    return summary


def _upload(
    study: optuna.Study, folder: Path, store: Any, summary: ExportSummary, skip_failures: bool
) -> None:
    """Upload ``folder`` to ``store`` (None: nothing to do); with ``skip_failures`` a store
    that fails is named in ``summary.skipped``, and the exported folder stays."""
    if store is None:
        return
    try:
        summary.artifacts[folder.name] = upload_folder(study, folder, store)
    except Exception as exc:  # noqa: BLE001 - any store's failure; the folder is written
        why = f"{folder.name}: exported, but not uploaded to the artifact store ({exc})"
        if not skip_failures:
            raise ExportError(f"{why}; check the store and export again") from exc
        summary.skipped[f"{folder.name} (artifact)"] = why
        logger.warning("%s", why)
