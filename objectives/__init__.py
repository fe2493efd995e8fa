"""Objectives: what a stitch search maximises or minimises.

Register your own with :func:`register_objective`; every objective reads a
:class:`stitch_nas.stitching.Measurement`.
"""

from . import _builtin  # noqa: F401  (registers the built-in objectives)
from ._base import Objective, get_objective, list_objectives, register_objective

__all__ = ["Objective", "get_objective", "list_objectives", "register_objective"]
