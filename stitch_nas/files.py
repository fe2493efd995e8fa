"""Files stitch_nas writes for a user: atomic writes, and checksums to verify them.

Atomic writes: readers see the old file (or folder) or the new one, never half of one.

Everything stitch_nas writes for a user (zoo weights, cache spills, reports) goes through here:
a temporary file in the same folder, fsynced, then ``os.replace``d into place, so a crash or a
concurrent reader never meets a half-written file.
"""

from __future__ import annotations

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
