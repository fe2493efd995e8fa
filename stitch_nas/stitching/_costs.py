"""What a stitched network costs: MACs counted once per piece of each zoo model and per stitch
shape, memoised in the context, and StitchNet's CKA score of its joints.

A trial sums what is already counted, so it traces nothing new: each zoo model is counted once
as consecutive pieces between its cut points, a fragment is the sum of its pieces, and a
stitch's MACs are counted once per (cost key, input shape). With ``ctx.cost_tables`` off,
fragments and networks are traced whole instead (the reference path).
"""

from __future__ import annotations

import functools
from typing import Any

from stitch_nas.activations import Memo, StitchContext
from stitch_nas.config import StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.fragments import count_macs
from stitch_nas.similarity import chain_score

from ._build import StitchedNet

__all__ = ["config_cka", "fragment_macs", "model_macs", "network_macs"]

#: MACs of each piece of a zoo model, and of each stitch part by cost key and input shape
_PIECE_MACS: Memo[str, list[int]] = Memo("MACs of each piece")
_PART_MACS: Memo[tuple[Any, ...], int] = Memo("MACs of stitch parts")


def config_cka(ctx: StitchContext, config: StitchConfig) -> float:
    """StitchNet's score: product over joints of CKA(chain output, B at its start cut).

    Every joint is scored on the source model's own activations at its end cut (the cached
    prefix), which is exact for the first joint and the usual cheap proxy for later ones.
    """
    scores = []
    for prev, frag in zip(config.fragments, config.fragments[1:], strict=False):
        if prev.end is None or frag.start is None:  # StitchConfig rules this out
            raise ConfigError(f"the joint {prev} -> {frag} needs a cut point on both sides")
        scores.append(ctx.joint_cka(prev.model, prev.end, frag.model, frag.start))
    return chain_score(scores)


def fragment_macs(ctx: StitchContext, model: str, start: str | None, end: str | None) -> int:
    """MACs of ``model`` from cut ``start`` to cut ``end`` for one image.

    With cost tables, each model is counted once as consecutive pieces between its cuts and a
    fragment is the sum of its pieces; otherwise the fragment itself is traced.
    """
    if not ctx.cost_tables:
        shape = ctx.input_shape(model) if start is None else (1, *ctx.cut(model, start).shape)
        return count_macs(ctx.segment(model, start, end), shape)
    pieces = _pieces(ctx, model)
    names = [c.name for c in ctx.cuts(model)]
    first = 0 if start is None else names.index(start) + 1
    last = len(pieces) if end is None else names.index(end) + 1
    return sum(pieces[first:last])


def _pieces(ctx: StitchContext, model: str) -> list[int]:
    """MACs of each run between consecutive cut points (input, cut 0, ..., cut k, output)."""

    def count() -> list[int]:
        cuts = ctx.cuts(model)
        bounds: list[str | None] = [None, *(c.name for c in cuts), None]
        shapes = [ctx.input_shape(model), *((1, *c.shape) for c in cuts)]
        return [
            count_macs(ctx.segment(model, start, end), shape)
            for start, end, shape in zip(bounds[:-1], bounds[1:], shapes, strict=True)
        ]

    return _PIECE_MACS.fetch(ctx, model, count)


def model_macs(ctx: StitchContext, name: str) -> int:
    """MACs of one zoo model on its own input size (memoised in the context)."""
    return fragment_macs(ctx, name, None, None)


def network_macs(ctx: StitchContext, net: StitchedNet) -> int:
    """MACs of one image through ``net``, from cost tables: each part's MACs are counted once
    per cost key (a fragment, or a stitch's shapes) and summed, so a trial traces nothing new.

    With ``ctx.cost_tables`` off, the whole network is traced instead (the reference path).
    Preprocessing (resize, normalise) is not counted: it is elementwise in fvcore's convention.
    """
    if not ctx.cost_tables:
        return count_macs(net, ctx.input_shape(net.config.fragments[0].model))
    total = 0
    for part, (key, in_shape) in zip(net.parts, net.part_info, strict=True):
        if key[0] == "fragment":
            total += fragment_macs(ctx, *key[1:])
            continue
        shape = (1, *in_shape)
        total += _PART_MACS.fetch(ctx, (key, shape), functools.partial(count_macs, part, shape))
    return total
