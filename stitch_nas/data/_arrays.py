"""Data from NumPy ``.npz`` files with fixed splits.

Each of train / probe / val / test is a run of rows of one file (``{file, start, count}``),
so a data set's own separation (a train file, a test file) is kept. Files stored in class
order (all of class 0, then class 1, ...) must be shuffled before a prefix is taken: with a
``seed`` every file is permuted once by ``numpy.random.default_rng(seed)``, and the splits of
one file are disjoint runs of that one permutation.

An image array stored uncompressed (``numpy.savez``) is read in place, a batch of rows
at a time (:mod:`stitch_nas.data._npz_files`). A compressed one (``numpy.savez_compressed``) up
to 512 MiB uncompressed is loaded whole (square uint8 images stay uint8, others become one
float32 tensor); a larger one is unpacked to disk once and read in place from there
(:mod:`stitch_nas.data._npz_unpack`), so no file's size sets the memory a search needs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stitch_nas.errors import DataError

from ._npz_files import NpzFileImages, npz_array_place
from ._npz_unpack import UNPACK_BYTES, compressed_size, npy_header, unpack_array
from ._sources import (
    ArrayImages,
    channels_first,
    check_finite_rows,
    is_channels_last,
    resize_images,
)
from ._splits import DataSplits, Split

__all__ = ["load_npz_splits", "images_to_tensor"]

logger = logging.getLogger(__name__)

_SPLITS = ("train", "probe", "val", "test")


def images_to_tensor(x: np.ndarray, what: str, rows: np.ndarray | None = None) -> torch.Tensor:
    """``(N, H, W, C)``, ``(N, C, H, W)`` or ``(N, H, W)`` images (uint8, or floats in
    ``[0, 1]``) as float32 ``(N, 3, H, W)`` in ``[0, 1]``; grey images are repeated to RGB.
    ``rows``: the file rows ``x`` holds, to name a bad one (None: ``x`` is rows 0, 1, ...)."""
    x = channels_first(x, what)
    if x.dtype == np.uint8:
        t = torch.from_numpy(np.ascontiguousarray(x)).float().div_(255.0)
    elif np.issubdtype(x.dtype, np.floating):
        t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        check_finite_rows(t, what, rows)
        low, high = float(t.min()), float(t.max())
        if low < 0.0 or high > 1.0:
            raise DataError(
                f"{what} holds floats in [{low:g}, {high:g}]; store uint8 or floats in [0, 1] "
                "(each model normalises its input itself)"
            )
    else:
        raise DataError(f"{what} has dtype {x.dtype}; store uint8 or float images")
    return t.expand(-1, 3, -1, -1).contiguous()


def _images(
    x: np.ndarray, what: str, size: int | None, rows: np.ndarray
) -> torch.Tensor | ArrayImages:
    """One split's images: square uint8 images stay uint8 (4 times smaller than float32 at
    the stored size, and at any output size), made float32 one batch at a time; other images
    become one float32 tensor."""
    x = channels_first(x, what)
    if x.dtype == np.uint8 and (size is not None or x.shape[2] == x.shape[3]):
        pixels = torch.from_numpy(np.ascontiguousarray(x))
        return ArrayImages(pixels, size or x.shape[3])
    images = images_to_tensor(x, what, rows)
    return images if size is None else resize_images(images, size)


#: where a file's images are read in place: (the file read, the compressed .npz it was
#: unpacked from or None, (offset, dtype, shape))
_Place = tuple[str, str | None, tuple[int, np.dtype, tuple[int, ...]]]


def _in_place(
    file: str, key: str, place: _Place, rows: np.ndarray, size: int | None
) -> NpzFileImages:
    """One split's images read from the file in batches (layouts as :func:`_images`)."""
    read_from, unpacked_from, (_, dtype, shape) = place
    what = f"{file}:{key}"
    channels_last = is_channels_last(shape, what)
    if dtype != np.uint8 and not np.issubdtype(dtype, np.floating):
        raise DataError(f"{what} has dtype {dtype}; store uint8 or float images")
    return NpzFileImages(read_from, key, place[2], rows, size, channels_last, unpacked_from)


def _labels(y: np.ndarray, what: str) -> torch.Tensor:
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
        raise DataError(
            f"{what} must be a 1-D array of class indices >= 0, got {y.dtype} {y.shape}"
        )
    return torch.from_numpy(y.astype(np.int64))


def load_npz_splits(
    splits: Mapping[str, Mapping[str, Any]],
    *,
    x_key: str = "x",
    y_key: str = "y",
    label_names: Sequence[str] | None = None,
    size: int | None = None,
    seed: int | None = 0,
    name: str | None = None,
) -> DataSplits:
    """Load fixed train / probe / val / test splits from ``.npz`` files.

    Args:
        splits: for each of ``train``, ``probe``, ``val``, ``test`` a mapping ``{"file": path,
            "start": first row, "count": rows (None: to the end)}`` into the file's rows after
            the seeded permutation.
        x_key: name of the image array in each file.
        y_key: name of the label array in each file.
        label_names: class names; default ``"0"``, ``"1"``... up to the largest label.
        size: side the images are resized to (None: kept as stored; they must be square).
        seed: seed of the one permutation of each file; None keeps the stored order.
        name: short name of the data set; default: the files' names and the split rows.

    Raises:
        DataError: a file, array or split is missing, malformed or out of range.
    """
    missing = [s for s in _SPLITS if s not in splits]
    if missing:
        raise DataError(f"npz splits lack {missing[0]!r}; give all of {', '.join(_SPLITS)}")
    arrays: dict[str, tuple[np.ndarray | None, np.ndarray, np.ndarray, Any]] = {}
    parts: dict[str, Split] = {}
    top = -1
    for split in _SPLITS:
        spec = splits[split]
        file = str(Path(spec["file"]).expanduser())
        if file not in arrays:
            arrays[file] = _read(file, x_key, y_key, seed)
        x, y, order, place = arrays[file]
        start = int(spec.get("start") or 0)
        stop = len(y) if spec.get("count") is None else start + int(spec["count"])
        if not 0 <= start < stop <= len(y):
            raise DataError(
                f"split {split} takes rows {start}..{stop - 1} of {file} ({len(y)} rows)"
            )
        rows = np.sort(order[start:stop])  # keep the stored order within a split
        if x is None:
            images: torch.Tensor | ArrayImages | NpzFileImages = _in_place(
                file, x_key, place, rows, size
            )
        else:
            images = _images(x[rows], f"{file}:{x_key}", size, rows)
        labels = _labels(y[rows], f"{file}:{y_key}")
        top = max(top, int(labels.max()))
        parts[split] = Split(images, labels)
        logger.info(
            "npz split %s: %d images from %s rows %d..%d", split, len(rows), file, start, stop - 1
        )
    sides = {p.image_size for p in parts.values()}
    if len(sides) != 1:
        raise DataError(
            f"npz splits have images of sizes {sorted(sides)}; set data.size to resize them"
        )
    names = tuple(str(n) for n in label_names) if label_names else tuple(map(str, range(top + 1)))
    if len(names) <= top:
        raise DataError(f"{len(names)} label names for labels up to {top}; give one name per class")
    if name is None:
        runs = ",".join(
            f"{s}={Path(splits[s]['file']).stem}[{int(splits[s].get('start') or 0)}"
            f"+{len(parts[s])}]"
            for s in _SPLITS
        )
        name = f"npz({runs},seed={seed})"
    return DataSplits(parts["train"], parts["probe"], parts["val"], parts["test"], names, name)


def _read(
    file: str, x_key: str, y_key: str, seed: int | None
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, _Place | None]:
    """Images (None when read in place), labels, the seeded row order and where the images are."""
    try:
        with np.load(file, allow_pickle=False) as archive:
            if x_key not in archive or y_key not in archive:
                raise DataError(
                    f"{file} has arrays {', '.join(archive.files)}; it needs {x_key!r} and "
                    f"{y_key!r} (set data.x_key / data.y_key)"
                )
            place = _place(file, x_key)
            x, y = (None if place else archive[x_key]), archive[y_key]
    except DataError:
        raise
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read {file} ({exc}); pass an .npz file of arrays") from exc
    images = place[2][2][0] if place else len(x)  # type: ignore[arg-type]
    if images != len(y):
        raise DataError(f"{file} has {images} images but {len(y)} labels; match them")
    order = np.arange(len(y)) if seed is None else np.random.default_rng(seed).permutation(len(y))
    return x, y, order, place


def _place(file: str, key: str) -> _Place | None:
    """Where array ``key`` of ``file`` is read in place: the file itself if stored
    uncompressed, an unpacked copy if compressed and over :data:`UNPACK_BYTES`; else None."""
    place = npz_array_place(file, key)
    if place is not None:
        return file, None, place
    if (compressed_size(file, key) or 0) <= UNPACK_BYTES:
        return None
    unpacked = unpack_array(file, key)
    with open(unpacked, "rb") as stream:
        dtype, shape, _ = npy_header(stream)  # type: ignore[misc]  # unpack_array checked it
        return str(unpacked), file, (stream.tell(), dtype, shape)
