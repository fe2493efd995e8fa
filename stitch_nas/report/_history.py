"""Hypervolume history: how much the search added to the zoo, trial by trial and over time.

The value after a trial is the report's validation hypervolume of front + zoo
(``split_hypervolumes(study)["val"]["union"]``: :func:`~stitch_nas.report.hypervolume` from the
reference point of :func:`~stitch_nas.report.hypervolume_box`, over the box's volume) over the
zoo's models and the feasible COMPLETE trials up to it; a fine-tune trial counts at its own
number and completion time. Its last value is that hypervolume; its first, before any trial,
the zoo's alone. The front is kept incrementally: a trial that joins it adds the volume it
covers alone, so a trial that does not join it costs no hypervolume computation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

import numpy as np
import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from ._pareto import (
    as_losses,
    hypervolume,
    hypervolume_box,
    is_feasible,
    objective_names,
    reference_values,
    zoo_references,
)

__all__ = ["LAST_SHARE", "HypervolumeHistory", "draw_history", "history_svg", "hypervolume_history"]

LAST_SHARE = 0.2  #: the share of trials at the end whose gain the report prints


def _nondominated(losses: np.ndarray) -> np.ndarray:
    """The rows no other row dominates (all objectives as losses), once each."""
    losses = np.unique(losses, axis=0)  # sorted by the first objective, then the next
    keep = np.ones(len(losses), dtype=bool)
    for i in range(1, len(losses)):  # only an earlier row can dominate a later one
        keep[i] = not np.any(np.all(losses[:i][keep[:i]] <= losses[i], axis=1))
    return losses[keep]


class _Front:
    """A non-dominated set and its hypervolume in the report's box (:func:`hypervolume` from the
    report's reference point, over the box's volume, at most 1).

    A point that joins adds its exclusive volume: the volume of its own box less the part the
    front covers already, the hypervolume of the front's points clipped to its box. That set is
    small, where recomputing the whole front each time costs much with three objectives.
    """

    def __init__(
        self, directions: Sequence[StudyDirection], worst: list[float], ideal: list[float]
    ) -> None:
        self.directions, self.worst = directions, worst
        self.box = float(np.prod(np.abs(np.subtract(ideal, worst))))
        self.losses = np.empty((0, len(directions)))
        self.volume = 0.0

    @property
    def value(self) -> float:
        return min(1.0, self.volume / self.box) if self.box > 0 else 0.0

    def add(self, points: Iterable[Sequence[float]]) -> float:
        """Add ``points`` (raw objective values); the normalised hypervolume after them."""
        for point in points:
            loss = as_losses(np.asarray([point], dtype=float), self.directions)[0]
            if np.any(np.all(self.losses <= loss, axis=1)):
                continue  # dominated by (or equal to) a point already in
            own = hypervolume([point], self.directions, self.worst)
            if len(self.losses):
                clipped = as_losses(_nondominated(np.maximum(self.losses, loss)), self.directions)
                own -= hypervolume(clipped, self.directions, self.worst)
            self.volume += own
            keep = ~np.all(loss <= self.losses, axis=1)
            self.losses = np.vstack([self.losses[keep], loss])
        return self.value


@dataclass
class HypervolumeHistory:
    """The validation hypervolume of front + zoo after each trial and over wall-clock time."""

    zoo: float  #: the zoo's models alone: the value before any trial
    numbers: list[int]  #: every trial's number, in order
    by_number: list[float]  #: the value after each trial of ``numbers``
    #: seconds from the first trial's start to each COMPLETE trial's end, in that order
    seconds: list[float]
    by_time: list[float]  #: the value once each trial of ``seconds`` had ended
    reference_point: list[float]  #: raw units, as ``split_hypervolumes`` gives it

    @property
    def final(self) -> float:
        return self.by_number[-1] if self.by_number else self.zoo

    def last_share(self, share: float = LAST_SHARE) -> tuple[int, int, float] | None:
        """(first and last trial number of the last ``share`` of trials, value before them)."""
        n = len(self.numbers)
        if n == 0:
            return None
        k = max(1, math.ceil(share * n - 1e-9))
        before = self.by_number[n - k - 1] if n > k else self.zoo
        return self.numbers[n - k], self.numbers[-1], before

    def line(self, reference: str) -> str:
        """One line: the final value and what the last 20 % of trials added to it."""
        head = f"hypervolume of front + zoo (validation, reference point {reference}): "
        head += f"{self.final:.4f}"
        last = self.last_share()
        if last is None:
            return f"{head}; no trial yet"
        first, end, before = last
        gain = self.final - before
        share = f" ({100 * gain / before:+.1f} %)" if before > 0 else ""
        span = f"#{first}" if first == end else f"#{first}–#{end}"
        return (
            f"{head}; the last {100 * LAST_SHARE:.0f} % of trials ({span}) added {gain:+.4f}{share}"
        )


def _usable(trial: FrozenTrial) -> bool:
    return (
        trial.state == TrialState.COMPLETE
        and trial.values is not None
        and all(math.isfinite(v) for v in trial.values)
        and is_feasible(trial)
    )


def hypervolume_history(study: optuna.Study) -> HypervolumeHistory:
    """The validation hypervolume of front + zoo after each trial and over wall-clock time.

    The value after a trial is the report's ``split_hypervolumes(study)["val"]["union"]`` (same
    function, same reference point and box) over the zoo's models and the feasible COMPLETE
    trials numbered up to it; pruned, failed and running trials add nothing, a fine-tune trial
    counts at its own number. Over time, trials count from their completion, in seconds from the
    first trial's start.

    Returns:
        The history; its ``final`` equals the report's front + zoo hypervolume.
    """
    objectives, directions = objective_names(study), study.directions
    worst, ideal = hypervolume_box(study)
    zoo = [v for r in zoo_references(study) if (v := reference_values(r, objectives)) is not None]
    trials = study.get_trials(deepcopy=False)
    front = _Front(directions, worst, ideal)
    start = front.add(zoo)
    by_number = [front.add([t.values] if _usable(t) else []) for t in trials]
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    timed = sorted(
        (t for t in trials if _usable(t) and t.datetime_complete is not None),
        key=lambda t: (t.datetime_complete, t.number),
    )
    seconds: list[float] = []
    by_time: list[float] = []
    if starts and timed:
        first = min(starts)
        ends = [t.datetime_complete for t in timed if t.datetime_complete is not None]
        seconds = [max(0.0, (end - first).total_seconds()) for end in ends]
        order = [t.number for t in timed]
        if order == sorted(order):  # they ended in the order of their numbers: the same values
            after = dict(zip((t.number for t in trials), by_number, strict=True))
            by_time = [after[n] for n in order]
        else:
            front = _Front(directions, worst, ideal)
            front.add(zoo)
            by_time = [front.add([t.values]) for t in timed]
    return HypervolumeHistory(start, [t.number for t in trials], by_number, seconds, by_time, worst)


def _duration(seconds: float) -> tuple[float, str]:
    for unit, scale in (("h", 3600.0), ("min", 60.0)):
        if seconds >= 2 * scale:
            return scale, unit
    return 1.0, "s"


def draw_history(ax_trials: Any, ax_time: Any, history: HypervolumeHistory) -> None:
    """Two matplotlib panels: the history against trial number and against wall-clock time."""
    scale, unit = _duration(max(history.seconds, default=0.0))
    times = [0.0, *(s / scale for s in history.seconds)]
    series = (
        (ax_trials, [-1, *history.numbers], history.by_number, "trial number"),
        (ax_time, times, history.by_time, f"wall clock ({unit})"),
    )
    for ax, xs, ys, label in series:
        if len(xs) > 1:
            ax.step(xs, [history.zoo, *ys], where="post", c="C0", lw=1.5, label="front + zoo")
        ax.axhline(history.zoo, c="C3", ls="--", lw=1, label="zoo alone")
        ax.set_xlabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    last = history.last_share()
    if last is not None and len(history.numbers) > 1:
        ax_trials.axvspan(last[0] - 0.5, history.numbers[-1] + 0.5, color="0.9", zorder=0)
    ax_trials.set_ylabel("hypervolume (validation)", fontsize=8)
    ax_trials.set_title("hypervolume of front + zoo, by trial", fontsize=9)
    ax_time.set_title("... and over time", fontsize=9)
    ax_trials.legend(loc="lower right", fontsize=7)
    ax_time.tick_params(labelleft=False)  # the same y axis as the panel on its left


def _polyline(xs: list[float], ys: list[float], box: tuple[float, float, float, float]) -> str:
    """A step line through (xs, ys) in an SVG box (left, top, width, height)."""
    left, top, width, height = box
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    pad = 0.05 * (y1 - y0) if y1 > y0 else 0.01
    y0, y1 = y0 - pad, y1 + pad

    def px(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1.0) * width

    def py(y: float) -> float:
        return top + (y1 - y) / (y1 - y0) * height

    path = [f"M{px(xs[0]):.1f},{py(ys[0]):.1f}"]
    for x, y in zip(xs[1:], ys[1:], strict=True):
        path.append(f"H{px(x):.1f}V{py(y):.1f}")
    return (
        f'<path d="{"".join(path)}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>'
        f'<line x1="{left}" x2="{left + width}" y1="{py(ys[0]):.1f}" y2="{py(ys[0]):.1f}" '
        'stroke="#d62728" stroke-dasharray="4 3"/>'
        f'<text x="{left - 4}" y="{py(y1 - pad) + 4:.1f}" text-anchor="end">{y1 - pad:.4f}</text>'
        f'<text x="{left - 4}" y="{py(y0 + pad) + 4:.1f}" text-anchor="end">{y0 + pad:.4f}</text>'
        f'<text x="{left}" y="{top + height + 14}">{x0:g}</text>'
        f'<text x="{left + width}" y="{top + height + 14}" text-anchor="end">{x1:.4g}</text>'
    )


def history_svg(history: HypervolumeHistory) -> str:
    """The two history panels as one SVG element (blue: front + zoo, dashed red: zoo alone)."""
    w, h, left, top = 560, 200, 62, 28
    scale, unit = _duration(max(history.seconds, default=0.0))
    times = [0.0, *(s / scale for s in history.seconds)]
    charts = (
        ("by trial number", [-1.0, *map(float, history.numbers)], history.by_number),
        (f"over wall-clock time ({unit})", times, history.by_time),
    )
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * w}" height="{h}" '
        f'viewBox="0 0 {2 * w} {h}" font-family="sans-serif" font-size="11">'
    ]
    for i, (title, xs, ys) in enumerate(charts):
        x = i * w + left
        out.append(
            f'<text x="{i * w + w / 2}" y="16" text-anchor="middle" font-size="13">'
            f"hypervolume of front + zoo (validation), {escape(title)}</text>"
        )
        out.append(
            f'<rect x="{x}" y="{top}" width="{w - left - 18}" height="{h - top - 40}" '
            'fill="none" stroke="#888"/>'
        )
        if len(xs) > 1:
            out.append(_polyline(xs, [history.zoo, *ys], (x, top, w - left - 18, h - top - 40)))
    out.append("</svg>")
    return "\n".join(out)
