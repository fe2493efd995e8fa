"""The search-space registry: define-by-run ``(trial, ctx, **options) -> StitchConfig``.

The registry belongs to the core (:mod:`stitch_nas.plugins`); this package fills it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna

from stitch_nas.activations import StitchContext
from stitch_nas.config import StitchConfig
from stitch_nas.plugins import SPACES, SpaceFn

__all__ = ["SpaceFn", "register_space", "get_space", "list_spaces", "sample"]


def register_space(name: str) -> Callable[[SpaceFn], SpaceFn]:
    """Decorator adding a space under ``name``; a duplicate name is an error."""
    return SPACES.register(name)


def get_space(name: str) -> SpaceFn:
    """The space ``name``; raises UnknownNameError listing the available ones."""
    return SPACES.get(name)


def list_spaces() -> list[str]:
    return SPACES.list()


def sample(
    space: str | SpaceFn, trial: optuna.Trial, ctx: StitchContext, **options: Any
) -> StitchConfig:
    fn = get_space(space) if isinstance(space, str) else space
    return fn(trial, ctx, **options)
