"""A finished search's folder: its report rewritten, its networks exported, the zoo and data
rebuilt from the settings its study stored (``stitch-nas report`` and ``stitch-nas export``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from stitch_nas import attrs
from stitch_nas.activations import StitchContext
from stitch_nas.errors import ConfigError, ExportError
from stitch_nas.export import FORMATS, ExportSummary, export_items, export_study
from stitch_nas.search import load_folder_study
from stitch_nas.settings import Settings, settings_from_dict

from ._run import _resolve_device, load_data, load_zoo

__all__ = ["export_folder", "report_folder"]

logger = logging.getLogger(__name__)


def report_folder(
    out_dir: Path,
    *,
    test: bool = True,
    progress: bool = True,
    echo: Callable[[str], Any] = logger.info,
    storage: str | None = None,
    study_name: str | None = None,
    dest: Path | None = None,
):
    """Rewrite and return the report of the search in ``out_dir``.

    With ``test``, front networks and zoo models that have no test figure yet are measured on
    the test split first (the zoo and data are rebuilt from the study's settings for that).
    ``storage`` and ``study_name``: where the study is when the search ran with ``--storage``
    (:func:`~stitch_nas.search.load_folder_study`). ``dest``: the folder the report files go
    to (default ``out_dir``; a read-only ``out_dir`` is only read, its study from a copy).
    """
    from stitch_nas.report import holdout_missing, measure_holdout, write_report

    from ._preflight import check_destination

    dest = Path(out_dir) if dest is None else Path(dest)
    check_destination(dest, "the report")
    study = load_folder_study(out_dir, storage=storage, study_name=study_name)
    if test and any(holdout_missing(study)):
        ctx, settings = _rebuild(study, out_dir, progress)
        echo(measure_holdout(study, ctx, fuse=settings.search.fuse, folder=out_dir).describe())
    return write_report(study, dest)


def _rebuild(study: Any, out_dir: Path, progress: bool) -> tuple[StitchContext, Settings]:
    """The zoo and data of the search in ``out_dir``, from the settings its study stored."""
    raw = study.user_attrs.get(attrs.SETTINGS)
    if raw is None:
        raise ConfigError(
            f"the study in {out_dir} does not record its settings (written by an older "
            "stitch_nas); run the search again (or `stitch-nas report --no-test`)"
        )
    from ._preflight import data_size

    settings = settings_from_dict(raw)
    data = load_data(replace(settings.data, size=data_size(settings)))
    zoo = load_zoo(settings.zoo, data, progress=progress)
    search = settings.search
    device = _resolve_device(search.device)
    return StitchContext(zoo, data, device=device, autocast=search.autocast), settings


def export_folder(
    out_dir: Path,
    *,
    trials: str | Sequence[int] = "pareto",
    formats: Sequence[str] = FORMATS,
    elastic: bool = False,
    progress: bool = True,
    storage: str | None = None,
    study_name: str | None = None,
    artifacts: str | Path | None = None,
    dest: Path | None = None,
) -> ExportSummary:
    """Export trials of the search in ``out_dir`` to ``dest`` (default ``out_dir/models``).

    The zoo and data are rebuilt from the settings the search stored in its study, so the
    exported networks are the ones it measured (the export checks their accuracy again).
    ``storage`` and ``study_name``: as for :func:`report_folder`. ``artifacts``: a folder or
    an Optuna artifact store each exported folder is also uploaded to (one tar archive each,
    an artifact of the study).
    """
    from ._preflight import check_destination

    study = load_folder_study(out_dir, storage=storage, study_name=study_name)
    # a trial that cannot be exported: refused before the zoo loads
    export_items(study, trials, Path(out_dir))
    models = Path(out_dir) / "models" if dest is None else Path(dest)
    if models.exists() and not models.is_dir():
        raise ExportError(f"{models} is a file; move it away, the networks are written there")
    # before the networks are rebuilt (seconds to minutes), not when the first is written
    check_destination(models, "the networks")
    ctx, settings = _rebuild(study, out_dir, progress)
    return export_study(
        study,
        ctx,
        models,
        trials=trials,
        formats=formats,
        elastic=elastic,
        fuse=settings.search.fuse,
        progress=progress,
        folder=Path(out_dir),
        artifact_store=artifacts,
    )
