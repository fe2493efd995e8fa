"""How much float16 storage of cached activations moves measured accuracies.

    python benchmarks/storage_dtype.py [--val 1000] [--pairs 8]

Measures every model alone and ``--pairs`` random two-model least-squares stitches twice, with
the cache storing activations as float32 and as float16 (computation is float32 in both), on
the digits mini zoo and, when ``../shared/realzoo`` is present, on its nine real CIFAR-10 models
(probe: 256 of its training images; validation: the first ``--val`` test images). Writes
benchmarks/results/storage_dtype.json.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np
import torch

from stitch_nas.activations import ActivationCache, StitchContext
from stitch_nas.adapters import joinable
from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from stitch_nas.data import DataSplits, Split, load_digits_splits
from stitch_nas.stitching import measure
from stitch_nas.zoo import InputSpec, Zoo, ZooEntry, load_mini_zoo

RESULTS = Path(__file__).parent / "results" / "storage_dtype.json"
REALZOO = Path(__file__).resolve().parents[2] / "shared" / "realzoo"


def _pairs(ctx: StitchContext, count: int, seed: int = 0) -> list[StitchConfig]:
    rng, names, configs = random.Random(seed), list(ctx.zoo.names()), []
    while len(configs) < count:
        a, b = rng.sample(names, 2)
        src = rng.choice(ctx.cuts(a)[1:-1])
        dst = min(ctx.cuts(b)[1:-1], key=lambda c: abs(c.depth - src.depth))
        if joinable(src, dst):
            frags = (Fragment(a, None, src.name), Fragment(b, dst.name, None))
            configs.append(StitchConfig(frags, (AdapterSpec("lstsq"),)))
    return configs


def compare(zoo: Zoo, data: DataSplits, pairs: int) -> dict:
    contexts = {
        dtype: StitchContext(zoo, data, cache=ActivationCache(dtype=dtype))
        for dtype in ("float32", "float16")
    }
    configs = [StitchConfig.single(n) for n in zoo.names()] + _pairs(contexts["float32"], pairs)
    rows = []
    for config in configs:
        acc = {d: measure(ctx, config)[1].accuracy for d, ctx in contexts.items()}
        rows.append({"config": config.describe(), **acc, "delta": acc["float16"] - acc["float32"]})
    deltas = np.abs([r["delta"] for r in rows])
    return {
        "val_images": len(data.val),
        "configs": len(rows),
        "max_abs_delta_points": round(100 * float(deltas.max()), 3),
        "mean_abs_delta_points": round(100 * float(deltas.mean()), 4),
        "changed": int((deltas > 0).sum()),
        "rows": rows,
    }


def realzoo(val: int) -> tuple[Zoo, DataSplits]:
    sys.path.insert(0, str(REALZOO))
    import zoo as real  # the shared folder's module, read in place

    labels = tuple(real.CLASSES)
    models = Zoo()
    for name, spec in real.MODELS.items():
        models.add(
            ZooEntry(
                name=name,
                model=real.build(name),
                input_spec=InputSpec(size=(32, 32), mean=spec["mean"], std=spec["std"]),
                label_names=labels,
                source="user",
            )
        )

    def split(x: np.ndarray, y: np.ndarray) -> Split:
        images = torch.from_numpy(x).permute(0, 3, 1, 2).float().div(255.0).contiguous()
        return Split(images, torch.from_numpy(y).long())

    xt, yt = real.load_cifar10("test")
    xr, yr = real.load_cifar10("train_10k")
    data = DataSplits(
        split(xr[256:264], yr[256:264]),
        split(xr[:256], yr[:256]),
        split(xt[:val], yt[:val]),
        split(xt[val : val + 8], yt[val : val + 8]),
        labels,
        "cifar10",
    )
    return models, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--val", type=int, default=1000)
    parser.add_argument("--pairs", type=int, default=8)
    args = parser.parse_args()
    digits = load_digits_splits()
    results = {"digits_mini_zoo": compare(load_mini_zoo(digits), digits, args.pairs)}
    print(json.dumps({k: v for k, v in results["digits_mini_zoo"].items() if k != "rows"}))
    if REALZOO.is_dir():
        results["realzoo"] = compare(*realzoo(args.val), args.pairs)
        print(json.dumps({k: v for k, v in results["realzoo"].items() if k != "rows"}))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
