"""Report files of a multi-objective search: ``trials.csv``, ``pareto.json``, ``pareto.png``,
``report.html`` and the table printed in a terminal.

Every accuracy is shown with the split it was measured on and its 95 % Wilson score interval
(:mod:`.intervals`); claims about zoo models follow the rule of :mod:`.claims` and are made on
the test split only, which :func:`~stitch_nas.report.measure_holdout` fills in after the search.
"""

from __future__ import annotations

import json
import logging
import os
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from stitch_nas import attrs
from stitch_nas.files import atomic_write
from stitch_nas.stitching import STITCHED

from ._claims import DOMINATION_RULE, control_accuracies, split_hypervolumes, zoo_claims
from ._csv import METRICS, trials_csv
from ._figure import plot_png
from ._history import HypervolumeHistory, hypervolume_history
from ._holdout import holdout_accuracies, split_sizes
from ._html import report_html
from ._intervals import accuracy_figures
from ._kinds import kind_text, recorded_kinds, stitched_front, trial_kind
from ._pareto import (
    finite_number,
    lookup_metric,
    n_fragments,
    objective_names,
    pareto_trials,
    trial_config,
    trial_metric,
    zoo_references,
)
from ._plot import human

__all__ = ["ReportSummary", "write_report"]

logger = logging.getLogger(__name__)

INTERVALS = "95 % Wilson score interval"


def _front_row(
    trial: FrozenTrial,
    objectives: list[str],
    tests: dict[int, float],
    sizes: dict[str, Any],
    kinds: dict[int, str],
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "number": trial.number,
        "values": [finite_number(v) for v in trial.values],
    }
    row.update({m: trial_metric(trial, m, objectives) for m in METRICS})
    val, test = row["accuracy"], tests.get(trial.number)
    row.update(accuracy_figures(val, sizes.get("val"), test, sizes.get("test")))
    kind = trial_kind(trial, kinds)
    row.update(
        describe=str(trial.user_attrs.get(attrs.DESCRIBE, "")),
        config=trial_config(trial),
        models=[str(m) for m in trial.user_attrs.get(attrs.MODELS, [])],
        n_fragments=n_fragments(trial),
        kind=kind,  # None: an older version's trial the test pass has not seen
        stitched=None if kind is None else kind == STITCHED,
        # a network the fine-tune stage trained further: from which trial, and how
        finetunes=trial.user_attrs.get(attrs.FINETUNES),
        finetuned=trial.user_attrs.get(attrs.FINETUNED),
    )
    return row


def _reference_row(ref: dict[str, Any], sizes: dict[str, Any]) -> dict[str, Any]:
    val, test = finite_number(ref.get("accuracy")), finite_number(ref.get(attrs.TEST_ACCURACY))
    return {**ref, **accuracy_figures(val, sizes.get("val"), test, sizes.get("test"))}


def _fixed(spec: str) -> Callable[[Any], str]:
    return lambda v: "-" if v is None else format(v, spec)


def _interval(value: Any) -> str:
    return "-" if not value else f"[{value[0]:.3f}, {value[1]:.3f}]"


# (key, header, width, formatter) of the columns shared by the front and the zoo models.
_COLUMNS = (
    ("accuracy", "val acc", 7, _fixed(".4f")),
    ("accuracy_interval", "95% interval", 14, _interval),
    (attrs.TEST_ACCURACY, "test acc", 8, _fixed(".4f")),
    ("test_accuracy_interval", "95% interval", 14, _interval),
    ("macs", "MACs", 7, human),
    ("params", "params", 7, human),
    ("cka", "CKA", 6, _fixed(".3f")),
)


def _cells(row: dict[str, Any] | None) -> str:
    if row is None:
        return " ".join(f"{head:>{w}}" for _, head, w, _ in _COLUMNS)
    cells = []
    for key, _, w, fmt in _COLUMNS:
        value = row.get(key) if key.endswith("interval") else lookup_metric(row, key)
        cells.append(f"{fmt(value):>{w}}")
    return " ".join(cells)


def _corner(objectives: list[str], point: list[float]) -> str:
    return ", ".join(
        f"{n} {human(v) if n != 'accuracy' else format(v, 'g')}"
        for n, v in zip(objectives, point, strict=True)
    )


@dataclass
class ReportSummary:
    """What :func:`write_report` wrote, plus the numbers a caller prints or checks."""

    objectives: list[str]
    front: list[dict[str, Any]]
    #: the front of the stitched networks alone, less those on ``front``
    stitched: list[dict[str, Any]]
    hypervolumes: dict[str, Any]  #: :func:`~stitch_nas.report.split_hypervolumes`
    claims: list[dict[str, Any]]  #: :func:`~stitch_nas.report.zoo_claims`
    #: the same against the zoo fine-tuned by the fine-tune stage's control (None: no control)
    control_claims: list[dict[str, Any]] | None
    counts: dict[str, int]
    references: list[dict[str, Any]]
    sizes: dict[str, Any]  #: data set name and images per split
    history: HypervolumeHistory  #: :func:`~stitch_nas.report.hypervolume_history`
    csv_path: Path
    json_path: Path
    png_path: Path
    html_path: Path

    @property
    def hypervolume(self) -> float:
        """The front's normalised hypervolume on validation (the search's objective values)."""
        return float(self.hypervolumes["val"]["front"])

    @property
    def reference_hypervolume(self) -> float:
        """The zoo models' normalised hypervolume on validation."""
        return float(self.hypervolumes["val"]["zoo"])

    def heading(self, n_trials: int) -> str:
        """One line: data set, trials, image counts."""
        data = self.sizes.get("data") or "search"
        done = self.counts.get("COMPLETE", 0)
        return f"{data}: {n_trials} trials ({done} completed), {len(self.front)} on the front"

    def hypervolume_lines(self) -> list[str]:
        """The three hypervolumes on each split, with the reference point they rest on."""
        hv = self.hypervolumes
        lines = [
            *textwrap.wrap(
                "hypervolume, as a fraction of the box from the reference point "
                f"({_corner(self.objectives, hv['reference_point'])}) to the ideal point "
                f"({_corner(self.objectives, hv['ideal_point'])}):",
                width=100,
            ),
            f"  {'split':<10} {'zoo alone':>10} {'front alone':>12} {'front + zoo':>12} "
            f"{'stitched + zoo':>15}",
        ]
        for split, word in (("val", "validation"), ("test", "test")):
            if hv.get(split) is None:
                lines.append(f"  {word:<10} (not measured: run `stitch-nas report DIR`)")
                continue
            z, f, u, s = (hv[split][k] for k in ("zoo", "front", "union", "stitched_union"))
            lines.append(f"  {word:<10} {z:>10.4f} {f:>12.4f} {u:>12.4f} {s:>15.4f}")
        if hv.get("test_control") is not None:
            z, f, u, s = (
                hv["test_control"][k] for k in ("zoo", "front", "union", "stitched_union")
            )
            lines.append(f"  {'test *':<10} {z:>10.4f} {f:>12.4f} {u:>12.4f} {s:>15.4f}")
            lines.append(
                "  (* the zoo's front models fine-tuned with the recipe of the front's networks)"
            )
        lines.append(
            "  (stitched + zoo: the front of the stitched networks alone, with the zoo's models)"
        )
        lines.append(self.history.line(_corner(self.objectives, hv["reference_point"])))
        return lines

    def claim_lines(self, control: bool = False) -> list[str]:
        """One line per zoo model: dominated, matched within noise, or neither (on test);
        ``control``: against the zoo fine-tuned by the control."""
        fronts = {r["number"]: r for r in self.front + self.stitched}
        lines = []
        claims = (self.control_claims or []) if control else self.claims
        if control and claims:
            lines.append(
                "against the zoo's front models fine-tuned with the same recipe (the control):"
            )
        for c in claims:
            name, zoo_test = c["reference"], c[attrs.TEST_ACCURACY]
            if c["status"] != "judged":
                why = {
                    "no_test": "no test figures (run `stitch-nas report DIR` without --no-test)",
                    "no_accuracy": "accuracy is not an objective",
                    "incomparable": "it lacks a value of some objective",
                }[c["status"]]
                lines.append(f"  {name}: no claim, {why}")
                continue

            def who(numbers: list[int], kind: bool = False) -> str:
                return ", ".join(
                    f"#{n}{' ' + kind_text(fronts[n]['kind']) if kind else ''} "
                    f"({fronts[n][attrs.TEST_ACCURACY]:.4f} "
                    f"{_interval(fronts[n]['test_accuracy_interval'])})"
                    for n in numbers
                )

            tuned = " fine-tuned" if c.get("finetuned") else ""
            head = f"  {name}{tuned} (test {zoo_test:.4f}):"
            if c["dominated_by"]:
                lines.append(f"{head} dominated by stitched {who(c['dominated_by'])}")
            elif c["matched_by"]:
                lines.append(
                    f"{head} no stitched network dominates it; within noise at no "
                    f"higher cost: {who(c['matched_by'])}"
                )
            else:
                lines.append(
                    f"{head} no stitched network dominates it or matches it at no higher cost"
                )
            other = [
                f"{word} {who(c[key], kind=True)}"
                for key, word in (
                    ("dominated_by_other", "dominated by"),
                    ("matched_by_other", "within noise at no higher cost:"),
                )
                if c[key]
            ]
            if other:
                lines.append(f"    networks of another kind: {'; '.join(other)}")
        return lines

    def table(self) -> str:
        """Fixed-width text: the front, the zoo models, the hypervolumes and the claims."""
        counts = ", ".join(f"{n} {state}" for state, n in self.counts.items() if n)
        if not self.counts.get("COMPLETE"):
            return f"no completed trial ({counts or 'no trials'}): nothing to report"
        lines = [f"Pareto front, chosen on validation: {len(self.front)} networks ({counts})"]
        lines.append(f"{'trial':>6} {_cells(None)}  network")
        for r in self.front:
            kind = kind_text(r["kind"])
            lines.append(f"{'#' + str(r['number']):>6} {_cells(r)}  {kind}: {r['describe']}")
        if self.stitched:
            lines += ["", "Stitched networks alone, chosen on validation (those not on the front):"]
            lines += [
                f"{'#' + str(r['number']):>6} {_cells(r)}  {r['describe']}" for r in self.stitched
            ]
        width = max([9] + [len(str(ref["name"])) for ref in self.references])
        if self.references:
            lines += ["", f"{'zoo model':<{width}} {_cells(None)}"]
            lines += [f"{str(ref['name']):<{width}} {_cells(ref)}" for ref in self.references]
        n_val, n_test = self.sizes.get("val"), self.sizes.get("test")
        if n_val:
            data = self.sizes.get("data", "the data")
            tested = f" / {n_test} test" if n_test else ""
            lines += [
                "",
                f"accuracy intervals: {INTERVALS} on {n_val} validation{tested} images of {data}",
            ]
        lines += ["", *self.hypervolume_lines(), ""]
        lines += textwrap.wrap(f"claims, on test only: {DOMINATION_RULE}.", width=100)
        lines += self.claim_lines()
        lines += self.claim_lines(control=True)
        return "\n".join(lines)


def _jsonable(obj: Any) -> Any:
    """Replace NaN/Inf (not valid JSON) by None, recursively."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return finite_number(obj) if isinstance(obj, (float, np.number)) else obj


def write_report(study: optuna.Study, out_dir: str | os.PathLike[str]) -> ReportSummary:
    """Write ``trials.csv``, ``pareto.json``, ``pareto.png`` and ``report.html`` into ``out_dir``.

    Works on a running or empty study too: an empty front, hypervolume 0, a placeholder plot.
    Test figures appear once :func:`~stitch_nas.report.measure_holdout` recorded them.

    Args:
        study: A multi-objective study following the search's conventions.
        out_dir: Folder for the files; created if missing. Existing report files are replaced.

    Returns:
        The summary; ``summary.table()`` renders it for a terminal.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    objectives, sizes, tests = objective_names(study), split_sizes(study), holdout_accuracies(study)
    kinds = recorded_kinds(study)
    front = [_front_row(t, objectives, tests, sizes, kinds) for t in pareto_trials(study)]
    on_front = {r["number"] for r in front}
    stitched = [
        _front_row(t, objectives, tests, sizes, kinds)
        for t in stitched_front(study)
        if t.number not in on_front
    ]
    refs = [_reference_row(r, sizes) for r in zoo_references(study)]
    counts = {s.name: 0 for s in TrialState}
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name] += 1
    paths = [out / name for name in ("trials.csv", "pareto.json", "pareto.png", "report.html")]
    summary = ReportSummary(
        objectives,
        front,
        stitched,
        hypervolumes=split_hypervolumes(study),
        claims=zoo_claims(study),
        control_claims=zoo_claims(study, control=True) if control_accuracies(study) else None,
        counts=counts,
        references=refs,
        sizes=sizes,
        history=hypervolume_history(study),
        csv_path=paths[0],
        json_path=paths[1],
        png_path=paths[2],
        html_path=paths[3],
    )
    payload = {
        "objectives": objectives,
        "directions": [d.name.lower() for d in study.directions],
        "data": sizes,
        "intervals": INTERVALS,
        "hypervolume": summary.hypervolumes,
        "domination_rule": DOMINATION_RULE,
        "claims": summary.claims,
        "claims_against_control": summary.control_claims,
        "finetune_control": study.user_attrs.get(attrs.FINETUNE_CONTROL),
        "front": front,
        "stitched_front": stitched,
        "references": refs,
        "counts": counts,
    }
    text = json.dumps(_jsonable(payload), indent=2, default=str, allow_nan=False)
    heading = summary.heading(len(study.trials))
    note = None
    if summary.hypervolumes.get("test") is not None:
        note = f"error bars: {INTERVALS}s; the test split is used by no choice of the search"
    front_rows = {r["number"]: r for r in front}
    atomic_write(paths[0], trials_csv(study, objectives, front_rows, summary.history))
    atomic_write(paths[1], text.encode())
    atomic_write(paths[2], plot_png(study, heading, note, summary.history))
    lines = [
        *summary.hypervolume_lines(),
        "",
        *summary.claim_lines(),
        *summary.claim_lines(control=True),
    ]
    page = report_html(study, heading, front, refs, lines, summary.history)
    atomic_write(paths[3], page.encode())
    logger.info("wrote the report of %d trials to %s", len(study.trials), out)
    return summary
