"""Evaluating one config: prune it on CKA and the probe, gate it, fit it and measure it.

Every executor runs a trial the same way, in three steps: the side that asks the study *plans*
it (:meth:`StitchObjective.plan`: sample, repeat check, the front its gate compares with) into a
:class:`TrialPlan`; the plan is *evaluated* (:func:`evaluate_plan`) in this process, on a Ray
worker or in a Tune trainable; the asking side *records* the :class:`TrialOutcome`
(:meth:`StitchObjective.finish`) and tells the study. Plans and outcomes pickle, and the outcome
is in JSON types (and the bytes of a safetensors file), so both cross process boundaries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from stitch_nas.activations import StitchContext
from stitch_nas.config import StitchConfig
from stitch_nas.errors import LayoutError, StitchNASError
from stitch_nas.stitching import (
    LatencySpec,
    Measurement,
    ProbeScore,
    config_cka,
    has_trained_adapters,
    least_squares_version,
    measure,
    probe_accuracy,
    trained_bytes,
)

from ._fidelity import Fidelity, Front, SliceStop, screen_before_training

__all__ = [
    "EvaluationOptions",
    "Repeat",
    "TrialOutcome",
    "TrialPlan",
    "evaluate_config",
    "evaluate_plan",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvaluationOptions:
    """How a search evaluates every config (:meth:`StitchObjective.evaluation_options`), the
    same wherever a plan is evaluated; the keywords of :func:`evaluate_config`.

    Attributes:
        cka_threshold: prune stitched configs whose CKA score is below this.
        probe_threshold: prune stitched configs whose least-squares probe accuracy is below
            this multiple of chance.
        fuse: fold least-squares stitches into the next layer where possible.
        latency: how each network is timed (an objective or a budget needs it; None: not).
        fidelity: the multi-fidelity rule (None: every config is scored on the whole split).
    """

    cka_threshold: float = 0.0
    probe_threshold: float = 0.0
    fuse: bool = False
    latency: LatencySpec | None = None
    fidelity: Fidelity | None = None


@dataclass(frozen=True)
class TrialPlan:
    """One trial's config and how it is evaluated: what the side that asks the study hands to
    the side that evaluates it.

    Attributes:
        config: the sampled config.
        front: the study's front when the trial was planned, which the multi-fidelity gate
            compares the config with (None: no gate).
        gate_training: gate a config with trained adapters on its least-squares version first
            (:func:`~stitch_nas.search._fidelity.gates_training`).
    """

    config: StitchConfig
    front: Front | None = None
    gate_training: bool = True


@dataclass(frozen=True)
class Repeat:
    """A planned trial whose ``config`` the study has evaluated already: it is told PRUNED with
    ``reason``, evaluating nothing, and does not count towards the requested trials."""

    config: StitchConfig
    reason: str


def exception_line(exc: BaseException) -> str:
    """``"TypeName: first line of the message"`` (a reason or error that stays one line)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


@dataclass(frozen=True)
class TrialOutcome:
    """What evaluating one config gave; it crosses process boundaries (Ray pickles it, Ray
    Tune reports it as JSON: :meth:`to_dict` / :meth:`from_dict`).

    Attributes:
        status: "complete", "pruned" (CKA below threshold, layout mismatch) or "fail".
        measurement: what the network measured, when complete.
        cka: the config's CKA score when it was computed.
        reason: why it was pruned or failed (``"TypeName: message"`` for exceptions).
        partial: what the slices measured when multi-fidelity evaluation pruned it.
        probe: the least-squares version's probe accuracy, when it was measured.
        weights: a complete network's trained adapters (``stitching.trained_bytes``: a
            safetensors file of a few kB to MB), for the driver to keep in the study's folder
            so the test pass and the export load them instead of training them again.
    """

    status: str
    measurement: Measurement | None = None
    cka: float | None = None
    reason: str | None = None
    partial: dict[str, Any] | None = None
    probe: float | None = None
    weights: bytes | None = None

    def to_dict(self) -> dict[str, Any]:
        """The outcome as plain values (the measurement as ``Measurement.to_dict()``)."""
        return asdict(self)

    @classmethod
    def failed(cls, exc: BaseException, context: str = "") -> TrialOutcome:
        """A failed outcome whose reason is ``context`` and the exception's first line."""
        return cls("fail", reason=f"{context}{exception_line(exc)}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialOutcome:
        """The outcome :meth:`to_dict` wrote."""
        measured = data.get("measurement")
        measurement = None if measured is None else Measurement(**measured)
        return cls(**{**data, "measurement": measurement})


def evaluate_config(
    ctx: StitchContext,
    config: StitchConfig,
    *,
    cka_threshold: float = 0.0,
    probe_threshold: float = 0.0,
    fuse: bool = False,
    latency: LatencySpec | None = None,
    fidelity: Fidelity | None = None,
    front: Sequence[Sequence[float]] | None = None,
    gate_training: bool = True,
) -> TrialOutcome:
    """Prune (CKA, then least-squares probe accuracy), fit and measure ``config``; any exception
    becomes a "fail" outcome.

    A trial that raises is recorded as FAIL with its reason rather than stopping the study;
    the runners stop a study whose trials all fail. ``probe_threshold`` is a multiple of chance
    (``1 / classes``) that the least-squares version's probe accuracy must reach
    (:mod:`stitch_nas.stitching._proxy`). ``fidelity`` (the search's :class:`Fidelity` rule)
    and a non-empty ``front`` turn on multi-fidelity evaluation (``._fidelity``);
    with it, a config with trained adapters is first gated on its least-squares version unless
    ``gate_training`` is False.
    """
    cka: float | None = None
    probe = None
    gate = fidelity.gate(front) if fidelity is not None and front else None
    try:
        cka = config_cka(ctx, config)
        if config.is_stitched and cka < cka_threshold:
            return TrialOutcome("pruned", cka=cka, reason=f"cka {cka:.3f} < {cka_threshold}")
        started = time.perf_counter()
        trains = gate_training and gate is not None and least_squares_version(config) != config
        if config.is_stitched and (probe_threshold > 0 or trains):
            probe = probe_accuracy(ctx, config)
            floor = probe_threshold / ctx.num_classes
            if probe.accuracy < floor:
                reason = f"probe accuracy {probe.accuracy:.3f} < {floor:.3f}"
                return TrialOutcome("pruned", cka=cka, reason=reason, probe=probe.accuracy)
            if gate is not None and trains:  # train only what could reach the front
                screen_before_training(gate, ctx, probe.net)
        net, result = measure(
            ctx,
            config,
            fuse=fuse,
            latency=latency,
            cka=cka,
            screen=gate,
            net=probe.net if probe and probe.own else None,
            fit_seconds=time.perf_counter() - started if probe and probe.own else 0.0,
        )
        weights = trained_bytes(ctx, net) if has_trained_adapters(config) else None
    except SliceStop as stop:
        return TrialOutcome(
            "pruned", cka=cka, reason=stop.reason, partial=stop.record, probe=_probe(probe)
        )
    except LayoutError as exc:  # a structural mismatch, not a broken trial
        return TrialOutcome("pruned", cka=cka, reason=f"layout: {exc}")
    except Exception as exc:  # noqa: BLE001 - failure isolation: the study goes on
        known = isinstance(exc, (StitchNASError, RuntimeError, ValueError))
        logger.warning("config %s failed: %s", config.describe(), exc, exc_info=not known)
        return TrialOutcome("fail", cka=cka, reason=f"{type(exc).__name__}: {exc}")
    return TrialOutcome(
        "complete", measurement=result, cka=cka, probe=_probe(probe), weights=weights
    )


def evaluate_plan(ctx: StitchContext, plan: TrialPlan, options: EvaluationOptions) -> TrialOutcome:
    """Evaluate ``plan`` on ``ctx`` with a search's evaluation ``options``
    (:meth:`StitchObjective.evaluation_options`): the middle step of every trial, wherever it
    runs."""
    return evaluate_config(
        ctx,
        plan.config,
        cka_threshold=options.cka_threshold,
        probe_threshold=options.probe_threshold,
        fuse=options.fuse,
        latency=options.latency,
        fidelity=options.fidelity,
        front=plan.front,
        gate_training=plan.gate_training,
    )


def _probe(score: ProbeScore | None) -> float | None:
    return None if score is None else score.accuracy
