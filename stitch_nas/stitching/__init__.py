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
from ._kinds import KINDS, STITCHED, network_kind, piece_roles
from ._measure import (
    SAMPLE_IMAGES,
    Measurement,
    config_cka,
    count_correct,
    fit_net_head,
    fragment_macs,
    head_accuracy,
    measure,
    model_macs,
    net_outputs,
    network_macs,
    reproduces,
    sample_correct,
)
from ._proxy import ProbeScore, keep_probe_score, least_squares_version, probe_accuracy
from ._tuned import (
    TRAINED_DIR,
    has_trained_adapters,
    load_tuned,
    save_trained,
    save_tuned,
    trained_bytes,
    trained_tensors,
)

__all__ = [
    "ProbeScore",
    "keep_probe_score",
    "least_squares_version",
    "probe_accuracy",
    "KINDS",
    "STITCHED",
    "network_kind",
    "piece_roles",
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
    "count_correct",
    "fit_head",
    "fit_net_head",
    "fragment_macs",
    "head_accuracy",
    "TRAINED_DIR",
    "has_trained_adapters",
    "load_tuned",
    "save_trained",
    "save_tuned",
    "trained_bytes",
    "trained_tensors",
    "head_from_recipe",
    "head_recipe",
    "register_head",
    "measure",
    "model_macs",
    "net_outputs",
    "network_macs",
    "reproduces",
    "SAMPLE_IMAGES",
    "sample_correct",
]
