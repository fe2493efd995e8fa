"""Where the labels of a panel go: next to their mark, clear of other labels and marks.

A deterministic greedy placement (no randomness, no iteration to a fixed point): labels are
placed in order, each at the first candidate position whose box covers no earlier label, no
mark, does not leave the axes and lies nearer its own mark than any other (or a reader pairs a
number with the wrong star); the candidates are eight spots right next to the mark, then
rings further out in eight directions (the figure draws a thin leader line to a far label).
When every candidate collides, the one with the least overlap wins.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ._plot import Mark, Panel

__all__ = ["LEADER", "is_far", "label_offsets", "labelled", "text_anchor"]

# next to the mark, in points (dx: left edge, or right edge when negative; dy: bottom edge)
_NEAR = ((7, 3), (7, -11), (-7, 3), (-7, -11), (7, 12), (7, -20), (-7, 12), (-7, -20))
_DIRECTIONS = ((1, 0), (1, 1), (0, 1), (-1, 1), (-1, 0), (-1, -1), (0, -1), (1, -1))
_RINGS = (14.0, 24.0, 36.0, 50.0, 66.0)
LEADER = 13.0  #: labels further than this from their mark (points) get a leader line

Box = tuple[float, float, float, float]


def _overlap(a: Box, b: Box) -> float:
    """The area two boxes (left, bottom, right, top) share; 0 when they only touch."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


def _candidates(w: float, h: float) -> list[tuple[float, float]]:
    out = [(float(dx), float(dy)) for dx, dy in _NEAR]
    for r in _RINGS:
        for cx, cy in _DIRECTIONS:
            dx = 0.0 if cx == 0 else cx * r
            out.append((dx, cy * (0.8 * r + h / 2) - h / 2))
    return out


def text_anchor(dx: float) -> str:
    """Which edge of the label ``dx`` gives: "left" (dx > 0), "right" (dx < 0) or "center"."""
    return "left" if dx > 0 else ("right" if dx < 0 else "center")


def _box(x: float, y: float, w: float, h: float, dx: float, dy: float, pad: float) -> Box:
    left = x + dx - (w if dx < 0 else (w / 2 if dx == 0 else 0))
    return (left - pad, y + dy - pad, left + w + pad, y + dy + h + pad)


def label_offsets(
    anchors: Sequence[tuple[float, float, float, float]],
    dots: Sequence[tuple[float, ...]],
    bounds: Box | None = None,
    pad: float = 1.0,
) -> list[tuple[float, float]]:
    """Offsets (dx, dy) for labels at ``anchors`` (x, y, text width, text height; y pointing
    up, one unit, points in the figure): dx is the label's left edge (its right edge when
    negative, its centre when 0, see :func:`text_anchor`), dy its bottom edge, from the mark.

    Args:
        anchors: One per label, in the order they are placed (the first get the best spots).
        dots: The marks to keep clear: (x, y) with a half size of 5, or (x, y, half size).
        bounds: (left, bottom, right, top) a label must stay inside, if any.
        pad: Space kept around each label.
    """
    marks: list[Box] = []
    centres = [(dot[0], dot[1]) for dot in dots]
    for dot in dots:
        r = dot[2] if len(dot) > 2 else 5.0
        marks.append((dot[0] - r, dot[1] - r, dot[0] + r, dot[1] + r))
    placed: list[Box] = []
    out: list[tuple[float, float]] = []
    for x, y, w, h in anchors:
        best: tuple[float, tuple[float, float], Box] | None = None
        for dx, dy in _candidates(w, h):
            box = _box(x, y, w, h, dx, dy, pad)
            outside = bounds is not None and (
                box[0] < bounds[0] or box[1] < bounds[1] or box[2] > bounds[2] or box[3] > bounds[3]
            )
            cost = 10 * sum(_overlap(box, p) for p in placed) + sum(_overlap(box, m) for m in marks)
            cost += 1e6 if outside else 0.0
            cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
            own = math.hypot(cx - x, cy - y)
            if any(math.hypot(cx - u, cy - v) < own - 0.5 for u, v in centres):
                cost += 40.0  # nearer another mark than its own
            if best is None or cost < best[0]:
                best = (cost, (dx, dy), box)
            if cost == 0:
                break
        if best is None:  # the offsets tried are a fixed, non-empty list
            raise ValueError("no label offset was tried")
        placed.append(best[2])
        out.append(best[1])
    return out


def is_far(dx: float, dy: float, h: float) -> bool:
    """Whether a label at (dx, dy) sits far enough from its mark to need a leader line."""
    return math.hypot(dx, dy + h / 2) > LEADER + h


def labelled(panel: Panel) -> list[tuple[Mark, str, float]]:
    """The marks that get a label, its text and font size: zoo models (their number), then the
    stitched networks (their trial number)."""
    zoo = [(m, m.key or m.label, 8.5) for m in panel.zoo]
    return zoo + [(m, m.label, 7.0) for m in panel.front if m.stitched]
