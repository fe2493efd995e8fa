"""The proxy sampler: of the base sampler's proposals, the one the proxy says adds most."""

from __future__ import annotations

import optuna
import pytest

from stitch_nas import attrs, errors
from stitch_nas.report import hypervolume
from stitch_nas.search import ProxySampler, StitchObjective, proxy_sampler
from stitch_nas.search._proxy_sampler import _reference
from stitch_nas.stitching import _proxy
from tests._tiny import tiny_context

optuna.logging.set_verbosity(optuna.logging.WARNING)

DIRECTIONS = ["maximize", "minimize"]


def _true(x: int) -> tuple[float, float]:
    """A toy space: accuracy peaks at x = 70, cost grows with x."""
    return 1.0 - abs(x - 70) / 100, float(x)


def _study(sampler):
    return optuna.create_study(directions=DIRECTIONS, sampler=sampler)


def test_each_trial_takes_the_candidate_that_adds_most_to_the_proxy_front():
    proposals: list[list[tuple[int, tuple[float, float]]]] = []

    def score(trial):
        x = trial.suggest_int("x", 0, 99)
        proposals[-1].append((x, _true(x)))
        return _true(x)

    sampler = ProxySampler(optuna.samplers.RandomSampler(seed=1), score, candidates=6)
    study = _study(sampler)
    for _ in range(12):
        proposals.append([])
        trial = study.ask()
        x = trial.suggest_int("x", 0, 99)
        done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        tried = {t.params["x"] for t in study.trials[:-1]}
        batch = [(p, v) for p, v in proposals[-1] if p not in tried]  # repeats are never chosen
        front = [_true(t.params["x"]) for t in done]
        ref = _reference(front + [v for _, v in batch], study.directions)
        gains = [hypervolume([*front, v], DIRECTIONS, ref) for _, v in batch]
        if gains and max(gains) > (hypervolume(front, DIRECTIONS, ref) if front else 0.0):
            assert gains[[p for p, _ in batch].index(x)] == pytest.approx(max(gains))
        elif batch:  # nothing adds: the base sampler's first proposal not tried yet
            assert x == batch[0][0]
        study.tell(trial, _true(x))
        # the trial keeps what its choice cost: every proposal scored, the chosen among them
        recorded = study.trials[-1].user_attrs[attrs.PROXY_PROPOSALS]
        assert recorded == [{"x": p} for p, _ in proposals[-1]] and {"x": x} in recorded
    assert sampler.scored == 6 * 12
    assert len({p for batch in proposals for p, _ in batch}) > 12  # it proposed, not repeated


def test_nsga2_under_the_proxy_breeds_generations_in_the_real_study():
    """The chosen candidate keeps NSGA-II's marks: once a population of trials completes, the
    next trials belong to a later generation (without them every trial stayed in the first,
    random, generation)."""

    def score(trial):
        return _true(trial.suggest_int("x", 0, 99))

    base = optuna.samplers.NSGAIISampler(population_size=4, seed=0)
    study = _study(ProxySampler(base, score, candidates=3))
    study.optimize(lambda t: _true(t.suggest_int("x", 0, 99)), n_trials=12)
    key = optuna.samplers.NSGAIISampler._get_generation_key()
    generations = [t.system_attrs.get(key) for t in study.trials]
    assert None not in generations and max(generations) >= 2, generations


def test_a_proposal_that_repeats_a_trial_is_not_chosen_while_another_is_new():
    class Stuck(optuna.samplers.RandomSampler):
        """Proposes x = 5 three times in four: a sampler that has converged."""

        calls = 0

        def sample_independent(self, study, trial, name, distribution):
            Stuck.calls += 1
            return 5 if Stuck.calls % 4 else 60

    def score(trial):  # x = 5 dominates every other point
        return (1.0, 0.0) if trial.suggest_int("x", 0, 99) == 5 else (0.5, 50.0)

    sampler = ProxySampler(Stuck(), score, candidates=4)
    study = _study(sampler)
    study.enqueue_trial({"x": 5})
    study.optimize(lambda t: _true(t.suggest_int("x", 0, 99)), n_trials=2)
    # x = 5 adds the most on its own, but it was tried: the new proposal is measured
    assert [t.params["x"] for t in study.trials] == [5, 60]


def test_a_base_sampler_that_only_repeats_gives_way_to_random_candidates():
    class Converged(optuna.samplers.RandomSampler):
        def sample_independent(self, study, trial, name, distribution):
            return 5

    sampler = ProxySampler(
        Converged(), lambda t: _true(t.suggest_int("x", 0, 99)), candidates=4, seed=0
    )
    study = _study(sampler)
    study.enqueue_trial({"x": 5})
    study.optimize(lambda t: _true(t.suggest_int("x", 0, 99)), n_trials=6)
    xs = [t.params["x"] for t in study.trials]
    assert xs[0] == 5 and len(set(xs)) == 6  # every trial after the first a new config
    assert sampler.scored == 5 * (4 + 4)  # the base's four repeats, then four random
    assert [len(t.user_attrs[attrs.PROXY_PROPOSALS]) for t in study.trials[1:]] == [8] * 5
    assert attrs.PROXY_PROPOSALS not in study.trials[0].user_attrs  # enqueued: none scored


def test_the_scratch_study_holds_each_finished_trial_once():
    sampler = ProxySampler(
        optuna.samplers.RandomSampler(seed=0), lambda t: _true(t.suggest_int("x", 0, 99))
    )
    study = _study(sampler)
    study.optimize(lambda t: _true(t.suggest_int("x", 0, 99)), n_trials=5)
    scratch = sampler._scratch.get_trials(deepcopy=False)
    complete = [t for t in scratch if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 4  # the trials finished before the last one asked
    assert all(t.state == optuna.trial.TrialState.FAIL for t in scratch if t not in complete)


def test_enqueued_trials_keep_their_params_and_cost_no_proposals():
    sampler = ProxySampler(
        optuna.samplers.RandomSampler(seed=0), lambda t: _true(t.suggest_int("x", 0, 99))
    )
    study = _study(sampler)
    study.enqueue_trial({"x": 3})
    study.optimize(lambda t: _true(t.suggest_int("x", 0, 99)), n_trials=1)
    assert study.trials[0].params == {"x": 3} and sampler.scored == 0


def test_the_proxy_finds_more_of_the_front_than_its_base_sampler_alone():
    # the proxy is the truth plus a monotone distortion: it ranks, it does not predict
    def run(candidates: int, seed: int) -> float:
        sampler = ProxySampler(
            optuna.samplers.RandomSampler(seed=seed),
            lambda t: (_true(t.suggest_int("x", 0, 99))[0] ** 3, t.params["x"]),
            recorded=lambda t: (t.values[0] ** 3, t.values[1]),
            candidates=candidates,
        )
        study = _study(sampler)
        study.optimize(lambda t: _true(t.suggest_int("x", 0, 99)), n_trials=10)
        return hypervolume([t.values for t in study.best_trials], DIRECTIONS, [0.0, 100.0])

    alone = sorted(run(1, seed) for seed in range(5))
    proxied = sorted(run(8, seed) for seed in range(5))
    assert proxied[2] > alone[2]  # the median over five seeds


def test_candidates_below_one_are_refused():
    with pytest.raises(errors.ConfigError, match="proxy_candidates=0"):
        ProxySampler(optuna.samplers.RandomSampler(), lambda t: None, candidates=0)


def test_a_search_with_the_probe_in_the_loop_scores_its_proposals_and_reuses_the_chosen():
    ctx = tiny_context()
    objective = StitchObjective(ctx, probe_threshold=1.0)
    base = optuna.samplers.TPESampler(seed=0, n_startup_trials=3)
    sampler = proxy_sampler(objective, base, candidates=4)
    study = optuna.create_study(directions=objective.directions, sampler=sampler)
    calls = {"scoring": 0, "trials": 0}
    real, score = _proxy.build, sampler._score
    scoring = [False]

    def counted(*args, **kwargs):
        calls["scoring" if scoring[0] else "trials"] += 1
        return real(*args, **kwargs)

    def scored(trial):
        scoring[0] = True
        try:
            return score(trial)
        finally:
            scoring[0] = False

    _proxy.build, sampler._score = counted, scored
    try:
        study.optimize(objective, n_trials=6)
    finally:
        _proxy.build = real
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert complete and all(attrs.PROBE_ACCURACY in t.user_attrs for t in complete)
    assert sampler.scored == 4 * 6 and calls["scoring"] <= sampler.scored
    # a trial whose candidate had a proxy point reads its kept score: only the others score
    assert calls["trials"] <= 6 - len(sampler._proxy)
    assert len(_proxy._KEPT._values(ctx)) <= 4  # the unchosen proposals' scores are dropped


def test_a_config_proposed_again_is_not_scored_again(monkeypatch):
    ctx = tiny_context()
    objective = StitchObjective(ctx, probe_threshold=0.0)
    sampler = proxy_sampler(objective, optuna.samplers.RandomSampler(seed=0), candidates=2)
    scratch = optuna.create_study(directions=objective.directions)
    values = None
    while values is None:  # a zoo model on its own has no proxy point: ask again
        first = scratch.ask()
        values = sampler._score(first)
    from stitch_nas.search import _proxy_sampler

    probes = []
    real = _proxy_sampler.probe_accuracy
    monkeypatch.setattr(
        _proxy_sampler, "probe_accuracy", lambda *a, **k: probes.append(1) or real(*a, **k)
    )
    scratch.enqueue_trial(first.params)
    assert sampler._score(scratch.ask()) == values and not probes


def test_a_proposal_the_space_prunes_is_skipped_by_seeding_and_by_the_proxy():
    """A space may prune params no network fits (``restnet``'s parameter budget): seeding and
    the proxy, which call the space outside a trial, skip them instead of stopping the run."""
    from stitch_nas.search import seed_study

    ctx = tiny_context()
    objective = StitchObjective(ctx, probe_threshold=0.0)
    real, calls = objective.space, [0]

    def space(trial, ctx, **options):
        calls[0] += 1
        if calls[0] % 2:
            raise optuna.TrialPruned("no network of this pair fits the budget")
        return real(trial, ctx, **options)

    objective.space = space
    sampler = proxy_sampler(objective, optuna.samplers.RandomSampler(seed=0), candidates=4)
    study = optuna.create_study(directions=objective.directions, sampler=sampler)
    assert seed_study(study, objective, 2, pool=4) == 2
    study.optimize(objective, n_trials=8)
    assert len(study.trials) == 8 and sampler.scored == 4 * 6  # the two seeded cost none
