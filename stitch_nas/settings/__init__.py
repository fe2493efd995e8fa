"""The settings of a run: the YAML file of ``stitch-nas search`` (or the same dict in Python),
parsed into dataclasses and checked key by key, without loading torch.

``load_settings(path)`` reads a file; ``settings_from_dict(raw)`` a dict. Each value is checked
in one place: its limits by :func:`check_settings` (the table :data:`FIELD_CHECKS`), or by the
one function :data:`CHECKED_BY` names. Zoo sources and data
kinds are registries a plug-in adds to (``ZOO_SOURCES`` with :func:`register_zoo_source`,
``DATA_KINDS`` with :func:`register_data_kind`, or the entry-point groups
``stitch_nas.zoo_sources`` and ``stitch_nas.data_kinds``). ``check_plugin_settings`` checks the
plug-ins a search's settings name (space, options, heads, adapters) against the tables the
plug-ins declare: without torch for the built-in ones (``declared_tables``).
"""

from __future__ import annotations

from ._data_keys import DATA_KINDS, DataKind, register_data_kind
from ._plugin_options import (
    PluginTables,
    check_plugin_settings,
    declared_tables,
    registered_tables,
)
from ._schema import (
    DataSettings,
    FinetuneSettings,
    SearchSettings,
    Settings,
    ZooSettings,
    load_settings,
    settings_from_dict,
)
from ._values import CHECKED_BY, FIELD_CHECKS, TYPE_ONLY, check_settings
from ._zoo_keys import ZOO_SOURCES, ZooSource, entry_from_settings, register_zoo_source

__all__ = [
    "CHECKED_BY",
    "FIELD_CHECKS",
    "TYPE_ONLY",
    "check_settings",
    "DATA_KINDS",
    "DataKind",
    "DataSettings",
    "FinetuneSettings",
    "SearchSettings",
    "Settings",
    "ZOO_SOURCES",
    "ZooSettings",
    "ZooSource",
    "PluginTables",
    "check_plugin_settings",
    "declared_tables",
    "entry_from_settings",
    "load_settings",
    "register_data_kind",
    "register_zoo_source",
    "registered_tables",
    "settings_from_dict",
]
