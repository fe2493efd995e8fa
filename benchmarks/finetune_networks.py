"""Named networks and zoo models fine-tuned alike with a preset's recipe, seed by seed, on test.

    python benchmarks/finetune_networks.py --network NAME=JSON [--network ...] [--zoo MODEL ...]
        [--settings examples/realzoo.yaml] [--seeds 0,1,2] [--set SECTION.KEY=VALUE ...]
        --results benchmarks/results/NAME.json

Each ``--network`` (a name for its rows, ``=``, a ``StitchConfig`` as JSON) and each ``--zoo``
model (named as in the zoo) is built on the
settings' zoo and data (least-squares joints fitted on the probe split, as the search fits
them), trained by the fine-tune stage's own job (``stitch_nas.finetune._jobs.run_job``, a control
job: it measures test too) with the settings' recipe and ``recipe.seed`` set to each seed, and
measured on validation before and after and on test after, with the 95 % Wilson interval. No
search runs: this answers "what would the stage make of this network", for a network a search
found (its config from the study), without the hour of search and of the stage's other
networks. The ensemble teacher is chosen from the zoo's validation accuracies, measured here.
Writes one results file; a seed's rows are written as soon as they are done, each with the
commit and command that made it, and a rerun with the same ``--results`` keeps the rows it
holds (``commit`` and ``command`` at the top are the latest run's).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from provenance import commit
from realzoo import overrides_from, settings_copy

from stitch_nas.activations import StitchContext
from stitch_nas.config import StitchConfig
from stitch_nas.finetune._jobs import Job, StageSetup, run_job
from stitch_nas.pipeline import load_data, load_zoo
from stitch_nas.report import rebuild, wilson_interval
from stitch_nas.settings import load_settings

ROOT = Path(__file__).resolve().parents[1]


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default=str(ROOT / "examples" / "realzoo.yaml"))
    parser.add_argument("--network", action="append", default=[], help="NAME=StitchConfig JSON")
    parser.add_argument("--zoo", action="append", default=[], help="a zoo model's name")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "finetune-networks")
    args = parser.parse_args()
    if any("=" not in item for item in args.network):
        raise SystemExit("--network takes NAME=JSON, e.g. strongest='{\"fragments\": ...}'")
    networks = {
        name: StitchConfig.from_json(text)
        for name, text in (item.split("=", 1) for item in args.network)
    }
    networks |= {name: StitchConfig.single(name) for name in args.zoo}
    if not networks:
        raise SystemExit("name at least one --network or --zoo")
    names = {config.describe(): name for name, config in networks.items()}
    overrides = overrides_from(args.set)
    copy = settings_copy(args.settings, None, False, overrides)
    try:
        settings = load_settings(copy)
    finally:
        copy.unlink()  # read once: paths in it are resolved by now
    data = load_data(settings.data)
    zoo = load_zoo(settings.zoo, data)
    ctx = StitchContext(zoo, data)
    val = {name: rebuild(ctx, StitchConfig.single(name), fuse=False)[1].accuracy for name in zoo}
    tests = len(ctx.labels("test"))
    record: dict[str, Any] = {}
    if args.results.exists():
        record = json.loads(args.results.read_text())
    for row in record.get("rows", []):  # made by an earlier command: it says which
        row.setdefault("commit", record.get("commit"))
        row.setdefault("command", record.get("command"))
    record.update(
        {
            "commit": commit(),
            "command": "python benchmarks/finetune_networks.py " + " ".join(sys.argv[1:]),
            "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads, CPU",
            "settings": str(Path(args.settings).name),
            "overrides": overrides,
            "train_images": len(ctx.labels("train")),
            "test_images": tests,
            "zoo_val": {name: round(acc, 4) for name, acc in val.items()},
        }
    )
    rows: list[dict[str, Any]] = record.setdefault("rows", [])
    for row in rows:  # rows of an earlier command keep their name, or take this one's
        if "name" not in row and row["config"] in names:
            row["name"] = names[row["config"]]
    args.results.write_text(json.dumps(record, indent=1) + "\n")
    done = {(r["config"], r["seed"]) for r in rows}
    for seed in [int(s) for s in args.seeds.split(",")]:
        recipe = replace(settings.finetune.recipe, seed=seed)
        setup = StageSetup(recipe, val, fuse=False, progress=True)
        for name, config in networks.items():
            if (config.describe(), seed) in done:
                continue
            start = time.perf_counter()
            file = args.out / f"seed{seed}_{config.stable_hash()}.safetensors"
            job = Job(name, config.describe(), config.to_dict(), str(file), control=True)
            result = run_job(ctx, job, setup, print)
            assert result.report is not None and result.test is not None, result.skipped
            rows.append(
                {
                    "name": name,
                    "commit": record["commit"],
                    "command": record["command"],
                    "config": config.describe(),
                    "stitch_config": config.to_dict(),
                    "seed": seed,
                    "recipe": recipe.to_dict(),
                    "val_before": round(result.before, 4),
                    "val_after": round(result.after, 4),
                    "test_accuracy": round(result.test, 4),
                    "interval": [round(x, 4) for x in wilson_interval(result.test, tests)],
                    "images_seen": result.report.images_seen,
                    "kept_start": result.report.kept_start,
                    "seconds": round(time.perf_counter() - start, 1),
                    "peak_rss_gb": round(_peak_gb(), 2),
                }
            )
            args.results.write_text(json.dumps(record, indent=1) + "\n")
            print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
