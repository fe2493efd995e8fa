"""Peak memory of a compressed ``.npz`` data set: unpacked to disk and read in place, or whole.

    python benchmarks/npz_memory.py [--images 3000] [--side 224] [--folder /tmp/npz_memory]
                                    [--repeat 2]

Writes ``--images`` random float32 images in [0, 1] (``(N, 3, side, side)``; random, so they
barely compress) with ``numpy.savez_compressed`` once into ``--folder``, then, each in a fresh
process (so each peak RSS is its own), loads four splits of it with ``load_npz_splits`` and
reads every split once, batch by batch:

- ``unpacked``: the library's way for an array over ``UNPACK_BYTES`` (512 MiB): unpacked into
  an empty ``$STITCH_NAS_CACHE`` first, then read in place;
- ``reused``: the same, with the unpacked copy of an earlier run already there;
- ``whole``: ``UNPACK_BYTES`` raised above the array, so it is decompressed into memory whole,
  as every compressed array was before.

Per run: peak RSS, the seconds to load (unpacking included) and to read every image once, and
the disk the copy takes. With ``--repeat R`` the three runs go in turn R times. Writes
benchmarks/results/npz_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results" / "npz_memory.json"
MODES = ("unpacked", "reused", "whole")


def _write(file: Path, images: int, side: int) -> None:
    rng = np.random.default_rng(0)
    x = np.empty((images, 3, side, side), dtype=np.float32)
    for start in range(0, images, 256):  # random floats, written in place a block at a time
        block = x[start : start + 256]
        block[...] = rng.random(block.shape, dtype=np.float32)
    np.savez_compressed(file, x=x, y=np.arange(images) % 10)


def run_one(file: Path, mode: str, cache: Path) -> dict:
    os.environ["STITCH_NAS_CACHE"] = str(cache)
    from stitch_nas.data import _arrays, load_npz_splits

    if mode == "whole":
        _arrays.UNPACK_BYTES = 2**62  # type: ignore[attr-defined]
    count = len(np.load(file)["y"])
    quarter = count // 4
    splits = {
        name: {"file": str(file), "start": i * quarter, "count": quarter}
        for i, name in enumerate(("train", "probe", "val", "test"))
    }
    start = time.perf_counter()
    data = load_npz_splits(splits, seed=0)
    loaded = time.perf_counter() - start
    start, seen = time.perf_counter(), 0
    for split in data.splits().values():
        for batch in split.batches(64):
            seen += len(batch)
    read = time.perf_counter() - start
    disk = sum(p.stat().st_size for p in cache.rglob("*.npy")) if cache.exists() else 0
    return {
        "mode": mode,
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
        "load_seconds": round(loaded, 2),
        "read_seconds": round(read, 2),
        "images_read": seen,
        "unpacked_gb_on_disk": round(disk / 2**30, 3),
        "images_type": type(data.val.x).__name__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--side", type=int, default=224)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/npz_memory"))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    file, cache = args.folder / f"images_{args.images}_{args.side}.npz", args.folder / "cache"
    if args.one:
        print(json.dumps(run_one(file, args.one, cache)))
        return
    args.folder.mkdir(parents=True, exist_ok=True)
    if not file.exists():
        start = time.perf_counter()
        _write(file, args.images, args.side)
        print(f"wrote {file} in {time.perf_counter() - start:.0f} s", flush=True)
    runs = []
    for _ in range(args.repeat):
        for mode in MODES:
            if mode == "unpacked":
                shutil.rmtree(cache, ignore_errors=True)
            command = [sys.executable, __file__, "--one", mode, "--folder", str(args.folder)]
            command += ["--images", str(args.images), "--side", str(args.side)]
            out = subprocess.run(command, capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]), flush=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                "commit": commit,
                "images": args.images,
                "side": args.side,
                "uncompressed_gb": round(args.images * 3 * args.side**2 * 4 / 2**30, 3),
                "file_gb": round(file.stat().st_size / 2**30, 3),
                "repeats": args.repeat,
                "runs": runs,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
