"""The fine-tune stage's recipe against the timm-terms one, on the real CIFAR-10 zoo, three seeds.

    python benchmarks/finetune_recipes.py [--seeds 0,1,2] [--runs DIR] [--results PATH]

For each seed and each recipe of ``RECIPES``, runs ``benchmarks/realzoo.py --finetune --seed N``
(``stitch-nas search examples/realzoo.yaml --finetune`` with the control on) on the preset as it
is, its 9,744-image train split and its 3 epochs: ``today`` with the preset's recipe, ``timm``
with the same plus the ``--set`` overrides ``RECIPES`` names (half an epoch of warm-up, timm's
mixup and CutMix with label smoothing, an exponential moving average of the weights). Each run
goes to ``DIR/<recipe>/seed<N>`` and its record to ``DIR/<recipe>_seed<N>.json``; a run whose
record exists is not run again. The first recipe's runs search from scratch; the others resume
a copy of the same seed's finished folder (``--resume``: every trial and refinement is held, so
only the stage runs), so the recipes of a seed fine-tune the same networks and the same control
models from the same start, and their stages' seconds compare.

Then every network a stage fine-tuned is measured on the test split, and so is the network it
started from (the search's test pass measures only the front's networks; no choice depends on
these figures), each rebuilt from the search's folder and checked against its recorded
validation accuracy; the control's test accuracies are the stage's own. Per recipe: each
network's and each control model's test accuracy with its 95 % Wilson interval; per pair (same
seed, same start, the two recipes): the difference and which recipe is better where the two
intervals do not overlap (``neither`` where they do). ``ray_speedup`` is copied from
``finetune_ray.json`` with the commit it measured; the GPU section (bfloat16 fine-tuning against
float32) says it has not run. Writes benchmarks/results/finetune_recipes.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from provenance import commit

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "finetune_recipes.json"
RAY = ROOT / "benchmarks" / "results" / "finetune_ray.json"

#: recipe name -> (whether it adds timm's training pieces to today's, its --set overrides).
#: ``timm`` keeps today's optimizer, learning rate, epochs and teacher, so that the comparison
#: is of what it adds; the moving average decays at 0.99 a step because 3 epochs of 9,744
#: images are 228 steps, and timm's 0.9998 would keep 95 % of the starting weights.
RECIPES: dict[str, tuple[bool, dict[str, Any]]] = {
    "today": (False, {}),
    "timm": (
        True,
        {
            "finetune.recipe.warmup_epochs": 0.5,
            "finetune.recipe.warmup_lr": 0.0005,
            "finetune.recipe.mixup": 0.8,
            "finetune.recipe.cutmix": 1.0,
            "finetune.recipe.smoothing": 0.1,
            "finetune.recipe.model_ema": True,
            "finetune.recipe.model_ema_decay": 0.99,
        },
    ),
}


def run(recipe: str, seed: int, runs: Path) -> Path:
    """The seed's search with the recipe's fine-tune stage, unless its record exists: the first
    recipe's from scratch, the others' resumed from a copy of its folder (the same search)."""
    record = runs / f"{recipe}_seed{seed}.json"
    if record.is_file():
        return record
    out = runs / recipe / f"seed{seed}"  # one folder name, so one study name, for each recipe
    command = [sys.executable, str(ROOT / "benchmarks" / "realzoo.py"), "--finetune"]
    command += ["--seed", str(seed), "--out", str(out), "--results", str(record)]
    for key, value in RECIPES[recipe][1].items():
        command += ["--set", f"{key}={json.dumps(value)}"]
    first = next(iter(RECIPES))
    if recipe != first:  # its trials and refinements are all held: only the stage runs
        shutil.copytree(runs / first / f"seed{seed}", out)
        command.append("--resume")
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    return record


def measured(out: Path) -> dict[str, Any]:
    """Test figures of the stage's networks (and their starts) and the control's models."""
    from optuna.trial import TrialState

    from stitch_nas import StitchConfig, attrs
    from stitch_nas.pipeline._folder import _rebuild
    from stitch_nas.report import accuracy_on, rebuild_checked, trial_config, wilson_interval
    from stitch_nas.report._holdout import split_sizes, trial_weights
    from stitch_nas.search import load_folder_study

    study = load_folder_study(out)
    ctx, settings = _rebuild(study, out, False)
    n = int(split_sizes(study)["test"])
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}

    def test_accuracy(trial: Any) -> float:
        checked = rebuild_checked(
            ctx,
            StitchConfig.from_dict(trial_config(trial)),
            trial.user_attrs,
            f"trial {trial.number}",
            "the realzoo folder or the code changed since the search",
            fuse=settings.search.fuse,
            weights=trial_weights(trial, out),
        )
        return accuracy_on(ctx, checked.net, "test", checked.head)

    def figure(accuracy: float) -> dict[str, Any]:
        low, high = wilson_interval(accuracy, n)
        return {"test_accuracy": round(accuracy, 4), "interval": [round(low, 4), round(high, 4)]}

    control = study.user_attrs.get(attrs.FINETUNE_CONTROL) or {}
    # the last stage's recipe: a resumed folder also holds the first recipe's networks
    recipe = next(iter(control.values()))["finetuned"]["recipe"]
    networks = []
    for t in sorted(trials.values(), key=lambda t: t.number):
        if t.user_attrs.get(attrs.FINETUNED, {}).get("recipe") != recipe:
            continue
        source = trials[t.user_attrs[attrs.FINETUNES]]
        kept_start = t.state != TrialState.COMPLETE  # the stage kept its starting weights
        start = test_accuracy(source)
        networks.append(
            {
                "start_trial": source.number,
                "config": source.user_attrs.get(attrs.DESCRIBE, ""),
                "macs": source.user_attrs.get("macs"),
                "start_test_accuracy": round(start, 4),
                **figure(start if kept_start else test_accuracy(t)),
                "kept_start": kept_start,
            }
        )
    zoo = {str(r["name"]): r for r in study.user_attrs.get(attrs.REFERENCES) or []}
    tuned_zoo = [
        {
            "model": name,
            "start_test_accuracy": zoo[name].get(attrs.TEST_ACCURACY),
            **figure(float(entry[attrs.TEST_ACCURACY])),
            "kept_start": entry[attrs.WEIGHTS] is None,
        }
        for name, entry in sorted(control.items())
    ]
    return {"test_images": n, "recipe": recipe, "networks": networks, "control": tuned_zoo}


def better(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> str:
    """The name of the one whose interval lies wholly above the other's, else ``neither``."""
    if a["interval"][0] > b["interval"][1]:
        return names[0]
    if b["interval"][0] > a["interval"][1]:
        return names[1]
    return "neither"


def compare(recipes: dict[str, dict[str, Any]], names: tuple[str, str]) -> dict[str, Any]:
    """Pairs of the two recipes' results of one seed and one start, and how they differ."""
    pairs = []
    for what, key in (("networks", "config"), ("control", "model")):
        first = {(r["seed"], r[key]): r for r in recipes[names[0]][what]}
        for r in recipes[names[1]][what]:
            twin = first.get((r["seed"], r[key]))
            if twin is None:
                continue  # a start only one recipe's search chose: no pair
            pairs.append(
                {
                    "what": what,
                    "seed": r["seed"],
                    key: r[key],
                    "difference": round(r["test_accuracy"] - twin["test_accuracy"], 4),
                    "better": better(twin, r, names),
                }
            )
    return {
        "difference": f"{names[1]} - {names[0]}, test accuracy",
        "pairs": pairs,
        "median_difference": {
            what: statistics.median(p["difference"] for p in pairs if p["what"] == what)
            for what in ("networks", "control")
            if any(p["what"] == what for p in pairs)
        },
        "better_by_interval": {
            name: sum(p["better"] == name for p in pairs) for name in (*names, "neither")
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "finetune-recipes")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    args.runs.mkdir(parents=True, exist_ok=True)
    records = {(r, s): json.loads(run(r, s, args.runs).read_text()) for s in seeds for r in RECIPES}

    recipes: dict[str, dict[str, Any]] = {}
    test_images = 0
    for name, (timm, overrides) in RECIPES.items():
        entry: dict[str, Any] = {
            "timm": timm,
            "overrides": overrides,
            "networks": [],
            "control": [],
        }
        for seed in seeds:
            record = records[name, seed]
            figures = measured(args.runs / name / f"seed{seed}")
            test_images = figures["test_images"]
            # the recipe's seed is the run's (realzoo.py --seed sets it)
            entry["recipe"] = {k: v for k, v in figures["recipe"].items() if k != "seed"}
            entry["epochs"] = figures["recipe"]["epochs"]
            for what in ("networks", "control"):
                entry[what] += [{"seed": seed, **r} for r in figures[what]]
            entry.setdefault("finetune_seconds", []).append(record["finetune_seconds"])
            entry.setdefault("commits", []).append(record["commit"])
        recipes[name] = entry
    ray = json.loads(RAY.read_text())
    result = {
        "command": f"python benchmarks/finetune_recipes.py --seeds {args.seeds}",
        "what": __doc__.split("\n\n")[1].replace("\n", " "),
        "seeds": seeds,
        "train_images": records[next(iter(RECIPES)), seeds[0]]["train_images"],
        "test_images": test_images,
        "recipes": recipes,
        "comparison": compare(recipes, ("today", "timm")),
        "ray_speedup": ray["ray_speedup"],
        "ray_speedup_from": f"finetune_ray.json (commit {ray['commit']}): {ray['what']}",
        "gpu": "not run: no GPU was lent to the session that wrote this file",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "commit": commit(),
    }
    args.results.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["comparison"], indent=1))


if __name__ == "__main__":
    main()
