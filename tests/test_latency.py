"""The latency objective and budget: onnxruntime and PyTorch timing, a user's table or function."""

from __future__ import annotations

import math
import sys

import optuna
import pytest
import yaml

from stitch_nas import errors
from stitch_nas.config import StitchConfig
from stitch_nas.search import StitchObjective, create_study, run_search
from stitch_nas.settings import settings_from_dict
from stitch_nas.stitching import LatencyTable
from stitch_nas.stitching._latency import median_interval
from tests._tiny import tiny_context

Complete = optuna.trial.TrialState.COMPLETE


@pytest.fixture(scope="module")
def ctx():
    return tiny_context()


def _complete(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.trials if t.state == Complete and "duplicate_of" not in t.user_attrs]


@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
def test_the_latency_objective_times_each_network_and_says_how(ctx, backend):
    spec = {"backend": backend, "repeats": 9, "warmup": 1}
    objective = StitchObjective(ctx, objectives=["accuracy", "latency"], latency=spec)
    study = optuna.create_study(
        directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=2)
    )
    study.optimize(objective, n_trials=2)
    done = _complete(study)
    assert done
    for t in done:
        assert t.values[1] == t.user_attrs["latency_ms"] > 0
        low, high = t.user_attrs["latency_interval_ms"]
        assert low <= t.values[1] <= high
        assert t.user_attrs["latency_how"].startswith(f"{backend} CPU, 1 thread(s), batch 1")


def test_the_median_interval_is_the_binomial_order_statistics():
    times = [float(i) for i in range(1, 21)]  # n = 20: the 6th and the 15th
    assert median_interval(times) == (6.0, 15.0)
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few for more: the range


def _table(ctx, tmp_path, joint_ms=0.5):
    """A made-up device: each cut of a model 1 ms further from the input, the model's total 1 ms
    after its last cut."""
    models = {}
    for name in ctx.zoo.names():
        cuts = {c.name: float(i + 1) for i, c in enumerate(ctx.cuts(name))}
        models[name] = {"total": float(len(cuts) + 1), "cuts": cuts}
    path = tmp_path / "device.yaml"
    path.write_text(yaml.safe_dump({"models": models, "joint_ms": joint_ms}))
    return path


def test_a_users_table_gives_the_latency_and_drives_a_budget(ctx, tmp_path):
    path = _table(ctx, tmp_path)
    table = LatencyTable.load(str(path))
    budget = 8.0  # of networks from 1.5 ms (a first cut joined to a last one) to ~23 ms
    objective = StitchObjective(
        ctx,
        objectives=["accuracy", "macs"],  # latency only as a budget: still measured
        latency={"table": str(path)},
        budgets={"latency": budget},
        fidelity=0,
        cka_threshold=0.0,
        probe_threshold=0.0,
    )
    study = create_study(objective, tmp_path / "s", sampler="random", seed=3)
    run_search(objective, study, 10)
    done = _complete(study)
    feasible = []
    for t in done:
        config = StitchConfig.from_dict(t.user_attrs["config"])
        expected = table.network_ms(config)
        assert t.user_attrs["latency_ms"] == expected
        assert t.user_attrs["latency_how"] == f"table {path}"
        assert t.user_attrs["latency_interval_ms"] is None
        assert t.constraints["latency"] == pytest.approx(expected - budget)
        if expected <= budget:
            feasible.append(t.number)
    assert feasible and len(feasible) < len(done)  # the budget splits this search
    # the front holds only networks within the budget
    assert {t.number for t in study.best_trials} <= set(feasible)


def test_a_table_adds_fragments_and_joints():
    table = LatencyTable(
        "t.yaml",
        {"a": {"total": 5.0, "x": 1.0, "y": 3.0}, "b": {"total": 8.0, "u": 2.0, "v": 6.0}},
        joint_ms=0.25,
    )
    one = {"adapters": [{"kind": "lstsq"}]}
    alone = StitchConfig.single("a")
    assert table.network_ms(alone) == 5.0
    stitched = StitchConfig.from_dict(
        {"fragments": [{"model": "a", "end": "y"}, {"model": "b", "start": "u"}], **one}
    )
    assert table.network_ms(stitched) == 3.0 + (8.0 - 2.0) + 0.25
    three = StitchConfig.from_dict(
        {
            "fragments": [
                {"model": "a", "end": "x"},
                {"model": "b", "start": "u", "end": "v"},
                {"model": "a", "start": "y"},
            ],
            "adapters": [{"kind": "lstsq"}] * 2,
        }
    )
    assert table.network_ms(three) == 1.0 + 4.0 + 2.0 + 2 * 0.25
    with pytest.raises(errors.ConfigError, match="lacks b's cut 'w'"):
        table.network_ms(
            StitchConfig.from_dict(
                {"fragments": [{"model": "a", "end": "y"}, {"model": "b", "start": "w"}], **one}
            )
        )


def slow_on_vit(net, config):  # a user's function: ms by the models a network uses
    return 10.0 if "vit" in config.models else 1.0


def test_a_users_function_gives_the_latency(ctx, tmp_path):
    objective = StitchObjective(
        ctx,
        objectives=["accuracy", "latency"],
        latency={"function": "tests.test_latency:slow_on_vit"},
        fidelity=0,
    )
    study = create_study(objective, tmp_path / "s", sampler="random", seed=1)
    run_search(objective, study, 4)
    for t in _complete(study):
        config = StitchConfig.from_dict(t.user_attrs["config"])
        assert t.values[1] == slow_on_vit(None, config)
        assert t.user_attrs["latency_how"] == "function tests.test_latency:slow_on_vit"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"backend": "tpu"}, "search.latency.backend='tpu' is unknown; use one of onnxruntime"),
        ({"threads": 0}, "search.latency.threads=0: give an integer >= 1"),
        ({"repeat": 5}, "search.latency: unknown key 'repeat'; use backend"),
        ({"table": "a.yaml", "function": "m:f"}, "give a table or a function, not both"),
        ({"function": "no_colon"}, "give package.module:function"),
    ],
)
def test_bad_latency_settings_are_one_line_errors(options, message):
    with pytest.raises(errors.ConfigError) as info:
        settings_from_dict({"search": {"latency": options}})
    assert message in str(info.value) and "\n" not in str(info.value)


def test_latency_the_run_cannot_have_fails_before_any_trial(ctx, tmp_path, monkeypatch):
    path = _table(ctx, tmp_path)
    data = yaml.safe_load(path.read_text())
    del data["models"]["vit"]
    path.write_text(yaml.safe_dump(data))
    LatencyTable.load.cache_clear()
    with pytest.raises(errors.ConfigError, match="lacks the zoo's model.s. vit; add each"):
        StitchObjective(ctx, objectives=["accuracy", "latency"], latency={"table": str(path)})
    with pytest.raises(errors.ConfigError, match="cannot be imported"):
        StitchObjective(
            ctx, objectives=["accuracy", "latency"], latency={"function": "tests.nowhere:fn"}
        )
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # what a missing package looks like
    with pytest.raises(errors.MissingDependencyError, match="latency objective.*'onnx' extra"):
        StitchObjective(ctx, objectives=["accuracy", "latency"])
    # nothing is timed where nothing needs it, so the extra is not needed either
    assert StitchObjective(ctx, objectives=["accuracy", "macs"]).latency is None
    assert not math.isnan(median_interval([1.0])[0])


def test_a_table_path_is_relative_to_the_settings_file(tmp_path):
    settings = settings_from_dict(
        {"search": {"latency": {"table": "tables/device.yaml"}}}, base=tmp_path
    )
    assert settings.search.latency["table"] == str(tmp_path / "tables" / "device.yaml")


def test_the_command_line_times_with_onnxruntime_and_keeps_a_latency_budget(tmp_path, mini_zoo_dir):
    from stitch_nas.cli import main
    from stitch_nas.search import load_folder_study

    config = tmp_path / "s.yaml"
    config.write_text(
        f"zoo: {{cache_dir: {mini_zoo_dir}}}\n"
        "search: {trials: 3, seed_trials: 0, latency: {repeats: 5}}\n"
    )
    out = tmp_path / "out"
    argv = ["search", str(config), "--out", str(out), "--objectives", "accuracy,latency"]
    assert main([*argv, "--budget", "latency=1000", "--no-export", "-q"]) == 0
    done = _complete(load_folder_study(out))
    assert done
    for t in done:
        assert t.user_attrs["latency_how"].startswith("onnxruntime CPU, 1 thread(s), batch 1")
        assert t.values[1] == t.user_attrs["latency_ms"] > 0
        assert t.constraints["latency"] == pytest.approx(t.values[1] - 1000)
