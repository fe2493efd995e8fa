"""The ``zoo.models`` items of a ``stitch-nas search`` file: sources, their keys, their checks.

Every item names a ``source`` registered in :data:`ZOO_SOURCES` (``timm``, ``torchvision``,
``module``: any factory of your own; plug-ins add more through the entry-point group
``stitch_nas.zoo_sources``). Each source declares its keys; an item is checked while the file
is parsed, before torch loads: an unknown key, a bad value, a missing file or an unset
environment variable is a one-line :class:`~stitch_nas.errors.ConfigError` that names the key.
Paths are taken relative to the YAML file and may use ``$VARIABLES``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stitch_nas.errors import ConfigError, UnknownNameError
from stitch_nas.registry import Option, Registry

__all__ = [
    "ZOO_SOURCES",
    "ZooSource",
    "check_zoo_item",
    "entry_from_settings",
    "expand_path",
    "register_zoo_source",
]


@dataclass(frozen=True)
class ZooSource:
    """One source of zoo entries.

    Attributes:
        keys: the item keys this source takes besides the common ones (:data:`COMMON_KEYS`).
        required: keys an item of this source must give.
        build: ``(checked item, the data's label names) -> ZooEntry``; it may import torch.
        paths: keys whose values are paths (expanded and resolved against the YAML file).
    """

    keys: Mapping[str, Option]
    required: tuple[str, ...]
    build: Callable[[dict[str, Any], tuple[str, ...]], Any]
    paths: tuple[str, ...] = ()


ZOO_SOURCES: Registry[ZooSource] = Registry("zoo source", group="stitch_nas.zoo_sources")


def _is_size(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _text(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


def _triple(v: Any, positive: bool) -> bool:
    if not isinstance(v, list) or len(v) != 3:
        return False
    ok = [isinstance(x, (int, float)) and not isinstance(x, bool) for x in v]
    return all(ok) and (not positive or min(v) > 0)


def _option(check: Callable[[Any], bool], expect: str) -> Option:
    return Option(None, lambda v: v is None or check(v), expect)


_SIDE = _option(
    lambda v: _is_size(v) or (isinstance(v, list) and len(v) == 2 and all(map(_is_size, v))),
    "an int or [height, width]",
)
_FILE = _option(_text, "a file path")
_NAMES = _option(lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list")

#: keys every source takes
COMMON_KEYS: dict[str, Option] = {
    "name": _option(_text, "a non-empty string (the model's name in the zoo)"),
    "source": _option(_text, "a source name"),
    "weights": _FILE,
    "label_names": _NAMES,
    "input_size": _SIDE,
    "mean": _option(lambda v: _triple(v, False), "3 numbers, e.g. [0.485, 0.456, 0.406]"),
    "std": _option(lambda v: _triple(v, True), "3 numbers > 0, e.g. [0.229, 0.224, 0.225]"),
    "blocks": _option(
        lambda v: isinstance(v, list) and bool(v) and all(map(_text, v)),
        "a non-empty list of module names or patterns (the modules that end cut points)",
    ),
}
_KWARGS = _option(lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v), "a mapping")
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def register_zoo_source(
    name: str,
    keys: Mapping[str, Option],
    *,
    required: Sequence[str] = (),
    paths: Sequence[str] = (),
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``build(item, label_names) -> ZooEntry`` as zoo source ``name``."""

    def add(build: Callable[..., Any]) -> Callable[..., Any]:
        ZOO_SOURCES.register(name, ZooSource(dict(keys), tuple(required), build, tuple(paths)))
        return build

    return add


@register_zoo_source(
    "timm",
    {
        "model": _option(_text, "a timm model name"),
        "num_classes": _option(_is_size, "an int >= 1"),
        "pretrained": Option(False, lambda v: isinstance(v, bool), "true or false"),
        "img_size": _SIDE,
        "kwargs": _KWARGS,
    },
    required=("model",),
)
def _timm(item: dict[str, Any], labels: tuple[str, ...]) -> Any:
    from stitch_nas.zoo import timm_entry

    return timm_entry(item)


@register_zoo_source(
    "torchvision",
    {
        "model": _option(_text, "a torchvision model name"),
        "num_classes": _option(_is_size, "an int >= 1"),
        "img_size": _SIDE,  # the older name of input_size
        "kwargs": _KWARGS,
    },
    required=("model", "weights"),
)
def _torchvision(item: dict[str, Any], labels: tuple[str, ...]) -> Any:
    from stitch_nas.zoo import torchvision_entry

    return torchvision_entry(item)


@register_zoo_source(
    "module",
    {
        "module": _option(
            lambda v: isinstance(v, str) and bool(_FACTORY.match(v)),
            "'package.module:factory' (a class or function returning the nn.Module)",
        ),
        "module_path": _option(
            lambda v: _text(v) or (isinstance(v, list) and bool(v) and all(map(_text, v))),
            "a folder (or list of folders) to import the module from",
        ),
        "kwargs": _KWARGS,
    },
    required=("module", "input_size", "mean", "std"),
    paths=("module_path",),
)
def _module(item: dict[str, Any], labels: tuple[str, ...]) -> Any:
    from stitch_nas.zoo import module_entry

    return module_entry(item, labels)


_UNSET = re.compile(r"\$\{?(\w+)\}?")
_DEFAULTED = re.compile(r"\$\{(\w+):-([^}]*)\}")


def expand_path(value: str, base: Path | None, what: str) -> str:
    """``value`` with ``~``, ``$VARIABLE`` and ``${VARIABLE:-default}`` expanded, made absolute
    against ``base`` (the YAML file's folder)."""
    defaulted = _DEFAULTED.sub(lambda m: os.environ.get(m.group(1)) or m.group(2), value)
    expanded = os.path.expandvars(os.path.expanduser(defaulted))
    unset = [m.group(1) for m in _UNSET.finditer(expanded) if m.group(1) not in os.environ]
    if unset:
        raise ConfigError(
            f"{what}: environment variable ${unset[0]} in {value!r} is not set; export it "
            "or write the path out"
        )
    path = Path(expanded)
    if base is not None and not path.is_absolute():
        path = base / path
    return os.path.normpath(path)


def check_zoo_item(item: Any, index: int, base: Path | None) -> dict[str, Any]:
    """One ``zoo.models`` item checked, with paths made absolute and defaults filled in.

    Args:
        item: the item as read from YAML.
        index: its position, for messages.
        base: the folder relative paths start from (the YAML file's), or None (as given).

    Raises:
        ConfigError: a wrong key, type or value, a missing file or folder.
    """
    if not isinstance(item, Mapping):
        raise ConfigError(
            f"zoo.models[{index}] must be a mapping (name, source, ...), got {type(item).__name__}"
        )
    label = item.get("name") or item.get("model") or item.get("module") or index
    at = f"zoo.models item {label!r}"
    source = item.get("source")
    if source is None:
        raise ConfigError(f"{at}: missing key 'source'; use one of {', '.join(ZOO_SOURCES)}")
    try:
        spec = ZOO_SOURCES.get(str(source))
    except UnknownNameError as exc:
        raise ConfigError(f"{at}: source: {exc}") from None
    table = {**COMMON_KEYS, **spec.keys}
    checked = {key: option.default for key, option in table.items()}
    for key, value in item.items():
        if key not in table:
            raise ConfigError(
                f"{at}: unknown key {key!r}; valid keys for source {source}: {', '.join(table)}"
            )
        if not table[key].check(value):
            raise ConfigError(
                f"{at}: {key} must be {table[key].expect}, got {type(value).__name__} {value!r}"
            )
        checked[key] = value
    if checked.get("pretrained") and checked.get("weights") is not None:
        raise ConfigError(f"{at}: pretrained: true and weights exclude each other; drop one")
    for key in spec.required:
        if checked.get(key) is None:
            raise ConfigError(
                f"{at}: missing key {key!r}; source {source} needs {', '.join(spec.required)}"
            )
    for key in ("weights", *spec.paths):
        value = checked.get(key)
        if value is None:
            continue
        values = [value] if isinstance(value, str) else list(value)
        resolved = [expand_path(v, base, f"{at}: {key}") for v in values]
        for path in resolved:
            exists = Path(path).is_file() if key == "weights" else Path(path).is_dir()
            if not exists:
                kind = "file" if key == "weights" else "folder"
                raise ConfigError(
                    f"{at}: {key} {path!r} is not an existing {kind}; fix the path (relative "
                    "paths start at the YAML file's folder)"
                )
        checked[key] = resolved[0] if isinstance(value, str) else resolved
    if checked.get("name") is None:  # the zoo's name: the model's, else the factory's
        checked["name"] = checked.get("model") or str(checked.get("module")).rpartition(":")[2]
    if checked.get("img_size") and checked.get("input_size"):
        if _side(checked["img_size"]) != _side(checked["input_size"]):
            raise ConfigError(f"{at}: img_size and input_size differ; give only input_size")
    return checked


def _side(size: int | Sequence[int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def entry_from_settings(
    item: Mapping[str, Any], label_names: Sequence[str] = (), *, base: Path | None = None
) -> Any:
    """Check one ``zoo.models`` item and build its :class:`~stitch_nas.zoo.ZooEntry`.

    Args:
        item: the item, as in the YAML file.
        label_names: the data set's label names (the default of ``module`` entries).
        base: the folder relative paths start from (None: the working directory).
    """
    checked = check_zoo_item(item, 0, base)
    return ZOO_SOURCES.get(checked["source"]).build(checked, tuple(label_names))
