"""Tests of pareto.png on a crowded real-zoo-like study: labels apart, wrapped title, zoom."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import numpy as np
import optuna
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Annotation, Text
from optuna.trial import TrialState, create_trial

from stitch_nas import attrs
from stitch_nas.report import write_report
from stitch_nas.report._figure import plot_figure
from stitch_nas.report._labels import label_offsets
from stitch_nas.report._plot import panels

optuna.logging.set_verbosity(optuna.logging.WARNING)

# twelve models, eight of them crowded between 40M and 130M MACs at 0.90-0.94, as on CIFAR-10
ZOO = [
    ("fattorib_resnet20", 0.921, 41e6),
    ("fattorib_resnet32", 0.929, 70e6),
    ("fattorib_resnet44", 0.934, 98e6),
    ("fattorib_resnet56", 0.938, 127e6),
    ("kejeon_resnet20", 0.918, 41e6),
    ("twin_resnet20", 0.9194, 41e6),  # a hair above kejeon_resnet20: their labels would collide
    ("zlatasm_resnet20", 0.905, 42e6),
    ("emphity1_mobilenet_eca_rep", 0.912, 48e6),
    ("amebett1_vit_tiny", 0.81, 260e6),
    ("zenvi_allconv6", 0.62, 9e6),
    ("yuebk_lenet5_bn", 0.21, 0.7e6),
    ("big_wide_resnet", 0.951, 5.2e9),
]


def _trial(acc: float, macs: float, k: int, start: float, **user: Any):
    models = ["fattorib_resnet20", "kejeon_resnet20"] if k > 1 else ["zenvi_allconv6"]
    ua = {
        "accuracy": acc,
        "macs": macs,
        attrs.MODELS: models,
        attrs.DESCRIBE: " -> ".join(models),
        attrs.KIND: "stitched" if k > 1 else "zoo model",
        **user,
    }
    t = create_trial(values=[acc, macs], user_attrs=ua)
    t.datetime_start = dt.datetime(2026, 1, 1) + dt.timedelta(seconds=start)
    t.datetime_complete = t.datetime_start + dt.timedelta(seconds=30)
    return t


def crowded_study(n: int = 120, seed: int = 0) -> optuna.Study:
    """A study whose zoo crowds 40M-130M MACs at 0.90-0.94, with weak cheap models below and a
    front that steps between them; test figures recorded for the front and the zoo."""
    rng = np.random.default_rng(seed)
    s = optuna.create_study(directions=["maximize", "minimize"])
    s.set_user_attr(attrs.OBJECTIVES, ["accuracy", "macs"])
    refs = [
        {"name": name, "accuracy": acc, "macs": macs, attrs.TEST_ACCURACY: acc - 0.004}
        for name, acc, macs in ZOO
    ]
    s.set_user_attr(attrs.REFERENCES, refs)
    s.set_user_attr(attrs.SPLIT_SIZES, {"data": "cifar10", "val": 5000, "test": 10000})
    for i in range(n):
        macs = float(np.exp(rng.uniform(np.log(1e6), np.log(3e8))))
        acc = float(np.clip(0.12 * np.log10(macs) - 0.02 + rng.normal(0, 0.12), 0.1, 0.945))
        acc = round(acc * 5000) / 5000  # a count of correct images out of 5000
        s.add_trial(_trial(acc, macs, 2, 40.0 * i))
    for acc, macs in ((0.925, 44e6), (0.936, 80e6), (0.941, 110e6), (0.93, 60e6)):
        s.add_trial(_trial(acc, macs, 2, 40.0 * len(s.trials)))
    s.add_trial(create_trial(state=TrialState.PRUNED))
    front = {t.number: t.values[0] - 0.003 for t in s.best_trials}
    s.set_user_attr(attrs.TEST_RESULTS, {str(k): v for k, v in front.items()})
    return s


@pytest.fixture(scope="module")
def study() -> optuna.Study:
    return crowded_study()


@pytest.fixture(scope="module")
def fig(study: optuna.Study) -> Figure:
    figure = plot_figure(study, "heading")
    figure.canvas.draw()
    return figure


def _texts(fig) -> list[list[Text]]:
    """The labels placed on each axes of ``fig`` (annotations), per axes."""
    return [[t for t in ax.texts if isinstance(t, Annotation)] for ax in fig.axes]


def test_no_two_labels_overlap_and_each_stays_inside_its_panel(fig: Figure) -> None:
    renderer = fig.canvas.get_renderer()
    per_axes = _texts(fig)
    assert sum(map(len, per_axes)) >= len(ZOO)  # every zoo model is numbered somewhere
    for ax, texts in zip(fig.axes, per_axes, strict=True):
        boxes = [Text.get_window_extent(t, renderer) for t in texts]  # the text, not the leader
        for a, b in itertools.combinations(boxes, 2):
            assert not a.overlaps(b) or min(a.x1, b.x1) - max(a.x0, b.x0) < 0.5, (a, b)
        inside = ax.bbox.padded(1)
        for box in boxes:
            assert inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1)


def test_zoo_numbers_are_keyed_once_in_the_table_cheapest_first(fig: Figure) -> None:
    table = next(t.get_text() for ax in fig.axes for t in ax.texts if "zoo model" in t.get_text())
    rows = table.splitlines()[1:]
    assert len(rows) == len(ZOO)
    by_cost = sorted(ZOO, key=lambda z: (z[2], z[0]))
    for i, (row, (name, acc, _)) in enumerate(zip(rows, by_cost, strict=True)):
        assert row.split()[0] == str(i + 1) and row.split()[1] == name[:19] + "…" * (len(name) > 20)
        assert f"{acc:.4f}" in row and f"{acc - 0.004:.4f}" in row
    labels = {t.get_text() for texts in _texts(fig) for t in texts}
    assert {str(i) for i in range(1, len(ZOO) + 1)} <= labels


def test_the_main_panel_zooms_on_the_strong_zoo_models_and_the_overview_keeps_the_rest(
    study: optuna.Study, fig: Figure
) -> None:
    val = next(p for p in panels(study) if p.split == "val")
    low, high = val.top_range()
    strong = [a for _, a, _ in ZOO if a >= 0.9]
    assert low < min(strong) and high >= max(strong)
    assert high - low < 0.15  # the 0.90-0.95 band fills the panel, not a sliver of 0.1-1.0
    i = next(i for i, ax in enumerate(fig.axes) if ax.get_ylabel() == "validation accuracy")
    main, overview = fig.axes[i], fig.axes[i + 1]
    assert main.get_ylim()[0] == pytest.approx(low) and main.get_ylim()[1] > high
    assert overview.get_ylim()[0] < 0.21  # the weakest zoo model is still drawn


def test_the_zoo_front_is_drawn_as_its_own_dashed_staircase(
    study: optuna.Study, fig: Figure
) -> None:
    val = next(p for p in panels(study) if p.split == "val")
    names = [m.label for m in val.zoo_staircase()]
    assert names == [
        "yuebk_lenet5_bn",
        "zenvi_allconv6",
        "fattorib_resnet20",
        "fattorib_resnet32",
        "fattorib_resnet44",
        "fattorib_resnet56",
        "big_wide_resnet",
    ]
    dashed = [ln for ln in fig.axes[0].lines if ln.get_linestyle() == "--"]
    assert dashed and dashed[0].get_color() == "C3"


def test_a_long_title_is_wrapped_inside_the_figure(study: optuna.Study) -> None:
    heading = "cifar10 (a zoo of eleven models from four authors, fine-tuned): " * 4
    fig = plot_figure(study, heading.strip())
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent(fig.canvas.get_renderer())
    assert box.x0 >= 0 and box.x1 <= fig.bbox.x1 and "\n" in fig._suptitle.get_text()


def test_label_offsets_separate_labels_of_marks_at_one_spot() -> None:
    anchors = [(100.0, 100.0, 12.0, 9.0)] * 8
    boxes = []
    for dx, dy in label_offsets(anchors, [(100.0, 100.0, 8.0)], bounds=(0, 0, 400, 400)):
        left = 100 + dx - (12 if dx < 0 else (6 if dx == 0 else 0))
        boxes.append((left, 100 + dy, left + 12, 100 + dy + 9))
    for a, b in itertools.combinations(boxes, 2):
        assert min(a[2], b[2]) <= max(a[0], b[0]) or min(a[3], b[3]) <= max(a[1], b[1])
    assert label_offsets(anchors, []) == label_offsets(anchors, [])  # deterministic


def test_the_report_of_a_crowded_study_renders(study: optuna.Study, tmp_path) -> None:
    summary = write_report(study, tmp_path)
    assert summary.png_path.read_bytes()[:4] == b"\x89PNG"
    html = summary.html_path.read_text()
    assert "hypervolume of front + zoo" in html
    # the page keys the zoo's numbers too, and draws the zoo's own front dashed
    assert "<th>#</th><th>zoo model</th>" in html and "<td>1</td><td>yuebk_lenet5_bn</td>" in html
    assert 'stroke="#d62728" stroke-dasharray="5 3"' in html
