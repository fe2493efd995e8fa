"""The one check of each settings value: its limits, its message, in one table.

:func:`check_settings` runs every check of :data:`FIELD_CHECKS` and then the checks that read
two values together; :func:`~stitch_nas.settings.settings_from_dict` runs it on a file's
values, the CLI again after its flags override some (the message then names the flag the user
typed), and :func:`stitch_nas.run` on settings built in Python. Values whose check needs more
than the value (the plug-ins a search names, a zoo item's files, the data kind's files, the
fine-tune recipe, folders a run writes in, the sampler a run builds) are checked by the one
function :data:`CHECKED_BY` names; that each objective is installed is checked by the run's
pre-flight, so settings a study stored read back where a plug-in is missing. Nothing here
imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

from stitch_nas.choices import (
    EXECUTORS,
    EXPORT_FORMATS,
    RAY_MODES,
    check_at_least,
    check_autocast_device,
    check_autocast_name,
    check_budgets,
    check_cka_threshold,
    check_control,
    check_device,
    check_disk_gb,
    check_fidelity,
    check_gpus_per_worker,
    check_image_size,
    check_memory_gb,
    check_objective_names,
    check_one_of,
    check_positive,
    check_probe_size,
    check_probe_threshold,
)
from stitch_nas.errors import ConfigError

__all__ = ["CHECKED_BY", "FIELD_CHECKS", "TYPE_ONLY", "check_settings"]

#: ``(value, where) -> the value kept``; ``where`` names the value as the user wrote it
Check = Callable[[Any, str], Any]


def _at_least(minimum: int, note: str = "") -> Check:
    return lambda value, where: check_at_least(value, where, minimum, note)


def _positive(note: str = "") -> Check:
    return lambda value, where: check_positive(value, where, note)


def _within(low: float, high: float, note: str) -> Check:
    def check(value: Any, where: str) -> Any:
        if value is not None and not low <= value <= high:
            raise ConfigError(f"{where}={value!r}: give a value in [{low:g}, {high:g}]{note}")
        return value

    return check


def _one_of(choices: tuple[str, ...]) -> Check:
    return lambda value, where: check_one_of(value, where, choices)


def _autocast(value: str | None, where: str) -> str | None:
    check_autocast_name(value, where)
    return value


def _memory_gb(value: float | None, where: str) -> float | None:
    """A cache budget in GiB, or None (its default, decided at run time)."""
    return value if value is None else check_memory_gb(value, where)


def _disk_gb(value: float | None, where: str) -> float | None:
    """A spill folder's size in GiB, or None (its default, decided when the folder opens)."""
    return value if value is None else check_disk_gb(value, where)


def _formats(value: list, where: str) -> list:
    for fmt in value:
        check_one_of(fmt, where, EXPORT_FORMATS)
    return value


def _study_name(value: str | None, where: str) -> str | None:
    if value is not None and (not value.strip() or value != value.strip()):
        raise ConfigError(
            f"{where}={value!r}: give a non-empty name without leading or trailing spaces"
        )
    return value


def _latency(value: dict, where: str) -> dict:
    from stitch_nas.stitching import LatencySpec  # torch-free

    try:
        LatencySpec.from_options(value)
    except ConfigError as exc:  # the spec's own names are latency.KEY
        raise ConfigError(str(exc).replace("latency", where, 1)) from exc
    return value


#: "section.key" -> the one check of that value (after its type, which the schema checks)
FIELD_CHECKS: dict[str, Check] = {
    "data.size": lambda v, where: v if v is None else check_image_size(v, where),
    "data.probe_size": check_probe_size,
    "data.workers": _at_least(0, " (0: decode in this process)"),
    "search.objectives": check_objective_names,
    "search.trials": _at_least(1),
    # at most the number of classes: checked by the objective once the data are loaded
    "search.probe_threshold": check_probe_threshold,
    "search.seed_trials": _at_least(0, " (0: off)"),
    "search.proxy_candidates": _at_least(1, " (1: the sampler alone)"),
    "search.cka_threshold": check_cka_threshold,
    "search.refine_trials": _at_least(0, " (0: off)"),
    "search.fidelity": check_fidelity,
    "search.budgets": check_budgets,
    "search.device": check_device,
    "search.autocast": _autocast,
    "search.cache_memory_gb": _memory_gb,
    "search.cache_device_memory_gb": _memory_gb,
    "search.cache_disk_gb": _disk_gb,
    "search.export_formats": _formats,
    "search.latency": _latency,
    "search.executor": _one_of(EXECUTORS),
    "search.workers": _at_least(1),
    "search.cpus_per_worker": _positive(),
    "search.ray_connect_timeout_s": _positive(),
    "search.gpus_per_worker": lambda value, where: check_gpus_per_worker(value, where, auto=-1),
    "search.ray_mode": _one_of(RAY_MODES),
    "search.study_name": _study_name,
    "search.heartbeat_s": _at_least(1),
    "finetune.networks": _at_least(1),
    "finetune.floor": _within(0, 1, " (a validation accuracy), or null"),
    "finetune.control": check_control,
}

#: "section.key" -> the one function that checks a value needing more than itself
CHECKED_BY: dict[str, str] = {
    "zoo.models": "stitch_nas.settings._zoo_keys.check_zoo_item (its source's keys, files)",
    "zoo.cache_dir": "stitch_nas.pipeline.check_caches (a folder this run can write in)",
    "data.kind": "stitch_nas.settings._data_keys.check_data (a registered data kind)",
    "data.root": "the data kind's check (an existing folder)",
    "data.name": "the data kind's check (torchvision: a data set class)",
    "data.splits": "the data kind's check (npz: files, rows, overlaps)",
    "data.split_folders": "the data kind's check (image_folder: train/, val/, test/)",
    "search.space": "stitch_nas.settings.check_plugin_settings (a registered space)",
    "search.space_options": "stitch_nas.settings.check_plugin_settings (the space's options)",
    "search.refine_adapters": "stitch_nas.settings.check_plugin_settings (adapter kinds)",
    "search.seed_pool": "check_settings, against seed_trials (None: 4 x seed_trials)",
    # built before a run (a module:Class is imported), not when stored settings are read back
    "search.sampler": "stitch_nas.pipeline.check_run (stitch_nas.samplers.check_sampler)",
    "search.sampler_options": "stitch_nas.pipeline.check_run (with the sampler it builds)",
    "search.cache_dir": "stitch_nas.pipeline.check_caches (a folder this run can write in)",
    "search.artifacts": "stitch_nas.pipeline.check_artifacts (a folder); needs export",
    "search.storage": "stitch_nas.search.create_study (opened before any trial)",
    "search.ray_address": "stitch_nas.pipeline.check_run (stitch_nas.ray_address, Ray answers)",
    "finetune.recipe": "stitch_nas.finetune.FinetuneRecipe.from_dict (each recipe key)",
}

#: values any value of the right type is good for
TYPE_ONLY = frozenset(
    {
        "zoo.mini_zoo",
        "data.seed",
        "data.upsample",
        "data.x_key",
        "data.y_key",
        "data.label_names",
        "data.shuffle",
        "search.seed",
        "search.fuse",
        "search.export",
        "finetune.enabled",
    }
)


def check_settings(settings: Any, flags: Mapping[str, str] | None = None) -> None:
    """Check every value of ``settings`` (a :class:`~stitch_nas.settings.Settings`) with its
    one check, and the values that go together; keep what the checks return (budgets as
    floats) and decide ``zoo.mini_zoo`` (``ZooSettings.includes_mini_zoo``).
    ``flags`` maps ``"section.key"`` to the command-line flag that set it, which the message
    then names instead."""
    flags = flags or {}
    for section in fields(settings):
        values = getattr(settings, section.name)
        for item in fields(values):
            key = f"{section.name}.{item.name}"
            check = FIELD_CHECKS.get(key)
            if check is not None:
                where = flags.get(key, key)
                setattr(values, item.name, check(getattr(values, item.name), where))
    _check_search_together(settings.search, flags)
    # decided here, so that the settings a study stores (and a resumed run is compared with)
    # say whether the mini zoo ran
    settings.zoo.mini_zoo = settings.zoo.includes_mini_zoo()


def _check_search_together(search: Any, flags: Mapping[str, str]) -> None:
    """The search values that are checked against each other."""

    def name(key: str) -> str:
        return flags.get(f"search.{key}", f"search.{key}")

    if search.seed_pool is not None and search.seed_pool < search.seed_trials:
        raise ConfigError(
            f"{name('seed_pool')}={search.seed_pool}: give at least seed_trials "
            f"({search.seed_trials}) configs to choose from, or leave it out (4 x seed_trials)"
        )
    check_autocast_device(search.autocast, search.device.split(":")[0], name("autocast"))
    if search.artifacts is not None and not search.export:
        raise ConfigError(
            "search.artifacts (--artifacts) uploads the exported networks, and the export "
            "is off (--no-export, search.export: false); drop one of them"
        )
