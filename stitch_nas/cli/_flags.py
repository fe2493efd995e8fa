"""The per-run flags of ``stitch-nas demo`` / ``search`` / ``export``: parsed and laid over the
YAML file's settings, before torch or the zoo load (the settings check their values)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from stitch_nas.errors import ConfigError
from stitch_nas.settings import check_settings

if TYPE_CHECKING:
    from stitch_nas.settings import Settings

__all__ = ["apply_run_flags", "trial_numbers"]


#: "section.key" set straight from the flag of the same name (argparse typed the value)
_PLAIN_FLAGS = {
    "search.trials": "--trials",
    "search.sampler": "--sampler",
    "search.seed": "--seed",
    "search.executor": "--executor",
    "search.workers": "--workers",
    "search.ray_address": "--ray-address",
    "search.storage": "--storage",
    "search.study_name": "--study-name",
    "search.device": "--device",
    "search.cka_threshold": "--cka-threshold",
    "search.probe_threshold": "--probe-threshold",
    "search.proxy_candidates": "--proxy-candidates",
    "search.fidelity": "--fidelity",
    "search.artifacts": "--artifacts",
    "zoo.cache_dir": "--cache-dir",
}


def apply_run_flags(args: argparse.Namespace, settings: Settings) -> None:
    """Lay the per-run flags over the settings file's values, then check every value.

    The flags are only parsed here; each value is checked once, by
    :func:`stitch_nas.settings.check_settings`, whose message names the flag that set it.
    All of it runs before torch or the zoo load, so a bad value answers at once in one line.
    """
    if args.resume and args.join:
        raise ConfigError(
            "--resume and --join exclude each other: --resume is for a study no other driver "
            "runs on, --join for one they may; pick one"
        )
    if (args.workers is not None or args.ray_address is not None) and args.executor == "local":
        raise ConfigError("--workers and --ray-address need --executor ray; drop them")
    flags: dict[str, str] = {}

    def put(key: str, value: Any, flag: str) -> None:
        section, _, name = key.partition(".")
        setattr(getattr(settings, section), name, value)
        flags[key] = flag

    for key, flag in _PLAIN_FLAGS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            put(key, value, flag)
    if args.workers is not None or args.ray_address is not None:
        put("search.executor", "ray", "--executor")
    if args.no_export:
        put("search.export", False, "--no-export")
    if args.finetune is not None:
        put("finetune.enabled", args.finetune, "--finetune")
    if args.autocast is not None:
        put("search.autocast", None if args.autocast == "off" else args.autocast, "--autocast")
    if args.objectives is not None:
        names = [n.strip() for n in args.objectives.split(",") if n.strip()]
        put("search.objectives", names, "--objectives")
    if args.budget is not None:
        put("search.budgets", _budgets(args.budget), "--budget")
    check_settings(settings, flags)


def _budgets(items: list[str]) -> dict[str, str]:
    """``["macs=2e6", "params=1e5"]`` -> ``{"macs": "2e6", "params": "1e5"}``; the numbers
    are checked with the settings file's budgets."""
    budgets: dict[str, str] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(f"--budget {item!r}: use KEY=VALUE, e.g. --budget macs=2e6")
        if key in budgets:
            raise ConfigError(f"--budget {key} is given twice; give it once")
        budgets[key] = text.strip()
    return budgets


def trial_numbers(text: str) -> str | list[int]:
    if text == "pareto":
        return text
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--trials {text!r}: use 'pareto' or trial numbers like 12,40") from None
