"""The zoo and data sections of a search file: every source and data kind, checked while
parsing (before torch loads), and a search run from YAML alone on split folders."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from stitch_nas.errors import ConfigError
from stitch_nas.settings import load_settings, settings_from_dict

ROOT = Path(__file__).resolve().parents[1]


def _npz(path: Path, n: int) -> None:
    y = np.repeat(np.arange(4), n // 4)
    np.savez(path, x=np.zeros((n, 8, 8, 3), np.uint8), y=y.astype(np.int64))


def _npz_config(folder: Path, **changes) -> dict:
    splits = {
        "probe": {"file": "a.npz", "count": 32},
        "train": {"file": "a.npz", "start": 32},
        "val": {"file": "b.npz", "count": 20},
        "test": {"file": "b.npz", "start": 20},
    }
    data = {"kind": "npz", "root": str(folder), "splits": splits} | changes
    return {"zoo": {"mini_zoo": True}, "data": data}


@pytest.fixture()
def npz_root(tmp_path: Path) -> Path:
    _npz(tmp_path / "a.npz", 100)
    _npz(tmp_path / "b.npz", 40)
    return tmp_path


def test_npz_settings_resolve_files_and_rows(npz_root: Path) -> None:
    settings = settings_from_dict(_npz_config(npz_root))
    data = settings.data
    assert data.splits["train"] == {"file": str(npz_root / "a.npz"), "start": 32, "count": 68}
    assert data.splits["test"]["count"] == 20
    # what a study stores (and `stitch-nas export` parses again) is the same configuration
    again = settings_from_dict(json.loads(json.dumps(asdict(settings))))
    assert asdict(again) == asdict(settings)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"kind": "arrays"}, r"data.kind: unknown data kind 'arrays'; available: digits, "),
        ({"name": "CIFAR10"}, r"data.name is not read by data.kind 'npz'"),
        ({"splits": {"train": {"file": "a.npz"}}}, r"must map each of train, probe, val, test"),
        ({"x_key": "images"}, r"has no array 'images' \(it has x, y\)"),
        ({"root": "/no/such/folder"}, r"data.root .*/no/such/folder. is not an existing folder"),
        ({"root": "$NO_SUCH_ROOT"}, r"\$NO_SUCH_ROOT in '\$NO_SUCH_ROOT' is not set"),
    ],
)
def test_npz_settings_errors(npz_root: Path, changes: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        settings_from_dict(_npz_config(npz_root, **changes))
    assert len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize(
    "split, spec, match",
    [
        ("val", {"file": "b.npz", "count": 30}, r"data.splits.test and data.splits.val overlap"),
        ("test", {"file": "b.npz", "start": 20, "count": 30}, r"rows 20..49 but b.npz has 40"),
        ("probe", {"file": "a.npz", "count": 8}, r"probe has 8 images; use 32 to 8192"),
        ("val", {"file": "c.npz"}, r"data.splits.val.file .*c.npz' does not exist"),
        ("val", {"file": "b.npz", "stop": 3}, r"must be \{file: x.npz, start: 0, count: N\}"),
        ("val", {"file": "b.npz", "count": 0}, r"count must be an int >= 1 or null"),
    ],
)
def test_npz_split_errors(npz_root: Path, split: str, spec: dict, match: str) -> None:
    config = _npz_config(npz_root)
    config["data"]["splits"][split] = spec
    with pytest.raises(ConfigError, match=match):
        settings_from_dict(config)


def test_data_keys_of_other_kinds(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data.splits is not read by data.kind 'digits'"):
        settings_from_dict({"data": {"kind": "digits", "splits": {"val": {}}}})
    with pytest.raises(ConfigError, match=r"needs data.root"):
        settings_from_dict({"data": {"kind": "image_folder"}})
    for split in ("train", "val", "test"):
        (tmp_path / split).mkdir()
    with pytest.raises(ConfigError, match=r"set data.split_folders: true"):
        settings_from_dict({"data": {"kind": "image_folder", "root": str(tmp_path)}})
    (tmp_path / "val").rmdir()  # test/ may be missing (ImageNet's layout), val/ not
    with pytest.raises(ConfigError, match=r"has no val/ folder"):
        settings_from_dict(
            {"data": {"kind": "image_folder", "root": str(tmp_path), "split_folders": True}}
        )
    with pytest.raises(ConfigError, match=r"needs data.name"):
        settings_from_dict({"data": {"kind": "torchvision", "root": str(tmp_path)}})


def test_paths_start_at_the_yaml_file_and_take_variables(
    npz_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _npz_config(npz_root)
    config["data"]["root"] = "${DATA_HOME:-data}"
    folder = npz_root / "configs"
    (folder / "data").mkdir(parents=True)
    for name in ("a.npz", "b.npz"):
        (npz_root / name).rename(folder / "data" / name)
    (folder / "run.yaml").write_text(yaml.safe_dump(config))
    assert load_settings(folder / "run.yaml").data.root == str(folder / "data")
    monkeypatch.setenv("DATA_HOME", str(folder / "data"))
    assert load_settings(folder / "run.yaml").data.root == str(folder / "data")
    monkeypatch.setenv("DATA_HOME", str(npz_root / "elsewhere"))
    with pytest.raises(ConfigError, match="elsewhere' is not an existing folder"):
        load_settings(folder / "run.yaml")


def test_zoo_items_are_checked_while_parsing(tmp_path: Path) -> None:
    item = {"name": "a", "source": "module", "module": "m:f", "input_size": 8}
    with pytest.raises(ConfigError, match=r"zoo.models item 'a': missing key 'mean'"):
        settings_from_dict({"zoo": {"models": [item]}})
    full = item | {"mean": [0, 0, 0], "std": [1, 1, 1], "module_path": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"two models named 'a'"):
        settings_from_dict({"zoo": {"models": [full, full]}})
    with pytest.raises(ConfigError, match=r"unknown key 'checkpoint'; valid keys for source"):
        settings_from_dict({"zoo": {"models": [full | {"checkpoint": "x.pt"}]}})


def test_parsing_the_realzoo_preset_loads_no_torch() -> None:
    """The CLI answers a bad file before torch loads, so parsing must not import it."""
    code = (
        "import sys; from stitch_nas.settings import settings_from_dict; "
        "from stitch_nas.errors import ConfigError\n"
        "try:\n"
        "    settings_from_dict({'zoo': {'models': [{'source': 'module', 'module': 'a:b'}]}})\n"
        "except ConfigError as e:\n"
        "    print(e)\n"
        "settings_from_dict({'data': {'kind': 'digits'}})\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "missing key 'input_size'" in run.stdout


# --- a search from YAML alone: a zoo of the user's own modules on split folders ----------

_NETS = """
import torch.nn as nn

def net(width=8, classes=2):
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes))
"""


def _folders(root: Path) -> None:
    rng = np.random.default_rng(0)
    for split, count in (("train", 40), ("val", 10), ("test", 10)):
        for label, cls in enumerate(("cat", "dog")):
            (root / split / cls).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, size=(12, 12, 3), dtype=np.uint8)
                pixels[..., label] = 255
                Image.fromarray(pixels).save(root / split / cls / f"{i}.png")


def test_search_from_yaml_on_split_folders(tmp_path: Path) -> None:
    from stitch_nas.cli._main import main

    _folders(tmp_path / "pets")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "folder_nets.py").write_text(_NETS)
    model = {"source": "module", "module": "folder_nets:net", "module_path": "code",
             "input_size": 16}  # fmt: skip

    # written out for each model: a list shared by two would be dumped as an alias, which the
    # settings loader refuses
    def norm() -> dict[str, list[float]]:
        return {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}

    config = {
        "zoo": {
            "mini_zoo": False,
            "models": [
                model | norm() | {"name": "narrow", "kwargs": {"width": 4}},
                model | norm() | {"name": "wide", "kwargs": {"width": 8}},
            ],
        },
        "data": {
            "kind": "image_folder",
            "root": "pets",
            "split_folders": True,
            "size": 16,
            "upsample": True,  # the pictures are 12 px: fed to 16-px models on purpose
            "probe_size": 32,
        },  # fmt: skip
        # untrained models: every stitch is at chance, so none may be probe-pruned
        "search": {"trials": 3, "export": False, "cka_threshold": 0.0, "probe_threshold": 0.0},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    code = main(["search", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "out"), "-q"])
    assert code == 0
    assert (tmp_path / "out" / "pareto.json").is_file()


def test_example_files_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for folder in ("code", "weights", "pets/train", "pets/val", "pets/test", "tv"):
        (tmp_path / folder).mkdir(parents=True)
    for name in ("my_cnn.pth", "resnet18_pets.safetensors", "resnet18_cifar10.pth",
                 "vit_tiny_cifar10.safetensors"):  # fmt: skip
        (tmp_path / "weights" / name).write_bytes(b"")
    monkeypatch.setenv("MY_CODE", str(tmp_path / "code"))
    monkeypatch.setenv("MY_WEIGHTS", str(tmp_path / "weights"))
    monkeypatch.setenv("MY_DATA", str(tmp_path / "pets"))
    monkeypatch.setenv("TORCHVISION_DATA", str(tmp_path / "tv"))
    pets = load_settings(ROOT / "examples" / "image_folder.yaml")
    assert pets.data.split_folders and pets.zoo.models[0]["module_path"] == str(tmp_path / "code")
    assert pets.zoo.models[1]["input_size"] == 64
    cifar = load_settings(ROOT / "examples" / "torchvision_data.yaml")
    assert cifar.data.root == str(tmp_path / "tv") and cifar.zoo.models[1]["img_size"] == 32
