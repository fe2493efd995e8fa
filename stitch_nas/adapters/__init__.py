"""Adapters: the layers that join a fragment's output to the next fragment's input.

One registry holds every kind: ``lstsq`` (closed form, fusable into the next layer) and the
trained kinds of Traft & Cheney (``linear``, ``linear_relu``, ``conv3x3``, ``bottleneck``,
``transformer_block``), each between norm layers, with spatial rescaling and layout conversion
between CNN (NCHW), Swin (NHWC) and ViT (tokens) cut points, and ``lowrank`` (SN-Netv2: the
frozen least-squares map plus a trained low-rank update). Register your own kind with
:func:`register_adapter`; list them with :func:`list_adapters` and build one with
:func:`create`. Fitting (:func:`initialise`) and training (:func:`fit_joint`) change weight
values only: ``create`` with the same arguments always gives the same ``state_dict`` layout.
"""

from . import _bodies as _bodies  # registers the trained kinds
from . import _closed_form as _closed_form  # registers "lstsq"
from . import _lowrank as _lowrank  # registers "lowrank"
from ._bodies import StitchAdapter
from ._convert import CLS_MODES, RESIZE_MODES
from ._fuse import FusedStitch, fusable_consumer, fuse_into_segment
from ._init import INIT_MODES, fit_conv, initialise
from ._joint import Joint, JointFit, feature_cut, fit_joint, resolve_teacher
from ._lowrank import LowRankStitch
from ._lstsq import LinearStitch, fit_lstsq, fit_lstsq_batches, joinable
from ._registry import (
    ADAPTERS,
    AdapterKind,
    Option,
    can_join,
    create,
    get_adapter,
    list_adapters,
    register_adapter,
    resolve_options,
)
from ._train import (
    LOSSES,
    TRAIN_OPTIONS,
    TRAINS,
    TrainReport,
    cosine_schedule,
    only_training,
    take_step,
    training_loss,
)

__all__ = [
    "ADAPTERS",
    "FusedStitch",
    "LinearStitch",
    "LowRankStitch",
    "can_join",
    "fit_lstsq",
    "fit_lstsq_batches",
    "fusable_consumer",
    "fuse_into_segment",
    "joinable",
    "AdapterKind",
    "CLS_MODES",
    "INIT_MODES",
    "Joint",
    "JointFit",
    "LOSSES",
    "Option",
    "RESIZE_MODES",
    "StitchAdapter",
    "TRAIN_OPTIONS",
    "TRAINS",
    "TrainReport",
    "cosine_schedule",
    "create",
    "feature_cut",
    "fit_conv",
    "fit_joint",
    "get_adapter",
    "initialise",
    "list_adapters",
    "only_training",
    "register_adapter",
    "resolve_options",
    "resolve_teacher",
    "take_step",
    "training_loss",
]
