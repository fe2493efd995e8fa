"""The plug-ins a search's settings name, checked in one place: space, its options, the
adapters and heads they name, the refined adapters.

The check reads tables of what each plug-in takes. Built-in plug-ins declare theirs without
torch (``stitch_nas.adapters.BUILTIN_KINDS``, ``stitch_nas.stitching.BUILTIN_HEADS``, and the
spaces' options through the entry-point group ``stitch_nas.space_options``), so a misspelt
name, option or value answers at once, before torch loads. When a third-party plug-in is
installed (an entry point the project does not ship), a name missing from the declarations may
be its, so the tables are read from the registries instead, after torch loads
(:func:`registered_tables`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from stitch_nas.adapters import (
    BUILTIN_KINDS,
    LOSSES,
    RESIZE_MODES,
    TRAINS,
    KindOptions,
    refined_adapters,
)
from stitch_nas.errors import ConfigError
from stitch_nas.registry import (
    Option,
    check_keywords,
    check_options,
    keyword_defaults,
    unknown_name,
)
from stitch_nas.stitching import BUILTIN_HEADS

__all__ = [
    "PluginTables",
    "check_lists",
    "check_plugin_settings",
    "declared_tables",
    "name_list",
    "registered_tables",
    "third_party_plugins",
]

#: the entry points the project itself declares (pyproject.toml), per group
BUILTIN_ENTRY_POINTS = {
    "stitch_nas.spaces": {"builtin"},
    "stitch_nas.objectives": {"builtin"},
    "stitch_nas.heads": {"builtin"},
    "stitch_nas.networks": {"snnet"},
    "stitch_nas.adapters": {"builtin"},
}
#: where plug-ins declare their spaces' keyword options without torch
SPACE_OPTIONS_GROUP = "stitch_nas.space_options"


@dataclass(frozen=True)
class PluginTables:
    """What the plug-ins take: each space's keyword options with their defaults (None: any
    option, a space with ``**options``), each adapter kind's options and whether it trains,
    each head's options."""

    spaces: Mapping[str, Mapping[str, Any] | None]
    adapters: Mapping[str, KindOptions]
    heads: Mapping[str, Mapping[str, Option]]


def third_party_plugins() -> list[str]:
    """Installed plug-ins the project does not ship (``group:name``), found without importing."""
    return [
        f"{group}:{ep.name}"
        for group, ours in BUILTIN_ENTRY_POINTS.items()
        for ep in entry_points(group=group)
        if ep.name not in ours
    ]


def declared_tables() -> PluginTables | None:
    """The built-in plug-ins' declarations, read without torch; None when a third-party plug-in
    is installed (its names are not declared here)."""
    if third_party_plugins():
        return None
    spaces: dict[str, Mapping[str, Any]] = {}
    for ep in entry_points(group=SPACE_OPTIONS_GROUP):
        spaces.update(ep.load())
    return PluginTables(spaces, BUILTIN_KINDS, BUILTIN_HEADS)


def registered_tables() -> PluginTables:
    """The same, read from the registries: every installed plug-in (imports them, and torch)."""
    from stitch_nas.adapters import registered_kinds
    from stitch_nas.plugins import HEADS, SPACES

    return PluginTables(
        spaces={name: keyword_defaults(SPACES.get(name)) for name in SPACES.list()},
        adapters=registered_kinds(),
        heads={name: HEADS.get(name).options for name in HEADS.list()},
    )


def name_list(key: str, value: Any) -> list[str]:
    """A name or list of names (None: none), else a one-line error."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ConfigError(f"search.space_options.{key}={value!r}: give a name or a list of names")


def check_lists(value: Callable[[str], Any]) -> None:
    """The option lists every built-in space reads the same way (``value(key)``: given, else
    the space's default): resizes, losses, trains."""
    for key, valid in (("resizes", RESIZE_MODES), ("losses", LOSSES), ("trains", TRAINS)):
        bad = sorted(set(name_list(key, value(key))) - set(valid))
        if bad:
            raise ConfigError(
                f"search.space_options.{key}: unknown {bad}; use some of {', '.join(valid)}"
            )


def _kind(tables: PluginTables, name: str) -> KindOptions:
    if name not in tables.adapters:
        raise unknown_name("adapter", name, tables.adapters)
    return tables.adapters[name]


def check_plugin_settings(search: Any, tables: PluginTables) -> None:
    """The search space and its options, the head, adapters, adapter options and refined
    adapters that ``search`` (``SearchSettings``) names, against ``tables``: names, option
    names and option values, each a one-line error."""
    if search.space not in tables.spaces:
        raise unknown_name("search space", search.space, tables.spaces)
    defaults = tables.spaces[search.space]
    options = dict(search.space_options)
    check_keywords(defaults, options, f"search space {search.space!r}")

    def value(key: str) -> Any:
        return options[key] if key in options else (defaults or {}).get(key)

    head = value("head")
    if isinstance(head, str) and head != "native" and head not in tables.heads:
        raise unknown_name("head", head, tables.heads)
    # the option names the built-in spaces share; a plug-in space that reads others checks them
    names = name_list("adapters", value("adapters")) or name_list("adapter", value("adapter"))
    kinds = {name: _kind(tables, name) for name in names}
    check_lists(value)
    extra = value("adapter_options") or {}
    if not isinstance(extra, Mapping):
        raise ConfigError(f"search.space_options.adapter_options must be a mapping, got {extra!r}")
    for name, kind in kinds.items():  # the spaces pass adapter_options to every trained kind
        if kind.trainable:
            where = f"adapter {name!r} (search.space_options.adapter_options)"
            check_options(kind.options, extra, where)
    if search.refine_trials:
        refined_adapters(search.refine_adapters, tables.adapters, "search.refine_adapters")
