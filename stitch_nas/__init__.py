"""stitch_nas: multi-objective search over networks stitched from pretrained fragments.

The public face of the package; everything else lives in one module per concept.
"""

from .build import StitchedNet, build
from .config import AdapterSpec, Fragment, HeadSpec, StitchConfig
from .context import StitchContext
from .costs import count_macs, count_params
from .deploy import ElasticNet, ExportedNet, load
from .errors import StitchNASError
from .export import ExportItem, export_elastic, export_network
from .fragments import CutPoint, cut_points, segment, split
from .measure import Measurement, measure
from .runner import make_objective
from .similarity import cka_matrix, linear_cka, minibatch_cka
from .study_export import export_study

__version__ = "0.1.0"

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
    "StitchNASError",
    "StitchedNet",
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
    "make_objective",
    "measure",
    "minibatch_cka",
    "segment",
    "split",
    "__version__",
]
