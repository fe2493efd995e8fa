"""A study continued with ``--resume`` or ``--join`` gets no trial from another search.

Optuna refuses a parameter whose choices changed ("CategoricalDistribution does not support
dynamic value space") only once a trial is under way, and records it FAIL; a different data
set or objective would mix figures that cannot be compared. The settings the study recorded
are compared with the run's before the zoo loads, and the first difference is named.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stitch_nas.errors import ConfigError

__all__ = ["SAME_ON_RESUME", "check_resumed"]

#: what a resumed or joined study must share with the run that recorded it: the networks a
#: trial can be (zoo, space) and what they are measured on and for (data, objectives)
SAME_ON_RESUME = ("zoo.mini_zoo", "zoo.models", "data", "search.space", "search.space_options",
                  "search.objectives")  # fmt: skip
_FREE_ON_RESUME = ("data.workers",)  # how the data load, not what they are


def check_resumed(settings: Any, out_dir: Path, study_name: str) -> None:
    """A study continued with ``--resume`` or ``--join`` gets no trial from another search:
    its zoo, space, data and objectives are the ones it recorded (before the zoo loads)."""
    from dataclasses import asdict

    from stitch_nas import attrs
    from stitch_nas.search import load_folder_study
    from stitch_nas.settings import settings_from_dict

    storage = settings.search.storage
    try:
        study = load_folder_study(out_dir, storage=storage, study_name=study_name)
    except ConfigError:  # --join creating it: nothing recorded yet
        return
    raw = study.user_attrs.get(attrs.SETTINGS)
    if raw is None:  # the run that created it stopped before recording (or an old study)
        return
    recorded, current = asdict(settings_from_dict(raw)), asdict(settings)
    for key in SAME_ON_RESUME:
        found = _difference(_at(recorded, key), _at(current, key), key)
        if found is not None:
            where, was, now = found
            raise ConfigError(
                f"the study {study_name!r} was searched with {where} = {_shown(was)}, this run "
                f"has {_shown(now)}; continue it with the same settings, or search into "
                "another --out"
            )


def _at(tree: Mapping[str, Any], key: str) -> Any:
    for part in key.split("."):
        tree = tree[part]
    return tree


def _difference(was: Any, now: Any, where: str) -> tuple[str, Any, Any] | None:
    """The first place where ``was`` and ``now`` differ: ``(dotted path, was, now)``."""
    if where in _FREE_ON_RESUME:
        return None
    if isinstance(was, Mapping) and isinstance(now, Mapping):
        for key in sorted(set(was) | set(now), key=str):
            found = _difference(was.get(key), now.get(key), f"{where}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(was, list) and isinstance(now, list) and len(was) == len(now):
        for i, (a, b) in enumerate(zip(was, now, strict=True)):
            found = _difference(a, b, f"{where}[{i}]")
            if found is not None:
                return found
        return None
    return None if was == now else (where, was, now)


def _shown(value: Any) -> str:
    """A value for a message: a list of zoo items by their names, anything else short."""
    from stitch_nas.errors import shorten

    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        value = [v.get("name") or v.get("model") or v.get("module") for v in value]
    return shorten(value)
