"""SN-Net as the core sees it: the whole-network builder registered for the adapter kind
``"snnet"``, through which building, exporting and shipping to Ray workers reach SN-Net without
naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stitch_nas.activations import StitchContext
from stitch_nas.config import AdapterSpec
from stitch_nas.stitching import NETWORKS, NetworkBuilder

from ._joint import joint_network
from ._ship import has_snnet, install_snnet, snnet_state, trained_snnet
from ._spec import JOINT_KIND, joint_layer

__all__ = ["SNNET"]


def _state(ctx: StitchContext, spec: AdapterSpec) -> dict[str, Any]:
    return snnet_state(trained_snnet(ctx, spec))


def _install(ctx: StitchContext, spec: AdapterSpec, state: dict[str, Any]) -> None:
    install_snnet(ctx, spec, state)


def _searched_by(space: str, options: Mapping[str, Any]) -> bool:
    """The ``snnet`` space with ``joint`` samples stitches of one jointly trained SN-Net."""
    return space == "snnet" and bool(options.get("joint"))


SNNET = NETWORKS.register(
    JOINT_KIND,
    NetworkBuilder(
        build=joint_network,
        layer=joint_layer,
        state=_state,
        install=_install,
        holds=has_snnet,
        searched_by=_searched_by,
    ),
)
