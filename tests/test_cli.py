"""The command line: every user error is one line on stderr and exit code 2, no traceback."""

from __future__ import annotations

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
