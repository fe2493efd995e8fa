"""Search spaces: define-by-run functions ``(trial, ctx, **options) -> StitchConfig``.

``pairwise`` (two models, one cut each), ``chain`` (StitchNet, up to L fragments) and ``gap``
(Traft & Cheney: bridge a gap within or across models, adapter kind as a choice) ship here;
register your own with :func:`register_space`.
"""

from . import chain as _chain  # noqa: F401  (registers "chain")
from . import gap as _gap  # noqa: F401  (registers "gap")
from . import pairwise as _pairwise  # noqa: F401  (registers "pairwise")
from . import restnet as _restnet  # noqa: F401  (registers "restnet": ReStNet preset)
from . import snnet as _snnet  # noqa: F401  (registers "snnet": SN-Net preset)
from . import stitchnet as _stitchnet  # noqa: F401  (registers "stitchnet": Alg. 1 preset)
from . import traft as _traft  # noqa: F401  (registers "traft": Traft & Cheney grid)
from ._adapter_choice import ADAPTER_KINDS, AdapterChoices, suggest_adapter
from ._registry import SpaceFn, get_space, list_spaces, register_space, sample

__all__ = [
    "ADAPTER_KINDS",
    "AdapterChoices",
    "SpaceFn",
    "get_space",
    "list_spaces",
    "register_space",
    "sample",
    "suggest_adapter",
]
