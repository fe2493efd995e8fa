"""Tests of stitch_nas.report on small hand-built Optuna studies with hand-computed answers."""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState, create_trial

from stitch_nas.errors import ConfigError
from stitch_nas.report import (
    dominated_references,
    front_hypervolume,
    hypervolume,
    pareto_trials,
    write_report,
)
from tests._hypervolume import grid_hypervolume

optuna.logging.set_verbosity(optuna.logging.WARNING)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REFERENCES = [
    {"name": "resnet", "accuracy": 0.75, "macs": 250, "params": 25, "cka": 1.0},
    {"name": "vit", "accuracy": 0.92, "macs": 500, "params": 50, "cka": 1.0},
    {"name": "tiny", "accuracy": 0.55, "macs": 150, "params": 15, "cka": 1.0},
]


def _config(models: tuple[str, ...]) -> dict[str, Any]:
    last = len(models) - 1
    fragments = [
        {"model": m, "start": None if i == 0 else "mid", "end": None if i == last else "mid"}
        for i, m in enumerate(models)
    ]
    adapters = [{"kind": "lstsq", "options": {}}] * last
    return {"fragments": fragments, "adapters": adapters, "head": {"kind": "native", "options": {}}}


def _done(values: list[float], models: tuple[str, ...] = ("resnet", "vit"), **kw: Any):
    attrs = {
        "config": _config(models),
        "describe": " -lstsq-> ".join(f"{m}[..]" for m in models),
        "models": list(dict.fromkeys(models)),
        "kind": "stitched" if len(models) > 1 else "zoo model",
        "accuracy": values[0],
        "macs": values[1],
        "params": values[2] if len(values) > 2 else values[1] // 10,
        "cka": 0.8,
    }
    return create_trial(values=values, user_attrs=attrs, **kw)


@pytest.fixture
def study() -> optuna.Study:
    """Accuracy (max) vs MACs (min); front = #4 (single model), #1, #8, #0 by MACs."""
    s = optuna.create_study(directions=["maximize", "minimize"])
    s.set_user_attr("objectives", ["accuracy", "macs"])
    s.set_user_attr("references", REFERENCES)
    s.add_trial(_done([0.90, 400]))  # 0: front
    s.add_trial(_done([0.80, 200]))  # 1: front, dominates resnet
    s.add_trial(_done([0.70, 300]))  # 2: dominated by #1
    s.add_trial(_done([0.95, 100], constraints={"max_latency": 1.0}))  # 3: infeasible
    s.add_trial(_done([0.60, 100], models=("resnet",)))  # 4: front, single model, beats tiny
    s.add_trial(create_trial(state=TrialState.PRUNED, user_attrs={"prune_reason": "cka < 0.2"}))
    s.add_trial(create_trial(state=TrialState.FAIL, user_attrs={"fail_reason": "OOM"}))
    s.add_trial(create_trial(state=TrialState.RUNNING))
    # 8: feasible, constraint stored the way set_constraint stores it
    s.add_trial(_done([0.85, 300], system_attrs={"constraints:max_latency": -0.5}))
    return s


def test_pareto_is_the_feasible_nondominated_set_sorted_by_cost(study: optuna.Study) -> None:
    assert [t.number for t in pareto_trials(study)] == [4, 1, 8, 0]


def test_hypervolume_2d_by_hand() -> None:
    pts = [[1, 3], [2, 2], [3, 1], [3, 3]]  # the last one is dominated
    assert hypervolume(pts, ["minimize", "minimize"], [4, 4]) == pytest.approx(6.0)
    # Maximising the first objective: the same boxes, mirrored.
    mirrored = [[-1, 3], [-2, 2], [-3, 1]]
    assert hypervolume(mirrored, ["maximize", "minimize"], [-4, 4]) == pytest.approx(6.0)
    assert hypervolume([[5, 1]], ["minimize", "minimize"], [4, 4]) == 0.0  # beyond the reference
    assert hypervolume([], ["minimize", "minimize"], [4, 4]) == 0.0


def test_hypervolume_3d_by_hand() -> None:
    # Three unit-offset boxes in [0, 2]^3: 3 * 2 - 3 * 1 + 1 = 4 by inclusion-exclusion.
    pts = [[0, 1, 1], [1, 0, 1], [1, 1, 0]]
    assert hypervolume(pts, ["minimize"] * 3, [2, 2, 2]) == pytest.approx(4.0)
    assert hypervolume([[0, 0, 0], [0.5, 0.5, 0.5]], ["minimize"] * 3, [1, 2, 3]) == 6.0


def test_hypervolume_matches_a_brute_force_grid_in_2_to_4_dimensions() -> None:
    rng = np.random.default_rng(0)
    for dim, n in ((2, 30), (3, 30), (4, 12)):
        pts = rng.uniform(size=(n, dim))
        ref = np.full(dim, 1.1)
        expected = grid_hypervolume(pts, ref)
        assert expected > 0.0
        assert hypervolume(pts, ["minimize"] * dim, ref) == pytest.approx(expected, rel=1e-9)


def test_hypervolume_rejects_bad_shapes() -> None:
    with pytest.raises(ConfigError):
        hypervolume([[1, 2, 3]], ["minimize", "minimize"], [4, 4])
    with pytest.raises(ConfigError):
        hypervolume([[1, 2]], ["minimize", "sideways"], [4, 4])
    with pytest.raises(ConfigError):
        hypervolume([[1, float("nan")]], ["minimize", "minimize"], [4, 4])


def test_front_hypervolume_2d_normalised(study: optuna.Study) -> None:
    # Worst MACs = 1.1 * 500 (vit) = 550; best accuracy 1 -> box 1 x 550. Summing accuracy over
    # MACs slabs: front 0.6*100 + 0.8*100 + 0.85*100 + 0.9*150 = 360;
    # references 0.55*100 + 0.75*250 + 0.92*50 = 288.5; both 60 + 80 + 85 + 90 + 46 = 361.
    hv = front_hypervolume(study)
    assert hv["hypervolume"] == pytest.approx(360 / 550)
    assert hv["reference_hypervolume"] == pytest.approx(288.5 / 550)
    assert hv["combined_hypervolume"] == pytest.approx(361 / 550)
    assert hv["extends_front"] is True
    assert hv["reference_point"] == pytest.approx([0.0, 550.0])


def test_front_hypervolume_3d_normalised() -> None:
    s = optuna.create_study(directions=["maximize", "minimize", "minimize"])
    s.set_user_attr("objectives", ["accuracy", "macs", "params"])
    for values in ([0.9, 100, 10], [0.8, 50, 20], [0.7, 120, 30], [0.85, 200, 5]):
        s.add_trial(_done(values))
    assert [t.number for t in pareto_trials(s)] == [1, 0, 3]
    # Box 1 x 220 x 33. Gains (acc, 220 - macs, 33 - params): a (.9,120,23), b (.8,170,13),
    # d (.85,20,28); inclusion-exclusion 2484 + 1768 + 476 - 1248 - 391 - 208 + 208 = 3089.
    assert front_hypervolume(s)["hypervolume"] == pytest.approx(3089 / 7260)
    assert front_hypervolume(s)["reference_hypervolume"] == 0.0


def test_dominated_references(study: optuna.Study) -> None:
    assert dominated_references(study) == [
        {"reference": "resnet", "dominated_by": [1], "dominated_by_stitched": [1]},
        {"reference": "vit", "dominated_by": [], "dominated_by_stitched": []},
        {"reference": "tiny", "dominated_by": [4], "dominated_by_stitched": []},
    ]


def test_write_report_files(study: optuna.Study, tmp_path: Path) -> None:
    summary = write_report(study, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "pareto.json",
        "pareto.png",
        "report.html",
        "trials.csv",
    ]  # no temp file left behind
    with summary.csv_path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(study.trials) == 9
    assert [r["state"] for r in rows] == [t.state.name for t in study.trials]
    assert {r["state"] for r in rows} == {"COMPLETE", "PRUNED", "FAIL", "RUNNING"}
    assert [r["number"] for r in rows if r["is_pareto"] == "True"] == ["0", "1", "4", "8"]
    assert rows[3]["feasible"] == "False" and rows[8]["feasible"] == "True"
    assert rows[5]["value_accuracy"] == "" and rows[5]["prune_reason"] == "cka < 0.2"
    assert rows[6]["fail_reason"] == "OOM"
    assert rows[0]["models"] == "resnet+vit" and rows[0]["n_fragments"] == "2"
    assert json.loads(rows[0]["config"])["fragments"][1]["model"] == "vit"

    data = json.loads(summary.json_path.read_text())
    assert {"objectives", "directions", "hypervolume", "front", "data", "intervals"} <= set(data)
    assert {"references", "claims", "domination_rule", "counts"} <= set(data)
    assert data["directions"] == ["maximize", "minimize"]
    assert [r["number"] for r in data["front"]] == [4, 1, 8, 0]
    assert data["front"][1]["values"] == [0.8, 200] and data["front"][1]["models"] == [
        "resnet",
        "vit",
    ]
    assert data["counts"]["COMPLETE"] == 6 and data["counts"]["PRUNED"] == 1
    assert data["counts"]["FAIL"] == 1 and data["counts"]["RUNNING"] == 1
    assert data["hypervolume"]["val"]["front"] == pytest.approx(360 / 550)
    assert data["hypervolume"]["val"]["zoo"] == pytest.approx(288.5 / 550)
    assert data["hypervolume"]["val"]["union"] == pytest.approx(361 / 550)
    assert data["hypervolume"]["test"] is None  # never measured on test
    assert data["hypervolume"]["reference_point"] == [0.0, pytest.approx(550.0)]
    # no image counts recorded: no interval, no test figure, no claim
    assert (
        data["front"][0]["accuracy_interval"] is None and data["front"][0]["test_accuracy"] is None
    )
    assert {c["status"] for c in data["claims"]} == {"no_test"}

    png = summary.png_path.read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 1000


def test_table(study: optuna.Study, tmp_path: Path) -> None:
    table = write_report(study, tmp_path).table()
    for name in ("resnet", "vit", "tiny"):
        assert name in table
    # without test figures nothing is claimed, and nothing says the search "extends" the zoo
    assert "dominated by" not in table and "extends" not in table
    assert "resnet: no claim, no test figures" in table
    assert "test       (not measured" in table
    assert "validation     0.5245       0.6545       0.6564" in table
    assert "zoo model: resnet[..]" in table and "stitched: resnet[..] -lstsq-> vit[..]" in table
    assert "200" in table


@pytest.mark.parametrize("states", [(), (TrialState.PRUNED, TrialState.FAIL)])
def test_study_without_completed_trial(tmp_path: Path, states: tuple[TrialState, ...]) -> None:
    s = optuna.create_study(directions=["maximize", "minimize"])
    s.set_user_attr("objectives", ["accuracy", "macs"])
    s.set_user_attr("references", REFERENCES)
    for state in states:
        s.add_trial(create_trial(state=state))
    summary = write_report(s, tmp_path)
    assert summary.front == [] and summary.hypervolume == 0.0
    with summary.csv_path.open(newline="") as fh:
        assert len(list(csv.DictReader(fh))) == len(states)
    assert json.loads(summary.json_path.read_text())["front"] == []
    assert summary.png_path.read_bytes().startswith(PNG_MAGIC)
    assert "no completed trial" in summary.table()


def test_objective_names_must_match_directions(study: optuna.Study, tmp_path: Path) -> None:
    study.set_user_attr("objectives", ["accuracy"])
    with pytest.raises(ConfigError):
        write_report(study, tmp_path)


def test_pyplot_is_not_imported(tmp_path: Path) -> None:
    """write_report draws with matplotlib's object API, never pyplot (which picks a GUI backend
    on import): checked in a fresh interpreter, as other tests may have imported pyplot here."""
    import subprocess

    code = (
        "import sys\n"
        "import optuna\n"
        "from stitch_nas.report import write_report\n"
        "from tests.test_report import REFERENCES, _done\n"
        "s = optuna.create_study(directions=['maximize', 'minimize'])\n"
        "s.set_user_attr('objectives', ['accuracy', 'macs'])\n"
        "s.set_user_attr('references', REFERENCES)\n"
        "s.add_trial(_done([0.9, 400]))\n"
        "s.add_trial(_done([0.8, 200]))\n"
        "write_report(s, sys.argv[1])\n"
        "assert 'matplotlib' in sys.modules, 'no plot drawn'\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'write_report imported pyplot'\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "pareto.png").is_file()
