"""Weight files of zoo models: read a state dict safely, load it strictly, hash the file.

Nothing here unpickles arbitrary objects: checkpoints are read with safetensors or
``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import pickle
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from stitch_nas.errors import DataError, NonFiniteError

__all__ = ["load_state_dict_file"]

BAD_FILE = (SafetensorError, pickle.UnpicklingError, EOFError, RuntimeError, ValueError, OSError)


# keys under which training scripts store the weights next to epoch, accuracy, optimizer...
_WRAPPERS = ("state_dict", "model_state_dict", "model", "net", "network", "state_dict_ema")
_PREFIXES = ("module.", "_orig_mod.")  # DataParallel / DistributedDataParallel, torch.compile


def _is_state(value: Any) -> bool:
    return isinstance(value, Mapping) and all(isinstance(v, torch.Tensor) for v in value.values())


def _unwrap_checkpoint(raw: Any, path: Path) -> dict[str, torch.Tensor]:
    """Return the state dict inside common checkpoint wrappers, prefixes stripped.

    ``{'net': state_dict, 'acc': ..., 'epoch': ...}``, ``{'state_dict': ...}``,
    ``{'model': ...}`` (up to two levels) and keys saved with a ``module.`` prefix are what
    training scripts write. The state dict's ``_metadata`` (module versions) is kept, with the
    same prefixes stripped, so loading behaves exactly as ``load_state_dict`` on the raw dict
    (BatchNorm of an old version fills in a missing ``num_batches_tracked``, as PyTorch does).
    """
    for _ in range(2):
        if _is_state(raw) or not isinstance(raw, Mapping):
            break
        inner = next((raw[k] for k in _WRAPPERS if isinstance(raw.get(k), Mapping)), None)
        if inner is None:
            break
        raw = inner
    if not _is_state(raw):
        found = ", ".join(f"{k!r}" for k in list(raw)[:5]) if isinstance(raw, Mapping) else ""
        what = f"a mapping with keys {found}" if found else f"a {type(raw).__name__}"
        raise DataError(
            f"{str(path)!r} does not hold a state dict of tensors (it holds {what}; looked "
            f"inside {', '.join(_WRAPPERS)}); save model.state_dict() instead"
        )
    metadata = getattr(raw, "_metadata", None)
    state = {str(k): v for k, v in raw.items()}
    for prefix in _PREFIXES:
        if state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix) :]: v for k, v in state.items()}
            if isinstance(metadata, Mapping):
                metadata = {_strip(k, prefix): v for k, v in metadata.items()}
    result = OrderedDict(state)
    if isinstance(metadata, Mapping):
        result._metadata = dict(metadata)  # type: ignore[attr-defined]
    return result


def _strip(key: str, prefix: str) -> str:
    """A ``_metadata`` key without ``prefix`` (the wrapper module's own key becomes the root)."""
    if key == prefix.rstrip("."):
        return ""
    return key[len(prefix) :] if key.startswith(prefix) else key


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
    except BAD_FILE as exc:
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise DataError(
            f"cannot read weights file {str(path)!r} ({reason}); re-save it with "
            "safetensors.torch.save_file(model.state_dict(), path)"
        ) from exc
    return _unwrap_checkpoint(raw, path)


def load_into(model: nn.Module, state: Mapping[str, torch.Tensor], origin: str) -> None:
    """Load ``state`` with ``load_state_dict(strict=True)``: what PyTorch accepts loads, and
    what it refuses is a one-line DataError with the counts and a few of the keys. Weights
    holding NaN or Inf are the file's fault, said before any trial measures their outputs."""
    for key, tensor in state.items():
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
            bad = int((~tensor.isfinite()).sum())
            if bad:
                raise NonFiniteError(
                    f"weights {origin} hold {bad} NaN/Inf values in {key!r}; the checkpoint is "
                    "broken: give a good copy of it"
                )
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        expected = model.state_dict()
        missing = [k for k in expected if k not in state]
        unexpected = [k for k in state if k not in expected]
        mismatched = [
            k for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape)
        ]
        examples = (missing[:2] + unexpected[:2] + mismatched[:2])[:4]
        raise DataError(
            f"weights {origin} do not fit the model: {len(missing)} missing, {len(unexpected)} "
            f"unexpected, {len(mismatched)} wrong-shape keys (e.g. {', '.join(examples)}); "
            "check the architecture and num_classes"
        ) from exc
