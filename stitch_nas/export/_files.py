"""Files of an export: weights stored once per tensor, and the checksums beside them.

Weights are safetensors (never a pickle). A tensor that several modules share (a fragment used
by several networks of an elastic package, or twice in one chain) is stored once under its first
name; the other names are recorded as aliases in the file's metadata and restored on load, so
``load_state_dict(strict=True)`` still sees every key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import nn

from stitch_nas.errors import IntegrityError
from stitch_nas.files import atomic_write, sha256_file

__all__ = ["save_weights", "load_weights", "checksums", "verify_checksums"]

_ALIASES = "stitch_nas.aliases"


def _storage_key(t: torch.Tensor) -> tuple:
    return (t.device, t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))


def save_weights(module: nn.Module, path: Path) -> None:
    """Write ``module.state_dict()`` as safetensors, each shared tensor once."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    first_name: dict[tuple, str] = {}
    for name, tensor in module.state_dict().items():
        key = _storage_key(tensor)
        if tensor.numel() and key in first_name:
            aliases[name] = first_name[key]
            continue
        first_name.setdefault(key, name)
        # contiguous copies: safetensors stores dense row-major data (channels-last is not)
        tensors[name] = tensor.detach().cpu().contiguous().clone()
    atomic_write(path, save(tensors, metadata={_ALIASES: json.dumps(aliases, sort_keys=True)}))


def load_weights(module: nn.Module, path: Path) -> None:
    """Load weights written by :func:`save_weights` into ``module``; every key must match."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as exc:
        raise IntegrityError(f"weights file {str(path)!r} is unreadable ({exc})") from exc
    for alias, name in json.loads(metadata.get(_ALIASES, "{}")).items():
        tensors[alias] = tensors[name]
    result = module.load_state_dict(tensors, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise IntegrityError(
            f"weights file {str(path)!r} does not fit the network its stitch.json describes "
            f"(missing {result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]}); "
            "export it again with this stitch_nas version"
        )


def checksums(folder: Path, names: list[str]) -> dict[str, str]:
    """sha256 of each named file in ``folder``."""
    return {name: sha256_file(folder / name) for name in names}


def verify_checksums(folder: Path, expected: Mapping[str, str]) -> None:
    """Refuse a folder whose files are missing or differ from the recorded sha256."""
    for name, digest in expected.items():
        path = folder / name
        if not path.is_file():
            raise IntegrityError(f"{str(path)!r} is missing; export the network again")
        if sha256_file(path) != digest:
            raise IntegrityError(
                f"{str(path)!r} does not match the sha256 in meta.json (changed or corrupted "
                "since export); refusing to load it; export the network again"
            )
