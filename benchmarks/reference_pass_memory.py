"""Peak memory of one zoo model's reference pass as the validation split grows, with freed
memory given back where the library gives it back and at a much lower mark.

    python benchmarks/reference_pass_memory.py [--sizes 1000,5000] [--model mobilenetv3_small_100]
                                               [--low-mib 64] [--folder DIR]

A Ray driver measures each zoo model on the validation split before the first trial
(``measure_references``) and runs no trial itself; in ``imagenet_scale.json`` its peak grew
with the split. This asks whether that growth is heap memory the pass freed and kept (the
library gives it back to the system only once more than ``RELEASED_ABOVE`` of it is free) or
something the pass holds per image: one timm model (random weights, 1,000 classes) measured on
``imagenet_scale.py``'s generated JPEG folder, each (size, mark) in a fresh process (its peak
resident set, ``stitch_nas.machine.peak_rss_bytes``), at the library's mark and at
``--low-mib``. If the growth is freed memory, the low mark's peaks agree across sizes. Writes
benchmarks/results/reference_pass_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import imagenet_scale
from provenance import commit

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "reference_pass_memory.json"


def one(folder: str, size: int, probe: int, model: str, keep: int | None) -> dict[str, float]:
    """The reference pass in this process: its peak resident set before and after, in GB."""
    import torch

    from stitch_nas import machine
    from stitch_nas.activations import StitchContext
    from stitch_nas.data import load_split_folders
    from stitch_nas.search._loop import measure_references

    if keep is not None:  # the passes release above the module's mark
        machine.RELEASED_ABOVE = keep
    machine.reuse_freed_memory()  # as the command line sets up its process
    torch.set_num_threads(1)
    view = imagenet_scale.size_folder(Path(folder), size)
    data = load_split_folders(view, size=224, probe_size=probe)
    ctx = StitchContext(imagenet_scale.timm_zoo([model]), data, device="cpu")
    before = machine.peak_rss_bytes()
    measure_references(ctx)
    after = machine.peak_rss_bytes()
    return {
        "peak_rss_gb_before_pass": round(before / 2**30, 3),
        "peak_rss_gb": round(after / 2**30, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,5000")
    parser.add_argument("--model", default="mobilenetv3_small_100")
    parser.add_argument("--probe", type=int, default=2000, help="read as a search reads it")
    parser.add_argument("--low-mib", type=int, default=64)
    parser.add_argument("--folder", default=imagenet_scale.FOLDER)
    parser.add_argument("--one", nargs=2, type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # size, mark in bytes (0: the library's)
        print(
            json.dumps(one(args.folder, args.one[0], args.probe, args.model, args.one[1] or None))
        )
        return
    from stitch_nas.machine import RELEASED_ABOVE

    sizes = [int(s) for s in args.sizes.split(",")]
    imagenet_scale.write_folder(Path(args.folder), args.probe + 100, 2 * max(sizes))  # as it does
    rows = []
    for mark, keep in (("library", 0), ("low", args.low_mib * 2**20)):
        for size in sizes:
            command = [sys.executable, __file__, "--one", str(size), str(keep)]
            command += ["--model", args.model, "--folder", args.folder, "--probe", str(args.probe)]
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            row = {
                "val_images": size,
                "release": mark,
                "released_above_bytes": keep or RELEASED_ABOVE,
            }
            rows.append(row | json.loads(out.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    peak = {(r["release"], r["val_images"]): r["peak_rss_gb"] for r in rows}
    growth = {m: round(peak[m, max(sizes)] - peak[m, min(sizes)], 3) for m in ("library", "low")}
    RESULTS.write_text(
        json.dumps(
            {
                "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                "commit": commit(),
                "command": "reference_pass_memory.py " + " ".join(sys.argv[1:]),
                "model": args.model,
                "probe_images": args.probe,
                "runs": rows,
                "peak_growth_gb": growth,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
