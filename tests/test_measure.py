"""Measurements: cached paths equal uncached ones, cost tables equal full counts."""

from __future__ import annotations

import math

import pytest
import torch

from stitch_nas.activations import ActivationCache, StitchContext
from stitch_nas.activations._stream import rows_split
from stitch_nas.config import AdapterSpec, Fragment, HeadSpec, StitchConfig
from stitch_nas.data import load_digits_splits
from stitch_nas.errors import ConfigError, UnknownNameError
from stitch_nas.fragments import count_macs, count_params
from stitch_nas.stitching import build, measure, network_macs
from tests._tiny import tiny_context, tiny_zoo

PAIR = StitchConfig(
    (Fragment("resnet", None, "layer2.0"), Fragment("efficientnet", "blocks.2.0", None)),
    (AdapterSpec("lstsq"),),
)
CHAIN = StitchConfig(
    (
        Fragment("efficientnet", None, "blocks.1.0"),
        Fragment("resnet", "layer1.0", "layer3.0"),
        Fragment("vit", "patch_embed", None),
    ),
    (AdapterSpec("lstsq"), AdapterSpec("lstsq")),
)
FUSABLE = StitchConfig(
    (Fragment("resnet", None, "layer2.0"), Fragment("efficientnet", "blocks.1.0", None)),
    (AdapterSpec("lstsq", {"fuse": True}),),
)


@pytest.fixture(scope="module")
def ctx():
    # float32 storage: these tests compare cached paths with full forwards to 1e-5
    return tiny_context(cache=ActivationCache(dtype="float32"))


@pytest.mark.parametrize("config", [PAIR, CHAIN, FUSABLE], ids=["pair", "chain", "fused"])
def test_cached_path_equals_full_forward(ctx, config):
    net, _ = measure(ctx, config)
    x = ctx.split("val").x
    first = config.fragments[0]
    cached = ctx.run(net.new_parts(), ctx.activation(first.model, first.end, "val"))
    full = ctx.run(net, x)
    assert (cached - full).abs().max().item() <= 1e-5


@pytest.mark.parametrize("config", [PAIR, CHAIN, FUSABLE], ids=["pair", "chain", "fused"])
def test_cost_tables_equal_a_full_count(ctx, config):
    net = build(ctx, config)
    assert network_macs(ctx, net) == count_macs(net, (1, 3, 32, 32))
    assert network_macs(ctx, net) == network_macs(ctx, net)  # second time from the tables


def test_fused_network_agrees_with_unfused(ctx):
    fused = build(ctx, FUSABLE)
    plain = build(ctx, StitchConfig(FUSABLE.fragments, (AdapterSpec("lstsq"),)))
    x = ctx.split("val").x[:32]
    assert torch.allclose(ctx.run(fused, x), ctx.run(plain, x), atol=1e-4)
    # 48 source channels into a 24-channel cut: folding the map into the next 1x1 conv makes
    # that conv wider, so here fusion costs MACs; it saves them when the source is narrower
    assert network_macs(ctx, fused) != network_macs(ctx, plain)
    assert network_macs(ctx, fused) == count_macs(fused, (1, 3, 32, 32))
    assert any(hasattr(m, "stitch_fused") for m in fused.modules())


def test_single_model_measures_like_the_model_itself(ctx):
    net, m = measure(ctx, StitchConfig.single("resnet"))
    model = ctx.entry("resnet").model
    assert m.params == count_params(model)
    assert m.macs == count_macs(model, (1, 3, 32, 32))
    logits = ctx.run(model, ctx.inputs("resnet", "val"))
    expected = (logits.argmax(1) == ctx.labels("val")).float().mean().item()
    assert m.accuracy == pytest.approx(expected)
    assert m.cka == 1.0


def test_knn_and_linear_probe_heads_for_a_new_label_space(ctx):
    for kind in ("knn", "linear_probe"):
        config = StitchConfig(PAIR.fragments, PAIR.adapters, HeadSpec(kind))
        _, m = measure(ctx, config)
        assert 0.0 <= m.accuracy <= 1.0


def test_cache_is_invalidated_when_weights_or_data_change(tmp_path):
    zoo = tiny_zoo(("resnet",))

    data = load_digits_splits(probe_size=64)
    cache = ActivationCache(memory_gb=0.5, spill_dir=tmp_path)
    ctx = StitchContext(zoo, data, cache=cache)
    before = ctx.activation("resnet", "layer2.0", "probe").clone()
    with torch.no_grad():
        next(zoo["resnet"].model.parameters()).add_(1.0)
    changed = StitchContext(zoo, data, cache=cache)  # same cache, new weights
    after = changed.activation("resnet", "layer2.0", "probe")
    assert not torch.allclose(before, after)
    other = StitchContext(zoo, load_digits_splits(probe_size=64, seed=1), cache=cache)
    misses = cache.stats()["misses"]
    other.activation("resnet", "layer2.0", "probe")
    assert cache.stats()["misses"] > misses  # new data: nothing served from the old entries


def _pair_context(cache: ActivationCache, **kwargs) -> StitchContext:
    return StitchContext(
        tiny_zoo(("resnet", "efficientnet")),
        load_digits_splits(probe_size=64),
        cache=cache,
        **kwargs,
    )


def _all_cut_bytes(ctx: StitchContext, model: str, split: str) -> int:
    per_image = sum(math.prod(c.shape) for c in ctx.cuts(model))
    return per_image * len(ctx.split(split)) * ctx.cache.dtype.itemsize


@pytest.mark.parametrize("spill", [True, False], ids=["spill", "recompute"])
def test_a_budget_below_one_models_activations_gives_the_same_accuracies(tmp_path, spill):
    """The budget holds at every moment (peak included) and changes no accuracy."""
    budget = ActivationCache(
        memory_gb=1.0 / 1024, dtype="float32", spill_dir=tmp_path if spill else None
    )
    ctx = _pair_context(budget, batch_size=32)
    reference = _pair_context(ActivationCache(dtype="float32"), batch_size=32)
    assert _all_cut_bytes(ctx, "resnet", "val") > 2 * budget.budget_bytes
    configs = [PAIR, StitchConfig.single("resnet")]
    expected = [measure(reference, config)[1].accuracy for config in configs]
    for _ in range(2):  # the second round reads what the first stored, spilled or evicted
        for config, accuracy in zip(configs, expected, strict=True):
            assert measure(ctx, config)[1].accuracy == accuracy, config.describe()
    stats = budget.stats()
    assert stats["peak_bytes"] <= stats["budget_bytes"] and stats["evictions"] > 0
    assert (stats["disk_hits"] > 0) == spill


def test_recomputation_after_eviction_is_identical():
    """An evicted activation comes back from the nearest cached earlier cut, bit for bit."""
    ctx = _pair_context(ActivationCache(dtype="float32"), batch_size=32)
    cuts = [c.name for c in ctx.cuts("resnet")]
    first = ctx.activation("resnet", cuts[-1], "val")  # computed from the input
    ctx.activation("resnet", cuts[2], "val")
    ctx.cache.clear_memory()
    ctx.activation("resnet", cuts[2], "val")  # cached again: the nearest earlier cut
    misses = ctx.cache.stats()["misses"]
    again = ctx.activation("resnet", cuts[-1], "val")  # recomputed from cuts[2]
    assert ctx.cache.stats()["misses"] == misses + 1
    assert torch.equal(first, again)


@pytest.mark.parametrize("split", ["val", "train"])
def test_an_activation_does_not_depend_on_what_the_cache_held(split):
    """With float16 storage, the value at a cut is the same computed from the images or from
    any cached earlier cut (each cut on the way is rounded as if read from the cache), so a
    network measures the same whatever the cache's budget or history."""
    cuts = [c.name for c in _pair_context(ActivationCache()).cuts("resnet")]
    alone = _pair_context(ActivationCache()).activation("resnet", cuts[-1], split)
    for start in (cuts[0], cuts[1], cuts[-2]):
        ctx = _pair_context(ActivationCache())
        ctx.activation("resnet", start, split)  # cached: the nearer start
        misses = ctx.cache.stats()["misses"]
        assert torch.equal(ctx.activation("resnet", cuts[-1], split), alone), start
        assert ctx.cache.stats()["misses"] == misses + 1  # computed, from ``start``
    chained = _pair_context(ActivationCache())  # the probe: every cut in one chained pass
    for cut in (cuts[1], cuts[-1]):
        one = _pair_context(ActivationCache(), fill="cut")
        assert torch.equal(
            chained.activation("resnet", cut, "probe"), one.activation("resnet", cut, "probe")
        )


def test_float16_storage_is_within_its_tolerance():
    """float16 storage rounds each cut on the way to 2**-11 relative, so an activation k cuts
    deep is within k * 2**-11 of float32's (in norm); accuracies move by <= 1 %."""
    half = _pair_context(ActivationCache(dtype="float16"))
    full = _pair_context(ActivationCache(dtype="float32"))
    a, b = (
        half.activation("resnet", "layer2.0", "val"),
        full.activation("resnet", "layer2.0", "val"),
    )
    depth = [c.name for c in half.cuts("resnet")].index("layer2.0") + 1
    assert a.dtype == torch.float32 and not torch.equal(a, b)
    assert (a - b).norm() <= depth * 2**-11 * b.norm()
    for config in (PAIR, FUSABLE, StitchConfig.single("efficientnet")):
        _, m_half = measure(half, config)
        _, m_full = measure(full, config)
        assert abs(m_half.accuracy - m_full.accuracy) <= 0.01, config.describe()


def test_streamed_accuracy_equals_in_memory_accuracy():
    ctx = _pair_context(ActivationCache(memory_gb=0), batch_size=48)  # nothing kept in memory
    for config in (PAIR, StitchConfig.single("resnet")):
        net, m = measure(ctx, config)
        with torch.no_grad():
            logits = net(ctx.split("val").x)  # the whole split at once, from the images
        expected = float((logits.argmax(1) == ctx.labels("val")).float().mean())
        assert m.accuracy == pytest.approx(expected, abs=1.5 / len(logits)), config.describe()


def test_a_budget_below_one_batch_is_refused_with_the_smallest_workable_one():
    ctx = _pair_context(ActivationCache(memory_gb=1e-4), batch_size=256)
    # the first of the pair's models to stream an activation is checked first; each names its
    # own smallest workable budget (resnet's largest cut: 0.0039 GiB, efficientnet's: 0.00293)
    match = r"below one batch of '(resnet'.*>= 0.0039 |efficientnet'.*>= 0.00293 )GiB"
    with pytest.raises(ConfigError, match=match):
        measure(ctx, PAIR)
    with pytest.raises(UnknownNameError, match=r"unknown split 'valid'.*'val'"):
        ctx.activation("resnet", None, "valid")  # named before any other check or work


def test_fragment_costs_from_pieces_equal_direct_counts(ctx):
    from stitch_nas.stitching import fragment_macs

    for model in ("resnet", "efficientnet", "vit"):
        names = [None, *(c.name for c in ctx.cuts(model)), None]
        for start, end in [(None, names[3]), (names[2], names[-2]), (names[4], None), (None, None)]:
            shape = ctx.input_shape(model) if start is None else (1, *ctx.cut(model, start).shape)
            direct = count_macs(ctx.segment(model, start, end), shape)
            assert fragment_macs(ctx, model, start, end) == direct, (model, start, end)


def test_one_pass_fill_equals_per_cut_prefixes(ctx):
    per_cut = StitchContext(ctx.zoo, ctx.data, fill="cut", cache=ActivationCache(dtype="float32"))
    for cut in ctx.cuts("vit"):
        one_pass = ctx.activation("vit", cut.name, "probe")
        assert torch.equal(one_pass, per_cut.activation("vit", cut.name, "probe")), cut.name


def test_channels_last_changes_speed_not_results():
    data = load_digits_splits(probe_size=64)
    f32 = dict(dtype="float32")
    fast = StitchContext(tiny_zoo(("resnet", "efficientnet")), data, cache=ActivationCache(**f32))
    plain = StitchContext(
        tiny_zoo(("resnet", "efficientnet")),
        data,
        channels_last=False,
        cache=ActivationCache(**f32),
    )
    assert (
        fast.channels_last_models == {"resnet", "efficientnet"} and not plain.channels_last_models
    )
    a = fast.activation("resnet", "layer2.0", "val")
    assert a.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(a, plain.activation("resnet", "layer2.0", "val"), atol=1e-5)
    _, m_fast = measure(fast, PAIR)
    _, m_plain = measure(plain, PAIR)
    assert m_fast.macs == m_plain.macs and abs(m_fast.accuracy - m_plain.accuracy) <= 0.01


def test_fragments_from_pieces_equal_single_graph_fragments(ctx):
    whole = StitchContext(ctx.zoo, ctx.data, pieces=False, cache=ActivationCache(dtype="float32"))
    for config in (PAIR, CHAIN):
        x = ctx.split("val").x[:64]
        a = ctx.run(build(ctx, config), x)
        b = whole.run(build(whole, config), x)
        assert (a - b).abs().max().item() <= 1e-5


def test_a_zoo_model_alone_is_measured_from_its_inputs_not_from_a_rounded_cached_cut():
    """The zoo's figures are the baseline of every claim: with a float16 cache that already
    holds a middle cut of the model, the model on its own still scores exactly what a float32
    forward of the whole model on the split's images scores."""
    ctx = tiny_context(cache=ActivationCache(dtype="float16"))
    ctx.activation("resnet", "layer2.0", "val")  # the cut a continuation would start from
    net, measured = measure(ctx, StitchConfig.single("resnet"))
    assert not net.cached_prefix
    with torch.no_grad():
        logits = net(ctx.split("val").x)
    expected = (logits.argmax(1) == ctx.labels("val")).float().mean().item()
    assert measured.accuracy == pytest.approx(expected, abs=1e-12)
    # a stitched network keeps reading its first fragment from the cache
    assert build(ctx, PAIR).cached_prefix


def test_rows_the_cache_lacks_are_computed_for_those_images_only():
    ctx = tiny_context()  # float16 storage, as a search runs
    index = torch.tensor([3, 10, 11, 57, 200])
    rows = torch.cat(list(ctx.activation_rows("resnet", "layer2.0", "val", index)))
    key = ctx.activation_key("resnet", "layer2.0", "val")
    own = ctx.activation_key("resnet", "layer2.0", rows_split("val", index))
    assert key not in ctx.cache  # the whole split did not stream
    assert own in ctx.cache and len(ctx.cache.get(own)) == len(index)  # those rows are kept
    # ... and read again from there, nothing computed
    misses = ctx.cache.stats()["misses"]
    again = torch.cat(list(ctx.activation_rows("resnet", "layer2.0", "val", index)))
    assert torch.equal(again, rows) and ctx.cache.stats()["misses"] == misses
    # other rows are other entries
    assert rows_split("val", index[:4]) != rows_split("val", index)
    # a later cut starts from those rows' cached earlier cut: the stream's values, row for row
    later = torch.cat(list(ctx.activation_rows("resnet", "layer3.0", "val", index)))
    whole = ctx.activation("resnet", "layer2.0", "val")  # the stream, stored as it goes
    assert key in ctx.cache
    assert torch.equal(rows, whole[index])
    assert torch.equal(later, ctx.activation("resnet", "layer3.0", "val")[index])


def test_the_probe_is_filled_cut_by_cut_where_every_cut_would_not_fit():
    """A whole model's probe activations larger than half the budget (224-px images) are not
    filled in one pass that would evict them again: only the cut asked for is computed."""
    roomy = _pair_context(ActivationCache(dtype="float32"))
    cuts = [c.name for c in roomy.cuts("resnet")]
    roomy.activation("resnet", cuts[1], "probe")
    assert all(roomy.activation_key("resnet", c, "probe") in roomy.cache for c in cuts)
    n = len(roomy.split("probe"))
    sizes = [math.prod(c.shape) * n * 4 for c in roomy.cuts("resnet")]
    budget = (sum(sizes) - 1) / 2**30  # every cut once would not fit in half of it
    tight = _pair_context(ActivationCache(memory_gb=budget, dtype="float32"))
    value = tight.activation("resnet", cuts[1], "probe")
    assert torch.equal(value, roomy.activation("resnet", cuts[1], "probe"))
    held = [c for c in cuts if tight.activation_key("resnet", c, "probe") in tight.cache]
    assert held == [cuts[1]], held


def test_every_pass_offers_its_freed_memory_back_after_each_batch(monkeypatch):
    # holes in the heap add up batch after batch within one pass (an ImageNet-size split's pass
    # grew its free memory by a GB), so the check runs per batch, not only at a pass's end
    import stitch_nas.activations._stream as stream
    import stitch_nas.stitching._measure as measuring

    calls = []
    monkeypatch.setattr(stream, "release_freed_memory", lambda: calls.append("stream"))
    monkeypatch.setattr(measuring, "release_freed_memory", lambda: calls.append("network"))
    ctx = _pair_context(ActivationCache(memory_gb=0), batch_size=16)  # nothing kept: all computed
    measure(ctx, PAIR)
    batches = {s: math.ceil(len(ctx.split(s)) / 16) for s in ("probe", "val")}
    # the first model to the cut and the second to the joint over the probe, the network over
    # the validation split (each pass once more at its end)
    assert calls.count("stream") >= 2 * batches["probe"] + batches["val"], (calls, batches)
    assert calls.count("network") >= batches["val"], (calls, batches)
