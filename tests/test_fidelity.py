"""Multi-fidelity evaluation: the slice gate's rule, and that passing it changes no accuracy."""

from __future__ import annotations

import optuna
import pytest

from stitch_nas import attrs
from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.report import wilson_interval
from stitch_nas.search import StitchObjective, evaluate_config
from stitch_nas.search._fidelity import Fidelity, FidelityGate, SliceStop, current_front
from stitch_nas.stitching import Measurement, measure
from tests._tiny import tiny_context

optuna.logging.set_verbosity(optuna.logging.WARNING)

NAMES = ("accuracy", "macs")


@pytest.fixture(scope="module")
def ctx():
    return tiny_context()


def _gate(front, budgets=None) -> FidelityGate:
    return FidelityGate(fidelity=0.15, objectives=NAMES, front=front, budgets=budgets or {})


def _costs(macs: int = 1000) -> Measurement:
    return Measurement(accuracy=float("nan"), macs=macs, params=10, cka=1.0)


def _configs(ctx) -> list[StitchConfig]:
    cut_a, cut_b = ctx.cuts("resnet")[1], ctx.cuts("resnet")[2]
    stitched = StitchConfig(
        (Fragment("resnet", None, cut_a.name), Fragment("resnet", cut_b.name, None)),
        (AdapterSpec("lstsq"),),
    )
    return [StitchConfig.single("resnet"), StitchConfig.single("vit"), stitched]


@pytest.mark.parametrize("k", [0, 3, 20, 45])
def test_a_config_whose_upper_end_reaches_the_front_is_kept(k):
    m = 45
    high = wilson_interval(k / m, m)[1]
    # a front point exactly at the upper end, same MACs: the config could still tie it
    _gate([[high, 1000.0]]).check(_costs(), k, m)
    # a cheaper config is never dominated by a dearer point, whatever its accuracy
    _gate([[1.0, 1000.0]]).check(_costs(macs=999), k, m)


@pytest.mark.parametrize("k", [0, 3, 20])
def test_a_hopeless_config_is_dropped(k):
    m = 45
    high = wilson_interval(k / m, m)[1]
    with pytest.raises(SliceStop, match="dominated") as stop:
        _gate([[high + 1e-6, 1000.0]]).check(_costs(), k, m)
    assert stop.value.record[attrs.SLICE_IMAGES] == m
    assert stop.value.record[attrs.PARTIAL_ACCURACY] == k / m


def test_no_front_never_prunes_and_over_budget_does():
    _gate([]).check(_costs(macs=10**12), 0, 45)
    with pytest.raises(SliceStop, match="macs budget"):
        _gate([[0.0, 1e12]], budgets={"macs": 500.0}).check(_costs(), 45, 45)


def test_the_slices_are_a_fixed_shuffle_not_the_head_of_the_split():
    parts = _gate([]).slices(300)
    again = _gate([]).slices(300)
    # 15 %, then 45 % (threefold, at most half the split), then the whole split
    assert [len(p) for p in parts] == [45, 90, 165]
    assert all(p.equal(q) for p, q in zip(parts, again, strict=True))
    assert sorted(i for p in parts for i in p.tolist()) == list(range(300))
    assert parts[0].max() > 200  # not the first 45 images


@pytest.mark.parametrize(
    ("fidelity", "sizes"), [(0.05, [50, 100, 300, 550]), (0.2, [200, 800]), (0.6, [600, 400])]
)
def test_slices_grow_threefold_up_to_half_the_split_after_the_first(fidelity, sizes):
    gate = FidelityGate(fidelity=fidelity, objectives=NAMES, front=[], budgets={})
    assert [len(p) for p in gate.slices(1000)] == sizes


class _Recorder:
    """A screen that records what it is shown and stops at its ``stop_at``-th check."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.seen: list[tuple[int, int]] = []
        self.stop_at = stop_at

    def slices(self, n):
        return _gate([]).slices(n)

    def check(self, costs, correct, images):
        self.seen.append((correct, images))
        if len(self.seen) == self.stop_at:
            raise SliceStop("stop", {attrs.SLICE_IMAGES: images})


def test_each_slice_is_judged_on_everything_scored_so_far(ctx):
    config = _configs(ctx)[2]
    n = len(ctx.labels("val"))
    _, plain = measure(ctx, config)
    screen = _Recorder()
    _, screened = measure(ctx, config, screen=screen)
    sizes = [len(p) for p in _gate([]).slices(n)]
    assert [images for _, images in screen.seen] == [sizes[0], sizes[0] + sizes[1]]
    assert screened.accuracy == plain.accuracy
    with pytest.raises(SliceStop) as stop:  # a config dropped at the second slice
        measure(ctx, config, screen=_Recorder(stop_at=2))
    assert stop.value.record[attrs.SLICE_IMAGES] == sizes[0] + sizes[1]


def test_each_slice_runs_only_its_images_and_keeps_them(ctx):
    """Each slice computes the prefix for its images only and keeps those rows under their own
    key (never the whole split's); a second config with that first fragment reads them, and the
    figures are the same either way."""
    from stitch_nas.activations._stream import rows_split, stored

    config = _configs(ctx)[2]
    first = config.fragments[0]
    _, plain = measure(ctx, config)
    fresh = tiny_context()
    key = fresh.activation_key(first.model, first.end, "val")
    slices = _gate([]).slices(len(ctx.labels("val")))
    rows = [fresh.activation_key(first.model, first.end, rows_split("val", s)) for s in slices]
    with pytest.raises(SliceStop):
        measure(fresh, config, screen=_Recorder(stop_at=1))
    assert stored(fresh, rows[0]) is not None
    assert stored(fresh, key) is None and all(stored(fresh, k) is None for k in rows[1:])
    _, screened = measure(fresh, config, screen=_Recorder())
    assert stored(fresh, key) is None and all(stored(fresh, k) is not None for k in rows)
    assert screened.accuracy == plain.accuracy
    assert screened.sample_correct == plain.sample_correct
    misses = fresh.cache.stats()["misses"]
    _, again = measure(fresh, config, screen=_Recorder())  # every slice read from the cache
    assert fresh.cache.stats()["misses"] == misses
    assert again.accuracy == plain.accuracy


def test_accuracy_with_the_gate_equals_accuracy_without(ctx):
    gated_ctx = tiny_context()  # nothing cached: the first slice computes its images only
    fidelity = Fidelity(0.15, tuple(NAMES), {})
    never = [[0.0, 1e15]]  # a front that dominates nothing
    for config in _configs(ctx):
        plain = evaluate_config(ctx, config)
        gated = evaluate_config(gated_ctx, config, fidelity=fidelity, front=never)
        assert plain.status == gated.status == "complete", (plain.reason, gated.reason)
        assert gated.measurement.accuracy == plain.measurement.accuracy
        assert gated.measurement.macs == plain.measurement.macs


def test_the_gate_off_measures_everything(ctx):
    hopeless = [[1.0, 1.0]]
    config = _configs(ctx)[0]
    assert evaluate_config(ctx, config, fidelity=None, front=hopeless).status == "complete"
    objective = StitchObjective(ctx, fidelity=0)
    assert objective.evaluation_options().fidelity is None
    study = optuna.create_study(directions=objective.directions)
    assert objective.front(study) is None
    with pytest.raises(ConfigError, match="fidelity"):
        StitchObjective(ctx, fidelity=1.0)


def test_a_slice_below_the_minimum_turns_the_gate_off(ctx):
    n = len(ctx.labels("val"))
    small = StitchObjective(ctx, fidelity=0.15, min_slice=round(0.15 * n) + 1)
    assert small.evaluation_options().fidelity is None
    study = optuna.create_study(directions=small.directions)
    study.add_trial(optuna.trial.create_trial(values=[1.0, 1.0]))
    assert small.front(study) is None
    exact = StitchObjective(ctx, fidelity=0.15, min_slice=round(0.15 * n))
    assert exact.evaluation_options().fidelity is not None and exact.front(study)


def test_a_pruned_trial_carries_the_slice(ctx):
    objective = StitchObjective(ctx, fidelity=0.15, min_slice=0)
    study = optuna.create_study(directions=objective.directions)
    # a front point better than any network on both objectives; stitched, so a stitched
    # config (gated against the stitched networks) meets it as well as any other config
    study.add_trial(
        optuna.trial.create_trial(values=[1.0, 1.0], user_attrs={attrs.KIND: "stitched"})
    )
    study.enqueue_trial({})
    study.optimize(objective, n_trials=1)
    trial = study.trials[-1]
    assert trial.state == optuna.trial.TrialState.PRUNED, trial.user_attrs
    n = len(ctx.labels("val"))
    assert trial.user_attrs[attrs.SLICE_IMAGES] == round(0.15 * n)
    low, high = trial.user_attrs[attrs.PARTIAL_INTERVAL]
    assert low <= trial.user_attrs[attrs.PARTIAL_ACCURACY] <= high
    assert trial.user_attrs[attrs.PRUNE_REASON].startswith("fidelity:")


def test_the_front_holds_references_within_budget():
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_user_attr(
        attrs.REFERENCES,
        [
            {"name": "a", "accuracy": 0.9, "macs": 100, "params": 5, "cka": 1.0},
            {"name": "b", "accuracy": 0.95, "macs": 900, "params": 5, "cka": 1.0},
        ],
    )
    assert current_front(study, NAMES, {}) == []  # no trial completed yet: no front
    study.add_trial(optuna.trial.create_trial(values=[0.5, 200.0]))  # dominated by "a"
    assert current_front(study, NAMES, {}) == [[0.9, 100.0], [0.95, 900.0]]
    assert current_front(study, NAMES, {"macs": 500}) == [[0.9, 100.0]]


def test_a_stitched_config_is_gated_against_the_stitched_networks_and_the_zoo(ctx):
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_user_attr(
        attrs.REFERENCES, [{"name": "a", "accuracy": 0.9, "macs": 900, "params": 5, "cka": 1.0}]
    )

    def add(accuracy: float, macs: float, kind: str) -> None:
        user = {attrs.KIND: kind}
        study.add_trial(optuna.trial.create_trial(values=[accuracy, macs], user_attrs=user))

    add(0.95, 100.0, "new stem")  # dominates every stitched network below
    assert current_front(study, NAMES, {}, "stitched") == []  # no stitched network yet
    add(0.8, 300.0, "stitched")
    add(0.7, 400.0, "stitched")  # dominated by the stitched one before it
    assert current_front(study, NAMES, {}) == [[0.95, 100.0]]
    assert current_front(study, NAMES, {}, "stitched") == [[0.8, 300.0], [0.9, 900.0]]
    objective = StitchObjective(ctx, fidelity=0.15, min_slice=0)
    single, _, stitched = _configs(ctx)
    assert objective.front(study, stitched) == [[0.8, 300.0], [0.9, 900.0]]
    assert objective.front(study, single) == objective.front(study) == [[0.95, 100.0]]


def test_ray_workers_apply_the_same_rule(ctx, tmp_path):
    ray = pytest.importorskip("ray")
    from stitch_nas.search import RayExecutor, create_study, run_search

    objective = StitchObjective(ctx, fidelity=0.15, min_slice=0)
    study = create_study(objective, tmp_path / "ray", sampler="random", seed=0)
    study.add_trial(  # dominates every network, stitched ones too (they are gated apart)
        optuna.trial.create_trial(values=[1.0, 1.0], user_attrs={attrs.KIND: "stitched"})
    )
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        run_search(objective, study, 3, executor=RayExecutor(workers=1))
    finally:
        ray.shutdown()
    gated = [t for t in study.trials[1:] if t.state == optuna.trial.TrialState.PRUNED]
    assert gated and all(attrs.SLICE_IMAGES in t.user_attrs for t in gated), [
        t.user_attrs.get(attrs.PRUNE_REASON) for t in study.trials[1:]
    ]


def test_a_trained_config_that_cannot_pay_is_pruned_before_training(ctx, monkeypatch):
    import stitch_nas.adapters._joint as joint

    trained = []
    real_train = joint.train
    monkeypatch.setattr(joint, "train", lambda *a, **k: trained.append(1) or real_train(*a, **k))
    cut_a, cut_b = ctx.cuts("resnet")[1], ctx.cuts("resnet")[2]
    config = StitchConfig(
        (Fragment("resnet", None, cut_a.name), Fragment("resnet", cut_b.name, None)),
        (AdapterSpec("linear", (("loss", "task"), ("steps", 4))),),
    )
    fidelity = Fidelity(0.15, tuple(NAMES), {})
    hopeless = evaluate_config(ctx, config, fidelity=fidelity, front=[[1.0, 1.0]])
    assert hopeless.status == "pruned", hopeless.reason
    assert hopeless.reason.startswith("before training, least squares: fidelity:")
    assert not trained  # pruned on its least-squares version: nothing trained
    kept = evaluate_config(ctx, config, fidelity=fidelity, front=[[0.0, 1e15]])
    assert kept.status == "complete", kept.reason
    assert trained  # one that could reach the front is trained and measured
