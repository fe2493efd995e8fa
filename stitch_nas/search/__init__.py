"""Search: the Optuna objective and its study, seeding and refining, and the executors that
run trials (this process, Ray workers, Ray Tune).

What a user needs: :func:`make_objective` / :class:`StitchObjective` for their own study,
:func:`create_study` and :func:`run_search` for ours, :class:`RayExecutor` for Ray workers and
the Tune helpers (:class:`StitchOptunaSearch`, :class:`StitchTuneSpace`, :func:`make_trainable`,
:func:`tune_modes`). The other names are what the pipeline's stages call.
"""

from typing import TYPE_CHECKING

from stitch_nas.lazy import lazy_face

from ._evaluate import (
    EvaluationOptions,
    Repeat,
    TrialOutcome,
    TrialPlan,
    evaluate_config,
    evaluate_plan,
)
from ._fidelity import Fidelity
from ._loop import check_budget_reachable, cost_floor, run_search
from ._proxy_sampler import ProxySampler, proxy_sampler
from ._ray_executor import RAY_NODE, RayExecutor, StudyWorker
from ._ray_resources import check_ray_address
from ._ray_workers import TrialWorker
from ._refine import refine_adapter, refine_adapters, refine_study
from ._runner import StitchObjective, make_objective
from ._seeding import seed_study
from ._storage import shown_url
from ._studies import (
    LEGACY_STUDY_NAME,
    check_study,
    completed_count,
    create_study,
    load_folder_study,
    set_metric_names,
)

if TYPE_CHECKING:  # static checkers see them; at run time __getattr__ imports them on first use
    from ._tune import (
        CONFIG_KEY,
        StitchOptunaSearch,
        StitchTuneSpace,
        make_trainable,
        tune_modes,
    )

# The Ray Tune helpers subclass Ray's OptunaSearch, so their module needs Ray at import time.
# They are loaded on first use (PEP 562): the base install (no `ray` extra) imports this
# package, and a user who reaches for them without Ray gets the one-line MissingDependencyError.
_TUNE_NAMES = (
    "CONFIG_KEY",
    "StitchOptunaSearch",
    "StitchTuneSpace",
    "make_trainable",
    "tune_modes",
)
__getattr__, __dir__ = lazy_face(__name__, dict.fromkeys(_TUNE_NAMES, "._tune"))


__all__ = [
    "CONFIG_KEY",
    "EvaluationOptions",
    "Fidelity",
    "LEGACY_STUDY_NAME",
    "ProxySampler",
    "RAY_NODE",
    "RayExecutor",
    "Repeat",
    "StitchObjective",
    "StitchOptunaSearch",
    "StitchTuneSpace",
    "StudyWorker",
    "TrialOutcome",
    "TrialPlan",
    "TrialWorker",
    "check_budget_reachable",
    "check_ray_address",
    "check_study",
    "completed_count",
    "cost_floor",
    "create_study",
    "evaluate_config",
    "evaluate_plan",
    "load_folder_study",
    "make_objective",
    "make_trainable",
    "proxy_sampler",
    "refine_adapter",
    "refine_adapters",
    "refine_study",
    "run_search",
    "seed_study",
    "set_metric_names",
    "shown_url",
    "tune_modes",
]
