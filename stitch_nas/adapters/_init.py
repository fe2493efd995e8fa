"""Initialising adapters from probe activations: least squares, near-identity, or left as built.

Least squares (SN-Net's initialisation of its stitching layers) fits each adapter's linear part
to the destination's activations, after the pre-norm has been set to standardise the probe
inputs; the norm after the body is set to the identity on the probe statistics, the position
bias to the mean residual per position, and the class-token map by a second least-squares fit.
An adapter so initialised computes its least-squares map before any training.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import cast

import torch
from torch import nn

from stitch_nas.errors import ConfigError, LayoutError, check_finite
from stitch_nas.fragments import CutPoint

from ._bodies import StitchAdapter
from ._convert import grid_target, prefix
from ._lowrank import LowRankStitch
from ._lstsq import LinearStitch, chunk_images, fit_lstsq_batches
from ._normal_equations import NormalEquations
from ._options import INIT_MODES

__all__ = ["Pairs", "fit_conv", "fit_conv_batches", "initialise", "initialise_batches"]

#: the probe's activations at the joint's source and destination, batch by batch and of the
#: same images; each call reads them again from the start (an initialisation makes passes)
Pairs = Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]]


def fit_conv(
    conv: nn.Conv2d, inp: torch.Tensor, target: torch.Tensor, ridge: float, what: str
) -> None:
    """Set ``conv`` (with bias) to the least-squares map from ``inp`` to ``target`` (NCHW)."""
    fit_conv_batches(conv, [(inp, target)], ridge, what)


def fit_conv_batches(
    conv: nn.Conv2d, pairs: Iterable[tuple[torch.Tensor, torch.Tensor]], ridge: float, what: str
) -> None:
    """:func:`fit_conv` from ``(inp, target)`` batches of the same images, in any number.

    Every output position is one row whose features are the conv's receptive field, so a 3x3
    or strided conv is fitted as exactly as a 1x1 one. The patches are unfolded a chunk of
    images at a time into accumulated normal equations: a 3x3 conv on a 128-channel 32x32
    source holds 1,152 features per position, 4.7 MB per image if unfolded whole.
    """
    if conv.bias is None:
        raise LayoutError(f"cannot fit {what}: its convolution has no bias")
    unfold = nn.Unfold(conv.kernel_size, padding=conv.padding, stride=conv.stride)  # type: ignore[arg-type]
    equations = NormalEquations()
    for inp, target in pairs:
        first = unfold(inp[:1])
        rows_in = first.shape[2] * inp.shape[0]
        rows_out = target[:1].flatten(2).shape[2] * target.shape[0]
        if rows_in != rows_out:
            raise LayoutError(
                f"{what}: the adapter gives {rows_in} rows but the destination "
                f"{rows_out}; both activations must come from the same samples"
            )
        step = chunk_images(max(first.numel(), target[:1].numel()))
        for chunk, wanted in zip(inp.split(step), target.split(step), strict=True):
            cols = unfold(chunk)
            rows = cols.transpose(1, 2).reshape(-1, cols.shape[1]).float()
            equations.add(rows, wanted.flatten(2).transpose(1, 2).reshape(-1, wanted.shape[1]))
    weight, bias = equations.solve(ridge, what)
    with torch.no_grad():
        conv.weight.copy_(weight.T.reshape(conv.weight.shape).to(conv.weight.dtype))
        conv.bias.copy_(bias.to(conv.bias.dtype))


def _moments(grids: Iterable[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and variance of NCHW batches: sums about the first batch's means,
    float32 within a batch and float64 across batches, so no pass holds the probe whole."""
    shift: torch.Tensor | None = None
    sums, count = torch.zeros(2, 0, dtype=torch.float64), 0
    for grid in grids:
        grid = grid.float()
        if shift is None:
            shift = grid.mean(dim=(0, 2, 3))
            sums = torch.zeros(2, grid.shape[1], dtype=torch.float64, device=grid.device)
        d = grid - shift[None, :, None, None]
        sums += torch.stack([d.sum(dim=(0, 2, 3)), (d * d).sum(dim=(0, 2, 3))]).double()
        count += grid.shape[0] * grid.shape[2] * grid.shape[3]
    if shift is None or count == 0:
        raise LayoutError("no probe activations to take statistics of")
    mean = sums[0] / count
    return (shift.double() + mean).float(), (sums[1] / count - mean * mean).clamp_min(0).float()


def _set_stats(norm: nn.BatchNorm2d, mean: torch.Tensor, var: torch.Tensor) -> None:
    """Running statistics of ``norm`` := the per-channel ``mean`` and ``var``."""
    # built with track_running_stats=True, so both buffers exist
    cast(torch.Tensor, norm.running_mean).copy_(mean)
    cast(torch.Tensor, norm.running_var).copy_(var)


def _lstsq(adapter: StitchAdapter, pairs: Pairs, ridge: float) -> None:
    """Least squares in passes over the probe's batches, each reading them again rather than
    holding the probe: the pre-norm's statistics, the linear part, the post-norm's statistics,
    the position bias, the class-token map (each set before the next pass reads through it)."""
    src, dst = adapter.src, adapter.dst
    what = f"{src.name!r} -> {dst.name!r}"

    def read() -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """``(x, y, grid)``: the source and destination batches, and the pre-norm's input."""
        for x, y in pairs():
            check_finite(x, f"activations at {src.name!r}")
            check_finite(y, f"activations at {dst.name!r}")
            yield x, y, adapter.to_grid(x)

    if isinstance(adapter.pre, nn.BatchNorm2d):  # standardise the probe inputs
        _set_stats(adapter.pre, *_moments(grid for _, _, grid in read()))
    linear = adapter.body.linear_part()  # type: ignore[operator]
    if adapter.map_first:  # a 1x1 conv onto a larger grid: as least squares fits it
        equations = NormalEquations()
        for _, y, grid in read():
            equations.add_resized(adapter.pre(grid), grid_target(y, dst))
        weight, bias = equations.solve(ridge, what)
        linear.weight.copy_(weight.T.reshape(linear.weight.shape).to(linear.weight.dtype))
        linear.bias.copy_(bias.to(linear.bias.dtype))
    else:
        targets = ((adapter.pre(grid), grid_target(y, dst)) for _, y, grid in read())
        fit_conv_batches(linear, targets, ridge, what)
    if isinstance(adapter.post, nn.BatchNorm2d):  # the identity on the body's outputs
        mean, var = _moments(adapter.inner(adapter.pre(grid)) for _, _, grid in read())
        _set_stats(adapter.post, mean, var)
        adapter.post.weight.copy_((var + adapter.post.eps).sqrt())
        adapter.post.bias.copy_(mean)

    def outputs() -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        for x, y, grid in read():
            yield x, y, adapter.post(adapter.inner(adapter.pre(grid)))

    out = adapter.from_grid
    if out.pos_bias is not None:  # the mean residual at each position
        total, images = torch.zeros(out.pos_bias.shape, dtype=torch.float64), 0
        for _, y, z in outputs():
            residual = grid_target(y, dst).flatten(2) - z.flatten(2)
            total = total.to(z.device) + residual.transpose(1, 2).sum(0).double()
            images += z.shape[0]
        out.pos_bias.copy_((total / max(images, 1)).float())
    if out.make_prefix is not None:
        equations = NormalEquations()
        for x, y, z in outputs():
            made = out.prefix_input(out.patches(z), prefix(x, src))
            equations.add(made.float(), y[:, : dst.prefix_tokens].flatten(1).float())
        weight, bias = equations.solve(ridge, f"class token of {what}")
        out.make_prefix.weight.copy_(weight.T)
        out.make_prefix.bias.copy_(bias)


def _identity(adapter: StitchAdapter) -> None:
    """Channel i to channel i, zero bias; class tokens start as the mean token.

    The taps that read the source positions under each output position carry the channel:
    the centre tap at stride 1, the mean of the ``s`` x ``s`` block when the conv downsamples
    by ``s`` (its kernel spans the block, after its padding: see ``_bodies.block_kernel``).
    """
    conv = adapter.body.linear_part()  # type: ignore[operator]
    conv.weight.zero_()
    (sh, sw), (ph, pw) = conv.stride, conv.padding
    rows, cols = slice(ph, ph + sh), slice(pw, pw + sw)
    for i in range(min(conv.in_channels, conv.out_channels)):
        conv.weight[i, i, rows, cols] = 1.0 / (sh * sw)
    conv.bias.zero_()
    out = adapter.from_grid
    if out.pos_bias is not None:
        out.pos_bias.zero_()
    if out.make_prefix is not None:
        width = out.pos_bias.shape[1] if out.pos_bias is not None else adapter.dst.channels
        out.make_prefix.weight.zero_()
        out.make_prefix.bias.zero_()
        for t in range(adapter.dst.prefix_tokens):
            out.make_prefix.weight[t * width : (t + 1) * width, :width] = torch.eye(width)


def initialise(
    adapter: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    src: CutPoint,
    dst: CutPoint,
    init: str = "lstsq",
    ridge: float = 1e-4,
) -> None:
    """Initialise ``adapter`` in place from whole probe activations ``x`` (at ``src``) and
    ``y`` (at ``dst``): :func:`initialise_batches` with one batch."""
    initialise_batches(adapter, lambda: [(x, y)], src=src, dst=dst, init=init, ridge=ridge)


def initialise_batches(
    adapter: nn.Module,
    pairs: Pairs,
    *,
    src: CutPoint,
    dst: CutPoint,
    init: str = "lstsq",
    ridge: float = 1e-4,
) -> None:
    """Initialise ``adapter`` in place from the probe's activations at ``src`` and ``dst``,
    read batch by batch (``pairs``), so its memory does not grow with the probe.

    Args:
        init: "lstsq" (fit the linear part), "identity" (channel-to-channel), "random" (as built).
        ridge: relative ridge term of the least-squares fits.
    """
    if init not in INIT_MODES:
        raise ConfigError(f"unknown init {init!r}; use one of {INIT_MODES}")
    was_training = adapter.training
    adapter.eval()
    try:
        with torch.no_grad():
            if isinstance(adapter, LinearStitch):
                fitted = fit_lstsq_batches(pairs(), src, dst, ridge=ridge)
                adapter.load_state_dict(fitted.state_dict())
            elif isinstance(adapter, LowRankStitch):  # its base, as lstsq fits; B := 0
                adapter.fit_base(fit_lstsq_batches(pairs(), src, dst, ridge=ridge))
            elif isinstance(adapter, StitchAdapter) and init == "lstsq":
                _lstsq(adapter, pairs, ridge)
            elif isinstance(adapter, StitchAdapter) and init == "identity":
                _identity(adapter)
    finally:
        adapter.train(was_training)
