"""``stitch-nas``: demo, search, report, export and zoo commands.

Every error a user can cause ends in one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from stitch_nas.errors import ConfigError, StitchNASError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stitch-nas",
        description="Search networks stitched from fragments of pretrained models.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="search the embedded digits zoo (no downloads)")
    _search_options(demo, default_out="stitch_nas_demo")
    demo.add_argument(
        "--space",
        default="pairwise",
        help="search space: pairwise, chain, gap, or a seed preset (stitchnet, restnet, snnet, "
        "traft)",
    )

    search = sub.add_parser("search", help="search as described by a YAML config file")
    search.add_argument("config", help="YAML file (see examples/search.yaml)")
    _search_options(search, default_out="stitch_nas_run")

    report = sub.add_parser("report", help="write and print the report of a search folder")
    report.add_argument("dir", help="a folder written by demo or search")

    export = sub.add_parser("export", help="export networks of a search folder to DIR/models")
    export.add_argument("dir", help="a folder written by demo or search")
    export.add_argument(
        "--trials", default="pareto", help="'pareto' (default) or trial numbers, e.g. 12,40"
    )
    export.add_argument(
        "--format",
        default="safetensors,onnx,torchscript",
        help="comma-separated: safetensors (always written), onnx, torchscript",
    )
    export.add_argument("--elastic", action="store_true", help="also write one elastic package")
    export.add_argument("--no-progress", action="store_true", help="hide progress bars")

    zoo = sub.add_parser("zoo", help="list or build the embedded mini zoo")
    zoo.add_argument("action", choices=["list", "build"])
    zoo.add_argument("--cache-dir", default=None, help="where the zoo is cached")
    return parser


def _search_options(parser: argparse.ArgumentParser, default_out: str) -> None:
    parser.add_argument("--out", default=default_out, help="output folder (study, report)")
    parser.add_argument("--trials", type=int, default=None, help="total trials (default 50)")
    parser.add_argument("--resume", action="store_true", help="continue the study in --out")
    parser.add_argument("--sampler", default=None, help="tpe (default), nsga2 or random")
    parser.add_argument("--seed", type=int, default=None, help="sampler seed")
    parser.add_argument("--cache-dir", default=None, help="where the mini zoo is cached")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument(
        "--no-export", action="store_true", help="do not export the Pareto front to OUT/models"
    )
    parser.add_argument(
        "--executor", choices=["local", "ray"], default=None, help="where trials run (local)"
    )
    parser.add_argument("--workers", type=int, default=None, help="Ray workers (default 2)")
    parser.add_argument("--ray-address", default=None, help="Ray cluster to join (e.g. auto)")
    parser.add_argument(
        "--storage", default=None, help="Optuna RDB URL shared by several drivers (PostgreSQL)"
    )


_DEMO_SPACE_OPTIONS: dict[str, dict] = {
    "chain": {"max_fragments": 3},
    # StitchNet's recursion is O(K^L): one stitch per chain keeps it to seconds on the mini zoo
    "stitchnet": {"max_joints": 1},
    # trained adapters: a short budget per trial
    "gap": {"adapter_options": {"steps": 50}},
    "restnet": {"adapter_options": {"steps": 50}},
    "traft": {"adapter_options": {"steps": 50}},
    # SN-Net as the paper trains it: every stitch together (Alg. 1), once, before the search
    "snnet": {"joint": {"steps": 300}},
}


def _run_search(args: argparse.Namespace) -> int:
    from stitch_nas.cli._settings import Settings, load_settings

    settings = load_settings(args.config) if args.command == "search" else Settings()
    if args.command == "demo":
        settings.search.space = args.space
        # options that keep the demo to minutes on a laptop; the YAML file sets any of them
        settings.search.space_options = _DEMO_SPACE_OPTIONS.get(args.space, {})
    if args.trials is not None:
        settings.search.trials = args.trials
    if args.sampler is not None:
        settings.search.sampler = args.sampler
    if args.seed is not None:
        settings.search.seed = args.seed
    if args.cache_dir is not None:
        settings.zoo.cache_dir = args.cache_dir
    if args.no_export:
        settings.search.export = False
    for option in ("executor", "workers", "ray_address", "storage"):
        if getattr(args, option) is not None:
            setattr(settings.search, option, getattr(args, option))
    if args.workers is not None or args.ray_address is not None:
        if args.executor == "local":
            raise ConfigError("--workers and --ray-address need --executor ray; drop them")
        settings.search.executor = "ray"
    from stitch_nas.cli._pipeline import run_settings  # torch and the zoo load from here on

    summary = run_settings(
        settings, Path(args.out), resume=args.resume, progress=not args.no_progress, echo=print
    )
    print(summary.table())
    return 0


def _trial_numbers(text: str) -> str | list[int]:
    if text == "pareto":
        return text
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--trials {text!r}: use 'pareto' or trial numbers like 12,40") from None


def _export(args: argparse.Namespace) -> int:
    from stitch_nas.cli._pipeline import export_folder

    formats = [f.strip() for f in args.format.split(",") if f.strip()]
    summary = export_folder(
        Path(args.dir),
        trials=_trial_numbers(args.trials),
        formats=formats,
        elastic=args.elastic,
        progress=not args.no_progress,
    )
    print(summary.describe())
    return 0


def _report(args: argparse.Namespace) -> int:
    from stitch_nas.cli._pipeline import report_folder

    print(report_folder(Path(args.dir)).table())
    return 0


def _zoo(args: argparse.Namespace) -> int:
    from stitch_nas.data._splits import load_digits_splits
    from stitch_nas.zoo._mini import load_mini_zoo

    zoo = load_mini_zoo(load_digits_splits(), cache_dir=args.cache_dir, progress=True)
    for name in zoo.names():
        entry = zoo[name]
        params = sum(p.numel() for p in entry.model.parameters())
        print(f"{name:14s} {entry.source:28s} {params:>9,d} params  input {entry.input_spec.size}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    handlers = {
        "demo": _run_search,
        "search": _run_search,
        "report": _report,
        "export": _export,
        "zoo": _zoo,
    }
    if not args.verbose:  # one INFO line per trial drowns the progress bar
        # optuna's own logger, set without importing optuna (which takes seconds)
        logging.getLogger("optuna").setLevel(logging.WARNING)
    try:
        return handlers[args.command](args)
    except StitchNASError as exc:
        print(f"stitch-nas: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "stitch-nas: interrupted; finished trials are kept, continue with --resume",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
