"""``stitch-nas``: demo, search, report, export and zoo commands.

Every error a user can cause ends in one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stitch_nas.errors import ConfigError, StitchNASError

from ._flags import apply_run_flags, trial_numbers

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # one line like every other error (argparse adds the whole usage block first)
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


class _Help(argparse.HelpFormatter):
    """Show an option's default where it has one; None means "as the YAML file says"."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.default not in (None, False, argparse.SUPPRESS)
        if shown and action.option_strings and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        formatter_class=_Help,
        prog="stitch-nas",
        description="Search networks stitched from fragments of pretrained models.",
    )
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    loud.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bars (and no INFO logging)"
    )
    parser.add_argument("--version", action="version", version=f"stitch-nas {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser(
        "demo", formatter_class=_Help, help="search the embedded digits zoo (no downloads)"
    )
    _search_options(demo, default_out="stitch_nas_demo")
    demo.add_argument(
        "--space",
        default="pairwise",
        help="search space: pairwise, chain, gap, or a seed preset (stitchnet, restnet, snnet, "
        "traft)",
    )

    search = sub.add_parser(
        "search", formatter_class=_Help, help="search as described by a YAML config file"
    )
    search.add_argument("config", help="YAML file (see examples/search.yaml)")
    _search_options(search, default_out="stitch_nas_run")

    report = sub.add_parser(
        "report", formatter_class=_Help, help="write and print the report of a search folder"
    )
    report.add_argument("dir", help="a folder written by demo or search")
    report.add_argument(
        "--no-test",
        action="store_true",
        help="do not measure front networks and zoo models that lack test figures",
    )
    _study_location(report)

    export = sub.add_parser(
        "export", formatter_class=_Help, help="export networks of a search folder to DIR/models"
    )
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
    _quiet(export)
    _study_location(export)

    zoo = sub.add_parser("zoo", formatter_class=_Help, help="list or build the embedded mini zoo")
    zoo.add_argument("action", choices=["list", "build"])
    zoo.add_argument("--cache-dir", default=None, help="where the zoo is cached")
    return parser


def _quiet(parser: argparse.ArgumentParser) -> None:
    # also after the command (stitch-nas demo -q); SUPPRESS keeps a -q given before it
    parser.add_argument(
        "-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress bars"
    )


def _study_location(parser: argparse.ArgumentParser) -> None:
    """Where the study of a search run with ``--storage`` is: report and export read it there."""
    parser.add_argument(
        "--storage", default=None, help="the --storage the search used (default: DIR/study.db)"
    )
    parser.add_argument(
        "--study-name", default=None, help="the study's name (default: the folder's name)"
    )


def _search_options(parser: argparse.ArgumentParser, default_out: str) -> None:
    parser.add_argument("--out", default=default_out, help="output folder (study, report)")
    parser.add_argument("--trials", type=int, default=None, help="total trials (default 50)")
    parser.add_argument("--resume", action="store_true", help="continue the study in --out")
    parser.add_argument("--sampler", default=None, help="tpe (default), nsga2 or random")
    parser.add_argument("--seed", type=int, default=None, help="sampler seed (default 0)")
    parser.add_argument("--cache-dir", default=None, help="where the mini zoo is cached")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _quiet(parser)
    parser.add_argument(
        "--no-export", action="store_true", help="do not export the Pareto front to OUT/models"
    )
    parser.add_argument(
        "--finetune",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="train networks of the stitched front further after the search (the YAML's "
        "finetune section says how; default: off)",
    )
    parser.add_argument(
        "--executor", choices=["local", "ray"], default=None, help="where trials run (local)"
    )
    parser.add_argument("--workers", type=int, default=None, help="Ray workers (default 2)")
    parser.add_argument("--ray-address", default=None, help="Ray cluster to join (e.g. auto)")
    parser.add_argument(
        "--storage",
        default=None,
        help="Optuna RDB URL (postgresql://...) or journal file shared by several drivers",
    )
    parser.add_argument(
        "--study-name", default=None, help="the study's name (default: the --out folder's name)"
    )
    parser.add_argument(
        "--join",
        action="store_true",
        help="continue or create the study while other drivers may run on it",
    )
    parser.add_argument(
        "--device",
        default=None,
        help="cpu (default), auto (CUDA when present), cuda, cuda:N or mps",
    )
    parser.add_argument(
        "--autocast",
        default=None,
        help="bfloat16: run passes that train nothing under autocast, faster on a GPU and a few "
        "near-tie predictions apart (see the README); off (default): float32",
    )
    parser.add_argument(
        "--cka-threshold",
        default=None,
        help="prune stitches with CKA below this, in [0, 1] (default 0: off)",
    )
    parser.add_argument(
        "--probe-threshold",
        default=None,
        help="prune stitches whose least-squares probe accuracy is below this multiple of "
        "chance, in [0, 10] (default 1.5; 0: off)",
    )
    parser.add_argument(
        "--fidelity",
        default=None,
        help="share of val a new config is scored on first, in [0, 1); 0 scores every "
        "config on the whole split (default 0.15)",
    )
    parser.add_argument(
        "--objectives",
        default=None,
        help="comma-separated (default accuracy,macs); also params, latency, cka",
    )
    parser.add_argument(
        "--budget",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="a constraint such as macs=2e6 or params=1e5 (repeatable)",
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
    from ._settings import Settings, load_settings

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
    if args.finetune is not None:
        settings.finetune.enabled = args.finetune
        if args.command == "demo":  # digits: a mirrored 2 is no 2, and the demo stays short
            recipe = dataclasses.replace(settings.finetune.recipe, augment=False, epochs=3)
            settings.finetune.recipe = recipe
    for option in ("executor", "workers", "ray_address", "storage"):
        if getattr(args, option) is not None:
            setattr(settings.search, option, getattr(args, option))
    if args.workers is not None or args.ray_address is not None:
        if args.executor == "local":
            raise ConfigError("--workers and --ray-address need --executor ray; drop them")
        settings.search.executor = "ray"
    apply_run_flags(args, settings.search)
    from ._preflight import check_plugins, check_run

    check_run(settings, Path(args.out), resume=args.resume, join=args.join)
    check_plugins(settings.search)  # imports the plug-ins and torch, not the whole pipeline
    from ._pipeline import run_settings  # the zoo and data load from here on

    _quiet_optuna(args)
    summary = run_settings(
        settings,
        Path(args.out),
        resume=args.resume,
        join=args.join,
        progress=not (args.no_progress or args.quiet),
        echo=print,
    )
    print(summary.table())
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("stitch-nas")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _quiet_optuna(args: argparse.Namespace) -> None:
    """Keep Optuna at WARNING unless -v: one INFO line per trial drowns the progress bar.

    Set after the pipeline import because importing optuna resets its logger to INFO.
    """
    if not args.verbose:
        import optuna

        optuna.logging.set_verbosity(logging.WARNING)


def _export(args: argparse.Namespace) -> int:
    from ._preflight import check_folder, check_formats

    trials = trial_numbers(args.trials)
    formats = check_formats(args.format)
    check_folder(Path(args.dir), args.storage)
    from ._pipeline import export_folder  # torch loads from here on

    _quiet_optuna(args)
    summary = export_folder(
        Path(args.dir),
        trials=trials,
        formats=formats,
        elastic=args.elastic,
        progress=not (args.no_progress or args.quiet),
        storage=args.storage,
        study_name=args.study_name,
    )
    print(summary.describe())
    return 0


def _report(args: argparse.Namespace) -> int:
    from ._preflight import check_folder

    check_folder(Path(args.dir), args.storage)
    from ._pipeline import report_folder  # torch loads from here on

    _quiet_optuna(args)
    report = report_folder(
        Path(args.dir),
        test=not args.no_test,
        echo=print,
        storage=args.storage,
        study_name=args.study_name,
    )
    print(report.table())
    return 0


def _zoo(args: argparse.Namespace) -> int:
    from ._preflight import check_caches
    from ._settings import Settings

    settings = Settings()  # a cache it cannot write in: one line before any training
    settings.zoo.cache_dir = args.cache_dir
    check_caches(settings)
    from stitch_nas.data import load_digits_splits
    from stitch_nas.zoo import load_mini_zoo

    zoo = load_mini_zoo(load_digits_splits(), cache_dir=args.cache_dir, progress=not args.quiet)
    for name in zoo.names():
        entry = zoo[name]
        params = sum(p.numel() for p in entry.model.parameters())
        print(f"{name:14s} {entry.source:28s} {params:>9,d} params  input {entry.input_spec.size}")
    return 0


def _one_line(message: str, limit: int = 1000) -> str:
    """``message`` cut to about ``limit`` characters, its start (what is wrong) and end (how
    to fix it) kept: a check that quoted a huge value whole still prints a short line."""
    if len(message) <= limit:
        return message
    cut = len(message) - limit
    return f"{message[: limit * 2 // 3]} [... {cut:,} characters ...] {message[-limit // 3 :]}"


def _after_disk_full(args: argparse.Namespace) -> str:
    """How to go on once there is room again."""
    if args.command in ("demo", "search"):
        if args.storage or (Path(args.out) / "study.db").is_file():
            return "the finished trials are kept: free space, then rerun with --resume"
        return "free space, then run again"
    if args.command in ("export", "report"):
        return f"the study is untouched: free space, then run stitch-nas {args.command} again"
    return "free space, then run again"


def _quiet_full_disk_in_threads() -> None:
    """A full disk also fails Optuna's heartbeat thread, whose default hook prints a
    traceback; the main thread meets the same fault and says it in one line."""
    import threading

    from stitch_nas.files import disk_full

    default = threading.excepthook
    if getattr(default, "quiet_full_disk", False):  # main() ran before in this process
        return

    def hook(args: Any) -> None:
        if disk_full(args.exc_value) is None:
            default(args)

    hook.quiet_full_disk = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _quiet_full_disk_in_threads()
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
    try:
        return handlers[args.command](args)
    except StitchNASError as exc:
        print(f"stitch-nas: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:
        from stitch_nas.files import disk_full

        full = disk_full(exc)  # at any phase; whatever was written is whole (atomic writes)
        if full is None:
            raise
        print(f"stitch-nas: error: {full}; {_after_disk_full(args)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "stitch-nas: interrupted; finished trials are kept, continue with --resume",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
