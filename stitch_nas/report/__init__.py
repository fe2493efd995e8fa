"""Report: the Pareto front, its re-measurement on the test split, accuracy intervals,
hypervolumes, claims over zoo models, and the CSV / JSON / PNG / HTML files of a search folder.
"""

from ._claims import DOMINATION_RULE, split_hypervolumes, zoo_claims
from ._headroom import Headroom, HeadroomGap, interpolation_headroom
from ._history import HypervolumeHistory, hypervolume_history
from ._holdout import (
    HoldoutPass,
    Rechecked,
    accuracy_on,
    holdout_accuracies,
    holdout_missing,
    holdout_trials,
    measure_holdout,
    rebuild,
    rebuild_checked,
    trial_weights,
)
from ._intervals import accuracy_figures, wilson_interval
from ._kinds import stitched_front, stitched_trials
from ._pareto import (
    dominated_references,
    first_of_each_network,
    front_hypervolume,
    hypervolume,
    hypervolume_box,
    is_feasible,
    objective_names,
    pareto_trials,
    reference_values,
    trial_config,
    trial_metric,
    zoo_references,
)
from ._write import (
    ReportSummary,
    write_report,
)

__all__ = [
    "DOMINATION_RULE",
    "Headroom",
    "HeadroomGap",
    "HoldoutPass",
    "HypervolumeHistory",
    "Rechecked",
    "ReportSummary",
    "accuracy_figures",
    "accuracy_on",
    "dominated_references",
    "first_of_each_network",
    "front_hypervolume",
    "holdout_accuracies",
    "holdout_missing",
    "holdout_trials",
    "hypervolume",
    "hypervolume_box",
    "hypervolume_history",
    "interpolation_headroom",
    "is_feasible",
    "measure_holdout",
    "objective_names",
    "reference_values",
    "pareto_trials",
    "rebuild",
    "rebuild_checked",
    "split_hypervolumes",
    "stitched_front",
    "stitched_trials",
    "trial_config",
    "trial_metric",
    "trial_weights",
    "wilson_interval",
    "write_report",
    "zoo_claims",
    "zoo_references",
]
