"""Values derived once per context and reused by every trial, each kind in a typed memo that
the module which fills it owns.

A module declares ``ROLES: Memo[str, PieceRoles] = Memo("piece roles")`` and asks
``ROLES.fetch(ctx, model, compute)``. The values live on the context (so they go with it, and a
new context starts empty), apart from every other module's: keys cannot collide, and each
memo's values have one type.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from ._view import MemoHolder

__all__ = ["Memo"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Memo(Generic[K, V]):
    """One kind of value memoised per context (see the module docstring).

    Args:
        what: what it holds, for ``repr`` and debugging ("piece roles").
    """

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"Memo({self.what!r})"

    def _values(self, ctx: MemoHolder) -> dict[Any, Any]:
        return ctx.memos.setdefault(self, {})

    def fetch(self, ctx: MemoHolder, key: K, compute: Callable[[], V]) -> V:
        """The value of ``key`` on ``ctx``, computed by ``compute`` the first time."""
        values = self._values(ctx)
        if key not in values:
            values[key] = compute()
        return values[key]

    def get(self, ctx: MemoHolder, key: K) -> V | None:
        """The value of ``key`` on ``ctx``, or None if none is held."""
        return self._values(ctx).get(key)

    def put(self, ctx: MemoHolder, key: K, value: V) -> V:
        """Hold ``value`` for ``key`` on ``ctx`` (replacing what was there)."""
        self._values(ctx)[key] = value
        return value

    def pop(self, ctx: MemoHolder, key: K) -> V | None:
        """Take the value of ``key`` off ``ctx`` (None if none is held)."""
        return self._values(ctx).pop(key, None)

    def values(self, ctx: MemoHolder) -> list[V]:
        """Every value this memo holds on ``ctx``."""
        return list(self._values(ctx).values())
