"""Confidence intervals of accuracies measured on a finite number of images.

An accuracy measured on ``n`` images is ``k / n`` for ``k`` correct images. Its 95 % interval is
the Wilson score interval (Wilson 1927; no continuity correction): unlike the normal
approximation ``p +- 1.96 sqrt(p (1 - p) / n)`` it stays inside [0, 1] and does not shrink to a
point at 0 or 100 % accuracy. It treats the images as a sample of the distribution the split
was drawn from; it says nothing of other data sets.
"""

from __future__ import annotations

import math
from typing import Any

from stitch_nas import attrs
from stitch_nas.errors import ConfigError

__all__ = ["Z95", "accuracy_figures", "correct_count", "wilson_interval"]

#: the standard normal's 97.5 % quantile: a two-sided 95 % interval
Z95 = 1.959963984540054


def correct_count(accuracy: float, n: int) -> int:
    """The number of correct images behind ``accuracy`` measured on ``n`` images.

    Raises:
        ConfigError: If ``accuracy * n`` is not (within float rounding) a whole number of images
            in [0, n], i.e. the accuracy was not measured on ``n`` images.
    """
    if n < 1:
        raise ConfigError(f"an accuracy interval needs at least one image, got n={n}")
    k = round(accuracy * n)
    # accuracies are float32 means: k / n is exact to ~1e-7 relative, far below 1 / n here
    if not 0 <= k <= n or abs(accuracy * n - k) > 1e-3:
        raise ConfigError(
            f"accuracy {accuracy!r} is not a count of correct images out of {n}; "
            "was it measured on another split?"
        )
    return k


def wilson_interval(accuracy: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of an accuracy measured on ``n`` images.

    With ``p = k / n`` correct, the interval is
    ``(p + z^2 / 2n -+ z sqrt(p (1 - p) / n + z^2 / 4n^2)) / (1 + z^2 / n)``.

    Args:
        accuracy: The measured accuracy, ``k / n``.
        n: Number of images it was measured on.
        z: Standard normal quantile; the default gives a two-sided 95 % interval.

    Returns:
        ``(low, high)``, both in [0, 1].
    """
    p = correct_count(accuracy, n) / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def accuracy_figures(
    val_accuracy: float | None,
    n_val: int | None,
    test_accuracy: float | None,
    n_test: int | None,
) -> dict[str, Any]:
    """Validation and test accuracy with their image counts and 95 % Wilson intervals.

    The keys are those of ``pareto.json``, ``trials.csv`` and an export's ``meta.json``:
    ``accuracy``, ``val_images``, ``accuracy_interval``, ``test_accuracy``, ``test_images``,
    ``test_accuracy_interval``; an interval is None where the accuracy or the count is unknown.
    """

    def interval(acc: float | None, n: int | None) -> list[float] | None:
        return None if acc is None or not n else list(wilson_interval(acc, n))

    return {
        "accuracy": val_accuracy,
        "val_images": n_val,
        "accuracy_interval": interval(val_accuracy, n_val),
        attrs.TEST_ACCURACY: test_accuracy,
        "test_images": n_test,
        "test_accuracy_interval": interval(test_accuracy, n_test),
    }
