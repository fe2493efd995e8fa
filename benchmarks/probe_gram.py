"""The probe's Gram of a wide map that outgrows the activation cache: forward passes and time.

    python benchmarks/probe_gram.py [--probe 400] [--cut layer1.1] [--cache-gb 0.1] [--repeats 2]

A timm ``resnet18`` (random weights, seeded; 224 px, 1,000 classes) reads ``--probe`` images of
the generated JPEG folder of ``benchmarks/imagenet_scale.py`` (``--folder``) through its own eval
transform. With a cache budget too small to keep its activation at ``--cut`` (64 x 56 x 56 at
``layer1.1``: 1.6 MB a row in float64, so a 32 MiB panel holds 20 rows), the CKA Gram of that cut
(per-position rows, as CKA compares two maps of the same grid) is computed in panels of rows.
Before, each panel read the activation again, and, outgrowing the cache, that ran the model up
to the cut again on every image; now the first pass writes its rows to a temporary file that
the later panels read (``stitch_nas.similarity.gram_of_batches``). Both run in this process,
taking turns ``--repeats`` times, each on a fresh context; recorded per run: seconds, how
many times the model's stem ran over the probe, and the largest difference between the two
Grams. Writes benchmarks/results/probe_gram.json.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import imagenet_scale  # noqa: E402  (the generated folder and zoo of the scale benchmark)

from stitch_nas.activations import ActivationCache, StitchContext  # noqa: E402
from stitch_nas.data import load_split_folders  # noqa: E402
from stitch_nas.similarity import _streamed_gram  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "probe_gram.json"


def _rereading(self: Any) -> Iterator[torch.Tensor]:
    """The code before: every panel reads the activation again."""
    for batch in self.read():
        yield _streamed_gram._rows(batch, "x", 1)


def _run(args: argparse.Namespace, data: Any, before: bool) -> tuple[dict[str, Any], torch.Tensor]:
    zoo = imagenet_scale._zoo(["resnet18"])
    cache = ActivationCache(memory_gb=args.cache_gb)
    ctx = StitchContext(zoo, data, cache=cache)
    passes = []
    stem = zoo["resnet18"].model.conv1
    stem.register_forward_hook(lambda module, inputs, output: passes.append(len(output)))
    cut = ctx.cut("resnet18", args.cut)
    mode, spatial = ctx.row_rule(cut, cut)
    saved = _streamed_gram._ReadOnce.__call__
    if before:
        _streamed_gram._ReadOnce.__call__ = _rereading  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        gram = ctx.probe_gram("resnet18", cut, mode, spatial)
        seconds = time.perf_counter() - start
    finally:
        _streamed_gram._ReadOnce.__call__ = saved  # type: ignore[method-assign]
    row = {
        "code": "before" if before else "after",
        "seconds": round(seconds, 1),
        "stem_passes_over_probe": round(sum(passes) / len(data.probe), 2),
        "row_width": int(ctx.rows(torch.zeros(1, *cut.shape), cut, mode, spatial).shape[1]),
    }
    return row, gram


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe", type=int, default=400)
    parser.add_argument("--cut", default="layer1.1")
    parser.add_argument("--cache-gb", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--folder", default="/tmp/stitch_nas_imagenet_scale")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(args.folder)
    imagenet_scale.write_folder(root, args.probe + 1, 2)
    data = load_split_folders(imagenet_scale.size_folder(root, 1), size=224, probe_size=args.probe)
    runs, grams = [], {}
    for _ in range(args.repeats):
        for before in (True, False):
            row, grams[before] = _run(args, data, before)
            runs.append(row)
            print(json.dumps(row), flush=True)
    gap = float((grams[True] - grams[False]).abs().max() / grams[True].abs().max())
    seconds = {c: [r["seconds"] for r in runs if r["code"] == c] for c in ("before", "after")}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True)
    result = {
        "command": "python benchmarks/probe_gram.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "date": datetime.date.today().isoformat(),
        "commit": commit.stdout.decode().strip(),
        "model": "resnet18 (random weights, 224 px)",
        "cut": args.cut,
        "probe_images": args.probe,
        "cache_gb": args.cache_gb,
        "panel_bytes": _streamed_gram.PANEL_BYTES,
        "runs": runs,
        "seconds_median": {c: statistics.median(v) for c, v in seconds.items()},
        "before_over_after": round(
            statistics.median(seconds["before"]) / statistics.median(seconds["after"]), 2
        ),
        "gram_relative_gap": gap,
    }
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
