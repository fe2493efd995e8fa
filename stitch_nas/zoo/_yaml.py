"""Zoo entries from checked ``zoo.models`` items (see :mod:`stitch_nas.settings`).

The items arrive checked (keys, types, files); this module creates the models: timm and
torchvision architectures, or a factory of the user's own imported from ``module`` (with
``module_path`` folders put on ``sys.path`` first). Every source takes ``input_size``,
``mean``, ``std`` (the model's own normalisation), ``weights`` (a checkpoint loaded as strictly
as ``load_state_dict(strict=True)``, its sha256 kept) and ``blocks`` (the modules whose ends
are its cut points, see :func:`stitch_nas.fragments.declare_blocks`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from stitch_nas.errors import ConfigError, shorten
from stitch_nas.fragments import declare_blocks

from ._entry import InputSpec, ZooEntry
from ._sources import from_module, from_timm, from_torchvision

__all__ = [
    "import_factory",
    "module_entry",
    "timm_entry",
    "torchvision_entry",
    "user_code_modules",
]

# the module_path folders import_factory put on sys.path, resolved
_USER_FOLDERS: set[Path] = set()


def first_line(exc: BaseException) -> str:
    """``"ValueError: its message's first line"``: what a one-line error quotes of the user's
    exception (a multi-line message or a traceback would break the line)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _side(size: int | Sequence[int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def _spec(item: dict[str, Any], default: InputSpec | None) -> InputSpec | None:
    """The item's input spec: its own ``input_size``/``mean``/``std`` over ``default``."""
    size = item.get("input_size") or item.get("img_size")
    mean, std = item.get("mean"), item.get("std")
    if default is None:
        if size is None or mean is None or std is None:
            return None
        return InputSpec(_side(size), tuple(mean), tuple(std))
    side = _side(size) if size else default.size
    return replace(  # the model's own eval transform (timm's crop) holds at its own size only
        default,
        size=side,
        mean=tuple(mean) if mean else default.mean,
        std=tuple(std) if std else default.std,
        crop_pct=default.crop_pct if side == default.size else None,
    )


def _finish(entry: ZooEntry, item: dict[str, Any]) -> ZooEntry:
    entry.input_spec = _spec(item, entry.input_spec) or entry.input_spec
    if item.get("blocks"):
        declare_blocks(entry.model, item["blocks"])
    return entry


def timm_entry(item: dict[str, Any]) -> ZooEntry:
    """A timm model (``model``, ``weights`` or ``pretrained``, ``img_size``, ``kwargs``)."""
    kwargs = dict(item.get("kwargs") or {})
    common: dict[str, Any] = {
        "weights": item.get("weights"),
        "pretrained": bool(item.get("pretrained")),
        "num_classes": item.get("num_classes"),
        "label_names": item.get("label_names"),
        "entry_name": item.get("name"),
    }
    size = item.get("img_size")
    try:
        entry = from_timm(item["model"], **common, **kwargs, **({"img_size": size} if size else {}))
    except TypeError as exc:  # models taking any input size (CNNs) have no img_size argument
        if not size or "img_size" not in str(exc):
            raise
        entry = from_timm(item["model"], **common, **kwargs)
    return _finish(entry, item)


def torchvision_entry(item: dict[str, Any]) -> ZooEntry:
    """A torchvision architecture with a local ``weights`` file."""
    entry = from_torchvision(
        item["model"],
        item["weights"],
        num_classes=item.get("num_classes"),
        label_names=item.get("label_names"),
        entry_name=item.get("name"),
        **dict(item.get("kwargs") or {}),
    )
    return _finish(entry, item)


def import_factory(spec: str, module_path: str | Sequence[str] | None = None) -> Any:
    """The object ``package.module:attr`` names, importing the module (after putting the
    ``module_path`` folders first on ``sys.path``).

    Raises:
        ConfigError: the module cannot be imported or has no such attribute.
    """
    module_name, _, attr = spec.partition(":")
    folders = [module_path] if isinstance(module_path, str) else list(module_path or ())
    for folder in reversed(folders):
        if folder not in sys.path:
            sys.path.insert(0, folder)
        _USER_FOLDERS.add(Path(folder).resolve())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        where = f" (searched {', '.join(folders)} first)" if folders else ""
        raise ConfigError(
            f"cannot import module {module_name!r} of {spec!r}: {exc}{where}; set module_path "
            "to the folder that holds it"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - the user's code: a SyntaxError, or its own raise
        raise ConfigError(
            f"importing module {module_name!r} of {spec!r} failed: {first_line(exc)}; fix "
            "the module"
        ) from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"module {module_name!r} has no {attr!r}; check module: {spec!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{spec!r} is a {type(obj).__name__}, not a class or function")
    return obj


def user_code_modules() -> list[ModuleType]:
    """The imported modules whose files lie in a ``module_path`` folder.

    Another process (a Ray worker) lacks those folders on its ``sys.path`` and could not import
    them to unpickle a model, so the Ray side ships them with the models, by value.
    """
    modules = []
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file and any(Path(file).resolve().is_relative_to(f) for f in _USER_FOLDERS):
            modules.append(module)
    return modules


def module_entry(item: dict[str, Any], data_labels: Sequence[str]) -> ZooEntry:
    """A model of the user's own: ``module`` factory called with ``kwargs``, then ``weights``.

    Label names default to the data set's; the model must output one score per label.
    """
    factory = import_factory(item["module"], item.get("module_path"))
    kwargs = dict(item.get("kwargs") or {})
    try:
        model = factory(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{item['module']}(**{kwargs!r}) failed: {exc}; fix kwargs") from exc
    except Exception as exc:  # noqa: BLE001 - the user's factory may raise anything
        raise ConfigError(
            f"{item['module']}(**{shorten(kwargs)}) raised {first_line(exc)}; fix the factory "
            "or its kwargs"
        ) from exc
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"{item['module']} returned a {type(model).__name__}; it must return an nn.Module"
        )
    spec = _spec(item, None)
    name = item.get("name") or item["module"].rpartition(":")[2]
    if spec is None:  # the settings check asks for them first; this is for direct callers
        raise ConfigError(
            f"zoo model {name!r}: a module source needs input_size, mean and std; add them"
        )
    labels = tuple(item.get("label_names") or data_labels)
    entry = from_module(
        name,
        model,
        checkpoint=item.get("weights"),
        input_spec=spec,
        label_names=labels,
        source=f"module:{item['module']}",
    )
    try:
        with torch.no_grad():  # one image: a wrong output size fails here, not in the search
            outputs = entry.model(torch.zeros(1, 3, *spec.size)).shape
    except Exception as exc:  # noqa: BLE001 - the user's forward may raise anything
        raise ConfigError(
            f"model {name!r} ({item['module']}) fails on a 1x3x{spec.size[0]}x{spec.size[1]} "
            f"input: {first_line(exc)}; check input_size and the model's forward"
        ) from exc
    if len(outputs) != 2 or outputs[1] != len(labels):
        raise ConfigError(
            f"model {name!r} maps a 1x3x{spec.size[0]}x{spec.size[1]} input to shape "
            f"{tuple(outputs)}, not (1, {len(labels)}) for the {len(labels)} labels; check "
            "input_size, kwargs and label_names"
        )
    entry.info["kwargs"] = kwargs
    return _finish(entry, item)
