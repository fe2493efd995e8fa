"""The adapter registry: kinds of stitching layer, each with its declared options.

A kind is registered once, by a decorator on its factory ``(src, dst, **structural) -> module``.
Its options are declared with defaults and checks, so ``create`` can refuse an unknown option
or a bad value with a one-line error before anything is built. Options marked *structural*
reach the factory; the others (initialisation, training) are read by the fitting code. Equal
structural options and cut points always give modules with equal ``state_dict`` keys and
shapes: fitting and training change values only.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..errors import ConfigError, UnknownNameError
from ..fragments import CutPoint

__all__ = [
    "Option",
    "AdapterKind",
    "register_adapter",
    "get_adapter",
    "list_adapters",
    "resolve_options",
    "check_options",
    "create",
]

Factory = Callable[..., nn.Module]


@dataclass(frozen=True)
class Option:
    """One declared option of an adapter kind.

    Attributes:
        default: the value used when the option is not given.
        check: returns True for an acceptable value.
        expect: what an acceptable value is, for the error message ("an int >= 1").
        structural: whether the option changes the module's structure (passed to the factory).
    """

    default: Any
    check: Callable[[Any], bool]
    expect: str
    structural: bool = False


def choice(default: Any, *values: Any, structural: bool = False) -> Option:
    """An option that takes one of ``values``."""
    return Option(default, lambda v: v in values, f"one of {values}", structural)


def integer(
    default: int | None, minimum: int, *, optional: bool = False, structural: bool = False
) -> Option:
    """An int option of at least ``minimum`` (or None where ``optional``)."""

    def ok(v: Any) -> bool:
        if v is None:
            return optional
        return isinstance(v, int) and not isinstance(v, bool) and v >= minimum

    expect = f"an int >= {minimum}" + (" or null" if optional else "")
    return Option(default, ok, expect, structural)


def number(
    default: float | None, minimum: float, *, optional: bool = False, structural: bool = False
) -> Option:
    """A number option of at least ``minimum`` (or None where ``optional``)."""

    def ok(v: Any) -> bool:
        if v is None:
            return optional
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v >= minimum

    expect = f"a number >= {minimum:g}" + (" or null" if optional else "")
    return Option(default, ok, expect, structural)


@dataclass(frozen=True)
class AdapterKind:
    """A registered adapter kind: its factory, options and one line saying what it is."""

    name: str
    factory: Factory
    options: Mapping[str, Option] = field(default_factory=dict)
    trainable: bool = True
    description: str = ""


_REGISTRY: dict[str, AdapterKind] = {}


def register_adapter(
    name: str, *, options: Mapping[str, Option], trainable: bool = True, description: str = ""
) -> Callable[[Factory], Factory]:
    """Decorator adding an adapter kind under ``name``; a duplicate name is an error."""

    def add(factory: Factory) -> Factory:
        if name in _REGISTRY:
            raise ConfigError(f"adapter {name!r} is already registered; pick a new name")
        _REGISTRY[name] = AdapterKind(name, factory, dict(options), trainable, description)
        return factory

    return add


def get_adapter(name: str) -> AdapterKind:
    """The registered kind ``name``; raises UnknownNameError listing the available ones."""
    if name not in _REGISTRY:
        raise UnknownNameError(
            f"unknown adapter {name!r}; available: {', '.join(sorted(_REGISTRY))}"
        )
    return _REGISTRY[name]


def list_adapters(pattern: str = "*") -> list[str]:
    """Registered adapter names matching the shell-style ``pattern``, sorted."""
    return sorted(n for n in _REGISTRY if fnmatch.fnmatch(n, pattern))


def resolve_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """All options of adapter ``name``: the given ones, checked, and defaults for the rest."""
    return check_options(get_adapter(name).options, options, f"adapter {name!r}")


def check_options(
    table: Mapping[str, Option], options: Mapping[str, Any], what: str
) -> dict[str, Any]:
    """``options`` checked against ``table`` (unknown keys, bad values: one-line errors naming
    ``what``), with the table's defaults for the keys not given."""
    unknown = sorted(set(options) - set(table))
    if unknown:
        raise ConfigError(
            f"unknown option(s) {unknown} for {what}; valid: {', '.join(sorted(table))}"
        )
    resolved = {key: opt.default for key, opt in table.items()}
    for key, value in options.items():
        if not table[key].check(value):
            raise ConfigError(
                f"option {key}={value!r} of {what} is invalid; use {table[key].expect}"
            )
        resolved[key] = value
    return resolved


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
