"""Fit one joint of a stitched network with a trained adapter kind, on a StitchContext.

The adapter is created from its spec, initialised on the probe split, then trained (when its
``loss`` is not "none") on the ``split`` option's samples: the train split by default, since 128
probe images are too few to train a nonlinear adapter without overfitting, and the train split is
disjoint from the validation and test splits accuracy is measured on. Training reads that split
a mini-batch at a time (:mod:`stitch_nas.activations._rows`): from the activation cache, or
recomputed, never held whole outside the cache's budget. The probe split is the
held-out set for early stopping. ``match`` reads the destination's cached activations;
``task`` needs the destination model to predict the data set's own labels. ``distill`` reads
its teacher's cached logits: the destination's own (label-free: any zoo model's classifier
works), or another zoo model's (``teacher`` a name, or ``"best"``: the highest probe accuracy
among the models predicting the data's labels), and then both models must predict the data's
labels. ``feature`` reads the destination's cached activations at its penultimate layer,
:func:`feature_cut`, and trains through the destination up to there (label-free).

What trains: ``adapter`` (ReStNet); ``suffix`` (adapter and the destination model after the cut,
up to the penultimate layer for ``feature``);
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

from stitch_nas.activations import (
    ActivationRows,
    InputRows,
    Memo,
    Rows,
    StitchContext,
    in_order,
)
from stitch_nas.config import AdapterSpec, Fragment
from stitch_nas.errors import ConfigError
from stitch_nas.fragments import CutPoint, segment

from ._init import initialise_batches
from ._options import TRAIN_OPTIONS
from ._registry import create, resolve_options
from ._train import TrainData, TrainReport, train

__all__ = ["Joint", "JointFit", "feature_cut", "fit_joint", "resolve_teacher"]

#: the zoo model teacher="best" names, chosen once per context
_BEST_TEACHER: Memo[tuple[()], str] = Memo("best teacher")


@dataclass
class Joint:
    """One joint of a network being built: where it comes from and where it goes."""

    index: int  #: position of the joint in the config (0 = after the first fragment)
    src_cut: CutPoint  #: the layout arriving at the joint
    dst_model: str
    dst_cut: CutPoint
    end: str | None  #: end cut of the destination fragment
    #: the chain's output at the joint on a split, whole or as rows fetched per mini-batch
    #: (``activations.Rows``): the train split's for training, the probe's for the rest
    chain_input: Callable[[str], torch.Tensor | Rows]
    first: Fragment  #: the network's first fragment (the prefix that ``train='all'`` trains)


@dataclass
class JointFit:
    """A fitted joint: the adapter, the destination fragment to use and, maybe, a new prefix."""

    adapter: nn.Module
    fragment: nn.Module
    prefix: nn.Module | None = None
    report: TrainReport | None = None


def feature_cut(ctx: StitchContext, model: str) -> CutPoint:
    """Where ``feature`` matches ``model``: its penultimate layer, the last of its cut points.

    Cut points stop before a model's output node, so the last one is the classifier's input:
    the pooled vector (ResNet ``global_pool``, ViT ``head_drop``) or, where the head pools
    itself, the last feature map (ConvNeXt ``norm_pre``).
    """
    return ctx.cuts(model)[-1]


def resolve_teacher(ctx: StitchContext, name: str, dst_model: str) -> str:
    """The zoo model whose logits ``distill`` learns from (``name`` as the option gives it).

    Raises:
        ConfigError: ``name`` is not a zoo model, or (teacher other than the destination) the
            teacher or the destination does not predict the data's labels, or no model does.
    """
    labels = tuple(ctx.data.label_names)
    if name == "destination":
        return dst_model
    if name == "best":
        name = _best(ctx)
    elif name not in ctx.zoo.names():
        raise ConfigError(
            f"teacher={name!r} is not a zoo model; use 'destination', 'best' or one of "
            f"{sorted(ctx.zoo.names())}"
        )
    for model, role in ((name, "teacher"), (dst_model, "destination")):
        if name != dst_model and tuple(ctx.entry(model).label_names) != labels:
            raise ConfigError(
                f"loss='distill' with teacher={name!r}: the {role} {model!r} predicts other "
                "labels than the data's; use teacher='destination' or a model with the data's"
            )
    return name


def _best(ctx: StitchContext) -> str:
    """The zoo model with the best probe accuracy among those predicting the data's labels.

    Probe logits are cached and read by every fit anyway; ties go to the first in zoo order.
    """

    def best() -> str:
        labels, y = tuple(ctx.data.label_names), ctx.labels("probe")
        native = [m for m in ctx.zoo.names() if tuple(ctx.entry(m).label_names) == labels]
        if not native:
            raise ConfigError(
                "teacher='best' but no zoo model predicts the data's labels; "
                "use teacher='destination'"
            )
        accuracy = {
            m: float((ctx.activation(m, None, "probe").argmax(1).cpu() == y).float().mean())
            for m in native
        }
        return max(native, key=lambda m: accuracy[m])

    return _BEST_TEACHER.fetch(ctx, (), best)


def _check(spec: AdapterSpec, opts: dict, joint: Joint, ctx: StitchContext) -> None:
    loss, what = opts["loss"], opts["train"]
    if loss == "none" and what != "adapter":
        raise ConfigError(
            f"adapter {spec.kind!r} has train={what!r} but loss='none' trains nothing; "
            "set loss='match', 'task', 'distill' or 'feature'"
        )
    if loss == "match" and what == "suffix":
        raise ConfigError(
            "train='suffix' with loss='match': the match loss never reaches the suffix; "
            "use loss='task', 'distill' or 'feature', or train='adapter'"
        )
    at_feature = joint.dst_cut.name == feature_cut(ctx, joint.dst_model).name
    if loss == "feature" and what == "suffix" and at_feature:
        raise ConfigError(
            f"train='suffix' with loss='feature' at {joint.dst_model}:{joint.dst_cut.name!r}, "
            "the penultimate layer itself: there is no suffix to train; use train='adapter'"
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
    if loss == "distill":
        resolve_teacher(ctx, str(opts["teacher"]), joint.dst_model)


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


def fit_joint(
    ctx: StitchContext, spec: AdapterSpec, joint: Joint, *, train_steps: bool = True
) -> JointFit:
    """Create, initialise and (per its options) train the adapter ``spec`` at ``joint``.

    ``train_steps=False``: everything but the training steps, so the joint has the structure
    (and the private copies) of a trained one, for trained weights to be loaded into it
    (:func:`stitch_nas.stitching.load_tuned`).
    """
    opts = resolve_options(spec.kind, dict(spec.options))
    if "loss" not in opts:  # a kind registered without TRAIN_OPTIONS: initialised, not trained
        opts = {**{k: option.default for k, option in TRAIN_OPTIONS.items()}, **opts}
        opts["loss"] = "none"
    _check(spec, opts, joint, ctx)
    adapter = create(spec.kind, joint.src_cut, joint.dst_cut, **dict(spec.options))
    adapter = adapter.to(ctx.device)
    ridge = ctx.ridge if opts["ridge"] is None else float(opts["ridge"])
    probe_x = joint.chain_input("probe")
    probe_y = ActivationRows(ctx, joint.dst_model, joint.dst_cut.name, "probe")
    initialise_batches(
        adapter,
        lambda: zip(
            in_order(probe_x, ctx.batch_size), in_order(probe_y, ctx.batch_size), strict=True
        ),
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
    # the loss reads the destination's suffix output: its logits, or its penultimate features
    suffix_end = feature_cut(ctx, dst).name if opts["loss"] == "feature" else None
    has_suffix = opts["loss"] in ("task", "distill") or (
        opts["loss"] == "feature" and suffix_end != cut
    )
    trains_suffix = has_suffix and opts["train"] != "adapter"
    fragment: nn.Module = ctx.segment(dst, cut, joint.end)
    if trains_suffix:  # one private copy of dst: the fragment shares the trained suffix weights
        fragment = _copy_segment(ctx, copies, dst, cut, joint.end, device)
    if has_suffix:
        if trains_suffix:
            suffix = _copy_segment(ctx, copies, dst, cut, suffix_end, device)
            trained.append(suffix)
        elif device != ctx.device:  # never move the zoo's own modules
            suffix = copy.deepcopy(ctx.segment(dst, cut, suffix_end)).to(device)
        else:
            suffix = ctx.segment(dst, cut, suffix_end)
        chain.append(suffix)
    if not train_steps:
        return JointFit(adapter.to(ctx.device), fragment.to(ctx.device), _moved(prefix, ctx))
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


def _moved(module: nn.Module | None, ctx: StitchContext) -> nn.Module | None:
    return None if module is None else module.to(ctx.device)


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
    inputs: torch.Tensor | Rows  # the split's rows, read a mini-batch at a time
    targets: torch.Tensor | Rows
    val_inputs: torch.Tensor | Rows  # the probe's, held out: read a batch at a time too
    val_targets: torch.Tensor | Rows
    if opts["train"] == "all":
        inputs = InputRows(ctx, joint.first.model, split)
        val_inputs = InputRows(ctx, joint.first.model, "probe")
    else:
        inputs, val_inputs = joint.chain_input(split), joint.chain_input("probe")
    loss, dst = opts["loss"], joint.dst_model
    if loss in ("match", "feature"):
        at = feature_cut(ctx, dst).name if loss == "feature" else joint.dst_cut.name
        targets = ActivationRows(ctx, dst, at, split)
        val_targets = ActivationRows(ctx, dst, at, "probe")
    elif loss == "distill":  # cached logits: each teacher runs once per split
        source = resolve_teacher(ctx, str(opts["teacher"]), dst)
        targets = ctx.activation(source, None, split)
        val_targets = ctx.activation(source, None, "probe")
    else:
        targets, val_targets = ctx.labels(split), ctx.labels("probe")
    return TrainData(inputs, targets, val_inputs, val_targets)
