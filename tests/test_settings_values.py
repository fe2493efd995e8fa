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
    "data.probe_size": 10000,
    "data.workers": -1,
    "search.objectives": ["accuracy", "accuracy"],
    "search.trials": 0,
    "search.probe_threshold": -1.0,
    "search.seed_trials": -1,
    "search.proxy_candidates": 0,
    "search.cka_threshold": 1.5,
    "search.refine_trials": -2,
    "search.fidelity": 1.0,
    "search.budgets": {"macs": -5},
    "search.device": "tpu",
    "search.autocast": "float16",
    "search.cache_memory_gb": -1.0,
    "search.cache_device_memory_gb": -1.0,
    "search.cache_disk_gb": -1.0,
    "search.export_formats": ["safetensors", "tflite"],
    "search.latency": {"backend": "tpu"},
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
    "finetune.control": "fattorib_resnet44",  # a list of names, not one name
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


#: a model of the user's own (untrained, built in a blink)
MINE = {"name": "mine", "source": "timm", "model": "test_resnet", "num_classes": 10}


@pytest.mark.parametrize(
    "zoo, included",
    [
        ({}, True),  # no models listed: the mini zoo is the zoo
        ({"models": [MINE]}, False),  # models listed: only they, unless the file says so
        ({"models": [MINE], "mini_zoo": True}, True),
        ({"mini_zoo": False}, False),
    ],
)
def test_the_mini_zoo_is_included_only_when_no_models_are_listed_unless_the_file_says(
    zoo, included
):
    settings = settings_from_dict({"zoo": zoo})
    assert settings.zoo.mini_zoo is included  # decided once: what a study stores and compares
    built = Settings()
    built.zoo.models = [MINE] * bool(zoo.get("models"))
    built.zoo.mini_zoo = zoo.get("mini_zoo")
    assert built.zoo.includes_mini_zoo() is included  # settings made in Python: the same rule


def test_listed_models_without_mini_zoo_build_no_mini_zoo(monkeypatch):
    import stitch_nas.zoo
    from stitch_nas.data import load_digits_splits
    from stitch_nas.pipeline import load_zoo

    def refuse(*args, **kwargs):
        raise AssertionError("the mini zoo was built")

    monkeypatch.setattr(stitch_nas.zoo, "load_mini_zoo", refuse)
    settings = settings_from_dict({"zoo": {"models": [MINE]}})
    zoo = load_zoo(settings.zoo, load_digits_splits(probe_size=32))
    assert zoo.names() == ["mine"]
    empty = settings_from_dict({"zoo": {"mini_zoo": False}}).zoo
    with pytest.raises(ConfigError, match="the zoo is empty"):
        load_zoo(empty, load_digits_splits(probe_size=32))


def test_a_gpu_node_defaults():
    search = Settings().search
    assert search.device == "auto"  # CUDA where there is one
    assert (search.cache_memory_gb, search.cache_device_memory_gb) == (None, None)
    with pytest.raises(ConfigError, match="zoo.mini_zoo must be bool"):
        settings_from_dict({"zoo": {"mini_zoo": 1}})
    with pytest.raises(ConfigError, match="search.cache_device_memory_gb must be a number"):
        settings_from_dict({"search": {"cache_device_memory_gb": "lots"}})


@pytest.mark.parametrize(
    "value", [31, 8193, 100.0, True, "all", {"per_class": 0}, {"per_class": 2.5}, {"k": 4}, [64]]
)
def test_probe_size_forms_refused_in_one_line(value):
    with pytest.raises(ConfigError, match=r"data\.probe_size=.*\[32, 8192\].*auto.*per_class") as e:
        settings_from_dict({"data": {"probe_size": value}})
    assert len(str(e.value).splitlines()) == 1


@pytest.mark.parametrize("value", [32, 8192, "auto", {"per_class": 4}])
def test_probe_size_forms_kept(value):
    assert settings_from_dict({"data": {"probe_size": value}}).data.probe_size == value


def test_default_probe_size_follows_the_classes():
    from stitch_nas.choices import default_probe_size, probe_size_for

    assert Settings().data.probe_size == "auto"
    assert [default_probe_size(c) for c in (2, 10, 16, 100, 256, 1000, 21843)] == [
        128,
        128,
        128,
        800,
        2048,
        2048,
        2048,
    ]
    assert probe_size_for("auto", 100) == 800 and probe_size_for(300, 1000) == 300
    assert probe_size_for({"per_class": 2}, 10) == 32  # never below the range's bottom
    assert probe_size_for({"per_class": 8}, 1000) == 8000
    with pytest.raises(ConfigError, match=r"9000 images for 1000 classes.*per_class <= 8"):
        probe_size_for({"per_class": 9}, 1000)
