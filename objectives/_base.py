"""The objective registry: named quantities a study optimises, each with its direction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from stitch_nas.errors import ConfigError, UnknownNameError
from stitch_nas.measure import Measurement

__all__ = ["Direction", "Objective", "register_objective", "get_objective", "list_objectives"]

Direction = Literal["maximize", "minimize"]  # Optuna's words

_REGISTRY: dict[str, Objective] = {}


@dataclass(frozen=True)
class Objective:
    """A value read off a Measurement, maximised or minimised.

    Attributes:
        name: registry key, used on the command line and in reports.
        direction: "maximize" or "minimize" (Optuna's words).
        value: reads the value from a Measurement.
        needs_latency: the measurement must time the network (costs a few forward passes).
        doc: one line shown by ``stitch-nas`` and in reports.
    """

    name: str
    direction: Direction
    value: Callable[[Measurement], float]
    needs_latency: bool = False
    doc: str = ""


def register_objective(objective: Objective) -> Objective:
    """Add an objective; a duplicate name is an error (nothing is silently replaced)."""
    if objective.direction not in ("maximize", "minimize"):
        raise ConfigError(
            f"objective {objective.name!r} has direction {objective.direction!r}; "
            "use 'maximize' or 'minimize'"
        )
    if objective.name in _REGISTRY:
        raise ConfigError(f"objective {objective.name!r} is already registered; pick a new name")
    _REGISTRY[objective.name] = objective
    return objective


def get_objective(name: str) -> Objective:
    if name not in _REGISTRY:
        raise UnknownNameError(
            f"unknown objective {name!r}; available: {', '.join(sorted(_REGISTRY))}"
        )
    return _REGISTRY[name]


def list_objectives() -> list[str]:
    return sorted(_REGISTRY)
