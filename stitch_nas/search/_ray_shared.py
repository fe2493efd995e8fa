"""A StitchContext rebuilt in Ray workers from the zoo and the data in the object store.

The driver puts the zoo and the data in the object store once (the code of a model class
imported from a ``module_path`` folder goes with it, by value), with the context's options and
its cache's budget, storage dtype and spill folder. Each worker rebuilds a
:class:`~stitch_nas.activations.StitchContext` with its own bounded
:class:`~stitch_nas.activations.ActivationCache` and fills it on demand, as a local run does:
no activation travels, so what a worker holds is what one local run holds, whatever the size
of the splits, and it measures what a local run measures. Workers on one machine that are
given a spill folder (``search.cache_dir``) share it: an activation one of them spilled there
is read by the others, not computed again. Used by both the Ray executor and the Ray Tune
trainable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from stitch_nas.activations import ActivationCache, StitchContext
from stitch_nas.config import AdapterSpec, StitchConfig
from stitch_nas.extras import require
from stitch_nas.stitching import NETWORKS, joint_networks
from stitch_nas.zoo import user_code_modules

__all__ = [
    "NetworkShipper",
    "SharedContext",
    "cache_options",
    "import_ray",
    "install_shipped",
    "models_on_cpu",
    "share_context",
]

logger = logging.getLogger(__name__)


def import_ray() -> ModuleType:
    """Import Ray, or raise a one-line error that says how to install it."""
    return require("ray", "ray", "Ray workers (--executor ray, RayExecutor)")


@dataclass
class SharedContext:
    """What a worker needs to rebuild the driver's context; cheap to pickle (a ref and options).

    Attributes:
        bundle: ObjectRef of ``(zoo, data)`` (or the pair), models on the CPU.
        options: keyword arguments of :class:`StitchContext` (batch size, ridge, ...).
        cache: keyword arguments of each worker's own :class:`ActivationCache`: the driver's
            budget, storage dtype and spill folder (:func:`cache_options`).
    """

    bundle: Any
    options: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)

    def materialize(
        self, device: str | torch.device = "cpu", cpus: float | None = None
    ) -> StitchContext:
        """Build the worker's context on ``device`` (fetches the zoo and the data once).

        Its cache is the worker's own, bounded as the driver's is, and fills on demand as a
        local run's does: the worker holds what one local run holds, whatever the split sizes.
        ``cpus``, the CPUs the worker reserved, are shared between its processes that decode
        image files (at most all but one) and its torch threads (the rest), so that N workers
        on N CPUs keep N busy, not N times the decoders more.
        """
        # an ObjectRef from the executor; the pair itself from Tune's with_parameters
        zoo, data = self.bundle if isinstance(self.bundle, tuple) else import_ray().get(self.bundle)
        if cpus is not None:
            reserved = max(1, int(cpus))
            torch.set_num_threads(max(1, reserved - data.limit_decoders(reserved - 1)))
        cache = ActivationCache(**self.cache, device=device)
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


def cache_options(cache: ActivationCache) -> dict[str, Any]:
    """The keyword arguments of an :class:`ActivationCache` bounded as ``cache`` is.

    The same budget, so a worker's cache holds what the driver's (a local run's) may; the same
    storage dtype, which is part of every activation's key and sets its rounding, so a worker
    measures what a local run measures; the same spill folder, which workers on one machine
    (and the driver) share: an activation one of them spilled there is read, not recomputed;
    and the folder's size as the driver was given it (left out, each process takes half its
    own disk's free space).
    A driver on the CPU has no device budget: a worker on a GPU then takes its own default
    share of that GPU's free memory (:func:`~stitch_nas.activations.cache_budgets`).
    """
    on_device = cache.device_budget_bytes / 2**30 if cache.device_budget_bytes else None
    return {
        "memory_gb": cache.budget_bytes / 2**30,
        "device_memory_gb": on_device,
        "spill_dir": None if cache.spill_dir is None else str(cache.spill_dir),
        "disk_gb": cache.disk_gb,
        "dtype": cache.dtype_name,
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


def share_context(ctx: StitchContext, put: Callable[[Any], Any] | None = None) -> SharedContext:
    """Put ``ctx``'s zoo and data in the object store once; the handle workers rebuild it from.

    No activation is computed or shipped: each worker fills its own bounded cache as a local run
    does (:meth:`SharedContext.materialize`), so the object store holds the weights and the
    images (or the description of where they are read from), whatever the splits' sizes. This
    is the one way a context is shipped to Ray: the executor's actors and the Tune trainable
    both rebuild it so.

    Args:
        ctx: The driver's context.
        put: How the ``(zoo, data)`` pair is stored: ``ray.put`` (default, needs
            ``ray.init()``), or ``lambda v: v`` to keep the pair itself for
            ``tune.with_parameters``, which stores the whole handle once (then pickle it inside
            :func:`models_on_cpu`).

    Returns:
        The handle to send to workers.

    Raises:
        ConfigError: The cache's budget is below one batch of a model's largest cut, which
            every worker would otherwise raise on its first trial.
    """
    ray = import_ray()
    from ray import cloudpickle  # what Ray pickles with

    for name in ctx.zoo.names():  # the driver computes nothing, so it checks here, once
        ctx.check_budget(name)

    store = put if put is not None else ray.put
    # a model class from a module_path folder: workers cannot import it, so it travels along
    for module in user_code_modules():
        cloudpickle.register_pickle_by_value(module)
    with models_on_cpu(ctx):
        bundle = store((ctx.zoo, ctx.data))
    return SharedContext(bundle, context_options(ctx), cache_options(ctx.cache))


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
