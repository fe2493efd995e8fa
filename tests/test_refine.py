"""Refining the front: the best least-squares networks retrained with a trained adapter."""

from __future__ import annotations

import optuna
import pytest

from stitch_nas import attrs
from stitch_nas.activations import StitchContext
from stitch_nas.config import AdapterSpec, StitchConfig
from stitch_nas.errors import ConfigError, UnknownNameError
from stitch_nas.search import (
    StitchObjective,
    completed_count,
    refine_adapter,
    refine_adapters,
    refine_study,
    run_search,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def ctx(mini_zoo, digits):
    return StitchContext(mini_zoo, digits)


def _configs(study, state=optuna.trial.TrialState.COMPLETE):
    return [
        StitchConfig.from_dict(t.user_attrs[attrs.CONFIG])
        for t in study.trials
        if t.state == state and attrs.CONFIG in t.user_attrs
    ]


def test_the_best_least_squares_networks_are_measured_again_with_trained_joints(ctx):
    objective = StitchObjective(ctx, fidelity=0)
    study = optuna.create_study(
        directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=0)
    )
    run_search(objective, study, 8)
    before = _configs(study)
    adapter = [refine_adapter({"kind": "linear", "loss": "distill", "steps": 10})]
    assert refine_study(study, objective, 2, adapter) == 2
    run_search(objective, study, completed_count(study) + 2)
    refined = [c for c in _configs(study) if c.adapters and c.adapters[0].kind == "linear"]
    assert len(refined) == 2
    lstsq = {c.stable_hash() for c in before}
    for config in refined:  # the same fragments as a least-squares network of the study
        twin = StitchConfig(config.fragments, tuple(AdapterSpec("lstsq") for _ in config.adapters))
        assert twin.stable_hash() in lstsq
        assert dict(config.adapters[0].options)["loss"] == "distill"
    # refining again (a resumed search) enqueues nothing: its two best are refined already;
    # one more network's worth refines the third best, and nothing the study holds
    assert refine_study(study, objective, 2, adapter) == 0
    assert refine_study(study, objective, 3, adapter) == 1
    waiting = _configs(study, optuna.trial.TrialState.WAITING)
    assert len(waiting) == 1
    assert not {c.stable_hash() for c in waiting} & {c.stable_hash() for c in refined}


def test_refining_nothing_enqueues_nothing(ctx):
    objective = StitchObjective(ctx, fidelity=0)
    study = optuna.create_study(directions=objective.directions)
    adapter = refine_adapters([{"kind": "conv3x3"}])
    assert refine_study(study, objective, 3, adapter) == 0  # no trial yet
    assert refine_study(study, objective, 0, adapter) == 0 and study.trials == []


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        ({"kind": "lstsq"}, ConfigError, "does not train"),
        ({"kind": "nope"}, UnknownNameError, "nope"),
        ({"kind": "linear", "stepz": 3}, ConfigError, "stepz"),
        ("linear", ConfigError, "give a mapping with a kind"),
    ],
)
def test_a_bad_refine_adapter_is_one_line(spec, error, message):
    with pytest.raises(error, match=message):
        refine_adapter(spec)


def test_each_refined_network_runs_once_per_adapter(ctx):
    objective = StitchObjective(ctx, fidelity=0)
    study = optuna.create_study(
        directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=1)
    )
    run_search(objective, study, 6)
    adapters = refine_adapters([{"kind": "linear", "steps": 5}, {"kind": "conv3x3", "steps": 5}])
    assert refine_study(study, objective, 1, adapters) == 2
    waiting = _configs(study, optuna.trial.TrialState.WAITING)
    assert sorted(c.adapters[0].kind for c in waiting) == ["conv3x3", "linear"]
    assert len({c.fragments for c in waiting}) == 1  # one network, two adapters
    with pytest.raises(ConfigError, match="non-empty list"):
        refine_adapters([])


def test_a_refinement_trains_before_it_meets_the_gate(ctx, monkeypatch):
    import stitch_nas.adapters._joint as joint

    trained = []
    real_train = joint.train
    monkeypatch.setattr(joint, "train", lambda *a, **k: trained.append(1) or real_train(*a, **k))
    objective = StitchObjective(ctx, fidelity=0.15, min_slice=0)
    study = optuna.create_study(
        directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=0)
    )
    run_search(objective, study, 4)
    study.add_trial(  # dominates every network, stitched ones too (they are gated apart)
        optuna.trial.create_trial(values=[1.0, 1.0], user_attrs={attrs.KIND: "stitched"})
    )
    adapters = refine_adapters([{"kind": "linear", "loss": "distill", "steps": 4}])
    assert refine_study(study, objective, 1, adapters) == 1
    study.optimize(objective, n_trials=1)
    refined = study.trials[-1]
    assert refined.user_attrs[attrs.REFINES] < refined.number
    assert trained  # trained, though its least-squares version could not reach the front
    reason = refined.user_attrs.get(attrs.PRUNE_REASON, "")
    assert reason.startswith("fidelity:"), reason  # then gated on the trained network's slice


def test_stitched_networks_and_the_rest_take_turns():
    from stitch_nas.search._refine import _turns

    # (error, MACs), both minimised: #0 and #1 (a new stem) dominate every stitched network,
    # the zoo model (0.1, 5) dominates #4; stitched networks still get every other turn, first
    points = [(0.1, 1.0), (0.2, 0.5), (0.3, 2.0), (0.4, 1.5), (0.5, 6.0)]
    stitched = [False, False, True, True, True]
    assert _turns(points, stitched, zoo=[(0.1, 5.0)]) == [2, 0, 3, 1, 4]
