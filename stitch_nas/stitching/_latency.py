"""How long a network takes: onnxruntime or PyTorch on this machine, or the user's own figure.

The ``latency`` objective (and a ``latency`` budget) reads :attr:`Measurement.latency_ms`,
which :func:`time_network` fills as :class:`LatencySpec` says:

- ``backend: onnxruntime`` (the default): the network as ONNX in an onnxruntime CPU session
  with ``threads`` threads, ``batch`` images a run, ``warmup`` runs, then the median of
  ``repeats`` runs and a distribution-free 95 % interval of that median. That is how most
  networks a search finds are deployed on a CPU, and it does not time PyTorch's eager overhead.
- ``backend: torch``: the same runs of the network in PyTorch, on the search's device.
- ``table: FILE.yaml``: the target device's figures, measured by the user there (see
  :class:`LatencyTable`): a network's latency is the sum of its fragments' and joints'.
- ``function: package.module:name`` (or a callable, from Python): ``fn(network, config)``
  returns milliseconds, e.g. from a device farm or a learned predictor.

The ONNX copy timed here comes from torch's dynamo exporter, as the export's does
(:mod:`stitch_nas.export`); only where ``torch.export`` refuses a network does the older
TorchScript-based exporter stand in, the export's documented fallback too. The dynamo exporter
takes seconds a network (3-6 s for the tiny test zoo's models on two cores): a latency search
pays that once per new config, on top of the timed runs; ``backend: torch`` does not.
"""

from __future__ import annotations

import copy
import functools
import importlib
import math
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stitch_nas.choices import check_at_least, check_one_of
from stitch_nas.config import StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.extras import require

if TYPE_CHECKING:  # torch loads when a network is timed: the settings check specs without it
    import torch
    from torch import nn

__all__ = ["LATENCY_BACKENDS", "LatencyFigure", "LatencySpec", "LatencyTable", "time_network"]

#: where a network is timed when no table or function gives its latency
LATENCY_BACKENDS = ("onnxruntime", "torch")


@dataclass(frozen=True)
class LatencySpec:
    """How the ``latency`` objective times a network (the ``search.latency`` settings).

    Attributes:
        backend: ``onnxruntime`` or ``torch`` (see the module docstring).
        threads: CPU threads the timed runs may use.
        batch: images per timed run; ``latency_ms`` is the time of one run.
        warmup: runs before the timed ones.
        repeats: timed runs; their median is the figure.
        table: a YAML table of the target device's figures (:class:`LatencyTable`).
        function: ``package.module:name`` of ``fn(network, config) -> milliseconds``, or the
            callable itself.
    """

    backend: str = "onnxruntime"
    threads: int = 1
    batch: int = 1
    warmup: int = 3
    repeats: int = 20
    table: str | None = None
    function: str | Callable[[nn.Module, StitchConfig], float] | None = None

    def __post_init__(self) -> None:
        check_one_of(self.backend, "latency.backend", LATENCY_BACKENDS)
        for name in ("threads", "batch", "repeats"):
            check_at_least(getattr(self, name), f"latency.{name}", 1)
        check_at_least(self.warmup, "latency.warmup", 0)
        if self.table is not None and self.function is not None:
            raise ConfigError("latency: give a table or a function, not both")
        if isinstance(self.function, str) and ":" not in self.function:
            raise ConfigError(f"latency.function={self.function!r}: give package.module:function")

    @classmethod
    def from_options(cls, options: LatencySpec | Mapping[str, Any] | None) -> LatencySpec:
        """``options`` (the ``search.latency`` mapping) checked: a wrong key is one line."""
        if isinstance(options, LatencySpec):
            return options
        options = dict(options or {})
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ConfigError(f"latency: unknown key {unknown[0]!r}; use {', '.join(known)}")
        return cls(**options)

    def user_figures(self) -> bool:
        """Whether the figures come from the user (a table or a function), not from timing."""
        return self.table is not None or self.function is not None

    def check(self, models: list[str]) -> None:
        """Fail now, before any trial, when the timing cannot run: onnxruntime or the onnx
        exporter missing, a table that cannot be read or lacks a zoo model, a function that
        cannot be imported."""
        if self.table is not None:
            LatencyTable.load(self.table).check_models(models)
        elif self.function is not None:
            self.callable()
        elif self.backend == "onnxruntime":
            for module in ("onnxruntime", "onnx", "onnxscript"):
                require("onnx", module, "the latency objective (latency.backend onnxruntime)")

    def callable(self) -> Callable[[nn.Module, StitchConfig], float]:
        """The user's latency function."""
        if callable(self.function):
            return self.function
        module, _, name = str(self.function).partition(":")
        try:
            fn = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(
                f"latency.function={self.function!r} cannot be imported ({exc}); give "
                "package.module:function of a module on the Python path"
            ) from exc
        if not callable(fn):
            raise ConfigError(f"latency.function={self.function!r} is not callable")
        return fn

    def describe(self, device: str = "CPU") -> str:
        """Where and how a figure was had, as a trial records it beside the figure
        (``device``: where ``backend: torch`` ran)."""
        if self.table is not None:
            return f"table {self.table}"
        if self.function is not None:
            name = self.function if isinstance(self.function, str) else _name(self.function)
            return f"function {name}"
        where = "CPU" if self.backend == "onnxruntime" else device
        return (
            f"{self.backend} {where}, {self.threads} thread(s), batch {self.batch}, "
            f"median of {self.repeats} runs after {self.warmup}"
        )


def _name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


@dataclass(frozen=True)
class LatencyFigure:
    """A network's latency: ``ms`` (the median, or the user's figure), the 95 % interval of
    the median (None for a user's figure) and how it was had."""

    ms: float
    interval: tuple[float, float] | None
    how: str


class LatencyTable:
    """A target device's latencies, in milliseconds, measured there by the user::

        models:
          resnet18:
            total: 4.1              # the whole model, input to scores
            cuts: {layer1: 1.2, layer2: 2.0, layer3: 2.9}   # input to each cut
        joint_ms: 0.05              # each adapter between two fragments (default 0)

    A fragment of a model from cut ``a`` to cut ``b`` takes ``cuts[b] - cuts[a]`` (the input
    for a first fragment, ``total`` for a last one); a network adds its fragments and one
    ``joint_ms`` per adapter. A network's head other than the model's own is not counted.
    """

    def __init__(self, path: str, models: dict[str, dict[str, Any]], joint_ms: float) -> None:
        self.path, self.models, self.joint_ms = path, models, joint_ms

    @staticmethod
    @functools.cache
    def load(path: str) -> LatencyTable:
        """The table in ``path`` (YAML), checked: every figure a non-negative number."""
        import yaml

        where = f"latency table {path}"
        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{where} cannot be read ({exc}); give a YAML file") from exc
        if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
            raise ConfigError(f"{where} needs models: {{MODEL: {{total: MS, cuts: {{CUT: MS}}}}}}")
        models = {}
        for name, entry in data["models"].items():
            if not isinstance(entry, dict) or "total" not in entry:
                raise ConfigError(f"{where}: model {name!r} needs total: MS (input to scores)")
            cuts = entry.get("cuts") or {}
            if not isinstance(cuts, dict):
                raise ConfigError(f"{where}: model {name!r} needs cuts: {{CUT: MS}}")
            figures = {"total": entry["total"], **cuts}
            for key, value in figures.items():
                _check_ms(value, f"{where}: {name}.{key}")
            models[str(name)] = {"total": float(entry["total"])} | {
                str(k): float(v) for k, v in cuts.items()
            }
        joint_ms = data.get("joint_ms", 0.0)
        _check_ms(joint_ms, f"{where}: joint_ms")
        return LatencyTable(path, models, float(joint_ms))

    def check_models(self, models: list[str]) -> None:
        missing = [m for m in models if m not in self.models]
        if missing:
            raise ConfigError(
                f"latency table {self.path} lacks the zoo's model(s) {', '.join(missing)}; "
                "add each with its total and cuts"
            )

    def network_ms(self, config: StitchConfig) -> float:
        """The latency of ``config``'s network by the table."""
        total = self.joint_ms * len(config.adapters)
        for fragment in config.fragments:
            end = self._to(fragment.model, fragment.end, end=True)
            total += end - self._to(fragment.model, fragment.start)
        return total

    def _to(self, model: str, cut: str | None, *, end: bool = False) -> float:
        entry = self.models[model]  # every zoo model is checked up front (check_models)
        if cut is None:
            return 0.0 if not end else entry["total"]
        if cut not in entry:
            raise ConfigError(
                f"latency table {self.path} lacks {model}'s cut {cut!r}; add its ms from the "
                "input to that cut under cuts"
            )
        return entry[cut]


def _check_ms(value: Any, where: str) -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where}={value!r}: give milliseconds, a number >= 0")


def time_network(
    net: nn.Module, config: StitchConfig, images: torch.Tensor, spec: LatencySpec
) -> LatencyFigure:
    """``net``'s latency as ``spec`` says; ``images``: at least one input image of the data
    (repeated to ``spec.batch``), on the device the network runs on."""
    if spec.table is not None:
        table = LatencyTable.load(spec.table)
        return LatencyFigure(table.network_ms(config), None, spec.describe())
    if spec.function is not None:
        ms = float(spec.callable()(net, config))
        if not math.isfinite(ms) or ms < 0:
            raise ConfigError(f"{spec.describe()} returned {ms!r}; it must return milliseconds")
        return LatencyFigure(ms, None, spec.describe())
    x = images[:1].expand(spec.batch, *images.shape[1:]).contiguous()
    if spec.backend == "onnxruntime":
        run = _onnxruntime_run(net, x.cpu(), spec.threads)
    else:
        run = _torch_run(net, x)
    how = spec.describe(x.device.type.upper())
    with _threads(spec.threads if spec.backend == "torch" and not x.is_cuda else None):
        for _ in range(spec.warmup):
            run()
        times = []
        for _ in range(spec.repeats):
            start = time.perf_counter()
            run()
            times.append(1000 * (time.perf_counter() - start))
    return LatencyFigure(statistics.median(times), median_interval(times), how)


def median_interval(times: list[float]) -> tuple[float, float]:
    """A distribution-free 95 % interval of the median of ``times``: the order statistics
    ``j`` and ``n + 1 - j`` with the largest ``j`` such that P(Binomial(n, 1/2) < j) <= 2.5 %
    (the whole range when ``n`` is too small for one)."""
    ordered, n = sorted(times), len(times)
    below, j = 0.0, 0
    while below + math.comb(n, j) / 2**n <= 0.025:
        below += math.comb(n, j) / 2**n
        j += 1
    j = max(j, 1)
    return ordered[j - 1], ordered[n - j]


def _torch_run(net: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    import torch

    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)  # CUDA runs asynchronously

    def run() -> None:
        with torch.inference_mode():
            net(x)
        sync()

    return run


def _onnxruntime_run(net: nn.Module, x: torch.Tensor, threads: int) -> Callable[[], None]:
    ort = require("onnx", "onnxruntime", "the latency objective (latency.backend onnxruntime)")
    model = copy.deepcopy(net).cpu().eval()
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(
        _onnx_bytes(model, x), options, providers=["CPUExecutionProvider"]
    )
    feed = {session.get_inputs()[0].name: x.numpy()}
    return lambda: session.run(None, feed)


def _onnx_bytes(model: nn.Module, x: torch.Tensor) -> bytes:
    import torch

    with warnings.catch_warnings(), tempfile.TemporaryDirectory() as folder:
        warnings.simplefilter("ignore")  # deprecation and tracer notes
        path = Path(folder) / "model.onnx"
        try:  # torch.export's program, translated by the dynamo exporter (onnxscript)
            torch.onnx.export(
                model, (x,), str(path), dynamo=True, external_data=False, verbose=False
            )
        except Exception:  # noqa: BLE001 - torch.export refused it: the documented fallback
            torch.onnx.export(model, (x,), str(path), dynamo=False)
        return path.read_bytes()


class _threads:
    """Run with ``count`` PyTorch CPU threads, then restore the number (None: unchanged)."""

    def __init__(self, count: int | None) -> None:
        import torch

        self.torch, self.count, self.before = torch, count, torch.get_num_threads()

    def __enter__(self) -> None:
        if self.count is not None:
            self.torch.set_num_threads(self.count)

    def __exit__(self, *exc: object) -> None:
        self.torch.set_num_threads(self.before)
