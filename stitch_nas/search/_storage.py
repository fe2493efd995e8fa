"""Where a study lives: SQLite in the output folder, an RDB URL, or a journal file.

- ``DIR/study.db`` and any ``sqlite://``, ``postgresql://`` or ``mysql://`` URL open an
  :class:`optuna.storages.RDBStorage` with Optuna's heartbeat: every running trial records a
  heartbeat each ``heartbeat_s`` seconds, and a trial whose driver was killed is marked FAIL by
  :func:`optuna.storages.fail_stale_trials` once ``2 * heartbeat_s`` have passed without one.
  ``study.optimize`` runs both; the Ray driver calls them for the trials it has in flight.
- A path without ``://`` (``runs/study.log``) opens a :class:`~optuna.storages.JournalStorage`
  on a :class:`~optuna.storages.journal.JournalFileBackend`: several processes on one machine,
  no database server. Journal storage has no heartbeat in Optuna.

The storages opened here are remembered by study, so that :mod:`._user_attrs` can write a
trial's user attributes in one transaction rather than one per attribute.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import time
import warnings
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from stitch_nas import attrs
from stitch_nas.choices import check_at_least
from stitch_nas.errors import ConfigError
from stitch_nas.extras import require
from stitch_nas.files import disk_full

__all__ = [
    "DEFAULT_HEARTBEAT_S",
    "Heartbeat",
    "ask_lock_of",
    "fail_running",
    "open_storage",
    "rdb_storage_of",
    "shown_url",
    "storage_url_of",
]

logger = logging.getLogger(__name__)

# as SQLAlchemy parses a URL: scheme://user:password@host..., the password up to the first "@"
_URL_PASSWORD = re.compile(r"^(?P<head>[\w+.-]+://[^:/@]*:)(?P<password>[^@]*)(?=@)")
# and the drivers' own query keys (mysql://...?password=...)
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&](?:password|passwd)=)(?P<password>[^&#]*)")
DEFAULT_HEARTBEAT_S = 60
_RDB_SCHEMES = ("sqlite", "postgresql", "mysql")
# storages this package opened, by study: the ones _user_attrs.write_user_attrs may batch on
_RDB_OF_STUDY: weakref.WeakKeyDictionary[optuna.Study, optuna.storages.RDBStorage] = (
    weakref.WeakKeyDictionary()
)
# ... each one's storage and the URL another process opens it by (Ray workers that drive)
_OPENED: weakref.WeakKeyDictionary[optuna.Study, tuple[optuna.storages.BaseStorage, str | None]] = (
    weakref.WeakKeyDictionary()
)


def shown_url(url: str, text: str | None = None) -> str:
    """``text`` (default ``url`` itself) with every password ``url`` holds replaced by ``***``,
    as messages, logs, reports and study attributes show a storage URL
    (``postgresql://user:***@host/db``)."""
    found = _URL_PASSWORD.match(url)
    secrets = [found["password"]] if found and found["password"] else []
    secrets += [m["password"] for m in _QUERY_PASSWORD.finditer(url) if m["password"]]
    if text is None:  # by position: a short password may be a part of the host's name too
        shown = _URL_PASSWORD.sub(lambda m: m["head"] + "***" if m["password"] else m[0], url)
        return _QUERY_PASSWORD.sub(lambda m: m["head"] + "***" if m["password"] else m[0], shown)
    for secret in secrets:  # a driver's message may quote the URL, or the password alone
        text = text.replace(secret, "***")
    return text


def open_storage(
    url: str, *, heartbeat_s: int = DEFAULT_HEARTBEAT_S
) -> optuna.storages.BaseStorage:
    """An Optuna storage for ``url`` (see the module docstring for the kinds).

    Raises:
        ConfigError: ``url`` names an unknown scheme, a missing driver, or cannot be opened.
    """
    check_at_least(heartbeat_s, "heartbeat_s", 1)  # search.heartbeat_s' check
    if "://" not in url:
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        path = Path(url)
        if not path.parent.is_dir():
            raise ConfigError(
                f"journal storage {shown_url(url)!r}: folder {path.parent} does not exist"
            )
        return JournalStorage(JournalFileBackend(str(path)))
    scheme = url.split("://", 1)[0].split("+", 1)[0]
    if scheme not in _RDB_SCHEMES:
        raise ConfigError(
            f"cannot open the study at storage {shown_url(url)!r}: unknown scheme {scheme!r}; use "
            "sqlite:///FILE, postgresql://USER@HOST/DB, mysql://... or a journal file path"
        )
    url = _with_installed_driver(url)
    try:
        with warnings.catch_warnings():  # heartbeats: experimental in Optuna since 2.9
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            storage = optuna.storages.RDBStorage(
                url,
                heartbeat_interval=heartbeat_s,
                grace_period=2 * heartbeat_s,
                engine_kwargs=_engine_kwargs(url),
            )
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy/driver errors of every kind
        if disk_full(exc):  # SQLite creating its tables on a full disk: say so plainly
            raise ConfigError(
                f"no space left on the disk for the study at {shown_url(url)!r}; free space, "
                "then run again"
            ) from None
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            f"cannot open the study at storage {shown_url(url)!r}: {shown_url(url, first)}"
        ) from None  # the chained driver error may quote the URL, password and all
    if scheme == "sqlite":
        _sqlite_wal(storage)
    return storage


def _with_installed_driver(url: str) -> str:
    """``postgresql://`` means psycopg2 to SQLAlchemy; use psycopg 3 when only it is installed."""
    if not url.startswith("postgresql://"):
        return url
    try:
        import psycopg2  # noqa: F401  (a driver the user installed: SQLAlchemy's default)
    except ImportError:
        require("postgres", "psycopg", "a postgresql:// storage")
        return "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


def _engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        # several processes (report while a search runs, a second driver) wait, not fail
        return {"connect_args": {"timeout": 60}}
    # a server may drop idle connections between a long trial's writes
    return {"pool_pre_ping": True}


def _sqlite_wal(storage: optuna.storages.RDBStorage) -> None:
    """WAL journal and ``synchronous=NORMAL``: a commit is an append, not an fsync of the file.

    Readers (optuna-dashboard, ``stitch-nas report``) do not block the driver either. Every
    connection gets the pragmas: the pool is emptied after the listener is in place.
    """
    import sqlalchemy

    def pragmas(connection: sqlite3.Connection, _record: Any) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    sqlalchemy.event.listen(storage.engine, "connect", pragmas)
    storage.engine.dispose()


def remember_storage(
    study: optuna.Study, storage: optuna.storages.BaseStorage, url: str | None = None
) -> None:
    """Note that ``study`` runs on ``storage``, opened here from ``url`` (lets writes be
    batched, and other processes open the same study: :func:`storage_url_of`)."""
    if isinstance(storage, optuna.storages.RDBStorage):
        _RDB_OF_STUDY[study] = storage
    _OPENED[study] = (storage, None if url is None else _absolute(url))
    if url is not None and url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        _one_ask_at_a_time(study, Path(url[len("sqlite:///") :]))


def _one_ask_at_a_time(study: optuna.Study, db: Path) -> None:
    """Let one process at a time ask ``study``, on an SQLite file, for a trial.

    An ask first takes a trial enqueued as WAITING (a seed, a refinement) by setting it
    RUNNING. Optuna guards that with ``SELECT ... FOR UPDATE``, which SQLite ignores, so two
    processes asking at once (Ray workers, joined drivers) both took the same trial and both
    ran it. An exclusive lock on a file beside the database (:func:`ask_lock_of`; every
    process that opens the database sees it) is held for the ask. It stays there, empty, with
    the database: removing a lock file others may hold would let two processes lock two files.
    """
    import fcntl  # POSIX: Ray and several drivers on one SQLite file run there

    lock = ask_lock_of(db)
    ask = study.ask

    def ask_alone(fixed_distributions: Any = None) -> optuna.Trial:
        with open(lock, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
            return ask(fixed_distributions)

    setattr(study, "ask", ask_alone)  # noqa: B010 - this study object's asks only


def ask_lock_of(db: Path) -> Path:
    """The lock file that serialises asks on the SQLite database ``db``: ``<db>-ask.lock``
    (``study.db-ask.lock``), beside it and removed with it."""
    return db.with_name(db.name + "-ask.lock")


def rdb_storage_of(study: optuna.Study) -> optuna.storages.RDBStorage | None:
    """The RDB storage :func:`open_storage` opened for ``study``, or None."""
    return _RDB_OF_STUDY.get(study)


def storage_url_of(study: optuna.Study) -> str | None:
    """The URL (or journal file) ``study`` was opened from here, file paths made absolute;
    None for a study this package did not open (in memory, or a user's own)."""
    opened = _OPENED.get(study)
    return None if opened is None else opened[1]


def is_file_storage(url: str) -> bool:
    """Whether ``url`` is a file on this machine (SQLite or journal), not a database server."""
    return "://" not in url or url.startswith("sqlite:")


def _absolute(url: str) -> str:
    """A file storage's path made absolute, so a process in another folder opens the same file."""
    if "://" not in url:
        return str(Path(url).resolve())
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        return "sqlite:///" + str(Path(url[len("sqlite:///") :]).resolve())
    return url


def fail_running(
    study: optuna.Study,
    reason: str,
    worker: str | None = None,
    storage: optuna.storages.BaseStorage | None = None,
) -> list[int]:
    """Mark the study's RUNNING trials FAIL with ``reason``: all of them, or only those whose
    ``ray_worker`` attribute is ``worker``. Only for trials whose process is known to be gone.

    Args:
        study: The study.
        reason: Recorded as each trial's ``fail_reason``.
        worker: Only this Ray worker's trials; None: every running trial.
        storage: The storage ``study`` was created on; None: the one it was opened on here.

    Returns:
        The numbers of the trials marked.
    """
    if storage is None:
        opened = _OPENED.get(study)
        if opened is None:
            raise ConfigError("fail_running needs the study's storage (it was not opened here)")
        storage = opened[0]
    study_id = storage.get_study_id_from_name(study.study_name)
    marked = []
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if worker is not None and frozen.user_attrs.get(attrs.RAY_WORKER) != worker:
            continue
        # a Trial handle on the stored trial, to record why before it is told FAIL
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, frozen.number)
        optuna.Trial(study, trial_id).set_user_attr(attrs.FAIL_REASON, reason)
        study.tell(frozen.number, state=TrialState.FAIL, skip_if_finished=True)
        marked.append(frozen.number)
    return marked


def heartbeat_of(study: optuna.Study) -> Heartbeat | None:
    """A :class:`Heartbeat` for ``study`` if it runs on a heartbeat storage opened here."""
    storage = _RDB_OF_STUDY.get(study)
    if storage is None or storage.get_heartbeat_interval() is None:
        return None
    return Heartbeat(study, storage)


class Heartbeat:
    """Heartbeats for trials run through ask/tell (the Ray driver), as ``optimize`` sends them.

    Optuna's ``study.optimize`` starts a heartbeat thread per trial and fails stale trials
    before each new one; a driver that asks for trials and tells results itself calls
    :meth:`beat` for the trials it has in flight and :meth:`fail_stale` now and then.
    """

    def __init__(self, study: optuna.Study, storage: optuna.storages.RDBStorage) -> None:
        self.study, self.storage = study, storage
        self.interval = float(storage.get_heartbeat_interval() or DEFAULT_HEARTBEAT_S)
        self._study_id = storage.get_study_id_from_name(study.study_name)
        self._last = 0.0

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.interval / 2

    def beat(self, numbers: Iterable[int]) -> None:
        """Record a heartbeat for each running trial in ``numbers``; fail stale trials."""
        for number in numbers:
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(self._study_id, number)
            self.storage.record_heartbeat(trial_id)
        self._last = time.monotonic()
        self.fail_stale()

    def fail_stale(self) -> None:
        """Trials of dead drivers, silent for longer than the grace period, become FAIL."""
        with warnings.catch_warnings():  # experimental in Optuna, stable in behaviour
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)
