"""Accuracy intervals, claims on the test split, and the test pass on the mini zoo."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.trial import create_trial

from stitch_nas import attrs
from stitch_nas.errors import ConfigError
from stitch_nas.report import (
    dominated_references,
    holdout_trials,
    hypervolume,
    split_hypervolumes,
    stitched_front,
    wilson_interval,
    write_report,
    zoo_claims,
)
from tests._hypervolume import grid_hypervolume

optuna.logging.set_verbosity(optuna.logging.WARNING)

N_VAL, N_TEST = 300, 369


def test_wilson_interval_by_hand() -> None:
    # 8 of 10: p = 0.8, z^2 = 3.8414588, 1 + z^2/n = 1.38414588,
    # centre (0.8 + 0.19207294) / 1.38414588 = 0.71674016,
    # half 1.95996398 * sqrt(0.016 + 0.00960365) / 1.38414588 = 0.22657769
    # -> [0.49016247, 0.94331785] (the textbook value 0.4902 - 0.9433)
    low, high = wilson_interval(0.8, 10)
    assert low == pytest.approx(0.49016247, abs=1e-8)
    assert high == pytest.approx(0.94331785, abs=1e-8)
    # 0 of 10: [0, z^2 / (n + z^2)] = [0, 3.841459 / 13.841459]
    assert wilson_interval(0.0, 10) == pytest.approx((0.0, 0.277533), abs=1e-6)
    # all right: the interval does not collapse to a point, unlike p +- z sqrt(p(1-p)/n)
    low, high = wilson_interval(1.0, N_TEST)
    assert high == 1.0 and low == pytest.approx(N_TEST / (N_TEST + 1.959963984540054**2))


def test_wilson_interval_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    for k, n in ((292, 300), (355, 369), (1, 7), (500, 1000)):
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert wilson_interval(k / n, n) == pytest.approx((ci.low, ci.high), abs=1e-12)


def test_an_accuracy_that_is_no_image_count_is_refused() -> None:
    with pytest.raises(ConfigError, match="count of correct images out of 300"):
        wilson_interval(0.5004, 300)
    with pytest.raises(ConfigError):
        wilson_interval(0.5, 0)


def _stitched(accuracy: float, macs: float, kind: str = "stitched") -> Any:
    config = {
        "fragments": [
            {"model": "a", "start": None, "end": "x"},
            {"model": "b", "start": "y", "end": None},
        ],
        "adapters": [{"kind": "lstsq", "options": {}}],
        "head": {"kind": "native", "options": {}},
    }
    user = {
        attrs.CONFIG: config,
        attrs.DESCRIBE: "a[input:x] -lstsq-> b[y:output]",
        attrs.MODELS: ["a", "b"],
        attrs.KIND: kind,
        "accuracy": accuracy,
        "macs": macs,
        "params": 10,
        attrs.CKA: 0.9,
    }
    return create_trial(values=[accuracy, macs], user_attrs=user)


def _study(zoo: dict[str, tuple[int, int, float]], trials: list[tuple[int, int, float]]):
    """Zoo models and stitched trials as (val correct of 300, test correct of 369, MACs)."""
    s = optuna.create_study(directions=["maximize", "minimize"])
    s.set_user_attr(attrs.OBJECTIVES, ["accuracy", "macs"])
    refs = [
        {"name": name, "accuracy": v / N_VAL, "macs": m, "params": 20, "cka": 1.0}
        | {attrs.TEST_ACCURACY: t / N_TEST}
        for name, (v, t, m) in zoo.items()
    ]
    s.set_user_attr(attrs.REFERENCES, refs)
    s.set_user_attr(attrs.SPLIT_SIZES, {"data": "toy", "val": N_VAL, "test": N_TEST})
    for v, _, m in trials:
        s.add_trial(_stitched(v / N_VAL, m))
    s.set_user_attr(attrs.TEST_RESULTS, {str(i): t / N_TEST for i, (_, t, _) in enumerate(trials)})
    return s


def test_one_image_better_on_validation_and_worse_on_test_is_no_domination(tmp_path: Path) -> None:
    # #0 beats the zoo model by one validation image at a quarter of its MACs, but on test it
    # gets 3 images fewer right: plain dominance on the search's values says "dominated", the
    # report must not.
    study = _study({"resnet": (291, 358, 4e6)}, [(292, 355, 1e6)])
    assert dominated_references(study)[0]["dominated_by_stitched"] == [0]  # the old, naive claim
    claim = zoo_claims(study)[0]
    assert claim["status"] == "judged" and claim["dominated_by"] == []
    assert claim["matched_by"] == [0]  # 358/369 lies inside #0's test interval
    summary = write_report(study, tmp_path)
    table = summary.table()
    assert "dominated by" not in table and "extends" not in table
    assert "resnet (test 0.9702): no stitched network dominates it; within noise" in table
    data = json.loads(summary.json_path.read_text())
    assert data["claims"][0]["dominated_by"] == [] and data["claims"][0]["matched_by"] == [0]
    assert data["front"][0]["test_accuracy"] == pytest.approx(355 / 369)
    assert data["front"][0]["test_accuracy_interval"] == pytest.approx(
        list(wilson_interval(355 / 369, N_TEST))
    )
    assert data["references"][0]["accuracy_interval"] == pytest.approx(
        list(wilson_interval(291 / 300, N_VAL))
    )


def test_domination_needs_the_interval_above_and_no_higher_cost(tmp_path: Path) -> None:
    zoo = {"big": (250, 300, 4e6), "cheap": (250, 300, 0.5e6), "strong": (299, 368, 4e6)}
    # #0: 369/369 on test, its interval's lower end (0.9897) is above 300/369 = 0.813;
    # #1: 310/369 is 0.840, its interval [0.799, 0.875] holds 0.813: within noise
    study = _study(zoo, [(280, 369, 1e6), (260, 310, 0.9e6)])
    claims = {c["reference"]: c for c in zoo_claims(study)}
    assert claims["big"]["dominated_by"] == [0] and claims["big"]["matched_by"] == [1]
    # cheaper than every stitched network: no claim whatever the accuracy
    assert claims["cheap"]["dominated_by"] == [] and claims["cheap"]["matched_by"] == []
    # 368/369 is inside #0's interval [0.9897, 1]; #1 is far below: worse, not "within noise"
    assert claims["strong"]["dominated_by"] == [] and claims["strong"]["matched_by"] == [0]
    table = write_report(study, tmp_path).table()
    assert "big (test 0.8130): dominated by stitched #0 (1.0000 [0.990, 1.000])" in table


def test_no_test_figures_no_claim() -> None:
    study = _study({"resnet": (291, 358, 4e6)}, [(299, 369, 1e6)])
    study.set_user_attr(attrs.TEST_RESULTS, {})
    assert zoo_claims(study)[0]["status"] == "no_test"
    assert split_hypervolumes(study)["test"] is None


def test_hypervolumes_on_both_splits_by_hand() -> None:
    study = _study({"z": (240, 300, 4e6)}, [(270, 350, 1e6), (150, 200, 0.5e6)])
    hv = split_hypervolumes(study)
    # box: accuracy 0..1, MACs 0..4.4M (1.1 x the largest cost); areas in accuracy x MACs
    worst = 4.4e6
    assert hv["reference_point"] == pytest.approx([0.0, worst])
    val_front = (0.5 * 0.5e6 + 0.9 * 3.4e6) / worst
    test_front = (200 / 369 * 0.5e6 + 350 / 369 * 3.4e6) / worst
    assert hv["val"]["front"] == pytest.approx(val_front)
    assert hv["val"]["zoo"] == pytest.approx(0.8 * 0.4e6 / worst)
    assert hv["val"]["union"] == pytest.approx(val_front)  # the zoo model is dominated on val
    assert hv["test"]["front"] == pytest.approx(test_front)
    assert hv["test"]["zoo"] == pytest.approx(300 / 369 * 0.4e6 / worst)


def test_the_stitched_networks_own_front_is_measured_and_judged(tmp_path: Path) -> None:
    # #0, a model with a new stem, dominates the stitched #1 and #2 on validation; #2 is
    # dominated by #1 too. The claims count stitched networks apart, so #1 is measured on test.
    study = _study({"z": (240, 300, 4e6)}, [])
    study.add_trial(_stitched(290 / N_VAL, 1e6, kind="new stem"))
    study.add_trial(_stitched(280 / N_VAL, 2e6))
    study.add_trial(_stitched(270 / N_VAL, 3e6))
    assert [t.number for t in stitched_front(study)] == [1]
    assert [t.number for t in holdout_trials(study)] == [0, 1]
    study.set_user_attr(attrs.TEST_RESULTS, {"0": 360 / N_TEST, "1": 350 / N_TEST})
    hv = split_hypervolumes(study)
    worst = 4.4e6  # 1.1 x the zoo model's MACs
    # #1 (350/369 at 2M MACs) dominates z on test: the union is its own box
    assert hv["test"]["stitched_union"] == pytest.approx(350 / 369 * 2.4e6 / worst)
    assert hv["val"]["union"] == pytest.approx(290 / 300 * 3.4e6 / worst)
    claim = zoo_claims(study)[0]
    assert claim["dominated_by"] == [1] and claim["dominated_by_other"] == [0]
    summary = write_report(study, tmp_path)
    assert [r["number"] for r in summary.stitched] == [1]
    assert "z (test 0.8130): dominated by stitched #1 (0.9485" in summary.table()
    data = json.loads(summary.json_path.read_text())
    assert [r["number"] for r in data["stitched_front"]] == [1]


def test_report_files_show_the_test_split(tmp_path: Path) -> None:
    study = _study({"resnet": (291, 358, 4e6)}, [(292, 355, 1e6)])
    summary = write_report(study, tmp_path)
    html = summary.html_path.read_text()
    # the two splits' panels, then the hypervolume history
    assert html.count("<svg") == 3 and "test, used by no choice (369 images)" in html
    assert "hypervolume of front + zoo (validation), by trial number" in html
    assert "<title>#0\na[input:x] -lstsq-&gt; b[y:output]" in html  # what a hover shows
    assert "&quot;fragments&quot;" in html
    header, row = summary.csv_path.read_text().splitlines()[:2]
    cells = dict(zip(header.split(","), row.split(","), strict=False))
    assert float(cells["test_accuracy"]) == pytest.approx(355 / 369)
    assert float(cells["accuracy_low"]) == pytest.approx(wilson_interval(292 / 300, 300)[0])
    assert summary.png_path.read_bytes()[:4] == b"\x89PNG"


def test_the_grid_reference_by_hand() -> None:
    # two boxes of 2 x 1 and 1 x 2 overlapping in a 1 x 1 square: 3; a dominated point adds 0
    points = np.array([[1.0, 2.0], [2.0, 1.0], [2.5, 2.5]])
    assert grid_hypervolume(points, np.array([3.0, 3.0])) == 3.0
    # a 2 x 2 x 2 cube and a 3 x 3 x 1 slab overlapping in 2 x 2 x 1: 8 + 9 - 4
    cube = np.array([[1.0, 1.0, 1.0], [0.0, 0.0, 2.0]])
    assert grid_hypervolume(cube, np.array([3.0, 3.0, 3.0])) == 8.0 + 9.0 - 4.0
    assert grid_hypervolume(np.array([[3.0, 1.0]]), np.array([3.0, 3.0])) == 0.0  # on the edge


def test_hypervolume_matches_a_brute_force_grid_on_random_fronts() -> None:
    rng = np.random.default_rng(12)
    for case in range(200):
        dims = 2 if case % 5 else 3
        n = int(rng.integers(1, 40 if dims == 2 else 12))
        if case % 2 and dims == 2:  # a true front: x up, y down
            x, y = np.sort(rng.uniform(0, 1, n)), np.sort(rng.uniform(0, 1, n))[::-1]
            points = np.stack([x, y], axis=1)
        else:  # any cloud, with dominated points and ties
            points = (
                rng.choice([0.1, 0.3, 0.5], size=(n, dims))
                if case % 4 == 0
                else rng.random((n, dims))
            )
        scale = 10.0 ** rng.uniform(-3, 7, size=dims)  # accuracy-like and MAC-like magnitudes
        points = points * scale
        ref = scale * rng.uniform(1.0, 1.5, size=dims)
        expected = grid_hypervolume(points, ref)
        assert expected > 0.0
        got = hypervolume(points, ["minimize"] * dims, ref)
        assert got == pytest.approx(expected, rel=1e-9, abs=0.0), (case, points, ref)
        # the first objective as accuracy (maximised): mirrored, same volume
        flip = np.array([-1.0] + [1.0] * (dims - 1))
        got = hypervolume(points * flip, ["maximize"] + ["minimize"] * (dims - 1), ref * flip)
        assert math.isclose(got, expected, rel_tol=1e-9)


@pytest.mark.slow  # the default suite's variant, through `stitch-nas report`: tests/test_cli.py::
# test_report_and_export_read_a_study_kept_in_a_journal_file (measures and refuses alike)
def test_measure_holdout_on_the_mini_zoo(mini_zoo, digits, tmp_path: Path) -> None:
    from stitch_nas.activations import StitchContext
    from stitch_nas.report import holdout_accuracies, holdout_missing, measure_holdout
    from stitch_nas.search import StitchObjective, create_study, run_search

    ctx = StitchContext(mini_zoo, digits)
    objective = StitchObjective(ctx, cka_threshold=0.0)
    study = create_study(objective, tmp_path / "run", sampler="random", seed=1)
    run_search(objective, study, 6)
    done = measure_holdout(study, ctx)
    assert done.n_images == len(digits.test) and done.references == mini_zoo.names()
    tests = holdout_accuracies(study)
    assert sorted(tests) == sorted(done.trials) and tests
    for value in tests.values():  # a count of correct test images
        assert abs(value * len(digits.test) - round(value * len(digits.test))) < 1e-3
    assert holdout_missing(study) == ([], [])
    assert measure_holdout(study, ctx).trials == []  # recorded figures are kept
    summary = write_report(study, tmp_path)
    assert summary.hypervolumes["test"] is not None
    assert {c["status"] for c in summary.claims} == {"judged"}
    # a network that no longer measures what the search recorded gets no test figure
    study.set_user_attr(attrs.TEST_RESULTS, {})
    refs = study.user_attrs[attrs.REFERENCES]
    refs[0]["accuracy"] = 0.5
    refs[0]["sample_correct"] //= 2  # the figure a rebuilt network is checked against
    for ref in refs:
        ref.pop(attrs.TEST_ACCURACY)
    study.set_user_attr(attrs.REFERENCES, refs)
    with pytest.raises(ConfigError, match="validation accuracy"):
        measure_holdout(study, ctx)
    # a record of an older study, which counted no sample, is measured on the whole split
    del refs[0]["sample_correct"], refs[0]["sample_images"]
    study.set_user_attr(attrs.REFERENCES, refs)
    with pytest.raises(ConfigError, match="measures validation accuracy .*recorded 0.5000"):
        measure_holdout(study, ctx)
