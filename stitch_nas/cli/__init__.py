"""``stitch-nas``: the command line, its YAML settings and the pipeline it runs."""

from ._main import (
    main,
)
from ._pipeline import (
    export_folder,
    load_data,
    load_zoo,
    report_folder,
    run_settings,
)
from ._settings import (
    DataSettings,
    SearchSettings,
    Settings,
    ZooSettings,
    load_settings,
)

__all__ = [
    "DataSettings",
    "SearchSettings",
    "Settings",
    "ZooSettings",
    "export_folder",
    "load_data",
    "load_settings",
    "load_zoo",
    "main",
    "report_folder",
    "run_settings",
]
