"""SN-Net: the plan of stitches between anchors, the adapter spec that names one SN-Net, and
its joint training (Alg. 1).
"""

from ._joint import (
    SNNETS,
    JointReport,
    JointSNNet,
    joint_network,
    joint_stitches,
    train_snnet,
)
from ._network import SNNET
from ._plan import (
    KERNEL_DEFAULT,
    STRIDE_DEFAULT,
    SNStitch,
    paired_stitching,
    snnet_stitches,
    unpaired_stitching,
)
from ._ship import has_snnet, install_snnet, snnet_state, trained_snnet
from ._spec import (
    JOINT_KIND,
    JOINT_OPTIONS,
    LAYER_OPTIONS,
    joint_layer,
    joint_spec,
    resolve_joint_options,
)

__all__ = [
    "JOINT_KIND",
    "JOINT_OPTIONS",
    "JointReport",
    "JointSNNet",
    "KERNEL_DEFAULT",
    "LAYER_OPTIONS",
    "SNNET",
    "SNNETS",
    "SNStitch",
    "STRIDE_DEFAULT",
    "joint_layer",
    "joint_network",
    "has_snnet",
    "install_snnet",
    "joint_spec",
    "joint_stitches",
    "paired_stitching",
    "resolve_joint_options",
    "snnet_state",
    "snnet_stitches",
    "train_snnet",
    "trained_snnet",
    "unpaired_stitching",
]
