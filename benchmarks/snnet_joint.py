"""SN-Net's joint training (Alg. 1) against least-squares stitches and per-stitch training.

    python benchmarks/snnet_joint.py [--steps 300,1000]
    python benchmarks/snnet_joint.py --zoo realzoo [--steps 300] [--val 1000]

On the embedded mini zoo, SN-Net's configuration set with the paper's defaults (the zoo ordered
by MACs as anchors, nearest stitching, fast-to-slow, windows kernel 2 / stride 1) is measured
four ways on the validation split:

- ``lstsq``: every stitching layer (a 1x1 conv) at its least-squares solution ("LS Init");
- ``joint N``: Alg. 1 for N steps, anchors and layers trained (SN-Net's default, lr 1e-4);
- ``joint adapter N``: Alg. 1 for N steps, stitching layers only;
- ``separate N``: each stitch trained on its own, with its own fine-tuned copies of both
  anchors (a ``linear`` adapter, ``train="all"``, task loss, lr 1e-4), N / |E| steps each, so
  the same number of optimiser steps as ``joint N`` in all.

With ``--zoo realzoo`` (``examples/realzoo.yaml``'s models and data, ``../shared/realzoo``) the
anchors are the fattorib ResNet-20/32/44/56 depth family (one trainer, one recipe) and the rows
are ``lstsq``, ``joint N``, ``joint distill N`` (Alg. 1 learning the logits of the zoo's best
model on the probe split, SN-Net's distillation) and ``separate N``, on the first ``--val``
validation images; results go to ``snnet_joint_realzoo.json``.

Reported per row: median, mean and lowest stitch accuracy, mean anchor accuracy, parameters
needed to store every network of the row (one SN-Net against one network per stitch), and
seconds. Writes benchmarks/results/snnet_joint.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from search_spaces.snnet import train_snnet
from stitch_nas.activations import StitchContext
from stitch_nas.config import AdapterSpec, StitchConfig
from stitch_nas.data import load_digits_splits
from stitch_nas.snnet import JointSNNet, joint_spec, joint_stitches
from stitch_nas.stitching import measure
from stitch_nas.zoo import load_mini_zoo

RESULTS = Path(__file__).parent / "results" / "snnet_joint.json"
REALZOO_RESULTS = RESULTS.with_name("snnet_joint_realzoo.json")
FAMILY = "fattorib_resnet20,fattorib_resnet32,fattorib_resnet44,fattorib_resnet56"


def _summary(name: str, rows: list[dict[str, Any]], params: int, seconds: float) -> dict:
    stitches = [r["accuracy"] for r in rows if not r["anchor"]]
    anchors = [r["accuracy"] for r in rows if r["anchor"]]
    return {
        "row": name,
        "stitches": len(stitches),
        "median": statistics.median(stitches),
        "mean": statistics.fmean(stitches),
        "lowest": min(stitches),
        "anchor_mean": statistics.fmean(anchors),
        "params_to_store": params,
        "seconds": seconds,
    }


def least_squares(ctx: StitchContext, anchors: str = "") -> dict:
    start = time.perf_counter()
    spec = joint_spec(anchors=anchors)
    sn = JointSNNet(ctx, spec, joint_stitches(ctx, spec))  # initialised, never trained
    return _summary("lstsq", sn.evaluate(), sn.num_params(), time.perf_counter() - start)


def joint(
    ctx: StitchContext, steps: int, train: str, anchors: str = "", loss: str = "task"
) -> dict:
    start = time.perf_counter()
    sn = train_snnet(ctx, steps=steps, train=train, anchors=anchors, loss=loss, progress=True)
    name = f"joint {steps}" if train == "all" else f"joint adapter {steps}"
    if loss == "distill":
        name = f"joint distill {steps}"
    return _summary(name, sn.evaluate(), sn.num_params(), time.perf_counter() - start)


def separate(ctx: StitchContext, steps: int, anchors: str = "") -> dict:
    """Each stitch trained alone with the same total number of optimiser steps as ``joint``."""
    stitches = joint_stitches(ctx, joint_spec(anchors=anchors))
    family = sorted({m for s in stitches for m in (s.front, s.back)})
    each = max(1, steps // (len(stitches) + len(family)))
    spec = AdapterSpec(
        "linear",
        {
            "norm": "none",
            "loss": "task",
            "train": "all",
            "steps": each,
            "lr": 1e-4,
            "patience": 0,
            "eval_every": each,
        },
    )
    start = time.perf_counter()
    rows, params = [], 0
    for name in family:
        _, m = measure(ctx, StitchConfig.single(name))
        rows.append({"anchor": True, "accuracy": m.accuracy})
        params += m.params
    for s in stitches:
        _, m = measure(ctx, StitchConfig(s.config.fragments, (spec,)))
        rows.append({"anchor": False, "accuracy": m.accuracy})
        params += m.params
    return _summary(f"separate {steps}", rows, params, time.perf_counter() - start)


def _table(rows: list[dict]) -> str:
    lines = [
        f"{'row':<20} {'stitches':>8} {'median':>7} {'mean':>7} {'lowest':>7} "
        f"{'anchors':>7} {'params':>9} {'s':>6}"
    ]
    for r in rows:
        lines.append(
            f"{r['row']:<20} {r['stitches']:>8} {r['median']:>7.3f} {r['mean']:>7.3f} "
            f"{r['lowest']:>7.3f} {r['anchor_mean']:>7.3f} {r['params_to_store']:>9,} "
            f"{r['seconds']:>6.1f}"
        )
    return "\n".join(lines)


def _realzoo(val: int) -> StitchContext:
    """The real zoo and data exactly as ``stitch-nas search examples/realzoo.yaml`` loads them."""
    from stitch_nas.pipeline import load_data, load_zoo
    from stitch_nas.settings import load_settings

    settings = load_settings(Path(__file__).parents[1] / "examples" / "realzoo.yaml")
    settings.data.splits["val"]["count"] = val
    data = load_data(settings.data)
    return StitchContext(load_zoo(settings.zoo, data), data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", choices=["digits", "realzoo"], default="digits")
    parser.add_argument("--steps", default=None, help="training steps, comma-separated")
    parser.add_argument("--val", type=int, default=1000, help="validation images (realzoo)")
    args = parser.parse_args()
    real = args.zoo == "realzoo"
    budgets = [int(s) for s in (args.steps or ("300" if real else "300,1000")).split(",")]
    torch.manual_seed(0)
    if real:
        ctx, anchors, results = _realzoo(args.val), FAMILY, REALZOO_RESULTS
    else:
        data = load_digits_splits()
        ctx, anchors, results = StitchContext(load_mini_zoo(data), data), "", RESULTS
    start = time.perf_counter()
    rows = [least_squares(ctx, anchors)]
    for steps in budgets:
        rows.append(joint(ctx, steps, "all", anchors))
        if real:
            rows.append(joint(ctx, steps, "all", anchors, loss="distill"))
        else:
            rows.append(joint(ctx, steps, "adapter"))
        rows.append(separate(ctx, steps, anchors))
        print(f"{steps} steps done", flush=True)
    stitches = joint_stitches(ctx, joint_spec(anchors=anchors))
    report = {
        "zoo": args.zoo,
        "anchors": sorted({m for s in stitches for m in (s.front, s.back)}),
        "val_images": len(ctx.labels("val")),
        "machine": platform.platform(),
        "torch_threads": torch.get_num_threads(),
        "seconds": time.perf_counter() - start,
        "rows": rows,
    }
    if real:
        from stitch_nas.adapters import resolve_teacher

        report["teacher"] = resolve_teacher(ctx, "best", stitches[0].back)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(report, indent=2))
    print(_table(rows))
    print(f"\nwrote {results} in {report['seconds']:.0f} s")


if __name__ == "__main__":
    main()
