"""Which stitched networks the fine-tune stage trains: those fine-tuning can lift.

Two measurements on the ten-model real zoo decide the rule:

- The stitched front on validation is a poor choice. Before fine-tuning, a cheap network ending
  in a weak zoo model's layers dominates a dearer one of two strong models that fine-tuning
  lifts far above it (0.81 -> 0.92 on validation, ``finetune_cuda_lr0.005.json``), and half of
  a front spread over its MACs was LeNet-stem stitches no recipe lifts above 0.45
  (``realzoo_finetune_gpu_long_seed0.json``).
- The search's fidelity gate prunes a network that cannot beat the front *as it is*, which is
  exactly what fine-tuning changes: it pruned 229 of 258 to 261 trials in each seed, and
  between 10 and 41 M MACs, where the strong models are, 69 to 78 trials per seed and
  completed 0 to 5
  (``realzoo_finetune_h100_complete_only_seed*.json``, all in ``benchmarks/results``).

So the candidates are the stitched networks the search completed (their validation accuracy)
*and* those its gate pruned on a slice of the validation split (the slice's accuracy, a
noisier estimate, used only to choose). Only those at or above ``floor`` take part; of
networks with the same fragments (they differ in the adapter, and training every weight makes
them nearly one network) the most accurate; then the most accurate in each of ``count`` bands
of cost (equal ratios: MACs span decades), and any band left empty gives its place to the most
accurate network not yet chosen. Where the cost is MACs and the zoo's are known, the network
that as it stands recovers the most of the zoo front's interpolation headroom above the floor
(:func:`stitch_nas.report.interpolation_headroom`) comes first: the budgets between two of the
zoo's models are where stitching adds what the zoo lacks, and bands of equal ratio may hold none
of them (a network of nearly a zoo model's MACs is the most accurate of its band).

A network whose head is fitted on the probe split (``knn``, ``linear_probe``) is no candidate:
its last fragment ends in features, not in a classifier's scores, so it has no logits for the
stage's loss, and its measured accuracy depends on a refit the training would not track.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from stitch_nas import attrs
from stitch_nas.activations import StitchContext
from stitch_nas.config import StitchConfig
from stitch_nas.report import (
    interpolation_headroom,
    objective_names,
    stitched_trials,
    trial_config,
)
from stitch_nas.stitching import STITCHED, network_kind

__all__ = ["FLOOR_BELOW_BEST", "Candidate", "candidates", "choose"]

#: the default floor: this far below the most accurate zoo model on validation. Measured on the
#: ten-model real zoo (H100, ``benchmarks/results/finetune_cuda_lr0.005.json``): fine-tuning
#: lifted stitched networks of strong models from 0.81 and 0.88 to 0.92 on validation.
FLOOR_BELOW_BEST = 0.15


@dataclass(frozen=True)
class Candidate:
    """A stitched network the stage may fine-tune."""

    trial: FrozenTrial
    #: its validation accuracy: over the whole split (``whole``) or over the slice the
    #: search's fidelity gate pruned it on
    accuracy: float
    cost: float | None  #: what the bands are cut by (MACs when an objective); None: no cost
    whole: bool  #: measured on the whole split (a COMPLETE trial)

    @property
    def fragments(self) -> str:
        """The network's fragments, as a key: networks that differ only in adapters share it."""
        return json.dumps(trial_config(self.trial).get("fragments"), sort_keys=True)


def _cost_name(study: optuna.Study) -> str | None:
    names = objective_names(study)
    if "macs" in names:
        return "macs"
    minimised = [
        name
        for name, d in zip(names, study.directions, strict=True)
        if d == optuna.study.StudyDirection.MINIMIZE
    ]
    return minimised[0] if minimised else None


def _native_head(config: Mapping) -> bool:
    """Whether the network ends in its last model's own classifier (module docstring)."""
    return (config.get("head") or {}).get("kind", "native") == "native"


def candidates(
    study: optuna.Study, ctx: StitchContext, budgets: Mapping[str, float] | None = None
) -> list[Candidate]:
    """The stitched networks of ``study`` not yet fine-tuned: COMPLETE ones, and PRUNED ones
    the fidelity gate scored on a slice (within ``budgets``; each config once)."""
    names = objective_names(study)
    cost = _cost_name(study)
    at = names.index("accuracy")

    def unfinished(t: FrozenTrial) -> bool:
        return attrs.FINETUNES not in t.user_attrs and _native_head(trial_config(t))

    out = [
        Candidate(t, t.values[at], None if cost is None else t.values[names.index(cost)], True)
        for t in stitched_trials(study, keep=unfinished)
    ]
    seen = {json.dumps(trial_config(c.trial), sort_keys=True) for c in out}
    for t in study.get_trials(deepcopy=False, states=(TrialState.PRUNED,)):
        config = trial_config(t)
        accuracy = t.user_attrs.get(attrs.PARTIAL_ACCURACY)
        key = json.dumps(config, sort_keys=True)
        if accuracy is None or not config or key in seen or not unfinished(t):
            continue
        if any(float(t.user_attrs.get(k, 0.0)) > limit for k, limit in (budgets or {}).items()):
            continue  # pruned for a budget, not for its accuracy
        if cost is not None and cost not in t.user_attrs:
            continue  # the gate records MACs and parameters; another cost is not known
        if network_kind(ctx, StitchConfig.from_dict(config)) != STITCHED:
            continue
        seen.add(key)
        out.append(
            Candidate(
                t, float(accuracy), None if cost is None else float(t.user_attrs[cost]), False
            )
        )
    return out


def choose(
    pool: list[Candidate],
    count: int,
    floor: float,
    zoo: list[tuple[float, float]] | None = None,
) -> list[Candidate]:
    """Up to ``count`` of ``pool`` to fine-tune (the module's rule), cheapest first.

    ``zoo``: ``(accuracy, cost)`` of the zoo's models, on the candidates' split and cost (MACs);
    with it, the candidate that recovers the most interpolation headroom above ``floor`` is
    chosen first and its band taken.
    """
    best: dict[str, Candidate] = {}
    for c in pool:
        if c.accuracy >= floor and (
            c.fragments not in best or c.accuracy > best[c.fragments].accuracy
        ):
            best[c.fragments] = c
    ranked = sorted(best.values(), key=lambda c: (-c.accuracy, c.trial.number))
    chosen: list[Candidate] = []
    costs = [c.cost for c in ranked if c.cost is not None]
    if count < len(ranked) and len(costs) == len(ranked):
        low = max(min(costs), 1e-12)
        span = math.log(max(max(costs), low) / low)

        def band(cost: float) -> int:
            return min(int(count * math.log(max(cost, low) / low) / span), count - 1) if span else 0

        if zoo:
            gains = [
                interpolation_headroom(zoo, [(c.accuracy, cost)], floor).recovered
                for c, cost in zip(ranked, costs, strict=True)
            ]
            if max(gains, default=0.0) > 0:
                chosen.append(ranked[gains.index(max(gains))])
        taken = {band(c.cost) for c in chosen if c.cost is not None}
        for c, cost in zip(ranked, costs, strict=True):  # the most accurate first
            if band(cost) not in taken:  # the most accurate of its band
                taken.add(band(cost))
                chosen.append(c)
    chosen += [c for c in ranked if c not in chosen][: count - len(chosen)]
    return sorted(chosen, key=lambda c: (c.cost if c.cost is not None else 0.0, c.trial.number))
