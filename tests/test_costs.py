"""Tests for stitch_nas.fragments: MAC counts against hand-computed figures and a reference."""

from __future__ import annotations

import logging
import threading

import pytest
import timm
import torch
import torch.nn.functional as F
from torch import nn

from stitch_nas.errors import ConfigError, TraceError
from stitch_nas.fragments._costs import (
    count_macs,
    count_macs_by_operator,
    count_macs_reference,
    count_params,
    count_params_of,
)

# fvcore counts these, FlopCounterMode does not; removing them must give the reference exactly.
_FVCORE_ONLY_OPS = {"batch_norm", "layer_norm", "group_norm", "adaptive_avg_pool2d"}


class _Attention(nn.Module):
    """Bare scaled-dot-product attention on given Q, K, V."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)


class _Twice(nn.Module):
    """Applies one Linear twice through two attribute names."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.second = self.first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


class _Broken(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom")


def test_linear_macs_are_in_times_out_per_sample() -> None:
    assert count_macs(nn.Linear(10, 7), (3, 10)) == 3 * 10 * 7


def test_conv_macs() -> None:
    # 16x16 input, 3x3 kernel, stride 1, no padding -> 14x14 output.
    expected = 8 * 3 * 3 * 3 * 14 * 14
    assert count_macs(nn.Conv2d(3, 8, 3), (1, 3, 16, 16)) == expected
    assert count_macs(nn.Conv2d(3, 8, 3), (2, 3, 16, 16)) == 2 * expected


def test_same_padding_conv_is_counted() -> None:
    assert count_macs(nn.Conv2d(3, 4, 3, padding="same"), (1, 3, 8, 8)) == 4 * 3 * 9 * 64


def test_sdpa_macs_from_traced_shapes() -> None:
    b, heads, length, source, embed, embed_v = 2, 4, 8, 6, 16, 10
    inputs = (
        torch.randn(b, heads, length, embed),
        torch.randn(b, heads, source, embed),
        torch.randn(b, heads, source, embed_v),
    )
    expected = b * heads * length * source * (embed + embed_v)
    assert count_macs(_Attention(), None, inputs=inputs) == expected


def test_vector_matmul_is_counted() -> None:
    class VecMat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(5, 7))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.w

    assert count_macs(VecMat(), (5,)) == 5 * 7


def test_vit_tiny_matches_reference_within_one_percent() -> None:
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    shape = (1, 3, 224, 224)
    by_op = count_macs_by_operator(model, shape)
    macs = sum(by_op.values())
    reference = count_macs_reference(model, shape)
    assert abs(macs - reference) / reference < 0.01
    # 12 blocks x 3 heads x (Q.K^T + attn.V) over 197 tokens of width 64.
    assert by_op["scaled_dot_product_attention"] == 12 * 3 * 2 * 197 * 197 * 64
    assert macs == count_macs(model, shape)
    assert sum(n for op, n in by_op.items() if op not in _FVCORE_ONLY_OPS) == reference


@pytest.mark.parametrize("name", ["test_vit", "test_resnet"])
def test_matmul_and_conv_part_equals_reference(name: str) -> None:
    model = timm.create_model(name, pretrained=False)
    shape = (1, *model.pretrained_cfg["input_size"])
    by_op = count_macs_by_operator(model, shape)
    core = sum(n for op, n in by_op.items() if op not in _FVCORE_ONLY_OPS)
    assert core == count_macs_reference(model, shape)


@pytest.mark.parametrize("name", ["test_vit", "test_resnet"])
def test_tiny_timm_models_close_to_reference(name: str) -> None:
    # These narrow nets spend ~1.1-1.3% of their MACs in norms, which only fvcore counts.
    model = timm.create_model(name, pretrained=False)
    shape = (1, *model.pretrained_cfg["input_size"])
    macs = count_macs(model, shape)
    reference = count_macs_reference(model, shape)
    assert reference < macs < 1.02 * reference


def test_train_eval_modes_restored() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    model.train()
    model[1].eval()
    count_macs(model, (2, 4))
    assert [m.training for m in model.modules()] == [True, True, False, True]
    model.eval()
    count_macs(model, (2, 4))
    assert not any(m.training for m in model.modules())


def test_threads_counting_one_model_at_once_get_the_same_count() -> None:
    # two drivers in one process (or Optuna's n_jobs) count MACs from two threads
    model = timm.create_model("test_resnet", pretrained=False, num_classes=10).eval()
    expected = count_macs(model, (1, 3, 32, 32))
    counts: list[int] = []
    failures: list[BaseException] = []

    def count() -> None:
        for _ in range(8):
            try:
                counts.append(count_macs(model, (1, 3, 32, 32)))
            except TraceError as exc:
                failures.append(exc)

    threads = [threading.Thread(target=count) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[:1]
    assert counts == [expected] * 16
    assert not any(m.training for m in model.modules())


def test_counts_in_eval_mode() -> None:
    # Train-mode batch norm costs 5 per element in fvcore's convention, eval mode 2.
    model = nn.BatchNorm1d(4).train()
    assert count_macs(model, (3, 4)) == 2 * 3 * 4


def test_fx_graph_module() -> None:
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    graph_module = torch.fx.symbolic_trace(net)
    assert isinstance(graph_module, torch.fx.GraphModule)
    expected = 3 * (8 * 16 + 16 * 4)
    assert count_macs(graph_module, (3, 8)) == expected
    assert count_macs(nn.Sequential(graph_module, nn.Identity()), (3, 8)) == expected


def test_trace_failure_raises_trace_error() -> None:
    with pytest.raises(TraceError, match="_Broken.*boom"):
        count_macs(_Broken(), (1, 4))


@pytest.mark.parametrize("shape", [(), (1, 0, 4), (1, 2.5), "abc"])
def test_bad_shape_raises_config_error(shape: object) -> None:
    with pytest.raises(ConfigError, match="input_shape"):
        count_macs(nn.Linear(4, 4), shape)  # type: ignore[arg-type]


def test_inputs_disagreeing_with_shape_rejected() -> None:
    with pytest.raises(ConfigError, match="disagrees"):
        count_macs(nn.Linear(4, 4), (2, 4), inputs=torch.randn(3, 4))


def test_no_mac_ops_are_quiet_but_unknown_ops_warn(caplog: pytest.LogCaptureFixture) -> None:
    class Cdist(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cdist(F.gelu(x) + x, x)

    with caplog.at_level(logging.DEBUG):
        count_macs(Cdist(), (2, 5, 3))
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "aten::cdist" in warned
    assert "aten::gelu" not in warned and "aten::add" not in warned


def test_count_params_dedupes_shared_module() -> None:
    assert count_params(_Twice()) == 8 * 8 + 8


def test_count_params_dedupes_aliased_storage() -> None:
    a = nn.Linear(4, 3, bias=False)
    b = nn.Linear(4, 3, bias=False)
    b.weight = nn.Parameter(a.weight.data)  # another Parameter object on the same memory
    assert count_params(nn.ModuleList([a, b])) == 12


def test_count_params_of_union_of_fragments() -> None:
    shared = nn.Linear(4, 4)
    left = nn.Sequential(nn.Linear(2, 4), shared)
    right = nn.Sequential(shared, nn.Linear(4, 1, bias=False))
    assert count_params_of([left, right]) == (2 * 4 + 4) + (4 * 4 + 4) + 4
    assert count_params_of([left]) == count_params(left) == (2 * 4 + 4) + (4 * 4 + 4)
    assert count_params_of([]) == 0


def test_count_params_of_rejects_non_modules() -> None:
    with pytest.raises(ConfigError, match="nn.Module"):
        count_params_of([nn.Linear(2, 2), "oops"])  # type: ignore[list-item]


# --- every attention op PyTorch can emit, against FlopCounterMode -------------------------


class _SelfAttention(nn.Module):
    def __init__(self, mha: nn.MultiheadAttention, need_weights: bool = False) -> None:
        super().__init__()
        self.mha, self.need_weights = mha, need_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mha(x, x, x, need_weights=self.need_weights)[0]


def _attention_macs(model: nn.Module, shape: tuple[int, ...]) -> int:
    by_op = count_macs_by_operator(model, shape, strict=True)
    return sum(n for op, n in by_op.items() if op not in _FVCORE_ONLY_OPS)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("need_weights", [False, True])
def test_multihead_attention_fast_and_math_paths_match_flop_counter(
    batch_first: bool, need_weights: bool
) -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(32, 4, batch_first=batch_first).eval()
    model = _SelfAttention(mha, need_weights)
    shape = (3, 7, 32)  # (batch, tokens, dim) or (tokens, batch, dim)
    ops = count_macs_by_operator(model, shape, strict=True)
    # batch_first takes the fused kernel in eval under no_grad; the others the math path
    assert ("_native_multi_head_attention" in ops) == batch_first, ops
    tokens, batch = (7, 3) if batch_first else (3, 7)
    by_hand = batch * (4 * tokens * 32 * 32 + 2 * tokens * tokens * 32)
    assert _attention_macs(model, shape) == by_hand == count_macs_reference(model, shape)


def test_transformer_encoder_layer_fast_path_counts_its_math_path() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0).eval()

    class Fused(nn.Module):  # the kernel nn.TransformerEncoderLayer's fast path calls
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a, n1, n2 = self.layer.self_attn, self.layer.norm1, self.layer.norm2
            lin1, lin2 = self.layer.linear1, self.layer.linear2
            return torch._transformer_encoder_layer_fwd(
                x, 32, 4, a.in_proj_weight, a.in_proj_bias, a.out_proj.weight, a.out_proj.bias,
                False, False, n1.eps, n1.weight, n1.bias, n2.weight, n2.bias,
                lin1.weight, lin1.bias, lin2.weight, lin2.bias, None,
            )  # fmt: skip

    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        assert torch.allclose(Fused()(x), layer(x), atol=1e-5)
    fused = count_macs_by_operator(Fused(), (2, 5, 32), strict=True)
    assert set(fused) == {"_transformer_encoder_layer_fwd"}
    assert sum(fused.values()) == count_macs(layer, (2, 5, 32), strict=True)


@pytest.mark.parametrize(
    "kernel",
    ["_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention_for_cpu"],
)
def test_sdpa_kernels_are_counted_like_sdpa(kernel: str) -> None:
    class Kernel(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return getattr(torch.ops.aten, kernel)(q, k, v)[0]

    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    expected = count_macs(_Attention(), None, inputs=(q, k, v), strict=True)
    assert expected == 2 * 3 * 5 * 6 * (8 + 8)
    assert count_macs(Kernel(), None, inputs=(q, k, v), strict=True) == expected


def test_an_op_without_handler_is_an_error_when_strict() -> None:
    class Cdist(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cdist(x, x)

    with pytest.raises(TraceError, match=r"aten::cdist"):
        count_macs(Cdist(), (2, 5, 3), strict=True)
