"""Forward passes with and without freed memory reused (``machine.reuse_freed_memory``).

    python benchmarks/allocator.py [--settings examples/realzoo.yaml] [--images 2560]
                                   [--repeat 3]

Every zoo model of the settings runs over the first ``images`` validation images as a search
runs it (cut by cut, each cut rounded to the cache's dtype, at the context's batch size and
memory layout; ``_stream.cut_by_cut``), in a fresh process per mode and repeat, since the
allocator's setting holds for a whole process; the two modes alternate. Reported per model:
the seconds of each mode (median and range over the repeats), default over reused as
``speedup``, and whether both modes computed the same outputs, bit for bit (a digest of them).

Writes benchmarks/results/allocator.json (``--results`` elsewhere).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "allocator.json"
MODES = ("default", "reused")


def _child(settings: str, images: int, mode: str) -> None:
    """One process, one mode: every model's seconds and output digest as JSON on stdout."""
    from stitch_nas.machine import reuse_freed_memory

    if mode == "reused" and not reuse_freed_memory():
        raise SystemExit("this C library has no mallopt: nothing to compare")
    import torch

    from stitch_nas.activations import StitchContext, _stream
    from stitch_nas.pipeline import load_data, load_zoo
    from stitch_nas.settings import load_settings

    loaded = load_settings(settings)
    data = load_data(loaded.data)
    ctx = StitchContext(load_zoo(loaded.zoo, data), data, device="cpu")
    rows: dict[str, Any] = {}
    for name in ctx.zoo.names():
        batches = list(ctx.input_rows(name, "val", torch.arange(images)))
        forward = _stream.cut_by_cut(ctx, name, None, None)
        digest = hashlib.sha256()
        start = time.perf_counter()
        with ctx.frozen():
            outputs = [forward(batch) for batch in batches]
        seconds = time.perf_counter() - start
        for out in outputs:
            digest.update(out.float().contiguous().numpy().tobytes())
        rows[name] = {"seconds": seconds, "digest": digest.hexdigest()[:16]}
    print(json.dumps(rows))


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default=str(ROOT / "examples" / "realzoo.yaml"))
    parser.add_argument("--images", type=int, default=2560)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.settings, args.images, args.child)
        return
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for i in range(args.repeat):
        for mode in MODES:
            command = [sys.executable, __file__, "--settings", args.settings]
            command += ["--images", str(args.images), "--child", mode]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"repeat {i} {mode}: done", flush=True)
    models = {}
    for name in runs["default"][0]:
        seconds = {mode: [run[name]["seconds"] for run in runs[mode]] for mode in MODES}
        digests = {run[name]["digest"] for mode in MODES for run in runs[mode]}
        models[name] = {
            "seconds": {mode: _spread(seconds[mode]) for mode in MODES},
            "speedup": round(
                statistics.median(seconds["default"]) / statistics.median(seconds["reused"]), 2
            ),
            "same_outputs": len(digests) == 1,
        }
        print(f"{name}: {models[name]}", flush=True)
    record = {
        "command": f"python benchmarks/allocator.py --images {args.images} --repeat {args.repeat}",
        "settings": Path(args.settings).name,
        "images": args.images,
        "repeats": args.repeat,
        "models": models,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
    }
    Path(args.results).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
