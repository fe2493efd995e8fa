"""What a search costs on the embedded zoo: zoo build, seconds per trial, CKA pruning, and how a
trial compares with one forward pass of the network it builds.

    python benchmarks/search_cost.py [--trials 40] [--fresh-zoo]

Writes benchmarks/results/search_cost.json and prints the figures. A benchmark, not a test:
the numbers depend on the machine, so they are recorded with its core count and torch version.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import optuna
import torch

from stitch_nas.activations import StitchContext
from stitch_nas.config import StitchConfig
from stitch_nas.data import load_digits_splits
from stitch_nas.search import StitchObjective
from stitch_nas.stitching import build
from stitch_nas.zoo import load_mini_zoo

RESULTS = Path(__file__).parent / "results" / "search_cost.json"


def _forward_seconds(ctx: StitchContext, config: StitchConfig, x: torch.Tensor) -> float:
    """One forward pass of the whole stitched network over ``x`` (probe + val), best of 3."""
    net = build(ctx, config)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        ctx.run(net, x)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--fresh-zoo", action="store_true", help="time a zoo build from scratch")
    parser.add_argument("--cka-threshold", type=float, default=0.3)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    data = load_digits_splits()
    cache = tempfile.mkdtemp() if args.fresh_zoo else None
    start = time.perf_counter()
    zoo = load_mini_zoo(data, cache_dir=cache)
    zoo_seconds = time.perf_counter() - start

    ctx = StitchContext(zoo, data)
    objective = StitchObjective(ctx, cka_threshold=args.cka_threshold)
    study = optuna.create_study(
        directions=objective.directions, sampler=optuna.samplers.TPESampler(seed=0)
    )
    start = time.perf_counter()
    study.optimize(objective, n_trials=args.trials)
    search_seconds = time.perf_counter() - start

    trials = study.trials
    durations = [t.duration.total_seconds() for t in trials if t.duration is not None]
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    fresh = [t for t in complete if "duplicate_of" not in t.user_attrs]
    pruned_cka = [t for t in trials if str(t.user_attrs.get("prune_reason", "")).startswith("cka")]
    x = torch.cat([data.probe.x, data.val.x])
    ratios = []
    for t in fresh:
        forward = _forward_seconds(ctx, StitchConfig.from_dict(t.user_attrs["config"]), x)
        ratios.append(t.duration.total_seconds() / forward)
    result = {
        "machine": {
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(),
            "torch": torch.__version__,
        },
        "trials": len(trials),
        "zoo_build_seconds": round(zoo_seconds, 2),
        "zoo_built_from_scratch": bool(args.fresh_zoo),
        "search_seconds": round(search_seconds, 2),
        "median_seconds_per_trial": round(statistics.median(durations), 4),
        "share_pruned_by_cka": round(len(pruned_cka) / len(trials), 3),
        "median_trial_over_forward": round(statistics.median(ratios), 2) if ratios else None,
        "forward_samples": int(x.shape[0]),
        "note": "trial time includes sampling, CKA, fitting, accuracy, MACs and recording; "
        "forward = the built stitched network over probe+val in one pass",
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    for key, value in result.items():
        print(f"{key:28s} {value}")


if __name__ == "__main__":
    main()
