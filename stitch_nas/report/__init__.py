"""Report: the Pareto front, hypervolume, dominance over zoo models, and the CSV / JSON /
PNG files of a search folder.
"""

from ._pareto import (
    dominated_references,
    front_hypervolume,
    hypervolume,
    pareto_trials,
)
from ._write import (
    ReportSummary,
    write_report,
)

__all__ = [
    "ReportSummary",
    "dominated_references",
    "front_hypervolume",
    "hypervolume",
    "pareto_trials",
    "write_report",
]
