"""MACs of the operators fvcore does not count (or counts wrongly): attention kernels,
matrix products, ``padding="same"`` convolutions; and the operators that do no MAC work."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

from stitch_nas.errors import TraceError

# fvcore is imported here once for the fragments package: importing it runs torch.jit.script
# on a few of its losses, which torch >= 2.9 reports as a harmless FutureWarning.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fvcore.nn import FlopCountAnalysis
    from fvcore.nn.jit_handles import conv_flop_count, get_shape

__all__ = ["EXTRA_HANDLES", "NO_MAC_OPS", "FlopCountAnalysis"]

_Handle = Callable[[list[Any], list[Any]], int]

# Ops that do no multiply-accumulate work (elementwise, activations, pooling, reductions,
# indexing). fvcore reports them as "unsupported"; that is noise, so they are only logged at
# DEBUG. Any other unsupported op may hide real MACs and is logged as a warning.
NO_MAC_OPS: frozenset[str] = frozenset(
    f"aten::{name}"
    for name in (
        "abs add add_ addcmul all any argmax argmin avg_pool1d avg_pool2d avg_pool3d bernoulli_ "
        "bitwise_and bitwise_or ceil clamp_min clamp_max clone cos cumsum div div_ erf exp "
        "fill_ gelu gelu_ hardsigmoid hardsigmoid_ hardswish hardswish_ hardtanh hardtanh_ "
        "le leaky_relu leaky_relu_ log log_softmax logical_and logical_not logical_or lt "
        "max_pool1d max_pool2d max_pool3d max_pool2d_with_indices mean min mish mish_ mul mul_ "
        "ne neg pad pixel_shuffle pixel_unshuffle pow reciprocal repeat rsqrt rsub "
        "scatter sigmoid sigmoid_ sign silu silu_ sin softmax softplus sqrt std sub sub_ sum "
        "tanh tanh_ tile topk tril triu unflatten var where adaptive_max_pool2d "
        "adaptive_avg_pool1d expand_as new_ones ones_like rand_like randn_like"
    ).split()
)


def _shape(value: Any) -> list[int]:
    """Return the traced shape of a jit value, failing loudly when the trace lacks it."""
    shape = get_shape(value)
    if shape is None:
        raise TraceError("an op input has an unknown shape in the trace; pass concrete inputs")
    return [int(s) for s in shape]


def _sdpa_macs(inputs: list[Any], outputs: list[Any]) -> int:
    """MACs of ``scaled_dot_product_attention``: Q·Kᵀ plus attn·V.

    Q is ``(..., L, E)``, K ``(..., S, E)``, V ``(..., S, Ev)``; Q's leading dims (batch,
    heads) set the work, which also covers grouped-query attention. Softmax, scaling and
    masking are elementwise and not counted.
    """
    q, k, v = (_shape(x) for x in inputs[:3])
    return math.prod(q[:-2]) * q[-2] * k[-2] * (q[-1] + v[-1])


def _projected_attention_macs(
    q: list[int], k: list[int], qkv_weight: list[int], proj_weight: list[int]
) -> int:
    """In-projections of Q, K and V, Q·Kᵀ plus attn·V over all heads, and the out-projection.

    ``q`` is ``(B, L, E)`` or unbatched ``(L, E)``, ``k`` likewise with ``S`` tokens;
    ``qkv_weight`` is the packed ``(3E, E)`` in-projection, ``proj_weight`` ``(E, E)``.
    """
    batch = math.prod(q[:-2]) if len(q) > 2 else 1
    length, source, dim = q[-2], k[-2], qkv_weight[-1]
    inner = qkv_weight[0] // 3  # embed dim after projection, summed over heads
    projections = batch * (length + 2 * source) * dim * inner
    attention = 2 * batch * length * source * inner
    return projections + attention + batch * length * proj_weight[0] * proj_weight[1]


def _native_mha_macs(inputs: list[Any], outputs: list[Any]) -> int:
    """MACs of ``aten::_native_multi_head_attention``, ``nn.MultiheadAttention``'s fast path
    (eval, no grad, ``batch_first``): the same work as its math path."""
    q, k = _shape(inputs[0]), _shape(inputs[1])
    return _projected_attention_macs(q, k, _shape(inputs[5]), _shape(inputs[7]))


def _encoder_layer_macs(inputs: list[Any], outputs: list[Any]) -> int:
    """MACs of ``aten::_transformer_encoder_layer_fwd``, ``nn.TransformerEncoderLayer``'s fast
    path: self-attention, the two feed-forward linears and the two layer norms, each counted
    as its math path is (layer norm: 5 per element, fvcore's convention)."""
    x = _shape(inputs[0])
    attention = _projected_attention_macs(x, x, _shape(inputs[3]), _shape(inputs[5]))
    hidden = _shape(inputs[14])  # (F, E)
    tokens = math.prod(x[:-1])
    return attention + 2 * tokens * hidden[0] * hidden[1] + 2 * 5 * tokens * x[-1]


def _product_macs(arg: int) -> _Handle:
    """Handle for ``out = [bias +] a @ b`` with ``a = inputs[arg]``: out size × inner dim.

    Unlike fvcore's matmul handler it accepts 1-D operands and counts batch dims that only
    the second operand carries.
    """

    def handle(inputs: list[Any], outputs: list[Any]) -> int:
        return math.prod(_shape(outputs[0])) * _shape(inputs[arg])[-1]

    return handle


def _addbmm_macs(inputs: list[Any], outputs: list[Any]) -> int:
    """MACs of ``addbmm``: a batch of ``(n, k) @ (k, m)`` products summed into ``(n, m)``."""
    return math.prod(_shape(inputs[1])) * _shape(inputs[2])[-1]


def _conv_mode_macs(inputs: list[Any], outputs: list[Any]) -> int:
    """MACs of ``aten::_convolution_mode``, what ``nn.Conv*d(padding="same")`` traces to."""
    x, w, out = _shape(inputs[0]), _shape(inputs[1]), _shape(outputs[0])
    return int(conv_flop_count(x, w, out, transposed=False))


# Ops that carry MACs but have no fvcore handler (or a fragile one).
EXTRA_HANDLES: dict[str, _Handle] = {
    # every kernel scaled_dot_product_attention can dispatch to takes (q, k, v, ...) first
    **{
        f"aten::{op}": _sdpa_macs
        for op in (
            "scaled_dot_product_attention",
            "_scaled_dot_product_attention_math",
            "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention",
            "_scaled_dot_product_fused_attention_overrideable",
        )
    },
    "aten::_native_multi_head_attention": _native_mha_macs,
    "aten::_transformer_encoder_layer_fwd": _encoder_layer_macs,
    "aten::matmul": _product_macs(0),
    "aten::mv": _product_macs(0),
    "aten::dot": _product_macs(0),
    "aten::vdot": _product_macs(0),
    "aten::baddbmm": _product_macs(1),
    "aten::addmv": _product_macs(1),
    "aten::addbmm": _addbmm_macs,
    "aten::_convolution_mode": _conv_mode_macs,
}
