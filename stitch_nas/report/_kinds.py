"""Each reported network's kind ("stitched", "new head", ...) as a study records it.

A trial records its kind when it is measured (``attrs.KIND``, see
:func:`~stitch_nas.stitching.network_kind`). Trials of older versions lack it: the test pass
(:func:`~stitch_nas.report.measure_holdout`, which has the zoo at hand) then records the front's
kinds on the study (``attrs.KINDS``). A one-fragment config needs no zoo to know its kind;
any other network of an old study that the test pass did not see has no known kind (None,
shown as "kind unknown"), and is not counted as stitched.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial

from stitch_nas import attrs
from stitch_nas.errors import ConfigError

from ._pareto import trial_config

__all__ = ["recorded_kinds", "trial_kind", "kind_text"]


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
