"""A trial's user attributes written at once: one transaction on SQLite, one append on a journal
file, one by one elsewhere; read back the same everywhere, and refused on a finished trial. And
on an SQLite file, one process at a time asks, so no two take the same enqueued trial."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.storages.journal import JournalFileBackend, JournalStorage

from stitch_nas.search._storage import open_storage, remember_storage
from stitch_nas.search._user_attrs import write_user_attrs

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


def _pop_enqueued(url: str, name: str, barrier, out: str) -> None:
    """In a forked process: open the study as stitch_nas does, then take enqueued trials."""
    storage = open_storage(url)
    study = optuna.load_study(study_name=name, storage=storage)
    remember_storage(study, storage, url)
    barrier.wait()
    numbers = []
    while True:
        trial = study.ask()
        if trial.number >= 40:  # past the enqueued ones
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            break
        numbers.append(trial.number)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED, skip_if_finished=True)
    with open(out, "w") as handle:
        handle.write(" ".join(map(str, numbers)))


def test_two_processes_never_take_one_enqueued_trial_on_sqlite(tmp_path):
    import multiprocessing

    url = f"sqlite:///{tmp_path}/study.db"
    study = optuna.create_study(storage=open_storage(url), directions=["maximize"])
    for i in range(40):
        study.enqueue_trial({}, user_attrs={"seed": i})
    fork = multiprocessing.get_context("fork")
    barrier = fork.Barrier(2)
    outs = [str(tmp_path / f"popped{i}.txt") for i in range(2)]
    processes = [
        fork.Process(target=_pop_enqueued, args=(url, study.study_name, barrier, out))
        for out in outs
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert [p.exitcode for p in processes] == [0, 0]
    popped = [int(n) for out in outs for n in Path(out).read_text().split()]
    # Optuna's SELECT ... FOR UPDATE is a no-op on SQLite: without one ask at a time, both
    # processes took some enqueued trials
    assert sorted(popped) == list(range(40))


def test_the_ask_lock_lives_beside_the_database_not_in_the_temporary_folder(tmp_path):
    """One lock file per study, removed with its folder, not one per database path ever asked
    left in the machine's temporary folder."""
    import tempfile

    url = f"sqlite:///{tmp_path}/study.db"
    storage = open_storage(url)
    study = optuna.create_study(storage=storage)
    remember_storage(study, storage, url)
    temporary = set(Path(tempfile.gettempdir()).glob("stitch_nas-ask-*"))
    study.tell(study.ask(), state=optuna.trial.TrialState.PRUNED)
    assert (tmp_path / "study.db-ask.lock").is_file()
    assert set(Path(tempfile.gettempdir()).glob("stitch_nas-ask-*")) == temporary
