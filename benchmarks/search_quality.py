"""How close each search gets to the exhaustive Pareto front of a small, enumerable space.

    python benchmarks/search_quality.py [--models resnet,convnext,...] [--seeds 3]
        [--methods tpe,gp/depth,...] [--out results.json]

The space is ``pairwise`` with least-squares stitches on the embedded mini zoo (two different
models, one cut each, both directions): every config in it is measured once (accuracy on the
validation split, MACs, CKA) to get the exhaustive front. Then TPE, NSGA-II, NSGA-III, GP, QMC
and random search (the runner's built-in samplers, ``stitch_nas.samplers``; CKA pruning at
``--cka-threshold`` before fitting, as in a real study) and the StitchNet recursion (Alg. 1,
K=2, T=0.5, L=16, one stitch so its networks lie in the same space; evaluated best score
first) run at budgets of 5 %, 10 % and 25 % of the space.
Each sampler runs twice: on the space as it is (cut parameters named by route) and with
``cut_params="depth"`` (``tpe/depth``, ...: relative depths shared by all routes).
Least-squares stitches are deterministic, so a search's trial reads the exhaustive
measurement of the config it sampled instead of refitting it (same numbers, less time).

Reported: hypervolume (accuracy up, MACs down; reference point accuracy 0 and 1.1 x the
largest MACs in the space) of each found front as a fraction of the exhaustive front's, median
and range over seeds; the share of trials CKA pruning answered without fitting; the Spearman
correlation between CKA score and accuracy over the whole space. Writes
benchmarks/results/search_quality.json (``--out``: another file, e.g. for a run of some
``--methods`` only) and prints a table.

    python benchmarks/search_quality.py --fidelity 0.15 [--seeds 3] [--trials-share 0.25]

runs multi-fidelity evaluation's comparison instead: the same real search (the runner's
objective, TPE and NSGA-II, CKA pruning as above) with the gate off and at ``--fidelity``, per
seed; it counts the images each search forwards through its trials' networks (a complete trial
the whole validation split, a gated one its slice; CKA-pruned and repeated configs none) and
the hypervolume of each found front, and checks every complete trial's accuracy against the
exhaustive (ungated) measurement. Writes benchmarks/results/search_quality_fidelity.json.

    python benchmarks/search_quality.py --fidelity 0.15 --adapter linear --steps 30

runs that comparison with trained adapters: every joint is a ``linear`` adapter initialised by
least squares and trained ``--steps`` steps (the ``match`` loss), so the gate also decides,
from the least-squares version's slice accuracy, whether a config is trained at all. Work then
also counts the images training forwards (optimiser steps x batch), read from each training
run's own report; accuracies are checked against the ungated search's measurement of the same
config. Writes benchmarks/results/search_quality_fidelity_linear.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import torch
from scipy.stats import spearmanr

import search_spaces
from search_spaces.pairwise import joinable
from search_spaces.stitchnet import stitchnet_search
from stitch_nas.activations import StitchContext
from stitch_nas.adapters import _joint as adapter_joint
from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from stitch_nas.data import load_digits_splits
from stitch_nas.report import hypervolume
from stitch_nas.samplers import make_sampler
from stitch_nas.search import StitchObjective, evaluate_config, run_search
from stitch_nas.stitching import probe_accuracy
from stitch_nas.zoo import load_mini_zoo

RESULTS = Path(__file__).parent / "results" / "search_quality.json"
FIDELITY_RESULTS = RESULTS.with_name("search_quality_fidelity.json")
BUDGETS = (0.05, 0.10, 0.25)
DIRECTIONS = ("maximize", "minimize")
#: samplers on the space as it is, and with its cut parameters as relative depths
SAMPLER_NAMES = ("tpe", "nsga2", "nsga3", "gp", "qmc", "random")
METHODS = (*SAMPLER_NAMES, *(f"{name}/depth" for name in SAMPLER_NAMES))


def enumerate_pairwise(ctx: StitchContext, models: list[str]) -> list[StitchConfig]:
    """Every config of the ``pairwise`` space with least squares over ``models``."""
    configs = []
    for a in models:
        for b in models:
            if a == b:
                continue
            for ca in ctx.cuts(a):
                for cb in ctx.cuts(b):
                    if joinable(ca, cb):
                        frags = (Fragment(a, None, ca.name), Fragment(b, cb.name, None))
                        configs.append(StitchConfig(frags, (AdapterSpec("lstsq"),)))
    return configs


def _pruned(row: dict[str, Any], thresholds: tuple[float, float]) -> bool:
    """The runner's rule: CKA below its threshold, or probe accuracy below its multiple of
    chance (``row["probe_accuracy"]`` is stored as a multiple of chance)."""
    return row["cka"] < thresholds[0] or row["probe_accuracy"] < thresholds[1]


def front_hv(points: list[tuple[float, float]], ref: list[float]) -> float:
    return hypervolume(points, DIRECTIONS, ref) if points else 0.0


def run_sampler(
    method: str,
    seed: int,
    n: int,
    ctx: StitchContext,
    table: dict[str, dict],
    models: list[str],
    thresholds: tuple[float, float],
) -> tuple[list[tuple[float, float]], int]:
    """``n`` trials of the pairwise space; returns measured points and how many were pruned.

    ``method`` is a sampler name, with ``/depth`` for the space's ``cut_params="depth"``.
    """
    name, _, cut_params = method.partition("/")
    study = optuna.create_study(directions=list(DIRECTIONS), sampler=make_sampler(name, seed))
    points, pruned = [], 0
    for _ in range(n):
        trial = study.ask()
        config = search_spaces.sample(
            "pairwise", trial, ctx, models=models, cut_params=cut_params or "named"
        )
        row = table[config.stable_hash()]
        if _pruned(row, thresholds):  # the runner prunes here, before measuring on val
            pruned += 1
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        values = (row["accuracy"], row["macs"])
        points.append(values)
        study.tell(trial, values)
    return points, pruned


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help="comma-separated zoo models (default: all)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--cka-threshold", type=float, default=0.0, help="0: off (the default)")
    parser.add_argument(
        "--probe-threshold", type=float, default=1.5, help="times chance; the runner's default"
    )
    parser.add_argument("--fidelity", type=float, default=0.0, help="compare the gate at this")
    parser.add_argument("--trials-share", type=float, default=0.25, help="with --fidelity")
    parser.add_argument("--samplers", default="tpe,nsga2", help="with --fidelity")
    parser.add_argument(
        "--methods", default=",".join(METHODS), help="comma-separated, of the default list"
    )
    parser.add_argument("--out", default=str(RESULTS), help="the JSON file written")
    parser.add_argument("--adapter", default="lstsq", help="with --fidelity: a trained kind")
    parser.add_argument("--steps", type=int, default=30, help="with --adapter: training steps")
    args = parser.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"--methods: unknown {unknown}; use some of {', '.join(METHODS)}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    data = load_digits_splits()
    zoo = load_mini_zoo(data)
    ctx = StitchContext(zoo, data)
    models = [m for m in args.models.split(",") if m] or sorted(zoo.names())

    start = time.perf_counter()
    configs = enumerate_pairwise(ctx, models)
    table: dict[str, dict[str, Any]] = {}
    for config in configs:
        outcome = evaluate_config(ctx, config)
        if outcome.status != "complete" or outcome.measurement is None:
            raise SystemExit(f"{config.describe()} did not measure: {outcome.reason}")
        m = outcome.measurement
        table[config.stable_hash()] = {
            "accuracy": m.accuracy,
            "macs": m.macs,
            "cka": m.cka,
            "probe_accuracy": probe_accuracy(ctx, config).accuracy * ctx.num_classes,
        }
    exhaustive_seconds = time.perf_counter() - start
    rows = list(table.values())
    ref = [0.0, 1.1 * max(r["macs"] for r in rows)]
    all_points = [(r["accuracy"], r["macs"]) for r in rows]
    full = front_hv(all_points, ref)
    if args.fidelity:
        compare_fidelity(args, ctx, table, len(configs), models, ref, full)
        return
    accuracy = [r["accuracy"] for r in rows]
    rho = float(spearmanr([r["cka"] for r in rows], accuracy).statistic)
    rho_probe = float(spearmanr([r["probe_accuracy"] for r in rows], accuracy).statistic)
    thresholds = (args.cka_threshold, args.probe_threshold)
    below = [r for r in rows if _pruned(r, thresholds)]
    front_keys = _front(table)
    front_pruned = sum(_pruned(table[k], thresholds) for k in front_keys)
    front_probe = sorted(table[k]["probe_accuracy"] for k in front_keys)

    results: list[dict[str, Any]] = []
    start = time.perf_counter()
    ranked = stitchnet_search(ctx, models=models, max_joints=1, fuse=False)
    stitchnet_seconds = time.perf_counter() - start
    in_space = [r.config for r in ranked if r.config.stable_hash() in table]
    for fraction in BUDGETS:
        n = max(1, round(fraction * len(configs)))
        for name in methods:
            fracs, pruned_share = [], []
            for seed in range(args.seeds):
                points, pruned = run_sampler(name, seed, n, ctx, table, models, thresholds)
                fracs.append(front_hv(points, ref) / full)
                pruned_share.append(pruned / n)
            results.append(_row(name, fraction, n, fracs, pruned_share))
        chosen = in_space[:n]
        points = [
            (table[c.stable_hash()]["accuracy"], table[c.stable_hash()]["macs"]) for c in chosen
        ]
        results.append(
            _row("stitchnet", fraction, len(chosen), [front_hv(points, ref) / full], [0.0])
        )

    out = {
        "space": "pairwise (lstsq), both directions",
        "models": models,
        "space_size": len(configs),
        "exhaustive_seconds": round(exhaustive_seconds, 2),
        "exhaustive_front_size": len(front_keys),
        "cka_threshold": args.cka_threshold,
        "probe_threshold": args.probe_threshold,
        "share_of_space_below_threshold": len(below) / len(rows),
        "front_configs_below_threshold": front_pruned,
        "front_probe_accuracy_times_chance": front_probe,
        "spearman_cka_accuracy": rho,
        "spearman_probe_accuracy_accuracy": rho_probe,
        "stitchnet_networks": len(ranked),
        "stitchnet_networks_in_space": len(in_space),
        "stitchnet_seconds": round(stitchnet_seconds, 2),
        "seeds": args.seeds,
        "results": results,
        "machine": {
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "optuna": optuna.__version__,
            "platform": platform.platform(),
        },
    }
    written = Path(args.out)
    written.parent.mkdir(parents=True, exist_ok=True)
    written.write_text(json.dumps(out, indent=2) + "\n")
    _print(out)


class TrainingCount:
    """Images that adapter training forwards (steps x batch), read from each run's report."""

    def __init__(self) -> None:
        self.images = 0
        self._train = adapter_joint.train

        def counted(*args: Any, **kwargs: Any) -> Any:
            report = self._train(*args, **kwargs)
            opts, data = args[4], args[3]
            self.images += report.steps * min(int(opts["batch_size"]), len(data.inputs))
            return report

        adapter_joint.train = counted  # type: ignore[assignment]


def fidelity_run(
    ctx: StitchContext, sampler: str, seed: int, n: int, fidelity: float, args: Any, models: list
) -> tuple[optuna.Study, float]:
    space: dict[str, Any] = {"models": models}
    if args.adapter != "lstsq":
        space.update(adapter=args.adapter, adapter_options={"steps": args.steps})
    objective = StitchObjective(
        ctx,
        cka_threshold=args.cka_threshold,
        fidelity=fidelity,
        min_slice=0,  # the mechanism on digits' 45-image slices, below the default minimum
        space_options=space,
    )
    study = optuna.create_study(directions=list(DIRECTIONS), sampler=make_sampler(sampler, seed))
    start = time.perf_counter()
    run_search(objective, study, n)
    return study, time.perf_counter() - start


def images_forwarded(study: optuna.Study, n_val: int) -> int:
    """Images the accuracy passes of ``study``'s trials forwarded (repeats and CKA prunes: 0)."""
    total = 0
    for t in study.trials:
        if t.state == optuna.trial.TrialState.COMPLETE and "duplicate_of" not in t.user_attrs:
            total += n_val
        total += int(t.user_attrs.get("slice_images", 0))
    return total


def compare_fidelity(
    args: Any, ctx: StitchContext, table: dict, size: int, models: list, ref: list, full: float
) -> None:
    n_val, n = len(ctx.labels("val")), max(1, round(args.trials_share * size))
    trained = args.adapter != "lstsq"
    counter = TrainingCount()
    runs, mismatches, compared = [], 0, 0
    for sampler in args.samplers.split(","):
        for seed in range(args.seeds):
            row: dict[str, Any] = {"sampler": sampler, "seed": seed}
            measured: dict[str, float] = {}  # the ungated search's accuracy per config
            for label, fidelity in (("full", 0.0), ("gated", args.fidelity)):
                counter.images = 0
                study, seconds = fidelity_run(ctx, sampler, seed, n, fidelity, args, models)
                done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
                for t in done:  # the gate must not change a measured accuracy
                    key = StitchConfig.from_dict(t.user_attrs["config"]).stable_hash()
                    if not trained:
                        truth: float | None = table[key]["accuracy"]
                    elif label == "full":
                        measured[key], truth = t.values[0], None
                    else:
                        truth = measured.get(key)
                    if truth is not None:
                        compared += 1
                        mismatches += truth != t.values[0]
                pruned = [t for t in study.trials if "slice_images" in t.user_attrs]
                before = [
                    t for t in pruned if "before training" in t.user_attrs.get("prune_reason", "")
                ]
                passes = images_forwarded(study, n_val)
                row[label] = {
                    "images": passes + counter.images,
                    "accuracy_pass_images": passes,
                    "training_images": counter.images,
                    "hv": front_hv([tuple(t.values) for t in done], ref),
                    "complete": len(done),
                    "fidelity_pruned": len(pruned),
                    "pruned_by_slice_images": dict(
                        sorted(Counter(str(t.user_attrs["slice_images"]) for t in pruned).items())
                    ),
                    "pruned_before_training": len(before),
                    "seconds": round(seconds, 2),
                }
            row["work_saved"] = 1 - row["gated"]["images"] / row["full"]["images"]
            row["seconds_saved"] = 1 - row["gated"]["seconds"] / row["full"]["seconds"]
            row["hv_loss"] = 1 - row["gated"]["hv"] / row["full"]["hv"]
            runs.append(row)
            print(
                f"{sampler} seed {seed}: saved {100 * row['work_saved']:.1f} % of images, "
                f"{100 * row['seconds_saved']:.1f} % of seconds, "
                f"hypervolume loss {100 * row['hv_loss']:.2f} %",
                flush=True,
            )
            _save_fidelity(args, runs, (mismatches, compared), models, size, n, n_val, full)


def _save_fidelity(
    args: Any, runs: list, checked: tuple, models: list, size: int, n: int, n_val: int, full: float
) -> None:
    """Write what has run so far (a long comparison leaves its figures if cut short)."""
    summary = {
        s: {
            "work_saved_median": statistics.median(r["work_saved"] for r in rs),
            "seconds_saved_median": statistics.median(r["seconds_saved"] for r in rs),
            "hv_loss_median": statistics.median(r["hv_loss"] for r in rs),
        }
        for s in args.samplers.split(",")
        if (rs := [r for r in runs if r["sampler"] == s])
    }
    out = {
        "space": f"pairwise ({args.adapter}), both directions",
        "adapter": args.adapter,
        "training_steps": args.steps if args.adapter != "lstsq" else 0,
        "models": models,
        "space_size": size,
        "trials": n,
        "val_images": n_val,
        "fidelity": args.fidelity,
        "cka_threshold": args.cka_threshold,
        "seeds": args.seeds,
        "hv_exhaustive": full,
        "accuracy_mismatches_vs_ungated": checked[0],
        "accuracies_checked": checked[1],
        "summary": summary,
        "runs": runs,
        "machine": {"cores": os.cpu_count(), "torch": torch.__version__},
    }
    path = FIDELITY_RESULTS
    if args.adapter != "lstsq":
        path = path.with_name(f"{path.stem}_{args.adapter}.json")
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(summary, indent=2), f"accuracy mismatches: {checked[0]} of {checked[1]}")


def _front(table: dict[str, dict[str, Any]]) -> list[str]:
    keys = list(table)
    pts = np.asarray([(-table[k]["accuracy"], table[k]["macs"]) for k in keys], dtype=float)
    return [
        k
        for k, p in zip(keys, pts, strict=True)
        if not np.any(np.all(pts <= p, axis=1) & np.any(pts < p, axis=1))
    ]


def _row(method: str, fraction: float, n: int, fracs: list[float], pruned: list[float]) -> dict:
    return {
        "method": method,
        "budget": fraction,
        "evaluations": n,
        "hv_fraction_median": statistics.median(fracs),
        "hv_fraction_min": min(fracs),
        "hv_fraction_max": max(fracs),
        "pruned_share_median": statistics.median(pruned),
    }


def _print(out: dict[str, Any]) -> None:
    print(
        f"space: {out['space']} over {len(out['models'])} models, {out['space_size']} configs, "
        f"exhaustive front {out['exhaustive_front_size']} configs "
        f"({out['exhaustive_seconds']} s to measure all)"
    )
    print(
        f"Spearman with accuracy over the space: CKA {out['spearman_cka_accuracy']:.3f}, "
        f"least-squares probe accuracy {out['spearman_probe_accuracy_accuracy']:.3f}"
    )
    print(
        f"pruned (CKA < {out['cka_threshold']} or probe accuracy < {out['probe_threshold']} x "
        f"chance): {100 * out['share_of_space_below_threshold']:.1f} % of the space, "
        f"{out['front_configs_below_threshold']} of the front's configs"
    )
    print(
        f"StitchNet recursion: {out['stitchnet_networks']} networks "
        f"({out['stitchnet_networks_in_space']} in the space) in {out['stitchnet_seconds']} s"
    )
    print(
        f"{'method':<13} {'budget':>6} {'evals':>5} {'HV/exhaustive (median, range)':>30} "
        f"{'pruned':>7}"
    )
    for r in out["results"]:
        span = (
            f"{r['hv_fraction_median']:.3f} ({r['hv_fraction_min']:.3f}-{r['hv_fraction_max']:.3f})"
        )
        print(
            f"{r['method']:<13} {100 * r['budget']:>5.0f}% {r['evaluations']:>5} {span:>30} "
            f"{100 * r['pruned_share_median']:>6.1f}%"
        )


if __name__ == "__main__":
    main()
