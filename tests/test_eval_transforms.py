"""Each model sees its images as its authors evaluated it: a timm model's inputs are made by
timm's own eval transform (from its ``pretrained_cfg``) from the stored images, whatever their
size and aspect, and a zoo whose models take larger inputs than the data hold is refused before
any trial rather than fed upsampled images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config

from stitch_nas.activations import ActivationCache, StitchContext
from stitch_nas.data import load_split_folders
from stitch_nas.data._sources import ArrayImages
from stitch_nas.zoo import InputSpec, Zoo, from_timm

#: a pretrained_cfg unlike timm's defaults in every field the eval transform reads
_CFG = {
    "input_size": (3, 40, 40),
    "crop_pct": 0.8,
    "interpolation": "bicubic",
    "mean": (0.3, 0.4, 0.5),
    "std": (0.2, 0.25, 0.3),
}
_SIDES = [(37, 61), (90, 45), (52, 52), (120, 33), (41, 77), (64, 100)]


def _imagenet_folder(root: Path) -> list[Path]:
    """``root/{train,val}/<synset>/*.JPEG`` of random pictures of odd sizes and aspects."""
    rng = np.random.default_rng(0)
    val = []
    for part, count in (("train", 20), ("val", 6)):
        for label in ("n01440764", "n01443537"):
            folder = root / part / label
            folder.mkdir(parents=True)
            for i in range(count):
                width, height = _SIDES[i % len(_SIDES)]
                pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
                path = folder / f"{i:03d}.JPEG"
                Image.fromarray(pixels).save(path, quality=90)
                if part == "val":
                    val.append(path)
    return val


def _entry() -> object:
    torch.manual_seed(0)
    return from_timm("test_resnet", num_classes=2, pretrained_cfg_overlay=dict(_CFG))


def test_the_spec_is_timms_resolved_config() -> None:
    spec = _entry().input_spec
    assert spec == InputSpec((40, 40), _CFG["mean"], _CFG["std"], 0.8, "bicubic", "center")
    plain = InputSpec((32, 32), (0.5,) * 3, (0.5,) * 3)
    assert plain.image_transform() is None
    assert repr(plain) == "InputSpec(size=(32, 32), mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))"
    assert "crop_pct=0.8" in repr(spec)  # part of every activation's key


def test_a_timm_model_scores_as_in_timms_own_eval_pipeline(tmp_path: Path) -> None:
    _imagenet_folder(tmp_path)
    entry = _entry()
    data = load_split_folders(tmp_path, size=24, probe_size=32, workers=0)
    assert len(data.val) + len(data.test) == 12  # no test/: val/ cut in two
    ctx = StitchContext(Zoo([entry]), data, cache=ActivationCache(dtype="float32"))
    ours = ctx.activation(entry.name, None, "val")

    model = timm.create_model(
        "test_resnet", pretrained=False, num_classes=2, pretrained_cfg_overlay=dict(_CFG)
    )
    model.load_state_dict(entry.model.state_dict())
    model.eval()
    transform = create_transform(**resolve_data_config({}, model=model), is_training=False)
    images = torch.stack([transform(Image.open(p).convert("RGB")) for p in data.val.x.paths])
    with torch.no_grad():
        theirs = model(images)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    assert torch.equal(ours.argmax(1), theirs.argmax(1))


def test_uint8_arrays_go_through_the_transform_as_pil_images() -> None:
    spec = _entry().input_spec
    pixels = torch.randint(0, 256, (3, 3, 30, 50), dtype=torch.uint8)
    out = next(ArrayImages(pixels, 32).batches(8, transform=spec.image_transform()))
    reference = create_transform(**resolve_data_config({}, model=_entry().model), normalize=False)
    expected = torch.stack(
        [reference(Image.fromarray(p.permute(1, 2, 0).numpy())).float() / 255 for p in pixels]
    )
    assert out.shape == (3, 3, 40, 40) and out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("channels", [1, 3])
def test_float_images_go_through_the_transform_as_tensors(channels: int) -> None:
    spec = _entry().input_spec
    x = torch.rand(2, channels, 30, 50)
    out = spec.image_transform()(x.expand(-1, 3, -1, -1))
    assert out.shape == (2, 3, 40, 40)
    from stitch_nas.data._sources import transform_images

    assert transform_images(x, spec.image_transform()).shape == (2, 3, 40, 40)


def test_imagenet_is_read_from_its_files(tmp_path: Path) -> None:
    from stitch_nas.data import load_torchvision_dataset
    from stitch_nas.data._files import FileImages

    _imagenet_folder(tmp_path)
    wnids = {"n01440764": ("tench", "Tinca tinca"), "n01443537": ("goldfish",)}
    torch.save((wnids, []), tmp_path / "meta.bin")  # what ImageNet parses its devkit into
    data = load_torchvision_dataset("ImageNet", tmp_path, size=24, probe_size=32, workers=0)
    assert data.label_names == ("tench", "goldfish")
    assert all(isinstance(s.x, FileImages) for s in data.splits().values())
    assert (len(data.train), len(data.probe), len(data.val), len(data.test)) == (8, 32, 6, 6)
    assert next(data.val.batches(4)).shape == (4, 3, 24, 24)
    transform = _entry().input_spec.image_transform()
    assert next(data.val.batches(4, transform=transform)).shape == (4, 3, 40, 40)


def test_a_data_set_without_arrays_is_read_item_by_item() -> None:
    from torchvision.datasets import FakeData

    from stitch_nas.data._files import DatasetImages

    fake = FakeData(size=6, image_size=(3, 30, 50), num_classes=2, random_offset=1)
    images = DatasetImages(fake, range(6), [int(fake[i][1]) for i in range(6)], 16)
    part = images.rows(torch.tensor([1, 4]))
    assert next(part.batches(8)).shape == (2, 3, 16, 16)
    transform = _entry().input_spec.image_transform()
    reference = torch.stack([transform(fake[i][0].convert("RGB")) for i in (1, 4)]) / 255
    torch.testing.assert_close(next(part.batches(8, transform=transform)), reference)
    assert part.fingerprint() != images.fingerprint()
