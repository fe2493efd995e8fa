"""Tests of stitch_nas.zoo, .zoo_sources (sources, weight files, YAML items) and .mini_zoo."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import timm
import torch
import torchvision
from safetensors.torch import save_file
from torch import nn

import stitch_nas.zoo._mini as mz
from stitch_nas.data import DataSplits, load_digits_splits
from stitch_nas.errors import CacheError, ConfigError, DataError, UnknownModelError
from stitch_nas.settings import entry_from_settings
from stitch_nas.zoo import InputSpec, Zoo, ZooEntry
from stitch_nas.zoo._sources import (
    from_module,
    from_timm,
    from_torchvision,
    load_state_dict_file,
    sha256_file,
)

SPEC = InputSpec(size=(32, 32), mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
LABELS = tuple(str(i) for i in range(10))


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture(scope="module")
def resnet() -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model("test_resnet", pretrained=False, num_classes=10).eval()


# --- InputSpec, ZooEntry, Zoo -------------------------------------------------------------


def test_input_spec_preprocess() -> None:
    spec = InputSpec(size=[16, 16], mean=[0.5, 0.25, 0.0], std=[0.5, 0.25, 1.0])
    assert spec.size == (16, 16) and spec == InputSpec((16, 16), (0.5, 0.25, 0), (0.5, 0.25, 1))
    out = spec.preprocess(torch.ones(2, 3, 32, 32))
    assert out.shape == (2, 3, 16, 16)
    assert torch.allclose(out[:, 0], torch.ones(1)) and torch.allclose(out[:, 1], torch.tensor(3.0))
    x = torch.rand(1, 3, 16, 16)
    assert torch.allclose(spec.preprocess(x)[:, 2], x[:, 2])  # same size: no resampling
    with pytest.raises(ConfigError, match="std"):
        InputSpec(size=(8, 8), mean=(0, 0, 0), std=(1, 0, 1))


def test_zoo_lookup_and_duplicates(resnet: nn.Module) -> None:
    zoo = Zoo([ZooEntry("a", resnet, SPEC, LABELS, "user")])
    zoo.add(ZooEntry("b", resnet, SPEC, LABELS, "user"))
    assert zoo.names() == ["a", "b"] and list(zoo) == ["a", "b"] and len(zoo) == 2
    assert "a" in zoo and "zzz" not in zoo and zoo["b"].name == "b"
    with pytest.raises(UnknownModelError, match=r"'zzz'.*available: a, b") as info:
        zoo["zzz"]
    assert isinstance(info.value, KeyError) and "zoo.add" in str(info.value)
    with pytest.raises(ConfigError, match="'a' is already in the zoo"):
        zoo.add(ZooEntry("a", resnet, SPEC, LABELS, "user"))
    assert zoo.remove("a").name == "a" and zoo.names() == ["b"]


def test_entry_puts_model_in_eval_mode() -> None:
    model = nn.Sequential(nn.Flatten(), nn.Dropout(), nn.LazyLinear(10)).train()
    entry = ZooEntry("m", model, SPEC, range(10), "user")
    assert not model.training and entry.label_names == LABELS and entry.num_classes == 10


# --- weight files and sources -------------------------------------------------------------


def test_from_timm_loads_local_weight_files(tmp_path: Path, resnet: nn.Module) -> None:
    x = torch.rand(4, 3, 32, 32)
    expected = resnet(SPEC.preprocess(x))
    save_file(resnet.state_dict(), tmp_path / "w.safetensors")
    torch.save({"state_dict": resnet.state_dict()}, tmp_path / "w.pt")
    for path in (tmp_path / "w.safetensors", tmp_path / "w.pt"):
        entry = from_timm("test_resnet", weights=path, entry_name="r")
        assert entry.num_classes == 10  # read from the checkpoint's classifier
        assert entry.source == "timm:test_resnet" and len(entry.weights_sha256) == 64
        assert torch.equal(entry.model(SPEC.preprocess(x)), expected)
        assert entry.input_spec.mean == (0.5, 0.5, 0.5)
    random = from_timm("test_vit", num_classes=3, img_size=32, patch_size=4)
    assert random.input_spec.size == (32, 32) and random.label_names == ("0", "1", "2")


def test_from_timm_errors(tmp_path: Path, resnet: nn.Module) -> None:
    with pytest.raises(UnknownModelError, match=r"test_resnet.*timm.list_models"):
        from_timm("test_resnett")
    with pytest.raises(DataError, match="not found"):
        from_timm("test_resnet", weights=tmp_path / "nope.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00garbage")
    with pytest.raises(DataError, match="cannot read"):
        from_timm("test_resnet", weights=tmp_path / "bad.safetensors")
    save_file(resnet.state_dict(), tmp_path / "ok.safetensors")
    data = (tmp_path / "ok.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="cannot read"):
        from_timm("test_resnet", weights=tmp_path / "cut.safetensors")
    with pytest.raises(DataError, match="do not fit"):
        from_timm("test_convnext", weights=tmp_path / "ok.safetensors")
    with pytest.raises(ConfigError, match="only one"):  # refused before anything is read
        from_timm("test_resnet", weights=tmp_path / "ok.safetensors", pretrained=True)


def test_pickled_objects_are_refused(tmp_path: Path) -> None:
    torch.save({"weights": torch.zeros(1), "extra": Path("x")}, tmp_path / "evil.pt")
    with pytest.raises(DataError, match="cannot read"):
        load_state_dict_file(tmp_path / "evil.pt")
    torch.save({"epoch": 3}, tmp_path / "meta.pt")
    with pytest.raises(DataError, match="state dict of tensors"):
        load_state_dict_file(tmp_path / "meta.pt")


def _fake_hub_cache(root: Path, repo: str, state: dict) -> None:
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text("abc123")
    (repo_dir / "snapshots" / "abc123").mkdir(parents=True)
    save_file(state, repo_dir / "snapshots" / "abc123" / "model.safetensors")


def test_from_timm_pretrained_uses_local_cache_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    # pretrained=True here reads only the hub cache this test writes itself; offline mode makes
    # any attempt to reach the network fail instead of downloading
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "torch_hub"))
    with pytest.raises(CacheError, match=r"not in the local cache.*weights="):
        from_timm("test_resnet.r160_in1k", pretrained=True)
    torch.manual_seed(1)
    source = timm.create_model("test_resnet", pretrained=False)  # 1000 classes, as on the hub
    _fake_hub_cache(tmp_path / "hub", "timm/test_resnet.r160_in1k", source.state_dict())
    entry = from_timm("test_resnet.r160_in1k", pretrained=True, num_classes=10)
    loaded = entry.model.state_dict()
    assert torch.equal(loaded["conv1.0.weight"], source.state_dict()["conv1.0.weight"])
    assert loaded["fc.weight"].shape == (10, 96)  # fresh head for the new classes
    assert entry.input_spec.size == (160, 160)


def test_from_timm_pretrained_downloads_like_timm_unless_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "torch_hub"))
    create = timm.create_model
    torch.manual_seed(2)
    published = create("test_resnet", pretrained=False).state_dict()
    calls = []

    def no_network(name: str, pretrained: bool = False, **kwargs: Any) -> Any:
        if pretrained and "pretrained_cfg_overlay" not in kwargs:  # timm would download
            calls.append(name)
            raise LocalEntryNotFoundError("cannot reach the Hub")
        return create(name, pretrained=pretrained, **kwargs)

    monkeypatch.setattr(timm, "create_model", no_network)
    with pytest.raises(CacheError, match=r"could not download.*test_resnet.r160_in1k.*weights="):
        from_timm("test_resnet.r160_in1k", pretrained=True)
    assert calls == ["test_resnet.r160_in1k"]  # timm was asked to download it

    def download(name: str, pretrained: bool = False, **kwargs: Any) -> Any:
        if pretrained and "pretrained_cfg_overlay" not in kwargs:  # what timm's download does
            _fake_hub_cache(tmp_path / "hub", f"timm/{name}", published)
            return create(name, pretrained=False, **kwargs)  # nothing reaches the network
        return create(name, pretrained=pretrained, **kwargs)

    monkeypatch.setattr(timm, "create_model", download)
    entry = from_timm("test_resnet.r160_in1k", pretrained=True)
    assert torch.equal(entry.model.state_dict()["conv1.0.weight"], published["conv1.0.weight"])
    cached = tmp_path / "hub/models--timm--test_resnet.r160_in1k/snapshots/abc123"
    assert entry.weights_sha256 == sha256_file(cached / "model.safetensors")


def test_from_torchvision(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torchvision.models.get_model("mobilenet_v3_small", weights=None, num_classes=10)
    torch.save(model.eval().state_dict(), tmp_path / "mnv3.pth")
    entry = from_torchvision("mobilenet_v3_small", tmp_path / "mnv3.pth", entry_name="m")
    x = torch.rand(2, 3, 64, 64)
    assert entry.num_classes == 10 and entry.source == "torchvision:mobilenet_v3_small"
    assert torch.equal(entry.model(x), model(x))
    with pytest.raises(UnknownModelError, match="list_models"):
        from_torchvision("resnet19x", tmp_path / "mnv3.pth")


def test_from_module_with_checkpoint(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 2))
    save_file(model.state_dict(), tmp_path / "m.safetensors")
    fresh = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 2))
    spec = InputSpec((8, 8), (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    entry = from_module(
        "mine", fresh, checkpoint=tmp_path / "m.safetensors", input_spec=spec, label_names="ab"
    )
    assert _same_weights(entry.model, model) and entry.label_names == ("a", "b")
    with pytest.raises(DataError, match="do not fit"):
        from_module("bad", nn.Linear(2, 2), checkpoint=tmp_path / "m.safetensors",
                    input_spec=spec, label_names="ab")  # fmt: skip


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_weights_holding_nan_or_inf_are_the_file_s_fault(tmp_path: Path, bad: float) -> None:
    """Named at load, with the file and the tensor, not blamed later on the model's input
    normalisation once a trial measures NaN outputs."""
    from stitch_nas.errors import NonFiniteError

    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 2))
    state = model.state_dict()
    state["1.weight"][0, :3] = bad
    save_file(state, tmp_path / "m.safetensors")
    spec = InputSpec((8, 8), (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    with pytest.raises(NonFiniteError) as info:
        from_module("mine", model, checkpoint=tmp_path / "m.safetensors", input_spec=spec,
                    label_names="ab")  # fmt: skip
    message = str(info.value)
    assert str(tmp_path / "m.safetensors") in message and "'1.weight'" in message, message
    assert "3 NaN/Inf" in message and "normalisation" not in message, message


def test_entry_from_settings_timm_weights(tmp_path: Path, resnet: nn.Module) -> None:
    save_file(resnet.state_dict(), tmp_path / "r.safetensors")
    path = str(tmp_path / "r.safetensors")
    labels = list("abcdefghij")
    item = {"name": "r", "source": "timm", "model": "test_resnet", "weights": path}
    entry = entry_from_settings(item | {"img_size": 32, "label_names": labels})
    x = torch.rand(4, 3, 32, 32)
    assert entry.name == "r" and entry.source == "timm:test_resnet" and entry.num_classes == 10
    assert entry.label_names == tuple("abcdefghij") and entry.input_spec.size == (32, 32)
    assert entry.weights_sha256 is not None and _same_weights(entry.model, resnet)
    assert torch.equal(entry.logits(x), resnet(entry.input_spec.preprocess(x)))
    vit = entry_from_settings({"source": "timm", "model": "test_vit", "img_size": [32, 32]})
    assert vit.name == "test_vit" and vit.input_spec.size == (32, 32)
    assert vit.model(torch.zeros(1, 3, 32, 32)).shape == (1, 1000)  # img_size reached timm


def test_entry_from_settings_torchvision(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torchvision.models.get_model("mobilenet_v3_small", weights=None, num_classes=3)
    torch.save(model.eval().state_dict(), tmp_path / "m.pth")
    item = {"source": "torchvision", "model": "mobilenet_v3_small", "img_size": [48, 64]}
    entry = entry_from_settings(item | {"weights": str(tmp_path / "m.pth"), "num_classes": 3})
    assert entry.name == "mobilenet_v3_small" and entry.input_spec.size == (48, 64)
    x = torch.rand(2, 3, 48, 64)
    assert torch.equal(entry.model(x), model(x)) and entry.label_names == ("0", "1", "2")


@pytest.mark.parametrize(
    "item, match",
    [
        ({"source": "timm", "model": "test_resnet", "weight": "w.pt"}, r"unknown key 'weight'"),
        (
            {"source": "hf", "model": "test_resnet"},
            r"unknown zoo source 'hf'; available: module, timm, torchvision",
        ),
        ({"source": "torchvision", "model": "resnet18"}, r"missing key 'weights'"),
        ({"model": "test_resnet"}, r"missing key 'source'"),
        ({"source": "timm", "model": "test_resnet", "num_classes": "10"}, r"num_classes must be"),
        ({"source": "timm", "model": "test_resnet", "pretrained": "yes"}, r"pretrained must be"),
        ({"source": "timm", "model": "m", "weights": "w.pt", "pretrained": True}, "pretrained"),
        (["timm", "resnet18"], "must be a mapping"),
        ({"source": "module", "module": "pkg.mod", "input_size": 8}, r"module must be 'package"),
        ({"source": "module", "module": "a:b", "mean": [0, 0, 0]}, r"missing key 'input_size'"),
        ({"source": "timm", "model": "m", "std": [1, 0, 1]}, r"std must be 3 numbers > 0"),
        ({"source": "timm", "model": "m", "weights": "/no/such.pt"}, r"not an existing file"),
        ({"source": "timm", "model": "m", "weights": "$NO_SUCH_VAR/w.pt"}, r"\$NO_SUCH_VAR"),
        ({"source": "timm", "model": "m", "blocks": "layer1"}, r"blocks must be a non-empty list"),
    ],
)
def test_entry_from_settings_errors(item: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        entry_from_settings(item)  # type: ignore[arg-type]
    assert len(str(info.value).splitlines()) == 1


# --- mini zoo -------------------------------------------------------------------------------


def test_mini_zoo_contents_and_accuracy(mini_zoo: Zoo, digits: DataSplits) -> None:
    assert mini_zoo.names() == list(mz.MINI_ZOO_NAMES) and len(mz.MINI_ZOO_NAMES) >= 5
    params = set()
    for entry in mini_zoo.values():
        assert entry.source == "mini_zoo" and not entry.model.training
        assert entry.input_spec.size == (32, 32) and entry.label_names == digits.label_names
        accuracy = float((entry.logits(digits.val.x).argmax(1) == digits.val.y).float().mean())
        assert accuracy > 0.85, entry.name
        assert accuracy == pytest.approx(entry.info["val_accuracy"], abs=1e-6)
        params.add(entry.num_params)
    assert len(params) == len(mini_zoo)  # deliberately different sizes


def test_mini_zoo_vit_tokens(mini_zoo: Zoo) -> None:
    vit = mini_zoo["vit"].model
    tokens = vit.forward_features(torch.zeros(1, 3, 32, 32))
    assert tokens.shape[1] == 64 + 1


def test_mini_zoo_reload_is_fast_and_identical(
    mini_zoo: Zoo, mini_zoo_dir: Path, digits: DataSplits, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_training(*args: object) -> None:
        raise AssertionError("the reload trained a model")

    monkeypatch.setattr(mz, "_train", no_training)
    start = time.perf_counter()
    again = mz.load_mini_zoo(digits, cache_dir=mini_zoo_dir)
    assert time.perf_counter() - start < 5.0  # about 0.1 s unloaded; slack for busy machines
    for name in mini_zoo.names():
        assert _same_weights(again[name].model, mini_zoo[name].model)
        assert again[name].weights_sha256 == mini_zoo[name].weights_sha256
    manifest = json.loads((mini_zoo_dir / "mini_zoo" / "manifest.json").read_text())
    record = manifest["models"]["vit"]
    assert record["recipe"]["data_fingerprint"] == digits.fingerprint()
    assert {"sha256", "val_accuracy", "recipe", "num_params"} <= set(record)


@pytest.fixture
def zoo_copy(mini_zoo: Zoo, mini_zoo_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the session's cache, free to corrupt."""
    shutil.copytree(mini_zoo_dir / "mini_zoo", tmp_path / "mini_zoo")
    return tmp_path


def _count_training(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    trained: list[str] = []
    real = mz._train

    def counting(name: str, *args: object) -> nn.Module:
        trained.append(name)
        return real(name, *args)

    monkeypatch.setattr(mz, "_train", counting)
    return trained


def test_corrupt_file_rebuilds_that_model_only(
    zoo_copy: Path, mini_zoo: Zoo, digits: DataSplits, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    path = zoo_copy / "mini_zoo" / "efficientnet.safetensors"
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # one flipped bit in the weights: still a readable file, wrong sha256
    path.write_bytes(bytes(data))
    trained = _count_training(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="stitch_nas.zoo._mini"):
        zoo = mz.load_mini_zoo(digits, cache_dir=zoo_copy)
    assert trained == ["efficientnet"]
    assert "efficientnet.safetensors is corrupt" in caplog.text
    # training is deterministic, so the rebuild reproduces the original weights
    assert _same_weights(zoo["efficientnet"].model, mini_zoo["efficientnet"].model)
    assert len(list((zoo_copy / "mini_zoo").glob("*.tmp"))) == 0


def test_truncated_file_with_matching_sha_rebuilds(
    zoo_copy: Path, digits: DataSplits, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = zoo_copy / "mini_zoo"
    path = folder / "byobnet.safetensors"
    path.write_bytes(path.read_bytes()[:1000])
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["models"]["byobnet"]["sha256"] = mz.sha256_file(path)  # fool the sha check
    (folder / "manifest.json").write_text(json.dumps(manifest))
    trained = _count_training(monkeypatch)
    zoo = mz.load_mini_zoo(digits, cache_dir=zoo_copy, names=("byobnet", "resnet"))
    assert trained == ["byobnet"] and zoo.names() == ["byobnet", "resnet"]


def test_changed_data_rebuilds(zoo_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trained = _count_training(monkeypatch)
    other = load_digits_splits(seed=1)
    zoo = mz.load_mini_zoo(other, cache_dir=zoo_copy, names=("byobnet",))
    assert trained == ["byobnet"] and zoo["byobnet"].info["val_accuracy"] > 0.85


def test_interrupted_write_leaves_no_valid_looking_file(
    zoo_copy: Path, digits: DataSplits, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = zoo_copy / "mini_zoo"
    (folder / "byobnet.safetensors").unlink()

    def interrupted(src: str, dst: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("os.replace", interrupted)  # stitch_nas.files moves the file into place
    with pytest.raises(KeyboardInterrupt):
        mz.load_mini_zoo(digits, cache_dir=zoo_copy, names=("byobnet",))
    assert not (folder / "byobnet.safetensors").exists()
    assert not list(folder.glob("*.tmp"))


def test_mini_zoo_unknown_names() -> None:
    with pytest.raises(UnknownModelError, match="resnet, convnext"):
        mz.build_model("alexnet")
    with pytest.raises(UnknownModelError, match="available"):
        mz.load_mini_zoo(names=("nope",))
    assert sum(p.numel() for p in mz.build_model("vit").parameters()) > 0


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STITCH_NAS_CACHE", str(tmp_path))
    assert mz.default_cache_dir() == tmp_path
    monkeypatch.delenv("STITCH_NAS_CACHE")
    assert mz.default_cache_dir() == Path.home() / ".cache" / "stitch_nas"


# --- checkpoints as PyTorch loads them --------------------------------------------------


def _bn_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(2))


@pytest.fixture()
def bn_net() -> nn.Module:
    net = _bn_net()
    net(torch.zeros(1, 3, 8, 8))  # materialise the lazy layer
    return net.eval()


@pytest.mark.parametrize(
    "wrap",
    [
        lambda sd: {"net": sd, "acc": 92.9, "epoch": 180},
        lambda sd: {"state_dict": sd, "optimizer": {"lr": 0.1}},
        lambda sd: {"model": sd},
        lambda sd: {"checkpoint": 1, "model": {"state_dict": sd}},
        lambda sd: {f"module.{k}": v for k, v in sd.items()},
        lambda sd: {"net": {f"module.{k}": v for k, v in sd.items()}, "acc": 70.8},
    ],
)
def test_checkpoint_wrappers_and_prefixes(tmp_path: Path, bn_net: nn.Module, wrap) -> None:
    torch.save(wrap(bn_net.state_dict()), tmp_path / "c.pth")
    state = load_state_dict_file(tmp_path / "c.pth")
    assert set(state) == set(bn_net.state_dict())
    fresh = _bn_net()
    fresh(torch.zeros(1, 3, 8, 8))
    entry = from_module(
        "m", fresh, checkpoint=tmp_path / "c.pth", input_spec=SPEC, label_names="ab"
    )
    assert _same_weights(entry.model, bn_net)
    assert entry.weights_sha256 == hashlib.sha256((tmp_path / "c.pth").read_bytes()).hexdigest()


def _torch_accepts(state: dict) -> bool:
    model = _bn_net()
    model(torch.zeros(1, 3, 8, 8))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError:
        return False
    return True


@pytest.mark.parametrize("version", [None, 1, 2])
def test_missing_num_batches_tracked_as_strict_as_pytorch(
    tmp_path: Path, bn_net: nn.Module, version: int | None
) -> None:
    """Old BatchNorm checkpoints lack num_batches_tracked; PyTorch fills it in for module
    versions before 2 (and for a dict without version metadata), and refuses it otherwise."""
    state = bn_net.state_dict()
    metadata = dict(state._metadata)  # type: ignore[attr-defined]
    del state["1.num_batches_tracked"]
    if version is None:
        state = dict(state)  # a plain dict carries no version metadata
    else:
        metadata["1"] = {"version": version}
        state._metadata = metadata  # type: ignore[attr-defined]
    torch.save({"net": state, "epoch": 1}, tmp_path / "old.pth")
    accepted = _torch_accepts(torch.load(tmp_path / "old.pth", weights_only=True)["net"])
    assert accepted == (version != 2)  # PyTorch's own rule, checked so this test can fail
    fresh = _bn_net()
    fresh(torch.zeros(1, 3, 8, 8))
    if accepted:
        entry = from_module("m", fresh, checkpoint=tmp_path / "old.pth", input_spec=SPEC,
                            label_names="ab")  # fmt: skip
        assert torch.equal(entry.model[1].running_mean, bn_net[1].running_mean)
    else:
        with pytest.raises(DataError, match=r"1 missing.*num_batches_tracked"):
            from_module("m", fresh, checkpoint=tmp_path / "old.pth", input_spec=SPEC,
                        label_names="ab")  # fmt: skip


def test_legacy_non_zip_checkpoint_loads(tmp_path: Path, bn_net: nn.Module) -> None:
    torch.save(bn_net.state_dict(), tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    assert _same_weights(
        from_module("m", _loaded_bn(), checkpoint=tmp_path / "legacy.pth", input_spec=SPEC,
                    label_names="ab").model, bn_net,
    )  # fmt: skip


def _loaded_bn() -> nn.Module:
    net = _bn_net()
    net(torch.zeros(1, 3, 8, 8))
    return net


def test_extra_and_missing_keys_are_one_line(tmp_path: Path, bn_net: nn.Module) -> None:
    state = bn_net.state_dict() | {"extra.weight": torch.zeros(1)}
    torch.save(state, tmp_path / "x.pth")
    with pytest.raises(DataError, match=r"0 missing, 1 unexpected.*extra.weight") as info:
        from_module("m", _loaded_bn(), checkpoint=tmp_path / "x.pth", input_spec=SPEC,
                    label_names="ab")  # fmt: skip
    assert len(str(info.value).splitlines()) == 1


# --- zoo entries from YAML items of the user's own modules ------------------------------


def _write_package(root: Path) -> None:
    (root / "mynets").mkdir(parents=True)
    (root / "mynets" / "__init__.py").write_text("")
    (root / "mynets" / "small.py").write_text(
        "import torch.nn as nn\n"
        "def tiny(width=4, classes=3):\n"
        "    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width),\n"
        "                         nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(width, width, 3,\n"
        "                         padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),\n"
        "                         nn.Linear(width, classes))\n"
    )


def test_module_source_from_settings(tmp_path: Path) -> None:
    _write_package(tmp_path / "code")
    sys.path.insert(0, str(tmp_path / "code"))
    try:
        from mynets.small import tiny  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path / "code"))
    torch.manual_seed(3)
    reference = tiny(width=6).eval()
    torch.save({"net": reference.state_dict(), "acc": 1.0}, tmp_path / "w.pth")
    item = {
        "name": "mine",
        "source": "module",
        "module": "mynets.small:tiny",
        "module_path": "code",
        "kwargs": {"width": 6},
        "weights": "w.pth",
        "input_size": 16,
        "mean": [0.5, 0.5, 0.5],
        "std": [0.25, 0.25, 0.25],
        "blocks": ["3", "5"],
    }
    entry = entry_from_settings(item, ("a", "b", "c"), base=tmp_path)
    assert entry.label_names == ("a", "b", "c") and entry.input_spec.size == (16, 16)
    assert entry.input_spec.std == (0.25, 0.25, 0.25) and entry.source == "module:mynets.small:tiny"
    assert _same_weights(entry.model, reference)
    assert entry.weights_sha256 == hashlib.sha256((tmp_path / "w.pth").read_bytes()).hexdigest()
    from stitch_nas.fragments import cut_points

    cuts = cut_points(entry.model, input_shape=(1, 3, 16, 16))
    assert [c.name for c in cuts] == ["3", "5"]  # the declared blocks, nothing else
    with pytest.raises(
        ConfigError, match=r"maps a 1x3x16x16 input to shape \(1, 3\), not \(1, 2\)"
    ):
        entry_from_settings(item, ("a", "b"), base=tmp_path)
    with pytest.raises(ConfigError, match=r"cannot import module 'nosuch'.*module_path"):
        entry_from_settings(item | {"module": "nosuch:tiny"}, ("a", "b", "c"), base=tmp_path)
    with pytest.raises(ConfigError, match=r"has no 'huge'"):
        entry_from_settings(item | {"module": "mynets.small:huge"}, ("a", "b", "c"), base=tmp_path)
    with pytest.raises(ConfigError, match=r"fix kwargs"):
        entry_from_settings(item | {"kwargs": {"depth": 3}}, ("a", "b", "c"), base=tmp_path)
