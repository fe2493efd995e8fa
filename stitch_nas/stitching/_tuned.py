"""Networks trained after they were built: their weights saved, and the networks rebuilt.

A fine-tuned network (``stitch_nas.finetune``) keeps the config of the network it started from
but not its weights, so the config alone rebuilds the starting network. :func:`load_tuned`
builds that on a copy of the zoo's fragments (the zoo's own modules are never changed) and
loads the trained weights into it. Weights are safetensors, never a pickle.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model

from stitch_nas.activations import StitchContext
from stitch_nas.config import StitchConfig
from stitch_nas.errors import ConfigError

from ._build import StitchedNet, build

__all__ = ["load_tuned", "save_tuned"]


def save_tuned(net: StitchedNet, file: Path) -> None:
    """Write ``net``'s weights to ``file`` (through a temporary beside it: a killed run leaves
    the old file or none, never half of one)."""
    file.parent.mkdir(parents=True, exist_ok=True)
    temp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    try:
        save_model(net, str(temp))  # writes a tensor that two parts share once
        os.replace(temp, file)
    finally:
        temp.unlink(missing_ok=True)


def load_tuned(
    ctx: StitchContext, config: StitchConfig, file: Path, *, fuse: bool = False
) -> StitchedNet:
    """``config`` built as :func:`~stitch_nas.stitching.build` builds it (``fuse`` as when it
    was trained), on its own copy of the fragments, with the weights saved in ``file``."""
    if not file.is_file():
        raise ConfigError(
            f"the fine-tuned weights {file} are missing; run the search's fine-tune stage "
            "again (--resume) or export from the folder the search wrote"
        )
    zoo_net = build(ctx, config, fuse=fuse)
    net = copy.deepcopy(zoo_net)
    device = next(net.parameters()).device
    try:
        load_model(net, str(file), strict=True, device=str(device))
    except (SafetensorError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"{file} does not hold the weights of {config.describe()} ({first}); it belongs "
            "to another search or version"
        ) from None
    # the cached activations of the first fragment stand for it only while its weights are
    # still the zoo's (fine-tuning everything, train='all', changes them)
    net.cached_prefix = _same_weights(zoo_net.parts[0], net.parts[0])
    net.eval()
    return net


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    ours, theirs = a.state_dict(), b.state_dict()
    return ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
