"""Measurements: cached paths equal uncached ones, cost tables equal full counts."""

from __future__ import annotations

import pytest
import torch

from stitch_nas.activations._cache import ActivationCache
from stitch_nas.activations._context import StitchContext
from stitch_nas.config import AdapterSpec, Fragment, HeadSpec, StitchConfig
from stitch_nas.data._splits import load_digits_splits
from stitch_nas.fragments._costs import count_macs, count_params
from stitch_nas.stitching._build import build
from stitch_nas.stitching._measure import measure, network_macs
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
    return tiny_context()


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


def test_memory_budget_smaller_than_the_data_still_works(tmp_path):
    ctx = StitchContext(
        tiny_zoo(("resnet", "efficientnet")),
        load_digits_splits(probe_size=64),
        cache=ActivationCache(memory_gb=0.3 / 1024, spill_dir=tmp_path),  # 0.3 MB
    )
    reference = StitchContext(ctx.zoo, ctx.data)
    for _ in range(2):
        net, m = measure(ctx, PAIR)
        _, m_ref = measure(reference, PAIR)
        assert m.accuracy == m_ref.accuracy
        assert ctx.cache.memory_bytes <= ctx.cache.budget_bytes
    assert ctx.cache.stats()["disk_hits"] > 0


def test_fragment_costs_from_pieces_equal_direct_counts(ctx):
    from stitch_nas.stitching._measure import fragment_macs

    for model in ("resnet", "efficientnet", "vit"):
        names = [None, *(c.name for c in ctx.cuts(model)), None]
        for start, end in [(None, names[3]), (names[2], names[-2]), (names[4], None), (None, None)]:
            shape = ctx.input_shape(model) if start is None else (1, *ctx.cut(model, start).shape)
            direct = count_macs(ctx.segment(model, start, end), shape)
            assert fragment_macs(ctx, model, start, end) == direct, (model, start, end)


def test_one_pass_fill_equals_per_cut_prefixes(ctx):
    per_cut = StitchContext(ctx.zoo, ctx.data, fill="cut")
    for cut in ctx.cuts("vit"):
        one_pass = ctx.activation("vit", cut.name, "probe")
        assert torch.equal(one_pass, per_cut.activation("vit", cut.name, "probe")), cut.name


def test_channels_last_changes_speed_not_results():
    data = load_digits_splits(probe_size=64)
    fast = StitchContext(tiny_zoo(("resnet", "efficientnet")), data)
    plain = StitchContext(tiny_zoo(("resnet", "efficientnet")), data, channels_last=False)
    assert fast._channels_last == {"resnet", "efficientnet"} and not plain._channels_last
    a = fast.activation("resnet", "layer2.0", "val")
    assert a.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(a, plain.activation("resnet", "layer2.0", "val"), atol=1e-5)
    _, m_fast = measure(fast, PAIR)
    _, m_plain = measure(plain, PAIR)
    assert m_fast.macs == m_plain.macs and abs(m_fast.accuracy - m_plain.accuracy) <= 0.01


def test_fragments_from_pieces_equal_single_graph_fragments(ctx):
    whole = StitchContext(ctx.zoo, ctx.data, pieces=False)
    for config in (PAIR, CHAIN):
        x = ctx.split("val").x[:64]
        a = ctx.run(build(ctx, config), x)
        b = whole.run(build(whole, config), x)
        assert (a - b).abs().max().item() <= 1e-5
