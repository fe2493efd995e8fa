"""``report.html``: one self-contained page (no script, no dependency) with the report's tables
and the panels of ``pareto.png`` as inline SVG, whose points show each network's config on hover
(an SVG ``<title>``, which every browser shows as a tooltip).
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

import optuna

from stitch_nas import attrs

from ._claims import DOMINATION_RULE
from ._history import HypervolumeHistory, history_svg
from ._kinds import kind_text
from ._labels import label_offsets, labelled, text_anchor
from ._plot import Mark, Panel, human, panels

__all__ = ["report_html", "panel_svg"]

_W, _H = 560, 390
_LEFT, _RIGHT, _TOP, _BOTTOM = 62, 18, 30, 48
_FRONT, _ZOO = "#1f77b4", "#d62728"


def _nice_ticks(low: float, high: float, n: int = 5) -> list[float]:
    step = 10 ** math.floor(math.log10((high - low) / n)) if high > low else 1.0
    for mult in (1, 2, 5, 10):
        if (high - low) / (step * mult) <= n:
            step *= mult
            break
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step) + 1)]


def _log_ticks(low: float, high: float) -> list[float]:
    ticks = []
    for exp in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1):
        ticks += [m * 10**exp for m in (1, 2, 5) if low <= m * 10**exp <= high]
    return ticks


def _domain(values: list[float], log: bool) -> tuple[float, float]:
    if log:
        lo, hi = math.log10(min(values)), math.log10(max(values))
    else:
        lo, hi = min(values), max(values)
    pad = 0.08 * (hi - lo) if hi > lo else 0.5 * (abs(lo) or 1.0)
    return lo - pad, hi + pad


def _star(x: float, y: float, r: float = 9.0) -> str:
    points = []
    for k in range(10):
        radius = r if k % 2 == 0 else r * 0.42
        angle = math.pi / 2 + k * math.pi / 5
        points.append(f"{x + radius * math.cos(angle):.1f},{y - radius * math.sin(angle):.1f}")
    return " ".join(points)


def panel_svg(panel: Panel) -> str:
    """One panel as an SVG element."""
    y_range = _y_range(panel)
    log = panel.log_x()
    xs = [m.x for m in panel.front + panel.zoo] + [x for x, _ in panel.others + panel.infeasible]
    xs = [x for x in xs if x > 0] if log else xs
    x0, x1 = _domain(xs, log)
    y0, y1 = y_range

    def px(x: float) -> float:
        v = math.log10(x) if log else x
        return _LEFT + (v - x0) / (x1 - x0) * (_W - _LEFT - _RIGHT)

    def py(y: float) -> float:
        return _TOP + (y1 - y) / (y1 - y0) * (_H - _TOP - _BOTTOM)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'viewBox="0 0 {_W} {_H}" font-family="sans-serif" font-size="11">'
    ]
    out.append(
        f'<text x="{_W / 2}" y="16" text-anchor="middle" font-size="13">'
        f"{escape(panel.title)}</text>"
    )
    bottom, right = _H - _BOTTOM, _W - _RIGHT
    xticks = _log_ticks(10**x0, 10**x1) if log else _nice_ticks(x0, x1)
    for t in xticks:
        out.append(
            f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{_TOP}" y2="{bottom}" stroke="#e6e6e6"/>'
        )
        out.append(
            f'<text x="{px(t):.1f}" y="{bottom + 14}" text-anchor="middle">{human(t)}</text>'
        )
    for t in _nice_ticks(y0, y1):
        out.append(
            f'<line x1="{_LEFT}" x2="{right}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#e6e6e6"/>'
        )
        out.append(f'<text x="{_LEFT - 5}" y="{py(t) + 4:.1f}" text-anchor="end">{t:.2f}</text>')
    out.append(
        f'<rect x="{_LEFT}" y="{_TOP}" width="{right - _LEFT}" height="{bottom - _TOP}" '
        'fill="none" stroke="#888"/>'
    )
    out.append(
        f'<text x="{(_LEFT + right) / 2}" y="{_H - 10}" text-anchor="middle">'
        f"{escape(panel.xlabel)}{' (log scale)' if log else ''}</text>"
    )
    out.append(
        f'<text transform="translate(14 {(_TOP + bottom) / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(panel.ylabel)}</text>'
    )
    for x, y in panel.others:
        out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="#c8c8c8"/>')
    for x, y in panel.infeasible:
        out.append(
            f'<text x="{px(x):.1f}" y="{py(y) + 4:.1f}" text-anchor="middle" fill="#aaa">x</text>'
        )
    # the front's staircase, and the zoo's own front dashed
    for line, style in (
        (panel.staircase(), f'stroke="{_FRONT}"'),
        (panel.zoo_staircase(), f'stroke="{_ZOO}" stroke-dasharray="5 3"'),
    ):
        if line:
            steps = [f"M{px(line[0].x):.1f},{py(line[0].y):.1f}"]
            for b in line[1:]:
                steps.append(f"H{px(b.x):.1f}V{py(b.y):.1f}")
            out.append(f'<path d="{"".join(steps)}" fill="none" {style}/>')
    for m in panel.front:
        out.append(_mark(m, px, py, _FRONT, star=False))
    for m in panel.zoo:
        out.append(_mark(m, px, py, _ZOO, star=True))
    # SVG's y points down: the placement works with y up, so flip it there and back
    items = labelled(panel)
    anchors = [(px(m.x), -py(m.y), 0.62 * size * len(text), size) for m, text, size in items]
    dots = [(px(m.x), -py(m.y)) for m in panel.front + panel.zoo]
    for (m, text, size), (dx, dy) in zip(items, label_offsets(anchors, dots), strict=True):
        anchor = {"left": "start", "right": "end", "center": "middle"}[text_anchor(dx)]
        weight = ' font-weight="bold"' if size > 8 else ""
        out.append(
            f'<text x="{px(m.x) + dx:.1f}" y="{py(m.y) - dy:.1f}" font-size="{size:g}" '
            f'text-anchor="{anchor}"{weight} opacity="{0.5 if m.faint else 1}">'
            f"{escape(text)}</text>"
        )
    out.append("</svg>")
    return "\n".join(out)


def _mark(m: Mark, px: Any, py: Any, colour: str, *, star: bool) -> str:
    x, y = px(m.x), py(m.y)
    opacity = 0.35 if m.faint else 1.0
    parts = [f'<g opacity="{opacity}"><title>{escape(m.tip or m.label)}</title>']
    if m.interval is not None:
        lo, hi = py(m.interval[0]), py(m.interval[1])
        parts.append(
            f'<path d="M{x:.1f},{lo:.1f}V{hi:.1f}M{x - 3:.1f},{lo:.1f}h6M{x - 3:.1f},'
            f'{hi:.1f}h6" stroke="{colour}"/>'
        )
    if star:
        parts.append(f'<polygon points="{_star(x, y)}" fill="{colour}" stroke="black"/>')
    else:
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{colour}" stroke="black" '
            'stroke-width="0.5"/>'
        )
    parts.append("</g>")
    return "".join(parts)


def _y_range(panel: Panel) -> tuple[float, float]:
    ys = [y for _, y in panel.others + panel.infeasible]
    for m in panel.front + panel.zoo:
        ys += [m.y, *(m.interval or ())]
    return _domain(ys, log=False)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _acc(row: dict[str, Any], key: str, interval: str) -> list[str]:
    value, bounds = row.get(key), row.get(interval)
    text = "-" if value is None else f"{value:.4f}"
    return [text, "-" if not bounds else f"{bounds[0]:.3f} – {bounds[1]:.3f}"]


def _figures(row: dict[str, Any]) -> list[str]:
    acc = _acc(row, "accuracy", "accuracy_interval")
    test = _acc(row, attrs.TEST_ACCURACY, "test_accuracy_interval")
    return [*acc, *test, human(row.get("macs")), human(row.get("params"))]


_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 3px 7px; text-align: right; }
td:last-child, th:last-child { text-align: left; }
.note { color: #555; font-size: 13px; max-width: 70em; }
"""


def report_html(
    study: optuna.Study,
    heading: str,
    front: list[dict[str, Any]],
    references: list[dict[str, Any]],
    lines: list[str],
    history: HypervolumeHistory,
) -> str:
    """The page: heading, panels, the hypervolume history, front and zoo tables (rows of
    ``pareto.json``), then ``lines`` (hypervolumes and claims, as the terminal prints them)."""
    drawn = panels(study)[::-1]  # test first, as in pareto.png
    figures = "<p>no completed trial to draw</p>"
    if drawn:
        figures = "\n".join(panel_svg(p) for p in drawn)
    cols = ["val acc", "95% interval", "test acc", "95% interval", "MACs", "params"]
    front_table = _table(
        ["trial", *cols, "kind", "network"],
        [[f"#{r['number']}", *_figures(r), kind_text(r.get("kind")), r["describe"]] for r in front],
    )
    keys = {m.label: m.key for p in drawn for m in p.zoo}  # the numbers on the panels
    zoo = _table(
        ["#", "zoo model", *cols],
        [[keys.get(str(r["name"]), ""), str(r["name"]), *_figures(r)] for r in references],
    )
    text = "\n".join(escape(line) for line in lines)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(heading)}</title>
<style>{_STYLE}</style></head><body>
<h1>{escape(heading)}</h1>
<p class="note">Hover a point for its network and config. Kinds: "stitched" when every model
contributes a block of its own; "new head" / "new stem" when one model only lends its head
(pooling and classifier, or a pooled cut onward) or its stem. Error bars and intervals: 95 % Wilson
score intervals on the number of images of each split. The front is chosen on validation; the
test split is used by no choice of the search.</p>
{figures}
<h2>Hypervolume history</h2>
<p class="note">Blue: the validation hypervolume of front + zoo once each trial had ended
(fine-tuned networks count at their own trial); dashed red: the zoo's models alone. The last
line under "Hypervolumes and claims" says how much the last 20 % of trials added.</p>
{history_svg(history)}
<h2>Pareto front (chosen on validation)</h2>
{front_table}
<h2>Zoo models</h2>
{zoo}
<h2>Hypervolumes and claims</h2>
<pre>{text}</pre>
<p class="note">Rule: {escape(DOMINATION_RULE)}.</p>
</body></html>
"""
