"""The Optuna study a search writes to: samplers, creating, resuming and reopening it.

A search owns one study named ``stitch_nas``, in ``DIR/study.db`` (SQLite) or in an RDB given by
URL. Resuming marks the trials a killed driver left RUNNING as FAIL, so their slots are sampled
again and the search still stops at the requested total of finished trials.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import optuna

from stitch_nas import attrs
from stitch_nas.errors import ConfigError
from stitch_nas.plugins import Direction


class StudyShape(Protocol):
    """What a study needs from the objective (a StitchObjective has all of it)."""

    @property
    def names(self) -> Sequence[str]: ...

    @property
    def directions(self) -> Sequence[Direction]: ...

    @property
    def space_name(self) -> str: ...

    @property
    def budgets(self) -> Mapping[str, float]: ...


__all__ = [
    "SAMPLERS",
    "STUDY_NAME",
    "completed_count",
    "create_study",
    "fail_stale_running",
    "load_folder_study",
    "make_sampler",
]

logger = logging.getLogger(__name__)

SAMPLERS = ("tpe", "nsga2", "random")
STUDY_NAME = "stitch_nas"


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    """One of :data:`SAMPLERS`, seeded; TPE with constant liar so trials in flight differ."""
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=16)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ConfigError(f"unknown sampler {name!r}; use one of {SAMPLERS}")


def create_study(
    objective: StudyShape,
    out_dir: str | Path,
    *,
    sampler: str = "tpe",
    seed: int | None = 0,
    resume: bool = False,
    storage: str | None = None,
) -> optuna.Study:
    """The study stored in ``out_dir/study.db``; ``resume=True`` continues an existing one.

    With ``storage``, an Optuna RDB URL such as ``postgresql://user@host/db``, the study lives
    there instead and several drivers can work on it at once: a driver joins the study if it
    exists. Only ``resume=True`` marks trials left RUNNING as FAIL, so pass it only when no other
    driver is running.
    """
    out = Path(out_dir)
    db = out / "study.db"
    if storage is None:
        if db.exists() and not resume:
            raise ConfigError(
                f"{out} already holds a study; pass --resume to continue it or choose another --out"
            )
        if resume and not db.exists():
            raise ConfigError(f"nothing to resume: {db} does not exist; run without --resume first")
    out.mkdir(parents=True, exist_ok=True)
    load = resume or storage is not None
    try:
        study = optuna.create_study(
            storage=storage or f"sqlite:///{db}",
            study_name=STUDY_NAME,
            directions=objective.directions,
            sampler=make_sampler(sampler, seed),
            load_if_exists=load,
        )
    except Exception as exc:
        if storage is None:
            raise
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"cannot open the study at storage {storage!r}: {first}") from exc
    if resume:
        fail_stale_running(study)
    if load and list(study.user_attrs.get(attrs.OBJECTIVES, objective.names)) != objective.names:
        raise ConfigError(
            f"the study in {storage or out} optimises {study.user_attrs['objectives']}, not "
            f"{objective.names}; resume with the same objectives"
        )
    study.set_user_attr(attrs.OBJECTIVES, objective.names)
    study.set_user_attr(attrs.SPACE, objective.space_name)
    study.set_user_attr(attrs.BUDGETS, objective.budgets)
    return study


def fail_stale_running(study: optuna.Study) -> None:
    """Trials left RUNNING by a killed driver are marked FAIL so their slots are re-sampled."""
    storage = study._storage
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        storage.set_trial_user_attr(trial._trial_id, attrs.FAIL_REASON, "driver stopped mid-trial")
        storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
        logger.info("marked stale running trial %d as FAIL", trial.number)


def load_folder_study(out_dir: str | Path) -> optuna.Study:
    """The study a search wrote to ``out_dir/study.db``."""
    db = Path(out_dir) / "study.db"
    if not db.is_file():
        raise ConfigError(f"{out_dir} holds no study ({db} is missing); run a search there first")
    return optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{db}")


def completed_count(study: optuna.Study) -> int:
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return len(study.get_trials(deepcopy=False, states=states))
