"""The CUDA code paths against the CPU ones, on the embedded mini zoo (needs a GPU).

    python benchmarks/gpu_paths.py [--cache-dir DIR] [--configs 30]

One context on the CPU and one on CUDA, the same zoo weights and data. Checked and reported:

- least-squares ``pairwise`` configs (random sample): accuracy on both devices, how many agree
  exactly, the largest difference, and the median trial time on each;
- a trained adapter (``conv3x3``, task loss, 200 steps): CPU context trained on the CPU, CPU
  context trained on CUDA (``device="auto"``), CUDA context;
- SN-Net's joint training (Alg. 1, 300 steps): seconds and the mean stitch accuracy on each;
- an export from the CUDA context in every format, loaded back on the CPU: the formats
  written and the largest output difference from the CUDA network (TF32 convolutions).

Accuracies may differ by a few images between devices (other kernels, other rounding; trained
paths amplify it), so the figures are reported, not asserted. Writes
benchmarks/results/gpu_paths.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import optuna
import torch

import search_spaces
from search_spaces.snnet import train_snnet
from stitch_nas import load
from stitch_nas.activations import StitchContext
from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from stitch_nas.data import load_digits_splits
from stitch_nas.errors import StitchNASError
from stitch_nas.export import FORMATS, ExportItem, export_network
from stitch_nas.stitching import measure
from stitch_nas.zoo import load_mini_zoo

RESULTS = Path(__file__).parent / "results" / "gpu_paths.json"


def adapter_config(device: str) -> StitchConfig:
    """resnet's 2-stage gap joined by a trained conv3x3, trained on ``device``."""
    return StitchConfig(
        (Fragment("resnet", None, "layer1.0"), Fragment("resnet", "layer3.0", None)),
        (AdapterSpec("conv3x3", {"loss": "task", "steps": 200, "device": device}),),
    )


def _contexts(cache_dir: str | None) -> dict[str, StitchContext]:
    data = load_digits_splits()
    return {
        device: StitchContext(load_mini_zoo(data, cache_dir=cache_dir), data, device=device)
        for device in ("cpu", "cuda")
    }


def _timed(ctx: StitchContext, config: StitchConfig) -> tuple[float, float]:
    start = time.perf_counter()
    _, m = measure(ctx, config)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    return m.accuracy, time.perf_counter() - start


def least_squares(ctxs: dict[str, StitchContext], n: int) -> dict:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    configs = []
    for _ in range(n):
        trial = study.ask()
        configs.append(search_spaces.sample("pairwise", trial, ctxs["cpu"]))
        study.tell(trial, 0.0)
    runs = {d: [_timed(ctx, c) for c in configs] for d, ctx in ctxs.items()}
    diffs = [abs(a[0] - b[0]) for a, b in zip(runs["cpu"], runs["cuda"], strict=True)]
    return {
        "configs": n,
        "equal_accuracy": sum(d == 0 for d in diffs),
        "max_accuracy_difference": max(diffs),
        "median_trial_seconds": {d: statistics.median(t for _, t in r) for d, r in runs.items()},
    }


def snnet(ctxs: dict[str, StitchContext]) -> dict:
    out = {}
    for device, ctx in ctxs.items():
        start = time.perf_counter()
        sn = train_snnet(ctx, steps=300)
        seconds = time.perf_counter() - start
        rows = [r for r in sn.evaluate() if not r["anchor"]]
        out[device] = {
            "seconds": seconds,
            "mean_stitch_accuracy": statistics.fmean(r["accuracy"] for r in rows),
        }
    return out


def trained_adapter(ctxs: dict[str, StitchContext]) -> dict:
    runs = {
        "cpu context, trained on cpu": _timed(ctxs["cpu"], adapter_config("cpu")),
        "cpu context, trained on cuda": _timed(ctxs["cpu"], adapter_config("auto")),
        "cuda context": _timed(ctxs["cuda"], adapter_config("auto")),
    }
    return {k: {"accuracy": a, "seconds": t} for k, (a, t) in runs.items()}


def export_roundtrip(ctx: StitchContext) -> dict:
    """Export from the CUDA context in every format; the CPU-loaded copy against the network."""
    config = adapter_config("auto")
    net, m = measure(ctx, config)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            item = ExportItem("gpu", config, m.to_dict())
            folder = export_network(ctx, item, tmp, formats=FORMATS)
        except StitchNASError as exc:
            return {"refused": str(exc)}
        meta = json.loads((folder / "meta.json").read_text())
        loaded = load(folder)
        x = ctx.split("val").read(torch.arange(8))
        with torch.no_grad():
            diff = float((loaded(x) - net(x.to(ctx.device)).cpu()).abs().max())
    return {
        "formats": sorted(meta["formats"]),
        "formats_failed": meta["formats_failed"],
        "loaded_on_cpu_vs_cuda_max_abs_difference": diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default=None, help="mini zoo cache (default: the usual)")
    parser.add_argument("--configs", type=int, default=30)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this check compares the CUDA paths with the CPU ones")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ctxs = _contexts(args.cache_dir)
    report = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "machine": platform.platform(),
        "least_squares": least_squares(ctxs, args.configs),
        "trained_adapter": trained_adapter(ctxs),
        "snnet_joint_300_steps": snnet(ctxs),
        "export_from_cuda": export_roundtrip(ctxs["cuda"]),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
