"""A short search on an ImageNet-size zoo, locally and on Ray workers, as the validation grows.

    python benchmarks/imagenet_scale.py [--sizes 1000,2500,5000] [--probe 2000] [--trials 6]
                                        [--executors local,ray] [--workers 1,2] [--threads 2]
                                        [--models resnet18,resnet50,...] [--folder DIR]
                                        [--append]

The zoo: five timm ImageNet architectures of different families (by default resnet18,
resnet50, deit_tiny_patch16_224, efficientnet_b0 and convnext_atto), 1,000 classes, random
weights from a fixed seed, each fed through its own ``pretrained_cfg`` eval transform (resize by
``crop_pct``, centre crop, its mean and std) by :func:`stitch_nas.zoo.from_timm`. Cost, memory
and scaling are real; accuracy is chance and means nothing here.

The data: a generated ImageNet-style folder (``train/<synset>/*.JPEG``, ``val/<synset>/*.JPEG``,
1,000 synsets) of JPEGs of varied sizes (shorter side 160-480 px) and aspect ratios (3:4 to
16:9), written once under ``--folder`` and reused; for ``N`` validation images ``val/`` holds
``2N`` (its two halves are the validation and test splits) and the probe ``--probe`` images of
``train/``, all read through :func:`stitch_nas.data.load_split_folders` batch by batch.

Each (executor, size) runs in its own process: the zoo's reference figures on the validation split,
then ``--trials`` trials of the pairwise least-squares space (random sampler, seed 0, pruning off:
random weights score at chance, and the cost at issue is a whole trial's; the default cache
budget), locally or on Ray workers of one CPU each (a local Ray started by the run; one run per
count in ``--workers``). Every process the run starts is watched (:mod:`process_tree`): its peak
resident set, and the growth of ``/dev/shm`` (the object store). Per run: seconds to the first
finished trial, trials per hour over the trials' phase (complete trials: a repeat of a sampled
config measures no network), and, for local runs (null in Ray rows), each trial over one plain
forward pass of its own network over the same probe and validation images (median over the trials
that met their first model's validation split first: ``trial_over_forward_cold``), and over the
passes such a trial cannot avoid (``trial_over_necessary_cold``: its first model up to the cut over
the probe, its second model up to the joint over the probe where no earlier trial read it, and the
network over the validation split; a network whose second model is dear up to the joint and first
model cheap needs far more than its own forward pass), and ``cores_busy_in_trials``, the machine's
busy cores over the trials' phase (every process: workers, their image decoders, the driver; on a
machine where nothing else runs). ``ray_2_over_1`` is Ray's trials per hour at two workers over one
at each size where both ran, and ``ray_over_local`` the most workers' over the local run's (which
uses ``--threads`` threads). ``--append`` keeps the runs already in ``--results`` (a rerun of the
same executor, workers and size replaces its row) and recomputes the summaries over all of them;
the file is written after every run. ``--cache-dir DIR`` gives each run a new spill folder under
``DIR``, shared by that run's driver and workers and by no other run. ``--rows LOG`` takes the rows
a run printed before it was stopped (marked ``from_printed_rows``).

A GPU section (trials per second at 224 px on one GPU, bfloat16 autocast's speed-up and
agreement) runs with ``--gpu`` where CUDA is available; otherwise ``"gpu"`` records why it did
not run. Writes benchmarks/results/imagenet_scale.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from process_tree import busy_jiffies, cores_busy, run_measured
from provenance import commit

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "imagenet_scale.json"
FOLDER = str(Path.home() / ".cache" / "stitch_nas" / "imagenet_scale")
MODELS = ("resnet18", "resnet50", "deit_tiny_patch16_224", "efficientnet_b0", "convnext_atto")
CLASSES = 1000


def _synsets() -> list[str]:
    return [f"n{i:08d}" for i in range(CLASSES)]


def write_folder(root: Path, train: int, val: int) -> None:
    """``train`` and ``val`` JPEGs of varied sizes under ``root/{train,val}/<synset>/``, unless
    a finished folder of at least that size is there (a marker file says so)."""
    from PIL import Image

    done = root / f".complete-{train}-{val}"
    if done.exists():
        return
    rng = np.random.default_rng(0)
    for split, count in (("train", train), ("val", val)):
        for synset in _synsets():
            (root / split / synset).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            short = int(rng.integers(160, 481))
            aspect = float(rng.uniform(0.75, 16 / 9))
            w, h = (
                (int(short * aspect), short) if rng.random() < 0.5 else (short, int(short * aspect))
            )
            low = Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8))
            low.resize((w, h), Image.BILINEAR).save(
                root / split / _synsets()[i % CLASSES] / f"{split}_{i:06d}.JPEG", quality=85
            )
    done.touch()


def size_folder(root: Path, val: int) -> Path:
    """A folder whose ``val/`` holds the first ``2 * val`` images of ``root/val`` (symbolic
    links) and whose ``train/`` is ``root/train``."""
    view = root / f"view_val{val}"
    if (view / ".complete").exists():
        return view
    (view / "val").mkdir(parents=True, exist_ok=True)
    if not (view / "train").exists():
        (view / "train").symlink_to(root / "train")
    for synset in _synsets():
        (view / "val" / synset).mkdir(exist_ok=True)
    for i in range(2 * val):
        name = f"val_{i:06d}.JPEG"
        link = view / "val" / _synsets()[i % CLASSES] / name
        if not link.exists():
            link.symlink_to(root / "val" / _synsets()[i % CLASSES] / name)
    (view / ".complete").touch()
    return view


# -- one run, in its own process --------------------------------------------------------------
def timm_zoo(names: list[str]):  # type: ignore[no-untyped-def]
    """The zoo: each named timm architecture, random weights from seed 0, 1,000 classes."""
    import torch

    from stitch_nas.zoo import Zoo, from_timm

    zoo = Zoo()
    for name in names:
        torch.manual_seed(0)
        zoo.add(from_timm(name, num_classes=CLASSES, label_names=_synsets()))
    return zoo


def _seconds(trial: Any) -> float:
    return (trial.datetime_complete - trial.datetime_start).total_seconds()


class BusyCores:
    """Reads the machine's busy CPU time (:func:`process_tree.busy_jiffies`) twice a second
    until stopped: the cores busy over any stretch of the run, counting every process (the Ray
    workers and their image decoders too), on a machine where nothing else runs."""

    def __init__(self, interval: float = 0.5) -> None:
        self.samples: list[tuple[float, tuple[int, int] | None]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(interval,), daemon=True)
        self._thread.start()

    def _loop(self, interval: float) -> None:
        while not self._done.is_set():
            self.samples.append((time.time(), busy_jiffies()))
            self._done.wait(interval)

    def between(self, start: float, end: float) -> float | None:
        """Cores busy on average from ``start`` to ``end`` (epoch seconds), from the first and
        last readings inside that stretch."""
        self._done.set()
        self._thread.join()
        inside = [reading for at, reading in self.samples if start <= at <= end]
        return cores_busy(inside[0], inside[-1]) if len(inside) >= 2 else None


def run_one(
    args: argparse.Namespace, executor: str, size: int, autocast: str | None = None
) -> dict[str, Any]:
    """One short search in this process; its figures (memory is measured from outside)."""
    import optuna
    import torch

    from stitch_nas import attrs
    from stitch_nas.activations import StitchContext
    from stitch_nas.config import StitchConfig
    from stitch_nas.data import load_split_folders
    from stitch_nas.machine import reuse_freed_memory
    from stitch_nas.search import RayExecutor, StitchObjective, create_study, run_search
    from stitch_nas.stitching import build

    began = datetime.datetime.now()  # Optuna stamps trials with naive local times too
    busy = BusyCores()
    reuse_freed_memory()  # as the command line sets up its process
    torch.set_num_threads(args.threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    data = load_split_folders(size_folder(Path(args.folder), size), size=224, probe_size=args.probe)
    cache = None  # the default budget, no spill folder, as the command line's default
    if args.cache_gb is not None or args.cache_dir is not None:
        from stitch_nas.activations import ActivationCache

        cache = ActivationCache(
            memory_gb=args.cache_gb, spill_dir=args.cache_dir, device=args.device
        )
    zoo = timm_zoo(args.models.split(","))
    ctx = StitchContext(zoo, data, device=args.device, autocast=autocast, cache=cache)
    # random weights score at chance: with pruning on, nearly every trial would stop at the
    # probe or the gate's slice; off, each is measured on the whole split, the cost at issue
    objective = StitchObjective(ctx, space="pairwise", probe_threshold=0.0, fidelity=0.0)
    study = create_study(objective, Path(args.out) / f"{executor}_{size}", sampler="random")
    runner = None
    workers = int(args.workers)
    if executor == "ray":
        import ray

        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        runner = RayExecutor(workers=workers, cpus_per_worker=1.0)
    run_search(objective, study, args.trials, executor=runner)
    done = [t for t in study.trials if t.datetime_complete is not None and t.state.is_finished()]
    done = [t for t in done if t.state != optuna.trial.TrialState.FAIL]
    first_start = min(t.datetime_start for t in done)
    last_end = max(t.datetime_complete for t in done)
    row: dict[str, Any] = {
        "executor": executor,
        "device": str(ctx.device),
        "autocast": autocast,
        "workers": workers if executor == "ray" else 1,
        "cache_budget_gb": round(ctx.cache.budget_bytes / 2**30, 3),
        "spill_folder": args.cache_dir is not None,
        "val_images": len(data.val),
        "probe_images": len(data.probe),
        "trials": len(done),
        "complete": sum(t.state == optuna.trial.TrialState.COMPLETE for t in done),
        "seconds_to_first_trial": round(
            (min(t.datetime_complete for t in done) - began).total_seconds(), 1
        ),
        "trials_seconds": round((last_end - first_start).total_seconds(), 1),
        # networks measured: a repeat of a sampled config is pruned at once and measures none
        "trials_per_hour": round(
            3600
            * sum(t.state == optuna.trial.TrialState.COMPLETE for t in done)
            / (last_end - first_start).total_seconds(),
            1,
        ),
        "cores_busy_in_trials": busy.between(first_start.timestamp(), last_end.timestamp()),
        # config -> accuracy of each complete trial, to compare runs of the same seed
        "accuracy": {
            json.dumps(t.user_attrs[attrs.CONFIG], sort_keys=True): t.values[0]
            for t in done
            if t.state == optuna.trial.TrialState.COMPLETE
        },
    }
    if executor == "ray":
        import ray

        ray.shutdown()
        # not timed: a worker's trials ran on one thread in its own process, and a forward
        # pass timed here, on --threads threads, would not be their twin
        return row | {"trial_over_forward_cold": None, "trial_over_necessary_cold": None}
    ratios, necessary, seen, joints = [], [], set(), set()
    for trial in sorted(done, key=lambda t: t.number):
        config = StitchConfig.from_dict(trial.user_attrs[attrs.CONFIG])
        first, last = config.fragments[0], config.fragments[-1]
        cold, _ = first.model not in seen, seen.add(first.model)
        joint_seen, _ = (last.model, last.start) in joints, joints.add((last.model, last.start))
        if not cold or trial.state != optuna.trial.TrialState.COMPLETE:
            continue
        net = build(ctx, config).eval()
        start = time.perf_counter()  # reading and transforming the images is part of the pass
        with torch.no_grad():
            for part in (data.probe, data.val):
                for x in part.batches(ctx.batch_size):
                    net(x)
        ratios.append(_seconds(trial) / (time.perf_counter() - start))
        necessary.append(_seconds(trial) / _necessary_seconds(ctx, net, config, joint_seen))
    row["trial_over_forward_cold"] = round(statistics.median(ratios), 3) if ratios else None
    row["trial_over_necessary_cold"] = round(statistics.median(necessary), 3) if ratios else None
    row["cold_trials_timed"] = len(ratios)
    return row


def _necessary_seconds(ctx: Any, net: Any, config: Any, joint_seen: bool) -> float:
    """Seconds of the passes a cold two-model trial cannot avoid: its first model up to the cut
    over the probe (the least-squares fit's inputs), its second model up to the joint over the
    probe (the fit's targets) unless an earlier trial of the run read it, and the network over
    the validation split; each reads and transforms its images, as the trial does."""
    import torch

    first, last = config.fragments[0], config.fragments[-1]
    start = time.perf_counter()
    with torch.no_grad():
        prefixes = [(first.model, first.end)] + ([] if joint_seen else [(last.model, last.start)])
        for model, cut in prefixes:
            prefix = ctx.segment(model, None, cut)
            for x in ctx.input_batches(model, "probe"):
                prefix(x)
        for x in ctx.split("val").batches(ctx.batch_size):
            net(x)
    return time.perf_counter() - start


def _gpu_section(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """Trials per second at 224 px on one GPU, in float32 and under bfloat16 autocast, and how
    far bfloat16's accuracies are from float32's for the configs both runs completed."""
    import torch

    if not torch.cuda.is_available():
        return {"ran": False, "why": "no CUDA device on this machine"}
    size = int(args.sizes.split(",")[0])
    rows = {}
    for autocast in ("none", "bfloat16"):
        command = [sys.executable, __file__, "--one", "local", str(size), "--autocast", autocast]
        for flag in ("probe", "trials", "threads", "models", "folder"):
            command += [f"--{flag}", str(getattr(args, flag))]
        command += ["--device", "cuda", "--out", str(Path(args.out) / f"gpu_{autocast}")]
        output = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        rows[autocast] = json.loads(output.stdout.strip().splitlines()[-1])
    fp32, bf16 = rows["none"], rows["bfloat16"]
    common = set(fp32["accuracy"]) & set(bf16["accuracy"])
    return {
        "ran": True,
        "device": torch.cuda.get_device_name(0),
        "val_images": fp32["val_images"],
        "trials_per_second_float32": round(fp32["trials_per_hour"] / 3600, 3),
        "trials_per_second_bfloat16": round(bf16["trials_per_hour"] / 3600, 3),
        "bfloat16_speedup": round(bf16["trials_per_hour"] / fp32["trials_per_hour"], 2),
        "configs_compared": len(common),
        "max_accuracy_difference": max(
            (abs(fp32["accuracy"][c] - bf16["accuracy"][c]) for c in common), default=None
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,2500,5000")
    parser.add_argument("--probe", type=int, default=2000)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--executors", default="local,ray")
    parser.add_argument("--workers", default="1,2", help="Ray worker counts, one run each")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--folder", default=FOLDER)
    parser.add_argument("--out", default=str(ROOT / "runs" / "imagenet_scale"))
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--device", default="cpu", help="where the local runs go (cpu, auto)")
    parser.add_argument("--gpu", action="store_true", help="also run the GPU section")
    parser.add_argument("--append", action="store_true", help="keep the runs in --results")
    parser.add_argument("--cache-gb", type=float, default=None, help="host cache budget (GiB)")
    parser.add_argument(
        "--cache-dir", default=None, help="spill folders of the cache, one per run under it"
    )
    parser.add_argument("--rows", default=None, help="also keep the rows a stopped run printed")
    parser.add_argument("--rows-commit", default=None, help="the commit that printed --rows")
    parser.add_argument("--one", nargs=2, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--autocast", default="none", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        autocast = None if args.autocast == "none" else args.autocast
        print(json.dumps(run_one(args, args.one[0], int(args.one[1]), autocast)))
        return
    if Path(args.out).exists():
        raise SystemExit(f"{args.out} exists: choose another --out or move it away")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    jobs = [
        (executor, workers)
        for executor in args.executors.split(",")
        for workers in (args.workers.split(",") if executor == "ray" else ["1"])
    ]
    taken = [
        _spill_folder(args, e, w, v)
        for v in sizes
        for e, w in jobs
        if args.cache_dir is not None and _spill_folder(args, e, w, v).exists()
    ]
    if taken:  # before any run: a run must not read another's spill files
        raise SystemExit(f"{taken[0]} exists: choose another --cache-dir")
    if sizes:
        write_folder(Path(args.folder), args.probe + 100, 2 * max(sizes))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    runs: list[dict[str, Any]] = []
    if args.append and Path(args.results).exists():
        runs = json.loads(Path(args.results).read_text())["runs"]
    if args.rows:  # rows an earlier run printed before it was stopped
        lines = Path(args.rows).read_text().splitlines()
        rows = [json.loads(line) for line in lines if line.startswith('{"executor"')]
        marks = {"from_printed_rows": Path(args.rows).name, "commit": args.rows_commit}
        runs = _merge(runs, [{**r, **marks} for r in rows])
    for size in sizes:
        for executor, workers in jobs:
            command = [sys.executable, __file__, "--one", executor, str(size)]
            for flag in ("probe", "trials", "threads", "models", "folder", "device"):
                command += [f"--{flag}", str(getattr(args, flag))]
            if args.cache_gb is not None:
                command += ["--cache-gb", str(args.cache_gb)]
            if args.cache_dir is not None:  # a new folder per run: none reads another's files
                command += ["--cache-dir", str(_spill_folder(args, executor, workers, size))]
            command += ["--workers", workers, "--out", str(Path(args.out) / f"w{workers}")]
            seconds, memory, output = run_measured(
                command, env=env, stdout=subprocess.PIPE, text=True
            )
            row = json.loads(output.strip().splitlines()[-1])
            row.pop("accuracy")
            row = {**row, "wall_seconds": round(seconds, 1), **memory, "commit": commit()}
            runs = _merge(runs, [row])
            print(json.dumps(row), flush=True)
            _write(args, runs, {"ran": False, "why": "the runs have not finished"})
    record = _write(
        args,
        runs,
        _gpu_section(args, env) if args.gpu else {"ran": False, "why": "--gpu not given"},
    )
    print(json.dumps({k: v for k, v in record.items() if k != "runs"}, indent=1))


def _spill_folder(args: argparse.Namespace, executor: str, workers: str, size: int) -> Path:
    """The spill folder of one run under ``--cache-dir``."""
    return Path(args.cache_dir) / f"{executor}-w{workers}-{size}"


def _merge(runs: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``runs`` with ``new`` in place of any of the same executor, workers and size."""
    keys = {(r["executor"], r["workers"], r["val_images"]) for r in new}
    return [r for r in runs if (r["executor"], r["workers"], r["val_images"]) not in keys] + new


def _write(args: argparse.Namespace, runs: list[dict[str, Any]], gpu: dict) -> dict[str, Any]:
    """The record of ``runs`` and its summaries, written to ``--results`` (after every run, so
    a stopped run keeps what it measured)."""
    by = {(r["executor"], r["workers"], r["val_images"]): r for r in runs}
    local = [r for r in runs if r["executor"] == "local"]
    most = max((r["workers"] for r in runs if r["executor"] == "ray"), default=0)
    record: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "date": datetime.date.today().isoformat(),
        "commit": commit(),  # that wrote the file; each row names the one that measured it
        "classes": CLASSES,
        "models": args.models.split(","),
        "probe_images": args.probe,
        "trials_per_run": args.trials,
        "threads": args.threads,
        "runs": runs,
        "ray_2_over_1": {
            str(v): round(r["trials_per_hour"] / by[("ray", 1, v)]["trials_per_hour"], 2)
            for (e, w, v), r in sorted(by.items())
            if e == "ray" and w == 2 and ("ray", 1, v) in by
        },
        "ray_over_local": {
            str(v): round(r["trials_per_hour"] / by[("local", 1, v)]["trials_per_hour"], 2)
            for (e, w, v), r in sorted(by.items())
            if e == "ray" and w == most and ("local", 1, v) in by
        },
        # the largest process's peak at each size over that at the smallest, per executor
        "peak_rss_growth": {
            e if e == "local" else f"{e}_{w}": round(
                max(max(r["peak_rss_gb_per_process"]) for r in rows)
                / max(rows[0]["peak_rss_gb_per_process"]),
                3,
            )
            for e, w in sorted({(r["executor"], r["workers"]) for r in runs})
            if (
                rows := sorted(
                    (r for r in runs if (r["executor"], r["workers"]) == (e, w)),
                    key=lambda r: r["val_images"],
                )
            )
        },
        # the same for the command's own process (a Ray run's driver), where rows have it
        "root_peak_rss_growth": {
            e if e == "local" else f"{e}_{w}": round(
                rows[-1]["root_peak_rss_gb"] / rows[0]["root_peak_rss_gb"], 3
            )
            for e, w in sorted({(r["executor"], r["workers"]) for r in runs})
            if (
                rows := sorted(
                    (
                        r
                        for r in runs
                        if (r["executor"], r["workers"]) == (e, w) and r.get("root_peak_rss_gb")
                    ),
                    key=lambda r: r["val_images"],
                )
            )
            and len(rows) > 1
        },
        "trial_over_forward_cold_max": max(
            (r["trial_over_forward_cold"] for r in local if r.get("trial_over_forward_cold")),
            default=None,
        ),
        "gpu": gpu,
    }
    Path(args.results).write_text(json.dumps(record, indent=1) + "\n")
    return record


if __name__ == "__main__":
    main()
