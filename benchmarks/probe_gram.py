"""The probe's Gram of a wide map that outgrows the activation cache: this code's against an
earlier commit's, in seconds and forward passes.

    python benchmarks/probe_gram.py [--probes 400,2000] [--cut layer1.1] [--cache-gb 0.1]
                                    [--repeats 2] [--before 9da7180]

A timm ``resnet18`` (random weights, seeded; 224 px, 1,000 classes) reads a probe of each size
in ``--probes`` from the generated JPEG folder of ``benchmarks/imagenet_scale.py``
(``--folder``) through its own eval transform. With a cache budget too small to keep its
activation at ``--cut`` (64 x 56 x 56 at ``layer1.1``), the CKA Gram of that cut (per-position
rows, as CKA compares two maps of the same grid) is made by ``gram_of_batches`` as this working
tree has it ("after") and as commit ``--before`` had it ("before"; its
``stitch_nas/similarity/_streamed_gram.py``, read with ``git show``). At 9da7180 it multiplied
panels of rows (20 rows of that map in 32 MiB of float64), reading every later row again for
each panel from a file the first pass wrote; this code writes the rows by blocks of features and
multiplies each block once. The two take turns ``--repeats`` times, each on a fresh context;
recorded per run: seconds, how many times the model's stem ran over the probe, and the largest
difference between the two Grams. Writes benchmarks/results/probe_gram.json.
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
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import imagenet_scale  # noqa: E402  (the generated folder and zoo of the scale benchmark)

from stitch_nas import similarity  # noqa: E402
from stitch_nas.activations import ActivationCache, StitchContext  # noqa: E402
from stitch_nas.data import load_split_folders  # noqa: E402
from stitch_nas.similarity import _streamed_gram  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "probe_gram.json"


def _gram_at(commit: str) -> Callable[..., torch.Tensor]:
    """``gram_of_batches`` as ``commit`` had it."""
    path = f"{commit}:stitch_nas/similarity/_streamed_gram.py"
    source = subprocess.run(["git", "show", path], cwd=ROOT, capture_output=True, check=True)
    module = types.ModuleType("stitch_nas.similarity._streamed_gram_before")
    module.__package__ = "stitch_nas.similarity"  # its relative imports read this tree's _cka
    exec(compile(source.stdout.decode(), path, "exec"), module.__dict__)  # noqa: S102
    gram_of_batches = module.gram_of_batches

    def called_as_now(read: Any, n: int, **values: Any) -> torch.Tensor:
        return gram_of_batches(read, n)  # type: ignore[no-any-return]  # it kept rows as read

    return called_as_now


def _run(
    args: argparse.Namespace, data: Any, before: Callable[..., torch.Tensor] | None
) -> tuple[dict[str, Any], torch.Tensor]:
    zoo = imagenet_scale._zoo(["resnet18"])
    cache = ActivationCache(memory_gb=args.cache_gb)
    ctx = StitchContext(zoo, data, cache=cache)
    passes = []
    stem = zoo["resnet18"].model.conv1
    stem.register_forward_hook(lambda module, inputs, output: passes.append(len(output)))
    cut = ctx.cut("resnet18", args.cut)
    mode, spatial = ctx.row_rule(cut, cut)
    if before is not None:
        similarity.gram_of_batches = before  # what the context calls
    try:
        start = time.perf_counter()
        gram = ctx.probe_gram("resnet18", cut, mode, spatial)
        seconds = time.perf_counter() - start
    finally:
        similarity.gram_of_batches = _streamed_gram.gram_of_batches
    row = {
        "code": "after" if before is None else "before",
        "probe_images": len(data.probe),
        "seconds": round(seconds, 1),
        "stem_passes_over_probe": round(sum(passes) / len(data.probe), 2),
        "row_width": int(ctx.rows(torch.zeros(1, *cut.shape), cut, mode, spatial).shape[1]),
    }
    return row, gram


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", default="400,2000")
    parser.add_argument("--cut", default="layer1.1")
    parser.add_argument("--cache-gb", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--before", default="9da7180")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--folder", default=imagenet_scale.FOLDER)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    root, before = Path(args.folder), _gram_at(args.before)
    probes = [int(p) for p in args.probes.split(",")]
    imagenet_scale.write_folder(root, max(probes) + 1, 2)
    runs, sizes = [], []
    for probe in probes:
        data = load_split_folders(imagenet_scale.size_folder(root, 1), size=224, probe_size=probe)
        grams = {}
        for _ in range(args.repeats):
            for code in (before, None):
                row, grams[code is None] = _run(args, data, code)
                runs.append(row)
                print(json.dumps(row), flush=True)
        seconds = {
            c: [r["seconds"] for r in runs if r["code"] == c and r["probe_images"] == probe]
            for c in ("before", "after")
        }
        sizes.append(
            {
                "probe_images": probe,
                "seconds_median": {c: statistics.median(v) for c, v in seconds.items()},
                "seconds_range": {c: [min(v), max(v)] for c, v in seconds.items()},
                "before_over_after": round(
                    statistics.median(seconds["before"]) / statistics.median(seconds["after"]), 2
                ),
                "gram_relative_gap": float(
                    (grams[False] - grams[True]).abs().max() / grams[False].abs().max()
                ),
            }
        )
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True)
    result = {
        "command": "python benchmarks/probe_gram.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "date": datetime.date.today().isoformat(),
        "commit": commit.stdout.decode().strip(),
        "before_commit": args.before,
        "model": "resnet18 (random weights, 224 px)",
        "cut": args.cut,
        "cache_gb": args.cache_gb,
        "sizes": sizes,
        "runs": runs,
    }
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(sizes, indent=1))


if __name__ == "__main__":
    main()
