"""From settings to a report: data, zoo, context, study, search, report.

This is what ``stitch-nas demo`` and ``stitch-nas search`` run; library users can call
:func:`run_settings` with a :class:`~stitch_nas.cli.Settings` too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stitch_nas import attrs
from stitch_nas.activations._cache import ActivationCache
from stitch_nas.activations._context import StitchContext
from stitch_nas.cli._settings import DataSettings, Settings, ZooSettings, settings_from_dict
from stitch_nas.data._datasets import load_image_folder, load_torchvision_dataset
from stitch_nas.data._splits import DataSplits, load_digits_splits
from stitch_nas.errors import ConfigError
from stitch_nas.export._select import FORMATS, ExportSummary, export_study
from stitch_nas.search._runner import StitchObjective, run_search
from stitch_nas.search._studies import create_study, load_folder_study
from stitch_nas.zoo._entry import Zoo

__all__ = [
    "load_data",
    "load_zoo",
    "run_settings",
    "report_folder",
    "export_folder",
]

logger = logging.getLogger(__name__)
DATA_KINDS = ("digits", "image_folder", "torchvision")


def load_data(settings: DataSettings) -> DataSplits:
    common = {"size": settings.size, "probe_size": settings.probe_size, "seed": settings.seed}
    if settings.kind == "digits":
        return load_digits_splits(**common)
    if settings.root is None:
        raise ConfigError(f"data.kind {settings.kind!r} needs data.root (a local folder)")
    if settings.kind == "image_folder":
        return load_image_folder(settings.root, **common)
    if settings.kind == "torchvision":
        if settings.name is None:
            raise ConfigError("data.kind 'torchvision' needs data.name, e.g. CIFAR10")
        return load_torchvision_dataset(settings.name, settings.root, **common)
    raise ConfigError(f"unknown data.kind {settings.kind!r}; use one of {DATA_KINDS}")


def load_zoo(settings: ZooSettings, data: DataSplits, *, progress: bool = False) -> Zoo:
    """The embedded mini zoo (if enabled) plus every model listed in ``zoo.models``."""
    from stitch_nas.zoo._mini import load_mini_zoo
    from stitch_nas.zoo._sources import entry_from_settings

    extra = [entry_from_settings(item) for item in settings.models]  # bad items fail first
    zoo = Zoo()
    if settings.mini_zoo:
        zoo = load_mini_zoo(data, cache_dir=settings.cache_dir, progress=progress)
    for entry in extra:
        zoo.add(entry)
    if len(zoo) < 1:
        raise ConfigError("the zoo is empty; enable zoo.mini_zoo or list zoo.models")
    return zoo


def run_settings(
    settings: Settings,
    out_dir: Path,
    *,
    resume: bool = False,
    progress: bool = True,
    echo: Callable[[str], Any] = logger.info,
):
    """Run the whole search described by ``settings`` and write its report to ``out_dir``."""
    from stitch_nas.report._write import write_report
    from stitch_nas.search._ray_executor import executor_from_settings

    search = settings.search
    executor = executor_from_settings(search)  # a bad executor fails before any work
    data = load_data(settings.data)
    start = time.perf_counter()
    zoo = load_zoo(settings.zoo, data, progress=progress)
    echo(f"zoo ready in {time.perf_counter() - start:.1f} s: {', '.join(zoo.names())}")
    cache = ActivationCache(memory_gb=search.cache_memory_gb, spill_dir=search.cache_dir)
    ctx = StitchContext(zoo, data, device=search.device, cache=cache)
    objective = StitchObjective(
        ctx,
        space=search.space,
        objectives=search.objectives,
        cka_threshold=search.cka_threshold,
        budgets=search.budgets,
        space_options=search.space_options,
        fuse=search.fuse,
    )
    study = create_study(
        objective,
        out_dir,
        sampler=search.sampler,
        seed=search.seed,
        resume=resume,
        storage=search.storage,
    )
    study.set_user_attr(attrs.SETTINGS, asdict(settings))  # what `stitch-nas export` rebuilds from
    start = time.perf_counter()
    run_search(objective, study, search.trials, progress=progress, executor=executor)
    echo(f"{search.trials} trials in {time.perf_counter() - start:.1f} s")
    summary = write_report(study, out_dir)
    if search.export:
        models = Path(out_dir) / "models"
        # the search itself is done and reported: a network that cannot be exported is
        # named, not a reason to fail the run
        export = export_study(
            study,
            ctx,
            models,
            elastic=True,
            fuse=search.fuse,
            progress=progress,
            skip_failures=True,
        )
        echo(export.describe())
    return summary


def report_folder(out_dir: Path):
    """Rewrite and return the report of the study stored in ``out_dir``."""
    from stitch_nas.report._write import write_report

    return write_report(load_folder_study(out_dir), out_dir)


def export_folder(
    out_dir: Path,
    *,
    trials: str | Sequence[int] = "pareto",
    formats: Sequence[str] = FORMATS,
    elastic: bool = False,
    progress: bool = True,
) -> ExportSummary:
    """Export trials of the search in ``out_dir`` to ``out_dir/models``.

    The zoo and data are rebuilt from the settings the search stored in its study, so the
    exported networks are the ones it measured (the export checks their accuracy again).
    """
    study = load_folder_study(out_dir)
    raw = study.user_attrs.get(attrs.SETTINGS)
    if raw is None:
        raise ConfigError(
            f"the study in {out_dir} does not record its settings (written by an older "
            "stitch_nas); run the search again to export from it"
        )
    settings = settings_from_dict(raw)
    data = load_data(settings.data)
    zoo = load_zoo(settings.zoo, data, progress=progress)
    ctx = StitchContext(zoo, data, device=settings.search.device)
    return export_study(
        study,
        ctx,
        Path(out_dir) / "models",
        trials=trials,
        formats=formats,
        elastic=elastic,
        fuse=settings.search.fuse,
        progress=progress,
    )
