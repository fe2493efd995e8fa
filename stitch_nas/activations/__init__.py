"""Activations: the memory-bounded cache of activations at cut points and the
:class:`StitchContext` that computes, memoises and shares them across trials.
"""

from ._batch import (
    GPU_MAX_BATCH,
    LIVE_ACTIVATIONS,
    MAX_BATCH,
    WORK_BATCH_BYTES,
    auto_batch_size,
    largest_activations,
)
from ._budgets import (
    DEFAULT_DEVICE_MEMORY_FRACTION,
    DEFAULT_MEMORY_FRACTION,
    cache_budgets,
    default_device_memory_gb,
    default_memory_gb,
)
from ._cache import STORAGE_DTYPES, ActivationCache, ActivationKey, weights_fingerprint
from ._context import (
    StitchContext,
    zoo_models,
)
from ._device import AUTOCAST_DTYPES, is_convolutional, resolve_device, to_device
from ._memo import Memo
from ._rows import ActivationRows, ChainRows, InputRows, Rows, in_order, take

__all__ = [
    "AUTOCAST_DTYPES",
    "DEFAULT_DEVICE_MEMORY_FRACTION",
    "DEFAULT_MEMORY_FRACTION",
    "GPU_MAX_BATCH",
    "LIVE_ACTIVATIONS",
    "Memo",
    "MAX_BATCH",
    "STORAGE_DTYPES",
    "WORK_BATCH_BYTES",
    "ActivationCache",
    "ActivationKey",
    "ActivationRows",
    "ChainRows",
    "InputRows",
    "Rows",
    "StitchContext",
    "auto_batch_size",
    "cache_budgets",
    "default_device_memory_gb",
    "default_memory_gb",
    "in_order",
    "is_convolutional",
    "largest_activations",
    "resolve_device",
    "take",
    "to_device",
    "weights_fingerprint",
    "zoo_models",
]
