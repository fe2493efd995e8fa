"""The objective registry: named quantities a study optimises, each with its direction.

The registry itself belongs to the core (:mod:`stitch_nas.plugins`); this package fills it.
"""

from __future__ import annotations

from stitch_nas.plugins import OBJECTIVES, Direction, Objective, register_objective

__all__ = ["Direction", "Objective", "register_objective", "get_objective", "list_objectives"]


def get_objective(name: str) -> Objective:
    """The objective ``name``; raises UnknownNameError listing the available ones."""
    return OBJECTIVES.get(name)


def list_objectives() -> list[str]:
    return OBJECTIVES.list()
