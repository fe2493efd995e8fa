"""``stitch-nas``: the command line, its YAML settings and the pipeline it runs.

Only :func:`main` is imported here: the parser and the settings check import nothing heavy, so
``stitch-nas --help`` and a bad YAML file answer before torch loads. The pipeline
(``stitch_nas.cli._pipeline``) is imported once a command has work to do.
"""

from ._main import main

__all__ = ["main"]
