"""The search-space registry: define-by-run ``(trial, ctx, **options) -> StitchConfig``.

The registry belongs to the core (:mod:`stitch_nas.plugins`); this package fills it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna

from stitch_nas.activations import StitchContext
from stitch_nas.config import StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.plugins import SPACES, SpaceFn
from stitch_nas.registry import keyword_defaults

from ._options import SPACE_OPTIONS

__all__ = ["SpaceFn", "register_space", "get_space", "list_spaces", "sample"]


def register_space(name: str) -> Callable[[SpaceFn], SpaceFn]:
    """Decorator adding a space under ``name``; a duplicate name is an error.

    A space this package declares (:data:`._options.SPACE_OPTIONS`, what the settings check
    reads without torch) must take exactly the declared keyword options with their defaults.
    """

    def declared(fn: SpaceFn) -> None:
        options = keyword_defaults(fn)
        if name in SPACE_OPTIONS and options != SPACE_OPTIONS[name]:
            raise ConfigError(
                f"search space {name!r} takes options {options}, but "
                f"search_spaces/_options.py declares {SPACE_OPTIONS[name]}; make them equal"
            )

    return SPACES.register(name, check=declared)


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
