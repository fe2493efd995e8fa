"""Which modules are blocks: the names given to cut points of a traced model.

A cut point is a node of the traced graph where one tensor carries all the state
(:mod:`stitch_nas.fragments._cuts`). It is kept, and named, when a *block* ends there:

- a module that is a direct child of the model, or a module with children inside an
  ``nn.Sequential`` / ``nn.ModuleList`` (timm's stages and blocks, torchvision's layers);
- a plain layer inside an ``nn.Sequential`` that is itself a block (a VGG-style ``features``
  stack, an all-conv network, a deep stem) unless the next layer of that ``Sequential`` is a
  normalisation or an activation, so a convolution is not cut from its batch norm and ReLU;
- a block whose output is finished by its parent: when a stage adds the skip connection and
  applies the ReLU in its own ``forward`` (``x = relu(block(x) + x)``), the cut after that
  glue carries the block's real output and is named after the block (only when another
  module follows the glue: arithmetic leading straight to the output is no block end).

A user can replace this choice for a model of their own with :func:`declare_blocks` (or a
``stitch_nas_blocks`` class attribute): then exactly the named modules (shell patterns
allowed) end blocks, and each must end where one tensor carries all the state.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence

import torch.fx as fx
from torch import nn

from stitch_nas.errors import ConfigError, UnknownCutError

__all__ = ["BLOCKS_ATTRIBUTE", "BlockNamer", "declare_blocks", "declared_blocks"]

BLOCKS_ATTRIBUTE = "stitch_nas_blocks"
_CONTAINERS = (nn.Sequential, nn.ModuleList)
_NORMS: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
)


def declare_blocks(model: nn.Module, names: Iterable[str]) -> nn.Module:
    """Name the modules whose ends are the cut points of ``model`` (replacing the automatic
    choice) and return ``model``.

    Args:
        model: the model; the names are stored on it as ``model.stitch_nas_blocks``, so
            copies of it keep them.
        names: module paths as in ``model.named_modules()`` (``"features.4"``), or shell
            patterns matched part by part (``"stages.*.blocks.*"``: ``*`` stays within one
            part of the dotted path). A block whose output its parent finishes
            (skip addition, activation) is cut after that glue.

    Raises:
        ConfigError: ``names`` is empty or holds something other than non-empty strings.
    """
    blocks = _check_names(names, f"declare_blocks({type(model).__name__}, ...)")
    object.__setattr__(model, BLOCKS_ATTRIBUTE, blocks)
    return model


def _check_names(names: object, what: str) -> tuple[str, ...]:
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise ConfigError(f"{what}: blocks must be a list of module names, got {names!r}")
    blocks = tuple(names)
    if not blocks or not all(isinstance(n, str) and n for n in blocks):
        raise ConfigError(
            f"{what}: blocks must be a non-empty list of module names, got {list(blocks)!r}"
        )
    return blocks


def declared_blocks(model: nn.Module) -> tuple[str, ...] | None:
    """The block names declared for ``model`` (instance or class attribute), if any."""
    declared = getattr(model, BLOCKS_ATTRIBUTE, None)
    if declared is None:
        return None
    return _check_names(declared, f"{type(model).__name__}.{BLOCKS_ATTRIBUTE}")


def _is_norm_or_activation(module: nn.Module) -> bool:
    if isinstance(module, _NORMS):
        return True
    if isinstance(module, nn.MultiheadAttention):  # lives in torch.nn.modules.activation
        return False
    # torch's activations and timm's (timm.layers.activations, activations_me)
    return "activation" in type(module).__module__.rpartition(".")[2]


def _glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _matches(path: str, pattern: str) -> bool:
    """Shell-style match of module paths, part by part: ``*`` does not cross a dot, so
    ``stages.*`` names the stages and not the layers inside them."""
    parts, wanted = path.split("."), pattern.split(".")
    return len(parts) == len(wanted) and all(map(fnmatch.fnmatchcase, parts, wanted))


class BlockNamer:
    """Names the cut points of one traced model (see the module docstring).

    Args:
        model: the traced model.
        nodes: the nodes of its graph, in order.
    """

    def __init__(self, model: nn.Module, nodes: Sequence[fx.Node]) -> None:
        self.model = model
        self.modules = dict(model.named_modules())
        self.declared = declared_blocks(model)
        self._nodes = list(nodes)
        stacks = [self._stack(n) for n in nodes]
        self._ended: list[list[str]] = []
        self._glue: list[list[str]] = []
        pending: list[str] = []
        for i, stack in enumerate(stacks):
            following = set(stacks[i + 1]) if i + 1 < len(stacks) else set()
            ended = [p for p in reversed(stack) if p not in following and p in self.modules]
            # a node that only runs in ancestors of an ended module (the parent's skip add,
            # its activation) still belongs to that module's output
            inside = set(stack)
            pending = [p for p in pending if inside <= self._ancestors(p)]
            self._ended.append(ended)
            self._glue.append(list(pending))
            if ended:
                pending = ended

    @staticmethod
    def _stack(node: fx.Node) -> list[str]:
        stack = list(node.meta.get("nn_module_stack", {}).keys())
        if node.op == "call_module" and str(node.target) not in stack:
            stack.append(str(node.target))
        return stack

    @staticmethod
    def _ancestors(path: str) -> set[str]:
        parts = path.split(".")
        return {".".join(parts[:k]) for k in range(1, len(parts))}

    def is_block(self, path: str) -> bool:
        """Whether the module at ``path`` ends a block."""
        if self.declared is not None:
            return any(_matches(path, p) for p in self.declared)
        parent_path, _, child = path.rpartition(".")
        if parent_path == "":
            return True
        module, parent = self.modules[path], self.modules.get(parent_path)
        if any(True for _ in module.children()):
            return isinstance(parent, _CONTAINERS)
        if not isinstance(parent, nn.Sequential) or not self.is_block(parent_path):
            return False  # layers of helper Sequentials nested inside a block stay whole
        names = [name for name, _ in parent.named_children()]
        index = names.index(child) if child in names else len(names) - 1
        # the last layer's boundary is the Sequential's own end, named by the Sequential
        return index + 1 < len(names) and not _is_norm_or_activation(parent[index + 1])

    def name(self, index: int) -> tuple[str | None, bool]:
        """(block name, whether it ends by its parent's glue) for the node at ``index``."""
        for path in self._ended[index]:
            if self.is_block(path):
                return path, False
        for path in self._glue[index]:
            if self.is_block(path) and self._glue_leads_on(index, path):
                return path, True
        return None, False

    def _glue_leads_on(self, index: int, path: str) -> bool:
        """Whether the parent's glue after ``path`` is followed by another module (a cut that
        leads only into the output's arithmetic, like averaging two heads, is no block end)."""
        end = index
        while end < len(self._glue) and path in self._glue[end]:
            end += 1
        return end < len(self._glue) and self._nodes[end].op != "output"

    def check_found(self, found: Iterable[str]) -> None:
        """Every declared name must have given a cut point (a one-line error otherwise)."""
        if self.declared is None:
            return
        found = set(found)
        cls = type(self.model).__name__
        for pattern in self.declared:
            if _glob(pattern):
                if not any(_matches(n, pattern) for n in found):
                    raise UnknownCutError(
                        f"declared blocks pattern {pattern!r} of {cls} matches no module that "
                        "ends where one tensor carries all the state; check the module names"
                    )
            elif pattern not in self.modules:
                close = ", ".join(n for n in list(self.modules)[1:6])
                raise UnknownCutError(
                    f"declared block {pattern!r} is not a module of {cls} (modules: {close}, "
                    "...); use names from model.named_modules()"
                )
            elif pattern not in found:
                raise UnknownCutError(
                    f"declared block {pattern!r} of {cls} does not end where one tensor "
                    "carries all the state (a skip connection crosses it); declare the module "
                    "that contains the skip instead"
                )
