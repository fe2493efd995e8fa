"""The docs build's own scripts (``docs/_scripts``: not a package), loaded from their files."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "docs" / "_scripts"


def load_docs_script(name: str) -> ModuleType:
    """The module ``docs/_scripts/<name>.py``, loaded once per process."""
    if f"docs_{name}" in sys.modules:
        return sys.modules[f"docs_{name}"]
    spec = importlib.util.spec_from_file_location(f"docs_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
