"""The least-squares probe accuracy: the default pruning and seeding proxy of a search."""

from __future__ import annotations

import optuna
import pytest
import torch

from stitch_nas.activations import StitchContext
from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.search import StitchObjective, evaluate_config, seed_study
from stitch_nas.search._loop import measure_references
from stitch_nas.stitching import least_squares_version, measure, probe_accuracy

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def ctx(mini_zoo, digits):
    return StitchContext(mini_zoo, digits)


def _pair(ctx, kind="lstsq", **options):
    a, b = "resnet", "convnext"
    src, dst = ctx.cuts(a)[len(ctx.cuts(a)) // 2], ctx.cuts(b)[len(ctx.cuts(b)) // 2]
    spec = AdapterSpec(kind, tuple(sorted(options.items())))
    return StitchConfig((Fragment(a, None, src.name), Fragment(b, dst.name, None)), (spec,))


def test_probe_accuracy_is_the_least_squares_networks_accuracy_on_the_probe_split(ctx):
    config = _pair(ctx)
    score = probe_accuracy(ctx, config)
    assert score.own and score.images == len(ctx.labels("probe"))
    _, on_probe = measure(ctx, config, split="probe")
    assert score.accuracy == pytest.approx(on_probe.accuracy, abs=1e-6)


def test_trained_adapters_are_scored_by_their_least_squares_initialisation(ctx):
    config = _pair(ctx, "linear", loss="task", train="suffix", steps=500)
    cheap = least_squares_version(config)
    options = dict(cheap.adapters[0].options)
    assert options["loss"] == "none" and options["init"] == "lstsq"
    assert options["train"] == "adapter" and options["steps"] == 500
    score = probe_accuracy(ctx, config)
    assert not score.own  # the trial still trains it; the proxy did not
    assert least_squares_version(_pair(ctx)) == _pair(ctx)  # lstsq has nothing to untrain


def test_a_stitch_below_the_threshold_is_pruned_before_measuring(ctx, monkeypatch):
    import stitch_nas.search._evaluate as runner

    def no_measure(*args, **kwargs):
        raise AssertionError("a pruned config must not be measured on validation")

    monkeypatch.setattr(runner, "measure", no_measure)
    outcome = evaluate_config(ctx, _pair(ctx), probe_threshold=ctx.num_classes)  # 100 %
    assert outcome.status == "pruned" and outcome.reason.startswith("probe accuracy")
    assert outcome.probe is not None and outcome.probe < 1.0


def test_the_probe_score_is_recorded_and_the_network_not_built_twice(ctx, monkeypatch):
    import stitch_nas.stitching._measure as measuring

    builds = []
    real = measuring.build
    monkeypatch.setattr(measuring, "build", lambda *a, **k: builds.append(1) or real(*a, **k))
    outcome = evaluate_config(ctx, _pair(ctx), probe_threshold=1.0)
    assert outcome.status == "complete" and 0.0 < outcome.probe <= 1.0
    assert builds == []  # measure reused the network the proxy built
    sampler = optuna.samplers.RandomSampler(seed=0)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    objective = StitchObjective(ctx, probe_threshold=1.0)
    study.optimize(objective, n_trials=3)
    stitched = [  # a repeat copies the earlier trial's figures and is not scored again
        t
        for t in study.trials
        if len(t.user_attrs["config"]["fragments"]) > 1 and "duplicate_of" not in t.user_attrs
    ]
    assert stitched and all("probe_accuracy" in t.user_attrs for t in stitched)


def test_probe_threshold_is_checked(ctx):
    with pytest.raises(ConfigError, match="probe_threshold=11"):
        StitchObjective(ctx, probe_threshold=11)


def test_seeding_enqueues_the_best_scored_configs_first(ctx):
    objective = StitchObjective(ctx, probe_threshold=0.0)
    study = optuna.create_study(directions=objective.directions)
    assert seed_study(study, objective, 3, seed=0) == 3
    waiting = [t for t in study.trials if t.state == optuna.trial.TrialState.WAITING]
    assert len(waiting) == 3
    study.optimize(objective, n_trials=3)
    seeded = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(seeded) == 3
    # every seeded trial is a stitch the probe ranked at least as well as chance
    assert all(t.user_attrs["accuracy"] > 1.0 / ctx.num_classes for t in seeded)
    assert seed_study(study, objective, 3) == 0  # a study with trials is never seeded again


def test_seeding_skips_configs_over_a_budget(ctx):
    objective = StitchObjective(ctx, probe_threshold=0.0, budgets={"macs": 1})
    study = optuna.create_study(directions=objective.directions)
    assert seed_study(study, objective, 2, seed=0) == 0  # no network costs a single MAC
    assert study.trials == []


def test_seeded_trials_reuse_the_probe_score_seeding_computed(ctx, monkeypatch):
    import stitch_nas.stitching._proxy as proxy

    objective = StitchObjective(ctx, probe_threshold=1.0)
    study = optuna.create_study(directions=objective.directions)
    assert seed_study(study, objective, 2, seed=1) == 2
    builds = []
    real = proxy.build
    monkeypatch.setattr(proxy, "build", lambda *a, **k: builds.append(1) or real(*a, **k))
    study.optimize(objective, n_trials=2)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 2 and all("probe_accuracy" in t.user_attrs for t in done)
    assert builds == []  # neither trial scored its config again


def test_pairwise_proposes_cheaper_less_accurate_into_dearer_at_matching_depth(ctx):
    """Each proposal, asked through the space, builds the stitch it names: the model of fewer
    MACs and lower accuracy first, both cuts nearest the same share of their model's MACs."""
    from search_spaces.pairwise import MATCHED_DEPTHS, MATCHED_TOLERANCE, matched_depths
    from stitch_nas.stitching import fragment_macs, model_macs

    names = ctx.zoo.names()
    by_macs = sorted(names, key=lambda n: model_macs(ctx, n))
    # the cheapest model the least accurate: every fast-to-slow pair from it qualifies
    accuracy = {n: 0.5 + 0.1 * i for i, n in enumerate(by_macs)}
    assert matched_depths(ctx, accuracy) == []  # off unless the space's option says so
    proposals = matched_depths(ctx, accuracy, matched_seeds=True)
    assert proposals and all(p["route"].split(">")[0] != by_macs[-1] for p in proposals)
    space = StitchObjective(ctx).space
    depths = set()
    for params in proposals:
        config = space(optuna.trial.FixedTrial(params), ctx)
        (src, dst), (a, b) = params["route"].split(">"), config.fragments
        assert (a.model, b.model) == (src, dst) and model_macs(ctx, src) <= model_macs(ctx, dst)
        assert accuracy[src] < accuracy[dst]
        share_a = fragment_macs(ctx, src, None, a.end) / model_macs(ctx, src)
        share_b = fragment_macs(ctx, dst, None, b.start) / model_macs(ctx, dst)
        depth = min(MATCHED_DEPTHS, key=lambda d: abs(share_a - d))
        assert abs(share_a - depth) <= MATCHED_TOLERANCE
        assert abs(share_b - depth) <= MATCHED_TOLERANCE
        depths.add(depth)
    assert len(depths) >= 2  # not one depth only
    # reversed accuracies: no cheaper model is the less accurate, nothing is proposed
    assert matched_depths(ctx, {n: -accuracy[n] for n in names}, matched_seeds=True) == []


def test_matched_margin_admits_a_cheaper_model_up_to_that_much_more_accurate(ctx):
    """A strong cheap model's early layers into a dearer head: proposed only within the margin,
    and a margin outside [0, 1] is a one-line error."""
    from search_spaces.pairwise import matched_depths
    from stitch_nas.stitching import model_macs

    by_macs = sorted(ctx.zoo.names(), key=lambda n: model_macs(ctx, n))
    # every cheaper model 0.01 more accurate than the next dearer one
    accuracy = {n: 0.9 - 0.01 * i for i, n in enumerate(by_macs)}
    assert matched_depths(ctx, accuracy, matched_seeds=True) == []
    near = matched_depths(ctx, accuracy, matched_seeds=True, matched_margin=0.015)
    wide = matched_depths(ctx, accuracy, matched_seeds=True, matched_margin=1.0)
    assert near and len(wide) > len(near)
    for params in near:  # within the margin: neighbours in MACs only
        src, dst = params["route"].split(">")
        assert 0 < accuracy[src] - accuracy[dst] <= 0.015
    with pytest.raises(ConfigError, match=r"matched_margin=-0.1 must be an accuracy difference"):
        matched_depths(ctx, accuracy, matched_seeds=True, matched_margin=-0.1)


def test_pairwise_proposes_each_front_model_with_one_end_of_another(ctx):
    """With the cheapest model also the most accurate, it is the zoo's front alone: every
    proposal keeps it whole but for one end, another model's stem before it or another
    model's classifier after it, and each builds through the space as it says."""
    from search_spaces.pairwise import end_swaps, proposals
    from stitch_nas.stitching import model_macs

    names = sorted(ctx.zoo.names(), key=lambda n: model_macs(ctx, n))
    kept = names[0]
    accuracy = {n: 0.9 - 0.1 * i for i, n in enumerate(names)}
    assert end_swaps(ctx, accuracy, end_seeds=False) == []
    found = end_swaps(ctx, accuracy)
    space = StitchObjective(ctx).space
    stems = tails = 0
    for params in found:
        src, dst = params["route"].split(">")
        a, b = space(optuna.trial.FixedTrial(params), ctx).fragments
        assert kept in (src, dst) and (a.model, b.model) == (src, dst)
        if dst == kept:  # src's stem into the kept model: both cut as early as they join
            stems += 1
            assert a.end == ctx.cuts(src)[0].name and b.start == ctx.cuts(dst)[0].name
        else:  # the kept model into dst's classifier: dst's last cut
            tails += 1
            assert b.start == ctx.cuts(dst)[-1].name
    assert stems and tails and len(found) == stems + tails <= 2 * (len(names) - 1)
    # reversed accuracies: the cheapest model is still on the front, and so is every model
    everyone = end_swaps(ctx, {n: -accuracy[n] for n in names})
    assert len(everyone) > len(found)
    # seeding's proposals: these first, then the matched depths, none twice
    both = proposals(ctx, accuracy, matched_seeds=True, matched_margin=1.0)
    assert both[: len(found)] == found and len(both) == len({repr(p) for p in both})


def test_pairwise_proposes_front_models_with_blocks_skipped_in_the_gap_below_them(ctx):
    """Each proposal skips blocks of a front model but the cheapest, its MACs between the next
    cheaper front model's and its own, and builds through the space as it says."""
    from search_spaces.pairwise import block_skips, proposals
    from stitch_nas.stitching import fragment_macs, model_macs

    names = sorted(ctx.zoo.names(), key=lambda n: model_macs(ctx, n))
    accuracy = {n: 0.5 + 0.1 * i for i, n in enumerate(names)}  # every model on the front
    assert block_skips(ctx, accuracy) == []  # off unless the space's option says so
    found = block_skips(ctx, accuracy, skips=True)
    space = StitchObjective(ctx).space
    skipped = set()
    for params in found:
        a, b = space(optuna.trial.FixedTrial(params), ctx, skips=True).fragments
        assert (
            a.model == b.model and ctx.cut(a.model, b.start).index > ctx.cut(a.model, a.end).index
        )
        below = names[names.index(a.model) - 1]
        macs = fragment_macs(ctx, a.model, None, a.end) + fragment_macs(ctx, a.model, b.start, None)
        assert a.model != names[0] and model_macs(ctx, below) < macs < model_macs(ctx, a.model)
        skipped.add(a.model)
    assert len(skipped) >= 2
    # the cheapest model the most accurate: it is the front alone, with no gap below it
    assert block_skips(ctx, {n: -accuracy[n] for n in names}, skips=True) == []
    # seeding's proposals: these after the end swaps, none twice
    every = proposals(ctx, accuracy, skips=True)
    assert every[-len(found) :] == found and len(every) == len({repr(p) for p in every})


def test_seeding_gives_a_share_of_the_seeds_to_the_spaces_proposals(ctx):
    from stitch_nas.search._seeding import MATCHED_SHARE

    options = {"matched_seeds": True}
    objective = StitchObjective(ctx, probe_threshold=0.0, space_options=options)
    study = optuna.create_study(directions=objective.directions)
    lines = []
    assert seed_study(study, objective, 8, seed=0, echo=lines.append) == 8
    refs = {r["name"]: r["accuracy"] for r in study.user_attrs["references"]}
    proposed = objective.space.proposals(ctx, refs, **options)
    waiting = [t.system_attrs["fixed_params"] for t in study.trials]
    share = int(8 * MATCHED_SHARE)
    assert proposed and all(p in proposed for p in waiting[:share])  # the space's come first
    assert not any(p in proposed for p in waiting[share:])  # and no more than their share
    assert "the space proposed" in lines[0]


# --- the documented default threshold, on the trained mini zoo -------------------------------


@pytest.mark.real_probe_default
def test_the_default_threshold_prunes_a_stitch_at_chance_and_keeps_a_good_one(ctx, digits):
    """Without ``probe_threshold`` a search prunes on 1.5 x chance (docs/guide/objectives.md):
    a stitch into an untrained suffix, which predicts at chance, is pruned with the probe
    accuracy as its reason; a stitch between two trained models is measured."""
    import timm

    from stitch_nas.search import _runner
    from stitch_nas.zoo import Zoo, ZooEntry

    assert _runner.DEFAULT_PROBE_THRESHOLD == 1.5  # the documented value, not conftest's 0
    resnet = ctx.entry("resnet")
    torch.manual_seed(0)
    untrained = ZooEntry(
        "untrained",
        timm.create_model("test_resnet", pretrained=False, num_classes=10).eval(),
        resnet.input_spec,
        resnet.label_names,
        source="timm:test_resnet",
    )
    both = StitchContext(Zoo([resnet, ctx.entry("convnext"), untrained]), digits)
    objective = StitchObjective(both)  # no threshold given: the default
    assert objective.probe_threshold == 1.5
    src = both.cuts("resnet")[len(both.cuts("resnet")) // 2].name
    dst = both.cuts("untrained")[len(both.cuts("untrained")) // 2].name
    at_chance = StitchConfig(
        (Fragment("resnet", None, src), Fragment("untrained", dst, None)), (AdapterSpec(),)
    )
    good = _pair(both)
    study = optuna.create_study(directions=objective.directions)
    for config in (at_chance, good):
        study.enqueue_trial({}, user_attrs={"config": config.to_dict()})
    study.optimize(objective, n_trials=2)
    pruned, kept = study.trials
    floor = 1.5 / both.num_classes
    assert pruned.user_attrs["config"] == at_chance.to_dict()
    assert pruned.state == optuna.trial.TrialState.PRUNED
    probe = pruned.user_attrs["probe_accuracy"]
    assert probe < floor
    assert pruned.user_attrs["prune_reason"] == f"probe accuracy {probe:.3f} < {floor:.3f}"
    assert kept.user_attrs["config"] == good.to_dict()
    assert kept.state == optuna.trial.TrialState.COMPLETE
    assert kept.user_attrs["probe_accuracy"] >= floor


def test_seeding_has_the_zoos_references_measured_where_the_executor_runs_trials(ctx):
    class Workers:  # an executor's face to seeding: it measures where its trials would run
        def __init__(self) -> None:
            self.asked = 0

        def references(self, objective: StitchObjective) -> list[dict]:
            self.asked += 1
            rows = measure_references(objective.ctx, latency=objective.latency)
            return [{**row, "accuracy": 0.5} for row in rows]  # told apart from this process's

    objective = StitchObjective(ctx, probe_threshold=0.0)  # the pairwise space: proposals
    study = optuna.create_study(directions=objective.directions)
    workers = Workers()
    assert seed_study(study, objective, 2, seed=0, executor=workers) == 2
    assert workers.asked == 1
    assert [r["accuracy"] for r in study.user_attrs["references"]] == [0.5] * len(ctx.zoo.names())
