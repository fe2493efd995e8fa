"""Seeding a fresh study with the configs the probe proxy ranks best.

A sampler's first trials are random (TPE's startup trials), and on a real zoo most random
stitches are poor. Before the search, ``pool`` configs (``4 x count`` unless given) are drawn
from the space at random (in a scratch in-memory study, so the user's study sees none of them),
each is scored by its
least-squares probe accuracy (:mod:`stitch_nas.stitching._proxy`, a few hundred images), and
the ``count`` best are enqueued with ``study.enqueue_trial``: Pareto layers of (probe accuracy
up, the search's cost objectives down), best layer first, so the first trials the sampler
learns from already span the front. Candidates over a budget are skipped (up to 3 x as many
draws are made to find enough within it). The enqueued trials are measured like any other.

A space may also propose params of its own (``space.proposals(ctx, accuracy, **options)``, a
list of params dicts; ``pairwise`` proposes each model of the zoo's front with another's stem or
classifier, the front's high-accuracy end, and optionally stitches from a cheaper, less
accurate model into a dearer one at matching depth, the region between strong models). They
are scored beside the random pool, and ``MATCHED_SHARE`` of the seeds (at most) go to the best
of them, the rest to the best of the random pool, so the budget does not follow only the easy
hypervolume at the cheap end of the zoo, nor only the proposals.

Why a pool larger than the default pays on a real zoo: the stitches that add to a zoo's front
(cheap ones that skip a block of a strong model) are a few percent of a pairwise space, so 4
random candidates per seed rarely hold one; scoring costs about a second per candidate, a
fraction of a measured trial, so a pool of several hundred is a cheap way to find them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import optuna

from stitch_nas import attrs
from stitch_nas.config import StitchConfig
from stitch_nas.errors import LayoutError
from stitch_nas.fragments import count_params_of
from stitch_nas.stitching import ProbeScore, keep_probe_score, network_macs, probe_accuracy

from ._loop import Executor, record_references
from ._runner import StitchObjective

__all__ = ["CANDIDATES_PER_SEED", "MATCHED_SHARE", "pareto_order", "seed_study"]

logger = logging.getLogger(__name__)

#: configs drawn and scored per config enqueued
CANDIDATES_PER_SEED = 4
#: the most of the seeds that go to the space's own proposals (the best by probe first)
MATCHED_SHARE = 0.25


def pareto_order(points: list[tuple[float, ...]]) -> list[int]:
    """Indices of ``points`` (every coordinate to minimise) in order of Pareto layer."""
    left, order = list(range(len(points))), []
    while left:
        layer = [
            i
            for i in left
            if not any(
                all(a <= b for a, b in zip(points[j], points[i], strict=True))
                and points[j] != points[i]
                for j in left
            )
        ]
        layer.sort(key=lambda i: points[i])
        order += layer
        left = [i for i in left if i not in layer]
    return order


def seed_study(
    study: optuna.Study,
    objective: StitchObjective,
    count: int,
    *,
    seed: int = 0,
    pool: int | None = None,
    echo: Callable[[str], None] | None = None,
    progress: bool = False,
    executor: Executor | None = None,
) -> int:
    """Enqueue on ``study`` the ``count`` configs the probe ranks best; returns how many.

    ``pool`` is how many distinct random configs are scored to choose them from (default
    ``4 x count``; at least ``count``). Does nothing on a study that already holds trials (a
    resumed or joined search) or with ``count`` 0. ``executor``: where the search's trials
    will run, and so where the zoo's references are measured when the space's proposals need
    them (None: here).
    """
    if count <= 0 or study.trials:
        return 0
    from tqdm.auto import tqdm

    wanted = max(pool or CANDIDATES_PER_SEED * count, count)
    ctx, start = objective.ctx, time.perf_counter()
    scratch = optuna.create_study(
        directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=seed)
    )
    proposals = _proposals(study, objective, executor)
    for params in proposals:  # asked first: scratch trials 0 .. len - 1
        scratch.enqueue_trial(params)
    seen: set[str] = set()
    scored: list[tuple[tuple[float, ...], dict, StitchConfig, ProbeScore]] = []
    proposed: list[int] = []  # indices into scored
    wanted += len(proposals)
    bar = tqdm(total=wanted, desc="seeding", unit="config", disable=not progress)
    for _ in range(wanted * 3):  # repeats are skipped; give up eventually
        if len(scored) >= wanted:
            break
        trial = scratch.ask()
        config = objective.config_of(trial)
        if config is None:  # the space has no network for these params (a budget)
            continue
        key = config.stable_hash()
        if key in seen or not config.is_stitched:
            continue
        seen.add(key)
        try:
            probe = probe_accuracy(ctx, config)
        except LayoutError as exc:  # the trial would be pruned for it too
            logger.info("seeding skips %s: %s", config.describe(), exc)
            continue
        costs = {"macs": network_macs(ctx, probe.net), "params": count_params_of([probe.net])}
        if any(costs[key] > limit for key, limit in objective.budgets.items()):
            continue  # over a budget: it could never join the front
        point = (-probe.accuracy, *(float(costs[n]) for n in objective.names if n in costs))
        if trial.number < len(proposals):
            proposed.append(len(scored))
        scored.append((point, trial.params, config, probe))
        bar.update()
    bar.close()
    share = min(len(proposed), int(count * MATCHED_SHARE))
    first = [proposed[i] for i in pareto_order([scored[i][0] for i in proposed])[:share]]
    rest = [i for i in pareto_order([row[0] for row in scored]) if i not in proposed]
    chosen = [scored[i] for i in (first + rest)[:count]]
    for _, params, config, probe in chosen:
        study.enqueue_trial(params, skip_if_exists=True)
        keep_probe_score(ctx, config, probe)  # its trial reuses it instead of scoring again
    if echo is not None:
        of = f"{len(scored) - len(proposed)} random configs"
        if proposals:
            of += f" and {len(proposed)} the space proposed ({len(first)} seeded first)"
        echo(
            f"seeded {len(chosen)} trials: the best by least-squares probe accuracy of "
            f"{of}, in {time.perf_counter() - start:.1f} s"
        )
    return len(chosen)


def _proposals(
    study: optuna.Study, objective: StitchObjective, executor: Executor | None
) -> list[dict]:
    """The space's own proposals, given the zoo models' validation accuracy (measured for the
    study when the space has proposals, where the search would measure them next)."""
    propose = getattr(objective.space, "proposals", None)
    if propose is None:
        return []
    record_references(study, objective, executor)
    accuracy = {r["name"]: float(r["accuracy"]) for r in study.user_attrs[attrs.REFERENCES]}
    return propose(objective.ctx, accuracy, **objective.space_options)
