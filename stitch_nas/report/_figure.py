"""``pareto.png``: the panels of :mod:`._plot` drawn with matplotlib, and the hypervolume history.

Per split a main panel zoomed on the accuracies where the zoo's stronger models live
(:meth:`~stitch_nas.report._plot.Panel.top_range`) and, under it, the whole range (shaded: what
the main panel shows), so the cheap end is not lost; zoo models are stars labelled by number,
keyed in a table beside the panels with their figures; below, the history of the validation
hypervolume of front + zoo against trial number and wall-clock time (:mod:`._history`). The
title is wrapped to the figure's width. Labels are placed by :func:`._labels.label_offsets`
once the layout is final, from their measured extents, so that no two overlap.
"""

from __future__ import annotations

import io
import textwrap
from typing import Any

import optuna
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from optuna.trial import TrialState

from ._history import HypervolumeHistory, draw_history, hypervolume_history
from ._labels import is_far, label_offsets, labelled, text_anchor
from ._plot import Mark, Panel, human, panels

__all__ = ["plot_figure", "plot_png"]

_STAR, _SMALL_STAR, _DOT = 260, 90, 36  # marker areas, points squared


def _errorbars(ax: Any, marks: list[Mark], **style: Any) -> None:
    marks = [m for m in marks if m.interval is not None]
    if marks:
        low = [m.y - m.interval[0] for m in marks if m.interval]
        high = [m.interval[1] - m.y for m in marks if m.interval]
        ax.errorbar(
            [m.x for m in marks], [m.y for m in marks], yerr=[low, high], fmt="none", **style
        )


def _draw(ax: Any, panel: Panel, overview: bool = False) -> None:
    if panel.others:
        ax.scatter(*zip(*panel.others, strict=True), s=12, c="0.82", label="other trials")
    if panel.infeasible:  # drawn apart, or a trial off the front looks like a bug
        ax.scatter(
            *zip(*panel.infeasible, strict=True), s=16, c="0.7", marker="x", label="infeasible"
        )
    line = panel.staircase()
    ax.step([m.x for m in line], [m.y for m in line], where="post", c="C0", zorder=2)
    zoo_line = panel.zoo_staircase()
    if len(zoo_line) > 1:
        xs, ys = [m.x for m in zoo_line], [m.y for m in zoo_line]
        ax.step(xs, ys, where="post", c="C3", ls="--", lw=1.2, zorder=2, label="zoo's own front")
    for faint, alpha in ((False, 1.0), (True, 0.35)):
        marks = [m for m in panel.front if m.faint == faint]
        if not marks:
            continue
        if not overview:
            _errorbars(ax, marks, ecolor="C0", elinewidth=1, capsize=2, alpha=alpha, zorder=2)
        label = "front (dominated here)" if faint else "Pareto front (chosen on validation)"
        ax.scatter(
            [m.x for m in marks],
            [m.y for m in marks],
            s=_DOT * (0.5 if overview else 1),
            c="C0",
            edgecolors="k",
            linewidths=0.5,
            alpha=alpha,
            zorder=3,
            label=label,
        )
    if panel.zoo:
        if not overview:
            _errorbars(ax, panel.zoo, ecolor="C3", elinewidth=1, capsize=3, zorder=3)
        ax.scatter(
            [m.x for m in panel.zoo],
            [m.y for m in panel.zoo],
            marker="*",
            s=_SMALL_STAR if overview else _STAR,
            c="C3",
            edgecolors="k",
            zorder=4,
            label="zoo models (numbered as in the table)",
        )
    if panel.log_x():
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: human(v)))
    ax.margins(0.08)
    ax.grid(alpha=0.3)


def _place_labels(
    ax: Any, panel: Panel, renderer: Any, low: float, high: float, star: float = _STAR
) -> None:
    """Label the marks of ``panel`` with y in [low, high]; run once the layout is final."""
    scale = ax.figure.dpi / 72
    ax.get_xlim(), ax.get_ylim()  # settles the lazy autoscale before reading positions

    def to_pt(m: Mark) -> tuple[float, float]:
        x, y = ax.transData.transform((m.x, m.y)) / scale
        return float(x), float(y)

    items = [(m, t, s) for m, t, s in labelled(panel) if low <= m.y <= high]
    anchors = []
    for m, text, size in items:
        probe = ax.text(0, 0, text, fontsize=size, weight="bold")
        extent = probe.get_window_extent(renderer)
        probe.remove()
        anchors.append((*to_pt(m), extent.width / scale, extent.height / scale))
    big = star**0.5 / 2 + 1  # a marker's area is in points squared
    dots = [(*to_pt(m), big) for m in panel.zoo] + [(*to_pt(m), 4.0) for m in panel.front]
    box = ax.bbox
    bounds = (box.x0 / scale, box.y0 / scale, box.x1 / scale, box.y1 / scale)
    offsets = label_offsets(anchors, dots, bounds)
    for (m, text, size), (dx, dy), (*_, h) in zip(items, offsets, anchors, strict=True):
        ax.annotate(
            text,
            (m.x, m.y),
            xytext=(dx, dy),
            textcoords="offset points",
            ha=text_anchor(dx),
            va="bottom",
            fontsize=size,
            alpha=0.5 if m.faint else 1.0,
            weight="bold",
            color="C3" if m.key else "k",
            zorder=5,
            arrowprops=dict(arrowstyle="-", lw=0.5, color="0.45", shrinkA=0, shrinkB=4)
            if is_far(dx, dy, h)
            else None,
        )


def _zoo_table(drawn: list[Panel]) -> str:
    """The key to the zoo's numbers: number, name, accuracy on each split, cost."""
    by_split = {p.split: {m.label: m for m in p.zoo} for p in drawn}
    marks = {m.label: m for p in drawn for m in p.zoo}
    lines = [f"{'#':>2} {'zoo model':<20} {'val acc':>7} {'test acc':>8} {'cost':>6}"]
    for m in sorted(marks.values(), key=lambda m: (len(m.key), m.key)):
        val, test = (by_split.get(split, {}).get(m.label) for split in ("val", "test"))
        name = m.label if len(m.label) <= 20 else m.label[:19] + "…"
        lines.append(
            f"{m.key:>2} {name:<20} {'-' if val is None else format(val.y, '.4f'):>7} "
            f"{'-' if test is None else format(test.y, '.4f'):>8} {human(m.x):>6}"
        )
    return "\n".join(lines)


def plot_figure(
    study: optuna.Study,
    heading: str,
    note: str | None = None,
    history: HypervolumeHistory | None = None,
) -> Figure:
    """The figure of ``pareto.png`` (see the module docstring), labels placed."""
    drawn = panels(study)[::-1]  # the test panel, what a reader wants, comes first
    history = history if history is not None else hypervolume_history(study)
    zooms = [p.top_range() for p in drawn]
    has_zoo = any(p.zoo for p in drawn)
    n = max(1, len(drawn))
    heights = [3.4] + ([1.3] if any(zooms) else []) + ([1.5] if drawn else [])
    widths = [6.0] * n + ([3.4] if has_zoo else [])
    # Figure + FigureCanvasAgg instead of pyplot: the process-wide backend and figure registry
    # of whoever imports us stay untouched.
    width = sum(widths) + 1.2
    title = textwrap.fill(heading, width=int(width * 72 / (0.6 * 11)))
    top = 0.35 + 0.2 * title.count("\n") + 0.3  # inches: the title's lines, a panel's title
    bottom = 0.65 + (0.2 if note is not None else 0.0)  # a panel's x label and ticks
    height = 1.45 * sum(heights) + top + bottom
    fig = Figure(figsize=(width, height), dpi=110)
    canvas = FigureCanvasAgg(fig)
    fig.suptitle(title, fontsize=11, y=1 - 0.12 / height, va="top")
    if not drawn:
        ax = fig.add_subplot()
        why = (
            "no completed trial"
            if not study.get_trials(states=(TrialState.COMPLETE,))
            else "no minimised/maximised pair to plot"
        )
        ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    # a fixed layout, in inches: the labels are placed before the one draw, from final positions
    grid = fig.add_gridspec(
        len(heights),
        len(widths),
        height_ratios=heights,
        width_ratios=widths,
        left=0.8 / width,
        right=1 - 0.4 / width,
        top=1 - top / height,
        bottom=bottom / height,
        hspace=0.85 / (1.45 * sum(heights) / len(heights)),
        wspace=0.9 / (sum(widths) / len(widths)),
    )
    mains: list[Any] = []
    overviews: list[Any] = []  # None where a panel is not zoomed
    for i, (panel, zoom) in enumerate(zip(drawn, zooms, strict=True)):
        ax = fig.add_subplot(grid[0, i] if zoom or not any(zooms) else grid[0:2, i])
        _draw(ax, panel)
        ax.set_title(textwrap.fill(panel.title, width=70), fontsize=10)
        ax.set_ylabel(panel.ylabel)
        mains.append(ax)
        if zoom is None:
            ax.set_xlabel(panel.xlabel + (" (log scale)" if panel.log_x() else ""))
            overviews.append(None)
            continue
        pad = 0.04 * (zoom[1] - zoom[0])
        ax.set_ylim(zoom[0], zoom[1] + pad)
        low = fig.add_subplot(grid[1, i], sharex=ax)
        _draw(low, panel, overview=True)
        low.axhspan(zoom[0], zoom[1] + pad, color="C0", alpha=0.08, zorder=0)
        low.set_title("the whole range (shaded: the panel above)", fontsize=8)
        low.set_xlabel(panel.xlabel + (" (log scale)" if panel.log_x() else ""))
        low.tick_params(labelsize=7)
        overviews.append(low)
    hist = grid[-1, :n].subgridspec(1, 2, wspace=0.08)
    by_trial = fig.add_subplot(hist[0, 0])
    draw_history(by_trial, fig.add_subplot(hist[0, 1], sharey=by_trial), history)
    if has_zoo:
        side = grid[:, n].subgridspec(2, 1, height_ratios=[1, 2.2])
        key = fig.add_subplot(side[0, 0])
        key.set_axis_off()
        handles: dict[str, Any] = {}
        for ax in mains:
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                handles.setdefault(label, handle)
        key.legend(handles.values(), handles.keys(), loc="upper left", fontsize=7.5, frameon=False)
        table = fig.add_subplot(side[1, 0])
        table.set_axis_off()
        table.text(0, 1, _zoo_table(drawn), va="top", family="monospace", fontsize=7.5)
    else:
        mains[0].legend(loc="lower right", fontsize=7)
    if note is not None:
        fig.text(0.5, 0.06 / height, note, ha="center", va="bottom", fontsize=8, color="0.3")
    renderer = canvas.get_renderer()
    inf = float("inf")
    for ax, low_ax, panel, zoom in zip(mains, overviews, drawn, zooms, strict=True):
        _place_labels(ax, panel, renderer, *(zoom or (-inf, inf)))
        if low_ax is not None and zoom is not None:
            # the overview labels what the main panel does not show
            _place_labels(low_ax, panel, renderer, -inf, zoom[0] - 1e-12, _SMALL_STAR)
    return fig


def plot_png(
    study: optuna.Study,
    heading: str,
    note: str | None = None,
    history: HypervolumeHistory | None = None,
) -> bytes:
    """``pareto.png``: :func:`plot_figure` as PNG bytes."""
    buf = io.BytesIO()
    plot_figure(study, heading, note, history).savefig(buf, format="png")
    return buf.getvalue()
