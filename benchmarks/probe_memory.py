"""Peak working memory of the probe's readers at 1,000 classes: a 2,000-image probe against 256.

    python benchmarks/probe_memory.py [--probes 256 2000] [--classes 1000] [--side 32]

Two untrained timm ``test_resnet`` models (``pretrained=False``, seeded) predict ``--classes``
classes of random ``--side`` x ``--side`` images. For each probe size, with every probe
activation the readers need already in the cache (what the cache holds is bounded by its own
budget, a setting), it records the most bytes of tensors alive at once while each reader runs:

- ``fit``: building a pairwise least-squares stitch (the normal equations, batch by batch);
- ``fit_trained``: building the same joint with a trained ``conv3x3`` adapter (least-squares
  initialisation on the probe, a few ``match`` steps on the train split, the held-out loss on
  the probe);
- ``cka``: the joint's CKA score (two probe Grams, read batch by batch: ``n x n`` float64 each);
- ``proxy``: the least-squares probe accuracy with the native head;
- ``proxy_knn``: the same with a k-NN head (fitted on the network's probe outputs, held out).

Tensors are counted by a ``TorchDispatchMode`` (CPU tensors escape tracemalloc): each new,
non-view output counts from its op until it is freed. Prints one JSON object per probe size
and writes them, with each reader's peak at the largest probe over its peak at the smallest, to
benchmarks/results/probe_memory.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import weakref
from pathlib import Path

import timm
import torch
from provenance import commit
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from stitch_nas.activations import ActivationCache, StitchContext
from stitch_nas.config import AdapterSpec, Fragment, HeadSpec, StitchConfig
from stitch_nas.data import DataSplits, Split
from stitch_nas.stitching import build, probe_accuracy
from stitch_nas.zoo import InputSpec, Zoo, ZooEntry


class PeakTensorBytes(TorchDispatchMode):
    """The most bytes of tensors alive at once among those ops make under this mode."""

    def __init__(self) -> None:
        super().__init__()
        self.now = self.peak = 0

    def _free(self, size: int) -> None:
        self.now -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if all(r.alias_info is None for r in func._schema.returns):
            for tensor in tree_leaves(out):
                if isinstance(tensor, torch.Tensor):
                    size = tensor.untyped_storage().nbytes()
                    self.now += size
                    self.peak = max(self.peak, self.now)
                    weakref.finalize(tensor, self._free, size)
        return out


def _split(n: int, classes: int, side: int, seed: int) -> Split:
    g = torch.Generator().manual_seed(seed)
    return Split(torch.rand(n, 3, side, side, generator=g), torch.arange(n) % classes)


def _context(probe: int, classes: int, side: int) -> StitchContext:
    labels = tuple(str(i) for i in range(classes))
    spec = InputSpec(size=(side, side), mean=(0.5,) * 3, std=(0.5,) * 3)
    zoo = Zoo()
    for seed, name in enumerate(("a", "b")):
        torch.manual_seed(seed)
        model = timm.create_model("test_resnet", pretrained=False, num_classes=classes)
        zoo.add(ZooEntry(name, model.eval(), spec, labels, source="timm:test_resnet"))
    splits = [_split(n, classes, side, seed) for seed, n in enumerate((64, probe, 64, 64))]
    data = DataSplits(*splits, label_names=labels, name=f"random{probe}")
    return StitchContext(zoo, data, batch_size=64, cache=ActivationCache(memory_gb=2.0))


READERS = ("fit", "fit_trained", "cka", "proxy", "proxy_knn")


def _peak(run) -> int:  # type: ignore[no-untyped-def]
    with PeakTensorBytes() as mode:
        run()
    return mode.peak


def measure(probe: int, classes: int, side: int) -> dict[str, object]:
    ctx = _context(probe, classes, side)
    src, dst = ctx.cuts("a")[1], ctx.cuts("b")[1]
    frags = (Fragment("a", None, src.name), Fragment("b", dst.name, None))
    config = StitchConfig(frags, (AdapterSpec(),))
    steps = {"loss": "match", "steps": 4, "eval_every": 2, "batch_size": 32, "patience": 0}
    trained = StitchConfig(frags, (AdapterSpec("conv3x3", steps),))
    knn = StitchConfig(frags, (AdapterSpec(),), HeadSpec("knn"))
    for model in ("a", "b"):  # every cut of both models in the cache first
        for _ in ctx.activation_batches(model, None, "probe"):
            pass
    out: dict[str, object] = {"probe": probe, "classes": classes}
    out["fit"] = _peak(lambda: build(ctx, config))
    out["fit_trained"] = _peak(lambda: build(ctx, trained))
    out["cka"] = _peak(lambda: ctx.joint_cka("a", src.name, "b", dst.name))
    out["proxy"] = _peak(lambda: probe_accuracy(ctx, config))
    out["proxy_knn"] = _peak(lambda: probe_accuracy(ctx, knn))
    out["proxy_accuracy"] = probe_accuracy(ctx, config).accuracy
    out["proxy_knn_accuracy"] = probe_accuracy(ctx, knn).accuracy
    out["probe_activation_bytes"] = sum(
        probe * 4 * torch.Size(cut.shape).numel() for cut in (src, dst)
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", type=int, nargs="+", default=[256, 2000])
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--side", type=int, default=32)
    args = parser.parse_args()
    rows = []
    for probe in args.probes:
        rows.append(measure(probe, args.classes, args.side))
        print(json.dumps(rows[-1]), flush=True)
    small, large = rows[0], rows[-1]
    record = {
        "machine": f"{platform.machine()}, torch {torch.__version__}",
        "classes": args.classes,
        "side": args.side,
        "rows": rows,
        "peak_ratio_largest_over_smallest": {
            reader: round(int(large[reader]) / int(small[reader]), 3)  # type: ignore[call-overload]
            for reader in READERS
        },
        "commit": commit(),
    }
    results = Path(__file__).parent / "results" / "probe_memory.json"
    results.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
