"""Tests of the package's shape: the layers of docs/ARCHITECTURE.md, no import circle, public
faces between packages, plug-ins kept out of the core, a light face.

The import graph is read statically (every ``import`` statement, at module level, inside a
function or under ``if TYPE_CHECKING:``), so a circle or an upward import hidden behind a
function-level or type-only import is found too.
"""

from __future__ import annotations

import ast
import re
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


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules that ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
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


def _package(module: str) -> str:
    """``stitch_nas.search._loop`` -> ``search``; a top-level module is its own package."""
    parts = module.split(".")
    if parts[0] != "stitch_nas":
        return parts[0]
    return parts[1] if len(parts) > 1 else "stitch_nas"


def _layers() -> dict[str, int | str]:
    """Each package's layer, read from the table in docs/ARCHITECTURE.md ("plug-in" for the
    plug-ins), so the documented rules and the tested ones are one text."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    layers: dict[str, int | str] = {}
    for row in re.findall(r"^\| (\d+|plug-in) \| ([^|]+) \|", text, flags=re.M):
        level, names = row
        for name in re.findall(r"`([a-z_]+)`", names):
            layers[name] = int(level) if level.isdigit() else level
    return layers


def _upward(graph: dict[str, set[str]], layers: dict[str, int | str]) -> set[tuple[str, str]]:
    """Imports that break the layers: into the same layer or one above, or into a plug-in from
    the core; a plug-in may import layers 0-5 and other plug-ins."""
    bad = set()
    for module, deps in graph.items():
        home = _package(module)
        if home == "stitch_nas":  # the root face names what every layer offers
            continue
        for dep in deps:
            there = _package(dep)
            if there in (home, "stitch_nas"):  # its own package; the root face is lazy
                continue
            mine, theirs = layers[home], layers[there]
            if theirs == "plug-in":
                ok = mine == "plug-in"
            elif mine == "plug-in":
                ok = int(theirs) <= 5
            else:
                ok = int(theirs) < int(mine) or int(theirs) == int(mine) == 0
            if not ok:
                bad.add((module, dep))
    return bad


def test_the_architecture_table_names_every_package():
    layers = _layers()
    packages = {_package(m) for m in _modules()} - {"stitch_nas"}
    assert packages == set(layers), (packages ^ set(layers), "docs/ARCHITECTURE.md, 'layer'")


def test_the_architecture_table_lists_every_module_and_no_other():
    """docs/ARCHITECTURE.md's table of private modules matches the tree."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    listed = set(re.findall(r"^\| `([a-z_]+/_[a-z_]+\.py)` \|", text, flags=re.M))
    tree = {
        str(path.relative_to(ROOT / "stitch_nas"))
        for path in (ROOT / "stitch_nas").glob("*/_*.py")
        if path.name != "__init__.py"
    }
    assert listed == tree, {"not in the table": tree - listed, "not in the tree": listed - tree}


def test_imports_go_down_the_layers():
    bad = _upward(_graph(), _layers())
    assert not bad, f"imports against the layers of docs/ARCHITECTURE.md: {sorted(bad)}"


def test_the_layer_check_finds_an_upward_import():
    layers: dict[str, int | str] = {"errors": 0, "zoo": 2, "search": 7, "snnet": "plug-in"}
    graph = {
        "stitch_nas.zoo._mini": {"stitch_nas.search"},  # up
        "stitch_nas.search._loop": {"stitch_nas.snnet", "stitch_nas.zoo", "stitch_nas.errors"},
        "stitch_nas.snnet._joint": {"stitch_nas.search._loop"},  # a plug-in above layer 5
    }
    assert _upward(graph, layers) == {
        ("stitch_nas.zoo._mini", "stitch_nas.search"),
        ("stitch_nas.search._loop", "stitch_nas.snnet"),
        ("stitch_nas.snnet._joint", "stitch_nas.search._loop"),
    }


def test_packages_reach_each_other_through_their_faces():
    """No module imports another package's private ``_module``: a face is the whole contract."""
    bad = {
        (module, dep)
        for module, deps in _graph().items()
        for dep in deps
        if _package(dep) != _package(module)
        and any(part.startswith("_") for part in dep.split(".")[1:])
    }
    assert not bad, f"private modules imported from another package: {sorted(bad)}"


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
