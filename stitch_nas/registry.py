"""One registry class for every extension point, and declared options with checks.

Adapters, search spaces, objectives, heads, zoo sources, data kinds and network builders are
each a :class:`Registry` owned by the core. Entries are added by decorator
(``@ADAPTERS.register("name")``); a duplicate name is an error. Third-party packages add
entries through a Python entry-point group (``stitch_nas.adapters``, ``stitch_nas.spaces``...):
the registry imports every entry point of its group the first time a name is looked up or
listed, so installing a plug-in is enough to use it. The built-in search spaces, objectives,
adapter kinds and heads are registered the same way, which is why the core never imports those
packages by name (and why the faces of ``stitch_nas.adapters`` and ``stitch_nas.stitching`` can
stay lazy: importing them registers nothing).

This module imports nothing heavy: the CLI checks names and options before torch loads.
"""

from __future__ import annotations

import fnmatch
import inspect
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar, overload

from .errors import ConfigError, UnknownNameError, shorten

__all__ = [
    "Option",
    "Registry",
    "check_options",
    "choice",
    "integer",
    "check_keywords",
    "keyword_defaults",
    "keyword_options",
    "number",
    "unknown_name",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Option:
    """One declared option of a registered entry.

    Attributes:
        default: the value used when the option is not given.
        check: returns True for an acceptable value.
        expect: what an acceptable value is, for the error message ("an int >= 1").
        structural: whether the option changes a module's structure (adapters pass these to
            their factory; the others are read by the fitting code).
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
                f"option {key}={shorten(value)} of {what} is invalid; use {table[key].expect}"
            )
        resolved[key] = value
    return resolved


class Registry(Generic[T]):
    """Named entries of one kind, filled by decorator and by an entry-point group.

    Args:
        kind: what an entry is, for messages ("adapter", "search space").
        group: the entry-point group plug-ins register through (None: none). An entry point
            names a module (imported, so its decorators run) or an object (registered under
            the entry point's name).
    """

    def __init__(self, kind: str, group: str | None = None) -> None:
        self.kind, self.group = kind, group
        self._entries: dict[str, T] = {}
        self._loaded = group is None

    @overload
    def register(
        self, name: str, *, check: Callable[[T], None] | None = None
    ) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, obj: T, *, check: Callable[[T], None] | None = None) -> T: ...

    def register(
        self, name: str, obj: Any = None, *, check: Callable[[T], None] | None = None
    ) -> Any:
        """Add ``obj`` under ``name`` (or decorate: ``@registry.register(name)``); ``check``,
        if given, sees a new entry first and raises to refuse it.

        Raises:
            ConfigError: ``name`` is already registered.
        """

        def add(value: T) -> T:
            if name in self._entries:
                raise ConfigError(f"{self.kind} {name!r} is already registered; pick a new name")
            if check is not None:
                check(value)
            self._entries[name] = value
            return value

        return add if obj is None else add(obj)

    def get(self, name: str) -> T:
        """The entry ``name``; raises UnknownNameError listing the available ones."""
        if name not in self._entries:
            self.load_plugins()
        if name not in self._entries:
            raise unknown_name(self.kind, name, self.list())
        return self._entries[name]

    def list(self, pattern: str = "*") -> list[str]:
        """Registered names matching the shell-style ``pattern``, sorted."""
        self.load_plugins()
        return sorted(n for n in self._entries if fnmatch.fnmatch(n, pattern))

    def __contains__(self, name: object) -> bool:
        if name not in self._entries:
            self.load_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.list())

    def load_plugins(self) -> None:
        """Import the entry points of this registry's group (once)."""
        if self._loaded or self.group is None:
            return
        self._loaded = True
        for ep in entry_points(group=self.group):
            try:
                obj = ep.load()
            except Exception as exc:  # a broken plug-in must not hide the working ones
                logger.warning(
                    "%s plug-in %r (%s) failed to load: %s", self.kind, ep.name, ep.value, exc
                )
                continue
            if not inspect.ismodule(obj) and ep.name not in self._entries:
                self._entries[ep.name] = obj


def unknown_name(kind: str, name: str, known: Iterable[str]) -> UnknownNameError:
    """The one-line error for a name no ``kind`` has, listing the ones that exist."""
    available = ", ".join(sorted(known)) or "none (is stitch-nas installed? pip install -e .)"
    return UnknownNameError(f"unknown {kind} {shorten(name)}; available: {available}")


def keyword_defaults(fn: Callable[..., Any]) -> dict[str, Any] | None:
    """``fn``'s keyword-only parameters and their defaults (None: it takes ``**options``)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def check_keywords(valid: Mapping[str, Any] | None, options: Mapping[str, Any], what: str) -> None:
    """Refuse keyword ``options`` not in ``valid`` (None: any), in one line naming the valid."""
    if valid is None:
        return
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ConfigError(f"unknown option(s) {unknown} for {what}; valid: {', '.join(valid)}")


def keyword_options(fn: Callable[..., Any], options: Mapping[str, Any], what: str) -> None:
    """Refuse keyword ``options`` that ``fn`` does not take, in one line naming the valid ones."""
    check_keywords(keyword_defaults(fn), options, what)
