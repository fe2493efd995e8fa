"""Export and load: the loaded network is the measured one, files are checked, nothing half-made."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import pytest
import torch

from stitch_nas import errors, load
from stitch_nas.activations import StitchContext
from stitch_nas.config import AdapterSpec, Fragment, HeadSpec, StitchConfig
from stitch_nas.export import (
    ElasticNet,
    ExportedNet,
    ExportItem,
    export_elastic,
    export_network,
    export_study,
    select_trials,
)
from stitch_nas.files import sha256_file
from stitch_nas.fragments import count_macs, count_params
from stitch_nas.stitching import measure, reproduces
from stitch_nas.zoo import Zoo, ZooEntry

CONFIGS = {
    "grid": StitchConfig(
        (Fragment("efficientnet", None, "bn1"), Fragment("byobnet", "stages.0.0", None)),
        (AdapterSpec("lstsq"),),
    ),
    "fused": StitchConfig(
        (Fragment("resnet", None, "layer1.0"), Fragment("convnext", "stages.1.blocks.0", None)),
        (AdapterSpec("lstsq", {"fuse": True}),),
    ),
    "chain": StitchConfig(
        (
            Fragment("resnet", None, "layer1.0"),
            Fragment("efficientnet", "blocks.2.0", "blocks.3.0"),
            Fragment("byobnet", "stages.2.0", None),
        ),
        (AdapterSpec("lstsq"), AdapterSpec("lstsq", {"fuse": True})),
    ),
    "tokens_knn": StitchConfig(
        (Fragment("vit", None, "blocks.1"), Fragment("vit", "blocks.2", "blocks.3")),
        (AdapterSpec("lstsq"),),
        HeadSpec("knn"),
    ),
    "linear_probe": StitchConfig(
        (
            Fragment("resnet", None, "layer1.0"),
            Fragment("efficientnet", "blocks.2.0", "blocks.3.0"),
        ),
        (AdapterSpec("lstsq"),),
        HeadSpec("linear_probe"),
    ),
    # a trained adapter across architectures, with a fine-tuned copy of the ViT suffix
    "trained_cnn_to_vit": StitchConfig(
        (Fragment("resnet", None, "layer2.0"), Fragment("vit", "blocks.1", None)),
        (
            AdapterSpec(
                "linear", {"steps": 30, "eval_every": 10, "loss": "task", "train": "suffix"}
            ),
        ),
    ),
}


@pytest.fixture(scope="module")
def ctx(mini_zoo, digits):
    return StitchContext(mini_zoo, digits)


@pytest.fixture(scope="module")
def items(ctx):
    out = {}
    for name, config in CONFIGS.items():
        _, m = measure(ctx, config)
        out[name] = ExportItem(f"trial_{len(out)}", config, m.to_dict(), len(out))
    return out


@pytest.fixture(scope="module")
def exported(ctx, items, tmp_path_factory):
    dest = tmp_path_factory.mktemp("exports")
    formats = ["safetensors", "pt2", "onnx"]
    return {name: export_network(ctx, item, dest, formats=formats) for name, item in items.items()}


def _in_memory(ctx, item) -> ExportedNet:
    from stitch_nas.stitching import fit_net_head

    net, _ = measure(ctx, item.config)
    return ExportedNet(net, fit_net_head(ctx, net), tuple(ctx.data.label_names))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_loaded_network_equals_the_measured_one(ctx, items, exported, name):
    folder = exported[name]
    loaded = load(folder)
    x = ctx.split("val").x[:64]
    with torch.no_grad():
        expected = _in_memory(ctx, items[name])(x)
        got = loaded(x)
    assert (got - expected).abs().max() <= 1e-5
    meta = json.loads((folder / "meta.json").read_text())
    assert count_params(loaded.net) == meta["metrics"]["params"]
    assert count_macs(loaded.net, (1, 3, 32, 32)) == meta["metrics"]["macs"]
    # the loaded network's own accuracy on the whole validation split is the one the trial recorded
    # (within the tolerance export itself accepts: exact with float32 activation storage)
    val = ctx.split("val")
    with torch.no_grad():
        val_correct = int((loaded(val.x).argmax(1) == ctx.labels("val")).sum())
    val_acc = val_correct / len(val.x)
    assert meta["metrics"]["accuracy"] == items[name].metrics["accuracy"]
    assert reproduces(ctx, val_acc, meta["metrics"]["accuracy"]), (val_acc, meta["metrics"])
    assert set(meta["files"]) >= {"model.safetensors", "stitch.json", "model.onnx", "model.pt2"}
    # the held-out figure is the loaded network's own accuracy on the whole test split
    test = ctx.split("test")
    with torch.no_grad():
        test_acc = int((loaded(test.x).argmax(1) == ctx.labels("test")).sum()) / len(test.x)
    m = meta["metrics"]
    # the recorded figure read the prefix from the float16 cache, the loaded network runs in
    # float32: a near-tie may flip one image (reproduces' rule, as for validation above)
    assert reproduces(ctx, test_acc, m["test_accuracy"], "test"), (test_acc, m["test_accuracy"])
    assert (m["val_images"], m["test_images"]) == (len(ctx.labels("val")), len(test.x))
    for acc, (low, high) in ((m["accuracy"], m["accuracy_interval"]),
                             (m["test_accuracy"], m["test_accuracy_interval"])):  # fmt: skip
        assert low <= acc <= high and low < high


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_program_and_onnx_match_the_network_at_any_batch(ctx, exported, name):
    ort = pytest.importorskip("onnxruntime")
    folder = exported[name]
    program = torch.export.load(str(folder / "model.pt2")).module()
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    for batch in (1, 7):  # exported from a batch of two: the batch dimension is dynamic
        x = ctx.split("val").x[:batch]
        with torch.no_grad():
            expected = load(folder)(x)
            assert (program(x) - expected).abs().max() <= 1e-5
        (onnx_out,) = session.run(None, {"images": x.numpy()})
        assert abs(onnx_out - expected.numpy()).max() <= 1e-4
    notes = json.loads((folder / "meta.json").read_text())["format_notes"]
    assert notes["onnx"].startswith("dynamo exporter") and "onnxruntime agrees" in notes["onnx"]


def test_torchscript_is_written_only_when_asked_for(ctx, items, exported, tmp_path):
    assert not (exported["grid"] / "model.pt").exists()
    folder = export_network(ctx, items["grid"], tmp_path, formats=["torchscript"])
    x = ctx.split("val").x[:5]
    with torch.no_grad():
        expected = load(folder)(x)
    assert (torch.jit.load(str(folder / "model.pt"))(x) - expected).abs().max() <= 1e-5


def test_onnx_falls_back_to_the_torchscript_exporter_where_torch_export_refuses(
    ctx, items, tmp_path, monkeypatch
):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")

    def refuse(*args, **kwargs):
        raise RuntimeError("data-dependent control flow")

    monkeypatch.setattr(torch.export, "export", refuse)
    folder = export_network(ctx, items["grid"], tmp_path, formats=["pt2", "onnx"])
    meta = json.loads((folder / "meta.json").read_text())
    assert "pt2" in meta["formats_failed"] and not (folder / "model.pt2").exists()
    note = meta["format_notes"]["onnx"]
    assert note.startswith("TorchScript-based exporter") and "data-dependent" in note
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    x = ctx.split("val").x[:3]
    with torch.no_grad():
        expected = load(folder)(x).numpy()
    assert abs(session.run(None, {"images": x.numpy()})[0] - expected).max() <= 1e-4


def test_a_graph_that_fixed_the_batch_size_is_refused(ctx, items, tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from stitch_nas.export import _traced

    def static(module, x, programs):  # as if the batch dimension had not been made dynamic
        return programs.setdefault(id(module), torch.export.export(module, (x,), strict=False))

    monkeypatch.setattr(_traced, "_program", static)
    folder = export_network(ctx, items["grid"], tmp_path, formats=["pt2", "onnx"])
    meta = json.loads((folder / "meta.json").read_text())
    assert "does not run at batch 1" in meta["formats_failed"]["pt2"]
    assert "onnx" in meta["formats_failed"], meta["format_notes"]
    assert not (folder / "model.pt2").exists() and not (folder / "model.onnx").exists()


def test_loaded_accuracy_is_the_recorded_accuracy(ctx, items, exported):
    loaded = load(exported["grid"])
    with torch.no_grad():
        scores = loaded(ctx.split("val").x)
    accuracy = float((scores.argmax(1) == ctx.labels("val")).float().mean())
    assert accuracy == pytest.approx(items["grid"].metrics["accuracy"], abs=1e-9)


def test_tampered_or_missing_files_are_refused(exported, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(exported["grid"], copy)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(errors.IntegrityError, match="sha256"):
        load(copy)
    weights.unlink()
    with pytest.raises(errors.IntegrityError, match="missing"):
        load(copy)
    with pytest.raises(errors.IntegrityError, match="meta.json"):
        load(tmp_path)


def test_elastic_package_selects_the_individual_networks_and_is_smaller(
    ctx, items, exported, tmp_path
):
    # the ViT pair overlaps: a fine-tuned copy of vit[blocks.1:] and the zoo's vit[blocks.2:3]
    names = ("grid", "fused", "chain", "tokens_knn", "trained_cnn_to_vit")
    chosen = [items[n] for n in names]
    folder = export_elastic(ctx, chosen, tmp_path / "elastic")
    elastic = load(folder)
    assert isinstance(elastic, ElasticNet)
    x = ctx.split("val").x[:16]
    trained, _ = measure(ctx, items["trained_cnn_to_vit"].config)
    zoo_vit = ctx.segment("vit", "blocks.1", None).state_dict()
    copy_vit = trained.parts[2].state_dict()
    assert any(not torch.equal(zoo_vit[k], copy_vit[k]) for k in zoo_vit)  # it did train
    for item, name in zip(chosen, names, strict=True):
        assert elastic.select(trial=item.trial) == item.name
        with torch.no_grad():
            assert (elastic(x) - load(exported[name])(x)).abs().max() <= 1e-6
    together = sum((exported[n] / "model.safetensors").stat().st_size for n in names)
    package = (folder / "model.safetensors").stat().st_size
    print(f"elastic package {package} bytes, individual exports {together} bytes")
    assert package < together  # e.g. resnet's prefix and byobnet's suffix are stored once
    rows = elastic.configs()
    assert {r["name"] for r in rows} == {i.name for i in chosen}
    budget = sorted(r["macs"] for r in rows)[1]
    name = elastic.select(max_macs=budget)
    fits = [r for r in rows if r["macs"] <= budget]
    assert name == max(fits, key=lambda r: r["accuracy"])["name"]
    with pytest.raises(errors.BudgetError, match="cheapest"):
        elastic.select(max_macs=1)


def test_a_network_that_does_not_measure_as_recorded_is_refused(ctx, items, tmp_path):
    item = items["grid"]
    images = item.metrics["sample_images"]  # the fixed sample a rebuilt network is checked on
    recorded = {"accuracy": 0.01, "sample_correct": round(0.01 * images)}
    wrong = ExportItem("wrong", item.config, {**item.metrics, **recorded}, 0)
    with pytest.raises(errors.ExportError, match="recorded 0.0100"):
        export_network(ctx, wrong, tmp_path)
    assert list(tmp_path.iterdir()) == []  # no folder, no temporary left behind
    # a trial of an older study counted no sample: measured on the whole validation split
    older = {**item.metrics, "accuracy": 0.01, "sample_correct": None, "sample_images": 0}
    with pytest.raises(errors.ExportError, match="recorded 0.0100"):
        export_network(ctx, ExportItem("older", item.config, older, 0), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_network_checked_once_is_handed_out_again_for_the_same_record(ctx, items, monkeypatch):
    """The export after a search's test pass writes the networks the pass rebuilt and checked
    on the same context: checked again against the same record, nothing is rebuilt; against
    another record it is rebuilt and checked again."""
    from stitch_nas.report import _holdout, rebuild_checked

    item = items["grid"]
    first = rebuild_checked(ctx, item.config, item.metrics, "grid", "fix it", fuse=False)

    def rebuilt(*args, **kwargs):
        raise AssertionError("rebuilt a network checked already")

    monkeypatch.setattr(_holdout, "build", rebuilt)
    again = rebuild_checked(ctx, item.config, item.metrics, "grid", "fix it", fuse=False)
    assert again is first
    images = item.metrics["sample_images"]
    wrong = {**item.metrics, "accuracy": 0.01, "sample_correct": round(0.01 * images)}
    with pytest.raises(AssertionError, match="rebuilt"):
        rebuild_checked(ctx, item.config, wrong, "grid", "fix it", fuse=False)
    monkeypatch.undo()
    with pytest.raises(errors.ConfigError, match="recorded 0.0100"):
        rebuild_checked(ctx, item.config, wrong, "grid", "fix it", fuse=False)


def test_unknown_format_is_refused(ctx, items, tmp_path):
    with pytest.raises(errors.ExportError, match="unknown export format 'tflite'"):
        export_network(ctx, items["grid"], tmp_path, formats=["tflite"])


def test_a_part_that_cannot_be_traced_is_named_and_the_rest_exported(
    ctx, items, tmp_path, monkeypatch
):
    from stitch_nas.adapters import LinearStitch
    from stitch_nas.export import _traced as traced_formats

    real = traced_formats._WRITERS["onnx"]

    def refuse_stitches(module, x, path, programs):
        if isinstance(module, LinearStitch) or any(
            isinstance(m, LinearStitch) for m in module.modules()
        ):
            raise RuntimeError("unsupported operator")
        return real(module, x, path, programs)

    monkeypatch.setitem(traced_formats._WRITERS, "onnx", refuse_stitches)
    folder = export_network(ctx, items["grid"], tmp_path, formats=["onnx", "pt2"])
    meta = json.loads((folder / "meta.json").read_text())
    assert "part 1 (stitch" in meta["formats_failed"]["onnx"]
    assert not (folder / "model.onnx").exists() and (folder / "model.pt2").is_file()
    assert not list(folder.glob(".probe-*"))


def test_failed_export_keeps_the_previous_folder(ctx, items, tmp_path, monkeypatch):
    from stitch_nas.export import _write as export

    folder = export_network(ctx, items["grid"], tmp_path)
    before = (folder / "meta.json").read_bytes()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(export, "save_weights", broken)
    with pytest.raises(OSError, match="disk full"):
        export_network(ctx, items["grid"], tmp_path)
    assert (folder / "meta.json").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]


def test_user_modules_must_be_passed_to_load(ctx, items, digits, tmp_path):
    entry = ctx.entry("efficientnet")
    user = ZooEntry("mine", entry.model, entry.input_spec, entry.label_names, source="user")
    zoo = Zoo([user, ctx.entry("byobnet")])
    user_ctx = StitchContext(zoo, digits)
    config = StitchConfig(
        (Fragment("mine", None, "bn1"), Fragment("byobnet", "stages.0.0", None)),
        (AdapterSpec("lstsq"),),
    )
    _, m = measure(user_ctx, config)
    folder = export_network(user_ctx, ExportItem("user", config, m.to_dict()), tmp_path)
    with pytest.raises(errors.ConfigError, match="modules="):
        load(folder)
    import timm

    fresh = timm.create_model("test_efficientnet", pretrained=False, num_classes=10)
    loaded = load(folder, modules={"mine": fresh})
    assert loaded(digits.val.x[:4]).shape == (4, 10)


def _study_with_states() -> optuna.Study:
    study = optuna.create_study(directions=["maximize", "minimize"])
    config = CONFIGS["grid"].to_dict()
    for state in ("complete", "pruned", "fail"):
        trial = study.ask()
        trial.set_user_attr("config", config)
        if state == "complete":
            study.tell(trial, [0.9, 1e6])
        elif state == "pruned":
            trial.set_user_attr("prune_reason", "cka 0.1 < 0.3")
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, [math.nan, math.nan])
    return study


def test_only_completed_trials_can_be_exported():
    study = _study_with_states()
    assert [t.number for t in select_trials(study, [0])] == [0]
    with pytest.raises(errors.ExportError, match="trial 1 is PRUNED .cka 0.1"):
        select_trials(study, [1])
    with pytest.raises(errors.ExportError, match="trial 2 is FAIL"):
        select_trials(study, [2])
    with pytest.raises(errors.ExportError, match="does not exist"):
        select_trials(study, [7])


def test_a_search_export_names_a_network_it_cannot_export_and_exports_the_rest(
    ctx, items, tmp_path
):
    study = optuna.create_study(directions=["maximize", "minimize"])
    recorded = ((items["grid"], items["grid"].metrics["accuracy"]), (items["fused"], 0.01))
    for item, accuracy in recorded:
        trial = study.ask()
        trial.set_user_attr("config", item.config.to_dict())
        trial.set_user_attr("accuracy", accuracy)  # the second one does not measure as recorded
        study.tell(trial, [accuracy, 1e6])
    with pytest.raises(errors.ExportError, match="trial_1"):
        export_study(study, ctx, tmp_path / "strict", trials=[0, 1], formats=["safetensors"])
    summary = export_study(
        study, ctx, tmp_path, trials=[0, 1], formats=[], elastic=True, skip_failures=True
    )
    assert [f.name for f in summary.folders] == ["trial_0"] and list(summary.skipped) == ["trial_1"]
    assert "not exported: trial_1" in summary.describe()
    assert load(summary.elastic).configs()[0]["name"] == "trial_0"


KEY = "STITCH_NAS_EXPORT_KEY"


def _edit_and_rehash(folder, edit) -> None:
    """Edit stitch.json and write its new sha256 into meta.json: an edit checksums cannot see."""
    stitch = json.loads((folder / "stitch.json").read_text())
    edit(stitch)
    (folder / "stitch.json").write_text(json.dumps(stitch))
    meta = json.loads((folder / "meta.json").read_text())
    meta["files"]["stitch.json"] = sha256_file(folder / "stitch.json")
    meta["metrics"] = stitch.get("metrics", meta.get("metrics"))
    (folder / "meta.json").write_text(json.dumps(meta))


def test_a_signed_export_refuses_a_consistent_edit(ctx, items, tmp_path, monkeypatch):
    monkeypatch.setenv(KEY, "correct horse battery staple")
    folder = export_network(ctx, items["grid"], tmp_path / "signed", formats=[])
    assert (folder / "signature.json").is_file()
    assert load(folder, require_signature=True).metrics["accuracy"] != 0.123
    edited = tmp_path / "edited"
    shutil.copytree(folder, edited)
    _edit_and_rehash(edited, lambda stitch: stitch["metrics"].update(accuracy=0.123))
    with pytest.raises(errors.IntegrityError, match="does not match its signature") as info:
        load(edited)
    assert "\n" not in str(info.value)
    monkeypatch.setenv(KEY, "another key")
    with pytest.raises(errors.IntegrityError, match="signed with another key"):
        load(folder)
    # without the key the sha256 checksums alone cannot tell: the consistent edit loads
    monkeypatch.delenv(KEY)
    assert load(edited).metrics["accuracy"] == 0.123
    with pytest.raises(errors.IntegrityError, match=f"{KEY} is not set"):
        load(folder, require_signature=True)
    # nor does removing the signature get an edit past the key
    monkeypatch.setenv(KEY, "correct horse battery staple")
    (edited / "signature.json").unlink()
    with pytest.raises(errors.IntegrityError, match="not signed.*require_signature=False"):
        load(edited)
    assert load(edited, require_signature=False).metrics["accuracy"] == 0.123


def test_an_unsigned_export_loads_when_no_key_is_set(exported, monkeypatch):
    monkeypatch.delenv(KEY, raising=False)
    assert not (exported["grid"] / "signature.json").exists()
    assert isinstance(load(exported["grid"]), ExportedNet)
    monkeypatch.setenv(KEY, "k")
    with pytest.raises(errors.IntegrityError, match="not signed"):
        load(exported["grid"])
    assert isinstance(load(exported["grid"], require_signature=False), ExportedNet)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"checkpoint_path": "/etc/passwd"}, "checkpoint_path"),
        ({"pretrained_cfg_overlay": {"file": "w.pth"}}, "pretrained_cfg_overlay"),
        ({"act_layer": "../evil.py"}, "act_layer"),  # an allowed key whose value names a file
    ],
)
def test_stitch_json_kwargs_off_the_allow_list_are_refused(
    exported, tmp_path, monkeypatch, kwargs, key
):
    import timm

    def never(*args, **kwargs):
        raise AssertionError("timm.create_model called with a refused recipe")

    monkeypatch.setattr(timm, "create_model", never)
    copy = tmp_path / "copy"
    shutil.copytree(exported["grid"], copy)
    _edit_and_rehash(
        copy, lambda stitch: stitch["sources"]["byobnet"]["architecture"]["kwargs"].update(kwargs)
    )
    with pytest.raises(errors.IntegrityError, match=f"'byobnet'.*timm kwarg '{key}'") as info:
        load(copy)
    assert "\n" not in str(info.value)


def test_an_architecture_off_the_allow_list_is_refused_before_anything_is_written(
    ctx, items, digits, tmp_path
):
    entry = ctx.entry("byobnet")
    assert entry.architecture is not None
    kwargs = {**entry.architecture["kwargs"], "checkpoint_path": "weights.pth"}
    odd = dataclasses.replace(entry, architecture={**entry.architecture, "kwargs": kwargs})
    odd_ctx = StitchContext(Zoo([ctx.entry("efficientnet"), odd]), digits)
    with pytest.raises(errors.ExportError, match="timm kwarg 'checkpoint_path'"):
        export_network(odd_ctx, items["grid"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_next_export_removes_the_temporaries_of_killed_exports_only(ctx, items, tmp_path):
    from stitch_nas.export._write import _TEMP_NAME, _WRITER

    # the pattern is the one atomic_folder's mkdtemp really makes
    real = Path(tempfile.mkdtemp(dir=tmp_path, prefix=".trial_3.", suffix=".tmp"))
    assert _TEMP_NAME.fullmatch(real.name)
    real.rmdir()
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    host = socket.gethostname()

    def temporary(name, writer):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half written")
        if writer is not None:
            (folder / _WRITER).write_text(json.dumps(writer))
        return folder

    stale = temporary(".trial_9.k3j_x0ab.tmp", {"pid": dead.pid, "host": host})
    kept = [
        temporary(".trial_8.abcdefgh.tmp", {"pid": os.getpid(), "host": host}),  # still running
        temporary(".trial_7.abcdefgh.tmp", {"pid": dead.pid, "host": "elsewhere"}),
        temporary(".mine.abcdefgh.tmp", None),  # a user's folder that fits the pattern
        temporary("notes.abcdefgh.tmp", {"pid": dead.pid, "host": host}),  # not hidden
    ]
    (tmp_path / ".x.abcdefgh.tmp").write_text("a file, not a folder")
    folder = export_network(ctx, items["grid"], tmp_path, formats=[])
    assert not stale.exists()
    assert not (folder / _WRITER).exists()
    left = {folder.name, ".x.abcdefgh.tmp", *(k.name for k in kept)}
    assert {p.name for p in tmp_path.iterdir()} == left


def test_without_the_onnx_package_the_other_formats_are_written(tmp_path, monkeypatch, caplog):
    import sys

    from stitch_nas.export import _traced

    monkeypatch.setitem(sys.modules, "onnx", None)  # what a missing package looks like
    monkeypatch.setattr(_traced, "_warned_no_onnx", [])
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 2)).eval()
    x = torch.zeros(2, 3, 2, 2)
    for folder in (tmp_path / "a", tmp_path / "b"):
        folder.mkdir()
        written, failed, _ = _traced.write_traced(net, x, folder, ["onnx", "pt2"])  # type: ignore[arg-type]
        assert written == {"pt2": "model.pt2"} and not (folder / "model.onnx").exists()
        assert "pip install -e '.[onnx]'" in failed["onnx"]
    assert sum("not writing model.onnx" in r.message for r in caplog.records) == 1  # once
