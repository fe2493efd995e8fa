"""The fine-tune stage's networks on Ray workers against one process: how much faster?

    python benchmarks/finetune_ray.py [--settings examples/realzoo.yaml] [--networks 4]
                                      [--workers 2] [--steps 60] [--repeats 2] [--out FILE]

On ``../shared/realzoo`` (or ``REALZOO=...``): the first ``--networks`` depth-matched
least-squares stitches between the zoo's three most accurate models on validation
(``benchmarks/finetune.py``'s candidates), each measured once first as a search trial records
it, are each fine-tuned for ``--steps`` steps with the stage's recipe otherwise (all weights,
the ensemble teacher, no early stop), as the stage's jobs (:func:`~stitch_nas.finetune._jobs.
run_job`: the network rebuilt and checked on the trial's fixed sample, trained, measured on
validation):

- one after the other in this process, with torch's default threads (all of this machine's
  cores), as the stage runs without Ray;
- on ``--workers`` Ray workers with one CPU each (``RayExecutor.map``), as the stage runs with
  ``--executor ray``.

Each is run ``--repeats`` times, alternating. A wall time counts everything a user waits for:
Ray's start and the zoo and data's trip through the object store included. Each network's
images a second are its own training's. The accuracy after training of each network is
recorded both ways (equal weights at equal thread counts are the test suite's:
``tests/test_finetune_stage.py``). Writes ``benchmarks/results/finetune_ray.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from stitch_nas.activations import ActivationCache, StitchContext
from stitch_nas.config import StitchConfig
from stitch_nas.finetune import FinetuneRecipe
from stitch_nas.finetune._jobs import Job, StageSetup, run_in_worker, run_job
from stitch_nas.pipeline import load_data, load_zoo
from stitch_nas.report import accuracy_on
from stitch_nas.search import RayExecutor
from stitch_nas.settings import load_settings
from stitch_nas.stitching import build, measure

sys.path.insert(0, str(Path(__file__).resolve().parent))
from finetune import depth_matched  # noqa: E402 - the candidates of the fine-tune benchmark

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default=str(ROOT / "examples" / "realzoo.yaml"))
    parser.add_argument("--networks", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/finetune_ray.json"))
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    say = lambda text: print(text, flush=True)  # noqa: E731

    settings = load_settings(args.settings)
    data = load_data(settings.data)
    zoo = load_zoo(settings.zoo, data)
    ctx = StitchContext(zoo, data, cache=ActivationCache(memory_gb=2.0))
    val = {n: accuracy_on(ctx, build(ctx, StitchConfig.single(n)), "val") for n in zoo.names()}
    best = sorted(val, key=lambda n: -val[n])[:3]
    chosen = depth_matched(ctx, best)[: args.networks]
    say(f"{len(chosen)} depth-matched stitches of {', '.join(best)}")
    recipe = FinetuneRecipe(steps=args.steps, epochs=1, patience=10, keep="last")
    setup = StageSetup(recipe, val, fuse=False)
    folder = Path(tempfile.mkdtemp(prefix="finetune_ray_"))
    jobs = [  # each with the figures its search trial would have recorded, checked as there
        Job(
            f"network {i}",
            c.describe(),
            c.to_dict(),
            str(folder / f"n{i}.safetensors"),
            recorded=measure(ctx, c)[1].to_dict(),
        )
        for i, c in enumerate(chosen)
    ]
    runs: dict[str, list[dict]] = {"process": [], "ray": []}
    for repeat in range(args.repeats):
        for where in ("process", "ray"):
            start = time.perf_counter()
            if where == "process":
                results = [run_job(ctx, job, setup, lambda line: None) for job in jobs]
            else:
                executor = RayExecutor(workers=args.workers)
                results = executor.map(ctx, run_in_worker, [(job, setup) for job in jobs])
            wall = time.perf_counter() - start
            per_network = [
                {
                    "images_per_second": r.report.steps * recipe.batch_size / r.report.seconds,
                    "train_seconds": r.report.seconds,
                    "val_after": r.after,
                }
                for r in results
                if r.report is not None
            ]
            runs[where].append({"wall_seconds": wall, "networks": per_network})
            say(f"repeat {repeat} {where}: {wall:.1f} s")
    ratios = [
        p["wall_seconds"] / r["wall_seconds"]
        for p, r in zip(runs["process"], runs["ray"], strict=True)
    ]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    out = {
        "what": (
            f"{len(jobs)} fine-tunes of {args.steps} steps (batch {recipe.batch_size}) on the "
            f"real CIFAR-10 zoo: one process ({torch.get_num_threads()} threads) against "
            f"{args.workers} Ray workers (1 CPU each), wall time including Ray's start"
        ),
        "networks": [j.what for j in jobs],
        "recipe": recipe.to_dict(),
        "ray_speedup": statistics.median(ratios),
        "ray_speedup_each_repeat": ratios,
        "runs": runs,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "gpu": None},
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    say(f"Ray {args.workers} workers : one process = {out['ray_speedup']:.2f}x ({ratios})")


if __name__ == "__main__":
    main()
