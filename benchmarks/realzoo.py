"""The development zoo searched the way the README recommends, judged on the held-out test half.

    python benchmarks/realzoo.py [--settings examples/realzoo.yaml] [--out runs/realzoo-bench]
                                 [--trials N] [--resume] [--seed N] [--finetune]
                                 [--set SECTION.KEY=VALUE ...]

Runs ``stitch-nas search SETTINGS --out OUT`` as a user would (its own process, wall time and
peak memory measured), then reads the finished study: every front network and every zoo model
was re-measured on the test split by the search itself. Reported, on test accuracy only:

- normalised hypervolume of the zoo alone and of zoo + front, with the reference point at
  accuracy 0.70 and 1.1 x the largest zoo model's MACs (networks below 70 % add nothing), in the
  box from there to (accuracy 1, 0 MACs);
- the networks on the combined front of zoo + front, each with its kind (``stitched``, ``new
  head``, ``new stem``, ``zoo model``: only ``stitched`` networks count as stitched), test
  accuracy with its 95 % Wilson interval, MACs and config;
- the zoo models a stitched network strictly dominates under the report's rule (lower end of
  its interval above the zoo model's test accuracy, at no more MACs), and by how much;
- ``headroom_at``: at reference accuracies 0.80 and 0.90, the zoo front's interpolation headroom
  (the area between its staircase and the lines joining adjacent front models, in accuracy x
  decades of MACs: :func:`stitch_nas.report.interpolation_headroom`), the part the stitched
  networks recover, its share, and each gap's.

``train_images`` is the train split's size (adapters and fine-tunes train on it).

Writes benchmarks/results/realzoo.json; with ``--seed N`` (the search's seed instead of the
settings file's, and with ``--finetune`` the fine-tune recipe's too) realzoo_seedN.json. Needs
``../shared/realzoo`` (or ``REALZOO=...``).

With ``--finetune`` the search runs its fine-tune stage with the control on (the settings'
``finetune:`` section says how; ``control`` is forced on, a list of names kept) and writes
realzoo_finetune_seedN.json: the figures above for the networks after fine-tuning, plus
``before_finetune`` (the same without the fine-tuned trials) and ``zoo_finetuned`` (against the
zoo's front, and any models the control names, fine-tuned alike), each
with hypervolumes at reference accuracy 0.70, 0.80 and 0.90, and ``finetune_seconds`` (the
stage's wall time) with ``finetuned``: per network and control model the split that judged it,
epochs run, optimizer steps, images seen, seconds, validation accuracy before and after (none
before for a network started from a trial the fidelity gate pruned), the judging split's
accuracy before the first epoch and of the weights kept, and ``kept_start``; the top-level
``kept_start`` counts the networks and the control's models that kept their starting weights.

``--set`` changes one setting of the copy that runs (recorded as ``overrides``), e.g. on a GPU:
``--set search.device=auto --set search.export=false --set finetune.recipe.epochs=15``; all
50,000 CIFAR-10 training images as the train split: ``--set "data.splits.train={file:
cifar10_train.npz}"``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from stitch_nas import attrs
from stitch_nas.pipeline import load_data
from stitch_nas.report import (
    first_of_each_network,
    holdout_accuracies,
    hypervolume,
    interpolation_headroom,
    wilson_interval,
    zoo_references,
)
from stitch_nas.report._holdout import split_sizes
from stitch_nas.report._kinds import recorded_kinds, trial_kind
from stitch_nas.search import load_folder_study
from stitch_nas.settings import load_settings

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "realzoo.json"
FLOOR = 0.70  #: the reference accuracy: networks below it add no hypervolume
FLOORS = (0.70, 0.80, 0.90)  #: with --finetune, hypervolumes at each
HEADROOM_AT = (0.80, 0.90)  #: reference accuracies of the interpolation headroom


def overrides_from(pairs: list[str]) -> dict[str, Any]:
    """``--set section.key=value`` pairs as {dotted key: YAML value}; a malformed one stops."""
    parsed = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or "." not in key:
            raise SystemExit(f"--set {pair!r}: expected section.key=value, e.g. search.device=auto")
        parsed[key] = yaml.safe_load(value)
    return parsed


def _seeds_set(seed: int, finetune: bool, overrides: dict[str, Any]) -> str:
    """The seeds ``--seed`` set, as ``settings_copy`` sets them, for the record's command."""
    recipe = finetune and "finetune.recipe.seed" not in overrides
    return f"search.seed: {seed}" + (f", finetune.recipe.seed: {seed}" if recipe else "")


def settings_copy(
    settings: str, seed: int | None, finetune: bool, overrides: dict[str, Any] | None = None
) -> Path:
    """A copy of ``settings`` with ``search.seed`` set (and, with ``finetune``, the recipe's
    seed, unless ``overrides`` set it: the stage's training is seeded by the recipe, so seeds
    that choose the same network would otherwise train it alike), the fine-tune control on and
    ``overrides`` applied, beside it (its paths are relative to it)."""
    raw = yaml.safe_load(Path(settings).read_text())
    for dotted, value in (overrides or {}).items():
        *sections, key = dotted.split(".")
        node = raw
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = value
    if seed is not None:
        raw.setdefault("search", {})["seed"] = seed
    if finetune:
        raw.setdefault("finetune", {})["enabled"] = True
        raw["finetune"]["control"] = raw["finetune"].get("control") or True  # a list stays
        if seed is not None and "finetune.recipe.seed" not in (overrides or {}):
            raw["finetune"].setdefault("recipe", {})["seed"] = seed
    copy = Path(settings).with_name(f".{Path(settings).stem}.seed{seed}.finetune{finetune:d}.yaml")
    copy.write_text(yaml.safe_dump(raw, sort_keys=False))
    return copy


def _run(args: argparse.Namespace) -> tuple[float, float]:
    """Run the search as a user would; returns (wall seconds, peak RSS of the search in GB)."""
    command = [str(Path(sys.executable).with_name("stitch-nas")), "search", args.settings]
    command += ["--out", args.out]
    if args.trials:
        command += ["--trials", str(args.trials)]
    if args.resume:
        command.append("--resume")
    print("$ stitch-nas", " ".join(command[1:]), flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True)
    seconds = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return seconds, peak_kb / 2**20


def _points(rows: list[dict[str, Any]]) -> np.ndarray:
    return np.asarray([(r["test_accuracy"], r["macs"]) for r in rows], dtype=float).reshape(-1, 2)


def _normalised_hv(rows: list[dict[str, Any]], max_macs: float, floor: float = FLOOR) -> float:
    box = (1.0 - floor) * max_macs
    return hypervolume(_points(rows), ["maximize", "minimize"], [floor, max_macs]) / box


def _on_front(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def beaten(r: dict[str, Any]) -> bool:
        return any(
            o["test_accuracy"] >= r["test_accuracy"]
            and o["macs"] <= r["macs"]
            and (o["test_accuracy"] > r["test_accuracy"] or o["macs"] < r["macs"])
            for o in rows
        )

    return sorted((r for r in rows if not beaten(r)), key=lambda r: r["macs"])


def finetune_costs(out: str) -> dict[str, Any]:
    """What the fine-tune stage spent and bought, per network it trained."""
    study = load_folder_study(out)
    phases = study.user_attrs.get(attrs.PHASES) or {}
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    tested = holdout_accuracies(study)
    rows = []

    def row(
        source: int | str,
        before: float | None,
        after: float | None,
        report: dict,
        trial: Any = None,
    ) -> None:
        rows.append(
            {
                "source": source,
                # the fine-tuned network's trial, MACs and test accuracy (when the test pass
                # measured it: it stood on a front)
                "trial": None if trial is None else trial.number,
                "macs": None if trial is None else trial.user_attrs.get("macs"),
                "test_accuracy": None if trial is None else tested.get(trial.number),
                "judged_on": report.get("judged_on", "train"),
                "epochs": report["epochs"],
                "steps": report["steps"],
                "images_seen": report.get("images_seen"),  # not recorded before it was
                "seconds": round(report["seconds"], 1),
                "stopped": report["stopped"],
                "val_before": before,
                "val_after": after,
                # what the judging split (all of validation by default) scored before the
                # first epoch and for the weights kept: a network started from a trial the
                # fidelity gate pruned has no whole-split validation figure of its own
                "judged_before": report["initial_holdout"],
                "judged_after": report["best_holdout"],
                "kept_start": report["best_epoch"] == 0,
            }
        )

    for t in by_number.values():
        if attrs.FINETUNES in t.user_attrs:
            source = by_number[t.user_attrs[attrs.FINETUNES]]
            kept = t.state.name == "COMPLETE"
            row(
                source.number,
                source.user_attrs.get("accuracy"),
                t.user_attrs.get("accuracy") if kept else source.user_attrs.get("accuracy"),
                t.user_attrs[attrs.FINETUNED]["report"],
                t,
            )
    refs = {r["name"]: r.get("accuracy") for r in study.user_attrs.get(attrs.REFERENCES) or []}
    for name, entry in (study.user_attrs.get(attrs.FINETUNE_CONTROL) or {}).items():
        row(name, refs.get(name), entry.get("accuracy"), entry["finetuned"]["report"])
    stitched = [r for r in rows if r["trial"] is not None]
    return {
        "finetune_seconds": (phases.get("fine-tune") or {}).get("seconds"),
        "finetuned": rows,
        # how many of the stage's networks, and of the control's models, kept their start
        "kept_start": {
            "networks": sum(r["kept_start"] for r in stitched),
            "of_networks": len(stitched),
            "control": sum(r["kept_start"] for r in rows if r["trial"] is None),
            "of_control": len(rows) - len(stitched),
        },
    }


def evaluate(
    out: str, *, finetuned: bool = True, control: bool = False, floors: tuple[float, ...] = ()
) -> dict[str, Any]:
    """The benchmark's figures from a finished search folder.

    ``finetuned``: with the fine-tune stage's networks (False: as before the stage);
    ``control``: the zoo's models at their fine-tuned test accuracy where the control trained
    them; ``floors``: also hypervolumes at these reference accuracies (``hv_at``).
    """
    study = load_folder_study(out)
    tuned = {
        name: float(entry[attrs.TEST_ACCURACY])
        for name, entry in (study.user_attrs.get(attrs.FINETUNE_CONTROL) or {}).items()
    }
    n_test = int(split_sizes(study).get("test") or 0)
    tested = holdout_accuracies(study)
    zoo = [
        {
            "name": r["name"],
            "kind": "zoo model",
            "test_accuracy": tuned.get(r["name"], float(r[attrs.TEST_ACCURACY]))
            if control
            else float(r[attrs.TEST_ACCURACY]),
            "macs": float(r["macs"]),
        }
        for r in zoo_references(study)
    ]
    trials = {t.number: t for t in study.trials}
    kinds = recorded_kinds(study)
    front = []
    for t in first_of_each_network([trials[n] for n in tested if n in trials]):
        if not finetuned and attrs.FINETUNES in t.user_attrs:
            continue
        front.append(
            {
                "trial": t.number,
                "kind": trial_kind(t, kinds) or "kind unknown",
                "test_accuracy": float(tested[t.number]),
                "val_accuracy": float(t.user_attrs["accuracy"]),
                "macs": float(t.user_attrs["macs"]),
                "config": t.user_attrs.get(attrs.DESCRIBE, ""),
                "finetunes": t.user_attrs.get(attrs.FINETUNES),
            }
        )
    max_macs = 1.1 * max(r["macs"] for r in zoo)
    combined = _on_front(zoo + front)
    dominated = []
    for z in zoo:
        for r in front:
            low = wilson_interval(r["test_accuracy"], n_test)[0]
            if r["kind"] == "stitched" and r["macs"] <= z["macs"] and low > z["test_accuracy"]:
                margin = round(low - z["test_accuracy"], 4)
                dominated.append({"zoo_model": z["name"], "by_trial": r["trial"], "margin": margin})
    stitched = [r for r in front if r["kind"] == "stitched"]
    with_zoo = _on_front(zoo + stitched)
    for r in combined + with_zoo:  # the networks the figures quote (a row may be on both)
        r["interval"] = [round(x, 4) for x in wilson_interval(r["test_accuracy"], n_test)]
    hv_zoo = _normalised_hv(zoo, max_macs)
    hv_all = _normalised_hv(zoo + front, max_macs)
    hv_stitched = _normalised_hv(zoo + stitched, max_macs)

    def counted(rows: list[dict[str, Any]]) -> int:
        return sum(r["kind"] == "stitched" and r["test_accuracy"] >= FLOOR for r in rows)

    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    return {
        "test_images": n_test,
        "reference_point": {"accuracy": FLOOR, "macs": max_macs},
        "hv_zoo": round(hv_zoo, 4),
        "hv_zoo_and_front": round(hv_all, 4),
        "hv_zoo_and_stitched": round(hv_stitched, 4),
        "hv_gain_stitched": round(hv_stitched - hv_zoo, 4),
        "stitched_on_front_with_zoo_at_70": counted(with_zoo),
        "stitched_on_combined_front_at_70": counted(combined),
        "stitched_front_with_zoo": with_zoo,
        "combined_front": combined,
        "zoo_dominated": dominated,
        "trials": len(study.trials),
        "complete": len(done),
        "pruned": sum(t.state.name == "PRUNED" for t in study.trials),
        "zoo": zoo,
        "trials_by_macs": _trials_by_macs(study, zoo),
        "hv_at": {
            str(floor): {
                "zoo": round(_normalised_hv(zoo, max_macs, floor), 4),
                "zoo_and_stitched": round(_normalised_hv(zoo + stitched, max_macs, floor), 4),
                "zoo_and_front": round(_normalised_hv(zoo + front, max_macs, floor), 4),
            }
            for floor in floors
        },
        "headroom_at": {
            str(reference): _headroom(zoo, stitched, reference) for reference in HEADROOM_AT
        },
    }


def _headroom(
    zoo: list[dict[str, Any]], stitched: list[dict[str, Any]], reference: float
) -> dict[str, Any]:
    """The zoo front's interpolation headroom at ``reference`` and what ``stitched`` recovers."""
    h = interpolation_headroom(
        [(r["test_accuracy"], r["macs"]) for r in zoo],
        [(r["test_accuracy"], r["macs"]) for r in stitched],
        reference,
    )
    share = h.recovered_share
    return {
        "headroom": round(h.headroom, 5),
        "recovered": round(h.recovered, 5),
        "recovered_share": None if share is None else round(share, 4),
        "gaps": [
            {
                "from_macs": g.low_macs,
                "to_macs": g.high_macs,
                "headroom": round(g.headroom, 5),
                "recovered": round(g.recovered, 5),
            }
            for g in h.gaps
        ],
    }


def _gpu() -> str | None:
    """The GPU the search could use (``device: auto``), or None."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def _budget(settings: str, trials: int) -> dict[str, Any]:
    """The settings that decide the run's cost, as the search reads them."""
    raw = yaml.safe_load(Path(settings).read_text())
    search, finetune = raw.get("search", {}), raw.get("finetune", {})
    train = load_data(load_settings(settings).data).train
    keys = ("trials", "seed_trials", "seed_pool", "refine_trials")
    return {
        **{key: search.get(key) for key in keys},
        **({"trials": trials} if trials else {}),
        "val_images": raw.get("data", {}).get("splits", {}).get("val", {}).get("count"),
        "train_images": None if train is None else len(train),
        "finetune_networks": finetune.get("networks"),
        "finetune_recipe": finetune.get("recipe"),
    }


def _trials_by_macs(study: Any, zoo: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """How much of the trial budget went to each MACs range between the zoo's models: the
    search's own trials (not zoo references, repeats or fine-tunes), complete or pruned."""
    edges = sorted({r["macs"] for r in zoo})
    names = {m: ", ".join(r["name"] for r in zoo if r["macs"] == m) for m in edges}
    ranges = [(0.0, edges[0])] + list(zip(edges, edges[1:], strict=False)) + [(edges[-1], None)]
    rows = [
        {
            "from_macs": low,
            "below_macs": high,
            "between": f"{names.get(low, '0')} .. {names.get(high, 'beyond')}",
            "complete": 0,
            "pruned": 0,
        }
        for low, high in ranges
    ]
    skip = (attrs.REFERENCE_OF, attrs.DUPLICATE_OF, attrs.FINETUNES)
    for t in study.trials:
        if "macs" not in t.user_attrs or any(k in t.user_attrs for k in skip):
            continue
        macs = float(t.user_attrs["macs"])
        row = next(r for r in rows if r["below_macs"] is None or macs < r["below_macs"])
        state = t.state.name.lower()
        if state in row:
            row[state] += 1
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default=str(ROOT / "examples" / "realzoo.yaml"))
    parser.add_argument("--out", default=str(ROOT / "runs" / "realzoo-bench"))
    parser.add_argument("--trials", type=int, default=0, help="0: the settings file's number")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--evaluate-only", action="store_true", help="read a finished --out")
    parser.add_argument("--seed", type=int, default=None, help="the search's seed (sampler)")
    parser.add_argument(
        "--finetune", action="store_true", help="with the fine-tune stage and its control"
    )
    parser.add_argument("--results", default=None, help="where the JSON goes (default: above)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="change one setting of the copy that runs, e.g. finetune.recipe.epochs=15",
    )
    args = parser.parse_args()
    name = Path(args.settings).name
    overrides = overrides_from(args.set)
    results = RESULTS if args.seed is None else RESULTS.with_name(f"realzoo_seed{args.seed}.json")
    if args.finetune:
        results = RESULTS.with_name(f"realzoo_finetune_seed{args.seed or 0}.json")
    if args.results:
        results = Path(args.results)
    budget = _budget(args.settings, args.trials)
    seconds = peak_gb = None
    if not args.evaluate_only:
        copy = None
        if args.seed is not None or args.finetune or overrides:
            copy = settings_copy(args.settings, args.seed, args.finetune, overrides)
        try:
            if copy is not None:
                args.settings = str(copy)
                budget = _budget(args.settings, args.trials)
            seconds, peak_gb = _run(args)
        finally:
            if copy is not None:
                copy.unlink()
    record = {
        "command": f"stitch-nas search {name} --out {args.out}"
        + ("" if args.seed is None else f" ({_seeds_set(args.seed, args.finetune, overrides)})"),
        "budget": budget,
        "train_images": budget["train_images"],
        "overrides": overrides,
        "wall_seconds": None if seconds is None else round(seconds, 1),
        "peak_rss_gb": None if peak_gb is None else round(peak_gb, 2),
        "phases": load_folder_study(args.out).user_attrs.get(attrs.PHASES),
        **evaluate(args.out, floors=FLOORS if args.finetune else ()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "gpu": _gpu()},
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        # a copy of the tree on a lent GPU machine names its commit in the environment (its
        # .git, where it has one, may be older than the tree)
        "commit": os.environ.get("STITCH_NAS_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
    }
    if args.finetune:
        record["before_finetune"] = evaluate(args.out, finetuned=False, floors=FLOORS)
        record["zoo_finetuned"] = evaluate(args.out, control=True, floors=FLOORS)
        record.update(finetune_costs(args.out))
    results.write_text(json.dumps(record, indent=1) + "\n")
    print(
        f"hypervolume on test (ref. accuracy {FLOOR}): zoo {record['hv_zoo']}, zoo + stitched "
        f"{record['hv_zoo_and_stitched']} ({record['hv_gain_stitched']:+.4f}), zoo + front "
        f"{record['hv_zoo_and_front']}"
    )
    for key, count, what in (
        ("stitched_front_with_zoo", "stitched_on_front_with_zoo_at_70", "zoo + stitched networks"),
        ("combined_front", "stitched_on_combined_front_at_70", "zoo + every network measured"),
    ):
        print(f"{record[count]} stitched networks at >= {FLOOR} on the front of {what}, on test:")
        for r in record[key]:
            name = r.get("name") or f"#{r['trial']} {r['config']}"
            print(
                f"  {r['kind']:>9}  {r['test_accuracy']:.4f} {r['interval']}  {r['macs']:.3g}  "
                f"{name}"
            )


if __name__ == "__main__":
    main()
