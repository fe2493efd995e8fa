"""``stitch-nas``: the command line over :mod:`stitch_nas.settings` and :mod:`stitch_nas.pipeline`.

Only :func:`main` is imported here: the parser and the settings check import nothing heavy, so
``stitch-nas --help`` and a bad YAML file answer before torch loads. The pipeline's run
(``stitch_nas.pipeline.run``) is imported once a command has work to do.
"""

from ._main import main

__all__ = ["main"]
