"""A cheap score that predicts a stitched network's accuracy: its least-squares probe accuracy.

Before any adapter is trained and before the validation split is read, a config is built with
least squares only (every trained adapter initialised by least squares and left untrained) and
scored on the probe split: the fraction of probe images it classifies right. The probe images
are the ones the stitches were fitted to, so the figure is optimistic, but it costs one pass over
the probe and it ranks configs far better than CKA: Spearman correlation with
validation accuracy 0.947 against CKA's 0.234 on the digits zoo (939 least-squares configs), and
0.992 against 0.720 on the real CIFAR-10 zoo (100 sampled configs; ``benchmarks/proxy.py``).
A head fitted on the probe (k-NN, linear probe) is scored on images it was not fitted to
(:func:`~stitch_nas.stitching.held_out_correct`: two folds, each scored by the head fitted on
the other); on its own images it would pass any stitch when classes have few images each.

The search prunes a stitched config whose probe accuracy is below ``probe_threshold`` (as a
multiple of chance, ``1 / classes``: a stitch no better than guessing is broken, whatever its
cost) and seeds a fresh study with the configs the probe ranks best (``search._seeding``).
With many classes chance is small (0.1 % at 1,000) and so is the floor (1.5 x chance: 0.15 %,
3 of the 2,048 images ``probe_size: auto`` gives): it prunes stitches that are broken, at
chance, and keeps any that carries signal, a few images per class being enough to tell them
apart; being a count of a few images, it lets about one broken stitch in seven through (a
binomial at 2 expected right reaches 4 that often), where 10 classes and 128 images let 3 %.
"""

from __future__ import annotations

import dataclasses

from stitch_nas.activations import Memo, StitchContext
from stitch_nas.adapters import get_adapter
from stitch_nas.config import AdapterSpec, StitchConfig

from ._build import NETWORKS, StitchedNet, build
from ._heads import held_out_correct
from ._measure import count_correct, net_outputs

__all__ = [
    "ProbeScore",
    "forget_probe_score",
    "keep_probe_score",
    "least_squares_version",
    "probe_accuracy",
]


@dataclasses.dataclass
class ProbeScore:
    """A config's probe accuracy and the least-squares network it measured."""

    accuracy: float  #: share of the probe split classified right by the least-squares version
    images: int  #: probe images scored
    net: StitchedNet  #: the least-squares version, built (same structure and costs as config)
    own: bool  #: whether ``net`` is the config's own network (no adapter of it trains)


def _untrained(spec: AdapterSpec) -> AdapterSpec:
    """``spec`` initialised by least squares and not trained (kinds without a ``loss`` option,
    such as ``lstsq`` itself or a jointly trained SN-Net stitch, are used as they are)."""
    if spec.kind in NETWORKS or "loss" not in get_adapter(spec.kind).options:
        return spec
    options = {**dict(spec.options), "loss": "none", "init": "lstsq", "train": "adapter"}
    return AdapterSpec(spec.kind, tuple(sorted(options.items())))


def least_squares_version(config: StitchConfig) -> StitchConfig:
    """``config`` with every trained adapter replaced by its least-squares initialisation."""
    return dataclasses.replace(config, adapters=tuple(_untrained(a) for a in config.adapters))


#: scores seeding computed for configs it enqueued, each handed back once
_KEPT: Memo[str, ProbeScore] = Memo("kept probe scores")


def keep_probe_score(ctx: StitchContext, config: StitchConfig, score: ProbeScore) -> None:
    """Hold ``score`` for the next :func:`probe_accuracy` of ``config`` (seeding scores the
    configs it enqueues, and their trials then need not score them again)."""
    _KEPT.put(ctx, config.stable_hash(), score)


def forget_probe_score(ctx: StitchContext, config: StitchConfig) -> None:
    """Drop a score :func:`keep_probe_score` holds for ``config``, if any (a proposal that
    was scored but not chosen)."""
    _KEPT.pop(ctx, config.stable_hash())


def probe_accuracy(ctx: StitchContext, config: StitchConfig) -> ProbeScore:
    """Build the least-squares version of ``config`` and score it on the probe split (or hand
    back, once, a score kept by :func:`keep_probe_score`)."""
    kept = _KEPT.pop(ctx, config.stable_hash())
    if kept is not None:
        return kept
    cheap = least_squares_version(config)
    net = build(ctx, cheap)
    if config.head.kind == "native":
        correct, seen = count_correct(ctx, net, "probe", None)
    else:  # a head fitted on the probe: scored on the images it was not fitted to
        labels = ctx.labels("probe")
        features = net_outputs(ctx, net, "probe")
        correct, seen = (
            held_out_correct(config.head, features, labels, ctx.num_classes),
            len(labels),
        )
    return ProbeScore(correct / max(seen, 1), seen, net, cheap == config)
