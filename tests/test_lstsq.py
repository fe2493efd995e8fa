"""Least-squares stitching: recovers known maps, fuses exactly, refuses what it cannot join."""

from __future__ import annotations

import weakref

import pytest
import timm
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from stitch_nas import errors
from stitch_nas.adapters._fuse import fusable_consumer, fuse_into_segment
from stitch_nas.adapters._lstsq import fit_lstsq, fit_lstsq_batches
from stitch_nas.adapters._normal_equations import NormalEquations, bilinear_matrix
from stitch_nas.fragments import CutPoint, cut_points, segment

SHAPE = (1, 3, 32, 32)


def _cut(layout: str, shape: tuple[int, ...], prefix: int = 0, name: str = "c") -> CutPoint:
    return CutPoint(name, 0, layout, shape, prefix)


def test_recovers_an_exact_affine_map_between_feature_maps():
    torch.manual_seed(0)
    x = torch.randn(64, 6, 4, 4)
    a, b = torch.randn(5, 6), torch.randn(5)
    y = torch.einsum("kj,njhw->nkhw", a, x) + b.view(1, -1, 1, 1)
    stitch = fit_lstsq(x, y, _cut("nchw", (6, 4, 4)), _cut("nchw", (5, 4, 4)), ridge=0.0)
    assert torch.allclose(stitch.weight, a, atol=1e-4)
    assert torch.allclose(stitch.bias, b, atol=1e-4)
    assert torch.allclose(stitch(x), y, atol=1e-4)


def test_batches_of_activations_fit_the_same_map_as_whole_ones():
    torch.manual_seed(1)
    x = torch.randn(50, 6, 8, 8)
    y = torch.randn(50, 4, 4, 7)  # resized and laid out as nhwc on the way
    src, dst = _cut("nchw", (6, 8, 8)), _cut("nhwc", (4, 4, 7))
    whole = fit_lstsq(x, y, src, dst)
    pairs = zip(x.split(16), y.split(16), strict=True)  # 16 + 16 + 16 + 2 images
    batched = fit_lstsq_batches(pairs, src, dst)
    torch.testing.assert_close(batched.weight, whole.weight, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(batched.bias, whole.bias, rtol=1e-4, atol=1e-5)
    with pytest.raises(errors.LayoutError, match="both activations must come from the same"):
        fit_lstsq_batches([(x[:16], y[:15])], src, dst)
    with pytest.raises(errors.LayoutError, match="no activations"):
        fit_lstsq_batches([], src, dst)


def test_a_fit_streamed_over_many_batches_is_the_whole_probe_solve():
    """A probe of 400 images fitted 10 at a time (40 batches, 6,400 rows of a 4x4 grid) gives
    the ridge solve on the whole probe in float64 to 1e-6 (far from centred data: the shift
    must absorb the mean)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 6, 4, 4, generator=g) * 3 + 40.0
    a = torch.randn(5, 6, generator=g, dtype=torch.float64)
    noise = torch.randn(400, 5, 4, 4, generator=g) * 0.1
    y = (torch.einsum("kj,njhw->nkhw", a.float(), x) + noise + 2.0).contiguous()
    src, dst = _cut("nchw", (6, 4, 4)), _cut("nchw", (5, 4, 4))
    streamed = fit_lstsq_batches(zip(x.split(10), y.split(10), strict=True), src, dst)
    rows_x = x.permute(0, 2, 3, 1).reshape(-1, 6).double()
    rows_y = y.permute(0, 2, 3, 1).reshape(-1, 5).double()
    xc, yc = rows_x - rows_x.mean(0), rows_y - rows_y.mean(0)
    gram = xc.T @ xc
    gram += 1e-4 * gram.diagonal().mean() * torch.eye(6, dtype=torch.float64)  # default ridge
    weight = torch.linalg.solve(gram, xc.T @ yc).T
    bias = rows_y.mean(0) - weight @ rows_x.mean(0)
    assert float((streamed.weight.double() - weight).abs().max()) <= 1e-6 * float(
        weight.abs().max()
    )
    assert float((streamed.bias.double() - bias).abs().max()) <= 1e-6 * float(rows_y.abs().max())


class PeakTensorBytes(TorchDispatchMode):
    """The most bytes of tensors alive at once among those made by ops under this mode: each
    new (non-view) output counts until it is freed (CPU tensors escape tracemalloc)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = self.peak = 0

    def _free(self, size: int) -> None:
        self.now -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if all(r.alias_info is None for r in func._schema.returns):
            for tensor in tree_leaves(out):
                if isinstance(tensor, torch.Tensor):
                    size = tensor.untyped_storage().nbytes()
                    self.now += size
                    self.peak = max(self.peak, self.now)
                    weakref.finalize(tensor, self._free, size)
        return out


def test_a_fits_working_memory_does_not_grow_with_the_probe():
    """Fitted from batches made as they are read (as the cache serves them), a 2,000-image
    probe peaks at the memory of a 256-image one; the whole 2,000 would be 6x more."""
    src, dst = _cut("nchw", (16, 4, 4)), _cut("nchw", (8, 4, 4))

    def batches(images: int):
        g = torch.Generator().manual_seed(0)
        for start in range(0, images, 32):
            n = min(32, images - start)
            yield torch.randn(n, 16, 4, 4, generator=g), torch.randn(n, 8, 4, 4, generator=g)

    peaks = []
    for images in (256, 2000):
        with PeakTensorBytes() as mode:
            fit_lstsq_batches(batches(images), src, dst)
        peaks.append(mode.peak)
    whole = 2000 * (16 + 8) * 4 * 4 * 4  # bytes of the 2,000 images' activations, float32
    assert peaks[1] <= 1.1 * peaks[0] and peaks[0] < whole / 6


@pytest.mark.parametrize("layouts", [("nchw", "nchw"), ("nhwc", "nhwc"), ("nchw", "nhwc")])
def test_a_stitch_into_a_larger_grid_with_fewer_channels_maps_before_it_resizes(layouts):
    """Mapping first gives the resize-then-map output (a bilinear resize commutes with a
    per-position affine map) without holding the source's channels at the destination's grid:
    that intermediate is 40 / 4 = 10 times the stitch's output here."""
    src_layout, dst_layout = layouts
    src = _cut(src_layout, (40, 4, 4) if src_layout == "nchw" else (4, 4, 40))
    dst = _cut(dst_layout, (4, 32, 32) if dst_layout == "nchw" else (32, 32, 4))
    stitch = fit_lstsq(torch.randn(8, *src.shape), torch.randn(8, *dst.shape), src, dst)
    assert stitch.map_first
    x = torch.randn(8, *src.shape)
    resized_first = torch.nn.functional.linear(stitch.align(x), stitch.weight, stitch.bias)
    if dst_layout == "nchw":
        resized_first = resized_first.permute(0, 3, 1, 2)
    with torch.no_grad(), PeakTensorBytes() as mode:
        out = stitch(x)
    torch.testing.assert_close(out, resized_first, rtol=1e-4, atol=1e-5)
    aligned_bytes = 8 * 40 * 32 * 32 * 4  # the source's channels on the destination's grid
    assert mode.peak < aligned_bytes / 3


def test_resizes_to_the_destination_grid_and_converts_layouts():
    x = torch.randn(32, 6, 8, 8)
    y = torch.randn(32, 4, 4, 7)  # nhwc destination, 4x4 grid, 7 channels
    stitch = fit_lstsq(x, y, _cut("nchw", (6, 8, 8)), _cut("nhwc", (4, 4, 7)))
    assert stitch(x).shape == y.shape
    pooled = fit_lstsq(x, torch.randn(32, 3), _cut("nchw", (6, 8, 8)), _cut("vector", (3,)))
    assert pooled(x).shape == (32, 3)


def test_tokens_to_tokens_keeps_prefix_tokens():
    x, y = torch.randn(40, 17, 8), torch.randn(40, 5, 6)
    stitch = fit_lstsq(x, y, _cut("tokens", (17, 8), 1), _cut("tokens", (5, 6), 1))
    assert stitch(x).shape == (40, 5, 6)


@pytest.mark.parametrize(
    "src, dst",
    [
        (_cut("vector", (8,)), _cut("nchw", (4, 2, 2))),
        (_cut("tokens", (17, 8), 1), _cut("nchw", (4, 2, 2))),
        (_cut("tokens", (17, 8), 1), _cut("tokens", (16, 8), 0)),
    ],
)
def test_unsupported_layout_pairs_are_refused_clearly(src, dst):
    with pytest.raises(errors.LayoutError, match="supported pairs"):
        fit_lstsq(torch.randn(4, *src.shape), torch.randn(4, *dst.shape), src, dst)


def test_singular_system_without_ridge_is_reported():
    x = torch.randn(50, 1).repeat(1, 4)  # four identical channels: rank 1
    with pytest.raises(errors.SingularSystemError, match="ridge"):
        fit_lstsq(x, torch.randn(50, 3), _cut("vector", (4,)), _cut("vector", (3,)), ridge=0.0)
    fit_lstsq(x, torch.randn(50, 3), _cut("vector", (4,)), _cut("vector", (3,)), ridge=1e-4)


def test_non_finite_activations_are_reported():
    x = torch.randn(10, 4)
    x[3, 1] = float("nan")
    with pytest.raises(errors.NonFiniteError, match="NaN"):
        fit_lstsq(x, torch.randn(10, 3), _cut("vector", (4,), name="src"), _cut("vector", (3,)))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_the_finite_check_finds_one_bad_value_and_passes_a_sum_that_overflows(bad):
    x = torch.full((4, 8), 3e38)  # finite values whose float32 sum is inf
    errors.check_finite(x, "x")
    errors.check_finite(torch.arange(5), "integers")
    x[2, 5] = bad
    with pytest.raises(errors.NonFiniteError, match=r"^x holds 1 NaN/Inf"):
        errors.check_finite(x, "x")


def _pair_cases():
    torch.manual_seed(0)
    src = timm.create_model("test_resnet", num_classes=10).eval()
    dst = timm.create_model("test_efficientnet", num_classes=10).eval()
    x = torch.randn(48, 3, 32, 32)
    return src, dst, x


def test_fused_and_unfused_outputs_agree():
    src, dst, x = _pair_cases()
    src_cut = cut_points(src, input_shape=SHAPE)[5]
    fused_any = 0
    for dst_cut in cut_points(dst, input_shape=SHAPE):
        tail = segment(dst, dst_cut, None, input_shape=SHAPE)
        if fusable_consumer(tail) is None:
            continue
        with torch.no_grad():
            xa = segment(src, None, src_cut, input_shape=SHAPE)(x)
            yb = segment(dst, None, dst_cut, input_shape=SHAPE)(x)
            stitch = fit_lstsq(xa, yb, src_cut, dst_cut)
            unfused = tail(stitch(xa))
            fused = fuse_into_segment(stitch, tail)(xa)
        assert (fused - unfused).abs().max() <= 1e-4 * max(1.0, unfused.abs().max().item())
        fused_any += 1
    assert fused_any >= 2  # conv and linear consumers both exercised


def test_fusing_into_a_padded_conv_keeps_the_border_exact():
    conv = torch.nn.Conv2d(4, 5, 3, padding=1).eval()
    tail = torch.fx.symbolic_trace(torch.nn.Sequential(conv, torch.nn.ReLU()))
    x = torch.randn(16, 3, 6, 6)
    y = torch.randn(16, 4, 6, 6)
    stitch = fit_lstsq(x, y, _cut("nchw", (3, 6, 6)), _cut("nchw", (4, 6, 6)))
    with torch.no_grad():
        assert torch.allclose(fuse_into_segment(stitch, tail)(x), tail(stitch(x)), atol=1e-5)


def test_fusion_is_refused_when_the_cut_feeds_a_residual():
    model = timm.create_model("test_resnet").eval()
    cut = next(c for c in cut_points(model, input_shape=SHAPE) if c.name == "layer1.0")
    tail = segment(model, cut, None, input_shape=SHAPE)
    assert fusable_consumer(tail) is None
    stitch = fit_lstsq(torch.randn(8, *cut.shape), torch.randn(8, *cut.shape), cut, cut)
    with pytest.raises(errors.LayoutError, match="fuse=False"):
        fuse_into_segment(stitch, tail)


def test_normal_equations_accumulated_in_chunks_equal_one_solve():
    torch.manual_seed(0)
    x = torch.randn(3000, 12) * 3 + 40.0  # far from centred: the shift must absorb the mean
    y = x @ torch.randn(12, 5) + torch.randn(3000, 5) * 0.1
    whole = NormalEquations().add(x, y).solve(1e-4, "whole")
    chunked = NormalEquations()
    for xs, ys in zip(x.split(257), y.split(257), strict=True):
        chunked.add(xs, ys)
    parts = chunked.solve(1e-4, "chunked")
    assert chunked.rows == 3000
    # the bias is y's mean less x's mean (40) times the weights, so it carries their float32
    # error times 40: about 1e-4 from the exact solution, chunked or not
    for a, b in zip(whole, parts, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("kernel", [1, 3])
def test_fits_in_small_chunks_equal_fits_in_one(monkeypatch, kernel):
    """fit_lstsq and fit_conv (unfolded 3x3 patches) never hold all rows; results agree."""
    from stitch_nas.adapters import _lstsq
    from stitch_nas.adapters._init import fit_conv

    torch.manual_seed(0)
    x, y = torch.randn(40, 6, 8, 8), torch.randn(40, 5, 8, 8)
    src, dst = _cut("nchw", (6, 8, 8)), _cut("nchw", (5, 8, 8))
    conv_whole = torch.nn.Conv2d(6, 5, kernel, padding=kernel // 2)
    conv_chunked = torch.nn.Conv2d(6, 5, kernel, padding=kernel // 2)
    stitch_whole = fit_lstsq(x, y, src, dst)
    fit_conv(conv_whole, x, y, 1e-4, "whole")
    monkeypatch.setattr(_lstsq, "CHUNK_ELEMENTS", 6 * 9 * 64 * 3)
    calls = []
    original = _lstsq.NormalEquations.add
    monkeypatch.setattr(
        _lstsq.NormalEquations,
        "add",
        lambda self, a, b: calls.append(len(a)) or original(self, a, b),
    )
    stitch_chunked = fit_lstsq(x, y, src, dst)
    assert calls == [27 * 64, 13 * 64]  # 384 elements per image: 27 images a chunk
    calls.clear()
    fit_conv(conv_chunked, x, y, 1e-4, "chunked")
    step = (6 * 9 * 64 * 3) // (6 * kernel * kernel * 64)  # unfolded patches per image
    assert calls == [len(c) * 64 for c in torch.arange(40).split(step)]
    torch.testing.assert_close(stitch_chunked.weight, stitch_whole.weight, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(conv_chunked.weight, conv_whole.weight, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(conv_chunked.bias, conv_whole.bias, rtol=1e-4, atol=1e-5)


def test_the_ridge_term_matches_an_independent_augmented_least_squares_solve():
    """fit_lstsq's ridge against numpy: min |Xw + b - Y|² + λ|w|² (the bias unpenalised) is the
    plain least-squares solution of the augmented system [X 1; √λ I 0] [w; b] = [Y; 0], with
    λ = ridge x the mean eigenvalue (trace / features) of the centred XᵀX, as documented."""
    import numpy as np

    rng = np.random.default_rng(3)
    n, p, q, ridge = 40, 6, 3, 0.3  # a ridge large enough to move the map far from plain LS
    x = rng.normal(size=(n, p)) * rng.uniform(0.5, 4.0, size=p) + rng.normal(size=p) * 5
    y = x @ rng.normal(size=(p, q)) + rng.normal(size=q) + rng.normal(size=(n, q)) * 0.5
    centred = x - x.mean(0)
    lam = ridge * np.trace(centred.T @ centred) / p
    system = np.block([[x, np.ones((n, 1))], [np.sqrt(lam) * np.eye(p), np.zeros((p, 1))]])
    target = np.vstack([y, np.zeros((p, q))])
    solution = np.linalg.lstsq(system, target, rcond=None)[0]
    weight, bias = solution[:p].T, solution[p]

    src, dst = _cut("vector", (p,)), _cut("vector", (q,))
    fitted = fit_lstsq(torch.tensor(x), torch.tensor(y), src, dst, ridge=ridge)
    np.testing.assert_allclose(fitted.weight.detach().numpy(), weight, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fitted.bias.detach().numpy(), bias, rtol=1e-4, atol=1e-4)
    plain = fit_lstsq(torch.tensor(x), torch.tensor(y), src, dst, ridge=0.0)
    assert (plain.weight - fitted.weight).abs().max() > 0.05  # the ridge did shrink the map


def test_normal_equations_without_rows_name_the_system():
    equations = NormalEquations().add(torch.zeros(0, 3), torch.zeros(0, 2))
    with pytest.raises(errors.SingularSystemError, match="has no rows"):
        equations.solve(1e-4, "empty")


@pytest.mark.parametrize("layouts", [("nchw", "nchw"), ("nhwc", "nchw"), ("nchw", "nhwc")])
def test_a_fit_onto_a_larger_grid_solves_the_resized_rows_system_without_making_them(layouts):
    """The products of the resized rows, taken on the source's grid (RᵀR and Rᵀ one axis at a
    time), give the map that fitting the resized rows themselves gives, over several batches;
    the resize is the product of the two axes' matrices."""
    src_layout, dst_layout = layouts
    torch.manual_seed(0)
    x_nchw, y_nchw = torch.randn(12, 24, 3, 5) * 3 + 1, torch.randn(12, 6, 8, 12) - 2
    resized = torch.nn.functional.interpolate(
        x_nchw, size=(8, 12), mode="bilinear", align_corners=False
    )
    rh, rw = bilinear_matrix(3, 8), bilinear_matrix(5, 12)
    torch.testing.assert_close(torch.einsum("Hh,nchw,Ww->ncHW", rh, x_nchw, rw), resized)
    x = x_nchw if src_layout == "nchw" else x_nchw.permute(0, 2, 3, 1)
    y = y_nchw if dst_layout == "nchw" else y_nchw.permute(0, 2, 3, 1)
    src = _cut(src_layout, tuple(x.shape[1:]))
    dst = _cut(dst_layout, tuple(y.shape[1:]))
    stitch = fit_lstsq_batches([(x[:5], y[:5]), (x[5:], y[5:])], src, dst)
    rows = NormalEquations().add(
        resized.permute(0, 2, 3, 1).reshape(-1, 24), y_nchw.permute(0, 2, 3, 1).reshape(-1, 6)
    )
    weight, bias = rows.solve(1e-4, "the resized rows")
    torch.testing.assert_close(stitch.weight, weight.T.float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(stitch.bias, bias.float(), rtol=1e-4, atol=1e-5)
    # and the rows are never made: 40 channels on a 32x32 grid are 10x the targets here
    x, y = torch.randn(8, 40, 4, 4), torch.randn(8, 4, 32, 32)
    with PeakTensorBytes() as mode:
        fit_lstsq_batches([(x, y)], _cut("nchw", (40, 4, 4)), _cut("nchw", (4, 32, 32)))
    assert mode.peak < 8 * 40 * 32 * 32 * 4 / 3
