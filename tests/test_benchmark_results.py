"""The real-zoo results files compare against one baseline: every file measured on one kind of
machine gives each zoo model the same test accuracy, to the image."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _zoo_figures() -> dict[str, dict[str, dict[str, float]]]:
    """{machine: {file: {zoo model: test accuracy}}} of every realzoo results file."""
    by_machine: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    for path in sorted(RESULTS.glob("realzoo*.json")):
        record = json.loads(path.read_text())
        # a GPU's float32 convolutions (TF32 in cuDNN by default) may flip an image or two
        # against the CPU, so each kind of machine is its own baseline
        machine = record["machine"].get("gpu") or "cpu"
        assert record["test_images"] == 5000, path.name
        by_machine[machine][path.name] = {r["name"]: r["test_accuracy"] for r in record["zoo"]}
    return by_machine


def test_there_are_realzoo_results_to_compare():
    assert sum(len(files) for files in _zoo_figures().values()) >= 2


def test_realzoo_results_agree_on_the_zoos_own_accuracies_to_the_image():
    for machine, files in _zoo_figures().items():
        first_name, first = next(iter(files.items()))
        for name, figures in files.items():
            assert figures.keys() == first.keys(), (machine, name, first_name)
            for model, accuracy in figures.items():
                # to the image: 1 of 5,000 test images is 0.0002
                assert round(accuracy * 5000) == round(first[model] * 5000), (
                    f"{name} gives {model} {accuracy}, {first_name} {first[model]} ({machine})"
                )


def test_the_recipe_comparison_claims_only_what_its_intervals_show():
    from stitch_nas.report import wilson_interval

    record = json.loads((RESULTS / "finetune_recipes.json").read_text())
    n, recipes = record["test_images"], record["recipes"]
    rows = {}
    for name, entry in recipes.items():
        assert {r["seed"] for r in entry["networks"]} == set(record["seeds"]), name
        for what, key in (("networks", "config"), ("control", "model")):
            for r in entry[what]:
                low, high = wilson_interval(r["test_accuracy"], n)
                assert r["interval"] == [round(low, 4), round(high, 4)], (name, r)
                rows[name, what, r["seed"], r[key]] = r
    pairs = record["comparison"]["pairs"]
    assert pairs, "no network was fine-tuned by both recipes from the same start"
    for pair in pairs:
        key = pair.get("config", pair.get("model"))
        today = rows["today", pair["what"], pair["seed"], key]
        timm = rows["timm", pair["what"], pair["seed"], key]
        assert today["start_test_accuracy"] == timm["start_test_accuracy"], pair  # one start
        assert pair["difference"] == round(timm["test_accuracy"] - today["test_accuracy"], 4)
        if timm["interval"][0] > today["interval"][1]:
            assert pair["better"] == "timm", pair
        elif today["interval"][0] > timm["interval"][1]:
            assert pair["better"] == "today", pair
        else:
            assert pair["better"] == "neither", pair
