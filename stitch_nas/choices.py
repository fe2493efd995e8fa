"""The fixed choices a run names (executors, Ray modes, budgets, export formats, devices,
autocast dtypes), and the checks of the values that both a run's settings and the library take
(budgets, the fidelity share, the CKA threshold, the autocast dtype).

Defined once, here, without torch: the checks before a run (``stitch_nas.pipeline``, the CLI)
read them before anything heavy loads, and the library (``search``, ``export``,
``activations``) reads the same tuples and calls the same checks, so the two cannot drift
apart. ``where`` names the value as the caller's user wrote it (``search.fidelity`` in a
settings file, ``fidelity`` in Python).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from stitch_nas.errors import ConfigError

__all__ = [
    "AUTOCAST_DEVICES",
    "AUTOCAST_DTYPES",
    "BUDGET_FIGURES",
    "BUDGET_KEYS",
    "DEVICE_CHOICES",
    "DEVICE_PATTERN",
    "EXECUTORS",
    "DEFAULT_EXPORT_FORMATS",
    "EXPORT_FORMATS",
    "PROBE_AUTO",
    "PROBE_SIZE_RANGE",
    "ProbeSize",
    "RAY_MODES",
    "check_at_least",
    "check_autocast_device",
    "check_autocast_name",
    "check_budgets",
    "check_cka_threshold",
    "check_control",
    "check_device",
    "check_disk_gb",
    "check_fidelity",
    "check_gpus_per_worker",
    "check_image_size",
    "check_memory_gb",
    "check_objective_names",
    "check_probe_size",
    "default_probe_size",
    "probe_size_for",
    "check_probe_threshold",
    "check_one_of",
    "check_positive",
]

#: where trials run: in this process, or on Ray workers
EXECUTORS = ("local", "ray")
#: how Ray workers get their trials (``stitch_nas.search.RayExecutor``'s ``mode``)
RAY_MODES = ("auto", "driver", "workers")
#: the costs a budget may cap -> the measurement's figure (a trial's user attribute) it caps
BUDGET_FIGURES = {"macs": "macs", "params": "params", "latency": "latency_ms"}
BUDGET_KEYS = tuple(BUDGET_FIGURES)
#: the files an export may write beside its weights
EXPORT_FORMATS = ("safetensors", "pt2", "onnx", "torchscript")
#: what ``stitch-nas export`` writes unless told (TorchScript, deprecated by torch: when asked)
DEFAULT_EXPORT_FORMATS = ("safetensors", "pt2", "onnx")
#: devices a run may name (``auto``: CUDA when present, else the CPU)
DEVICE_PATTERN = re.compile(r"(auto|cpu|cuda(:\d+)?|mps)")
DEVICE_CHOICES = "auto, cpu, cuda, cuda:N or mps"
#: the images a probe split may hold, inclusive: every reader of the probe streams it in
#: batches (least-squares fits, CKA Grams, the proxy), so the top is a bound on time and on
#: the n x n Grams CKA keeps per cut (8,192 images: 0.5 GiB each in float64), not on the fits
PROBE_SIZE_RANGE = (32, 8192)
#: ``probe_size: auto``: ``max(floor, min(per_class * classes, cap))`` images
#: (:func:`default_probe_size`)
PROBE_AUTO = {"floor": 128, "per_class": 8, "cap": 2048}
#: the forms of a probe size (:func:`check_probe_size`): images, "auto" or {"per_class": k}
ProbeSize = int | str | Mapping[str, int]
#: the dtypes frozen passes may run in (float16 could overflow activations no loss scale guards)
AUTOCAST_DTYPES = ("bfloat16",)


def _number(value: Any) -> bool:
    """An int or a float, and not a bool (which Python counts as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: the device types autocast runs on
AUTOCAST_DEVICES = ("cpu", "cuda")


_UNITS = {"macs": "MACs", "params": "parameters", "latency": "milliseconds"}


def check_budgets(budgets: Any, where: str = "budgets") -> dict[str, float]:
    """``{"macs": 2e6}`` checked: known keys, positive finite numbers (YAML's "2e6" string too)."""
    if not isinstance(budgets, Mapping):
        raise ConfigError(f"{where} must map budget names to numbers, e.g. {{macs: 2.0e6}}")
    out: dict[str, float] = {}
    for key, value in budgets.items():
        if key not in BUDGET_KEYS:
            raise ConfigError(
                f"{where}: unknown budget {key!r}; budgets exist for {', '.join(BUDGET_KEYS)} "
                "(e.g. macs: 2.0e6)"
            )
        number = value
        if isinstance(value, str):  # YAML reads 2e6 (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if not _number(number) or not (math.isfinite(number) and number > 0):
            raise ConfigError(
                f"{where}: {key}={value!r} must be a positive number of {_UNITS[key]} "
                "(plain digits or 2.0e6, no unit suffix)"
            )
        out[key] = float(number)
    return out


def check_fidelity(value: Any, where: str = "fidelity") -> float:
    """``value`` as the share of the validation split a new config is scored on first, in
    [0, 1) (0: off), or a one-line ConfigError."""
    if not _number(value) or not 0 <= value < 1:
        raise ConfigError(f"{where}={value!r}: give a share of the split in [0, 1); 0 turns it off")
    return float(value)


def check_cka_threshold(value: Any, where: str = "cka_threshold") -> float:
    """``value`` as the CKA score below which stitched configs are pruned, in [0, 1]."""
    if not _number(value) or not 0 <= value <= 1:
        raise ConfigError(f"{where}={value!r}: give a value in [0, 1] (0 turns CKA pruning off)")
    return float(value)


def check_device(value: str, where: str = "device") -> str:
    """``value`` as a device a run may name (:data:`DEVICE_PATTERN`), or a one-line error."""
    if not DEVICE_PATTERN.fullmatch(value):
        raise ConfigError(f"{where} {value!r}: use {DEVICE_CHOICES}")
    return value


def check_autocast_name(name: str | None, where: str = "autocast") -> None:
    """``name`` (None: off) is a dtype frozen passes may run in."""
    if name is not None and name not in AUTOCAST_DTYPES:
        raise ConfigError(
            f"{where} {name!r} is not supported; use {' or '.join(AUTOCAST_DTYPES)}, "
            "or leave it unset for float32"
        )


def check_autocast_device(name: str | None, device: str, where: str = "autocast") -> None:
    """Autocast ``name`` (None: off) can run on a device of type ``device`` ("cpu", "cuda",
    "mps"; "auto": not known yet)."""
    if name is not None and device not in ("auto", *AUTOCAST_DEVICES):
        raise ConfigError(
            f"{where} {name!r} is not supported on device {device!r}; use it on "
            f"{' or '.join(AUTOCAST_DEVICES)}, or leave it unset"
        )


def check_at_least(value: Any, where: str, minimum: int, note: str = "") -> int:
    """``value`` as a whole number >= ``minimum`` (``note``: what the number means)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}={value!r}: give an integer >= {minimum}{note}")
    return value


def check_positive(value: Any, where: str, note: str = "") -> float:
    """``value`` as a number > 0."""
    if not _number(value) or not value > 0:
        raise ConfigError(f"{where}={value!r}: give a positive number{note}")
    return float(value)


def check_one_of(value: Any, where: str, choices: tuple[str, ...]) -> str:
    """``value`` as one of ``choices``."""
    if value not in choices:
        raise ConfigError(f"{where}={value!r} is unknown; use one of {', '.join(choices)}")
    return value


def check_gpus_per_worker(value: Any, where: str, auto: Any = None) -> Any:
    """``value`` as the GPUs each Ray worker reserves: ``auto`` (the settings file's -1,
    Python's None: the visible GPUs shared out) or a number >= 0, fractions allowed."""
    if value is auto or (auto is not None and not isinstance(value, bool) and value == auto):
        return value
    if not _number(value) or value < 0:
        raise ConfigError(
            f"{where}={value!r}: give {auto!r} (share the visible GPUs) or a number >= 0"
        )
    return float(value)


def check_memory_gb(value: Any, where: str = "memory_gb") -> float:
    """``value`` as an activation cache's memory budget in GiB: a finite number >= 0 (0 keeps
    nothing in memory: every activation is spilled, or recomputed when it is needed)."""
    if not _number(value) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where}={value!r}: give a number of GiB >= 0 (0: keep none in memory)")
    return float(value)


def check_disk_gb(value: Any, where: str = "disk_gb") -> float:
    """``value`` as the GiB a spill folder may take: a finite number >= 0 (0 spills nothing)."""
    if not _number(value) or not math.isfinite(value) or value < 0:
        raise ConfigError(
            f"{where}={value!r}: give a number of GiB >= 0 (0: spill nothing), or leave it out "
            "(half the disk's free space)"
        )
    return float(value)


def check_objective_names(value: Any, where: str = "objectives") -> list[str]:
    """``value`` as a list of objective names, each once (whether each is installed is the
    objectives registry's to say)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"{where}={value!r}: give a list of names such as accuracy and macs")
    for name in value:
        if not isinstance(name, str):
            raise ConfigError(f"{where} holds {name!r}; give objective names")
    twice = [n for n in value if value.count(n) > 1]
    if twice:
        raise ConfigError(f"{where} names {twice[0]!r} twice; give each objective once")
    return list(value)


def check_probe_threshold(
    value: Any, where: str = "probe_threshold", classes: int | None = None
) -> float:
    """``value`` as the multiple of chance a stitch's least-squares probe accuracy must reach
    (0: off): >= 0, and at most ``classes`` (chance times the classes is accuracy 1) once the
    data, and so their number of classes, are known.

    The floor is ``value / classes``: with the default 1.5, 15 % on ten classes and 0.15 % on
    1,000, where it prunes what scores at chance (a broken stitch) and keeps what carries any
    signal; on 2,048 probe images (``probe_size: auto`` there) it asks for 4 right, which a
    stitch at chance reaches one time in seven (:mod:`stitch_nas.stitching._proxy`)."""
    top = "" if classes is None else f", at most {classes} (the data have {classes} classes)"
    if not _number(value) or not 0 <= value or (classes is not None and value > classes):
        raise ConfigError(
            f"{where}={value!r}: give a multiple of chance >= 0{top} (1.5 by default; 0 turns "
            "probe pruning off)"
        )
    return float(value)


def check_image_size(value: Any, where: str = "size") -> int:
    """``value`` as the side of the square images a data set yields: an integer >= 8 pixels."""
    return check_at_least(value, where, 8, " (image side in pixels)")


def check_control(value: Any, where: str = "control") -> bool | list[str]:
    """``value`` as the fine-tune stage's control: a bool (true: the zoo's front models) or a
    non-empty list of distinct zoo model names (those and the front's; whether each is a zoo
    model is checked once the zoo is known: ``stitch_nas.finetune.check_stage``)."""
    if isinstance(value, bool):
        return value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(name, str) and name for name in value)
        and len(set(value)) == len(value)
    ):
        return list(value)
    raise ConfigError(
        f"{where}={value!r}: give true (the zoo's front models), false, or a list of distinct "
        "zoo model names (those and the front's), e.g. [resnet44]"
    )


def check_probe_size(value: Any, where: str = "probe_size") -> int | str | dict[str, int]:
    """``value`` as the size of the probe split, in one of three forms:

    * an integer in :data:`PROBE_SIZE_RANGE`: that many images;
    * ``"auto"`` (the default): :func:`default_probe_size` of the data's number of classes;
    * ``{"per_class": k}``, k >= 1: k images per class, at least the range's bottom.

    The last two are resolved by :func:`probe_size_for` once the data's classes are known.
    """
    low, high = PROBE_SIZE_RANGE
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool)):
        if value == "auto" or low <= value <= high:
            return value
    elif isinstance(value, Mapping) and list(value) == ["per_class"]:
        k = value["per_class"]
        if isinstance(k, int) and not isinstance(k, bool) and k >= 1:
            return {"per_class": k}
    raise ConfigError(
        f"{where}={value!r}: give an integer in [{low}, {high}] (images in the probe split), "
        "auto (from the number of classes) or {per_class: k} with k >= 1"
    )


def default_probe_size(classes: int) -> int:
    """The probe size ``auto`` gives for ``classes`` classes: 8 images per class, at least 128
    and at most 2,048 (:data:`PROBE_AUTO`): 128 for 10 classes, 800 for 100, 2,048 (about 2
    per class) for 1,000. The cap bounds the time every probe pass takes (each zoo model runs
    on the probe once per cut it caches) and the CKA Grams (32 MiB each at 2,048)."""
    rule = PROBE_AUTO
    return max(rule["floor"], min(rule["per_class"] * classes, rule["cap"]))


def probe_size_for(value: Any, classes: int, where: str = "probe_size") -> int:
    """The number of probe images ``value`` (any form of :func:`check_probe_size`) names for
    data of ``classes`` classes; ``{per_class: k}`` above the range's top is a one-line error."""
    value = check_probe_size(value, where)
    if value == "auto":
        return default_probe_size(classes)
    if isinstance(value, int):
        return value
    low, high = PROBE_SIZE_RANGE
    images = value["per_class"] * classes
    if images > high:
        raise ConfigError(
            f"{where}={value!r} is {images} images for {classes} classes, above {high}; give "
            f"per_class <= {high // classes} or an integer probe size"
        )
    return max(low, images)
