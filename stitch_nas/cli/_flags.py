"""The per-run flags of ``stitch-nas demo`` / ``search`` / ``export``: parsed, checked and laid
over the YAML file's ``search`` section, before torch or the zoo load."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from stitch_nas.choices import AUTOCAST_DTYPES, BUDGET_KEYS, check_device
from stitch_nas.errors import ConfigError

if TYPE_CHECKING:
    from stitch_nas.settings import SearchSettings

__all__ = ["apply_run_flags", "trial_numbers"]


def apply_run_flags(args: argparse.Namespace, search: SearchSettings) -> None:
    """Check the per-run flags and let them override the YAML file's search section.

    Everything is checked here, after parsing and before torch or the zoo load, so a bad
    value answers at once with one line.
    """
    if args.resume and args.join:
        raise ConfigError(
            "--resume and --join exclude each other: --resume is for a study no other driver "
            "runs on, --join for one they may; pick one"
        )
    if args.study_name is not None:
        if not args.study_name.strip() or args.study_name != args.study_name.strip():
            raise ConfigError(
                f"--study-name {args.study_name!r}: give a non-empty name without leading or "
                "trailing spaces"
            )
        search.study_name = args.study_name
    if args.device is not None:
        search.device = check_device(args.device, "--device")
    if args.autocast is not None:
        if args.autocast not in (*AUTOCAST_DTYPES, "off"):
            raise ConfigError(
                f"--autocast {args.autocast!r}: use {', '.join(AUTOCAST_DTYPES)} or off"
            )
        search.autocast = None if args.autocast == "off" else args.autocast
    if args.cka_threshold is not None:
        search.cka_threshold = _unit_number("--cka-threshold", args.cka_threshold)
    if args.probe_threshold is not None:
        search.probe_threshold = _number("--probe-threshold", args.probe_threshold, 0.0, 10.0)
    if args.fidelity is not None:
        search.fidelity = _unit_number("--fidelity", args.fidelity)
        if search.fidelity == 1.0:
            raise ConfigError("--fidelity 1 scores nothing first; use 0 to turn the slice off")
    if args.objectives is not None:
        names = [n.strip() for n in args.objectives.split(",") if n.strip()]
        if not names:
            raise ConfigError("--objectives is empty; give names such as accuracy,macs")
        if len(set(names)) != len(names):
            raise ConfigError(f"--objectives {args.objectives!r} names an objective twice")
        search.objectives = names
    if args.budget is not None:
        search.budgets = _budgets(args.budget)
    from stitch_nas.plugins import OBJECTIVES  # torch-free; finds plug-in objectives too

    for name in search.objectives:
        OBJECTIVES.get(name)  # an unknown name is a one-line error listing the known ones


def _unit_number(flag: str, text: str) -> float:
    return _number(flag, text, 0.0, 1.0)


def _number(flag: str, text: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(
            f"{flag} {text!r} is not a number; give one in [{low:g}, {high:g}]"
        ) from None
    if not low <= value <= high:
        raise ConfigError(f"{flag} {text!r} must be in [{low:g}, {high:g}]")
    return value


def _budgets(items: list[str]) -> dict[str, float]:
    """``["macs=2e6", "params=1e5"]`` -> ``{"macs": 2e6, "params": 1e5}``, checked."""
    budgets: dict[str, float] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or key not in BUDGET_KEYS:
            raise ConfigError(
                f"--budget {item!r}: use KEY=VALUE with KEY one of {', '.join(BUDGET_KEYS)}, "
                "e.g. --budget macs=2e6"
            )
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"--budget {item!r}: {text!r} is not a number") from None
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"--budget {item!r}: the limit must be a positive number")
        if key in budgets:
            raise ConfigError(f"--budget {key} is given twice; give it once")
        budgets[key] = value
    return budgets


def trial_numbers(text: str) -> str | list[int]:
    if text == "pareto":
        return text
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--trials {text!r}: use 'pareto' or trial numbers like 12,40") from None
