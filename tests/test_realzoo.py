"""The ten real CIFAR-10 models of ../shared/realzoo through the public paths: checkpoints as
published, cut points, MACs against FlopCounterMode, and the examples/realzoo.yaml preset.

Nothing is copied from that folder (it has no licence); the tests read it where it is, or where
$REALZOO points, and skip with the reason when it is absent.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

import pytest
import torch
import yaml

from stitch_nas.fragments import count_macs_by_operator, count_macs_reference, cut_points, split
from stitch_nas.settings import entry_from_settings, load_settings

ROOT = Path(__file__).resolve().parents[1]
REALZOO = Path(os.environ.get("REALZOO") or ROOT.parent / "shared" / "realzoo")
PRESET = ROOT / "examples" / "realzoo.yaml"
SHAPE = (1, 3, 32, 32)

pytestmark = pytest.mark.skipif(
    not (REALZOO / "archs.py").is_file() or not (REALZOO / "weights").is_dir(),
    reason=f"realzoo not found at {REALZOO} (set REALZOO to the folder)",
)


@pytest.fixture(scope="module")
def realzoo():
    """realzoo's own zoo.py (the reference loader), imported from the folder."""
    spec = importlib.util.spec_from_file_location("realzoo_reference", REALZOO / "zoo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def settings(monkeypatch_module):
    monkeypatch_module.setenv("REALZOO", str(REALZOO))
    return load_settings(PRESET)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def entries(settings):
    labels = tuple(settings.data.label_names)
    return {item["name"]: entry_from_settings(item, labels) for item in settings.zoo.models}


def test_all_ten_published_checkpoints_load_from_the_preset(entries, realzoo) -> None:
    assert sorted(entries) == sorted(realzoo.MODELS)
    x, _ = realzoo.load_cifar10("test")
    for name, entry in entries.items():
        facts = realzoo.MODELS[name]
        # sha256 of the file as published: the {'net': ...} wrappers, 'module.' prefixes and
        # legacy CUDA pickles were read with weights_only=True, nothing re-saved
        assert entry.weights_sha256 == facts["sha256"], name
        assert entry.input_spec.mean == tuple(facts["mean"]), name
        reference = realzoo.build(name)
        with torch.no_grad():
            ours = entry.logits(torch.from_numpy(x[:32]).permute(0, 3, 1, 2).float() / 255)
            theirs = reference(realzoo.preprocess(x[:32], name))
        assert torch.allclose(ours, theirs, atol=1e-5), name
        assert sum(p.numel() for p in entry.model.parameters()) == facts["params"], name


def test_checkpoint_hash_is_of_the_file(entries) -> None:
    path = REALZOO / "weights" / "fattorib_resnet20.pth"
    assert (
        entries["fattorib_resnet20"].weights_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    )


def test_cut_points_of_every_family(entries) -> None:
    names = {
        n: [c.name for c in cut_points(e.model, input_shape=SHAPE)] for n, e in entries.items()
    }
    # the all-conv CNN: after every ReLU (2, 5, 9, 12, 16) and pool (6, 13) of ConvPart
    assert {f"ConvPart.{i}" for i in (2, 5, 6, 9, 12, 13, 16)} <= set(names["zenvi_allconv6"])
    # the tail-down ResNets add the skip in the stage's forward: cut between blocks anyway,
    # as many cuts as the standard ResNet-20 at depth 20, two more per stage per depth step
    assert len(names["fattorib_resnet20"]) == len(names["zlatasm_resnet20"]) == 11
    for depth, n in ((20, 3), (32, 5), (44, 7), (56, 9)):
        cuts = names[f"fattorib_resnet{depth}"]
        assert len(cuts) == 2 + 3 * n, (depth, cuts)
        for stage in ("first_block", "second_block", "third_block"):
            assert stage in cuts
            assert [f"{stage}.residual_block.{i}" for i in range(n - 1)] == [
                c for c in cuts if c.startswith(f"{stage}.")
            ]
    assert names["amebett1_vit_tiny"][2:8] == [f"encoders.{i}" for i in range(6)]
    shapes = {
        c.name: c.shape for c in cut_points(entries["fattorib_resnet56"].model, input_shape=SHAPE)
    }
    assert shapes["first_block.residual_block.7"] == (16, 32, 32)
    assert shapes["first_block"] == (32, 16, 16) and shapes["third_block"] == (64, 8, 8)


@pytest.mark.slow  # about 100 cuts, each traced twice: 40-120 s
def test_prefix_then_suffix_is_the_model_at_every_cut(entries) -> None:
    x = torch.randn(2, 3, 32, 32)
    for name, entry in entries.items():
        with torch.no_grad():
            reference = entry.model(x)
            for cut in cut_points(entry.model, input_shape=SHAPE):
                head, tail = split(entry.model, cut, input_shape=SHAPE)
                assert torch.equal(tail(head(x)), reference), (name, cut.name)


def test_macs_match_flop_counter_on_every_model(entries) -> None:
    """FlopCounterMode counts 2 FLOPs per multiply-add and no norms or pooling; fvcore (ours)
    counts 1 per multiply-add. Without the norm and pooling ops the two must agree exactly, the
    ViT's nn.MultiheadAttention fast path (aten::_native_multi_head_attention) included."""
    fvcore_only = {"batch_norm", "layer_norm", "adaptive_avg_pool2d"}
    for name, entry in entries.items():
        ops = count_macs_by_operator(entry.model, SHAPE, strict=True)
        ours = sum(n for op, n in ops.items() if op not in fvcore_only)
        assert ours == count_macs_reference(entry.model, SHAPE), (name, ops)
    vit_ops = count_macs_by_operator(entries["amebett1_vit_tiny"].model, SHAPE, strict=True)
    assert vit_ops["_native_multi_head_attention"] > 0


def _tiny_preset(tmp_path: Path, models: list[str] | None) -> Path:
    config = yaml.safe_load(PRESET.read_text())
    if models is not None:
        config["zoo"]["models"] = [m for m in config["zoo"]["models"] if m["name"] in models]
    splits = config["data"]["splits"]
    splits["probe"]["count"] = 32
    splits["train"] |= {"start": 32, "count": 64}
    splits["val"]["count"] = 64
    splits["test"] |= {"start": 64, "count": 64}
    config["search"] |= {"trials": 2, "export": False, "seed_trials": 2, "seed_pool": 8}
    config["search"] |= {"refine_trials": 1}  # each refine adapter once, on one network
    path = tmp_path / "realzoo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow  # all ten models: about a minute on two busy cores
def test_the_preset_runs_on_a_tiny_slice(tmp_path: Path, monkeypatch_module) -> None:
    from stitch_nas.cli._main import main

    monkeypatch_module.setenv("REALZOO", str(REALZOO))
    out = tmp_path / "out"
    assert main(["search", str(_tiny_preset(tmp_path, None)), "--out", str(out), "-q"]) == 0
    assert (out / "pareto.json").is_file()


@pytest.mark.slow  # 15-45 s
def test_three_models_of_the_preset_run_on_a_tiny_slice(tmp_path: Path, monkeypatch_module) -> None:
    from stitch_nas.cli._main import main

    monkeypatch_module.setenv("REALZOO", str(REALZOO))
    yaml_file = _tiny_preset(tmp_path, ["zlatasm_resnet20", "fattorib_resnet20", "yuebk_lenet5_bn"])
    out = tmp_path / "out"
    assert main(["search", str(yaml_file), "--out", str(out), "-q"]) == 0
    assert (out / "pareto.json").is_file()
