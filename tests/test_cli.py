"""The command line: every user error is one line on stderr and exit code 2, no traceback."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from stitch_nas import errors
from stitch_nas.cli import main
from stitch_nas.settings import load_settings, settings_from_dict


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    "text, match",
    [
        ("search: {trails: 5}\n", "search.trails"),
        ("search: {trials: five}\n", "search.trials must be int"),
        ("zoo: {mini_zoo: 1}\n", "zoo.mini_zoo must be bool"),
        ("model: {}\n", "unknown section 'model'"),
        ("search: [1, 2\n", "not valid YAML"),
        ("- 1\n- 2\n", "mapping"),
        ("search: {probe_threshold: -1}\n", "search.probe_threshold=-1.0: give a multiple"),
        ("search: {seed_trials: -1}\n", "search.seed_trials=-1: give an integer >= 0"),
        ("search: {cache_memory_gb: lots}\n", "search.cache_memory_gb must be a number"),
        ("search: {seed_pool: 2.5}\n", "search.seed_pool must be a whole number"),
        ("search: {seed_trials: 8, seed_pool: 4}\n", "search.seed_pool=4: give at least"),
        ("search: {refine_trials: -2}\n", "search.refine_trials=-2: give an integer >= 0"),
        (
            "search: {refine_trials: 2, refine_adapters: [{kind: lstsq}]}\n",
            "search.refine_adapters[0].kind='lstsq' does not train",
        ),
        (
            "search: {refine_trials: 2, refine_adapters: [{kind: linear, stepz: 3}]}\n",
            "stepz",
        ),
        ("finetune: {networks: 0}\n", "finetune.networks=0: give an integer >= 1"),
        ("finetune: {epochs: 3}\n", "unknown key finetune.epochs"),
        ("finetune: {recipe: 3}\n", "finetune.recipe must be a mapping"),
        ("finetune: {recipe: {lr: -1}}\n", "finetune.recipe.lr=-1 is invalid"),
        ("finetune: {recipe: {epoch: 3}}\n", "unknown finetune.recipe key 'epoch'"),
    ],
)
def test_bad_config_files_exit_2_with_one_line(capsys, tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    code, _, err = _run(capsys, "search", str(path), "--out", str(tmp_path / "out"))
    assert code == 2
    assert match in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # nothing half-made


def test_missing_config_file_and_report_folder(capsys, tmp_path):
    code, _, err = _run(capsys, "search", str(tmp_path / "nope.yaml"))
    assert code == 2 and "does not exist" in err
    code, _, err = _run(capsys, "report", str(tmp_path / "empty"))
    assert code == 2 and "holds no study" in err


def test_missing_data_folder_exits_2(capsys, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(f"data: {{kind: image_folder, root: {tmp_path / 'no_such_dir'}}}\n")
    code, _, err = _run(capsys, "search", str(path), "--out", str(tmp_path / "o"))
    assert code == 2 and "no_such_dir" in err


def test_settings_defaults_and_example_file_parse():
    settings = settings_from_dict({})
    assert settings.search.trials == 50 and settings.data.kind == "digits"
    example = load_settings("examples/search.yaml")
    assert example.search.objectives == ["accuracy", "macs"]
    with pytest.raises(errors.ConfigError, match="search.space_options must be dict"):
        settings_from_dict({"search": {"space_options": [1]}})


@pytest.mark.skipif(shutil.which("stitch-nas") is None, reason="console script not installed")
def test_console_script_exit_code_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("search: {sampler: 3}\n")
    proc = subprocess.run(["stitch-nas", "search", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "search.sampler must be str" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_zoo_entry_fails_before_any_zoo_build(capsys, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        f"zoo: {{cache_dir: {tmp_path / 'cache'}, models: [{{source: hf, model: resnet18}}]}}\n"
    )
    code, _, err = _run(capsys, "search", str(path), "--out", str(tmp_path / "o"))
    assert code == 2 and "source" in err and "hf" in err
    assert not (tmp_path / "cache").exists()  # failed before the mini zoo was built


def _printout_skeleton(text: str) -> list[str]:
    """What a printout says whatever the run measured: its unindented lines (headings, the
    phases, the rules) with every number masked and spaces collapsed; table rows, indented
    lines (the claims, one per zoo model) and the optional stitched-alone heading left out."""
    lines = []
    for line in text.splitlines():
        if not line.strip() or line[0].isspace() or line.startswith("Stitched networks alone"):
            continue
        masked = re.sub(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e-?\d+)?[KMG]?", "N", line)
        masked = re.sub(r"study '[^']*'", "study 'OUT'", masked)
        masked = re.sub(r"\((?:N [A-Z]+(?:, )?)+\)", "(STATES)", masked)  # 44 COMPLETE, 6 PRUNED
        if not re.match(r"^\S+ +N \[N, N\]", masked):  # a zoo model's row
            lines.append(" ".join(masked.split()))
    return lines


def _page_printout(page: str, heading: str) -> str:
    """The first code block after ``heading`` on ``docs/<page>``, as the site renders it."""
    from tests._docs_scripts import SCRIPTS, load_docs_script

    text = load_docs_script("figures").render((SCRIPTS.parent / page).read_text())
    after = text[text.index(heading) :]
    start = after.index("\n```\n") + len("\n```\n")
    return after[start : after.index("\n```", start)]


def test_demo_end_to_end(capsys, monkeypatch, tmp_path, mini_zoo, mini_zoo_dir, digits):
    """The README's main job on the session's zoo: files, a stitched front, a report."""
    import json

    import torch

    from stitch_nas import load
    from stitch_nas.stitching._measure import LOW_PRECISION_TOLERANCE

    out = tmp_path / "demo"
    code, stdout, _ = _run(
        capsys, "demo", "--out", str(out), "--cache-dir", str(mini_zoo_dir), "--no-progress"
    )
    assert code == 0
    for name in ("pareto.json", "trials.csv", "pareto.png", "study.db"):
        assert (out / name).is_file(), name
    report = json.loads((out / "pareto.json").read_text())
    stitched = [f for f in report["front"] if len(set(f["models"])) >= 2]
    assert stitched, report["front"]
    assert "hypervolume" in stdout and "dominat" in stdout
    rows = (out / "trials.csv").read_text().splitlines()
    assert len(rows) >= 51 and "state" in rows[0]
    code, again, _ = _run(capsys, "report", str(out))
    assert code == 0 and "hypervolume" in again
    import stitch_nas.pipeline

    asked, report_folder = {}, stitch_nas.pipeline.report_folder
    monkeypatch.setattr(
        stitch_nas.pipeline,
        "report_folder",
        lambda *args, **kwargs: asked.update(kwargs) or report_folder(*args, **kwargs),
    )
    assert _run(capsys, "-q", "report", str(out))[0] == 0 and asked["progress"] is False
    # the demo ends by exporting its front: one folder per front network and an elastic package
    exported = sorted(p.name for p in (out / "models").iterdir())
    assert "elastic" in exported and f"trial_{report['front'][0]['number']}" in exported
    assert "exported" in stdout
    # where the run's time went: every phase, in order, kept on the study and printed
    from stitch_nas import attrs
    from stitch_nas.search import load_folder_study

    phases = load_folder_study(out).user_attrs[attrs.PHASES]
    assert list(phases) == [
        "zoo and data",
        "seeding",
        "trials",
        "refining",
        "test pass",
        "report",
        "export",
    ]
    assert phases["trials"]["seconds"] > 0 and phases["export"]["seconds"] > 0
    peaks = [row["peak_rss_gb"] for row in phases.values()]
    assert peaks[0] > 0 and peaks == sorted(peaks)  # the process's peak so far never falls
    assert "phases: zoo and data" in stdout and "peak memory" in stdout
    # Getting started shows this printout: a change to what the demo prints changes that page
    # or fails here (its figures differ between runs and machines; its lines may not)
    shown = _page_printout("getting-started.md", "## What the demo prints")
    ran = _printout_skeleton(stdout.replace(str(out), "demo_out"))
    assert len(ran) > 15 and ran == _printout_skeleton(shown), (
        "the demo prints other lines than Getting started shows: run benchmarks/demo.py, which "
        "keeps its printout in benchmarks/results/demo.json"
    )
    # every front row carries both figures, each inside its 95 % interval, on the whole splits
    n_val, n_test = len(digits.val.y), len(digits.test.y)
    for row in report["front"]:
        assert (row["val_images"], row["test_images"]) == (n_val, n_test), row
        for acc in ("accuracy", "test_accuracy"):
            low, high = row[f"{acc}_interval"]
            assert 0.0 <= low <= row[acc] <= high <= 1.0 and low < high, row
    # the exported stitched front networks load and score what the front says they score. The
    # search stores activations in float16, so a network recomputed in float32 may flip a
    # near-tie: within reproduces()' tolerance, or two images on a split too small for it (the
    # 369 test images: trial_56 of this demo once, 156 vs 155 correct; trial_21 once, 243 vs
    # 245, after least squares summed its columns in float32 blocks)
    for row in stitched:
        folder = out / "models" / f"trial_{row['number']}"
        loaded = load(folder)
        assert loaded.metrics["accuracy"] == row["accuracy"]
        assert loaded.metrics["test_accuracy"] == pytest.approx(row["test_accuracy"], abs=1e-9)
        with torch.no_grad():
            for split, key in ((digits.val, "accuracy"), (digits.test, "test_accuracy")):
                acc = int((loaded(split.x).argmax(1) == split.y).sum()) / len(split.y)
                # (+1e-6: the recorded figure is a float32)
                tolerance = max(LOW_PRECISION_TOLERANCE, 2 / len(split.y) + 1e-6)
                assert abs(acc - row[key]) <= tolerance, (folder.name, key, acc, row[key])
    code, stdout, _ = _run(capsys, "export", str(out), "--trials", "0,zero")
    assert code == 2
    code, _, err = _run(capsys, "demo", "--out", str(out), "--cache-dir", str(mini_zoo_dir))
    assert code == 2 and "--resume" in err  # an existing study is never overwritten


def test_search_with_a_small_activation_cache_spills_to_its_folder(
    capsys, tmp_path, mini_zoo, mini_zoo_dir
):
    spill = tmp_path / "acts"
    config = tmp_path / "c.yaml"
    config.write_text(
        f"zoo: {{cache_dir: {mini_zoo_dir}}}\n"
        f"search: {{trials: 4, cache_memory_gb: 0.004, cache_dir: {spill}, sampler: random}}\n"
    )
    code, out, err = _run(
        capsys, "search", str(config), "--out", str(tmp_path / "o"), "--no-progress"
    )
    assert code == 0, err
    assert list(spill.glob("*.npy")) and "hypervolume" in out
    config.write_text("search: {cache_memory_gb: lots}\n")
    code, _, err = _run(capsys, "search", str(config))
    assert code == 2 and "search.cache_memory_gb must be a number" in err


def test_search_with_snnet_joint_training_exports_from_a_fresh_context(
    capsys, tmp_path, mini_zoo, mini_zoo_dir, digits
):
    """`stitch-nas export` rebuilds the zoo and retrains the SN-Net: the same weights, seeded."""
    config = tmp_path / "c.yaml"
    config.write_text(
        f"zoo: {{cache_dir: {mini_zoo_dir}}}\n"
        "search: {trials: 4, sampler: random, export: false, space: snnet,\n"
        "         space_options: {joint: {steps: 30}}}\n"
    )
    out = tmp_path / "o"
    code, stdout, err = _run(capsys, "search", str(config), "--out", str(out), "--no-progress")
    assert code == 0, err
    assert "-snnet->" in stdout
    # the export re-measures each network and refuses one that differs from the trial's
    code, stdout, err = _run(capsys, "export", str(out), "--no-progress", "--format", "safetensors")
    assert code == 0, err
    assert (out / "models").is_dir() and "exported" in stdout
    # what it exported: the Pareto front of pareto.json, one folder each, each loading as the
    # network whose figures the front records (an SN-Net stitch among them)
    import json

    import torch

    from stitch_nas import load
    from stitch_nas.stitching._measure import LOW_PRECISION_TOLERANCE

    front = {
        f"trial_{r['number']}": r for r in json.loads((out / "pareto.json").read_text())["front"]
    }
    folders = {p.name for p in (out / "models").iterdir() if p.name.startswith("trial_")}
    assert folders == set(front), (folders, set(front))
    assert any("-snnet->" in row["describe"] for row in front.values()), front
    for name, row in front.items():
        loaded = load(out / "models" / name)
        assert loaded.metrics["accuracy"] == row["accuracy"], name
        with torch.no_grad():
            correct = int((loaded(digits.val.x).argmax(1) == digits.val.y).sum())
        assert abs(correct / len(digits.val.y) - row["accuracy"]) <= LOW_PRECISION_TOLERANCE


# --- per-run flags over the YAML file -------------------------------------------------------


class _Captured:
    def table(self) -> str:
        return "captured"


@pytest.fixture
def captured(monkeypatch):
    """What the CLI hands to the pipeline, without running it."""
    from stitch_nas.pipeline import _run as _pipeline

    seen: dict = {}

    def run_settings(settings, out_dir, **kwargs):
        seen.update(settings=settings, out_dir=out_dir, **kwargs)
        return _Captured()

    import stitch_nas.pipeline

    monkeypatch.setattr(_pipeline, "run", run_settings)
    monkeypatch.setattr(stitch_nas.pipeline, "run", run_settings)  # the face keeps what it read
    return seen


def test_run_flags_override_the_yaml_file(capsys, tmp_path, captured):
    path = tmp_path / "c.yaml"
    path.write_text(
        "search: {device: cpu, cka_threshold: 0.3, objectives: [accuracy, macs], "
        "budgets: {params: 5}}\n"
    )
    argv = ["search", str(path), "--out", str(tmp_path / "o"), "--device", "cuda:1"]
    argv += ["--cka-threshold", "0.5", "--objectives", "accuracy,params,latency"]
    argv += ["--budget", "macs=2e6", "--budget", "params=1e5", "--study-name", "exp-1"]
    argv += ["--join", "-q", "--fidelity", "0", "--autocast", "bfloat16", "--proxy-candidates", "1"]
    code, out, _ = _run(capsys, *argv)
    assert code == 0 and "captured" in out
    search = captured["settings"].search
    assert search.device == "cuda:1" and search.cka_threshold == 0.5
    assert search.objectives == ["accuracy", "params", "latency"]
    assert search.budgets == {"macs": 2e6, "params": 1e5}
    assert search.study_name == "exp-1" and search.fidelity == 0.0
    assert search.autocast == "bfloat16" and search.proxy_candidates == 1
    assert captured["join"] is True and captured["resume"] is False
    assert captured["progress"] is False  # -q after the command
    code, _, _ = _run(capsys, "-q", "demo", "--out", str(tmp_path / "d"))  # -q before it
    assert code == 0 and captured["progress"] is False
    assert captured["settings"].search.cka_threshold == 0.0  # the default, untouched
    assert captured["settings"].search.proxy_candidates == 8
    code, _, _ = _run(capsys, "demo", "--out", str(tmp_path / "d"))
    assert code == 0 and captured["progress"] is True


BAD_FLAGS = [
    (["--device", "gpu"], "--device 'gpu': use auto, cpu, cuda, cuda:N or mps"),
    (["--autocast", "float16"], "--autocast 'float16' is not supported; use bfloat16"),
    (["--cka-threshold", "1.5"], "--cka-threshold=1.5: give a value in [0, 1]"),
    (["--cka-threshold", "high"], "--cka-threshold: invalid float value: 'high'"),
    (["--probe-threshold", "-1"], "--probe-threshold=-1.0: give a multiple of chance >= 0"),
    (["--probe-threshold", "low"], "--probe-threshold: invalid float value: 'low'"),
    (["--proxy-candidates", "0"], "--proxy-candidates=0: give an integer >= 1 (1: the sampler"),
    (["--fidelity", "1"], "--fidelity=1.0: give a share of the split in [0, 1); 0 turns it off"),
    (["--fidelity", "half"], "--fidelity: invalid float value: 'half'"),
    (["--objectives", "accuracy,flops"], "unknown objective 'flops'"),
    (["--objectives", "macs,macs"], "--objectives names 'macs' twice"),
    (["--objectives", ","], "--objectives=[]: give a list of names"),
    (["--budget", "flops=3"], "--budget: unknown budget 'flops'; budgets exist for macs, params"),
    (["--budget", "macs=2M"], "--budget: macs='2M' must be a positive number of MACs"),
    (["--budget", "macs=-1"], "--budget: macs='-1' must be a positive number"),
    (["--budget", "macs=1", "--budget", "macs=2"], "--budget macs is given twice"),
    (["--budget", "macs"], "--budget 'macs': use KEY=VALUE"),
    (["--study-name", " "], "--study-name=' ': give a non-empty name"),
    (["--resume", "--join"], "--resume and --join exclude each other"),
]


def test_bad_flag_values_are_one_line_errors_before_torch_loads(tmp_path):
    """Each bad value: exit 2, one line naming it, torch never imported, in well under 1 s."""
    import json
    import sys

    script = (
        "import json, sys, time\n"
        "from stitch_nas.cli import main\n"
        "cases, out = json.loads(sys.argv[1]), []\n"
        "for argv in cases:\n"
        "    start = time.perf_counter()\n"
        "    try:\n"
        "        code = main(['demo', '--out', sys.argv[2], *argv])\n"
        "    except SystemExit as stop:  # the parser's own errors\n"
        "        code = stop.code\n"
        "    out.append([code, time.perf_counter() - start, 'torch' in sys.modules])\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps([a for a, _ in BAD_FLAGS]), str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    errs = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errs) == len(BAD_FLAGS) and "Traceback" not in proc.stderr, proc.stderr
    for (argv, match), (code, seconds, torch_loaded), err in zip(
        BAD_FLAGS, results, errs, strict=True
    ):
        assert code == 2, argv
        assert match in err, (argv, err)
        assert not torch_loaded, argv
        assert seconds < 0.5, (argv, seconds)
    assert not (tmp_path / "o").exists()


def test_version_flag(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"stitch-nas {version('stitch-nas')}"


def test_a_taken_study_name_is_refused_before_the_zoo_is_built(capsys, tmp_path):
    import optuna

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    optuna.create_study(storage=url, study_name="exp", directions=["maximize", "minimize"])
    argv = ["demo", "--storage", url, "--study-name", "exp", "--out", str(tmp_path / "o")]
    argv += ["--cache-dir", str(tmp_path / "no_zoo_here")]
    code, _, err = _run(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "already holds a study named 'exp'; pass --resume (or --join" in err
    assert not (tmp_path / "no_zoo_here").exists()  # refused before any zoo build
    code, _, err = _run(capsys, "demo", "--device", "cuda:7", "--out", str(tmp_path / "p"))
    assert code == 2 and "device 'cuda:7' is not available here" in err
    bad = tmp_path / "device.yaml"
    bad.write_text("search: {device: gpu}\n")
    code, _, err = _run(capsys, "search", str(bad), "--out", str(tmp_path / "q"))
    assert code == 2 and "search.device 'gpu': use auto, cpu, cuda, cuda:N or mps" in err
    bad.write_text("search: {autocast: float16}\n")
    code, _, err = _run(capsys, "search", str(bad), "--out", str(tmp_path / "q"))
    assert code == 2 and "search.autocast 'float16' is not supported; use bfloat16" in err
    bad.write_text("search: {autocast: bfloat16, device: mps}\n")
    code, _, err = _run(capsys, "search", str(bad), "--out", str(tmp_path / "q"))
    assert code == 2 and "search.autocast 'bfloat16' is not supported on device 'mps'" in err


def test_autocast_reaches_the_search_context(monkeypatch, capsys, tmp_path, mini_zoo_dir):
    from stitch_nas.errors import ConfigError
    from stitch_nas.pipeline import _run as _pipeline

    seen: dict = {}

    def context(*args, **kwargs):  # stops the run once the context's settings are known
        seen.update(kwargs)
        raise ConfigError("stop")

    monkeypatch.setattr(_pipeline, "StitchContext", context)
    argv = ["--autocast", "bfloat16", "--cache-dir", str(mini_zoo_dir), "--no-progress"]
    code, _, err = _run(capsys, "demo", "--out", str(tmp_path / "d"), *argv)
    assert code == 2 and "stop" in err
    assert seen["autocast"] == "bfloat16"


def test_device_auto_is_cuda_when_present_else_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from stitch_nas.choices import DEVICE_PATTERN
    from stitch_nas.pipeline import _run as _pipeline

    assert DEVICE_PATTERN.fullmatch("auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _pipeline._check_device("auto") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert _pipeline._check_device("auto") == "cuda"
    assert _pipeline._resolve_device("cuda:0") == "cuda:0"


PROBE_THRESHOLD = 8.0  #: x chance (0.1 on the digits): a floor of 0.8, above the 0.15 default


def test_report_and_export_read_a_study_kept_in_a_journal_file(
    capsys, tmp_path, mini_zoo, mini_zoo_dir, digits
):
    """A search run with --storage keeps its study there; report and export read it back.

    The same run also checks a valid --sampler nsga2 and --probe-threshold (the study's trials
    were sampled by NSGA-II, and pruned exactly where their probe accuracy is below the floor
    given), `export --elastic`, and `report` measuring the test figures a study lacks, or
    refusing to when a rebuilt network does not reproduce its validation accuracy."""
    import json

    import optuna
    import torch
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    from stitch_nas import attrs, load
    from stitch_nas.export import ElasticNet

    out, journal = tmp_path / "run", tmp_path / "study.log"
    config = tmp_path / "search.yaml"  # the demo's settings, two seeded trials of six, not six
    config.write_text("search: {seed_trials: 2}\n")
    argv = ["--out", str(out), "--cache-dir", str(mini_zoo_dir), "--no-progress"]
    argv += ["--sampler", "nsga2", "--probe-threshold", str(PROBE_THRESHOLD)]
    code, _, err = _run(
        capsys,
        "search",
        str(config),
        *argv,
        "--trials",
        "6",
        "--no-export",
        "--storage",
        str(journal),
    )
    assert code == 0, err
    assert not (out / "study.db").exists()
    storage = JournalStorage(JournalFileBackend(str(journal)))
    study = optuna.load_study(study_name="run", storage=storage)
    # --sampler nsga2: recorded in the settings, and NSGA-II sampled every trial (it numbers
    # each trial's generation; TPE and random sampling leave no such mark)
    assert study.user_attrs[attrs.SETTINGS]["search"]["sampler"] == "nsga2"
    generation = optuna.samplers.NSGAIISampler._get_generation_key()
    sampled = [t for t in study.trials if "fixed_params" not in t.system_attrs]  # not seeded
    assert len(sampled) >= 4 and all(generation in t.system_attrs for t in sampled), sampled
    # --probe-threshold 8: a stitch is pruned exactly when its probe accuracy is below 0.8
    assert study.user_attrs[attrs.SETTINGS]["search"]["probe_threshold"] == PROBE_THRESHOLD
    floor = PROBE_THRESHOLD / digits.num_classes
    probed = [t for t in study.trials if attrs.PROBE_ACCURACY in t.user_attrs]
    assert probed, [t.user_attrs for t in study.trials]
    for trial in probed:
        reason = trial.user_attrs.get(attrs.PRUNE_REASON, "")
        below = trial.user_attrs[attrs.PROBE_ACCURACY] < floor
        assert below == reason.startswith("probe accuracy"), (trial.number, trial.user_attrs)
        if below:
            assert reason.endswith(f"< {floor:.3f}"), reason
    pruned = [t for t in probed if t.user_attrs[attrs.PROBE_ACCURACY] < floor]
    kept = [t for t in probed if t.user_attrs[attrs.PROBE_ACCURACY] >= floor]
    assert pruned and kept, [t.user_attrs[attrs.PROBE_ACCURACY] for t in probed]

    code, _, err = _run(capsys, "report", str(out), "--no-test")
    assert code == 2 and "--storage" in err  # the folder alone does not hold the study
    code, stdout, err = _run(capsys, "report", str(out), "--no-test", "--storage", str(journal))
    assert code == 0 and "hypervolume" in stdout, err
    code, stdout, err = _run(
        capsys,
        "export",
        str(out),
        "--storage",
        str(journal),
        "--format",
        "safetensors",
        "--elastic",
    )
    assert code == 0 and "exported" in stdout, err
    front = json.loads((out / "pareto.json").read_text())["front"]
    exported = {p.name for p in (out / "models").iterdir()}
    assert exported == {f"trial_{r['number']}" for r in front} | {"elastic"}, exported
    # --elastic: one package holding every exported network, each with its trial's figures
    package = load(out / "models" / "elastic")
    assert isinstance(package, ElasticNet)
    rows = {r["name"]: r for r in package.configs()}
    assert set(rows) == exported - {"elastic"}
    for row in front:
        assert rows[f"trial_{row['number']}"]["accuracy"] == row["accuracy"]
        package.select(trial=row["number"])
        with torch.no_grad():
            assert package(digits.val.x[:4]).shape == (4, digits.num_classes)

    # `report DIR` measures the test figures a study lacks (zoo models and front networks) ...
    test_results = dict(study.user_attrs[attrs.TEST_RESULTS])
    references = study.user_attrs[attrs.REFERENCES]
    assert test_results and all(attrs.TEST_ACCURACY in r for r in references)
    study.set_user_attr(attrs.TEST_RESULTS, {})
    study.set_user_attr(
        attrs.REFERENCES,
        [{k: v for k, v in r.items() if k != attrs.TEST_ACCURACY} for r in references],
    )
    code, stdout, err = _run(capsys, "report", str(out), "--storage", str(journal))
    assert code == 0, err
    assert (
        f"measured {len(test_results)} front network(s) and {len(references)} zoo model(s)"
        in stdout
    )
    again = optuna.load_study(study_name="run", storage=storage)
    assert again.user_attrs[attrs.TEST_RESULTS] == test_results
    assert again.user_attrs[attrs.REFERENCES] == references
    # ... and refuses to when a rebuilt network does not measure the validation accuracy the
    # search recorded (another zoo, data or fuse setting): no test figure of another network
    tampered = [{k: v for k, v in r.items() if k != attrs.TEST_ACCURACY} for r in references]
    tampered[0]["accuracy"] = 0.5
    tampered[0]["sample_correct"] //= 2  # the figure a rebuilt network is checked against
    again.set_user_attr(attrs.REFERENCES, tampered)
    code, _, err = _run(capsys, "report", str(out), "--storage", str(journal))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{tampered[0]['name']}: the rebuilt network measures validation accuracy" in err

    code, _, err = _run(
        capsys, "report", str(out), "--storage", str(journal), "--study-name", "other"
    )
    assert code == 2 and "no study named 'other'" in err and "'run'" in err
    missing = tmp_path / "typo.log"
    code, _, err = _run(capsys, "export", str(out), "--storage", str(missing))
    assert code == 2 and "typo.log" in err and len(err.strip().splitlines()) == 1
    assert not missing.exists()  # never created by reading


def test_zoo_list_prints_each_model_and_zoo_build_builds_only_what_is_missing(
    capsys, tmp_path, monkeypatch, mini_zoo, mini_zoo_dir
):
    import json

    from stitch_nas.files import sha256_file
    from stitch_nas.zoo import _mini

    trained: list[str] = []
    train = _mini._train
    monkeypatch.setattr(_mini, "_train", lambda name, *a: trained.append(name) or train(name, *a))
    # one line per model, in build order: name, source, parameters, input size; no training
    code, listed, err = _run(capsys, "-q", "zoo", "list", "--cache-dir", str(mini_zoo_dir))
    assert code == 0 and not trained, err
    lines = listed.strip().splitlines()
    assert [line.split()[0] for line in lines] == mini_zoo.names()
    for line, entry in zip(lines, mini_zoo.values(), strict=True):
        assert line.split()[1:] == [
            "mini_zoo",
            f"{entry.num_params:,d}",
            "params",
            "input",
            "(32,",
            "32)",
        ], line
    # build: a cache that never held one model trains that model only, and records it
    cache = tmp_path / "cache"
    (cache / "mini_zoo").mkdir(parents=True)
    for path in (mini_zoo_dir / "mini_zoo").iterdir():
        if path.name != "byobnet.safetensors":
            (cache / "mini_zoo" / path.name).write_bytes(path.read_bytes())
    manifest = json.loads((cache / "mini_zoo" / "manifest.json").read_text())
    del manifest["models"]["byobnet"]
    (cache / "mini_zoo" / "manifest.json").write_text(json.dumps(manifest))
    code, built, err = _run(capsys, "-q", "zoo", "build", "--cache-dir", str(cache))
    assert code == 0 and trained == ["byobnet"], err
    assert built == listed
    weights = cache / "mini_zoo" / "byobnet.safetensors"
    manifest = json.loads((cache / "mini_zoo" / "manifest.json").read_text())
    record = manifest["models"]["byobnet"]
    assert record["sha256"] == sha256_file(weights)
    assert record["num_params"] == mini_zoo["byobnet"].num_params
    assert record["val_accuracy"] > 0.85


# --- demo --space: every registered space through the demo's path ---------------------------

#: the trial parameters by which each registered space samples (its configs' shape is checked
#: below); a space registered without an entry here fails the test that lists them
SPACE_PARAMS = {
    "pairwise": {"route"},
    "chain": {"n_fragments"},
    "gap": {"route"},
    "restnet": {"pair", "budget_fraction"},
    "snnet": {"snnet_stitch"},
    "stitchnet": {"stitchnet_rank"},
    "traft": {"traft_point"},
}

#: the demo's options per space (``_DEMO_SPACE_OPTIONS``) with the training budgets cut to a
#: few steps and StitchNet's recursion to two models: the same options, tiny trials
TINY_DEMO_OPTIONS = {
    "chain": {"max_fragments": 3},
    "stitchnet": {"max_joints": 1, "models": ["resnet", "efficientnet"]},
    "gap": {"adapter_options": {"steps": 3}},
    "restnet": {"adapter_options": {"steps": 3}},
    "traft": {"adapter_options": {"steps": 3}},
    "snnet": {"joint": {"steps": 5}},
}


def test_every_registered_space_has_a_demo_test():
    import search_spaces
    from stitch_nas.cli._main import _DEMO_SPACE_OPTIONS

    assert set(SPACE_PARAMS) == set(search_spaces.list_spaces())
    for space, options in _DEMO_SPACE_OPTIONS.items():  # the tiny options cut only sizes
        assert set(options) <= set(TINY_DEMO_OPTIONS[space]), space


@pytest.mark.parametrize("space", sorted(SPACE_PARAMS))
def test_demo_space_samples_and_measures_configs_of_that_space(
    capsys, tmp_path, monkeypatch, mini_zoo, mini_zoo_dir, space
):
    """`stitch-nas demo --space S` up to its trials (two, not seeded), the test pass, report and
    export left out: what the demo samples is of S's shape, and is measured."""
    import optuna

    from stitch_nas import attrs
    from stitch_nas.cli import _main
    from stitch_nas.pipeline import _run as _pipeline
    from stitch_nas.search import run_search

    seen: dict = {}

    def trials_only(settings, out_dir, ctx, objective, study, *args):
        seen.update(settings=settings, study=run_search(objective, study, settings.search.trials))
        return _Captured()

    monkeypatch.setattr(_pipeline, "_search", trials_only)
    monkeypatch.setattr(_main, "_DEMO_SPACE_OPTIONS", TINY_DEMO_OPTIONS)
    argv = ["demo", "--space", space, "--trials", "2", "--out", str(tmp_path / "o"), "-q"]
    argv += ["--cache-dir", str(mini_zoo_dir), "--fidelity", "0", "--probe-threshold", "0"]
    code, _, err = _run(capsys, *argv)
    assert code == 0, err
    assert seen["settings"].search.space == space
    assert seen["settings"].search.space_options == TINY_DEMO_OPTIONS.get(space, {})
    study = seen["study"]
    assert study.user_attrs[attrs.SPACE] == space
    states = [t.state for t in study.trials]
    assert optuna.trial.TrialState.FAIL not in states, [t.user_attrs for t in study.trials]
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert done, [t.user_attrs for t in study.trials]
    for trial in study.trials:
        assert SPACE_PARAMS[space] <= set(trial.params), (space, trial.params)
        config = trial.user_attrs[attrs.CONFIG]
        models = [f["model"] for f in config["fragments"]]
        kinds = [a["kind"] for a in config["adapters"]]
        assert len(kinds) == len(models) - 1 and set(models) <= set(mini_zoo.names())
        if space == "chain":
            assert len(models) == trial.params["n_fragments"] <= 3 and set(kinds) <= {"lstsq"}
        elif space == "stitchnet":
            assert len(models) <= 2 and set(models) <= {"resnet", "efficientnet"}
        elif space == "snnet":
            assert kinds == ["snnet"], config
        else:  # one joint
            assert len(models) == 2, config
        if space == "pairwise":
            assert models[0] != models[1] and kinds == ["lstsq"]
        if space in ("gap", "restnet", "traft"):  # trained joints train as the demo says
            trained = [a for a in config["adapters"] if a["kind"] != "lstsq"]
            assert all(dict(a["options"]).get("steps") == 3 for a in trained), config


def test_run_from_python_is_stitch_nas_search(capsys, tmp_path, mini_zoo, mini_zoo_dir):
    """``stitch_nas.run(file, dir)`` is the library's ``stitch-nas search file --out dir``:
    the same trials, the same figures, the same front, on the digits zoo."""
    import json

    import stitch_nas
    from stitch_nas.search import load_folder_study

    config = tmp_path / "search.yaml"
    config.write_text(
        f"zoo: {{cache_dir: {mini_zoo_dir}}}\n"
        "search: {trials: 10, seed_trials: 3, seed_pool: 8, refine_trials: 1,\n"
        "         refine_adapters: [{kind: linear, steps: 5}], export: false}\n"
    )
    code, _, err = _run(capsys, "search", str(config), "--out", str(tmp_path / "cli"), "-q")
    assert code == 0, err
    stitch_nas.run(config, tmp_path / "lib", progress=False)

    def trials(folder):
        study = load_folder_study(tmp_path / folder)
        return [(t.number, t.state.name, t.params, t.values) for t in study.trials]

    cli, lib = trials("cli"), trials("lib")
    assert len(cli) >= 10 and any(state == "COMPLETE" for _, state, _, _ in cli)
    assert lib == cli
    front = [
        json.loads((tmp_path / f / "pareto.json").read_text())["front"] for f in ("cli", "lib")
    ]
    assert front[0] and front[1] == front[0]
    bad = tmp_path / "bad.yaml"
    bad.write_text("search: {trials: -1}\n")
    with pytest.raises(errors.ConfigError, match="search.trials"):  # checked as the CLI checks
        stitch_nas.run(bad, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_a_search_records_the_same_trials_whatever_the_cache_holds(tmp_path, mini_zoo_dir):
    """What a network measures is a function of the network: a cache that keeps almost
    nothing (prefixes recomputed from whichever earlier cut survived) and one that keeps
    everything give the same trials, values and front for the same seed."""
    import json

    import stitch_nas
    from stitch_nas.search import load_folder_study

    def search(folder: str, cache: str) -> list:
        config = tmp_path / f"{folder}.yaml"
        config.write_text(
            f"zoo: {{cache_dir: {mini_zoo_dir}}}\n"
            f"search: {{trials: 10, seed_trials: 3, seed_pool: 8, export: false{cache}}}\n"
        )
        stitch_nas.run(config, tmp_path / folder, progress=False)
        study = load_folder_study(tmp_path / folder)
        front = json.loads((tmp_path / folder / "pareto.json").read_text())["front"]
        return [[(t.number, t.state.name, t.params, t.values) for t in study.trials], front]

    roomy, tight = (
        search("roomy", ", cache_memory_gb: 2"),
        search("tight", ", cache_memory_gb: 0.004"),
    )
    assert sum(state == "COMPLETE" for _, state, _, _ in roomy[0]) >= 5
    assert tight == roomy
