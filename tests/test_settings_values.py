"""Each settings value is checked in one place: the table of checks covers every field once,
each check refuses a bad value with a line that names it, and with that one check switched
off nothing else on the way to the run (the file's parsing, the CLI's flags, the run's
pre-flight) refuses the value."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from stitch_nas.cli._flags import apply_run_flags
from stitch_nas.cli._parser import build_parser
from stitch_nas.errors import ConfigError
from stitch_nas.pipeline import check_run
from stitch_nas.settings import (
    CHECKED_BY,
    FIELD_CHECKS,
    TYPE_ONLY,
    Settings,
    check_settings,
    settings_from_dict,
)

#: "section.key" -> a value of the right type that its check must refuse
BAD = {
    "data.size": 0,
    "data.probe_size": 1000,
    "data.workers": -1,
    "search.objectives": ["accuracy", "accuracy"],
    "search.trials": 0,
    "search.probe_threshold": -1.0,
    "search.seed_trials": -1,
    "search.cka_threshold": 1.5,
    "search.refine_trials": -2,
    "search.fidelity": 1.0,
    "search.budgets": {"macs": -5},
    "search.device": "tpu",
    "search.autocast": "float16",
    "search.cache_memory_gb": -1.0,
    "search.executor": "slurm",
    "search.workers": 0,
    "search.cpus_per_worker": 0.0,
    "search.ray_connect_timeout_s": 0.0,
    "search.gpus_per_worker": -2.0,
    "search.ray_mode": "workerz",
    "search.study_name": " padded ",
    "search.heartbeat_s": 0,
    "finetune.networks": 0,
    "finetune.floor": 1.5,
}

#: flag -> (its value as typed, the key it sets)
FLAGS = {
    "--trials": ("0", "search.trials"),
    "--fidelity": ("1", "search.fidelity"),
    "--cka-threshold": ("2", "search.cka_threshold"),
    "--probe-threshold": ("-1", "search.probe_threshold"),
    "--device": ("tpu", "search.device"),
    "--autocast": ("float16", "search.autocast"),
    "--objectives": ("accuracy,accuracy", "search.objectives"),
    "--budget": ("macs=-5", "search.budgets"),
    "--study-name": (" padded ", "search.study_name"),
    "--workers": ("0", "search.workers"),
}


def _all_fields() -> set[str]:
    settings = Settings()
    return {
        f"{section.name}.{item.name}"
        for section in fields(settings)
        for item in fields(getattr(settings, section.name))
    }


def test_every_field_has_one_check_listed():
    """Every key of every section is in exactly one list: checked by its table entry, by the
    one function CHECKED_BY names, or by its type alone."""
    listed = [*FIELD_CHECKS, *CHECKED_BY, *TYPE_ONLY]
    assert sorted(listed) == sorted(_all_fields())  # each once, none missing, none stale
    assert set(BAD) == set(FIELD_CHECKS)  # every table entry has a bad value below


def _raw(key: str, value) -> dict:
    section, _, name = key.partition(".")
    raw: dict = {section: {name: value}}
    if key == "data.workers":  # a key of image_folder only
        raw["data"].update(kind="image_folder", root="images")
    return raw


@pytest.fixture
def images(tmp_path: Path) -> Path:
    """A folder image_folder accepts (the data are not read by these checks)."""
    (tmp_path / "images" / "cat").mkdir(parents=True)
    return tmp_path


@pytest.mark.parametrize("key", sorted(BAD))
def test_a_bad_value_is_refused_by_its_check_naming_it(key, images):
    with pytest.raises(ConfigError, match=key.partition(".")[2]) as caught:
        settings_from_dict(_raw(key, BAD[key]), images)
    assert len(str(caught.value).splitlines()) == 1


@pytest.mark.parametrize("key", sorted(BAD))
def test_nothing_else_refuses_the_value_on_the_way_to_the_run(key, images, monkeypatch):
    """With the one check switched off, the file parses and the run's pre-flight passes."""
    monkeypatch.setitem(FIELD_CHECKS, key, lambda value, where: value)
    settings = settings_from_dict(_raw(key, BAD[key]), images)
    settings.zoo.mini_zoo = False  # its cache folder is not this test's business
    check_run(settings, images / "out", resume=False, join=False)


@pytest.mark.parametrize("flag", sorted(FLAGS))
def test_a_bad_flag_is_refused_by_the_same_check_naming_the_flag(flag, monkeypatch):
    text, key = FLAGS[flag]
    args = build_parser().parse_args(["demo", f"{flag}={text}"])
    with pytest.raises(ConfigError, match=flag) as caught:
        apply_run_flags(args, Settings())
    assert len(str(caught.value).splitlines()) == 1
    monkeypatch.setitem(FIELD_CHECKS, key, lambda value, where: value)
    apply_run_flags(args, Settings())  # no second check of the flag's value


def test_settings_built_in_python_meet_the_same_check(tmp_path):
    settings = Settings()
    settings.search.fidelity = 1.0
    with pytest.raises(ConfigError, match=r"search\.fidelity=1\.0"):
        check_run(settings, tmp_path / "out", resume=False, join=False)


def test_values_checked_together():
    settings = Settings()
    settings.search.seed_pool, settings.search.seed_trials = 3, 8
    with pytest.raises(ConfigError, match="seed_pool=3"):
        check_settings(settings)
    settings = Settings()
    settings.search.device, settings.search.autocast = "mps", "bfloat16"
    with pytest.raises(ConfigError, match="mps"):
        check_settings(settings)
    settings = Settings()
    settings.search.export, settings.search.artifacts = False, "store"
    with pytest.raises(ConfigError, match="artifacts"):
        check_settings(settings)


def test_checks_keep_the_values_they_normalise():
    settings = settings_from_dict({"search": {"budgets": {"macs": "2e6"}}})
    assert settings.search.budgets == {"macs": 2e6}


def test_stored_settings_read_back_without_their_sampler_module(tmp_path):
    """``report`` and ``export`` rebuild from the settings a study stored; a sampler module
    the search imported need not exist where they run: the sampler is checked by the run's
    pre-flight, which builds it, not when settings are read."""
    raw = {"search": {"sampler": "no_such_package.samplers:Mine"}}
    settings = settings_from_dict(raw)  # read back: fine
    with pytest.raises(ConfigError, match="no_such_package"):
        check_run(settings, tmp_path / "out", resume=False, join=False)
