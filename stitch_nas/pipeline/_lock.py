"""One run per output folder: a lock file inside ``--out``, held while the run lives.

A search takes :data:`LOCK_NAME` in its ``--out`` with ``flock`` (exclusive; shared for
``--join``, whose drivers share a folder on purpose) and keeps it until it ends, so a second run
into the same folder is refused in one line instead of both writing one study. The kernel drops
the lock when the process dies, so a killed run never leaves the folder blocked.

A refused run removes only what it made itself, by name (:meth:`Claim.undo`): the files it
created and the folder if it created it and it is empty again. It never removes a folder or
file another process may have written.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from stitch_nas.errors import ConfigError

try:
    import fcntl
except ImportError:  # Windows: no flock; runs there are not serialised
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_NAME", "STUDY_FILES", "Claim", "check_free", "claim_out"]

logger = logging.getLogger(__name__)

LOCK_NAME = ".stitch-nas.lock"
#: what a run writes into ``--out`` before its first trial (SQLite adds the journal, WAL and
#: shared-memory files; the first ask the lock of ``search._storage.ask_lock_of``)
STUDY_FILES = (
    "study.db",
    "study.db-journal",
    "study.db-wal",
    "study.db-shm",
    "study.db-ask.lock",
)
# a probe (check_free) of another process holds the lock for microseconds: retry that long
_CLAIM_TRIES = 20
_CLAIM_PAUSE_S = 0.02


def _pid(fd: int) -> str:
    """The pid a run wrote into the lock file ("" if none: a probe holds it)."""
    try:
        pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return pid if pid.isdigit() else ""


def _busy(out: Path, pid: str) -> ConfigError:
    who = f" (pid {pid})" if pid else ""
    return ConfigError(
        f"--out {str(out)!r} is in use by another stitch-nas run{who}; wait for it to end or "
        "choose another --out"
    )


def check_free(out_dir: Path, *, shared: bool = False) -> None:
    """Refuse ``out_dir`` if another run holds it; writes nothing (the lock file is only read)."""
    if fcntl is None:
        return
    out = Path(out_dir)
    try:
        fd = os.open(out / LOCK_NAME, os.O_RDONLY)
    except OSError:  # no lock file (or no folder): nobody holds it
        return
    try:
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _busy(out, _pid(fd)) from None
    finally:
        os.close(fd)  # closing releases the probe's lock


class Claim:
    """A held ``--out``: what this run created there, so a refused run removes only that."""

    def __init__(self, out: Path, fd: int | None, made_folder: bool) -> None:
        self.out = out
        self.fd = fd
        self.made_folder = made_folder
        self.undone = False
        self._before = {n for n in STUDY_FILES if (out / n).exists()}

    def undo(self) -> None:
        """Remove the :data:`STUDY_FILES` this run created, and on :meth:`release` the folder
        if this run made it and nothing else is in it. Call it while the lock is held."""
        for name in STUDY_FILES:
            if name not in self._before:
                (self.out / name).unlink(missing_ok=True)
        self.undone = True

    def release(self) -> None:
        """Let go of the folder (the lock file goes unless a ``--join`` driver shares it)."""
        if self.fd is not None:
            self._drop_lock_file()
            os.close(self.fd)
            self.fd = None
        if self.undone and self.made_folder:
            try:
                self.out.rmdir()  # only if empty: another process may have written into it
            except OSError:
                pass

    def _drop_lock_file(self) -> None:
        """Remove the lock file unless another ``--join`` driver still shares it. A run that
        opened the file meanwhile sees it gone once it holds the lock, and takes a new one."""
        if fcntl is None or self.fd is None:  # no flock here, or released already
            return
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        (self.out / LOCK_NAME).unlink(missing_ok=True)


def _make_folder(out: Path) -> bool:
    """Create ``out`` (and its parents); True if this call created ``out`` itself."""
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        out.mkdir()
    except FileExistsError:
        return False
    return True


def _take(out: Path, shared: bool) -> tuple[int | None, bool]:
    if fcntl is None:  # claim_out only calls this where flock exists
        return None, _make_folder(out)
    made, pid = False, ""
    mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
    path = out / LOCK_NAME
    for _ in range(_CLAIM_TRIES):
        made = _make_folder(out) or made
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            pid = _pid(fd)
            os.close(fd)
            if pid:  # a run holds it (a probe writes no pid, and lets go at once)
                break
            time.sleep(_CLAIM_PAUSE_S)
            continue
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:  # the lock file is still the one in the folder: it is ours
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd, made
        os.close(fd)  # the run before removed it after we opened it: take the new one
    if made:  # refused: leave no folder behind (rmdir: only while it is empty)
        try:
            out.rmdir()
        except OSError:
            pass
    raise _busy(out, pid)


@contextmanager
def claim_out(out_dir: Path, *, shared: bool = False) -> Iterator[Claim]:
    """Hold ``out_dir`` (created if missing) for the ``with`` block, then let it go.

    ``shared``: for ``--join``, whose drivers share the folder; a run without it is refused
    while they hold it, and the other way round. A run that fails before it has anything to
    keep calls :meth:`Claim.undo` inside the block.

    Raises:
        ConfigError: another run holds the folder, or it cannot be written.
    """
    out = Path(out_dir)
    try:
        if fcntl is None:
            logger.debug("no flock on this platform: %s is not locked", out)
            fd, made = None, _make_folder(out)
        else:
            fd, made = _take(out, shared)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.ENOTDIR):
            raise
        raise ConfigError(
            f"--out {str(out)!r}: cannot write there ({exc.strerror}); choose a folder you can "
            "write to"
        ) from None
    claim = Claim(out, fd, made)
    try:
        yield claim
    finally:
        claim.release()
