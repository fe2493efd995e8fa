"""stitch_nas: multi-objective search over networks stitched from pretrained fragments.

The public face of the package; everything else lives in one module per concept.
"""

from .build import StitchedNet, build
from .config import AdapterSpec, Fragment, HeadSpec, StitchConfig
from .context import StitchContext
from .costs import count_macs, count_params
from .errors import StitchNASError
from .fragments import CutPoint, cut_points, segment, split
from .measure import Measurement, measure
from .runner import make_objective
from .similarity import cka_matrix, linear_cka, minibatch_cka

__version__ = "0.1.0"

__all__ = [
    "AdapterSpec",
    "CutPoint",
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
    "linear_cka",
    "make_objective",
    "measure",
    "minibatch_cka",
    "segment",
    "split",
    "__version__",
]
