"""The fine-tune stage of a search: settings, choice of networks, recording, control, export."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import torch

from stitch_nas import attrs, load
from stitch_nas.cli import main
from stitch_nas.errors import ConfigError
from stitch_nas.finetune import Candidate, FinetuneRecipe, check_stage, choose
from stitch_nas.search import load_folder_study
from stitch_nas.settings import settings_from_dict
from stitch_nas.stitching import load_tuned

# on the digits mini zoo: a short recipe that lifts one of the front's stitched networks (seed 0)
RECIPE = {"lr": 0.001, "epochs": 3, "augment": False}


def test_settings_read_the_stage_and_its_recipe_and_round_trip() -> None:
    raw = {"finetune": {"enabled": True, "networks": 2, "control": True, "recipe": RECIPE}}
    settings = settings_from_dict(raw)
    assert settings.finetune.enabled and settings.finetune.networks == 2
    assert settings.finetune.recipe == FinetuneRecipe(**RECIPE)
    # the study stores asdict(settings); `stitch-nas export` reads it back
    again = settings_from_dict(json.loads(json.dumps(asdict(settings))))
    assert again == settings
    assert not settings_from_dict({}).finetune.enabled  # off unless asked for


def _candidate(number: int, accuracy: float, macs: float, cut: str = "a") -> Candidate:
    fragments = [{"model": "m", "start": None, "end": cut}, {"model": "n", "start": cut}]
    trial = SimpleNamespace(number=number, user_attrs={attrs.CONFIG: {"fragments": fragments}})
    return Candidate(trial, accuracy, macs, True)  # type: ignore[arg-type]


def test_choose_takes_the_most_accurate_per_band_of_macs_above_the_floor() -> None:
    pool = [
        _candidate(0, 0.40, 1e5, "lenet"),  # below the floor: never chosen
        _candidate(1, 0.91, 9e6, "b"),
        _candidate(2, 0.88, 1e7, "c"),  # the same band as #1, less accurate
        _candidate(3, 0.81, 2e7, "d"),  # alone in its band: chosen though the least accurate
        _candidate(4, 0.90, 9e7, "e"),
        _candidate(5, 0.92, 9e7, "e"),  # the same fragments as #4 (another adapter): one of them
    ]

    def numbers(count: int, floor: float, cost: bool = True) -> list[int]:
        chosen = choose(pool if cost else [replace(c, cost=None) for c in pool], count, floor)
        return [c.trial.number for c in chosen]

    assert numbers(3, 0.786) == [1, 3, 5]  # cheapest first
    assert numbers(4, 0.786) == [1, 2, 3, 5]  # an empty band's place: the most accurate left
    assert numbers(2, 0.786, cost=False) == [1, 5]  # no cost: the two most accurate
    assert numbers(9, 0.786) == [1, 2, 3, 5]
    assert numbers(3, 0.95) == []


def test_choose_takes_first_the_network_that_fills_most_of_the_zoo_fronts_gaps() -> None:
    """A LeNet-5 at 0.65 M MACs and a MobileNet at 10.1 M (the real zoo's front): the headroom
    lies between them. The most accurate network there, at nearly the MobileNet's MACs, covers
    little of it; one halfway covers most, and it is chosen before the bands."""
    from stitch_nas.report import interpolation_headroom

    zoo = [(0.67, 6.5e5), (0.936, 1.01e7), (0.93, 4.1e7), (0.94, 1.25e8)]
    pool = [
        _candidate(1, 0.86, 4e6, "halfway"),
        _candidate(2, 0.935, 1.0e7, "nearly the MobileNet"),
        _candidate(3, 0.91, 1.1e7, "c"),
        _candidate(4, 0.92, 4e7, "d"),
        _candidate(5, 0.90, 1.2e8, "e"),
    ]
    gain = {
        c.trial.number: interpolation_headroom(zoo, [(c.accuracy, c.cost)], 0.786).recovered
        for c in pool[:2]
    }
    assert gain[1] > gain[2] > 0
    assert [c.trial.number for c in choose(pool, 2, 0.786)] == [2, 4]  # bands alone
    assert [c.trial.number for c in choose(pool, 2, 0.786, zoo)] == [1, 4]
    assert [c.trial.number for c in choose(pool, 2, 0.9, zoo)] == [2, 4]  # the floor holds
    assert [c.trial.number for c in choose(pool, 2, 0.95, zoo)] == []


def test_the_control_is_the_zoo_front_and_the_models_it_names() -> None:
    """A LeNet, a MobileNet and a ResNet that the MobileNet dominates: the front is the first
    two; naming the ResNet adds it (a claim against it needs it trained as much)."""
    from stitch_nas.finetune._stage import control_models

    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_user_attr(attrs.OBJECTIVES, ["accuracy", "macs"])
    zoo = {"lenet": (0.67, 6.5e5), "mobilenet": (0.936, 1.0e7), "resnet44": (0.93, 9.8e7)}
    refs = [{"name": n, "accuracy": a, "macs": m} for n, (a, m) in zoo.items()]
    study.set_user_attr(attrs.REFERENCES, refs)

    def names(control: bool | list[str]) -> list[str]:
        return [r["name"] for r in control_models(study, control)]

    assert names(False) == []
    assert names(True) == ["lenet", "mobilenet"]
    assert names(["resnet44"]) == ["lenet", "mobilenet", "resnet44"]
    assert names(["mobilenet"]) == ["lenet", "mobilenet"]  # once
    assert settings_from_dict({"finetune": {"control": ["resnet44"]}}).finetune.control == [
        "resnet44"
    ]
    for bad in ("resnet44", [], ["a", "a"], [3]):
        with pytest.raises(ConfigError, match=r"finetune.control=.*give true"):
            settings_from_dict({"finetune": {"control": bad}})
    with pytest.raises(ConfigError, match=r"finetune.control names 'resnet50', not a zoo model"):
        check_stage(list(zoo), FinetuneRecipe(), ["resnet50"])


def test_a_teacher_the_zoo_lacks_or_too_large_an_ensemble_is_one_line() -> None:
    zoo = ["resnet", "vit"]
    with pytest.raises(ConfigError, match=r"finetune.teacher='convnet' is not a zoo model"):
        check_stage(zoo, FinetuneRecipe(teacher="convnet"))
    with pytest.raises(ConfigError, match=r"finetune.k=3 but the zoo has 2 model"):
        check_stage(zoo, FinetuneRecipe(k=3))
    check_stage(zoo, FinetuneRecipe(teacher="vit", k=3))  # k counts only for the ensemble


@pytest.mark.parametrize(
    ("stage", "named"),
    [
        ("recipe: {teacher: convnet}", "finetune.teacher='convnet'"),
        ("control: [resnet, resnet50]", "finetune.control names 'resnet50'"),
    ],
)
def test_a_bad_teacher_or_control_stops_the_search_before_its_study_exists(
    capsys, tmp_path, mini_zoo_dir, stage, named
) -> None:
    config = tmp_path / "ft.yaml"
    config.write_text(
        "search: {trials: 4}\n"
        f"zoo: {{cache_dir: {mini_zoo_dir}}}\n"
        f"finetune: {{enabled: true, {stage}}}\n"
    )
    code = main(["search", str(config), "--out", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and named in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out" / "study.db").exists()


@pytest.fixture(scope="module")
def searched(tmp_path_factory, mini_zoo_dir) -> SimpleNamespace:
    """A 30-trial digits search with the stage on (three networks, and the control)."""
    root = tmp_path_factory.mktemp("finetune_stage")
    config = root / "ft.yaml"
    recipe = ", ".join(f"{k}: {json.dumps(v)}" for k, v in RECIPE.items())
    config.write_text(
        "search: {trials: 30, seed: 0}\n"
        f"zoo: {{cache_dir: {mini_zoo_dir}}}\n"
        f"finetune: {{enabled: true, networks: 3, control: true, recipe: {{{recipe}}}}}\n"
    )
    out = root / "out"
    assert main(["search", str(config), "--out", str(out), "-q"]) == 0
    return SimpleNamespace(config=config, out=out, study=load_folder_study(out))


def _tuned(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials() if attrs.FINETUNES in t.user_attrs]


def test_the_stage_records_each_network_as_a_trial_with_its_recipe(searched) -> None:
    tuned = _tuned(searched.study)
    assert 1 <= len(tuned) <= 3
    by_number = {t.number: t for t in searched.study.get_trials()}
    recipe = FinetuneRecipe(**RECIPE).to_dict()
    kept = [t for t in tuned if t.state == optuna.trial.TrialState.COMPLETE]
    assert kept, "the recipe lifts at least one network of this search"
    for t in tuned:
        source = by_number[t.user_attrs[attrs.FINETUNES]]
        assert t.user_attrs[attrs.FINETUNED]["recipe"] == recipe
        assert t.user_attrs[attrs.CONFIG] == source.user_attrs[attrs.CONFIG]
        report = t.user_attrs[attrs.FINETUNED]["report"]
        if t.state == optuna.trial.TrialState.COMPLETE:
            # better on the held-out slice, so it was kept; costs are the source's
            assert report["best_epoch"] >= 1 and report["best_holdout"] > report["initial_holdout"]
            assert t.values[1] == source.values[1]  # MACs
            assert (searched.out / t.user_attrs[attrs.WEIGHTS]).is_file()
        else:  # no epoch beat the start: nothing new, recorded so --resume skips it
            assert report["best_epoch"] == 0 and attrs.WEIGHTS not in t.user_attrs


def test_the_control_trains_the_zoo_front_with_the_same_recipe(searched) -> None:
    control = searched.study.user_attrs[attrs.FINETUNE_CONTROL]
    assert control, "the zoo's front models were fine-tuned"
    recipes = {json.dumps(c["finetuned"]["recipe"], sort_keys=True) for c in control.values()}
    recipes |= {
        json.dumps(t.user_attrs[attrs.FINETUNED]["recipe"], sort_keys=True)
        for t in _tuned(searched.study)
    }
    assert len(recipes) == 1  # one recipe for the stitched networks and the control
    report = json.loads((searched.out / "pareto.json").read_text())
    assert report["hypervolume"]["test_control"] is not None
    claims = report["claims_against_control"]
    assert {c["reference"] for c in claims if c["finetuned"]} == set(control)


def test_a_fine_tuned_network_is_tested_exported_and_reloads_with_equal_outputs(
    searched, mini_zoo, digits
) -> None:
    from stitch_nas.activations import StitchContext
    from stitch_nas.config import StitchConfig

    kept = [t for t in _tuned(searched.study) if t.state == optuna.trial.TrialState.COMPLETE]
    tests = searched.study.user_attrs[attrs.TEST_RESULTS]
    front = {r["number"] for r in json.loads((searched.out / "pareto.json").read_text())["front"]}
    trial = kept[0]
    folder = searched.out / "models" / f"trial_{trial.number}"
    if trial.number not in front:  # the search exports its front; export this one by number
        assert main(["export", str(searched.out), "--trials", str(trial.number), "-q"]) == 0
    else:
        assert str(trial.number) in tests
    ctx = StitchContext(mini_zoo, digits)
    config = StitchConfig.from_dict(trial.user_attrs[attrs.CONFIG])
    net = load_tuned(ctx, config, searched.out / trial.user_attrs[attrs.WEIGHTS])
    loaded = load(folder)
    x = digits.test.read(torch.arange(16))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), net(x), atol=1e-5, rtol=1e-4)
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["metrics"]["accuracy"] == pytest.approx(trial.user_attrs["accuracy"])


def test_resuming_does_not_train_a_network_twice(searched) -> None:
    before = len(searched.study.get_trials())
    argv = ["search", str(searched.config), "--out", str(searched.out), "--resume", "--no-export"]
    code = main([*argv, "-q"])
    assert code == 0
    study = load_folder_study(searched.out)
    assert len(study.get_trials()) == before  # no new search trial, no new fine-tune


def test_weights_of_another_network_are_refused_in_one_line(searched, mini_zoo, digits) -> None:
    from stitch_nas.activations import StitchContext
    from stitch_nas.config import StitchConfig

    kept = [t for t in _tuned(searched.study) if attrs.WEIGHTS in t.user_attrs]
    ctx = StitchContext(mini_zoo, digits)
    other = StitchConfig.single("resnet")
    with pytest.raises(ConfigError, match="does not hold the weights of"):
        load_tuned(ctx, other, Path(searched.out) / kept[0].user_attrs[attrs.WEIGHTS])


def test_a_network_the_fidelity_gate_pruned_is_measured_whole_then_fine_tuned(
    searched, mini_zoo, digits, tmp_path
) -> None:
    """The gate prunes what cannot beat the front as it is, which fine-tuning changes: such a
    network is a candidate (by its slice's accuracy), measured on the whole split before it
    trains, and its record carries none of the slice's figures."""
    from stitch_nas.activations import StitchContext
    from stitch_nas.finetune import candidates, finetune_front
    from stitch_nas.report import stitched_trials

    lifted = {
        t.user_attrs[attrs.FINETUNES]
        for t in _tuned(searched.study)
        if t.state == optuna.trial.TrialState.COMPLETE
    }
    source = next(t for t in stitched_trials(searched.study) if t.number in lifted)
    study = optuna.create_study(directions=searched.study.directions)
    for key, value in searched.study.user_attrs.items():
        if key != attrs.FINETUNE_CONTROL:
            study.set_user_attr(key, value)
    kept = {k: v for k, v in source.user_attrs.items() if k in (attrs.CONFIG, attrs.DESCRIBE)}
    slice_figures = {
        attrs.PARTIAL_ACCURACY: 0.99,  # a slice can flatter: the whole split decides
        attrs.SLICE_IMAGES: 45,
        attrs.PARTIAL_INTERVAL: [0.9, 1.0],
        attrs.PRUNE_REASON: "fidelity: dominated",
        "macs": source.values[1],
        "params": source.user_attrs["params"],
    }
    study.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.PRUNED,
            params=source.params,
            distributions=source.distributions,
            user_attrs={**kept, **slice_figures},
        )
    )
    # the same network with a head fitted on the probe ends in features: no logits to train
    knn = {**kept[attrs.CONFIG], "head": {"kind": "knn"}}
    study.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.PRUNED,
            params=source.params,
            distributions=source.distributions,
            user_attrs={**kept, attrs.CONFIG: knn, **slice_figures},
        )
    )
    ctx = StitchContext(mini_zoo, digits)
    (pool,) = candidates(study, ctx)
    assert pool.trial.number == 0
    assert not pool.whole and pool.accuracy == 0.99 and pool.cost == source.values[1]
    assert candidates(study, ctx, {"macs": source.values[1] - 1}) == []  # pruned for a budget
    stage = finetune_front(study, ctx, FinetuneRecipe(**RECIPE), tmp_path, networks=1, floor=0.5)
    (tuned,) = stage.networks
    assert tuned.source == 0 and tuned.before == pytest.approx(source.values[0])  # whole split
    record = study.trials[tuned.trial]
    assert record.user_attrs[attrs.FINETUNES] == 0
    assert record.state == optuna.trial.TrialState.COMPLETE  # the recipe lifted it before
    assert not {attrs.PARTIAL_ACCURACY, attrs.SLICE_IMAGES, attrs.PARTIAL_INTERVAL} & set(
        record.user_attrs
    )
    assert attrs.PRUNE_REASON not in record.user_attrs
    assert record.values == [tuned.after, source.values[1]] and tuned.after > tuned.before
    assert record.user_attrs[attrs.KIND] == "stitched"
    assert record.user_attrs["split"] == "val"  # its measurement, as a completed trial records it
    assert record.user_attrs["accuracy"] == tuned.after
    assert (tmp_path / record.user_attrs[attrs.WEIGHTS]).is_file()


def _fresh_copy(study: optuna.Study) -> optuna.Study:
    """``study`` as it was before its fine-tune stage: the search's trials and attributes."""
    copy = optuna.create_study(directions=study.directions)
    for key, value in study.user_attrs.items():
        if key != attrs.FINETUNE_CONTROL:
            copy.set_user_attr(key, value)
    for trial in study.get_trials():
        if attrs.FINETUNES not in trial.user_attrs:
            copy.add_trial(trial)
    return copy


def test_ray_workers_fine_tune_each_network_as_this_process_does(
    searched, mini_zoo, digits, tmp_path
) -> None:
    """Two Ray workers train the stage's networks (and the control) one each, each network
    ending with the weights and figures it has when trained here with the same seed."""
    from safetensors.torch import load_file

    from stitch_nas.activations import StitchContext
    from stitch_nas.finetune import finetune_front
    from stitch_nas.search import RayExecutor

    recipe = FinetuneRecipe(**RECIPE)
    stages, studies = {}, {}
    for where, workers in (("here", None), ("ray", RayExecutor(workers=2))):
        studies[where] = _fresh_copy(searched.study)
        ctx = StitchContext(mini_zoo, digits)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as each worker runs (cpus_per_worker 1): the same sums
        try:
            stages[where] = finetune_front(
                studies[where],
                ctx,
                recipe,
                tmp_path / where,
                networks=3,
                control=True,
                workers=workers,
            )
        finally:
            torch.set_num_threads(threads)
    here, ray = stages["here"], stages["ray"]
    assert len(here.networks) + len(here.control) >= 2  # several jobs: Ray ran them
    assert [(t.source, t.before, t.after) for t in ray.networks] == [
        (t.source, t.before, t.after) for t in here.networks
    ]
    assert [(t.source, t.after) for t in ray.control] == [(t.source, t.after) for t in here.control]
    files = sorted(
        p.relative_to(tmp_path / "here") for p in (tmp_path / "here").rglob("*.safetensors")
    )
    assert files and files == sorted(
        p.relative_to(tmp_path / "ray") for p in (tmp_path / "ray").rglob("*.safetensors")
    )
    for name in files:
        a, b = load_file(tmp_path / "here" / name), load_file(tmp_path / "ray" / name)
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), (name, key)

    def control(study: optuna.Study) -> dict:  # what the control recorded, less its time
        recorded = json.loads(json.dumps(study.user_attrs[attrs.FINETUNE_CONTROL]))
        for entry in recorded.values():
            del entry["finetuned"]["report"]["seconds"]
        return recorded

    assert control(studies["here"]) == control(studies["ray"])
