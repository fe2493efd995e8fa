"""Adapters: every kind joins every layout pair, least squares initialises exactly, training helps.

Parametrized over the registry, so a newly registered kind is tested by being registered.
"""

from __future__ import annotations

import math

import pytest
import timm
import torch

from stitch_nas import adapters, errors
from stitch_nas.activations import ActivationCache, StitchContext
from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from stitch_nas.fragments import CutPoint, count_macs, cut_points, segment
from stitch_nas.stitching import build, measure, network_macs
from tests._tiny import tiny_context, tiny_swin

SHAPE = (1, 3, 32, 32)
TRAINED = ["linear", "linear_relu", "conv3x3", "bottleneck", "transformer_block"]


def _models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    swin = tiny_swin()
    return {
        "resnet": timm.create_model("test_resnet", num_classes=10).eval(),
        "vit": timm.create_model("test_vit", img_size=32, patch_size=4, num_classes=10).eval(),
        "swin": swin.eval(),
    }


# (source model, cut) -> (destination model, cut): one of each layout pair the issue names
PAIRS = {
    "cnn->cnn": (("resnet", "layer1.0"), ("resnet", "layer3.0")),
    "cnn->vit": (("resnet", "layer1.0"), ("vit", "blocks.2")),
    "vit->cnn": (("vit", "blocks.1"), ("resnet", "layer2.0")),
    "cnn->swin": (("resnet", "layer1.0"), ("swin", "layers.1.blocks.0")),
    "swin->vit": (("swin", "layers.0.blocks.0"), ("vit", "blocks.3")),
    "vit->vit": (("vit", "blocks.0"), ("vit", "blocks.3")),
}
LSTSQ_JOINS = {"cnn->cnn", "cnn->swin", "vit->vit"}  # least squares keeps its layout rules


@pytest.fixture(scope="module")
def activations():
    """Real activations of tiny timm models at every cut used in PAIRS, on 24 random images."""
    models, x = _models(), torch.rand(24, 3, 32, 32)
    acts: dict[tuple[str, str], tuple[CutPoint, torch.Tensor]] = {}
    for (a, ca), (b, cb) in PAIRS.values():
        for model, name in ((a, ca), (b, cb)):
            cut = next(c for c in cut_points(models[model], input_shape=SHAPE) if c.name == name)
            with torch.no_grad():
                acts[(model, name)] = cut, segment(models[model], None, name, input_shape=SHAPE)(x)
    return acts


def test_registry_lists_every_kind_and_refuses_bad_input():
    assert set(adapters.list_adapters()) >= {"lstsq", *TRAINED}
    assert adapters.list_adapters("linear*") == ["linear", "linear_relu"]
    src, dst = CutPoint("a", 0, "nchw", (4, 8, 8)), CutPoint("b", 1, "nchw", (6, 4, 4))
    with pytest.raises(errors.UnknownNameError, match="'linaer'.*available: bottleneck"):
        adapters.create("linaer", src, dst)
    with pytest.raises(errors.ConfigError, match=r"unknown option\(s\) \['widht'\].*valid:"):
        adapters.create("bottleneck", src, dst, widht=4)
    with pytest.raises(errors.ConfigError, match="resize='nearest'.*one of"):
        adapters.create("linear", src, dst, resize="nearest")
    with pytest.raises(errors.ConfigError, match="steps=0.*int >= 1"):
        adapters.create("conv3x3", src, dst, steps=0)
    with pytest.raises(errors.ConfigError, match="already registered"):
        adapters.register_adapter("linear", options={})(lambda src, dst: torch.nn.Identity())


@pytest.mark.parametrize("pair", sorted(PAIRS))
@pytest.mark.parametrize("kind", adapters.list_adapters())
def test_every_adapter_joins_every_layout_pair(kind, pair, activations):
    (a, ca), (b, cb) = PAIRS[pair]
    (src, x), (dst, y) = activations[(a, ca)], activations[(b, cb)]
    if kind in ("lstsq", "lowrank") and pair not in LSTSQ_JOINS:  # lowrank wraps lstsq
        with pytest.raises(errors.LayoutError, match="least squares cannot join.*supported"):
            adapters.create(kind, src, dst)
        return
    module = adapters.create(kind, src, dst)
    adapters.initialise(module, x, y, src=src, dst=dst)
    with torch.no_grad():
        out = module.eval()(x)
    assert out.shape == y.shape
    assert torch.isfinite(out).all()
    again = adapters.create(kind, src, dst)  # what export relies on: same keys, same shapes
    assert {k: v.shape for k, v in again.state_dict().items()} == {
        k: v.shape for k, v in module.state_dict().items()
    }


@pytest.mark.parametrize("pair", ["cnn->vit", "vit->cnn", "cnn->cnn"])
@pytest.mark.parametrize("kind", TRAINED)
def test_an_adapter_initialised_batch_by_batch_is_the_one_initialised_whole(
    kind, pair, activations
):
    (a, ca), (b, cb) = PAIRS[pair]
    (src, x), (dst, y) = activations[(a, ca)], activations[(b, cb)]
    torch.manual_seed(0)
    whole = adapters.create(kind, src, dst)
    torch.manual_seed(0)  # the same random weights where least squares sets none
    streamed = adapters.create(kind, src, dst)
    adapters.initialise(whole, x, y, src=src, dst=dst)
    sizes = [5, 11, 8]  # the 24 images in uneven batches, read again by every pass
    adapters.initialise_batches(
        streamed, lambda: zip(x.split(sizes), y.split(sizes), strict=True), src=src, dst=dst
    )
    with torch.no_grad():  # the same map; weights may differ where the probe barely constrains
        once, passes = whole.eval()(x), streamed.eval()(x)
    torch.testing.assert_close(passes, once, rtol=1e-4, atol=1e-4)
    error_once, error_passes = (once - y).pow(2).mean(), (passes - y).pow(2).mean()
    assert error_passes <= 1.001 * error_once + 1e-8  # and fits the destination as well


@pytest.mark.parametrize(
    "kind, src, dst, options, match",
    [
        ("linear", ("vector", (8,)), ("nchw", (4, 2, 2)), {}, "no positions"),
        ("linear", ("nchw", (4, 8, 8)), ("nchw", (4, 4, 4)), {"resize": "none"}, "resize='none'"),
        ("conv3x3", ("nchw", (4, 6, 6)), ("nchw", (4, 4, 4)), {"resize": "integrated"}, "multiple"),
        (
            "transformer_block",
            ("nchw", (4, 8, 8)),
            ("nchw", (16, 4, 4)),
            {"resize": "integrated"},
            "no strided",
        ),
        ("linear", ("tokens", (11, 8)), ("nchw", (4, 2, 2)), {}, "not a square grid"),
    ],
)
def test_layouts_that_cannot_be_joined_are_refused_with_the_reason(kind, src, dst, options, match):
    with pytest.raises(errors.LayoutError, match=match):
        adapters.create(kind, CutPoint("s", 0, *src), CutPoint("d", 1, *dst), **options)


def test_fit_conv_recovers_a_strided_3x3_convolution():
    torch.manual_seed(0)
    true = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)
    x = torch.randn(32, 3, 8, 8)
    fitted = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)
    with torch.no_grad():
        adapters.fit_conv(fitted, x, true(x), 0.0, "test")
    assert torch.allclose(fitted.weight, true.weight, atol=1e-4)
    assert torch.allclose(fitted.bias, true.bias, atol=1e-4)


@pytest.mark.parametrize("kind", ["linear", "transformer_block"])  # no ReLU at the output
def test_lstsq_init_recovers_a_known_affine_map_exactly(kind):
    torch.manual_seed(0)
    src, dst = CutPoint("a", 0, "nchw", (6, 4, 4)), CutPoint("b", 1, "nhwc", (4, 4, 5))
    x = torch.randn(64, 6, 4, 4)
    a, b = torch.randn(5, 6), torch.randn(5)
    y = torch.einsum("kj,njhw->nhwk", a, x) + b
    module = adapters.create(kind, src, dst, init="lstsq")
    adapters.initialise(module, x, y, src=src, dst=dst, ridge=0.0)
    with torch.no_grad():
        assert torch.allclose(module.eval()(x), y, atol=1e-3)


def test_class_token_is_fitted_and_folded(activations):
    (src, x), (dst, y) = activations[("vit", "blocks.0")], activations[("vit", "blocks.0")]
    module = adapters.create("linear", src, dst)
    adapters.initialise(module, x, y, src=src, dst=dst, ridge=0.0)
    with torch.no_grad():
        out = module.eval()(x)
    assert torch.allclose(out, y, atol=1e-3)  # class token and patches, via least squares
    dropped = adapters.create("linear", src, dst, cls="drop")
    assert dropped.to_grid.channels == src.channels
    assert module.to_grid.channels == 2 * src.channels  # folded: class token on every token


@pytest.fixture(scope="module")
def mini_ctx(mini_zoo, digits):
    return StitchContext(mini_zoo, digits)


SAME_CUT = [("resnet", "layer2.0", kind) for kind in TRAINED] + [
    ("vit", "blocks.1", "linear"),
    ("vit", "blocks.1", "transformer_block"),
]


@pytest.mark.parametrize("model, cut, kind", SAME_CUT)
def test_lstsq_initialised_adapter_at_the_same_cut_keeps_accuracy(mini_ctx, model, cut, kind):
    alone = measure(mini_ctx, StitchConfig.single(model))[1].accuracy
    config = StitchConfig(
        (Fragment(model, None, cut), Fragment(model, cut, None)),
        (AdapterSpec(kind, {"loss": "none"}),),
    )
    net, result = measure(mini_ctx, config)
    assert abs(result.accuracy - alone) <= 0.01, (alone, result.accuracy)
    assert result.macs > measure(mini_ctx, StitchConfig.single(model))[1].macs  # adapter counted


@pytest.fixture(scope="module")
def ctx():
    # float32 storage: a 5-step fine-tune below must beat its float32-fitted initialisation
    return tiny_context(cache=ActivationCache(dtype="float32"))


GAP = (("resnet", "layer1.0"), ("resnet", "layer3.0"))


def _fit(ctx, spec, src=GAP[0], dst=GAP[1]):
    x_cut, dst_cut = ctx.cut(*src), ctx.cut(*dst)
    first = Fragment(src[0], None, src[1])
    joint = adapters.Joint(
        0,
        x_cut,
        dst[0],
        dst_cut,
        None,
        lambda split: ctx.activation(*src, split),
        first,
    )
    return adapters.fit_joint(ctx, spec, joint)


@pytest.mark.parametrize("loss", ["match", "task"])
def test_a_few_training_steps_lower_the_loss(ctx, loss):
    options = {"loss": loss, "init": "random", "steps": 30, "eval_every": 10, "patience": 0}
    fit = _fit(ctx, AdapterSpec("linear", options))
    report = fit.report
    assert report is not None and report.steps == 30 and report.stopped == "steps"
    assert report.last_loss < report.first_loss
    assert report.best_val < report.initial_val


@pytest.mark.parametrize("what", ["suffix", "all"])
def test_fine_tuning_trains_copies_and_leaves_the_zoo_alone(ctx, what):
    zoo_model = ctx.entry("resnet").model
    before = {k: v.clone() for k, v in zoo_model.state_dict().items()}
    # lr 1e-2 swung the loss of train='all' up and down (2.3 to 3.9): whether its held-out loss
    # ended below the start, so that the trained copy was kept, came down to rounding
    options = {"loss": "task", "train": what, "steps": 5, "eval_every": 5, "lr": 1e-3}
    config = StitchConfig(
        (Fragment(*GAP[0][:1], None, GAP[0][1]), Fragment(GAP[1][0], GAP[1][1], None)),
        (AdapterSpec("conv3x3", options),),
    )
    net = build(ctx, config)
    after = zoo_model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the shared zoo is untouched
    assert net.cached_prefix is (what != "all")
    tail_weight = next(v for k, v in net.state_dict().items() if k.endswith("fc.weight"))
    assert not torch.equal(tail_weight, before["fc.weight"])  # the trained copy is in the net
    _, result = measure(ctx, config)
    assert 0.0 <= result.accuracy <= 1.0


def test_a_trained_joint_reads_the_probe_a_batch_at_a_time():
    """Its initialisation and held-out loss read the probe's rows a batch at a time, so a
    larger probe costs passes, not memory (the adapter used to be given the probe whole)."""
    small = tiny_context(batch_size=16, cache=ActivationCache(dtype="float32"))
    options = {"loss": "match", "steps": 4, "eval_every": 2, "batch_size": 8, "patience": 0}
    config = StitchConfig(
        (Fragment(GAP[0][0], None, GAP[0][1]), Fragment(GAP[1][0], GAP[1][1], None)),
        (AdapterSpec("conv3x3", options),),
    )
    rows: list[int] = []

    def count(module, args):
        if type(module).__name__ == "ToGrid":  # what every pass of the adapter reads through
            rows.append(args[0].shape[0])

    hook = torch.nn.modules.module.register_module_forward_pre_hook(count)
    try:
        build(small, config)
    finally:
        hook.remove()
    assert len(small.split("probe")) == 64
    assert rows and max(rows) == 16  # the context's batch; the probe is four of them


def test_diverging_training_is_a_non_finite_error(ctx):
    options = {"loss": "match", "init": "random", "lr": 1e30, "steps": 20, "weight_decay": 0.0}
    with pytest.raises(errors.NonFiniteError, match="lower lr"):
        _fit(ctx, AdapterSpec("linear", options))


def test_bad_training_combinations_are_refused(ctx):
    with pytest.raises(errors.ConfigError, match="never reaches the suffix"):
        _fit(ctx, AdapterSpec("linear", {"loss": "match", "train": "suffix"}))
    with pytest.raises(errors.ConfigError, match="trains nothing"):
        _fit(ctx, AdapterSpec("linear", {"loss": "none", "train": "all"}))


def test_adapter_macs_count_and_depend_on_the_kind(ctx):
    macs = {}
    for kind in ("linear", "bottleneck", "conv3x3"):
        config = StitchConfig(
            (Fragment("resnet", None, "layer1.0"), Fragment("vit", "blocks.2", None)),
            (AdapterSpec(kind, {"loss": "none"}),),
        )
        net = build(ctx, config)
        macs[kind] = network_macs(ctx, net)
        adapter = net.parts[1]
        direct = count_macs(adapter, (1, *ctx.cut("resnet", "layer1.0").shape))
        fragments = macs[kind] - direct
        assert direct > 0 and fragments > 0
    assert macs["linear"] < macs["bottleneck"] < macs["conv3x3"]
    assert not math.isnan(sum(macs.values()))


# Hand counts, fvcore convention (stitch_nas.fragments.count_macs): one multiply-add per weight
# use, biases, activations, softmax and residual adds free; BatchNorm in eval with its affine
# part 2 per element, LayerNorm 5 per element. The joint: an NCHW cut of C_IN x 6 x 6 into one
# of C_OUT x 6 x 6 (same grid: no resizing, stride 1), so P = 36 positions.
C_IN, C_OUT, P = 12, 32, 36
_LINEAR = C_IN * C_OUT * P  # a 1x1 convolution
_BODY = {
    "linear": _LINEAR,
    "linear_relu": _LINEAR,
    "conv3x3": 9 * C_IN * C_OUT * P,  # 3x3 taps, padding 1
    # width C_OUT / 4 = 8: 1x1 reduce, 3x3, 1x1 expand, 1x1 shortcut, and the block's own
    # BatchNorms (bn1, bn2 over 8 channels, bn3 over C_OUT)
    "bottleneck": (C_IN * 8 + 9 * 8 * 8 + 8 * C_OUT + C_IN * C_OUT) * P + 2 * (8 + 8 + C_OUT) * P,
    # 1x1 projection, then a ViT block over P tokens of width D = C_OUT (2 heads, mlp_ratio 4):
    # LayerNorm, qkv, Q.K^T and attn.V (P*P*D each, whatever the heads), out projection,
    # LayerNorm, MLP up and down
    "transformer_block": _LINEAR
    + 5 * P * C_OUT
    + P * C_OUT * 3 * C_OUT
    + 2 * P * P * C_OUT
    + P * C_OUT * C_OUT
    + 5 * P * C_OUT
    + 2 * P * C_OUT * 4 * C_OUT,
    # frozen least-squares map plus the rank-8 update B(Ax); no norms
    "lowrank": _LINEAR + (C_IN * 8 + 8 * C_OUT) * P,
}
_NORMS = 2 * (C_IN + C_OUT) * P  # norm="batch": a BatchNorm before the body and one after


@pytest.mark.parametrize("norm", ["none", "batch"])
def test_each_trained_adapter_kind_costs_its_hand_counted_macs(norm):
    src = CutPoint("src", 0, "nchw", (C_IN, 6, 6))
    dst = CutPoint("dst", 1, "nchw", (C_OUT, 6, 6))
    trained = {k for k in adapters.list_adapters() if adapters.get_adapter(k).trainable}
    assert trained == set(_BODY)  # a new kind needs its hand count here
    for kind, body in _BODY.items():
        options = {"norm": norm} if "norm" in adapters.get_adapter(kind).options else {}
        adapter = adapters.create(kind, src, dst, **options)
        expected = body + (_NORMS if options.get("norm") == "batch" else 0)
        assert count_macs(adapter, (1, C_IN, 6, 6)) == expected, kind
        assert count_macs(adapter, (3, C_IN, 6, 6)) == 3 * expected, kind  # per image


def test_device_option_is_checked(ctx):
    with pytest.raises(errors.ConfigError, match="device='nowhere'"):
        _fit(ctx, AdapterSpec("linear", {"device": "nowhere", "steps": 1}))
    fit = _fit(ctx, AdapterSpec("linear", {"device": "cpu", "steps": 2, "eval_every": 1}))
    assert fit.report is not None and fit.report.steps == 2
    assert next(fit.adapter.parameters()).device == ctx.device  # back beside the fragments


@pytest.mark.parametrize("dst", [("resnet", "layer4.0"), ("resnet", "global_pool")])
def test_linear_without_training_is_the_lstsq_map(ctx, dst):
    """Same rescaling (bilinear, or pooling into a vector) and the same least-squares fit."""
    src = ctx.cut("resnet", "layer1.0")
    x, y = ctx.activation("resnet", src.name, "probe"), ctx.activation(*dst, "probe")
    closed = adapters.create("lstsq", src, ctx.cut(*dst))
    linear = adapters.create("linear", src, ctx.cut(*dst), loss="none")
    for module in (closed, linear):
        adapters.initialise(module, x, y, src=src, dst=ctx.cut(*dst))
    with torch.no_grad():
        assert torch.allclose(closed(x), linear.eval()(x), atol=1e-3, rtol=1e-3)


def test_a_kind_registered_without_training_options_is_initialised_and_not_trained(ctx):
    """The plug-ins page's own example: a kind declares only its structure (no
    ``adapters.TRAIN_OPTIONS``); its joints are fitted as built, not trained (every trial
    failed with KeyError: 'loss' before)."""
    from stitch_nas.adapters._registry import ADAPTERS
    from stitch_nas.registry import integer

    @adapters.register_adapter(
        "conv5x5_plain", options={"width": integer(None, 1, optional=True, structural=True)}
    )
    def conv5x5(src, dst, *, width=None):
        return torch.nn.Conv2d(src.channels, dst.channels, 5, padding=2)

    try:
        fit = _fit(ctx, AdapterSpec("conv5x5_plain", {}))
        assert fit.report is None and isinstance(fit.adapter, torch.nn.Conv2d)
    finally:
        ADAPTERS._entries.pop("conv5x5_plain")


@pytest.mark.parametrize("kind", ["linear", "linear_relu", "transformer_block"])
@pytest.mark.parametrize("norm", ["batch", "none"])
def test_a_trained_adapter_into_a_larger_grid_maps_before_it_resizes(kind, norm):
    """Its channel map (and a BatchNorm as it stands) commutes with the bilinear resize, so
    mapping first gives the resize-then-map output, least squares fits the same map (on the
    resized rows' products), and the source's 40 channels are never held on the destination's
    32x32 grid: 10 times the adapter's output here."""
    from tests.test_lstsq import PeakTensorBytes

    torch.manual_seed(0)
    src, dst = CutPoint("a", 0, "nchw", (40, 4, 4)), CutPoint("b", 1, "nchw", (4, 32, 32))
    x, y = torch.randn(16, 40, 4, 4), torch.randn(16, 4, 32, 32)
    options = {"norm": norm} | ({"heads": 1} if kind == "transformer_block" else {})
    module = adapters.create(kind, src, dst, init="lstsq", **options)
    adapters.initialise(module, x, y, src=src, dst=dst)
    assert module.map_first
    module.eval()
    with torch.no_grad():  # least squares on the resized rows, though it never made them
        inputs = module.pre(torch.nn.functional.interpolate(x, size=(32, 32), mode="bilinear"))
        fitted = torch.nn.Conv2d(40, 4, 1)
        adapters.fit_conv(fitted, inputs, y, 1e-4, "the resized rows")
    linear = module.body.linear_part()
    torch.testing.assert_close(linear.weight, fitted.weight, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(linear.bias, fitted.bias, rtol=1e-3, atol=1e-4)
    with torch.no_grad(), PeakTensorBytes() as mapped:
        out = module(x[:8])
    module.map_first = module.to_grid.defer = False  # the same adapter resizing first
    with torch.no_grad(), PeakTensorBytes() as resized:
        resized_first = module(x[:8])
    torch.testing.assert_close(out, resized_first, rtol=1e-4, atol=1e-4)
    source_on_destination = 8 * 40 * 32 * 32 * 4  # bytes
    assert mapped.peak < resized.peak - source_on_destination / 2
    wider, same_grid = CutPoint("c", 1, "nchw", (64, 32, 32)), CutPoint("d", 1, "nchw", (4, 4, 4))
    for other in (wider, same_grid):
        assert not adapters.create(kind, src, other, **options).map_first
    assert not adapters.create("conv3x3", src, dst).map_first  # a 3x3 conv reads the grid


def test_a_network_whose_adapter_resizes_a_wide_source_first_runs_in_parts_of_a_batch(
    ctx, monkeypatch
):
    """A conv3x3 from layer3 (192 channels at 2x2) into the stem (16 at 16x16) holds 192
    channels at 16x16 per image, six times the zoo's largest activation, which the batch size
    was chosen for: the network takes a sixth of a batch at a time, with the same outputs."""
    from stitch_nas.activations import largest_activations
    from stitch_nas.stitching import _measure

    fragments = (Fragment("resnet", None, "layer3.0"), Fragment("resnet", "conv1.2", None))
    net = build(ctx, StitchConfig(fragments, (AdapterSpec("conv3x3", {"loss": "none"}),)))
    largest = largest_activations(ctx)[0]
    assert net.parts[1].widest_per_image == 192 * 16 * 16 > largest
    at_once = _measure.images_at_once(ctx, net)
    assert at_once == ctx.batch_size * largest // (192 * 16 * 16) < ctx.batch_size
    parts = torch.cat(list(_measure.output_batches(ctx, net, "val")))
    monkeypatch.setattr(_measure, "images_at_once", lambda ctx, net: ctx.batch_size)
    torch.testing.assert_close(parts, torch.cat(list(_measure.output_batches(ctx, net, "val"))))
    mapped = build(ctx, StitchConfig(fragments, (AdapterSpec("linear", {"loss": "none"}),)))
    assert mapped.parts[1].map_first and mapped.parts[1].widest_per_image == 0
    assert _measure.images_at_once(ctx, mapped) == ctx.batch_size
