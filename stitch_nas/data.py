"""Image data sets split into train / probe / val / test parts.

Every loader returns a :class:`DataSplits` whose images are float32 tensors in ``[0, 1]`` with
shape ``(N, 3, H, W)``. Images are deliberately *not* normalised: each model in a zoo has its
own input spec (mean, std, size) and applies it itself, so one data set serves all of them.

The *probe* split is a small set disjoint from the others; it is used to collect activations
when fitting stitching layers, so it must never leak into validation or test numbers.

Nothing here downloads anything: the digits come with scikit-learn, folders and torchvision
data sets must already be on disk.
"""

from __future__ import annotations

import difflib
import hashlib
import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from stitch_nas.errors import ConfigError, DataError, UnknownNameError

__all__ = [
    "PROBE_SIZE_RANGE",
    "Split",
    "DataSplits",
    "load_digits_splits",
    "load_image_folder",
    "load_torchvision_dataset",
]

logger = logging.getLogger(__name__)

PROBE_SIZE_RANGE = (32, 256)
"""Inclusive range allowed for ``probe_size``."""

_DIGITS_TRAIN = 1000
_DIGITS_VAL = 300
_CHUNK = 4096  # images resized per call, to bound peak memory on large data sets


@dataclass(frozen=True, eq=False)
class Split:
    """One part of a data set.

    ``eq=False`` because element-wise tensor comparison has no single truth value; compare
    fingerprints instead.

    Attributes:
        x: Images, shape ``(N, 3, H, W)``, float32 in ``[0, 1]``, not normalised.
        y: Class indices, shape ``(N,)``, int64.
    """

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.ndim != 4 or self.x.shape[1] != 3:
            raise DataError(f"split images have shape {tuple(self.x.shape)}; expected (N, 3, H, W)")
        if self.x.dtype != torch.float32:
            raise DataError(f"split images have dtype {self.x.dtype}; convert them to float32")
        if self.y.ndim != 1 or self.y.dtype != torch.int64:
            raise DataError(
                f"split labels have shape {tuple(self.y.shape)} and dtype {self.y.dtype}; "
                "expected a 1-D int64 tensor"
            )
        if len(self.x) != len(self.y):
            raise DataError(f"split has {len(self.x)} images but {len(self.y)} labels; match them")

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True, eq=False)
class DataSplits:
    """A data set cut into disjoint train, probe, val and test splits.

    The tensors are treated as immutable: :meth:`fingerprint` is computed once and memoised.

    Attributes:
        train: Split used to train models.
        probe: Small split used to fit stitching layers; disjoint from the others.
        val: Split used for model selection during the search.
        test: Held-out split for final numbers only.
        label_names: Name of each class, indexed by label.
        name: Short name of the data set, part of the fingerprint.
    """

    train: Split
    probe: Split
    val: Split
    test: Split
    label_names: tuple[str, ...]
    name: str

    @property
    def num_classes(self) -> int:
        """Number of classes."""
        return len(self.label_names)

    @property
    def image_size(self) -> tuple[int, int]:
        """Height and width of the images."""
        return int(self.train.x.shape[-2]), int(self.train.x.shape[-1])

    def splits(self) -> dict[str, Split]:
        """Return the four splits by name, in a fixed order."""
        return {"train": self.train, "probe": self.probe, "val": self.val, "test": self.test}

    def fingerprint(self) -> str:
        """Return a sha256 hex digest of all tensors, the name and the label names.

        Used to key on-disk caches: any change to the data changes the digest.
        """
        cached = self.__dict__.get("_fingerprint")
        if cached is not None:
            return cached
        digest = hashlib.sha256()
        digest.update(self.name.encode())
        digest.update("\x00".join(self.label_names).encode())
        for split_name, split in self.splits().items():
            digest.update(split_name.encode())
            for tensor in (split.x, split.y):
                digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
                # hashing the buffer directly avoids a copy of large image tensors
                digest.update(memoryview(tensor.detach().cpu().contiguous().numpy()))
        value = digest.hexdigest()
        object.__setattr__(self, "_fingerprint", value)  # memoise despite frozen=True
        return value


def _check_probe_size(probe_size: int) -> None:
    low, high = PROBE_SIZE_RANGE
    if not isinstance(probe_size, int) or not low <= probe_size <= high:
        raise DataError(f"probe_size={probe_size!r} is out of range; use an int in [{low}, {high}]")


def _check_size(size: int) -> None:
    if not isinstance(size, int) or size < 8:
        raise ConfigError(f"size={size!r} is invalid; use an int >= 8 (image side in pixels)")


def _class_interleaved_order(y: torch.Tensor, seed: int) -> torch.Tensor:
    """Return a seeded permutation in which the classes are spread evenly.

    Each example gets the key ``rank within its class / class count`` (ranks from a seeded
    shuffle); sorting by that key interleaves the classes, so any contiguous slice of the
    result is close to stratified while the split sizes stay exact.
    """
    generator = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(y), generator=generator)
    labels = y[perm]
    keys = torch.empty(len(y), dtype=torch.float64)
    for label in labels.unique():
        members = (labels == label).nonzero().squeeze(1)
        keys[members] = (torch.arange(len(members), dtype=torch.float64) + 0.5) / len(members)
    return perm[torch.sort(keys, stable=True).indices]


def _cut(order: torch.Tensor, sizes: Sequence[int]) -> list[torch.Tensor]:
    """Cut ``order`` into consecutive pieces of the given sizes."""
    pieces, start = [], 0
    for size in sizes:
        pieces.append(order[start : start + size])
        start += size
    return pieces


def _subset(x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> Split:
    # sorting keeps each split in the original order, which makes inspection easier
    index = index.sort().values
    return Split(x=x[index].contiguous(), y=y[index].contiguous())


def _splits_from(
    x: torch.Tensor, y: torch.Tensor, sizes: Sequence[int], seed: int, labels: Any, name: str
) -> DataSplits:
    """Cut train, probe, val and test (in that order, of the given sizes) from one pool."""
    pieces = _cut(_class_interleaved_order(y, seed), sizes)
    train, probe, val, test = (_subset(x, y, piece) for piece in pieces)
    return DataSplits(train, probe, val, test, tuple(str(label) for label in labels), name)


def _resize(x: torch.Tensor, size: int) -> torch.Tensor:
    """Resize a float batch to ``size`` x ``size`` (bilinear; antialiased when shrinking)."""
    if tuple(x.shape[-2:]) == (size, size):
        return x
    shrink = x.shape[-1] > size or x.shape[-2] > size
    out = [
        F.interpolate(chunk, (size, size), mode="bilinear", align_corners=False, antialias=shrink)
        for chunk in x.split(_CHUNK)
    ]
    return torch.cat(out).clamp_(0.0, 1.0)


def load_digits_splits(*, size: int = 32, probe_size: int = 128, seed: int = 0) -> DataSplits:
    """Load scikit-learn's bundled handwritten digits (1,797 real 8x8 images) as splits.

    Images are upsampled bilinearly to ``size`` x ``size`` and repeated to three channels.
    Splits are about 1000 train, ``probe_size`` probe, 300 val and the rest test, cut from a
    seeded class-interleaved permutation so every split holds all ten digits.

    Args:
        size: Side of the output images in pixels.
        probe_size: Number of probe images, within :data:`PROBE_SIZE_RANGE`.
        seed: Seed of the split permutation; the same seed gives identical splits.

    Returns:
        The splits, named ``f"digits{size}"``, with label names ``"0"`` to ``"9"``.

    Raises:
        DataError: If ``probe_size`` is out of range.
    """
    from sklearn.datasets import load_digits  # local: keeps `import stitch_nas` light

    _check_probe_size(probe_size)
    _check_size(size)
    bunch = load_digits()
    x = torch.from_numpy(bunch.images.astype(np.float32) / 16.0).unsqueeze(1)
    x = _resize(x, size).expand(-1, 3, -1, -1).contiguous()
    y = torch.from_numpy(bunch.target.astype(np.int64))
    test_size = len(y) - _DIGITS_TRAIN - probe_size - _DIGITS_VAL
    sizes = [_DIGITS_TRAIN, probe_size, _DIGITS_VAL, test_size]
    return _splits_from(x, y, sizes, seed, range(10), f"digits{size}")


def _split_sizes(n: int, probe_size: int, val_fraction: float, test_fraction: float) -> list[int]:
    for label, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.0 < value < 1.0:
            raise ConfigError(f"{label}={value!r} is out of range; use a float in (0, 1)")
    if val_fraction + test_fraction >= 1.0:
        raise ConfigError(
            f"val_fraction + test_fraction = {val_fraction + test_fraction:g}; keep it below 1"
        )
    n_val = max(1, round(n * val_fraction))
    n_test = max(1, round(n * test_fraction))
    n_train = n - probe_size - n_val - n_test
    if n_train < 1:
        raise DataError(
            f"only {n} images for probe_size={probe_size}, {n_val} val and {n_test} test; "
            "add images or lower probe_size"
        )
    return [n_train, probe_size, n_val, n_test]


def load_image_folder(
    root: str | Path,
    *,
    size: int,
    probe_size: int = 128,
    val_fraction: float = 0.15,
    test_fraction: float = 0.15,
    seed: int = 0,
) -> DataSplits:
    """Load a torchvision ``ImageFolder`` (``root/<class>/<image>``) as splits.

    Every image is converted to RGB, resized to ``size`` x ``size`` and scaled to ``[0, 1]``.
    Splits are cut as in :func:`load_digits_splits`: val and test take the given fractions,
    probe takes ``probe_size`` images and train takes the rest.

    Args:
        root: Folder holding one sub-folder per class.
        size: Side of the output images in pixels.
        probe_size: Number of probe images, within :data:`PROBE_SIZE_RANGE`.
        val_fraction: Fraction of all images used for validation.
        test_fraction: Fraction of all images used for testing.
        seed: Seed of the split permutation.

    Returns:
        The splits, named after the folder, with the class folder names as label names.

    Raises:
        DataError: If the folder is missing, holds no images, or too few for the splits.
        ConfigError: If a fraction is out of range.
    """
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    _check_probe_size(probe_size)
    _check_size(size)
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(
            f"image folder {str(root)!r} does not exist; pass a folder of class folders"
        )
    transform = transforms.Compose([transforms.Resize((size, size)), transforms.ToTensor()])
    try:
        dataset = ImageFolder(str(root), transform=transform)
    except (FileNotFoundError, RuntimeError) as exc:
        raise DataError(
            f"no images found under {str(root)!r} ({exc}); add root/<class>/<image> files"
        ) from exc
    sizes = _split_sizes(len(dataset), probe_size, val_fraction, test_fraction)
    x, y = _read_all(dataset)
    logger.info("loaded %d images in %d classes from %s", len(y), len(dataset.classes), root)
    return _splits_from(x, y, sizes, seed, dataset.classes, root.name)


def _read_all(dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Read every (tensor image, label) of an ImageFolder, naming any unreadable file."""
    images, labels = [], []
    for index in range(len(dataset)):
        try:
            image, label = dataset[index]
        except OSError as exc:
            path = dataset.samples[index][0]
            raise DataError(f"cannot read image {path!r} ({exc}); remove or fix the file") from exc
        images.append(image)
        labels.append(label)
    return torch.stack(images).float(), torch.tensor(labels, dtype=torch.int64)


def _dataset_class(name: str) -> type:
    """Return the torchvision data set class ``name`` if it can load a train and a test part."""
    import torchvision.datasets as tvd

    found = {}
    for candidate in getattr(tvd, "__all__", dir(tvd)):
        cls = getattr(tvd, candidate, None)
        if not inspect.isclass(cls):
            continue
        params = inspect.signature(cls.__init__).parameters
        if "root" in params and "download" in params and ("train" in params or "split" in params):
            found[candidate] = cls
    if name not in found:
        close = difflib.get_close_matches(name, list(found), n=3) or ["CIFAR10", "MNIST", "SVHN"]
        raise UnknownNameError(
            f"unknown torchvision data set {name!r}; try one of {', '.join(close)} "
            f"({len(found)} available, see torchvision.datasets)"
        )
    return found[name]


def _open_part(cls: type, root: Path, train: bool) -> Any:
    params = inspect.signature(cls.__init__).parameters
    part = {"train": train} if "train" in params else {"split": "train" if train else "test"}
    try:
        return cls(root=str(root), download=False, **part)
    except (RuntimeError, FileNotFoundError, OSError, ValueError) as exc:
        raise DataError(
            f"{cls.__name__} not found under {str(root)!r} ({exc}); nothing is downloaded, "
            "so place the data set files there first"
        ) from exc


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


def _to_tensors(dataset: Any, size: int, limit: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    count = len(dataset) if limit is None else min(limit, len(dataset))
    arrays = _bulk_arrays(dataset)
    if arrays is not None:
        data, labels = arrays[0][:count], arrays[1][:count]
        chunks = [_resize(chunk.float().div_(255.0), size) for chunk in data.split(_CHUNK)]
        x = torch.cat(chunks)
        return x.expand(-1, 3, -1, -1).contiguous(), labels.contiguous()
    # generic path: slower, but works for any data set that yields (PIL image, int)
    from torchvision.transforms import functional as TF

    images, labels_list = [], []
    for index in range(count):
        image, label = dataset[index]
        image = TF.resize(image.convert("RGB"), [size, size])
        images.append(TF.to_tensor(image))
        labels_list.append(int(label))
    return torch.stack(images).float(), torch.tensor(labels_list, dtype=torch.int64)


def load_torchvision_dataset(
    name: str,
    root: str | Path,
    *,
    size: int,
    probe_size: int = 128,
    seed: int = 0,
    limit: int | None = None,
) -> DataSplits:
    """Load a torchvision data set class (e.g. ``"CIFAR10"``, ``"MNIST"``) from a local root.

    Nothing is downloaded (``download=False``). The train split and the probe come from the
    data set's train part (disjoint), val and test are the two halves of its test part.

    Args:
        name: Class name in ``torchvision.datasets``.
        root: Folder the data set was downloaded to, as the class expects it.
        size: Side of the output images in pixels.
        probe_size: Number of probe images, within :data:`PROBE_SIZE_RANGE`.
        seed: Seed of the split permutations.
        limit: If set, use at most this many examples from each part, to bound memory
            (float32 images take ``12 * size**2`` bytes each).

    Returns:
        The splits, named after the class, with the class's ``classes`` as label names.

    Raises:
        UnknownNameError: If ``name`` is not a usable torchvision data set.
        DataError: If the files are not under ``root`` or a part is too small.
    """
    _check_probe_size(probe_size)
    _check_size(size)
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"limit={limit!r} is invalid; use a positive int or None")
    cls = _dataset_class(name)
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(
            f"data root {str(root)!r} does not exist; nothing is downloaded, so put {name} there"
        )
    test_part = _open_part(cls, root, train=False)
    x_train, y_train = _to_tensors(_open_part(cls, root, train=True), size, limit)
    x_test, y_test = _to_tensors(test_part, size, limit)
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
    label_names = getattr(test_part, "classes", None) or range(int(y_train.max()) + 1)
    return DataSplits(
        train=_subset(x_train, y_train, train_idx),
        probe=_subset(x_train, y_train, probe_idx),
        val=_subset(x_test, y_test, val_idx),
        test=_subset(x_test, y_test, test_idx),
        label_names=tuple(str(label) for label in label_names),
        name=f"{name}{size}",
    )
