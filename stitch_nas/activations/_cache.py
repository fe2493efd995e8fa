"""A memory-bounded activation cache, spilled to disk and shared between processes.

A search evaluates hundreds of stitched networks built from the same frozen fragments, so the
activation of each zoo model at each cut point on each split is computed once and reused. Entries
live in memory up to a byte budget that also counts buffers still being filled (:meth:`reserve`),
so the budget holds at every moment. Least recently used entries are evicted first, probe-split
entries last (every stitch fit reads the probe). Evicted entries go to
``<spill_dir>/<digest>.npy`` (plain ``.npy``, never a pickle) plus a JSON sidecar with the key,
shape, dtype, size and sha256, so a damaged file is recomputed instead of returned (see
:mod:`._spill`). A full disk stops spilling with one warning; entries are then recomputed.
Device placement is the caller's job: tensors stay in memory as given (the budget counts their
bytes on any device); tensors read from disk are on CPU.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from stitch_nas.activations._keys import (  # re-exported: the cache's public face
    DEFAULT_MEMORY_FRACTION,
    FORMAT,
    STORAGE_DTYPES,
    ActivationKey,
    default_memory_gb,
    storage_dtype,
    weights_fingerprint,
)
from stitch_nas.activations._spill import (
    SpillWriter,
    map_verified,
    read_verified,
    spill_paths,
    write_spill,
)
from stitch_nas.choices import check_memory_gb
from stitch_nas.errors import CacheError

__all__ = [
    "DEFAULT_MEMORY_FRACTION",
    "STORAGE_DTYPES",
    "ActivationKey",
    "ActivationCache",
    "default_memory_gb",
    "storage_dtype",
    "weights_fingerprint",
]

logger = logging.getLogger(__name__)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class ActivationCache:
    """An LRU cache of activation tensors with a byte budget and an optional spill folder.

    Returned tensors are the cached objects themselves, not copies: treat them as read-only.
    Calls are serialised by a lock, so one cache may be shared by threads.

    Args:
        memory_gb: In-memory budget in GiB (``memory_gb * 2**30`` bytes); 0 keeps nothing in
            memory. None: :func:`default_memory_gb` (5 % of the machine's memory). A tensor
            larger than the budget is returned (and spilled) but not kept.
        spill_dir: Folder for evicted entries, created if missing; None drops evicted entries,
            which are then recomputed when asked for again.
        progress: Show a progress bar when spilling many entries at once
            (:meth:`clear_memory` with ``spill=True``); callers may read it for their own loops.
        dtype: Storage dtype of activations that a :class:`StitchContext` caches
            (``"float16"``, the default, halves memory and disk; computation stays float32).
            Tensors handed to :meth:`get_or_compute` are stored as given.

    Raises:
        ConfigError: If ``memory_gb`` is negative or not finite, or ``dtype`` is unsupported.
        CacheError: If ``spill_dir`` cannot be created.
    """

    def __init__(
        self,
        memory_gb: float | None = None,
        spill_dir: str | Path | None = None,
        progress: bool = False,
        dtype: str | torch.dtype = "float16",
    ) -> None:
        if memory_gb is None:
            memory_gb = default_memory_gb()
        self.budget_bytes = int(check_memory_gb(memory_gb) * 2**30)
        self.dtype = storage_dtype(dtype)
        self.progress = progress
        self.spill_dir = Path(spill_dir).expanduser() if spill_dir is not None else None
        if self.spill_dir is not None:
            try:
                self.spill_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CacheError(
                    f"cannot create spill_dir {str(self.spill_dir)!r} ({exc}); "
                    "pass a writable folder or spill_dir=None"
                ) from exc
        self._entries: OrderedDict[str, tuple[ActivationKey, torch.Tensor]] = OrderedDict()
        self._bytes = 0
        self._reserved = 0  # buffers being filled, counted against the budget
        self._spill_failed = False  # set once the disk refused a write: stop spilling
        self._hashed: dict[str, tuple[int, int]] = {}  # digest -> (size, mtime_ns) verified
        self._lock = threading.RLock()
        self._counts = dict(hits=0, misses=0, disk_hits=0, evictions=0, spilled_files=0)
        self._peak = 0

    @property
    def dtype_name(self) -> str:
        """The storage dtype's name, as recorded in activation keys."""
        return str(self.dtype).removeprefix("torch.")

    @property
    def memory_bytes(self) -> int:
        """Bytes now held in memory: cached tensors plus buffers reserved for filling."""
        return self._bytes + self._reserved

    @property
    def spilling(self) -> bool:
        """Whether evicted or oversized entries go to disk (a folder, and no disk failure)."""
        return self.spill_dir is not None and not self._spill_failed

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is in memory or has a spill file (the file is checked only on load)."""
        if not isinstance(key, ActivationKey):
            return False
        digest = key.digest()
        with self._lock:
            return digest in self._entries or self._on_disk(digest)

    def __repr__(self) -> str:
        return (
            f"ActivationCache({len(self._entries)} entries, {self._bytes / 2**20:.1f} MiB of "
            f"{self.budget_bytes / 2**20:.1f} MiB, dtype={self.dtype_name}, "
            f"spill_dir={self.spill_dir})"
        )

    def stats(self) -> dict[str, int]:
        """Return counters since creation.

        ``hits`` were served from memory, ``disk_hits`` from the spill folder and ``misses`` by
        computing, so they sum to the lookups. ``evictions`` counts entries pushed out of memory
        by the budget, ``spilled_files`` the files this cache wrote, ``peak_bytes`` the most
        bytes held at once (reservations included) and ``disk_bytes`` the spill folder's size.
        """
        with self._lock:
            return {
                **self._counts,
                "bytes_in_memory": self.memory_bytes,
                "peak_bytes": self._peak,
                "entries_in_memory": len(self._entries),
                "budget_bytes": self.budget_bytes,
                "disk_bytes": self._disk_bytes(),
            }

    def get_or_compute(
        self, key: ActivationKey, compute: Callable[[], torch.Tensor]
    ) -> torch.Tensor:
        """Return the activation for ``key`` from memory, else from disk, else from ``compute()``.

        Args:
            key: What the activation depends on.
            compute: Called without arguments when the activation is cached nowhere.

        Returns:
            The activation; tensors loaded from disk are on the CPU.

        Raises:
            TypeError: If ``compute`` does not return a tensor.
        """
        digest = key.digest()
        with self._lock:
            hit = self.get(key)
            if hit is not None:
                return hit
            tensor = self._load(key, digest)
            if tensor is not None:
                self._counts["disk_hits"] += 1
            else:
                tensor = compute()
                if not isinstance(tensor, torch.Tensor):
                    raise TypeError(
                        f"compute for {key.model}@{key.cut} returned {type(tensor).__name__}; "
                        "it must return a torch.Tensor"
                    )
                self._counts["misses"] += 1
            self._insert(key, digest, tensor)
            return tensor

    # -- pieces of a lookup, for callers that stream (StitchContext) ------------------------
    def get(self, key: ActivationKey) -> torch.Tensor | None:
        """The in-memory tensor for ``key`` (a hit, now most recently used), or None."""
        digest = key.digest()
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                return None
            self._entries.move_to_end(digest)
            self._counts["hits"] += 1
            return entry[1]

    def mapped(self, key: ActivationKey) -> np.ndarray | None:
        """A read-only memory map of ``key``'s verified spill file, or None.

        The sha256 is checked the first time this cache maps a file (and again if its size or
        modification time changes); a damaged file is deleted with a warning and None returned.
        """
        digest = key.digest()
        with self._lock:
            if self.spill_dir is None or not self._on_disk(digest):
                return None
            npy_path, meta_path = spill_paths(self.spill_dir, digest)
            try:
                stat = npy_path.stat()
                stamp = (stat.st_size, stat.st_mtime_ns)
                array = map_verified(
                    npy_path, meta_path, key, hashed=self._hashed.get(digest) == stamp
                )
            except (OSError, ValueError, KeyError, TypeError, CacheError) as exc:
                self._drop_file(npy_path, meta_path, exc)
                return None
            self._hashed[digest] = stamp
            self._counts["disk_hits"] += 1
            return array

    def count_miss(self) -> None:
        """Record one activation computed because it was cached nowhere."""
        with self._lock:
            self._counts["misses"] += 1

    def reserve(self, nbytes: int) -> bool:
        """Make room for a buffer of ``nbytes`` and count it against the budget.

        Evicts (and spills) least recently used entries, probe entries last. Returns False,
        evicting nothing, when ``nbytes`` exceeds the budget. Pair with :meth:`release`.
        """
        with self._lock:
            if nbytes > self.budget_bytes:
                return False
            self._evict_until(nbytes)
            if self.memory_bytes + nbytes > self.budget_bytes:  # other buffers are filling
                return False
            self._reserved += nbytes
            self._peak = max(self._peak, self.memory_bytes)
            return True

    def release(self, nbytes: int) -> None:
        """Return a reservation (before :meth:`put` of the filled buffer, or on abandoning it)."""
        with self._lock:
            self._reserved -= nbytes

    def put(self, key: ActivationKey, tensor: torch.Tensor) -> None:
        """Keep ``tensor`` for ``key`` (evicting as needed; spilled only if it cannot stay)."""
        with self._lock:
            self._insert(key, key.digest(), tensor)

    def spill_writer(
        self, key: ActivationKey, shape: tuple[int, ...], dtype: torch.dtype
    ) -> SpillWriter | None:
        """A writer that fills ``key``'s spill file batch by batch, or None.

        None when there is no spill folder, spilling stopped after a disk failure, or the file
        exists already; a disk that is full now stops spilling with one warning.
        """
        with self._lock:
            if not self.spilling or self.spill_dir is None or self._on_disk(key.digest()):
                return None
            try:
                np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
                return SpillWriter(self.spill_dir, key.digest(), FORMAT, key, shape, np_dtype)
            except OSError as exc:
                self._spill_failure(exc)
                return None

    def commit_spill(self, writer: SpillWriter) -> None:
        """Move a filled writer's file into place (a disk failure stops spilling)."""
        with self._lock:
            try:
                writer.commit()
            except OSError as exc:
                self._spill_failure(exc)
                return
            self._counts["spilled_files"] += 1

    def clear_memory(self, spill: bool = False) -> None:
        """Drop every in-memory entry, first writing them to the spill folder if ``spill``.

        Args:
            spill: Spill entries not yet on disk (needs a spill folder), so that this or another
                process can load them instead of recomputing them.
        """
        with self._lock:
            if spill and self.spill_dir is not None:
                entries = list(self._entries.items())
                for digest, (key, tensor) in tqdm(
                    entries, desc="spilling activations", disable=not self.progress
                ):
                    self._spill(key, digest, tensor)
            self._entries.clear()
            self._bytes = 0

    # -- internals ---------------------------------------------------------------------------
    def _insert(self, key: ActivationKey, digest: str, tensor: torch.Tensor) -> None:
        size = _nbytes(tensor)
        if size > self.budget_bytes:
            # never fail on a small budget: hand the tensor back, keep it on disk only
            logger.debug("activation %s (%d bytes) exceeds the memory budget", digest, size)
            self._spill(key, digest, tensor)
            return
        old = self._entries.pop(digest, None)
        if old is not None:
            self._bytes -= _nbytes(old[1])
        self._evict_until(size)
        self._entries[digest] = (key, tensor)
        self._bytes += size
        self._peak = max(self._peak, self.memory_bytes)

    def _evict_until(self, extra: int) -> None:
        """Evict until ``extra`` more bytes fit; other splits before the probe, LRU within."""
        while self._entries and self.memory_bytes + extra > self.budget_bytes:
            victim = next(
                (d for d, (k, _) in self._entries.items() if k.split != "probe"),
                next(iter(self._entries)),
            )
            old_key, old_tensor = self._entries.pop(victim)
            self._bytes -= _nbytes(old_tensor)
            self._counts["evictions"] += 1
            self._spill(old_key, victim, old_tensor)

    def _on_disk(self, digest: str) -> bool:
        if self.spill_dir is None:
            return False
        return all(path.is_file() for path in spill_paths(self.spill_dir, digest))

    def _disk_bytes(self) -> int:
        if self.spill_dir is None:
            return 0
        return sum(p.stat().st_size for p in self.spill_dir.glob("*.npy") if p.is_file())

    def _spill_failure(self, exc: OSError) -> None:
        if not self._spill_failed:
            logger.warning(
                "stopped spilling activations to %s (%s); evicted ones will be recomputed",
                self.spill_dir,
                exc,
            )
        self._spill_failed = True

    def _spill(self, key: ActivationKey, digest: str, tensor: torch.Tensor) -> None:
        """Write ``tensor`` to the spill folder unless it is there; warn and go on on failure."""
        if not self.spilling or self.spill_dir is None or self._on_disk(digest):
            return
        try:
            write_spill(self.spill_dir, digest, FORMAT, key, tensor.detach().cpu().numpy())
        except OSError as exc:  # a full disk costs recomputations later, not the search
            self._spill_failure(exc)
            return
        except (TypeError, ValueError, RuntimeError) as exc:  # a dtype numpy lacks
            logger.warning("could not spill activation %s (%s)", digest, exc)
            return
        self._counts["spilled_files"] += 1

    def _drop_file(self, npy_path: Path, meta_path: Path, exc: Exception) -> None:
        logger.warning("spill file %s is corrupt (%s); deleting and recomputing", npy_path, exc)
        # another process may have just replaced the pair; at worst both recompute once
        npy_path.unlink(missing_ok=True)
        meta_path.unlink(missing_ok=True)

    def _load(self, key: ActivationKey, digest: str) -> torch.Tensor | None:
        """Return the verified spilled tensor, or None (deleting a bad file, with a warning)."""
        if self.spill_dir is None or not self._on_disk(digest):
            return None
        npy_path, meta_path = spill_paths(self.spill_dir, digest)
        try:
            array = read_verified(npy_path, meta_path, key)
        except (OSError, ValueError, KeyError, TypeError, CacheError) as exc:
            self._drop_file(npy_path, meta_path, exc)
            return None
        return torch.from_numpy(array)
