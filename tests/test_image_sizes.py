"""No model is fed upsampled images unless asked: ``data.size`` follows the zoo when left out,
and a zoo whose models take larger inputs than the data hold is refused before any trial, in
one line naming the model and the fix (``stitch-nas search`` exits 2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from stitch_nas.cli import main
from stitch_nas.data import load_digits_splits, load_npz_splits
from stitch_nas.errors import DataError
from stitch_nas.pipeline import check_image_sizes, data_size
from stitch_nas.settings import settings_from_dict
from stitch_nas.zoo import InputSpec, Zoo, from_module


def _npz(root: Path, side: int = 32) -> dict:
    """A small uint8 data set of ``side``-px images in one file, as npz splits."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (120, side, side, 3), dtype=np.uint8)
    np.savez(root / "set.npz", x=x, y=np.arange(120) % 2)
    runs = {"train": (0, 40), "probe": (40, 32), "val": (72, 24), "test": (96, 24)}
    return {k: {"file": "set.npz", "start": s, "count": c} for k, (s, c) in runs.items()}


def _entry(side: int) -> object:
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(2))
    spec = InputSpec((side, side), (0.5,) * 3, (0.5,) * 3)
    return from_module(f"m{side}", model, input_spec=spec, label_names=("0", "1"))


def test_data_size_follows_the_zoo_when_left_out() -> None:
    def settings(size: object, *models: dict) -> object:
        data = {} if size is None else {"size": size}
        return settings_from_dict({"zoo": {"models": list(models)}, "data": data})

    module = {"source": "module", "module": "a:b", "input_size": [48, 64], "mean": [0] * 3}
    module["std"] = [1] * 3
    timm_item = {"source": "timm", "model": "test_resnet"}  # its pretrained_cfg: 160 px
    assert data_size(settings(None)) == 32  # the mini zoo alone: its size
    assert data_size(settings(None, module)) == 64
    assert data_size(settings(None, module, timm_item)) == 160
    assert data_size(settings(40, module, timm_item)) == 40  # as given


def test_a_model_larger_than_the_data_is_refused(tmp_path: Path) -> None:
    splits = _npz(tmp_path)
    for split in splits.values():
        split["file"] = str(tmp_path / split["file"])
    small = load_npz_splits(splits, size=64)  # stored at 32: asked 64, still 32 underneath
    assert small.stored_side == 32
    with pytest.raises(DataError, match=r"model 'm64' takes 64x64 images but the data's are 32"):
        check_image_sizes(Zoo([_entry(32), _entry(64)]), small)
    check_image_sizes(Zoo([_entry(64)]), small, upsample=True)  # asked for
    check_image_sizes(Zoo([_entry(16), _entry(32)]), small)  # shrinking is fine
    digits = load_digits_splits(size=32)
    assert digits.stored_side == 32  # made at the asked size: the mini zoo's data
    with pytest.raises(DataError, match=r"data.upsample: true"):
        check_image_sizes(Zoo([_entry(48)]), digits)


def test_the_cli_refuses_upsampled_data_before_any_trial(tmp_path: Path, capsys) -> None:
    _npz(tmp_path)
    splits = "\n".join(
        f"    {k}: {{file: set.npz, start: {s}, count: {c}}}"
        for k, (s, c) in {"train": (0, 40), "probe": (40, 32), "val": (72, 24)}.items()
    )
    (tmp_path / "run.yaml").write_text(
        "zoo:\n  mini_zoo: false\n  models:\n"
        "    - {source: timm, model: test_resnet, num_classes: 2}\n"
        f"data:\n  kind: npz\n  splits:\n{splits}\n"
        "    test: {file: set.npz, start: 96, count: 24}\n"
        "search: {trials: 2, export: false}\n"
    )
    out = tmp_path / "out"
    capsys.readouterr()
    code = main(["search", str(tmp_path / "run.yaml"), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "'test_resnet' takes 160x160 images but the data's are 32 px" in err
    assert not out.exists()  # refused before the study was made
