"""Interpolation headroom (stitch_nas.report._headroom): exact areas on hand-made fronts, and
the same as a fine numeric integration on random ones."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stitch_nas.report import interpolation_headroom

# a cheap weak model and a dear strong one, one decade of MACs apart
ZOO = [(0.6, 1e6), (0.9, 1e7)]


def test_the_headroom_of_one_gap_is_the_triangle_under_its_line() -> None:
    h = interpolation_headroom(ZOO, [], 0.6)
    assert h.headroom == pytest.approx(0.5 * 1.0 * 0.3)
    assert h.recovered == 0 and h.recovered_share == 0
    # above a higher reference only the part of the triangle above it counts
    assert interpolation_headroom(ZOO, [], 0.75).headroom == pytest.approx(0.5 * 0.5 * 0.15)
    assert interpolation_headroom(ZOO, [], 0.9).gaps == ()
    assert interpolation_headroom(ZOO, [], 0.9).recovered_share is None


def test_networks_recover_what_their_staircase_covers_up_to_the_line() -> None:
    # at half a decade, on the line: covers the band from 0.6 to 0.75 for the second half
    assert interpolation_headroom(ZOO, [(0.75, 10**6.5)], 0.6).recovered_share == pytest.approx(0.5)
    # the same network adds nothing above its own accuracy
    assert interpolation_headroom(ZOO, [(0.75, 10**6.5)], 0.75).recovered == pytest.approx(0)
    # as accurate as the dear model from half a decade on: all of the headroom above 0.75
    assert interpolation_headroom(ZOO, [(0.9, 10**6.5)], 0.75).recovered_share == pytest.approx(1)
    # far above the line, at the cheap model's MACs: counted up to the line only
    assert interpolation_headroom(ZOO, [(1.0, 1e6)], 0.6).recovered_share == pytest.approx(1)
    # below the staircase, or dearer than the front's dearest model: nothing
    assert interpolation_headroom(ZOO, [(0.55, 10**6.5), (0.99, 2e7)], 0.6).recovered == 0


def test_dominated_zoo_models_and_ties_change_nothing() -> None:
    plain = interpolation_headroom(ZOO, [(0.8, 3e6)], 0.6)
    crowded = interpolation_headroom([*ZOO, (0.5, 5e6), (0.58, 1e6), (0.9, 2e7)], [(0.8, 3e6)], 0.6)
    assert (crowded.headroom, crowded.recovered) == pytest.approx((plain.headroom, plain.recovered))


def _numeric(zoo, nets, reference, n=200_001):  # type: ignore[no-untyped-def]
    """The same areas by the midpoint rule on a fine grid of log10 MACs."""
    front = sorted(zoo, key=lambda p: p[1])
    front = [p for p in front if not any(o[0] > p[0] and o[1] <= p[1] for o in zoo)]
    xs = np.log10([m for _, m in front])
    grid = np.linspace(xs[0], xs[-1], n)
    mid = (grid[1:] + grid[:-1]) / 2
    line = np.interp(mid, xs, [a for a, _ in front])
    stair = np.array([max(a for a, m in front if math.log10(m) <= x) for x in mid])
    floor = np.maximum(stair, reference)
    cover = np.array(
        [
            max([s] + [a for a, m in nets if math.log10(m) <= x])
            for s, x in zip(stair, mid, strict=True)
        ]
    )
    width = grid[1] - grid[0]
    headroom = np.clip(line - floor, 0, None).sum() * width
    recovered = np.clip(np.minimum(cover, line) - floor, 0, None).sum() * width
    return headroom, recovered


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_exact_areas_equal_a_fine_numeric_integration(seed: int) -> None:
    rng = np.random.default_rng(seed)
    zoo = [
        (float(a), float(m))
        for a, m in zip(rng.uniform(0.5, 0.95, 6), 10 ** rng.uniform(5, 8, 6), strict=True)
    ]
    nets = [
        (float(a), float(m))
        for a, m in zip(rng.uniform(0.4, 0.95, 12), 10 ** rng.uniform(5, 8, 12), strict=True)
    ]
    for reference in (0.5, 0.7, 0.8):
        h = interpolation_headroom(zoo, nets, reference)
        headroom, recovered = _numeric(zoo, nets, reference, n=20_001)
        assert h.headroom == pytest.approx(headroom, abs=1e-4)
        assert h.recovered == pytest.approx(recovered, abs=1e-4)


def test_macs_must_be_positive() -> None:
    with pytest.raises(ValueError, match="MACs 0.0 is not > 0"):
        interpolation_headroom(ZOO, [(0.7, 0.0)], 0.6)
