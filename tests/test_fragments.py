"""Cut points and splits: prefix then suffix must compute the model exactly."""

from __future__ import annotations

import pytest
import timm
import torch
import torchvision

from stitch_nas import errors
from stitch_nas.fragments._cuts import LAYOUTS, cut_points, get_cut, segment, split
from tests._tiny import tiny_swin

MODELS = {
    "test_resnet": (lambda: timm.create_model("test_resnet", num_classes=10), 32),
    "test_convnext": (lambda: timm.create_model("test_convnext", num_classes=10), 32),
    "test_efficientnet": (lambda: timm.create_model("test_efficientnet", num_classes=10), 32),
    "test_vit": (
        lambda: timm.create_model("test_vit", img_size=32, patch_size=4, num_classes=10),
        32,
    ),
    "swin": (tiny_swin, 32),
    "torchvision_resnet18": (lambda: torchvision.models.resnet18(weights=None), 64),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_case(request):
    torch.manual_seed(0)
    build, size = MODELS[request.param]
    return request.param, build().eval(), (1, 3, size, size)


def test_tail_of_head_equals_model_at_every_cut(model_case):
    name, model, shape = model_case
    x = torch.randn(3, *shape[1:])
    with torch.no_grad():
        reference = model(x)
        cuts = cut_points(model, input_shape=shape)
        assert len(cuts) >= 3, f"{name} has too few cut points: {cuts}"
        for cut in cuts:
            head, tail = split(model, cut, input_shape=shape)
            diff = (tail(head(x)) - reference).abs().max().item()
            assert diff <= 1e-5, f"{name} at {cut.name}: max abs diff {diff}"


def test_cut_layouts_and_shapes_match_the_activation(model_case):
    name, model, shape = model_case
    x = torch.randn(2, *shape[1:])
    for cut in cut_points(model, input_shape=shape):
        assert cut.layout in LAYOUTS
        with torch.no_grad():
            act = segment(model, None, cut, input_shape=shape)(x)
        assert tuple(act.shape[1:]) == cut.shape, (name, cut)


def test_layouts_of_known_architectures():
    vit = timm.create_model("test_vit", img_size=32, patch_size=4).eval()
    layouts = {c.name: c for c in cut_points(vit, input_shape=(1, 3, 32, 32))}
    assert layouts["blocks.0"].layout == "tokens"
    assert layouts["blocks.0"].prefix_tokens == 1
    assert layouts["blocks.0"].spatial == (8, 8)
    swin = tiny_swin().eval()
    swin_cuts = cut_points(swin, input_shape=(1, 3, 32, 32))
    # C == H == W == 16 at the first stage: the consumer (LayerNorm) must decide NHWC
    assert all(c.layout == "nhwc" for c in swin_cuts), swin_cuts
    resnet = timm.create_model("test_resnet").eval()
    kinds = {c.layout for c in cut_points(resnet, input_shape=(1, 3, 32, 32))}
    assert kinds == {"nchw", "vector"}


def test_segments_chain_and_share_parameters():
    model = timm.create_model("test_resnet", num_classes=10).eval()
    shape = (1, 3, 32, 32)
    cuts = cut_points(model, input_shape=shape)
    first, second = cuts[2], cuts[-2]
    parts = [
        segment(model, None, first, input_shape=shape),
        segment(model, first, second, input_shape=shape),
        segment(model, second, None, input_shape=shape),
    ]
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = parts[2](parts[1](parts[0](x)))
        assert torch.allclose(out, model(x), atol=1e-5)
    own = {id(p) for p in model.parameters()}
    assert all(id(p) in own for part in parts for p in part.parameters())


def test_unknown_cut_names_the_valid_ones():
    model = timm.create_model("test_resnet").eval()
    with pytest.raises(errors.UnknownCutError, match="layer1.0") as info:
        get_cut(model, "layer9", input_shape=(1, 3, 32, 32))
    assert isinstance(info.value, KeyError)
    assert "layer9" in str(info.value)


def test_segment_end_before_start_is_refused():
    model = timm.create_model("test_resnet").eval()
    cuts = cut_points(model, input_shape=(1, 3, 32, 32))
    with pytest.raises(errors.UnknownCutError, match="deeper"):
        segment(model, cuts[3], cuts[1], input_shape=(1, 3, 32, 32))


def test_untraceable_model_gives_trace_error():
    class Dynamic(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: fx cannot trace it
                return x
            return -x

    with pytest.raises(errors.TraceError, match="Dynamic"):
        cut_points(Dynamic(), input_shape=(1, 3, 8, 8))


def test_train_mode_is_restored():
    model = timm.create_model("test_resnet").train()
    cut_points(model, input_shape=(1, 3, 32, 32))
    assert model.training
