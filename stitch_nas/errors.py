"""The one exception hierarchy of stitch_nas.

Every error a user can cause derives from :class:`StitchNASError` and, where it fits, from the
built-in type a caller would expect (``KeyError`` for an unknown name, ``ValueError`` for a bad
value), so ``except KeyError`` keeps working. Messages name the bad value and say how to fix it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # no torch at import: the CLI reports user errors without loading it
    import torch

__all__ = [
    "StitchNASError",
    "UnknownModelError",
    "UnknownCutError",
    "UnknownNameError",
    "ConfigError",
    "LayoutError",
    "NonFiniteError",
    "SingularSystemError",
    "CacheError",
    "DataError",
    "BudgetError",
    "TraceError",
    "ExportError",
    "IntegrityError",
    "MissingDependencyError",
    "check_finite",
    "shorten",
]


class StitchNASError(Exception):
    """Base class of every error raised on purpose by stitch_nas."""


class UnknownNameError(StitchNASError, KeyError):
    """A name looked up in a registry does not exist."""

    def __str__(self) -> str:  # KeyError would wrap the message in quotes
        return str(self.args[0]) if self.args else ""


class UnknownModelError(UnknownNameError):
    """A model name is not in the zoo."""


class UnknownCutError(UnknownNameError):
    """A cut point name does not exist in the model."""


class ConfigError(StitchNASError, ValueError):
    """A configuration (YAML file, StitchConfig JSON, options) has a wrong key, type or value."""


class LayoutError(StitchNASError, ValueError):
    """Two tensor layouts cannot be joined by the requested adapter."""


class NonFiniteError(StitchNASError, ValueError):
    """NaN or Inf found in activations or in a fitted map."""


class SingularSystemError(StitchNASError, ValueError):
    """A least-squares system has no unique solution."""


class CacheError(StitchNASError, OSError):
    """An on-disk cache is unreadable or inconsistent."""


class DataError(StitchNASError, ValueError):
    """A data set, folder or split is missing or malformed."""


class BudgetError(StitchNASError, ValueError):
    """A budget that no configuration can meet."""


class TraceError(StitchNASError, RuntimeError):
    """torch.fx (or an exporter) could not trace a model."""


class ExportError(StitchNASError, ValueError):
    """A trial or network cannot be exported as asked (failed trial, unknown format, ...)."""


class IntegrityError(StitchNASError, ValueError):
    """An exported file is missing or does not match the sha256 recorded beside it."""


class MissingDependencyError(StitchNASError, ImportError):
    """An optional dependency (Ray, ONNX...) is needed and not installed."""


def check_finite(x: torch.Tensor, what: str) -> None:
    """Raise NonFiniteError if ``x`` holds NaN or Inf (a broken model or exploding stitch)."""
    # a sum is NaN or Inf whenever an element is, and costs one pass with no boolean copy; a
    # finite tensor whose sum overflows falls through to the exact test
    if x.is_floating_point() and bool(x.sum().isfinite()):
        return
    finite = x.isfinite()
    if not bool(finite.all()):
        bad = int((~finite).sum())
        raise NonFiniteError(
            f"{what} holds {bad} NaN/Inf values; check the model and its input normalisation"
        )


def shorten(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to about ``limit`` characters: a message quotes a bad value, never a
    megabyte of it."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 3]}... ({len(text):,} characters)"
