"""Repeated configs: recognised across --resume and drivers, never refitted, not counted, listed
once on the front and in exports; zoo models on their own are their references."""

from __future__ import annotations

import logging

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from stitch_nas import attrs
from stitch_nas.config import StitchConfig
from stitch_nas.export import select_trials
from stitch_nas.report import pareto_trials
from stitch_nas.search import StitchObjective, completed_count, create_study, run_search
from stitch_nas.search import _evaluate as runner
from stitch_nas.stitching import Measurement
from tests._tiny import tiny_context

optuna.logging.set_verbosity(optuna.logging.WARNING)
PRUNED, COMPLETE = TrialState.PRUNED, TrialState.COMPLETE


@pytest.fixture(scope="module")
def ctx():
    return tiny_context()


@pytest.fixture(scope="module")
def configs(ctx) -> list[StitchConfig]:
    """Three distinct stitched configs of the pairwise space."""
    objective = StitchObjective(ctx, probe_threshold=0)
    scratch = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    found: dict[str, StitchConfig] = {}
    while len(found) < 3:
        config = objective.space(scratch.ask(), ctx)
        found.setdefault(config.stable_hash(), config)
    return list(found.values())


@pytest.fixture
def fits(monkeypatch) -> list[str]:
    """The configs fitted and measured as trials, in order."""
    done: list[str] = []
    real = runner.measure

    def counting(ctx, config, **kwargs):
        done.append(config.stable_hash())
        return real(ctx, config, **kwargs)

    monkeypatch.setattr(runner, "measure", counting)
    return done


def _objective(ctx, configs, n: int, **options) -> StitchObjective:
    """An objective whose space holds the first ``n`` of ``configs`` (param ``pick``)."""
    objective = StitchObjective(ctx, probe_threshold=0, **options)
    objective.space = lambda trial, ctx: configs[trial.suggest_categorical("pick", list(range(n)))]
    return objective


def _enqueue(study: optuna.Study, *picks: int) -> None:
    for pick in picks:
        study.enqueue_trial({"pick": pick})


def test_a_resumed_search_does_not_refit_a_config_measured_before(ctx, configs, fits, tmp_path):
    first = _objective(ctx, configs, 3)
    study = create_study(first, tmp_path / "run", sampler="random")
    _enqueue(study, 0, 1)
    run_search(first, study, 2)
    assert len(fits) == 2
    again = _objective(ctx, configs, 3)  # a new process: nothing in memory
    resumed = create_study(again, tmp_path / "run", sampler="random", resume=True)
    _enqueue(resumed, 0, 1, 2)
    run_search(again, resumed, 3)
    assert fits == [c.stable_hash() for c in configs]  # each fitted once
    repeats = resumed.trials[2:4]
    assert [t.state for t in repeats] == [PRUNED, PRUNED]
    assert [t.user_attrs[attrs.DUPLICATE_OF] for t in repeats] == [0, 1]
    assert repeats[0].user_attrs["accuracy"] == resumed.trials[0].values[0]
    assert completed_count(resumed) == 3


def test_two_drivers_on_one_storage_share_what_they_measured(ctx, configs, fits, tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a, b = _objective(ctx, configs, 3), _objective(ctx, configs, 3)
    studies = [
        optuna.create_study(
            storage=url, study_name="shared", directions=a.directions, load_if_exists=True
        )
        for _ in (a, b)
    ]
    _enqueue(studies[0], 0)
    studies[0].optimize(a, n_trials=1)
    _enqueue(studies[1], 0)
    studies[1].optimize(b, n_trials=1)  # measured by driver a: not refitted
    assert len(fits) == 1
    assert studies[1].trials[1].user_attrs[attrs.DUPLICATE_OF] == 0
    # a config driver a is still measuring is not sent again by driver b
    running = studies[0].ask()
    running.set_user_attr(attrs.CONFIG, configs[1].to_dict())
    _enqueue(studies[1], 1)
    studies[1].optimize(b, n_trials=1)
    repeat = studies[1].trials[-1]
    assert repeat.state == PRUNED and repeat.user_attrs[attrs.DUPLICATE_OF] == running.number
    assert "still running" in repeat.user_attrs[attrs.PRUNE_REASON]
    assert len(fits) == 1


def test_n_trials_means_n_distinct_networks_when_the_sampler_repeats(ctx, configs, fits):
    objective = _objective(ctx, configs, 2)
    study = optuna.create_study(directions=objective.directions)
    _enqueue(study, 0, 0, 0, 1)  # a sampler that proposes config 0 three times
    run_search(objective, study, 2)
    assert [t.state for t in study.trials] == [COMPLETE, PRUNED, PRUNED, COMPLETE]
    assert len(fits) == 2 and len(set(fits)) == 2
    assert completed_count(study) == 2


def test_a_space_that_only_repeats_stops_with_a_message(ctx, configs, fits, caplog):
    objective = _objective(ctx, configs, 2, max_repeats=4)
    study = optuna.create_study(
        directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=0)
    )
    with caplog.at_level(logging.WARNING, logger="stitch_nas.search._loop"):
        run_search(objective, study, 3)
    assert "the space holds no new config after 4 proposals; 2 of 3 measured" in caplog.text
    assert len(fits) == 2
    assert [t.state for t in study.trials[-4:]] == [PRUNED] * 4


def test_a_zoo_model_on_its_own_is_its_reference_not_a_trial(ctx, fits, caplog):
    objective = StitchObjective(
        ctx, space="chain", space_options={"max_fragments": 1}, max_repeats=3
    )
    study = optuna.create_study(directions=objective.directions)
    with caplog.at_level(logging.WARNING, logger="stitch_nas.search._loop"):
        run_search(objective, study, 2)
    assert not fits and "0 of 2 measured" in caplog.text
    refs = {r["name"]: r for r in study.user_attrs[attrs.REFERENCES]}
    for trial in study.trials:
        name = trial.user_attrs[attrs.REFERENCE_OF]
        assert trial.state == PRUNED and trial.user_attrs["accuracy"] == refs[name]["accuracy"]
    assert pareto_trials(study) == []


def _done(config: StitchConfig, values: list[float], **user_attrs) -> optuna.trial.FrozenTrial:
    ua = {attrs.CONFIG: config.to_dict(), "accuracy": values[0], "macs": values[1], **user_attrs}
    return create_trial(values=values, user_attrs=ua)


def test_the_front_and_exports_list_a_network_once(configs):
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_user_attr(attrs.OBJECTIVES, ["accuracy", "macs"])
    a, b = configs[:2]
    study.add_trial(_done(a, [0.5, 100]))  # 0
    study.add_trial(_done(a, [0.5, 100], duplicate_of=0))  # 1: an older search's COMPLETE copy
    study.add_trial(_done(b, [0.7, 200]))  # 2
    study.add_trial(_done(b, [0.7, 200], duplicate_of=2))  # 3
    study.add_trial(_done(b, [0.7, 200], duplicate_of=2))  # 4
    assert [t.number for t in pareto_trials(study)] == [0, 2]
    assert [t.number for t in select_trials(study, "pareto")] == [0, 2]
    assert [t.number for t in select_trials(study, [1, 0, 3, 4])] == [0, 3]


def test_a_driver_knows_its_own_trials_between_reads_of_the_study(ctx, configs):
    """The Ray driver reads the study at most once per max_age_s: its own sent and finished
    configs are recognised from its notes, another driver's only at the next read."""
    from stitch_nas.search import TrialOutcome

    objective = _objective(ctx, configs, 3)
    study = optuna.create_study(directions=objective.directions)
    age = 3600.0  # no read after the first one

    def ask(pick: int) -> tuple[optuna.Trial, StitchConfig]:
        _enqueue(study, pick)
        trial = study.ask()
        return trial, objective.sample(trial)

    first, config = ask(0)
    assert objective.duplicate(first, config, max_age_s=age) is None
    again, _ = ask(0)
    reason = objective.duplicate(again, config, max_age_s=age)
    assert reason == "duplicate of trial 0, still running"
    study.tell(again, state=PRUNED)
    measured = Measurement(accuracy=0.75, macs=10, params=5, cka=0.9)
    state, values = objective.finish(first, config, TrialOutcome("complete", measured))
    study.tell(first, values)
    third, _ = ask(0)
    assert objective.duplicate(third, config, max_age_s=age) == "duplicate of trial 0"
    assert third.user_attrs["accuracy"] == 0.75
    study.tell(third, state=PRUNED)

    other = study.ask()  # another driver sends config 1
    other.set_user_attr(attrs.CONFIG, configs[1].to_dict())
    mine, config1 = ask(1)
    assert objective.duplicate(mine, config1, max_age_s=age) is None  # not read yet
    late, _ = ask(1)
    repeat = objective.duplicate(late, config1)  # max_age_s=0: read now
    assert repeat == f"duplicate of trial {other.number}, still running"
