"""Image data sets split into train / probe / val / test parts, and the bundled digits.

:class:`DataSplits` holds four :class:`Split` parts whose images are float32 in ``[0, 1]``
with shape ``(N, 3, H, W)``: a tensor in memory, or an
:class:`~stitch_nas.data._sources.ImageSource` that makes them batch by batch (files, what image
folders become; uint8 arrays, what torchvision data sets become). Code reads a split through
:meth:`Split.batches` and :meth:`Split.read`, which serve both. Images are deliberately *not*
normalised: each model in a zoo has its own input spec (mean, std, size) and applies it itself,
so one data set serves all of them; a model with an eval transform of its own (a timm model's
resize and centre crop) has its batches made from the stored images by it (``transform``).

The *probe* split is a small set disjoint from the others; it is used to collect activations
when fitting stitching layers, so it must never leak into validation or test numbers.

This module also holds the seeded, class-interleaved split helpers and
:func:`load_digits_splits` (scikit-learn's bundled digits; nothing is downloaded). Loaders for
your own data (image folders, local torchvision data sets) are in :mod:`stitch_nas.data`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from stitch_nas.choices import (
    PROBE_SIZE_RANGE,
    ProbeSize,
    check_image_size,
    probe_size_for,
)
from stitch_nas.errors import ConfigError, DataError

from ._sources import (
    ImageSource,
    check_finite_rows,
    resize_images,
    stored_side,
    transform_images,
)

__all__ = ["PROBE_SIZE_RANGE", "Split", "DataSplits", "load_digits_splits"]


_DIGITS_TRAIN = 1000
_DIGITS_VAL = 300


@dataclass(frozen=True, eq=False)
class Split:
    """One part of a data set.

    ``eq=False`` because element-wise tensor comparison has no single truth value; compare
    fingerprints instead.

    Attributes:
        x: Images, shape ``(N, 3, H, W)``, float32 in ``[0, 1]``, not normalised: a tensor, or
            an :class:`~stitch_nas.data._sources.ImageSource` read in batches.
        y: Class indices, shape ``(N,)``, int64.
    """

    x: torch.Tensor | ImageSource
    y: torch.Tensor

    def __post_init__(self) -> None:
        if isinstance(self.x, torch.Tensor):
            if self.x.ndim != 4 or self.x.shape[1] != 3:
                shape = tuple(self.x.shape)
                raise DataError(f"split images have shape {shape}; expected (N, 3, H, W)")
            if self.x.dtype != torch.float32:
                raise DataError(f"split images have dtype {self.x.dtype}; convert them to float32")
            check_finite_rows(self.x, "split tensor x")  # a NaN image fails here, not in the search
        if self.y.ndim != 1 or self.y.dtype != torch.int64:
            raise DataError(
                f"split labels have shape {tuple(self.y.shape)} and dtype {self.y.dtype}; "
                "expected a 1-D int64 tensor"
            )
        if len(self.x) != len(self.y):
            raise DataError(f"split has {len(self.x)} images but {len(self.y)} labels; match them")

    def __len__(self) -> int:
        return len(self.y)

    @property
    def image_size(self) -> tuple[int, int]:
        """Height and width of the images."""
        return int(self.x.shape[-2]), int(self.x.shape[-1])

    @property
    def stored_side(self) -> int:
        """The largest input side a model may take without upsampling the images."""
        return stored_side(self.x)

    def batches(
        self,
        size: int,
        index: torch.Tensor | None = None,
        transform: Callable[[Any], Any] | None = None,
    ) -> Iterator[torch.Tensor]:
        """The images ``index`` (sorted rows; None: all), ``size`` at a time, in order; with a
        model's eval ``transform`` (:meth:`~stitch_nas.zoo.InputSpec.image_transform`), made
        from the stored images by it (:func:`~stitch_nas.data._sources.transform_images`)."""
        if not isinstance(self.x, torch.Tensor):
            if transform is None:  # a plug-in's source may not take a transform
                yield from self.x.batches(size, index)
            else:
                yield from self.x.batches(size, index, transform)
            return
        n = len(self) if index is None else len(index)
        for i in range(0, n, size):
            x = self.x[i : i + size] if index is None else self.x[index[i : i + size]]
            yield x if transform is None else transform_images(x, transform)

    def read(
        self, index: torch.Tensor | None = None, transform: Callable[[Any], Any] | None = None
    ) -> torch.Tensor:
        """The images ``index`` (all: None) as one tensor: for a few rows, or a small split;
        with a model's eval ``transform``, as :meth:`batches` makes them."""
        if isinstance(self.x, torch.Tensor) and transform is None:
            return self.x if index is None else self.x[index]
        rows = max(1, len(self if index is None else index))
        return torch.cat(list(self.batches(rows, index, transform)))


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
        return self.train.image_size

    @property
    def stored_side(self) -> int:
        """The largest input side a model may take without upsampling any split's images."""
        return min(split.stored_side for split in self.splits().values())

    def splits(self) -> dict[str, Split]:
        """Return the four splits by name, in a fixed order."""
        return {"train": self.train, "probe": self.probe, "val": self.val, "test": self.test}

    def limit_decoders(self, processes: int) -> int:
        """Decode the splits read from files with at most ``processes`` worker processes; the
        most any split now uses.

        A Ray worker calls it with the CPUs it reserved less one, so that its image decoding
        stays within its reservation: two decoding processes beside a one-CPU worker's compute
        would take a CPU another worker reserved. What is read does not change.
        """
        most = 0
        for split in self.splits().values():
            if getattr(split.x, "workers", 0) > processes:
                split.x.workers = processes  # type: ignore[union-attr]
            most = max(most, getattr(split.x, "workers", 0))
        return most

    def fingerprint(self) -> str:
        """Return a sha256 hex digest of all tensors, the name and the label names.

        Used to key on-disk caches: any change to the data changes the digest. A split whose
        images are an image source contributes the source's fingerprint instead of pixels
        (files: their metadata, :meth:`~stitch_nas.data._files.FileImages.fingerprint`).
        """
        cached = self.__dict__.get("_fingerprint")
        if cached is not None:
            return cached
        digest = hashlib.sha256()
        digest.update(self.name.encode())
        digest.update("\x00".join(self.label_names).encode())
        for split_name, split in self.splits().items():
            digest.update(split_name.encode())
            tensors: tuple[torch.Tensor, ...] = (split.y,)
            if isinstance(split.x, torch.Tensor):
                tensors = (split.x, split.y)
            else:
                digest.update(split.x.fingerprint().encode())
            for tensor in tensors:
                digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
                # hashing the buffer directly avoids a copy of large image tensors; numpy's
                # stubs declare ndarray.__buffer__ only for Python >= 3.12 (we target 3.10)
                array = tensor.detach().cpu().contiguous().numpy()
                digest.update(memoryview(array))  # type: ignore[arg-type]
        value = digest.hexdigest()
        object.__setattr__(self, "_fingerprint", value)  # memoise despite frozen=True
        return value


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


def _subset(x: torch.Tensor | Any, y: torch.Tensor, index: torch.Tensor) -> Split:
    """The rows ``index`` of images ``x`` (a tensor, or a source with ``rows``) as a split."""
    # sorting keeps each split in the original order, which makes inspection easier
    index = index.sort().values
    rows = x[index].contiguous() if isinstance(x, torch.Tensor) else x.rows(index)
    return Split(x=rows, y=y[index].contiguous())


def _splits_from(
    x: torch.Tensor, y: torch.Tensor, sizes: Sequence[int], seed: int, labels: Any, name: str
) -> DataSplits:
    """Cut train, probe, val and test (in that order, of the given sizes) from one pool."""
    pieces = _cut(_class_interleaved_order(y, seed), sizes)
    train, probe, val, test = (_subset(x, y, piece) for piece in pieces)
    return DataSplits(train, probe, val, test, tuple(str(label) for label in labels), name)


def load_digits_splits(
    *, size: int = 32, probe_size: ProbeSize = "auto", seed: int = 0
) -> DataSplits:
    """Load scikit-learn's bundled handwritten digits (1,797 real 8x8 images) as splits.

    Images are upsampled bilinearly to ``size`` x ``size`` and repeated to three channels.
    Splits are about 1000 train, ``probe_size`` probe, 300 val and the rest test, cut from a
    seeded class-interleaved permutation so every split holds all ten digits.

    Args:
        size: Side of the output images in pixels.
        probe_size: Number of probe images, within :data:`PROBE_SIZE_RANGE`; ``"auto"``
            (128 for the ten digits) or ``{"per_class": k}`` (:func:`~stitch_nas.choices.
            check_probe_size`). At most 496: the rest of the 1,797 images are the other splits.
        seed: Seed of the split permutation; the same seed gives identical splits.

    Returns:
        The splits, named ``f"digits{size}"``, with label names ``"0"`` to ``"9"``.

    Raises:
        ConfigError: If ``probe_size`` is out of range.
    """
    from sklearn.datasets import load_digits  # local: keeps `import stitch_nas` light

    probe_size = probe_size_for(probe_size, 10)
    check_image_size(size)
    bunch = load_digits()
    x = torch.from_numpy(bunch.images.astype(np.float32) / 16.0).unsqueeze(1)
    x = resize_images(x, size).expand(-1, 3, -1, -1).contiguous()
    y = torch.from_numpy(bunch.target.astype(np.int64))
    test_size = len(y) - _DIGITS_TRAIN - probe_size - _DIGITS_VAL
    if test_size < 1:
        raise ConfigError(
            f"probe_size={probe_size}: the digits hold {len(y)} images, {_DIGITS_TRAIN} train "
            f"and {_DIGITS_VAL} val; give at most {probe_size + test_size - 1} probe images"
        )
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
