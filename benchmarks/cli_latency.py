"""How fast the command line answers when it has no model to load: whole-process wall time.

    python benchmarks/cli_latency.py [--repeats 5]

Runs each command as a new process (what a user waits for, interpreter start included) and
records the median and the spread of ``--repeats`` runs: ``stitch-nas --help``, ``--version``,
and ``search`` on a YAML file with an unknown key, a bad value, a missing zoo checkpoint, and a
misspelt search space, space option, adapter or head (all refused before torch is imported; the
plug-in names are checked against the built-ins' torch-free declarations). Writes
benchmarks/results/cli_latency.json. Targets: ``--help`` under 1 s and a bad YAML file refused
under 1.5 s on an idle 2-core machine.
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
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "cli_latency.json"

BAD_YAML = {
    "unknown_key": "zoo:\n  mini_zoo: true\n  colour: red\n",
    "bad_value": "search:\n  trials: many\n",
    "missing_checkpoint": (
        "zoo:\n  mini_zoo: false\n  models:\n    - name: mine\n      source: timm\n"
        "      architecture: resnet18\n      checkpoint: /nonexistent/weights.safetensors\n"
    ),
    "unknown_space": "search:\n  space: nowhere\n",
    "unknown_space_option": "search:\n  space_options: {max_fragmentz: 3}\n",
    "unknown_adapter": "search:\n  space_options: {adapters: [lstsq, wobble]}\n",
    "unknown_head": "search:\n  space: stitchnet\n  space_options: {head: oracle}\n",
}


def _command() -> list[str]:
    exe = shutil.which("stitch-nas")
    return [exe] if exe else [sys.executable, "-m", "stitch_nas.cli._main"]


def _time(args: list[str], repeats: int, expect_code: int) -> dict[str, float | int | str]:
    times, last = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        last = subprocess.run(_command() + args, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
    assert last is not None
    if last.returncode != expect_code:
        raise SystemExit(f"{args}: exit {last.returncode}, expected {expect_code}: {last.stderr}")
    return {
        "median_s": round(statistics.median(times), 4),
        "min_s": round(min(times), 4),
        "max_s": round(max(times), 4),
        "exit_code": last.returncode,
        "stderr": last.stderr.strip().splitlines()[-1] if last.stderr.strip() else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, dict] = {}
    results["--help"] = _time(["--help"], args.repeats, 0)
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in BAD_YAML.items():
            path = Path(tmp) / f"{name}.yaml"
            path.write_text(text)
            out = Path(tmp) / f"out_{name}"
            results[f"bad_yaml:{name}"] = _time(
                ["search", str(path), "--out", str(out)], args.repeats, 2
            )
            if out.exists():
                raise SystemExit(f"a refused run left {out} behind")
    load = os.getloadavg()[0]
    record = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_1min": round(load, 2),
        },
        "repeats": args.repeats,
        "results": results,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(record, indent=2) + "\n")
    for name, r in results.items():
        print(
            f"{name:32s} median {r['median_s']:.3f} s  (min {r['min_s']:.3f}, max {r['max_s']:.3f})"
        )
    print(f"load average during the run: {load:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
