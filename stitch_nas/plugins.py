"""The registries that plug-in packages fill: search spaces, objectives and heads.

The core owns these registries; ``search_spaces`` and ``objectives`` (and any third-party
package) register into them, and are found through the entry-point groups
``stitch_nas.spaces`` and ``stitch_nas.objectives`` (see ``pyproject.toml``). Nothing in the
core imports a plug-in package by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .errors import ConfigError
from .registry import Registry

__all__ = [
    "HEADS",
    "OBJECTIVES",
    "SPACES",
    "Direction",
    "Objective",
    "SpaceFn",
    "register_objective",
]

Direction = Literal["maximize", "minimize"]  # Optuna's words

#: a define-by-run search space: ``(trial, ctx, **options) -> StitchConfig``
SpaceFn = Callable[..., Any]

SPACES: Registry[SpaceFn] = Registry("search space", group="stitch_nas.spaces")

#: heads for a new label space (``HeadSpec.kind`` other than "native"); the built-in ``knn``
#: and ``linear_probe`` live in :mod:`stitch_nas.stitching` and register like a plug-in, so a
#: config names a head without importing torch
HEADS: Registry[Any] = Registry("head", group="stitch_nas.heads")


@dataclass(frozen=True)
class Objective:
    """A value read off a Measurement, maximised or minimised.

    Attributes:
        name: registry key, used on the command line and in reports.
        direction: "maximize" or "minimize" (Optuna's words).
        value: reads the value from a :class:`stitch_nas.Measurement` (typed loosely here so
            that this module, which configs import, stays free of torch).
        needs_latency: the measurement must time the network (costs a few forward passes).
        doc: one line shown by ``stitch-nas`` and in reports.
    """

    name: str
    direction: Direction
    value: Callable[[Any], float]
    needs_latency: bool = False
    doc: str = ""


OBJECTIVES: Registry[Objective] = Registry("objective", group="stitch_nas.objectives")


def register_objective(objective: Objective) -> Objective:
    """Add an objective; a duplicate name is an error (nothing is silently replaced)."""
    if objective.direction not in ("maximize", "minimize"):
        raise ConfigError(
            f"objective {objective.name!r} has direction {objective.direction!r}; "
            "use 'maximize' or 'minimize'"
        )
    return OBJECTIVES.register(objective.name, objective)
