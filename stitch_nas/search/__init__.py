"""Search: measuring a stitched network, the Optuna objective, the study, and the executors
that run trials (local, Ray actors, Ray Tune).
"""

from ._ray_executor import (
    TEST_HOOKS_ENV,
    RayExecutor,
    TrialWorker,
    executor_from_settings,
)
from ._ray_shared import (
    SharedActivationCache,
    SharedContext,
    import_ray,
    share_context,
)
from ._runner import (
    Executor,
    StitchObjective,
    TrialOutcome,
    evaluate_config,
    make_objective,
    measure_references,
    run_search,
)
from ._studies import (
    SAMPLERS,
    STUDY_NAME,
    completed_count,
    create_study,
    fail_stale_running,
    load_folder_study,
    make_sampler,
)
from ._tune import (
    CONFIG_KEY,
    StitchOptunaSearch,
    StitchTuneSpace,
    make_trainable,
    stitch_trainable,
    tune_modes,
)

__all__ = [
    "CONFIG_KEY",
    "Executor",
    "RayExecutor",
    "SAMPLERS",
    "STUDY_NAME",
    "SharedActivationCache",
    "SharedContext",
    "StitchObjective",
    "StitchOptunaSearch",
    "StitchTuneSpace",
    "TEST_HOOKS_ENV",
    "TrialOutcome",
    "TrialWorker",
    "completed_count",
    "create_study",
    "evaluate_config",
    "executor_from_settings",
    "fail_stale_running",
    "import_ray",
    "load_folder_study",
    "make_objective",
    "make_sampler",
    "make_trainable",
    "measure_references",
    "run_search",
    "share_context",
    "stitch_trainable",
    "tune_modes",
]
