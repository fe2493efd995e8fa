"""Spill files of the activation cache: plain ``.npy`` plus a JSON sidecar, verified on read.

A spill file is written either whole (:func:`write_spill`, an evicted in-memory tensor) or batch
by batch into a memory map (:class:`SpillWriter`, an activation too large for the memory
budget), and read back whole (:func:`read_verified`) or as a read-only memory map
(:func:`map_verified`) that callers slice batch by batch. The sidecar records the key, shape,
dtype, size and sha256; it is written last and marks the ``.npy`` as complete, so processes
sharing a folder never read half a file. Nothing here ever unpickles.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stitch_nas.errors import CacheError
from stitch_nas.files import atomic_file, sha256_file

if TYPE_CHECKING:
    from ._keys import ActivationKey

__all__ = ["SpillWriter", "map_verified", "read_verified", "spill_paths", "write_spill"]


def spill_paths(folder: Path, digest: str) -> tuple[Path, Path]:
    """The ``.npy`` and sidecar paths of one entry."""
    return folder / f"{digest}.npy", folder / f"{digest}.json"


def _write_sidecar(
    meta_path: Path, fmt: int, key: ActivationKey, array: Any, size: int, sha: str
) -> None:
    meta = {"format": fmt, "key": asdict(key), "shape": list(array.shape)}
    meta.update(dtype=np.dtype(array.dtype).str, size=size, sha256=sha)
    with atomic_file(meta_path) as handle:
        handle.write(json.dumps(meta, indent=1, sort_keys=True).encode())


def write_spill(folder: Path, digest: str, fmt: int, key: ActivationKey, array: np.ndarray) -> None:
    """Write ``array`` and its sidecar atomically (raises OSError on a full disk)."""
    npy_path, meta_path = spill_paths(folder, digest)
    with atomic_file(npy_path) as handle:
        np.save(handle, array, allow_pickle=False)
        handle.flush()
        # hash the temporary file: the final name may already hold another writer's bytes
        size, sha = handle.tell(), sha256_file(Path(handle.name))
    # the sidecar goes last: it marks the .npy as complete for other processes
    _write_sidecar(meta_path, fmt, key, array, size, sha)


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
        fd, name = tempfile.mkstemp(dir=folder, prefix=f".{digest}.npy.", suffix=".tmp")
        os.close(fd)
        self.tmp = Path(name)
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
        """Flush, hash and move the file into place; write the sidecar last."""
        if self.array is None:
            raise CacheError(f"spill file for {self.digest} is already closed")
        self.array.flush()
        shape, dtype = self.array.shape, self.array.dtype
        self.array = None  # unmap before the move
        try:
            with open(self.tmp, "rb+") as handle:
                os.fsync(handle.fileno())
            os.chmod(self.tmp, 0o644)
            size, sha = self.tmp.stat().st_size, sha256_file(self.tmp)
            npy_path, meta_path = spill_paths(self.folder, self.digest)
            os.replace(self.tmp, npy_path)
        except BaseException:
            self.abort()
            raise
        _write_sidecar(meta_path, self.fmt, self.key, np.empty(shape, dtype), size, sha)

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
