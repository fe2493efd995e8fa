"""The adapter registry: kinds of stitching layer, each with its declared options.

A kind is registered once, by a decorator on its factory ``(src, dst, **structural) -> module``.
Its options are declared with defaults and checks, so ``create`` can refuse an unknown option
or a bad value with a one-line error before anything is built. Options marked *structural*
reach the factory; the others (initialisation, training) are read by the fitting code. Equal
structural options and cut points always give modules with equal ``state_dict`` keys and
shapes: fitting and training change values only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from stitch_nas.errors import ConfigError, LayoutError
from stitch_nas.fragments import CutPoint
from stitch_nas.registry import Option, Registry, check_options, choice, integer, number

from ._options import BUILTIN_KINDS, KindOptions

__all__ = [
    "ADAPTERS",
    "Option",
    "choice",
    "integer",
    "number",
    "AdapterKind",
    "register_adapter",
    "get_adapter",
    "registered_kinds",
    "list_adapters",
    "resolve_options",
    "check_options",
    "can_join",
    "create",
]

Factory = Callable[..., nn.Module]


@dataclass(frozen=True)
class AdapterKind:
    """A registered adapter kind: its factory, options and one line saying what it is."""

    name: str
    factory: Factory
    options: Mapping[str, Option] = field(default_factory=dict)
    trainable: bool = True
    description: str = ""


#: every adapter kind; plug-ins register through the entry-point group ``stitch_nas.adapters``
ADAPTERS: Registry[AdapterKind] = Registry("adapter", group="stitch_nas.adapters")


def register_adapter(
    name: str,
    *,
    options: Mapping[str, Option] | None = None,
    trainable: bool = True,
    description: str = "",
) -> Callable[[Factory], Factory]:
    """Decorator adding an adapter kind under ``name``; a duplicate name is an error.

    A built-in kind takes the options and trainability declared in :mod:`._options` (where the
    settings check reads them without torch) and refuses others.
    """
    declared = BUILTIN_KINDS.get(name)
    given = options is not None or not trainable
    if declared is not None and not given:
        options, trainable = declared.options, declared.trainable

    def built_in(kind: AdapterKind) -> None:
        if declared is not None and given:
            raise ConfigError(
                f"adapter {name!r} is built in, with the options stitch_nas/adapters/_options.py "
                "declares; register a new kind under another name"
            )

    def add(factory: Factory) -> Factory:
        kind = AdapterKind(name, factory, dict(options or {}), trainable, description)
        ADAPTERS.register(name, kind, check=built_in)
        return factory

    return add


def registered_kinds() -> dict[str, KindOptions]:
    """Every registered kind's options and whether it trains (plug-ins' kinds included)."""
    return {
        name: KindOptions(kind.options, kind.trainable)
        for name in ADAPTERS.list()
        for kind in [ADAPTERS.get(name)]
    }


def get_adapter(name: str) -> AdapterKind:
    """The registered kind ``name``; raises UnknownNameError listing the available ones."""
    return ADAPTERS.get(name)


def list_adapters(pattern: str = "*") -> list[str]:
    """Registered adapter names matching the shell-style ``pattern``, sorted."""
    return ADAPTERS.list(pattern)


def resolve_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """All options of adapter ``name``: the given ones, checked, and defaults for the rest."""
    return check_options(get_adapter(name).options, options, f"adapter {name!r}")


def create(name: str, src: CutPoint, dst: CutPoint, **options: Any) -> nn.Module:
    """An unfitted adapter of kind ``name`` from cut ``src`` to cut ``dst``.

    Raises:
        UnknownNameError: no adapter of that name is registered.
        ConfigError: an option is unknown or has a bad value.
        LayoutError: this kind cannot join the two cut points (the message says why).
    """
    kind = get_adapter(name)
    resolved = resolve_options(name, options)
    structural = {k: v for k, v in resolved.items() if kind.options[k].structural}
    return kind.factory(src, dst, **structural)


def can_join(kind: str, src: CutPoint, dst: CutPoint, resize: str | None = None) -> bool:
    """Whether adapter ``kind`` (with rescaling ``resize`` if given) joins ``src`` to ``dst``."""
    return _can_join(kind, src, dst, resize)


@functools.lru_cache(maxsize=65536)
def _can_join(kind: str, src: CutPoint, dst: CutPoint, resize: str | None) -> bool:
    try:  # building the (small, unfitted) module runs exactly the checks a trial would
        create(kind, src, dst, **({} if resize is None else {"resize": resize}))
    except LayoutError:
        return False
    return True
