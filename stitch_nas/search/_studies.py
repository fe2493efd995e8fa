"""The Optuna study a search writes to: its sampler, names, creating, joining, resuming, reopening.

A search owns one named study: in ``DIR/study.db`` (SQLite), or at a ``--storage`` URL or
journal file shared by several drivers (:mod:`stitch_nas.search._storage`). Its name defaults
to the output folder's name. A study of that name that exists already is refused unless the
caller means to continue it: ``resume`` (this driver alone: trials left RUNNING are marked FAIL
at once) or ``join`` (other drivers may be running: trials left RUNNING become FAIL through
Optuna's heartbeat once their driver has been silent for the grace period).

Studies are created with their objective names (``study.set_metric_names``), so
optuna-dashboard labels the axes "accuracy", "macs" rather than "Objective 0, 1".
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import optuna

from stitch_nas import attrs
from stitch_nas.errors import ConfigError
from stitch_nas.files import readable_sqlite
from stitch_nas.plugins import Direction
from stitch_nas.samplers import SAMPLERS, make_sampler

from ._storage import (
    DEFAULT_HEARTBEAT_S,
    fail_running,
    heartbeat_of,
    open_storage,
    remember_storage,
    shown_url,
)


class StudyShape(Protocol):
    """What a study is created for (a :class:`~stitch_nas.search.StitchObjective` has it): the
    objectives' names and Optuna directions, the search space's name and the budgets."""

    @property
    def names(self) -> list[str]: ...
    @property
    def directions(self) -> Sequence[Direction]: ...
    @property
    def space_name(self) -> str: ...
    @property
    def budgets(self) -> dict[str, float]: ...


__all__ = [
    "LEGACY_STUDY_NAME",
    "SAMPLERS",
    "completed_count",
    "check_study",
    "create_study",
    "default_study_name",
    "fail_stale_running",
    "is_repeat",
    "load_folder_study",
    "make_sampler",
    "set_metric_names",
]

logger = logging.getLogger(__name__)

#: the one name every study had before studies were named after their folder
LEGACY_STUDY_NAME = "stitch_nas"


def default_study_name(out_dir: str | Path) -> str:
    """The study name a search into ``out_dir`` gets without ``--study-name``: the folder's."""
    return Path(out_dir).resolve().name or LEGACY_STUDY_NAME


def set_metric_names(study: optuna.Study, names: list[str]) -> None:
    """Name the study's objectives (read by optuna-dashboard and ``trials_dataframe``)."""
    if study.metric_names == names:
        return
    with warnings.catch_warnings():  # experimental since Optuna 3.2, unchanged since
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(list(names))


def create_study(
    objective: StudyShape,
    out_dir: str | Path,
    *,
    sampler: str = "tpe",
    seed: int | None = 0,
    sampler_options: Mapping[str, Any] | None = None,
    trials: int | None = None,
    resume: bool = False,
    storage: str | None = None,
    study_name: str | None = None,
    join: bool = False,
    heartbeat_s: int = DEFAULT_HEARTBEAT_S,
) -> optuna.Study:
    """The study of a search into ``out_dir``, created, resumed or joined.

    Args:
        objective: Lends the directions and objective names.
        out_dir: The output folder; the study lives in ``out_dir/study.db`` unless ``storage``.
        sampler: One of :data:`SAMPLERS`, or ``package.module:Class``
            (:func:`~stitch_nas.samplers.make_sampler`).
        seed: Sampler seed, passed where the sampler's class takes one.
        sampler_options: Keyword arguments of the sampler's class.
        trials: The search's total, which sizes NSGA-II's and NSGA-III's generations.
        resume: Continue the study; no other driver runs on it, so trials left RUNNING are
            marked FAIL now.
        storage: Optuna RDB URL (``postgresql://user@host/db``) or journal file path shared by
            several drivers, instead of ``out_dir/study.db``.
        study_name: The study's name; default :func:`default_study_name` of ``out_dir`` (a
            folder written before studies were named keeps its ``"stitch_nas"``).
        join: Continue the study, or create it, while other drivers may run on it.
        heartbeat_s: Heartbeat interval of RDB storages; a killed driver's trial becomes FAIL
            after twice this.

    Raises:
        ConfigError: the study exists and neither ``resume`` nor ``join`` is given, there is
            nothing to resume, the storage cannot be opened, the objectives differ, or the
            sampler spec is bad.
    """
    backend, name = _open(out_dir, resume, storage, study_name, join, heartbeat_s)
    where = shown_url(storage) if storage else str(Path(out_dir) / "study.db")
    study = optuna.create_study(
        storage=backend,
        study_name=name,
        directions=objective.directions,
        sampler=make_sampler(sampler, seed, sampler_options, trials=trials),
        load_if_exists=resume or join,  # join: two drivers may create it at once
    )
    remember_storage(study, backend, storage or f"sqlite:///{Path(out_dir) / 'study.db'}")
    if resume and not join:
        fail_stale_running(study, backend)
    elif join and (beat := heartbeat_of(study)) is not None:
        beat.fail_stale()
    names = list(study.user_attrs.get(attrs.OBJECTIVES, objective.names))
    if names != objective.names:
        raise ConfigError(
            f"the study {name!r} in {where} optimises {names}, not {objective.names}; "
            "continue it with the same objectives"
        )
    if study.user_attrs.get(attrs.OBJECTIVES) is None:
        study.set_user_attr(attrs.OBJECTIVES, objective.names)
        study.set_user_attr(attrs.SPACE, objective.space_name)
        study.set_user_attr(attrs.BUDGETS, objective.budgets)
    set_metric_names(study, objective.names)
    return study


def check_study(
    out_dir: str | Path,
    *,
    resume: bool = False,
    storage: str | None = None,
    study_name: str | None = None,
    join: bool = False,
    heartbeat_s: int = DEFAULT_HEARTBEAT_S,
) -> str:
    """What :func:`create_study` checks about the storage and name, before any slow work.

    Returns:
        The study's name.
    """
    return _open(out_dir, resume, storage, study_name, join, heartbeat_s)[1]


def _open(
    out_dir: str | Path,
    resume: bool,
    storage: str | None,
    study_name: str | None,
    join: bool,
    heartbeat_s: int,
) -> tuple[optuna.storages.BaseStorage, str]:
    out = Path(out_dir)
    db = out / "study.db"
    if storage is None:
        if resume and not db.exists():
            raise ConfigError(f"nothing to resume: {db} does not exist; run without --resume first")
        out.mkdir(parents=True, exist_ok=True)
    where = shown_url(storage) if storage else str(db)
    backend = open_storage(storage or f"sqlite:///{db}", heartbeat_s=heartbeat_s)
    existing = optuna.get_all_study_names(backend)
    if storage is None and existing and not (resume or join):
        raise ConfigError(
            f"{out} already holds a study ({existing[0]!r}); pass --resume to continue it or "
            "choose another --out"
        )
    name = study_name or _default_name(out, existing, legacy=storage is None)
    if name in existing and not (resume or join):
        raise ConfigError(
            f"{where} already holds a study named {name!r}; pass --resume (or --join while other "
            "drivers run) to continue it, or choose another --study-name"
        )
    if resume and not join and name not in existing:
        known = ", ".join(repr(n) for n in existing) or "none"
        raise ConfigError(
            f"nothing to resume: {where} holds no study named {name!r} (studies there: {known}); "
            "check --study-name"
        )
    return backend, name


def _default_name(out: Path, existing: list[str], *, legacy: bool) -> str:
    # A folder written before studies were named holds one study called "stitch_nas"
    if legacy and existing == [LEGACY_STUDY_NAME]:
        return LEGACY_STUDY_NAME
    return default_study_name(out)


def fail_stale_running(study: optuna.Study, storage: optuna.storages.BaseStorage) -> None:
    """Mark every RUNNING trial FAIL; only for a study no other driver is running on.

    ``--resume`` promises that; drivers sharing a study rely on Optuna's heartbeat instead.

    Args:
        study: The study.
        storage: The storage ``study`` was created on.
    """
    for number in fail_running(study, "driver stopped mid-trial", storage=storage):
        logger.info("marked stale running trial %d as FAIL", number)


def load_folder_study(
    out_dir: str | Path, *, storage: str | None = None, study_name: str | None = None
) -> optuna.Study:
    """The study of the search into ``out_dir``.

    Without ``storage``: the study in ``out_dir/study.db`` (the only one there, or
    ``study_name``). With ``storage``, the URL or journal file the search was given: the study
    named ``study_name``, by default the folder's name as the search named it.

    Raises:
        ConfigError: no such study, or ``storage`` does not exist (it is never created here).
    """
    if storage is None:
        db = Path(out_dir) / "study.db"
        if not db.is_file():
            raise ConfigError(
                f"{out_dir} holds no study ({db} is missing); run a search there first, or "
                "pass the --storage the search used"
            )
        # a study in a read-only folder is read from a copy (SQLite's WAL cannot open in place)
        where, backend = str(db), open_storage(f"sqlite:///{readable_sqlite(db)}")
    else:
        _check_storage_exists(storage)
        where, backend = shown_url(storage), open_storage(storage)
    names = optuna.get_all_study_names(backend)
    if storage is None and study_name is None:
        if len(names) != 1:
            raise ConfigError(
                f"{where} holds {len(names)} studies ({', '.join(names)}); a search folder "
                "holds one"
            )
        study_name = names[0]
    name = study_name or default_study_name(out_dir)
    if name not in names:
        known = ", ".join(repr(n) for n in names) or "none"
        raise ConfigError(
            f"{where} holds no study named {name!r} (it holds {known}); pass the --study-name "
            "the search used"
        )
    return optuna.load_study(study_name=name, storage=backend)


def _check_storage_exists(storage: str) -> None:
    """Refuse a journal file or SQLite file that does not exist: opening it would create it."""
    if "://" not in storage:
        path = Path(storage)
    elif storage.startswith("sqlite:///"):
        path = Path(storage[len("sqlite:///") :])
    else:  # a server: whether the study is there is read from it
        return
    if not path.is_file():
        raise ConfigError(
            f"storage {shown_url(storage)!r}: {path} does not exist; pass the --storage the "
            "search used"
        )


def is_repeat(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether ``trial`` repeated an earlier config (``duplicate_of``) or a zoo reference
    (``reference_of``): PRUNED at once, it evaluated no network of its own."""
    return attrs.DUPLICATE_OF in trial.user_attrs or attrs.REFERENCE_OF in trial.user_attrs


def completed_count(study: optuna.Study) -> int:
    """Finished (COMPLETE or PRUNED) trials that evaluated a network of their own, i.e. not a
    repeat (:func:`is_repeat`); the fine-tune stage's trials are not trials of the search."""
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return sum(
        not is_repeat(t) and attrs.FINETUNES not in t.user_attrs
        for t in study.get_trials(deepcopy=False, states=states)
    )
