"""What kind of network a config is: a zoo model, a truncated one, a real stitch, or a zoo model
with another model's head or stem.

A search can score well by keeping one model whole up to its pooled features and joining it
to another model's pooled cut: that is the first model with a new head, not two models working
together. Reports therefore name each network's kind, and claims about stitching count only
networks where every model does some of the work.

**Rule.** Each model is cut into pieces between its cut points (``ctx.segment`` lays a fragment
out as those pieces), and each piece has one role:

- *stem*: the pieces before the model's first block cut, the first cut that ends a module with
  children inside a ``Sequential``/``ModuleList`` (``layer1.0``, ``stages.0.blocks.0``,
  ``blocks.0``). A model with no such cut (a flat stack of layers) has its first piece as stem.
- *head*: the pieces after the model's last spatial cut, where a cut is spatial if its layout
  is tokens or a grid, except a *pooled* 1x1 grid (one reached through pieces without
  parameters from a larger grid: a ``C x 1 x 1`` average-pooled output, a vector in disguise).
  The head is then the pooling, flattening and classifier. A grid strided down to 1x1 by a
  block's own convolutions stays spatial: that block is no head.
- *block*: every other piece.

A model *contributes a block* when the config's fragments of it cover at least one block piece
that has parameters. Then:

- ``"zoo model"``: one fragment, the whole model;
- ``"truncated"``: one fragment cut short, classified by a fitted head;
- ``"stitched"``: two or more fragments, each model contributing a block (a model with the
  blocks between two of its cuts skipped, stitched to itself, is one too: ``pairwise``'s
  ``skips``, ``gap``'s ``model_rule="same"``);
- ``"new stem"``: the first model contributes no block (only its stem, or nothing with weights):
  the later model with a new stem;
- ``"new head"``: a later model contributes no block (only its head, or pooling onward): the
  first model with a new head;
- ``"new stem and head"``: both at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn

from stitch_nas.activations import Memo, StitchContext
from stitch_nas.config import StitchConfig

__all__ = ["KINDS", "PieceRoles", "STITCHED", "network_kind", "piece_roles"]

STITCHED = "stitched"
KINDS = ("zoo model", "truncated", STITCHED, "new head", "new stem", "new stem and head")
_CONTAINERS = (nn.Sequential, nn.ModuleList)


@dataclass(frozen=True)
class PieceRoles:
    """The roles of one model's pieces (piece ``i`` runs from cut ``i - 1`` to cut ``i``)."""

    roles: tuple[str, ...]  #: "stem", "block" or "head", one per piece
    weighted: tuple[bool, ...]  #: whether the piece has parameters

    def contributes(self, pieces: Iterable[int]) -> bool:
        """Whether ``pieces`` (indices) include a block piece with parameters."""
        return any(self.roles[i] == "block" and self.weighted[i] for i in pieces)


def _first_block(model: nn.Module, names: list[str]) -> int:
    """Index of the first cut ending a module with children inside a container (else 1)."""
    modules = dict(model.named_modules())
    for i, name in enumerate(names):
        parent = modules.get(name.rpartition(".")[0]) if "." in name else None
        module = modules.get(name)
        if isinstance(parent, _CONTAINERS) and module is not None and any(module.children()):
            return i
    return 1


_ROLES: Memo[str, PieceRoles] = Memo("piece roles")
_KINDS: Memo[str, str] = Memo("network kinds")


def piece_roles(ctx: StitchContext, model: str) -> PieceRoles:
    """Stem, block or head for each piece of ``model`` (memoised on the context)."""
    return _ROLES.fetch(ctx, model, lambda: _piece_roles(ctx, model))


def _piece_roles(ctx: StitchContext, model: str) -> PieceRoles:
    chain, cuts = ctx.chain(model), ctx.cuts(model)
    weighted = tuple(any(True for _ in chain.piece(i).parameters()) for i in range(len(cuts) + 1))
    pooled: list[bool] = []  # a 1x1 grid reached without weights from a larger grid
    for i, cut in enumerate(cuts):
        one_position = cut.layout != "vector" and cut.join_layout == "vector"
        # what piece i reads: the input image, a larger grid or tokens, or a pooled grid
        from_larger = i == 0 or cuts[i - 1].join_layout != "vector" or pooled[i - 1]
        pooled.append(one_position and not weighted[i] and from_larger)
    spatial = [i for i, c in enumerate(cuts) if c.layout != "vector" and not pooled[i]]
    last = spatial[-1] if spatial else len(cuts) - 1  # head: the pieces after cut ``last``
    first = min(_first_block(chain.model, [c.name for c in cuts]), last + 1)
    roles = tuple(
        "stem" if i < first else "head" if i > last else "block" for i in range(len(cuts) + 1)
    )
    return PieceRoles(roles, weighted)


def _span(ctx: StitchContext, model: str, start: str | None, end: str | None) -> range:
    """The pieces a fragment covers (as ``PieceChain.fragment`` takes them)."""
    names = [c.name for c in ctx.cuts(model)]
    first = 0 if start is None else names.index(ctx.cut(model, start).name) + 1
    last = len(names) + 1 if end is None else names.index(ctx.cut(model, end).name) + 1
    return range(first, last)


def network_kind(ctx: StitchContext, config: StitchConfig) -> str:
    """The kind of network ``config`` is, one of :data:`KINDS` (the rule is the module's)."""
    return _KINDS.fetch(ctx, config.stable_hash(), lambda: _network_kind(ctx, config))


def _network_kind(ctx: StitchContext, config: StitchConfig) -> str:
    frags = config.fragments
    if len(frags) == 1:
        kind = "zoo model" if frags[0].end is None else "truncated"
    else:
        covered: dict[str, set[int]] = {}
        for frag in frags:
            covered.setdefault(frag.model, set()).update(
                _span(ctx, frag.model, frag.start, frag.end)
            )
        gives = {m: piece_roles(ctx, m).contributes(pieces) for m, pieces in covered.items()}
        new_stem = not gives[frags[0].model]
        new_head = not all(gives[m] for m in covered if m != frags[0].model)
        if new_stem and new_head:
            kind = "new stem and head"
        else:
            kind = "new stem" if new_stem else "new head" if new_head else STITCHED
    return kind
