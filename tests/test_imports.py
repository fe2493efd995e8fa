"""Tests of the package's shape: no import circle, plug-ins kept out of the core, a light face.

The import graph is read statically (every ``import`` statement, at module level or inside a
function), so a circle hidden behind a function-level import is found too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("stitch_nas", "search_spaces", "objectives")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _type_only(tree: ast.Module) -> set[int]:
    """Nodes inside ``if TYPE_CHECKING:`` blocks: read by type checkers, never run, so an
    annotation may name a module that imports this one without making a circle."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return inside


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules that ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    type_only = _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            submodules = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in known]
            # ``from pkg import mod`` depends on pkg.mod (pkg itself is always imported first)
            targets = submodules or [module]
        else:
            continue
        for target in targets:
            if target in known and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph``, or None. A package's face importing its own private
    modules is not a circle unless a private module imports the face back."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_package_has_no_import_circle():
    cycle = _cycle(_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_core_does_not_import_the_plug_in_packages():
    graph = _graph()
    offenders = {
        (mod, dep)
        for mod, deps in graph.items()
        if mod.startswith("stitch_nas")
        for dep in deps
        if dep.split(".")[0] in ("search_spaces", "objectives")
    }
    assert not offenders, f"core modules importing plug-ins: {sorted(offenders)}"


def test_only_the_cli_imports_the_cli():
    """The command line sits on top: the pipeline and the settings it runs are the library's."""
    offenders = {
        (mod, dep)
        for mod, deps in _graph().items()
        if not mod.startswith("stitch_nas.cli")
        for dep in deps
        if dep.startswith("stitch_nas.cli")
    }
    assert not offenders, f"modules importing the CLI: {sorted(offenders)}"


def test_modules_stay_small():
    long = {
        name: n for name, p in _modules().items() if (n := len(p.read_text().splitlines())) > 420
    }
    assert not long, f"modules over ~400 lines: {long}"


@pytest.mark.parametrize(
    "statement",
    [
        "import stitch_nas",
        "import stitch_nas.cli",
        "import stitch_nas.settings",
        "import stitch_nas.pipeline",
    ],
)
def test_the_public_face_and_the_cli_start_without_torch(statement):
    heavy = "('torch', 'timm', 'optuna')"
    code = f"{statement}; import sys; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_lazy_names_resolve_and_unknown_ones_raise():
    import stitch_nas

    assert stitch_nas.StitchConfig.__name__ == "StitchConfig"
    assert set(stitch_nas.__all__) <= set(dir(stitch_nas))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        stitch_nas.nope  # noqa: B018
