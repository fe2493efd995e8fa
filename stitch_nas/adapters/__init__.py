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

from __future__ import annotations

from typing import TYPE_CHECKING

from stitch_nas.lazy import lazy_face

#: public name -> the module that defines it (the face is lazy: the declared options load
#: without torch, for the settings check)
_HOMES = {
    "StitchAdapter": "._bodies",
    "FusedStitch": "._fuse",
    "fusable_consumer": "._fuse",
    "fuse_into_segment": "._fuse",
    "fit_conv": "._init",
    "initialise": "._init",
    "initialise_batches": "._init",
    "Joint": "._joint",
    "JointFit": "._joint",
    "feature_cut": "._joint",
    "fit_joint": "._joint",
    "resolve_teacher": "._joint",
    "LowRankStitch": "._lowrank",
    "LinearStitch": "._lstsq",
    "fit_lstsq": "._lstsq",
    "fit_lstsq_batches": "._lstsq",
    "joinable": "._lstsq",
    "BUILTIN_KINDS": "._options",
    "CLS_MODES": "._options",
    "INIT_MODES": "._options",
    "KindOptions": "._options",
    "LOSSES": "._options",
    "RESIZE_MODES": "._options",
    "TRAINS": "._options",
    "TRAIN_OPTIONS": "._options",
    "ADAPTERS": "._registry",
    "AdapterKind": "._registry",
    "Option": "._registry",
    "can_join": "._registry",
    "create": "._registry",
    "get_adapter": "._registry",
    "list_adapters": "._registry",
    "refined_adapter": "._options",
    "refined_adapters": "._options",
    "registered_kinds": "._registry",
    "register_adapter": "._registry",
    "resolve_options": "._registry",
    "TrainReport": "._train",
    "cosine_schedule": "._train",
    "only_training": "._train",
    "take_step": "._train",
    "training_loss": "._train",
}

__all__ = [
    "AdapterKind",
    "ADAPTERS",
    "BUILTIN_KINDS",
    "can_join",
    "CLS_MODES",
    "cosine_schedule",
    "create",
    "feature_cut",
    "fit_conv",
    "fit_joint",
    "fit_lstsq",
    "fit_lstsq_batches",
    "fusable_consumer",
    "fuse_into_segment",
    "FusedStitch",
    "get_adapter",
    "INIT_MODES",
    "initialise",
    "initialise_batches",
    "joinable",
    "Joint",
    "JointFit",
    "KindOptions",
    "LinearStitch",
    "list_adapters",
    "refined_adapter",
    "refined_adapters",
    "registered_kinds",
    "LOSSES",
    "LowRankStitch",
    "only_training",
    "Option",
    "register_adapter",
    "RESIZE_MODES",
    "resolve_options",
    "resolve_teacher",
    "StitchAdapter",
    "take_step",
    "TRAIN_OPTIONS",
    "training_loss",
    "TrainReport",
    "TRAINS",
]

if TYPE_CHECKING:  # what static checkers see; at run time __getattr__ imports lazily
    from ._bodies import StitchAdapter
    from ._fuse import FusedStitch, fusable_consumer, fuse_into_segment
    from ._init import fit_conv, initialise, initialise_batches
    from ._joint import Joint, JointFit, feature_cut, fit_joint, resolve_teacher
    from ._lowrank import LowRankStitch
    from ._lstsq import LinearStitch, fit_lstsq, fit_lstsq_batches, joinable
    from ._options import (
        BUILTIN_KINDS,
        CLS_MODES,
        INIT_MODES,
        LOSSES,
        RESIZE_MODES,
        TRAIN_OPTIONS,
        TRAINS,
        KindOptions,
    )
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
    from ._train import TrainReport, cosine_schedule, only_training, take_step, training_loss

__getattr__, __dir__ = lazy_face(__name__, _HOMES)
