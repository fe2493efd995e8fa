"""Adapter kinds across gaps of increasing size and across architectures, on the embedded zoo.

    python benchmarks/adapters.py [--steps 100] [--device cpu]

For each gap (a cut i of model A, a deeper cut j of model B; A may be B) it builds
``A[input:i] -adapter-> B[j:output]`` with every adapter kind that can join the two cuts and
measures validation accuracy, MACs and parameters of the whole stitched network:

* ``lstsq``: the closed-form stitch alone (where least squares can join the layouts);
* each trained kind three ways: least-squares initialisation only (``loss='none'``), least
  squares then training, and a random initialisation then the same training.

Training follows Traft & Cheney (AdamW, lr 2e-3, weight decay 0.05, cosine schedule, BatchNorm
around the adapter, bilinear rescaling) with the task loss through the frozen suffix, on the
train split, early-stopped on the probe split, for ``--steps`` steps of batch 64.
Writes benchmarks/results/adapters.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch

from stitch_nas import adapters
from stitch_nas.activations import StitchContext
from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from stitch_nas.data import load_digits_splits
from stitch_nas.errors import LayoutError
from stitch_nas.stitching import measure
from stitch_nas.zoo import load_mini_zoo

RESULTS = Path(__file__).parent / "results" / "adapters.json"

# (label, source model, source cut, destination model, destination cut)
GAPS = [
    ("within a stage", "convnext", "stages.2.blocks.0", "convnext", "stages.2.blocks.3"),
    ("1 stage", "convnext", "stages.0.blocks.0", "convnext", "stages.1.blocks.1"),
    ("2 stages", "convnext", "stages.0.blocks.0", "convnext", "stages.2.blocks.3"),
    ("3 stages", "convnext", "stages.0.blocks.0", "convnext", "stages.3.blocks.0"),
    ("1 stage", "resnet", "layer1.0", "resnet", "layer2.0"),
    ("2 stages", "resnet", "layer1.0", "resnet", "layer3.0"),
    ("CNN->CNN", "resnet", "layer1.0", "convnext", "stages.1.blocks.1"),
    ("CNN->ViT", "resnet", "layer1.0", "vit", "blocks.1"),
    ("ViT->CNN", "vit", "blocks.1", "resnet", "layer2.0"),
]
GRID_KINDS = ("linear", "linear_relu", "conv3x3", "bottleneck")
TOKEN_KINDS = (*GRID_KINDS, "transformer_block")  # Traft & Cheney used ViT blocks with ViTs


def _config(gap: tuple[str, ...], spec: AdapterSpec) -> StitchConfig:
    _, a, i, b, j = gap
    return StitchConfig((Fragment(a, None, i), Fragment(b, j, None)), (spec,))


def _row(ctx: StitchContext, gap: tuple[str, ...], spec: AdapterSpec, mode: str) -> dict:
    start = time.perf_counter()
    net, result = measure(ctx, _config(gap, spec))
    return {
        "gap": gap[0],
        "src": f"{gap[1]}:{gap[2]}",
        "dst": f"{gap[3]}:{gap[4]}",
        "kind": spec.kind,
        "mode": mode,
        "accuracy": result.accuracy,
        "macs": result.macs,
        "params": result.params,
        "seconds": time.perf_counter() - start,
    }


def run_gap(ctx: StitchContext, gap: tuple[str, ...], steps: int, device: str) -> list[dict]:
    rows = []
    try:
        rows.append(_row(ctx, gap, AdapterSpec("lstsq"), "closed form"))
    except LayoutError as exc:  # least squares keeps to its layout pairs
        rows.append({"gap": gap[0], "kind": "lstsq", "mode": "refused", "reason": str(exc)})
    tokens = "vit" in (gap[1], gap[3])
    train = {"loss": "task", "steps": steps, "device": device}
    for kind in TOKEN_KINDS if tokens else GRID_KINDS:
        rows.append(_row(ctx, gap, AdapterSpec(kind, {"loss": "none"}), "lstsq init only"))
        rows.append(_row(ctx, gap, AdapterSpec(kind, train), "lstsq init + train"))
        random = {**train, "init": "random"}
        rows.append(_row(ctx, gap, AdapterSpec(kind, random), "random init + train"))
    return rows


def _table(rows: list[dict], references: dict[str, dict]) -> str:
    lines = ["reference models (val accuracy, MACs):"]
    lines += [f"  {n:<10} {r['accuracy']:.3f}  {r['macs']:>10,}" for n, r in references.items()]
    header = f"{'gap':<15}{'src -> dst':<60}{'adapter':<18}{'mode':<20}{'acc':>6}{'MACs':>12}"
    lines += ["", header, "-" * len(header)]
    for r in rows:
        if r["mode"] == "refused":
            continue
        pair = f"{r['src']} -> {r['dst']}"
        lines.append(
            f"{r['gap']:<15}{pair:<60}{r['kind']:<18}{r['mode']:<20}"
            f"{r['accuracy']:>6.3f}{r['macs']:>12,}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="training steps per adapter")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--gaps", type=int, default=len(GAPS), help="run the first N gaps only")
    args = parser.parse_args()
    torch.manual_seed(0)
    data = load_digits_splits()
    ctx = StitchContext(load_mini_zoo(data), data, device=args.device)
    references = {}
    for name in sorted({g[1] for g in GAPS} | {g[3] for g in GAPS}):
        result = measure(ctx, StitchConfig.single(name))[1]
        references[name] = {"accuracy": result.accuracy, "macs": result.macs}
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for gap in GAPS[: args.gaps]:
        rows.extend(run_gap(ctx, gap, args.steps, args.device))
        print(f"{gap[0]:<15} {gap[1]}:{gap[2]} -> {gap[3]}:{gap[4]} done", flush=True)
    report = {
        "steps": args.steps,
        "device": args.device,
        "defaults": {
            k: adapters.get_adapter("linear").options[k].default
            for k in ("lr", "weight_decay", "batch_size", "patience", "eval_every", "split")
        },
        "machine": platform.platform(),
        "torch_threads": torch.get_num_threads(),
        "seconds": time.perf_counter() - start,
        "references": references,
        "rows": rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))
    print(_table(rows, references))
    print(f"\nwrote {RESULTS} in {report['seconds']:.0f} s")


if __name__ == "__main__":
    main()
