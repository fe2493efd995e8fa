"""``lowrank``: a frozen least-squares stitch plus a trained rank-r update (SN-Netv2 / ESTA)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from stitch_nas import adapters, errors, load
from stitch_nas.activations import StitchContext
from stitch_nas.adapters import LowRankStitch
from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from stitch_nas.export import ExportItem, export_network
from stitch_nas.fragments import CutPoint, count_macs, count_params
from stitch_nas.stitching import measure

# a joint least squares stitches imperfectly: 0.81 validation accuracy against 0.98 alone
SRC, DST = ("resnet", "layer2.0"), ("efficientnet", "blocks.3.0")
TRAIN = {"loss": "task", "steps": 20, "eval_every": 10, "patience": 0}


def _config(kind: str, options: dict | None = None) -> StitchConfig:
    return StitchConfig(
        (Fragment(SRC[0], None, SRC[1]), Fragment(DST[0], DST[1], None)),
        (AdapterSpec(kind, options or {}),),
    )


@pytest.fixture(scope="module")
def ctx(mini_zoo, digits):
    return StitchContext(mini_zoo, digits)


@pytest.fixture(scope="module")
def nets(ctx):
    """The least-squares network and the same joint with a lowrank stitch trained on the task."""
    return {
        "lstsq": measure(ctx, _config("lstsq")),
        "lowrank": measure(ctx, _config("lowrank", TRAIN)),
    }


def _untrained(ctx, rank: int = 8) -> tuple[LowRankStitch, adapters.LinearStitch, torch.Tensor]:
    src, dst = ctx.cut(*SRC), ctx.cut(*DST)
    x, y = ctx.activation(*SRC, "probe"), ctx.activation(*DST, "probe")
    low, closed = (
        adapters.create("lowrank", src, dst, rank=rank),
        adapters.create("lstsq", src, dst),
    )
    for module in (low, closed):
        adapters.initialise(module, x, y, src=src, dst=dst)
    assert isinstance(low, LowRankStitch) and isinstance(closed, adapters.LinearStitch)
    return low, closed, x


def test_before_training_it_is_the_lstsq_stitch_on_the_probe_split(ctx):
    low, closed, x = _untrained(ctx)
    with torch.no_grad():
        assert torch.allclose(low(x), closed(x), atol=1e-5, rtol=1e-5)
    assert torch.equal(low.base.weight, closed.weight) and torch.equal(low.base.bias, closed.bias)
    assert not low.up.any()  # B = 0; A is random, so the update is what training moves


def test_task_training_beats_least_squares_and_moves_only_the_update(ctx, nets):
    (lstsq_net, lstsq), (net, trained) = nets["lstsq"], nets["lowrank"]
    val = ctx.split("val")
    with torch.no_grad():
        losses = {k: float(F.cross_entropy(n(val.x), ctx.labels("val"))) for k, n in
                  (("lstsq", lstsq_net), ("lowrank", net))}  # fmt: skip
    assert losses["lowrank"] < losses["lstsq"], losses  # measured: 0.53 -> 0.44
    assert trained.accuracy >= lstsq.accuracy  # measured: 0.81 -> 0.86
    adapter, start = net.parts[1], _untrained(ctx)[0]
    assert isinstance(adapter, LowRankStitch)
    assert [n for n, p in adapter.named_parameters() if p.requires_grad] == ["down", "up"]
    assert torch.equal(adapter.base.weight, start.base.weight)  # frozen, weight decay included
    assert torch.equal(adapter.base.bias, start.base.bias)
    assert not torch.equal(adapter.down, start.down) and adapter.up.any()  # A and B trained


def test_params_and_macs_count_the_base_and_the_update(ctx, nets):
    src, dst = CutPoint("a", 0, "nchw", (6, 4, 4)), CutPoint("b", 1, "nhwc", (4, 4, 5))
    module = adapters.create("lowrank", src, dst, rank=3)
    assert count_params(module) == 6 * 5 + 5 + 3 * (6 + 5)  # W0, b0 (frozen), A, B
    assert count_macs(module, (1, 6, 4, 4)) == 16 * (6 * 5 + 3 * (6 + 5))  # per position
    added = nets["lowrank"][1].params - nets["lstsq"][1].params
    c_in, c_out = ctx.cut(*SRC).channels, ctx.cut(*DST).channels
    assert added == 8 * (c_in + c_out)  # the default rank's A and B beside the same base


def test_a_built_network_exports_and_reloads_with_equal_outputs(ctx, nets, tmp_path):
    net, result = nets["lowrank"]
    item = ExportItem("lowrank", _config("lowrank", TRAIN), result.to_dict(), 0)
    folder = export_network(ctx, item, tmp_path)  # rebuilds and re-measures: deterministic
    loaded = load(folder)
    x = ctx.split("val").x[:64]
    with torch.no_grad():
        assert (loaded.net(x) - net(x)).abs().max() <= 1e-5
    assert count_params(loaded.net) == result.params
    assert count_macs(loaded.net, (1, 3, 32, 32)) == result.macs


@pytest.mark.parametrize(
    "options, match",
    [
        ({"rank": 0}, "rank=0 of adapter 'lowrank' is invalid; use an int >= 1"),
        ({"rank": 2.5}, "rank=2.5 .* int >= 1"),
        ({"init": "random"}, "init='random' .* one of \\('lstsq',\\)"),
    ],
)
def test_bad_options_are_one_line_config_errors(options, match):
    src, dst = CutPoint("a", 0, "nchw", (6, 8, 8)), CutPoint("b", 1, "nchw", (4, 4, 4))
    with pytest.raises(errors.ConfigError, match=match) as info:
        adapters.create("lowrank", src, dst, **options)
    assert "\n" not in str(info.value)


def test_rank_is_clamped_and_layouts_follow_least_squares():
    src, dst = CutPoint("a", 0, "nchw", (6, 8, 8)), CutPoint("b", 1, "nchw", (4, 4, 4))
    wide = adapters.create("lowrank", src, dst, rank=64)
    assert wide.rank == 4 and wide.down.shape == (4, 6) and wide.up.shape == (4, 4)
    with pytest.raises(errors.LayoutError, match="no strided convolution"):
        adapters.create("lowrank", src, dst, resize="integrated")
    with pytest.raises(errors.LayoutError, match="resize='none' but 'a' is 8x8 and 'b' is 4x4"):
        adapters.create("lowrank", src, dst, resize="none")
    vector = CutPoint("v", 2, "vector", (6,))
    with pytest.raises(errors.LayoutError, match="least squares cannot join"):
        adapters.create("lowrank", vector, dst)
