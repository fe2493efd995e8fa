"""Images read in place from an uncompressed ``.npz`` file: only the rows of a batch are read.

``numpy.savez`` stores each array uncompressed (a ``.npy`` file inside a zip), so the array's
bytes sit at a fixed offset of the ``.npz`` file and each image is a run of bytes there:
50,000 ImageNet images at 224x224 as uint8 are 7.5 GB (30 GB as float32), of which a batch at a
time is read and converted. The rows are read with ``seek`` and ``readinto`` rather than a
memory map, whose pages would count towards the process's resident memory once touched.
``numpy.savez_compressed`` files cannot be read so: small arrays are loaded whole, large ones are
unpacked to disk once and read in place from there (:mod:`._npz_unpack`).

The fingerprint (the on-disk activation cache's key) covers the file's absolute path, size and
modification time, the array's name, dtype and shape, the rows and the output size, not the
pixels: rewriting the file changes its modification time and so the key, as for image folders.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from stitch_nas.errors import DataError

from ._npz_unpack import npy_header, unpack_array
from ._sources import channels_first, check_finite_rows, resize_images, transform_images

__all__ = ["NpzFileImages", "npz_array_place"]

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., file name length, extra length
# bytes read at once when checking that float images are in [0, 1]: 1,024 rows were 0.6 GB of
# float32 images at 224x224, more than the rest of the data pipeline holds
_RANGE_CHUNK_BYTES = 32 * 2**20


def npz_array_place(file: str, key: str) -> tuple[int, np.dtype, tuple[int, ...]] | None:
    """``(offset, dtype, shape)`` of array ``key`` of ``file`` if it can be read in place.

    It can be when the array is stored uncompressed in C order with a plain dtype; None else.
    """
    with zipfile.ZipFile(file) as archive:
        try:
            info = archive.getinfo(key + ".npy")
        except KeyError:
            return None
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    with open(file, "rb") as stream:
        stream.seek(info.header_offset)
        signature, name_length, extra_length = _LOCAL_HEADER.unpack(stream.read(30))
        if signature != b"PK\x03\x04":
            return None
        stream.seek(info.header_offset + 30 + name_length + extra_length)
        header = npy_header(stream)
        if header is None or header[2] or header[0].hasobject:
            return None
        return stream.tell(), header[0], header[1]


class NpzFileImages:
    """Rows ``rows`` of an image array in a file, yielded as float32 ``(n, 3, H, W)`` in
    ``[0, 1]``.

    Args:
        file: The ``.npz`` file.
        key: The array's name in it (for messages).
        place: ``(offset, dtype, shape)`` from :func:`npz_array_place`.
        rows: The rows of the array this split holds, sorted.
        size: Side the images are resized to; None keeps the stored size.
        channels_last: The array is ``(N, H, W, C)``; otherwise ``(N, C, H, W)`` or ``(N, H, W)``.
        unpacked_from: The compressed ``.npz`` that ``file`` was unpacked from
            (:mod:`._npz_unpack`): messages and the fingerprint name it, and a process that lacks
            ``file`` (a Ray worker on another node) unpacks it again on first use.

    Raises:
        DataError: float images outside ``[0, 1]`` or holding NaN or Inf (checked now, a chunk
            of rows at a time).
    """

    def __init__(
        self,
        file: str,
        key: str,
        place: tuple[int, np.dtype, tuple[int, ...]],
        rows: np.ndarray,
        size: int | None,
        channels_last: bool,
        unpacked_from: str | None = None,
    ) -> None:
        self.file, self.key = os.path.abspath(file), key
        self.unpacked_from = os.path.abspath(unpacked_from) if unpacked_from else None
        # what messages and the fingerprint name: the user's file, not our unpacked copy of it
        self.source = self.unpacked_from or self.file
        self.offset, self.dtype, self.stored_shape = place
        self.rows, self.size, self.channels_last = (
            np.asarray(rows, dtype=np.int64),
            size,
            channels_last,
        )
        self._stream: io.BufferedReader | None = None
        stat = os.stat(self.source)
        self._stat = (stat.st_size, stat.st_mtime_ns)
        if np.issubdtype(self.dtype, np.floating):
            self._check_range()

    def __getstate__(self) -> dict[str, Any]:  # a Ray worker opens the file itself
        return {**self.__dict__, "_stream": None}

    def __del__(self) -> None:
        if getattr(self, "_stream", None) is not None:
            self._stream.close()  # type: ignore[union-attr]

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        if self.size is not None:
            return (len(self.rows), 3, self.size, self.size)
        height, width = self.stored_shape[1:3] if self.channels_last else self.stored_shape[-2:]
        return (len(self.rows), 3, int(height), int(width))

    def _rows(self, rows: np.ndarray) -> np.ndarray:
        """The stored images ``rows`` as an array of the stored shape, read from the file."""
        if self._stream is None:  # opened on first use, also in a process this was sent to
            if self.unpacked_from and not os.path.isfile(self.file):  # another node's cache
                self.file = str(unpack_array(self.unpacked_from, self.key, progress=False))
            self._stream = open(self.file, "rb")  # noqa: SIM115 - kept open for every batch
        out = np.empty((len(rows), *self.stored_shape[1:]), dtype=self.dtype)
        size = out[:1].nbytes
        for i, row in enumerate(rows):
            self._stream.seek(self.offset + int(row) * size)
            if self._stream.readinto(memoryview(out[i]).cast("B")) != size:
                fix = "write it again"
                if self.unpacked_from:  # a copy unpacked from the user's .npz, which is kept
                    fix = "delete this unpacked copy to unpack it again from the .npz"
                raise DataError(f"{self.file} ends inside image {row} of {self.key!r}; the file "
                                f"is truncated: {fix}")  # fmt: skip
        return out if out.dtype.isnative else out.astype(out.dtype.newbyteorder("="))

    def _read(self, rows: np.ndarray) -> torch.Tensor:
        """The stored images ``rows`` as a ``(n, C, H, W)`` tensor of the stored dtype."""
        raw = channels_first(self._rows(rows), f"{self.source}:{self.key}")
        return torch.from_numpy(np.ascontiguousarray(raw))

    @property
    def stored_side(self) -> int:
        """The stored images' shorter side, at most :attr:`size` (see :func:`.stored_side`)."""
        height, width = self.stored_shape[1:3] if self.channels_last else self.stored_shape[-2:]
        return min(int(height), int(width), self.size or int(height))

    def batches(
        self,
        size: int,
        index: torch.Tensor | None = None,
        transform: Callable[[Any], Any] | None = None,
    ) -> Iterator[torch.Tensor]:
        rows = self.rows if index is None else self.rows[index.numpy()]
        for start in range(0, len(rows), size):
            raw = self._read(rows[start : start + size])
            if transform is not None:
                yield transform_images(raw, transform)
                continue
            images = raw.float().div_(255.0) if raw.dtype == torch.uint8 else raw.float()
            if self.size is not None:
                images = resize_images(images, self.size)
            yield images.expand(-1, 3, -1, -1).contiguous()

    def _check_range(self) -> None:
        low, high = np.inf, -np.inf
        row_bytes = int(np.prod(self.stored_shape[1:])) * self.dtype.itemsize
        step = max(1, _RANGE_CHUNK_BYTES // row_bytes)
        for start in range(0, len(self.rows), step):
            chunk = self._rows(self.rows[start : start + step])
            check_finite_rows(chunk, f"{self.source}:{self.key}", self.rows[start : start + step])
            low, high = min(low, float(chunk.min())), max(high, float(chunk.max()))
        if low < 0.0 or high > 1.0:
            raise DataError(
                f"{self.source}:{self.key} holds floats in [{low:g}, {high:g}]; store uint8 or "
                "floats in [0, 1] (each model normalises its input itself)"
            )

    def fingerprint(self) -> str:
        described = (self.source, *self._stat, self.key, str(self.dtype), self.stored_shape)
        digest = hashlib.sha256(f"npz-map{described}:{self.size}".encode())
        digest.update(self.rows.tobytes())
        return digest.hexdigest()
