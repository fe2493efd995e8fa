"""The README's first figure: how long ``stitch-nas demo`` takes, and its peak memory.

    python benchmarks/demo.py [--repeat 3] [--command PATH/stitch-nas]

Runs ``stitch-nas demo -q --out DIR`` ``--repeat`` times into fresh folders, as a user who has
run it once before would (the mini zoo cached in ``STITCH_NAS_CACHE``; a first run that trains
it is made beforehand and not counted), each as a new process: wall seconds (interpreter start,
importing torch, the search, the report and the export) and the process's peak resident memory
(:mod:`process_tree`). Then one more run without ``-q`` (``--out demo_out``), whose printout
is kept whole (Getting started shows it), its phases (``phases: zoo and data 4.6 s, ...``)
as numbers, and the trial whose folder it offers to load (the README loads it). Run it in the
venv a new user has (the README's first command: no extras); ``extras_importable`` records
what that venv could import.
Writes ``benchmarks/results/demo.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from process_tree import run_measured

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "demo.json"
PHASE = re.compile(r"([a-z ]+?) ([0-9.]+) s")


def phases(printed: str) -> dict[str, float]:
    """``{"zoo and data": 4.6, ..., "in all": 14.0}`` from the demo's ``phases:`` line."""
    line = next(line for line in printed.splitlines() if line.startswith("phases: "))
    steps, _, total = line[len("phases: ") :].partition(";")
    out = {name.strip(): float(s) for name, s in PHASE.findall(steps)}
    out["in all"] = float(re.search(r"([0-9.]+) s in all", total)[1])  # type: ignore[index]
    out["peak_memory_gb"] = float(re.search(r"peak memory ([0-9.]+) GB", total)[1])  # type: ignore[index]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--command", default=str(Path(sys.executable).parent / "stitch-nas"))
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="stitch_nas_demo_"))
    try:
        subprocess.run([args.command, "demo", "-q", "--out", str(work / "warm")], check=True)
        runs = []
        for i in range(args.repeat):
            command = [args.command, "demo", "-q", "--out", str(work / f"run{i}")]
            seconds, memory, _ = run_measured(command)
            runs.append(
                {
                    "wall_seconds": round(seconds, 2),
                    "peak_rss_gb": max(memory["peak_rss_gb_per_process"]),
                }
            )
            print(json.dumps(runs[-1]), flush=True)
        printed = subprocess.run(  # in a folder of its own, under the README's name
            [args.command, "demo", "--no-progress", "--out", "demo_out"],
            check=True,
            capture_output=True,
            text=True,
            cwd=work,
        ).stdout
    finally:
        shutil.rmtree(work, ignore_errors=True)
    walls = [r["wall_seconds"] for r in runs]
    python = str(Path(args.command).parent / "python")
    record = {
        "command": "stitch-nas demo -q --out DIR (mini zoo cached)",
        "repeats": args.repeat,
        "wall_seconds": {"median": statistics.median(walls), "min": min(walls), "max": max(walls)},
        "peak_rss_gb": {
            "median": statistics.median(r["peak_rss_gb"] for r in runs),
            "max": max(r["peak_rss_gb"] for r in runs),
        },
        "runs": runs,
        "printed_phases_seconds": phases(printed),
        "printout": printed.rstrip("\n"),
        # the folder the demo offers to load: the README and the export guide load it
        "first_exported_trial": int(
            re.search(r"stitch_nas\.load\('demo_out/models/trial_(\d+)'\)", printed)[1]  # type: ignore[index]
        ),
        "extras_importable": {
            name: subprocess.run([python, "-c", f"import {name}"], capture_output=True).returncode
            == 0
            for name in ("ray", "onnxruntime", "psycopg", "optuna_dashboard")
        },
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "date": datetime.date.today().isoformat(),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),
    }
    Path(args.results).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
