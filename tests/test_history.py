"""Tests of the hypervolume history: trials.csv's column, the printed line, the time axis, cost."""

from __future__ import annotations

import csv
import datetime as dt
import re
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState, create_trial

from stitch_nas import attrs
from stitch_nas.report import _history, hypervolume_history, split_hypervolumes, write_report
from tests._hypervolume import grid_hypervolume
from tests.test_report import REFERENCES, _done

optuna.logging.set_verbosity(optuna.logging.WARNING)

T0 = dt.datetime(2026, 1, 1, 12, 0, 0)


def _timed(trial, start: float, end: float):
    trial.datetime_start = T0 + dt.timedelta(seconds=start)
    trial.datetime_complete = T0 + dt.timedelta(seconds=end)
    return trial


def _random_study(n: int, seed: int, n_obj: int = 2) -> optuna.Study:
    """Accuracy (max) against one or two costs (min), with a few pruned and infeasible trials."""
    rng = np.random.default_rng(seed)
    directions = ["maximize"] + ["minimize"] * (n_obj - 1)
    s = optuna.create_study(directions=directions)
    s.set_user_attr("objectives", ["accuracy", "macs", "params"][:n_obj])
    s.set_user_attr("references", REFERENCES)
    for i in range(n):
        if i % 7 == 3:
            s.add_trial(create_trial(state=TrialState.PRUNED))
            continue
        values = [float(rng.uniform(0.3, 0.97)), float(rng.integers(50, 600))]
        values += [float(rng.integers(5, 60))] * (n_obj > 2)
        bad = {"max_macs": 1.0} if i % 11 == 5 else None
        s.add_trial(create_trial(values=values, constraints=bad))
    return s


def _brute(study: optuna.Study, upto: int, only: list[int] | None = None) -> float:
    """The normalised union hypervolume from scratch over trials numbered <= upto (or the
    trials ``only`` names)."""
    from stitch_nas.report import hypervolume_box, reference_values

    names = study.user_attrs["objectives"]
    worst, ideal = hypervolume_box(study)
    sign = np.array([-1.0 if d.name == "MAXIMIZE" else 1.0 for d in study.directions])
    pts = [reference_values(r, names) for r in REFERENCES]
    pts += [
        list(t.values)
        for t in study.trials
        if (t.number <= upto if only is None else t.number in only)
        and t.state == TrialState.COMPLETE
        and all(v <= 0 for v in t.constraints.values())
    ]
    box = float(np.prod(np.abs(np.subtract(ideal, worst))))
    return grid_hypervolume(np.asarray(pts) * sign, np.asarray(worst) * sign) / box


@pytest.mark.parametrize("n_obj", [2, 3])
def test_history_matches_a_recompute_from_scratch_after_every_trial(n_obj: int) -> None:
    study = _random_study(40, seed=n_obj, n_obj=n_obj)
    history = hypervolume_history(study)
    assert history.numbers == list(range(40))
    expected = [_brute(study, n) for n in range(40)]
    assert history.by_number == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert history.zoo == pytest.approx(split_hypervolumes(study)["val"]["zoo"])
    assert history.final == pytest.approx(split_hypervolumes(study)["val"]["union"], rel=1e-12)


def test_trials_csv_column_is_non_decreasing_and_ends_at_the_reports_hypervolume(
    tmp_path: Path,
) -> None:
    study = _random_study(60, seed=1)
    # a fine-tune trial counts at its own position, like any other trial
    study.add_trial(_finetuned(0.99, 120))
    summary = write_report(study, tmp_path)
    with summary.csv_path.open(newline="") as fh:
        column = [float(r["hypervolume_so_far"]) for r in csv.DictReader(fh)]
    assert len(column) == 61
    assert all(b >= a for a, b in zip(column, column[1:], strict=False))
    assert column[-1] == pytest.approx(summary.hypervolumes["val"]["union"], rel=1e-12)
    assert column[-1] > column[-2]  # the fine-tuned network joined the front at #60
    assert column[0] >= summary.hypervolumes["val"]["zoo"]


def _finetuned(acc: float, macs: float):
    trial = _done([acc, macs])
    trial.user_attrs[attrs.FINETUNES] = 1
    return trial


def test_the_printed_line_says_what_the_last_fifth_of_trials_added(tmp_path: Path) -> None:
    study = _random_study(50, seed=4)
    summary = write_report(study, tmp_path)
    with summary.csv_path.open(newline="") as fh:
        column = [float(r["hypervolume_so_far"]) for r in csv.DictReader(fh)]
    line = next(ln for ln in summary.table().splitlines() if "last 20 % of trials" in ln)
    found = re.search(
        r"reference point accuracy 0, macs (\S+)\): ([\d.]+); the last 20 % of trials "
        r"\(#(\d+)–#(\d+)\) added ([+-][\d.]+) \(([+-][\d.]+) %\)",
        line,
    )
    assert found, line
    ref, final, first, last, gain, share = found.groups()
    assert ref == "1.1K" or ref.endswith(("K", "M")) or float(ref) > 0
    assert (int(first), int(last)) == (40, 49)
    assert float(final) == pytest.approx(summary.hypervolumes["val"]["union"], abs=5e-5)
    assert float(gain) == pytest.approx(column[-1] - column[39], abs=5e-5)
    assert float(share) == pytest.approx(100 * (column[-1] - column[39]) / column[39], abs=0.05)
    assert line in summary.html_path.read_text()


def test_wall_clock_history_follows_completion_time_not_numbers() -> None:
    s = optuna.create_study(directions=["maximize", "minimize"])
    s.set_user_attr("objectives", ["accuracy", "macs"])
    s.set_user_attr("references", REFERENCES)
    s.add_trial(_timed(_done([0.80, 200]), 5, 100))  # 0: ends last
    s.add_trial(_timed(_done([0.60, 100]), 10, 20))  # 1: ends first
    s.add_trial(_timed(create_trial(state=TrialState.FAIL), 0, 30))  # 2: starts first
    s.add_trial(_timed(_done([0.70, 300]), 30, 50))  # 3: dominated by #0 and vit
    history = hypervolume_history(s)
    assert history.seconds == [20.0, 50.0, 100.0]
    unions = [_brute(s, n) for n in range(4)]
    # once #1 ended (alone), once #3 ended (nothing new), once #0 ended: everything
    assert history.by_time[0] == pytest.approx(_brute(s, 3, only=[1]))
    assert history.by_time[1] == pytest.approx(history.by_time[0])
    assert history.by_time[2] == pytest.approx(unions[-1])
    assert history.by_number == pytest.approx(unions)


def test_the_front_is_recomputed_only_when_a_trial_joins_it(monkeypatch) -> None:
    """1,000 trials: the hypervolume is computed only for the trials that join the front."""
    s = optuna.create_study(directions=["maximize", "minimize"])
    s.set_user_attr("objectives", ["accuracy", "macs"])
    s.set_user_attr("references", REFERENCES)
    rng = np.random.default_rng(0)
    joins = 0
    best = 0.5
    for i in range(1000):
        if i % 50 == 0:  # a new best at the same cost: joins the front
            best += 0.004
            s.add_trial(create_trial(values=[best, 100.0]))
            joins += 1
        else:
            s.add_trial(create_trial(values=[float(rng.uniform(0.1, 0.5)), 400.0]))
    calls = []
    real = _history.hypervolume
    monkeypatch.setattr(_history, "hypervolume", lambda *a: calls.append(1) or real(*a))
    history = hypervolume_history(s)
    # at most twice (its own box, what the front covers of it) per zoo model and per joining
    # trial; the trials ended in the order of their numbers, so the history by time is reused
    assert len(calls) <= 2 * (len(REFERENCES) + joins)
    assert history.final == pytest.approx(split_hypervolumes(s)["val"]["union"])
