"""``trials.csv``: one row per trial of the study, whatever its state.

Its columns: number and state, the objective values, the measured metrics, both accuracies
with their 95 % Wilson intervals, feasibility, front membership, the network (fragments, kind,
models, description), why it was pruned or failed, its duration, ``hypervolume_so_far`` (the
report's validation hypervolume of front + zoo over the trials up to this one:
:mod:`~stitch_nas.report._history`) and its config as JSON.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import optuna

from stitch_nas import attrs

from ._history import HypervolumeHistory
from ._holdout import holdout_accuracies, split_sizes
from ._intervals import accuracy_figures
from ._kinds import recorded_kinds, trial_kind
from ._pareto import is_feasible, n_fragments, trial_config, trial_metric

__all__ = ["METRICS", "trials_csv"]

#: the metrics each trial row and each front row carries
METRICS = ("accuracy", "macs", "params", "cka", "latency_ms")


def trials_csv(
    study: optuna.Study,
    objectives: list[str],
    front: dict[int, dict[str, Any]],
    history: HypervolumeHistory,
) -> bytes:
    """The file's bytes; ``front``: the front's rows by trial number."""
    buf = io.StringIO()
    writer = csv.writer(buf)  # writes None as an empty field
    intervals = "accuracy_low accuracy_high".split()
    tested = [attrs.TEST_ACCURACY, "test_accuracy_low", "test_accuracy_high"]
    names = "feasible is_pareto n_fragments kind models describe prune_reason fail_reason"
    names += " duration_s hypervolume_so_far"
    tail = [*names.split(), "config"]
    writer.writerow(
        ["number", "state", *(f"value_{n}" for n in objectives), *METRICS, *intervals, *tested]
        + tail
    )
    sizes, tests, kinds = split_sizes(study), holdout_accuracies(study), recorded_kinds(study)
    so_far = dict(zip(history.numbers, history.by_number, strict=True))
    for t in study.get_trials(deepcopy=False):
        ua, config = t.user_attrs, trial_config(t)
        values = list(t.values) if t.values is not None else [None] * len(objectives)
        metrics = [trial_metric(t, m, objectives) for m in METRICS]
        acc = accuracy_figures(metrics[0], sizes.get("val"), tests.get(t.number), sizes.get("test"))
        low_high = [*(acc["accuracy_interval"] or [None, None])]
        test = [acc[attrs.TEST_ACCURACY], *(acc["test_accuracy_interval"] or [None, None])]
        duration = t.duration.total_seconds() if t.duration is not None else None
        models = "+".join(str(m) for m in ua.get(attrs.MODELS, []))
        config_json = json.dumps(config, sort_keys=True, default=str) if config else None
        flags = [is_feasible(t), t.number in front, n_fragments(t), trial_kind(t, kinds), models]
        reasons = [ua.get(attrs.DESCRIBE), ua.get(attrs.PRUNE_REASON), ua.get(attrs.FAIL_REASON)]
        writer.writerow(
            [t.number, t.state.name, *values, *metrics, *low_high, *test, *flags, *reasons]
            + [duration, so_far.get(t.number), config_json]
        )
    return buf.getvalue().encode()
