"""The accuracy-against-cost picture of a search: what ``pareto.png`` and ``report.html`` draw.

One panel per split. Validation: every completed trial (faint), the front the search selected
on it, and the zoo's models as stars. Test (once measured): the same front networks and zoo
models on the held-out split, each with its 95 % Wilson interval as an error bar, the front
networks that the test split shows dominated (by another front network or a zoo model) faint.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from optuna.study import StudyDirection
from optuna.trial import TrialState

from stitch_nas import attrs

from ._holdout import holdout_accuracies, split_sizes
from ._intervals import wilson_interval
from ._pareto import (
    finite_number,
    is_feasible,
    lookup_metric,
    n_fragments,
    objective_names,
    pareto_trials,
    trial_config,
    zoo_references,
)

__all__ = ["Mark", "Panel", "human", "label_offsets", "labelled", "panels", "plot_png"]

AXIS_LABELS = {
    "macs": "MACs per image",
    "params": "parameters",
    "accuracy": "accuracy",
    "latency": "latency (ms per image)",
    "latency_ms": "latency (ms per image)",
}


def human(value: float | None) -> str:
    """1234567 -> '1.2M', 3e8 -> '300M', None -> '-'."""
    if value is None:
        return "-"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}".removesuffix(".0") + unit
    return f"{value:g}"


@dataclass
class Mark:
    """One network drawn in a panel."""

    label: str  #: "#30" for a trial, the model's name for a zoo model
    x: float
    y: float
    interval: tuple[float, float] | None = None  #: 95 % Wilson interval of ``y``
    stitched: bool = False
    faint: bool = False  #: dominated in this panel's plane
    tip: str = ""  #: what a hover shows: description, config, figures


@dataclass
class Panel:
    """One split's picture: x is a cost (minimised), y an accuracy (maximised)."""

    split: str
    title: str
    xlabel: str
    ylabel: str
    front: list[Mark] = field(default_factory=list)
    zoo: list[Mark] = field(default_factory=list)
    others: list[tuple[float, float]] = field(default_factory=list)
    infeasible: list[tuple[float, float]] = field(default_factory=list)

    def staircase(self) -> list[Mark]:
        """The front marks not dominated by another front mark, by increasing x."""
        line: list[Mark] = []
        for m in sorted(self.front, key=lambda m: (m.x, -m.y)):
            if not line or m.y > line[-1].y:
                line.append(m)
        return line

    def log_x(self) -> bool:
        xs = [m.x for m in self.front + self.zoo if m.x > 0] + [x for x, _ in self.others if x > 0]
        return bool(xs) and max(xs) > 10 * min(xs)


def plot_axes(
    objectives: list[str], directions: Sequence[StudyDirection]
) -> tuple[int, int] | None:
    """Indices of x (a minimised cost, MACs before params) and y (accuracy, else maximised)."""
    mins = [i for i, d in enumerate(directions) if d == StudyDirection.MINIMIZE]
    maxs = [i for i, d in enumerate(directions) if d == StudyDirection.MAXIMIZE]
    named = [objectives.index(n) for n in ("macs", "params") if n in objectives]
    x = next((i for i in named if i in mins), mins[0] if mins else None)
    acc = [i for i in maxs if objectives[i] == "accuracy"]
    y = acc[0] if acc else (maxs[0] if maxs else None)
    return None if x is None or y is None else (x, y)


def _interval(y: float, n: Any) -> tuple[float, float] | None:
    return wilson_interval(y, int(n)) if isinstance(n, int) and n > 0 else None


def _mark_dominated(front: list[Mark], others: list[Mark]) -> None:
    """Fade the front marks that another front network or a zoo model dominates in the plane."""
    for m in front:
        m.faint = any(
            o.x <= m.x and o.y >= m.y and (o.x < m.x or o.y > m.y) for o in front + others
        )


def _tip(head: str, describe: str, config: dict[str, Any], figures: str) -> str:
    config_text = json.dumps(config, sort_keys=True) if config else ""
    return "\n".join(s for s in (head, describe, figures, config_text) if s)


def panels(study: optuna.Study) -> list[Panel]:
    """The validation panel, and the test panel once test figures exist for the whole front.

    Empty when the study has no completed trial or no (cost, accuracy) pair of objectives.
    """
    objectives = objective_names(study)
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    xy = plot_axes(objectives, study.directions)
    if not done or xy is None:
        return []
    xi, yi = xy
    xname, yname = objectives[xi], objectives[yi]
    sizes, tests = split_sizes(study), holdout_accuracies(study)
    front = pareto_trials(study)
    on_front = {t.number for t in front}
    refs = zoo_references(study)
    has_acc = yname == "accuracy"
    val_n = sizes.get("val") if has_acc else None
    words = {"val": "validation, what the search selected on", "test": "test, used by no choice"}

    def title(split: str) -> str:
        n = sizes.get(split)
        return f"{words[split]}" + (f" ({n} images)" if n else "")

    val = Panel("val", title("val"), AXIS_LABELS.get(xname, xname), f"validation {yname}")
    for t in done:
        point = (t.values[xi], t.values[yi])
        if t.number not in on_front:
            (val.others if is_feasible(t) else val.infeasible).append(point)
    figures: dict[int, str] = {}
    for t in front:
        test = tests.get(t.number)
        figures[t.number] = f"validation {yname} {t.values[yi]:.4f}" + (
            f", test accuracy {test:.4f}" if test is not None else ""
        )
        figures[t.number] += f", {xname} {human(t.values[xi])}"
        tip = _tip(
            f"#{t.number}",
            str(t.user_attrs.get(attrs.DESCRIBE, "")),
            trial_config(t),
            figures[t.number],
        )
        val.front.append(
            Mark(
                f"#{t.number}",
                t.values[xi],
                t.values[yi],
                _interval(t.values[yi], val_n),
                n_fragments(t) > 1,
                tip=tip,
            )
        )
    for r in refs:
        x, y = lookup_metric(r, xname), lookup_metric(r, yname)
        if x is not None and y is not None:
            tip = _tip(str(r["name"]), "zoo model", {}, f"validation {yname} {y:.4f}")
            val.zoo.append(Mark(str(r["name"]), x, y, _interval(y, val_n), tip=tip))
    out = [val]
    test_n = sizes.get("test")
    if has_acc and front and all(t.number in tests for t in front):
        held_out = Panel("test", title("test"), val.xlabel, "test accuracy")
        for t, m in zip(front, val.front, strict=True):
            y = tests[t.number]
            held_out.front.append(
                Mark(m.label, m.x, y, _interval(y, test_n), m.stitched, tip=m.tip)
            )
        for r in refs:
            x, y = lookup_metric(r, xname), finite_number(r.get(attrs.TEST_ACCURACY))
            if x is not None and y is not None:
                tip = _tip(str(r["name"]), "zoo model", {}, f"test accuracy {y:.4f}")
                held_out.zoo.append(Mark(str(r["name"]), x, y, _interval(y, test_n), tip=tip))
        _mark_dominated(held_out.front, held_out.zoo)
        out.append(held_out)
    return out


# label offsets tried in turn, in points: right, below right, left, below left, further out
_OFFSETS = ((7, 3), (7, -11), (-7, 3), (-7, -11), (7, 12), (7, -20), (-7, 12), (-7, -20))


def _overlaps(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def label_offsets(
    anchors: Sequence[tuple[float, float, float, float]], dots: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    """Offsets for labels at ``anchors`` (x, y, text width, text height; y pointing up, one
    unit), each the first of :data:`_OFFSETS` whose box covers no earlier label and no dot:
    neighbours on a log axis otherwise print over each other."""
    placed: list[tuple[float, ...]] = [(x - 5, y - 5, x + 5, y + 5) for x, y in dots]
    out: list[tuple[float, float]] = []
    for x, y, w, h in anchors:
        box: tuple[float, ...] = ()
        for dx, dy in _OFFSETS:
            left = x + dx - (w if dx < 0 else 0)
            box = (left, y + dy, left + w, y + dy + h)
            if not any(_overlaps(box, other) for other in placed):
                break
        placed.append(box)
        out.append((dx, dy))
    return out


def labelled(panel: Panel) -> list[tuple[Mark, float]]:
    """The marks that get a label, with its font size: zoo models, then stitched networks."""
    return [(m, 9.0) for m in panel.zoo] + [(m, 7.0) for m in panel.front if m.stitched]


def _place_labels(ax: Any, panel: Panel) -> None:
    """Label the panel's marks; run after the layout is final (pixel positions)."""
    scale = ax.figure.dpi / 72
    to_px = ax.transData.transform
    items = labelled(panel)
    anchors = []
    for m, size in items:
        x, y = to_px((m.x, m.y)) / scale  # in points
        anchors.append((x, y, 0.62 * size * len(m.label), size))
    dots = [tuple(to_px((m.x, m.y)) / scale) for m in panel.front + panel.zoo]
    for (m, size), (dx, dy) in zip(items, label_offsets(anchors, dots), strict=True):
        ax.annotate(
            m.label,
            (m.x, m.y),
            xytext=(dx, dy),
            textcoords="offset points",
            ha="right" if dx < 0 else "left",
            fontsize=size,
            alpha=0.5 if m.faint else 1.0,
            weight="bold" if size > 8 else "normal",
        )


def _errorbars(ax: Any, marks: list[Mark], **style: Any) -> None:
    marks = [m for m in marks if m.interval is not None]
    if marks:
        low = [m.y - m.interval[0] for m in marks if m.interval]
        high = [m.interval[1] - m.y for m in marks if m.interval]
        ax.errorbar(
            [m.x for m in marks], [m.y for m in marks], yerr=[low, high], fmt="none", **style
        )


def _draw(ax: Any, panel: Panel) -> None:
    if panel.others:
        ax.scatter(*zip(*panel.others, strict=True), s=12, c="0.82", label="other trials")
    if panel.infeasible:  # drawn apart, or a trial off the front looks like a bug
        ax.scatter(
            *zip(*panel.infeasible, strict=True), s=16, c="0.7", marker="x", label="infeasible"
        )
    line = panel.staircase()
    ax.step([m.x for m in line], [m.y for m in line], where="post", c="C0", zorder=2)
    for faint, alpha in ((False, 1.0), (True, 0.35)):
        marks = [m for m in panel.front if m.faint == faint]
        if not marks:
            continue
        _errorbars(ax, marks, ecolor="C0", elinewidth=1, capsize=2, alpha=alpha, zorder=2)
        label = "front (dominated here)" if faint else "Pareto front (chosen on validation)"
        ax.scatter(
            [m.x for m in marks],
            [m.y for m in marks],
            s=36,
            c="C0",
            edgecolors="k",
            linewidths=0.5,
            alpha=alpha,
            zorder=3,
            label=label,
        )
    if panel.zoo:
        _errorbars(ax, panel.zoo, ecolor="C3", elinewidth=1, capsize=3, zorder=3)
        ax.scatter(
            [m.x for m in panel.zoo],
            [m.y for m in panel.zoo],
            marker="*",
            s=260,
            c="C3",
            edgecolors="k",
            zorder=4,
            label="zoo models",
        )
    if panel.log_x():
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: human(v)))
    ax.margins(0.08)
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)


def plot_png(study: optuna.Study, heading: str, note: str | None = None) -> bytes:
    """``pareto.png``: one panel per split (see the module docstring), ``heading`` above."""
    drawn = panels(study)
    # Figure + FigureCanvasAgg instead of pyplot: the process-wide backend and figure registry
    # of whoever imports us stay untouched.
    fig = Figure(figsize=(6.5 * max(1, len(drawn)), 5.2), dpi=110)
    FigureCanvasAgg(fig)
    if not drawn:
        ax = fig.add_subplot()
        why = (
            "no completed trial"
            if not study.get_trials(states=(TrialState.COMPLETE,))
            else ("no minimised/maximised pair to plot")
        )
        ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    # the test panel, what a reader wants, comes first; each panel keeps its own y range so
    # that the front and the zoo models are not squeezed by the search's worst trials
    drawn = drawn[::-1]
    axes = [fig.add_subplot(1, len(drawn), i + 1) for i in range(len(drawn))]
    for ax, panel in zip(axes, drawn, strict=True):
        _draw(ax, panel)
    fig.suptitle(heading, fontsize=11)
    if note is not None:
        fig.text(0.5, 0.01, note, ha="center", va="bottom", fontsize=8, color="0.3")
    fig.tight_layout(rect=(0, 0.04 if note else 0, 1, 1))
    for ax, panel in zip(axes, drawn, strict=True):
        _place_labels(ax, panel)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
