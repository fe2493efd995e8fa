"""Files stitch_nas writes for a user: atomic writes, and checksums to verify them.

Atomic writes: readers see the old file (or folder) or the new one, never half of one.

Everything stitch_nas writes for a user (zoo weights, cache spills, reports) goes through here:
a temporary file in the same folder, fsynced, then ``os.replace``d into place, so a crash or a
concurrent reader never meets a half-written file.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = [
    "atomic_file",
    "atomic_folder",
    "atomic_write",
    "default_cache_dir",
    "disk_full",
    "not_writable",
    "readable_sqlite",
    "sha256_file",
]


def default_cache_dir() -> Path:
    """Return ``$STITCH_NAS_CACHE`` if set, else ``~/.cache/stitch_nas``: where the mini zoo's
    weights and unpacked ``.npz`` arrays are kept between runs."""
    env = os.environ.get("STITCH_NAS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "stitch_nas"


@contextmanager
def atomic_file(path: Path) -> Iterator[IO[bytes]]:
    """Yield a temporary file next to ``path``; on success fsync it and move it into place."""
    handle = tempfile.NamedTemporaryFile(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
    )
    try:
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(handle.name, 0o644)  # temp files are 0600; what we write is meant to be read
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_file(path) as handle:
        handle.write(data)


@contextmanager
def atomic_folder(target: Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``target``; on success it replaces ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        yield tmp
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700 folders; an export is meant to be shared
        old = None
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
        os.replace(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# SQLite files whose folder this process cannot write in -> their private copies (see below)
_COPIES: dict[tuple[str, int, int], Path] = {}


def readable_sqlite(db: Path) -> Path:
    """``db`` itself where this process can write beside it, else a private copy to read.

    A study's SQLite file is in WAL mode, and SQLite must create ``-shm`` (and ``-wal``) files
    beside it even to read it, so in a read-only folder (a run copied from elsewhere, a shared
    mount) it fails with "unable to open database file" although the file is a good study. The
    copy (with the write-ahead log, which may hold the latest trials) is made in a temporary
    folder removed at exit; the user's files are only read.
    """
    db = Path(db)
    if os.access(db.parent, os.W_OK) and os.access(db, os.W_OK):  # EROFS: False, even to root
        return db
    stat = db.stat()
    key = (str(db.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _COPIES:
        folder = Path(tempfile.mkdtemp(prefix="stitch_nas-read-only-"))
        atexit.register(shutil.rmtree, folder, True)
        for suffix in ("", "-wal", "-journal"):
            source = db.with_name(db.name + suffix)
            if source.is_file():
                shutil.copyfile(source, folder / source.name)
        _COPIES[key] = folder / db.name
    return _COPIES[key]


def sha256_file(path: str | Path) -> str:
    """Return the sha256 hex digest of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def disk_full(exc: BaseException | None) -> str | None:
    """What ran out of room when ``exc``, or an exception it arose from, is a full disk (an
    ``OSError`` ENOSPC / EDQUOT, or SQLite's "database or disk is full", which Optuna wraps and
    may even hide behind an ``AssertionError``); None for any other fault."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return "no space left on the disk" + (
                f" writing {exc.filename}" if exc.filename else ""
            )
        if "database or disk is full" in str(exc):
            return "no space left on the disk for the study database"
        exc = exc.__cause__ or exc.__context__
    return None


def not_writable(exc: BaseException | None) -> str | None:
    """What could not be written when ``exc``, or an exception it arose from, is a permission
    or read-only fault (an ``OSError`` EACCES / EPERM / EROFS, or SQLite's "attempt to write a
    readonly database"); None for any other fault."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            where = f" {str(exc.filename)!r}" if exc.filename else ""
            return f"cannot write{where} ({exc.strerror})"
        if "readonly database" in str(exc):
            return "cannot write the study database (it is read-only)"
        exc = exc.__cause__ or exc.__context__
    return None
