"""How close a trial gets to its floor: one forward pass of what is new.

    python benchmarks/trial_cost.py [--configs 40]

Samples a fixed set of pairwise configs on the embedded zoo, then evaluates every one of them
(CKA score, least-squares fit, accuracy, parameters, MACs) in two ways within this one run:

* with the cache: one StitchContext for all trials (activation cache, Gram and cost tables);
* without it: a fresh context per trial that keeps nothing (each fragment traced as one graph,
  prefixes re-run, Grams recomputed, MACs counted by tracing the whole built network).

Writes benchmarks/results/trial_cost.json. Ratios are within one run on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import time
from pathlib import Path

import optuna
import torch

import search_spaces
from stitch_nas.activations import ActivationCache, StitchContext
from stitch_nas.data import load_digits_splits
from stitch_nas.stitching import build, config_cka, measure
from stitch_nas.zoo import load_mini_zoo

RESULTS = Path(__file__).parent / "results" / "trial_cost.json"


def sample_configs(ctx: StitchContext, n: int, seed: int = 0) -> list:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    configs, seen = [], set()
    while len(configs) < n:
        trial = study.ask()
        config = search_spaces.sample("pairwise", trial, ctx)
        study.tell(trial, 0.0)
        if config.stable_hash() not in seen:
            seen.add(config.stable_hash())
            configs.append(config)
    return configs


def trial_seconds(ctx: StitchContext, config) -> float:
    start = time.perf_counter()
    measure(ctx, config, cka=config_cka(ctx, config))
    return time.perf_counter() - start


def forward_seconds(ctx: StitchContext, config, x: torch.Tensor) -> float:
    net = build(ctx, config)
    ctx.run(net, x)  # warm-up
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        ctx.run(net, x)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=200, help="distinct configs (>= 40)")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    data = load_digits_splits()
    zoo = load_mini_zoo(data)
    cached = StitchContext(zoo, data)
    configs = sample_configs(cached, args.configs)

    cold = [trial_seconds(cached, c) for c in configs]  # fills the cache as a search would
    warm = [trial_seconds(cached, c) for c in configs]  # every table filled
    uncached = []
    for config in configs:
        fresh = StitchContext(
            zoo,
            data,
            cache=ActivationCache(memory_gb=0),
            cost_tables=False,
            fill="cut",
            pieces=False,
        )
        uncached.append(trial_seconds(fresh, config))
    val = data.val.x
    ratios = [w / forward_seconds(cached, c, val) for w, c in zip(warm, configs, strict=True)]

    result = {
        "machine": {
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(),
            "torch": torch.__version__,
        },
        "cores": os.cpu_count(),
        "configs": len(configs),
        "eval_samples": int(val.shape[0]),
        "trials_per_min": round(60 * len(cold) / sum(cold), 1),
        "trials_per_min_warm": round(60 * len(warm) / sum(warm), 1),
        "trials_per_min_uncached": round(60 * len(uncached) / sum(uncached), 1),
        "cache_speedup": round(sum(uncached) / sum(cold), 2),
        "cache_speedup_warm": round(sum(uncached) / sum(warm), 2),
        "median_trial_seconds_warm": round(statistics.median(warm), 4),
        "trial_over_forward": round(statistics.median(ratios), 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "cache_stats": cached.cache.stats(),
        "note": "trials_per_min and cache_speedup include filling the cache (cold); *_warm "
        "are with every table filled; trial_over_forward = median warm trial time / one "
        "forward pass of the same stitched network over the validation split",
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    for key, value in result.items():
        print(f"{key:28s} {value}")


if __name__ == "__main__":
    main()
