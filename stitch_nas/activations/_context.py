"""StitchContext: the zoo, the data, and everything computed once and shared by all trials.

Cut points, fragment modules and activations at cut points are memoised
here (and, through :class:`~._similarity.CutSimilarity`, the Gram matrices used by CKA), so a
trial only pays for what is new: fitting its stitch and running the suffix after it.
Activations are served batch by batch (:meth:`StitchContext.activation_batches`) under the
cache's memory budget: the probe's cuts are filled in one chained pass, other splits one cut at
a time, on first use (see :mod:`._stream`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from stitch_nas.data import DataSplits
from stitch_nas.errors import ConfigError, UnknownNameError
from stitch_nas.fragments import CutPoint, PieceChain, segment
from stitch_nas.zoo import Zoo, ZooEntry

from . import _stream
from ._batch import auto_batch_size
from ._cache import ActivationCache, ActivationKey, weights_fingerprint
from ._device import check_autocast, frozen_pass, is_convolutional, resolve_device, to_device
from ._similarity import CutSimilarity

__all__ = ["StitchContext", "zoo_models"]

logger = logging.getLogger(__name__)


class StitchContext(CutSimilarity):
    """Shared, memoised state of a search over one zoo and one data set.

    Args:
        zoo: the models to take fragments from.
        data: train / probe / val / test splits; images in [0, 1].
        device: where fragments run ("cpu", "cuda", ...); "auto" (the default): CUDA when this
            machine has it, else the CPU.
        batch_size: batch size of every forward pass over a split; None (the default): 256,
            or fewer where one batch of the zoo's largest activation would pass
            ``WORK_BATCH_BYTES`` (:func:`auto_batch_size`: 41 images for ResNet-50 at 224x224),
            so the work beside the cache stays bounded at any input size.
        ridge: relative ridge term of least-squares stitches.
        cka_rows: "flatten" (per-position features, Kornblith) or "pooled" rows for CKA.
        cache: where activations live; default: ``ActivationCache(device=device)``, 5 % of the
            host's memory (its cgroup's limit where lower) and, on a GPU, 25 % of its free
            memory, float16 storage, no spill folder. Pass ``ActivationCache(memory_gb=...,
            device_memory_gb=..., device=..., spill_dir=..., dtype=...)`` to set the budgets,
            spill to disk or share activations between worker processes (a cache made without
            ``device`` keeps a GPU's activations in host memory). A budget (other than 0, which
            caches nothing there) smaller than one batch of a model's largest cut raises
            ConfigError naming the smallest workable budget.
        cost_tables: memoise MACs per fragment and per stitch shape (False: count the whole
            built network every trial, the slow reference path).
        fill: on a probe-split miss, store every cut of that model in one chained pass, batch
            by batch ("model", the default, where those cuts fit in half the cache's memory:
            else as "cut"), or only the requested cut ("cut"). Other splits are always filled
            one cut at a time, on first use.
        channels_last: store convolutional zoo models (three or more Conv2d layers) and their
            inputs channels-last on the CPU, where it runs them 1.3-1.9x faster (measured on
            the mini zoo; a ViT gains nothing, so it is left alone). The zoo's models are
            changed in place, as ``.to(device)`` already does.
        pieces: build fragments from per-model pieces traced once (False: trace each fragment
            as one graph, cheaper when nothing is reused, as in a one-off evaluation).
        autocast: ``"bfloat16"``: run every pass over frozen weights (activations, training
            inputs, measurement) under autocast to bfloat16, on the CPU or a GPU; None (the
            default): float32. Part of every activation's key. See :mod:`._device`.
    """

    def __init__(
        self,
        zoo: Zoo,
        data: DataSplits,
        *,
        device: str | torch.device = "auto",
        batch_size: int | None = None,
        ridge: float = 1e-4,
        cka_rows: str = "flatten",
        cache: ActivationCache | None = None,
        cost_tables: bool = True,
        fill: str = "model",
        channels_last: bool = True,
        pieces: bool = True,
        autocast: str | None = None,
    ) -> None:
        if fill not in ("model", "cut"):
            raise ConfigError(f"fill must be 'model' or 'cut', got {fill!r}")
        self.fill = fill
        self.pieces = pieces
        self.zoo, self.data = zoo, data
        self.device = resolve_device(device)
        self.autocast = check_autocast(autocast, self.device)
        if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):
            raise ConfigError(f"batch_size must be an integer >= 1 or None, got {batch_size!r}")
        self._batch_size, self.ridge, self.cka_rows = batch_size, ridge, cka_rows
        self._chains: dict[str, PieceChain] = {}
        self.cache = cache if cache is not None else ActivationCache(device=self.device)
        self.cost_tables = cost_tables
        self._fingerprints: dict[str, str] = {}
        #: each :class:`~stitch_nas.activations.Memo`'s values on this context (owned by the
        #: modules that fill them: MAC tables, piece roles, a trained SN-Net...)
        self.memos: dict[Any, dict[Any, Any]] = {}
        self._channels_last: set[str] = set()
        self._budget_checked: set[str] = set()
        for name in zoo.names():
            model = zoo[name].model.to(self.device).eval()
            if channels_last and self.device.type == "cpu" and is_convolutional(model):
                model.to(memory_format=torch.channels_last)
                self._channels_last.add(name)

    @property
    def batch_size(self) -> int:
        """Images per forward pass (chosen on first use when not given, see ``__init__``)."""
        if self._batch_size is None:
            self._batch_size = auto_batch_size(self)
        return self._batch_size

    @property
    def channels_last_models(self) -> frozenset[str]:
        """Zoo models stored (and fed) channels-last by this context."""
        return frozenset(self._channels_last)

    # -- models and cuts ---------------------------------------------------------------------
    def entry(self, model: str) -> ZooEntry:
        return self.zoo[model]

    def input_shape(self, model: str) -> tuple[int, int, int, int]:
        h, w = self.entry(model).input_spec.size
        return (1, 3, h, w)

    def chain(self, model: str) -> PieceChain:
        """``model`` traced once into its pieces between cut points (see :mod:`.pieces`)."""
        if model not in self._chains:
            self._chains[model] = PieceChain(self.entry(model).model, self.input_shape(model))
        return self._chains[model]

    def cuts(self, model: str) -> list[CutPoint]:
        return self.chain(model).cuts

    def cut(self, model: str, name: str) -> CutPoint:
        return self.chain(model).cut(name)

    def segment(self, model: str, start: str | None, end: str | None) -> torch.nn.Module:
        """``model`` from cut ``start`` to cut ``end``, as a chain of its memoised pieces.

        A model is traced into one GraphModule per run between consecutive cuts, once; every
        fragment is a Sequential of those pieces, so no trial builds or compiles a new graph.
        Running pieces in sequence is exactly running the model (see ``fragments.split``).
        With ``pieces=False`` the fragment is traced as one graph instead.
        """
        chain = self.chain(model)
        if not self.pieces:
            return segment(chain.model, start, end, input_shape=chain.input_shape)
        return chain.fragment(start, end)

    # -- data and activations ----------------------------------------------------------------
    def split(self, name: str) -> Any:
        splits = self.data.splits()
        if name not in splits:
            raise UnknownNameError(f"unknown split {name!r}; use one of {sorted(splits)}")
        return splits[name]

    @property
    def num_classes(self) -> int:
        return len(self.data.label_names)

    def labels(self, split: str) -> torch.Tensor:
        return self.split(split).y

    def _preprocess(self, model: str, x: torch.Tensor) -> torch.Tensor:
        x = self.entry(model).input_spec.preprocess(to_device(x, self.device))
        if model in self._channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    def inputs(self, model: str, split: str) -> torch.Tensor:
        """The split's images preprocessed for ``model`` (resize + normalise), on the device,
        whole; prefer :meth:`input_batches`.

        Not memoised: at 224 px a 2,000-image probe is 1.2 GB in float32 per model, which would
        stay held outside the cache's budget (the probe's activations are cached instead).
        """
        return torch.cat(list(self.input_batches(model, split)))

    def input_batches(self, model: str, split: str) -> Iterator[torch.Tensor]:
        """The split's images preprocessed for ``model``, one batch at a time, on the device."""
        transform = self.entry(model).input_spec.image_transform()  # the model's own crop
        for batch in self.split(split).batches(self.batch_size, transform=transform):
            yield self._preprocess(model, batch)

    def batches(self, x: torch.Tensor) -> Iterator[torch.Tensor]:
        for i in range(0, x.shape[0], self.batch_size):
            yield x[i : i + self.batch_size]

    def frozen(self) -> Any:
        """The context of a pass that trains nothing: no autograd, and this context's autocast
        (``with ctx.frozen(): out = fragment(x)``); outputs may be bfloat16 under autocast."""
        return frozen_pass(self.device, self.autocast)

    def run(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``module`` over ``x`` in batches, as a frozen pass (:meth:`frozen`), in float32.

        ``no_grad`` rather than ``inference_mode``: cached outputs may later feed adapter
        training, which inference tensors cannot.
        """
        with self.frozen():
            return torch.cat([module(b).float() for b in self.batches(x)])

    def activation_key(self, model: str, cut: str | None, split: str) -> ActivationKey:
        if model not in self._fingerprints:
            self._fingerprints[model] = weights_fingerprint(self.entry(model).model)
        if "data" not in self._fingerprints:
            self._fingerprints["data"] = self.data.fingerprint()
        return ActivationKey(
            model=model,
            weights=self._fingerprints[model],
            cut=cut,
            split=split,
            data=self._fingerprints["data"],
            preprocess=repr(self.entry(model).input_spec),
            dtype=self.cache.dtype_name,
            autocast=self.autocast,
        )

    def for_compute(self, model: str, batch: torch.Tensor) -> torch.Tensor:
        """A stored batch as float32 on the device (channels-last for such models' grids)."""
        # always a copy: the consumer may open with an in-place op (ReLU(inplace=True) after a
        # norm cut), which must not overwrite the cached tensor (a move to the device is one)
        moved = to_device(batch, self.device)
        out = moved.to(torch.float32, copy=moved is batch)
        if model in self._channels_last and out.dim() == 4:
            out = out.contiguous(memory_format=torch.channels_last)
        return out

    def activation_batches(self, model: str, cut: str | None, split: str) -> Iterator[torch.Tensor]:
        """Output of ``model`` at ``cut`` (None: its final output) on ``split``, batch by batch.

        Float32 on the device, in split order, ``batch_size`` images at a time. Served from the
        cache (memory, then spill files read through a memory map) or computed from the nearest
        cached earlier cut and stored as it streams; see :mod:`stitch_nas.activations._stream`.
        """
        self.split(split)  # an unknown split is named before any work
        self.check_budget(model)
        key = self.activation_key(model, cut, split)
        values = _stream.stored(self, key)
        if (
            values is None
            and split == "probe"
            and self.fill == "model"
            and _stream.fill_fits(self, model, split)
        ):
            _stream.fill_every_cut(self, model, split)
            values = _stream.stored(self, key)
        if values is not None:
            return _stream.stored_batches(self, model, values)
        return _stream.compute_batches(self, model, cut, split)

    def activation_rows(
        self, model: str, cut: str | None, split: str, index: torch.Tensor
    ) -> Iterator[torch.Tensor]:
        """:meth:`activation_batches` for the images ``index`` (sorted) of ``split`` only.

        Read from the cache when it holds the activation over the whole split; otherwise only
        those rows are computed, and stored under their own key (the fidelity gate's slices and
        the checks' sample are the same rows every time). An index of the whole split is the
        whole split's activation (:meth:`activation_batches`).
        """
        self.split(split)
        self.check_budget(model)
        if len(index) == len(self.split(split)):
            return self.activation_batches(model, cut, split)
        values = _stream.stored(self, self.activation_key(model, cut, split))
        if values is not None:
            return _stream.gathered_batches(self, model, values, index)
        return _stream.computed_rows(self, model, cut, split, index)

    def input_rows(self, model: str, split: str, index: torch.Tensor) -> Iterator[torch.Tensor]:
        """:meth:`input_batches` for the images ``index`` (sorted) of ``split`` only."""
        transform = self.entry(model).input_spec.image_transform()
        for batch in self.split(split).batches(self.batch_size, index, transform):
            yield self._preprocess(model, batch)

    def activation(self, model: str, cut: str | None, split: str) -> torch.Tensor:
        """Output of ``model`` at ``cut`` (None: its final output) on ``split``, whole.

        Float32 on the device. Meant for the probe (small, always worth keeping); a trial's
        accuracy pass reads :meth:`activation_batches` instead and never holds a whole split.
        """
        return torch.cat(list(self.activation_batches(model, cut, split)))

    def check_budget(self, model: str) -> None:
        """Refuse a memory budget (host or device) too small for one batch of ``model``'s
        largest activation.

        Raises:
            ConfigError: Naming the smallest workable budget (0 keeps nothing in memory and
                is always allowed).
        """
        if model in self._budget_checked:
            return
        element = torch.empty(0, dtype=self.cache.dtype).element_size()
        per_image = max((math.prod(c.shape) for c in self.cuts(model)), default=0) * element
        needed = per_image * self.batch_size
        for what, where, budget in (
            ("memory", "in memory", self.cache.budget_bytes),
            ("device memory", "on the device", self.cache.device_budget_bytes),
        ):
            if 0 < budget < needed:
                raise ConfigError(
                    f"cache {what} budget {budget / 2**30:.4g} GiB is below one batch of "
                    f"{model!r} ({self.batch_size} images at its largest cut need "
                    f"{needed / 2**30:.4g} GiB in {self.cache.dtype_name}); set the budget to "
                    f">= {needed / 2**30:.4g} GiB, lower batch_size, or use 0 to cache nothing "
                    f"{where}"
                )
        self._budget_checked.add(model)


def zoo_models(ctx: StitchContext, models: Sequence[str] | None, minimum: int) -> list[str]:
    """``models`` (default: the whole zoo), checked to exist and to be at least ``minimum``."""
    names = list(models) if models else list(ctx.zoo.names())
    for name in names:
        ctx.entry(name)  # unknown names raise UnknownModelError here
    if len(set(names)) < minimum:
        raise ConfigError(f"this search space needs at least {minimum} models, got {names}")
    return sorted(set(names))
