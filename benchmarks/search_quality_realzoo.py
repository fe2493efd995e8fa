"""How close each search gets to the front of the real CIFAR-10 zoo's whole pairwise space.

    python benchmarks/search_quality_realzoo.py [--val 1000] [--workers 2] [--seeds 10]
        [--trials 50,100,200] [--methods random,tpe,...] [--candidates 8] [--from-table]
    python benchmarks/search_quality_realzoo.py --zoo digits --trials 47,94

The space: ``pairwise`` with least-squares stitches over the ten models of ``../shared/realzoo``
(``examples/realzoo.yaml``: two different models, one cut each, both directions; 16,290
configs), no budget. Accuracy on the first ``--val`` images of that file's validation split,
so a trial is cheap; the least-squares probe on its 256 probe images.

Stage 1, the table (once, resumable, ``--workers`` processes of one thread each, every one a
share of the configs): each config measured as a trial measures it (accuracy, MACs,
parameters) and its probe accuracy (the least-squares version is the config itself, so the
trial's network is the probe's). Written as JSON lines under ``--work`` and, whole,
gzipped beside the zoo's results file (``search_quality_realzoo_table.json.gz``) so anyone can
re-check the rest (``--from-table`` reads it back instead of measuring, and the seconds it
took and its ``--models`` from ``search_quality_realzoo.json``; ``--out`` writes stage 2
elsewhere, e.g. for another ``--candidates``).

Stage 2: every method at each ``--trials`` count over ``--seeds`` seeds. A trial reads the
table instead of measuring (least squares is deterministic: the same figures, none of the
time). As in the CLI's runner, a config already tried is a repeat that does not count, and
one whose probe accuracy is below 1.5 x chance is pruned (it counts; it is not on the front).

- ``random``, ``tpe``, ``gp``, ``nsga2``: Optuna's samplers with the CLI's options
  (:mod:`stitch_nas.samplers`; NSGA-II's generation a fifth of the trials, at least 8, and
  its mutation probability 0.1);
- ``seeded``: ``seed_trials: 8`` of a probe-scored pool of 32 random configs and the
  space's own proposals (``pairwise``'s end swaps, a quarter of the seeds at most;
  :func:`stitch_nas.search.seed_study`, its probe and costs read from the table), then TPE
  (``proxy_candidates: 1``);
- ``default``: what ``stitch-nas search`` does with its defaults: ``seeded`` with
  ``proxy_candidates: --candidates`` (8, the default; :class:`stitch_nas.search.ProxySampler`:
  TPE's proposals, the best by probe measured); its proxy cost is reported as probe scores
  per trial;
- ``default_no_ends``: ``default`` with the space option ``end_seeds: false`` (seeding from
  the random pool alone, as the CLI did before end swaps were proposed).

Reported: the hypervolume of each found front (accuracy up, MACs down; reference point
(reference accuracy, 1.1 x the largest MACs in the space)) as a fraction of the whole space's,
at reference accuracies 0.0, 0.8 and 0.9: each seed's, the median and range, and Mann-Whitney
U's one-sided p-value that a method's seeds lie above random sampling's (random runs first).
The zoo models on their own are not in it: the fractions are about what the search finds.
Writes
``results/search_quality_realzoo.json``. ``--zoo digits`` runs all of it on the demo's mini
zoo and digits splits instead (814 configs, the whole 300-image validation split; ``--val``
does not apply) and writes ``results/search_quality_digits.json``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import optuna

from stitch_nas import attrs

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "search_quality_realzoo.json"
DIGITS_RESULTS = RESULTS.with_name("search_quality_digits.json")
DIRECTIONS = ("maximize", "minimize")
METHODS = ("random", "tpe", "nsga2", "gp", "seeded", "default", "default_no_ends")
REFERENCES = (0.0, 0.8, 0.9)
PROBE_THRESHOLD = 1.5  # times chance: the CLI's default


def _paths(zoo: str) -> tuple[Path, Path]:
    """The zoo's results file, and its table beside it."""
    results = DIGITS_RESULTS if zoo == "digits" else RESULTS
    return results, results.with_name(f"{results.stem}_table.json.gz")


def _context(zoo: str, val: int):
    from stitch_nas.activations import ActivationCache, StitchContext
    from stitch_nas.pipeline import load_data, load_zoo
    from stitch_nas.settings import load_settings

    if zoo == "digits":  # the demo's: the embedded mini zoo on its whole 300-image split
        from stitch_nas.data import load_digits_splits
        from stitch_nas.zoo import load_mini_zoo

        digits = load_digits_splits()
        return StitchContext(load_mini_zoo(digits), digits)
    settings = load_settings(ROOT / "examples" / "realzoo.yaml")
    splits = dict(settings.data.splits)
    splits["val"] = {**splits["val"], "count": val}
    data = load_data(replace(settings.data, splits=splits))
    zoo = load_zoo(settings.zoo, data)
    return StitchContext(zoo, data, cache=ActivationCache(memory_gb=6.0))


def _configs(ctx, models: list[str]) -> list:
    sys.path.insert(0, str(Path(__file__).parent))
    from search_quality import enumerate_pairwise

    return enumerate_pairwise(ctx, models or sorted(ctx.zoo.names()))


def measure_share(zoo: str, val: int, models: list[str], part: int, parts: int, out: Path) -> None:
    """Measure every ``parts``-th config from ``part`` into ``out`` (JSON lines), skipping
    those already there."""
    import torch

    from stitch_nas.search import evaluate_config

    torch.set_num_threads(1)
    ctx = _context(zoo, val)
    done = (
        {json.loads(line)["key"] for line in out.read_text().splitlines()}
        if out.exists()
        else set()
    )
    with out.open("a") as f:
        for i, config in enumerate(_configs(ctx, models)):
            key = config.stable_hash()
            if i % parts != part or key in done:
                continue
            # a threshold just above 0 makes the trial score the probe (and keep nothing out)
            outcome = evaluate_config(ctx, config, probe_threshold=1e-9)
            m = outcome.measurement
            if outcome.status != "complete" or m is None:
                raise SystemExit(f"{config.describe()} did not measure: {outcome.reason}")
            row = {
                "key": key,
                "config": config.to_dict(),
                "accuracy": m.accuracy,
                "macs": m.macs,
                "params": m.params,
                "probe_accuracy": outcome.probe,
            }
            f.write(json.dumps(row) + "\n")
            f.flush()


def _models(args: argparse.Namespace) -> list[str]:
    return sorted(m for m in args.models.split(",") if m)


def build_table(args: argparse.Namespace) -> tuple[dict[str, dict], float]:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    shards = [work / f"table_{i}_of_{args.workers}.jsonl" for i in range(args.workers)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--zoo",
                args.zoo,
                "--val",
                str(args.val),
                "--models",
                args.models,
                "--share",
                str(i),
                str(args.workers),
                str(shard),
            ]
        )
        for i, shard in enumerate(shards)
    ]
    if any(p.wait() for p in procs):
        raise SystemExit("a share of the table failed; rerun to resume it")
    table = {}
    for shard in shards:
        for line in shard.read_text().splitlines():
            row = json.loads(line)
            table[row.pop("key")] = row
    return table, time.perf_counter() - start


# --- stage 2: searches that read the table -------------------------------------------------


class TableSearch:
    """One search over the table: the CLI runner's counting (repeats do not count, a probe
    below the threshold prunes), values read instead of measured."""

    def __init__(self, ctx, table: dict[str, dict], models: list[str]) -> None:
        from search_spaces import sample

        self.ctx, self.table, self.sample = ctx, table, sample
        self.options = {"models": models} if models else {}
        self.references: list[dict] | None = None  # the zoo measured once, as a study would
        self.floor = PROBE_THRESHOLD / ctx.num_classes

    def config(self, trial: optuna.Trial):
        return self.sample("pairwise", trial, self.ctx, **self.options)

    def run(self, study: optuna.Study, n: int) -> list[tuple[float, float]]:
        seen: set[str] = set()
        points: list[tuple[float, float]] = []
        for _ in range(50 * n):
            if len(seen) >= n:
                break
            trial = study.ask()
            config = self.config(trial)
            key = config.stable_hash()
            row = self.table.get(key)
            if row is None or key in seen:  # a zoo model alone, or a repeat: does not count
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            seen.add(key)
            trial.set_user_attr("probe_accuracy", row["probe_accuracy"])
            if row["probe_accuracy"] < self.floor:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            points.append((row["accuracy"], row["macs"]))
            study.tell(trial, (row["accuracy"], row["macs"]))
        return points

    def seed(self, study: optuna.Study, count: int, pool: int, seed: int, options: dict) -> None:
        """:func:`stitch_nas.search.seed_study` as the CLI runs it, its probe and costs read
        from the table."""
        from stitch_nas.search import StitchObjective, _seeding, seed_study

        table = self.table

        def probe(ctx, config):
            return SimpleNamespace(
                accuracy=table[config.stable_hash()]["probe_accuracy"], net=config.stable_hash()
            )

        patched = {
            "probe_accuracy": probe,
            "network_macs": lambda ctx, key: table[key]["macs"],
            "count_params_of": lambda nets: table[nets[0]]["params"],
            "keep_probe_score": lambda *a: None,
        }
        if self.references is None:
            from stitch_nas.search._loop import measure_references

            self.references = measure_references(self.ctx)
        # the space's proposals read the zoo's accuracy from the study, as the CLI's does
        study.set_user_attr(attrs.REFERENCES, self.references)
        saved = {k: getattr(_seeding, k) for k in patched}
        for k, v in patched.items():
            setattr(_seeding, k, v)
        try:
            seed_study(
                study,
                StitchObjective(self.ctx, space_options={**self.options, **options}),
                count,
                seed=seed,
                pool=pool,
            )
        finally:
            for k, v in saved.items():
                setattr(_seeding, k, v)

    def proxy(self, base: optuna.samplers.BaseSampler, candidates: int, seed: int):
        """:func:`stitch_nas.search.proxy_sampler`'s rules on the table."""
        from stitch_nas.search import ProxySampler

        def score(trial):
            row = self.table.get(self.config(trial).stable_hash())
            if row is None or row["probe_accuracy"] < self.floor:
                return None
            return row["probe_accuracy"], float(row["macs"])

        def recorded(trial):
            probe = trial.user_attrs.get("probe_accuracy")
            return None if probe is None else (probe, trial.values[1])

        return ProxySampler(base, score, recorded=recorded, candidates=candidates, seed=seed)


def run_method(search: TableSearch, method: str, n: int, seed: int, candidates: int):
    from stitch_nas.samplers import make_sampler

    seeded = method in ("seeded", "default", "default_no_ends")
    # nsga2: the built-in's generation of a fifth of the trials and mutation probability 0.1
    sampler = make_sampler("tpe" if seeded else method, seed, trials=n)
    proxy = None
    if method.startswith("default") and candidates > 1:
        sampler = proxy = search.proxy(sampler, candidates, seed)
    study = optuna.create_study(directions=list(DIRECTIONS), sampler=sampler)
    if seeded:
        ends = {"end_seeds": method != "default_no_ends"}
        search.seed(study, min(8, n), 32, seed, ends)
    points = search.run(study, n)
    return points, (proxy.scored if proxy else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--zoo", choices=("realzoo", "digits"), default="realzoo", help="digits: the demo's"
    )
    parser.add_argument("--val", type=int, default=1000, help="realzoo: validation images")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--trials", default="50,100,200")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--models", default="", help="comma-separated zoo models (default: all)")
    parser.add_argument("--work", default=str(ROOT / "runs" / "search_quality_realzoo"))
    parser.add_argument("--out", default="", help=f"default {RESULTS.name}, {DIGITS_RESULTS.name}")
    parser.add_argument(
        "--from-table", action="store_true", help="read stage 1 from the zoo's *_table.json.gz"
    )
    parser.add_argument("--share", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.share:
        measure_share(
            args.zoo,
            args.val,
            _models(args),
            int(args.share[0]),
            int(args.share[1]),
            Path(args.share[2]),
        )
        return
    methods = [m for m in args.methods.split(",") if m]
    if set(methods) - set(METHODS):
        parser.error(f"--methods: use some of {', '.join(METHODS)}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    results_path, table_path = _paths(args.zoo)
    out_path = Path(args.out or results_path)
    if args.zoo == "digits":
        args.val = 0  # the split is the demo's, whole: --val does not apply
    if args.from_table:  # stage 2 alone, on the stored table
        with gzip.open(table_path, "rt") as f:
            stored = json.load(f)
        if stored["val_images"] != args.val:
            parser.error(f"--from-table: {table_path.name} holds --val {stored['val_images']}")
        table = stored["configs"]
        recorded = json.loads(results_path.read_text())
        table_seconds = recorded["table_seconds"]
        if not args.models:  # the table's models: seeding draws from them, as it did then
            args.models = ",".join(recorded["models"])
        elif _models(args) != sorted(recorded["models"]):
            parser.error(f"--from-table: the table holds --models {','.join(recorded['models'])}")
    else:
        table, table_seconds = build_table(args)
        with gzip.open(table_path, "wt") as f:
            json.dump({"val_images": args.val, "configs": table}, f)

    from stitch_nas.report import hypervolume

    ctx = _context(args.zoo, args.val)
    search = TableSearch(ctx, table, _models(args))
    rows = list(table.values())
    top = 1.1 * max(r["macs"] for r in rows)
    everything = [(r["accuracy"], r["macs"]) for r in rows]
    full = {a: hypervolume(everything, DIRECTIONS, [a, top]) for a in REFERENCES}
    from search_quality import _front  # the digits benchmark's rule, on this table

    front = [table[k] for k in _front(table)]
    val_images = len(ctx.labels("val"))
    earlier = json.loads(out_path.read_text()) if out_path.exists() else {}
    same = earlier.get("val_images") == val_images and earlier.get("space_size") == len(rows)
    results = earlier.get("results", []) if same else []
    for n in [int(x) for x in args.trials.split(",")]:
        for method in methods:
            if any(r["method"] == method and r["trials"] == n for r in results):
                continue  # measured by an earlier run on the same table
            start = time.perf_counter()
            found, scored = [], []
            for seed in range(args.seeds):
                points, proxy_scores = run_method(search, method, n, seed, args.candidates)
                found.append(points)
                scored.append(proxy_scores / n)
            for a in REFERENCES:
                fracs = [
                    hypervolume(p, DIRECTIONS, [a, top]) / full[a] if p else 0.0 for p in found
                ]
                random_row = next(
                    (
                        r
                        for r in results
                        if r["method"] == "random"
                        and r["trials"] == n
                        and r["reference_accuracy"] == a
                    ),
                    None,
                )
                results.append(
                    {
                        "method": method,
                        "trials": n,
                        "reference_accuracy": a,
                        "seeds": args.seeds,
                        "hv_fraction_median": statistics.median(fracs),
                        "hv_fraction_min": min(fracs),
                        "hv_fraction_max": max(fracs),
                        "hv_fractions": fracs,
                        # one-sided: are this method's seeds' fractions above random's?
                        "mannwhitney_p_above_random": _above(fracs, random_row),
                        "proxy_scores_per_trial": statistics.median(scored),
                        "seconds": round(time.perf_counter() - start, 1),
                    }
                )
            r = [x for x in results if x["method"] == method and x["trials"] == n]
            print(
                f"{method:8s} {n:4d} trials: "
                + "  ".join(
                    f"ref {x['reference_accuracy']}: {x['hv_fraction_median']:.3f} "
                    f"[{x['hv_fraction_min']:.3f}, {x['hv_fraction_max']:.3f}]"
                    for x in r
                )
                + f"  ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
            _write(out_path, args, ctx, rows, search, top, full, front, table_seconds, results)


def _above(fracs: list[float], random_row: dict | None) -> float | None:
    """Mann-Whitney U's one-sided p-value that ``fracs`` lie above random sampling's seeds."""
    if random_row is None or "hv_fractions" not in random_row:
        return None  # random itself, or random measured by a run that kept no seeds
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(fracs, random_row["hv_fractions"], alternative="greater").pvalue)


def _write(out_path, args, ctx, rows, search, top, full, front, table_seconds, results) -> None:
    """The results so far (written after each method, so a stopped run resumes)."""
    from scipy.stats import spearmanr

    probe = [r["probe_accuracy"] for r in rows]
    out = {
        "space": "pairwise (lstsq), both directions, over "
        + (
            "the mini zoo (the demo's)"
            if args.zoo == "digits"
            else "examples/realzoo.yaml's models"
        ),
        "zoo": args.zoo,
        "models": _models(args) or sorted(ctx.zoo.names()),
        "val_images": len(ctx.labels("val")),
        "probe_images": len(ctx.labels("probe")),
        "space_size": len(rows),
        "table_seconds": round(table_seconds, 1),
        "table": _paths(args.zoo)[1].name,
        "reference_front": {
            "configs": len(front),
            "macs_reference": top,
            "hypervolume": full,
            "points": sorted((r["accuracy"], r["macs"]) for r in front),
        },
        "spearman_probe_accuracy_accuracy": float(
            spearmanr(probe, [r["accuracy"] for r in rows]).statistic
        ),
        "share_below_probe_threshold": sum(p < search.floor for p in probe) / len(rows),
        "candidates": args.candidates,
        "results": results,
        "machine": {
            "cores": os.cpu_count(),
            "optuna": optuna.__version__,
            "platform": platform.platform(),
        },
        "date": time.strftime("%Y-%m-%d"),
    }
    out_path.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
