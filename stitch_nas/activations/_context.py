"""StitchContext: the zoo, the data, and everything computed once and shared by all trials.

Cut points, fragment modules, preprocessed inputs, activations at every cut on the probe and
validation splits, and the Gram matrices used by CKA are memoised here, so a trial only pays
for what is new: fitting its stitch and running the suffix after it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from stitch_nas.activations._cache import ActivationCache, ActivationKey, weights_fingerprint
from stitch_nas.data._splits import DataSplits
from stitch_nas.errors import ConfigError, UnknownCutError, check_finite
from stitch_nas.fragments._cuts import CutPoint, segment
from stitch_nas.fragments._pieces import PieceChain
from stitch_nas.similarity import _cka as similarity
from stitch_nas.zoo._entry import Zoo, ZooEntry

__all__ = ["StitchContext", "zoo_models"]

logger = logging.getLogger(__name__)


class StitchContext:
    """Shared, memoised state of a search over one zoo and one data set.

    Args:
        zoo: the models to take fragments from.
        data: train / probe / val / test splits; images in [0, 1].
        device: where fragments run ("cpu", "cuda", ...).
        batch_size: batch size of every forward pass over a split.
        ridge: relative ridge term of least-squares stitches.
        cka_rows: "flatten" (per-position features, Kornblith) or "pooled" rows for CKA.
        cache: where activations live; default: an in-memory cache of 2 GB without spill.
            Pass ``ActivationCache(memory_gb=..., spill_dir=...)`` to bound memory or share
            activations between worker processes.
        cost_tables: memoise MACs per fragment and per stitch shape (False: count the whole
            built network every trial, the slow reference path).
        fill: on a cache miss, compute every cut of that model on that split in one chained
            pass ("model", the default) or only the requested prefix ("cut").
        channels_last: store convolutional zoo models (three or more Conv2d layers) and their
            inputs channels-last on the CPU, where it runs them 1.3-1.9x faster (measured on
            the mini zoo; a ViT gains nothing, so it is left alone). The zoo's models are
            changed in place, as ``.to(device)`` already does.
        pieces: build fragments from per-model pieces traced once (False: trace each fragment
            as one graph, cheaper when nothing is reused, as in a one-off evaluation).
    """

    def __init__(
        self,
        zoo: Zoo,
        data: DataSplits,
        *,
        device: str | torch.device = "cpu",
        batch_size: int = 256,
        ridge: float = 1e-4,
        cka_rows: str = "flatten",
        cache: ActivationCache | None = None,
        cost_tables: bool = True,
        fill: str = "model",
        channels_last: bool = True,
        pieces: bool = True,
    ) -> None:
        if fill not in ("model", "cut"):
            raise ConfigError(f"fill must be 'model' or 'cut', got {fill!r}")
        self.fill = fill
        self.pieces = pieces
        self.zoo, self.data = zoo, data
        self.device = torch.device(device)
        self.batch_size, self.ridge, self.cka_rows = batch_size, ridge, cka_rows
        self._chains: dict[str, PieceChain] = {}
        self._inputs: dict[tuple[str, str, bool], torch.Tensor] = {}
        self.cache = cache if cache is not None else ActivationCache(memory_gb=2.0)
        self.cost_tables = cost_tables
        self._fingerprints: dict[str, str] = {}
        self.memo: dict[tuple, Any] = {}  # per-search memo of derived values (e.g. MACs)
        self._grams: dict[tuple[str, str, str, tuple[int, int] | None], torch.Tensor] = {}
        self._channels_last: set[str] = set()
        for name in zoo.names():
            model = zoo[name].model.to(self.device).eval()
            if channels_last and self.device.type == "cpu" and is_convolutional(model):
                model.to(memory_format=torch.channels_last)
                self._channels_last.add(name)

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
            raise UnknownCutError(f"unknown split {name!r}; use one of {sorted(splits)}")
        return splits[name]

    @property
    def num_classes(self) -> int:
        return len(self.data.label_names)

    def labels(self, split: str) -> torch.Tensor:
        return self.split(split).y

    def inputs(self, model: str, split: str) -> torch.Tensor:
        """The split's images preprocessed for ``model`` (resize + normalise), on the device."""
        spec = self.entry(model).input_spec
        key = (repr(spec), split, model in self._channels_last)
        if key not in self._inputs:
            x = spec.preprocess(self.split(split).x).to(self.device)
            if model in self._channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            self._inputs[key] = x
        return self._inputs[key]

    def batches(self, x: torch.Tensor) -> Iterator[torch.Tensor]:
        for i in range(0, x.shape[0], self.batch_size):
            yield x[i : i + self.batch_size]

    def run(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``module`` over ``x`` in batches, without autograd.

        ``no_grad`` rather than ``inference_mode``: cached outputs may later feed adapter
        training, which inference tensors cannot.
        """
        with torch.no_grad():
            return torch.cat([module(b) for b in self.batches(x)])

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
        )

    def activation(self, model: str, cut: str | None, split: str) -> torch.Tensor:
        """Output of ``model`` at ``cut`` (None: its final output) on ``split``, cached."""
        key = self.activation_key(model, cut, split)
        if self.fill == "model" and key not in self.cache:
            acts = self._every_cut(model, split)
            for name, act in acts.items():
                self.cache.get_or_compute(self.activation_key(model, name, split), _const(act))
            return acts[cut].to(self.device)

        def compute() -> torch.Tensor:
            out = self.run(self.segment(model, None, cut), self.inputs(model, split))
            check_finite(out, f"activations of {model!r} at {cut or 'output'!r} on {split}")
            return out

        return self.cache.get_or_compute(key, compute).to(self.device)

    def _every_cut(self, model: str, split: str) -> dict[str | None, torch.Tensor]:
        """All cut activations in one pass: segment by segment, each feeding the next."""
        bounds: list[str | None] = [None, *(c.name for c in self.cuts(model)), None]
        x, acts = self.inputs(model, split), {}
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            # a copy in: a piece may open with an in-place op (ReLU(inplace=True) after a
            # norm cut), which would overwrite the activation just cached for the previous cut
            x = self.run(self.segment(model, start, end), x.clone())
            check_finite(x, f"activations of {model!r} at {end or 'output'!r} on {split}")
            acts[end] = x
        return acts

    # -- similarity --------------------------------------------------------------------------
    def _row_rule(self, a: CutPoint, b: CutPoint) -> tuple[str, tuple[int, int] | None]:
        """How two cuts are compared: per-position rows on a common grid, else pooled rows."""
        sa, sb = a.spatial, b.spatial
        if a.layout in _GRIDS and b.layout in _GRIDS and sa is not None and sb is not None:
            return self.cka_rows, similarity.common_spatial((1, 1, *sa), (1, 1, *sb))
        return "pooled", None

    def _rows(
        self, act: torch.Tensor, cut: CutPoint, mode: str, spatial: tuple[int, int] | None
    ) -> torch.Tensor:
        return similarity.to_rows(act, cut.layout, spatial=spatial, mode=mode)

    def _gram(
        self, model: str, cut: CutPoint, mode: str, spatial: tuple[int, int] | None
    ) -> torch.Tensor:
        key = (model, cut.name, mode, spatial)
        if key not in self._grams:
            act = self.activation(model, cut.name, "probe")
            self._grams[key] = similarity.gram(self._rows(act, cut, mode, spatial))
        return self._grams[key]

    def joint_cka(self, src_model: str, src_cut: str, dst_model: str, dst_cut: str) -> float:
        """CKA on the probe set between A's output at ``src_cut`` and B's input at ``dst_cut``.

        Grid layouts are compared per position after resizing both maps to the smaller grid
        (``cka_rows="flatten"``) or after global pooling; tokens and vectors are mean-pooled.
        """
        a, b = self.cut(src_model, src_cut), self.cut(dst_model, dst_cut)
        mode, spatial = self._row_rule(a, b)
        return similarity.cka_from_grams(
            self._gram(src_model, a, mode, spatial), self._gram(dst_model, b, mode, spatial)
        )

    def cka_matrix(self, model_a: str, model_b: str) -> torch.Tensor:
        """ReStNet's matrix: CKA between every cut of ``model_a`` (rows) and of ``model_b``."""
        cuts_a, cuts_b = self.cuts(model_a), self.cuts(model_b)
        matrix = torch.zeros(len(cuts_a), len(cuts_b), dtype=torch.float64)
        for i, a in enumerate(cuts_a):
            for j, b in enumerate(cuts_b):
                matrix[i, j] = self.joint_cka(model_a, a.name, model_b, b.name)
        return matrix

    def cka_to(
        self,
        x: torch.Tensor,
        x_cut: CutPoint,
        model: str,
        cut: CutPoint,
        *,
        x_grams: dict[tuple, torch.Tensor] | None = None,
    ) -> float:
        """CKA between a probe activation ``x`` (laid out as ``x_cut``) and B at ``cut``.

        Scoring one ``x`` against many cuts, pass the same dict as ``x_grams``: ``x``'s Gram
        matrix is then computed once per row rule instead of once per cut.
        """
        rule = self._row_rule(x_cut, cut)
        grams = {} if x_grams is None else x_grams
        if rule not in grams:
            grams[rule] = similarity.gram(self._rows(x, x_cut, *rule))
        return similarity.cka_from_grams(grams[rule], self._gram(model, cut, *rule))


_GRIDS = ("nchw", "nhwc")


def is_convolutional(model: torch.nn.Module) -> bool:
    """Three or more Conv2d layers: such models run faster channels-last on the CPU."""
    return sum(isinstance(m, torch.nn.Conv2d) for m in model.modules()) >= 3


def _const(value: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: value


def zoo_models(ctx: StitchContext, models: Sequence[str] | None, minimum: int) -> list[str]:
    """``models`` (default: the whole zoo), checked to exist and to be at least ``minimum``."""
    names = list(models) if models else list(ctx.zoo.names())
    for name in names:
        ctx.entry(name)  # unknown names raise UnknownModelError here
    if len(set(names)) < minimum:
        raise ConfigError(f"this search space needs at least {minimum} models, got {names}")
    return sorted(set(names))
