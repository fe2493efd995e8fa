"""Turn a StitchConfig into a runnable network: fragments of zoo models joined by fitted stitches.

Stitches are fitted on the probe set, joint by joint: the chain built so far is run on the probe
samples, and its output is mapped onto what the next model expects at its start cut.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from stitch_nas import adapters
from stitch_nas.activations import (
    ActivationRows,
    ChainRows,
    InputRows,
    Rows,
    StitchContext,
    in_order,
)
from stitch_nas.adapters import (
    LinearStitch,
    fit_lstsq_batches,
    fusable_consumer,
    fuse_into_segment,
)
from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.fragments import CutPoint
from stitch_nas.registry import Registry

__all__ = ["NETWORKS", "NetworkBuilder", "Preprocess", "StitchedNet", "build", "joint_networks"]

logger = logging.getLogger(__name__)


class Preprocess(nn.Module):
    """Resize (bilinear) and normalise images in [0, 1] for the first model of a network."""

    mean: torch.Tensor  # buffers, registered in __init__
    std: torch.Tensor

    def __init__(
        self, size: tuple[int, int], mean: tuple[float, ...], std: tuple[float, ...]
    ) -> None:
        super().__init__()
        self.size = tuple(size)
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) != self.size:
            x = nn.functional.interpolate(x, size=self.size, mode="bilinear", align_corners=False)
        return (x - self.mean) / self.std


class StitchedNet(nn.Module):
    """Preprocessing, then fragments and stitches in order.

    ``parts[0]`` is always the first fragment, so ``forward_from(1, act)`` continues from a
    cached activation of the first model at its end cut.
    """

    def __init__(
        self,
        config: StitchConfig,
        preprocess: Preprocess,
        parts: list[nn.Module],
        part_info: list[tuple[tuple[Any, ...], tuple[int, ...]]],
        *,
        cached_prefix: bool = True,
    ) -> None:
        super().__init__()
        self.config = config
        self.preprocess = preprocess
        self.parts = nn.ModuleList(parts)
        #: per part: a key that determines its cost (the fragment it runs, or the shapes of a
        #: stitch) and its per-sample input shape; equal keys have equal MACs (cost tables).
        self.part_info = part_info
        #: whether ``parts[0]`` is the zoo's own first fragment, so that its cached activations
        #: stand for it (False after ``train='all'`` fine-tuned a copy of it)
        self.cached_prefix = cached_prefix
        self.eval()  # a new Module starts in train mode; fragments are frozen zoo modules

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_from(0, self.preprocess(x))

    def forward_from(self, index: int, x: torch.Tensor) -> torch.Tensor:
        for part in self.parts[index:]:
            x = part(x)
        return x

    def new_parts(self) -> nn.Sequential:
        """Everything after the first fragment: what a trial actually has to run."""
        return nn.Sequential(*self.parts[1:])


@dataclass(frozen=True)
class NetworkBuilder:
    """A whole jointly trained network, named by the kind of a config's first adapter.

    The core knows such a network only through these functions, so a plug-in (SN-Net registers
    ``"snnet"``) needs no core module to name it.

    Attributes:
        build: ``(ctx, config) -> StitchedNet``: the network ``config`` names, trained in ``ctx``
            the first time it is needed.
        layer: ``(spec, src, dst) -> nn.Module``: an unfitted stitching layer of the network
            ``spec`` names; an export loads the trained weights into it.
        state: ``(ctx, spec) -> state``: the trained network (trained in ``ctx`` once) as CPU
            tensors that pickle, so that a Ray driver trains it and its workers do not.
        install: ``(ctx, spec, state) -> None``: the network rebuilt in ``ctx`` from ``state``,
            untrained.
        holds: ``(ctx, spec) -> bool``: whether ``ctx`` has that network already.
        searched_by: ``(space, space_options) -> bool``: whether a search of that space samples
            networks of this kind (the Ray executor then trains them on its driver).
    """

    build: Callable[[StitchContext, StitchConfig], StitchedNet]
    layer: Callable[[AdapterSpec, CutPoint, CutPoint], nn.Module]
    state: Callable[[StitchContext, AdapterSpec], Any]
    install: Callable[[StitchContext, AdapterSpec, Any], None]
    holds: Callable[[StitchContext, AdapterSpec], bool]
    searched_by: Callable[[str, Mapping[str, Any]], bool]


#: adapter kinds that name a whole jointly trained network rather than one joint
#: (group ``stitch_nas.networks``)
NETWORKS: Registry[NetworkBuilder] = Registry("network builder", group="stitch_nas.networks")


def joint_networks(config: StitchConfig) -> list[AdapterSpec]:
    """The adapters of ``config`` that name a whole jointly trained network."""
    return [spec for spec in config.adapters if spec.kind in NETWORKS]


#: the probe's output of the network built so far, batch by batch (each call reads it anew)
ProbeBatches = Callable[[], Iterator[torch.Tensor]]


def _fit_adapter(
    ctx: StitchContext,
    spec: AdapterSpec,
    x: ProbeBatches,
    frag: Fragment,
    src: CutPoint,
    dst: CutPoint,
) -> LinearStitch:
    """A least-squares stitch from the probe's chain output ``x`` to ``frag``'s start, both
    read batch by batch: the fit holds its normal equations, never the probe's activations."""
    opts = adapters.resolve_options(spec.kind, dict(spec.options))
    ridge = ctx.ridge if opts["ridge"] is None else opts["ridge"]
    ys = ctx.activation_batches(frag.model, frag.start, "probe")
    return fit_lstsq_batches(zip(x(), ys, strict=True), src, dst, ridge=ridge)


def _through(ctx: StitchContext, module: nn.Module, x: ProbeBatches) -> ProbeBatches:
    """``x`` run on through ``module`` batch by batch, as :meth:`StitchContext.run` runs it
    (recomputed on each read: a chain's probe output at a late joint is not kept whole)."""

    def batches() -> Iterator[torch.Tensor]:
        for batch in x():
            with ctx.frozen():  # not around the yield: the caller's code must not run under it
                out = module(batch)
            yield out.float()

    return batches


def _chain_rows(
    ctx: StitchContext, first: Fragment, parts: list[nn.Module], cached: bool
) -> Callable[[str], Rows]:
    """``split -> rows of the network built so far on that split``, fetched per mini-batch, so
    adapter training never holds a whole split (see :mod:`stitch_nas.activations._rows`)."""

    def rows(split: str) -> Rows:
        if cached:  # the first model's activation, from the cache or recomputed
            source: Rows = ActivationRows(ctx, first.model, first.end, split)
            rest = parts[1:]
        else:
            source, rest = InputRows(ctx, first.model, split), parts
        return ChainRows(source, nn.Sequential(*rest), ctx) if rest else source

    return rows


def _first_piece(seg: nn.Module) -> tuple[torch.fx.GraphModule, list[nn.Module]]:
    """The graph that reads a fragment's input, and the pieces after it."""
    if isinstance(seg, nn.Sequential):
        pieces = list(seg)
        return cast(torch.fx.GraphModule, pieces[0]), pieces[1:]
    return cast(torch.fx.GraphModule, seg), []


def _cut_key(cut: CutPoint) -> tuple[str, tuple[int, ...], int]:
    return (cut.layout, cut.shape, cut.prefix_tokens)


def check_labels(ctx: StitchContext, config: StitchConfig) -> None:
    """A native head only makes sense when the last model predicts the task's labels."""
    if config.head.kind != "native":
        return
    last = config.fragments[-1].model
    labels = tuple(ctx.entry(last).label_names)
    if labels != tuple(ctx.data.label_names):
        raise ConfigError(
            f"model {last!r} predicts labels {labels[:5]}... but the data has "
            f"{tuple(ctx.data.label_names)[:5]}...; use head kind 'knn' or 'linear_probe'"
        )


def build(
    ctx: StitchContext, config: StitchConfig, *, fuse: bool = False, train: bool = True
) -> StitchedNet:
    """Build and fit the network described by ``config``.

    Args:
        ctx: the shared context (zoo, data, memoised activations).
        config: what to build.
        fuse: fold least-squares stitches into the next conv/linear layer where possible
            (also enabled per joint by the adapter option ``fuse=True``).
        train: train the trained adapter kinds (False: built and initialised only, for the
            weights a trial stored to be loaded into them, :func:`~stitch_nas.stitching.
            load_tuned`).
    """
    check_labels(ctx, config)
    if config.adapters and config.adapters[0].kind in NETWORKS:  # e.g. a jointly trained SN-Net
        return NETWORKS.get(config.adapters[0].kind).build(ctx, config)
    first = config.fragments[0]
    spec = ctx.entry(first.model).input_spec
    parts: list[nn.Module] = [ctx.segment(first.model, None, first.end)]
    info: list[tuple[tuple[Any, ...], tuple[int, ...]]] = [
        (("fragment", first.model, None, first.end), ctx.input_shape(first.model)[1:])
    ]
    # the probe's output of the chain so far, batch by batch: the first fragment's cached
    # activation, run on through each joint fitted since (after a trained joint, the rows
    # of the chain it trained, read in order)
    x: ProbeBatches | None = None
    if config.is_stitched:
        x = functools.partial(ctx.activation_batches, first.model, first.end, "probe")
    x_cut = ctx.cut(first.model, first.end) if first.end else None
    # parts[0] is the zoo's own fragment, so its outputs may be read from the cache; a zoo
    # model on its own runs from its inputs instead: the figures every claim compares with
    # must not depend on which cut the cache happens to hold, or on its storage dtype
    cached = config != StitchConfig.single(first.model)
    joints = list(zip(config.adapters, config.fragments[1:], strict=True))
    for i, (adapter, frag) in enumerate(joints):
        if x is None or x_cut is None or frag.start is None:  # StitchConfig rules these out
            raise ConfigError(f"joint {i} of {config.describe()} needs a cut point on both sides")
        dst = ctx.cut(frag.model, frag.start)
        if adapter.kind != "lstsq":  # a trained kind, or one registered by the user
            link = adapters.Joint(
                i,
                x_cut,
                frag.model,
                dst,
                frag.end,
                _chain_rows(ctx, first, parts, cached),
                first,
            )
            fit = adapters.fit_joint(ctx, adapter, link, train_steps=train)
            if fit.prefix is not None:
                parts[0], cached = fit.prefix, False
            key = ("adapter", adapter.kind, adapter.options, _cut_key(x_cut), _cut_key(dst))
            info.append((key, x_cut.shape))
            info.append((("fragment", frag.model, frag.start, frag.end), dst.shape))
            parts.extend([fit.adapter, fit.fragment])
            if i + 1 < len(joints):
                probe = _chain_rows(ctx, first, parts, cached)("probe")
                x = functools.partial(in_order, probe, ctx.batch_size)
                x_cut = _next_cut(ctx, frag)
            continue
        stitch = _fit_adapter(ctx, adapter, x, frag, x_cut, dst)
        seg = ctx.segment(frag.model, frag.start, frag.end)
        stitch_key = ("stitch", type(stitch).__name__, _cut_key(x_cut), _cut_key(dst))
        head, rest = _first_piece(seg)
        if (fuse or adapter.option("fuse", False)) and fusable_consumer(head) is not None:
            fused = fuse_into_segment(stitch, head)
            joint: list[nn.Module] = [nn.Sequential(fused, *rest) if rest else fused]
            info.append((("fused", frag.model, frag.start, frag.end, _cut_key(x_cut)), x_cut.shape))
        else:
            joint = [stitch, seg]
            info.append((stitch_key, x_cut.shape))
            info.append((("fragment", frag.model, frag.start, frag.end), dst.shape))
        parts.extend(joint)
        if i + 1 < len(joints):  # the next joint is fitted on this chain's output
            x, x_cut = _through(ctx, nn.Sequential(*joint), x), _next_cut(ctx, frag)
    preprocess = Preprocess(spec.size, spec.mean, spec.std).to(ctx.device)
    return StitchedNet(config, preprocess, parts, info, cached_prefix=cached)


def _next_cut(ctx: StitchContext, frag: Fragment) -> CutPoint:
    if frag.end is None:  # StitchConfig rules this out
        raise ConfigError(f"fragment {frag} before the last must end at a cut point")
    return ctx.cut(frag.model, frag.end)
