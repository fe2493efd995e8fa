"""Checks of a whole run before any slow work, so a bad value answers at once in one line.

Two stages. :func:`check_run` reads nothing heavy (no torch; Optuna only for a sampler given
by ``module:Class`` or with options): every value's limits
(:func:`stitch_nas.settings.check_settings`), the plug-ins the search names (space, options
and their values, adapters, heads: ``stitch_nas.settings.check_plugin_settings``, against the
built-in plug-ins' torch-free declarations), and the output folder (a folder, writable,
holding a study only when the run continues one). When a third-party plug-in is installed,
:func:`check_plugins` makes the plug-in check instead, against the registries (importing
them, and so torch); it runs before the data are read or the zoo is built. What needs the zoo
(a budget no network can meet) is checked by the pipeline right after the zoo loads, still
before the study is created.
Neither stage writes anything, so a refused run leaves ``--out`` as it found it.
"""

from __future__ import annotations

import logging
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from stitch_nas.choices import EXPORT_FORMATS
from stitch_nas.errors import ConfigError, DataError
from stitch_nas.samplers import check_sampler
from stitch_nas.settings import (
    check_plugin_settings,
    check_settings,
    declared_tables,
    registered_tables,
)

from ._lock import check_free

__all__ = [
    "check_artifacts",
    "check_caches",
    "check_destination",
    "check_first_sample",
    "check_folder",
    "check_formats",
    "check_image_sizes",
    "check_out",
    "check_plugins",
    "check_run",
    "check_study_file",
    "check_study_in",
    "check_writable",
    "data_size",
]

logger = logging.getLogger(__name__)


def check_run(settings: Any, out_dir: Path, *, resume: bool, join: bool) -> None:
    """Everything about ``settings`` and ``out_dir`` that can be known without torch."""
    check_settings(settings)  # each value's limits (the CLI ran it first, naming its flags)
    # what must be installed here, not checked when stored settings are read back elsewhere
    check_sampler(settings.search.sampler, settings.search.sampler_options)  # may import it
    from stitch_nas.plugins import OBJECTIVES  # torch-free; finds plug-in objectives too

    # an unknown name is a one-line error listing the known ones
    objectives = [OBJECTIVES.get(name) for name in settings.search.objectives]
    if any(o.needs_latency for o in objectives) or "latency" in settings.search.budgets:
        from stitch_nas.stitching import LatencySpec  # torch-free

        # onnxruntime installed, the table readable, the function importable
        LatencySpec.from_options(settings.search.latency).check([])
    tables = declared_tables()  # None: a third-party plug-in, checked by check_plugins
    if tables is not None:
        check_plugin_settings(settings.search, tables)
    check_caches(settings)
    check_out(out_dir, resume=resume, join=join, storage=settings.search.storage)
    if settings.search.executor == "ray":  # ray.init would retry a wrong address for minutes
        from stitch_nas.ray_address import check_ray_address

        check_ray_address(settings.search.ray_address, settings.search.ray_connect_timeout_s)
    if settings.search.artifacts is not None:
        check_artifacts(Path(settings.search.artifacts))
    models = Path(out_dir) / "models"
    if settings.search.export and models.exists() and not models.is_dir():
        raise ConfigError(  # the run ends writing there
            f"{models} is a file; move it away (the Pareto front is exported there) or pass "
            "--no-export"
        )
    if settings.search.export and models.is_dir():  # one left by an earlier run, or a mount
        check_writable(models, "the export folder", "make it writable, or pass --no-export")


def check_out(out_dir: Path, *, resume: bool, join: bool, storage: str | None) -> None:
    """``out_dir`` is (or can become) a writable folder, holding a study only if it goes on."""
    out = Path(out_dir)
    check_writable(out, "--out", "choose another --out")
    check_free(out, shared=join)  # another run's study may be half-written: say so instead
    check_study_in(out, resume=resume, join=join, storage=storage)


def check_writable(folder: Path, what: str, fix: str) -> None:
    """``folder`` is a folder this process can write in, or can be created as one."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{what} {str(folder)!r} is a file, not a folder; {fix}")
    parent = folder
    while not parent.exists():  # the nearest folder that exists is where the run writes
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{what} {str(folder)!r}: {str(parent)!r} is a file, not a folder; {fix}")
    try:  # os.access says yes to root even on a read-only file system; a real write does not
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise ConfigError(
            f"{what} {str(folder)!r}: cannot write in {str(parent)!r} ({exc.strerror}); {fix}"
        ) from None


def check_destination(folder: Path, what: str) -> None:
    """``report`` and ``export`` can write ``what`` ("the report", "the networks") into
    ``folder``: checked before the zoo is rebuilt, so a read-only run answers at once."""
    check_writable(
        folder,
        f"the folder for {what}",
        f"pass --out FOLDER to write {what} elsewhere (the study is only read)",
    )


def check_artifacts(folder: Path) -> None:
    """``--artifacts DIR``: a folder the artifact store can be made in and written to."""
    check_writable(
        Path(folder).expanduser(), "--artifacts", "give a folder you can write to for the store"
    )


def check_caches(settings: Any) -> None:
    """The cache folders the run writes in (the mini zoo's weights, spilled activations) are
    folders it can write in, so a bad one answers now rather than after the data load."""
    from stitch_nas.files import default_cache_dir

    zoo = settings.zoo
    if zoo.includes_mini_zoo():
        if zoo.cache_dir is not None:
            root, what = Path(zoo.cache_dir).expanduser(), "zoo.cache_dir (--cache-dir)"
            fix = "choose a folder you can write to"
        else:
            root, what = default_cache_dir(), "the cache folder"
            fix = "set STITCH_NAS_CACHE (or --cache-dir) to a folder you can write to"
        if not (root / "mini_zoo").is_dir():  # built before: a read-only cache may do
            check_writable(root / "mini_zoo", what, fix)
    if settings.search.cache_dir is not None:
        spill = Path(settings.search.cache_dir).expanduser()
        check_writable(spill, "search.cache_dir", "choose a folder you can write to")


def check_study_in(out_dir: Path, *, resume: bool, join: bool, storage: str | None) -> None:
    """``out_dir`` holds a study only if the run goes on with it (``storage``: not here)."""
    out = Path(out_dir)
    if storage is not None:  # a shared storage is checked when it is opened
        return
    db = out / "study.db"
    if resume and not db.exists():
        raise ConfigError(f"nothing to resume: {db} does not exist; run without --resume first")
    if db.exists():
        names = check_study_file(db)
        if names and not (resume or join):
            raise ConfigError(
                f"{out} already holds a study ({names[0]!r}); pass --resume to continue it or "
                "choose another --out"
            )


def check_study_file(db: Path) -> list[str]:
    """The study names in the SQLite file ``db``; a file that is not a study is one line (which
    never advises removing it: it may hold a user's results that this version cannot read)."""
    from stitch_nas.files import readable_sqlite

    try:
        # read-only: checking must not create or migrate anything; in a read-only folder, a copy
        with sqlite3.connect(f"file:{readable_sqlite(db)}?mode=ro", uri=True) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            if not tables:
                if db.stat().st_size == 0:
                    return []  # what an interrupted first run leaves: nothing to keep
                raise sqlite3.DatabaseError("no tables")
            if "studies" not in tables:
                raise sqlite3.DatabaseError("no studies table")
            return [r[0] for r in conn.execute("SELECT study_name FROM studies")]
    except sqlite3.Error as exc:
        raise ConfigError(
            f"{db} cannot be read as a study database ({exc}); it was left as it is: choose "
            "another folder"
        ) from None
    except OSError as exc:  # unreadable (permissions), or no room for the read-only copy
        raise ConfigError(
            f"cannot read {db} ({exc.strerror}); it was left as it is: check its permissions"
        ) from None


def check_folder(out_dir: Path, storage: str | None = None) -> None:
    """``out_dir`` holds one readable study (``report`` and ``export`` read nothing else first);
    with ``storage`` (the search's ``--storage``) it is a folder, and the study is read there."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{str(out)!r} is a file; give a folder written by demo or search")
    if storage is not None:
        if not out.is_dir():
            raise ConfigError(f"{out} does not exist; give the folder the search wrote (--out)")
        return
    db = out / "study.db"
    if not db.is_file():
        raise ConfigError(
            f"{out} holds no study ({db} is missing); run a search there first, or pass the "
            "--storage the search used"
        )
    names = check_study_file(db)
    if len(names) != 1:
        raise ConfigError(
            f"{db} holds {len(names)} studies ({', '.join(names) or 'none'}); a search folder "
            "holds one; run the search again into a new folder"
        )


def check_formats(text: str) -> list[str]:
    """``--format pt2,onnx`` as a list of known export formats."""
    formats = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in formats if f not in EXPORT_FORMATS]
    if unknown:
        raise ConfigError(
            f"--format: unknown export format {unknown[0]!r}; "
            f"use any of {', '.join(EXPORT_FORMATS)}"
        )
    if "onnx" in formats:  # torch's dynamo exporter needs onnx and onnxscript: say so up front
        from stitch_nas.extras import require

        require("onnx", "onnx", "--format onnx")
        require("onnx", "onnxscript", "--format onnx")
    return formats


def check_plugins(search: Any) -> None:
    """The plug-ins ``search`` names, when a third-party plug-in is installed: against the
    registries, which imports them and torch (without one, :func:`check_run` checked them
    against the built-in plug-ins' declarations)."""
    if declared_tables() is None:
        check_plugin_settings(search, registered_tables())


def check_first_sample(objective: Any) -> None:
    """Sample one config off the record, so a space's own checks of its options (model names,
    directions...) fail now, before the study exists, rather than as a FAIL trial. What the
    space computes is memoised in the context, so the first real trial reuses it."""
    import optuna

    from stitch_nas.errors import UnknownNameError

    study = optuna.create_study(
        directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=0)
    )
    trial = study.ask()
    try:
        objective.space(trial, objective.ctx, **objective.space_options)
    except (ConfigError, UnknownNameError):
        raise
    except Exception as exc:  # noqa: BLE001 - a trial's own failure is the search's business
        logger.debug("off-the-record sample failed: %s", exc)


def _item_side(item: dict[str, Any]) -> int | None:
    """The input side a ``zoo.models`` item asks for (its larger one), read without building
    the model: its input_size (or img_size), else a timm model's ``pretrained_cfg`` as timm
    resolves it, else torchvision's 224; None for other sources that name none."""
    size = item.get("input_size") or item.get("img_size")
    if size is None and item.get("source") == "timm":
        from timm.data import resolve_data_config
        from timm.models import get_pretrained_cfg

        cfg = get_pretrained_cfg(item["model"])
        resolved = resolve_data_config({}, pretrained_cfg=cfg.to_dict() if cfg else {})
        size = list(resolved["input_size"][-2:])
    elif size is None and item.get("source") == "torchvision":
        size = 224  # from_torchvision's default spec
    if size is None:
        return None
    return int(size) if isinstance(size, int) else max(int(side) for side in size)


def data_size(settings: Any) -> int:
    """``data.size`` as given, else the largest input side the ``zoo.models`` ask for (their
    ``input_size``, a timm model's ``pretrained_cfg``), else 32: the mini zoo's, which takes the
    data's size. The run loads its data at this size; the study records ``data.size`` as given
    (None follows the zoo, which a resumed run must keep too).
    """
    if settings.data.size is not None:
        return int(settings.data.size)
    sides = [side for side in map(_item_side, settings.zoo.models) if side is not None]
    return max(sides, default=32)


def check_image_sizes(zoo: Any, data: Any, upsample: bool = False) -> None:
    """Every model takes inputs no larger than the data's images, unless ``upsample``.

    A model fed images smaller than its input (32-px CIFAR into a 224-px ImageNet model) sees
    them upsampled, and scores nothing like the figures its authors give: refused before any
    trial, naming the model, the sizes and the fix.

    Raises:
        DataError: a model's input side is above the data's (:attr:`DataSplits.stored_side`).
    """
    if upsample:
        return
    side = data.stored_side
    for name, entry in zoo.items():
        height, width = entry.input_spec.size
        if max(height, width) > side:
            raise DataError(
                f"model {name!r} takes {height}x{width} images but the data's are {side} px "
                f"(data.size or the stored images); use images of at least {max(height, width)} "
                "px (data.size: leave it out to follow the zoo), or set data.upsample: true to "
                "feed it upsampled images"
            )
