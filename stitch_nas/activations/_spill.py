"""Spill files of the activation cache: plain ``.npy`` plus a JSON sidecar, verified on read.

A spill file is written either whole (:func:`write_spill`, an evicted in-memory tensor) or batch
by batch into a memory map (:class:`SpillWriter`, an activation too large for the memory
budget), and read back whole (:func:`read_verified`) or as a read-only memory map
(:func:`map_verified`) that callers slice batch by batch. The sidecar records the key, shape,
dtype, size and sha256; it is written last and marks the ``.npy`` as complete, so processes
sharing a folder never read half a file. When several processes spill one key at once (Ray
workers sharing a folder), the first complete ``.npy`` stays and only its description is written
(:func:`_publish`), so they leave one valid pair even where their bytes differ. Nothing here
ever unpickles.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stitch_nas.errors import CacheError
from stitch_nas.files import atomic_file, sha256_file

if TYPE_CHECKING:
    from ._keys import ActivationKey

__all__ = [
    "SpillFolder",
    "SpillWriter",
    "map_verified",
    "read_verified",
    "spill_paths",
    "write_spill",
]

logger = logging.getLogger(__name__)


def spill_paths(folder: Path, digest: str) -> tuple[Path, Path]:
    """The ``.npy`` and sidecar paths of one entry."""
    return folder / f"{digest}.npy", folder / f"{digest}.json"


# errors of a file system without hard links, where a spill file is moved into place instead
_NO_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}


def _temporary(folder: Path, digest: str) -> Path:
    fd, name = tempfile.mkstemp(dir=folder, prefix=f".{digest}.npy.", suffix=".tmp")
    os.close(fd)
    return Path(name)


def _publish(
    tmp: Path, folder: Path, digest: str, fmt: int, key: ActivationKey, shape: Any, dtype: Any
) -> None:
    """Put the complete, fsynced temporary ``.npy`` ``tmp`` in place, then write its sidecar.

    The first writer wins: processes sharing a folder may spill one key at once, and their bytes
    may differ (a GPU worker's and a CPU one's last bits). ``os.replace`` let a later writer swap
    its ``.npy`` in under a sidecar another had written, a pair every reader deletes. A hard
    link never replaces a file, so the ``.npy`` in place is the first complete one, and every
    sidecar written for it describes those bytes.
    """
    npy_path, meta_path = spill_paths(folder, digest)
    os.chmod(tmp, 0o644)  # temporary files are 0600; spill files are meant to be shared
    size, sha = tmp.stat().st_size, sha256_file(tmp)
    try:
        os.link(tmp, npy_path)
    except FileExistsError:
        if meta_path.is_file():
            return  # another writer's pair
        # its writer died before the sidecar (or is writing it): a linked file is complete
        size, sha = npy_path.stat().st_size, sha256_file(npy_path)
    except OSError as exc:
        if exc.errno not in _NO_LINKS:
            raise
        os.replace(tmp, npy_path)  # no hard links here: the last complete writer wins
    meta = {"format": fmt, "key": asdict(key), "shape": list(shape)}
    meta.update(dtype=np.dtype(dtype).str, size=size, sha256=sha)
    # the sidecar goes last: it marks the .npy as complete for other processes
    with atomic_file(meta_path) as handle:
        handle.write(json.dumps(meta, indent=1, sort_keys=True).encode())


def write_spill(folder: Path, digest: str, fmt: int, key: ActivationKey, array: np.ndarray) -> None:
    """Write ``array`` and its sidecar unless another writer's pair is there (raises OSError
    on a full disk)."""
    tmp = _temporary(folder, digest)
    try:
        with open(tmp, "wb") as handle:
            np.save(handle, array, allow_pickle=False)
            handle.flush()
            os.fsync(handle.fileno())
        _publish(tmp, folder, digest, fmt, key, array.shape, array.dtype)
    finally:
        tmp.unlink(missing_ok=True)


class SpillWriter:
    """A spill file filled batch by batch through a memory map, then committed atomically.

    The file's blocks are reserved up front (``posix_fallocate``), so a full disk raises
    OSError here rather than a bus error halfway through the writes.

    Args:
        folder: The spill folder.
        digest: The entry's digest.
        fmt: The cache format number recorded in the sidecar.
        key: The entry's key.
        shape: Full shape of the activation.
        dtype: Numpy dtype of the stored values.
    """

    def __init__(
        self,
        folder: Path,
        digest: str,
        fmt: int,
        key: ActivationKey,
        shape: tuple[int, ...],
        dtype: np.dtype,
    ) -> None:
        self.folder, self.digest, self.fmt, self.key = folder, digest, fmt, key
        self.tmp = _temporary(folder, digest)
        try:
            self.array: np.memmap | None = np.lib.format.open_memmap(
                self.tmp, mode="w+", dtype=dtype, shape=shape
            )
            if hasattr(os, "posix_fallocate"):
                with open(self.tmp, "rb+") as handle:
                    os.posix_fallocate(handle.fileno(), 0, self.tmp.stat().st_size)
        except BaseException:
            self.abort()
            raise

    def write(self, start: int, values: np.ndarray) -> None:
        """Store ``values`` at rows ``start:start + len(values)``."""
        if self.array is None:
            raise CacheError(f"spill file for {self.digest} is already closed")
        self.array[start : start + len(values)] = values

    def commit(self) -> None:
        """Flush the file and put it in place (:func:`_publish`); the sidecar goes last."""
        if self.array is None:
            raise CacheError(f"spill file for {self.digest} is already closed")
        self.array.flush()
        shape, dtype = self.array.shape, self.array.dtype
        self.array = None  # unmap before the move
        try:
            with open(self.tmp, "rb+") as handle:
                os.fsync(handle.fileno())
            _publish(self.tmp, self.folder, self.digest, self.fmt, self.key, shape, dtype)
        finally:
            self.abort()  # the temporary name goes; a linked file stays under its own

    def abort(self) -> None:
        """Drop the partial file."""
        self.array = None
        self.tmp.unlink(missing_ok=True)


def _check(npy_path: Path, meta_path: Path, key: ActivationKey, *, hashed: bool) -> dict:
    meta = json.loads(meta_path.read_text())
    if not isinstance(meta, dict) or meta.get("key") != asdict(key):
        raise CacheError(f"sidecar {meta_path} describes another key")
    size = npy_path.stat().st_size
    if size != meta["size"]:
        raise CacheError(f"size {size} != {meta['size']} bytes recorded in the sidecar")
    # shape, dtype and size cannot catch flipped bytes in the data; only the hash can
    if not hashed and sha256_file(npy_path) != meta["sha256"]:
        raise CacheError("sha256 mismatch with the sidecar")
    return meta


def map_verified(
    npy_path: Path, meta_path: Path, key: ActivationKey, *, hashed: bool = False
) -> np.ndarray:
    """A read-only memory map of a spill file checked against its sidecar.

    Args:
        hashed: The file was already hashed by this process (same size and sidecar), so the
            sha256 check is skipped; size, key, shape and dtype are still checked.

    Raises:
        CacheError: On any mismatch (callers delete the pair and recompute).
    """
    meta = _check(npy_path, meta_path, key, hashed=hashed)
    mapped = np.load(npy_path, mmap_mode="r", allow_pickle=False)
    if list(mapped.shape) != meta["shape"] or mapped.dtype.str != meta["dtype"]:
        raise CacheError(
            f"shape/dtype {mapped.shape}/{mapped.dtype.str} != {meta['shape']}/{meta['dtype']}"
        )
    return mapped


def read_verified(npy_path: Path, meta_path: Path, key: ActivationKey) -> np.ndarray:
    """Load a whole spill file after checking it; raise CacheError on mismatch."""
    mapped = map_verified(npy_path, meta_path, key)
    # copy out of the map: a tensor over a read-only map would segfault on in-place writes, and
    # an owned copy is what the memory budget counts (the hash already paged the file in)
    return np.array(mapped, copy=True, order="C")


#: share of the disk's free space a spill folder may fill when no size is given
DEFAULT_DISK_FRACTION = 0.5


class SpillFolder:
    """The activation cache's spill folder: which entries it holds, writing and reading them
    verified, keeping its ``.npy`` files within a size, and stopping with one warning once the
    disk refuses a write (entries are then recomputed instead). Not thread-safe: the cache
    calls it under its lock.

    Args:
        path: The folder, created if missing.
        fmt: The cache format number recorded in each sidecar.
        disk_gb: GiB the folder's files may take, counting every process's (the folder is
            shared); an entry that would pass it is not written, and is recomputed when next
            needed. None: what the folder holds now plus half the disk's free space
            (:data:`DEFAULT_DISK_FRACTION`), so that spilling never fills a node's disk.

    Raises:
        CacheError: If the folder cannot be created.
    """

    def __init__(self, path: Path, fmt: int, disk_gb: float | None = None) -> None:
        self.path, self.fmt = path, fmt
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(
                f"cannot create spill_dir {str(path)!r} ({exc}); "
                "pass a writable folder or spill_dir=None"
            ) from exc
        if disk_gb is None:
            free = shutil.disk_usage(path).free
            self.max_bytes = self.size_bytes() + int(free * DEFAULT_DISK_FRACTION)
        else:
            self.max_bytes = int(disk_gb * 2**30)
        self.failed = False  # set once the disk refused a write
        self.files_written = 0
        self._full_warned = False
        self._hashed: dict[str, tuple[int, int]] = {}  # digest -> (size, mtime_ns) verified

    def holds(self, digest: str) -> bool:
        """Whether both files of an entry are there (their contents are checked on reading)."""
        return all(path.is_file() for path in spill_paths(self.path, digest))

    def size_bytes(self) -> int:
        """Bytes of the folder's ``.npy`` files, those being written included (their blocks are
        taken); the sidecars' few hundred bytes each are not counted."""
        total = 0
        with os.scandir(self.path) as entries:
            for entry in entries:
                if not entry.name.endswith((".npy", ".tmp")):
                    continue
                try:  # another process may delete a file between listing and stat
                    total += entry.stat().st_size if entry.is_file() else 0
                except FileNotFoundError:
                    pass
        return total

    def write(self, key: ActivationKey, digest: str, array: np.ndarray) -> None:
        """Write ``array`` unless its entry is there; a disk failure stops spilling."""
        if self.failed or self.holds(digest) or not self._fits(array.nbytes):
            return
        try:
            write_spill(self.path, digest, self.fmt, key, array)
        except OSError as exc:  # a full disk costs recomputations later, not the search
            self._stop(exc)
            return
        self.files_written += 1

    def writer(
        self, key: ActivationKey, digest: str, shape: tuple[int, ...], dtype: np.dtype
    ) -> SpillWriter | None:
        """A :class:`SpillWriter` for ``key``, or None when spilling stopped, the entry is
        there or it would pass the folder's size; a disk that is full now stops spilling."""
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if self.failed or self.holds(digest) or not self._fits(nbytes):
            return None
        try:
            return SpillWriter(self.path, digest, self.fmt, key, shape, dtype)
        except OSError as exc:
            self._stop(exc)
            return None

    def commit(self, writer: SpillWriter) -> None:
        """Put a filled writer's file in place; a disk failure stops spilling."""
        try:
            writer.commit()
        except OSError as exc:
            self._stop(exc)
            return
        self.files_written += 1

    def read(self, key: ActivationKey, digest: str) -> np.ndarray | None:
        """The entry's verified array (an owned copy), or None if absent or bad (deleted)."""
        if not self.holds(digest):
            return None
        npy_path, meta_path = spill_paths(self.path, digest)
        try:
            return read_verified(npy_path, meta_path, key)
        except (OSError, ValueError, KeyError, TypeError, CacheError) as exc:
            self._drop(npy_path, meta_path, exc)
            return None

    def map(self, key: ActivationKey, digest: str) -> np.ndarray | None:
        """A read-only memory map of the entry, or None if absent or bad (deleted).

        The sha256 is checked the first time this folder object maps a file (and again if its
        size or modification time changes).
        """
        if not self.holds(digest):
            return None
        npy_path, meta_path = spill_paths(self.path, digest)
        try:
            stat = npy_path.stat()
            stamp = (stat.st_size, stat.st_mtime_ns)
            hashed = self._hashed.get(digest) == stamp
            array = map_verified(npy_path, meta_path, key, hashed=hashed)
        except (OSError, ValueError, KeyError, TypeError, CacheError) as exc:
            self._drop(npy_path, meta_path, exc)
            return None
        self._hashed[digest] = stamp
        return array

    def _fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more stay within the folder's size (warning once when not).

        The folder's files are counted afresh each time: other processes write there too (so
        processes that check at once may each write one entry past the size).
        """
        held = self.size_bytes()
        if held + nbytes <= self.max_bytes:
            return True
        if not self._full_warned:
            logger.warning(
                "spill folder %s holds %.2f GiB of its %.2f GiB (search.cache_disk_gb); "
                "activations that do not fit are recomputed instead",
                self.path,
                held / 2**30,
                self.max_bytes / 2**30,
            )
            self._full_warned = True
        return False

    def _stop(self, exc: OSError) -> None:
        if not self.failed:
            logger.warning(
                "stopped spilling activations to %s (%s); evicted ones will be recomputed",
                self.path,
                exc,
            )
        self.failed = True

    def _drop(self, npy_path: Path, meta_path: Path, exc: Exception) -> None:
        logger.warning("spill file %s is corrupt (%s); deleting and recomputing", npy_path, exc)
        # another process may have just replaced the pair; at worst both recompute once
        npy_path.unlink(missing_ok=True)
        meta_path.unlink(missing_ok=True)
