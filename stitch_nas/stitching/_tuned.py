"""Networks trained after they were built: their weights saved, and the networks rebuilt.

Two kinds of trained network keep their weights in a search's folder, one safetensors file
each (never a pickle), named by the trial's ``attrs.WEIGHTS``:

- A fine-tuned network (``stitch_nas.finetune``) keeps the config of the network it started
  from but not its weights: every weight is saved (:func:`save_tuned`), and :func:`load_tuned`
  builds the config on a copy of the zoo's fragments (the zoo's own modules are never changed)
  and loads them all.
- A network with trained adapters keeps only what training made, the tensors that are not the
  zoo's own (:func:`trained_tensors`: the adapters, and the private copies that
  ``train='suffix'`` or ``'all'`` trains), marked ``{"stitch_nas": "trained"}`` in the file's
  metadata. :func:`load_tuned` builds the config without any training step and loads them
  into those tensors, so a trial's network is rebuilt without training it again.

A file whose tensors are not those of the config (another search's, or another version's) is
refused in one line.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model, save, save_model

from stitch_nas.activations import StitchContext
from stitch_nas.config import StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.files import atomic_write

from ._build import NETWORKS, StitchedNet, build

__all__ = [
    "TRAINED_DIR",
    "has_trained_adapters",
    "load_tuned",
    "save_trained",
    "save_tuned",
    "trained_bytes",
    "trained_tensors",
]

#: where a search keeps the trained adapters of its trials: ``<folder>/trained/``
TRAINED_DIR = "trained"
_MARK = {"stitch_nas": "trained"}  # the metadata of a file of trained tensors only


def has_trained_adapters(config: StitchConfig) -> bool:
    """Whether building ``config`` fits an adapter of a trained kind (not least squares, nor a
    whole jointly trained network such as SN-Net, which ships its own weights)."""
    kinds = [a.kind for a in config.adapters]
    return bool(kinds) and kinds[0] not in NETWORKS and any(k != "lstsq" for k in kinds)


def trained_tensors(ctx: StitchContext, net: StitchedNet) -> dict[str, torch.Tensor]:
    """``net``'s state tensors that are not its zoo models' own, as CPU copies by name."""
    zoo = {
        id(t)
        for name in net.config.models
        for module in (ctx.entry(name).model,)
        for t in (*module.parameters(), *module.buffers())
    }
    return {
        key: value.detach().to("cpu", copy=True).contiguous()
        for key, value in net.state_dict(keep_vars=True).items()
        if id(value) not in zoo
    }


def trained_bytes(ctx: StitchContext, net: StitchedNet) -> bytes:
    """:func:`trained_tensors` as the bytes of a safetensors file (what a Ray worker returns)."""
    return save(trained_tensors(ctx, net), metadata=_MARK)


def save_trained(data: bytes, file: Path) -> None:
    """Write :func:`trained_bytes` to ``file`` atomically (a killed run leaves no half file)."""
    file.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(file, data)


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
    was trained) with the weights saved in ``file``: all of them on its own copy of the
    fragments, or, for a file of trained tensors only, those with no training step run."""
    if not file.is_file():
        raise ConfigError(
            f"the trained weights {file} are missing; run the search's fine-tune stage "
            "again (--resume) or export from the folder the search wrote"
        )
    try:
        with safe_open(str(file), framework="pt") as handle:
            trained_only = (handle.metadata() or {}).get("stitch_nas") == _MARK["stitch_nas"]
    except (SafetensorError, OSError) as exc:
        raise _refused(file, config, exc) from None
    if trained_only:
        return _load_trained(ctx, config, file, fuse)
    zoo_net = build(ctx, config, fuse=fuse)
    net = copy.deepcopy(zoo_net)
    device = next(net.parameters()).device
    try:
        load_model(net, str(file), strict=True, device=str(device))
    except (SafetensorError, RuntimeError) as exc:
        raise _refused(file, config, exc) from None
    # the cached activations of the first fragment stand for it only while its weights are
    # still the zoo's (fine-tuning everything, train='all', changes them)
    net.cached_prefix = _same_weights(zoo_net.parts[0], net.parts[0])
    net.eval()
    return net


def _load_trained(ctx: StitchContext, config: StitchConfig, file: Path, fuse: bool) -> StitchedNet:
    """``config`` built with no training step, its trained tensors loaded from ``file``."""
    net = build(ctx, config, fuse=fuse, train=False)
    targets = net.state_dict(keep_vars=True)
    own = trained_tensors(ctx, net).keys()
    with safe_open(str(file), framework="pt") as handle:
        stored = set(handle.keys())
        if stored != own:
            missing, extra = sorted(own - stored), sorted(stored - own)
            what = f"lacks {missing[0]}" if missing else f"has {extra[0]}, which it does not"
            raise _refused(file, config, f"the file {what}")
        with torch.no_grad():
            for key in sorted(stored):
                tensor, target = handle.get_tensor(key), targets[key]
                if tensor.shape != target.shape:
                    shapes = f"{tuple(tensor.shape)} for {tuple(target.shape)}"
                    raise _refused(file, config, f"{key}: {shapes}")
                target.copy_(tensor)
    net.eval()
    return net


def _refused(file: Path, config: StitchConfig, why: object) -> ConfigError:
    text = str(why).strip()
    first = text.splitlines()[0][:200] if text else type(why).__name__
    return ConfigError(
        f"{file} does not hold the weights of {config.describe()} ({first}); it belongs "
        "to another search or version"
    )


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    ours, theirs = a.state_dict(), b.state_dict()
    return ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
