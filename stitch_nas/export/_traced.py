"""ONNX and TorchScript copies of an exported network, where the network traces.

Both are traced on CPU from a batch of evaluation images with a dynamic batch dimension. ONNX uses
torch's TorchScript-based exporter (``dynamo=False``): it needs no extra package and handles
the fx GraphModules that fragments are made of. When a format fails, each part of the network
(preprocessing, every fragment and adapter, the head) is traced on its own to name the first one
that cannot be, and the export goes on without that format.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from stitch_nas.choices import EXPORT_FORMATS
from stitch_nas.errors import MissingDependencyError
from stitch_nas.extras import require

from ._load import ExportedNet

__all__ = ["FORMATS", "write_traced"]

logger = logging.getLogger(__name__)

FORMATS = EXPORT_FORMATS
_FILES = {"onnx": "model.onnx", "torchscript": "model.pt"}


def _onnx(module: nn.Module, x: torch.Tensor, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer notes
        torch.onnx.export(
            module,
            (x,),
            str(path),
            dynamo=False,
            input_names=["images"],
            output_names=["scores"],
            dynamic_axes={"images": {0: "batch"}, "scores": {0: "batch"}},
            opset_version=17,
        )


def _torchscript(module: nn.Module, x: torch.Tensor, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is deprecated but still what C++ loads
        traced = torch.jit.trace(module, x, check_trace=False)
        torch.jit.save(traced, str(path))


_WRITERS: dict[str, Callable[[nn.Module, torch.Tensor, Path], None]] = {
    "onnx": _onnx,
    "torchscript": _torchscript,
}


def _parts(module: ExportedNet) -> list[tuple[str, nn.Module]]:
    """The network's parts in running order, each with a name for error messages."""
    net = module.net
    parts: list[tuple[str, nn.Module]] = [("preprocess", net.preprocess)]
    for i, (part, (key, _)) in enumerate(zip(net.parts, net.part_info, strict=True)):
        parts.append((f"part {i} ({key[0]} {' '.join(map(str, key[1:4]))})", part))
    if module.head is not None:
        parts.append((f"head ({type(module.head).__name__})", module.head))
    return parts


def _failing_part(writer: Callable, module: ExportedNet, x: torch.Tensor, path: Path) -> str:
    for name, part in _parts(module):
        try:
            writer(part, x, path)
        except Exception as exc:  # noqa: BLE001 - any exporter failure names the part
            return f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        with torch.no_grad():
            x = part(x)
    return "every part traces on its own; the failure comes from joining them"


_warned_no_onnx: list[bool] = []  # once per process


def write_traced(
    module: ExportedNet, x: torch.Tensor, folder: Path, formats: Sequence[str]
) -> tuple[dict[str, str], dict[str, str]]:
    """Write the traced formats among ``formats`` into ``folder``.

    Returns:
        (format -> file name written, format -> why it could not be written).
    """
    wanted = [f for f in formats if f in _WRITERS]
    if not wanted:
        return {}, {}
    # a copy: exporters switch train/eval modes recursively, and the parts share zoo modules
    cpu = copy.deepcopy(module).cpu().eval()
    x = x.cpu()
    written, failed = {}, {}
    if "onnx" in wanted:
        try:  # torch's exporter needs the onnx package
            require("onnx", "onnx", "ONNX export")
        except MissingDependencyError as exc:  # say so once, not once per network
            wanted.remove("onnx")
            failed["onnx"] = str(exc)
            if not _warned_no_onnx:
                logger.warning("not writing model.onnx: %s", exc)
                _warned_no_onnx.append(True)
    for fmt in wanted:
        path = folder / _FILES[fmt]
        try:
            _WRITERS[fmt](cpu, x, path)
            written[fmt] = _FILES[fmt]
        except Exception:  # noqa: BLE001 - diagnosed part by part below
            path.unlink(missing_ok=True)
            scratch = folder / f".probe-{_FILES[fmt]}"
            failed[fmt] = _failing_part(_WRITERS[fmt], cpu, x, scratch)
            scratch.unlink(missing_ok=True)
            logger.warning("could not export %s: %s", fmt, failed[fmt])
    return written, failed
