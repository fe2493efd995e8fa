"""Initialising adapters from probe activations: least squares, near-identity, or left as built.

Least squares (SN-Net's initialisation of its stitching layers) fits each adapter's linear part
to the destination's activations, after the pre-norm has been set to standardise the probe
inputs; the norm after the body is set to the identity on the probe statistics, the position
bias to the mean residual per position, and the class-token map by a second least-squares fit.
An adapter so initialised computes its least-squares map before any training.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from stitch_nas.errors import ConfigError, LayoutError, check_finite
from stitch_nas.fragments import CutPoint

from ._bodies import StitchAdapter
from ._convert import grid_target, prefix
from ._lowrank import LowRankStitch
from ._lstsq import LinearStitch, NormalEquations, chunk_images, fit_lstsq, solve_normal
from ._options import INIT_MODES

__all__ = ["initialise", "fit_conv"]


def fit_conv(
    conv: nn.Conv2d, inp: torch.Tensor, target: torch.Tensor, ridge: float, what: str
) -> None:
    """Set ``conv`` (with bias) to the least-squares map from ``inp`` to ``target`` (NCHW).

    Every output position is one row whose features are the conv's receptive field, so a 3x3
    or strided conv is fitted as exactly as a 1x1 one. The patches are unfolded a chunk of
    images at a time into accumulated normal equations: a 3x3 conv on a 128-channel 32x32
    source holds 1,152 features per position, 4.7 MB per image if unfolded whole.
    """
    if conv.bias is None:
        raise LayoutError(f"cannot fit {what}: its convolution has no bias")
    unfold = nn.Unfold(conv.kernel_size, padding=conv.padding, stride=conv.stride)  # type: ignore[arg-type]
    first = unfold(inp[:1])
    rows_in = first.shape[2] * inp.shape[0]
    rows_out = target[:1].flatten(2).shape[2] * target.shape[0]
    if rows_in != rows_out:
        raise LayoutError(
            f"{what}: the adapter gives {rows_in} rows but the destination "
            f"{rows_out}; both activations must come from the same samples"
        )
    equations = NormalEquations()
    step = chunk_images(max(first.numel(), target[:1].numel()))
    for chunk, wanted in zip(inp.split(step), target.split(step), strict=True):
        cols = unfold(chunk)
        rows = cols.transpose(1, 2).reshape(-1, cols.shape[1]).float()
        equations.add(rows, wanted.flatten(2).transpose(1, 2).reshape(-1, wanted.shape[1]))
    weight, bias = equations.solve(ridge, what)
    with torch.no_grad():
        conv.weight.copy_(weight.T.reshape(conv.weight.shape).to(conv.weight.dtype))
        conv.bias.copy_(bias.to(conv.bias.dtype))


def _set_stats(norm: nn.BatchNorm2d, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Running statistics of ``norm`` := the per-channel mean and variance of ``x``."""
    mean, var = x.mean(dim=(0, 2, 3)), x.var(dim=(0, 2, 3), unbiased=False)
    # built with track_running_stats=True, so both buffers exist
    cast(torch.Tensor, norm.running_mean).copy_(mean)
    cast(torch.Tensor, norm.running_var).copy_(var)
    return mean, var


def _standardise(norm: nn.Module, x: torch.Tensor) -> None:
    if isinstance(norm, nn.BatchNorm2d):
        _set_stats(norm, x)


def _pass_through(norm: nn.Module, z: torch.Tensor) -> None:
    """Make a BatchNorm the identity on the probe statistics of ``z`` (eval mode)."""
    if isinstance(norm, nn.BatchNorm2d):
        mean, var = _set_stats(norm, z)
        norm.weight.copy_((var + norm.eps).sqrt())
        norm.bias.copy_(mean)


def _lstsq(adapter: StitchAdapter, x: torch.Tensor, y: torch.Tensor, ridge: float) -> None:
    src, dst = adapter.src, adapter.dst
    what = f"{src.name!r} -> {dst.name!r}"
    grid = adapter.to_grid(x)
    _standardise(adapter.pre, grid)
    inp = adapter.pre(grid)
    target = grid_target(y, dst)
    fit_conv(adapter.body.linear_part(), inp, target, ridge, what)  # type: ignore[operator]
    z = adapter.body(inp)
    _pass_through(adapter.post, z)
    z = adapter.post(z)
    out = adapter.from_grid
    if out.pos_bias is not None:
        residual = target.flatten(2).transpose(1, 2) - z.flatten(2).transpose(1, 2)
        out.pos_bias.copy_(residual.mean(0))
    if out.make_prefix is not None:
        made = out.prefix_input(out.patches(z), prefix(x, src))
        wanted = y[:, : dst.prefix_tokens].flatten(1)
        weight, bias = solve_normal(made.float(), wanted.float(), ridge, f"class token of {what}")
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
    """Initialise ``adapter`` in place from probe activations ``x`` (at ``src``), ``y`` (``dst``).

    Args:
        init: "lstsq" (fit the linear part), "identity" (channel-to-channel), "random" (as built).
        ridge: relative ridge term of the least-squares fits.
    """
    if init not in INIT_MODES:
        raise ConfigError(f"unknown init {init!r}; use one of {INIT_MODES}")
    check_finite(x, f"activations at {src.name!r}")
    check_finite(y, f"activations at {dst.name!r}")
    was_training = adapter.training
    adapter.eval()
    try:
        with torch.no_grad():
            if isinstance(adapter, LinearStitch):
                adapter.load_state_dict(fit_lstsq(x, y, src, dst, ridge=ridge).state_dict())
            elif isinstance(adapter, LowRankStitch):  # its base, as lstsq fits; B := 0
                adapter.fit_base(fit_lstsq(x, y, src, dst, ridge=ridge))
            elif isinstance(adapter, StitchAdapter) and init == "lstsq":
                _lstsq(adapter, x, y, ridge)
            elif isinstance(adapter, StitchAdapter) and init == "identity":
                _identity(adapter)
    finally:
        adapter.train(was_training)
