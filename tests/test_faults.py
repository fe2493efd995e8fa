"""Faults a real user meets: two runs into one folder, and what a refused run may remove."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from stitch_nas.cli import main
from stitch_nas.config import Fragment, StitchConfig
from stitch_nas.errors import ConfigError, DataError
from stitch_nas.pipeline._lock import LOCK_NAME, claim_out

# what the stitch-nas console script runs, without needing it on PATH
_CONSOLE = "import sys; from stitch_nas.cli import main; sys.exit(main(sys.argv[1:]))"


def _one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stitch-nas: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_two_runs_into_one_folder_one_finishes_intact_the_other_is_refused(
    tmp_path, mini_zoo, mini_zoo_dir
):
    out = tmp_path / "run"
    argv = ["demo", "--out", str(out), "--cache-dir", str(mini_zoo_dir)]
    argv += ["--trials", "3", "--no-export", "--no-progress"]
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _CONSOLE, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [(run.wait(timeout=600), *run.communicate()) for run in runs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    _, _, err = next(r for r in results if r[0] == 2)
    line = _one_line_error(err)
    assert str(out) in line and ("in use" in line or "already holds" in line), line
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{out / 'study.db'}")
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(finished) == 3, [t.state for t in study.trials]
    assert (out / "pareto.json").is_file()
    assert not (out / LOCK_NAME).exists()  # let go when the run ended


def test_a_held_folder_is_refused_in_one_line_and_left_alone(tmp_path, capsys):
    out = tmp_path / "run"
    with claim_out(out):
        (out / "notes.txt").write_text("the other run's file\n")
        before = sorted(p.name for p in out.iterdir())
        assert main(["demo", "--out", str(out), "--trials", "2"]) == 2
        line = _one_line_error(capsys.readouterr().err)
        assert "in use by another stitch-nas run" in line and str(out) in line
        assert sorted(p.name for p in out.iterdir()) == before
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_second_claim_is_refused_while_the_first_holds(tmp_path):
    out = tmp_path / "run"
    with claim_out(out):
        with pytest.raises(ConfigError, match="in use"):
            with claim_out(out):
                pass
    with claim_out(out):  # once let go, the folder is free again
        pass


def test_joined_drivers_share_the_folder_and_a_plain_run_is_refused(tmp_path):
    out = tmp_path / "run"
    with claim_out(out, shared=True), claim_out(out, shared=True):
        with pytest.raises(ConfigError, match="in use"):
            with claim_out(out):
                pass
        assert (out / LOCK_NAME).is_file()
    assert not (out / LOCK_NAME).exists()  # the last one out removes it


@pytest.mark.parametrize("existed", [True, False], ids=["out existed", "new out"])
def test_a_refused_run_removes_only_what_it_created(tmp_path, monkeypatch, capsys, existed):
    """Another process writes into --out while a run prepares; the run then fails before its
    first trial: only the run's own files go, the other process's file and folder stay."""
    from stitch_nas.pipeline import _run as _pipeline

    out = tmp_path / "run"
    if existed:
        out.mkdir()
        (out / "notes.txt").write_text("the user's own file\n")

    def prepare(*_args, **_kwargs):
        (out / "study.db").write_bytes(b"")  # as if this run had begun its study
        (out / "other.txt").write_text("written by another process meanwhile\n")
        raise ConfigError("injected: the zoo cannot be built")

    monkeypatch.setattr(_pipeline, "_prepare", prepare)
    assert main(["demo", "--out", str(out), "--trials", "2"]) == 2
    assert "injected" in _one_line_error(capsys.readouterr().err)
    left = sorted(p.name for p in out.iterdir())
    assert left == (["notes.txt", "other.txt"] if existed else ["other.txt"])


def test_a_refused_run_into_a_new_folder_leaves_no_folder(tmp_path, monkeypatch, capsys):
    from stitch_nas.pipeline import _run as _pipeline

    out = tmp_path / "run"

    def prepare(*_args, **_kwargs):
        (out / "study.db").write_bytes(b"")
        raise ConfigError("injected: the zoo cannot be built")

    monkeypatch.setattr(_pipeline, "_prepare", prepare)
    assert main(["demo", "--out", str(out), "--trials", "2"]) == 2
    _one_line_error(capsys.readouterr().err)
    assert not out.exists()


def test_the_folder_is_held_for_the_whole_run(tmp_path, monkeypatch, capsys):
    """While the trials run, a second claim of --out is refused."""
    from stitch_nas.pipeline import _run as _pipeline

    out = tmp_path / "run"
    seen: list[str] = []

    def search(*_args, **_kwargs):
        try:
            with claim_out(out):
                seen.append("claimed")
        except ConfigError as exc:
            seen.append(str(exc))
        return None

    monkeypatch.setattr(_pipeline, "_search", search)
    monkeypatch.setattr(_pipeline, "_prepare", lambda *a, **k: _stub_prepare())
    monkeypatch.setattr(_pipeline, "create_study", lambda *a, **k: _StubStudy())
    monkeypatch.setattr(_pipeline, "asdict", lambda s: {})
    _pipeline.run(_pipeline.Settings(), out, progress=False)
    assert len(seen) == 1 and "in use" in seen[0], seen
    assert not (out / LOCK_NAME).exists()


def _stub_prepare():
    from types import SimpleNamespace

    return None, SimpleNamespace()  # the pipeline sets the objective's folder


class _StubStudy:
    study_name = "stub"

    def set_user_attr(self, key, value):
        pass


def test_the_lock_file_is_not_left_behind(tmp_path):
    out = tmp_path / "run"
    with claim_out(out):
        assert (out / LOCK_NAME).is_file()
    assert not (out / LOCK_NAME).exists()
    assert isinstance(out, Path) and out.is_dir()


# --- untrusted YAML ------------------------------------------------------------------------

_BOMB = """
zoo:
  models:
    - name: bomb
      source: timm
      model: test_resnet
      kwargs:
        a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]
        b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
        c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
        d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
        e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
        f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
        g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
        h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
        i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


def _limited_memory() -> None:  # the child may not take more than 2 GB of address space
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_an_alias_bomb_is_refused_at_once_in_little_memory(tmp_path):
    import time

    config = tmp_path / "bomb.yaml"
    config.write_text(_BOMB)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _CONSOLE, "search", str(config), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limited_memory,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = _one_line_error(proc.stderr)
    assert "anchors and aliases (&a)" in line and "(line 8, column 12)" in line, line
    assert time.perf_counter() - start < 10  # a process start; the refusal itself is instant
    assert not (tmp_path / "o").exists()


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("search:\n  trials: 3\n  sampler: random\n  trials: 500\n")
    assert main(["search", str(config), "--out", str(tmp_path / "o")]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "key 'trials' is given twice (first on line 2)" in line, line
    assert "(line 4, column 3)" in line, line


def test_a_key_repeated_in_a_nested_mapping_is_refused(tmp_path):
    from stitch_nas.settings import load_settings

    config = tmp_path / "run.yaml"
    config.write_text("search:\n  space_options: {models: [a], models: [b]}\n")
    with pytest.raises(ConfigError, match=r"line 2, column 32\): key 'models' is given twice"):
        load_settings(config)


@pytest.mark.parametrize(
    "text",
    [
        "search: {sampler: %s}\n",  # an unknown name
        "search: {trials: %s}\n",  # a wrong type
        "search: {space_options: {adapters: [%s]}}\n",  # an unknown plug-in
    ],
)
def test_a_huge_value_is_quoted_short(tmp_path, capsys, text):  # (keys: YAML caps at 1024)
    config = tmp_path / "run.yaml"
    config.write_text(text % ("x" * 2_000_000))
    assert main(["search", str(config), "--out", str(tmp_path / "o")]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert len(line) < 1200 and "xxxx" in line, line[:2000]


# --- true messages, early ------------------------------------------------------------------


def _study_folder(folder: Path, *, constraints: float | None = None) -> Path:
    """A search folder whose study has COMPLETE trials 0 and 1 and a FAIL trial 2 (``constraints``:
    each COMPLETE trial's budget excess, > 0 meaning it missed the budget)."""
    from optuna.trial import TrialState, create_trial

    folder.mkdir()
    study = optuna.create_study(
        storage=f"sqlite:///{folder / 'study.db'}",
        study_name=folder.name,
        directions=["maximize", "minimize"],
    )
    study.set_user_attr("budgets", {"macs": 10.0})
    config = StitchConfig((Fragment("resnet", None, None),)).to_dict()
    extra = {} if constraints is None else {"constraints": {"macs": constraints}}
    for values in ([0.9, 2e6], [0.8, 1e6]):
        attrs = {"config": config, "macs": values[1]}
        study.add_trial(create_trial(values=values, user_attrs=attrs, **extra))
    study.add_trial(create_trial(state=TrialState.FAIL, user_attrs={"fail_reason": "boom"}))
    return folder


@pytest.fixture
def no_rebuild(monkeypatch):
    """The zoo must not be rebuilt: the refusal comes from the study alone."""
    from stitch_nas.pipeline import _folder as _pipeline

    def rebuild(*_args, **_kwargs):
        raise AssertionError("the zoo was rebuilt before the refusal")

    monkeypatch.setattr(_pipeline, "_rebuild", rebuild)


@pytest.mark.parametrize(
    "trials, says",
    [
        ("99999", "trial 99999 does not exist; the study has trials 0..2"),
        ("0,2", "trial 2 is FAIL (boom)"),
    ],
)
def test_export_of_a_trial_that_cannot_be_is_refused_before_the_zoo_loads(
    tmp_path, capsys, no_rebuild, trials, says
):
    folder = _study_folder(tmp_path / "run")
    assert main(["export", str(folder), "--trials", trials, "--format", "safetensors"]) == 2
    assert says in _one_line_error(capsys.readouterr().err)
    assert not (folder / "models").exists()


def test_export_into_a_models_file_is_refused_before_the_zoo_loads(tmp_path, capsys, no_rebuild):
    folder = _study_folder(tmp_path / "run")
    (folder / "models").write_text("a file of the user's\n")
    assert main(["export", str(folder), "--format", "safetensors"]) == 2
    assert "models' is a file" in _one_line_error(capsys.readouterr().err)
    assert (folder / "models").read_text() == "a file of the user's\n"


def test_a_budget_no_trial_met_is_named_not_blamed_on_too_few_trials(tmp_path, capsys, no_rebuild):
    folder = _study_folder(tmp_path / "run", constraints=5.0)
    assert main(["export", str(folder), "--format", "safetensors"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "none of the 2 completed trials meets macs=10.0" in line, line
    assert "run more trials" not in line


def test_a_search_whose_trials_all_miss_the_budget_still_ends_well(tmp_path):
    """The search's own export names why nothing was exported instead of failing the run."""
    from stitch_nas.export import export_study

    folder = _study_folder(tmp_path / "run", constraints=5.0)
    study = optuna.load_study(study_name="run", storage=f"sqlite:///{folder / 'study.db'}")
    summary = export_study(study, None, folder / "models", skip_failures=True)  # type: ignore[arg-type]
    assert summary.describe().startswith("nothing exported: none of the 2 completed trials")


def test_a_search_no_trial_of_which_meets_the_budget_ends_in_one_line(tmp_path):
    """Was: exit 0 after a test pass, report and export of nothing."""
    from stitch_nas.errors import BudgetError
    from stitch_nas.pipeline._run import _check_budgets_met

    folder = _study_folder(tmp_path / "run", constraints=5.0)
    study = optuna.load_study(study_name="run", storage=f"sqlite:///{folder / 'study.db'}")
    with pytest.raises(BudgetError, match=r"none of the 2 completed trials meets macs=10") as err:
        _check_budgets_met(study, {"macs": 10.0}, folder, {"macs": (3.0, "a's stem and b's head")})
    # what the search found and what the zoo allows, never that no network can meet it
    assert "the cheapest: macs=" in str(err.value) and "cost at least 3 macs" in str(err.value)
    assert "no network" not in str(err.value)
    _check_budgets_met(study, {}, folder)  # no budget: nothing to meet
    met = _study_folder(tmp_path / "met", constraints=-1.0)
    study = optuna.load_study(study_name="met", storage=f"sqlite:///{met / 'study.db'}")
    _check_budgets_met(study, {"macs": 10.0}, met)


# --- bad data ------------------------------------------------------------------------------


def _npz_search(folder: Path, x, *, compressed: bool) -> Path:
    """A search file over one .npz of images ``x`` (rows 0..39 probe, 40..59 val, 60..79 test,
    the rest train), with no zoo of its own: the data must fail before any model loads."""
    import numpy as np

    folder.mkdir()
    save = np.savez_compressed if compressed else np.savez
    save(folder / "images.npz", x=x, y=np.arange(len(x)) % 4)
    rows = {"probe": (0, 40), "val": (40, 20), "test": (60, 20), "train": (80, None)}
    splits = "".join(
        f"    {name}: {{file: images.npz, start: {start}, count: {'null' if n is None else n}}}\n"
        for name, (start, n) in rows.items()
    )
    config = folder / "run.yaml"
    config.write_text(f"data:\n  kind: npz\n  shuffle: false\n  splits:\n{splits}")
    return config


@pytest.mark.parametrize("compressed", [True, False], ids=["loaded whole", "read in place"])
@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_nan_or_inf_images_are_refused_at_load_naming_the_file_and_row(
    tmp_path, monkeypatch, capsys, compressed, bad
):
    import numpy as np

    from stitch_nas.pipeline import _run as _pipeline

    def no_zoo(*_args, **_kwargs):
        raise AssertionError("the zoo was built: the data passed its check")

    monkeypatch.setattr(_pipeline, "load_zoo", no_zoo)
    x = np.random.default_rng(0).random((120, 8, 8, 3), dtype=np.float32)
    x[97, 3, 4, 1] = float(bad)
    x[110, 0, 0, 0] = float("nan")  # a later bad row: the first one is named
    config = _npz_search(tmp_path / "data", x, compressed=compressed)
    out = tmp_path / "o"
    assert main(["search", str(config), "--out", str(out), "--no-progress"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "images.npz:x holds NaN or Inf in row 97" in line, line
    assert not out.exists()


def test_nan_images_of_ones_own_tensors_are_refused(tmp_path):
    import torch

    from stitch_nas.data import Split

    x = torch.rand(10, 3, 4, 4)
    Split(x, torch.zeros(10, dtype=torch.int64))  # finite: accepted
    x[6, 2, 1, 1] = float("nan")
    with pytest.raises(DataError, match="split tensor x holds NaN or Inf in row 6"):
        Split(x, torch.zeros(10, dtype=torch.int64))


# --- caches --------------------------------------------------------------------------------


def _unwritable(tmp_path: Path) -> Path:
    """A folder this process cannot write in (root writes anywhere chmod allows nothing:
    /sys then, which the kernel keeps read-only)."""
    import os

    if os.geteuid() != 0:
        folder = tmp_path / "locked"
        folder.mkdir(mode=0o500)
        return folder / "cache"
    if not Path("/sys").is_dir() or os.access("/sys", os.W_OK) and _writes_in("/sys"):
        pytest.skip("no folder root cannot write in")
    return Path("/sys/stitch_nas_cache")


def _writes_in(folder: str) -> bool:
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


@pytest.mark.parametrize("where", ["a file", "under a file", "unwritable"])
@pytest.mark.parametrize("how", ["--cache-dir", "STITCH_NAS_CACHE", "search.cache_dir"])
def test_a_cache_that_is_no_writable_folder_is_one_line_before_any_work(
    tmp_path, monkeypatch, capsys, where, how
):
    from stitch_nas.pipeline import _run as _pipeline

    def no_data(*_args, **_kwargs):
        raise AssertionError("the data loaded before the cache was checked")

    monkeypatch.setattr(_pipeline, "load_data", no_data)
    (tmp_path / "afile").write_text("a file of the user's\n")
    bad = {
        "a file": tmp_path / "afile",
        "under a file": tmp_path / "afile" / "cache",
        "unwritable": _unwritable(tmp_path),
    }[where]
    out = tmp_path / "o"
    argv = ["--out", str(out), "--trials", "2", "--no-progress"]
    if how == "--cache-dir":
        argv = ["demo", *argv, "--cache-dir", str(bad)]
    elif how == "STITCH_NAS_CACHE":
        monkeypatch.setenv("STITCH_NAS_CACHE", str(bad))
        argv = ["demo", *argv]
    else:
        config = tmp_path / "run.yaml"
        config.write_text(f"search:\n  cache_dir: {bad}\n")
        argv = ["search", str(config), *argv]
    assert main(argv) == 2
    line = _one_line_error(capsys.readouterr().err)
    named = {"--cache-dir": "zoo.cache_dir (--cache-dir)", "STITCH_NAS_CACHE": "STITCH_NAS_CACHE"}
    assert named.get(how, how) in line and str(bad) in line, line
    assert "is a file" in line if where != "unwritable" else "cannot write in" in line, line
    assert not out.exists()
    assert (tmp_path / "afile").read_text() == "a file of the user's\n"


# --- the user's own modules ----------------------------------------------------------------

_GOOD_NET = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3 * 8 * 8, 10)

    def forward(self, x):
        {forward}
        return self.fc(x.flatten(1))


def net():
    {factory}
    return Net()
"""

_USER_FAULTS = {
    "syntax error": ("def net(:\n", "SyntaxError: "),
    "raises on import": (
        "raise RuntimeError('no licence file found\\nsecond line')\n",
        "RuntimeError: no licence file found;",
    ),
    "missing import": (
        "import not_a_package_anywhere\n",
        "No module named 'not_a_package_anywhere'",
    ),
    "factory raises": (
        _GOOD_NET.format(forward="pass", factory="raise ValueError('width must be even\\nmore')"),
        "raised ValueError: width must be even;",
    ),
    "forward raises": (
        _GOOD_NET.format(forward="raise KeyError('stem')", factory="pass"),
        "fails on a 1x3x8x8 input: KeyError: 'stem';",
    ),
}


@pytest.mark.parametrize("case", list(_USER_FAULTS))
def test_a_user_module_that_fails_is_one_line_naming_it(tmp_path, capsys, case):
    code, says = _USER_FAULTS[case]
    module = "user_net_" + case.replace(" ", "_")  # one name per case: imports are cached
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / f"{module}.py").write_text(code)
    config = tmp_path / "run.yaml"
    config.write_text(
        "zoo:\n  mini_zoo: false\n  models:\n"
        f"    - {{source: module, module: '{module}:net', module_path: code, input_size: 8,\n"
        "       mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25]}\n"
        "data: {kind: digits, size: 8}\n"
    )
    out = tmp_path / "o"
    assert main(["search", str(config), "--out", str(out), "--no-progress"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert module in line and says in line, line
    assert "second line" not in line and "more" not in line.split(says)[-1][:6], line
    assert not out.exists()


# --- the search's own export ---------------------------------------------------------------


def test_a_models_file_in_out_is_refused_before_the_search(tmp_path, monkeypatch, capsys):
    from stitch_nas.pipeline import _run as _pipeline

    monkeypatch.setattr(_pipeline, "load_data", lambda *a: pytest.fail("the data loaded"))
    out = tmp_path / "o"
    out.mkdir()
    (out / "models").write_text("a file of the user's\n")
    assert main(["demo", "--out", str(out), "--trials", "2", "--no-progress"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert f"{out / 'models'} is a file" in line and "--no-export" in line, line
    assert sorted(p.name for p in out.iterdir()) == ["models"]
    assert (out / "models").read_text() == "a file of the user's\n"


def test_a_models_file_made_during_the_search_keeps_study_and_report(
    tmp_path, monkeypatch, capsys, mini_zoo_dir, mini_zoo
):
    import stitch_nas.report as report  # _search imports write_report from here as it runs

    out = tmp_path / "o"
    real = report.write_report

    def write_then_block(study, folder):  # another process takes DIR/models meanwhile
        summary = real(study, folder)
        (Path(folder) / "models").write_text("a file of the user's\n")
        return summary

    monkeypatch.setattr(report, "write_report", write_then_block)
    argv = ["demo", "--out", str(out), "--trials", "3", "--no-progress"]
    assert main([*argv, "--cache-dir", str(mini_zoo_dir)]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert f"{out / 'models'} is a file" in line and "stitch-nas export" in line, line
    assert (out / "pareto.json").is_file() and (out / "study.db").is_file()
    assert (out / "models").read_text() == "a file of the user's\n"


# --- resuming another search's study -------------------------------------------------------


def _recorded_study(out: Path, config: Path) -> None:
    """A study in ``out`` as the search of ``config`` leaves it: its settings and one trial."""
    from dataclasses import asdict

    from optuna.trial import create_trial

    from stitch_nas import attrs
    from stitch_nas.settings import load_settings

    out.mkdir()
    study = optuna.create_study(
        storage=f"sqlite:///{out / 'study.db'}", study_name=out.name, directions=["maximize"] * 2
    )
    study.set_user_attr(attrs.SETTINGS, asdict(load_settings(config)))
    config_json = StitchConfig((Fragment("resnet", None, None),)).to_dict()
    study.add_trial(create_trial(values=[0.9, 1e6], user_attrs={"config": config_json}))


_SEARCHED = "zoo:\n  models: [{source: timm, model: test_resnet, num_classes: 10}]\n"


@pytest.mark.parametrize(
    "change, says",
    [
        ("", None),  # the same search: resumed (up to the zoo load, stubbed here)
        # no models listed: the mini zoo is the zoo now (mini_zoo's default), the first change
        ("zoo:\n  models: []\n", "zoo.mini_zoo = False, this run has True"),
        (
            "zoo:\n  models: [{source: timm, model: test_vit, num_classes: 10}]\n",
            "zoo.models[0].model = 'test_resnet', this run has 'test_vit'",
        ),
        (_SEARCHED + "search: {space: chain}\n", "search.space = 'pairwise', this run has 'chain'"),
        (_SEARCHED + "data: {size: 16}\n", "data.size = None, this run has 16"),
    ],
    ids=["same", "model removed", "model changed", "space", "data"],
)
def test_resuming_with_another_zoo_or_space_is_refused_before_any_trial(
    tmp_path, monkeypatch, capsys, change, says
):
    from stitch_nas.pipeline import _run as _pipeline

    def prepare(*_args, **_kwargs):
        raise ConfigError("injected: the zoo loads")

    monkeypatch.setattr(_pipeline, "_prepare", prepare)
    searched, resumed = tmp_path / "searched.yaml", tmp_path / "resumed.yaml"
    searched.write_text(_SEARCHED)
    resumed.write_text(change or _SEARCHED)
    out = tmp_path / "run"
    _recorded_study(out, searched)
    assert main(["search", str(resumed), "--out", str(out), "--resume", "--trials", "3"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    if says is None:
        assert "injected: the zoo loads" in line, line
    else:
        assert f"the study 'run' was searched with {says};" in line, line
    study = optuna.load_study(study_name="run", storage=f"sqlite:///{out / 'study.db'}")
    assert len(study.trials) == 1  # nothing added


# --- Ray ------------------------------------------------------------------------------------


@pytest.fixture
def not_ray():
    """``not_ray(reply)``: the address of a TCP service on a loopback port that is not Ray:
    it accepts connections and says nothing (``reply`` None), or answers ``reply`` and closes
    (PostgreSQL's answer to a client it cannot parse, for one)."""
    import socket
    import threading

    servers, held = [], []

    def start(reply: bytes | None) -> str:
        server = socket.create_server(("127.0.0.1", 0))
        servers.append(server)

        def serve() -> None:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:  # closed when the test ends
                    return
                held.append(conn)
                if reply is not None:
                    conn.recv(64)
                    conn.sendall(reply)
                    conn.close()

        threading.Thread(target=serve, daemon=True).start()
        return f"127.0.0.1:{server.getsockname()[1]}"

    yield start
    for sock in servers + held:
        sock.close()


_POSTGRES_ERROR = b"E\x00\x00\x00\x2aSFATAL\x00C0A000\x00Munsupported frontend protocol\x00\x00"


@pytest.mark.parametrize(
    "address, says",
    [
        ("127.0.0.1:1", "cannot reach the Ray cluster at '127.0.0.1:1'"),
        ("ray://127.0.0.1:1", "cannot reach the Ray cluster at 'ray://127.0.0.1:1'"),
        ("silent", "does not answer as Ray within 0.5 s"),
        ("postgres", "is not Ray"),
    ],
    ids=["refused", "ray client refused", "a silent service", "another service"],
)
def test_a_ray_address_where_no_ray_answers_fails_fast_and_writes_nothing(
    tmp_path, monkeypatch, capsys, not_ray, address, says
):
    """Was: minutes of silent retries of a rewritten address, SIGTERM ignored meanwhile, and
    WAITING trials left in a study the corrected command had to --resume."""
    import time

    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    if address in ("silent", "postgres"):
        address = not_ray(None if address == "silent" else _POSTGRES_ERROR)
    config = tmp_path / "run.yaml"
    config.write_text(
        f"search:\n  executor: ray\n  ray_address: '{address}'\n  ray_connect_timeout_s: 0.5\n"
    )
    out = tmp_path / "o"
    start = time.perf_counter()
    code = main(["search", str(config), "--out", str(out), "--trials", "2", "-q"])
    elapsed = time.perf_counter() - start
    assert code == 2
    line = _one_line_error(capsys.readouterr().err)
    assert says in line and "fix --ray-address" in line, line
    assert elapsed < 10, elapsed
    assert not out.exists()  # nothing written before Ray answers


def test_the_ray_connect_timeout_is_checked_as_a_setting(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("search:\n  ray_connect_timeout_s: 0\n")
    assert main(["search", str(config), "--out", str(tmp_path / "o")]) == 2
    assert "search.ray_connect_timeout_s" in _one_line_error(capsys.readouterr().err)


# --- a full disk ---------------------------------------------------------------------------


@pytest.fixture
def full_disk():
    """``full_disk["full"] = True`` fills the disk under the study database: every write
    statement then fails with the error SQLite gives on a full disk (SQLITE_FULL, "database or
    disk is full"), raised where the driver raises it, so SQLAlchemy and Optuna wrap it as
    they would a real one."""
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    state = {"full": False}

    def before_execute(_conn, _cursor, statement, *_rest):
        if state["full"] and not statement.lstrip().upper().startswith(("SELECT", "PRAGMA")):
            raise sqlite3.OperationalError("database or disk is full")

    event.listen(Engine, "before_cursor_execute", before_execute)
    yield state
    event.remove(Engine, "before_cursor_execute", before_execute)


def test_a_full_disk_while_the_study_is_created_is_one_line_and_leaves_nothing(
    tmp_path, capsys, full_disk, mini_zoo_dir, mini_zoo
):
    full_disk["full"] = True
    out = tmp_path / "o"
    argv = ["demo", "--out", str(out), "--trials", "2", "--no-progress"]
    assert main([*argv, "--cache-dir", str(mini_zoo_dir)]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "no space left on the disk" in line and "run again" in line, line
    assert not out.exists()  # nothing that blocks the same command once there is room


def test_a_full_disk_mid_search_and_at_export_keeps_the_study_and_resumes(
    tmp_path, monkeypatch, capsys, full_disk, mini_zoo_dir, mini_zoo
):
    import errno

    from stitch_nas.export import _files
    from stitch_nas.search import StitchObjective

    calls = {"n": 0}
    evaluate = StitchObjective.__call__

    def fill_on_the_third(self, trial):  # the disk fills while the third trial runs
        calls["n"] += 1
        full_disk["full"] = calls["n"] >= 3
        return evaluate(self, trial)

    monkeypatch.setattr(StitchObjective, "__call__", fill_on_the_third)
    out = tmp_path / "o"
    argv = ["demo", "--out", str(out), "--no-export", "--no-progress", "--seed", "1"]
    argv += ["--cache-dir", str(mini_zoo_dir)]
    assert main([*argv, "--trials", "4"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "no space left on the disk for the study database" in line, line
    assert "rerun with --resume" in line, line
    storage = f"sqlite:///{out / 'study.db'}"
    kept = [t.number for t in optuna.load_study(study_name="o", storage=storage).trials
            if t.state.is_finished()]  # fmt: skip
    assert len(kept) >= 2, kept

    full_disk["full"] = False  # room again: --resume goes on from the kept trials
    monkeypatch.setattr(StitchObjective, "__call__", evaluate)
    assert main([*argv, "--trials", "4", "--resume"]) == 0
    capsys.readouterr()
    study = optuna.load_study(study_name="o", storage=storage)
    assert [t.number for t in study.trials if t.state.is_finished()][: len(kept)] == kept
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]

    def no_room(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(_files, "atomic_write", no_room)  # the export's weights
    assert main(["export", str(out), "--format", "safetensors", "-q"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "no space left on the disk writing" in line and "export again" in line, line
    models = out / "models"  # no network half-written, no temporary left behind
    assert not models.exists() or not list(models.iterdir()), list(models.iterdir())
    monkeypatch.undo()
    assert main(["export", str(out), "--format", "safetensors", "-q"]) == 0
    assert (out / "models").is_dir()


@pytest.mark.parametrize(
    "asked, left, cpus, memory_gb, expect, says",
    [
        (64, 50, 2, 100, 2, "2 CPU(s), 1 each"),
        (64, 3, 16, 100, 3, "3 trial(s) left"),
        (8, 50, 16, 2.5, 2, "2.5 GB of memory free, about 1.0 GB each"),
        (8, 50, 16, 0.2, 1, "0.2 GB of memory free"),  # never none: the driver runs anyway
        (2, 50, 16, 100, 2, None),
    ],
    ids=["cpus", "trials", "memory", "no memory", "fits"],
)
def test_workers_are_capped_by_trials_cpus_and_memory(asked, left, cpus, memory_gb, expect, says):
    from stitch_nas.search._ray_resources import fit_workers

    n, why = fit_workers(asked, left, cpus, 1.0, memory_gb * 2**30, 2**30)
    assert n == expect
    assert (says is None and why == []) or (says is not None and says in "; ".join(why)), why


@pytest.mark.slow  # starts Ray: 20-80 s on a 2-core machine
def test_workers_64_on_this_machine_start_no_more_than_it_has(
    tmp_path, monkeypatch, caplog, mini_zoo_dir, mini_zoo
):
    import logging
    import os

    pytest.importorskip("ray")
    from stitch_nas.pipeline import _executor

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    made = []
    real = _executor.executor_from_settings

    def keep(settings):
        made.append(real(settings))
        return made[-1]

    monkeypatch.setattr(_executor, "executor_from_settings", keep)
    out = tmp_path / "o"
    argv = ["demo", "--out", str(out), "--workers", "64", "--trials", "3", "--no-export", "-q"]
    with caplog.at_level(logging.WARNING, logger="stitch_nas.search._ray_executor"):
        assert main([*argv, "--cache-dir", str(mini_zoo_dir)]) == 0
    cpus = len(os.sched_getaffinity(0))
    started = made[0].last_run["workers"]
    assert 1 <= started <= min(cpus, 3), made[0].last_run
    warned = [r.getMessage() for r in caplog.records if "Ray worker(s), not 64" in r.getMessage()]
    assert len(warned) == 1 and f"starting {started} Ray worker(s)" in warned[0], warned


# --- read-only folders ---------------------------------------------------------------------


@pytest.fixture
def read_only():
    """``read_only(folder)`` makes ``folder`` read-only for this process until the test ends:
    a read-only bind mount as root (root ignores permission bits, not a read-only mount),
    chmod for anyone else."""
    import os

    undo = []

    def make(folder: Path) -> Path:
        if os.geteuid() != 0:
            paths = [folder, *folder.rglob("*")]
            for path in paths:
                path.chmod(path.stat().st_mode & ~0o222)
            undo.append(lambda: [p.chmod(p.stat().st_mode | 0o200) for p in paths])
        else:
            mount = ["mount", "--bind", str(folder), str(folder)]
            if subprocess.run(mount, capture_output=True).returncode != 0:
                pytest.skip("root without mount rights: no folder root cannot write in")
            undo.append(lambda: subprocess.run(["umount", str(folder)], check=True))
            remount = ["mount", "-o", "remount,ro,bind", str(folder)]
            subprocess.run(remount, check=True, capture_output=True)
        assert not _writes_in(str(folder))
        return folder

    yield make
    for step in reversed(undo):
        step()


def _wal_study_folder(folder: Path) -> Path:
    """:func:`_study_folder` in WAL mode, as every search writes its study."""
    import sqlite3

    _study_folder(folder)
    with sqlite3.connect(folder / "study.db") as conn:
        conn.execute("PRAGMA journal_mode=WAL")
    return folder


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


class _Rebuilt(Exception):
    """Raised instead of rebuilding the zoo: every check before it passed."""


def test_report_and_export_read_a_study_in_a_read_only_folder(
    tmp_path, monkeypatch, capsys, read_only
):
    from stitch_nas.pipeline import _folder as _pipeline

    def rebuild(*_args, **_kwargs):
        raise _Rebuilt

    monkeypatch.setattr(_pipeline, "_rebuild", rebuild)
    run = read_only(_wal_study_folder(tmp_path / "run"))
    before = _files(run)
    # was: "study.db is not a study database (unable to open database file); remove it ..."
    assert main(["report", str(run), "--no-test", "--out", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    assert (tmp_path / "report" / "report.html").is_file()
    export = ["export", str(run), "--format", "safetensors"]
    for argv in (["report", str(run), "--no-test"], export):
        assert main(argv) == 2
        line = _one_line_error(capsys.readouterr().err)
        assert "pass --out FOLDER" in line and str(run) in line, line
        assert "remove" not in line and "delete" not in line, line
    with pytest.raises(_Rebuilt):  # a dry run: every check up to the zoo's rebuild passes
        main(["export", str(run), "--format", "safetensors", "--out", str(tmp_path / "m")])
    assert _files(run) == before


def test_a_study_whose_latest_trials_are_in_its_wal_is_read_whole(tmp_path, read_only):
    """A run copied while its driver held the database: the last trials are only in
    ``study.db-wal``; read from the read-only copy they are all there."""
    import shutil

    from optuna.trial import create_trial

    from stitch_nas.pipeline import check_folder
    from stitch_nas.search import load_folder_study
    from stitch_nas.search._storage import open_storage

    live = tmp_path / "live"
    live.mkdir()
    storage = open_storage(f"sqlite:///{live / 'study.db'}")  # WAL, as a search opens it
    study = optuna.create_study(storage=storage, study_name="run", directions=["maximize"])
    for value in (0.1, 0.2, 0.3):
        study.add_trial(create_trial(value=value))
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("study.db", "study.db-wal", "study.db-shm"):  # while the pool holds it open
        shutil.copyfile(live / name, copy / name)
    assert (copy / "study.db-wal").stat().st_size > 0
    read_only(copy)
    check_folder(copy)
    assert [t.value for t in load_folder_study(copy).trials] == [0.1, 0.2, 0.3]


@pytest.mark.parametrize(
    "content", [b"not a database at all\n" * 20, b""], ids=["not SQLite", "empty tables"]
)
def test_a_study_file_that_cannot_be_read_is_never_advised_away(tmp_path, capsys, content):
    import sqlite3

    run = tmp_path / "run"
    run.mkdir()
    db = run / "study.db"
    if content:
        db.write_bytes(content)
    else:
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE results (x)")  # a user's own SQLite file
    before = db.read_bytes()
    for argv in (["report", str(run)], ["demo", "--out", str(run), "--trials", "2"]):
        assert main(argv) == 2
        line = _one_line_error(capsys.readouterr().err)
        assert str(db) in line and "left as it is" in line, line
        assert "remove" not in line and "delete" not in line, line
    assert db.read_bytes() == before


def test_a_read_only_models_folder_is_one_line_before_any_work(
    tmp_path, monkeypatch, capsys, read_only, no_rebuild
):
    from stitch_nas.pipeline import _run as _pipeline

    run = _study_folder(tmp_path / "run")
    (run / "models").mkdir()
    read_only(run / "models")
    assert main(["export", str(run), "--format", "safetensors"]) == 2  # before the rebuild
    line = _one_line_error(capsys.readouterr().err)
    assert f"{str(run / 'models')!r}" in line and "pass --out FOLDER" in line, line

    def no_data(*_args, **_kwargs):
        raise AssertionError("the data loaded before the export folder was checked")

    monkeypatch.setattr(_pipeline, "load_data", no_data)
    assert main(["demo", "--out", str(run), "--resume", "--trials", "3"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "the export folder" in line and "--no-export" in line, line


@pytest.mark.parametrize(
    "error",
    [
        PermissionError(13, "Permission denied", "/somewhere/report.html"),
        OSError(30, "Read-only file system", "/somewhere/report.html"),
    ],
    ids=["permission", "read-only"],
)
def test_a_write_refused_mid_command_is_one_line_naming_the_path(
    tmp_path, monkeypatch, capsys, error
):
    def write_report(*_args, **_kwargs):
        raise error

    monkeypatch.setattr("stitch_nas.report.write_report", write_report)
    run = _study_folder(tmp_path / "run")
    assert main(["report", str(run), "--no-test"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "cannot write '/somewhere/report.html'" in line and error.strerror in line, line
    assert "the study is untouched" in line, line


# --- Ctrl-C and SIGTERM --------------------------------------------------------------------

# the console command, with the phase a test interrupts patched in first
_PATCHED = """
import os, signal, sys, time
# Ctrl-C as a terminal delivers it: a child inherits an ignored SIGINT from its parent
signal.signal(signal.SIGINT, signal.default_int_handler)
from stitch_nas.cli import main
{patch}
sys.exit(main(sys.argv[1:]))
"""


def _console(patch: str, *argv: str) -> subprocess.Popen:
    code = _PATCHED.format(patch=patch)
    return subprocess.Popen(
        [sys.executable, "-c", code, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def test_ctrl_c_mid_trial_is_one_line_keeps_the_study_and_resumes(tmp_path, mini_zoo_dir, mini_zoo):
    """SIGINT while the second trial runs: no Optuna traceback, exit 130, and --resume goes on."""
    patch = """
from stitch_nas.search import StitchObjective
evaluate, calls = StitchObjective.__call__, []
def interrupted(self, trial):
    calls.append(1)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C sends
        time.sleep(5)
    return evaluate(self, trial)
StitchObjective.__call__ = interrupted
import atexit
def uninterrupted():  # says why, should the run end without the second trial
    if len(calls) < 2:
        print(f"the objective ran {len(calls)} time(s)", file=sys.stderr)
atexit.register(uninterrupted)
"""
    out = tmp_path / "o"
    argv = ["demo", "--out", str(out), "--trials", "3", "--no-export", "-q", "--seed", "1"]
    argv += ["--cache-dir", str(mini_zoo_dir)]
    run = _console(patch, *argv)
    _, err = run.communicate(timeout=600)
    assert run.returncode == 130, err
    line = err.strip()
    assert "\n" not in line and "Traceback" not in err, err  # was: Optuna's 30-line traceback
    kept = f"the study in {out / 'study.db'} is kept: continue it with --resume"
    assert line == f"stitch-nas: interrupted; {kept}", line
    study = optuna.load_study(study_name="o", storage=f"sqlite:///{out / 'study.db'}")
    assert sum(t.state.is_finished() for t in study.trials) >= 1
    assert main([*argv, "--resume"]) == 0


def test_ctrl_c_before_the_study_exists_leaves_nothing_and_says_so(tmp_path, monkeypatch, capsys):
    from stitch_nas.pipeline import _run as _pipeline

    def prepare(*_args, **_kwargs):  # the zoo loading, 5 s in
        raise KeyboardInterrupt

    monkeypatch.setattr(_pipeline, "_prepare", prepare)
    out = tmp_path / "o"
    argv = ["demo", "--out", str(out), "--trials", "2", "--no-progress"]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert err == (
        f"stitch-nas: interrupted; stopped before the study was made; nothing was kept in {out}: "
        "run again\n"
    )
    assert not out.exists()  # so the same command runs, and --resume would be refused
    monkeypatch.undo()
    from stitch_nas.pipeline import check_run
    from stitch_nas.settings import Settings

    check_run(Settings(), out, resume=False, join=False)  # the plain rerun is not refused


def test_sigterm_while_the_zoo_loads_ends_at_once_and_leaves_nothing(tmp_path):
    import signal
    import time

    patch = """
from stitch_nas.pipeline import _run
def prepare(*args, **kwargs):
    print("loading", flush=True)
    time.sleep(120)
_run._prepare = prepare
"""
    out = tmp_path / "o"
    run = _console(patch, "demo", "--out", str(out), "--trials", "2", "-q")
    assert run.stdout is not None
    assert run.stdout.readline().strip() == "loading"
    start = time.perf_counter()
    run.send_signal(signal.SIGTERM)
    assert run.stderr is not None
    err = run.stderr.readline()  # said (and the folder undone) at once; the interpreter's
    assert time.perf_counter() - start < 5  # own teardown after torch takes its time
    err += run.communicate(timeout=60)[1]
    assert run.returncode == 143, err
    nothing = f"stopped before the study was made; nothing was kept in {out}: run again"
    assert err == f"stitch-nas: terminated; {nothing}\n", err
    assert not out.exists()
