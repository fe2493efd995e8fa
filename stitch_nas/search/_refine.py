"""Refining the front: the least-squares stitches of the best networks found, trained.

Least squares first: a least-squares trial costs about one forward pass of what is new, so the
search itself learns cheaply where stitching works. Training an adapter costs a training run
per trial, so it is spent only where the search found something: once the search is done, the
``count`` best networks with a least-squares joint (Pareto layers of the study's objectives on
validation, best layer first, within the budgets; a trial the multi-fidelity gate stopped
counts with its slice accuracy; the zoo's own models take part in the layers, so a network a
zoo model dominates comes after those on the front of both; stitched networks and the rest,
new stems and heads, are ranked apart and take turns, because on a real zoo a model with a
new stem can dominate every stitched network and would take every turn) are each
run once more per adapter in ``adapters`` as a new trial, every ``lstsq`` joint replaced by
that trained adapter (the CLI's default is one ``linear``
stitch, which joins any layout, initialised by least squares and trained 100 steps by SN-Net's
distillation from the destination model). A refined trial records the trial it retrains
(``refines``) and is measured like any other, with one difference: it skips the gate before
training (``._fidelity``), because it was chosen to be trained, and training is what lifts a
least-squares stitch the front dominates past it (``fattorib_resnet20[input:bn] ->
zlatasm_resnet20[layer1.1:output]``: 0.746 least squares, 0.892 with a distilled ``conv3x3``).
Its trained network still meets the gate on its own slices, and it joins the front only
where its validation accuracy earns it.

On the real CIFAR-10 zoo a block-skipping stitch, ``fattorib_resnet20[input:second_block.
residual_block.0] -> kejeon_resnet20[layer2.1:output]``, went from 0.742 validation accuracy
(least squares) to 0.871 with a ``linear`` stitch and to 0.877 with ``conv3x3`` (2.2 M MACs more),
each trained 100 steps by distillation.

The enqueued trial carries its config as the ``config`` user attribute, which
:meth:`StitchObjective.sample` takes instead of asking the space, so refining works with any
space, with the local loop and with Ray workers alike.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna

from stitch_nas import attrs
from stitch_nas.adapters import refined_adapter, refined_adapters, registered_kinds
from stitch_nas.config import AdapterSpec, StitchConfig
from stitch_nas.stitching import STITCHED, Measurement, network_kind

from ._fidelity import objective_values, reference_points
from ._runner import StitchObjective
from ._seeding import pareto_order

__all__ = ["refine_adapter", "refine_adapters", "refine_study"]


def refine_adapters(specs: Any, where: str = "refine_adapters") -> list[AdapterSpec]:
    """A list of ``{"kind": ..., **options}`` mappings as checked AdapterSpecs of trained kinds
    (one-line errors: an unknown kind or option, a bad value, a kind that does not train)."""
    checked = refined_adapters(specs, registered_kinds(), where)
    return [AdapterSpec(kind, tuple(sorted(options.items()))) for kind, options in checked]


def refine_adapter(spec: Mapping[str, Any], where: str = "refine_adapter") -> AdapterSpec:
    """One ``{"kind": ..., **options}`` mapping as a checked AdapterSpec (see
    :func:`refine_adapters`)."""
    kind, options = refined_adapter(spec, registered_kinds(), where)
    return AdapterSpec(kind, tuple(sorted(options.items())))


def _refined(config: StitchConfig, adapter: AdapterSpec) -> StitchConfig | None:
    """``config`` with every least-squares joint replaced by ``adapter`` (None: it has none)."""
    if not any(a.kind == "lstsq" for a in config.adapters):
        return None
    joints = tuple(adapter if a.kind == "lstsq" else a for a in config.adapters)
    return dataclasses.replace(config, adapters=joints)


def _measured(
    trial: optuna.trial.FrozenTrial, names: Sequence[str], budgets: Mapping[str, float]
) -> list[float] | None:
    """A trial's objective values: a COMPLETE one's own, or for one the multi-fidelity gate
    stopped, those of its slice accuracy (its least-squares stitch may be worth training even
    so); None for anything else (repeats, probe-pruned, over a budget)."""
    if trial.values is not None:
        return list(trial.values)
    ua = trial.user_attrs
    if attrs.PARTIAL_ACCURACY not in ua or attrs.DUPLICATE_OF in ua:
        return None
    if "macs" not in ua or "params" not in ua:  # a slice record of another version
        return None
    m = Measurement(
        accuracy=ua[attrs.PARTIAL_ACCURACY], macs=ua["macs"], params=ua["params"], cka=math.nan
    )
    return objective_values(m, names, budgets)


def _turns(
    points: list[tuple[float, ...]], stitched: list[bool], zoo: list[tuple[float, ...]]
) -> list[int]:
    """Indices of ``points`` (to minimise), stitched networks and the rest taking turns, each
    group in order of Pareto layers among itself and the zoo's models."""
    groups = []
    for want in (True, False):
        members = [i for i, s in enumerate(stitched) if s == want]
        order = pareto_order([points[i] for i in members] + zoo)
        groups.append([members[j] for j in order if j < len(members)])
    turns = []
    for pair in itertools.zip_longest(*groups):
        turns += [i for i in pair if i is not None]
    return turns


def refine_study(
    study: optuna.Study,
    objective: StitchObjective,
    count: int,
    adapters: Sequence[AdapterSpec],
    *,
    echo: Callable[[str], None] | None = None,
) -> int:
    """Enqueue on ``study`` the ``count`` best least-squares networks, once per adapter of
    ``adapters`` trained at their joints; returns how many trials were enqueued. Configs the
    study holds already are skipped, and a network refined before is one of the ``count``: a
    resumed search refines its best networks, not ``count`` more."""
    if count <= 0 or not adapters:
        return 0
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    done = study.get_trials(deepcopy=False, states=states)
    held = {
        StitchConfig.from_dict(t.user_attrs[attrs.CONFIG]).stable_hash()
        for t in study.trials
        if attrs.CONFIG in t.user_attrs
    }
    signs = [-1.0 if d == optuna.study.StudyDirection.MAXIMIZE else 1.0 for d in study.directions]
    rows, values = [], []
    for t in done:
        if attrs.CONFIG not in t.user_attrs or not all(c <= 0 for c in t.constraints.values()):
            continue
        if attrs.FINETUNES in t.user_attrs:  # trained already, and by the stage after this one
            continue
        if attrs.REFINES in t.user_attrs:  # a refinement (of a resumed search) would reorder
            continue  # the least-squares networks it was chosen from
        measured = _measured(t, objective.names, objective.budgets)
        if measured is not None:
            rows.append(t)
            values.append(measured)
    zoo = [
        tuple(s * v for s, v in zip(signs, p, strict=True))
        for p in reference_points(study, objective.names, objective.budgets)
    ]
    points = [tuple(s * v for s, v in zip(signs, p, strict=True)) for p in values]
    stitched = [
        network_kind(objective.ctx, StitchConfig.from_dict(t.user_attrs[attrs.CONFIG])) == STITCHED
        for t in rows
    ]
    networks = refining = enqueued = 0
    for i in _turns(points, stitched, zoo):
        if networks >= count:
            break
        config = StitchConfig.from_dict(rows[i].user_attrs[attrs.CONFIG])
        refined = [c for c in (_refined(config, a) for a in adapters) if c is not None]
        if not refined:  # no least-squares joint
            continue
        networks += 1
        new = [c for c in refined if c.stable_hash() not in held]
        refining += bool(new)
        for config in new:
            held.add(config.stable_hash())
            user_attrs = {attrs.CONFIG: config.to_dict(), attrs.REFINES: rows[i].number}
            study.enqueue_trial({}, user_attrs=user_attrs)
            enqueued += 1
    if echo is not None and enqueued:
        kinds = ", ".join(f"{a.kind} {dict(a.options)}" for a in adapters)
        echo(f"refining {refining} of the best least-squares networks: {enqueued} trials ({kinds})")
    return enqueued
