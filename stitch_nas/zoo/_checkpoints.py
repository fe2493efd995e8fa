"""Weight files of zoo models: read a state dict safely, load it strictly, hash the file.

Nothing here unpickles arbitrary objects: checkpoints are read with safetensors or
``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from stitch_nas.errors import DataError

__all__ = ["load_state_dict_file"]

_BAD_FILE = (SafetensorError, pickle.UnpicklingError, EOFError, RuntimeError, ValueError, OSError)


def _unwrap_checkpoint(raw: Any, path: Path) -> dict[str, torch.Tensor]:
    """Return the state dict inside common checkpoint wrappers."""
    if isinstance(raw, Mapping):
        for key in ("state_dict", "model_state_dict", "model", "state_dict_ema"):
            if isinstance(raw.get(key), Mapping):
                raw = raw[key]
                break
    if not isinstance(raw, Mapping) or not all(isinstance(v, torch.Tensor) for v in raw.values()):
        raise DataError(
            f"{str(path)!r} does not hold a state dict of tensors; save model.state_dict() instead"
        )
    state = {str(k): v for k, v in raw.items()}
    if state and all(k.startswith("module.") for k in state):  # saved from DataParallel
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state


def load_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a state dict (CPU tensors) from a ``.safetensors`` or ``.pt``/``.pth``/``.bin`` file.

    Raises:
        DataError: If the file is missing, corrupt or holds anything but tensors.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"weights file {str(path)!r} not found; pass an existing checkpoint path")
    try:
        if path.suffix == ".safetensors":
            raw: Any = load_file(str(path), device="cpu")
        else:
            raw = torch.load(path, map_location="cpu", weights_only=True)
    except _BAD_FILE as exc:
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise DataError(
            f"cannot read weights file {str(path)!r} ({reason}); re-save it with "
            "safetensors.torch.save_file(model.state_dict(), path)"
        ) from exc
    return _unwrap_checkpoint(raw, path)


def _load_into(model: nn.Module, state: Mapping[str, torch.Tensor], origin: str) -> None:
    """Load ``state`` strictly, turning a mismatch into a one-line DataError."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    mismatched = [
        k for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape)
    ]
    if missing or unexpected or mismatched:
        examples = (missing + unexpected + mismatched)[:3]
        raise DataError(
            f"weights {origin} do not fit the model: {len(missing)} missing, {len(unexpected)} "
            f"unexpected, {len(mismatched)} wrong-shape keys (e.g. {', '.join(examples)}); "
            "check the architecture and num_classes"
        )
    model.load_state_dict(state, strict=True)
