"""The optional extras of ``pyproject.toml`` and the one way the code imports them.

The base install (``pip install -e .``) runs the whole main job: search, report, export to
safetensors and ``torch.export`` programs. Each extra adds one feature, and its packages are
imported only where that feature is used, through :func:`require`: a user who reaches for a
feature whose extra is missing gets one line naming the extra to install (a
:class:`MissingDependencyError`, exit code 2 from the CLI) instead of a failing
``import stitch_nas``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from stitch_nas.errors import MissingDependencyError

__all__ = ["EXTRAS", "require"]

#: extra -> (what it adds, the top-level modules it installs that the code may import).
#: ``tests/test_extras.py`` holds this equal to ``pyproject.toml``'s extras.
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ray": ("Ray workers (--executor ray) and the Ray Tune helpers", ("ray",)),
    "onnx": (
        "ONNX export (--format onnx), checked in onnxruntime",
        ("onnx", "onnxruntime", "onnxscript"),
    ),
    "postgres": ("PostgreSQL storages (--storage postgresql://...)", ("psycopg", "psycopg2")),
    "dashboard": ("optuna-dashboard, to browse a study (never imported by stitch_nas)", ()),
}


def require(extra: str, module: str, feature: str) -> ModuleType:
    """Import ``module``, or raise one line saying that ``feature`` needs ``extra``.

    Args:
        extra: The ``pyproject.toml`` extra that installs ``module`` (a key of :data:`EXTRAS`).
        module: What to import (``"ray"``, ``"onnx"``...).
        feature: What the user asked for, as they would recognise it (``"--executor ray"``).
    """
    if extra not in EXTRAS:  # a programming error: every extra is declared above
        raise KeyError(f"unknown extra {extra!r}")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise MissingDependencyError(
            f"{feature}: the {extra!r} extra is not installed ({detail}); "
            f"install it with pip install -e '.[{extra}]'"
        ) from exc
