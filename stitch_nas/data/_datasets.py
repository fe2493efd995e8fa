"""Loaders for your own image data: ``ImageFolder`` trees and local torchvision data sets.

Both return a :class:`~stitch_nas.data.DataSplits` cut with the seeded, class-interleaved
split helpers of :mod:`stitch_nas.data`, with float32 images in ``[0, 1]``, not normalised.
An image folder's splits stay files, read batch by batch when a split is used
(:mod:`stitch_nas.data._files`); a torchvision data set that has its images as arrays keeps
them as uint8 and converts a batch at a time (:mod:`stitch_nas.data._sources`); other
torchvision data sets stay files (ImageNet) or items read a batch at a time. No split is
decoded whole, and each model's own eval transform crops the stored images.
Nothing here downloads anything: folders and torchvision data sets must already be on disk.
"""

from __future__ import annotations

import difflib
import inspect
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stitch_nas.choices import ProbeSize, check_image_size, check_probe_size, probe_size_for
from stitch_nas.data._files import DatasetImages, FileImages
from stitch_nas.data._sources import ArrayImages
from stitch_nas.data._splits import (
    DataSplits,
    Split,
    _class_interleaved_order,
    _cut,
    _split_sizes,
    _subset,
)
from stitch_nas.errors import ConfigError, DataError, UnknownNameError

__all__ = ["load_image_folder", "load_split_folders", "load_torchvision_dataset"]

logger = logging.getLogger(__name__)


def load_image_folder(
    root: str | Path,
    *,
    size: int,
    probe_size: ProbeSize = "auto",
    val_fraction: float = 0.15,
    test_fraction: float = 0.15,
    seed: int = 0,
    workers: int = 2,
) -> DataSplits:
    """Load a torchvision ``ImageFolder`` (``root/<class>/<image>``) as splits.

    Every image is converted to RGB, resized to ``size`` x ``size`` and scaled to ``[0, 1]``
    when a batch of its split is read; no split is held in memory. Splits are cut as in
    :func:`load_digits_splits`: val and test take the given fractions, probe takes
    ``probe_size`` images and train takes the rest.

    Args:
        root: Folder holding one sub-folder per class.
        size: Side of the output images in pixels.
        probe_size: Number of probe images, within :data:`PROBE_SIZE_RANGE`, ``"auto"`` or
            ``{"per_class": k}``, resolved for the data's classes
            (:func:`~stitch_nas.choices.probe_size_for`).
        val_fraction: Fraction of all images used for validation.
        test_fraction: Fraction of all images used for testing.
        seed: Seed of the split permutation.
        workers: Processes that decode images while a split is read (0: none).

    Returns:
        The splits, named after the folder, with the class folder names as label names.

    Raises:
        DataError: If the folder is missing, holds no images, too few for the splits, or a
            file that is not an image (named).
        ConfigError: If a fraction is out of range.
    """
    from torchvision.datasets import ImageFolder

    check_probe_size(probe_size)
    check_image_size(size)
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(
            f"image folder {str(root)!r} does not exist; pass a folder of class folders"
        )
    try:
        dataset = ImageFolder(str(root))  # lists the files; opens none
    except (FileNotFoundError, RuntimeError) as exc:
        raise DataError(
            f"no images found under {str(root)!r} ({exc}); add root/<class>/<image> files"
        ) from exc
    probe_size = probe_size_for(probe_size, len(dataset.classes))
    sizes = _split_sizes(len(dataset), probe_size, val_fraction, test_fraction)
    y = torch.tensor(dataset.targets, dtype=torch.int64)
    pieces = _cut(_class_interleaved_order(y, seed), sizes)
    train, probe, val, test = (
        _files_split(root, dataset.samples, piece, size, workers) for piece in pieces
    )
    logger.info("found %d images in %d classes in %s", len(y), len(dataset.classes), root)
    return DataSplits(train, probe, val, test, tuple(dataset.classes), root.name)


def _files_split(
    root: Path, samples: list[tuple[str, int]], rows: torch.Tensor, size: int, workers: int
) -> Split:
    """The ``rows`` of an ImageFolder's ``(path, label)`` samples as a split read from files
    (in the folder's order, as :func:`_subset` keeps it for tensors)."""
    chosen = [samples[i] for i in rows.sort().values.tolist()]
    labels = [label for _, label in chosen]
    images = FileImages(root, [path for path, _ in chosen], labels, size, workers)
    images.check_headers()
    return Split(images, torch.tensor(labels, dtype=torch.int64))


def _dataset_class(name: str) -> type[Any]:
    """Return the torchvision data set class ``name`` if it can load a train and a test part."""
    import torchvision.datasets as tvd

    found = {}
    for candidate in getattr(tvd, "__all__", dir(tvd)):
        cls = getattr(tvd, candidate, None)
        if not inspect.isclass(cls):
            continue
        params = inspect.signature(cls.__init__).parameters
        # ImageNet takes no download (it is never downloadable), the others all do
        local = "download" in params or candidate == "ImageNet"
        if "root" in params and local and ("train" in params or "split" in params):
            found[candidate] = cls
    if name not in found:
        close = difflib.get_close_matches(name, list(found), n=3) or ["CIFAR10", "MNIST", "SVHN"]
        raise UnknownNameError(
            f"unknown torchvision data set {name!r}; try one of {', '.join(close)} "
            f"({len(found)} available, see torchvision.datasets)"
        )
    return found[name]


def _open_part(cls: type[Any], root: Path, train: bool) -> Any:
    params = inspect.signature(cls.__init__).parameters
    local = {"download": False} if "download" in params else {}
    if "train" in params:
        parts: list[dict[str, Any]] = [{"train": train}]
    else:  # a data set without a test split (ImageNet: train and val) holds out val
        parts = [{"split": "train"}] if train else [{"split": "test"}, {"split": "val"}]
    for part in parts:
        try:
            return cls(root=str(root), **local, **part)
        except ValueError as exc:  # an unknown split name (try the next), or a bad file
            error: Exception = exc
        except (RuntimeError, FileNotFoundError, OSError) as exc:
            error = exc
            break
    raise DataError(
        f"{cls.__name__} not found under {str(root)!r} ({error}); nothing is downloaded, "
        "so place the data set files there first"
    ) from error


def _bulk_arrays(dataset: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Return (uint8 images NCHW, labels) straight from a data set's arrays, if it has them."""
    data = getattr(dataset, "data", None)
    labels = getattr(dataset, "targets", getattr(dataset, "labels", None))
    if data is None or labels is None:
        return None
    data = torch.as_tensor(data)
    labels = torch.as_tensor(np.asarray(labels))
    if data.dtype != torch.uint8 or labels.ndim != 1 or len(data) != len(labels):
        return None
    if data.ndim == 3:  # (N, H, W) grey, e.g. MNIST
        data = data.unsqueeze(1)
    elif data.ndim == 4 and data.shape[-1] in (1, 3) and data.shape[1] not in (1, 3):
        data = data.permute(0, 3, 1, 2)  # (N, H, W, C), e.g. CIFAR
    elif not (data.ndim == 4 and data.shape[1] in (1, 3)):  # (N, C, H, W), e.g. SVHN
        return None
    return data, labels.long()


def _to_tensors(
    dataset: Any, size: int, limit: int | None, workers: int
) -> tuple[ArrayImages | FileImages, torch.Tensor]:
    """A data set's images as a source that makes float32 a batch at a time: uint8 arrays kept
    in memory, files (an ImageFolder, ImageNet) read from disk, or other data sets' items."""
    count = len(dataset) if limit is None else min(limit, len(dataset))
    arrays = _bulk_arrays(dataset)
    if arrays is not None:  # kept as uint8, made float32 (and resized) batch by batch
        return ArrayImages(arrays[0][:count], size), arrays[1][:count].contiguous()
    samples = getattr(dataset, "samples", None)
    if isinstance(samples, list) and samples and isinstance(samples[0], tuple):  # ImageFolder
        chosen = samples[:count]
        labels = [int(label) for _, label in chosen]
        images = FileImages(Path(dataset.root), [p for p, _ in chosen], labels, size, workers)
        images.check_headers()
        return images, torch.tensor(labels, dtype=torch.int64)
    # any other data set yielding (PIL image, label): its items, read when a batch is
    targets = getattr(dataset, "targets", None) or getattr(dataset, "_labels", None)
    if targets is None or len(targets) < count:  # labels only by reading every item once
        targets = [dataset[index][1] for index in range(count)]
    labels = [int(label) for label in list(targets)[:count]]
    return DatasetImages(dataset, range(count), labels, size), torch.tensor(labels)


def load_torchvision_dataset(
    name: str,
    root: str | Path,
    *,
    size: int,
    probe_size: ProbeSize = "auto",
    seed: int = 0,
    limit: int | None = None,
    workers: int = 2,
) -> DataSplits:
    """Load a torchvision data set class (e.g. ``"CIFAR10"``, ``"MNIST"``, ``"ImageNet"``)
    from a local root.

    Nothing is downloaded (``download=False``). The train split and the probe come from the
    data set's train part (disjoint), val and test are the two halves of its test part (its
    val part where it has no test part, as ImageNet).

    Args:
        name: Class name in ``torchvision.datasets``.
        root: Folder the data set was downloaded to, as the class expects it.
        size: Side of the output images in pixels.
        probe_size: Number of probe images, within :data:`PROBE_SIZE_RANGE`, ``"auto"`` or
            ``{"per_class": k}``, resolved for the data's classes
            (:func:`~stitch_nas.choices.probe_size_for`).
        seed: Seed of the split permutations.
        limit: If set, use at most this many examples from each part.
        workers: Processes that decode image files while a split is read (0: none).

    No split is decoded whole: data sets with image arrays (CIFAR, MNIST, SVHN, ...) keep them
    as uint8 at their own size (CIFAR-10: 0.18 GB); ImageFolder-like ones (ImageNet) are read
    from their files, and others item by item, a batch at a time.

    Returns:
        The splits, named after the class, with the class's ``classes`` as label names.

    Raises:
        UnknownNameError: If ``name`` is not a usable torchvision data set.
        DataError: If the files are not under ``root`` or a part is too small.
    """
    check_probe_size(probe_size)
    check_image_size(size)
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"limit={limit!r} is invalid; use a positive int or None")
    cls = _dataset_class(name)
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(
            f"data root {str(root)!r} does not exist; nothing is downloaded, so put {name} there"
        )
    test_part = _open_part(cls, root, train=False)
    x_train, y_train = _to_tensors(_open_part(cls, root, train=True), size, limit, workers)
    x_test, y_test = _to_tensors(test_part, size, limit, workers)
    label_names = getattr(test_part, "classes", None) or range(int(y_train.max()) + 1)
    # ImageNet's classes are tuples of names ("tench", "Tinca tinca"): the first names it
    label_names = [n[0] if isinstance(n, (tuple, list)) else n for n in label_names]
    probe_size = probe_size_for(probe_size, len(label_names))
    if len(y_train) <= probe_size or len(y_test) < 2:
        raise DataError(
            f"{name} under {str(root)!r} has {len(y_train)} train and {len(y_test)} test images; "
            f"need more than probe_size={probe_size} train and at least 2 test"
        )
    probe_idx, train_idx = _cut(
        _class_interleaved_order(y_train, seed), [probe_size, len(y_train) - probe_size]
    )
    half = len(y_test) // 2
    val_idx, test_idx = _cut(_class_interleaved_order(y_test, seed + 1), [half, len(y_test) - half])
    return DataSplits(
        train=_subset(x_train, y_train, train_idx),
        probe=_subset(x_train, y_train, probe_idx),
        val=_subset(x_test, y_test, val_idx),
        test=_subset(x_test, y_test, test_idx),
        label_names=tuple(str(label) for label in label_names),
        name=f"{name}{size}",
    )


def load_split_folders(
    root: str | Path,
    *,
    size: int,
    probe_size: ProbeSize = "auto",
    seed: int = 0,
    workers: int = 2,
) -> DataSplits:
    """Load an image folder whose splits are fixed: ``root/{train,val,test}/<class>/<image>``,
    or ImageNet's layout ``root/{train,val}/<synset>/<image>`` (no ``test/``).

    The val and test folders are used as they are; without ``test/``, val and test are the two
    halves of ``val/`` (a seeded, class-interleaved cut, as the torchvision kind cuts a test
    part). The probe is ``probe_size`` images of ``train/`` (a seeded, class-interleaved pick;
    ``"auto"`` or ``{"per_class": k}`` resolved for its classes by
    :func:`~stitch_nas.choices.probe_size_for`) and train is the rest of ``train/``, so the
    data set's own train/test separation is kept. Every split must have the same class folders
    (a class with no images in a split still needs its empty folder). Images are read from
    their files batch by batch, as in :func:`load_image_folder`.

    Raises:
        DataError: a split folder is missing, holds other classes than train/, or too few
            images for the probe.
    """
    from torchvision.datasets import ImageFolder

    check_probe_size(probe_size)
    check_image_size(size)
    root = Path(root).expanduser()
    parts: dict[str, list[tuple[str, int]]] = {}
    classes: list[str] | None = None
    folders = ("train", "val", "test") if (root / "test").is_dir() else ("train", "val")
    for split in folders:
        folder = root / split
        try:
            dataset = ImageFolder(str(folder), allow_empty=True)
        except (FileNotFoundError, RuntimeError) as exc:
            raise DataError(
                f"split folder {str(folder)!r} is missing or empty ({exc}); add "
                f"{split}/<class>/<image> files"
            ) from exc
        if classes is not None and dataset.classes != classes:
            raise DataError(
                f"{str(folder)!r} has classes {dataset.classes[:5]}..., train/ has "
                f"{classes[:5]}...; give every split the same class folders"
            )
        classes = dataset.classes
        if len(dataset) == 0:
            raise DataError(f"split folder {str(folder)!r} holds no images; add some")
        parts[split] = dataset.samples
    y_train = torch.tensor([label for _, label in parts["train"]], dtype=torch.int64)
    probe_size = probe_size_for(probe_size, len(dataset.classes))
    if len(y_train) <= probe_size:
        raise DataError(
            f"{root}/train has {len(y_train)} images; need more than probe_size={probe_size}"
        )
    probe_idx, train_idx = _cut(
        _class_interleaved_order(y_train, seed), [probe_size, len(y_train) - probe_size]
    )
    logger.info("found split folders of %s: %s", root, {s: len(p) for s, p in parts.items()})
    if "test" in parts:
        held = {split: (parts[split], torch.arange(len(parts[split]))) for split in ("val", "test")}
    else:  # ImageNet's layout: its val/ is the held-out part, cut into val and test
        y_val = torch.tensor([label for _, label in parts["val"]], dtype=torch.int64)
        if len(y_val) < 2:
            raise DataError(f"{root}/val has {len(y_val)} images; need at least 2 (val and test)")
        half = len(y_val) // 2
        val_idx, test_idx = _cut(
            _class_interleaved_order(y_val, seed + 1), [half, len(y_val) - half]
        )
        held = {"val": (parts["val"], val_idx), "test": (parts["val"], test_idx)}
    return DataSplits(
        train=_files_split(root, parts["train"], train_idx, size, workers),
        probe=_files_split(root, parts["train"], probe_idx, size, workers),
        val=_files_split(root, *held["val"], size, workers),
        test=_files_split(root, *held["test"], size, workers),
        label_names=tuple(dataset.classes),  # every split has the same (checked above)
        name=f"{root.name}{size}-split-folders",
    )
