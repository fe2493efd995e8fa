"""The Optuna side: an objective that plugs into any study (``search._loop`` runs a study).

``make_objective`` returns a callable for ``study.optimize``: it samples a StitchConfig from a
search space, prunes it on CKA before any fitting, fits and measures it, records everything as
JSON user attributes, sets budget constraints, and returns the objective values. A trial that
fails on its own (bad stitch, NaN) is recorded as FAIL with its reason; the study goes on. A
config the study evaluated before is not evaluated again (:meth:`StitchObjective.duplicate`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import optuna

from stitch_nas import attrs
from stitch_nas.activations import StitchContext
from stitch_nas.choices import (
    check_at_least,
    check_budgets,
    check_cka_threshold,
    check_fidelity,
    check_objective_names,
    check_probe_threshold,
)
from stitch_nas.config import StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.plugins import OBJECTIVES, SPACES
from stitch_nas.registry import keyword_options
from stitch_nas.stitching import STITCHED, LatencySpec, Measurement, network_kind

from ._evaluate import EvaluationOptions, Repeat, TrialOutcome, TrialPlan, evaluate_plan
from ._fidelity import (
    DEFAULT_FIDELITY,
    MIN_SLICE_IMAGES,
    Fidelity,
    Front,
    current_front,
    gates_training,
    slice_size,
)
from ._record import record_measurement, record_outcome
from ._seen import Earlier, SeenConfigs
from ._studies import completed_count, set_metric_names
from ._user_attrs import BufferedTrial

__all__ = ["ObjectiveSettings", "StitchObjective", "make_objective"]

logger = logging.getLogger(__name__)

#: prune stitched configs whose least-squares probe accuracy is below this multiple of chance
DEFAULT_PROBE_THRESHOLD = 1.5
#: stop a search after this many proposals in a row that were all repeats of evaluated configs
DEFAULT_MAX_REPEATS = 50


@dataclass(frozen=True)
class ObjectiveSettings:
    """What a :class:`StitchObjective` was made with, less its context: another process (a Ray
    worker that runs trials itself) rebuilds the same objective on its own context from it
    (:meth:`StitchObjective.on_context`). The fields are the constructor's arguments, checked
    there, plus the search folder."""

    space: str
    objectives: tuple[str, ...]
    cka_threshold: float
    probe_threshold: float
    budgets: dict[str, float]
    space_options: dict[str, Any]
    fuse: bool
    fidelity: float
    min_slice: int
    max_repeats: int
    latency: LatencySpec
    folder: Path | None


class StitchObjective:
    """The callable ``trial -> tuple of objective values`` handed to ``study.optimize``.

    Attributes:
        directions: Optuna directions matching the returned values, for ``create_study``.
        names: the objective names in the same order.
    """

    def __init__(
        self,
        ctx: StitchContext,
        *,
        space: str = "pairwise",
        objectives: Sequence[str] = ("accuracy", "macs"),
        cka_threshold: float = 0.0,
        probe_threshold: float | None = None,
        budgets: Mapping[str, float] | None = None,
        space_options: Mapping[str, Any] | None = None,
        fuse: bool = False,
        fidelity: float = DEFAULT_FIDELITY,
        min_slice: int = MIN_SLICE_IMAGES,
        max_repeats: int = DEFAULT_MAX_REPEATS,
        latency: LatencySpec | Mapping[str, Any] | None = None,
    ) -> None:
        self.ctx = ctx
        self.space = SPACES.get(space)
        self.space_name = space
        # search.objectives' check, then each name against the installed objectives
        self.objectives = [OBJECTIVES.get(n) for n in check_objective_names(objectives)]
        self.names = [o.name for o in self.objectives]
        self.directions = [o.direction for o in self.objectives]
        self.cka_threshold = check_cka_threshold(cka_threshold)
        if probe_threshold is None:  # read at call time, so a test may change the default
            probe_threshold = DEFAULT_PROBE_THRESHOLD
        # search.probe_threshold's check, now with the data's number of classes
        self.probe_threshold = check_probe_threshold(
            probe_threshold, "probe_threshold", ctx.num_classes
        )
        self.budgets = check_budgets(budgets or {})
        self.space_options = dict(space_options or {})
        # an unknown option is a one-line error now, not a TypeError on the first trial
        keyword_options(self.space, self.space_options, f"search space {space!r}")
        self.fuse = fuse
        # multi-fidelity evaluation (see ._fidelity): share of the split scored first, 0: off
        self.fidelity = check_fidelity(fidelity)
        # ... on a slice of at least min_slice images; smaller splits are scored whole
        self.min_slice = check_at_least(min_slice, "min_slice", 0, " (images; 0: any slice)")
        self.gated = self.fidelity > 0 and (
            slice_size(len(ctx.labels("val")), self.fidelity) >= min_slice
        )
        #: how a network is timed (``search.latency``); ``latency``: that, where an objective
        #: or a budget needs the figure, else None (nothing is timed)
        self.latency_spec = LatencySpec.from_options(latency)
        timed = any(o.needs_latency for o in self.objectives) or "latency" in self.budgets
        self.latency = self.latency_spec if timed else None
        if self.latency is not None:  # onnxruntime missing, a table without a zoo model...
            self.latency.check(ctx.zoo.names())
        self.max_repeats = check_at_least(max_repeats, "max_repeats", 1)
        self.repeats = 0  # proposals in a row that repeated an evaluated config
        #: user attributes every trial records with its config (a Ray worker's node and id)
        self.trial_attrs: dict[str, Any] = {}
        #: how old the repeat check's read of other drivers' trials may be (:meth:`duplicate`)
        self.seen_max_age_s = 0.0
        self._seen = SeenConfigs()  # read from the study, so --resume and --join share it
        self._named = False  # metric names checked on the study of the first trial
        #: the search's folder: a complete trial's trained adapters are kept in its
        #: ``trained/`` (``attrs.WEIGHTS``), so the test pass and the export load them rather
        #: than train them again; None: not kept (they are trained again from their seed)
        self.folder: Path | None = None

    def portable(self) -> ObjectiveSettings:
        """This objective's settings without its context, for another process to rebuild it
        on its own context (:meth:`on_context`): a Ray worker that runs trials itself."""
        return ObjectiveSettings(
            space=self.space_name,
            objectives=tuple(self.names),
            cka_threshold=self.cka_threshold,
            probe_threshold=self.probe_threshold,
            budgets=dict(self.budgets),
            space_options=dict(self.space_options),
            fuse=self.fuse,
            fidelity=self.fidelity,
            min_slice=self.min_slice,
            max_repeats=self.max_repeats,
            latency=self.latency_spec,
            folder=self.folder,
        )

    @classmethod
    def on_context(cls, settings: ObjectiveSettings, ctx: StitchContext) -> StitchObjective:
        """The objective ``settings`` describe (:meth:`portable`), on ``ctx``, with nothing
        seen yet."""
        objective = cls(
            ctx,
            space=settings.space,
            objectives=settings.objectives,
            cka_threshold=settings.cka_threshold,
            probe_threshold=settings.probe_threshold,
            budgets=settings.budgets,
            space_options=settings.space_options,
            fuse=settings.fuse,
            fidelity=settings.fidelity,
            min_slice=settings.min_slice,
            max_repeats=settings.max_repeats,
            latency=settings.latency,
        )
        objective.folder = settings.folder
        return objective

    def config_of(self, trial: optuna.Trial) -> StitchConfig | None:
        """The config the space makes of ``trial``'s params, for a caller outside a trial
        (seeding, the proxy, a replay); None where the space prunes them (``restnet``: no
        network of the pair fits the parameter budget)."""
        try:
            return self.space(trial, self.ctx, **self.space_options)
        except optuna.TrialPruned:
            return None

    def sample(self, trial: optuna.Trial) -> StitchConfig:
        given = trial.user_attrs.get(attrs.CONFIG)  # enqueued with its config (._refine)
        if given is not None:
            config = StitchConfig.from_dict(given)
        else:
            config = self.space(trial, self.ctx, **self.space_options)
        trial.set_user_attr(attrs.CONFIG, config.to_dict())
        trial.set_user_attr(attrs.DESCRIBE, config.describe())
        trial.set_user_attr(attrs.MODELS, list(config.models))
        for key, value in self.trial_attrs.items():
            trial.set_user_attr(key, value)
        return config

    def __call__(self, trial: optuna.Trial) -> tuple[float, ...]:
        if not self._named:  # a user's own study: name its objectives for optuna-dashboard
            self._named = True
            study = trial.study
            if study.metric_names is None and len(study.directions) == len(self.names):
                set_metric_names(study, self.names)
        # the trial's attributes in two writes: the config (shown while the trial runs), then
        # the measurement
        buffered = BufferedTrial(trial)
        view = cast(optuna.Trial, buffered)
        try:
            plan = self.plan(view, max_age_s=self.seen_max_age_s)
            buffered.flush()
            if isinstance(plan, Repeat):
                raise optuna.TrialPruned(plan.reason)
            outcome = self.evaluate(plan)
            state, values = self.finish(view, plan.config, outcome)
        finally:
            buffered.flush()
        if state == optuna.trial.TrialState.PRUNED:
            raise optuna.TrialPruned(outcome.reason)
        if values is None:  # a failed trial: NaN values make Optuna record FAIL
            return tuple(math.nan for _ in self.objectives)
        return values

    def plan(
        self, trial: optuna.Trial, *, max_age_s: float = 0.0, gate: bool = True
    ) -> TrialPlan | Repeat:
        """The first step of every trial, whichever executor runs it: sample ``trial``'s config,
        check that it is new (a repeat records the earlier figures, :meth:`duplicate`) and take
        the front its multi-fidelity gate compares with (``gate=False``: none).

        ``max_age_s``: as :meth:`duplicate`.
        """
        config = self.sample(trial)
        repeat = self.duplicate(trial, config, max_age_s=max_age_s)
        if repeat is not None:
            return Repeat(config, repeat)
        front = self.front(trial.study, config) if gate else None
        return TrialPlan(config, front, gates_training(trial))

    def evaluation_options(self) -> EvaluationOptions:
        """How this objective's configs are evaluated, wherever their plans are."""
        fidelity = Fidelity(self.fidelity, tuple(self.names), dict(self.budgets))
        return EvaluationOptions(
            cka_threshold=self.cka_threshold,
            probe_threshold=self.probe_threshold,
            fuse=self.fuse,
            latency=self.latency,
            fidelity=fidelity if self.gated else None,
        )

    def front(self, study: optuna.Study, config: StitchConfig | None = None) -> Front | None:
        """The study's current front that ``config`` is gated against (None: the gate is off):
        for a stitched config, the front of the study's stitched networks and the zoo."""
        if not self.gated:
            return None
        stitched = config is not None and network_kind(self.ctx, config) == STITCHED
        return current_front(study, self.names, self.budgets, STITCHED if stitched else None)

    def evaluate(self, plan: TrialPlan) -> TrialOutcome:
        """The second step: score, prune or measure ``plan`` in this process (what a Ray worker
        or a Tune trainable does elsewhere, with the same :func:`evaluate_plan`)."""
        return evaluate_plan(self.ctx, plan, self.evaluation_options())

    def duplicate(
        self, trial: optuna.Trial, config: StitchConfig, *, max_age_s: float = 0.0
    ) -> str | None:
        """Why ``config`` is not evaluated (the trial's prune reason), or None: a new config.

        A config that the study evaluated before (in this driver, before ``--resume``, or in
        another driver on the same storage), one still running there, and a zoo model on its
        own (measured once as a reference before the search) are not fitted again. The trial
        records ``duplicate_of`` (or ``reference_of``), the earlier figures as user attributes
        and a prune reason, and is told PRUNED rather than COMPLETE with copied values, by
        choice: the front and exports then hold each network once, the repeat does not count
        towards the requested trials (:func:`~stitch_nas.search.completed_count`), and TPE
        ranks a pruned trial among its poor ones, so it moves on to configs it has not
        proposed instead of proposing the same one again. :attr:`repeats` counts repeats in a
        row; the runners stop at ``max_repeats`` (:meth:`exhausted`).

        ``max_age_s``: read the study again only when the last read is older (other drivers'
        configs may then be missed for that long; see :mod:`._seen`).
        """
        self._seen.refresh(trial.study, current=trial.number, max_age_s=max_age_s)
        key = config.stable_hash()
        earlier = self._seen.get(key)
        if earlier is not None and earlier.reference is not None and not self._stands_in(earlier):
            earlier = None
        if earlier is None:
            self.repeats = 0
            self._seen.note(trial.number, key, optuna.trial.TrialState.RUNNING)
            return None
        self.repeats += 1
        if earlier.reference is not None:
            trial.set_user_attr(attrs.REFERENCE_OF, earlier.reference)
        else:
            trial.set_user_attr(attrs.DUPLICATE_OF, earlier.number)
        for key, value in earlier.figures.items():
            trial.set_user_attr(key, value)
        reason = earlier.describe()
        trial.set_user_attr(attrs.PRUNE_REASON, reason)
        return reason

    def _stands_in(self, reference: Earlier) -> bool:
        """Whether a zoo reference holds every objective's figure (older ones lack latency)."""
        try:
            result = Measurement(**reference.figures)
        except TypeError:  # a figure the reference was stored without
            return False
        usable = all(math.isfinite(float(o.value(result))) for o in self.objectives)
        if not usable:
            logger.info(
                "zoo reference %s lacks an objective's figure; measured as a trial",
                reference.reference,
            )
        return usable

    def exhausted(self) -> bool:
        """Whether the last ``max_repeats`` proposals all repeated evaluated configs."""
        return self.repeats >= self.max_repeats

    def exhausted_message(self, study: optuna.Study, n_trials: int) -> str:
        return (
            f"the space holds no new config after {self.repeats} proposals; "
            f"{completed_count(study)} of {n_trials} measured"
        )

    def finish(
        self, trial: optuna.Trial, config: StitchConfig, outcome: TrialOutcome
    ) -> tuple[optuna.trial.TrialState, tuple[float, ...] | None]:
        """The last step: record ``outcome`` on ``trial`` (:func:`._record.record_outcome`,
        which every executor's trials go through); return the state to tell and, if COMPLETE,
        the values."""
        state, values = record_outcome(trial, outcome, self.objectives, self.budgets, self.folder)
        # known before the study is read again
        self._seen.note(trial.number, config.stable_hash(), state, trial.user_attrs)
        return state, values

    def record(self, trial: optuna.Trial, result: Measurement) -> tuple[float, ...]:
        """Write ``result`` on ``trial`` with this search's objectives and budgets; return the
        objective values."""
        return record_measurement(trial, result, self.objectives, self.budgets)


def make_objective(
    zoo: Any = None,
    data: Any = None,
    *,
    ctx: StitchContext | None = None,
    space: str = "pairwise",
    objectives: Sequence[str] = ("accuracy", "macs"),
    **options: Any,
) -> StitchObjective:
    """An objective for your own study: ``study.optimize(make_objective(zoo, data), ...)``.

    Create the study with ``directions=objective.directions``. Pass ``ctx`` to share memoised
    activations between several objectives; otherwise one is made from ``zoo`` and ``data``.
    """
    if ctx is None:
        if zoo is None or data is None:
            raise ConfigError("make_objective needs zoo and data, or a StitchContext as ctx=")
        ctx = StitchContext(zoo, data)
    return StitchObjective(ctx, space=space, objectives=objectives, **options)
