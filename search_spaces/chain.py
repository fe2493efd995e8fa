"""``chain``: up to L fragments from any zoo models (StitchNet).

The first fragment starts at a model's input, the last runs to a model's output, and each
fragment in between runs from one cut of its model to a deeper one. Every joint is a
least-squares stitch by default; with ``adapters`` the adapter kind, rescaling, loss and what
trains are sampled per joint (see :class:`search_spaces.AdapterChoices`). The CKA product along
the chain (StitchNet's score) prunes bad chains.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from stitch_nas import adapters as registry
from stitch_nas.activations import StitchContext
from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from stitch_nas.errors import ConfigError

from ._adapter_choice import AdapterChoices, suggest_adapter
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
    adapters: Sequence[str] | None = None,
    resizes: Sequence[str] = registry.RESIZE_MODES,
    losses: Sequence[str] = ("match",),
    trains: Sequence[str] = ("adapter",),
    adapter_options: Mapping[str, Any] | None = None,
) -> StitchConfig:
    """Sample a chain of 1 to ``max_fragments`` fragments (1 = a zoo model on its own).

    Args:
        adapter: the one adapter kind of every joint, when ``adapters`` is not given.
        adapters, resizes, losses, trains: per-joint choices (see ``AdapterChoices``).
        adapter_options: fixed options of every trained adapter (e.g. ``{"steps": 100}``).
    """
    choices = AdapterChoices(adapters or (adapter,), resizes, losses, trains, adapter_options)
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
    if choices.only_lstsq:
        return StitchConfig(tuple(fragments), tuple(AdapterSpec("lstsq") for _ in fragments[1:]))
    specs = []
    for k, (prev, frag) in enumerate(zip(fragments, fragments[1:], strict=False)):
        if prev.end is None or frag.start is None:  # the loop above always sets both
            raise ConfigError(f"joint {k} of the sampled chain lacks a cut point")
        src, dst = ctx.cut(prev.model, prev.end), ctx.cut(frag.model, frag.start)
        specs.append(
            suggest_adapter(
                trial, ctx, choices, src, dst, frag.model, prefix=f"j{k}_", first_joint=k == 0
            )
        )
    return StitchConfig(tuple(fragments), tuple(specs))
