"""Export measured stitched networks as standalone folders, one each or one elastic package.

A network folder ``<dest>/<name>/`` holds ``model.safetensors`` (every weight the network needs),
``stitch.json`` (the recipe :func:`stitch_nas.load` rebuilds it from), ``meta.json`` (what the
search measured, provenance, the sha256 of every file) and the graph formats asked for
(``model.pt2``, ``model.onnx``, ``model.pt``: :mod:`._traced`). The network is rebuilt from
the same zoo and probe data as in the search and refused if it does not measure what its
trial recorded: loaded from the weights its trial kept (trained adapters, or a fine-tuned
network) and checked on the fixed sample of validation images the trial counted
(``Measurement.sample_correct``), else built again (trained adapters train again from their
seed, saying so) and checked on that sample too; a trial of an older study that counted no
sample is re-measured on the whole validation split. Its test figure is the test pass's where
the study has one. Before the folder is moved into place it is loaded back and compared with
the network in memory. An elastic package stores several networks with shared fragments once.

With a key in ``STITCH_NAS_EXPORT_KEY`` each folder is also signed (``signature.json``, see
``_signing``). Each export first removes the temporary folders that killed exports left beside
its own (only those whose writer process is gone).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import shutil
import socket
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stitch_nas.activations import StitchContext
from stitch_nas.attrs import TEST_ACCURACY
from stitch_nas.config import StitchConfig
from stitch_nas.errors import ConfigError, ExportError
from stitch_nas.files import atomic_folder
from stitch_nas.report import accuracy_figures, accuracy_on, rebuild_checked
from stitch_nas.stitching import StitchedNet, has_trained_adapters, head_recipe
from stitch_nas.zoo import check_architecture

from ._files import checksums, save_weights
from ._load import FORMAT_VERSION, ElasticNet, ExportedNet, joint_recipes, load
from ._signing import sign_folder
from ._traced import FORMATS, write_traced

__all__ = ["ExportItem", "export_network", "export_elastic", "folder_size", "FORMATS"]

logger = logging.getLogger(__name__)

# a loaded export may differ from the network in memory by float rounding only: the zoo runs
# channels-last on CPU, the loaded copy contiguous, so convolutions sum in another order
_ATOL, _RTOL = 1e-5, 1e-4

# atomic_folder's temporary is ".<name>.<8 random characters>.tmp" (tempfile.mkdtemp)
_TEMP_NAME = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")
# written into that temporary while an export fills it: a folder is removed as stale only when
# it holds this file and the process named there is gone, so a user's folder of the same
# pattern, or a concurrent export, is never touched
_WRITER = ".stitch_nas-export-writer.json"


@dataclass(frozen=True)
class ExportItem:
    """One network to export: its folder name, config and what the search measured
    (``weights``: the file of a fine-tuned network's weights or of the trained adapters its
    trial kept; None: its config rebuilds it, training any trained adapter again)."""

    name: str
    config: StitchConfig
    metrics: Mapping[str, Any]
    trial: int | None = None
    weights: Path | None = None


def _network(ctx: StitchContext, item: ExportItem, fuse: bool) -> ExportedNet:
    """Rebuild ``item`` exactly as the search measured it, and check that it measures the same
    (:func:`~stitch_nas.report.rebuild_checked`: loaded from the weights its trial kept, else
    built again; checked on the fixed sample of validation images its trial counted, else on
    the whole split)."""
    if item.weights is None and has_trained_adapters(item.config):
        logger.warning(
            "%s: no trained adapters kept (a search before stitch_nas kept them, or run "
            "without a folder); training them again from their seed",
            item.name,
        )
    fix = "export with the folder, zoo, data and fuse setting of the search"
    try:
        checked = rebuild_checked(
            ctx, item.config, item.metrics, item.name, fix, fuse=fuse, weights=item.weights
        )
    except ConfigError as exc:  # an ExportError, so a search's export skips just this one
        raise ExportError(str(exc)) from None
    measured = {} if checked.measurement is None else checked.measurement.to_dict()
    metrics = {**measured, **{k: v for k, v in item.metrics.items() if v is not None}}
    # meta.json carries the validation figure the search chose on and the held-out test one,
    # each with its 95 % Wilson interval; the test pass measured the test figure already
    test = metrics.get(TEST_ACCURACY)
    if test is None:
        test = accuracy_on(ctx, checked.net, "test", checked.head)
    n_val, n_test = len(ctx.labels("val")), len(ctx.labels("test"))
    metrics.update(accuracy_figures(checked.accuracy, n_val, float(test), n_test))
    return ExportedNet(checked.net, checked.head, tuple(ctx.data.label_names), metrics)


def _recipe(ctx: StitchContext, exported: ExportedNet) -> dict[str, Any]:
    spec = ctx.entry(exported.config.fragments[0].model).input_spec
    return {
        "config": exported.config.to_dict(),
        "input_spec": {"size": list(spec.size), "mean": list(spec.mean), "std": list(spec.std)},
        "label_names": list(exported.label_names),
        "joints": joint_recipes(exported.net),
        "own_copies": _own_copies(ctx, exported.net),
        "head": head_recipe(exported.head),
        "metrics": exported.metrics,
    }


def _own_copies(ctx: StitchContext, net: StitchedNet) -> list[int]:
    """Parts that are fine-tuned copies of a fragment rather than the zoo's own pieces.

    A loader shares one instance of each source model among all fragments (and all networks
    of an elastic package); a trained copy must get pieces of its own, or its weights and
    those of the zoo fragment it overlaps would land in the same tensors.
    """
    copies = []
    for i, (part, (key, _)) in enumerate(zip(net.parts, net.part_info, strict=True)):
        if key[0] != "fragment":
            continue
        zoo = ctx.segment(*key[1:4])
        pieces = list(part) if isinstance(part, nn.Sequential) else [part]
        zoo_pieces = list(zoo) if isinstance(zoo, nn.Sequential) else [zoo]
        if len(pieces) != len(zoo_pieces) or any(
            a is not b for a, b in zip(pieces, zoo_pieces, strict=True)
        ):
            copies.append(i)
    return copies


def _sources(ctx: StitchContext, models: Sequence[str]) -> dict[str, Any]:
    out = {}
    for name in models:
        entry = ctx.entry(name)
        try:
            architecture = check_architecture(name, entry.architecture)
        except ConfigError as exc:  # an ExportError, so a search's export skips just this one
            raise ExportError(str(exc)) from exc
        out[name] = {
            "architecture": architecture,
            "input_shape": list(ctx.input_shape(name)),
            "source": entry.source,
            "weights_sha256": entry.weights_sha256,
        }
    return out


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    import timm

    return {
        "stitch_nas": version("stitch-nas"),
        "torch": torch.__version__,
        "timm": timm.__version__,
    }


def _user_modules(ctx: StitchContext, models: Sequence[str]) -> dict[str, nn.Module]:
    """Copies of the source models JSON cannot recreate, for loading an export back."""
    return {m: copy.deepcopy(ctx.entry(m).model) for m in models if not ctx.entry(m).architecture}


def _check_loads(
    folder: Path, module: nn.Module, x: torch.Tensor, what: str, user: dict[str, nn.Module]
) -> None:
    """Load the written folder back and compare it with the module in memory.

    Both run on the CPU: a network measured on CUDA is compared through a CPU copy, since
    CUDA's convolutions (TF32 by default) differ from the CPU's by more than float rounding,
    and the check is about the written weights and structure, not about the device.
    """
    loaded = load(folder, modules=user)
    nets = module.networks if isinstance(module, ElasticNet) else {what: module}
    for name, net in nets.items():
        if isinstance(loaded, ElasticNet):
            loaded.select(trial=name)
        reference = net if _device(net).type == "cpu" else copy.deepcopy(net).cpu()
        with torch.no_grad():
            got, expected = loaded(x), reference(x)
        diff = float((got - expected).abs().max())
        if not torch.allclose(got, expected, rtol=_RTOL, atol=_ATOL):
            raise ExportError(
                f"{name}: the exported network differs from the measured one by {diff:.2e} "
                "(max abs); this is a stitch_nas bug, please report it"
            )


def _device(module: nn.Module) -> torch.device:
    return next(module.parameters(), torch.empty(0)).device


def _write(folder: Path, module: nn.Module, stitch: dict[str, Any], meta: dict[str, Any]) -> None:
    save_weights(module, folder / "model.safetensors")
    (folder / "stitch.json").write_text(json.dumps(stitch, indent=1, sort_keys=True))
    files = ["model.safetensors", "stitch.json", *meta.get("formats", {}).values()]
    meta["files"] = checksums(folder, files)
    (folder / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    sign_folder(folder)


def _writer_gone(temp: Path) -> bool:
    """Whether the export that made ``temp`` was killed: its writer file names a dead process."""
    try:
        writer = json.loads((temp / _WRITER).read_text())
        pid, host = int(writer["pid"]), writer["host"]
    except (OSError, ValueError, TypeError, KeyError):
        return False  # not an export's temporary, or one that is just starting
    if host != socket.gethostname() or pid <= 0 or pid == os.getpid():
        return False  # another machine's process cannot be asked; this one is alive
    try:
        os.kill(pid, 0)  # signal 0 only asks whether the process exists
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: it exists, as another user's process
        return False
    return False


def _remove_stale(parent: Path) -> None:
    """Remove the temporary folders killed exports left in ``parent``."""
    if os.name != "posix" or not parent.is_dir():  # os.kill(pid, 0) terminates on Windows
        return
    for path in parent.iterdir():
        if _TEMP_NAME.fullmatch(path.name) and not path.is_symlink() and path.is_dir():
            if _writer_gone(path):
                shutil.rmtree(path, ignore_errors=True)
                logger.info("removed %s, left by a killed export", path)


@contextmanager
def _export_folder(target: Path) -> Iterator[Path]:
    """:func:`atomic_folder` for an export, after removing stale temporaries beside ``target``."""
    _remove_stale(target.parent)
    with atomic_folder(target) as folder:
        writer = {"pid": os.getpid(), "host": socket.gethostname()}
        (folder / _WRITER).write_text(json.dumps(writer))
        yield folder
        (folder / _WRITER).unlink()


def _check_formats(formats: Sequence[str]) -> list[str]:
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ExportError(f"unknown export format {unknown[0]!r}; use any of {', '.join(FORMATS)}")
    return list(dict.fromkeys(["safetensors", *formats]))


def export_network(
    ctx: StitchContext,
    item: ExportItem,
    dest: str | Path,
    *,
    fuse: bool = False,
    formats: Sequence[str] = ("safetensors",),
) -> Path:
    """Export one network to ``dest/<item.name>/`` and return that folder.

    Raises:
        ExportError: an unknown format, or a rebuilt network that does not measure what the
            search recorded. A format the network cannot be traced to is skipped and named
            (with the part that failed) in ``meta.json["formats_failed"]``.
    """
    wanted = _check_formats(formats)
    sources = _sources(ctx, item.config.models)  # refuses what stitch.json may not hold, first
    exported = _network(ctx, item, fuse)
    x = ctx.split("val").read(torch.arange(2))
    target = Path(dest) / item.name
    with _export_folder(target) as folder:
        written, failed, notes = write_traced(exported, x, folder, wanted)
        meta = {
            "name": item.name,
            "trial": item.trial,
            "describe": item.config.describe(),
            "metrics": exported.metrics,
            "fragments": [f.to_dict() for f in item.config.fragments],
            "sources": sources,
            "formats": written,
            "formats_failed": failed,
            "format_notes": notes,
            "versions": _versions(),
        }
        stitch = {"format": FORMAT_VERSION, "sources": meta["sources"], **_recipe(ctx, exported)}
        _write(folder, exported, stitch, meta)
        _check_loads(folder, exported, x, item.name, _user_modules(ctx, item.config.models))
    logger.info("exported %s to %s", item.name, target)
    return target


def export_elastic(
    ctx: StitchContext, items: Sequence[ExportItem], dest: str | Path, *, fuse: bool = False
) -> Path:
    """Export several networks as one package whose shared fragments are stored once.

    ``stitch_nas.load`` returns an :class:`~stitch_nas.export.ElasticNet`: ``select`` switches
    the active network to meet a budget, ``configs`` lists them with their metrics.
    """
    if not items:
        raise ExportError("nothing to export: the elastic package needs at least one trial")
    models = list(dict.fromkeys(m for item in items for m in item.config.models))
    sources = _sources(ctx, models)  # refuses what stitch.json may not hold, first
    networks = {item.name: _network(ctx, item, fuse) for item in items}
    elastic = ElasticNet(networks)
    stitch = {
        "format": FORMAT_VERSION,
        "sources": sources,
        "networks": {name: _recipe(ctx, net) for name, net in networks.items()},
    }
    meta = {
        "name": Path(dest).name,
        "networks": {name: net.metrics for name, net in networks.items()},
        "sources": sources,
        "versions": _versions(),
    }
    target = Path(dest)
    with _export_folder(target) as folder:
        _write(folder, elastic, stitch, meta)
        x = ctx.split("val").read(torch.arange(2))
        _check_loads(folder, elastic, x, "elastic", _user_modules(ctx, models))
    return target


def folder_size(folder: Path) -> int:
    """Bytes of all files under ``folder``."""
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
