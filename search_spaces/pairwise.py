"""``pairwise``: two zoo models, one cut each (SN-Net / ReStNet style), or one model and itself.

The front of one model up to a cut, a least-squares stitch, and the back of another model from a
cut. The sampled ``route`` ("src>dst") fixes which goes first; ``directions`` restricts routes
to ``fast_to_slow`` (start with the model of fewer MACs, SN-Net's choice) and/or
``slow_to_fast`` (start with the larger one, ReStNet's default). Only routes and cuts that one
of the allowed adapters can join are offered, so no trial is spent on an impossible pair. With
``adapters`` beyond ``["lstsq"]``, the adapter kind, rescaling, loss and what trains are search
choices too (see :class:`search_spaces.AdapterChoices`).

With ``skips: true`` each model is also routed to itself (route ``"m>m"``, direction ``"skip"``):
its front up to one cut, then its own back from a deeper cut, a least-squares joint in place of
the blocks between (Traft & Cheney's block skipping, inside the ``gap`` space too). A strong
cheap model with blocks skipped is the network between it and the next cheaper zoo model: on the
real CIFAR-10 zoo, where nothing stands between LeNet-5's 0.65 M MACs and the MobileNet's 10.1 M,
the MobileNet without its blocks 4 to 6 (5.8 M) reached 0.90 on test after refining and one
epoch of fine-tuning (``benchmarks/results/realzoo_gaps_skips_seed0.json``).

Cut parameters: each model has its own cut points, so by default (``cut_params="named"``) the
cuts are categorical parameters named by route (``src_resnet_to_vit``), which leaves ``route``
the only parameter every trial shares. That suits TPE, but NSGA-II crosses over shared
parameters only and mutates each with probability 1 / (their number), so it degenerates into
random search. ``cut_params="depth"`` samples ``src_depth`` and ``dst_depth`` in [0, 1) instead,
the relative position among the route's joinable cuts, shared by every route. A skip's
destination cut is named by its source cut (``dst_m_after_<cut>``): which cuts lie deeper
depends on it.

Seed proposals (:func:`proposals`, offered as ``pairwise.proposals``; seeding scores them
beside its random pool and gives a share of the seeds to the best of them):

- :func:`end_swaps` (on unless ``end_seeds: false``): each model on the zoo's own front with
  another model's stem or classifier in place of its own. The high-accuracy end of a pairwise
  space's front is made of these (on four real CIFAR-10 models, 1,447 configs, every network
  of the front above 90 % accuracy is the MobileNet with another model's stem or classifier),
  and a random pool of a few dozen rarely holds one: there are two per pair of models.
- :func:`matched_depths` (with ``matched_seeds: true``): SN-Net observes that stitching a cheaper
  model into a dearer one of the same kind at matching depth interpolates their accuracy and
  cost, the region between strong models that random draws rarely visit (few routes join two
  members of one family).
- :func:`block_skips` (with ``skips: true``): each model on the zoo's front with blocks
  skipped, where the network's MACs fall in the gap between it and the next cheaper front
  model: the budgets where the zoo's front has nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from stitch_nas import adapters as registry
from stitch_nas.activations import StitchContext, zoo_models
from stitch_nas.adapters import joinable
from stitch_nas.config import DIRECTIONS, AdapterSpec, Fragment, StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.fragments import CutPoint
from stitch_nas.stitching import fragment_macs, model_macs

from ._adapter_choice import AdapterChoices, suggest_adapter
from ._options import SPACE_OPTIONS
from ._registry import register_space
from ._routes import (
    CUT_PARAMS,
    SKIP,
    allowed_routes,
    destination_cuts,
    destination_param,
    joins,
    source_cuts,
    suggest_cut,
)

#: what other spaces and plug-ins import from here
__all__ = [
    "CUT_PARAMS",
    "DIRECTIONS",
    "MATCHED_DEPTHS",
    "MATCHED_TOLERANCE",
    "block_skips",
    "end_swaps",
    "joinable",
    "joins",
    "matched_depths",
    "pairwise",
    "proposals",
    "zoo_models",
]

#: the relative depths (share of the model's MACs before the cut) seed proposals stitch at,
#: and how far from one a cut's share may be (no proposal where a model has no cut that near)
MATCHED_DEPTHS = (0.25, 0.5, 0.75)
MATCHED_TOLERANCE = 0.15


@register_space("pairwise")
def pairwise(
    trial: optuna.Trial,
    ctx: StitchContext,
    *,
    models: Sequence[str] | None = None,
    directions: Sequence[str] = DIRECTIONS,
    adapter: str = "lstsq",
    adapters: Sequence[str] | None = None,
    resizes: Sequence[str] = registry.RESIZE_MODES,
    losses: Sequence[str] = ("match",),
    trains: Sequence[str] = ("adapter",),
    adapter_options: Mapping[str, Any] | None = None,
    cut_params: str = "named",
    matched_seeds: bool = False,
    matched_margin: float = 0.0,
    end_seeds: bool = True,
    skips: bool = False,
) -> StitchConfig:
    """Sample ``A[input:cut_a] -stitch-> B[cut_b:output]`` from two different models (or, with
    ``skips``, from one model and a deeper cut of its own).

    Args:
        adapter: the one adapter kind to use, when ``adapters`` is not given.
        adapters, resizes, losses, trains: per-joint choices (see ``AdapterChoices``).
        adapter_options: fixed options of every trained adapter (e.g. ``{"steps": 100}``).
        cut_params: "named" (a categorical per route) or "depth" (relative depth, shared by
            all routes; lets NSGA-II's crossover work, see the module docstring).
        matched_seeds: seeding also scores the stitches :func:`matched_depths` proposes
            (read by seeding only; sampling is the same either way).
        matched_margin: :func:`matched_depths` also proposes pairs whose dearer model is up to
            this much less accurate than the cheaper one (read by seeding only).
        end_seeds: seeding also scores the stitches :func:`end_swaps` proposes (read by
            seeding only).
        skips: also route each model to itself, skipping the blocks between two of its cuts
            (seeding then also scores what :func:`block_skips` proposes).
    """
    _check_margin(matched_margin)
    choices = AdapterChoices(adapters or (adapter,), resizes, losses, trains, adapter_options)
    routes = allowed_routes(ctx, models, directions, choices, cut_params, skips)
    choice = trial.suggest_categorical("route", [f"{src}>{dst}" for src, dst, _ in routes])
    src, dst = choice.split(">")
    trial.set_user_attr("direction", next(r[2] for r in routes if r[:2] == (src, dst)))
    kinds = choices.kinds
    src_cuts = source_cuts(ctx, kinds, src, dst)
    src_cut = suggest_cut(trial, cut_params, f"src_{src}_to_{dst}", "src_depth", src_cuts)
    dst_cuts = destination_cuts(ctx, kinds, src, src_cut, dst)
    dst_name = destination_param(src, src_cut, dst)
    dst_cut = suggest_cut(trial, cut_params, dst_name, "dst_depth", dst_cuts)
    spec = (
        AdapterSpec("lstsq")
        if choices.only_lstsq
        else suggest_adapter(trial, ctx, choices, src_cut, dst_cut, dst)
    )
    return StitchConfig(
        (Fragment(src, None, src_cut.name), Fragment(dst, dst_cut.name, None)), (spec,)
    )


def matched_depths(
    ctx: StitchContext,
    accuracy: Mapping[str, float],
    *,
    matched_seeds: bool = False,
    matched_margin: float = 0.0,
    depths: Sequence[float] = MATCHED_DEPTHS,
    **options: Any,
) -> list[dict[str, Any]]:
    """Trial params of ``cheap[input:cut] -> dear[cut:output]`` at matching relative depths.

    For each pair of the space's models where the one of fewer MACs is also the less accurate
    (``accuracy``: validation, by model name), or more accurate by at most ``matched_margin``
    (a strong cheap model's early layers into a deeper model's head, which fine-tuning can
    train into one network), and each of ``depths``: the cheaper model's
    joinable cut whose prefix holds the share of its MACs nearest the depth, and the dearer
    model's cut (of those that cut joins) nearest the same share; a pair with no cut within
    ``MATCHED_TOLERANCE`` of the depth, in either model, is left out. The params fix the route
    and the cuts; adapter choices, if any, are left to the sampler. Takes the space's own
    options, so it proposes only what the space can sample; nothing unless the space's option
    ``matched_seeds`` is on.
    """
    _check_margin(matched_margin)
    if not matched_seeds:
        return []
    kinds, routes, cut_params = _proposal_space(ctx, options)
    proposals = []
    for src, dst, direction in routes:
        if direction != "fast_to_slow" or not accuracy[src] < accuracy[dst] + matched_margin:
            continue
        src_cuts = source_cuts(ctx, kinds, src, dst)
        for depth in depths:
            src_cut = _nearest(ctx, src, src_cuts, depth)
            dst_cuts = destination_cuts(ctx, kinds, src, src_cut, dst)
            dst_cut = _nearest(ctx, dst, dst_cuts, depth)
            if any(
                abs(_share(ctx, model, cut) - depth) > MATCHED_TOLERANCE
                for model, cut in ((src, src_cut), (dst, dst_cut))
            ):
                continue
            params = _params(src, dst, (src_cut, src_cuts), (dst_cut, dst_cuts), cut_params)
            if params not in proposals:
                proposals.append(params)
    return proposals


def end_swaps(
    ctx: StitchContext, accuracy: Mapping[str, float], *, end_seeds: bool = True, **options: Any
) -> list[dict[str, Any]]:
    """Trial params of each model on the zoo's own front with one end of another model's.

    A model is on the zoo's front when no other model of the space has at most its MACs and a
    higher ``accuracy`` (validation, by model name). For each such model ``kept`` and each
    other model the space routes to or from it: the other model's stem into ``kept``
    (``other[input:first cut] -> kept[first cut joinable from it:output]``) and ``kept`` into
    the other model's classifier (``kept[input:last cut joinable to it] -> other[last
    cut:output]``), each where both cuts lie within ``MATCHED_TOLERANCE`` of that end's share
    of their model's MACs (0 or 1). Such a network is ``kept`` with one end changed, so it
    costs and scores about what ``kept`` does: these are the stitches at the high-accuracy end
    of the space's front, two per model pair among the thousands of a pairwise space. Takes the
    space's own options; nothing unless ``end_seeds`` is on.
    """
    if not end_seeds:
        return []
    kinds, routes, cut_params = _proposal_space(ctx, options)
    front = _zoo_front(ctx, routes, accuracy)
    proposals = []
    for src, dst, _ in routes:
        if src == dst:  # a model's own stem or classifier: no swap
            continue
        src_cuts = source_cuts(ctx, kinds, src, dst)
        pairs = []  # (src cut, dst cut, the depth both must be near)
        if dst in front:  # src's stem into dst: both cut as early as they join
            first = src_cuts[0]
            pairs.append((first, next(d for d in ctx.cuts(dst) if joins(kinds, first, d)), 0.0))
        if src in front:  # src into dst's classifier: the last src cut that joins dst's last
            last = next(
                d for d in reversed(ctx.cuts(dst)) if any(joins(kinds, c, d) for c in src_cuts)
            )
            pairs.append((next(c for c in reversed(src_cuts) if joins(kinds, c, last)), last, 1.0))
        for src_cut, dst_cut, depth in pairs:
            if any(  # a ViT joins a CNN only at its pooled features: no stem to swap
                abs(_share(ctx, model, cut) - depth) > MATCHED_TOLERANCE
                for model, cut in ((src, src_cut), (dst, dst_cut))
            ):
                continue
            dst_cuts = destination_cuts(ctx, kinds, src, src_cut, dst)
            params = _params(src, dst, (src_cut, src_cuts), (dst_cut, dst_cuts), cut_params)
            if params not in proposals:
                proposals.append(params)
    return proposals


def block_skips(
    ctx: StitchContext, accuracy: Mapping[str, float], *, skips: bool = False, **options: Any
) -> list[dict[str, Any]]:
    """Trial params of each model on the zoo's front with the blocks between two cuts skipped.

    A model is on the zoo's front as in :func:`end_swaps`. For each such model but the
    cheapest, every skip (``m[input:i] -> m[j:output]``, ``j`` deeper and joinable from ``i``)
    whose fragments' MACs lie between the next cheaper front model's MACs and the model's own:
    the gap in the zoo's front this model bounds from above, where interpolating between the two
    has headroom (:func:`stitch_nas.report.interpolation_headroom`) and no zoo model stands.
    Takes the space's own options; nothing unless ``skips`` is on.
    """
    if not skips:
        return []
    kinds, routes, cut_params = _proposal_space(ctx, {**options, "skips": True})
    front = sorted(_zoo_front(ctx, routes, accuracy), key=lambda m: model_macs(ctx, m))
    proposals = []
    for below, model in zip(front, front[1:], strict=False):
        if (model, model, SKIP) not in routes:
            continue
        low, high = model_macs(ctx, below), model_macs(ctx, model)
        src_cuts = source_cuts(ctx, kinds, model, model)
        for src_cut in src_cuts:
            dst_cuts = destination_cuts(ctx, kinds, model, src_cut, model)
            for dst_cut in dst_cuts:
                macs = fragment_macs(ctx, model, None, src_cut.name) + fragment_macs(
                    ctx, model, dst_cut.name, None
                )
                if low < macs < high:
                    at = (src_cut, src_cuts), (dst_cut, dst_cuts)
                    proposals.append(_params(model, model, *at, cut_params))
    return proposals


def proposals(
    ctx: StitchContext, accuracy: Mapping[str, float], **options: Any
) -> list[dict[str, Any]]:
    """Seeding's proposals: :func:`end_swaps`, :func:`matched_depths`, :func:`block_skips` (each
    per its option)."""
    found = end_swaps(ctx, accuracy, **options)
    found += [p for p in matched_depths(ctx, accuracy, **options) if p not in found]
    return found + block_skips(ctx, accuracy, **options)


def _proposal_space(
    ctx: StitchContext, options: Mapping[str, Any]
) -> tuple[tuple[str, ...], list[tuple[str, str, str]], str]:
    """From the space's options (its declared defaults, :data:`._options.SPACE_OPTIONS`, for
    those not given): its adapter kinds, the routes it samples and how it names cuts, so a
    proposal is one the space can sample."""
    unknown = sorted(set(options) - set(SPACE_OPTIONS["pairwise"]))
    if unknown:
        raise ConfigError(
            f"pairwise: unknown option(s) {unknown}; use {sorted(SPACE_OPTIONS['pairwise'])}"
        )
    o = {**SPACE_OPTIONS["pairwise"], **options}
    kinds = o["adapters"] or (o["adapter"],)
    choices = AdapterChoices(kinds, o["resizes"], o["losses"], o["trains"], o["adapter_options"])
    routes = allowed_routes(ctx, o["models"], o["directions"], choices, o["cut_params"], o["skips"])
    return choices.kinds, routes, o["cut_params"]


def _zoo_front(
    ctx: StitchContext, routes: list[tuple[str, str, str]], accuracy: Mapping[str, float]
) -> set[str]:
    """The routes' models no other of them beats in ``accuracy`` at at most their MACs."""
    names = {name for route in routes for name in route[:2]}
    return {
        m
        for m in names
        if not any(
            model_macs(ctx, o) <= model_macs(ctx, m) and accuracy[o] > accuracy[m] for o in names
        )
    }


def _params(
    src: str,
    dst: str,
    src_at: tuple[CutPoint, list[CutPoint]],
    dst_at: tuple[CutPoint, list[CutPoint]],
    cut_params: str,
) -> dict[str, Any]:
    """The trial params of ``src[input:cut] -> dst[cut:output]``, each cut given with the cuts
    it is sampled from."""
    (src_cut, src_cuts), (dst_cut, dst_cuts) = src_at, dst_at
    params: dict[str, Any] = {"route": f"{src}>{dst}"}
    if cut_params == "named":
        params[f"src_{src}_to_{dst}"] = src_cut.name
        params[destination_param(src, src_cut, dst)] = dst_cut.name
    else:  # the middle of the cut's share of [0, 1), as suggest_cut reads it
        params["src_depth"] = (src_cuts.index(src_cut) + 0.5) / len(src_cuts)
        params["dst_depth"] = (dst_cuts.index(dst_cut) + 0.5) / len(dst_cuts)
    return params


pairwise.proposals = proposals  # type: ignore[attr-defined]  # read by seeding


def _check_margin(margin: float) -> None:
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin <= 1:
        raise ConfigError(
            f"pairwise: matched_margin={margin!r} must be an accuracy difference in [0, 1]"
        )


def _nearest(ctx: StitchContext, model: str, cuts: list[CutPoint], depth: float) -> CutPoint:
    """The cut of ``cuts`` whose prefix holds the share of ``model``'s MACs nearest ``depth``."""
    return min(cuts, key=lambda c: abs(_share(ctx, model, c) - depth))


def _share(ctx: StitchContext, model: str, cut: CutPoint) -> float:
    """The share of ``model``'s MACs before ``cut``: its relative depth."""
    return fragment_macs(ctx, model, None, cut.name) / model_macs(ctx, model)
