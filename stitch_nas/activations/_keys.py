"""What an activation depends on (:class:`ActivationKey`), weight fingerprints, and the dtypes
activations may be stored in.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

import torch
from torch import nn

from stitch_nas.errors import ConfigError

__all__ = [
    "FORMAT",
    "STORAGE_DTYPES",
    "ActivationKey",
    "storage_dtype",
    "weights_fingerprint",
]

# bump when the digest recipe, the file layout or how activations are computed changes, to
# orphan old files (2: activations at a cut followed by an in-place op were overwritten;
# 3: the storage dtype joined the key; 4: the autocast dtype joined it)
FORMAT = 4


@dataclass(frozen=True)
class ActivationKey:
    """Everything an activation depends on; any change gives a new digest and a fresh entry.

    Attributes:
        model: Zoo name of the model.
        weights: Fingerprint of the model's weights (see :func:`weights_fingerprint`).
        cut: Cut point name, or None for the model's output.
        split: Data split name (``"probe"``, ``"val"``...).
        data: Fingerprint of the data set.
        preprocess: ``repr`` of the input spec (resize, normalisation...).
        dtype: Storage dtype of the cached values (``"float16"`` rounds them).
        autocast: The dtype the forward pass ran in under autocast (None: float32).
    """

    model: str
    weights: str
    cut: str | None
    split: str
    data: str
    preprocess: str
    dtype: str = "float32"
    autocast: str | None = None

    def digest(self) -> str:
        """Return the first 32 hex characters of the sha256 of a canonical form of the key."""
        # JSON keeps None apart from the string "None" and cannot confuse field boundaries
        canonical = json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def weights_fingerprint(module: nn.Module) -> str:
    """Return the sha256 hex digest of a module's parameters and buffers.

    Names, shapes, dtypes and raw bytes are hashed in name order, so a change to any weight or
    buffer (a BatchNorm running mean, for example) changes the fingerprint. It reads every byte
    (about 3 ms per million float32 parameters on a CPU, plus the copy of GPU tensors to the
    host), so callers should compute it once per model and memoise it.

    Args:
        module: The model to fingerprint.

    Raises:
        ConfigError: If a tensor lives on the meta device and so has no data to hash.
    """
    digest = hashlib.sha256(f"stitch_nas.weights.v{FORMAT}\0".encode())
    tensors: dict[str, torch.Tensor] = dict(module.named_parameters())
    tensors.update(module.named_buffers())
    for name in sorted(tensors):
        tensor = tensors[name].detach()
        if tensor.is_meta:
            raise ConfigError(
                f"tensor {name!r} is on the meta device; load real weights before fingerprinting"
            )
        # viewing the bytes as uint8 avoids a numpy round trip for dtypes numpy lacks (bfloat16)
        raw = tensor.cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        header = f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0{raw.nbytes}\0"
        digest.update(header.encode())
        digest.update(raw.data)
    return digest.hexdigest()


#: storage dtypes of cached activations (numpy has no bfloat16, so spill files could not hold it)
STORAGE_DTYPES = {"float16": torch.float16, "float32": torch.float32}


def storage_dtype(name: str | torch.dtype) -> torch.dtype:
    """The torch dtype for a storage dtype name; ConfigError names the valid ones."""
    for key, dtype in STORAGE_DTYPES.items():
        if name in (key, dtype):
            return dtype
    raise ConfigError(f"cache dtype {name!r} is not supported; use one of {sorted(STORAGE_DTYPES)}")
