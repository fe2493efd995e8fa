"""stitch_nas: multi-objective search over networks stitched from pretrained fragments.

The public face of the package. Names are imported on first use (PEP 562), so
``import stitch_nas`` and ``stitch-nas --help`` start without loading torch; the code lives in
one subpackage per pipeline stage (see docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from importlib.metadata import version
from typing import TYPE_CHECKING

from .lazy import lazy_face

__version__ = version("stitch-nas")  # pyproject.toml's, the one place it is written

#: public name -> the subpackage that defines it
_HOMES = {
    "AdapterSpec": "config",
    "Fragment": "config",
    "HeadSpec": "config",
    "StitchConfig": "config",
    "StitchNASError": "errors",
    "CutPoint": "fragments",
    "count_macs": "fragments",
    "count_params": "fragments",
    "cut_points": "fragments",
    "segment": "fragments",
    "split": "fragments",
    "cka_matrix": "similarity",
    "linear_cka": "similarity",
    "minibatch_cka": "similarity",
    "StitchContext": "activations",
    "StitchedNet": "stitching",
    "build": "stitching",
    "Measurement": "stitching",
    "make_objective": "search",
    "measure": "stitching",
    "ElasticNet": "export",
    "ExportItem": "export",
    "ExportedNet": "export",
    "export_elastic": "export",
    "export_network": "export",
    "export_study": "export",
    "load": "export",
    "run": "pipeline",
    "load_settings": "settings",
    "Settings": "settings",
}

__all__ = [
    "AdapterSpec",
    "CutPoint",
    "ElasticNet",
    "ExportItem",
    "ExportedNet",
    "Fragment",
    "HeadSpec",
    "Measurement",
    "StitchConfig",
    "StitchContext",
    "Settings",
    "StitchNASError",
    "StitchedNet",
    "__version__",
    "build",
    "cka_matrix",
    "count_macs",
    "count_params",
    "cut_points",
    "export_elastic",
    "export_network",
    "export_study",
    "linear_cka",
    "load",
    "load_settings",
    "make_objective",
    "measure",
    "minibatch_cka",
    "run",
    "segment",
    "split",
]

if TYPE_CHECKING:  # what static checkers and IDEs see; at run time __getattr__ imports lazily
    from .activations import StitchContext
    from .config import AdapterSpec, Fragment, HeadSpec, StitchConfig
    from .errors import StitchNASError
    from .export import (
        ElasticNet,
        ExportedNet,
        ExportItem,
        export_elastic,
        export_network,
        export_study,
        load,
    )
    from .fragments import CutPoint, count_macs, count_params, cut_points, segment, split
    from .pipeline import run
    from .search import make_objective
    from .settings import Settings, load_settings
    from .similarity import cka_matrix, linear_cka, minibatch_cka
    from .stitching import Measurement, StitchedNet, build, measure


__getattr__, __dir__ = lazy_face(__name__, {name: f".{home}" for name, home in _HOMES.items()})
