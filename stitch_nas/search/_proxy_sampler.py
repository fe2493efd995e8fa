"""A sampler that measures, of several proposals, the one the cheap proxy says adds most.

Stitches are cheap to score with the least-squares probe (one fit and one pass over a few
hundred images) and dear to measure (the whole validation split). Each trial, the base
sampler proposes ``candidates`` configs, in a scratch study that holds the real study's
finished trials (so it proposes as it would for the real one, and reads the budgets'
constraints from them); ``score`` gives each its proxy values (probe accuracy and costs, in
the study's objective order), and the trial takes the params of the candidate whose proxy
point adds most hypervolume to the front of the finished trials' own proxy points
(``recorded``). The probe ranks configs well but its accuracy is not the validation accuracy
(it is fitted on the probe), so candidates are compared with trials in the proxy's space,
never with measured values. When no candidate adds to that front, the trial takes the base
sampler's first proposal that no trial has tried: the search then explores as the base sampler
would. A proposal that repeats a trial's params is never chosen while another is new; when
every proposal repeats one (TPE converges on a small space, and would propose the same few
configs for thousands of asks), the candidates are drawn at random instead, and the proxy
ranks those.

Optuna's ``BaseSampler`` API is used as it is meant: no relative search space, every
parameter answered in :meth:`sample_independent` from the chosen candidate, and the base
sampler's own answer for any parameter the candidate did not sample. Enqueued trials (the
probe-seeded first trials) keep their fixed params and cost no proposals.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from stitch_nas import attrs
from stitch_nas.choices import check_at_least
from stitch_nas.config import StitchConfig
from stitch_nas.errors import LayoutError
from stitch_nas.fragments import count_params_of
from stitch_nas.report import hypervolume
from stitch_nas.stitching import (
    forget_probe_score,
    keep_probe_score,
    network_macs,
    probe_accuracy,
)

from ._runner import StitchObjective

__all__ = ["ProxySampler", "proxy_sampler"]

#: a candidate's proxy values (the study's objective order), or None: skip it
ProxyScore = Callable[[optuna.Trial], Sequence[float] | None]


class ProxySampler(BaseSampler):
    """``base``'s proposals, ``candidates`` a trial, the best by ``score`` measured.

    Args:
        base: The sampler that proposes (TPE, NSGA-II, ...); it also answers any parameter
            the chosen candidate did not sample.
        score: Samples a candidate's params on the trial it is given (as the objective's
            space does) and returns its proxy values in the study's objective order, or None
            for a candidate the search would prune or that breaks a budget.
        recorded: A finished trial's proxy values, or None where it has none (by default the
            values ``score`` gave the trials this sampler proposed).
        candidates: Proposals scored per trial (1: the base sampler alone).
        seed: Seeds the random proposals scored instead of the base sampler's when all of
            its proposals repeat trials.
    """

    def __init__(
        self,
        base: BaseSampler,
        score: ProxyScore,
        *,
        recorded: Callable[[FrozenTrial], Sequence[float] | None] | None = None,
        candidates: int = 8,
        seed: int | None = None,
    ) -> None:
        self.base = base
        self.seed = seed
        self._explore = optuna.samplers.RandomSampler(seed=seed)  # when the base only repeats
        self.candidates = check_at_least(candidates, "proxy_candidates", 1)
        self._score = score
        self._recorded = recorded
        self._chosen: dict[int, dict[str, Any]] = {}  # trial number -> the params it takes
        self._proxy: dict[int, tuple[float, ...]] = {}  # trial number -> its proxy values
        self.scored = 0  # proposals scored so far (a bound on the probe scores they cost)
        self._scratch: optuna.Study | None = None  # where the base sampler proposes
        self._scratch_of = ""  # the name of the study it mirrors
        self._mirrored: set[int] = set()  # numbers of the trials it holds

    def reseed_rng(self) -> None:
        self.base.reseed_rng()
        self._explore.reseed_rng()

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if "fixed_params" in trial.system_attrs or self.candidates == 1:
            return  # an enqueued trial keeps its params; one candidate is the base alone
        trials = study.get_trials(deepcopy=False)  # read once: a storage may be remote
        scratch = self._mirror(study, trials)
        # a proposal that repeats a trial adds nothing and would not count: never chosen
        # while another is new (a sampler that has converged proposes repeats often)
        tried = {_key(t.params) for t in trials if t.params}
        proposals = self._propose(scratch, tried)
        scored = [params for params, *_ in proposals]  # every proposal scored for this trial
        new = [i for i, (params, *_) in enumerate(proposals) if _key(params) not in tried]
        if not new:  # the base sampler only repeats (it has converged): random ones instead
            scratch.sampler = self._explore
            try:
                proposals = self._propose(scratch, tried)
            finally:
                scratch.sampler = self.base
            scored += [params for params, *_ in proposals]
            new = [i for i, (params, *_) in enumerate(proposals) if _key(params) not in tried]
        front = [p for p in map(self._values_of, trials) if p]
        best, gain = (new or [0])[0], 0.0  # by default the base sampler's first new proposal
        points = [v for _, v, _ in proposals if v is not None]
        if points:
            ref = _reference(front + points, study.directions)
            base_hv = hypervolume(front, study.directions, ref) if front else 0.0
            for i, (_, values, _) in enumerate(proposals):
                if values is not None:
                    added = hypervolume([*front, values], study.directions, ref) - base_hv
                    if added > gain:
                        best, gain = i, added
        params, values, bookkeeping = proposals[best]
        self._chosen[trial.number] = params
        study._storage.set_trial_user_attr(trial._trial_id, attrs.PROXY_PROPOSALS, scored)
        # the base sampler's own marks on the candidate (NSGA-II's generation) go with it, so
        # the trial counts in the base's bookkeeping once mirrored (without them NSGA-II saw no
        # generation complete and proposed its first, random, one for ever); Optuna's own
        # samplers write them through the storage the same way
        for name, value in bookkeeping.items():
            study._storage.set_trial_system_attr(trial._trial_id, name, value)
        if values is not None:
            self._proxy[trial.number] = values

    def _propose(
        self, scratch: optuna.Study, tried: set[frozenset]
    ) -> list[tuple[dict[str, Any], tuple[float, ...] | None, dict[str, Any]]]:
        """``candidates`` proposals of ``scratch``'s sampler, each with its proxy values (None:
        skipped, or it repeats a trial) and the system attributes the sampler gave it."""
        proposals: list[tuple[dict[str, Any], tuple[float, ...] | None, dict[str, Any]]] = []
        asked = []
        for _ in range(self.candidates):
            candidate = scratch.ask()  # left running: TPE's constant liar spreads the next
            asked.append(candidate)
            values = self._score(candidate)
            self.scored += 1
            if _key(candidate.params) in tried:
                values = None
            marks = scratch._storage.get_trial_system_attrs(candidate._trial_id)
            proposals.append(
                (candidate.params, None if values is None else tuple(values), dict(marks))
            )
        for candidate in asked:  # then failed, so later batches see only measured trials
            scratch.tell(candidate, state=TrialState.FAIL)
        return proposals

    def _mirror(self, study: optuna.Study, trials: list[FrozenTrial]) -> optuna.Study:
        """The scratch study the base sampler proposes in, holding ``study``'s complete trials.

        Kept from trial to trial, each finished trial added once: built anew every trial, it
        copied every finished trial again, so the sampler's own cost grew with the square of
        the trials."""
        if self._scratch is None or self._scratch_of != study.study_name:
            self._scratch = optuna.create_study(directions=study.directions, sampler=self.base)
            self._scratch_of, self._mirrored = study.study_name, set()
        new = [
            t for t in trials if t.state == TrialState.COMPLETE and t.number not in self._mirrored
        ]
        self._scratch.add_trials(new)
        self._mirrored.update(t.number for t in new)
        return self._scratch

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        chosen = self._chosen.get(trial.number, {})
        if param_name in chosen:
            value = chosen[param_name]
            if _fits(param_distribution, value):
                return value
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._chosen.pop(trial.number, None)
        self.base.after_trial(study, trial, state, values)

    def _values_of(self, trial: FrozenTrial) -> tuple[float, ...] | None:
        """A complete trial's proxy values, if it has them."""
        if trial.state != TrialState.COMPLETE:
            return None
        if self._recorded is not None:
            values = self._recorded(trial)
            return None if values is None else tuple(values)
        return self._proxy.get(trial.number)


def _key(params: dict[str, Any]) -> frozenset:
    return frozenset((name, repr(value)) for name, value in params.items())


def _fits(distribution: BaseDistribution, value: Any) -> bool:
    """Whether ``value`` is one ``distribution`` can give (a candidate's space may differ from
    the trial's where the space depends on what was sampled before)."""
    if isinstance(distribution, CategoricalDistribution):
        return value in distribution.choices
    low, high = getattr(distribution, "low", None), getattr(distribution, "high", None)
    return low is not None and high is not None and low <= value <= high


def _reference(points: list[tuple[float, ...]], directions: Sequence[Any]) -> list[float]:
    """A reference point just worse than every point on every objective."""
    ref = []
    for i, direction in enumerate(directions):
        column = [p[i] for p in points]
        low, high = min(column), max(column)
        pad = 0.1 * (high - low) or 1.0
        ref.append(low - pad if direction == optuna.study.StudyDirection.MAXIMIZE else high + pad)
    return ref


def proxy_sampler(
    objective: StitchObjective, base: BaseSampler, candidates: int, seed: int | None = None
) -> ProxySampler:
    """``base`` with ``objective``'s least-squares probe in the loop (``search.proxy_candidates``).

    A candidate's proxy values: its probe accuracy for ``accuracy``, its MACs and parameters as
    measured; none (skipped) for a zoo model on its own, a config the probe threshold would
    prune, one over a budget, or when an objective has no proxy (latency: the base sampler
    then proposes alone). The probe scores of the last ``candidates`` proposals are kept, so
    the chosen one's trial does not score it again; every config's proxy values are kept (a
    few numbers each), so a config proposed again is not scored again.
    """
    ctx = objective.ctx
    proxies = {"accuracy", "macs", "params"}
    kept: deque[StitchConfig] = deque()
    values: dict[str, tuple[float, ...] | None] = {}  # config hash -> its proxy values

    def score(trial: optuna.Trial) -> tuple[float, ...] | None:
        if not proxies.issuperset(objective.names):
            return None
        config = objective.config_of(trial)
        if config is None:  # the space has no network for these params (a budget)
            return None
        key = config.stable_hash()
        if key not in values:
            values[key] = measure(config)
        return values[key]

    def measure(config: StitchConfig) -> tuple[float, ...] | None:
        if not config.is_stitched:
            return None
        try:
            probe = probe_accuracy(ctx, config)
        except LayoutError:  # its trial would be pruned for it
            return None
        if probe.accuracy < objective.probe_threshold / ctx.num_classes:
            return None
        costs = {"macs": network_macs(ctx, probe.net), "params": count_params_of([probe.net])}
        if any(costs[key] > limit for key, limit in objective.budgets.items()):
            return None
        keep_probe_score(ctx, config, probe)
        kept.append(config)
        while len(kept) > candidates:
            forget_probe_score(ctx, kept.popleft())
        return tuple(
            probe.accuracy if n == "accuracy" else float(costs[n]) for n in objective.names
        )

    def recorded(trial: FrozenTrial) -> tuple[float, ...] | None:
        probe = trial.user_attrs.get(attrs.PROBE_ACCURACY)
        if probe is None or trial.values is None:
            return None
        return tuple(
            float(probe) if n == "accuracy" else float(v)
            for n, v in zip(objective.names, trial.values, strict=True)
        )

    return ProxySampler(base, score, recorded=recorded, candidates=candidates, seed=seed)
