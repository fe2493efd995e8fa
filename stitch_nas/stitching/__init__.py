"""Stitching: turn a :class:`~stitch_nas.config.StitchConfig` into a fitted network
(fragments joined by adapters) and fit its head.
"""

from ._build import (
    NETWORKS,
    NetworkBuilder,
    Preprocess,
    StitchedNet,
    build,
)
from ._heads import (
    HeadKind,
    KNNHead,
    LinearProbeHead,
    fit_head,
    head_from_recipe,
    head_recipe,
    register_head,
)
from ._measure import (
    Measurement,
    config_cka,
    fit_net_head,
    fragment_macs,
    head_accuracy,
    measure,
    model_macs,
    net_outputs,
    network_macs,
)

__all__ = [
    "HeadKind",
    "KNNHead",
    "LinearProbeHead",
    "Measurement",
    "NETWORKS",
    "NetworkBuilder",
    "Preprocess",
    "StitchedNet",
    "build",
    "config_cka",
    "fit_head",
    "fit_net_head",
    "fragment_macs",
    "head_accuracy",
    "head_from_recipe",
    "head_recipe",
    "register_head",
    "measure",
    "model_macs",
    "net_outputs",
    "network_macs",
]
