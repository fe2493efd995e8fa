"""Presets whose space is "pick one result of a procedure": run it once per context and options.

StitchNet's recursion, SN-Net's stitch set and Traft & Cheney's grid are deterministic given the
context and their options, and a space is sampled once per trial, so each procedure runs once
and is memoised in ``ctx.memo`` under its name and its (frozen) arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from stitch_nas.activations import StitchContext

__all__ = ["memoised"]

T = TypeVar("T")


def _frozen(value: Any) -> Any:
    """A hashable stand-in: lists become tuples, mappings sorted tuples of pairs."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def memoised(ctx: StitchContext, procedure: Callable[..., T], **options: Any) -> T:
    """``procedure(ctx, **options)``, computed once per context and options."""
    key = ("procedure", procedure.__module__, procedure.__qualname__, _frozen(options))
    if key not in ctx.memo:
        ctx.memo[key] = procedure(ctx, **options)
    return ctx.memo[key]
