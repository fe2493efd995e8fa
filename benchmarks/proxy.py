"""Which cheap score predicts a stitch's accuracy? Spearman correlation over every least-squares
pairwise stitch of a zoo.

    python benchmarks/proxy.py [--zoo digits|realzoo] [--max-configs N] [--val N]

For every config ``A[input:a] -lstsq-> B[b:output]`` (every ordered pair of models, every pair of
cut points least squares can join), four scores are computed on the probe split only:

- ``residual``: relative residual of the least-squares fit, ``||S(x) - y|| / ||y - mean(y)||``
  on the probe activations it was fitted to (free once the stitch is fitted; lower is better);
- ``kl``: mean KL divergence from B's own predictions to the stitched network's on the probe
  images (KLAS-style; lower is better);
- ``probe_accuracy``: the stitched network's accuracy on the probe images (it saw them while
  fitting, so it is optimistic, but it costs one pass over 128-256 images);
- ``cka``: linear CKA between A's activation at ``a`` and B's at ``b`` (the mission's proxy).

Each is correlated (Spearman, sign-corrected so that higher = better) with the config's
accuracy on the validation split. Writes benchmarks/results/proxy_<zoo>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

from stitch_nas.activations import StitchContext
from stitch_nas.adapters import LinearStitch, joinable
from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from stitch_nas.stitching import build, measure, net_outputs

RESULTS = Path(__file__).parent / "results"
PROXIES = ("residual", "kl", "probe_accuracy", "cka")
HIGHER_IS_BETTER = {"residual": False, "kl": False, "probe_accuracy": True, "cka": True}


def configs(ctx: StitchContext) -> list[StitchConfig]:
    out = []
    for a in ctx.zoo.names():
        for b in ctx.zoo.names():
            if a == b:
                continue
            for src in ctx.cuts(a):
                for dst in ctx.cuts(b):
                    if joinable(src, dst):
                        frags = (Fragment(a, None, src.name), Fragment(b, dst.name, None))
                        out.append(StitchConfig(frags, (AdapterSpec("lstsq"),)))
    return out


def scores(ctx: StitchContext, config: StitchConfig) -> dict[str, float]:
    first, second = config.fragments
    assert first.end is not None and second.start is not None
    net = build(ctx, config)
    stitch = next(p for p in net.parts if isinstance(p, LinearStitch))
    x = ctx.activation(first.model, first.end, "probe")
    y = ctx.activation(second.model, second.start, "probe").float()
    with torch.no_grad():
        fitted = ctx.run(stitch, x).float()
        residual = float((fitted - y).norm() / (y - y.mean(0, keepdim=True)).norm())
        stitched = net_outputs(ctx, net, "probe").float()
        own = ctx.activation(second.model, None, "probe").float()
        log_p, log_q = own.log_softmax(1), stitched.log_softmax(1)
        kl = float((log_p.exp() * (log_p - log_q)).sum(1).mean())
        probe_acc = float((stitched.argmax(1).cpu() == ctx.labels("probe")).float().mean())
    cka = ctx.joint_cka(first.model, first.end, second.model, second.start)
    return {"residual": residual, "kl": kl, "probe_accuracy": probe_acc, "cka": cka}


def _context(zoo_name: str, val: int | None) -> StitchContext:
    if zoo_name == "digits":
        from stitch_nas.data import load_digits_splits
        from stitch_nas.zoo import load_mini_zoo

        data = load_digits_splits()
        return StitchContext(load_mini_zoo(data), data)
    # The real zoo exactly as ``stitch-nas search examples/realzoo.yaml`` loads it.
    from stitch_nas.pipeline import load_data, load_zoo
    from stitch_nas.settings import load_settings

    settings = load_settings(Path(__file__).parents[1] / "examples" / "realzoo.yaml")
    if val is not None:
        settings.data.splits["val"]["count"] = val
    data = load_data(settings.data)
    return StitchContext(load_zoo(settings.zoo, data), data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", choices=["digits", "realzoo"], default="digits")
    parser.add_argument("--max-configs", type=int, default=None, help="a seeded random subset")
    parser.add_argument("--val", type=int, default=None, help="validation images (realzoo)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    ctx = _context(args.zoo, args.val)
    todo = configs(ctx)
    if args.max_configs and len(todo) > args.max_configs:
        todo = random.Random(args.seed).sample(todo, args.max_configs)
    rows, start = [], time.perf_counter()
    for i, config in enumerate(todo):
        row = {"config": config.describe(), **scores(ctx, config)}
        row["val_accuracy"] = measure(ctx, config)[1].accuracy
        rows.append(row)
        if (i + 1) % 50 == 0:
            print(f"{i + 1}/{len(todo)} configs, {time.perf_counter() - start:.0f} s", flush=True)
    val = np.array([r["val_accuracy"] for r in rows])
    summary = {}
    for name in PROXIES:
        values = np.array([r[name] for r in rows])
        rho = float(spearmanr(values, val).statistic)
        summary[name] = rho if HIGHER_IS_BETTER[name] else -rho
    record = {
        "zoo": args.zoo,
        "configs": len(rows),
        "of": len(configs(ctx)),
        "val_images": int(len(ctx.labels("val"))),
        "probe_images": int(len(ctx.labels("probe"))),
        "spearman_with_val_accuracy": summary,
        "seconds": round(time.perf_counter() - start, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"proxy_{args.zoo}.json").write_text(json.dumps(record, indent=1) + "\n")
    for name, rho in summary.items():
        print(f"{name:16s} Spearman {rho:+.3f}")
    print(f"{len(rows)} configs, {record['val_images']} validation images, {record['seconds']} s")


if __name__ == "__main__":
    main()
