"""From settings to an exported front: data, zoo, context, study, search, report, export.

This is what ``stitch-nas demo`` and ``stitch-nas search`` run, and what ``stitch_nas.run``
is: a Python user passes a settings file or :class:`~stitch_nas.settings.Settings`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from stitch_nas import attrs
from stitch_nas.activations import ActivationCache, StitchContext, resolve_device
from stitch_nas.data import DataSplits
from stitch_nas.errors import BudgetError, ConfigError, ExportError
from stitch_nas.export import export_study
from stitch_nas.search import (
    StitchObjective,
    check_study,
    completed_count,
    cost_floor,
    create_study,
    proxy_sampler,
    refine_adapters,
    refine_study,
    run_search,
    seed_study,
    shown_url,
)
from stitch_nas.settings import (
    DATA_KINDS,
    DataSettings,
    Settings,
    ZooSettings,
    entry_from_settings,
    load_settings,
)
from stitch_nas.zoo import Zoo

from ._phases import PhaseClock

__all__ = ["load_data", "load_zoo", "run"]

logger = logging.getLogger(__name__)


def load_data(settings: DataSettings) -> DataSplits:
    """The splits ``settings`` describe, loaded by its registered data kind."""

    return DATA_KINDS.get(settings.kind).build(settings)


def load_zoo(settings: ZooSettings, data: DataSplits, *, progress: bool = False) -> Zoo:
    """The embedded mini zoo (when included: :meth:`ZooSettings.includes_mini_zoo`) plus
    every model listed in ``zoo.models``."""
    labels = tuple(data.label_names)  # what models of the user's own answer in by default
    extra = [entry_from_settings(item, labels) for item in settings.models]  # bad items first
    zoo = Zoo()
    if settings.includes_mini_zoo():
        from stitch_nas.zoo import load_mini_zoo

        zoo = load_mini_zoo(data, cache_dir=settings.cache_dir, progress=progress)
    for entry in extra:
        zoo.add(entry)
    if len(zoo) < 1:
        raise ConfigError("the zoo is empty; set zoo.mini_zoo: true or list zoo.models")
    return zoo


def run(
    settings: Settings | str | Path,
    out_dir: str | Path,
    *,
    resume: bool = False,
    join: bool = False,
    progress: bool = True,
    echo: Callable[[str], Any] = logger.info,
):
    """Run the whole search that ``settings`` (a YAML file's path, or its parsed
    :class:`~stitch_nas.settings.Settings`) describes into ``out_dir``, as ``stitch-nas search
    FILE --out DIR`` does: seeding, trials, refining, fine-tuning when on, the test pass, the
    report and the export. ``resume``/``join`` are ``--resume``/``--join``; returns the
    report's summary. Every value is checked before any slow work; a bad one raises
    :class:`~stitch_nas.errors.ConfigError`."""
    from ._executor import executor_from_settings
    from ._lock import claim_out
    from ._preflight import check_plugins, check_run, check_study_in
    from ._resume import check_resumed

    if not isinstance(settings, Settings):  # a file's path: parsed and checked key by key
        settings = load_settings(settings)
    out_dir = Path(out_dir)
    search = settings.search
    check_run(settings, Path(out_dir), resume=resume, join=join)  # names, numbers, --out
    check_plugins(search)  # space, its options, adapters, heads: before data or zoo
    executor = executor_from_settings(search)  # a bad executor fails before any work
    study_options: dict[str, Any] = {
        "resume": resume,
        "storage": search.storage,
        "study_name": search.study_name,
        "join": join,
        "heartbeat_s": search.heartbeat_s,
    }
    device = _check_device(search.device)
    with claim_out(Path(out_dir), shared=join) as claim:  # held until the run ends
        try:  # until the first trial, a failure leaves --out as it was (the rerun just works)
            # again under the lock: another run may have written its study since check_run
            check_study_in(Path(out_dir), resume=resume, join=join, storage=search.storage)
            if search.storage is not None or resume or join:  # check_run saw to a new one
                name = check_study(out_dir, **study_options)  # a taken name fails before work
                if resume or join:  # another search's trials would break the study
                    check_resumed(settings, Path(out_dir), name)
            clock = PhaseClock()
            ctx, objective = _prepare(settings, device, progress, echo)
            clock.mark("zoo and data")
            objective.folder = Path(out_dir)  # where trained adapters are kept
            study = create_study(
                objective,
                out_dir,
                sampler=search.sampler,
                seed=search.seed,
                sampler_options=search.sampler_options,
                trials=search.trials,
                **study_options,
            )
            where = shown_url(search.storage) if search.storage else Path(out_dir) / "study.db"
            echo(f"study {study.study_name!r} in {where}")
            # what `stitch-nas export` rebuilds from; anyone who reads the study may read it,
            # so the storage's password is not kept (report and export take --storage again)
            stored = asdict(settings)
            if search.storage:
                stored["search"]["storage"] = shown_url(search.storage)
            study.set_user_attr(attrs.SETTINGS, stored)
            clock.record_on(study)
        except BaseException:
            if not join:  # other drivers may be writing there
                claim.undo()  # by name: only what this run created
            raise
        return _search(
            settings, Path(out_dir), ctx, objective, study, executor, clock, progress, echo
        )


def _prepare(
    settings: Settings, device: str, progress: bool, echo: Callable[[str], Any]
) -> tuple[StitchContext, StitchObjective]:
    """Data, zoo, context and objective, checked as far as can be before the study exists."""
    from stitch_nas.search import check_budget_reachable

    from ._preflight import check_image_sizes, data_size

    search = settings.search
    data = load_data(replace(settings.data, size=data_size(settings)))  # None: the zoo's
    start = time.perf_counter()
    zoo = load_zoo(settings.zoo, data, progress=progress)
    echo(f"zoo ready in {time.perf_counter() - start:.1f} s: {', '.join(zoo.names())}")
    check_image_sizes(zoo, data, settings.data.upsample)  # no model fed upsampled images
    cache = ActivationCache(
        memory_gb=search.cache_memory_gb,
        spill_dir=search.cache_dir,
        disk_gb=search.cache_disk_gb,
        device_memory_gb=search.cache_device_memory_gb,
        device=device,
    )
    ctx = StitchContext(zoo, data, device=device, cache=cache, autocast=search.autocast)
    if ctx.autocast is not None:  # every accuracy below is measured this way
        echo(f"autocast {ctx.autocast}: passes that train nothing run in {ctx.autocast}")
    objective = StitchObjective(
        ctx,
        space=search.space,
        objectives=search.objectives,
        cka_threshold=search.cka_threshold,
        probe_threshold=search.probe_threshold,
        fidelity=search.fidelity,
        budgets=search.budgets,
        space_options=search.space_options,
        fuse=search.fuse,
        latency=search.latency,
    )
    check_budget_reachable(objective)  # needs the zoo; before the study exists
    if settings.finetune.enabled:
        from stitch_nas.finetune import check_stage

        check_stage(zoo.names(), settings.finetune.recipe, settings.finetune.control)
    from ._preflight import check_first_sample

    check_first_sample(objective)
    return ctx, objective


def _search(
    settings: Settings,
    out_dir: Path,
    ctx: StitchContext,
    objective: StitchObjective,
    study: Any,
    executor: Any,
    clock: PhaseClock,
    progress: bool,
    echo: Callable[[str], Any],
):
    """The trials, the refinements, the test pass, the report and the export, each timed."""
    from stitch_nas.report import measure_holdout, write_report

    search = settings.search
    start, finished = time.perf_counter(), completed_count(study)
    with clock.phase("seeding"):
        seed_study(
            study,
            objective,
            min(search.seed_trials, search.trials),
            seed=search.seed,
            pool=search.seed_pool,
            echo=echo,
            progress=progress,
            executor=executor,
        )
    if search.proxy_candidates > 1:  # the probe in the loop: scored proposals, the best measured
        study.sampler = proxy_sampler(
            objective, study.sampler, search.proxy_candidates, seed=search.seed
        )
    with clock.phase("trials"):
        run_search(objective, study, search.trials, progress=progress, executor=executor)
    with clock.phase("refining"):
        adapters = refine_adapters(search.refine_adapters, "search.refine_adapters")
        refined = refine_study(study, objective, search.refine_trials, adapters, echo=echo)
        if refined:  # the enqueued refinements run first, one trial each
            total = completed_count(study) + refined
            run_search(objective, study, total, progress=progress, executor=executor)
    _check_budgets_met(study, search.budgets, out_dir, cost_floor(objective))
    ran, total = completed_count(study) - finished, completed_count(study)
    if ran == 0:
        echo(f"no trial left to run: the study holds {total} finished of {search.trials}")
    else:  # on --resume / --join the study also holds earlier trials
        held = f" (the study holds {total})" if total != ran else ""
        echo(f"{ran} trials in {time.perf_counter() - start:.1f} s{held}")
    if settings.finetune.enabled:  # the front is chosen; its networks train on the train split
        with clock.phase("fine-tune"):
            stage = _finetune(settings, out_dir, ctx, study, executor, progress, echo)
            echo(stage.describe())
    # the front is chosen on validation: its networks and the zoo's are measured once more on
    # the test split, which no choice used, before anything is reported
    with clock.phase("test pass"):
        echo(measure_holdout(study, ctx, fuse=search.fuse, folder=out_dir).describe())
    with clock.phase("report"):
        summary = write_report(study, out_dir)
    if search.export:
        models = Path(out_dir) / "models"
        if models.exists() and not models.is_dir():  # made while the search ran
            raise ExportError(
                f"{models} is a file; the study and the report are kept: move it away, then "
                f"run `stitch-nas export {out_dir}`"
            )
        # the search itself is done and reported: a network that cannot be exported is
        # named, not a reason to fail the run
        with clock.phase("export"):
            export = export_study(
                study,
                ctx,
                models,
                formats=search.export_formats,
                elastic=True,
                fuse=search.fuse,
                progress=progress,
                skip_failures=True,
                folder=out_dir,
                artifact_store=search.artifacts,
            )
        echo(export.describe())
    echo(clock.describe())
    return summary


def _check_budgets_met(
    study: Any,
    budgets: dict[str, float],
    out_dir: Path,
    floor: dict[str, tuple[float, str]] | None = None,
) -> None:
    """A search none of whose trials meets its budgets ends in one line (exit 2), not with a
    test pass, report and export of nothing. The line says what the trials cost and, from
    ``floor`` (:func:`stitch_nas.search.cost_floor`), what the zoo's networks cost at least:
    it cannot say that no network meets the budget, only that the search found none."""
    from optuna.trial import TrialState

    from stitch_nas.choices import BUDGET_FIGURES
    from stitch_nas.report import is_feasible

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not budgets or not complete or any(is_feasible(t) for t in complete):
        return
    given = ", ".join(f"{k}={v:g}" for k, v in budgets.items())
    figures = {k: BUDGET_FIGURES[k] for k in budgets}  # latency is recorded as latency_ms
    costs = {
        k: [t.user_attrs[a] for t in complete if a in t.user_attrs] for k, a in figures.items()
    }
    cheapest = ", ".join(f"{k}={min(v):.4g}" for k, v in costs.items() if v)
    bound = ", ".join(f"{v:.4g} {k}" for k, (v, _) in (floor or {}).items())
    line = f"none of the {len(complete)} completed trials meets {given}"
    if cheapest:
        line += f" (the cheapest: {cheapest})"
    if bound:
        line += f"; the zoo's networks cost at least {bound}, but few or none are that cheap"
    raise BudgetError(
        f"{line}; the study is kept in {out_dir}: raise the budget (--budget) and search into "
        "another --out"
    )


def _finetune(
    settings: Settings,
    out_dir: Path,
    ctx: StitchContext,
    study: Any,
    executor: Any,
    progress: bool,
    echo: Callable[[str], Any],
):
    """The fine-tune stage (:func:`stitch_nas.finetune.finetune_front`) as settings say: on
    the search's Ray workers, one network each, when it ran on them."""
    from stitch_nas.finetune import finetune_front

    stage = settings.finetune
    return finetune_front(
        study,
        ctx,
        stage.recipe,
        out_dir,
        networks=stage.networks,
        floor=stage.floor,
        budgets=settings.search.budgets,
        control=stage.control,
        fuse=settings.search.fuse,
        progress=progress,
        echo=echo,
        workers=executor,
    )


def _resolve_device(device: str) -> str:
    """``auto`` as CUDA when this machine has it, else the CPU; any other device as given
    (:func:`stitch_nas.activations.resolve_device`)."""
    return str(resolve_device(device))


def _check_device(device: str) -> str:
    """The device to run on (see :func:`_resolve_device`), one this machine has, checked
    before the zoo is built."""
    import torch

    device = _resolve_device(device)  # a name check_settings accepted
    kind, _, index = device.partition(":")
    if kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (index and int(index) >= count):
            raise ConfigError(
                f"device {device!r} is not available here ({count} CUDA device(s)); "
                "use --device cpu or another index"
            )
    elif kind == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device 'mps' is not available here; use --device cpu")
    return device
