"""Every optional extra is optional: the base install runs the main job without it.

Each case runs in subprocesses whose ``sitecustomize`` makes the extra's modules look not
installed (also for the ``stitch-nas`` console script, which they start). Then the public
packages import, the CLI answers, and the feature that needs the extra fails with one line
naming it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stitch_nas.extras import EXTRAS

ROOT = Path(__file__).resolve().parents[1]

#: extras that add no feature of the library: the test and docs tools
TOOL_EXTRAS = {"dev", "docs"}

BLOCKER = """
import sys

# None in sys.modules is what a missing package looks like to both probes the code may use:
# `import ray` raises ModuleNotFoundError and importlib.util.find_spec("ray") returns None.
# (A sys.meta_path finder that raises would break torch's own optional-import probes.)
for name in {blocked!r}:
    sys.modules[name] = None
"""

IMPORTS = (
    "import sys, stitch_nas, stitch_nas.search, stitch_nas.export, stitch_nas.report\n"
    "import stitch_nas.cli\n"
    "loaded = [m for m, mod in sys.modules.items() if mod is not None]\n"
    "print(sorted(m for m in loaded if m.split('.')[0] in {blocked!r}))\n"
)


def _pyproject_extras() -> set[str]:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
    with open(ROOT / "pyproject.toml", "rb") as file:
        return set(tomllib.load(file)["project"]["optional-dependencies"])


def test_every_extra_of_pyproject_is_declared_and_tested() -> None:
    """A new extra must be added to stitch_nas.extras.EXTRAS, and so to the cases below."""
    assert _pyproject_extras() - TOOL_EXTRAS == set(EXTRAS)


def _blocked(extras: list[str]) -> list[str]:
    modules = [m for extra in extras for m in EXTRAS[extra][1]]
    return modules or ["optuna_dashboard"]  # dashboard: the library must never import it


def _env(tmp_path: Path, blocked: list[str], cache: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=set(blocked)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    env["STITCH_NAS_CACHE"] = str(cache)
    env["RAY_AUTH_MODE"] = "disabled"
    return env


def _cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("stitch-nas")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "stitch_nas.cli"]
    return subprocess.run([*command, *argv], env=env, capture_output=True, text=True, timeout=600)


def _one_line_naming(proc: subprocess.CompletedProcess[str], extra: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("stitch-nas: error:")]
    assert len(errors) == 1, proc.stderr
    assert f"pip install -e '.[{extra}]'" in errors[0], errors[0]


def _feature_fails(extra: str, env: dict[str, str], folder: Path) -> None:
    """The feature that needs ``extra`` fails with one line naming it, before slow work."""
    if extra == "ray":
        proc = _cli(env, "demo", "--out", str(folder / "ray"), "--executor", "ray")
        _one_line_naming(proc, "ray")
        assert not (folder / "ray").exists()  # refused before anything was written
        code = (
            "from stitch_nas.errors import MissingDependencyError\n"
            "try:\n"
            "    from stitch_nas.search import StitchOptunaSearch\n"
            "except MissingDependencyError as exc:\n"
            "    print('refused:', exc)\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        assert "refused:" in proc.stdout and "'.[ray]'" in proc.stdout, proc.stdout + proc.stderr
    elif extra == "onnx":
        proc = _cli(env, "export", str(folder / "demo"), "--format", "onnx")
        _one_line_naming(proc, "onnx")
    elif extra == "postgres":
        url = "postgresql://user:secret@127.0.0.1:1/db"
        proc = _cli(env, "demo", "--out", str(folder / "pg"), "--storage", url)
        _one_line_naming(proc, "postgres")
        assert "secret" not in proc.stderr + proc.stdout
    # dashboard adds no feature of the library: that nothing imports it is checked above


@pytest.mark.parametrize("extras", [[name] for name in EXTRAS] + [list(EXTRAS)], ids=str)
def test_base_install_works_without_the_extra(
    extras: list[str], tmp_path: Path, mini_zoo, mini_zoo_dir: Path
) -> None:
    blocked = _blocked(extras)
    env = _env(tmp_path, blocked, mini_zoo_dir)
    proc = subprocess.run(
        [sys.executable, "-c", IMPORTS.format(blocked=set(blocked))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1].replace("'", '"')) == []

    proc = _cli(env, "--help")
    assert proc.returncode == 0 and "demo" in proc.stdout, proc.stderr

    demo = tmp_path / "demo"
    if len(extras) > 1:  # the main job, with every extra missing at once: a tiny search
        proc = _cli(env, "demo", "--out", str(demo), "--trials", "6", "--no-progress")
        assert proc.returncode == 0, proc.stderr
        for name in ("pareto.json", "report.html", "study.db"):
            assert (demo / name).is_file(), name
        exported = [p for p in (demo / "models").iterdir() if (p / "model.safetensors").is_file()]
        assert exported, sorted(p.name for p in (demo / "models").iterdir())
        assert "Traceback" not in proc.stderr
        proc = _cli(env, "report", str(demo))
        assert proc.returncode == 0 and "hypervolume" in proc.stdout, proc.stderr
    else:
        demo.mkdir()  # export's refusal comes before the folder is even read
    for extra in extras:
        _feature_fails(extra, env, tmp_path)
