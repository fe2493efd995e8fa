"""Search spaces: define-by-run functions ``(trial, ctx, **options) -> StitchConfig``.

``pairwise`` (two models, one cut each), ``chain`` (StitchNet, up to L fragments) and ``gap``
(Traft & Cheney: bridge a gap within or across models, adapter kind as a choice) ship here;
register your own with :func:`register_space`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stitch_nas.lazy import lazy_face

#: public name -> the module that defines it (a lazy face: light names load without torch)
_HOMES = {
    "AdapterChoices": "._adapter_choice",
    "suggest_adapter": "._adapter_choice",
    "ADAPTER_KINDS": "._options",
    "SPACE_OPTIONS": "._options",
    "SpaceFn": "._registry",
    "get_space": "._registry",
    "list_spaces": "._registry",
    "register_space": "._registry",
    "sample": "._registry",
}

__all__ = [
    "ADAPTER_KINDS",
    "AdapterChoices",
    "get_space",
    "list_spaces",
    "register_space",
    "sample",
    "SPACE_OPTIONS",
    "SpaceFn",
    "suggest_adapter",
]

if TYPE_CHECKING:  # what static checkers see; at run time __getattr__ imports lazily
    from ._adapter_choice import AdapterChoices, suggest_adapter
    from ._options import ADAPTER_KINDS, SPACE_OPTIONS
    from ._registry import SpaceFn, get_space, list_spaces, register_space, sample

__getattr__, __dir__ = lazy_face(__name__, _HOMES)
