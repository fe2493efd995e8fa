"""A trial's user attributes written at once: one transaction on SQLite, one append on a journal
file, one by one elsewhere; read back the same everywhere, and refused on a finished trial."""

from __future__ import annotations

import optuna
import pytest
from optuna.storages.journal import JournalFileBackend, JournalStorage

from stitch_nas.search._storage import open_storage, remember_storage, write_user_attrs

optuna.logging.set_verbosity(optuna.logging.WARNING)
# study.ask() on a heartbeat storage warns that optimize() would send the heartbeats
pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")
VALUES = {"config": {"fragments": [["a", None, "s1"]]}, "accuracy": 0.5, "describe": "a ⇒ b"}


def _study(kind: str, tmp_path) -> optuna.Study:
    if kind == "memory":
        return optuna.create_study(directions=["maximize", "minimize"])
    url = str(tmp_path / "study.log") if kind == "journal" else f"sqlite:///{tmp_path}/study.db"
    storage = open_storage(url)
    study = optuna.create_study(storage=storage, directions=["maximize", "minimize"])
    remember_storage(study, storage)
    return study


@pytest.mark.parametrize("kind", ["sqlite", "journal", "memory"])
def test_user_attrs_written_at_once_read_back_as_set_one_by_one(kind, tmp_path):
    study = _study(kind, tmp_path)
    trial = study.ask()
    write_user_attrs(trial, VALUES)
    assert trial.user_attrs == VALUES  # the trial object shows them, as set_user_attr does
    study.tell(trial, [0.5, 1.0])
    assert study.trials[0].user_attrs == VALUES
    if kind == "journal":  # and another process reading the file sees them
        other = JournalStorage(JournalFileBackend(str(tmp_path / "study.log")))
        study_id = other.get_study_id_from_name(study.study_name)
        assert other.get_all_trials(study_id)[0].user_attrs == VALUES


def test_a_journal_gets_all_attributes_in_one_append(tmp_path, monkeypatch):
    study = _study("journal", tmp_path)
    trial = study.ask()
    appends: list[int] = []
    real = JournalFileBackend.append_logs
    monkeypatch.setattr(
        JournalFileBackend,
        "append_logs",
        lambda self, logs: (appends.append(len(logs)), real(self, logs))[1],
    )
    write_user_attrs(trial, VALUES)
    assert appends == [len(VALUES)]


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_finished_trial_refuses_attributes_written_at_once(kind, tmp_path):
    study = _study(kind, tmp_path)
    trial = study.ask()
    study.tell(trial, [0.5, 1.0])
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        write_user_attrs(trial, VALUES)
