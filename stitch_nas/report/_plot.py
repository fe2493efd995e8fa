"""The accuracy-against-cost picture of a search: what ``pareto.png`` and ``report.html`` draw.

This module holds what is drawn (:class:`Panel`, :class:`Mark`); :mod:`._figure` draws it with
matplotlib and :mod:`._html` as SVG. One panel per split. Validation: every completed trial
(faint), the front the search selected on it, and the zoo's models as stars. Test (once
measured): the same front networks and zoo models on the held-out split, each with its 95 %
Wilson interval as an error bar, the front networks that the test split shows dominated (by
another front network or a zoo model) faint. Each panel has two staircases: the front's and the
zoo's own front. Zoo models are numbered (cheapest first, by their validation cost) and labelled
by number; a table keys the numbers.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
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

__all__ = ["Mark", "Panel", "human", "panels", "stairs"]

AXIS_LABELS = {
    "macs": "MACs per image",
    "params": "parameters",
    "accuracy": "accuracy",
    "latency": "latency (ms)",
    "latency_ms": "latency (ms)",
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
    key: str = ""  #: a zoo model's number, its label on the plot


def stairs(marks: list[Mark]) -> list[Mark]:
    """The marks not dominated by another of ``marks`` (lower x, higher y), by increasing x."""
    line: list[Mark] = []
    for m in sorted(marks, key=lambda m: (m.x, -m.y)):
        if not line or m.y > line[-1].y:
            line.append(m)
    return line


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
        return stairs(self.front)

    def zoo_staircase(self) -> list[Mark]:
        """The zoo's own front: its models that no other zoo model dominates, by increasing x."""
        return stairs(self.zoo)

    def top_range(self) -> tuple[float, float] | None:
        """The y range where the zoo's strong models live, when the whole range is much wider.

        The strong zoo models are those less than twice the spread from the median to the best
        zoo model below the median (weak outliers, such as a LeNet in a zoo of ResNets, are
        not); the range runs from a bit below the weakest of them (the lower end of its
        interval, or 15 % of the strong models' spread further down) to the highest point drawn.
        None when that would still cover more than 60 % of the panel's range, or when fewer than
        two zoo models are drawn.
        """
        if len(self.zoo) < 2:
            return None
        ys = [y for _, y in self.others + self.infeasible]
        for m in self.front + self.zoo:
            ys += [m.y, *(m.interval or ())]
        low, high = min(ys), max(ys)
        median = statistics.median(m.y for m in self.zoo)
        best = max(m.y for m in self.zoo)
        weakest = min(
            (m for m in self.zoo if m.y >= median - 2 * (best - median)), key=lambda m: m.y
        )
        spread = max(best - weakest.y, 0.02 * (high - low))
        bottom = min(weakest.y - 0.15 * spread, weakest.interval[0] if weakest.interval else high)
        return (bottom, high) if high - bottom < 0.6 * (high - low) else None

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


def _numbered(refs: list[dict[str, Any]], xname: str) -> list[tuple[str, dict[str, Any]]]:
    """Zoo references with their numbers: 1, 2, ... cheapest first (then by name); those
    without a cost come last."""
    inf = float("inf")

    def order(r: dict[str, Any]) -> tuple[float, str]:
        cost = lookup_metric(r, xname)
        return (inf if cost is None else float(cost), str(r["name"]))

    return [(str(i + 1), r) for i, r in enumerate(sorted(refs, key=order))]


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
    refs = _numbered(zoo_references(study), xname)
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
    for key, r in refs:
        x, y = lookup_metric(r, xname), lookup_metric(r, yname)
        if x is not None and y is not None:
            tip = _tip(str(r["name"]), "zoo model", {}, f"validation {yname} {y:.4f}")
            val.zoo.append(Mark(str(r["name"]), x, y, _interval(y, val_n), tip=tip, key=key))
    out = [val]
    test_n = sizes.get("test")
    if has_acc and front and all(t.number in tests for t in front):
        held_out = Panel("test", title("test"), val.xlabel, "test accuracy")
        for t, m in zip(front, val.front, strict=True):
            y = tests[t.number]
            held_out.front.append(
                Mark(m.label, m.x, y, _interval(y, test_n), m.stitched, tip=m.tip)
            )
        for key, r in refs:
            x, y = lookup_metric(r, xname), finite_number(r.get(attrs.TEST_ACCURACY))
            if x is not None and y is not None:
                tip = _tip(str(r["name"]), "zoo model", {}, f"test accuracy {y:.4f}")
                mark = Mark(str(r["name"]), x, y, _interval(y, test_n), tip=tip, key=key)
                held_out.zoo.append(mark)
        _mark_dominated(held_out.front, held_out.zoo)
        out.append(held_out)
    return out
