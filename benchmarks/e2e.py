"""A whole search end to end, phase by phase, repeated: where a user's wait goes.

    python benchmarks/e2e.py [--settings examples/realzoo.yaml] [--repeat 3] [--out runs/e2e]
                             [--trials N] [--set SECTION.KEY=VALUE ...]
    python benchmarks/e2e.py --export-from OUT/repeat0 [--repeat 3]
    python benchmarks/e2e.py --necessary-from OUT/repeat0

Runs ``stitch-nas search SETTINGS --out OUT/repeat<i>`` as a user would (its own process, a
fresh folder each time, so each repeat builds its own activation cache; the zoo's weights and
data files are read from wherever the settings point), then reads the phases the search kept
on its study (``attrs.PHASES``: zoo and data, seeding, trials, refining, fine-tune when on, test
pass, report, export), each with its wall seconds and the process's peak resident memory by its
end. Reported per phase: median and range over the repeats; the whole run's wall time (process
start to exit, imports included) likewise; and whether every repeat ran the same trials to the
same values and the same front (it must: the search is seeded).

``--export-from DIR`` times ``stitch-nas export`` of a finished search instead, as a user runs it
after the search (a new process: read the study, rebuild the zoo and data from its settings,
rebuild each front network from its kept adapters, check it on a fixed sample, write it and
the elastic package), on ``--repeat`` copies of ``DIR`` without its ``models/``, and adds the
seconds per network written to the results file as ``export_command``.

After the repeats, each phase's *necessary work* (the forward passes and training steps it
cannot avoid, counted from the first repeat's study and timed as plain forwards on this
machine; ``necessary_work.py`` says what counts) goes beside it as ``necessary_work``, with the
phase's median seconds over it as ``ratio``, and the search's median over all of it as
``end_to_end``; ``--necessary-from DIR`` adds it for a finished search to an existing results
file.

Writes benchmarks/results/e2e.json (``--results`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from necessary_work import necessary_work
from provenance import commit
from realzoo import overrides_from, settings_copy

from stitch_nas import attrs
from stitch_nas.search import load_folder_study

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "e2e.json"


def _search(settings: str, out: Path, trials: int) -> float:
    """One ``stitch-nas search`` in its own process; returns its wall seconds."""
    command = [str(Path(sys.executable).with_name("stitch-nas")), "search", settings]
    command += ["--out", str(out), "--no-progress"]
    if trials:
        command += ["--trials", str(trials)]
    print("$ stitch-nas", " ".join(command[1:]), flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - start


def _fingerprint(out: Path) -> dict[str, Any]:
    """What must not change between repeats: every trial's state and values, and the front."""
    study = load_folder_study(out)
    trials = [(t.number, t.state.name, t.values) for t in study.trials]
    front = json.loads((out / "pareto.json").read_text())["front"]
    return {"trials": trials, "front": [(r["number"], r.get("test_accuracy")) for r in front]}


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default=str(ROOT / "examples" / "realzoo.yaml"))
    parser.add_argument("--out", default=str(ROOT / "runs" / "e2e"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--trials", type=int, default=0, help="0: the settings file's number")
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="change one setting of the copy that runs, e.g. finetune.enabled=true",
    )
    parser.add_argument("--export-from", default=None, help="time stitch-nas export of DIR")
    parser.add_argument(
        "--necessary-from", default=None, help="add DIR's necessary work to --results"
    )
    args = parser.parse_args()
    if args.export_from:
        _time_export(Path(args.export_from), args.repeat, Path(args.results))
        return
    if args.necessary_from:
        record = json.loads(Path(args.results).read_text())
        record["necessary_work"] = necessary_work(
            Path(args.necessary_from), record["phases"], record["wall_seconds"]["median"]
        )
        # counted later than the runs, maybe by a newer yardstick: say when and by which code
        record["necessary_work"]["counted"] = {"date": _today(), "commit": commit()}
        Path(args.results).write_text(json.dumps(record, indent=1) + "\n")
        print(json.dumps(record["necessary_work"], indent=1))
        return
    overrides = overrides_from(args.set)
    out = Path(args.out)
    taken = [out / f"repeat{i}" for i in range(args.repeat) if (out / f"repeat{i}").exists()]
    if taken:
        raise SystemExit(f"{taken[0]} exists: choose another --out or move it away")
    settings = args.settings
    copy = settings_copy(settings, None, False, overrides) if overrides else None
    repeats: list[dict[str, Any]] = []
    try:
        for i in range(args.repeat):
            folder = out / f"repeat{i}"
            seconds = _search(str(copy or settings), folder, args.trials)
            phases = load_folder_study(folder).user_attrs[attrs.PHASES]
            repeats.append({"wall_seconds": round(seconds, 1), "phases": phases})
            spent = ", ".join(f"{name} {row['seconds']:.1f} s" for name, row in phases.items())
            print(f"repeat {i}: {seconds:.1f} s; {spent}", flush=True)
            # after each repeat, so a run cut short keeps what it measured
            record = _record(
                settings, overrides, [out / f"repeat{j}" for j in range(i + 1)], repeats
            )
            Path(args.results).write_text(json.dumps(record, indent=1) + "\n")
    finally:
        if copy is not None:
            copy.unlink()
    record["necessary_work"] = necessary_work(
        out / "repeat0", record["phases"], record["wall_seconds"]["median"]
    )
    Path(args.results).write_text(json.dumps(record, indent=1) + "\n")
    print(
        json.dumps({k: record[k] for k in ("wall_seconds", "phases", "necessary_work")}, indent=1)
    )


def _time_export(search: Path, repeats: int, results: Path) -> None:
    """``stitch-nas export`` of the search in ``search``, ``repeats`` times, each on a copy of
    the folder without its exported networks; the seconds go into ``results``."""
    runs = []
    for i in range(repeats):
        copy = search.with_name(f"{search.name}.export{i}")
        if copy.exists():
            raise SystemExit(f"{copy} exists: move it away")
        shutil.copytree(search, copy, ignore=shutil.ignore_patterns("models"))
        command = [str(Path(sys.executable).with_name("stitch-nas")), "export", str(copy)]
        command += ["--elastic", "--no-progress"]
        print("$ stitch-nas", " ".join(command[1:]), flush=True)
        start = time.perf_counter()
        subprocess.run(command, check=True)
        seconds = time.perf_counter() - start
        networks = len(list((copy / "models").glob("trial_*")))
        runs.append({"seconds": round(seconds, 1), "networks": networks})
        print(f"export {i}: {networks} networks in {seconds:.1f} s", flush=True)
    record = json.loads(results.read_text()) if results.exists() else {}
    per_network = [r["seconds"] / r["networks"] for r in runs]
    record["export_command"] = {
        "command": "stitch-nas export DIR --elastic --no-progress",
        "networks": runs[0]["networks"],
        "seconds": _spread([r["seconds"] for r in runs]),
        "seconds_per_network": _spread(per_network),
        "each_repeat": runs,
    }
    results.write_text(json.dumps(record, indent=1) + "\n")


def _record(
    settings: str, overrides: dict[str, Any], folders: list[Path], repeats: list[dict[str, Any]]
) -> dict[str, Any]:
    prints = [_fingerprint(folder) for folder in folders]
    names = list(repeats[0]["phases"])
    return {
        "command": f"stitch-nas search {Path(settings).name} --out OUT --no-progress",
        "overrides": overrides,
        "repeats": len(repeats),
        "wall_seconds": _spread([r["wall_seconds"] for r in repeats]),
        "phases": {
            name: {
                "seconds": _spread([r["phases"][name]["seconds"] for r in repeats]),
                "peak_rss_gb": max(r["phases"][name]["peak_rss_gb"] for r in repeats),
            }
            for name in names
        },
        "identical_trials_and_front": all(p == prints[0] for p in prints),
        "trials": len(prints[0]["trials"]),
        "front_networks": len(prints[0]["front"]),
        "each_repeat": repeats,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "date": _today(),
        "commit": commit(),
    }


def _today() -> str:
    return time.strftime("%Y-%m-%d", time.gmtime())


if __name__ == "__main__":
    main()
