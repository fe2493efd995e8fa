"""The work each phase of a finished search cannot avoid, in image-MACs and in seconds.

Used by ``benchmarks/e2e.py``: a phase's wall time divided by its necessary work's time is how
far that phase is from its own limit. Necessary work is counted from the study (what the search
ran, on how many images) and the zoo's per-fragment MACs, as the forward passes that no cache
or reuse could remove:

- **seeding**: every zoo model once over the validation split (the zoo's figures, which
  seeding measures for the matched proposals) and once over the probe images (every cut's
  probe activation), then what is new in each scored config (its fragments after the first)
  over the probe images. The scored pool is replayed from the search's seed (the same scratch
  sampler and space), without scoring anything.
- **trials**: what is new in each trial that ran (its MACs less its first fragment's, which a
  zoo model's pass already computed) over the validation images it was scored on (the gate's
  slice or the whole split), and what is new in each distinct config the trials' probe scored
  over the probe images: the trials after seeding, and every proposal the probe in the loop
  scored to choose them (``attrs.PROXY_PROPOSALS``; the seeded trials were scored in seeding;
  the proposals no trial measured are also reported apart, ``proposals_image_gmacs``); a
  repeat of an earlier trial costs nothing.
- **refining**: each trained joint's steps x batch images through what is new as training
  steps (a forward, and a backward to the adapter), plus its first fragment once per distinct
  prefix over the rows its steps draw, each distinct teacher once over the train split, and
  what is new over the images it was scored on.
- **fine-tune**: not counted (off in the preset); **report**: none.
- **test pass**: every zoo model once over the test split, and what is new in each network the
  pass measured over the test split (its prefix is a zoo model's); the checks against the
  search's record are not counted.
- **export**: each exported network (the front) checked on the fixed sample, what is new in
  it (its prefix is cached within the search's process).

A second of necessary work is timed as plain forwards on the same machine: every zoo model over
``images`` validation images as a frozen pass, as the search runs it (the context's pieces and
memory layout, freed memory reused as ``stitch-nas`` sets up its process) and nothing else. Each
fragment's image-MACs are converted at its own model's rate (:func:`plain_forward_rates`), the
stitches' at the zoo's overall rate: a MAC does not cost the same in every model (e2e.json's
``plain_forward_gmacs_per_s.by_model``: on two cores the MobileNet's depthwise layers run
several times fewer MACs a second than the all-conv CNN), and a search whose networks lean on
one model would otherwise be held to another's speed. (Before, every MAC was
converted at the overall rate; ``ratio_at_overall_rate`` keeps that figure beside the ratio.)
Training steps are timed as plain training steps instead (:func:`training_step_seconds`):
for each distinct refined network, its trained adapter and the frozen network after it, built
afresh, take a few AdamW steps at its batch size on random inputs of the joint's shape, and
their seconds per step times its steps is its necessary time; no data is fetched, nothing is
checked on held-out images, no weights are snapshotted. (Before, a step counted as three
forwards at the forward rate, an assumption the measurement replaces.)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import optuna
import torch
from optuna.trial import FixedTrial, FrozenTrial, TrialState

from stitch_nas import attrs
from stitch_nas.activations import StitchContext
from stitch_nas.adapters import ADAPTERS, create, get_adapter, only_training, resolve_options
from stitch_nas.config import StitchConfig
from stitch_nas.machine import reuse_freed_memory
from stitch_nas.report import pareto_trials
from stitch_nas.search import StitchObjective, load_folder_study
from stitch_nas.search._seeding import CANDIDATES_PER_SEED
from stitch_nas.settings import Settings, settings_from_dict
from stitch_nas.stitching import SAMPLE_IMAGES, fragment_macs

__all__ = ["necessary_work"]

#: the part of the trials' work that scored proposals no trial measured (reported beside it)
PROPOSALS = "proposals"
#: the part of refining's work that is training steps (forward MACs; timed as training steps)
STEPS = "refining steps"


def _context(folder: Path) -> tuple[optuna.Study, StitchContext, Settings]:
    from stitch_nas.pipeline import load_data, load_zoo

    study = load_folder_study(folder)
    settings = settings_from_dict(study.user_attrs[attrs.SETTINGS])
    data = load_data(settings.data)
    return study, StitchContext(load_zoo(settings.zoo, data), data, device="cpu"), settings


#: the stitches' part of a network's new MACs, converted at the zoo's overall rate
STITCHES = "stitches"


class Tally:
    """Image-MACs of plain forwards and their seconds, each model's MACs at its own rate
    (``rates``: image-MACs per second by model name, and :data:`STITCHES`)."""

    def __init__(self, rates: dict[str, float]) -> None:
        self.rates, self.macs, self.seconds = rates, 0.0, 0.0

    def add(self, parts: Iterable[tuple[str, float]], images: int) -> None:
        """``parts``, ``(model, MACs per image)`` pairs, over ``images`` images."""
        for model, macs in parts:
            self.macs += macs * images
            self.seconds += macs * images / self.rates[model]


def _new_parts(
    ctx: StitchContext, config: StitchConfig, macs: float | None = None
) -> list[tuple[str, float]]:
    """MACs per image of ``config`` beyond its first fragment, by model: its later fragments,
    and with its recorded MACs the rest of them, its stitches (without: left out, a lower
    bound)."""
    first = config.fragments[0]
    parts = [
        (f.model, float(fragment_macs(ctx, f.model, f.start, f.end))) for f in config.fragments[1:]
    ]
    if macs is not None:
        prefix = fragment_macs(ctx, first.model, first.start, first.end)
        stitches = float(macs) - prefix - sum(m for _, m in parts)
        parts.append((STITCHES, max(stitches, 0.0)))
    return parts


def _config(trial: FrozenTrial) -> StitchConfig | None:
    raw = trial.user_attrs.get(attrs.CONFIG)
    return StitchConfig.from_dict(raw) if isinstance(raw, dict) else None


def _scored_images(trial: FrozenTrial, n_val: int) -> int:
    """Validation images a trial's accuracy pass ran on: the gate's slice, or the split."""
    if trial.state == TrialState.COMPLETE:
        return n_val
    return int(trial.user_attrs.get(attrs.SLICE_IMAGES) or 0)


def _pool(study: optuna.Study, ctx: StitchContext, settings: Settings) -> list[StitchConfig]:
    """The configs seeding scored: its scratch sampler and space replayed, nothing measured
    (a config the probe refused for its layout is counted too: a lower bound's error of a
    handful)."""
    search = settings.search
    objective = _objective(ctx, settings)
    refs = study.user_attrs.get(attrs.REFERENCES) or []
    accuracy = {str(r["name"]): float(r["accuracy"]) for r in refs}
    propose = getattr(objective.space, "proposals", None)
    proposals = [] if propose is None else propose(ctx, accuracy, **objective.space_options)
    scratch = optuna.create_study(
        directions=objective.directions,
        sampler=optuna.samplers.RandomSampler(seed=search.seed),
    )
    for params in proposals:
        scratch.enqueue_trial(params)
    pool = search.seed_pool or CANDIDATES_PER_SEED * search.seed_trials  # as seeding reads it
    wanted = max(pool, search.seed_trials) + len(proposals)
    seen: set[str] = set()
    configs: list[StitchConfig] = []
    for _ in range(wanted * 3):
        if len(configs) >= wanted:
            break
        config = objective.config_of(scratch.ask())  # seeding skips what the space prunes
        if config is None:
            continue
        key = config.stable_hash()
        if key not in seen and config.is_stitched:
            seen.add(key)
            configs.append(config)
    return configs


def _objective(ctx: StitchContext, settings: Settings) -> StitchObjective:
    """The search's objective, for its space (nothing is measured through it)."""
    search = settings.search
    return StitchObjective(
        ctx, space=search.space, objectives=search.objectives, space_options=search.space_options
    )


def _trained(trial: FrozenTrial) -> tuple[int, int, str] | None:
    """Steps, batch size and loss of a refining trial's first trained adapter (None: none),
    with the adapter kind's own defaults for what its config leaves out."""
    config = _config(trial)
    if config is None:
        return None
    for adapter in config.adapters:
        if _trains(adapter.kind, adapter.options):
            options = resolve_options(adapter.kind, dict(adapter.options))
            return int(options["steps"]), int(options["batch_size"]), str(options["loss"])
    return None


def _work(
    study: optuna.Study, ctx: StitchContext, settings: Settings, rates: dict[str, float]
) -> tuple[dict[str, Tally], list[tuple[StitchConfig, int, int]]]:
    """Each phase's necessary work as a :class:`Tally` at ``rates`` (see the module's
    docstring), and each refinement's config, steps and batch size (its training steps are
    timed apart; their forward MACs are tallied as :data:`STEPS`, not converted)."""
    n = {split: len(ctx.labels(split)) for split in ("probe", "val", "test", "train")}
    zoo = {name: float(fragment_macs(ctx, name, None, None)) for name in ctx.zoo.names()}
    phases = ("seeding", "trials", PROPOSALS, "refining", STEPS, "test pass", "export")
    work = {name: Tally(rates) for name in phases}
    trials = study.get_trials(deepcopy=False)
    ran = [t for t in trials if attrs.DUPLICATE_OF not in t.user_attrs and _config(t)]
    seeded = settings.search.seed_trials
    work["seeding"].add(zoo.items(), n["val"] + n["probe"])
    for pooled in _pool(study, ctx, settings):
        work["seeding"].add(_new_parts(ctx, pooled), n["probe"])
    searched = [
        t for t in ran if attrs.REFINES not in t.user_attrs and attrs.FINETUNES not in t.user_attrs
    ]
    with_configs = [(t, c) for t, c in ((t, _config(t)) for t in searched) if c is not None]
    for t, c in with_configs:
        work["trials"].add(
            _new_parts(ctx, c, t.user_attrs.get("macs")), _scored_images(t, n["val"])
        )
    probed = {  # config hash -> what is new in it, for each distinct config the probe scored
        c.stable_hash(): _new_parts(ctx, c, t.user_attrs.get("macs"))
        for t, c in with_configs
        if t.number >= seeded and c.is_stitched
    }
    own = set(probed)  # the trials' own probes
    objective = _objective(ctx, settings)
    for t in searched:  # the proposals the probe in the loop scored (the chosen one among them)
        for params in t.user_attrs.get(attrs.PROXY_PROPOSALS) or []:
            proposed = objective.config_of(FixedTrial(params))  # type: ignore[arg-type]
            if proposed is None:  # no network for these params: nothing was scored
                continue
            if proposed.is_stitched and proposed.stable_hash() not in probed:
                probed[proposed.stable_hash()] = _new_parts(ctx, proposed)
    for key, parts in probed.items():
        work["trials"].add(parts, n["probe"])
        if key not in own:
            work[PROPOSALS].add(parts, n["probe"])
    prefixes, teachers = set(), set()
    trained: list[tuple[StitchConfig, int, int]] = []
    for t in (t for t in ran if attrs.REFINES in t.user_attrs):
        config, how = _config(t), _trained(t)
        if config is None or how is None:
            continue
        steps, batch, loss = how
        trained.append((config, steps, batch))
        new = _new_parts(ctx, config, t.user_attrs.get("macs"))
        work[STEPS].add(new, steps * batch)
        work["refining"].add(new, _scored_images(t, n["val"]))
        first = config.fragments[0]
        if (first.model, first.end) not in prefixes:
            prefixes.add((first.model, first.end))
            rows = min(n["train"], steps * batch)
            prefix = float(fragment_macs(ctx, first.model, None, first.end))
            work["refining"].add([(first.model, prefix)], rows)
        if loss == "distill" and config.fragments[-1].model not in teachers:
            teachers.add(config.fragments[-1].model)
            teacher = config.fragments[-1].model
            work["refining"].add([(teacher, zoo[teacher])], n["train"])
    tests = {int(k) for k in (study.user_attrs.get(attrs.TEST_RESULTS) or {})}
    work["test pass"].add(zoo.items(), n["test"])
    for t in trials:
        if t.number in tests and (tested := _config(t)) is not None:
            work["test pass"].add(_new_parts(ctx, tested, t.user_attrs.get("macs")), n["test"])
    for t in pareto_trials(study):
        if (exported := _config(t)) is not None:
            work["export"].add(_new_parts(ctx, exported, t.user_attrs.get("macs")), SAMPLE_IMAGES)
    return work, trained


def plain_forward_rates(
    ctx: StitchContext, images: int = 1024, repeats: int = 3
) -> tuple[list[float], dict[str, list[float]]]:
    """Image-MACs per second of plain forwards, once per repeat: every zoo model over
    ``images`` validation images as a frozen pass of the context, overall and by model."""
    names = ctx.zoo.names()
    batches = {name: list(_first(ctx.input_batches(name, "val"), images)) for name in names}
    overall: list[float] = []
    by_model: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(repeats):
        seconds = macs = 0.0
        for name, inputs in batches.items():
            model = ctx.segment(name, None, None)  # as the search runs it (layout, pieces)
            start = time.perf_counter()
            with ctx.frozen():  # as every pass that trains nothing runs
                for x in inputs:
                    model(x)
            spent = time.perf_counter() - start
            done = fragment_macs(ctx, name, None, None) * sum(len(x) for x in inputs)
            by_model[name].append(done / spent)
            seconds, macs = seconds + spent, macs + done
        overall.append(macs / seconds)
    return overall, by_model


def training_step_seconds(
    ctx: StitchContext, refined: list[tuple[StitchConfig, int, int]], timed: int = 3
) -> float:
    """Seconds of the refinements' training steps as plain training steps: for each distinct
    ``(config, steps, batch)``, its first trained adapter (created, untrained) and what follows
    it (the next fragment, frozen; with ``train`` other than ``adapter`` trained too), one
    untimed step and ``timed`` timed AdamW steps of ``batch`` random inputs on cross-entropy;
    ``steps`` x the median step."""
    total, seen = 0.0, set()
    for config, steps, batch in refined:
        if config.stable_hash() in seen:
            continue
        seen.add(config.stable_hash())
        joint = next(i for i, a in enumerate(config.adapters) if _trains(a.kind, a.options))
        spec, src, dst = (
            config.adapters[joint],
            config.fragments[joint],
            config.fragments[joint + 1],
        )
        src_cut = next(c for c in ctx.cuts(src.model) if c.name == src.end)
        dst_cut = next(c for c in ctx.cuts(dst.model) if c.name == dst.start)
        adapter = create(spec.kind, src_cut, dst_cut, **dict(spec.options)).to(ctx.device)
        model = torch.nn.Sequential(adapter, ctx.segment(dst.model, dst.start, dst.end)).eval()
        adapter.train()
        options = resolve_options(spec.kind, dict(spec.options))
        params = list((adapter if options["train"] == "adapter" else model).parameters())
        x = torch.randn(batch, *src_cut.shape, device=ctx.device)
        y = torch.zeros(batch, dtype=torch.long, device=ctx.device)
        optimiser = torch.optim.AdamW(params)
        seconds = []
        with only_training(model, params), torch.enable_grad():
            for _ in range(timed + 1):
                start = time.perf_counter()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
                seconds.append(time.perf_counter() - start)
        total += steps * statistics.median(seconds[1:])
    return total


def _trains(kind: str, options: Any) -> bool:
    """Whether an adapter of ``kind`` with ``options`` trains (a loss other than none)."""
    if kind not in ADAPTERS or "loss" not in get_adapter(kind).options:
        return False
    return resolve_options(kind, dict(options))["loss"] != "none"


def _first(batches: Iterable[torch.Tensor], images: int) -> Iterable[torch.Tensor]:
    taken = 0
    for batch in batches:
        if taken >= images:
            return
        yield batch[: images - taken]
        taken += len(batch)


def necessary_work(folder: Path, phases: dict[str, Any], wall: float) -> dict[str, Any]:
    """Per phase of the search in ``folder``: its necessary work (image-MACs), that work's
    seconds as plain forwards on this machine (each model's at its own rate), and the phase's
    median seconds (``phases``, as e2e.json keeps them) over it; and over the seconds the same
    MACs take at the zoo's overall rate (``ratio_at_overall_rate``, the yardstick before);
    ``end_to_end``: the search's median ``wall`` seconds over all phases' necessary seconds
    (loading the zoo and writing the report count as none)."""
    # the forwards run as the search's process runs them: freed blocks reused, as its command
    # line sets up (the setting holds for this process from here on)
    reuse_freed_memory()
    study, ctx, settings = _context(folder)
    overall, by_model = plain_forward_rates(ctx)
    rate = statistics.median(overall)
    rates = {name: statistics.median(r) for name, r in by_model.items()} | {STITCHES: rate}
    work, trained = _work(study, ctx, settings, rates)
    steps_seconds = training_step_seconds(ctx, trained)
    out: dict[str, Any] = {
        "plain_forward_gmacs_per_s": {
            "median": round(rate / 1e9, 2),
            "min": round(min(overall) / 1e9, 2),
            "max": round(max(overall) / 1e9, 2),
            "by_model": {name: round(r / 1e9, 2) for name, r in rates.items() if name != STITCHES},
        },
        "phases": {},
    }
    totals = [0.0, 0.0]  # necessary seconds of every phase, at the models' rates and overall
    for name, row in phases.items():
        if name not in work:
            continue
        seconds, macs = work[name].seconds, work[name].macs
        at_overall = macs / rate
        if name == "refining":  # and its training steps, timed as plain training steps
            seconds, macs = seconds + steps_seconds, macs + work[STEPS].macs
            at_overall += steps_seconds
        spent = float(row["seconds"]["median"])
        out["phases"][name] = {
            "image_gmacs": round(macs / 1e9, 1),
            "seconds": round(seconds, 1),
            "ratio": round(spent / seconds, 2) if seconds else None,
            "ratio_at_overall_rate": round(spent / at_overall, 2) if at_overall else None,
        }
        if name == "trials":  # of which the probe in the loop's proposals no trial measured
            out["phases"][name]["proposals_image_gmacs"] = round(work[PROPOSALS].macs / 1e9, 1)
        if name == "refining":  # of which training steps (forward MACs, and their seconds)
            out["phases"][name]["training_steps_image_gmacs"] = round(work[STEPS].macs / 1e9, 1)
            out["phases"][name]["training_steps_seconds"] = round(steps_seconds, 1)
        totals = [a + b for a, b in zip(totals, (seconds, at_overall), strict=True)]
    out["end_to_end"] = {
        "seconds": round(totals[0], 1),
        "ratio": round(wall / totals[0], 2),
        "ratio_at_overall_rate": round(wall / totals[1], 2),
    }
    return out
