"""Export: chosen networks written as standalone folders or one elastic package, and
:func:`load`, which rebuilds them without the zoo.
"""

from ._files import (
    checksums,
    load_weights,
    save_weights,
    verify_checksums,
)
from ._load import (
    FORMAT_VERSION,
    ElasticNet,
    ExportedNet,
    assemble,
    joint_recipes,
    load,
)
from ._select import (
    ExportSummary,
    export_items,
    export_study,
    select_trials,
)
from ._traced import (
    FORMATS,
    write_traced,
)
from ._write import (
    ExportItem,
    export_elastic,
    export_network,
    folder_size,
)

__all__ = [
    "ElasticNet",
    "ExportItem",
    "ExportSummary",
    "ExportedNet",
    "FORMATS",
    "FORMAT_VERSION",
    "assemble",
    "checksums",
    "export_elastic",
    "export_network",
    "export_items",
    "export_study",
    "folder_size",
    "joint_recipes",
    "load",
    "load_weights",
    "save_weights",
    "select_trials",
    "verify_checksums",
    "write_traced",
]
