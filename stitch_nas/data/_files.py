"""Images read from their files batch by batch: a split of any size that is never held whole.

An image folder becomes a list of file paths (its labels come from the folder names, without
opening a file). Each time a split is read, a torch ``DataLoader`` with ``workers`` processes
decodes the files of one batch at a time, converts them to RGB, resizes them to ``size`` x
``size`` and scales them to ``[0, 1]`` (``torchvision.transforms.Resize`` + ``ToTensor``, the
transform the in-memory loaders used, so the pixels are the same). A model with an eval
transform of its own (a timm model: resize by ``crop_pct``, centre crop, its interpolation;
:meth:`~stitch_nas.zoo.InputSpec.image_transform`) reads the files through that transform
instead, so it sees each image as timm's eval pipeline shows it, whatever the image's size and
aspect. Memory is a few batches, whatever the number of files.

The fingerprint (which keys the on-disk activation cache) covers each file's path relative to
the folder, its size in bytes and its modification time in nanoseconds, its label, and the
output size. It is computed from ``os.stat`` alone, without reading the files: a file replaced
by one of the same size with its modification time restored would not be noticed.

Every file's header is opened once when the split is built (no pixels decoded), so a file that
is not an image stops the run at load with its name; a file whose pixels are damaged past the
header is named when a batch first reads it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from stitch_nas.choices import check_at_least
from stitch_nas.errors import DataError

__all__ = ["DatasetImages", "FileImages"]


def _fix(path: str, exc: Exception) -> str:
    return f"cannot read image {path!r} ({exc}); fix the file, or move it out of the data folder"


class _Decode(Dataset):
    """``index -> (image tensor or None, error or None)``: errors travel back as one line, not
    as a worker process's traceback. With a model's eval ``transform`` the image goes through
    it (uint8 out, a quarter of float32 between processes); else it is resized to ``size``."""

    def __init__(
        self,
        paths: Sequence[Any],
        size: int,
        transform: Callable[[Any], Any] | None,
        dataset: Any = None,
    ) -> None:
        self.paths, self.size, self.transform, self.dataset = paths, size, transform, dataset

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor | None, str | None]:
        from PIL import Image
        from torchvision.transforms import functional as TF

        path = self.paths[index]
        try:
            if self.dataset is not None:  # a data set's item: (PIL image, label)
                rgb = self.dataset[path][0].convert("RGB")
            else:
                with Image.open(path) as image:
                    rgb = image.convert("RGB")
            if self.transform is not None:
                return self.transform(rgb), None
            resized = TF.resize(rgb, [self.size, self.size])
            return TF.to_tensor(resized), None
        except (OSError, ValueError, SyntaxError) as exc:  # PIL raises all three
            where = path if self.dataset is None else f"{type(self.dataset).__name__}[{path}]"
            return None, _fix(where, exc)


def _collate(items: list[tuple[torch.Tensor | None, str | None]]) -> Any:
    """One batch, or the first file's error (raised by the reader, not in a worker)."""
    errors = [error for _, error in items if error is not None]
    return errors[0] if errors else torch.stack([image for image, _ in items])  # type: ignore[misc]


class FileImages:
    """The images of one split, as files under ``root``, read on demand.

    Args:
        root: the folder the paths are under (the fingerprint takes paths relative to it).
        paths: one file per image, in split order.
        labels: their class indices (part of the fingerprint).
        size: side of the output images in pixels.
        workers: ``DataLoader`` worker processes (0: decode in this process).
    """

    def __init__(
        self, root: Path, paths: Sequence[str], labels: Sequence[int], size: int, workers: int
    ) -> None:
        check_at_least(workers, "workers", 0, " (0: decode in this process)")
        self.root, self.paths, self.size, self.workers = root, list(paths), size, workers
        self._labels = list(labels)
        self._fingerprint: str | None = None
        self._largest: int | None = None  # the largest shorter side, read by check_headers

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self.paths), 3, self.size, self.size)

    def rows(self, index: torch.Tensor) -> FileImages:
        """The images ``index`` as a new source (their paths and labels)."""
        chosen = index.tolist()
        labels = [self._labels[i] for i in chosen]
        part = FileImages(
            self.root, [self.paths[i] for i in chosen], labels, self.size, self.workers
        )
        part._largest = self._largest  # an upper bound: the headers are not read again
        return part

    @property
    def stored_side(self) -> int:
        """The largest side a model may take without upsampling every image: the largest of
        the files' shorter sides (their headers say), at most :attr:`size`. A folder of mixed
        sizes (ImageNet's) passes; one of small images only (CIFAR's) does not."""
        if self._largest is None:
            self.check_headers()
        return min(self.size, self._largest or self.size)

    def check_headers(self) -> None:
        """Open every file's header (no pixels): a file that is not an image is named now."""
        from PIL import Image

        largest = 0
        for path in self.paths:
            try:
                with Image.open(path) as image:
                    largest = max(largest, min(image.size))
            except (OSError, ValueError, SyntaxError) as exc:
                raise DataError(_fix(path, exc)) from None
        self._largest = largest

    def batches(
        self,
        size: int,
        index: torch.Tensor | None = None,
        transform: Callable[[Any], Any] | None = None,
    ) -> Iterator[torch.Tensor]:
        """Float32 ``(n, 3, size, size)`` batches of the rows ``index`` (all: None), in order;
        with a model's eval ``transform``, each file goes through it instead of the resize."""
        paths = self.paths if index is None else [self.paths[i] for i in index.tolist()]
        decode = _Decode(paths, self.size, transform, getattr(self, "dataset", None))
        loaded: Any
        if self.workers == 0 or len(paths) <= size:  # one batch: not worth starting processes
            loaded = (
                _collate([decode[i] for i in range(start, min(start + size, len(paths)))])
                for start in range(0, len(paths), size)
            )
        else:
            loaded = DataLoader(
                decode, batch_size=size, num_workers=self.workers, collate_fn=_collate
            )
        for batch in loaded:
            if isinstance(batch, str):
                raise DataError(batch)
            yield batch.float().div_(255.0) if batch.dtype == torch.uint8 else batch

    def fingerprint(self) -> str:
        """A digest of the files' relative paths, sizes, modification times and labels, and
        the output size (see the module doc for what it does not notice)."""
        if self._fingerprint is None:
            digest = hashlib.sha256(f"files:{self.size}".encode())
            for path, label in zip(self.paths, self._labels, strict=True):
                stat = os.stat(path)
                relative = os.path.relpath(path, self.root)
                digest.update(f"{relative}\0{stat.st_size}\0{stat.st_mtime_ns}\0{label}\n".encode())
            self._fingerprint = digest.hexdigest()
        return self._fingerprint


class DatasetImages(FileImages):
    """The images of a torchvision data set that has no image array (its items are PIL images
    of any size), read item by item when a split is read, never decoded whole.

    Its fingerprint covers the data set's class, root and length, the rows, their labels and
    the output size; not the pixels (decoding every image to hash it would cost a whole pass).

    Args:
        dataset: the data set (``dataset[i]`` is ``(PIL image, label)``).
        rows: the items this split holds, in order.
        labels: their class indices.
        size: side of the output images in pixels.
    """

    def __init__(self, dataset: Any, rows: Sequence[int], labels: Sequence[int], size: int) -> None:
        root = Path(str(getattr(dataset, "root", ".")))
        # the rows stand where a folder's paths do: _Decode reads dataset[row] for them
        super().__init__(root, list(rows), labels, size, workers=0)  # type: ignore[arg-type]
        self.dataset = dataset

    def rows(self, index: torch.Tensor) -> DatasetImages:
        chosen = index.tolist()
        labels = [self._labels[i] for i in chosen]
        return DatasetImages(self.dataset, [self.paths[i] for i in chosen], labels, self.size)

    @property
    def stored_side(self) -> int:
        return self.size  # unknown without decoding every image

    def check_headers(self) -> None:
        """Nothing to open ahead: a bad item is named when a batch first reads it."""

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            kind = type(self.dataset).__name__
            described = f"dataset:{kind}:{self.root}:{len(self.dataset)}:{self.size}"
            digest = hashlib.sha256(described.encode())
            rows = torch.tensor([self.paths, self._labels], dtype=torch.int64)
            digest.update(rows.numpy().tobytes())
            self._fingerprint = digest.hexdigest()
        return self._fingerprint
