"""``stitch-nas``: demo, search, report, export and zoo commands.

Every error a user can cause ends in one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stitch_nas.errors import StitchNASError
from stitch_nas.machine import reuse_freed_memory

from ._flags import apply_run_flags, trial_numbers
from ._parser import build_parser

__all__ = ["main"]


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
    from stitch_nas.settings import Settings, load_settings

    settings = load_settings(args.config) if args.command == "search" else Settings()
    if args.command == "demo":
        settings.search.space = args.space
        # options that keep the demo to minutes on a laptop; the YAML file sets any of them
        settings.search.space_options = _DEMO_SPACE_OPTIONS.get(args.space, {})
    if args.finetune and args.command == "demo":
        # digits: a mirrored 2 is no 2, and the demo stays short
        recipe = dataclasses.replace(settings.finetune.recipe, augment=False, epochs=3)
        settings.finetune.recipe = recipe
    apply_run_flags(args, settings)  # and check every value, naming the flags that set them
    from stitch_nas.pipeline import check_plugins, check_run

    check_run(settings, Path(args.out), resume=args.resume, join=args.join)
    check_plugins(settings.search)  # imports the plug-ins and torch, not the whole pipeline
    from stitch_nas.pipeline import run  # the zoo and data load from here on

    _quiet_optuna(args)
    summary = run(
        settings,
        Path(args.out),
        resume=args.resume,
        join=args.join,
        progress=not (args.no_progress or args.quiet),
        echo=print,
    )
    print(summary.table())
    return 0


def _quiet_optuna(args: argparse.Namespace) -> None:
    """Keep Optuna at WARNING unless -v: one INFO line per trial drowns the progress bar.

    Set after the pipeline import because importing optuna resets its logger to INFO.
    """
    if not args.verbose:
        import optuna

        optuna.logging.set_verbosity(logging.WARNING)


def _export(args: argparse.Namespace) -> int:
    from stitch_nas.choices import DEFAULT_EXPORT_FORMATS
    from stitch_nas.pipeline import check_artifacts, check_destination, check_folder, check_formats

    trials = trial_numbers(args.trials)
    # formats asked for are checked now; by default ONNX is skipped, saying so, without its extra
    formats = list(DEFAULT_EXPORT_FORMATS) if args.format is None else check_formats(args.format)
    check_folder(Path(args.dir), args.storage)
    check_destination(Path(args.out or Path(args.dir) / "models"), "the networks")
    if args.artifacts is not None:
        check_artifacts(Path(args.artifacts))
    from stitch_nas.pipeline import export_folder  # torch loads from here on

    _quiet_optuna(args)
    summary = export_folder(
        Path(args.dir),
        trials=trials,
        formats=formats,
        elastic=args.elastic,
        progress=not (args.no_progress or args.quiet),
        storage=args.storage,
        study_name=args.study_name,
        artifacts=args.artifacts,
        dest=None if args.out is None else Path(args.out),
    )
    print(summary.describe())
    return 0


def _report(args: argparse.Namespace) -> int:
    from stitch_nas.pipeline import check_destination, check_folder

    check_folder(Path(args.dir), args.storage)
    check_destination(Path(args.out or args.dir), "the report")
    from stitch_nas.pipeline import report_folder  # torch loads from here on

    _quiet_optuna(args)
    report = report_folder(
        Path(args.dir),
        test=not args.no_test,
        progress=not args.quiet,
        echo=print,
        storage=args.storage,
        study_name=args.study_name,
        dest=None if args.out is None else Path(args.out),
    )
    print(report.table())
    return 0


def _zoo(args: argparse.Namespace) -> int:
    from stitch_nas.pipeline import check_caches
    from stitch_nas.settings import Settings

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


def _after_fault(args: argparse.Namespace, fix: str) -> str:
    """How to go on once ``fix`` ("free space", "make it writable") is done."""
    if args.command in ("demo", "search"):
        if args.storage or (Path(args.out) / "study.db").is_file():
            return f"the finished trials are kept: {fix}, then rerun with --resume"
        return f"{fix}, then run again"
    if args.command in ("export", "report"):
        return f"the study is untouched: {fix}, then run stitch-nas {args.command} again"
    return f"{fix}, then run again"


def _after_interrupt(args: argparse.Namespace) -> str:
    """What an interrupted command left, as it is on disk, and how to go on."""
    if args.command in ("demo", "search"):
        flag = "--join" if args.join else "--resume"
        if args.storage:
            return f"trials it finished are kept in the study at --storage: continue with {flag}"
        db = Path(args.out) / "study.db"
        if db.is_file():  # a run that stops before its study is made removes what it wrote
            return f"the study in {db} is kept: continue it with {flag}"
        return f"stopped before the study was made; nothing was kept in {args.out}: run again"
    if args.command in ("export", "report"):
        return f"the study is untouched: run stitch-nas {args.command} again"
    return "run it again"


class _Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is (what the run made so far kept or undone, one line), but
    exit code 143."""


def _terminate(_signum: int, _frame: Any) -> None:
    raise _Terminated()


class _NoInterrupts(logging.Filter):
    """Drops what Optuna logs for a trial that Ctrl-C ended (a warning with a 30-line traceback
    of the KeyboardInterrupt, then "Trial N failed with value None."): :func:`main` says it in
    one line."""

    def __init__(self) -> None:
        super().__init__()
        self.ended = ""  # "Trial N" of the interrupted trial, until its second line

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt):
            self.ended = record.getMessage().split(" failed", 1)[0]
            return False
        if self.ended and record.getMessage().startswith(f"{self.ended} failed with value"):
            self.ended = ""
            return False
        return True


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
    args = build_parser().parse_args(argv)
    _quiet_full_disk_in_threads()
    reuse_freed_memory()  # this process's tensors: the same values, faster on CPU
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    # the logger Optuna's study.optimize reports a trial's failure on (a filter, not a level:
    # a trial that failed on its own keeps its warning)
    optimize = logging.getLogger("optuna.study._optimize")
    if not any(isinstance(f, _NoInterrupts) for f in optimize.filters):  # main() ran before
        optimize.addFilter(_NoInterrupts())
    handlers = {
        "demo": _run_search,
        "search": _run_search,
        "report": _report,
        "export": _export,
        "zoo": _zoo,
    }
    # the default action of SIGTERM kills at once, leaving a half-made study that blocks the
    # rerun; as an exception, it unwinds like Ctrl-C (a library's handler may replace it)
    terminate = signal.signal(signal.SIGTERM, _terminate)
    try:
        return handlers[args.command](args)
    except StitchNASError as exc:
        print(f"stitch-nas: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:
        from stitch_nas.files import disk_full, not_writable

        # at any phase; whatever was written is whole (atomic writes)
        if (full := disk_full(exc)) is not None:
            print(f"stitch-nas: error: {full}; {_after_fault(args, 'free space')}", file=sys.stderr)
            return 2
        if (locked := not_writable(exc)) is None:
            raise
        fix = _after_fault(args, "make it writable")
        print(f"stitch-nas: error: {locked}; {fix}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        what = "terminated" if isinstance(exc, _Terminated) else "interrupted"
        print(f"stitch-nas: {what}; {_after_interrupt(args)}", file=sys.stderr)
        return 143 if isinstance(exc, _Terminated) else 130
    finally:
        signal.signal(signal.SIGTERM, terminate)


if __name__ == "__main__":
    sys.exit(main())
