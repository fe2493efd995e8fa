"""The built-in heads' options, declared without torch.

:mod:`._heads` registers ``knn`` and ``linear_probe`` with these options, and the settings
check reads them from here (through the lazy face of :mod:`stitch_nas.stitching`), so a
misspelt head or head option in a YAML file is answered before torch loads.
"""

from __future__ import annotations

from collections.abc import Mapping

from stitch_nas.registry import Option, integer

__all__ = ["BUILTIN_HEADS"]

#: every built-in head for a new label space: its declared options (``HeadSpec.options``)
BUILTIN_HEADS: dict[str, Mapping[str, Option]] = {
    "knn": {"k": integer(5, 1)},
    "linear_probe": {"max_iter": integer(500, 1)},
}
