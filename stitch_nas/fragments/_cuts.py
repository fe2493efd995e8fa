"""Cut points and fragments of any torch.fx-traceable model.

A model is traced once with torch.fx (timm's non-traceable modules and functions stay leaves).
A *cut point* is a node of that graph where one tensor carries all the state: every value
computed before it, other than constants derived from parameters, is dead after it. Among those
we keep the ends of blocks (:mod:`stitch_nas.fragments._blocks`: children of the model, modules
in ``Sequential``/``ModuleList`` containers, layer boundaries in plain ``Sequential`` stacks, or
the modules a user declares). Nothing here is written per architecture.

``segment(model, start, end)`` builds a ``GraphModule`` that runs the model from one cut to
another. Segments share the model's parameters (no copies), so the prefix of A, then the suffix
of A, computes exactly A.
"""

from __future__ import annotations

import inspect
import logging
import math
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from stitch_nas.errors import ConfigError, TraceError, UnknownCutError

from ._blocks import BlockNamer, declared_blocks
from ._layouts import layout_of, prefix_tokens

__all__ = [
    "CutPoint",
    "cut_points",
    "default_input_shape",
    "get_cut",
    "split",
    "segment",
]

logger = logging.getLogger(__name__)

_IDENTITY_LIKE = (nn.Identity, nn.Dropout, nn.Dropout2d, nn.Dropout1d)


@dataclass(frozen=True)
class CutPoint:
    """A place between two blocks of a model where one tensor carries all the state.

    Attributes:
        name: the module path of the block that ends here (``"layer2.1"``, ``"blocks.3"``).
        index: position among the model's cut points, 0 = shallowest.
        layout: one of ``"nchw"``, ``"nhwc"``, ``"tokens"``, ``"vector"``.
        shape: the per-sample shape of the tensor at this cut (batch dimension dropped).
        prefix_tokens: class/register tokens in front of the patch tokens (token layout only).
        depth: relative depth in [0, 1] by position in the graph.
    """

    name: str
    index: int
    layout: str
    shape: tuple[int, ...]
    prefix_tokens: int = 0
    depth: float = 0.0

    @property
    def channels(self) -> int:
        return self.shape[-1] if self.layout in ("nhwc", "tokens", "vector") else self.shape[0]

    @property
    def spatial(self) -> tuple[int, int] | None:
        if self.layout == "nchw":
            return (self.shape[1], self.shape[2])
        if self.layout == "nhwc":
            return (self.shape[0], self.shape[1])
        if self.layout == "tokens":
            side = math.isqrt(self.shape[0] - self.prefix_tokens)
            return (side, side)
        return None

    @property
    def join_layout(self) -> str:
        """The layout adapters join this cut as: a grid of one position (a pooled ``C x 1 x 1``
        output, or a map strided down to 1x1) is a vector in disguise, so it is joined as one:
        a grid entering it is averaged over its positions (not resized to its centre pixels),
        a vector may enter it, and it spreads over no grid. ``layout`` stays the tensor's own.
        """
        if self.layout in ("nchw", "nhwc") and self.spatial == (1, 1):
            return "vector"
        return self.layout


class _LeafTracer(fx.Tracer):
    """fx tracer that keeps timm's registered non-traceable modules and functions as leaves."""

    def __init__(self) -> None:
        from timm.models._features_fx import get_notrace_functions, get_notrace_modules

        super().__init__(autowrap_functions=tuple(get_notrace_functions()))
        self._leaves = tuple(get_notrace_modules())

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, self._leaves):
            return True
        return super().is_leaf_module(m, module_qualified_name)


class _Traced:
    """The traced graph of one model with its cut points (computed once per model)."""

    def __init__(self, model: nn.Module, input_shape: tuple[int, ...]) -> None:
        self.graph = _trace(model)
        self.nodes = list(self.graph.nodes)
        self.position = {n: i for i, n in enumerate(self.nodes)}
        self.constant = _constant_nodes(self.nodes)
        self.input = next(n for n in self.nodes if n.op == "placeholder")
        self.output = next(n for n in self.nodes if n.op == "output")
        found = _find_cuts(model, self, input_shape)
        self.cuts = [cut for cut, _ in found]
        self.by_name = {cut.name: cut for cut in self.cuts}
        self.node_of = {cut.name: node for cut, node in found}


_TraceKey = tuple[tuple[int, ...], tuple[str, ...] | None]
_CACHE: weakref.WeakKeyDictionary[nn.Module, dict[_TraceKey, _Traced]] = weakref.WeakKeyDictionary()


def _traced(model: nn.Module, input_shape: tuple[int, ...] | None) -> _Traced:
    shape = _input_shape(model, input_shape)
    per_model = _CACHE.setdefault(model, {})
    key = (shape, declared_blocks(model))  # declaring other blocks later traces anew
    if key not in per_model:
        per_model[key] = _Traced(model, shape)
    return per_model[key]


def _input_shape(model: nn.Module, input_shape: tuple[int, ...] | None) -> tuple[int, ...]:
    if input_shape is not None:
        shape = tuple(input_shape)
        if len(shape) < 2 or not all(type(s) is int and s > 0 for s in shape):
            raise ConfigError(
                f"input_shape={input_shape!r} is invalid; pass positive ints with the batch "
                "first, e.g. (1, 3, 32, 32)"
            )
        return shape
    return default_input_shape(model)


def default_input_shape(model: nn.Module) -> tuple[int, ...]:
    """(1, C, H, W) from a timm model's ``pretrained_cfg``.

    Raises:
        ConfigError: the model does not say its input size (any non-timm module): guessing
            would put every cut at the wrong resolution, so pass ``input_shape``.
    """
    cfg = getattr(model, "pretrained_cfg", None)
    size = cfg.get("input_size") if isinstance(cfg, dict) else None
    if not size:
        raise ConfigError(
            f"the input size of {type(model).__name__} cannot be known (it has no timm "
            "pretrained_cfg); pass input_shape=(1, 3, height, width)"
        )
    return (1, *(int(s) for s in size))


def _trace(model: nn.Module) -> fx.Graph:
    was_training = model.training
    model.eval()
    try:
        params = list(inspect.signature(model.forward).parameters.values())[1:]
        concrete = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
        graph = _LeafTracer().trace(model, concrete_args=concrete or None)
    except Exception as exc:  # fx raises many types; all mean the same to the user
        raise TraceError(
            f"torch.fx could not trace {type(model).__name__}: {exc}. Register the offending "
            "module with timm.models.register_notrace_module so it stays a leaf."
        ) from exc
    finally:
        model.train(was_training)
    for node in list(graph.nodes):  # shape checks only; they would pin values across cuts
        if node.op == "call_function" and node.target is torch._assert and not node.users:
            graph.erase_node(node)
    return graph


def _constant_nodes(nodes: list[fx.Node]) -> set[fx.Node]:
    """Nodes computed from parameters and buffers only: copied into any segment that needs them."""
    constant: set[fx.Node] = set()
    for node in nodes:
        if node.op == "get_attr":
            constant.add(node)
        elif node.op in ("call_function", "call_method") and node.all_input_nodes:
            if all(arg in constant for arg in node.all_input_nodes):
                constant.add(node)
    return constant


def _single_state_nodes(traced: _Traced) -> list[fx.Node]:
    """Nodes after which no earlier non-constant value is still needed."""
    position = traced.position
    found, open_until = [], -1  # furthest use of any earlier state value
    for i, node in enumerate(traced.nodes):
        if node.op == "output":
            break
        if node in traced.constant:
            continue
        if open_until <= i and node.op != "placeholder":
            found.append(node)
        open_until = max([open_until, *(position[u] for u in node.users)])
    return found


def _find_cuts(
    model: nn.Module, traced: _Traced, input_shape: tuple[int, ...]
) -> list[tuple[CutPoint, fx.Node]]:
    shapes = _propagate_shapes(model, traced, input_shape)
    namer = BlockNamer(model, traced.nodes)
    named: list[tuple[str, fx.Node]] = []
    direct: set[str] = set()  # blocks cut at their own last node
    final = traced.output.args[0]
    for node in _single_state_nodes(traced):
        name, glue = namer.name(traced.position[node])
        shape = shapes.get(node)
        if name is None or node is final or shape is None or len(shape) not in (2, 3, 4):
            continue
        if glue and name in direct:
            continue  # already cut where it ends; its parent's glue adds no new cut
        if glue and named and named[-1][0] == name:
            if shapes.get(named[-1][1]) != shape:
                continue  # pooling or flattening after the block is no longer its output
            named.pop()  # the parent's glue goes on (skip add, then ReLU): cut after the last
        elif named and _is_identity_of(model, node, named[-1][1]):
            named.pop()  # same tensor as the previous cut: keep the later name only
        named.append((name, node))
        if not glue:
            direct.add(name)
    namer.check_found(name for name, _ in named)
    found = []
    total = max(len(traced.nodes) - 1, 1)
    for index, (name, node) in enumerate(named):
        shape = shapes[node][1:]
        layout = layout_of(model, node, shape)
        prefix = prefix_tokens(model, shape) if layout == "tokens" else 0
        depth = traced.position[node] / total
        found.append((CutPoint(name, index, layout, tuple(shape), prefix, round(depth, 4)), node))
    return found


def _is_identity_of(model: nn.Module, node: fx.Node, previous: fx.Node) -> bool:
    if node.op != "call_module" or node.args[:1] != (previous,):
        return False
    return isinstance(model.get_submodule(str(node.target)), _IDENTITY_LIKE)


def _propagate_shapes(
    model: nn.Module, traced: _Traced, input_shape: tuple[int, ...]
) -> dict[fx.Node, tuple[int, ...]]:
    """Run the traced graph once on a batch of 2 and record each tensor node's shape."""
    shapes: dict[fx.Node, tuple[int, ...]] = {}
    gm = fx.GraphModule(model, traced.graph)

    class _Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            result = super().run_node(n)
            if isinstance(result, torch.Tensor) and result.is_floating_point():
                shapes[n] = tuple(result.shape)
            return result

    was_training = model.training
    model.eval()
    try:
        device = next(iter(model.parameters()), torch.empty(0)).device
        x = torch.zeros((2, *input_shape[1:]), device=device)
        with torch.no_grad():
            _Recorder(gm).run(x)
    except Exception as exc:
        raise TraceError(
            f"running the traced {type(model).__name__} on input shape {tuple(input_shape)} "
            f"failed: {exc}. Pass the model's real input_shape."
        ) from exc
    finally:
        model.train(was_training)
    return shapes


def cut_points(model: nn.Module, *, input_shape: tuple[int, ...] | None = None) -> list[CutPoint]:
    """All cut points of ``model``, shallowest first.

    Args:
        model: any module torch.fx can trace with timm's leaf modules.
        input_shape: full input shape used to read tensor shapes at each cut; defaults to the
            timm ``pretrained_cfg`` input size. Required for any other module (its cuts would
            be at the wrong resolution otherwise); a :class:`~stitch_nas.zoo.ZooEntry` gives
            it as ``(1, 3, *entry.input_spec.size)``.

    Raises:
        ConfigError: no ``input_shape`` for a module that does not declare its input size.
        TraceError: torch.fx cannot trace the model or it fails on ``input_shape``.
        UnknownCutError: a declared block (:func:`declare_blocks`) gives no cut point.
    """
    return list(_traced(model, input_shape).cuts)


def get_cut(
    model: nn.Module, cut: CutPoint | str, *, input_shape: tuple[int, ...] | None = None
) -> CutPoint:
    """Look a cut point up by name (or check that a given CutPoint belongs to ``model``)."""
    traced = _traced(model, input_shape)
    name = cut.name if isinstance(cut, CutPoint) else cut
    if name not in traced.by_name:
        known = ", ".join(traced.by_name) or "(none)"
        raise UnknownCutError(
            f"unknown cut point {name!r} for {type(model).__name__}; valid cuts: {known}"
        )
    return traced.by_name[name]


def segment(
    model: nn.Module,
    start: CutPoint | str | None,
    end: CutPoint | str | None,
    *,
    input_shape: tuple[int, ...] | None = None,
) -> fx.GraphModule:
    """The part of ``model`` from cut ``start`` (None: the input) to cut ``end`` (None: output).

    The returned GraphModule shares the model's parameters.
    """
    traced = _traced(model, input_shape)
    first = traced.node_of[get_cut(model, start, input_shape=input_shape).name] if start else None
    last = traced.node_of[get_cut(model, end, input_shape=input_shape).name] if end else None
    lo = traced.position[first] if first is not None else traced.position[traced.input]
    hi = traced.position[last] if last is not None else traced.position[traced.output]
    if hi <= lo:
        raise UnknownCutError(
            f"cut {end if isinstance(end, str) else getattr(end, 'name', end)!r} does not come "
            f"after {start if isinstance(start, str) else getattr(start, 'name', start)!r} "
            f"in {type(model).__name__}; pick an end cut deeper than the start cut"
        )
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    env[first if first is not None else traced.input] = graph.placeholder("x")

    def lookup(n: fx.Node) -> fx.Node:
        if n not in env:  # only constants can be missing: copy them on demand
            env[n] = graph.node_copy(n, lookup)
        return env[n]

    for node in traced.nodes[lo + 1 : hi + 1]:
        if node.op == "output":
            graph.output(fx.map_arg(node.args[0], lookup))
        elif node.op != "placeholder" and node not in traced.constant:
            env[node] = graph.node_copy(node, lookup)
    if last is not None:
        graph.output(env[last])
    graph.lint()
    return fx.GraphModule(model, graph, class_name=f"{type(model).__name__}Segment")


def split(
    model: nn.Module, cut: CutPoint | str, *, input_shape: tuple[int, ...] | None = None
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Split ``model`` at ``cut`` into (head, tail) with ``tail(head(x)) == model(x)``."""
    return (
        segment(model, None, cut, input_shape=input_shape),
        segment(model, cut, None, input_shape=input_shape),
    )
