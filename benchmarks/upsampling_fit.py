"""Least-squares fits into a larger grid at ImageNet size, against an earlier commit's code.

    python benchmarks/upsampling_fit.py [--before COMMIT] [--images 64] [--repeat 3]

The joint: timm's ``efficientnet_b0`` after ``conv_head`` (1,280 channels at 7x7) into
``resnet18`` at ``bn1`` (64 channels at 112x112), both random-initialised (seeded: cost is
real, accuracy is not), on generated 224-px images. Each code state (this checkout and
``--before``, checked out in a temporary worktree) fits, in a fresh process, the least-squares
stitch (``fit_lstsq_batches``) and a ``linear`` adapter's least-squares start
(``adapters.initialise_batches``) on the same activations, in batches of 32, ``--repeat``
times; the seconds are the median and the spread, and the largest difference between the two
codes' outputs on four of the images is recorded (the maps' own weights are ill-determined: the
resized rows of an image span at most its 49 source positions).
Writes benchmarks/results/upsampling_fit.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import commit

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "upsampling_fit.json"
JOINT = {"src": ("efficientnet_b0", "conv_head"), "dst": ("resnet18", "bn1")}


def measure(images: int, repeat: int, out: Path) -> None:
    """In this process (the code on ``sys.path``): fit both, ``repeat`` times; save the maps."""
    import timm
    import torch

    from stitch_nas import adapters
    from stitch_nas.adapters import fit_lstsq_batches
    from stitch_nas.fragments import CutPoint

    torch.manual_seed(0)
    acts = {}
    x = torch.randn(images, 3, 224, 224)
    for side, (arch, layer) in JOINT.items():
        model = timm.create_model(arch, pretrained=False).eval()
        grabbed: list[torch.Tensor] = []
        model.get_submodule(layer).register_forward_hook(
            lambda m, i, o, kept=grabbed: kept.append(o)
        )
        with torch.no_grad():
            for batch in x.split(32):
                model(batch)
        acts[side] = torch.cat(grabbed)
    src = CutPoint("conv_head", 0, "nchw", tuple(acts["src"].shape[1:]))
    dst = CutPoint("bn1", 1, "nchw", tuple(acts["dst"].shape[1:]))

    def pairs():
        return zip(acts["src"].split(32), acts["dst"].split(32), strict=True)

    seconds: dict[str, list[float]] = {"lstsq": [], "linear_init": []}
    maps = {}
    for _ in range(repeat):
        start = time.perf_counter()
        stitch = fit_lstsq_batches(pairs(), src, dst)
        seconds["lstsq"].append(time.perf_counter() - start)
        adapter = adapters.create("linear", src, dst, init="lstsq")
        start = time.perf_counter()
        adapters.initialise_batches(adapter, pairs, src=src, dst=dst)
        seconds["linear_init"].append(time.perf_counter() - start)
        with torch.no_grad():  # what each map predicts: its weights are ill-determined
            sample = acts["src"][:4]
            maps = {"lstsq": stitch(sample), "linear_init": adapter.eval()(sample)}
    import stitch_nas

    threads = torch.get_num_threads()
    torch.save(
        {"seconds": seconds, "maps": maps, "threads": threads, "code": stitch_nas.__file__}, out
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="33ffda4")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.measure:
        measure(args.images, args.repeat, args.measure)
        return
    import torch

    runs, saved = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "before"
        subprocess.run(
            ["git", "worktree", "add", "-q", str(tree), args.before], cwd=ROOT, check=True
        )
        try:
            for label, code in (("before", tree), ("now", ROOT)):
                out = Path(tmp) / f"{label}.pt"
                subprocess.run(
                    [sys.executable, __file__, "--measure", str(out), "--images",
                     str(args.images), "--repeat", str(args.repeat)],
                    env={**os.environ, "PYTHONPATH": str(code)},
                    check=True,
                )  # fmt: skip
                saved[label] = torch.load(out, weights_only=True)
                assert saved[label]["code"].startswith(str(code)), saved[label]["code"]
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=True
            )
    for label, data in saved.items():
        runs[label] = {
            "commit": args.before if label == "before" else commit(),
            "threads": data["threads"],
            **{
                kind: {
                    "seconds": [round(s, 3) for s in values],
                    "median_seconds": round(statistics.median(values), 3),
                }
                for kind, values in data["seconds"].items()
            },
        }
    for kind in ("lstsq", "linear_init"):
        now, before = saved["now"]["maps"][kind], saved["before"]["maps"][kind]
        runs["now"][kind]["outputs_max_abs_difference_from_before"] = float(
            (now - before).abs().max()
        )
        runs["now"][kind]["outputs_max_abs"] = float(before.abs().max())
        runs["now"][kind]["before_over_now"] = round(
            runs["before"][kind]["median_seconds"] / runs["now"][kind]["median_seconds"], 1
        )
    record = {
        "commit": commit(),
        "command": "python benchmarks/upsampling_fit.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, CPU",
        "joint": {side: f"{arch}.{layer}" for side, (arch, layer) in JOINT.items()},
        "images": args.images,
        "repeat": args.repeat,
        "runs": runs,
    }
    RESULTS.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
