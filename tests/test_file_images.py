"""Image folders stay files: splits read batch by batch, fingerprinted from file metadata, and
a bad file named in one line (at load for a broken header, when read for damaged pixels)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms

from stitch_nas.data import load_image_folder, load_split_folders
from stitch_nas.data._files import FileImages
from stitch_nas.errors import ConfigError, DataError


def _folder(root: Path, per_class: int = 40, side: int = 12) -> list[Path]:
    rng = np.random.default_rng(1)
    files = []
    for cls in ("a", "b", "c"):
        (root / cls).mkdir(parents=True)
        for i in range(per_class):
            path = root / cls / f"{i:03d}.png"
            Image.fromarray(rng.integers(0, 256, (side, side + 3, 3), dtype=np.uint8)).save(path)
            files.append(path)
    return files


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_match_the_in_memory_transform(tmp_path: Path, workers: int) -> None:
    _folder(tmp_path / "set")
    data = load_image_folder(tmp_path / "set", size=16, probe_size=32, workers=workers)
    images = data.val.x
    assert isinstance(images, FileImages) and images.workers == workers
    reference = transforms.Compose([transforms.Resize((16, 16)), transforms.ToTensor()])
    expected = torch.stack([reference(Image.open(p).convert("RGB")) for p in images.paths])
    batches = list(data.val.batches(5))
    assert [len(b) for b in batches] == [5] * (len(data.val) // 5) + [len(data.val) % 5] * (
        len(data.val) % 5 > 0
    )
    torch.testing.assert_close(torch.cat(batches), expected, rtol=0, atol=0)
    rows = torch.tensor([1, 4, 7])
    torch.testing.assert_close(data.val.read(rows), expected[rows], rtol=0, atol=0)
    torch.testing.assert_close(torch.cat(list(data.val.batches(2, rows))), expected[rows])


def test_the_fingerprint_follows_the_files_not_their_pixels(tmp_path: Path) -> None:
    files = _folder(tmp_path / "set")
    first = load_image_folder(tmp_path / "set", size=16, probe_size=32).fingerprint()
    assert load_image_folder(tmp_path / "set", size=16, probe_size=32).fingerprint() == first
    assert load_image_folder(tmp_path / "set", size=24, probe_size=32).fingerprint() != first
    stat = files[0].stat()
    os.utime(files[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert load_image_folder(tmp_path / "set", size=16, probe_size=32).fingerprint() != first


def test_a_file_that_is_no_image_is_named_at_load(tmp_path: Path) -> None:
    _folder(tmp_path / "set")
    bad = tmp_path / "set" / "b" / "zz.png"
    bad.write_bytes(b"not an image at all")
    with pytest.raises(DataError, match=r"cannot read image '.*zz\.png'.*fix the file") as info:
        load_image_folder(tmp_path / "set", size=16, probe_size=32)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_damaged_pixels_are_named_when_read(tmp_path: Path, workers: int) -> None:
    files = _folder(tmp_path / "set" / "train")
    _folder(tmp_path / "set" / "val", per_class=4)
    _folder(tmp_path / "set" / "test", per_class=4)
    damaged = tmp_path / "set" / "val" / "c" / "002.png"
    damaged.write_bytes(damaged.read_bytes()[:60])  # the header survives, the pixels do not
    data = load_split_folders(tmp_path / "set", size=16, probe_size=32, workers=workers)
    assert len(files) == len(data.train) + len(data.probe)
    with pytest.raises(DataError, match=r"cannot read image '.*val/c/002\.png'") as info:
        for _ in data.val.batches(4):
            pass
    assert "\n" not in str(info.value)


def test_bad_workers_are_refused(tmp_path: Path) -> None:
    _folder(tmp_path / "set")
    with pytest.raises(ConfigError, match=r"workers=-1: give an integer >= 0"):
        load_image_folder(tmp_path / "set", size=16, probe_size=32, workers=-1)


@pytest.mark.parametrize(
    ("cpus", "decoders", "threads"), [(1, 0, 1), (2, 1, 1), (3, 2, 1), (6, 2, 4)]
)
def test_a_ray_workers_decoders_and_threads_share_the_cpus_it_reserved(
    tmp_path: Path, cpus: int, decoders: int, threads: int
) -> None:
    from stitch_nas.search._ray_shared import SharedContext
    from tests._tiny import tiny_zoo

    _folder(tmp_path / "set", per_class=20, side=40)
    data = load_image_folder(tmp_path / "set", size=32, probe_size=32, workers=2)
    before = torch.get_num_threads()
    try:
        ctx = SharedContext((tiny_zoo(("resnet",)), data)).materialize("cpu", cpus=cpus)
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    assert {part: split.x.workers for part, split in ctx.data.splits().items()} == dict.fromkeys(
        ("train", "probe", "val", "test"), decoders
    )
    assert len(list(ctx.data.val.batches(8))) == -(-len(ctx.data.val) // 8)  # still reads
