"""The real zoo's search on Ray workers against the same search in one process: memory and values.

    python benchmarks/ray_realzoo.py [--settings examples/realzoo.yaml] [--workers 2]
                                     [--trials N] [--out runs/ray_realzoo] [--set K=V ...]

Runs ``stitch-nas search SETTINGS`` twice as a user would, each in its own process and a fresh
folder: once with the local executor, once with ``--executor ray --workers N`` (a local Ray on
this machine, each worker one CPU). While each runs, every process it starts is watched
(:mod:`process_tree`: each process's own peak resident set, and the growth of ``/dev/shm``,
where Ray keeps its object store). Afterwards the two studies are compared config by config:
every config both runs completed must have the same recorded values (accuracy and MACs).

Writes benchmarks/results/ray_realzoo.json:
``{"val_images", "local": {"peak_rss_gb", "wall_seconds"}, "ray": {"workers",
"peak_rss_gb_per_process", "object_store_peak_gb", "wall_seconds"}, "same_values",
"configs_compared"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import optuna
from process_tree import run_measured
from realzoo import overrides_from, settings_copy

from stitch_nas import attrs
from stitch_nas.search import load_folder_study

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "ray_realzoo.json"


def _values(study: optuna.Study) -> dict[str, list[float]]:
    """Each completed trial's config (JSON) -> its values."""
    return {
        json.dumps(t.user_attrs[attrs.CONFIG], sort_keys=True): list(t.values)
        for t in study.trials
        if t.state == optuna.trial.TrialState.COMPLETE and attrs.CONFIG in t.user_attrs
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default=str(ROOT / "examples" / "realzoo.yaml"))
    parser.add_argument("--out", default=str(ROOT / "runs" / "ray_realzoo"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--trials", type=int, default=0, help="0: the settings file's number")
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args()
    out = Path(args.out)
    if out.exists():
        raise SystemExit(f"{out} exists: choose another --out or move it away")
    overrides = overrides_from(args.set)
    copy = settings_copy(args.settings, None, False, overrides) if overrides else None
    settings = str(copy or args.settings)
    base = [str(Path(sys.executable).with_name("stitch-nas")), "search", settings]
    base += ["--no-progress"] + (["--trials", str(args.trials)] if args.trials else [])
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    runs: dict[str, Any] = {}
    try:
        for name, extra in (
            ("local", []),
            ("ray", ["--executor", "ray", "--workers", str(args.workers)]),
        ):
            command = [*base, "--out", str(out / name), *extra]
            print("$ stitch-nas", " ".join(command[1:]), flush=True)
            seconds, memory, _ = run_measured(command, env=env)
            runs[name] = {"wall_seconds": round(seconds, 1), **memory}
            print(name, json.dumps(runs[name]), flush=True)
    finally:
        if copy is not None:
            copy.unlink()
    local_study = load_folder_study(out / "local")
    local, ray = _values(local_study), _values(load_folder_study(out / "ray"))
    common = sorted(set(local) & set(ray))
    differing = [c for c in common if local[c] != ray[c]]
    record = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "command": f"stitch-nas search {Path(args.settings).name} --no-progress "
        f"[--executor ray --workers {args.workers}]",
        "overrides": overrides,
        "trials": len(local_study.trials),
        # the validation images the search measured on, as its study recorded
        "val_images": int(local_study.user_attrs[attrs.SPLIT_SIZES]["val"]),
        "local": {
            "peak_rss_gb": runs["local"]["peak_rss_gb_per_process"][0],
            **runs["local"],
        },
        "ray": {"workers": args.workers, **runs["ray"]},
        "configs_compared": len(common),
        "configs_differing": len(differing),
        "same_values": bool(common) and not differing,
    }
    local_peak = record["local"]["peak_rss_gb"]
    record["ray"]["max_process_over_local_peak"] = round(
        max(runs["ray"]["peak_rss_gb_per_process"]) / local_peak, 3
    )
    Path(args.results).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
