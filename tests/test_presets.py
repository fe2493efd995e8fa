"""The seed papers' procedures as presets: stitchnet, restnet, snnet, traft."""

from __future__ import annotations

import inspect

import optuna
import pytest

import search_spaces
from search_spaces.restnet import order, restnet_select, restnet_spec
from search_spaces.snnet import paired_stitching, snnet_stitches, unpaired_stitching
from search_spaces.stitchnet import stitchnet_search
from search_spaces.traft import stages, traft_grid
from stitch_nas import errors
from stitch_nas.config import AdapterSpec, StitchConfig
from stitch_nas.fragments import count_params
from stitch_nas.search import evaluate_config, make_objective
from stitch_nas.stitching import config_cka, fragment_macs
from tests._tiny import tiny_context

FAST = {"steps": 3, "eval_every": 3}  # trained adapters: structure, not accuracy


@pytest.fixture(scope="module")
def ctx():
    return tiny_context()


def _run(ctx, space, n, **options):
    objective = make_objective(ctx=ctx, space=space, space_options=options)
    study = optuna.create_study(
        directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=0)
    )
    study.optimize(objective, n_trials=n)
    return study


def _some_complete_none_failed(study: optuna.Study) -> None:
    """No trial failed and at least one was measured: a study whose trials were all pruned
    evaluates nothing of the preset, so it must not pass for one."""
    states = [t.state for t in study.trials]
    assert optuna.trial.TrialState.FAIL not in states, states
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert done, states
    assert all(t.values[0] == t.user_attrs["accuracy"] for t in done)


@pytest.mark.parametrize("name", ["stitchnet", "restnet", "snnet", "traft"])
def test_presets_are_registered(name):
    assert name in search_spaces.list_spaces()


def test_documented_defaults_are_the_papers():
    sn = inspect.signature(stitchnet_search).parameters
    assert (sn["K"].default, sn["T"].default, sn["L"].default) == (2, 0.5, 16)  # StitchNet III-C
    assert sn["fuse"].default is True  # StitchNet II-B: fused into the next layer
    snn = inspect.signature(snnet_stitches).parameters
    assert (snn["kernel"].default, snn["stride"].default) == (2, 1)  # SN-Net Sec. 4
    assert snn["direction"].default == "fast_to_slow" and snn["nearest"].default is True
    rs = inspect.signature(search_spaces.get_space("restnet")).parameters
    assert rs["direction"].default == "slow_to_fast"  # ReStNet Sec. III-B
    assert restnet_spec() == AdapterSpec("linear", (("loss", "task"), ("train", "adapter")))


def test_stitchnet_recursion_scores_and_configs(ctx):
    results = stitchnet_search(ctx, max_joints=1, starts=["efficientnet"])
    assert results, "the tiny zoo should give some stitched networks"
    scores = [r.score for r in results]
    assert scores == sorted(scores, reverse=True) and min(scores) > 0.5
    for r in results:
        config = r.config
        assert len(config.fragments) == 2 and config.fragments[0].model != config.fragments[1].model
        assert config.adapters[0] == AdapterSpec("lstsq", (("fuse", True),))
        # one stitch: the score is the joint's CKA (Alg. 1 line 12 with s = 1); the search
        # takes A's side from the fragment's float32 output, config_cka from the cache, which
        # stores activations in float16: they agree to that rounding, not bit for bit
        assert r.score == pytest.approx(config_cka(ctx, config), abs=1e-5)
    # a higher threshold keeps a subset
    strict = {r.config for r in stitchnet_search(ctx, max_joints=1, T=0.8, starts=["efficientnet"])}
    assert strict <= {r.config for r in results} and all(
        r.score > 0.8 for r in results if r.config in strict
    )


def test_stitchnet_space_and_knn_head_evaluate(ctx):
    study = _run(ctx, "stitchnet", 3, max_joints=1, head="knn", fuse=False, starts=["vit"])
    states = {t.state for t in study.trials}
    assert optuna.trial.TrialState.FAIL not in states
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert done and all(t.user_attrs["config"]["head"]["kind"] == "knn" for t in done)
    assert all(t.user_attrs["stitchnet_score"] > 0.5 for t in study.trials)


def test_stitchnet_refuses_bad_parameters_and_runaway_recursion(ctx):
    with pytest.raises(errors.ConfigError, match="T=1.5"):
        stitchnet_search(ctx, T=1.5)
    with pytest.raises(errors.ConfigError, match="max_nodes=3"):
        stitchnet_search(ctx, T=0.0, max_nodes=3)


def test_paired_and_unpaired_stitching_by_hand():
    plan = paired_stitching(4, kernel=2, stride=1)
    assert plan == [
        (0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0),
        (1, 2, 1), (2, 1, 1), (2, 2, 1),
        (2, 3, 2), (3, 2, 2), (3, 3, 2),
    ]  # fmt: skip
    assert unpaired_stitching(2, 4) == [(0, 0, 0), (0, 1, 0), (1, 2, 1), (1, 3, 1)]
    with pytest.raises(errors.ConfigError, match="kernel"):
        paired_stitching(4, kernel=0)


def test_snnet_nearest_fast_to_slow(ctx):
    stitches = snnet_stitches(ctx)
    names = sorted(ctx.zoo.names(), key=lambda m: fragment_macs(ctx, m, None, None))
    neighbours = {(names[i], names[i + 1]) for i in range(len(names) - 1)}
    assert stitches
    for s in stitches:
        assert (s.front, s.back) in neighbours  # nearest stitching, smaller anchor first
        assert s.config.fragments[0].end == ctx.cuts(s.front)[s.front_cut].name
    everything = snnet_stitches(ctx, nearest=False)
    assert len(everything) > len(stitches)
    reverse = snnet_stitches(ctx, direction="slow_to_fast")
    assert {(s.back, s.front) for s in reverse} <= neighbours
    with pytest.raises(errors.ConfigError, match="anchors must be distinct"):
        snnet_stitches(ctx, anchors=["resnet", "resnet"])
    study = _run(ctx, "snnet", 3)
    _some_complete_none_failed(study)


def test_restnet_picks_best_cka_within_budget(ctx):
    spec = AdapterSpec("lstsq")
    front, back = order(ctx, "resnet", "efficientnet", "slow_to_fast")
    params = {m: count_params(ctx.entry(m).model) for m in (front, back)}
    assert params[front] >= params[back]
    best = restnet_select(ctx, front, back, spec=spec)
    matrix = ctx.cka_matrix(front, back)
    names_a = [c.name for c in ctx.cuts(front)]
    names_b = [c.name for c in ctx.cuts(back)]
    i, j = names_a.index(best.fragments[0].end), names_b.index(best.fragments[1].start)
    assert float(matrix[i, j]) == pytest.approx(float(matrix.max()))  # all CNN cuts join
    budget = 0.5 * params[front]
    small = restnet_select(ctx, front, back, param_budget=budget, spec=spec)
    assert evaluate_config(ctx, small).measurement.params <= budget
    with pytest.raises(errors.BudgetError, match="param_budget=10"):
        restnet_select(ctx, front, back, param_budget=10, spec=spec)


def test_restnet_space_trains_the_stitching_layer_only(ctx):
    study = _run(ctx, "restnet", 3, models=["resnet", "efficientnet"], adapter_options=FAST)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert done
    for t in done:
        adapter = t.user_attrs["config"]["adapters"][0]
        assert adapter["kind"] == "linear" and adapter["options"]["train"] == "adapter"
        assert t.user_attrs["params"] <= t.user_attrs["param_budget"]


def test_traft_stages_and_grid(ctx):
    groups = stages(ctx.cuts("resnet"))
    assert [len({c.spatial for c in g}) for g in groups] == [1] * len(groups)
    grid = traft_grid(ctx, models=["resnet"], adapter_options=FAST)
    kinds = {c.adapters[0].kind for c in grid}
    resizes = {c.adapters[0].option("resize") for c in grid}
    assert {"linear", "bottleneck", "conv3x3"} <= kinds and resizes == {
        "none",
        "bilinear",
        "integrated",
    }
    for config in grid:
        src, dst = config.fragments
        assert src.model == dst.model == "resnet"
        assert ctx.cut("resnet", dst.start).index > ctx.cut("resnet", src.end).index
        assert StitchConfig.from_json(config.to_json()) == config
    first = [c for c in grid if c.adapters[0].kind == "linear"][0]
    assert evaluate_config(ctx, first).status == "complete"
    study = _run(ctx, "traft", 2, models=["resnet"], adapter_options=FAST)
    _some_complete_none_failed(study)
