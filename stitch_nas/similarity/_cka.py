"""Representation similarity: linear CKA, its unbiased minibatch form, and the chain score.

Linear CKA (Kornblith et al. 2019) uses the n x n Gram form: O(n^2 p) time and O(n^2) memory
however wide the flattened features are (no p x p covariance), accumulated in float64 a block
of features at a time, so no float64 copy of a wide activation is ever made (a ResNet-50
layer-1 map of 128 probe images would be 0.8 GB in float64, and centring it twice that). Cache
Grams per activation with :func:`gram` (or :func:`gram_of_batches`, from an activation read batch
by batch, as the probe's is) and reuse them with :func:`cka_from_grams`;
:func:`cka_matrix` does so for all cut points of two models (ReStNet). :class:`MinibatchCKA` is
the unbiased estimator of Nguyen, Raghu & Kornblith (2020); :func:`chain_score` is StitchNet's.

Zero-variance convention: if an input is constant over the samples its centred Gram is zero and
CKA is 0/0; every function here returns ``0.0`` then, since a constant carries no information.

The row rule that turns an activation into ``(n, d)`` sample rows is in
:mod:`stitch_nas.similarity._rows`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from stitch_nas.errors import DataError, NonFiniteError

__all__ = [
    "MinibatchCKA",
    "chain_score",
    "cka_from_grams",
    "cka_matrix",
    "gram",
    "linear_cka",
    "minibatch_cka",
]


def _rows(x: Any, name: str, min_n: int) -> torch.Tensor:
    """An activation as ``(n, -1)`` rows in its own dtype, with at least ``min_n`` samples."""
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    if t.ndim == 0:
        raise DataError(f"{name} is a scalar; pass an array with the sample axis first")
    n = t.shape[0]
    if n < min_n:
        raise DataError(f"{name} has {n} samples; CKA here needs at least {min_n} samples")
    return t.detach().reshape(n, -1)


def _finite64(t: torch.Tensor, name: str) -> torch.Tensor:
    """``t`` in float64, refused when it holds NaN or Inf."""
    t = t.to(torch.float64)
    if not bool(torch.isfinite(t).all()):
        raise NonFiniteError(f"{name} contains NaN or Inf; fix the activations before CKA")
    return t


def _rows64(x: Any, name: str, min_n: int = 2) -> torch.Tensor:
    """Flattens an activation to float64 ``(n, -1)`` rows and checks it is usable."""
    return _finite64(_rows(x, name, min_n), name)


#: float64 bytes of one block of features in :func:`_centred_gram`: its memory beside the input
_BLOCK_BYTES = 32 * 2**20


def feature_step(n: int, block_bytes: int = _BLOCK_BYTES) -> int:
    """How many features of ``n`` samples make one block of :func:`_centred_gram`."""
    return max(1, block_bytes // (8 * n))


def _centred_gram(x: Any, name: str) -> torch.Tensor:
    """``Xc Xcᵀ`` in float64 for the feature-centred rows of ``x``, one block of features (the
    columns of ``(n, -1)`` rows) at a time (:func:`gram_of_blocks`)."""
    rows = _rows(x, name, 2)
    step = feature_step(rows.shape[0])
    blocks = (rows[:, start : start + step] for start in range(0, rows.shape[1], step))
    return gram_of_blocks(blocks, rows.shape[0], rows.device, name)


def gram_of_blocks(
    blocks: Iterable[torch.Tensor], n: int, device: torch.device, name: str
) -> torch.Tensor:
    """``Xc Xcᵀ`` in float64 from the blocks of features (columns) of ``X``'s ``n`` rows, each
    ``(n, width)``: centring is per feature, so the blocks' products add up to the whole one.
    Constant features are exactly zero, as in :func:`_centre_rows`.

    Blocks in half precision (the activation cache stores float16) are multiplied in float32
    and summed in float64: their values carry three significant digits, and float32 products
    add about 1e-6 of relative error to a Gram entry, where float64 ones took twice the time
    (the product is most of the cost of a wide map's Gram)."""
    k = torch.zeros(n, n, dtype=torch.float64, device=device)
    product: torch.Tensor | None = None
    for block in blocks:
        centred = _centre_rows(_finite64(block.to(device), name))
        if block.dtype not in (torch.float16, torch.bfloat16):
            k.addmm_(centred, centred.T)
            continue
        single = centred.float()
        product = torch.mm(single, single.T, out=product)
        k.add_(product)
    return k


def _n_samples(x: Any) -> int:
    """Length of the sample axis (0 for a scalar, which :func:`_rows64` then rejects)."""
    shape = np.shape(x)
    return int(shape[0]) if len(shape) else 0


def _centre_rows(t: torch.Tensor) -> torch.Tensor:
    """Centres each feature over the samples; constant features become exactly zero."""
    centred = t - t.mean(dim=0, keepdim=True)
    # The float mean of equal values can be off by one ulp, which would leave a ~1e-17 residue
    # and turn the 0/0 of a constant input into a random number instead of the documented 0.0.
    constant = (t == t[:1]).all(dim=0)
    return centred.masked_fill(constant.unsqueeze(0), 0.0)


def gram(x: Any) -> torch.Tensor:
    """Linear-kernel Gram matrix of centred features, to cache per activation.

    Args:
        x: Activation, samples on the first axis (tensor or numpy array); the rest is flattened.

    Returns:
        Float64 ``(n, n)`` ``Xc Xcᵀ`` of the feature-centred rows (equal to ``H X Xᵀ H``).

    Raises:
        NonFiniteError: If ``x`` has NaN or Inf.
        DataError: If ``x`` has fewer than two samples.
    """
    return _centred_gram(x, "x")


def _centre_gram(k: torch.Tensor) -> torch.Tensor:
    """Returns ``H K H``; idempotent, so an already centred Gram comes back unchanged."""
    k = k - k.mean(dim=0, keepdim=True)  # one copy, then in place: n x n float64 adds up
    return k.sub_(k.mean(dim=1, keepdim=True))


def _unit(kc: torch.Tensor, floor: float = 0.0) -> torch.Tensor:
    """Scales a centred Gram (owned by the caller) to unit Frobenius norm, in place."""
    norm = float(torch.linalg.matrix_norm(kc))
    return kc.zero_() if norm <= floor else kc.div_(norm)


def _unit_gram_of(x: Any, name: str) -> torch.Tensor:
    """Unit-norm centred Gram of an activation; exactly zero for constant features."""
    return _unit(_centred_gram(x, name))


def _unit_gram(k: Any, name: str) -> torch.Tensor:
    """Centres a user-supplied Gram and scales it to unit Frobenius norm."""
    shape = tuple(np.shape(k))
    if len(shape) != 2 or shape[0] != shape[1]:
        raise DataError(f"{name} has shape {shape}; a Gram matrix must be n x n")
    k64 = _rows64(k, name)
    # Centring a raw Gram of constant features leaves rounding noise of about n * eps * max|K|;
    # below that floor the centred Gram is treated as exactly zero (the 0.0 convention).
    floor = 16.0 * k64.shape[0] * torch.finfo(torch.float64).eps * float(k64.abs().max())
    return _unit(_centre_gram(k64), floor)


def _clipped_dot(ku: torch.Tensor, lu: torch.Tensor) -> float:
    """Inner product of two unit Grams, clipped to [0, 1] against rounding."""
    return min(1.0, max(0.0, float(torch.dot(ku.reshape(-1), lu.reshape(-1)))))


def cka_from_grams(k: Any, l: Any) -> float:  # noqa: E741 - K and L are the paper's names
    """Linear CKA from two Gram matrices of the same samples.

    Args:
        k: ``(n, n)`` Gram of the first representation, centred (:func:`gram`) or raw; it is
            centred here, which leaves a centred Gram unchanged.
        l: ``(n, n)`` Gram of the second representation, same sample order.

    Returns:
        ``<Kc, Lc>_F / (||Kc||_F ||Lc||_F)``, clipped to ``[0, 1]`` against rounding (Grams are
        positive semi-definite); ``0.0`` if either centred Gram is zero.

    Raises:
        NonFiniteError: If a Gram has NaN or Inf.
        DataError: If a Gram is not square, the sizes differ or n < 2.
    """
    ku, lu = _unit_gram(k, "k"), _unit_gram(l, "l")
    if ku.shape != lu.shape:
        raise DataError(f"k is {ku.shape[0]}² but l {lu.shape[0]}²; compute both on one batch")
    return _clipped_dot(ku, lu)


def linear_cka(x: Any, y: Any) -> float:
    """Linear CKA between two representations of the same n samples.

    Args:
        x: First activation, samples on the first axis (tensor or numpy array).
        y: Second activation of the same samples in the same order; widths may differ.

    Returns:
        CKA in ``[0, 1]``; ``0.0`` when either input is constant over the samples.

    Raises:
        NonFiniteError: Naming ``x`` or ``y`` if it has NaN or Inf.
        DataError: If the sample counts differ or are below two.
    """
    nx, ny = _n_samples(x), _n_samples(y)
    if nx != ny:
        raise DataError(f"x has {nx} samples but y has {ny}; use activations of one batch")
    return _clipped_dot(_unit_gram_of(x, "x"), _unit_gram_of(y, "y"))


def cka_matrix(acts_a: Sequence[Any], acts_b: Sequence[Any]) -> torch.Tensor:
    """Linear CKA between every activation of one model and every activation of another.

    Each Gram is computed and normalised once; each pair then costs one ``n^2`` inner product.

    Args:
        acts_a: Activations of model A, ``(n, d_i)`` rows of the same n samples (:func:`to_rows`).
        acts_b: Activations of model B on the same samples.

    Returns:
        Float64 ``(len(acts_a), len(acts_b))`` tensor with entries in ``[0, 1]``.

    Raises:
        NonFiniteError: Naming the activation that has NaN or Inf.
        DataError: If the activations differ in sample count or have fewer than two.
    """
    named = [(f"acts_a[{i}]", a) for i, a in enumerate(acts_a)]
    named += [(f"acts_b[{j}]", b) for j, b in enumerate(acts_b)]
    if not named:
        return torch.zeros((0, 0), dtype=torch.float64)
    n = _n_samples(named[0][1])
    for name, act in named:
        if _n_samples(act) != n:
            raise DataError(
                f"{name} has {_n_samples(act)} samples, {named[0][0]} {n}; use one batch"
            )
    # Unit-norm centred Grams, one row each, so a single matmul gives every CKA; filling a
    # preallocated buffer keeps the peak at one copy of the Grams (they dominate memory).
    first = _unit_gram_of(named[0][1], named[0][0]).reshape(-1)
    flat = first.new_empty((len(named), first.numel()))  # on the activations' device
    flat[0] = first
    for row, (name, act) in enumerate(named[1:], start=1):
        flat[row] = _unit_gram_of(act, name).reshape(-1)
    return (flat[: len(acts_a)] @ flat[len(acts_a) :].T).clamp_(0.0, 1.0)


def _unbiased_hsic(k: torch.Tensor, l: torch.Tensor) -> float:  # noqa: E741
    """Unbiased HSIC_1 estimator of Song et al. (2012) for two raw ``(n, n)`` Grams, n >= 4."""
    n = k.shape[0]
    kt = k.clone().fill_diagonal_(0.0)
    lt = l.clone().fill_diagonal_(0.0)
    trace = (kt * lt).sum()  # tr(K~ L~) since both are symmetric
    sums = kt.sum() * lt.sum() / ((n - 1) * (n - 2))
    cross = 2.0 / (n - 2) * (kt.sum(dim=0) @ lt.sum(dim=1))  # 1ᵀ K~ L~ 1
    return float((trace + sums - cross) / (n * (n - 3)))


class MinibatchCKA:
    """Unbiased minibatch linear CKA (Nguyen, Raghu & Kornblith 2020).

    Per minibatch the unbiased HSIC_1 of (K, L), (K, K) and (L, L) is added to running sums;
    CKA is ``sum HSIC(K, L) / sqrt(sum HSIC(K, K) * sum HSIC(L, L))``. Unlike full-batch CKA it
    does not drift upward for wide features and holds one minibatch at a time. Being unbiased,
    the estimate may fall slightly outside ``[0, 1]``; it is returned unclipped.
    """

    def __init__(self) -> None:
        self.hsic_kl = self.hsic_kk = self.hsic_ll = 0.0  # running sums over minibatches
        self.batches = 0

    def update(self, x: Any, y: Any) -> None:
        """Adds one minibatch of paired activations.

        Args:
            x: First activation, samples (at least 4) on the first axis.
            y: Second activation of the same samples in the same order.

        Raises:
            NonFiniteError: Naming ``x`` or ``y`` if it has NaN or Inf.
            DataError: If the sample counts differ or are below four.
        """
        rx, ry = _rows64(x, "x", min_n=4), _rows64(y, "y", min_n=4)
        if rx.shape[0] != ry.shape[0]:
            raise DataError(f"x has {rx.shape[0]} samples but y has {ry.shape[0]}; pair batches")
        # The estimator is invariant to shifting features, so centring changes nothing but
        # cancellation error, and makes constant features give exact zeros.
        cx, cy = _centre_rows(rx), _centre_rows(ry)
        k, l = cx @ cx.T, cy @ cy.T  # noqa: E741
        self.hsic_kl += _unbiased_hsic(k, l)
        self.hsic_kk += _unbiased_hsic(k, k)
        self.hsic_ll += _unbiased_hsic(l, l)
        self.batches += 1

    def value(self) -> float:
        """Returns the estimate over all minibatches so far.

        ``0.0`` when a self-similarity sum is not positive (constant features: CKA undefined).

        Raises:
            DataError: If no minibatch was added.
        """
        if self.batches == 0:
            raise DataError("MinibatchCKA has no minibatches; call update(x, y) first")
        if self.hsic_kk <= 0.0 or self.hsic_ll <= 0.0:
            return 0.0
        return self.hsic_kl / math.sqrt(self.hsic_kk * self.hsic_ll)


def minibatch_cka(pairs: Iterable[tuple[Any, Any]]) -> float:
    """Unbiased minibatch linear CKA (:class:`MinibatchCKA`) over ``(x, y)`` minibatches.

    Raises:
        NonFiniteError: If an activation has NaN or Inf.
        DataError: If a pair is mismatched or has < 4 samples, or ``pairs`` is empty.
    """
    acc = MinibatchCKA()
    for x, y in pairs:
        acc.update(x, y)
    return acc.value()


def chain_score(scores: Iterable[float]) -> float:
    """StitchNet score of a chain: the product of the CKA scores of its junctions.

    Args:
        scores: CKA of each junction, each in ``[0, 1]``.

    Returns:
        The product; ``1.0`` for an empty chain (nothing stitched, nothing lost).

    Raises:
        NonFiniteError: If a score is NaN or Inf.
        DataError: If a score is outside ``[0, 1]``.
    """
    out = 1.0
    for i, s in enumerate(scores):
        s = float(s)
        if not math.isfinite(s):
            raise NonFiniteError(f"scores[{i}]={s}; compute CKA on finite activations")
        if not 0.0 <= s <= 1.0:
            raise DataError(f"scores[{i}]={s} is outside [0, 1]; clip minibatch estimates first")
        out *= s
    return out
