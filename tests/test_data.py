"""Tests of stitch_nas.data (splits, digits) and stitch_nas.data (folders, torchvision)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from stitch_nas.data import (
    ArrayImages,
    DataSplits,
    Split,
    load_digits_splits,
    load_image_folder,
    load_torchvision_dataset,
)
from stitch_nas.data._sources import resize_images
from stitch_nas.errors import ConfigError, DataError, UnknownNameError


def _split_keys(split: Split) -> set[bytes]:
    return {image.numpy().tobytes() for image in split.read()}


def test_digits_sizes_shapes_and_range(digits: DataSplits) -> None:
    sizes = {name: len(split) for name, split in digits.splits().items()}
    assert sizes == {"train": 1000, "probe": 128, "val": 300, "test": 1797 - 1428}
    assert digits.label_names == tuple(str(i) for i in range(10))
    assert digits.image_size == (32, 32) and digits.num_classes == 10
    for split in digits.splits().values():
        assert split.x.dtype == torch.float32 and split.x.shape[1:] == (3, 32, 32)
        assert split.y.dtype == torch.int64
        images = split.read()
        assert images.dtype == torch.float32 and images.min() >= 0.0 and images.max() <= 1.0
        assert torch.equal(split.x[:, 0], split.x[:, 2])  # grey repeated to three channels
        assert set(split.y.tolist()) == set(range(10))  # class-interleaved: all digits in each


def test_digits_splits_are_disjoint() -> None:
    # size=8 keeps the original pixels, so every image maps back to one row of load_digits
    from sklearn.datasets import load_digits

    images = load_digits().images.astype(np.float32) / 16.0
    rows = {}
    for index, image in enumerate(images):
        rows.setdefault(image.tobytes(), []).append(index)
    data = load_digits_splits(size=8, probe_size=64)
    owners = {}
    for name, split in data.splits().items():
        for image in split.x[:, 0]:
            for index in rows[image.numpy().tobytes()]:
                owners.setdefault(index, set()).add(name)
    assert len(owners) == 1797
    unique_rows = {i for group in rows.values() if len(group) == 1 for i in group}
    assert all(len(owners[i]) == 1 for i in unique_rows)


def test_digits_deterministic_and_fingerprint(digits: DataSplits) -> None:
    again = load_digits_splits()
    for name, split in digits.splits().items():
        other = again.splits()[name]
        assert torch.equal(split.x, other.x) and torch.equal(split.y, other.y)
    assert digits.fingerprint() == again.fingerprint()
    assert len(digits.fingerprint()) == 64 and digits.fingerprint() == digits.fingerprint()
    assert load_digits_splits(seed=1).fingerprint() != digits.fingerprint()
    assert load_digits_splits(size=16).fingerprint() != digits.fingerprint()


def test_digits_fast() -> None:
    import time

    load_digits_splits()  # warm the imports
    start = time.perf_counter()
    load_digits_splits(seed=3)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("probe_size", [0, 31, 8193, 64.0, "all", {"per_class": 0}])
def test_probe_size_validated(probe_size: int) -> None:
    with pytest.raises(ConfigError, match=r"probe_size.*\[32, 8192\]"):
        load_digits_splits(probe_size=probe_size)


@pytest.mark.parametrize(("probe_size", "images"), [(32, 32), (496, 496), ("auto", 128)])
def test_probe_size_bounds_allowed(probe_size, images: int) -> None:
    assert len(load_digits_splits(probe_size=probe_size).probe) == images


def test_probe_size_per_class_and_beyond_the_digits() -> None:
    data = load_digits_splits(probe_size={"per_class": 20})
    counts = data.probe.y.bincount()  # the interleaved cut is near stratified
    assert len(data.probe) == 200 and counts.min() >= 19 and counts.max() <= 21
    with pytest.raises(ConfigError, match=r"probe_size=497.*at most 496"):
        load_digits_splits(probe_size=497)


def test_split_validation() -> None:
    with pytest.raises(DataError, match="shape"):
        Split(x=torch.zeros(2, 1, 4, 4), y=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(DataError, match="labels"):
        Split(x=torch.zeros(2, 3, 4, 4), y=torch.zeros(3, dtype=torch.int64))


def _write_folder(root: Path, per_class: int = 30) -> None:
    rng = np.random.default_rng(0)
    for label, cls in enumerate(["class_a", "class_b"]):
        (root / cls).mkdir(parents=True)
        for index in range(per_class):
            pixels = rng.integers(0, 256, size=(10, 12, 3), dtype=np.uint8)
            pixels[..., 0] = 255 * label  # makes the class visible in the first channel
            mode_image = Image.fromarray(pixels)
            if index % 5 == 0:
                mode_image = mode_image.convert("L")  # mixed modes must still load as RGB
            mode_image.save(root / cls / f"{index:03d}.png")


def test_image_folder(tmp_path: Path) -> None:
    _write_folder(tmp_path / "shapes")
    data = load_image_folder(tmp_path / "shapes", size=16, probe_size=32)
    assert data.label_names == ("class_a", "class_b") and data.name == "shapes"
    sizes = [len(split) for split in data.splits().values()]
    assert sizes == [60 - 32 - 9 - 9, 32, 9, 9]
    for split in data.splits().values():
        images = split.read()
        assert images.shape[1:] == (3, 16, 16) and split.image_size == (16, 16)
        assert images.min() >= 0.0 and images.max() <= 1.0
    again = load_image_folder(tmp_path / "shapes", size=16, probe_size=32)
    assert again.fingerprint() == data.fingerprint()


def test_image_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load_image_folder(tmp_path / "missing", size=16)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no images"):
        load_image_folder(tmp_path / "empty", size=16)
    _write_folder(tmp_path / "small", per_class=10)
    with pytest.raises(DataError, match="only 20 images"):
        load_image_folder(tmp_path / "small", size=16, probe_size=32)


def _write_idx(path: Path, array: np.ndarray) -> None:
    # the IDX format of MNIST: magic (0, 0, dtype 0x08 = uint8, ndim), big-endian dims, data
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def _write_mnist(root: Path, n_train: int = 60, n_test: int = 20) -> None:
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, count in (("train", n_train), ("t10k", n_test)):
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (count, 28, 28)))
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", np.arange(count) % 10)


def test_torchvision_mnist_from_local_files(tmp_path: Path) -> None:
    _write_mnist(tmp_path)
    data = load_torchvision_dataset("MNIST", tmp_path, size=32, probe_size=32)
    assert [len(split) for split in data.splits().values()] == [28, 32, 10, 10]
    assert data.label_names[0].startswith("0") and len(data.label_names) == 10
    assert isinstance(data.train.x, ArrayImages) and data.train.x.pixels.dtype == torch.uint8
    images = data.train.read()
    assert images.shape[1:] == (3, 32, 32) and data.image_size == (32, 32)
    assert 0.0 <= images.min() and images.max() <= 1.0
    # batch by batch from uint8, the same pixels as converting the whole array at once
    whole = resize_images(data.train.x.pixels.float() / 255.0, 32).expand(-1, 3, -1, -1)
    assert torch.equal(images, whole)
    assert torch.equal(torch.cat(list(data.train.batches(5))), whole)
    assert not _split_keys(data.train) & _split_keys(data.probe)
    again = load_torchvision_dataset("MNIST", tmp_path, size=32, probe_size=32)
    assert again.fingerprint() == data.fingerprint()


def test_torchvision_errors(tmp_path: Path) -> None:
    with pytest.raises(UnknownNameError, match="CIFAR10") as info:
        load_torchvision_dataset("CIFAR11", tmp_path, size=32)
    assert isinstance(info.value, KeyError)
    with pytest.raises(DataError, match="does not exist"):
        load_torchvision_dataset("MNIST", tmp_path / "missing", size=32)
    with pytest.raises(DataError, match="nothing is downloaded"):
        load_torchvision_dataset("CIFAR10", tmp_path, size=32)


# --- fixed splits: .npz arrays and split folders -----------------------------------------


def _write_npz(
    path: Path, n: int, *, seed: int = 0, layout: str = "nhwc", compressed: bool = True
) -> None:
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(4), n // 4)  # class-major, like realzoo's files
    x = rng.integers(0, 256, size=(n, 8, 8, 3), dtype=np.uint8)
    x[..., 0] = 60 * y[:, None, None]  # the class is visible in the first channel
    if layout == "nchw":
        x = x.transpose(0, 3, 1, 2)
    save = np.savez_compressed if compressed else np.savez
    save(path, images=x, labels=y.astype(np.int64), extra=np.arange(n))


def _npz_splits(root: Path) -> dict:
    return {
        "probe": {"file": str(root / "train.npz"), "start": 0, "count": 32},
        "train": {"file": str(root / "train.npz"), "start": 32, "count": None},
        "val": {"file": str(root / "test.npz"), "start": 0, "count": 40},
        "test": {"file": str(root / "test.npz"), "start": 40, "count": 40},
    }


def test_npz_fixed_splits_are_shuffled_disjoint_runs(tmp_path: Path) -> None:
    from stitch_nas.data import load_npz_splits

    _write_npz(tmp_path / "train.npz", 100)
    _write_npz(tmp_path / "test.npz", 80, seed=1, layout="nchw")
    data = load_npz_splits(_npz_splits(tmp_path), x_key="images", y_key="labels", size=16)
    assert [len(s) for s in data.splits().values()] == [68, 32, 40, 40]
    assert data.label_names == ("0", "1", "2", "3") and data.image_size == (16, 16)
    for split in data.splits().values():  # a prefix of a class-major file would hold 1-2 classes
        assert split.y.unique().numel() == 4
        images = split.read()
        assert images.dtype == torch.float32 and images.min() >= 0.0 and images.max() <= 1.0
    # the splits of one file are disjoint runs of one seeded permutation
    x = np.load(tmp_path / "train.npz")["images"]
    order = np.random.default_rng(0).permutation(100)
    expected = torch.from_numpy(x[np.sort(order[:32])]).permute(0, 3, 1, 2).float() / 255
    kept = load_npz_splits(_npz_splits(tmp_path), x_key="images", y_key="labels")
    assert torch.equal(kept.probe.read(), expected)
    # uint8 files stay uint8 in memory: a quarter of float32 at the stored size
    assert isinstance(kept.probe.x, ArrayImages) and kept.probe.x.pixels.dtype == torch.uint8
    floats = tmp_path / "floats.npz"
    np.savez_compressed(
        floats, images=x.astype(np.float32) / 255, labels=np.zeros(100, dtype=np.int64)
    )
    splits = {k: {**v, "file": str(floats)} for k, v in _npz_splits(tmp_path).items()}
    as_floats = load_npz_splits(splits, x_key="images", y_key="labels")
    assert isinstance(as_floats.probe.x, torch.Tensor)
    assert torch.allclose(as_floats.probe.read(), expected)
    assert (
        kept.fingerprint()
        == load_npz_splits(_npz_splits(tmp_path), x_key="images", y_key="labels").fingerprint()
    )
    other = load_npz_splits(_npz_splits(tmp_path), x_key="images", y_key="labels", seed=1)
    assert other.fingerprint() != kept.fingerprint()
    named = load_npz_splits(_npz_splits(tmp_path), x_key="images", y_key="labels",
                            label_names=list("abcd"))  # fmt: skip
    assert named.label_names == ("a", "b", "c", "d")
    with pytest.raises(DataError, match=r"needs 'x' and 'y'"):
        load_npz_splits(_npz_splits(tmp_path))
    with pytest.raises(DataError, match=r"2 label names for labels up to 3"):
        load_npz_splits(_npz_splits(tmp_path), x_key="images", y_key="labels", label_names="ab")


def test_a_large_compressed_npz_is_unpacked_once_and_read_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compressed array over UNPACK_BYTES is unpacked to the cache folder once and read in
    place from there: the same images as loading it whole, the user's file named in messages
    and the fingerprint, the copy reused, and unpacked again where a process lacks it."""
    import pickle

    from stitch_nas.data import _npz_unpack, load_npz_splits
    from stitch_nas.data._npz_files import NpzFileImages

    _write_npz(tmp_path / "train.npz", 100)
    _write_npz(tmp_path / "test.npz", 80, seed=1, layout="nchw")
    whole = load_npz_splits(_npz_splits(tmp_path), x_key="images", y_key="labels", size=16)
    monkeypatch.setenv("STITCH_NAS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_npz_unpack, "UNPACK_BYTES", 1000)
    monkeypatch.setattr("stitch_nas.data._arrays.UNPACK_BYTES", 1000)
    data = load_npz_splits(_npz_splits(tmp_path), x_key="images", y_key="labels", size=16)
    unpacked = sorted((tmp_path / "cache" / "npz").glob("*.npy"))
    assert len(unpacked) == 2  # one per file; no temporary file left
    assert not list((tmp_path / "cache" / "npz").glob(".*"))
    for name, split in data.splits().items():
        assert isinstance(split.x, NpzFileImages) and split.x.source.endswith(".npz")
        assert torch.equal(split.read(), whole.splits()[name].read()), name
    stamps = [p.stat().st_mtime_ns for p in unpacked]
    again = load_npz_splits(_npz_splits(tmp_path), x_key="images", y_key="labels", size=16)
    assert [p.stat().st_mtime_ns for p in unpacked] == stamps  # reused, not unpacked again
    assert again.fingerprint() == data.fingerprint()
    # a Ray worker on another node has no copy: it unpacks one on first use
    sent = pickle.loads(pickle.dumps(data.val.x))
    for path in unpacked:
        path.unlink()
    assert torch.equal(torch.cat(list(sent.batches(7))), whole.val.read())
    # a rewritten source is a new file: new copy, new fingerprint
    _write_npz(tmp_path / "test.npz", 80, seed=2, layout="nchw")
    rewritten = load_npz_splits(_npz_splits(tmp_path), x_key="images", y_key="labels", size=16)
    assert rewritten.fingerprint() != data.fingerprint()


def test_unpacking_a_compressed_npz_without_room_fails_before_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Too little disk: a one-line DataError with the fixes, before anything is written; a disk
    that fills during the unpacking leaves no partial file."""
    import collections

    from stitch_nas.data import _npz_unpack, load_npz_splits

    _write_npz(tmp_path / "train.npz", 100)
    _write_npz(tmp_path / "test.npz", 80, seed=1)
    cache = tmp_path / "cache"
    monkeypatch.setenv("STITCH_NAS_CACHE", str(cache))
    monkeypatch.setattr("stitch_nas.data._arrays.UNPACK_BYTES", 1000)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(_npz_unpack.shutil, "disk_usage", lambda _: usage(10**9, 10**9, 100))
    with pytest.raises(DataError, match=r"train.npz:images .* STITCH_NAS_CACHE .* numpy.savez"):
        load_npz_splits(_npz_splits(tmp_path), x_key="images", y_key="labels")
    assert not list((cache / "npz").iterdir())
    monkeypatch.setattr(_npz_unpack.shutil, "disk_usage", lambda _: usage(10**9, 0, 10**9))

    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_npz_unpack, "_CHUNK", 100)
    monkeypatch.setattr("tqdm.auto.tqdm.update", full)
    with pytest.raises(DataError, match=r"No space left on device.* free space there"):
        load_npz_splits(_npz_splits(tmp_path), x_key="images", y_key="labels")
    assert not list((cache / "npz").iterdir())  # the temporary file is gone too


def test_a_fortran_order_compressed_npz_is_refused_before_unpacking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stitch_nas.data import load_npz_splits

    x = np.asfortranarray(np.zeros((100, 8, 8, 3), dtype=np.uint8))
    np.savez_compressed(tmp_path / "f.npz", images=x, labels=np.arange(100) % 4)
    splits = {k: {**v, "file": str(tmp_path / "f.npz")} for k, v in _npz_splits(tmp_path).items()}
    monkeypatch.setenv("STITCH_NAS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("stitch_nas.data._arrays.UNPACK_BYTES", 1000)
    with pytest.raises(DataError, match=r"f.npz:images .*Fortran order.*ascontiguousarray"):
        load_npz_splits(splits, x_key="images", y_key="labels")
    assert not (tmp_path / "cache" / "npz").exists()


def test_uncompressed_npz_is_read_in_place_as_loaded(tmp_path: Path) -> None:
    """np.savez files are read in place, a batch of rows at a time: same images as the
    loaded (compressed) file, also as floats, after pickling (a Ray worker) and resized."""
    import pickle

    from stitch_nas.data import load_npz_splits
    from stitch_nas.data._npz_files import NpzFileImages

    for compressed, folder in ((True, tmp_path / "zipped"), (False, tmp_path / "mapped")):
        folder.mkdir()
        _write_npz(folder / "train.npz", 100, compressed=compressed)
        _write_npz(folder / "test.npz", 80, seed=1, layout="nchw", compressed=compressed)
    x = np.load(tmp_path / "mapped" / "train.npz")["images"]
    np.savez(tmp_path / "mapped" / "floats.npz", images=x / 255.0, labels=np.zeros(100, int))
    np.savez(tmp_path / "mapped" / "grey.npz", images=x[..., 0], labels=np.zeros(100, int))
    for size in (None, 12):
        loaded = load_npz_splits(_npz_splits(tmp_path / "zipped"), x_key="images",
                                 y_key="labels", size=size)  # fmt: skip
        mapped = load_npz_splits(_npz_splits(tmp_path / "mapped"), x_key="images",
                                 y_key="labels", size=size)  # fmt: skip
        for name, split in mapped.splits().items():
            assert isinstance(split.x, NpzFileImages), name
            assert split.x.shape == loaded.splits()[name].x.shape
            assert torch.equal(split.read(), loaded.splits()[name].read())
            index = torch.tensor([1, 5, 7])
            assert torch.equal(
                torch.cat(list(split.batches(2, index))), loaded.splits()[name].read(index)
            )
        sent = pickle.loads(pickle.dumps(mapped.val.x))
        assert sent._stream is None and torch.equal(torch.cat(list(sent.batches(16))),
                                                   mapped.val.read())  # fmt: skip
    mapped = load_npz_splits(_npz_splits(tmp_path / "mapped"), x_key="images", y_key="labels")
    files = {k: {**v, "file": str(tmp_path / "mapped" / "floats.npz")}
             for k, v in _npz_splits(tmp_path).items()}  # fmt: skip
    floats = load_npz_splits(files, x_key="images", y_key="labels")
    assert isinstance(floats.probe.x, NpzFileImages)
    assert torch.allclose(floats.probe.read(), mapped.probe.read())
    grey = load_npz_splits({k: {**v, "file": str(tmp_path / "mapped" / "grey.npz")}
                            for k, v in files.items()}, x_key="images", y_key="labels")  # fmt: skip
    assert torch.equal(grey.probe.read()[:, 1], mapped.probe.read()[:, 0])
    # the fingerprint follows the file's metadata, not a read of its pixels
    before = mapped.fingerprint()
    again = load_npz_splits(_npz_splits(tmp_path / "mapped"), x_key="images", y_key="labels")
    assert again.fingerprint() == before
    os.utime(tmp_path / "mapped" / "test.npz", ns=(1, 1))
    touched = load_npz_splits(_npz_splits(tmp_path / "mapped"), x_key="images", y_key="labels")
    assert touched.fingerprint() != before
    np.savez(tmp_path / "mapped" / "floats.npz", images=x * 1.0, labels=np.zeros(100, int))
    with pytest.raises(DataError, match=r"floats.npz:images holds floats in \[0, 255\]"):
        load_npz_splits(files, x_key="images", y_key="labels")


def test_split_folders_keep_their_splits(tmp_path: Path) -> None:
    from stitch_nas.data import load_split_folders

    _write_folder(tmp_path / "set" / "train", per_class=30)
    _write_folder(tmp_path / "set" / "val", per_class=6)
    _write_folder(tmp_path / "set" / "test", per_class=7)
    data = load_split_folders(tmp_path / "set", size=16, probe_size=32)
    assert [len(s) for s in data.splits().values()] == [60 - 32, 32, 12, 14]
    assert data.label_names == ("class_a", "class_b")
    assert data.val.y.tolist() == [0] * 6 + [1] * 6  # val/ used as it is, in its own order
    (tmp_path / "set" / "test" / "class_c").mkdir()
    with pytest.raises(DataError, match="same class folders"):
        load_split_folders(tmp_path / "set", size=16, probe_size=32)
    with pytest.raises(DataError, match=r"missing or empty"):
        load_split_folders(tmp_path / "nothing", size=16, probe_size=32)
