"""The fixed choices a run names (executors, Ray modes, budgets, export formats, devices,
autocast dtypes) and the check of budgets, which name them.

Defined once, here, without torch: the checks before a run (``stitch_nas.pipeline``, the CLI)
read them before anything heavy loads, and the library (``search``, ``export``,
``activations``) reads the same tuples, so the two cannot drift apart.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from stitch_nas.errors import ConfigError

__all__ = [
    "AUTOCAST_DTYPES",
    "BUDGET_KEYS",
    "DEVICE_CHOICES",
    "DEVICE_PATTERN",
    "EXECUTORS",
    "EXPORT_FORMATS",
    "RAY_MODES",
    "check_budgets",
]

#: where trials run: in this process, or on Ray workers
EXECUTORS = ("local", "ray")
#: how Ray workers get their trials (``stitch_nas.search.RayExecutor``'s ``mode``)
RAY_MODES = ("auto", "driver", "workers")
#: the costs a budget may cap
BUDGET_KEYS = ("macs", "params")
#: the files an export may write beside its weights
EXPORT_FORMATS = ("safetensors", "onnx", "torchscript")
#: devices a run may name (``auto``: CUDA when present, else the CPU)
DEVICE_PATTERN = re.compile(r"(auto|cpu|cuda(:\d+)?|mps)")
DEVICE_CHOICES = "auto, cpu, cuda, cuda:N or mps"
#: the dtypes frozen passes may run in (float16 could overflow activations no loss scale guards)
AUTOCAST_DTYPES = ("bfloat16",)


def check_budgets(budgets: Mapping[str, Any]) -> dict[str, float]:
    """``{"macs": 2e6}`` checked: known keys, positive finite numbers (YAML's "2e6" string too)."""
    out: dict[str, float] = {}
    for key, value in budgets.items():
        if key not in BUDGET_KEYS:
            raise ConfigError(
                f"unknown budget {key!r}; budgets exist for {', '.join(BUDGET_KEYS)} "
                "(e.g. macs: 2.0e6)"
            )
        number = value
        if isinstance(value, str):  # YAML reads 2e6 (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if (
            isinstance(number, bool)
            or not isinstance(number, (int, float))
            or not (math.isfinite(number) and number > 0)
        ):
            raise ConfigError(
                f"budget {key}={value!r} must be a positive number of {key} "
                "(plain digits or 2.0e6, no unit suffix)"
            )
        out[key] = float(number)
    return out
