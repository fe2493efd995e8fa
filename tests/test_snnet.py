"""SN-Net joint training (Alg. 1): shared layers and anchors, the zoo untouched, search, export."""

from __future__ import annotations

import copy

import optuna
import pytest
import timm
import torch

from search_spaces.snnet import train_snnet
from stitch_nas import errors, load
from stitch_nas.activations import StitchContext
from stitch_nas.adapters import resolve_teacher
from stitch_nas.config import StitchConfig
from stitch_nas.data import load_digits_splits
from stitch_nas.export import ExportItem, export_elastic
from stitch_nas.search import evaluate_config, make_objective
from stitch_nas.snnet import JOINT_OPTIONS, JointSNNet, joint_spec
from stitch_nas.stitching import measure
from stitch_nas.zoo import ZooEntry
from tests._tiny import LABELS, SPEC, tiny_context, tiny_zoo

FAST = {"steps": 12, "lr": 1e-3}


@pytest.fixture(scope="module")
def ctx():
    return tiny_context()


def _two_vits() -> StitchContext:
    """Two ViTs of equal depth: SN-Net's paired stitching, whose windows share layers."""
    zoo = tiny_zoo(("vit",))
    torch.manual_seed(1)
    other = timm.create_model("test_vit", num_classes=10, img_size=32, patch_size=4).eval()
    zoo.add(ZooEntry("vit_b", other, SPEC, LABELS, source="timm:test_vit"))
    return StitchContext(zoo, load_digits_splits(probe_size=64))


def _state(ctx):
    return {m: copy.deepcopy(ctx.entry(m).model.state_dict()) for m in ctx.zoo.names()}


def _same(a, b):
    return all(torch.equal(a[m][k], b[m][k]) for m in a for k in a[m])


def _equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_defaults_are_the_papers():
    defaults = {k: opt.default for k, opt in JOINT_OPTIONS.items()}
    assert (defaults["kernel"], defaults["stride"]) == (2, 1)  # SN-Net Sec. 4
    assert defaults["direction"] == "fast_to_slow" and defaults["nearest"] is True
    assert defaults["train"] == "all"  # Sec. 4.2: the full model is updated
    assert (defaults["lr"], defaults["weight_decay"]) == (1e-4, 0.05)  # DeiT recipe, Sec. 4
    assert defaults["norm"] == "none"  # a plain 1x1 conv stitching layer


def test_windows_share_layers_and_anchors_are_shared_copies():
    ctx = _two_vits()
    before = _state(ctx)
    sn = train_snnet(ctx, **FAST)
    assert _same(before, _state(ctx)), "joint training must not change the zoo"
    assert train_snnet(ctx, **FAST) is sn  # trained once per context and options
    nets = {c: sn.network(c) for c in sn.configs()}
    by_layer: dict[int, list[StitchConfig]] = {}
    for stitch in sn.stitches:
        by_layer.setdefault(id(nets[sn.config_of(stitch)].parts[1]), []).append(stitch.config)
    assert len(by_layer) == len(sn.layers) < len(sn.stitches)  # some stitches share a layer
    assert any(len(v) > 1 for v in by_layer.values())
    # every stitch runs the same fine-tuned anchors, none of them the zoo's
    for config, net in nets.items():
        back = config.fragments[1].model
        chain_params = {id(p) for p in sn.chains[back].model.parameters()}
        assert {id(p) for p in net.parts[2].parameters()} <= chain_params
        assert not net.cached_prefix
    zoo_params = {id(p) for m in ctx.zoo.names() for p in ctx.entry(m).model.parameters()}
    assert not zoo_params & {id(p) for c in sn.chains.values() for p in c.model.parameters()}
    report = sn.report
    assert report is not None and report.members == len(sn.stitches) + 2
    assert report.steps == FAST["steps"] and report.draws_max >= 1


def test_training_moves_the_layers_from_least_squares():
    ctx = _two_vits()
    sn = train_snnet(ctx, **FAST)
    fresh = JointSNNet(ctx, sn.spec, sn.stitches)  # least-squares init, not trained
    assert any(not _equal(sn.layers[k], fresh.layers[k]) for k in sn.layers)
    # seeded: another context trains the very same SN-Net
    again = train_snnet(_two_vits(), **FAST)
    assert all(_equal(layer, again.layers[key]) for key, layer in sn.layers.items())
    assert all(_equal(c.model, again.chains[m].model) for m, c in sn.chains.items())


def test_adapter_only_training_keeps_zoo_anchors(ctx):
    before = _state(ctx)
    sn = train_snnet(ctx, train="adapter", **FAST)
    assert _same(before, _state(ctx))
    config = sn.configs()[0]
    net = sn.network(config)
    front = config.fragments[0]
    assert net.cached_prefix and net.parts[0] is ctx.segment(front.model, None, front.end)
    assert sn.report is not None and sn.report.members == len(sn.stitches)  # anchors not drawn
    rows = sn.evaluate()
    assert len(rows) == len(sn.anchors) + len(sn.stitches)
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["macs"] > 0 for r in rows)


def test_distillation_learns_the_teachers_logits(ctx):
    from stitch_nas.snnet._joint import _targets

    sn = train_snnet(ctx, train="adapter", loss="distill", teacher="best", **FAST)
    assert sn.spec != joint_spec(train="adapter", **FAST)  # not the task-trained SN-Net
    members = sn.members()
    best = resolve_teacher(ctx, "best", ctx.zoo.names()[0])
    logits = ctx.activation(best, None, "train")
    distill = {"loss": "distill", "teacher": "best"}
    assert all(torch.equal(t, logits) for t in _targets(ctx, members, distill))
    own = _targets(ctx, members, {"loss": "distill", "teacher": "destination"})
    for net, target in zip(members, own, strict=True):  # each member's last model's logits
        assert torch.equal(target, ctx.activation(net.config.fragments[-1].model, None, "train"))
    labels = _targets(ctx, members, {"loss": "task"})
    assert all(torch.equal(t, ctx.labels("train")) for t in labels)
    with pytest.raises(errors.ConfigError, match="teacher='nope' is not a zoo model"):
        train_snnet(ctx, loss="distill", teacher="nope", **FAST)


def test_bad_options_name_the_value(ctx):
    with pytest.raises(errors.ConfigError, match="steps=0"):
        train_snnet(ctx, steps=0)
    with pytest.raises(
        errors.ConfigError, match=r"unknown option\(s\) \['epochs'\] for SN-Net joint training"
    ):
        train_snnet(ctx, epochs=3)
    with pytest.raises(errors.ConfigError, match="not adapter / adapter_options"):
        _search(ctx, 1, joint=FAST, adapter="linear")
    with pytest.raises(errors.ConfigError, match="kernel as options of the snnet space"):
        _search(ctx, 1, joint={"kernel": 3})


def _search(ctx, n, **options):
    objective = make_objective(ctx=ctx, space="snnet", space_options=options)
    study = optuna.create_study(
        directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=0)
    )
    study.optimize(objective, n_trials=n)
    return study


def test_search_measures_and_exports_the_jointly_trained_stitches(ctx, tmp_path):
    study = _search(ctx, 4, joint=FAST)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    # a repeated stitch is pruned as a duplicate of its first trial, not measured again
    repeats = [t for t in study.trials if "duplicate_of" in t.user_attrs]
    assert len(done) + len(repeats) == 4 and len(done) >= 3
    configs = [StitchConfig.from_dict(t.user_attrs["config"]) for t in done]
    assert all(c.adapters[0].kind == "snnet" for c in configs)
    # a fresh context (another worker, `stitch-nas export`) trains and measures the same
    first = evaluate_config(tiny_context(), configs[0]).measurement
    assert first is not None and first.accuracy == done[0].user_attrs["accuracy"]
    items = []
    for i, config in enumerate(dict.fromkeys(configs)):
        _, m = measure(ctx, config)
        items.append(ExportItem(f"stitch_{i}", config, m.to_dict(), i))
    folder = export_elastic(ctx, items, tmp_path / "snnet")  # checks load-back itself
    # the tiny zoo's models are user modules: JSON names no timm recipe for them
    loaded = load(folder, modules={m: copy.deepcopy(ctx.entry(m).model) for m in ctx.zoo.names()})
    x = ctx.split("val").x[:4]
    for item in items:
        loaded.select(trial=item.name)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), measure(ctx, item.config)[0](x))
