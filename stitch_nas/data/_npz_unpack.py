"""Compressed ``.npz`` image arrays too large to hold: unpacked to disk once, then read in place.

``numpy.savez_compressed`` deflates each array, so its images have no fixed place in the file
and cannot be read a batch at a time. An image array larger than :data:`UNPACK_BYTES`
uncompressed is instead decompressed once, a chunk at a time, into a plain ``.npy`` under
``<cache>/npz/`` (``$STITCH_NAS_CACHE``, else ``~/.cache/stitch_nas``) and read in place from
there, like an array stored uncompressed (:class:`~._npz_files.NpzFileImages`). The file is
named by the digest of the source's absolute path, size and modification time and the array's
name, so later runs and other processes reuse it, and rewriting the source unpacks it afresh.
It is written atomically (an interrupted unpacking leaves nothing behind), after checking that
the disk has room. Smaller arrays stay whole in memory, where they are fastest.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from stitch_nas.errors import DataError
from stitch_nas.files import atomic_file, default_cache_dir

__all__ = ["UNPACK_BYTES", "compressed_size", "npy_header", "unpack_array", "unpacked_path"]

#: uncompressed size above which a compressed image array is unpacked to disk instead of loaded:
#: CIFAR-10's 50,000 training images (150 MB as uint8) stay in memory, ImageNet's validation
#: set (7.5 GB as uint8 at 224x224) streams from disk
UNPACK_BYTES = 512 * 2**20

_CHUNK = 16 * 2**20  # bytes decompressed and written at a time


def compressed_size(file: str, key: str) -> int | None:
    """Uncompressed bytes of array ``key`` of ``file`` if it is stored compressed, else None."""
    with zipfile.ZipFile(file) as archive:
        info = archive.getinfo(key + ".npy")
    return None if info.compress_type == zipfile.ZIP_STORED else info.file_size


def unpacked_path(file: str, key: str) -> Path:
    """Where array ``key`` of ``file`` is unpacked to (see the module docstring)."""
    stat = os.stat(file)
    described = (os.path.abspath(file), stat.st_size, stat.st_mtime_ns, key)
    digest = hashlib.sha256(f"npz-unpack{described}".encode()).hexdigest()[:32]
    return default_cache_dir() / "npz" / f"{digest}.npy"


def npy_header(stream: Any) -> tuple[np.dtype, tuple[int, ...], bool] | None:
    """``(dtype, shape, fortran_order)`` from the ``.npy`` header at the stream's position,
    leaving the stream at the first byte of data; None for a format version numpy may add."""
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
    else:
        return None
    return dtype, tuple(shape), bool(fortran)


def unpack_array(file: str, key: str, progress: bool = True) -> Path:
    """The unpacked ``.npy`` of image array ``key`` of the compressed ``file``, unpacking it
    first unless an earlier run did.

    Raises:
        DataError: The array is not in C order (it could not be read in place), the cache folder
            lacks the room, or the disk fails or fills during the unpacking; each names the fix.
    """
    what = f"{file}:{key}"
    target = unpacked_path(file, key)
    with zipfile.ZipFile(file) as archive:
        info = archive.getinfo(key + ".npy")
        with archive.open(info) as member:  # check the layout before any slow work
            header = npy_header(member)
        if header is None or header[2] or header[0].hasobject:
            raise DataError(
                f"{what} is a {info.file_size / 2**30:.1f} GiB compressed array that cannot be "
                "read a batch at a time (Fortran order or object dtype); save it with "
                "numpy.savez(file, x=numpy.ascontiguousarray(x), ...)"
            )
        if target.is_file() and target.stat().st_size == info.file_size:
            return target
        folder = target.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(folder).free
        except OSError as exc:
            raise DataError(_no_room(what, folder, info.file_size, str(exc))) from exc
        if free < info.file_size:
            raise DataError(_no_room(what, folder, info.file_size, f"{free / 2**30:.1f} GiB free"))
        try:
            with (
                archive.open(info) as member,
                atomic_file(target) as out,
                tqdm(
                    total=info.file_size,
                    unit="B",
                    unit_scale=True,
                    desc=f"unpacking {Path(file).name}:{key}",
                    disable=not progress,
                ) as bar,
            ):
                while chunk := member.read(_CHUNK):
                    out.write(chunk)
                    bar.update(len(chunk))
        except OSError as exc:
            raise DataError(_no_room(what, folder, info.file_size, str(exc))) from exc
        except zipfile.BadZipFile as exc:  # the member's CRC did not match: a damaged file
            raise DataError(f"{what} is damaged ({exc}); write the file again") from exc
    return target


def _no_room(what: str, folder: Path, size: int, why: str) -> str:
    return (
        f"cannot unpack the compressed array {what} ({size / 2**30:.1f} GiB) to {folder} "
        f"({why}); free space there, set STITCH_NAS_CACHE to a folder with room, or save the "
        "file with numpy.savez (uncompressed) to have it read in place"
    )
