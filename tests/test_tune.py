"""Ray Tune integration: the searcher's bookkeeping (constraints, pruning) and the example run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch

from stitch_nas.activations import ActivationCache
from stitch_nas.config import StitchConfig
from stitch_nas.search import StitchObjective, TrialOutcome, TrialPlan, evaluate_plan
from stitch_nas.search._tune import (
    CONFIG_KEY,
    REPEAT_KEY,
    StitchOptunaSearch,
    StitchTuneSpace,
    outcome_metrics,
)
from tests._tiny import tiny_context

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parents[1]
State = optuna.trial.TrialState


@pytest.fixture(scope="module")
def ctx():
    return tiny_context()


def _run_one(searcher, objective, trial_id: str) -> optuna.trial.FrozenTrial:
    """What Tune does for one trial: suggest, evaluate in the trainable, complete."""
    config = searcher.suggest(trial_id)
    plan = TrialPlan(StitchConfig.from_dict(json.loads(config[CONFIG_KEY])))
    outcome = evaluate_plan(objective.ctx, plan, objective.evaluation_options())
    searcher.on_trial_complete(trial_id, outcome_metrics(outcome, objective.names))
    return searcher.study.trials[-1]


def test_searcher_carries_budgets_to_optuna_as_constraints(ctx):
    objective = StitchObjective(ctx, budgets={"macs": 1_000_000})
    searcher = StitchOptunaSearch(objective, sampler=optuna.samplers.RandomSampler(seed=0))
    trials = [_run_one(searcher, objective, f"t{i}") for i in range(5)]
    complete = [t for t in trials if t.state == State.COMPLETE]
    assert complete, [t.user_attrs for t in trials]
    for trial in complete:
        assert trial.constraints == {"macs": trial.user_attrs["macs"] - 1_000_000}
        assert trial.values[1] == trial.user_attrs["macs"]
    assert any(t.user_attrs["macs"] > 1_000_000 for t in complete)  # some are over budget
    # best_trials holds feasible networks only: the budget reached Optuna
    assert all(t.user_attrs["macs"] <= 1_000_000 for t in searcher.study.best_trials)


def test_searcher_records_pruned_and_failed_trials(ctx):
    objective = StitchObjective(ctx, cka_threshold=1.0)  # nothing stitched reaches CKA 1
    searcher = StitchOptunaSearch(objective, sampler=optuna.samplers.RandomSampler(seed=1))
    trial = _run_one(searcher, objective, "pruned")
    assert trial.state == State.PRUNED and trial.user_attrs["prune_reason"].startswith("cka")
    searcher.suggest("crashed")
    searcher.on_trial_complete("crashed", None, error=True)
    crashed = searcher.study.trials[-1]
    assert crashed.state == State.FAIL and "raised" in crashed.user_attrs["fail_reason"]


def test_a_repeated_config_is_pruned_without_evaluating_it(ctx):
    objective = StitchObjective(ctx)
    searcher = StitchOptunaSearch(objective, sampler=optuna.samplers.RandomSampler(seed=2))
    first = _run_one(searcher, objective, "first")
    searcher.study.enqueue_trial(first.params)  # the sampler proposes the same config again
    config = searcher.suggest("again")
    assert config[REPEAT_KEY].startswith(f"duplicate of trial {first.number}")
    # what the trainable reports for a repeat, evaluating nothing
    outcome = TrialOutcome("pruned", reason=config[REPEAT_KEY])
    searcher.on_trial_complete("again", outcome_metrics(outcome, objective.names))
    again = searcher.study.trials[-1]
    assert again.state == State.PRUNED and again.user_attrs["duplicate_of"] == first.number
    assert again.user_attrs["config"] == first.user_attrs["config"]


def test_space_works_with_plain_optuna_search(ctx):
    from ray.tune.search.optuna import OptunaSearch

    objective = StitchObjective(ctx)
    searcher = OptunaSearch(
        space=StitchTuneSpace(objective), metric=objective.names, mode=["max", "min"]
    )
    config = searcher.suggest("a")
    assert StitchConfig.from_dict(json.loads(config[CONFIG_KEY])).is_stitched


def test_the_trainable_ships_no_activation_and_measures_what_the_driver_does(tmp_path):
    from ray import cloudpickle

    from stitch_nas.search._ray_resources import context_bytes
    from stitch_nas.search._ray_shared import share_context

    # float32 storage: a worker's cache must keep the driver's dtype, or its keys and its
    # rounding differ from the driver's
    cache = ActivationCache(memory_gb=0.05, spill_dir=tmp_path, dtype="float32", disk_gb=0.5)
    ctx = tiny_context(cache=cache)
    objective = StitchObjective(ctx, fidelity=0, cka_threshold=0.0, probe_threshold=0.0)
    # what make_trainable hands to tune.with_parameters, pickled as the object store holds it
    shipped = cloudpickle.dumps(share_context(ctx, put=lambda value: value))
    assert len(shipped) < context_bytes(ctx) + 2**20  # the zoo and the images, no activation
    assert ctx.cache.stats()["misses"] == 0  # nothing computed on the driver to ship
    worker = cloudpickle.loads(shipped).materialize()  # as a Tune worker process builds it
    assert worker.cache is not ctx.cache and worker.cache.spill_dir == tmp_path
    assert worker.cache.disk_gb == 0.5  # the folder's size the driver was given
    assert (worker.cache.budget_bytes, worker.cache.dtype) == (cache.budget_bytes, torch.float32)
    assert worker.activation_key("resnet", None, "val") == ctx.activation_key("resnet", None, "val")
    searcher = StitchOptunaSearch(objective, sampler=optuna.samplers.RandomSampler(seed=3))
    plan = TrialPlan(StitchConfig.from_dict(json.loads(searcher.suggest("a")[CONFIG_KEY])))
    there = evaluate_plan(worker, plan, objective.evaluation_options())
    here = evaluate_plan(ctx, plan, objective.evaluation_options())
    assert there.status == here.status == "complete"
    assert there.measurement.accuracy == here.measurement.accuracy
    assert worker.cache.stats()["misses"] > 0  # the worker filled its own cache


def test_tune_example_runs_and_prints_the_front(tmp_path):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(ROOT / "examples" / "ray_tune_optuna.py"), "--tiny"]
    command += ["--trials", "6", "--results", str(tmp_path)]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    counts = re.search(r"6 Tune trials: (\d+) complete", run.stdout)
    assert counts and int(counts.group(1)) >= 1, run.stdout
    front = re.search(r"Pareto front \(MACs budget [\d,]+\): (\d+) networks", run.stdout)
    assert front and int(front.group(1)) >= 1, run.stdout
    assert len(re.findall(r"^#\s*\d+\s+accuracy", run.stdout, flags=re.M)) == int(front.group(1))
