"""The loop that runs a study: zoo references first, then trials one by one in this process,
or both on the executor the settings name (Ray workers), until the requested total is reached.

The total counts distinct networks: a proposal that repeats an evaluated config, or a zoo model
on its own, is recorded as a cheap PRUNED trial that does not count
(:meth:`StitchObjective.duplicate`). A space that only repeats itself stops the search after
``objective.max_repeats`` such proposals in a row, with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import optuna
from optuna.trial import TrialState

from stitch_nas import attrs
from stitch_nas.activations import StitchContext
from stitch_nas.choices import check_at_least
from stitch_nas.config import StitchConfig
from stitch_nas.errors import BudgetError, StitchNASError
from stitch_nas.fragments import count_params
from stitch_nas.stitching import LatencySpec, fragment_macs, measure

from ._runner import StitchObjective
from ._studies import completed_count

__all__ = [
    "Executor",
    "check_budget_reachable",
    "cost_floor",
    "measure_references",
    "record_references",
    "run_search",
]

logger = logging.getLogger(__name__)


def measure_references(
    ctx: StitchContext,
    models: Sequence[str] | None = None,
    *,
    latency: LatencySpec | None = None,
) -> list[dict]:
    """Each zoo model on its own, measured like a trial: the reference stars of the report.

    A search's space proposing a zoo model on its own gets these figures, not a new trial, so
    they include latency when an objective needs it.
    """
    rows = []
    for name in models or ctx.zoo.names():
        _, m = measure(ctx, StitchConfig.single(name), latency=latency)
        rows.append({"name": name, **{k: v for k, v in m.to_dict().items() if v is not None}})
    return rows


def record_references(
    study: optuna.Study, objective: StitchObjective, executor: Executor | None = None
) -> None:
    """Store the zoo's references on ``study`` (``attrs.REFERENCES``) unless it has them:
    measured here (:func:`measure_references`), or on ``executor``'s workers."""
    if attrs.REFERENCES in study.user_attrs:
        return
    if executor is None:
        refs = measure_references(objective.ctx, latency=objective.latency)
    else:
        refs = executor.references(objective)
    study.set_user_attr(attrs.REFERENCES, refs)


def cost_floor(objective: StitchObjective) -> dict[str, tuple[float, str]]:
    """A lower bound on what any network of the zoo costs, per budget key, and its parts.

    Every network starts with some model's prefix and ends with some model's suffix (its head),
    and the two never overlap, so the cheapest first-cut prefix plus the cheapest last-cut suffix
    (MACs or parameters) is a lower bound on any config's cost, a zoo model on its own included.
    A latency budget has none (the figure is timed, or the user's own).
    """
    ctx = objective.ctx

    def cost(key: str, name: str, start: str | None, end: str | None) -> float:
        if key == "macs":
            return fragment_macs(ctx, name, start, end)
        return count_params(ctx.segment(name, start, end))

    cut = [n for n in ctx.zoo.names() if ctx.cuts(n)]
    whole = [n for n in ctx.zoo.names() if not ctx.cuts(n)]  # used only on its own
    floors = {}
    for key in (k for k in objective.budgets if k != "latency"):  # no floor before timing
        bounds = [(cost(key, n, None, None), f"{n} on its own") for n in whole]
        if cut:
            # a deeper prefix holds the shallower one, so each model's first cut is its
            # cheapest; an earlier suffix holds a later one, so its last cut is its cheapest
            prefix = min((cost(key, n, None, ctx.cuts(n)[0].name), n) for n in cut)
            suffix = min((cost(key, n, ctx.cuts(n)[-1].name, None), n) for n in cut)
            bounds.append(
                (
                    prefix[0] + suffix[0],
                    f"{prefix[1]}'s first block {prefix[0]:.4g} and {suffix[1]}'s head "
                    f"{suffix[0]:.4g}",
                )
            )
        floors[key] = min(bounds)
    return floors


def check_budget_reachable(objective: StitchObjective) -> None:
    """Refuse a budget below the cheapest network the zoo can make (:func:`cost_floor`),
    before any trial."""
    for key, (cheapest, parts) in cost_floor(objective).items():
        limit = objective.budgets[key]
        if limit < cheapest:
            raise BudgetError(
                f"{key} budget {limit:.4g} is below the cheapest network the zoo can make (at "
                f"least {cheapest:.4g} {key}: {parts}); raise the budget"
            )


class Executor(Protocol):
    """Runs trials of ``objective`` until ``study`` holds ``n_trials`` finished ones, having
    first measured the zoo's references (:func:`measure_references`) where the study lacks
    them (``attrs.REFERENCES``)."""

    def run(
        self, objective: StitchObjective, study: optuna.Study, n_trials: int, *, progress: bool
    ) -> optuna.Study: ...

    def references(self, objective: StitchObjective) -> list[dict]:
        """The zoo's references (:func:`measure_references`), measured where trials run."""
        ...


def run_search(
    objective: StitchObjective,
    study: optuna.Study,
    n_trials: int,
    *,
    progress: bool = False,
    executor: Executor | None = None,
) -> optuna.Study:
    """Run until the study holds ``n_trials`` finished (complete or pruned) distinct networks.

    Repeats of evaluated configs do not count (:func:`completed_count`); after
    ``objective.max_repeats`` of them in a row the search stops short with a warning.

    Args:
        objective: The objective (search space, objectives, budgets) to run.
        study: The study to add trials to; finished trials already in it count.
        n_trials: Total number of finished distinct networks to reach.
        progress: Show a progress bar.
        executor: Where trials run; None runs them one by one in this process, a
            :class:`~stitch_nas.search.RayExecutor` runs them on Ray workers.
    """
    check_at_least(n_trials, "n_trials", 1)  # search.trials' check
    check_budget_reachable(objective)  # costs only: before any network runs
    objective.repeats = 0
    if executor is not None:  # it measures the references where its trials run
        return executor.run(objective, study, n_trials, progress=progress)
    record_references(study, objective)
    from tqdm.auto import tqdm

    done = completed_count(study)
    bar = tqdm(total=n_trials, initial=min(done, n_trials), desc="trials", disable=not progress)
    try:
        while completed_count(study) < n_trials and not objective.exhausted():
            remaining = n_trials - completed_count(study)
            before = _finished(study)  # by number: enqueued trials wait among the earlier ones
            callbacks = [_tick(bar), _stop_at(n_trials, objective)]
            study.optimize(objective, n_trials=remaining, callbacks=callbacks)
            new = [t for t in _finished(study).values() if t.number not in before]
            if not new:
                break
            if all(t.state == TrialState.FAIL for t in new):  # every one failed: don't spin
                raise StitchNASError(
                    "every trial failed; see fail_reason in trials.csv for the cause"
                )
    finally:
        bar.close()
    if objective.exhausted():
        logger.warning(objective.exhausted_message(study, n_trials))
    return study


def _finished(study: optuna.Study) -> dict[int, optuna.trial.FrozenTrial]:
    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return {t.number: t for t in study.get_trials(deepcopy=False, states=states)}


def _stop_at(n_trials: int, objective: StitchObjective):
    """Stop at the requested total even when other drivers add trials to the study, or when
    the space proposes nothing new."""

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if objective.exhausted() or completed_count(study) >= n_trials:
            study.stop()

    return callback


def _tick(bar: Any):
    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        finished = (TrialState.COMPLETE, TrialState.PRUNED)
        repeat = attrs.DUPLICATE_OF in trial.user_attrs or attrs.REFERENCE_OF in trial.user_attrs
        if trial.state in finished and not repeat:
            bar.update(1)
        if not bar.disable and trial.number % 10 == 0:  # best_trials reads every trial
            # two drivers may measure one config at once: count it once
            front = {t.user_attrs.get(attrs.DESCRIBE, t.number) for t in study.best_trials}
            bar.set_postfix(pareto=len(front), refresh=False)

    return callback
