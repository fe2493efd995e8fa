"""How much bfloat16 autocast of frozen passes moves predictions and accuracies, and its speed.

    python benchmarks/autocast.py [--val 2000] [--pairs 8] [--device cpu]

Measures every zoo model alone and ``--pairs`` random two-model least-squares stitches twice:
in float32 and under ``autocast="bfloat16"``, with float32 activation storage in both so that
only the autocast differs. Reported per network: accuracy both ways, the share of images whose
top-1 prediction agrees, and the seconds of each measurement (its activations computed cold).
On the digits mini zoo and, when ``../shared/realzoo`` is present, on its nine real CIFAR-10
models (probe: 256 of its training images; the first ``--val`` test images are measured). Run
it on a GPU with ``--device cuda``. Writes benchmarks/results/autocast[_DEVICE].json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from storage_dtype import REALZOO, _pairs, realzoo  # the same zoo, data and stitches

from stitch_nas.activations import ActivationCache, StitchContext
from stitch_nas.config import StitchConfig
from stitch_nas.data import DataSplits, load_digits_splits
from stitch_nas.stitching import measure
from stitch_nas.stitching._measure import output_batches
from stitch_nas.zoo import Zoo, load_mini_zoo

RESULTS = Path(__file__).parent / "results"


def _predictions(ctx: StitchContext, config: StitchConfig) -> tuple[torch.Tensor, float, float]:
    sync = torch.cuda.synchronize if ctx.device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    net, result = measure(ctx, config)
    sync()
    seconds = time.perf_counter() - start
    predictions = torch.cat([o.argmax(1).cpu() for o in output_batches(ctx, net, "val")])
    return predictions, result.accuracy, seconds


def compare(zoo: Zoo, data: DataSplits, pairs: int, device: str) -> dict:
    contexts = {
        name: StitchContext(
            zoo, data, device=device, cache=ActivationCache(dtype="float32"), autocast=autocast
        )
        for name, autocast in (("float32", None), ("bfloat16", "bfloat16"))
    }
    configs = [StitchConfig.single(n) for n in zoo.names()] + _pairs(contexts["float32"], pairs)
    rows = []
    for config in configs:
        seen = {name: _predictions(ctx, config) for name, ctx in contexts.items()}
        (p32, a32, s32), (p16, a16, s16) = seen["float32"], seen["bfloat16"]
        rows.append(
            {
                "config": config.describe(),
                "accuracy_float32": a32,
                "accuracy_bfloat16": a16,
                "delta_points": round(100 * (a16 - a32), 3),
                "agreement": float((p32 == p16).float().mean()),
                "seconds_float32": round(s32, 3),
                "seconds_bfloat16": round(s16, 3),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    deltas = np.abs([r["delta_points"] for r in rows])
    agreements = [r["agreement"] for r in rows]
    ratios = [r["seconds_bfloat16"] / r["seconds_float32"] for r in rows]
    return {
        "val_images": len(data.val),
        "networks": len(rows),
        "min_agreement": min(agreements),
        "median_agreement": statistics.median(agreements),
        "max_abs_delta_points": float(deltas.max()),
        "mean_abs_delta_points": round(float(deltas.mean()), 4),
        "time_ratio_bfloat16_to_float32": {
            "median": round(statistics.median(ratios), 3),
            "min": round(min(ratios), 3),
            "max": round(max(ratios), 3),
        },
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--val", type=int, default=2000)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    cpu_flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    results: dict = {
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "machine": platform.platform(),
        "torch": torch.__version__,
        # without these the CPU emulates bfloat16 arithmetic, slower than float32
        "cpu_bfloat16_instructions": any(f in cpu_flags for f in ("avx512_bf16", "amx_bf16")),
    }
    digits = load_digits_splits()
    results["digits_mini_zoo"] = compare(load_mini_zoo(digits), digits, args.pairs, args.device)
    if REALZOO.is_dir():
        results["realzoo"] = compare(*realzoo(args.val), args.pairs, args.device)
    for name in ("digits_mini_zoo", "realzoo"):
        if name in results:
            print(name, json.dumps({k: v for k, v in results[name].items() if k != "rows"}))
    suffix = "" if args.device == "cpu" else f"_{args.device.split(':')[0]}"
    path = RESULTS / f"autocast{suffix}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
