"""The spaces this package ships, registered on import (the entry point ``stitch_nas.spaces:
builtin``, which the registry loads the first time a space is looked up or listed)."""

from . import chain as chain  # "chain"
from . import gap as gap  # "gap"
from . import pairwise as pairwise  # "pairwise"
from . import restnet as restnet  # "restnet": ReStNet preset
from . import snnet as snnet  # "snnet": SN-Net preset
from . import stitchnet as stitchnet  # "stitchnet": Alg. 1 preset
from . import traft as traft  # "traft": Traft & Cheney grid
