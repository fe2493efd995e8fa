"""The Optuna objective and runner: own-study use, pruning, budgets, failures, resume."""

from __future__ import annotations

import math
import re

import optuna
import pytest

import stitch_nas
from stitch_nas import errors
from stitch_nas.search import StitchObjective, completed_count, create_study, run_search
from stitch_nas.search import _evaluate as runner
from tests._tiny import tiny_context

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def ctx():
    return tiny_context()


def test_plugs_into_a_users_own_study(ctx):
    objective = stitch_nas.make_objective(ctx=ctx, objectives=["accuracy", "macs", "params"])
    assert objective.directions == ["maximize", "minimize", "minimize"]
    study = optuna.create_study(
        directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=1)
    )
    study.optimize(objective, n_trials=6)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert done, [t.user_attrs for t in study.trials]
    for trial in done:
        assert 0.0 <= trial.values[0] <= 1.0 and trial.values[1] > 0 and trial.values[2] > 0
        assert trial.user_attrs["macs"] == trial.values[1]
        assert stitch_nas.StitchConfig.from_dict(trial.user_attrs["config"])


def test_cka_pruning_happens_before_any_fitting(ctx, monkeypatch):
    def no_fit(*args, **kwargs):
        raise AssertionError("a pruned trial must not be fitted")

    monkeypatch.setattr(runner, "measure", no_fit)
    objective = StitchObjective(ctx, cka_threshold=1.0)  # nothing stitched reaches CKA 1
    # a seeded sampler whose 4 proposals differ: a repeat would be pruned as a duplicate
    study = optuna.create_study(
        directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=0)
    )
    study.optimize(objective, n_trials=4)
    assert all(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)
    assert all(t.user_attrs["prune_reason"].startswith("cka") for t in study.trials)


def test_budgets_become_optuna_constraints(ctx):
    objective = StitchObjective(ctx, budgets={"macs": 1_000_000})
    study = optuna.create_study(
        directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=0)
    )
    study.optimize(objective, n_trials=5)
    for trial in study.trials:
        if trial.state == optuna.trial.TrialState.COMPLETE:
            assert trial.constraints == {"macs": trial.user_attrs["macs"] - 1_000_000}
    feasible = [t for t in study.best_trials if t.constraints["macs"] <= 0]
    assert len(feasible) == len(study.best_trials)


@pytest.mark.parametrize(
    "budgets, match", [({"flops": 1}, "unknown budget"), ({"macs": -5}, "positive")]
)
def test_bad_budgets_are_refused(ctx, budgets, match):
    with pytest.raises(errors.ConfigError, match=match):
        StitchObjective(ctx, budgets=budgets)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"max_repeats": 0}, r"max_repeats=0: give an integer >= 1"),
        ({"max_repeats": True}, r"max_repeats=True: give an integer >= 1"),
        ({"min_slice": -1}, r"min_slice=-1: give an integer >= 0"),
        ({"min_slice": 1.5}, r"min_slice=1.5: give an integer >= 0"),
    ],
)
def test_bad_library_only_options_are_refused_in_one_line(ctx, options, match):
    with pytest.raises(errors.ConfigError, match=match) as caught:
        StitchObjective(ctx, **options)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("key", ["macs", "params"])
def test_unreachable_budget_is_one_clear_error(ctx, tmp_path, key):
    objective = StitchObjective(ctx, budgets={key: 10})
    study = create_study(objective, tmp_path / "run")
    with pytest.raises(errors.BudgetError, match=f"{key} budget 10 .*raise the budget"):
        run_search(objective, study, 3)


@pytest.mark.parametrize("key", ["macs", "params"])
def test_a_budget_under_the_cheapest_prefix_plus_the_cheapest_head_is_refused(ctx, key):
    from stitch_nas.fragments import count_params
    from stitch_nas.search import check_budget_reachable
    from stitch_nas.stitching import fragment_macs

    def cost(name, start, end):
        if key == "macs":
            return fragment_macs(ctx, name, start, end)
        return count_params(ctx.segment(name, start, end))

    names = ctx.zoo.names()
    prefix = min(cost(n, None, ctx.cuts(n)[0].name) for n in names)
    head = min(cost(n, ctx.cuts(n)[-1].name, None) for n in names)
    # above the cheapest prefix alone (the old bound), below any network: refused up front
    bound = re.escape(f"{prefix + head:.4g}")
    with pytest.raises(errors.BudgetError, match=f"{key} budget .*at least {bound} {key}"):
        check_budget_reachable(StitchObjective(ctx, budgets={key: prefix + head - 1}))
    # the bound is a bound: every zoo model and every measured network is at least that dear
    assert all(cost(n, None, None) >= prefix + head for n in names)
    check_budget_reachable(StitchObjective(ctx, budgets={key: prefix + head}))


def test_a_failing_trial_is_recorded_and_the_study_goes_on(ctx, monkeypatch):
    calls = {"n": 0}
    real = runner.measure

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise errors.NonFiniteError("activations hold NaN")
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "measure", flaky)
    objective = StitchObjective(ctx)
    study = optuna.create_study(
        directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=3)
    )
    study.optimize(objective, n_trials=4)
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(failed) == 1 and "NaN" in failed[0].user_attrs["fail_reason"]
    assert any(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)


def test_resume_continues_the_same_study_to_the_requested_total(ctx, tmp_path):
    out = tmp_path / "run"
    objective = StitchObjective(ctx)
    study = create_study(objective, out, sampler="random")
    run_search(objective, study, 3)
    first = {t.number: t.values for t in study.trials if t.values}
    with pytest.raises(errors.ConfigError, match="--resume"):
        create_study(objective, out)
    resumed = create_study(objective, out, sampler="random", resume=True)
    run_search(objective, resumed, 6)
    assert completed_count(resumed) == 6
    for number, values in first.items():
        assert resumed.trials[number].values == values


def test_resume_marks_trials_left_running_as_failed(ctx, tmp_path):
    objective = StitchObjective(ctx)
    study = create_study(objective, tmp_path / "run")
    study.ask()  # a trial a killed driver left RUNNING
    resumed = create_study(objective, tmp_path / "run", resume=True)
    assert resumed.trials[0].state == optuna.trial.TrialState.FAIL
    assert "driver" in resumed.trials[0].user_attrs["fail_reason"]


def test_nan_objective_is_marked_failed_with_reason(ctx):
    objective = StitchObjective(ctx)
    study = optuna.create_study(directions=objective.directions)
    trial = study.ask()
    from stitch_nas.stitching import Measurement

    values = objective.record(trial, Measurement(math.nan, 10, 10, 0.5))
    assert math.isnan(values[0]) and "non-finite" in trial.user_attrs["fail_reason"]
