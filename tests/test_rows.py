"""Training reads the train split a mini-batch at a time: from the cache, or recomputed."""

from __future__ import annotations

import pytest
import torch

from stitch_nas import measure
from stitch_nas.activations import ActivationCache, ActivationRows, InputRows
from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from tests._tiny import tiny_context

CUT = ("resnet", "layer1.0")
INDEX = torch.tensor([7, 0, 31, 5, 5, 200, 63])  # any order, repeats allowed: a random batch


@pytest.mark.parametrize("storage", ["memory", "spill", "nothing"])
def test_rows_are_the_split_rows_wherever_they_come_from(storage, tmp_path):
    cache = {
        "memory": ActivationCache(memory_gb=1.0, dtype="float32"),
        "spill": ActivationCache(memory_gb=0, spill_dir=tmp_path, dtype="float32"),
        "nothing": ActivationCache(memory_gb=0, dtype="float32"),
    }[storage]
    ctx = tiny_context(cache=cache)
    rows = ActivationRows(ctx, *CUT, "train")
    whole = tiny_context(cache=ActivationCache(dtype="float32")).activation(*CUT, "train")
    assert len(rows) == whole.shape[0]
    torch.testing.assert_close(rows.take(INDEX), whole[INDEX], rtol=1e-5, atol=1e-5)
    # where it was read from: memory, the spill file, or recomputed from the images
    key = ctx.activation_key(*CUT, "train")
    assert (ctx.cache.get(key) is not None) == (storage == "memory")
    assert (ctx.cache.mapped(key) is not None) == (storage == "spill")
    images = InputRows(ctx, "resnet", "train").take(INDEX)
    torch.testing.assert_close(images, ctx.inputs("resnet", "train")[INDEX])


def test_a_cache_that_keeps_nothing_trains_the_same_adapter():
    options = {"loss": "match", "steps": 20, "eval_every": 10, "patience": 0, "batch_size": 16}
    config = StitchConfig(
        (Fragment("resnet", None, "layer1.0"), Fragment("resnet", "layer2.0", None)),
        (AdapterSpec("conv3x3", tuple(sorted(options.items()))),),
    )
    results = []
    for budget in (1.0, 0):  # the train split kept in memory, then recomputed per mini-batch
        ctx = tiny_context(cache=ActivationCache(memory_gb=budget, dtype="float32"))
        net, measurement = measure(ctx, config)
        results.append((net.state_dict(), measurement.accuracy))
    (kept, kept_acc), (recomputed, recomputed_acc) = results
    assert kept.keys() == recomputed.keys()
    for name in kept:
        torch.testing.assert_close(kept[name], recomputed[name], rtol=1e-4, atol=1e-4)
    assert abs(kept_acc - recomputed_acc) <= 1 / 250  # at most one validation image apart
