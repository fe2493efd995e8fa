"""The search-space registry: define-by-run ``(trial, ctx, **options) -> StitchConfig``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna

from stitch_nas.config import StitchConfig
from stitch_nas.context import StitchContext
from stitch_nas.errors import ConfigError, UnknownNameError

__all__ = ["SpaceFn", "register_space", "get_space", "list_spaces"]

SpaceFn = Callable[..., StitchConfig]
_REGISTRY: dict[str, SpaceFn] = {}


def register_space(name: str) -> Callable[[SpaceFn], SpaceFn]:
    """Decorator adding a space under ``name``; a duplicate name is an error."""

    def add(fn: SpaceFn) -> SpaceFn:
        if name in _REGISTRY:
            raise ConfigError(f"search space {name!r} is already registered; pick a new name")
        _REGISTRY[name] = fn
        return fn

    return add


def get_space(name: str) -> SpaceFn:
    if name not in _REGISTRY:
        raise UnknownNameError(
            f"unknown search space {name!r}; available: {', '.join(sorted(_REGISTRY))}"
        )
    return _REGISTRY[name]


def list_spaces() -> list[str]:
    return sorted(_REGISTRY)


def sample(space: str | SpaceFn, trial: optuna.Trial, ctx: StitchContext, **options: Any):
    fn = get_space(space) if isinstance(space, str) else space
    return fn(trial, ctx, **options)
