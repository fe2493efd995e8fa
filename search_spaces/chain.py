"""``chain``: up to L fragments from any zoo models (StitchNet).

The first fragment starts at a model's input, the last runs to a model's output, and each
fragment in between runs from one cut of its model to a deeper one. Every joint is a
least-squares stitch; the CKA product along the chain (StitchNet's score) prunes bad chains.
"""

from __future__ import annotations

from collections.abc import Sequence

import optuna

from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from stitch_nas.context import StitchContext
from stitch_nas.errors import ConfigError

from ._registry import register_space
from .pairwise import zoo_models


@register_space("chain")
def chain(
    trial: optuna.Trial,
    ctx: StitchContext,
    *,
    models: Sequence[str] | None = None,
    max_fragments: int = 3,
    adapter: str = "lstsq",
) -> StitchConfig:
    """Sample a chain of 1 to ``max_fragments`` fragments (1 = a zoo model on its own)."""
    if max_fragments < 1:
        raise ConfigError(f"max_fragments must be >= 1, got {max_fragments}")
    names = zoo_models(ctx, models, 1)
    n = trial.suggest_int("n_fragments", 1, max_fragments)
    fragments: list[Fragment] = []
    for k in range(n):
        model = trial.suggest_categorical(f"model_{k}", names)
        cuts = [c.name for c in ctx.cuts(model)]
        start_idx = -1
        if k > 0:  # leave at least one cut after the start for a middle fragment
            last_start = len(cuts) - 1 if k == n - 1 else len(cuts) - 2
            start_idx = trial.suggest_int(f"start_{k}_{model}", 0, max(last_start, 0))
        end = None
        if k < n - 1:
            end_idx = trial.suggest_int(f"end_{k}_{model}", start_idx + 1, len(cuts) - 1)
            end = cuts[end_idx]
        fragments.append(Fragment(model, cuts[start_idx] if k > 0 else None, end))
    return StitchConfig(tuple(fragments), tuple(AdapterSpec(adapter) for _ in fragments[1:]))
