"""Fragments: cut points found by torch.fx, the pieces between them, and their MACs and
parameters.
"""

from ._blocks import (
    declare_blocks,
    declared_blocks,
)
from ._costs import (
    count_macs,
    count_macs_by_operator,
    count_macs_reference,
    count_params,
    count_params_of,
)
from ._cuts import (
    CutPoint,
    cut_points,
    get_cut,
    segment,
    split,
)
from ._layouts import LAYOUTS
from ._pieces import (
    PieceChain,
)

__all__ = [
    "CutPoint",
    "LAYOUTS",
    "PieceChain",
    "count_macs",
    "count_macs_by_operator",
    "count_macs_reference",
    "count_params",
    "count_params_of",
    "cut_points",
    "declare_blocks",
    "declared_blocks",
    "get_cut",
    "segment",
    "split",
]
