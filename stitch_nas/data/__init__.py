"""Data: train / probe / val / test splits of images in [0, 1] with integer labels, from the
embedded digits, image folders and local torchvision data sets.
"""

from ._datasets import (
    load_image_folder,
    load_torchvision_dataset,
)
from ._splits import (
    PROBE_SIZE_RANGE,
    DataSplits,
    Split,
    load_digits_splits,
)

__all__ = [
    "DataSplits",
    "PROBE_SIZE_RANGE",
    "Split",
    "load_digits_splits",
    "load_image_folder",
    "load_torchvision_dataset",
]
