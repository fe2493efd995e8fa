"""Data: train / probe / val / test splits of images in [0, 1] with integer labels, from the
embedded digits, image folders (pooled or with fixed split folders), ``.npz`` arrays with fixed
splits and local torchvision data sets.
"""

from ._arrays import (
    images_to_tensor,
    load_npz_splits,
)
from ._datasets import (
    load_image_folder,
    load_split_folders,
    load_torchvision_dataset,
)
from ._sources import ArrayImages, ImageSource
from ._splits import (
    PROBE_SIZE_RANGE,
    DataSplits,
    Split,
    load_digits_splits,
)

__all__ = [
    "ArrayImages",
    "DataSplits",
    "ImageSource",
    "PROBE_SIZE_RANGE",
    "Split",
    "images_to_tensor",
    "load_digits_splits",
    "load_image_folder",
    "load_npz_splits",
    "load_split_folders",
    "load_torchvision_dataset",
]
