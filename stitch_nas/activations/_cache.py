"""A memory-bounded activation cache, spilled to disk and shared between processes.

A search evaluates hundreds of stitched networks built from the same frozen fragments, so the
activation of each zoo model at each cut point on each split is computed once and reused. Entries
live in memory up to a byte budget; least recently used ones are evicted to
``<spill_dir>/<digest>.npy`` (plain ``.npy``, never a pickle) plus a JSON sidecar with the key,
shape, dtype, size and sha256, so a damaged file is recomputed instead of returned. Files are
written to a temporary name, fsynced and ``os.replace``d (the sidecar last), so processes sharing
a spill folder only ever see complete files. Device placement is the caller's job: tensors stay in
memory as given (the budget counts their bytes on any device); tensors read from disk are on CPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from stitch_nas.errors import CacheError, ConfigError
from stitch_nas.files import atomic_file, sha256_file

__all__ = ["ActivationKey", "ActivationCache", "weights_fingerprint"]

logger = logging.getLogger(__name__)

# bump when the digest recipe, the file layout or how activations are computed changes, to
# orphan old files (2: activations at a cut followed by an in-place op were overwritten)
_FORMAT = 2


@dataclass(frozen=True)
class ActivationKey:
    """Everything an activation depends on; any change gives a new digest and a fresh entry.

    Attributes:
        model: Zoo name of the model.
        weights: Fingerprint of the model's weights (see :func:`weights_fingerprint`).
        cut: Cut point name, or None for the model's output.
        split: Data split name (``"probe"``, ``"val"``...).
        data: Fingerprint of the data set.
        preprocess: ``repr`` of the input spec (resize, normalisation...).
    """

    model: str
    weights: str
    cut: str | None
    split: str
    data: str
    preprocess: str

    def digest(self) -> str:
        """Return the first 32 hex characters of the sha256 of a canonical form of the key."""
        # JSON keeps None apart from the string "None" and cannot confuse field boundaries
        canonical = json.dumps({"format": _FORMAT, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def weights_fingerprint(module: nn.Module) -> str:
    """Return the sha256 hex digest of a module's parameters and buffers.

    Names, shapes, dtypes and raw bytes are hashed in name order, so a change to any weight or
    buffer (a BatchNorm running mean, for example) changes the fingerprint. It reads every byte
    (about 3 ms per million float32 parameters on a CPU, plus the copy of GPU tensors to the
    host), so callers should compute it once per model and memoise it.

    Args:
        module: The model to fingerprint.

    Raises:
        ConfigError: If a tensor lives on the meta device and so has no data to hash.
    """
    digest = hashlib.sha256(f"stitch_nas.weights.v{_FORMAT}\0".encode())
    tensors: dict[str, torch.Tensor] = dict(module.named_parameters())
    tensors.update(module.named_buffers())
    for name in sorted(tensors):
        tensor = tensors[name].detach()
        if tensor.is_meta:
            raise ConfigError(
                f"tensor {name!r} is on the meta device; load real weights before fingerprinting"
            )
        # viewing the bytes as uint8 avoids a numpy round trip for dtypes numpy lacks (bfloat16)
        raw = tensor.cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        header = f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0{raw.nbytes}\0"
        digest.update(header.encode())
        digest.update(raw.data)
    return digest.hexdigest()


def _spill_paths(folder: Path, digest: str) -> tuple[Path, Path]:
    return folder / f"{digest}.npy", folder / f"{digest}.json"


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class ActivationCache:
    """An LRU cache of activation tensors with a byte budget and an optional spill folder.

    Returned tensors are the cached objects themselves, not copies: treat them as read-only.
    Calls are serialised by a lock, so one cache may be shared by threads.

    Args:
        memory_gb: In-memory budget in GiB (``memory_gb * 2**30`` bytes); 0 keeps nothing in
            memory. A tensor larger than the budget is returned (and spilled) but not kept.
        spill_dir: Folder for evicted entries, created if missing; None drops evicted entries,
            which are then recomputed when asked for again.
        progress: Show a progress bar when spilling many entries at once
            (:meth:`clear_memory` with ``spill=True``); callers may read it for their own loops.

    Raises:
        ConfigError: If ``memory_gb`` is negative or not finite.
        CacheError: If ``spill_dir`` cannot be created.
    """

    def __init__(
        self,
        memory_gb: float = 2.0,
        spill_dir: str | Path | None = None,
        progress: bool = False,
    ) -> None:
        if not isinstance(memory_gb, (int, float)) or not math.isfinite(memory_gb) or memory_gb < 0:
            raise ConfigError(f"memory_gb={memory_gb!r} is invalid; pass a number >= 0 (GiB)")
        self.budget_bytes = int(memory_gb * 2**30)
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
        self._lock = threading.RLock()
        self._counts = dict(hits=0, misses=0, disk_hits=0, evictions=0, spilled_files=0)

    @property
    def memory_bytes(self) -> int:
        """Bytes of the tensors now held in memory."""
        return self._bytes

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
            f"{self.budget_bytes / 2**20:.1f} MiB, spill_dir={self.spill_dir})"
        )

    def stats(self) -> dict[str, int]:
        """Return counters since creation.

        ``hits`` were served from memory, ``disk_hits`` from the spill folder and ``misses`` by
        calling ``compute``, so they sum to the calls of :meth:`get_or_compute`. ``evictions``
        counts entries pushed out of memory by the budget and ``spilled_files`` the files this
        cache wrote.
        """
        with self._lock:
            return {
                **self._counts,
                "bytes_in_memory": self._bytes,
                "entries_in_memory": len(self._entries),
                "budget_bytes": self.budget_bytes,
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
            entry = self._entries.get(digest)
            if entry is not None:
                self._entries.move_to_end(digest)
                self._counts["hits"] += 1
                return entry[1]
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

    def _insert(self, key: ActivationKey, digest: str, tensor: torch.Tensor) -> None:
        size = _nbytes(tensor)
        if size > self.budget_bytes:
            # never fail on a small budget: hand the tensor back, keep it on disk only
            logger.debug("activation %s (%d bytes) exceeds the memory budget", digest, size)
            self._spill(key, digest, tensor)
            return
        while self._entries and self._bytes + size > self.budget_bytes:
            old_digest, (old_key, old_tensor) = self._entries.popitem(last=False)
            self._bytes -= _nbytes(old_tensor)
            self._counts["evictions"] += 1
            self._spill(old_key, old_digest, old_tensor)
        self._entries[digest] = (key, tensor)
        self._bytes += size

    def _on_disk(self, digest: str) -> bool:
        if self.spill_dir is None:
            return False
        return all(path.is_file() for path in _spill_paths(self.spill_dir, digest))

    def _spill(self, key: ActivationKey, digest: str, tensor: torch.Tensor) -> None:
        """Write ``tensor`` to the spill folder unless it is there; warn and go on on failure."""
        if self.spill_dir is None or self._on_disk(digest):
            return
        npy_path, meta_path = _spill_paths(self.spill_dir, digest)
        try:
            array = tensor.detach().cpu().numpy()
            with atomic_file(npy_path) as handle:
                np.save(handle, array, allow_pickle=False)
                handle.flush()
                # hash the temporary file: the final name may already hold another writer's bytes
                size, sha256 = handle.tell(), sha256_file(Path(handle.name))
            meta = {"format": _FORMAT, "key": asdict(key), "shape": list(array.shape)}
            meta.update(dtype=array.dtype.str, size=size, sha256=sha256)
            # the sidecar goes last: it marks the .npy as complete for other processes
            with atomic_file(meta_path) as handle:
                handle.write(json.dumps(meta, indent=1, sort_keys=True).encode())
        except (OSError, TypeError, ValueError, RuntimeError) as exc:
            # a full disk or a dtype numpy lacks costs a recomputation later, not the search
            logger.warning("could not spill activation %s to %s (%s)", digest, npy_path, exc)
            return
        self._counts["spilled_files"] += 1

    def _load(self, key: ActivationKey, digest: str) -> torch.Tensor | None:
        """Return the verified spilled tensor, or None (deleting a bad file, with a warning)."""
        if self.spill_dir is None or not self._on_disk(digest):
            return None
        npy_path, meta_path = _spill_paths(self.spill_dir, digest)
        try:
            array = _read_verified(npy_path, meta_path, key)
        except (OSError, ValueError, KeyError, TypeError, CacheError) as exc:
            logger.warning("spill file %s is corrupt (%s); deleting and recomputing", npy_path, exc)
            # another process may have just replaced the pair; at worst both recompute once
            npy_path.unlink(missing_ok=True)
            meta_path.unlink(missing_ok=True)
            return None
        return torch.from_numpy(array)


def _read_verified(npy_path: Path, meta_path: Path, key: ActivationKey) -> np.ndarray:
    """Load a spill file after checking it against its sidecar; raise CacheError on mismatch."""
    meta = json.loads(meta_path.read_text())
    if not isinstance(meta, dict) or meta.get("key") != asdict(key):
        raise CacheError(f"sidecar {meta_path} describes another key")
    size = npy_path.stat().st_size
    if size != meta["size"]:
        raise CacheError(f"size {size} != {meta['size']} bytes recorded in the sidecar")
    # shape, dtype and size cannot catch flipped bytes in the data; only the hash can
    if sha256_file(npy_path) != meta["sha256"]:
        raise CacheError("sha256 mismatch with the sidecar")
    mapped = np.load(npy_path, mmap_mode="r", allow_pickle=False)
    if list(mapped.shape) != meta["shape"] or mapped.dtype.str != meta["dtype"]:
        raise CacheError(
            f"shape/dtype {mapped.shape}/{mapped.dtype.str} != {meta['shape']}/{meta['dtype']}"
        )
    # copy out of the map: a tensor over a read-only map would segfault on in-place writes, and
    # an owned copy is what the memory budget counts (the hash already paged the file in)
    return np.array(mapped, copy=True, order="C")
