"""Cut points and splits: prefix then suffix must compute the model exactly."""

from __future__ import annotations

import pytest
import timm
import torch
import torchvision

from stitch_nas import errors
from stitch_nas.fragments import LAYOUTS, cut_points, get_cut, segment, split
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


# --- input size, plain Sequential stacks, blocks finished by their parent, declared blocks --


def test_a_module_without_an_input_size_needs_input_shape():
    model = torchvision.models.resnet18(weights=None).eval()
    with pytest.raises(
        errors.ConfigError, match=r"input size of ResNet cannot be known.*input_shape"
    ):
        cut_points(model)
    cuts = cut_points(model, input_shape=(1, 3, 32, 32))
    assert cuts[0].shape[1:] == (16, 16)  # the cut is at the size the model is fed
    timm_model = timm.create_model("test_resnet").eval()
    assert cut_points(timm_model)[0].shape[1:] == (80, 80)  # its pretrained_cfg: 160x160


class _AllConv(torch.nn.Module):
    """A plain Sequential stack in the layout of realzoo's all-conv CNN."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn

        def cbr(cin, cout):
            return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]

        layers = cbr(3, 8) + cbr(8, 8) + [nn.MaxPool2d(2)] + cbr(8, 8)
        self.body = nn.Sequential(*layers, nn.Conv2d(8, 4, 1), nn.AdaptiveAvgPool2d(1))

    def forward(self, x):
        return torch.flatten(self.body(x), 1)


def test_plain_sequential_is_cut_between_layer_groups():
    model = _AllConv().eval()
    shape = (1, 3, 16, 16)
    names = [c.name for c in cut_points(model, input_shape=shape)]
    # after each ReLU and the pool, never between a conv and its batch norm or activation
    assert names == ["body.2", "body.5", "body.6", "body.9", "body.10", "body"]
    _assert_exact(model, shape)


class _StageGlue(torch.nn.Module):
    """Blocks whose skip addition and ReLU happen in the stage's forward (fattorib layout)."""

    def __init__(self, n: int = 3) -> None:
        super().__init__()
        nn = torch.nn

        def pair(c):
            return nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
                                 nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c))  # fmt: skip

        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.ModuleList(pair(8) for _ in range(n - 1))
        self.final = pair(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        for block in self.blocks:
            x = torch.relu(block(x) + x)
        x = torch.relu(self.final(x) + x)
        return self.fc(x.mean((2, 3)))


class _Stage(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _StageGlue()

    def forward(self, x):
        return self.inner(x)


def test_blocks_finished_by_their_parent_are_cut_after_the_glue():
    model = _StageGlue().eval()
    shape = (1, 3, 8, 8)
    cuts = cut_points(model, input_shape=shape)
    assert [c.name for c in cuts] == ["stem", "blocks.0", "blocks.1", "final"]
    assert cuts[-1].shape == (8, 8, 8)  # after the skip and ReLU, not after the pooling
    _assert_exact(model, shape)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():  # the cut carries the block's output after the skip and the ReLU
        after_stem = torch.relu(model.stem(x))
        expected = torch.relu(model.blocks[0](after_stem) + after_stem)
        assert torch.allclose(segment(model, None, "blocks.0", input_shape=shape)(x), expected)


def test_declared_blocks_replace_the_automatic_cuts():
    from stitch_nas.fragments import declare_blocks

    model = declare_blocks(_StageGlue().eval(), ["blocks.1", "final"])
    shape = (1, 3, 8, 8)
    assert [c.name for c in cut_points(model, input_shape=shape)] == ["blocks.1", "final"]
    _assert_exact(model, shape)
    nested = declare_blocks(_Stage().eval(), ["inner.blocks.*"])
    assert [c.name for c in cut_points(nested, input_shape=shape)] == [
        "inner.blocks.0",
        "inner.blocks.1",
    ]
    with pytest.raises(errors.UnknownCutError, match=r"'blocks.7' is not a module"):
        cut_points(declare_blocks(_StageGlue().eval(), ["blocks.7"]), input_shape=shape)
    with pytest.raises(errors.UnknownCutError, match=r"'blocks.0.3'.*skip connection"):
        cut_points(declare_blocks(_StageGlue().eval(), ["blocks.0.3"]), input_shape=shape)
    with pytest.raises(errors.UnknownCutError, match=r"pattern 'head\*' .* matches no module"):
        cut_points(declare_blocks(_StageGlue().eval(), ["head*"]), input_shape=shape)
    with pytest.raises(errors.ConfigError, match="non-empty list"):
        declare_blocks(_StageGlue(), [])


def _assert_exact(model, shape):
    x = torch.randn(2, *shape[1:])
    with torch.no_grad():
        reference = model(x)
        for cut in cut_points(model, input_shape=shape):
            head, tail = split(model, cut, input_shape=shape)
            assert torch.equal(tail(head(x)), reference), cut.name
