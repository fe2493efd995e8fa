"""Speed on the device: bfloat16 autocast of frozen passes, pinned copies, the GPU's batch."""

from __future__ import annotations

import math

import pytest
import torch

from stitch_nas.activations import ActivationCache, StitchContext, auto_batch_size
from stitch_nas.activations._device import resolve_device, to_device
from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.stitching import build, measure
from stitch_nas.stitching._measure import output_batches
from tests._tiny import tiny_context

# trained digits models, so that predictions are not all near-ties
STITCH = StitchConfig(
    (Fragment("resnet", None, "layer2.0"), Fragment("byobnet", "stages.2.0", None)),
    (AdapterSpec("lstsq"),),
)


def _contexts(zoo, data):
    """The same zoo and data in float32 and under bfloat16 autocast (float32 storage, so the
    storage's rounding does not hide or add to the autocast's)."""
    plain = StitchContext(zoo, data, cache=ActivationCache(dtype="float32"))
    fast = StitchContext(zoo, data, cache=ActivationCache(dtype="float32"), autocast="bfloat16")
    return plain, fast


def test_autocast_is_part_of_every_activation_key(mini_zoo, digits):
    plain, fast = _contexts(mini_zoo, digits)
    assert plain.activation_key("resnet", "layer2.0", "val").autocast is None
    key = fast.activation_key("resnet", "layer2.0", "val")
    assert key.autocast == "bfloat16"
    assert key.digest() != plain.activation_key("resnet", "layer2.0", "val").digest()


def test_autocast_activations_are_float32_close_to_but_not_float32s(mini_zoo, digits):
    plain, fast = _contexts(mini_zoo, digits)
    a = plain.activation("resnet", "layer2.0", "probe")
    b = fast.activation("resnet", "layer2.0", "probe")
    assert b.dtype == torch.float32
    assert not torch.equal(a, b)  # the pass did run in bfloat16
    # bfloat16 keeps 8 bits of mantissa: through a few layers, errors of a few per cent
    assert float((a - b).norm() / a.norm()) < 0.03


def test_autocast_measurement_agrees_with_float32_on_trained_models(mini_zoo, digits):
    plain, fast = _contexts(mini_zoo, digits)
    for config in (StitchConfig.single("resnet"), STITCH):
        net_a, at_a = measure(plain, config)
        net_b, at_b = measure(fast, config)
        pred_a = torch.cat([o.argmax(1) for o in output_batches(plain, net_a, "val")])
        pred_b = torch.cat([o.argmax(1) for o in output_batches(fast, net_b, "val")])
        agreement = float((pred_a == pred_b).float().mean())
        assert agreement >= 0.98, (config, agreement)
        assert abs(at_a.accuracy - at_b.accuracy) <= 0.02
        assert (at_a.macs, at_a.params) == (at_b.macs, at_b.params)


def test_autocast_does_not_leak_into_the_callers_code(mini_zoo, digits):
    _, fast = _contexts(mini_zoo, digits)
    net = build(fast, STITCH)
    batches = output_batches(fast, net, "val")
    first = next(batches)  # the generator is suspended mid-split
    assert first.dtype == torch.float32
    assert not torch.is_autocast_enabled("cpu")
    assert torch.is_grad_enabled()
    batches.close()


def test_an_unsupported_autocast_names_the_fix():
    with pytest.raises(ConfigError, match="autocast 'float16' is not supported; use bfloat16"):
        tiny_context(autocast="float16")
    with pytest.raises(ConfigError, match="not supported on device 'meta'"):
        StitchContext(tiny_context().zoo, tiny_context().data, device="meta", autocast="bfloat16")


class _Recorder:
    """A host tensor's stand-in that records how it was moved."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def pin_memory(self) -> _Recorder:
        self.calls.append(("pin",))
        return self

    def to(self, device, non_blocking=False) -> _Recorder:
        self.calls.append(("to", str(device), non_blocking))
        return self


def test_copies_to_a_gpu_go_through_pinned_memory_without_blocking():
    x = _Recorder()
    to_device(x, torch.device("cuda:0"))  # type: ignore[arg-type]
    assert x.calls == [("pin",), ("to", "cuda:0", True)]
    on_cpu = torch.ones(2)
    assert to_device(on_cpu, torch.device("cpu")) is on_cpu  # nothing to copy on the host


def test_the_gpu_batch_fills_free_memory_beside_the_cache(monkeypatch):
    from stitch_nas.activations import GPU_MAX_BATCH, LIVE_ACTIVATIONS

    # a host budget far above the GPU's: it takes nothing from the GPU
    cache = ActivationCache(memory_gb=64.0, device_memory_gb=1.0, device="cuda")
    ctx = tiny_context(device="cpu", cache=cache)
    ctx.device = torch.device("cuda")  # only the batch rule is exercised: nothing runs
    largest = max(
        max(math.prod(ctx.input_shape(n)), *(math.prod(c.shape) for c in ctx.cuts(n)))
        for n in ctx.zoo.names()
    )
    per_batch = LIVE_ACTIVATIONS * 4 * largest  # bytes per image
    free = 2**30 + 100 * per_batch + per_batch // 2  # the cache's 1 GiB, then room for 100
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * 2**30))
    assert auto_batch_size(ctx) == 100
    # what the cache already holds on the GPU is not free any more, and not set aside twice
    assert cache.reserve(2**29, "cuda") == torch.device("cuda")
    free -= 2**29
    assert auto_batch_size(ctx) == 100
    cache.release(2**29, "cuda")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80 * 2**30,) * 2)
    assert auto_batch_size(ctx) == GPU_MAX_BATCH
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2**20, 80 * 2**30))
    assert auto_batch_size(ctx) == 1  # less free than the cache's budget: one image at a time


def test_auto_is_cuda_where_there_is_one_else_the_cpu(monkeypatch):
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cuda:1") == torch.device("cuda:1")  # others as named
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ctx = tiny_context()  # the library's default is auto too
    assert ctx.device == torch.device("cpu") and ctx.cache.device_budget_bytes == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


def test_ray_workers_rebuild_the_drivers_autocast():
    from stitch_nas.search._ray_shared import context_options

    driver = tiny_context(autocast="bfloat16")
    worker = StitchContext(driver.zoo, driver.data, **context_options(driver))
    assert worker.autocast == "bfloat16"
    key = ("resnet", "layer1.0", "val")
    assert worker.activation_key(*key) == driver.activation_key(*key)  # they share the cache
