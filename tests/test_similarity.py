"""Tests of stitch_nas.similarity against a plain feature-space reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from stitch_nas.errors import ConfigError, DataError, NonFiniteError, StitchNASError
from stitch_nas.similarity._cka import (
    MinibatchCKA,
    chain_score,
    cka_from_grams,
    cka_matrix,
    gram,
    linear_cka,
    minibatch_cka,
)
from stitch_nas.similarity._rows import common_spatial, to_rows
from stitch_nas.similarity._streamed_gram import gram_of_batches


def reference_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Feature-space linear CKA: ||YᵀX||_F² / (||XᵀX||_F ||YᵀY||_F) on centred features."""
    x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    y = np.asarray(y, dtype=np.float64).reshape(len(y), -1)
    x = x - x.mean(axis=0)
    y = y - y.mean(axis=0)
    num = np.linalg.norm(y.T @ x) ** 2
    return float(num / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.mark.parametrize(("n", "px", "py"), [(50, 10, 7), (20, 300, 500), (8, 2000, 3)])
def test_matches_reference(rng: np.random.Generator, n: int, px: int, py: int) -> None:
    x = rng.normal(size=(n, px))
    y = x[:, :1] @ rng.normal(size=(1, py)) + rng.normal(size=(n, py))
    expected = reference_cka(x, y)
    got = linear_cka(torch.from_numpy(x), torch.from_numpy(y))
    assert got == pytest.approx(expected, abs=1e-10)
    assert linear_cka(x, y) == pytest.approx(expected, abs=1e-10)  # numpy arrays too


def test_float32_and_multidim_inputs(rng: np.random.Generator) -> None:
    x = rng.normal(size=(16, 3, 4, 5)).astype(np.float32)
    y = rng.normal(size=(16, 6, 2)).astype(np.float32)
    got = linear_cka(torch.from_numpy(x), torch.from_numpy(y))
    assert got == pytest.approx(reference_cka(x, y), abs=1e-6)


def test_invariances(rng: np.random.Generator) -> None:
    x = torch.from_numpy(rng.normal(size=(40, 12)))
    q, _ = torch.linalg.qr(torch.from_numpy(rng.normal(size=(12, 12))))
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka(x, x @ q) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka(x, 7.5 * x) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka(x, x + 3.0) == pytest.approx(1.0, abs=1e-12)  # centring removes shifts
    # An anisotropic rescaling is not an invariance: CKA must drop below 1.
    assert linear_cka(x, x * torch.linspace(0.01, 10.0, 12, dtype=torch.float64)) < 0.99


def test_symmetric_and_bounded(rng: np.random.Generator) -> None:
    for _ in range(5):
        x = rng.normal(size=(30, 25))
        y = np.tanh(x @ rng.normal(size=(25, 9))) + rng.normal(size=(30, 9))
        a, b = linear_cka(x, y), linear_cka(y, x)
        assert a == pytest.approx(b, abs=1e-12)
        assert 0.0 <= a <= 1.0


def test_unrelated_is_lower_than_related(rng: np.random.Generator) -> None:
    x = rng.normal(size=(500, 10))
    rotation, _ = np.linalg.qr(rng.normal(size=(10, 10)))
    related = x @ rotation + 0.1 * rng.normal(size=(500, 10))
    unrelated = rng.normal(size=(500, 10))
    assert linear_cka(x, related) > 0.8
    assert linear_cka(x, unrelated) < 0.1


def test_constant_input_gives_zero(rng: np.random.Generator) -> None:
    x = rng.normal(size=(10, 4))
    const = np.full((10, 4), 0.1)  # 0.1 is not exact in binary: the mean is off by an ulp
    assert linear_cka(x, const) == 0.0
    assert linear_cka(const, const) == 0.0
    raw = const @ const.T  # uncentred Gram: centring leaves only rounding noise
    assert cka_from_grams(x @ x.T, raw) == 0.0


def test_nan_and_inf_name_the_input(rng: np.random.Generator) -> None:
    x = rng.normal(size=(10, 4))
    bad = x.copy()
    bad[3, 1] = np.nan
    with pytest.raises(NonFiniteError, match=r"^y "):
        linear_cka(x, bad)
    bad[3, 1] = np.inf
    with pytest.raises(NonFiniteError, match=r"^x "):
        linear_cka(bad, x)
    with pytest.raises(NonFiniteError):
        gram(bad)
    with pytest.raises(NonFiniteError, match=r"acts_b\[1\]"):
        cka_matrix([x], [x, bad])


def test_bad_sample_counts(rng: np.random.Generator) -> None:
    x = rng.normal(size=(10, 4))
    with pytest.raises(DataError, match="10 samples but y has 9"):
        linear_cka(x, x[:9])
    with pytest.raises(DataError):
        linear_cka(x[:1], x[:1])
    with pytest.raises(DataError):
        cka_from_grams(gram(x), gram(x[:9]))
    with pytest.raises(DataError):
        cka_from_grams(np.ones((4, 3)), np.ones((4, 3)))
    with pytest.raises(ValueError):  # DataError is also a ValueError for callers
        cka_matrix([x], [x[:5]])


def test_gram_cache_matches_direct(rng: np.random.Generator) -> None:
    x = rng.normal(size=(25, 40))
    y = rng.normal(size=(25, 3)) + x[:, :3]
    k, l = gram(x), gram(y)  # noqa: E741
    assert k.dtype == torch.float64 and k.shape == (25, 25)
    assert cka_from_grams(k, l) == pytest.approx(linear_cka(x, y), abs=1e-12)
    k_before = k.clone()
    cka_from_grams(k, l)
    assert torch.equal(k, k_before)  # cached Grams are not modified in place
    # Uncentred Grams give the same value: cka_from_grams centres them itself.
    assert cka_from_grams(x @ x.T, y @ y.T) == pytest.approx(reference_cka(x, y), abs=1e-10)


def test_gram_in_feature_blocks_matches_one_block(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wide activation's Gram is built a few features at a time: the same matrix, constant
    features still exactly zero, and a NaN in a late block still named."""
    from stitch_nas.similarity import _cka

    x = rng.normal(size=(12, 5, 7, 7)).astype(np.float32)
    x[:, 2] = 3.0  # a constant channel
    whole = gram(x)
    monkeypatch.setattr(_cka, "_BLOCK_BYTES", 8 * 12 * 10)  # 10 features a block: 25 blocks
    torch.testing.assert_close(gram(x), whole, rtol=1e-12, atol=1e-12)
    centred = x.reshape(12, -1) - x.reshape(12, -1).mean(0)
    torch.testing.assert_close(
        gram(x), torch.from_numpy(centred @ centred.T).double(), rtol=1e-5, atol=1e-4
    )
    assert linear_cka(x, x**2) == pytest.approx(reference_cka(x, x**2), abs=1e-9)
    x[3, 4, 6, 6] = np.nan
    with pytest.raises(NonFiniteError, match="x contains NaN"):
        gram(x)


def test_cka_matrix_matches_pairwise(rng: np.random.Generator) -> None:
    n = 32
    base = rng.normal(size=(n, 8))
    acts_a = [torch.from_numpy(base @ rng.normal(size=(8, d))) for d in (4, 16, 64)]
    acts_b = [torch.from_numpy(rng.normal(size=(n, d)) + base[:, :1]) for d in (5, 300)]
    acts_b.append(torch.ones(n, 3))  # constant: a row of zeros
    mat = cka_matrix(acts_a, acts_b)
    assert mat.shape == (3, 3) and mat.dtype == torch.float64
    for i, a in enumerate(acts_a):
        for j, b in enumerate(acts_b):
            assert float(mat[i, j]) == pytest.approx(linear_cka(a, b), abs=1e-12)
    assert torch.all(mat[:, 2] == 0.0)
    assert cka_matrix([], acts_b).shape == (0, 3)


def test_minibatch_identical_is_one(rng: np.random.Generator) -> None:
    xs = [torch.from_numpy(rng.normal(size=(16, 20))) for _ in range(4)]
    assert minibatch_cka((x, x) for x in xs) == pytest.approx(1.0, abs=1e-12)
    assert minibatch_cka((x, 3.0 * x + 1.0) for x in xs) == pytest.approx(1.0, abs=1e-12)


def test_minibatch_approaches_full_batch(rng: np.random.Generator) -> None:
    n, batch = 4000, 200
    x = rng.normal(size=(n, 12))
    y = x @ rng.normal(size=(12, 8)) + 0.5 * rng.normal(size=(n, 8))
    full = linear_cka(x, y)
    acc = MinibatchCKA()
    for start in range(0, n, batch):
        acc.update(x[start : start + batch], y[start : start + batch])
    assert acc.batches == n // batch
    assert abs(acc.value() - full) < 0.05
    # Unrelated features: unbiased estimate near 0, while the biased one on wide features is not.
    wide_x, wide_y = rng.normal(size=(n, 500)), rng.normal(size=(n, 500))
    pairs = ((wide_x[s : s + batch], wide_y[s : s + batch]) for s in range(0, n, batch))
    assert abs(minibatch_cka(pairs)) < 0.05
    assert linear_cka(wide_x[:batch], wide_y[:batch]) > 0.5


def test_minibatch_unbiased_hsic_formula(rng: np.random.Generator) -> None:
    # One batch of 6: compare to the estimator written out with explicit loops.
    x, y = rng.normal(size=(6, 3)), rng.normal(size=(6, 2))

    def hsic(k: np.ndarray, l: np.ndarray) -> float:  # noqa: E741
        n = len(k)
        kt, lt = k.copy(), l.copy()
        np.fill_diagonal(kt, 0.0)
        np.fill_diagonal(lt, 0.0)
        one = np.ones(n)
        val = np.trace(kt @ lt) + (one @ kt @ one) * (one @ lt @ one) / ((n - 1) * (n - 2))
        val -= 2.0 / (n - 2) * (one @ kt @ lt @ one)
        return float(val / (n * (n - 3)))

    k, l = x @ x.T, y @ y.T  # noqa: E741
    expected = hsic(k, l) / np.sqrt(hsic(k, k) * hsic(l, l))
    assert minibatch_cka([(x, y)]) == pytest.approx(expected, abs=1e-10)


def test_minibatch_errors(rng: np.random.Generator) -> None:
    x = rng.normal(size=(3, 5))
    with pytest.raises(DataError, match="at least 4"):
        minibatch_cka([(x, x)])
    with pytest.raises(DataError):
        minibatch_cka([])
    big = rng.normal(size=(8, 5))
    with pytest.raises(DataError):
        minibatch_cka([(big, big[:6])])
    bad = big.copy()
    bad[0, 0] = np.nan
    with pytest.raises(NonFiniteError, match=r"^x "):
        minibatch_cka([(bad, big)])
    assert minibatch_cka([(big, np.full((8, 2), 0.1))]) == 0.0


def test_to_rows_shapes() -> None:
    nchw = torch.randn(4, 3, 8, 6)
    assert to_rows(nchw, "nchw").shape == (4, 3)
    assert to_rows(nchw, "nchw", mode="flatten").shape == (4, 3 * 8 * 6)
    assert to_rows(nchw, "nchw", spatial=(4, 3), mode="flatten").shape == (4, 3 * 4 * 3)
    nhwc = nchw.permute(0, 2, 3, 1).contiguous()
    flat_nchw = to_rows(nchw, "nchw", mode="flatten")
    torch.testing.assert_close(to_rows(nhwc, "nhwc", mode="flatten"), flat_nchw)
    torch.testing.assert_close(to_rows(nchw, "nchw"), nchw.mean(dim=(2, 3)))
    tokens = torch.randn(4, 10, 7)
    torch.testing.assert_close(to_rows(tokens, "tokens"), tokens.mean(dim=1))
    assert to_rows(tokens, "tokens", mode="flatten").shape == (4, 70)
    vec = torch.randn(4, 9)
    assert to_rows(vec, "vector") is vec
    assert to_rows(torch.ones(4, 2, dtype=torch.int64), "vector").is_floating_point()


def test_to_rows_resize_is_bilinear() -> None:
    big = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).reshape(2, 3, 8, 8)
    rows = to_rows(big, "nchw", spatial=(4, 4), mode="flatten")
    expected = F.interpolate(big, size=(4, 4), mode="bilinear", align_corners=False)
    torch.testing.assert_close(rows, expected.reshape(2, -1))
    # A map already at the target size is untouched.
    same = to_rows(big, "nchw", spatial=(8, 8), mode="flatten")
    torch.testing.assert_close(same, big.reshape(2, -1))


def test_to_rows_errors() -> None:
    with pytest.raises(ConfigError, match="'nhcw'.*nchw, nhwc, tokens, vector"):
        to_rows(torch.zeros(2, 3, 4, 4), "nhcw")
    with pytest.raises(StitchNASError):
        to_rows(torch.zeros(2, 3, 4, 4), "nchw", mode="max")
    with pytest.raises(DataError, match="4-D"):
        to_rows(torch.zeros(2, 3, 4), "nchw")
    with pytest.raises(ConfigError):
        to_rows(torch.zeros(2, 3, 4), "tokens", spatial=(2, 2))
    with pytest.raises(ConfigError):
        to_rows(torch.zeros(2, 3, 4, 4), "nchw", spatial=(0, 2))


def test_common_spatial_takes_smaller() -> None:
    assert common_spatial((8, 64, 28, 28), (8, 128, 14, 14)) == (14, 14)
    assert common_spatial((7, 7), (8, 32, 14, 14)) == (7, 7)
    assert common_spatial((14, 28), (28, 14)) == (14, 14)  # per axis: never upsample
    with pytest.raises(DataError):
        common_spatial((1, 2, 3), (4, 4))


def test_spatial_rule_end_to_end() -> None:
    # Two maps of different size but the same content compare as identical after the rule.
    torch.manual_seed(0)
    small = torch.randn(12, 4, 7, 7)
    big = F.interpolate(small, size=(14, 14), mode="nearest")
    size = common_spatial(small.shape, big.shape)
    a = to_rows(small, "nchw", spatial=size, mode="flatten")
    b = to_rows(big, "nchw", spatial=size, mode="flatten")
    assert a.shape == b.shape == (12, 4 * 49)
    assert linear_cka(a, b) > 0.9


def test_chain_score() -> None:
    assert chain_score([]) == 1.0
    assert chain_score([0.5, 0.8, 0.25]) == pytest.approx(0.1)
    assert chain_score(iter([0.9])) == pytest.approx(0.9)
    with pytest.raises(NonFiniteError):
        chain_score([0.5, float("nan")])
    with pytest.raises(DataError, match=r"scores\[1\]=1.5"):
        chain_score([0.5, 1.5])


@pytest.mark.parametrize("batch", [1, 7, 60])
@pytest.mark.parametrize("block_features", [1, 11, 100])
def test_gram_of_batches_is_the_whole_gram(batch, block_features):
    """Streamed in batches and multiplied in blocks of features, the Gram is the whole one's."""
    x = torch.randn(60, 4, 5, 5, generator=torch.Generator().manual_seed(0)) * 3 + 10
    x[:, 0] = 7.0  # a constant channel contributes exactly nothing
    streamed = gram_of_batches(lambda: iter(x.split(batch)), 60, block_features * 8 * 60)
    whole = gram(x)
    assert float((streamed - whole).abs().max()) <= 1e-12 * float(whole.abs().max())
    assert linear_cka(x, x**2) == pytest.approx(cka_from_grams(streamed, gram(x**2)), abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gram_of_batches_runs_the_activation_once_however_many_blocks(dtype):
    """Each read of a probe activation not in the cache is a forward pass of the model's
    prefix: the blocks of features are read back from the file the one pass wrote, and make
    the same Gram as one block."""
    x = (torch.randn(50, 3, 4, 4, generator=torch.Generator().manual_seed(1)) * 2).to(dtype)
    reads = []

    def read():
        reads.append(1)
        return iter(x.split(6))

    blocks = 7 * 8 * 50  # 7 float64 features of 50 rows: seven blocks of 48 features
    panels, one = gram_of_batches(read, 50, blocks), gram_of_batches(read, 50, 1 << 30)
    assert len(reads) == 2  # once each
    # half precision is multiplied in float32 (summed in float64), float32 in float64
    tolerance = 1e-12 if dtype == torch.float32 else 1e-6
    assert float((panels - one).abs().max()) <= tolerance * float(one.abs().max())
    whole = gram(x.float())
    assert float((panels - whole).abs().max()) <= tolerance * float(whole.abs().max())
    assert float((panels - whole).abs().max()) > 0 or dtype == torch.float32
    # float16 values read as float32 (the cache's activations) make the float16 Gram
    as_read = x.float().split(6)
    assert torch.equal(gram_of_batches(lambda: iter(as_read), 50, blocks, values=dtype), panels)


def test_gram_of_batches_of_a_constant_and_of_the_wrong_count():
    constant = torch.full((50, 3, 2, 2), 1.7)
    assert float(gram_of_batches(lambda: iter(constant.split(8)), 50).abs().max()) == 0.0
    with pytest.raises(DataError, match="hold 50 samples, not 60"):
        gram_of_batches(lambda: iter(constant.split(8)), 60)
    with pytest.raises(DataError, match="hold at least 48 samples, not 40"):
        gram_of_batches(lambda: iter(constant.split(8)), 40)
    with pytest.raises(NonFiniteError, match="NaN"):
        gram_of_batches(lambda: iter([torch.tensor([[1.0], [float("nan")]])]), 2)
    with pytest.raises(DataError, match="a batch has 4 features after 12"):
        gram_of_batches(lambda: iter([constant[:8], constant[8:16, :1]]), 50)
