"""The argument parser of ``stitch-nas``: its commands and their flags.

Only the flags' names, defaults and help live here; what they mean is checked and applied in
:mod:`._flags` and :mod:`._main`. ``docs/_scripts/reference.py`` writes the CLI reference page
from :func:`build_parser`.
"""

from __future__ import annotations

import argparse

__all__ = ["build_parser"]


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


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``stitch-nas`` and its commands."""
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
        "--out",
        default=None,
        help="folder the report files are written to (default: DIR; give one when DIR is "
        "read-only)",
    )
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
        "--out",
        default=None,
        help="folder the networks are written to (default: DIR/models; give one when DIR is "
        "read-only)",
    )
    export.add_argument(
        "--trials", default="pareto", help="'pareto' (default) or trial numbers, e.g. 12,40"
    )
    export.add_argument(
        "--format",
        default=None,
        help="comma-separated: safetensors (always written), pt2 (torch.export), onnx, "
        "torchscript (default: safetensors,pt2,onnx, ONNX where the onnx extra is installed)",
    )
    export.add_argument("--elastic", action="store_true", help="also write one elastic package")
    _artifacts(export)
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


def _artifacts(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--artifacts",
        default=None,
        metavar="DIR",
        help="also upload each exported network's folder (one tar archive) to an Optuna "
        "artifact store in DIR, as an artifact of the study",
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
    parser.add_argument(
        "--sampler",
        default=None,
        help="tpe (default), nsga2, nsga3, gp, qmc, random, or package.module:Class for any "
        "other Optuna sampler (its keyword arguments: the YAML's search.sampler_options)",
    )
    parser.add_argument("--seed", type=int, default=None, help="sampler seed (default 0)")
    parser.add_argument("--cache-dir", default=None, help="where the mini zoo is cached")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _quiet(parser)
    parser.add_argument(
        "--no-export", action="store_true", help="do not export the Pareto front to OUT/models"
    )
    _artifacts(parser)
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
        help="auto (default: CUDA when present, else cpu), cpu, cuda, cuda:N or mps",
    )
    parser.add_argument(
        "--autocast",
        default=None,
        help="bfloat16: run passes that train nothing under autocast, faster on a GPU and a few "
        "near-tie predictions apart (see the README); off (default): float32",
    )
    parser.add_argument(
        "--cka-threshold",
        type=float,
        default=None,
        help="prune stitches with CKA below this, in [0, 1] (default 0: off)",
    )
    parser.add_argument(
        "--probe-threshold",
        type=float,
        default=None,
        help="prune stitches whose least-squares probe accuracy is below this multiple of "
        "chance, from 0 to the number of classes (default 1.5; 0: off)",
    )
    parser.add_argument(
        "--proxy-candidates",
        type=int,
        default=None,
        help="the sampler's proposals probe-scored per trial, the one adding most to the front "
        "measured (default 8; 1: the sampler alone)",
    )
    parser.add_argument(
        "--fidelity",
        type=float,
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


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("stitch-nas")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"
