"""The whole run, from settings to an exported front: ``run(settings, out_dir)`` does what
``stitch-nas search FILE --out DIR`` does (data, zoo, seeding, trials, refining, fine-tuning,
the test pass, the report, the export), ``report_folder`` / ``export_folder`` what
``stitch-nas report`` / ``export`` do with a finished folder, and ``load_data`` / ``load_zoo``
the data and zoo that settings describe; the ``check_*`` functions are the checks of a run
that need no torch (settings, folders, formats, caches) and ``check_plugins`` the one that
imports the plug-ins, which the CLI runs before any slow work.

Names are imported on first use, so the checks load without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stitch_nas.lazy import lazy_face

#: each public name -> the module that defines it (imported on first use)
_HOMES = {
    "run": "._run",
    "report_folder": "._folder",
    "export_folder": "._folder",
    "load_data": "._run",
    "load_zoo": "._run",
    "PhaseClock": "._phases",
    "check_artifacts": "._preflight",
    "check_caches": "._preflight",
    "check_destination": "._preflight",
    "check_folder": "._preflight",
    "check_formats": "._preflight",
    "check_image_sizes": "._preflight",
    "check_plugins": "._preflight",
    "check_run": "._preflight",
    "data_size": "._preflight",
}
__all__ = [  # _HOMES's keys, written out for linters and type checkers
    "PhaseClock",
    "check_artifacts",
    "check_caches",
    "check_destination",
    "check_folder",
    "check_formats",
    "check_image_sizes",
    "check_plugins",
    "check_run",
    "data_size",
    "export_folder",
    "load_data",
    "load_zoo",
    "report_folder",
    "run",
]

if TYPE_CHECKING:
    from ._folder import export_folder, report_folder
    from ._phases import PhaseClock
    from ._preflight import (
        check_artifacts,
        check_caches,
        check_destination,
        check_folder,
        check_formats,
        check_image_sizes,
        check_plugins,
        check_run,
        data_size,
    )
    from ._run import load_data, load_zoo, run

__getattr__, __dir__ = lazy_face(__name__, _HOMES)
