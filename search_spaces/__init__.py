"""Search spaces: define-by-run functions ``(trial, ctx, **options) -> StitchConfig``.

``pairwise`` (two models, one cut each) and ``chain`` (StitchNet, up to L fragments) ship here;
register your own with :func:`register_space`.
"""

from . import chain as _chain  # noqa: F401  (registers "chain")
from . import pairwise as _pairwise  # noqa: F401  (registers "pairwise")
from ._registry import SpaceFn, get_space, list_spaces, register_space, sample

__all__ = ["SpaceFn", "get_space", "list_spaces", "register_space", "sample"]
