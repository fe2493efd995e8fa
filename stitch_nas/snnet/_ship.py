"""A trained SN-Net as plain tensors, so one process trains it and others load it.

Joint training is the costly part of an ``snnet`` search with ``joint`` (minutes on a real zoo).
Ray workers each hold their own context; without this, every worker would train the same
(seeded) SN-Net itself. The driver trains it once, :func:`snnet_state` turns it into CPU
tensors for the object store, and each worker rebuilds the same SN-Net from its own zoo with
:func:`install_snnet`: the stitching layers are created as training created them (same
shapes, same order), then their weights, and with ``train="all"`` the fine-tuned anchors'
weights, are loaded strictly, so a mismatch fails loudly instead of measuring other weights.
"""

from __future__ import annotations

from typing import Any

import torch

from stitch_nas.activations import StitchContext
from stitch_nas.config import AdapterSpec

from ._joint import SNNETS, JointReport, JointSNNet, joint_stitches, memo_key, train_snnet

__all__ = ["has_snnet", "install_snnet", "snnet_state", "trained_snnet"]


def has_snnet(ctx: StitchContext, spec: AdapterSpec) -> bool:
    """Whether ``ctx`` already holds the SN-Net ``spec`` names (trained or installed)."""
    return SNNETS.get(ctx, memo_key(spec)[0]) is not None


def trained_snnet(ctx: StitchContext, spec: AdapterSpec) -> JointSNNet:
    """The SN-Net ``spec`` names, trained on ``ctx`` (once per context)."""
    return train_snnet(ctx, **dict(spec.options))


def _cpu(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def snnet_state(sn: JointSNNet) -> dict[str, Any]:
    """``sn``'s trained weights and training report, on the CPU, in a picklable dict."""
    return {
        "layers": [_cpu(layer.state_dict()) for layer in sn.layers.values()],
        "anchors": {m: _cpu(c.model.state_dict()) for m, c in sn.chains.items()}
        if sn.fine_tuned
        else {},
        "report": None if sn.report is None else sn.report.to_dict(),
    }


def install_snnet(ctx: StitchContext, spec: AdapterSpec, state: dict[str, Any]) -> JointSNNet:
    """Rebuild on ``ctx`` the SN-Net ``spec`` names with the weights in ``state``, untrained.

    The result is memoised where :func:`train_snnet` would put it, so the search's networks
    of that SN-Net use these weights and nothing trains again.

    Raises:
        ValueError: ``state`` does not match the SN-Net ``spec`` builds on ``ctx``.
    """
    key, spec = memo_key(spec)
    held = SNNETS.get(ctx, key)
    if held is not None:
        return held
    sn = JointSNNet(ctx, spec, joint_stitches(ctx, spec))
    layers = list(sn.layers.values())
    if len(layers) != len(state["layers"]) or set(state["anchors"]) - set(sn.chains):
        raise ValueError(
            f"the shipped SN-Net has {len(state['layers'])} stitching layers and anchors "
            f"{sorted(state['anchors'])}; this context builds {len(layers)} and {sorted(sn.chains)}"
        )
    for layer, weights in zip(layers, state["layers"], strict=True):
        layer.load_state_dict(weights)
    for name, weights in state["anchors"].items():
        sn.chains[name].model.load_state_dict(weights)
    if state["report"] is not None:
        sn.report = JointReport(**state["report"])
    return SNNETS.put(ctx, key, sn)
