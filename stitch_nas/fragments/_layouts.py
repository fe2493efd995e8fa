"""Layouts of the tensor at a cut point: ``nchw`` and ``nhwc`` grids, ``tokens``, ``vector``."""

from __future__ import annotations

import math

from torch import fx, nn

__all__ = ["LAYOUTS", "layout_of", "prefix_tokens"]

LAYOUTS = ("nchw", "nhwc", "tokens", "vector")


def layout_of(model: nn.Module, node: fx.Node, shape: tuple[int, ...]) -> str:
    """The layout of a cut tensor of per-image ``shape``: one of :data:`LAYOUTS`."""
    if len(shape) == 1:
        return "vector"
    if len(shape) == 2:
        return "tokens"
    if shape[1] == shape[2] and shape[0] != shape[1]:
        return "nchw"
    if shape[0] == shape[1] and shape[2] != shape[0]:
        return "nhwc"
    return _layout_from_consumer(model, node)


def _layout_from_consumer(model: nn.Module, node: fx.Node) -> str:
    """Ambiguous shape (C == H == W): the first normalising or weighted layer downstream decides."""
    from timm.layers import LayerNorm2d

    frontier, seen = list(node.users), set[fx.Node]()
    while frontier and len(seen) < 64:
        user = frontier.pop(0)
        if user in seen:
            continue
        seen.add(user)
        if user.op == "call_module":
            consumer = model.get_submodule(str(user.target))
            if isinstance(consumer, (nn.Conv2d, nn.BatchNorm2d, nn.GroupNorm, LayerNorm2d)):
                return "nchw"
            if isinstance(consumer, (nn.LayerNorm, nn.Linear)):
                return "nhwc"
        frontier.extend(user.users)
    return "nchw"


def prefix_tokens(model: nn.Module, shape: tuple[int, ...]) -> int:
    """Tokens in front of a square grid of patch tokens (before the class token is added: 0)."""
    n = shape[0]
    declared = getattr(model, "num_prefix_tokens", None)
    if (
        isinstance(declared, int)
        and 0 <= declared < n
        and math.isqrt(n - declared) ** 2 == n - declared
    ):
        return declared
    return n - math.isqrt(n) ** 2
