"""Search spaces sample valid StitchConfigs; CKA pruning happens before any fitting."""

from __future__ import annotations

import optuna
import pytest

import search_spaces
from stitch_nas import errors
from stitch_nas.adapters._lstsq import check_pair
from stitch_nas.config import StitchConfig
from stitch_nas.samplers import make_sampler
from stitch_nas.stitching import fragment_macs, piece_roles
from tests._tiny import tiny_context


@pytest.fixture(scope="module")
def ctx():
    return tiny_context()


def _sample(space, ctx, n=30, seed=0, **options):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    configs = []
    for _ in range(n):
        trial = study.ask()
        configs.append(search_spaces.sample(space, trial, ctx, **options))
        study.tell(trial, 0.0)
    return configs


def test_registry_lists_and_refuses_unknown_and_duplicates():
    assert {"pairwise", "chain"} <= set(search_spaces.list_spaces())
    with pytest.raises(errors.UnknownNameError, match="pairwise"):
        search_spaces.get_space("pairwize")
    with pytest.raises(errors.ConfigError, match="already registered"):
        search_spaces.register_space("pairwise")(lambda trial, ctx: None)


def test_pairwise_samples_joinable_two_model_configs(ctx):
    configs = _sample("pairwise", ctx)
    directions = set()
    for config in configs:
        assert isinstance(config, StitchConfig)
        src, dst = config.fragments
        assert src.model != dst.model and src.start is None and dst.end is None
        check_pair(ctx.cut(src.model, src.end), ctx.cut(dst.model, dst.start))  # never raises
        assert StitchConfig.from_json(config.to_json()) == config
        macs = {m: fragment_macs(ctx, m, None, None) for m in config.models}
        directions.add(macs[src.model] <= macs[dst.model])
    assert directions == {True, False}  # both fast-to-slow and slow-to-fast are sampled


def test_pairwise_depth_cut_params_are_shared_by_every_route(ctx):
    """With relative depths NSGA-II sees the cut parameters of every trial, so it crosses over."""
    named = _sample("pairwise", ctx, n=40)
    deep = _sample("pairwise", ctx, n=40, cut_params="depth")
    for config in deep:
        src, dst = config.fragments
        check_pair(ctx.cut(src.model, src.end), ctx.cut(dst.model, dst.start))
    assert len(set(deep)) > 10  # many cuts reached, not only the ends
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        search_spaces.sample("pairwise", trial, ctx, cut_params="depth")
        study.tell(trial, 0.0)
    shared = set.intersection(*(set(t.params) for t in study.trials))
    assert shared == {"route", "src_depth", "dst_depth"}
    assert {c.fragments[0].model for c in named} == {c.fragments[0].model for c in deep}
    with pytest.raises(errors.ConfigError, match="cut_params 'deep'"):
        _sample("pairwise", ctx, n=1, cut_params="deep")


def test_pairwise_skips_route_each_model_to_a_deeper_cut_of_its_own(ctx):
    """With ``skips`` a model also joins itself, always forward (blocks skipped, never repeated),
    in both cut parameter modes and under TPE, whose parameters must keep fixed choices."""
    assert all(c.fragments[0].model != c.fragments[1].model for c in _sample("pairwise", ctx))
    for cut_params in ("named", "depth"):
        configs = _sample("pairwise", ctx, n=60, skips=True, cut_params=cut_params)
        skips = [c for c in configs if c.fragments[0].model == c.fragments[1].model]
        assert skips and len(skips) < len(configs)  # beside the two-model routes
        for config in skips:
            src, dst = config.fragments
            a, b = ctx.cut(src.model, src.end), ctx.cut(dst.model, dst.start)
            assert b.index > a.index
            skipped = range(a.index + 1, b.index + 1)  # piece i: from cut i - 1 to cut i
            assert piece_roles(ctx, src.model).contributes(skipped)  # a block, not a norm layer
            check_pair(a, b)
            assert fragment_macs(ctx, src.model, None, src.end) + fragment_macs(
                ctx, dst.model, dst.start, None
            ) < fragment_macs(ctx, src.model, None, None)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=5))
    for i in range(30):  # TPE refuses a parameter whose choices change between trials
        trial = study.ask()
        search_spaces.sample("pairwise", trial, ctx, skips=True)
        study.tell(trial, float(i % 7))
    assert any(t.user_attrs["direction"] == "skip" for t in study.trials)


def _proposals(sampler, space, ctx, **options):
    """The params of 40 trials of ``space`` told (source cut name length, source MACs)."""
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    for _ in range(40):
        trial = study.ask()
        src = search_spaces.sample(space, trial, ctx, **options).fragments[0]
        study.tell(trial, (len(src.end or ""), fragment_macs(ctx, src.model, None, src.end)))
    return [t.params for t in study.trials]


def _nsga2_and_random(space, ctx, **options):
    nsga2 = optuna.samplers.NSGAIISampler(seed=0, population_size=8)
    random = optuna.samplers.RandomSampler(seed=0)
    return _proposals(nsga2, space, ctx, **options), _proposals(random, space, ctx, **options)


def test_nsga2_on_depth_cut_params_is_not_random_search(ctx):
    # named cut parameters: NSGA-II re-samples every child at random (see pairwise's docstring)
    nsga2, random = _nsga2_and_random("pairwise", ctx, cut_params="named")
    assert nsga2 == random
    # the built-in nsga2 mutates a child one time in ten: it breeds on named cut parameters too
    built = _proposals(make_sampler("nsga2", 0, trials=40), "pairwise", ctx, cut_params="named")
    assert built[8:] != random[8:]
    nsga2, random = _nsga2_and_random("pairwise", ctx, cut_params="depth")
    assert nsga2[8:] != random[8:]


def test_chain_samples_ordered_fragments_up_to_the_limit(ctx):
    configs = _sample("chain", ctx, n=40, max_fragments=3)
    lengths = {len(c.fragments) for c in configs}
    assert lengths == {1, 2, 3}
    for config in configs:
        for frag in config.fragments[1:-1]:
            cuts = [c.name for c in ctx.cuts(frag.model)]
            assert cuts.index(frag.end) > cuts.index(frag.start)


def test_unknown_model_in_space_options(ctx):
    study = optuna.create_study()
    with pytest.raises(errors.UnknownModelError, match="resnet"):
        search_spaces.sample("pairwise", study.ask(), ctx, models=["resnet", "nope"])


def _spec_values(configs, key):
    return {dict(c.adapters[0].options).get(key) for c in configs if c.adapters[0].kind != "lstsq"}


def test_gap_samples_every_adapter_choice_and_bridges_forward(ctx):
    configs = _sample("gap", ctx, n=120, adapter_options={"steps": 5})
    assert {c.adapters[0].kind for c in configs} == set(search_spaces.ADAPTER_KINDS)
    assert _spec_values(configs, "resize") == {"bilinear", "none", "integrated"}
    assert _spec_values(configs, "loss") == {"none", "match", "task"}
    assert _spec_values(configs, "train") == {"adapter", "suffix", "all"}
    assert _spec_values(configs, "steps") == {5}
    same = {c.fragments[0].model == c.fragments[1].model for c in configs}
    assert same == {True, False}  # within one model and across models
    for config in configs:
        src, dst = config.fragments
        a, b = ctx.cut(src.model, src.end), ctx.cut(dst.model, dst.start)
        assert b.index > a.index if src.model == dst.model else b.depth > a.depth
        assert StitchConfig.from_json(config.to_json()) == config


def test_gap_depth_cut_params_are_shared_by_every_route(ctx):
    from stitch_nas import adapters

    named = _sample("gap", ctx, n=60, adapters=["linear"])
    deep = _sample("gap", ctx, n=60, adapters=["linear"], cut_params="depth")
    for config in deep:  # the same rules as named cuts: forward, and joinable
        src, dst = config.fragments
        a, b = ctx.cut(src.model, src.end), ctx.cut(dst.model, dst.start)
        assert b.index > a.index if src.model == dst.model else b.depth > a.depth
        adapters.create("linear", a, b, **dict(config.adapters[0].options))
    assert len(set(deep)) > 20 and len(set(named)) > 20
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        search_spaces.sample("gap", study.ask(), ctx, adapters=["linear"], cut_params="depth")
        study.tell(study.trials[-1].number, 0.0)
    shared = set.intersection(*(set(t.params) for t in study.trials))
    assert {"route", "src_depth", "dst_depth"} <= shared
    every = set().union(*(t.params for t in study.trials))
    assert not [n for n in every if n.startswith(("src_", "dst_")) and not n.endswith("_depth")]
    with pytest.raises(errors.ConfigError, match="cut_params 'deep'"):
        _sample("gap", ctx, n=1, cut_params="deep")


def test_nsga2_on_gap_depth_cut_params_is_not_random_search(ctx):
    nsga2, random = _nsga2_and_random("gap", ctx, adapters=["linear"], cut_params="depth")
    assert nsga2[8:] != random[8:]


def test_gap_offers_only_combinations_that_build(ctx):
    from stitch_nas import adapters

    for config in _sample("gap", ctx, n=60, seed=1):
        src, dst = config.fragments
        spec = config.adapters[0]
        a, b = ctx.cut(src.model, src.end), ctx.cut(dst.model, dst.start)
        adapters.create(spec.kind, a, b, **dict(spec.options))  # never raises LayoutError


def test_pairwise_samples_adapter_choices_when_asked(ctx):
    kinds = ["lstsq", "linear", "bottleneck"]
    configs = _sample("pairwise", ctx, n=60, adapters=kinds, losses=["none", "match"])
    assert {c.adapters[0].kind for c in configs} == set(kinds)
    assert _spec_values(configs, "loss") == {"none", "match"}


def test_gap_trials_run_through_the_objective(ctx):
    from stitch_nas.search import StitchObjective

    objective = StitchObjective(
        ctx,
        space="gap",
        space_options={"adapters": ["linear", "conv3x3"], "adapter_options": {"steps": 3}},
    )
    study = optuna.create_study(
        directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=0)
    )
    study.optimize(objective, n_trials=3)
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 3
    assert all(t.user_attrs["macs"] > 0 for t in study.trials)


def test_diverging_adapter_training_fails_the_trial_not_the_study(ctx):
    from stitch_nas.search import StitchObjective

    options = {"init": "random", "lr": 1e30, "weight_decay": 0.0, "steps": 20}
    objective = StitchObjective(
        ctx,
        space="gap",
        space_options={"adapters": ["linear"], "losses": ["match"], "adapter_options": options},
    )
    study = optuna.create_study(directions=objective.directions)
    study.optimize(objective, n_trials=2)
    assert all(t.state == optuna.trial.TrialState.FAIL for t in study.trials)
    assert all("NonFiniteError" in t.user_attrs["fail_reason"] for t in study.trials)


def test_chain_samples_adapter_choices_per_joint(ctx):
    kinds = ["linear", "conv3x3"]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    configs = []
    for _ in range(40):  # a vector cut cannot feed a grid: the runner prunes such trials
        try:
            trial = study.ask()
            configs.append(
                search_spaces.sample(
                    "chain", trial, ctx, max_fragments=3, adapters=kinds, trains=["adapter", "all"]
                )
            )
        except errors.LayoutError as exc:
            assert "can join" in str(exc)
    joints = [(i, a) for c in configs for i, a in enumerate(c.adapters)]
    assert {a.kind for _, a in joints} == set(kinds)
    assert all(dict(a.options)["train"] != "all" for i, a in joints if i > 0)  # first joint only
