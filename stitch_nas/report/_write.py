"""Report files of a multi-objective search: trials CSV, Pareto JSON, Pareto PNG and a table.

The Pareto front, hypervolumes and dominance come from :mod:`.pareto` (re-exported here);
this module writes ``trials.csv``, ``pareto.json`` and ``pareto.png`` and renders the summary
table printed in a terminal.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from stitch_nas import attrs
from stitch_nas.files import atomic_write
from stitch_nas.report._pareto import (
    _MAX,
    _MIN,
    _config,
    _feasible,
    _lookup,
    _metric,
    _n_fragments,
    _number,
    _objectives,
    _references,
    dominated_references,
    front_hypervolume,
    hypervolume,
    pareto_trials,
)

__all__ = [
    "ReportSummary",
    "dominated_references",
    "front_hypervolume",
    "hypervolume",
    "pareto_trials",
    "write_report",
]

logger = logging.getLogger(__name__)

_METRICS = ("accuracy", "macs", "params", "cka", "latency_ms")
_FRONT_STYLE = {"s": 36, "c": "C0", "edgecolors": "k", "linewidths": 0.5, "label": "Pareto front"}
_STAR_STYLE = {"marker": "*", "s": 280, "c": "C3", "edgecolors": "k", "label": "zoo models"}
_LABEL_STYLE = {"textcoords": "offset points", "fontsize": 7}
_AXIS_LABELS = {
    "macs": "MACs per image",
    "params": "parameters",
    "accuracy": "validation accuracy",
    "latency": "latency (ms per image)",
    "latency_ms": "latency (ms per image)",
}


def _front_row(trial: FrozenTrial, objectives: list[str]) -> dict[str, Any]:
    row: dict[str, Any] = {"number": trial.number, "values": [_number(v) for v in trial.values]}
    row.update({m: _metric(trial, m, objectives) for m in _METRICS})
    row.update(
        describe=str(trial.user_attrs.get(attrs.DESCRIBE, "")),
        config=_config(trial),
        models=[str(m) for m in trial.user_attrs.get(attrs.MODELS, [])],
        n_fragments=_n_fragments(trial),
        stitched=_n_fragments(trial) > 1,
    )
    return row


def _human(value: float | None) -> str:
    """1234567 -> '1.2M', 3e8 -> '300M', None -> '-'."""
    if value is None:
        return "-"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}".removesuffix(".0") + unit
    return f"{value:g}"


def _fixed(spec: str) -> Callable[[float | None], str]:
    return lambda v: "-" if v is None else format(v, spec)


# (key, header, width, formatter) of the metric columns shared by the front and the references.
_COLUMNS = (
    ("accuracy", "accuracy", 8, _fixed(".4f")),
    ("macs", "MACs", 7, _human),
    ("params", "params", 7, _human),
    ("cka", "CKA", 6, _fixed(".3f")),
)


def _cells(row: dict[str, Any] | None) -> str:
    if row is None:
        return " ".join(f"{head:>{w}}" for _, head, w, _ in _COLUMNS)
    return " ".join(f"{fmt(_lookup(row, key)):>{w}}" for key, _, w, fmt in _COLUMNS)


@dataclass
class ReportSummary:
    """What :func:`write_report` wrote, plus the numbers a caller prints or checks."""

    objectives: list[str]
    front: list[dict[str, Any]]
    hypervolume: float
    reference_hypervolume: float
    extends_front: bool
    dominated: list[dict[str, Any]]
    counts: dict[str, int]
    references: list[dict[str, Any]]
    csv_path: Path
    json_path: Path
    png_path: Path

    def table(self) -> str:
        """Fixed-width text: the front, the references, the hypervolume and dominance lines."""
        counts = ", ".join(f"{n} {state}" for state, n in self.counts.items() if n)
        if not self.counts.get("COMPLETE"):
            return f"no completed trial ({counts or 'no trials'}): nothing to report"
        lines = [f"Pareto front: {len(self.front)} networks ({counts})"]
        lines.append(f"{'trial':>6} {_cells(None)}  network")
        for r in self.front:
            kind = "stitched" if r["stitched"] else "single"
            lines.append(f"{'#' + str(r['number']):>6} {_cells(r)}  {kind}: {r['describe']}")
        width = max([9] + [len(str(ref["name"])) for ref in self.references])
        if self.references:
            lines += ["", f"{'zoo model':<{width}} {_cells(None)}"]
            lines += [f"{str(ref['name']):<{width}} {_cells(ref)}" for ref in self.references]
        lines += [
            "",
            f"hypervolume (normalised, 0-1): front {self.hypervolume:.4f}, "
            f"zoo models alone {self.reference_hypervolume:.4f}",
            f"the search {'extends' if self.extends_front else 'does not extend'} the zoo's front",
        ]
        for d in self.dominated:
            name, by = d["reference"], ", ".join(f"#{n}" for n in d["dominated_by_stitched"])
            if by:
                lines.append(f"{name} is dominated by stitched network(s) {by}")
                continue
            single = ", ".join(f"#{n}" for n in d["dominated_by"])
            also = f" (single-model trial(s) {single} do)" if single else ""
            lines.append(f"no stitched network dominates {name}{also}")
        return "\n".join(lines)


def _plot_axes(
    objectives: list[str], directions: Sequence[StudyDirection]
) -> tuple[int, int] | None:
    """Indices of x (a minimised cost, MACs before params) and y (accuracy, else maximised)."""
    mins = [i for i, d in enumerate(directions) if d == _MIN]
    maxs = [i for i, d in enumerate(directions) if d == _MAX]
    named = [objectives.index(n) for n in ("macs", "params") if n in objectives]
    x = next((i for i in named if i in mins), mins[0] if mins else None)
    acc = [i for i in maxs if objectives[i] == "accuracy"]
    y = acc[0] if acc else (maxs[0] if maxs else None)
    return None if x is None or y is None else (x, y)


def _xy(points: Sequence[Sequence[float]], xi: int, yi: int) -> tuple[list[float], list[float]]:
    return [p[xi] for p in points], [p[yi] for p in points]


def _draw(ax: Any, study: optuna.Study, refs: list[dict[str, Any]], names: list[str]) -> None:
    """Draw x = ``names[0]`` against y = ``names[1]`` (objective names) on ``ax``."""
    objectives = _objectives(study)
    xi, yi = objectives.index(names[0]), objectives.index(names[1])
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    front = pareto_trials(study)
    ok, bad = [t.values for t in done if _feasible(t)], [t.values for t in done if not _feasible(t)]
    ax.scatter(*_xy(ok, xi, yi), s=12, c="0.8", label="completed trials")
    if bad:  # drawn apart, or a trial off the front for a violated constraint looks like a bug
        ax.scatter(*_xy(bad, xi, yi), s=16, c="0.7", marker="x", label="infeasible (constraints)")
    # With 3+ objectives some front points are dominated in this plane; the step line joins only
    # those that are not, so it stays a monotone staircase.
    line: list[list[float]] = []
    for v in sorted((t.values for t in front), key=lambda v: (v[xi], -v[yi])):
        if not line or v[yi] > line[-1][yi]:
            line.append(v)
    ax.step(*_xy(line, xi, yi), where="post", c="C0", zorder=2)
    ax.scatter(*_xy([t.values for t in front], xi, yi), zorder=3, **_FRONT_STYLE)
    for t in (t for t in front if _n_fragments(t) > 1):
        ax.annotate(f"#{t.number}", (t.values[xi], t.values[yi]), xytext=(4, -10), **_LABEL_STYLE)
    stars: list[tuple[str, float, float]] = []
    for r in refs:
        name, x, y = str(r["name"]), _lookup(r, names[0]), _lookup(r, names[1])
        if x is not None and y is not None:
            stars.append((name, x, y))
    star_xy = [(x, y) for _, x, y in stars]
    if stars:
        ax.scatter(*_xy(star_xy, 0, 1), zorder=4, **_STAR_STYLE)
    # Alternate label sides along x so that neighbouring zoo models do not print over each other.
    for k, (name, x, y) in enumerate(sorted(stars, key=lambda s: s[1])):
        offset = (8, 4) if k % 2 == 0 else (8, -13)
        ax.annotate(
            name, (x, y), xytext=offset, **{**_LABEL_STYLE, "fontsize": 9, "weight": "bold"}
        )
    xs = [x for x in _xy(ok + bad, xi, yi)[0] + _xy(star_xy, 0, 1)[0] if x > 0]
    if xs and max(xs) > 10 * min(xs):
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _human(v)))
    ax.margins(0.08)
    ax.set_xlabel(_AXIS_LABELS.get(names[0], names[0]))
    ax.set_ylabel(_AXIS_LABELS.get(names[1], names[1]))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)


def _plot_png(
    study: optuna.Study, objectives: list[str], refs: list[dict[str, Any]], hv: float
) -> bytes:
    # Figure + FigureCanvasAgg instead of pyplot: the process-wide backend and figure registry
    # of whoever imports us stay untouched.
    fig = Figure(figsize=(7.5, 5.0), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    n_done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    xy = _plot_axes(objectives, study.directions)
    if n_done and xy is not None:
        _draw(ax, study, refs, [objectives[xy[0]], objectives[xy[1]]])
    else:
        why = "no completed trial" if not n_done else "no minimised/maximised pair to plot"
        ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    ax.set_title(f"{len(study.trials)} trials ({n_done} completed), hypervolume {hv:.3f}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _trials_csv(study: optuna.Study, objectives: list[str], on_front: set[int]) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf)  # writes None as an empty field
    names = "feasible is_pareto n_fragments models describe prune_reason fail_reason duration_s"
    tail = [*names.split(), "config"]
    writer.writerow(["number", "state", *(f"value_{n}" for n in objectives), *_METRICS, *tail])
    for t in study.get_trials(deepcopy=False):
        ua, config = t.user_attrs, _config(t)
        values = list(t.values) if t.values is not None else [None] * len(objectives)
        metrics = [_metric(t, m, objectives) for m in _METRICS]
        duration = t.duration.total_seconds() if t.duration is not None else None
        models = "+".join(str(m) for m in ua.get(attrs.MODELS, []))
        config_json = json.dumps(config, sort_keys=True, default=str) if config else None
        flags = [_feasible(t), t.number in on_front, _n_fragments(t), models]
        reasons = [ua.get(attrs.DESCRIBE), ua.get(attrs.PRUNE_REASON), ua.get(attrs.FAIL_REASON)]
        writer.writerow(
            [t.number, t.state.name, *values, *metrics, *flags, *reasons, duration, config_json]
        )
    return buf.getvalue().encode()


def _jsonable(obj: Any) -> Any:
    """Replace NaN/Inf (not valid JSON) by None, recursively."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return _number(obj) if isinstance(obj, (float, np.number)) else obj


def write_report(study: optuna.Study, out_dir: str | os.PathLike[str]) -> ReportSummary:
    """Write ``trials.csv``, ``pareto.json`` and ``pareto.png`` into ``out_dir``.

    Works on a running or empty study too: an empty front, hypervolume 0, a placeholder plot.

    Args:
        study: A multi-objective study following the search's conventions.
        out_dir: Folder for the files; created if missing. Existing report files are replaced.

    Returns:
        The summary; ``summary.table()`` renders it for a terminal.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    objectives, refs = _objectives(study), _references(study)
    front = [_front_row(t, objectives) for t in pareto_trials(study)]
    hv, dominated = front_hypervolume(study), dominated_references(study)
    counts = {s.name: 0 for s in TrialState}
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name] += 1
    paths = (out / "trials.csv", out / "pareto.json", out / "pareto.png")
    summary = ReportSummary(
        objectives,
        front,
        hypervolume=hv["hypervolume"],
        reference_hypervolume=hv["reference_hypervolume"],
        extends_front=hv["extends_front"],
        dominated=dominated,
        counts=counts,
        references=refs,
        csv_path=paths[0],
        json_path=paths[1],
        png_path=paths[2],
    )
    payload = {
        "objectives": objectives,
        "directions": [d.name.lower() for d in study.directions],
        **{k: hv[k] for k in ("hypervolume", "reference_hypervolume", "combined_hypervolume")},
        "extends_front": hv["extends_front"],
        "reference_point": hv["reference_point"],
        "front": front,
        "references": refs,
        "dominated_references": dominated,
        "counts": counts,
    }
    text = json.dumps(_jsonable(payload), indent=2, default=str, allow_nan=False)
    atomic_write(paths[0], _trials_csv(study, objectives, {r["number"] for r in front}))
    atomic_write(paths[1], text.encode())
    atomic_write(paths[2], _plot_png(study, objectives, refs, hv["hypervolume"]))
    logger.info("wrote the report of %d trials to %s", len(study.trials), out)
    return summary
