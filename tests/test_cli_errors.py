"""Bad inputs, one by one: exit 2, one line naming the bad value, no traceback, --out untouched.

Each case builds its inputs in ``tmp_path`` and runs the CLI in this process. The --out folder
is either new (it must not be created) or holds files already (they must stay byte-identical).
Every case's wall time is printed at the end of the module as a report, not asserted: the goal
is under 2 s each on an idle machine (the first case to import torch pays for it; cases that
need the zoo pay for loading it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stitch_nas.cli import main
from stitch_nas.errors import ConfigError

TIMES: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _time_report(request):
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or not TIMES:
        return
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():  # teardown output is captured otherwise
        reporter.write_line("")
        reporter.write_line("bad inputs, wall time per case (goal: < 2 s on an idle machine)")
        for name, seconds in TIMES.items():
            reporter.write_line(f"  {name:36s} {seconds:6.2f} s")


def _tree(path: Path) -> dict[str, bytes] | None:
    """Every file under ``path`` with its bytes (None: ``path`` does not exist)."""
    if not path.exists():
        return None
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def _yaml(tmp: Path, text: str) -> str:
    path = tmp / "run.yaml"
    path.write_text(text)
    return str(path)


def _study(out: Path) -> None:
    import optuna

    out.mkdir(parents=True, exist_ok=True)
    optuna.create_study(storage=f"sqlite:///{out / 'study.db'}", study_name=out.name)


def _kept(out: Path) -> None:
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("the user's own file\n")


@dataclass(frozen=True)
class Case:
    """``argv(tmp, out)``: the command; ``bad``: what the error line must name; ``setup``
    prepares ``out`` (None: it does not exist); ``zoo``: the case needs the mini zoo."""

    name: str
    argv: Callable[[Path, Path], list[str]]
    bad: str
    setup: Callable[[Path], None] | None = None
    zoo: bool = False


def _search(text: str, *flags: str) -> Callable[[Path, Path], list[str]]:
    return lambda tmp, out: ["search", _yaml(tmp, text), "--out", str(out), *flags]


def _binary(tmp: Path, out: Path) -> list[str]:
    path = tmp / "run.yaml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 20)
    return ["search", str(path), "--out", str(out)]


def _demo(*flags: str) -> Callable[[Path, Path], list[str]]:
    return lambda tmp, out: ["demo", "--out", str(out), *flags]


CASES = [
    Case("unknown YAML key", _search("search: {trails: 5}\n"), "trails"),
    Case("bad value type", _search("search: {trials: many}\n"), "many", _kept),
    Case("binary YAML", _binary, "run.yaml"),
    Case("unknown space", _search("search: {space: nowhere}\n"), "nowhere", _kept),
    Case("unknown sampler (YAML)", _search("search: {sampler: cmaes}\n"), "cmaes"),
    Case("unknown sampler (flag)", _demo("--sampler", "grid"), "grid", _kept),
    Case("sampler module missing (flag)", _demo("--sampler", "no_such_mod:S"), "no_such_mod"),
    Case(
        "bad sampler option (YAML)",
        _search("search: {sampler: nsga2, sampler_options: {population_sise: 4}}\n"),
        "population_sise",
        _kept,
    ),
    Case("unknown objective", _demo("--objectives", "accuracy,speed"), "speed"),
    Case("unknown objective (YAML)", _search("search: {objectives: [speed]}\n"), "speed", _kept),
    Case(
        "unknown adapter kind",
        _search("search: {space_options: {adapters: [lstsq, wobble]}}\n"),
        "wobble",
    ),
    Case(
        "bad adapter option",
        _search("search: {space: gap, space_options: {adapter_options: {stepz: 5}}}\n"),
        "stepz",
        _kept,
    ),
    Case(
        "bad adapter option value",
        _search("search: {space: gap, space_options: {adapter_options: {steps: -5}}}\n"),
        "steps=-5",
    ),
    Case(
        "bad resize choice",
        _search("search: {space_options: {adapters: [linear], resizes: [cubic]}}\n"),
        "cubic",
    ),
    Case(
        "unknown head",
        _search("search: {space: stitchnet, space_options: {head: oracle}}\n"),
        "oracle",
    ),
    Case(
        "bad space option",
        _search("search: {space_options: {max_fragmentz: 3}}\n"),
        "max_fragmentz",
        _kept,
    ),
    Case("bad budget type (YAML)", _search("search: {budgets: {macs: lots}}\n"), "lots"),
    Case("bad budget unit (flag)", _demo("--budget", "macs=2M"), "2M", _kept),
    Case("unknown budget (YAML)", _search("search: {budgets: {flops: 1000}}\n"), "flops"),
    Case(
        "missing checkpoint file",
        _search(
            "zoo: {models: [{name: mine, source: timm, model: resnet18, "
            "weights: /no/such/weights.pth}]}\n"
        ),
        "/no/such/weights.pth",
        _kept,
    ),
    Case(
        "missing data root",
        _search("data: {kind: image_folder, root: /no/such/images}\n"),
        "/no/such/images",
    ),
    Case(
        "negative data.workers",
        _search("data: {kind: image_folder, root: /no/such/images, workers: -1}\n"),
        "data.workers=-1",
    ),
    Case("--out is a file", _demo(), "out", lambda out: out.write_text("a file\n")),
    Case(
        "--out under a file",
        lambda tmp, out: ["demo", "--out", str(out / "run")],
        "out",
        lambda out: out.write_text("a file\n"),
    ),
    Case("--resume with no study", _demo("--resume"), "study.db"),
    Case("--resume into an empty folder", _demo("--resume"), "study.db", _kept),
    Case("existing study, no --resume", _demo(), "--resume", _study),
    Case("bad --device", _demo("--device", "gpu"), "gpu"),
    Case("bad device (YAML)", _search("search: {device: tpu}\n"), "tpu", _kept),
    Case("bad --trials (negative)", _demo("--trials", "-3"), "-3"),
    Case("bad --trials (text)", _demo("--trials", "abc"), "abc", _kept),
    Case("bad trials (YAML)", _search("search: {trials: 0}\n"), "trials=0"),
    Case("bad cache_memory_gb", _search("search: {cache_memory_gb: -1}\n"), "cache_memory_gb"),
    Case(
        "unknown ray_mode",
        _search("search: {executor: ray, ray_mode: workerz}\n"),
        "ray_mode='workerz'",
    ),
    Case(
        "report: garbage study.db",
        lambda tmp, out: ["report", str(out)],
        "study.db",
        lambda out: (out.mkdir(), (out / "study.db").write_bytes(b"not a database" * 100)),
    ),
    Case(
        "report: 0-byte study.db",
        lambda tmp, out: ["report", str(out)],
        "study.db",
        lambda out: (out.mkdir(), (out / "study.db").write_bytes(b"")),
    ),
    Case(
        "report: --storage beside a folder that does not exist",
        lambda tmp, out: ["report", str(out), "--storage", str(tmp / "study.log")],
        "does not exist",
    ),
    Case(
        "export: --storage to a journal file that does not exist",
        lambda tmp, out: ["export", str(out), "--storage", str(tmp / "typo.log")],
        "typo.log",
        lambda out: out.mkdir(),
    ),
    Case(
        "export: unknown format",
        lambda tmp, out: ["export", str(out), "--format", "tflite"],
        "tflite",
        _study,
    ),
    # these need the zoo: checked right after it loads, before the study is created
    Case("zoo: unreachable budget", _demo("--budget", "macs=10"), "10", zoo=True),
    Case(
        "zoo: unknown model in space options",
        _search("search: {space_options: {models: [resnet, nobody]}}\n"),
        "nobody",
        _kept,
        zoo=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_line_exit_2_and_leaves_out_alone(case, tmp_path, capsys, request):
    out = tmp_path / "out"
    if case.setup is not None:
        case.setup(out)
    argv = case.argv(tmp_path, out)
    if case.zoo:
        argv += ["--cache-dir", str(request.getfixturevalue("mini_zoo_dir"))]
        request.getfixturevalue("mini_zoo")  # built (or reused) before the clock starts
    before = _tree(out)
    capsys.readouterr()
    start = time.perf_counter()
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    TIMES[case.name] = time.perf_counter() - start
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert case.bad in lines[0], lines[0]
    assert _tree(out) == before  # not created, or byte-identical


def _one_line_error(argv: list[str], capsys) -> str:
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def unwritable_folder(tmp_path) -> Iterator[Path]:
    """A folder in which no file can be created, by this user: a read-only folder, or, as root
    (CI runs as root, and root writes into read-only folders), ``/proc``, where no one can."""
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        try:
            yield locked
        finally:
            locked.chmod(0o700)
        return
    proc = Path("/proc")
    if not (proc / "self").is_dir():
        pytest.skip("running as root without /proc: no folder that root cannot write into")
    yield proc


def test_a_read_only_out_folder_is_refused_before_any_work(unwritable_folder, capsys):
    out = unwritable_folder / f"stitch_nas_run_{os.getpid()}"
    line = _one_line_error(["demo", "--out", str(out)], capsys)
    assert f"error: --out {str(out)!r}: cannot write in {str(unwritable_folder)!r}" in line
    assert not out.exists()


def test_an_out_folder_under_a_file_is_refused_before_any_work(tmp_path, capsys):
    """A path whose parent is a regular file cannot be made by anyone, root included."""
    parent = tmp_path / "notes.txt"
    parent.write_text("a file\n")
    out = parent / "run"
    line = _one_line_error(["demo", "--out", str(out)], capsys)
    assert f"{str(parent)!r} is a file, not a folder" in line, line
    assert parent.read_text() == "a file\n"


# what the stitch-nas console script runs, without needing it on PATH
_CONSOLE = "import sys; from stitch_nas.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.parametrize(
    "argv, bad",
    [
        (["search", "{yaml}"], "wobble"),
        (["demo", "--trials", "-3"], "-3"),
    ],
)
def test_the_console_command_prints_no_traceback(tmp_path, argv, bad):
    config = tmp_path / "run.yaml"
    config.write_text("search: {space_options: {adapters: [wobble]}}\n")
    argv = [str(config) if a == "{yaml}" else a for a in argv]
    out = tmp_path / "out"
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _CONSOLE, *argv, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    TIMES[f"new process: {bad}"] = time.perf_counter() - start
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and bad in proc.stderr
    assert not out.exists()


# the CLI in a new process; after it returns, whether it ever imported torch
_TORCH_FREE = (
    "import sys; from stitch_nas.cli import main; code = main(sys.argv[1:]); "
    "print('torch imported' if 'torch' in sys.modules else 'torch-free'); sys.exit(code)"
)


@pytest.mark.parametrize(
    "yaml, bad",
    [
        ("search: {space: nowhere}", "nowhere"),
        ("search: {space_options: {adapters: [lstsq, wobble]}}", "wobble"),
        ("search: {space_options: {max_fragmentz: 3}}", "max_fragmentz"),
        ("search: {space: gap, space_options: {adapter_options: {stepz: 5}}}", "stepz"),
        ("search: {space: stitchnet, space_options: {head: oracle}}", "oracle"),
        ("search: {space_options: {adapters: [linear], resizes: [cubic]}}", "cubic"),
        ("search: {refine_trials: 2, refine_adapters: [{kind: lstsq}]}", "lstsq"),
        ("search: {refine_trials: 2, refine_adapters: [{kind: linear, stepz: 1}]}", "stepz"),
        ("search: {space: gap, space_options: {adapter_options: {steps: -5}}}", "steps=-5"),
        ("search: {refine_trials: 2, refine_adapters: [{kind: linear, lr: -1}]}", "lr=-1"),
    ],
)
def test_a_bad_plugin_name_or_option_answers_before_torch_is_imported(tmp_path, yaml, bad):
    config = tmp_path / "run.yaml"
    config.write_text(yaml + "\n")
    out = tmp_path / "out"
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _TORCH_FREE, "search", str(config), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    TIMES[f"new process, torch-free: {bad}"] = time.perf_counter() - start
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and bad in proc.stderr, proc.stderr
    assert proc.stdout.strip() == "torch-free"
    assert not out.exists()


def test_the_corrected_command_runs_into_the_same_out(tmp_path, capsys, mini_zoo, mini_zoo_dir):
    out = tmp_path / "out"
    good = ["demo", "--out", str(out), "--cache-dir", str(mini_zoo_dir)]
    good += ["--trials", "3", "--no-export", "--no-progress"]
    for bad in (["--budget", "macs=10"], ["--trials", "-3"], ["--sampler", "grid"]):
        assert main([*good, *bad]) == 2
        assert not out.exists()
    capsys.readouterr()
    assert main(good) == 0, capsys.readouterr().err
    assert (out / "study.db").is_file() and (out / "pareto.json").is_file()


def test_the_checks_and_the_library_read_one_list_of_choices():
    """The torch-free checks and the library name the same objects (stitch_nas.choices), not
    copies that could drift apart."""
    from stitch_nas import choices
    from stitch_nas.activations import AUTOCAST_DTYPES
    from stitch_nas.data import PROBE_SIZE_RANGE, _splits
    from stitch_nas.export import FORMATS
    from stitch_nas.pipeline import _preflight
    from stitch_nas.search import _ray_executor, _runner
    from stitch_nas.settings import FIELD_CHECKS, _values

    assert _preflight.EXPORT_FORMATS is FORMATS is choices.EXPORT_FORMATS
    assert _values.EXECUTORS is choices.EXECUTORS
    assert _values.RAY_MODES is _ray_executor.RAY_MODES is choices.RAY_MODES
    assert _values.check_budgets is _runner.check_budgets is choices.check_budgets
    assert FIELD_CHECKS["search.fidelity"] is _runner.check_fidelity is choices.check_fidelity
    assert FIELD_CHECKS["search.cka_threshold"] is _runner.check_cka_threshold
    assert _values.check_autocast_name is choices.check_autocast_name
    assert PROBE_SIZE_RANGE is choices.PROBE_SIZE_RANGE
    assert FIELD_CHECKS["data.probe_size"] is choices.check_probe_size
    assert _splits.probe_size_for is choices.probe_size_for  # which calls check_probe_size
    assert _splits.check_image_size is choices.check_image_size  # data.size: it, or None
    assert FIELD_CHECKS["data.size"](None, "data.size") is None  # None: the zoo's size
    with pytest.raises(ConfigError, match=r"data.size=4"):
        FIELD_CHECKS["data.size"](4, "data.size")
    assert tuple(AUTOCAST_DTYPES) == choices.AUTOCAST_DTYPES


def test_the_built_in_plugins_declare_what_they_register():
    """The torch-free declarations the settings check reads are what the registries hold (each
    built-in registration takes its declaration, or refuses to load)."""
    from stitch_nas.settings import declared_tables, registered_tables

    declared = declared_tables()
    assert declared is not None  # no third-party plug-in installed: the declarations answer
    assert declared == registered_tables()


def test_a_space_that_differs_from_its_declaration_refuses_to_register(monkeypatch):
    from search_spaces import _options, _registry

    monkeypatch.setitem(_options.SPACE_OPTIONS, "declared_only", {"models": None, "k": 2})

    def space(trial, ctx, *, models=None, k=3):
        return None

    with pytest.raises(ConfigError, match="declared_only.*k.*3"):
        _registry.register_space("declared_only")(space)


def test_a_built_in_adapter_kind_takes_its_declared_options(monkeypatch):
    from stitch_nas.adapters import ADAPTERS, register_adapter

    with pytest.raises(ConfigError, match="'linear' is already registered"):
        register_adapter("linear", options={})(lambda src, dst: None)
    # before the built-in kinds load (a plug-in registering first), the declaration answers
    monkeypatch.setattr(ADAPTERS, "_entries", {})
    with pytest.raises(ConfigError, match="'lstsq' is built in"):
        register_adapter("lstsq", trainable=False)(lambda src, dst: None)


def test_every_cli_error_the_docs_show_is_what_the_cli_prints(tmp_path, monkeypatch, capsys):
    """A docs page that shows ``$ stitch-nas ...`` and its error lines shows what that command
    prints now: a change to the message changes the page or fails here."""
    import re
    import shlex

    docs = Path(__file__).resolve().parents[1] / "docs"
    text = "\n".join(page.read_text() for page in sorted(docs.rglob("*.md")))
    examples = re.findall(r"^\$ stitch-nas (.+)\n((?:stitch-nas: error: .+\n)+)", text, re.M)
    assert examples, "no page shows a CLI error: the pattern changed?"
    (tmp_path / "my_samplers.py").write_text("")  # the pages' own sampler module, without it
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    for command, shown in examples:
        assert main(shlex.split(command)) == 2, command
        assert capsys.readouterr().err == shown, command
        assert not (tmp_path / "stitch_nas_run").exists() and not (tmp_path / "demo_out").exists()
