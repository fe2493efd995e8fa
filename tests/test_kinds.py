"""Network kinds (zoo model, stitched, new head, new stem) and pooled 1x1 cuts joined as vectors."""

from __future__ import annotations

import csv
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from optuna.trial import create_trial
from torch import nn

from stitch_nas import adapters, attrs
from stitch_nas.activations import StitchContext
from stitch_nas.config import AdapterSpec, Fragment, HeadSpec, StitchConfig
from stitch_nas.data import load_digits_splits
from stitch_nas.fragments import CutPoint
from stitch_nas.report import write_report, zoo_claims
from stitch_nas.report._holdout import _record_kinds
from stitch_nas.stitching import KINDS, Measurement, measure, network_kind, piece_roles
from stitch_nas.zoo import ZooEntry

from ._tiny import LABELS, SPEC, tiny_zoo


class _Block(nn.Module):
    """A CIFAR ResNet basic block."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Conv2d(c_in, c_out, 1, stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + self.shortcut(x))


class _CifarResNet(nn.Module):
    """A ResNet-20 in miniature: its ``avgpool`` output is a pooled ``C x 1 x 1`` cut."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.layer1 = nn.Sequential(_Block(width, width, 1))
        self.layer2 = nn.Sequential(_Block(width, 2 * width, 2))
        self.layer3 = nn.Sequential(_Block(2 * width, 4 * width, 2))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * width, len(LABELS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


@pytest.fixture(scope="module")
def ctx() -> StitchContext:
    zoo = tiny_zoo(("resnet", "efficientnet"))
    for name, width in (("cifar_a", 8), ("cifar_b", 12)):
        torch.manual_seed(width)
        model = _CifarResNet(width).eval()
        zoo.add(ZooEntry(name, model, SPEC, LABELS, source=f"test:{name}"))
    return StitchContext(zoo, load_digits_splits(probe_size=64))


def _pair(a: str, a_end: str | None, b: str, b_start: str) -> StitchConfig:
    return StitchConfig((Fragment(a, None, a_end), Fragment(b, b_start, None)), (AdapterSpec(),))


def test_the_pooled_cut_ends_the_blocks_and_starts_the_head(ctx: StitchContext) -> None:
    cuts = [c.name for c in ctx.cuts("cifar_b")]
    assert cuts[-4:] == ["layer1.0", "layer2.0", "layer3.0", "avgpool"]
    pooled = ctx.cut("cifar_b", "avgpool")
    assert pooled.layout == "nchw" and pooled.shape == (48, 1, 1)
    assert pooled.join_layout == "vector"
    roles = piece_roles(ctx, "cifar_b")
    # conv1, bn1, relu: stem; the three stages: blocks; pooling, then flatten + fc: head
    assert roles.roles == ("stem",) * 3 + ("block",) * 3 + ("head",) * 2
    # the timm ResNet's layer4 is strided down to 1x1 by its own convolutions: still a block
    names = [c.name for c in ctx.cuts("resnet")] + ["output"]
    resnet = dict(zip(names, piece_roles(ctx, "resnet").roles, strict=True))
    assert resnet["layer4.0"] == "block" and resnet["global_pool"] == "head"
    assert resnet["conv1.2"] == resnet["maxpool"] == "stem" and resnet["layer1.0"] == "block"


def test_kinds(ctx: StitchContext) -> None:
    assert network_kind(ctx, StitchConfig.single("cifar_a")) == "zoo model"
    truncated = StitchConfig((Fragment("resnet", None, "layer3.0"),), head=HeadSpec("knn"))
    assert network_kind(ctx, truncated) == "truncated"
    # the case: a whole model up to its pooled features, then another's classifier
    assert network_kind(ctx, _pair("cifar_a", "avgpool", "cifar_b", "avgpool")) == "new head"
    assert network_kind(ctx, _pair("cifar_a", "layer3.0", "cifar_b", "avgpool")) == "new head"
    assert network_kind(ctx, _pair("resnet", "global_pool", "efficientnet", "global_pool")) == (
        "new head"
    )
    first = ctx.cuts("resnet")[0].name
    assert network_kind(ctx, _pair("resnet", first, "efficientnet", "blocks.2.0")) == "new stem"
    assert network_kind(ctx, _pair("cifar_a", "relu", "cifar_b", "layer1.0")) == "new stem"
    assert network_kind(ctx, _pair("cifar_a", "relu", "cifar_b", "avgpool")) == (
        "new stem and head"
    )
    assert network_kind(ctx, _pair("resnet", "layer2.0", "efficientnet", "blocks.3.0")) == (
        "stitched"
    )
    assert network_kind(ctx, _pair("cifar_a", "layer2.0", "cifar_b", "layer2.0")) == "stitched"
    from stitch_nas.stitching._kinds import _KINDS

    assert _KINDS.get(ctx, truncated.stable_hash()) in KINDS  # memoised per config


def test_a_1x1_grid_joins_as_a_vector(ctx: StitchContext) -> None:
    grid, pooled = CutPoint("s", 0, "nchw", (4, 4, 4)), CutPoint("d", 1, "nchw", (4, 1, 1))
    vector = CutPoint("v", 0, "vector", (4,))
    assert adapters.joinable(vector, pooled)  # a vector may enter a pooled cut
    assert not adapters.joinable(pooled, grid)  # and a pooled cut spreads over no grid
    stitch = adapters.LinearStitch(grid, pooled)
    with torch.no_grad():
        stitch.weight.copy_(torch.eye(4))
        stitch.bias.zero_()
    x = torch.randn(3, 4, 4, 4)
    # averaged over every position, not resized to the centre pixels
    assert torch.allclose(stitch(x), x.mean(dim=(2, 3), keepdim=True), atol=1e-6)
    assert stitch(torch.randn(3, 4, 4, 4)).shape == (3, 4, 1, 1)
    assert adapters.LinearStitch(vector, pooled)(torch.randn(3, 4)).shape == (3, 4, 1, 1)
    trained = adapters.create("linear", grid, pooled, norm="none")
    assert trained.to_grid.pool and trained(x).shape == (3, 4, 1, 1)
    src, dst = ctx.cut("cifar_a", "layer3.0"), ctx.cut("cifar_b", "avgpool")
    assert ctx.row_rule(src, dst) == ("pooled", None)  # CKA pools too


def test_measure_records_the_kind(ctx: StitchContext) -> None:
    assert attrs.KIND in {f.name for f in fields(Measurement)}
    _, m = measure(ctx, _pair("cifar_a", "layer3.0", "cifar_b", "avgpool"))
    assert m.kind == "new head" and 0.0 <= m.accuracy <= 1.0
    assert Measurement(**m.to_dict()) == m
    _, m = measure(ctx, _pair("resnet", "layer2.0", "efficientnet", "blocks.3.0"))
    assert m.kind == "stitched"


def _trial(number: int, accuracy: float, macs: float, config: StitchConfig, kind: str | None):
    user: dict[str, Any] = {
        attrs.CONFIG: config.to_dict(),
        attrs.DESCRIBE: config.describe(),
        attrs.MODELS: list(config.models),
        "macs": macs,
        "params": 10,
    }
    if kind is not None:
        user[attrs.KIND] = kind
    return create_trial(values=[accuracy, macs], user_attrs=user)


def _study() -> optuna.Study:
    s = optuna.create_study(directions=["maximize", "minimize"])
    s.set_user_attr(attrs.OBJECTIVES, ["accuracy", "macs"])
    ref = {"name": "cifar_b", "accuracy": 0.5, "macs": 1e6, "params": 20, "cka": 1.0}
    s.set_user_attr(attrs.REFERENCES, [ref | {attrs.TEST_ACCURACY: 0.5}])
    s.set_user_attr(attrs.SPLIT_SIZES, {"data": "toy", "val": 300, "test": 300})
    stitched = _pair("cifar_a", "layer2.0", "cifar_b", "layer2.0")
    s.add_trial(_trial(0, 0.9, 0.9e6, stitched, "stitched"))
    s.add_trial(
        _trial(1, 0.95, 0.95e6, _pair("cifar_a", "avgpool", "cifar_b", "avgpool"), "new head")
    )
    s.add_trial(_trial(2, 0.97, 0.99e6, _pair("cifar_a", "layer3.0", "cifar_b", "avgpool"), None))
    s.set_user_attr(attrs.TEST_RESULTS, {"0": 0.9, "1": 0.95, "2": 0.97})
    return s


def test_reports_show_the_kind_and_claim_for_stitched_networks_only(
    ctx: StitchContext, tmp_path: Path
) -> None:
    study = _study()
    claim = zoo_claims(study)[0]
    assert claim["dominated_by"] == [0]  # the stitched network alone makes the claim
    assert claim["dominated_by_other"] == [1, 2]
    assert claim["kinds"] == {"0": "stitched", "1": "new head", "2": None}
    summary = write_report(study, tmp_path)
    table = summary.table()
    assert "stitched: cifar_a[input:layer2.0]" in table
    assert "new head: cifar_a[input:avgpool]" in table
    assert "kind unknown: cifar_a[input:layer3.0]" in table  # an older version's trial
    assert "dominated by stitched #0" in table
    assert "networks of another kind: dominated by #1 new head (0.9500" in table
    data = json.loads(summary.json_path.read_text())
    assert [(r["kind"], r["stitched"]) for r in data["front"]] == [
        ("stitched", True),
        ("new head", False),
        (None, None),
    ]
    with summary.csv_path.open(newline="") as fh:
        assert [r["kind"] for r in csv.DictReader(fh)] == ["stitched", "new head", ""]
    html = summary.html_path.read_text()
    assert "<td>new head</td>" in html and "<td>kind unknown</td>" in html
    # the test pass, which has the zoo, works out what the old trial lacks
    _record_kinds(study, ctx)
    assert study.user_attrs[attrs.KINDS] == {"2": "new head"}
    assert zoo_claims(study)[0]["kinds"]["2"] == "new head"
    assert "new head: cifar_a[input:layer3.0]" in write_report(study, tmp_path).table()
