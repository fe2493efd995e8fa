"""Memory and time of a search as the validation split grows: CIFAR-size and ImageNet-size zoos.

    python benchmarks/scale.py [--setting cifar|imagenet] [--sizes 1250,2500,5000]
                               [--models 11] [--trials 10] [--threads 2]
                               [--forward-configs N] [--repeat R] [--cache-gb X]

Each size runs in a fresh subprocess (so its peak RSS is its own) with the library's default
settings (cache budget 5 % of the machine's memory, float16 storage, no spill folder, the
automatic batch size: 256, fewer for large inputs) and random-init weights: cost is the point, not
accuracy. The synthetic images are uint8, as a torchvision data set keeps them. Start-up does
what a search does once per model before its trials (a Ray worker does it explicitly; the CLI's
seeding pass on the way): trace the model, fill its MAC table, and store the probe's
activations at every cut. Per size it records peak RSS, the cache's bytes in memory (now and at
peak) and on disk, the start-up and the time to the first trial, the median trial, each trial
divided by one plain forward pass of the same stitched network over the same images (probe +
validation) with the median over ``--forward-configs`` configs ("cold": the trial whose
first-fragment activation on the validation split was not cached yet, "warm": the same config
measured again), and trials per hour. With ``--repeat R`` every size runs R times, in turn;
``sizes`` holds each figure's median with its range (``<figure>_range``) and ``runs`` each run.
``--cache-gb X`` sets the cache's budget instead of the default (stored under
``<setting>_cacheXgb``): a budget the cache reaches at the smallest size bounds the peak at every
size. Writes benchmarks/results/scale.json (one entry per setting, merged with what is there).

    python benchmarks/scale.py --setting imagenet --folder DIR [--folder-images 20000] --sizes 500

runs the same trials on a folder of synthetic PNGs instead of tensors: DIR (written once, kept)
holds ``--folder-images`` images in ``train/``, ``val/`` and ``test/`` folders (val and test of
the given size each, train the rest), read through ``stitch_nas.data.load_split_folders``, which
keeps every split as files and decodes each batch when it is read. After the trials, every image
of the folder is read once more, batch by batch, and the peak RSS before and after that pass is
recorded: a folder held in memory would add its float32 size. Stored under ``<setting>_folder``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from stitch_nas.activations import DEFAULT_MEMORY_FRACTION

RESULTS = Path(__file__).parent / "results" / "scale.json"
SETTINGS = {
    "cifar": {"sizes": (1250, 2500, 5000), "probe": 256, "side": 32},
    "imagenet": {"sizes": (250, 500, 1000), "probe": 128, "side": 224},
}
IMAGENET_MODELS = (
    "resnet50",
    "convnext_tiny",
    "deit_small_patch16_224",
    "swin_tiny_patch4_window7_224",
)


# -- CIFAR-size models: small definitions of the architectures -------------------------
class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, shortcut: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.pad = cout - cin
        self.stride = stride
        self.proj: nn.Module | None = None
        if shortcut == "conv" and (stride != 1 or cin != cout):
            self.proj = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        if self.proj is not None:
            short = self.proj(x)
        elif self.stride != 1 or self.pad:  # option A: subsample and zero-pad the channels
            short = nn.functional.pad(
                x[:, :, :: self.stride, :: self.stride], (0, 0, 0, 0, 0, self.pad)
            )
        else:
            short = x
        return torch.relu(out + short)


class CifarResNet(nn.Module):
    """He et al.'s CIFAR ResNet-(6n+2), with zero-pad ("pad") or 1x1-conv ("conv") shortcuts."""

    def __init__(self, depth: int, shortcut: str = "pad", classes: int = 10) -> None:
        super().__init__()
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        layers, cin = [], 16
        for i, width in enumerate((16, 32, 64)):
            blocks = []
            for j in range(n):
                blocks.append(_Block(cin, width, 2 if (i and not j) else 1, shortcut))
                cin = width
            layers.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = layers
        self.fc = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(x.mean(dim=(2, 3)))


class PlainCNN(nn.Module):
    """Three conv layers and a linear classifier."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.c1 = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.c2 = nn.Sequential(nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.c3 = nn.Sequential(nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(128 * 16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.c3(self.c2(self.c1(x))).flatten(1))


def cifar_models() -> dict[str, nn.Module]:
    """Eleven CIFAR-size models, random-init (two seeds stand for two trainers)."""
    import torchvision

    specs: dict[str, object] = {}
    for seed in (0, 1):
        for depth in (20, 32, 44, 56) if seed == 0 else (20, 56):
            specs[f"resnet{depth}_pad_s{seed}"] = (CifarResNet, (depth, "pad"), seed)
    for depth in (20, 56):
        specs[f"resnet{depth}_conv"] = (CifarResNet, (depth, "conv"), 2)
    models: dict[str, nn.Module] = {}
    for name, (cls, args, seed) in specs.items():  # type: ignore[misc]
        torch.manual_seed(seed)
        models[name] = cls(*args)
    torch.manual_seed(3)
    models["shufflenetv2_x0_5"] = torchvision.models.shufflenet_v2_x0_5(num_classes=10)
    torch.manual_seed(4)
    models["densenet_bc_k12"] = torchvision.models.DenseNet(
        growth_rate=12, block_config=(6, 6, 6), num_init_features=24, num_classes=10
    )
    torch.manual_seed(5)
    models["plain_cnn"] = PlainCNN()
    return models


def imagenet_models() -> dict[str, nn.Module]:
    import timm

    models = {}
    for name in IMAGENET_MODELS:
        torch.manual_seed(0)
        models[name] = timm.create_model(name, pretrained=False)
    return models


# -- one size, in its own process -------------------------------------------------------------
def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _configs(ctx, names: list[str], count: int, seed: int) -> list:  # type: ignore[no-untyped-def]
    """Random two-model least-squares configs at similar relative depths."""
    from stitch_nas.adapters import joinable
    from stitch_nas.config import AdapterSpec, Fragment, StitchConfig

    rng = random.Random(seed)
    configs = []
    while len(configs) < count:
        a, b = rng.sample(names, 2)
        cuts_a, cuts_b = ctx.cuts(a), ctx.cuts(b)
        src = rng.choice(cuts_a[1:-1])
        dst = min(cuts_b[1:-1], key=lambda c: abs(c.depth - src.depth))
        if joinable(src, dst):
            configs.append(
                StitchConfig(
                    (Fragment(a, None, src.name), Fragment(b, dst.name, None)),
                    (AdapterSpec("lstsq"),),
                )
            )
    return configs


def write_folder(root: Path, total: int, val: int, side: int, classes: int) -> None:
    """``total`` synthetic PNGs under ``root/{train,val,test}/<class>/`` (val and test ``val``
    each), unless a finished folder of that shape is there already."""
    from PIL import Image

    done = root / f".complete-{total}-{val}-{side}-{classes}"
    if done.exists():
        return
    for split, count in (("train", total - 2 * val), ("val", val), ("test", val)):
        rng = np.random.default_rng(len(split))
        for c in range(classes):
            (root / split / f"{c:04d}").mkdir(parents=True, exist_ok=True)
        for i in range(count):
            low = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
            low.resize((side, side), Image.BILINEAR).save(
                root / split / f"{i % classes:04d}/{i}.png"
            )
    done.touch()


def _folder_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*.png"))


def run_size(
    setting: str,
    images: int,
    n_models: int,
    trials: int,
    folder: Path | None = None,
    forward_configs: int = 0,
    cache_gb: float | None = None,
) -> dict:
    from stitch_nas.activations import ActivationCache, StitchContext
    from stitch_nas.data import ArrayImages, DataSplits, Split, load_split_folders
    from stitch_nas.stitching import build, fragment_macs, measure
    from stitch_nas.zoo import InputSpec, Zoo, ZooEntry

    spec = SETTINGS[setting]
    side, classes = int(spec["side"]), 10 if setting == "cifar" else 1000  # type: ignore[call-overload]
    models = cifar_models() if setting == "cifar" else imagenet_models()
    names = list(models)[:n_models]
    gen = torch.Generator().manual_seed(0)

    def split(n: int) -> Split:  # uint8 pixels, as a torchvision data set keeps its images
        pixels = torch.randint(256, (n, 3, side, side), generator=gen, dtype=torch.uint8)
        return Split(ArrayImages(pixels, side), torch.randint(classes, (n,), generator=gen))

    if folder is None:
        labels = tuple(str(i) for i in range(classes))
        data = DataSplits(
            split(8), split(int(spec["probe"])), split(images), split(8), labels, "synthetic"
        )  # type: ignore[call-overload]
    else:
        data = load_split_folders(folder, size=side, probe_size=int(spec["probe"]))  # type: ignore[call-overload]
        labels = data.label_names
    zoo = Zoo()
    for name in names:
        zoo.add(
            ZooEntry(
                name=name,
                model=models[name].eval(),
                input_spec=InputSpec(size=(side, side), mean=(0.5,) * 3, std=(0.25,) * 3),
                label_names=labels,
                source="user",
            )
        )
    start = time.perf_counter()
    ctx = StitchContext(zoo, data, cache=ActivationCache(memory_gb=cache_gb))
    for name in names:  # once per model, as a search's start-up (a Ray worker's) does
        fragment_macs(ctx, name, None, None)  # trace the model, fill its MAC table
        for _ in ctx.activation_batches(name, None, "probe"):  # the probe at every cut
            pass
    startup = time.perf_counter() - start
    configs = _configs(ctx, names, trials, seed=0)
    cold, warm, forward = [], [], []
    first_trial = None
    for config in configs:
        t = time.perf_counter()
        measure(ctx, config)
        cold.append(time.perf_counter() - t)
        first_trial = first_trial or time.perf_counter() - start
    again = forward_configs or max(3, trials // 3)
    for config in configs[:again]:
        t = time.perf_counter()
        measure(ctx, config)
        warm.append(time.perf_counter() - t)
        net = build(ctx, config)
        t = time.perf_counter()  # reading the images is part of the pass (a folder decodes)
        with torch.no_grad():
            for part in (data.probe, data.val):
                for x in part.batches(ctx.batch_size):
                    net(x)
        forward.append(time.perf_counter() - t)
    stats = ctx.cache.stats()
    median_forward = statistics.median(forward)
    # each trial over the forward pass of its own network, then the median over those configs
    cold_ratio = statistics.median(c / f for c, f in zip(cold, forward, strict=False))
    warm_ratio = statistics.median(w / f for w, f in zip(warm, forward, strict=True))
    return {
        "images": images,
        "models": names,
        "trials": len(cold),
        "peak_rss_gb": round(_peak_rss_gb(), 3),
        "cache_budget_gb": round(stats["budget_bytes"] / 2**30, 3),
        "cache_gb_in_memory": round(stats["bytes_in_memory"] / 2**30, 3),
        "cache_peak_gb_in_memory": round(stats["peak_bytes"] / 2**30, 3),
        "cache_gb_on_disk": round(stats["disk_bytes"] / 2**30, 3),
        "startup_seconds": round(startup, 2),
        "seconds_to_first_trial": round(first_trial or 0.0, 2),
        "median_trial_seconds_cold": round(statistics.median(cold), 3),
        "median_trial_seconds_warm": round(statistics.median(warm), 3),
        "median_forward_seconds": round(median_forward, 3),
        "forward_configs": len(forward),
        "trial_over_forward_cold": round(cold_ratio, 3),
        "trial_over_forward_warm": round(warm_ratio, 3),
        "trials_per_hour": round(3600 * len(cold) / sum(cold), 1),
        **(_whole_pass(data, ctx.batch_size, folder) if folder is not None else {}),
    }


def _whole_pass(data, batch: int, folder: Path) -> dict:  # type: ignore[no-untyped-def]
    """Read every image of the folder once, batch by batch, and what that did to peak RSS."""
    before, t, count = _peak_rss_gb(), time.perf_counter(), 0
    for part in data.splits().values():
        for x in part.batches(batch):
            count += len(x)
    seconds = time.perf_counter() - t
    return {
        "folder_images": count,
        "folder_gb_on_disk": round(_folder_bytes(folder) / 2**30, 3),
        "folder_gb_as_float32": round(count * 3 * data.image_size[0] ** 2 * 4 / 2**30, 3),
        "whole_folder_pass_seconds": round(seconds, 1),
        "peak_rss_gb_before_whole_pass": round(before, 3),
        "peak_rss_gb_after_whole_pass": round(_peak_rss_gb(), 3),
    }


def _summary(rows: list[dict]) -> dict:
    """One size over its repeated runs: the median of every figure, the range of each beside it."""
    out = dict(rows[0])
    for key, value in rows[0].items():
        if isinstance(value, (int, float)) and key != "images":
            values = [row[key] for row in rows]
            out[key] = round(statistics.median(values), 3)
            if min(values) != max(values):
                out[key + "_range"] = [min(values), max(values)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="cifar")
    parser.add_argument("--sizes", default=None, help="comma-separated validation sizes")
    parser.add_argument("--models", type=int, default=11, help="first N models of the zoo")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--folder", type=Path, default=None, help="synthetic PNG folder")
    parser.add_argument("--folder-images", type=int, default=20000)
    parser.add_argument(
        "--forward-configs", type=int, default=0, help="configs timed again and as a plain "
        "forward pass (0: a third of --trials, at least 3)"
    )  # fmt: skip
    parser.add_argument("--repeat", type=int, default=1, help="runs of every size, in turn")
    parser.add_argument(
        "--cache-gb", type=float, default=None, help="cache budget in GiB (default: the library's)"
    )
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.one is not None:
        row = run_size(
            args.setting,
            args.one,
            args.models,
            args.trials,
            args.folder,
            args.forward_configs,
            args.cache_gb,
        )
        print(json.dumps(row))
        return
    sizes = (
        [int(s) for s in args.sizes.split(",")] if args.sizes else SETTINGS[args.setting]["sizes"]
    )
    runs: list[list[dict]] = []
    for _ in range(args.repeat):
        runs.append([])
        for size in sizes:  # type: ignore[union-attr]
            command = [sys.executable, __file__, "--setting", args.setting, "--one", str(size)]
            command += ["--models", str(args.models), "--trials", str(args.trials)]
            command += ["--threads", str(args.threads)]
            command += ["--forward-configs", str(args.forward_configs)]
            if args.cache_gb is not None:
                command += ["--cache-gb", str(args.cache_gb)]
            if args.folder is not None:
                classes = 10 if args.setting == "cifar" else 1000
                side = int(SETTINGS[args.setting]["side"])  # type: ignore[call-overload]
                write_folder(args.folder, args.folder_images, size, side, classes)
                command += ["--folder", str(args.folder)]
            out = subprocess.run(command, capture_output=True, text=True, check=True)
            runs[-1].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(runs[-1][-1]), flush=True)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    key = args.setting + ("_folder" if args.folder else "")
    default = f"{DEFAULT_MEMORY_FRACTION:.0%} of RAM".replace("%", " %")
    budget = default if args.cache_gb is None else f"{args.cache_gb:g} GiB (--cache-gb)"
    if args.cache_gb is not None:
        key += f"_cache{args.cache_gb:g}gb"
    results[key] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
        "threads": args.threads,
        "defaults": f"cache budget {budget}, float16 storage, no spill folder, batch auto",
        "repeats": args.repeat,
        "sizes": [_summary([run[i] for run in runs]) for i in range(len(sizes))],  # type: ignore[arg-type]
        "runs": runs,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
