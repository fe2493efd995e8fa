"""Trials per minute of the Ray executor with 1 and 2 workers on the embedded zoo.

    python benchmarks/ray_scaling.py [--trials 150] [--workers 1 2]

Each setting runs a fresh study (random sampler, same seed, CKA threshold 0.3) on one local Ray
started with as many CPUs as the largest worker count; the local executor is timed on the same
searches for reference, with one torch thread and the same warm-up as a worker (models traced,
MAC tables and activations filled). Rates count the trials that ran on a worker (sampled
duplicates are answered by the driver and reported apart) over the search time, start-up
excluded; start-up (sharing the activations, starting the actors) is reported separately. Writes
benchmarks/results/ray_scaling.json. A benchmark, not a test: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import optuna
import ray
import torch

from stitch_nas.activations._context import StitchContext
from stitch_nas.data._splits import load_digits_splits
from stitch_nas.search._ray_executor import RayExecutor
from stitch_nas.search._runner import StitchObjective, run_search
from stitch_nas.search._studies import create_study
from stitch_nas.stitching._measure import fragment_macs
from stitch_nas.zoo._mini import load_mini_zoo

RESULTS = Path(__file__).parent / "results" / "ray_scaling.json"


def _local(ctx: StitchContext, trials: int, seed: int) -> dict:
    objective = StitchObjective(ctx, cka_threshold=0.3)
    study = create_study(objective, tempfile.mkdtemp(), sampler="random", seed=seed)
    run_search(objective, study, 1)  # references and activations, as Ray's start-up does
    for name in ctx.zoo.names():  # and what Ray's start-up gives each worker: traced models,
        fragment_macs(ctx, name, None, None)  # MAC tables, every probe and val activation
        for split in ("probe", "val"):
            ctx.activation(name, None, split)
    start = time.perf_counter()
    run_search(objective, study, trials)
    seconds = time.perf_counter() - start
    dups = sum("duplicate_of" in t.user_attrs for t in study.trials[1:])
    ran = len(study.trials) - 1 - dups
    return {
        "seconds": round(seconds, 2),
        "ran": ran,
        "duplicates": dups,
        "trials_per_minute": round(60 * ran / seconds, 1),
    }


def _ray(ctx: StitchContext, trials: int, seed: int, workers: int) -> dict:
    objective = StitchObjective(ctx, cka_threshold=0.3)
    study = create_study(objective, tempfile.mkdtemp(), sampler="random", seed=seed)
    executor = RayExecutor(workers=workers)
    run_search(objective, study, trials, executor=executor)
    run = executor.last_run
    ran = run["complete"] + run["pruned"] + run["failed"]
    return {
        "workers": workers,
        "startup_seconds": round(run["startup_seconds"], 2),
        "search_seconds": round(run["search_seconds"], 2),
        "ran": ran,
        "duplicates": run["duplicates"],
        "failed": run["failed"],
        "trials_per_minute": round(60 * ran / run["search_seconds"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=150)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    data = load_digits_splits()
    ctx = StitchContext(load_mini_zoo(data), data)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a worker with one CPU: oversubscribed threads distort timing
    local = _local(ctx, args.trials, args.seed)
    torch.set_num_threads(threads)
    print(f"local executor: {local['trials_per_minute']:,.0f} trials/min")
    ray.init(num_cpus=max(args.workers), include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        for workers in args.workers:
            row = _ray(ctx, args.trials, args.seed, workers)
            rows.append(row)
            print(
                f"ray, {workers} worker(s): {row['trials_per_minute']:,.0f} trials/min "
                f"({row['ran']} trials on workers in {row['search_seconds']} s, "
                f"start-up {row['startup_seconds']} s)"
            )
    finally:
        ray.shutdown()
    base = rows[0]["trials_per_minute"]
    for row in rows:
        row["speedup_over_first"] = round(row["trials_per_minute"] / base, 2)
    if len(rows) > 1:
        print(
            f"ratio {rows[-1]['workers']} : {rows[0]['workers']} workers: "
            f"{rows[-1]['speedup_over_first']:.2f}"
        )
    result = {
        "machine": {
            "cores": os.cpu_count(),
            "torch_threads_local_and_per_worker": 1,
            "platform": platform.platform(),
            "torch": torch.__version__,
            "ray": ray.__version__,
            "load_average_1_5_15_min_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "trials": args.trials,
        "sampler": "random",
        "local": local,
        "ray": rows,
        "note": "trials/min counts trials run on workers (duplicates excluded) over search time; "
        "start-up (object store fill, actor start) excluded and reported apart",
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
