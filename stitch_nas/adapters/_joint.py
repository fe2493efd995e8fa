"""Fit one joint of a stitched network with a trained adapter kind, on a StitchContext.

The adapter is created from its spec, initialised on the probe split, then trained (when its
``loss`` is not "none") on the ``split`` option's samples: the train split by default, since 128
probe images are too few to train a nonlinear adapter without overfitting, and the train split is
disjoint from the validation and test splits accuracy is measured on. The probe split is the
held-out set for early stopping. ``match`` reads the destination's cached activations;
``task`` needs the destination model to predict the data set's own labels.

What trains: ``adapter`` (ReStNet); ``suffix`` (adapter and the destination model after the cut);
``all`` (also the first fragment: SN-Net's full fine-tune). Trained models are deep copies, so
the zoo's shared modules never change; copies run in eval mode (their BatchNorm statistics stay
as trained), only their weights move.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from stitch_nas.activations import StitchContext
from stitch_nas.config import AdapterSpec, Fragment
from stitch_nas.errors import ConfigError
from stitch_nas.fragments import CutPoint, segment

from ._init import initialise
from ._registry import create, resolve_options
from ._train import TrainData, TrainReport, train

__all__ = ["Joint", "JointFit", "fit_joint"]


@dataclass
class Joint:
    """One joint of a network being built: where it comes from and where it goes."""

    index: int  #: position of the joint in the config (0 = after the first fragment)
    src_cut: CutPoint  #: the layout arriving at the joint
    dst_model: str
    dst_cut: CutPoint
    end: str | None  #: end cut of the destination fragment
    probe_x: torch.Tensor  #: the chain's output at the joint on the probe split
    chain_input: Callable[[str], torch.Tensor]  #: the same on any split, computed on demand
    first: Fragment  #: the network's first fragment (the prefix that ``train='all'`` trains)


@dataclass
class JointFit:
    """A fitted joint: the adapter, the destination fragment to use and, maybe, a new prefix."""

    adapter: nn.Module
    fragment: nn.Module
    prefix: nn.Module | None = None
    report: TrainReport | None = None


def _check(spec: AdapterSpec, opts: dict, joint: Joint, ctx: StitchContext) -> None:
    loss, what = opts["loss"], opts["train"]
    if loss == "none" and what != "adapter":
        raise ConfigError(
            f"adapter {spec.kind!r} has train={what!r} but loss='none' trains nothing; "
            "set loss='match' or 'task'"
        )
    if loss == "match" and what == "suffix":
        raise ConfigError(
            "train='suffix' with loss='match': the match loss never reaches the suffix; "
            "use loss='task' or train='adapter'"
        )
    if what == "all" and joint.index > 0:
        raise ConfigError(
            f"train='all' fine-tunes the first fragment, so only the first joint can use it "
            f"(joint {joint.index} asked); use train='suffix' or 'adapter' here"
        )
    if loss == "task":
        labels = tuple(ctx.entry(joint.dst_model).label_names)
        if labels != tuple(ctx.data.label_names):
            raise ConfigError(
                f"loss='task' runs {joint.dst_model!r}'s own classifier, whose labels "
                f"{labels[:3]}... differ from the data's; use loss='match'"
            )


def _copy_segment(
    ctx: StitchContext,
    copies: dict[str, nn.Module],
    model: str,
    start: str | None,
    end: str | None,
    device: torch.device,
) -> nn.Module:
    """A fragment of a private deep copy of ``model`` (one copy per model per joint).

    Laid out as ``ctx.segment`` lays out the zoo's fragments (a chain of per-cut pieces, or one
    graph with ``ctx.pieces`` off), so a trained network has the same state_dict keys.
    """
    if model not in copies:
        copies[model] = copy.deepcopy(ctx.entry(model).model).to(device).eval()
    shape = ctx.input_shape(model)
    if not ctx.pieces:
        return segment(copies[model], start, end, input_shape=shape)
    bounds: list[str | None] = [None, *(c.name for c in ctx.cuts(model)), None]
    first = bounds.index(start) if start is not None else 0
    last = bounds.index(end) if end is not None else len(bounds) - 1
    pieces = [
        segment(copies[model], bounds[k], bounds[k + 1], input_shape=shape)
        for k in range(first, last)
    ]
    return pieces[0] if len(pieces) == 1 else nn.Sequential(*pieces)


def fit_joint(ctx: StitchContext, spec: AdapterSpec, joint: Joint) -> JointFit:
    """Create, initialise and (per its options) train the adapter ``spec`` at ``joint``."""
    opts = resolve_options(spec.kind, dict(spec.options))
    _check(spec, opts, joint, ctx)
    adapter = create(spec.kind, joint.src_cut, joint.dst_cut, **dict(spec.options))
    adapter = adapter.to(ctx.device)
    y = ctx.activation(joint.dst_model, joint.dst_cut.name, "probe")
    ridge = ctx.ridge if opts["ridge"] is None else float(opts["ridge"])
    initialise(
        adapter,
        joint.probe_x,
        y,
        src=joint.src_cut,
        dst=joint.dst_cut,
        init=opts["init"],
        ridge=ridge,
    )
    dst, cut = joint.dst_model, joint.dst_cut.name
    if opts["loss"] == "none":
        return JointFit(adapter, ctx.segment(dst, cut, joint.end))
    device = _device(str(opts["device"]), ctx)
    adapter.to(device)
    copies: dict[str, nn.Module] = {}
    chain: list[nn.Module] = []
    trained: list[nn.Module] = [adapter]
    prefix = None
    if opts["train"] == "all":
        first = joint.first
        prefix = _copy_segment(ctx, copies, first.model, None, first.end, device)
        chain.append(prefix)
        trained.append(prefix)
    chain.append(adapter)
    trains_suffix = opts["loss"] == "task" and opts["train"] != "adapter"
    fragment: nn.Module = ctx.segment(dst, cut, joint.end)
    if trains_suffix:
        fragment = _copy_segment(ctx, copies, dst, cut, joint.end, device)
    if opts["loss"] == "task":
        if trains_suffix:
            suffix = _copy_segment(ctx, copies, dst, cut, None, device)
            trained.append(suffix)
        elif device != ctx.device:  # never move the zoo's own modules
            suffix = copy.deepcopy(ctx.segment(dst, cut, None)).to(device)
        else:
            suffix = ctx.segment(dst, cut, None)
        chain.append(suffix)
    data = _data(ctx, joint, opts)
    params = list({id(p): p for m in trained for p in m.parameters()}.values())
    report = train(
        nn.Sequential(*chain),
        params,
        trained,
        data,
        opts,
        device=device,
        what=f"{spec.kind} {joint.src_cut.name!r} -> {dst}:{cut!r}",
    )
    adapter.to(ctx.device)
    fragment.to(ctx.device)
    if prefix is not None:
        prefix.to(ctx.device)
    return JointFit(adapter, fragment, prefix, report)


def _device(name: str, ctx: StitchContext) -> torch.device:
    """Where training runs: "auto" is CUDA when present, else the context's device."""
    if name == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else ctx.device
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(
            f"adapter option device={name!r} is not a device; use 'auto' or 'cpu'"
        ) from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"adapter option device={name!r} but CUDA is not available; use 'auto'")
    return device


def _data(ctx: StitchContext, joint: Joint, opts: dict) -> TrainData:
    split = str(opts["split"])
    if opts["train"] == "all":
        inputs = ctx.inputs(joint.first.model, split)
        val_inputs = ctx.inputs(joint.first.model, "probe")
    else:
        inputs, val_inputs = joint.chain_input(split), joint.probe_x
    if opts["loss"] == "match":
        targets = ctx.activation(joint.dst_model, joint.dst_cut.name, split)
        val_targets = ctx.activation(joint.dst_model, joint.dst_cut.name, "probe")
    else:
        targets, val_targets = ctx.labels(split), ctx.labels("probe")
    return TrainData(inputs, targets, val_inputs, val_targets)
