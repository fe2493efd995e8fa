"""Presets whose space is "pick one result of a procedure": run it once per context and options.

StitchNet's recursion, SN-Net's stitch set and Traft & Cheney's grid are deterministic given the
context and their options, and a space is sampled once per trial, so each procedure runs once
and is memoised on the context under its name and its (frozen) arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from stitch_nas.activations import Memo, StitchContext

__all__ = ["memoised"]

T = TypeVar("T")

_RESULTS: Memo[tuple[Any, ...], Any] = Memo("procedure results")


def _frozen(value: Any) -> Any:
    """A hashable stand-in: lists become tuples, mappings sorted tuples of pairs."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def memoised(ctx: StitchContext, procedure: Callable[..., T], **options: Any) -> T:
    """``procedure(ctx, **options)``, computed once per context and options."""
    key = (procedure.__module__, procedure.__qualname__, _frozen(options))
    return cast(T, _RESULTS.fetch(ctx, key, lambda: procedure(ctx, **options)))
