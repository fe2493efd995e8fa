"""A memory-bounded activation cache, spilled to disk and shared between processes.

A search evaluates hundreds of stitched networks built from the same frozen fragments, so the
activation of each zoo model at each cut point on each split is computed once and reused. Entries
live in memory up to two byte budgets, host memory's and a GPU's (each entry counts against the
one of the memory it is in, as do buffers still being filled: :meth:`reserve`), so each holds at
every moment. Least recently used entries are evicted first, probe-split entries last (every
stitch fit reads the probe). Evicted entries go to ``<spill_dir>/<digest>.npy`` (plain
``.npy``, never a pickle) plus a JSON sidecar with the key, shape, dtype, size and sha256, so a
damaged file is recomputed instead of returned (see :mod:`._spill`). The folder keeps within a
size (``disk_gb``), and a full disk stops spilling, each with one warning; entries that are not
spilled are recomputed. Tensors stay where they are given (a buffer for a
GPU's batches goes to the GPU while its budget has room, else to host memory); tensors read from
disk are on the CPU.
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

from stitch_nas.activations._budgets import cache_budgets
from stitch_nas.activations._keys import (  # re-exported: the cache's public face
    FORMAT,
    STORAGE_DTYPES,
    ActivationKey,
    storage_dtype,
    weights_fingerprint,
)
from stitch_nas.activations._spill import SpillFolder, SpillWriter
from stitch_nas.choices import check_disk_gb
from stitch_nas.errors import CacheError

__all__ = [
    "STORAGE_DTYPES",
    "ActivationKey",
    "ActivationCache",
    "storage_dtype",
    "weights_fingerprint",
]

logger = logging.getLogger(__name__)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _on_device(device: torch.device) -> bool:
    """Whether memory on ``device`` counts against the device budget (else the host's)."""
    return device.type != "cpu"


class ActivationCache:
    """An LRU cache of activation tensors with a byte budget and an optional spill folder.

    Returned tensors are the cached objects themselves, not copies: treat them as read-only.
    Calls are serialised by a lock, so one cache may be shared by threads.

    Args:
        memory_gb: Host memory budget in GiB (``memory_gb * 2**30`` bytes); 0 keeps nothing in
            host memory. None: 5 % of the memory this process may use (its cgroup's limit where
            lower than physical memory). A tensor larger than its budget is returned (and
            spilled) but not kept. Both budgets' defaults: :func:`cache_budgets`.
        spill_dir: Folder for evicted entries, created if missing; None drops evicted entries,
            which are then recomputed when asked for again.
        disk_gb: GiB the spill folder's files may take, every process's counted (processes
            may share it); an entry past it is not spilled. None: what the folder holds plus
            half the disk's free space when the cache is made.
        progress: Show a progress bar when spilling many entries at once
            (:meth:`clear_memory` with ``spill=True``); callers may read it for their own loops.
        dtype: Storage dtype of activations that a :class:`StitchContext` caches
            (``"float16"``, the default, halves memory and disk; computation stays float32).
            Tensors handed to :meth:`get_or_compute` are stored as given.
        device_memory_gb: Budget in GiB of ``device``'s memory, where activations computed
            there are kept first; None: 25 % of a GPU's free memory now. 0 on the CPU.
        device: The device (a GPU) the device budget is of; ``"cpu"`` (the default): none, all
            in host memory. A :class:`StitchContext` makes its default cache for its device.

    Raises:
        ConfigError: If a budget (or ``disk_gb``) is negative or not finite, or ``dtype`` is
            unsupported.
        CacheError: If ``spill_dir`` cannot be created.
    """

    def __init__(
        self,
        memory_gb: float | None = None,
        spill_dir: str | Path | None = None,
        progress: bool = False,
        dtype: str | torch.dtype = "float16",
        *,
        device_memory_gb: float | None = None,
        device: str | torch.device = "cpu",
        disk_gb: float | None = None,
    ) -> None:
        host, on_device = cache_budgets(memory_gb, device_memory_gb, device)
        #: bytes entries may hold in host memory, and in the device's (a GPU's)
        self.budget_bytes, self.device_budget_bytes = int(host * 2**30), int(on_device * 2**30)
        self.dtype = storage_dtype(dtype)
        self.progress = progress
        self.spill_dir = Path(spill_dir).expanduser() if spill_dir is not None else None
        #: the spill folder's size as given (None: decided from the free space on opening)
        self.disk_gb = disk_gb if disk_gb is None else check_disk_gb(disk_gb)
        self._disk = (
            SpillFolder(self.spill_dir, FORMAT, disk_gb) if self.spill_dir is not None else None
        )
        self._entries: OrderedDict[str, tuple[ActivationKey, torch.Tensor]] = OrderedDict()
        # per budget (False: host, True: device): entries' bytes, buffers being filled, peak
        self._bytes, self._reserved, self._peaks = ({False: 0, True: 0} for _ in range(3))
        self._lock = threading.RLock()
        self._counts = dict(hits=0, misses=0, disk_hits=0, evictions=0)

    @property
    def dtype_name(self) -> str:
        """The storage dtype's name, as recorded in activation keys."""
        return str(self.dtype).removeprefix("torch.")

    @property
    def memory_bytes(self) -> int:
        """Bytes now held in host memory: cached tensors plus buffers reserved for filling."""
        return self._used(False)

    @property
    def device_memory_bytes(self) -> int:
        """Bytes now held in the device's memory, as :attr:`memory_bytes` counts them."""
        return self._used(True)

    @property
    def spilling(self) -> bool:
        """Whether evicted or oversized entries go to disk (a folder, and no disk failure)."""
        return self._disk is not None and not self._disk.failed

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is in memory or has a spill file (the file is checked only on load)."""
        if not isinstance(key, ActivationKey):
            return False
        digest = key.digest()
        with self._lock:
            return digest in self._entries or (self._disk is not None and self._disk.holds(digest))

    def __repr__(self) -> str:
        return (
            f"ActivationCache({len(self._entries)} entries, {self._bytes[False] / 2**20:.1f} MiB "
            f"of {self.budget_bytes / 2**20:.1f} MiB (device: {self._bytes[True] / 2**20:.1f} of "
            f"{self.device_budget_bytes / 2**20:.1f}), dtype={self.dtype_name}, "
            f"spill_dir={self.spill_dir})"
        )

    def stats(self) -> dict[str, int]:
        """Return counters since creation.

        ``hits`` were served from memory, ``disk_hits`` from the spill folder and ``misses`` by
        computing, so they sum to the lookups. ``evictions`` counts entries pushed out of memory
        by a budget, ``spilled_files`` the files this cache wrote, ``peak_bytes`` the most
        bytes held at once in host memory (reservations included), ``device_peak_bytes`` the
        same on the device, and ``disk_bytes`` the spill folder's size.
        """
        with self._lock:
            return {
                **self._counts,
                "spilled_files": self._disk.files_written if self._disk is not None else 0,
                "bytes_in_memory": self.memory_bytes,
                "peak_bytes": self._peaks[False],
                "entries_in_memory": len(self._entries),
                "budget_bytes": self.budget_bytes,
                "device_bytes_in_memory": self.device_memory_bytes,
                "device_peak_bytes": self._peaks[True],
                "device_budget_bytes": self.device_budget_bytes,
                "disk_bytes": self._disk.size_bytes() if self._disk is not None else 0,
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
        with self._lock:
            array = self._disk.map(key, key.digest()) if self._disk is not None else None
            if array is not None:
                self._counts["disk_hits"] += 1
            return array

    def count_miss(self) -> None:
        """Record one activation computed because it was cached nowhere."""
        with self._lock:
            self._counts["misses"] += 1

    def reserve(self, nbytes: int, device: str | torch.device = "cpu") -> torch.device | None:
        """Make room for a buffer of ``nbytes`` for batches on ``device`` and count it against
        a budget: the device's (not the CPU) if it can take it, else host memory's, evicting
        (and spilling) its least recently used entries, probe entries last. Returns where to
        allocate the buffer, or None when neither can. Pair with :meth:`release`.
        """
        device = torch.device(device)
        places = [device, torch.device("cpu")] if _on_device(device) else [device]
        with self._lock:
            for place in places:
                which = _on_device(place)
                if nbytes > self._budget(which):
                    continue
                self._evict_until(nbytes, which)
                if self._used(which) + nbytes > self._budget(which):  # other buffers filling
                    continue
                self._reserved[which] += nbytes
                self._peaks[which] = max(self._peaks[which], self._used(which))
                return place
            return None

    def release(self, nbytes: int, device: str | torch.device = "cpu") -> None:
        """Return a reservation :meth:`reserve` placed on ``device`` (before :meth:`put` of the
        filled buffer, or on abandoning it)."""
        with self._lock:
            self._reserved[_on_device(torch.device(device))] -= nbytes

    def put(self, key: ActivationKey, tensor: torch.Tensor) -> None:
        """Keep ``tensor`` for ``key`` (evicting as needed; spilled only if it cannot stay)."""
        with self._lock:
            self._insert(key, key.digest(), tensor)

    def spill_writer(
        self, key: ActivationKey, shape: tuple[int, ...], dtype: torch.dtype
    ) -> SpillWriter | None:
        """A writer that fills ``key``'s spill file batch by batch, or None.

        None when there is no spill folder, spilling stopped after a disk failure, the file
        exists already or it would pass the folder's size (``disk_gb``); a disk that is full
        now stops spilling with one warning.
        """
        with self._lock:
            if self._disk is None:
                return None
            np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
            return self._disk.writer(key, key.digest(), shape, np_dtype)

    def commit_spill(self, writer: SpillWriter) -> None:
        """Move a filled writer's file into place (a disk failure stops spilling)."""
        with self._lock:
            if self._disk is None:
                raise CacheError("this cache has no spill folder to commit a spill file to")
            self._disk.commit(writer)

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
            self._bytes = {False: 0, True: 0}

    # -- internals ---------------------------------------------------------------------------
    def _budget(self, on_device: bool) -> int:
        return self.device_budget_bytes if on_device else self.budget_bytes

    def _used(self, on_device: bool) -> int:
        return self._bytes[on_device] + self._reserved[on_device]

    def _insert(self, key: ActivationKey, digest: str, tensor: torch.Tensor) -> None:
        size, which = _nbytes(tensor), _on_device(tensor.device)
        if size > self._budget(which):
            # never fail on a small budget: hand the tensor back, keep it on disk only
            logger.debug("activation %s (%d bytes) exceeds its memory budget", digest, size)
            self._spill(key, digest, tensor)
            return
        old = self._entries.pop(digest, None)
        if old is not None:
            self._bytes[_on_device(old[1].device)] -= _nbytes(old[1])
        self._evict_until(size, which)
        self._entries[digest] = (key, tensor)
        self._bytes[which] += size
        self._peaks[which] = max(self._peaks[which], self._used(which))

    def _evict_until(self, extra: int, on_device: bool) -> None:
        """Evict entries of one budget until ``extra`` more bytes fit in it; other splits
        before the probe, LRU within."""
        while self._used(on_device) + extra > self._budget(on_device):
            held = [d for d, (_, t) in self._entries.items() if _on_device(t.device) == on_device]
            if not held:
                return
            victim = next((d for d in held if self._entries[d][0].split != "probe"), held[0])
            old_key, old_tensor = self._entries.pop(victim)
            self._bytes[on_device] -= _nbytes(old_tensor)
            self._counts["evictions"] += 1
            self._spill(old_key, victim, old_tensor)

    def _spill(self, key: ActivationKey, digest: str, tensor: torch.Tensor) -> None:
        """Write ``tensor`` to the spill folder unless it is there; warn and go on on failure."""
        if not self.spilling or self._disk is None:
            return
        try:
            array = tensor.detach().cpu().numpy()
        except (TypeError, ValueError, RuntimeError) as exc:  # a dtype numpy lacks
            logger.warning("could not spill activation %s (%s)", digest, exc)
            return
        self._disk.write(key, digest, array)

    def _load(self, key: ActivationKey, digest: str) -> torch.Tensor | None:
        """The verified spilled tensor, or None (a bad file is deleted, with a warning)."""
        array = self._disk.read(key, digest) if self._disk is not None else None
        return None if array is None else torch.from_numpy(array)
