"""Graph copies of an exported network: a ``torch.export`` program, ONNX and TorchScript.

Each is made on CPU from a batch of evaluation images with a dynamic batch dimension. The
program (``model.pt2``) comes from ``torch.export``; ONNX (``model.onnx``) from torch's dynamo
exporter, which translates that same program (``onnxscript``, the ``onnx`` extra). Each file is
checked against the network at batch 1 and 7: the program reloaded from its file, ONNX in
onnxruntime where it is installed; a file that disagrees beyond 1e-4 is removed. Where
``torch.export`` refuses a network, ONNX falls back to torch's TorchScript-based exporter and
the manifest says so (``meta.json["format_notes"]``); ``model.pt`` (TorchScript,
``torch.jit.trace``) is written only when asked for. When a format fails, each part of the
network (preprocessing, every fragment and adapter, the head) is exported on its own to name
the first one that cannot be, and the export goes on without that format.
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
from stitch_nas.errors import ExportError, MissingDependencyError
from stitch_nas.extras import require

from ._load import ExportedNet

__all__ = ["FORMATS", "write_traced"]

logger = logging.getLogger(__name__)

FORMATS = EXPORT_FORMATS
_FILES = {"pt2": "model.pt2", "onnx": "model.onnx", "torchscript": "model.pt"}
#: a graph copy's scores may differ from the network's by float32 rounding, not more
TOLERANCE = 1e-4
#: the larger batch a written graph is checked at besides one image (it is exported at two)
CHECK_BATCH = 7


Programs = dict[int, torch.export.ExportedProgram]  # id(module) -> its program, made once


def _program(
    module: nn.Module, x: torch.Tensor, programs: Programs
) -> torch.export.ExportedProgram:
    """``module`` as a ``torch.export`` program whose batch dimension is dynamic."""
    if id(module) in programs:
        return programs[id(module)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer notes about the fx modules fragments are made of
        program = torch.export.export(
            module, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},), strict=False
        )
    programs[id(module)] = program
    return program


def _pt2(module: nn.Module, x: torch.Tensor, path: Path, programs: Programs) -> str:
    program = _program(module, x, programs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # notes on weights that share storage
        torch.export.save(program, str(path))
    return "torch.export program, dynamic batch"


def _onnx(module: nn.Module, x: torch.Tensor, path: Path, programs: Programs) -> str:
    names = {"input_names": ["images"], "output_names": ["scores"]}
    try:
        program = _program(module, x, programs)
    except Exception as exc:  # noqa: BLE001 - any refusal: the documented fallback below
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the legacy exporter's deprecation notes
            torch.onnx.export(
                module,
                (x,),
                str(path),
                dynamo=False,
                dynamic_axes={"images": {0: "batch"}, "scores": {0: "batch"}},
                opset_version=17,
                **names,  # type: ignore[arg-type]
            )
        return f"TorchScript-based exporter, opset 17: torch.export refused the network ({reason})"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx_program = torch.onnx.export(  # verbose=False: its progress lines went to stdout
            program,
            (x,),
            dynamo=True,
            verbose=False,
            **names,  # type: ignore[arg-type]
        )
    if onnx_program is None:  # it returns the program when no file is given
        raise ExportError("torch.onnx.export returned no program")
    onnx_program.save(str(path))
    return "dynamo exporter (torch.export program), dynamic batch"


def _torchscript(module: nn.Module, x: torch.Tensor, path: Path, programs: Programs) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is deprecated; written only when asked for
        traced = torch.jit.trace(module, x, check_trace=False)
        torch.jit.save(traced, str(path))
    return "torch.jit.trace (deprecated by torch; asked for)"


_WRITERS: dict[str, Callable[[nn.Module, torch.Tensor, Path, Programs], str]] = {
    "pt2": _pt2,
    "onnx": _onnx,
    "torchscript": _torchscript,
}


Cases = list[tuple[torch.Tensor, torch.Tensor]]  # (images, the network's scores on them)


def _check_cases(module: nn.Module, x: torch.Tensor) -> Cases:
    """The batches a written file is checked at, with the network's scores, computed once for
    every format: one image, and an odd batch larger than the one it was exported with, so a
    batch size baked into the graph shows."""
    seven = x.repeat((-(-CHECK_BATCH // len(x)),) + (1,) * (x.dim() - 1))[:CHECK_BATCH]
    with torch.no_grad():
        return [(batch, module(batch)) for batch in (x[:1], seven)]


def _gap(run: Callable[[torch.Tensor], torch.Tensor], cases: Cases, what: str) -> float:
    """The largest difference between ``run``'s scores and the network's over ``cases``.

    Raises:
        ExportError: ``run`` (``what``) fails on a batch of some size, as where a batch size
            was fixed in the graph.
    """
    gap = 0.0
    for x, expected in cases:
        with torch.no_grad():
            try:
                got = torch.as_tensor(run(x))
            except Exception as exc:  # noqa: BLE001 - any failure to run is a file not to keep
                first = str(exc).splitlines()[0][:200] if str(exc) else ""
                raise ExportError(
                    f"{what} does not run at batch {len(x)}: {type(exc).__name__}: {first}"
                ) from exc
        gap = max(gap, float((got - expected).abs().max()))
    return gap


def _check_pt2(cases: Cases, path: Path) -> str:
    """How far the saved program's scores are from the network's at batch 1 and 7.

    Raises:
        ExportError: beyond :data:`TOLERANCE`.
    """
    gap = _gap(torch.export.load(str(path)).module(), cases, "the saved program")
    if not gap <= TOLERANCE:
        raise ExportError(f"the saved program's scores differ from the network's by {gap:.3g}")
    return f"reloaded, agrees to {gap:.1e} at batch 1 and {CHECK_BATCH}"


def _check_onnx(cases: Cases, path: Path) -> str:
    """How far onnxruntime's scores are from the network's at batch 1 and 7, or why that was
    not checked.

    Raises:
        ExportError: beyond :data:`TOLERANCE`.
    """
    try:
        import onnxruntime
    except ImportError:
        return "not checked: onnxruntime is not installed"
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def run(batch: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(session.run(None, {"images": batch.numpy()})[0])

    gap = _gap(run, cases, "onnxruntime")
    if not gap <= TOLERANCE:
        raise ExportError(f"onnxruntime's scores differ from the network's by {gap:.3g}")
    return f"onnxruntime agrees to {gap:.1e} at batch 1 and {CHECK_BATCH}"


_CHECKS: dict[str, Callable[[Cases, Path], str]] = {"pt2": _check_pt2, "onnx": _check_onnx}


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
            writer(part, x, path, {})
        except Exception as exc:  # noqa: BLE001 - any exporter failure names the part
            return f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        with torch.no_grad():
            x = part(x)
    return "every part exports on its own; the failure comes from joining them"


_warned_no_onnx: list[bool] = []  # once per process


def write_traced(
    module: ExportedNet, x: torch.Tensor, folder: Path, formats: Sequence[str]
) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """Write the graph formats among ``formats`` into ``folder``.

    ``x`` needs at least two images: ``torch.export`` takes a batch of one for a constant.

    Returns:
        (format -> file name written, format -> why it could not be written, format -> how it
        was written and checked).
    """
    wanted = [f for f in formats if f in _WRITERS]
    if not wanted:
        return {}, {}, {}
    # a copy: exporters switch train/eval modes recursively, and the parts share zoo modules
    cpu = copy.deepcopy(module).cpu().eval()
    x = x.cpu()
    written, failed, notes = {}, {}, {}
    if "onnx" in wanted:
        try:  # the dynamo exporter translates with onnxscript, which needs onnx
            require("onnx", "onnx", "ONNX export")
            require("onnx", "onnxscript", "ONNX export")
        except MissingDependencyError as exc:  # say so once, not once per network
            wanted.remove("onnx")
            failed["onnx"] = str(exc)
            if not _warned_no_onnx:
                logger.warning("not writing model.onnx: %s", exc)
                _warned_no_onnx.append(True)
    programs: Programs = {}  # the program model.pt2 holds is the one ONNX translates
    cases: Cases | None = None  # the network's own scores, once for every format's check
    for fmt in wanted:
        path = folder / _FILES[fmt]
        try:
            note = _WRITERS[fmt](cpu, x, path, programs)
        except Exception:  # noqa: BLE001 - diagnosed part by part below
            path.unlink(missing_ok=True)
            scratch = folder / f".probe-{_FILES[fmt]}"
            failed[fmt] = _failing_part(_WRITERS[fmt], cpu, x, scratch)
            scratch.unlink(missing_ok=True)
            logger.warning("could not export %s: %s", fmt, failed[fmt])
            continue
        try:
            if fmt in _CHECKS:
                cases = _check_cases(cpu, x) if cases is None else cases
                note += "; " + _CHECKS[fmt](cases, path)
            notes[fmt] = note
        except ExportError as exc:  # written, but not what the network computes
            path.unlink()
            failed[fmt] = str(exc)
            logger.warning("could not export %s: %s", fmt, exc)
            continue
        written[fmt] = _FILES[fmt]
    return written, failed, notes
