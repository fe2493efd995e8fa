"""Every network of a finished search's Pareto front exported as torch does now, and checked.

    python benchmarks/export_front.py DIR [--results PATH]

``DIR`` is a finished search folder (the real-zoo one: ``stitch-nas search examples/realzoo.yaml
--out DIR``). Runs ``stitch-nas export DIR --out DIR/models_check --format
safetensors,pt2,onnx`` in this process, counting every call of ``torch.jit.trace`` and of torch's
TorchScript-based ONNX exporter (``torch.onnx.export(..., dynamo=False)``) while it runs. Then,
apart from the export's own checks, each exported folder is read back three ways: the network
from ``model.safetensors`` (:func:`stitch_nas.load`), the program in ``model.pt2``
(``torch.export.load``) and ``model.onnx`` in onnxruntime (CPU); the largest difference of the
program's and onnxruntime's scores from the network's is recorded at batch 1 and 7, on the
first test images. Writes benchmarks/results/export_realzoo.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from provenance import commit

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "export_realzoo.json"
BATCHES = (1, 7)


def _count_legacy_calls() -> dict[str, int]:
    """Wrap torch's deprecated tracers so that each call is counted."""
    import torch

    calls = {"torch.jit.trace": 0, "torch.onnx.export(dynamo=False)": 0}
    trace, onnx_export = torch.jit.trace, torch.onnx.export

    def counted_trace(*args: Any, **kwargs: Any) -> Any:
        calls["torch.jit.trace"] += 1
        return trace(*args, **kwargs)

    def counted_export(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("dynamo") is False:
            calls["torch.onnx.export(dynamo=False)"] += 1
        return onnx_export(*args, **kwargs)

    torch.jit.trace, torch.onnx.export = counted_trace, counted_export
    return calls


def _check(folder: Path, images: Any, modules: dict[str, Any]) -> dict[str, Any]:
    import onnxruntime
    import torch

    from stitch_nas import load

    meta = json.loads((folder / "meta.json").read_text())
    row: dict[str, Any] = {
        "network": folder.name,
        "describe": meta["describe"],
        "formats": meta["formats"],
        "formats_failed": meta["formats_failed"],
        "format_notes": meta["format_notes"],
    }
    if {"pt2", "onnx"} - set(meta["formats"]):
        return row
    net = load(folder, modules=modules)  # the zoo's own modules, which JSON cannot recreate
    program = torch.export.load(str(folder / "model.pt2")).module()
    session = onnxruntime.InferenceSession(
        str(folder / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    for batch in BATCHES:
        x = images[:batch]
        with torch.no_grad():
            expected = net(x)
            row[f"pt2_gap_batch{batch}"] = float((program(x) - expected).abs().max())
        (got,) = session.run(None, {"images": x.numpy()})
        row[f"onnx_gap_batch{batch}"] = float(abs(got - expected.numpy()).max())
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a finished search folder")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()

    import torch

    from stitch_nas.cli._main import main as cli
    from stitch_nas.pipeline._folder import _rebuild
    from stitch_nas.search import load_folder_study

    out = args.folder / "models_check"
    calls = _count_legacy_calls()
    start = time.perf_counter()
    code = cli(["export", str(args.folder), "--out", str(out), "-q",
                "--format", "safetensors,pt2,onnx"])  # fmt: skip
    seconds = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"stitch-nas export exited {code}")
    ctx, _ = _rebuild(load_folder_study(args.folder), args.folder, False)
    images = ctx.split("test").read(torch.arange(max(BATCHES)))
    modules = {name: ctx.zoo[name].model for name in ctx.zoo}
    folders = sorted(p for p in out.iterdir() if p.is_dir() and p.name != "elastic")
    rows = [_check(folder, images, modules) for folder in folders]
    checked = [r for r in rows if "pt2_gap_batch1" in r]
    gaps = [r[k] for r in checked for k in r if k.endswith(tuple(f"_batch{b}" for b in BATCHES))]
    result = {
        "command": f"python benchmarks/export_front.py {args.folder}",
        "what": __doc__.split("\n\n")[2].replace("\n", " "),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "date": datetime.date.today().isoformat(),
        "commit": commit(),
        "networks": len(rows),
        "exported_pt2_and_dynamo_onnx": sum(
            "pt2" in r["formats"] and r["format_notes"].get("onnx", "").startswith("dynamo")
            for r in rows
        ),
        "max_gap": max(gaps) if gaps else None,
        "within_1e-4": bool(gaps) and len(checked) == len(rows) and max(gaps) <= 1e-4,
        "legacy_calls": calls,
        "export_seconds": round(seconds, 1),
        "export_seconds_per_network": round(seconds / max(len(rows), 1), 1),
        "rows": rows,
    }
    args.results.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("rows", "what")}, indent=1))


if __name__ == "__main__":
    main()
