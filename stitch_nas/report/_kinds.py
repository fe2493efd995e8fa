"""Each reported network's kind ("stitched", "new head", ...) as a study records it.

A trial records its kind when it is measured (``attrs.KIND``, see
:func:`~stitch_nas.stitching.network_kind`). Trials of older versions lack it: the test pass
(:func:`~stitch_nas.report.measure_holdout`, which has the zoo at hand) then records the front's
kinds on the study (``attrs.KINDS``). A one-fragment config needs no zoo to know its kind;
any other network of an old study that the test pass did not see has no known kind (None,
shown as "kind unknown"), and is not counted as stitched.

:func:`stitched_front` is the front of the stitched networks alone. The claims count stitched
networks apart, and on a real zoo a network of another kind (a zoo model with a new stem) often
dominates every stitched one on validation, which would leave the claims nothing chosen to judge:
so the test pass measures this front as well as the study's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from stitch_nas import attrs
from stitch_nas.errors import ConfigError
from stitch_nas.stitching import STITCHED

from ._pareto import as_losses, cheapest_first, first_of_each_network, is_feasible, trial_config

__all__ = ["recorded_kinds", "stitched_front", "stitched_trials", "trial_kind", "kind_text"]


def recorded_kinds(study: optuna.Study) -> dict[int, str]:
    """Kinds the test pass recorded on the study for trials without their own, by number."""
    raw = study.user_attrs.get(attrs.KINDS) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"study.user_attrs[{attrs.KINDS!r}] must be a dict")
    return {int(number): str(kind) for number, kind in raw.items()}


def trial_kind(trial: FrozenTrial, recorded: dict[int, str]) -> str | None:
    """The trial's kind: its own attribute, the test pass's record, or from a one-fragment
    config; None when none of these knows it."""
    own = trial.user_attrs.get(attrs.KIND)
    if own is not None:
        return str(own)
    if trial.number in recorded:
        return recorded[trial.number]
    fragments: list[dict[str, Any]] = trial_config(trial).get("fragments") or []
    if len(fragments) == 1:
        return "zoo model" if fragments[0].get("end") is None else "truncated"
    return None


def kind_text(kind: str | None) -> str:
    """A kind as tables and claims print it."""
    return "kind unknown" if kind is None else kind


def stitched_trials(
    study: optuna.Study, keep: Callable[[FrozenTrial], bool] | None = None
) -> list[FrozenTrial]:
    """The feasible completed trials of kind "stitched", each network once (its first trial);
    ``keep``: only the trials it accepts."""
    recorded = recorded_kinds(study)
    return first_of_each_network(
        [
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if is_feasible(t) and trial_kind(t, recorded) == STITCHED and (keep is None or keep(t))
        ]
    )


def stitched_front(
    study: optuna.Study, keep: Callable[[FrozenTrial], bool] | None = None
) -> list[FrozenTrial]:
    """The non-dominated feasible completed trials of kind "stitched", compared only with each
    other (each network once, cheapest first as :func:`~stitch_nas.report.pareto_trials`);
    ``keep``: only the trials it accepts take part."""
    trials = stitched_trials(study, keep)
    if not trials:
        return []
    losses = as_losses(np.asarray([t.values for t in trials], dtype=float), study.directions)
    front = [
        t
        for t, row in zip(trials, losses, strict=True)
        if not np.any(np.all(losses <= row, axis=1) & np.any(losses < row, axis=1))
    ]
    return cheapest_first(front, study.directions)
