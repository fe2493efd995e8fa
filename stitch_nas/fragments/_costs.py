"""Costs of a network: multiply-accumulates (MACs, fvcore convention) and parameter counts.

:func:`count_macs` is the figure used everywhere in stitch_nas; :func:`count_macs_reference`
is an independent cross-check built on ``torch.utils.flop_counter``.
"""

from __future__ import annotations

import copy
import logging
import threading
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from stitch_nas.errors import ConfigError, TraceError

from ._op_macs import EXTRA_HANDLES, NO_MAC_OPS, FlopCountAnalysis

__all__ = [
    "count_macs",
    "count_macs_by_operator",
    "count_macs_reference",
    "count_params",
    "count_params_of",
]

logger = logging.getLogger(__name__)

#: Counts take turns: torch.jit's tracer fails when two threads trace at once (two drivers in
#: one process, Optuna's ``n_jobs``: "Cannot get parent from Scope with no parent", "module is
#: not installed as a submodule"), and a count flips the shared model's train/eval flags
_TRACING = threading.Lock()


def _check_shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    """Validate a full input shape (batch included) and return it as a tuple."""
    shape = tuple(input_shape) if isinstance(input_shape, (tuple, list, torch.Size)) else ()
    if not shape or not all(type(s) is int and s > 0 for s in shape):
        raise ConfigError(
            f"input_shape={input_shape!r} is not a shape; pass positive ints with the batch "
            "first, e.g. (1, 3, 224, 224)"
        )
    return shape


def _probe_tensor(model: nn.Module, shape: tuple[int, ...]) -> torch.Tensor:
    """A reproducible random input on the model's device and in its floating dtype."""
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    # Random rather than zeros so data-dependent branches see a typical input; seeded so the
    # count is reproducible and the global RNG is left alone.
    gen = torch.Generator().manual_seed(0)
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


def _resolve_inputs(
    model: nn.Module, input_shape: Sequence[int] | None, inputs: Any
) -> tuple[Any, ...]:
    """Turn ``input_shape``/``inputs`` into the positional-argument tuple for the model."""
    if inputs is None:
        if input_shape is None:
            raise ConfigError(
                "input_shape=None needs inputs=; pass a shape such as (1, 3, 224, 224)"
            )
        return (_probe_tensor(model, _check_shape(input_shape)),)
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    if input_shape is not None and args and isinstance(args[0], torch.Tensor):
        if tuple(args[0].shape) != _check_shape(input_shape):
            raise ConfigError(
                f"input_shape={tuple(input_shape)} disagrees with inputs of shape "
                f"{tuple(args[0].shape)}; pass input_shape=None or matching inputs"
            )
    return args


def _trace_counts(model: nn.Module, args: tuple[Any, ...]) -> tuple[Any, Any]:
    """fvcore's counts by operator and its unsupported ops, traced in eval mode (every
    submodule's train/eval flag restored after)."""
    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # torch.jit tracing is deprecated in recent torch and may warn about
            # data-dependent Python control flow; neither changes the count.
            warnings.simplefilter("ignore")
            analysis = FlopCountAnalysis(model, args)
            analysis.set_op_handle(**EXTRA_HANDLES)
            analysis.unsupported_ops_warnings(False)
            analysis.uncalled_modules_warnings(False)
            analysis.tracer_warnings("none")
            return analysis.by_operator(), analysis.unsupported_ops()
    except Exception as exc:  # anything from tracing or a handler means we have no count
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise TraceError(
            f"cannot count MACs of {type(model).__name__}: {reason}; make sure "
            "torch.jit.trace(model, inputs) works for this input"
        ) from exc
    finally:
        for module, training in modes.items():
            module.training = training


def count_macs_by_operator(
    model: nn.Module, input_shape: Sequence[int] | None, *, inputs: Any = None, strict: bool = False
) -> dict[str, int]:
    """MACs of one forward pass, broken down by operator; see :func:`count_macs`.

    Args:
        model: Network to analyse, as for :func:`count_macs`.
        input_shape: Full input shape with the batch dimension first, or ``None``.
        inputs: Optional positional arguments used instead of a random input.
        strict: Raise instead of warning when an op that may do multiply-adds has no handler.

    Returns:
        MACs per operator, keyed by fvcore's short names (``"linear"``, ``"conv"``,
        ``"scaled_dot_product_attention"``, ``"layer_norm"``, ...).

    Raises:
        ConfigError: ``input_shape`` is malformed or disagrees with ``inputs``.
        TraceError: The model cannot be traced or counted.
    """
    args = _resolve_inputs(model, input_shape, inputs)
    with _TRACING:
        by_op, unsupported = _trace_counts(model, args)
    name = type(model).__name__
    quiet = ", ".join(sorted(op for op in unsupported if op in NO_MAC_OPS))
    loud = ", ".join(sorted(op for op in unsupported if op not in NO_MAC_OPS))
    if quiet:
        logger.debug("count_macs(%s): no-MAC ops counted as 0: %s", name, quiet)
    if loud and strict:
        raise TraceError(
            f"count_macs({name}): ops without a MAC handler: {loud}; add a handler in "
            "stitch_nas/fragments/_costs.py or list the op as MAC-free"
        )
    if loud:
        logger.warning("count_macs(%s): ops without a MAC handler, counted as 0: %s", name, loud)
    return {op: int(round(n)) for op, n in by_op.items()}


def count_macs(
    model: nn.Module, input_shape: Sequence[int] | None, *, inputs: Any = None, strict: bool = False
) -> int:
    """Multiply-accumulates of one forward pass, in the fvcore convention.

    Convention: one fused multiply-add is one MAC (half of what a "2 FLOPs per MAC"
    counter reports). The input is a seeded random tensor of ``input_shape`` (batch
    included) so the result is for that whole batch; divide by the batch size for a
    per-sample figure.

    Counted: linear/addmm/mm/bmm/matmul/einsum/mv/dot/baddbmm (inner-product MACs only,
    biases ignored), convolutions including transposed and ``padding="same"`` ones, and
    ``F.scaled_dot_product_attention`` (and each kernel it dispatches to) as
    ``B·heads·L·S·E + B·heads·L·S·Ev`` (Q·Kᵀ plus attn·V), which fvcore alone silently
    counts as 0, and the fast paths of ``nn.MultiheadAttention``
    (``aten::_native_multi_head_attention``) and ``nn.TransformerEncoderLayer``
    (``aten::_transformer_encoder_layer_fwd``) as the work of their math paths. Also
    counted, because fvcore's default handlers count them: batch norm (eval: 1-2 per
    element, train: 4-5), layer, group and instance norm (4-5 per element),
    ``adaptive_avg_pool2d`` (1 per input element), nearest/bilinear upsampling (1/4 per
    output element) and ``grid_sample``.
    Not counted: activations, softmax, residual adds and other elementwise ops,
    ``avg_pool``/``max_pool``, ``rms_norm`` and anything else without a handler (such ops
    are logged; ones not known to be MAC-free are logged as a warning).

    The model is traced with ``torch.jit`` in eval mode under ``torch.no_grad()``; every
    submodule's train/eval flag is restored afterwards.

    Args:
        model: Network to analyse; any ``nn.Module`` that ``torch.jit.trace`` accepts,
            including ``torch.fx.GraphModule``.
        input_shape: Full input shape with the batch dimension first, e.g.
            ``(1, 3, 224, 224)``. May be ``None`` when ``inputs`` is given.
        inputs: Optional tensor or tuple of positional arguments used instead of a random
            input of ``input_shape`` (for models with several inputs).
        strict: Raise TraceError naming any op that may do multiply-adds and has no
            handler (the default logs a warning naming it and counts it as 0).

    Returns:
        Total MACs for the batch.

    Raises:
        ConfigError: ``input_shape`` is malformed or disagrees with ``inputs``.
        TraceError: The model cannot be traced or counted.
    """
    return sum(count_macs_by_operator(model, input_shape, inputs=inputs, strict=strict).values())


def count_macs_reference(model: nn.Module, input_shape: Sequence[int]) -> int:
    """Independent MAC count from ``torch.utils.flop_counter.FlopCounterMode``.

    A deep copy of the model runs in eval mode on the meta device (no memory, no compute)
    and the reported FLOPs are halved to get MACs. Differences from :func:`count_macs`:
    FlopCounterMode only counts mm/addmm/bmm/baddbmm, convolutions and attention kernels,
    so norms, ``adaptive_avg_pool2d`` and upsampling (which fvcore counts) are absent, as
    are ``mv``/``dot``. On transformers the gap is the layer norms (well under 1% for
    ViT-Ti); on narrow CNNs batch norm can make it a few percent.

    Args:
        model: Network to analyse; it is copied, never modified.
        input_shape: Full input shape with the batch dimension first.

    Returns:
        Total MACs for the batch.

    Raises:
        ConfigError: ``input_shape`` is malformed.
        TraceError: The model cannot run on the meta device.
    """
    from torch.utils.flop_counter import FlopCounterMode

    shape = _check_shape(input_shape)
    try:
        meta_model = copy.deepcopy(model).to("meta").eval()
        dtype = next(
            (p.dtype for p in meta_model.parameters() if p.is_floating_point()), torch.float32
        )
        x = torch.empty(shape, device="meta", dtype=dtype)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            meta_model(x)
    except Exception as exc:  # a meta-device failure means we have no reference
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise TraceError(
            f"cannot run {type(model).__name__} on the meta device: {reason}; use count_macs"
        ) from exc
    return int(counter.get_total_flops()) // 2


def _param_key(param: torch.Tensor) -> tuple[Any, ...]:
    """Identity of a parameter's storage, so aliases of one tensor are counted once."""
    if param.device.type == "meta" or param.data_ptr() == 0:
        return ("id", id(param))
    return ("ptr", param.device, param.data_ptr(), param.dtype, tuple(param.shape))


def count_params_of(modules: Iterable[nn.Module]) -> int:
    """Number of parameters reachable from several modules, each counted once.

    A stitched network reuses parameter objects of the models it was cut from; counting the
    union keeps a weight shared by two fragments (or tied inside one) from being counted
    twice. Parameters are deduplicated by identity and by storage pointer, so two
    ``Parameter`` objects viewing the same memory also count once.

    Args:
        modules: The modules whose parameters to count.

    Returns:
        Total number of scalar parameters.

    Raises:
        ConfigError: An element is not an ``nn.Module`` or a parameter is uninitialized.
    """
    if isinstance(modules, nn.Module):  # a lone module is a common slip; count it whole
        modules = [modules]
    seen: set[tuple[Any, ...]] = set()
    total = 0
    for module in modules:
        if not isinstance(module, nn.Module):
            raise ConfigError(
                f"count_params_of got {type(module).__name__}; pass an iterable of nn.Module"
            )
        for name, param in module.named_parameters():
            if isinstance(param, nn.parameter.UninitializedParameter):
                raise ConfigError(
                    f"parameter {name!r} of {type(module).__name__} is uninitialized; run one "
                    "forward pass before counting"
                )
            key = _param_key(param)
            if key not in seen:
                seen.add(key)
                total += param.numel()
    return total


def count_params(module: nn.Module) -> int:
    """Number of parameters reachable from ``module``, shared ones counted once.

    Args:
        module: The module whose parameters to count.

    Returns:
        Total number of scalar parameters (see :func:`count_params_of`).
    """
    return count_params_of([module])
