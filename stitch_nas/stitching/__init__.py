"""Stitching: turn a :class:`~stitch_nas.config.StitchConfig` into a fitted network
(fragments joined by adapters) and fit its head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stitch_nas.lazy import lazy_face

#: public name -> the module that defines it (a lazy face: light names load without torch)
_HOMES = {
    "NETWORKS": "._build",
    "NetworkBuilder": "._build",
    "Preprocess": "._build",
    "StitchedNet": "._build",
    "build": "._build",
    "joint_networks": "._build",
    "BUILTIN_HEADS": "._head_options",
    "HeadKind": "._heads",
    "KNNHead": "._heads",
    "LinearProbeHead": "._heads",
    "fit_head": "._heads",
    "head_from_recipe": "._heads",
    "head_recipe": "._heads",
    "held_out_correct": "._heads",
    "register_head": "._heads",
    "KINDS": "._kinds",
    "STITCHED": "._kinds",
    "network_kind": "._kinds",
    "piece_roles": "._kinds",
    "config_cka": "._costs",
    "fragment_macs": "._costs",
    "model_macs": "._costs",
    "network_macs": "._costs",
    "LATENCY_BACKENDS": "._latency",
    "LatencyFigure": "._latency",
    "LatencySpec": "._latency",
    "LatencyTable": "._latency",
    "time_network": "._latency",
    "Measurement": "._measure",
    "SAMPLE_IMAGES": "._measure",
    "count_correct": "._measure",
    "fit_net_head": "._measure",
    "head_accuracy": "._measure",
    "measure": "._measure",
    "net_outputs": "._measure",
    "reproduces": "._measure",
    "reproduces_count": "._measure",
    "sample_correct": "._measure",
    "ProbeScore": "._proxy",
    "forget_probe_score": "._proxy",
    "keep_probe_score": "._proxy",
    "least_squares_version": "._proxy",
    "probe_accuracy": "._proxy",
    "TRAINED_DIR": "._tuned",
    "has_trained_adapters": "._tuned",
    "load_tuned": "._tuned",
    "save_trained": "._tuned",
    "save_tuned": "._tuned",
    "trained_bytes": "._tuned",
    "trained_tensors": "._tuned",
}

__all__ = [
    "build",
    "BUILTIN_HEADS",
    "config_cka",
    "count_correct",
    "fit_head",
    "fit_net_head",
    "fragment_macs",
    "has_trained_adapters",
    "head_accuracy",
    "head_from_recipe",
    "head_recipe",
    "held_out_correct",
    "HeadKind",
    "joint_networks",
    "forget_probe_score",
    "keep_probe_score",
    "KINDS",
    "KNNHead",
    "LATENCY_BACKENDS",
    "LatencyFigure",
    "LatencySpec",
    "LatencyTable",
    "least_squares_version",
    "LinearProbeHead",
    "load_tuned",
    "measure",
    "Measurement",
    "model_macs",
    "net_outputs",
    "network_kind",
    "network_macs",
    "NetworkBuilder",
    "NETWORKS",
    "piece_roles",
    "Preprocess",
    "probe_accuracy",
    "ProbeScore",
    "register_head",
    "reproduces",
    "reproduces_count",
    "sample_correct",
    "SAMPLE_IMAGES",
    "save_trained",
    "save_tuned",
    "STITCHED",
    "StitchedNet",
    "trained_bytes",
    "TRAINED_DIR",
    "trained_tensors",
    "time_network",
]

if TYPE_CHECKING:  # what static checkers see; at run time __getattr__ imports lazily
    from ._build import NETWORKS, NetworkBuilder, Preprocess, StitchedNet, build, joint_networks
    from ._costs import config_cka, fragment_macs, model_macs, network_macs
    from ._head_options import BUILTIN_HEADS
    from ._heads import (
        HeadKind,
        KNNHead,
        LinearProbeHead,
        fit_head,
        head_from_recipe,
        head_recipe,
        held_out_correct,
        register_head,
    )
    from ._kinds import KINDS, STITCHED, network_kind, piece_roles
    from ._latency import LATENCY_BACKENDS, LatencyFigure, LatencySpec, LatencyTable, time_network
    from ._measure import (
        SAMPLE_IMAGES,
        Measurement,
        count_correct,
        fit_net_head,
        head_accuracy,
        measure,
        net_outputs,
        reproduces,
        reproduces_count,
        sample_correct,
    )
    from ._proxy import (
        ProbeScore,
        forget_probe_score,
        keep_probe_score,
        least_squares_version,
        probe_accuracy,
    )
    from ._tuned import (
        TRAINED_DIR,
        has_trained_adapters,
        load_tuned,
        save_trained,
        save_tuned,
        trained_bytes,
        trained_tensors,
    )

__getattr__, __dir__ = lazy_face(__name__, _HOMES)
