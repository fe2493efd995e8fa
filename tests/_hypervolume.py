"""An independent reference for hypervolumes: brute force on the grid the points span.

It shares nothing with ``stitch_nas.report.hypervolume`` (a sweep, sliced along the last
objective) or with Optuna's private ``optuna._hypervolume`` (which the tests no longer import:
a private module that moved would have skipped the only independent check silently).
"""

from __future__ import annotations

import numpy as np


def grid_hypervolume(points: np.ndarray, ref: np.ndarray) -> float:
    """Hypervolume for minimisation by brute force, independent of any sweep: cut the box at
    every coordinate any point has, and add up the cells some point dominates (a cell is
    covered by the union of boxes [p, ref] iff some p is at or below its lowest corner)."""
    inside = points[np.all(points < ref, axis=1)]
    if len(inside) == 0:
        return 0.0
    edges = [np.unique(np.append(inside[:, d], ref[d])) for d in range(len(ref))]
    lows = np.stack(np.meshgrid(*[e[:-1] for e in edges], indexing="ij"), axis=-1)
    sizes = np.meshgrid(*[np.diff(e) for e in edges], indexing="ij")
    covered = np.zeros(lows.shape[:-1], dtype=bool)
    for p in inside:
        covered |= np.all(p <= lows, axis=-1)
    return float(np.sum(np.prod(sizes, axis=0)[covered]))
