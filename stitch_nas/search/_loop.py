"""The loop that runs a study: zoo references first, then trials one by one in this process
or on the executor the settings name (Ray workers), until the requested total is reached."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import optuna

from stitch_nas import attrs
from stitch_nas.activations import StitchContext
from stitch_nas.config import StitchConfig
from stitch_nas.errors import BudgetError, ConfigError, StitchNASError
from stitch_nas.fragments import count_params
from stitch_nas.stitching import fragment_macs, measure

from ._ray_executor import RayExecutor
from ._runner import StitchObjective
from ._studies import completed_count

if TYPE_CHECKING:
    from stitch_nas.cli._settings import SearchSettings

__all__ = [
    "EXECUTORS",
    "Executor",
    "check_budget_reachable",
    "executor_from_settings",
    "measure_references",
    "run_search",
]


def measure_references(ctx: StitchContext, models: Sequence[str] | None = None) -> list[dict]:
    """Each zoo model on its own, measured like a trial: the reference stars of the report."""
    rows = []
    for name in models or ctx.zoo.names():
        _, m = measure(ctx, StitchConfig.single(name))
        rows.append({"name": name, **{k: v for k, v in m.to_dict().items() if v is not None}})
    return rows


def check_budget_reachable(objective: StitchObjective) -> None:
    """Refuse a budget below the cheapest network the zoo can make.

    Every network starts with some model's prefix, so the cheapest prefix (MACs or parameters)
    is a lower bound on any config's cost.
    """
    ctx = objective.ctx
    for key, limit in objective.budgets.items():
        costs = []
        for name in ctx.zoo.names():
            # a deeper prefix holds the shallower one, so each model's first cut is its cheapest
            for cut in ctx.cuts(name)[:1]:
                if key == "macs":
                    costs.append(fragment_macs(ctx, name, None, cut.name))
                else:
                    costs.append(count_params(ctx.segment(name, None, cut.name)))
        cheapest = min(costs)
        if limit < cheapest:
            raise BudgetError(
                f"{key} budget {limit:.4g} is below the cheapest possible network (the cheapest "
                f"model prefix alone has {cheapest:.4g} {key}); raise the budget"
            )


class Executor(Protocol):
    """Runs trials of ``objective`` until ``study`` holds ``n_trials`` finished ones."""

    def run(
        self, objective: StitchObjective, study: optuna.Study, n_trials: int, *, progress: bool
    ) -> optuna.Study: ...


def run_search(
    objective: StitchObjective,
    study: optuna.Study,
    n_trials: int,
    *,
    progress: bool = False,
    executor: Executor | None = None,
) -> optuna.Study:
    """Run until the study holds ``n_trials`` finished (complete or pruned) trials.

    Args:
        objective: The objective (search space, objectives, budgets) to run.
        study: The study to add trials to; finished trials already in it count.
        n_trials: Total number of finished trials to reach.
        progress: Show a progress bar.
        executor: Where trials run; None runs them one by one in this process, a
            :class:`~stitch_nas.search.RayExecutor` runs them on Ray workers.
    """
    if n_trials < 1:
        raise ConfigError(f"the number of trials must be >= 1, got {n_trials}")
    if attrs.REFERENCES not in study.user_attrs:
        refs = measure_references(objective.ctx)
        study.set_user_attr(attrs.REFERENCES, refs)
    check_budget_reachable(objective)
    if executor is not None:
        return executor.run(objective, study, n_trials, progress=progress)
    from tqdm.auto import tqdm

    done = completed_count(study)
    bar = tqdm(total=n_trials, initial=min(done, n_trials), desc="trials", disable=not progress)
    try:
        while completed_count(study) < n_trials:
            remaining = n_trials - completed_count(study)
            before = len(study.trials)
            callbacks = [_tick(bar), _stop_at(n_trials)]
            study.optimize(objective, n_trials=remaining, callbacks=callbacks)
            if len(study.trials) == before:
                break
            if _only_failures(study, before):  # every trial of a round failed: stop, don't spin
                raise StitchNASError(
                    "every trial failed; see fail_reason in trials.csv for the cause"
                )
    finally:
        bar.close()
    return study


def _only_failures(study: optuna.Study, since: int) -> bool:
    new = study.trials[since:]
    return bool(new) and all(t.state == optuna.trial.TrialState.FAIL for t in new)


def _stop_at(n_trials: int):
    """Stop at the requested total even when other drivers add trials to the study."""

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if completed_count(study) >= n_trials:
            study.stop()

    return callback


def _tick(bar: Any):
    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED):
            bar.update(1)
        if not bar.disable and trial.number % 10 == 0:  # best_trials reads every trial
            # a config sampled twice is two trials with the same values: count it once
            front = {t.user_attrs.get(attrs.DESCRIBE, t.number) for t in study.best_trials}
            bar.set_postfix(pareto=len(front), refresh=False)

    return callback


EXECUTORS = ("local", "ray")


def executor_from_settings(search: SearchSettings) -> RayExecutor | None:
    """The executor that ``search.executor`` names: None runs trials in this process."""
    if search.executor == "local":
        return None
    if search.executor == "ray":
        if search.gpus_per_worker < 0 and search.gpus_per_worker != -1:
            raise ConfigError(
                f"search.gpus_per_worker={search.gpus_per_worker} is invalid; use -1 (auto) or >= 0"
            )
        gpus = None if search.gpus_per_worker == -1 else search.gpus_per_worker
        return RayExecutor(
            workers=search.workers,
            address=search.ray_address,
            cpus_per_worker=search.cpus_per_worker,
            gpus_per_worker=gpus,
        )
    raise ConfigError(f"unknown executor {search.executor!r}; use one of {', '.join(EXECUTORS)}")
