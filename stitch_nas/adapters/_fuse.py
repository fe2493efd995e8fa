"""Fusing a least-squares stitch into the layer after it: ``W' = W A``, one layer fewer.

Where the first layer after the destination cut is a conv or linear layer that alone consumes
the cut, the affine map ``y = A x + b`` of a :class:`~stitch_nas.adapters._lstsq.LinearStitch`
can be folded into that layer's weights, removing the stitch as a separate layer. Fusion saves
MACs when the source cut has fewer channels than the destination cut; otherwise the widened
layer costs more than the separate 1x1 map (the cost tables count either exactly).
"""

from __future__ import annotations

from typing import cast

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from stitch_nas.errors import LayoutError, TraceError

from ._lstsq import LinearStitch

__all__ = ["FusedStitch", "fusable_consumer", "fuse_into_segment"]


class FusedStitch(nn.Module):
    """A LinearStitch folded into the conv/linear layer that consumes the destination cut."""

    def __init__(self, stitch: LinearStitch, consumer: nn.Module) -> None:
        super().__init__()
        self.align = stitch.align
        a, b = stitch.weight.detach(), stitch.bias.detach()
        if isinstance(consumer, nn.Linear):
            self.layer: nn.Module = nn.Linear(a.shape[1], consumer.out_features)
            with torch.no_grad():
                self.layer.weight.copy_(consumer.weight @ a)
                extra = consumer.weight @ b
                base = consumer.bias if consumer.bias is not None else 0.0
                self.layer.bias.copy_(base + extra)
            bias_map = None
        elif isinstance(consumer, nn.Conv2d):
            self.layer, bias_map = _fused_conv(consumer, a, b, stitch.align.dst_size())
        else:  # fusable_consumer admits only these two
            raise LayoutError(f"cannot fuse a stitch into {type(consumer).__name__}")
        self.register_buffer("bias_map", bias_map)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        aligned = self.align(x)
        if isinstance(self.layer, nn.Linear):
            return self.layer(aligned)
        out = self.layer(aligned.permute(0, 3, 1, 2))
        return out if self.bias_map is None else out + self.bias_map


def _fused_conv(
    conv: nn.Conv2d, a: torch.Tensor, b: torch.Tensor, spatial: tuple[int, int]
) -> tuple[nn.Conv2d, torch.Tensor | None]:
    """``conv(A x + b) = conv'(x) + conv(b)``; conv(b) is position-dependent under zero padding."""
    # torch types the size attributes of every _ConvNd as tuple[int, ...]; a Conv2d's are pairs
    pair = tuple[int, int]
    fused = nn.Conv2d(
        a.shape[1],
        conv.out_channels,
        cast(pair, conv.kernel_size),
        cast(pair, conv.stride),
        cast("str | tuple[int, int]", conv.padding),
        cast(pair, conv.dilation),
        bias=True,
    ).to(a.device)
    # torch types Conv2d.bias as Optional; built with bias=True it is always a parameter
    fused_bias = cast(nn.Parameter, fused.bias)
    with torch.no_grad():
        fused.weight.copy_(torch.einsum("ojmn,jk->okmn", conv.weight, a))
        constant = b.view(1, -1, 1, 1).expand(1, -1, *spatial)
        bias_map = F.conv2d(
            constant, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation
        )[0]
    flat = bias_map.flatten(1)
    if torch.allclose(flat, flat[:, :1].expand_as(flat), atol=1e-6, rtol=1e-5):
        with torch.no_grad():
            fused_bias.copy_(flat[:, 0])
        return fused, None
    with torch.no_grad():
        fused_bias.zero_()
    return fused, bias_map


def fusable_consumer(segment: fx.GraphModule) -> fx.Node | None:
    """The conv/linear node that alone consumes the segment's input, if there is one."""
    placeholder = next(n for n in segment.graph.nodes if n.op == "placeholder")
    users = list(placeholder.users)
    if len(users) != 1 or users[0].op != "call_module" or users[0].args[:1] != (placeholder,):
        return None
    layer = segment.get_submodule(str(users[0].target))
    if isinstance(layer, nn.Linear):
        return users[0]
    if isinstance(layer, nn.Conv2d) and layer.groups == 1 and layer.padding_mode == "zeros":
        return users[0]
    return None


def fuse_into_segment(stitch: LinearStitch, segment: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``segment`` whose first layer absorbs ``stitch`` (the original is untouched).

    Raises:
        LayoutError: the segment does not start with a lone conv/linear layer.
    """
    consumer = fusable_consumer(segment)
    if consumer is None:
        raise LayoutError(
            "the destination fragment does not start with a single conv/linear layer that alone "
            "reads the cut, so the stitch cannot be fused; use fuse=False"
        )
    fused = FusedStitch(stitch, segment.get_submodule(str(consumer.target)))
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in segment.graph.nodes:
        if node is consumer:
            source = node.args[0]
            if not isinstance(source, fx.Node):  # fusable_consumer checked it is the input
                raise TraceError(f"the first argument of {node.name!r} is not a graph node")
            env[node] = graph.call_module("stitch_fused", (env[source],))
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    root = nn.Module()
    for name, module in segment.named_children():
        root.add_module(name, module)
    for name, value in segment.__dict__.get("_parameters", {}).items():
        root.register_parameter(name, value)
    for name, value in segment.__dict__.get("_buffers", {}).items():
        root.register_buffer(name, value)
    root.add_module("stitch_fused", fused)
    return fx.GraphModule(root, graph, class_name="FusedSegment")
