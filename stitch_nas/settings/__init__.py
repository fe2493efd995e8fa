"""The settings of a run: the YAML file of ``stitch-nas search`` (or the same dict in Python),
parsed into dataclasses and checked key by key, without loading torch.

``load_settings(path)`` reads a file; ``settings_from_dict(raw)`` a dict. Zoo sources and data
kinds are registries a plug-in adds to (``ZOO_SOURCES`` with :func:`register_zoo_source`,
``DATA_KINDS`` with :func:`register_data_kind`, or the entry-point groups
``stitch_nas.zoo_sources`` and ``stitch_nas.data_kinds``). ``check_builtin_names`` checks the
names a search's settings give (space, options, heads, adapters) against the built-in plug-ins
without importing them.
"""

from __future__ import annotations

from ._catalogue import check_builtin_names, check_lists, name_list
from ._data_keys import DATA_KINDS, DataKind, register_data_kind
from ._schema import (
    DataSettings,
    FinetuneSettings,
    SearchSettings,
    Settings,
    ZooSettings,
    load_settings,
    settings_from_dict,
)
from ._zoo_keys import ZOO_SOURCES, ZooSource, entry_from_settings, register_zoo_source

__all__ = [
    "DATA_KINDS",
    "DataKind",
    "DataSettings",
    "FinetuneSettings",
    "SearchSettings",
    "Settings",
    "ZOO_SOURCES",
    "ZooSettings",
    "ZooSource",
    "check_builtin_names",
    "check_lists",
    "entry_from_settings",
    "load_settings",
    "name_list",
    "register_data_kind",
    "register_zoo_source",
    "settings_from_dict",
]
