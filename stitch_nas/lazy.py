"""Package faces that import each name on first use (PEP 562).

A face built this way costs nothing to import: a light name (an option list, a plug-in's
declared options) is read without loading torch, and a heavy one loads its module when it is
first used. Static checkers see the names through the face's ``if TYPE_CHECKING:`` imports.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_face"]


def lazy_face(
    package: str, homes: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``'s face: ``homes`` maps each public
    name to the module that defines it, relative to the package (``"._bodies"``)."""
    face = sys.modules[package]

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, package), name)
        setattr(face, name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(face), *homes})

    return __getattr__, __dir__
