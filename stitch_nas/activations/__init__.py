"""Activations: the memory-bounded cache of activations at cut points and the
:class:`StitchContext` that computes, memoises and shares them across trials.
"""

from ._cache import (
    ActivationCache,
    ActivationKey,
    weights_fingerprint,
)
from ._context import (
    StitchContext,
    zoo_models,
)

__all__ = [
    "ActivationCache",
    "ActivationKey",
    "StitchContext",
    "weights_fingerprint",
    "zoo_models",
]
