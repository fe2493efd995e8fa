"""The command line: every user error is one line on stderr and exit code 2, no traceback."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from stitch_nas import errors
from stitch_nas.cli._main import main
from stitch_nas.cli._settings import load_settings, settings_from_dict


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


def test_demo_end_to_end(capsys, tmp_path, mini_zoo, mini_zoo_dir):
    """The README's main job on the session's zoo: files, a stitched front, a report."""
    import json

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
    # the demo ends by exporting its front: one folder per front network and an elastic package
    exported = sorted(p.name for p in (out / "models").iterdir())
    assert "elastic" in exported and f"trial_{report['front'][0]['number']}" in exported
    assert "exported" in stdout
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
        f"search: {{trials: 4, cache_memory_gb: 0.001, cache_dir: {spill}, sampler: random}}\n"
    )
    code, out, err = _run(
        capsys, "search", str(config), "--out", str(tmp_path / "o"), "--no-progress"
    )
    assert code == 0, err
    assert list(spill.glob("*.npy")) and "hypervolume" in out
    config.write_text("search: {cache_memory_gb: lots}\n")
    code, _, err = _run(capsys, "search", str(config))
    assert code == 2 and "search.cache_memory_gb must be float" in err


def test_search_with_snnet_joint_training_exports_from_a_fresh_context(
    capsys, tmp_path, mini_zoo, mini_zoo_dir
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
    code, stdout, err = _run(capsys, "export", str(out), "--no-progress")
    assert code == 0, err
    assert (out / "models").is_dir() and "exported" in stdout
