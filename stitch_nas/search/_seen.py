"""The configs a study has evaluated already, read from the study itself.

Samplers propose the same config again (TPE re-proposes its good configs; a chain space holds
each zoo model on its own). :class:`SeenConfigs` maps ``StitchConfig.stable_hash()`` to the first
trial that evaluated that config, read from the trials stored on the study (their ``config``
attribute), so a resumed search (``--resume``) and every driver on a shared storage
(``--join``) recognise what was measured before. A refresh parses only the finished trials it
has not read yet; running trials (this driver's in flight, other drivers') are read anew each
time, so a config in flight is not sent twice. A zoo model on its own is the reference the
search measured before its first trial (``attrs.REFERENCES``).

A driver also notes its own trials as it sends and finishes them (:meth:`SeenConfigs.note`), so
its own repeats are recognised exactly even between reads. That lets the Ray driver, which asks
many times a second when trials are cheap, read the study at most once per ``max_age_s``: a
config another driver sent within that time may then be measured twice (a wasted trial, listed
once on the front), never one of its own. Reading the study costs an Optuna query over every
running trial, ~7 ms on SQLite, on every ask otherwise.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, fields
from typing import Any

import optuna

from stitch_nas import attrs
from stitch_nas.config import StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.stitching import Measurement

__all__ = ["Earlier", "SeenConfigs"]

logger = logging.getLogger(__name__)

_FIGURES = tuple(f.name for f in fields(Measurement))
_State = optuna.trial.TrialState


@dataclass(frozen=True)
class Earlier:
    """The first evaluation of a config: a trial (``number``) or a zoo reference.

    Attributes:
        number: The trial that evaluated it; None for a zoo reference.
        reference: The zoo model's name, for a zoo model on its own.
        figures: What it measured (``Measurement`` fields); empty when pruned or running.
        reason: Why it was pruned, when it was.
        running: The trial has not finished yet.
    """

    number: int | None = None
    reference: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    running: bool = False

    def describe(self) -> str:
        """Why a repeat of this config is not evaluated (the repeat's ``prune_reason``)."""
        if self.reference is not None:
            return f"the zoo model {self.reference} on its own, measured once as a reference"
        if self.running:
            return f"duplicate of trial {self.number}, still running"
        if self.reason is not None:
            return f"duplicate of trial {self.number}, pruned: {self.reason}"
        return f"duplicate of trial {self.number}"


class SeenConfigs:
    """Config hash -> its first evaluation in one study (:meth:`refresh` reads the study)."""

    def __init__(self) -> None:
        self._study: optuna.Study | None = None
        self._reset()

    def _reset(self) -> None:
        self._read: set[int] = set()  # finished trials read already
        self._finished: dict[str, Earlier] = {}
        self._running: dict[str, Earlier] = {}
        self._references: dict[str, Earlier] = {}
        self._read_at = -float("inf")

    def refresh(
        self, study: optuna.Study, current: int | None = None, *, max_age_s: float = 0.0
    ) -> None:
        """Read what ``study`` evaluated since the last refresh; ``current``: the asking trial.

        ``max_age_s``: skip the read when the last one is younger (see the module docstring).
        """
        if study is not self._study:  # another study: nothing read applies to it
            self._reset()
            self._study = study
        elif time.monotonic() - self._read_at < max_age_s:
            return
        self._read_at = time.monotonic()
        if not self._references:  # stored before the first trial of a search, if at all
            self._references = _references(study)
        self._running = {}
        states = (_State.COMPLETE, _State.PRUNED, _State.RUNNING)
        for trial in study.get_trials(deepcopy=False, states=states):
            if trial.state == _State.RUNNING:
                key = _key(trial.user_attrs, trial.number)
                if trial.number != current and key is not None:
                    self._running.setdefault(key, Earlier(trial.number, running=True))
                continue
            if trial.number in self._read:
                continue
            self._read.add(trial.number)
            ua = trial.user_attrs
            if attrs.DUPLICATE_OF in ua or attrs.REFERENCE_OF in ua:  # a copy, not a source
                continue
            if (key := _key(ua, trial.number)) is not None:
                self._add_finished(key, trial.number, trial.state, ua)

    def note(
        self,
        number: int,
        key: str,
        state: optuna.trial.TrialState,
        user_attrs: dict[str, Any] | None = None,
    ) -> None:
        """This driver's own trial ``number`` of the config whose hash is ``key``: sent
        (RUNNING), or finished in ``state`` with ``user_attrs``; known before the next read."""
        if state == _State.RUNNING:
            self._running.setdefault(key, Earlier(number, running=True))
            return
        if self._running.get(key, Earlier()).number == number:
            del self._running[key]
        if state in (_State.COMPLETE, _State.PRUNED):  # a failed config may be tried again
            self._add_finished(key, number, state, user_attrs or {})

    def _add_finished(
        self, key: str, number: int, state: optuna.trial.TrialState, ua: dict[str, Any]
    ) -> None:
        if state == _State.PRUNED:
            reason = ua.get(attrs.PRUNE_REASON) or "pruned"
            earlier = Earlier(number, reason=str(reason))
        else:
            earlier = Earlier(number, figures={k: ua[k] for k in _FIGURES if k in ua})
        # a measurement beats a prune, then the lower number (which may finish later)
        known = self._finished.get(key)
        if known is None or _rank(earlier) < _rank(known):
            self._finished[key] = earlier

    def get(self, key: str) -> Earlier | None:
        """The first evaluation of the config with ``stable_hash() == key``, if any.

        A finished trial comes first, then one still running, then a zoo reference (a study
        from before references stood in holds zoo models measured as trials).
        """
        return self._finished.get(key) or self._running.get(key) or self._references.get(key)


def _rank(earlier: Earlier) -> tuple[bool, int]:
    return earlier.reason is not None, earlier.number or 0


def _key(user_attrs: dict[str, Any], number: int) -> str | None:
    data = user_attrs.get(attrs.CONFIG)
    if not isinstance(data, dict):  # failed before its config was sampled, or not ours
        return None
    try:
        return StitchConfig.from_dict(data).stable_hash()
    except ConfigError as exc:
        logger.warning(
            "trial %d: stored config unreadable (%s); repeats not recognised", number, exc
        )
        return None


def _references(study: optuna.Study) -> dict[str, Earlier]:
    out = {}
    for ref in study.user_attrs.get(attrs.REFERENCES) or []:
        if isinstance(ref, dict) and isinstance(ref.get("name"), str):
            figures = {k: ref[k] for k in _FIGURES if k in ref}
            key = StitchConfig.single(ref["name"]).stable_hash()
            out[key] = Earlier(reference=ref["name"], figures=figures)
    return out
