"""Search: measuring a stitched network, the Optuna objective, the study, and the executors
that run trials (local, Ray actors, Ray Tune).
"""

from typing import TYPE_CHECKING, Any

from ._evaluate import TrialOutcome, evaluate_config
from ._loop import (
    EXECUTORS,
    Executor,
    check_budget_reachable,
    executor_from_settings,
    measure_references,
    run_search,
)
from ._ray_executor import RAY_MODES, RAY_NODE, RayExecutor, StudyWorker
from ._ray_shared import (
    SharedActivationCache,
    SharedContext,
    import_ray,
    models_on_cpu,
    share_context,
)
from ._ray_workers import TrialWorker
from ._refine import refine_adapter, refine_adapters, refine_study
from ._runner import (
    StitchObjective,
    make_objective,
)
from ._seeding import seed_study
from ._storage import shown_url
from ._studies import (
    LEGACY_STUDY_NAME,
    SAMPLERS,
    check_study,
    completed_count,
    create_study,
    default_study_name,
    fail_stale_running,
    load_folder_study,
    make_sampler,
    set_metric_names,
)

if TYPE_CHECKING:  # static checkers see them; at run time __getattr__ imports them on first use
    from ._tune import (
        CONFIG_KEY,
        StitchOptunaSearch,
        StitchTuneSpace,
        make_trainable,
        stitch_trainable,
        tune_modes,
    )

# The Ray Tune helpers subclass Ray's OptunaSearch, so their module needs Ray at import time.
# They are loaded on first use (PEP 562): the base install (no `ray` extra) imports this
# package, and a user who reaches for them without Ray gets the one-line MissingDependencyError.
_TUNE_NAMES = frozenset(
    {
        "CONFIG_KEY",
        "StitchOptunaSearch",
        "StitchTuneSpace",
        "make_trainable",
        "stitch_trainable",
        "tune_modes",
    }
)


def __getattr__(name: str) -> Any:
    if name in _TUNE_NAMES:
        from . import _tune

        return getattr(_tune, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CONFIG_KEY",
    "EXECUTORS",
    "Executor",
    "RAY_MODES",
    "RAY_NODE",
    "RayExecutor",
    "LEGACY_STUDY_NAME",
    "SAMPLERS",
    "SharedActivationCache",
    "SharedContext",
    "StitchObjective",
    "StitchOptunaSearch",
    "StitchTuneSpace",
    "TrialOutcome",
    "StudyWorker",
    "TrialWorker",
    "check_budget_reachable",
    "check_study",
    "completed_count",
    "create_study",
    "default_study_name",
    "evaluate_config",
    "executor_from_settings",
    "fail_stale_running",
    "import_ray",
    "load_folder_study",
    "make_objective",
    "make_sampler",
    "refine_adapter",
    "refine_adapters",
    "refine_study",
    "seed_study",
    "set_metric_names",
    "make_trainable",
    "measure_references",
    "models_on_cpu",
    "run_search",
    "share_context",
    "shown_url",
    "stitch_trainable",
    "tune_modes",
]
