"""A StitchContext shared with Ray workers through the object store.

The driver puts the zoo and the data in the object store once (the code of a model class
imported from a ``module_path`` folder goes with it, by value), and every cached activation
(each model at each cut on the probe and validation splits) as its own numpy array. Workers
rebuild a :class:`~stitch_nas.activations.StitchContext` whose cache reads those arrays
zero-copy from the node's shared memory, so N workers hold one copy of the activations per
machine, not N, and no trial recomputes a frozen prefix. Used by both the Ray executor and the
Ray Tune trainable.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from stitch_nas.activations import ActivationCache, ActivationKey, StitchContext
from stitch_nas.config import AdapterSpec, StitchConfig
from stitch_nas.extras import require
from stitch_nas.stitching import NETWORKS, joint_networks
from stitch_nas.zoo import user_code_modules

__all__ = [
    "NetworkShipper",
    "SharedActivationCache",
    "SharedContext",
    "import_ray",
    "install_shipped",
    "models_on_cpu",
    "share_context",
]

logger = logging.getLogger(__name__)

SHARED_SPLITS = ("probe", "val")


def import_ray() -> ModuleType:
    """Import Ray, or raise a one-line error that says how to install it."""
    return require("ray", "ray", "Ray workers (--executor ray, RayExecutor)")


class SharedActivationCache(ActivationCache):
    """An :class:`ActivationCache` that first looks in the Ray object store.

    Arrays fetched from the object store are read-only views of shared memory; like every
    cached tensor they must not be written to. Keys not shared by the driver (another split,
    say) are computed and cached locally as usual.

    Args:
        refs: ``ActivationKey.digest()`` -> ObjectRef of the numpy array, or the array.
        memory_gb: Budget of the local part, as for :class:`ActivationCache`.
        spill_dir: Spill folder of the local part.
    """

    def __init__(
        self,
        refs: Mapping[str, Any],
        memory_gb: float = 2.0,
        spill_dir: str | Path | None = None,
    ) -> None:
        super().__init__(memory_gb=memory_gb, spill_dir=spill_dir)
        self._refs = dict(refs)
        self._shared: dict[str, torch.Tensor] = {}
        self._counts.update(shared_fetches=0, shared_hits=0)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, ActivationKey) and key.digest() in self._refs:
            return True
        return super().__contains__(key)

    def get_or_compute(
        self, key: ActivationKey, compute: Callable[[], torch.Tensor]
    ) -> torch.Tensor:
        digest = key.digest()
        ref = self._refs.get(digest)
        if ref is None:
            return super().get_or_compute(key, compute)
        with self._lock:
            tensor = self._shared.get(digest)
            if tensor is not None:
                self._counts["shared_hits"] += 1
                return tensor
            # Tune's with_parameters hands over the arrays themselves, the executor ObjectRefs
            array = ref if isinstance(ref, np.ndarray) else import_ray().get(ref)
            with warnings.catch_warnings():  # the view is read-only, as cached tensors are
                warnings.filterwarnings("ignore", message=".*not writable.*")
                tensor = torch.from_numpy(array)
            self._shared[digest] = tensor
            self._counts["shared_fetches"] += 1
            return tensor


@dataclass
class SharedContext:
    """What a worker needs to rebuild the driver's context; cheap to pickle (refs only).

    Attributes:
        bundle: ObjectRef of ``(zoo, data)`` (or the pair), models on the CPU.
        activations: ``ActivationKey.digest()`` -> ObjectRef of a numpy array (or the array).
        options: keyword arguments of :class:`StitchContext` (batch size, ridge, ...).
        cache_memory_gb: budget of each worker's local cache (keys not shared).
        spill_dir: spill folder of each worker's local cache.
    """

    bundle: Any
    activations: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    cache_memory_gb: float = 2.0
    spill_dir: str | None = None

    def materialize(self, device: str | torch.device = "cpu") -> StitchContext:
        """Build the worker's context on ``device`` (fetches the zoo once)."""
        # an ObjectRef from the executor; the pair itself from Tune's with_parameters
        zoo, data = self.bundle if isinstance(self.bundle, tuple) else import_ray().get(self.bundle)
        cache = SharedActivationCache(
            self.activations, memory_gb=self.cache_memory_gb, spill_dir=self.spill_dir
        )
        return StitchContext(zoo, data, device=device, cache=cache, **self.options)


def context_options(ctx: StitchContext) -> dict[str, Any]:
    """The keyword arguments that rebuild ``ctx``'s behaviour in another process."""
    return {
        "batch_size": ctx.batch_size,
        "ridge": ctx.ridge,
        "cka_rows": ctx.cka_rows,
        "cost_tables": ctx.cost_tables,
        "fill": ctx.fill,
        "pieces": ctx.pieces,
        "autocast": ctx.autocast,
        # channels-last is a per-model choice the worker makes again by the same rule
        "channels_last": bool(ctx.channels_last_models),
    }


@contextmanager
def models_on_cpu(ctx: StitchContext) -> Iterator[None]:
    """The zoo's models on the CPU for the duration (workers may lack the driver's GPU)."""
    models = {name: ctx.entry(name).model for name in ctx.zoo.names()}
    on_device = {name: next(m.parameters(), torch.empty(0)).device for name, m in models.items()}
    try:
        for model in models.values():
            model.to("cpu")
        yield
    finally:
        for name, model in models.items():
            model.to(on_device[name])


def share_context(
    ctx: StitchContext,
    splits: tuple[str, ...] = SHARED_SPLITS,
    put: Callable[[Any], Any] | None = None,
) -> SharedContext:
    """Put ``ctx``'s zoo, data and every activation on ``splits`` in the object store.

    Activations missing from ``ctx``'s cache are computed here first, once, which is what
    the first trials of a local search would do anyway. This is the one way a context is
    shipped to Ray: the executor's actors and the Tune trainable both rebuild it with
    :meth:`SharedContext.materialize`.

    Args:
        ctx: The driver's context.
        splits: Splits whose activations trials read (probe for stitches and CKA, val for
            accuracy).
        put: How each large value is stored: ``ray.put`` (default, needs ``ray.init()``), or
            ``lambda v: v`` to keep the values themselves for ``tune.with_parameters``, which
            stores the whole handle once (then pickle it inside :func:`models_on_cpu`).

    Returns:
        The handle to send to workers.
    """
    ray = import_ray()
    from ray import cloudpickle  # what Ray pickles with

    store = put if put is not None else ray.put
    # a model class from a module_path folder: workers cannot import it, so it travels along
    for module in user_code_modules():
        cloudpickle.register_pickle_by_value(module)
    with models_on_cpu(ctx):
        bundle = store((ctx.zoo, ctx.data))
    refs: dict[str, Any] = {}
    total = 0
    for name in ctx.zoo.names():
        cuts: list[str | None] = [c.name for c in ctx.cuts(name)]
        for split in splits:
            for cut in [*cuts, None]:
                array = ctx.activation(name, cut, split).detach().cpu().numpy()
                refs[ctx.activation_key(name, cut, split).digest()] = store(array)
                total += array.nbytes
    logger.info("shared %d activations (%.1f MiB)", len(refs), total / 2**20)
    return SharedContext(
        bundle=bundle,
        activations=refs,
        options=context_options(ctx),
        cache_memory_gb=ctx.cache.budget_bytes / 2**30,
        spill_dir=str(ctx.cache.spill_dir) if ctx.cache.spill_dir is not None else None,
    )


class NetworkShipper:
    """Trains each jointly trained network the search samples once, on the driver, and stores
    it for workers.

    A config whose first adapter names a whole jointly trained network (a plug-in's
    :class:`~stitch_nas.stitching.NetworkBuilder`: SN-Net's ``snnet`` space with ``joint``)
    needs that network trained; without this every worker would train the same seeded network
    itself. The first config that names one trains it here (in the driver's context, so the
    driver's own re-measurements use it too) and puts its weights in the object store once.

    Args:
        ctx: The driver's context.
        put: How the weights are stored (``ray.put``).
    """

    def __init__(self, ctx: StitchContext, put: Callable[[Any], Any]) -> None:
        self.ctx, self.put = ctx, put
        self.stored: dict[tuple[Any, ...], Any] = {}

    def refs(self, config: StitchConfig) -> list[tuple[AdapterSpec, Any]]:
        """``(spec, ObjectRef of its weights)`` per jointly trained network ``config`` names."""
        shipped = []
        for spec in joint_networks(config):
            key = (spec.kind, spec.options)
            if key not in self.stored:
                self.stored[key] = self.put(NETWORKS.get(spec.kind).state(self.ctx, spec))
                logger.info("%s network trained on the driver, shipped to workers", spec.kind)
            shipped.append((spec, self.stored[key]))
        return shipped


def install_shipped(ctx: StitchContext, shipped: list[tuple[AdapterSpec, Any]]) -> None:
    """In a worker: load each shipped network into ``ctx``, fetched once and never trained here."""
    for spec, ref in shipped:
        network = NETWORKS.get(spec.kind)
        if not network.holds(ctx, spec):
            network.install(ctx, spec, import_ray().get(ref))
