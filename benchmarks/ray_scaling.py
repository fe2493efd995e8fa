"""Trials per minute of the Ray executor with 1 and 2 workers on the embedded zoo.

    python benchmarks/ray_scaling.py [--trials 150] [--workers 1 2] [--repeat 3]
    python benchmarks/ray_scaling.py --trained-steps 30 [--trials 60]
    python benchmarks/ray_scaling.py --two-node [--trials 60]
    python benchmarks/ray_scaling.py --storage journal
    python benchmarks/ray_scaling.py --modes workers

Each setting runs a fresh study (random sampler, same seed, CKA threshold 0.3) on one local Ray
started with as many CPUs as the largest worker count; the local executor is timed on the same
searches for reference, with one torch thread and the same warm-up as a worker (models traced,
MAC tables and activations filled). Rates count the trials that ran on a worker (sampled
repeats, answered without a fit, are reported apart) over the search time; start-up (sharing
the activations, starting the actors, each worker opening the study) is reported separately.
Each row also counts the distinct configs its trials measured, and the ratio is given in those
too: in the workers mode a config another worker sampled within the last second may be
measured twice. The worker settings alternate ``--repeat`` times, so the ratio's spread shows
how much the machine's load moved; the 1, 5 and 15 minute load averages are recorded before
and after, and each row records how many of the machine's cores were busy during its search
(``cores_busy``, from /proc/stat: the driver, the workers and Ray's own processes together).

Trials here are cheap (least-squares stitches of the digits zoo, ~60 ms each on one core), and
the driver's own work per trial (Optuna's ask and tell on SQLite, sampling, the repeat check:
~25 ms of CPU, also for each sampled repeat) shares the two cores with the workers, so the
ratio measures how much the driver costs as much as how workers scale. ``--trained-steps N``
times trials that train a ``linear`` adapter for N steps instead (~0.3 s at 30 steps, still
far cheaper than a trial on a real zoo), written to ray_scaling_stepsN.json.

Both Ray modes run in each round (``--modes``): ``driver``, where the driver asks the study for
every trial and tells every result while the workers evaluate, and ``workers``, where each
worker asks and tells a study it opens itself and the driver only watches (the default for a
study in a file on one machine). In the workers mode a worker with one CPU also pays Optuna's
ask and tell itself, so compare the modes' 2-worker rates as well as their ratios.

Studies live where a search's do by default, ``DIR/study.db`` (SQLite with Optuna's heartbeat);
``--storage journal`` puts them in a journal file (``--storage DIR/study.log``) instead and
writes ray_scaling_journal.json. Optuna's ask and tell on SQLite run ~35 queries per trial, ~15
ms of the driver's CPU here, where the journal file appends a line.

As a reference without Ray, the same search also runs as 1 and 2 local drivers joined on one
study (forked processes with the warm context, each asking and telling for itself, sampler
seeds ``seed + i``), the way ``stitch-nas search --join`` runs several drivers: its 2 : 1 ratio
shows what the two cores allow when no part of the search is serial (``--no-joined`` skips it).
They are forked after the local reference ran the same seed and inherit its cache: the
validation activations it used (Ray's workers receive every probe and validation activation)
and, with ``--trained-steps``, the train-split activations it computed (Ray's workers compute
those themselves), so compare their rates with each other rather than with the other settings.

``--two-node`` starts a two-node Ray cluster on this machine instead (Ray's own test helper
``ray.cluster_utils.Cluster``: a head and a second node of one CPU each, loopback only), runs
the search with two workers joined to it by address, and reports how many trials ran on each
node (each trial records its node as ``ray_node``); the cluster is torn down after.

Writes benchmarks/results/ray_scaling.json (or ray_two_node.json). A benchmark, not a test: the
figures depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

# Loopback only: Ray otherwise rewrites 127.0.0.1 in a cluster address to this machine's
# outward address (read when ray is imported, so set first)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import optuna  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from process_tree import busy_jiffies, cores_busy  # noqa: E402

from stitch_nas.activations import StitchContext  # noqa: E402
from stitch_nas.data import load_digits_splits  # noqa: E402
from stitch_nas.search import (  # noqa: E402
    RAY_NODE,
    RayExecutor,
    StitchObjective,
    create_study,
    run_search,
)
from stitch_nas.stitching import fragment_macs  # noqa: E402
from stitch_nas.zoo import load_mini_zoo  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "ray_scaling.json"
TWO_NODE_RESULTS = Path(__file__).parent / "results" / "ray_two_node.json"


class _TimedExecutor(RayExecutor):
    """A RayExecutor that records how many of the machine's cores were busy while it searched
    (start-up excluded): with ~40 ms trials, the ratio is bounded by how full two cores get."""

    cores_busy: float | None = None

    def _drive(self, *args, **kwargs):
        before = busy_jiffies()
        counts = super()._drive(*args, **kwargs)
        self.cores_busy = cores_busy(before, busy_jiffies())
        return counts


def _space_options(steps: int) -> dict:
    """The space's options: least squares (0), or a linear adapter trained ``steps`` steps."""
    return {"adapter": "linear", "adapter_options": {"steps": steps}} if steps else {}


def _study(objective: StitchObjective, seed: int, journal: bool) -> optuna.Study:
    """A fresh study in a temporary folder: its study.db, or a journal file there."""
    folder = tempfile.mkdtemp()
    storage = str(Path(folder) / "study.log") if journal else None
    return create_study(objective, folder, sampler="random", seed=seed, storage=storage)


def _local(
    ctx: StitchContext, trials: int, seed: int, steps: int = 0, journal: bool = False
) -> dict:
    objective = StitchObjective(ctx, cka_threshold=0.3, space_options=_space_options(steps))
    study = _study(objective, seed, journal)
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


def _ray(
    ctx: StitchContext,
    trials: int,
    seed: int,
    workers: int,
    address: str | None = None,
    steps: int = 0,
    journal: bool = False,
    mode: str = "auto",
) -> dict:
    objective = StitchObjective(ctx, cka_threshold=0.3, space_options=_space_options(steps))
    study = _study(objective, seed, journal)
    executor = _TimedExecutor(workers=workers, address=address, mode=mode)
    run_search(objective, study, trials, executor=executor)
    run = executor.last_run
    ran = run["complete"] + run["pruned"] + run["failed"]
    nodes: dict[str, int] = {}
    networks = set()  # the configs measured: two workers may measure one config twice
    for trial in study.trials:
        node = trial.user_attrs.get(RAY_NODE)
        if node is not None:
            nodes[node] = nodes.get(node, 0) + 1
        repeat = "duplicate_of" in trial.user_attrs or "reference_of" in trial.user_attrs
        if node is not None and not repeat and trial.state != optuna.trial.TrialState.RUNNING:
            networks.add(json.dumps(trial.user_attrs["config"], sort_keys=True))
    return {
        "mode": run["mode"],
        "workers": workers,
        "startup_seconds": round(run["startup_seconds"], 2),
        "search_seconds": round(run["search_seconds"], 2),
        "ran": ran,
        "duplicates": run["duplicates"],
        "failed": run["failed"],
        "trials_per_minute": round(60 * ran / run["search_seconds"], 1),
        "distinct_networks": len(networks),
        "distinct_networks_per_minute": round(60 * len(networks) / run["search_seconds"], 1),
        "driver_cpu_ms_per_trial": round(
            1000 * run["driver_cpu_seconds"] / max(1, len(study.trials)), 1
        ),
        # repeats are answered by the driver alone, so a worker's trial carries their cost too
        "driver_cpu_ms_per_worker_trial": round(1000 * run["driver_cpu_seconds"] / max(1, ran), 1),
        # the whole machine's busy cores over the search (driver, workers, Ray's own processes)
        "cores_busy": executor.cores_busy,
        "trials_per_node": nodes,
    }


def _joined_driver(
    ctx: StitchContext,
    folder: str,
    storage: str | None,
    seed: int,
    trials: int,
    steps: int,
    barrier: multiprocessing.synchronize.Barrier,
) -> None:
    torch.set_num_threads(1)
    objective = StitchObjective(ctx, cka_threshold=0.3, space_options=_space_options(steps))
    study = create_study(objective, folder, sampler="random", seed=seed, storage=storage, join=True)
    barrier.wait()
    run_search(objective, study, trials)


def _joined(
    ctx: StitchContext, trials: int, seed: int, drivers: int, steps: int, journal: bool
) -> dict:
    """``drivers`` forked local drivers joined on one fresh study, until it holds ``trials``."""
    folder = tempfile.mkdtemp()
    storage = str(Path(folder) / "study.log") if journal else None
    objective = StitchObjective(ctx, cka_threshold=0.3, space_options=_space_options(steps))
    study = create_study(objective, folder, sampler="random", seed=seed, storage=storage, join=True)
    run_search(objective, study, 1)  # the references and one trial, as the other settings
    fork = multiprocessing.get_context("fork")  # the children inherit the warm context
    barrier = fork.Barrier(drivers + 1)
    processes = [
        fork.Process(
            target=_joined_driver,
            args=(ctx, folder, storage, seed + i, trials, steps, barrier),
        )
        for i in range(drivers)
    ]
    for process in processes:
        process.start()
    barrier.wait()
    before, start = busy_jiffies(), time.perf_counter()
    for process in processes:
        process.join()
    seconds, cores = time.perf_counter() - start, cores_busy(before, busy_jiffies())
    repeats = sum(
        "duplicate_of" in t.user_attrs or "reference_of" in t.user_attrs for t in study.trials
    )
    ran = len(study.trials) - 1 - repeats
    return {
        "drivers": drivers,
        "seconds": round(seconds, 2),
        "ran": ran,
        "duplicates": repeats,
        "trials_per_minute": round(60 * ran / seconds, 1),
        "cores_busy": cores,
        "exit_codes": [process.exitcode for process in processes],
    }


def _ratio_summary(ratios: list[float]) -> dict:
    return {
        "ratio_last_to_first": ratios,
        "median": round(statistics.median(ratios), 2),
        "min": min(ratios),
        "max": max(ratios),
    }


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _machine() -> dict:
    return {
        "cores": os.cpu_count(),
        "torch_threads_local_and_per_worker": 1,
        "platform": platform.platform(),
        "torch": torch.__version__,
        "ray": ray.__version__,
    }


def _two_node(ctx: StitchContext, trials: int, seed: int) -> None:
    from ray.cluster_utils import Cluster

    start = time.perf_counter()
    node = {"num_cpus": 1, "node_ip_address": "127.0.0.1"}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        up = time.perf_counter() - start
        row = _ray(ctx, trials, seed, 2, address=cluster.address)
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(
        f"two-node cluster ({up:.1f} s to start): {row['ran']} trials on workers, per node "
        f"{sorted(row['trials_per_node'].values())}, {row['trials_per_minute']:,.0f} trials/min"
    )
    result = {
        "machine": {**_machine(), "load_average_1_5_15_min_at_end": _load()},
        "cluster": "ray.cluster_utils.Cluster: head + 1 node, 1 CPU each, 127.0.0.1",
        "cluster_start_seconds": round(up, 2),
        "trials": trials,
        "run": row,
    }
    TWO_NODE_RESULTS.parent.mkdir(parents=True, exist_ok=True)
    TWO_NODE_RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {TWO_NODE_RESULTS}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=150)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every worker count")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--two-node", action="store_true", help="the two-node cluster run")
    parser.add_argument("--no-local", action="store_true", help="skip the local reference")
    parser.add_argument(
        "--no-joined", action="store_true", help="skip the joined local drivers reference"
    )
    parser.add_argument(
        "--trained-steps", type=int, default=0, help="train a linear adapter N steps per trial"
    )
    parser.add_argument(
        "--storage", choices=["sqlite", "journal"], default="sqlite", help="where studies live"
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=["driver", "workers"],
        default=["driver", "workers"],
        help="the Ray modes to time, each in every round",
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    data = load_digits_splits()
    ctx = StitchContext(load_mini_zoo(data), data)
    if args.two_node:
        _two_node(ctx, args.trials, args.seed)
        return
    load_before = _load()
    journal = args.storage == "journal"
    local = None
    threads = torch.get_num_threads()
    if not args.no_local:
        torch.set_num_threads(1)  # as a worker with one CPU: oversubscribed threads distort timing
        local = _local(ctx, args.trials, args.seed, args.trained_steps, journal)
        torch.set_num_threads(threads)
        print(f"local executor: {local['trials_per_minute']:,.0f} trials/min")
    joined: dict | None = None
    if not args.no_local and not args.no_joined:  # before Ray starts: it does not survive a fork
        torch.set_num_threads(1)  # forked with one thread, as the drivers run
        joined_rounds = []
        for _ in range(args.repeat):
            rows = []
            for drivers in args.workers:
                row = _joined(ctx, args.trials, args.seed, drivers, args.trained_steps, journal)
                rows.append(row)
                print(
                    f"joined local drivers, {drivers}: {row['trials_per_minute']:,.0f} trials/min "
                    f"({row['ran']} trials in {row['seconds']} s, {row['duplicates']} repeats, "
                    f"{row['cores_busy']} cores busy, exit codes {row['exit_codes']})"
                )
            joined_rounds.append(rows)
        ratios = [
            round(rows[-1]["trials_per_minute"] / rows[0]["trials_per_minute"], 2)
            for rows in joined_rounds
        ]
        joined = {"rounds": joined_rounds, "ratio": _ratio_summary(ratios)}
        torch.set_num_threads(threads)
        print(f"joined local drivers, ratio per round: {ratios}")
    ray.init(num_cpus=max(args.workers), include_dashboard=False, log_to_driver=False)
    rounds: dict[str, list[list[dict]]] = {mode: [] for mode in args.modes}
    try:
        for _ in range(args.repeat):
            for mode in args.modes:
                rows = []
                for workers in args.workers:
                    row = _ray(
                        ctx,
                        args.trials,
                        args.seed,
                        workers,
                        steps=args.trained_steps,
                        journal=journal,
                        mode=mode,
                    )
                    rows.append(row)
                    print(
                        f"ray {mode} mode, {workers} worker(s): "
                        f"{row['trials_per_minute']:,.0f} trials/min ({row['ran']} trials on "
                        f"workers in {row['search_seconds']} s, start-up "
                        f"{row['startup_seconds']} s, driver CPU "
                        f"{row['driver_cpu_ms_per_worker_trial']} ms per worker trial, "
                        f"{row['duplicates']} repeats, {row['cores_busy']} cores busy, "
                        f"load {_load()})"
                    )
                base = rows[0]["trials_per_minute"]
                distinct = rows[0]["distinct_networks_per_minute"]
                for row in rows:
                    row["speedup_over_first"] = round(row["trials_per_minute"] / base, 2)
                    row["distinct_speedup_over_first"] = round(
                        row["distinct_networks_per_minute"] / distinct, 2
                    )
                rounds[mode].append(rows)
    finally:
        ray.shutdown()
    summary = {}
    if len(args.workers) > 1:
        for mode, mode_rounds in rounds.items():
            ratios = [rows[-1]["speedup_over_first"] for rows in mode_rounds]
            distinct = [rows[-1]["distinct_speedup_over_first"] for rows in mode_rounds]
            summary[mode] = _ratio_summary(ratios)
            summary[mode]["distinct_networks"] = _ratio_summary(distinct)
            print(
                f"{mode} mode, ratio {args.workers[-1]} : {args.workers[0]} workers over "
                f"{len(ratios)} rounds: median {summary[mode]['median']:.2f} "
                f"(min {summary[mode]['min']:.2f}, max {summary[mode]['max']:.2f}); "
                f"in distinct networks: {distinct}"
            )
    result = {
        "machine": {
            **_machine(),
            "load_average_1_5_15_min_at_start": load_before,
            "load_average_1_5_15_min_at_end": _load(),
        },
        "trials": args.trials,
        "sampler": "random",
        "storage": "journal file" if journal else "study.db (SQLite, heartbeat)",
        "space_options": _space_options(args.trained_steps),
        "local": local,
        "joined_local_drivers": joined,
        "ray_rounds": rounds,
        "ratio": summary,
        "note": "trials/min counts trials run on workers (recognised repeats excluded) over "
        "search time; distinct_networks counts their distinct configs (a config two workers "
        "sampled within the repeat check's second is measured twice); start-up (the zoo into "
        "the object store, actor start, each worker opening the study) excluded and reported apart",
    }
    out = RESULTS.with_name(f"ray_scaling_steps{args.trained_steps}.json")
    if not args.trained_steps:
        out = RESULTS.with_name("ray_scaling_journal.json") if journal else RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
