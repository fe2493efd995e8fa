"""The built-in adapter kinds, registered on import (the entry point ``stitch_nas.adapters:
builtin``, which the registry loads the first time a kind is looked up or listed)."""

from . import _bodies as _bodies  # the trained kinds of Traft & Cheney
from . import _closed_form as _closed_form  # "lstsq"
from . import _lowrank as _lowrank  # "lowrank"
