"""Similarity of activations: linear CKA in the n x n Gram form, unbiased minibatch CKA, CKA
matrices and StitchNet's chain score.
"""

from ._cka import (
    MinibatchCKA,
    chain_score,
    cka_from_grams,
    cka_matrix,
    gram,
    linear_cka,
    minibatch_cka,
)
from ._rows import LAYOUTS, MODES, common_spatial, to_rows
from ._streamed_gram import gram_of_batches

__all__ = [
    "LAYOUTS",
    "MODES",
    "MinibatchCKA",
    "chain_score",
    "cka_from_grams",
    "cka_matrix",
    "common_spatial",
    "gram",
    "gram_of_batches",
    "linear_cka",
    "minibatch_cka",
    "to_rows",
]
