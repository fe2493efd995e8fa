"""Does fine-tuning from a zoo-ensemble teacher lift stitched networks past the strong models?

    python benchmarks/finetune.py [--settings examples/realzoo.yaml] [--device cuda]
                                  [--networks 12] [--epochs 15] [--lr 0.01] [--out FILE]
                                  [--train-on train|val] [--judge val|train]

On ``../shared/realzoo`` (or ``REALZOO=...``), with the preset's splits (probe and train from
the 10k train subset, validation and test the two halves of the CIFAR-10 test set):

1. every zoo model measured on validation and test;
2. the depth-matched stitches between every ordered pair of strong zoo models (validation
   accuracy >= ``--strong``): the first model up to the cut nearest a relative depth (its
   share of the model's MACs) of 1/4, 1/2 or 3/4, a least-squares stitch, then the second
   model from the cut nearest the same relative depth (SN-Net's observation: stitches between
   models of one kind interpolate their accuracy and cost), each measured on validation;
3. the ``--networks`` best of them on validation (the Pareto front of accuracy against MACs
   first, then the most accurate) fine-tuned by :func:`stitch_nas.finetune.finetune` with the
   recipe given, from the ensemble of the ``k`` best zoo models on validation;
4. the control: every strong zoo model fine-tuned with the identical recipe;
5. test accuracy (95 % Wilson interval) of everything, hypervolumes on test at reference
   accuracies 0.70, 0.80 and 0.90 (the box up to 1.1 x the costliest zoo model's MACs) for the
   zoo, zoo + stitched before and after fine-tuning, and the same against the fine-tuned zoo;
   and the claims of issue #33: a stitched network more accurate than every zoo model (lower
   end of its interval above the best zoo model's test accuracy), and stitched networks that
   dominate a zoo model of >= 91.5 % test accuracy under the interval rule.

Each epoch is judged on the validation split (``--judge val``, the stage's default) or, as
the results files before 2026-11-29 were, on a tenth of the train split (``--judge train``).
Validation chose every network here; only test figures are claims. Writes
benchmarks/results/finetune_<device type>.json.

``--train-on val`` trains on the validation half instead of the train split, early-stopping on
a slice of it: images no zoo model was trained on (every public CIFAR-10 model here was trained
on the CIFAR-10 training images the train split and its held-out slice come from, so there the
zoo's models and the teacher are nearly always right and the slice flatters every starting
network). The
candidates, the teacher's members and the strong models are chosen on validation before any
training, and the figures after training are test figures only: a diagnostic of whether unseen
training images lift the networks, not a way to run the stage. Writes
finetune_<device type>_train_on_val.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stitch_nas.activations import ActivationCache, StitchContext
from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from stitch_nas.finetune import FinetuneRecipe, finetune, make_teacher
from stitch_nas.pipeline import load_data, load_zoo
from stitch_nas.report import accuracy_on, hypervolume, wilson_interval
from stitch_nas.settings import load_settings
from stitch_nas.stitching import build, fragment_macs, model_macs

ROOT = Path(__file__).resolve().parents[1]
DEPTHS = (0.25, 0.5, 0.75)
FLOORS = (0.70, 0.80, 0.90)
STRONG_ZOO = 0.915  #: "a zoo ResNet with >= 91.5 % test accuracy"


def _cut_at(ctx: StitchContext, model: str, depth: float) -> str:
    """The cut of ``model`` whose prefix holds the share of its MACs nearest ``depth``."""
    total = model_macs(ctx, model)
    cuts = [c for c in ctx.cuts(model) if c.layout != "nc"]  # image or token maps only
    return min(
        cuts, key=lambda c: abs(fragment_macs(ctx, model, None, c.name) / total - depth)
    ).name


def depth_matched(ctx: StitchContext, models: list[str]) -> list[StitchConfig]:
    """Least-squares stitches A[input:a] -> B[b:output] at matching relative depths."""
    configs = []
    for a in models:
        for b in models:
            if a == b:
                continue
            for depth in DEPTHS:
                configs.append(
                    StitchConfig(
                        (
                            Fragment(a, None, _cut_at(ctx, a, depth)),
                            Fragment(b, _cut_at(ctx, b, depth), None),
                        ),
                        (AdapterSpec("lstsq"),),
                    )
                )
    return list(dict.fromkeys(configs))


def _on_front(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    def beaten(r: dict[str, Any]) -> bool:
        return any(
            o[key] >= r[key]
            and o["macs"] <= r["macs"]
            and (o[key] > r[key] or o["macs"] < r["macs"])
            for o in rows
        )

    return sorted((r for r in rows if not beaten(r)), key=lambda r: r["macs"])


def _hv(rows: list[dict[str, Any]], floor: float, max_macs: float) -> float:
    points = np.asarray([(r["test"], r["macs"]) for r in rows], dtype=float).reshape(-1, 2)
    box = (1.0 - floor) * max_macs
    return hypervolume(points, ["maximize", "minimize"], [floor, max_macs]) / box


def _test_row(ctx: StitchContext, net: Any, n_test: int) -> dict[str, Any]:
    test = accuracy_on(ctx, net, "test")
    return {"test": test, "interval": [round(x, 4) for x in wilson_interval(test, n_test)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default=str(ROOT / "examples" / "realzoo.yaml"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--networks", type=int, default=12)
    parser.add_argument("--strong", type=float, default=0.90, help="zoo models paired")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--opt", default="sgd", help="a timm optimizer")
    parser.add_argument("--train", default="all")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--ce-weight", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--patience", type=int, default=3)
    parser.add_argument("--no-control", action="store_true")
    parser.add_argument("--train-on", choices=("train", "val"), default="train")
    parser.add_argument(
        "--judge",
        choices=("val", "train"),
        default="val",
        help="the split that scores each epoch (the results files before 2026-11-29: train)",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    start = time.perf_counter()
    recipe = FinetuneRecipe(
        train=args.train,
        k=args.k,
        epochs=args.epochs,
        lr=args.lr,
        opt=args.opt,
        ce_weight=args.ce_weight,
        batch_size=args.batch_size,
        patience=args.patience,
        # trained on validation images, epochs are judged on a slice of those (as before)
        judge="train" if args.train_on == "val" else args.judge,
        holdout=0.1 if args.train_on == "val" or args.judge == "train" else 1.0,
    )
    settings = load_settings(args.settings)
    data = load_data(settings.data)
    zoo = load_zoo(settings.zoo, data)
    ctx = StitchContext(zoo, data, device=args.device, cache=ActivationCache(memory_gb=4.0))
    n_test = len(ctx.labels("test"))
    say = lambda text: print(text, flush=True)  # noqa: E731

    zoo_rows = []
    for name in zoo.names():
        net = build(ctx, StitchConfig.single(name))
        row = {"name": name, "kind": "zoo model", "macs": float(model_macs(ctx, name))}
        row["val"] = accuracy_on(ctx, net, "val")
        row.update(_test_row(ctx, net, n_test))
        zoo_rows.append(row)
        say(f"zoo {name}: val {row['val']:.4f} test {row['test']:.4f} {row['macs'] / 1e6:.1f} M")
    val_acc = {r["name"]: r["val"] for r in zoo_rows}
    teacher = make_teacher(zoo, recipe.teacher, recipe.k, recipe.temperature, val_acc)
    say(f"teacher: {teacher.describe()}")

    strong = [r["name"] for r in zoo_rows if r["val"] >= args.strong]
    candidates = []
    for config in depth_matched(ctx, strong):
        net = build(ctx, config)
        candidates.append(
            {
                "config": config,
                "kind": "stitched",
                "macs": float(
                    fragment_macs(ctx, config.fragments[0].model, None, config.fragments[0].end)
                    + fragment_macs(ctx, config.fragments[1].model, config.fragments[1].start, None)
                ),
                "val": accuracy_on(ctx, net, "val"),
            }
        )
    say(f"{len(candidates)} depth-matched stitches of {len(strong)} strong models measured")
    front = _on_front(candidates, "val")
    rest = sorted((c for c in candidates if c not in front), key=lambda c: -c["val"])
    chosen = (front + rest)[: args.networks]

    # the same zoo, validation split and test split; only the images it trains on change
    train_ctx = (
        StitchContext(
            zoo,
            dataclasses.replace(data, train=data.val),
            device=args.device,
            cache=ActivationCache(memory_gb=4.0),
        )
        if args.train_on == "val"
        else ctx
    )

    def tuned(config: StitchConfig, kind: str, base: dict[str, Any]) -> dict[str, Any]:
        net = build(ctx, config)
        before = _test_row(ctx, net, n_test)
        out, report = finetune(train_ctx, net, teacher, recipe, progress=None)
        row = {
            "config": config.describe(),
            "kind": kind,
            "macs": base["macs"],
            "val_before": base["val"],
            "test_before": before["test"],
            "interval_before": before["interval"],
            # trained on validation: its accuracy there is no measurement of anything
            "val": accuracy_on(ctx, out, "val") if args.train_on == "train" else None,
            **_test_row(ctx, out, n_test),
            "finetune": {k: v for k, v in report.to_dict().items() if k != "recipe"},
        }
        say(
            f"{kind} {config.describe()}: test {row['test_before']:.4f} -> {row['test']:.4f} "
            f"(held-out {report.initial_holdout:.4f} -> {report.best_holdout:.4f}, epoch "
            f"{report.best_epoch}/{report.epochs}, {report.seconds:.0f} s)"
        )
        return row

    stitched = [tuned(c["config"], "stitched", c) for c in chosen]
    control = []
    if not args.no_control:
        for r in zoo_rows:
            if r["name"] in strong:
                control.append(
                    {"name": r["name"], **tuned(StitchConfig.single(r["name"]), "zoo model", r)}
                )

    before = [dict(r, test=r["test_before"], interval=r["interval_before"]) for r in stitched]
    zoo_tuned = [next((c for c in control if c["name"] == r["name"]), r) for r in zoo_rows]
    max_macs = 1.1 * max(r["macs"] for r in zoo_rows)
    best_zoo = max(r["test"] for r in zoo_rows)
    best_zoo_tuned = max(r["test"] for r in zoo_tuned)

    def claims(
        rows: list[dict[str, Any]], against: list[dict[str, Any]], best: float
    ) -> dict[str, Any]:
        return {
            "more_accurate_than_every_zoo_model": [
                r["config"] for r in rows if r["interval"][0] > best
            ],
            "dominate_strong_zoo_models": [
                {
                    "network": r["config"],
                    "zoo_model": z["name"],
                    "margin": round(r["interval"][0] - z["test"], 4),
                }
                for r in rows
                for z in against
                if z["test"] >= STRONG_ZOO
                and r["macs"] <= z["macs"]
                and r["interval"][0] > z["test"]
            ],
        }

    hv = {}
    for floor in FLOORS:
        zoo_hv = _hv(zoo_rows, floor, max_macs)
        tuned_hv = _hv(zoo_tuned, floor, max_macs)
        hv[f"{floor:.2f}"] = {
            "zoo": round(zoo_hv, 4),
            "zoo_and_stitched_before": round(_hv(zoo_rows + before, floor, max_macs), 4),
            "zoo_and_stitched_after": round(_hv(zoo_rows + stitched, floor, max_macs), 4),
            "zoo_finetuned": round(tuned_hv, 4),
            "zoo_finetuned_and_stitched_after": round(
                _hv(zoo_tuned + stitched, floor, max_macs), 4
            ),
            "gain_after_vs_zoo": round(_hv(zoo_rows + stitched, floor, max_macs) / zoo_hv - 1, 4)
            if zoo_hv
            else None,
        }
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    record = {
        "command": "python benchmarks/finetune.py "
        + " ".join(
            f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
            for k, v in vars(args).items()
            if k not in ("out", "settings") and v is not False
        ),
        "recipe": recipe.to_dict(),
        "trained_on": args.train_on,
        "teacher": teacher.describe(),
        "test_images": n_test,
        "zoo": zoo_rows,
        "candidates": len(candidates),
        "stitched_after": stitched,
        "zoo_finetuned": control,
        "hypervolume_test": hv,
        "claims_against_zoo": claims(stitched, zoo_rows, best_zoo),
        "claims_against_finetuned_zoo": claims(stitched, zoo_tuned, best_zoo_tuned),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "machine": {
            "device": torch.cuda.get_device_name()
            if args.device.startswith("cuda")
            else platform.processor(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"),
            "commit": commit or None,
        },
    }
    out = (
        Path(args.out)
        if args.out
        else ROOT / "benchmarks" / "results" / f"finetune_{torch.device(args.device).type}"
        f"{'_train_on_val' if args.train_on == 'val' else ''}.json"
    )
    out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    say(
        json.dumps(
            {
                "hypervolume_test": hv,
                "claims_against_zoo": record["claims_against_zoo"],
                "claims_against_finetuned_zoo": record["claims_against_finetuned_zoo"],
            },
            indent=1,
        )
    )
    say(f"wrote {out} in {record['wall_seconds']} s")


if __name__ == "__main__":
    main()
