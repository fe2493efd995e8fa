"""``traft``: Traft & Cheney's grid of gap x adapter x rescaling (seeds 002 Sec. 2, 003 Sec. 2).

**Gaps.** Each model is divided into stages (a stage is a run of cut points at one spatial
size, where CNNs downsample between stages; a token model's cuts are split into ``stages`` equal
runs). Traft & Cheney stitch "directly after the first block in each stage" and test all stage
pairs ``x <= y``: for ``x < y`` from the first cut of stage x to the first cut of stage y, for
``x == y`` from the first to the last cut of the stage. ``scenario="same"`` keeps the start and
end of one model (their ResNet-50 / Swin-T / MobileNetV3 scenarios); ``"cross"`` takes the
start of one model and the end of another (their ResNet-50 -> Swin-T scenario).

**Adapters**: ``linear``, ``linear_relu``, ``conv3x3``, ``bottleneck`` (the paper's four), plus
``transformer_block`` wherever it joins (they used a ViT block for ViT); BatchNorm before and
after each (the adapters' default ``norm="batch"``). **Rescaling**: ``none`` ("No Downsample"),
``bilinear`` ("Downsample") and ``integrated`` ("Integrated Downsample", a strided 3x3 conv).
Training: cross-entropy on the task (``loss="task"``), adapter only, AdamW lr 0.002, weight
decay 0.05, cosine to 0 — the adapters' defaults, which are the paper's (seed 002 Sec. 2
"Optimization"); the paper's 10 ImageNet epochs become ``adapter_options["steps"]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from stitch_nas import adapters as registry
from stitch_nas.activations import StitchContext
from stitch_nas.config import AdapterSpec, Fragment, StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.fragments import CutPoint

from ._adapter_choice import can_join
from ._options import TRAFT_ADAPTERS
from ._procedure import memoised
from ._registry import register_space
from .pairwise import zoo_models

__all__ = ["TRAFT_ADAPTERS", "stages", "traft_gaps", "traft_grid"]

_SCENARIOS = ("same", "cross", "both")


def stages(cuts: Sequence[CutPoint], token_stages: int = 4) -> list[list[CutPoint]]:
    """Cut points grouped into stages: runs of one spatial size (grids) or equal runs (tokens).

    Vector cuts (after global pooling) belong to no stage.
    """
    grid = [c for c in cuts if c.layout in ("nchw", "nhwc")]
    tokens = [c for c in cuts if c.layout == "tokens"]
    out: list[list[CutPoint]] = []
    for cut in grid:
        if out and out[-1][-1].spatial == cut.spatial:
            out[-1].append(cut)
        else:
            out.append([cut])
    n = min(token_stages, len(tokens))
    for s in range(n):
        out.append(tokens[s * len(tokens) // n : (s + 1) * len(tokens) // n])
    return [s for s in out if s]


def traft_gaps(
    ctx: StitchContext, models: Sequence[str] | None = None, scenario: str = "same"
) -> list[tuple[str, CutPoint, str, CutPoint]]:
    """Every (model A, cut i, model B, cut j) of Traft & Cheney's stage-pair protocol."""
    if scenario not in _SCENARIOS:
        raise ConfigError(f"unknown scenario {scenario!r}; use one of {_SCENARIOS}")
    names = zoo_models(ctx, models, 1 if scenario == "same" else 2)
    out = []
    for a in names:
        for b in names:
            if (a == b and scenario == "cross") or (a != b and scenario == "same"):
                continue
            sa, sb = stages(ctx.cuts(a)), stages(ctx.cuts(b))
            for x in range(len(sa)):
                for y in range(x, len(sb)):
                    src, dst = sa[x][0], (sb[y][-1] if x == y else sb[y][0])
                    if a == b and dst.index <= src.index:  # a one-cut stage has no gap
                        continue
                    out.append((a, src, b, dst))
    return out


def traft_grid(
    ctx: StitchContext,
    *,
    models: Sequence[str] | None = None,
    scenario: str = "same",
    adapters: Sequence[str] = TRAFT_ADAPTERS,
    resizes: Sequence[str] = registry.RESIZE_MODES,
    adapter_options: Mapping[str, Any] | None = None,
) -> list[StitchConfig]:
    """The full grid gap x adapter x rescaling; combinations that cannot join are left out."""
    for kind in adapters:
        registry.get_adapter(kind)
    bad = sorted(set(resizes) - set(registry.RESIZE_MODES))
    if bad:
        raise ConfigError(f"unknown rescaling {bad}; use some of {registry.RESIZE_MODES}")
    base = {"loss": "task", "train": "adapter", **dict(adapter_options or {})}
    grid = []
    for a, src, b, dst in traft_gaps(ctx, models, scenario):
        for kind in adapters:
            for resize in resizes:
                if can_join(kind, src, dst, resize=resize):
                    spec = AdapterSpec(kind, tuple(sorted({**base, "resize": resize}.items())))
                    frags = (Fragment(a, None, src.name), Fragment(b, dst.name, None))
                    grid.append(StitchConfig(frags, (spec,)))
    return grid


@register_space("traft")
def traft(
    trial: optuna.Trial,
    ctx: StitchContext,
    *,
    models: Sequence[str] | None = None,
    scenario: str = "same",
    adapters: Sequence[str] = TRAFT_ADAPTERS,
    resizes: Sequence[str] = registry.RESIZE_MODES,
    adapter_options: Mapping[str, Any] | None = None,
) -> StitchConfig:
    """One point of :func:`traft_grid` (``traft_point`` = its index); with Optuna's
    ``GridSampler`` or ``n_trials = len(traft_grid(...))`` a random sampler sweeps it."""
    grid: list[StitchConfig] = memoised(
        ctx,
        traft_grid,
        models=models,
        scenario=scenario,
        adapters=adapters,
        resizes=resizes,
        adapter_options=adapter_options,
    )
    if not grid:
        raise ConfigError(f"the Traft grid over {models or 'the zoo'} is empty; allow more models")
    config = grid[trial.suggest_int("traft_point", 0, len(grid) - 1)]
    trial.set_user_attr(
        "gap",
        [
            ctx.cut(f.model, n).depth
            for f, n in (
                (config.fragments[0], config.fragments[0].end),
                (config.fragments[1], config.fragments[1].start),
            )
            if n
        ],
    )
    return config
