"""Interpolation headroom: how much a zoo's front leaves between its models, and how much of it
other networks fill.

SN-Net's stitches interpolate between anchors of different cost, and ReStNet's fill the budgets
between two networks: what stitching can add to a zoo lies between adjacent models of its front.
On a plot of accuracy against log10 MACs, the zoo's front is a staircase (the best accuracy at
no more MACs); the line joining two adjacent front models is what an interpolation between them
would reach. The *headroom* at a reference accuracy is the area between that line and the
staircase, above the reference, summed over the gaps of the front (units: accuracy x decades of
MACs). Other networks (stitched ones) *recover* the part of it their own staircase covers: the
area between the zoo's staircase and the staircase of the zoo with them, capped at the line: a
network counts from its own MACs up to the dearest front model's, and above the line only up to
the line. The share recovered is the ratio.

Computed exactly: on each gap, between the MACs where a staircase steps or the line crosses one
of their levels, every curve is constant or linear and never crosses another, so the trapezoid
rule is exact there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Headroom", "HeadroomGap", "interpolation_headroom"]


@dataclass(frozen=True)
class HeadroomGap:
    """The headroom between two adjacent models of the zoo's front."""

    low_macs: float  #: the cheaper model's MACs
    high_macs: float  #: the dearer model's MACs
    headroom: float  #: accuracy x decades of MACs between the line and the staircase
    recovered: float  #: the part of it the other networks cover


@dataclass(frozen=True)
class Headroom:
    """The interpolation headroom of a zoo's front at one reference accuracy."""

    reference: float
    gaps: tuple[HeadroomGap, ...]  #: by MACs; only gaps where the line rises above the reference

    @property
    def headroom(self) -> float:
        return sum(g.headroom for g in self.gaps)

    @property
    def recovered(self) -> float:
        return sum(g.recovered for g in self.gaps)

    @property
    def recovered_share(self) -> float | None:
        """``recovered / headroom``; None where there is no headroom."""
        return self.recovered / self.headroom if self.headroom > 0 else None


def _front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The non-dominated ``(accuracy, macs)`` points, by MACs (accuracy then rises)."""
    front: list[tuple[float, float]] = []
    for accuracy, macs in sorted(points, key=lambda p: (p[1], -p[0])):
        if not front or accuracy > front[-1][0]:
            front.append((accuracy, macs))
    return front


def interpolation_headroom(
    zoo: Sequence[tuple[float, float]],
    networks: Sequence[tuple[float, float]],
    reference: float,
) -> Headroom:
    """The headroom of ``zoo``'s front at ``reference`` and what ``networks`` recover of it.

    Args:
        zoo: ``(accuracy, macs)`` of the zoo's models (any order, dominated ones included).
        networks: ``(accuracy, macs)`` of the other networks (stitched ones).
        reference: The accuracy below which nothing counts.
    """
    bad = [macs for _, macs in [*zoo, *networks] if not macs > 0]
    if bad:
        raise ValueError(f"MACs {bad[0]!r} is not > 0: give each network its MACs (log10 axis)")
    front = _front(zoo)
    others = sorted((math.log10(m), a) for a, m in networks)
    gaps = []
    for (a0, m0), (a1, m1) in zip(front, front[1:], strict=False):
        if a1 <= reference:
            continue  # the line stays below the reference
        x0, x1 = math.log10(m0), math.log10(m1)
        floor = max(a0, reference)  # the zoo's staircase on the gap, or the reference

        def line(x: float, x0: float = x0, x1: float = x1, a0: float = a0, a1: float = a1) -> float:
            return a0 + (a1 - a0) * (x - x0) / (x1 - x0)

        def covered(x: float, a0: float = a0) -> float:
            """The staircase of the zoo with the other networks at log10 MACs ``x``."""
            return max([a0] + [a for xo, a in others if xo <= x])

        levels = {floor} | {a for _, a in others}
        cuts = {x0, x1} | {x for x, _ in others if x0 < x < x1}
        cuts |= {x0 + (v - a0) / (a1 - a0) * (x1 - x0) for v in levels if a0 < v < a1}
        xs = sorted(cuts)
        headroom = recovered = 0.0
        for left, right in zip(xs, xs[1:], strict=False):
            level = covered((left + right) / 2)  # constant inside the piece
            ends = (line(left), line(right))
            width = right - left
            headroom += width * sum(max(0.0, y - floor) for y in ends) / 2
            recovered += width * sum(max(0.0, min(level, y) - floor) for y in ends) / 2
        gaps.append(HeadroomGap(m0, m1, headroom, recovered))
    return Headroom(reference, tuple(gaps))
