"""Adapter choices shared by the search spaces: kind, rescaling, loss and what trains.

Only combinations that can join the sampled pair of cut points are offered, so no trial is
spent on a layout error. Optuna needs a parameter to keep one set of choices, so when the
feasible set is a subset of what the user allowed, the subset is part of the parameter's name
(``resize[bilinear/none]``). Losses that read the destination's classifier against the data's
labels (``task``; ``distill`` with a teacher other than the destination) are offered only where
the destination predicts those labels, and ``train='suffix'`` only where the loss reaches a
suffix (not ``match``; not ``feature`` at the destination's penultimate layer itself).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from stitch_nas import adapters as registry
from stitch_nas.activations import Memo, StitchContext
from stitch_nas.config import AdapterSpec
from stitch_nas.errors import ConfigError, LayoutError
from stitch_nas.fragments import CutPoint

from ._options import ADAPTER_KINDS

__all__ = ["ADAPTER_KINDS", "AdapterChoices", "suggest_adapter", "can_join"]


#: the resizes each adapter kind can join a cut pair with
_FEASIBLE: Memo[tuple[Any, ...], dict[str, list[str]]] = Memo("feasible adapters")


class AdapterChoices:
    """What a space may choose per joint; checked once against the adapter registry.

    Args:
        adapters: adapter kinds to choose from.
        resizes: spatial rescaling modes (trained kinds).
        losses: training losses ("none" = least-squares initialisation only; "match", "task",
            "distill", "feature": see :mod:`stitch_nas.adapters`).
        trains: what trains ("adapter", "suffix", "all").
        options: fixed options for every trained adapter (e.g. ``{"steps": 100}``).
    """

    def __init__(
        self,
        adapters: Sequence[str] = ("lstsq",),
        resizes: Sequence[str] = registry.RESIZE_MODES,
        losses: Sequence[str] = ("match",),
        trains: Sequence[str] = ("adapter",),
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.kinds = tuple(adapters)
        self.resizes, self.losses, self.trains = tuple(resizes), tuple(losses), tuple(trains)
        self.options = dict(options or {})
        if not self.kinds:
            raise ConfigError("give at least one adapter kind, e.g. ['lstsq']")
        for kind in self.kinds:
            registry.get_adapter(kind)  # unknown names raise here, before any trial
        for label, given, valid in (
            ("resize", self.resizes, registry.RESIZE_MODES),
            ("loss", self.losses, registry.LOSSES),
            ("train", self.trains, registry.TRAINS),
        ):
            bad = sorted(set(given) - set(valid)) or ([] if given else ["(empty)"])
            if bad:
                raise ConfigError(f"unknown {label} choice(s) {bad}; use some of {valid}")

    @property
    def only_lstsq(self) -> bool:
        return self.kinds == ("lstsq",)


can_join = registry.can_join


def _pick(trial: optuna.Trial, base: str, allowed: tuple[str, ...], feasible: list[str]) -> str:
    if len(feasible) == 1:
        return feasible[0]
    name = base if tuple(feasible) == allowed else f"{base}[{'/'.join(feasible)}]"
    return str(trial.suggest_categorical(name, feasible))


def suggest_adapter(
    trial: optuna.Trial,
    ctx: StitchContext,
    choices: AdapterChoices,
    src: CutPoint,
    dst: CutPoint,
    dst_model: str,
    *,
    prefix: str = "",
    first_joint: bool = True,
) -> AdapterSpec:
    """Sample an adapter spec for the joint ``src -> dst`` (``dst`` a cut of ``dst_model``).

    ``train='all'`` fine-tunes the network's first fragment, so only the first joint offers it.
    """

    def resizes() -> dict[str, list[str]]:
        return {
            kind: [r for r in choices.resizes if can_join(kind, src, dst, resize=r)]
            if kind != "lstsq"
            else ["-"] * can_join(kind, src, dst)
            for kind in choices.kinds
        }

    key = (choices.kinds, choices.resizes, src, dst)
    feasible = _FEASIBLE.fetch(ctx, key, resizes)
    kinds = [k for k in choices.kinds if feasible[k]]
    if not kinds:
        raise LayoutError(
            f"none of the adapters {list(choices.kinds)} can join {src.name!r} to {dst.name!r}"
        )
    kind = _pick(trial, f"{prefix}adapter", choices.kinds, kinds)
    if kind == "lstsq":
        return AdapterSpec("lstsq")
    resize = _pick(trial, f"{prefix}resize", choices.resizes, feasible[kind])
    native = tuple(ctx.entry(dst_model).label_names) == tuple(ctx.data.label_names)
    teacher = choices.options.get("teacher", "destination")
    labelled = {"task"} | ({"distill"} if teacher not in ("destination", dst_model) else set())
    losses = [x for x in choices.losses if x not in labelled or native]
    if not losses:
        raise ConfigError(
            f"loss choices {list(choices.losses)} need labels {dst_model!r} does not predict; "
            "allow loss 'match', 'feature' or 'none'"
        )
    loss = _pick(trial, f"{prefix}loss", choices.losses, losses)
    # the feature loss at the penultimate layer itself has no suffix to train, as match never has
    at_feature = dst.name == registry.feature_cut(ctx, dst_model).name
    no_suffix = ("adapter", "all")
    usable = {
        "none": ("adapter",),
        "match": no_suffix,
        "task": registry.TRAINS,
        "distill": registry.TRAINS,
        "feature": no_suffix if at_feature else registry.TRAINS,
    }[loss]
    trains = [t for t in choices.trains if t in usable and (first_joint or t != "all")]
    trains = trains or ["adapter"]
    what = _pick(trial, f"{prefix}train_{loss}", choices.trains, trains)
    options = {**choices.options, "resize": resize, "loss": loss, "train": what}
    return AdapterSpec(kind, tuple(sorted(options.items())))
