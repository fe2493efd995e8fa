"""The objectives stitch_nas ships: accuracy, MACs, parameters, CKA score, latency."""

from __future__ import annotations

from ._base import Objective, register_objective

ACCURACY = register_objective(
    Objective(
        "accuracy", "maximize", lambda m: m.accuracy, doc="top-1 accuracy on the validation split"
    )
)
MACS = register_objective(
    Objective(
        "macs",
        "minimize",
        lambda m: float(m.macs),
        doc="multiply-accumulates per image, fvcore convention, attention included",
    )
)
PARAMS = register_objective(
    Objective(
        "params",
        "minimize",
        lambda m: float(m.params),
        doc="parameters the network uses, shared ones once",
    )
)
CKA = register_objective(
    Objective(
        "cka",
        "maximize",
        lambda m: m.cka,
        doc="product of linear CKA over the joints, on the probe set",
    )
)
LATENCY = register_objective(
    Objective(
        "latency",
        "minimize",
        lambda m: float("nan") if m.latency_ms is None else m.latency_ms,
        needs_latency=True,
        doc="median batch-1 forward time in ms on this machine",
    )
)
