"""How long ``stitch-nas export DIR`` takes per network, before and after trials kept their
trained adapters (issue #34, item 2).

    python benchmarks/export_time.py [--folder DIR] [--before REV] [--repeats 3]

``DIR`` is a finished digits search with refine trials, written by this working tree (without
``--folder``, one is run: mini zoo, seed 0, ``--trials`` trials, then ``--refine`` of the best
least-squares networks refined with the default trained ``linear`` stitch). Its study is copied
as the code of ``REV`` (default: the commit before the change) would have written it, without
the trials' ``weights`` and fixed-sample counts, into a second folder. Then the work of
``stitch-nas export`` (read the study, rebuild the zoo and data from its settings, rebuild,
check, write safetensors + ONNX + TorchScript, load back) runs as a new process, through
``export_study`` with ``skip_failures`` as ``demo`` and ``search`` run it (the code before
retrains each adapter, and a retrained network that lands on other figures is refused there,
which would stop the command): with the code of ``REV`` (unpacked with ``git archive``) on the
copy ("before": every trained adapter trained again, every network re-measured on the whole
validation and test splits) and with this working tree on ``DIR`` ("after"), taking turns
``--repeats`` times so that a machine loaded by others slows both alike; once for the Pareto
front (the command's default) and once for every completed trial with a trained adapter.
Records each run's wall time, per network (written or refused), their median and spread, and
the ratio after / before within each turn. Writes
benchmarks/results/export_time.json after every turn.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "export_time.json"
BEFORE = "61fd41d"  # main before the trials kept their trained adapters
# `stitch-nas export DIR`'s work (read the study, rebuild the zoo from its settings, export) as
# `demo` and `search` run it, naming a network that does not reproduce instead of stopping: the
# code before retrains each adapter, and one that lands on other figures is refused there
EXPORT = """
import sys
from pathlib import Path
from stitch_nas.pipeline._folder import _rebuild
from stitch_nas.export import export_study
from stitch_nas.search import load_folder_study
out, trials, formats = Path(sys.argv[1]), sys.argv[2], sys.argv[3].split(",")
study = load_folder_study(out)
ctx, settings = _rebuild(study, out, False)
chosen = "pareto" if trials == "pareto" else [int(n) for n in trials.split(",")]
summary = export_study(study, ctx, out / "models", trials=chosen, formats=formats,
                       fuse=settings.search.fuse, skip_failures=True, folder=out)
print(len(summary.folders), len([k for k in summary.skipped if k]))
"""


def _git(*args: str) -> str:
    run = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=False)
    return run.stdout.decode().strip() if run.returncode == 0 else ""


def _unpack(rev: str, dest: Path) -> Path:
    data = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "stitch_nas"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def _cli(
    code: Path, args: list[str], script: str | None = None
) -> tuple[float, subprocess.CompletedProcess]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    start = time.perf_counter()
    run = subprocess.run(
        [sys.executable, *(["-c", script] if script else ["-m", "stitch_nas.cli._main"]), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(code),
    )
    seconds = time.perf_counter() - start
    if run.returncode != 0:
        raise SystemExit(f"{args[:2]} with {code}: exit {run.returncode}\n{run.stderr[-2000:]}")
    return seconds, run


def _trained_trials(out: Path) -> list[int]:
    """Completed trials whose config has an adapter other than least squares."""
    with sqlite3.connect(out / "study.db") as db:
        rows = db.execute(
            "SELECT t.number, a.value_json FROM trials t JOIN trial_user_attributes a "
            "ON a.trial_id = t.trial_id WHERE a.key = 'config' AND t.state = 'COMPLETE'"
        ).fetchall()
    trained = []
    for number, raw in rows:
        config = json.loads(raw)
        if any(a["kind"] != "lstsq" for a in config.get("adapters", [])):
            trained.append(int(number))
    return sorted(trained)


def _as_before(out: Path, dest: Path) -> None:
    """``out``'s study as the code before the change wrote it: no kept weights, no sample."""
    import optuna

    sys.path.insert(0, str(ROOT))
    from stitch_nas.search import load_folder_study

    old = load_folder_study(out)
    dest.mkdir(parents=True)
    study = optuna.create_study(
        storage=f"sqlite:///{dest / 'study.db'}",
        study_name=old.study_name,
        directions=old.directions,
    )
    if old.metric_names is not None:
        study.set_metric_names(old.metric_names)
    for key, value in old.user_attrs.items():
        study.set_user_attr(key, value)
    dropped = ("weights", "sample_correct", "sample_images")
    for t in old.get_trials():
        study.add_trial(
            optuna.trial.create_trial(
                state=t.state,
                values=t.values,
                params=t.params,
                distributions=t.distributions,
                user_attrs={k: v for k, v in t.user_attrs.items() if k not in dropped},
                constraints=dict(t.constraints) or None,
            )
        )


def _summary(runs: list[dict]) -> dict:
    per = [r["per_network_s"] for r in runs]
    walls = [r["wall_s"] for r in runs]
    return {
        "networks": runs[0]["networks"],
        "wall_s_median": round(statistics.median(walls), 3),
        "per_network_s_median": round(statistics.median(per), 3),
        "per_network_s_min": round(min(per), 3),
        "per_network_s_max": round(max(per), 3),
        "runs": runs,
    }


def _report(args, search_s, trained, runs, selections) -> dict:
    results = {}
    for selection in selections:
        if not runs[selection]["after"]:
            continue
        before, after = (_summary(runs[selection][w]) for w in ("before", "after"))
        ratios = [
            a["wall_s"] / b["wall_s"]
            for a, b in zip(runs[selection]["after"], runs[selection]["before"], strict=False)
        ]
        results[selection] = {
            "before": before,
            "after": after,
            "ratio_after_over_before_median": round(statistics.median(ratios), 3),
            "ratio_min": round(min(ratios), 3),
            "ratio_max": round(max(ratios), 3),
        }
    return {
        "command": " ".join(["python", "benchmarks/export_time.py", *sys.argv[1:]]),
        "what": "wall time of the work of `stitch-nas export DIR` as a new process (interpreter, "
        "study, zoo load from the mini zoo's cache, rebuild, check, safetensors + ONNX + "
        "TorchScript, load-back check; export_study with skip_failures) on a finished digits "
        "search with refine trials; before: the code of `before` on the study without kept "
        "weights (every trained adapter trained again, every network re-measured on the whole "
        "validation and test splits); after: this commit on the study as it wrote it",
        "search": args.search,
        "search_seconds": search_s,
        "trained_trials": trained,
        "repeats": len(next(iter(runs.values()))["after"]),
        "results": results,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_1min": round(os.getloadavg()[0], 2),
            "date": time.strftime("%Y-%m-%d"),
            "before": _git("rev-parse", args.before),
            "commit": _git("rev-parse", "HEAD") or None,
            "dirty": bool(_git("status", "--porcelain", "--", "stitch_nas")),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, help="a finished search (else one is run)")
    parser.add_argument("--before", default=BEFORE, help="git revision of the code before")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--refine", type=int, default=6)
    parser.add_argument("--formats", default="safetensors,onnx,torchscript")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="export_time."))
    codes = {"before": _unpack(args.before, tmp / "before_code"), "after": ROOT}
    search_s = None
    outs = {"after": tmp / "after_out", "before": tmp / "before_out"}
    if args.folder is None:
        config = tmp / "search.yaml"
        config.write_text(
            f"search: {{trials: {args.trials}, seed: 0, refine_trials: {args.refine}}}\n"
        )
        argv = ["search", str(config), "--out", str(outs["after"]), "--no-export", "-q"]
        search_s, _ = _cli(ROOT, argv)
        args.search = {"trials": args.trials, "refine_trials": args.refine, "seed": 0}
    else:
        shutil.copytree(args.folder, outs["after"], ignore=shutil.ignore_patterns("models"))
        args.search = {"folder": str(args.folder)}
    _as_before(outs["after"], outs["before"])
    trained = _trained_trials(outs["after"])
    selections = {"pareto": "pareto", "trained": ",".join(map(str, trained))}
    runs: dict[str, dict[str, list[dict]]] = {k: {"before": [], "after": []} for k in selections}
    for repeat in range(args.repeats):
        for selection, extra in selections.items():
            for which in ("before", "after"):
                out = outs[which]
                argv = [str(out), extra, args.formats]
                wall, run = _cli(codes[which], argv, EXPORT)
                written, skipped = map(int, run.stdout.split()[-2:])
                n = written + skipped
                runs[selection][which].append(
                    {
                        "wall_s": round(wall, 3),
                        "networks": n,
                        "refused": skipped,
                        "per_network_s": round(wall / n, 3),
                    }
                )
                print(f"{repeat}: {selection} {which}: {wall:.1f} s for {n}", flush=True)
                shutil.rmtree(out / "models", ignore_errors=True)  # each run writes anew
            report = _report(args, search_s, trained, runs, selections)
            RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["results"], indent=1))


if __name__ == "__main__":
    main()
