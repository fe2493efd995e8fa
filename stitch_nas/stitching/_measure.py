"""Measure a stitched network: accuracy, parameters, MACs, CKA score and (optionally) latency.

The accuracy pass starts from the cached activation of the first fragment, so a trial runs only
what is new (stitches and the fragments after them), and streams: batch by batch from the cache
(or from the prefix recomputed batch by batch), through the stitch, the suffix and the head, to a
count of correct predictions; no split is held whole. MACs are summed from per-fragment counts
that are memoised per (model, start, end), plus the stitches' own MACs.

The same pass also counts the images right among the first :data:`SAMPLE_IMAGES` of the split
(``sample_correct`` of ``sample_images``): a network rebuilt from weights its trial stored is
checked on that fixed sample (:func:`sample_correct`) instead of the whole split again.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Protocol

import torch

from stitch_nas.activations import StitchContext, largest_activations
from stitch_nas.adapters import StitchAdapter
from stitch_nas.choices import BUDGET_FIGURES
from stitch_nas.config import StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.fragments import count_params_of
from stitch_nas.machine import release_freed_memory

from ._build import StitchedNet, build
from ._costs import config_cka, network_macs
from ._heads import fit_head
from ._kinds import network_kind
from ._latency import LatencySpec, time_network

__all__ = [
    "Measurement",
    "Screen",
    "measure",
    "reproduces",
    "reproduces_count",
    "head_accuracy",
    "fit_net_head",
    "net_outputs",
    "output_batches",
    "images_at_once",
    "count_correct",
    "streamed_accuracy",
    "SAMPLE_IMAGES",
    "sample_correct",
]

logger = logging.getLogger(__name__)

#: the fixed sample a stored network is checked on: the first this many images of the split
SAMPLE_IMAGES = 512


@dataclass
class Measurement:
    """What one trial measured, each on what its name says (see the field docs)."""

    accuracy: float  #: top-1 accuracy on the evaluation split
    macs: int  #: MACs per image (fvcore convention), fragments + stitches
    params: int  #: parameters the network uses, shared ones counted once
    cka: float  #: product of joint CKA scores on the probe set (1.0 for a single model)
    split: str = "val"
    #: the network's latency in milliseconds (:mod:`._latency`): the median of timed runs of
    #: ``LatencySpec.batch`` images, or the user's table's or function's figure
    latency_ms: float | None = None
    latency_interval_ms: list[float] | None = None  #: 95 % interval of that median (timed)
    latency_how: str | None = None  #: where and how ``latency_ms`` was had
    fit_seconds: float = 0.0  #: time to fit the stitches
    eval_seconds: float = 0.0  #: time of the accuracy pass
    #: the network's kind (:func:`~stitch_nas.stitching.network_kind`); None: not known
    kind: str | None = None
    #: images right among the first ``sample_images`` of the split (None: not counted)
    sample_correct: int | None = None
    sample_images: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def budget_value(self, key: str) -> float:
        """The figure a budget named ``key`` caps (``choices.BUDGET_FIGURES``); NaN when it
        was not measured (latency, where nothing asked for it)."""
        value = getattr(self, BUDGET_FIGURES[key])
        return math.nan if value is None else float(value)


def head_accuracy(
    ctx: StitchContext,
    config: StitchConfig,
    outputs: torch.Tensor,
    labels: torch.Tensor,
    probe_outputs: torch.Tensor | None,
) -> float:
    """Top-1 accuracy: the model's own classifier, or k-NN / linear probe on final features."""
    head = None
    if config.head.kind != "native":
        if probe_outputs is None:
            raise ConfigError(
                f"head kind {config.head.kind!r} is fitted on the network's probe outputs; "
                "pass probe_outputs"
            )
        head = fit_head(config.head, probe_outputs, ctx.labels("probe"), ctx.num_classes)
    scores = outputs if head is None else ctx.run(head, outputs)
    return float((scores.argmax(1).cpu() == labels).float().mean())


def images_at_once(ctx: StitchContext, net: torch.nn.Module) -> int:
    """How many images of a batch ``net`` takes at once: the batch size, or fewer where one of
    its adapters holds more per image than the zoo's largest activation (which the batch size
    was chosen for), so that it holds at most what a batch of that activation does. A ``conv3x3``
    from efficientnet_b0's head (1,280 channels at 7x7) into resnet18's stem (64 at 112x112)
    resizes all 1,280 channels onto the stem's grid first (``StitchAdapter.widest_per_image``).
    """
    widest = max(
        (m.widest_per_image for m in net.modules() if isinstance(m, StitchAdapter)), default=0
    )
    largest = largest_activations(ctx)[0] if widest else 0
    if widest <= largest:
        return ctx.batch_size
    return max(1, ctx.batch_size * largest // widest)


def output_batches(
    ctx: StitchContext,
    net: StitchedNet,
    split: str,
    index: torch.Tensor | None = None,
) -> Iterator[torch.Tensor]:
    """``net``'s outputs on ``split`` batch by batch, continuing from the first model's cached
    activation (served or recomputed batch by batch by the context).

    When the first fragment was fine-tuned (adapter option ``train='all'``) the cache no longer
    stands for it, and the whole network runs on the preprocessed images, batch by batch.
    ``index`` (sorted): only those images of the split, in that order (a first-fragment
    activation the cache lacks is computed for those images only, and kept for them:
    :meth:`~stitch_nas.activations.StitchContext.activation_rows`).
    """
    first = net.config.fragments[0]
    rest: torch.nn.Module
    if net.cached_prefix:
        rest = net.new_parts()
        if index is None:
            source = ctx.activation_batches(first.model, first.end, split)
        else:
            source = ctx.activation_rows(first.model, first.end, split, index)
    else:
        rest = torch.nn.Sequential(*net.parts)
        if index is None:
            source = ctx.input_batches(first.model, split)
        else:
            source = ctx.input_rows(first.model, split, index)
    at_once = images_at_once(ctx, rest)
    try:
        for batch in source:
            with ctx.frozen():  # not around the yield: the caller's code must not run under it
                if len(batch) <= at_once:
                    out = rest(batch)
                else:  # eval mode: parts give the batch's outputs
                    out = torch.cat([rest(part) for part in batch.split(at_once)])
            yield out.float()
            release_freed_memory()  # holes that add up batch after batch, not only per pass
    finally:
        release_freed_memory()  # what this pass's batches freed, beyond what is kept for reuse


def net_outputs(ctx: StitchContext, net: StitchedNet, split: str) -> torch.Tensor:
    """``net``'s outputs on the whole of ``split`` (see :func:`output_batches`)."""
    return torch.cat(list(output_batches(ctx, net, split)))


def count_correct(
    ctx: StitchContext,
    net: StitchedNet,
    split: str,
    head: torch.nn.Module | None,
    index: torch.Tensor | None = None,
) -> tuple[int, int]:
    """Images of ``split`` (``index``: those only) that ``net`` then ``head`` gets right, and
    how many were seen."""
    correct, seen, _ = _count(ctx, net, split, head, index)
    return correct, seen


def _count(
    ctx: StitchContext,
    net: StitchedNet,
    split: str,
    head: torch.nn.Module | None,
    index: torch.Tensor | None = None,
    first: int = 0,
) -> tuple[int, int, int]:
    """:func:`count_correct`, and how many of the right ones are among the split's ``first``
    images (``index``: sorted, so a batch's images are known by position)."""
    labels = ctx.labels(split) if index is None else ctx.labels(split)[index]
    correct = seen = in_first = 0
    for outputs in output_batches(ctx, net, split, index):
        if head is not None:
            with ctx.frozen():
                outputs = head(outputs)
        wanted = labels[seen : seen + len(outputs)]
        right = outputs.argmax(1).cpu() == wanted
        correct += int(right.sum())
        if first:
            end = seen + len(outputs)
            at = torch.arange(seen, end) if index is None else index[seen:end].cpu()
            in_first += int(right[at < first].sum())
        seen += len(outputs)
    return correct, seen, in_first


def sample_correct(
    ctx: StitchContext, net: StitchedNet, head: torch.nn.Module | None, images: int
) -> int:
    """Images right among the first ``images`` of the validation split: what a trial recorded
    as ``sample_correct``, for a network rebuilt to be checked. Only those images run (a
    prefix the cache lacks is computed for them, not for the whole split)."""
    return count_correct(ctx, net, "val", head, torch.arange(images))[0]


def _mean(correct: int, seen: int) -> float:
    # float32, as the mean over a whole split of 0/1 predictions has always been computed
    return float(torch.tensor(correct, dtype=torch.float32) / max(seen, 1))


def streamed_accuracy(
    ctx: StitchContext, net: StitchedNet, split: str, head: torch.nn.Module | None
) -> float:
    """Top-1 accuracy of ``net`` (then ``head``, None: native) on ``split``, batch by batch."""
    return _mean(*count_correct(ctx, net, split, head))


#: how far a re-measured accuracy may move when activations are stored below float32: the
#: search's own figures do not depend on the cache (activations are rounded cut by cut), but a
#: rebuild elsewhere (another machine, batch size or device) runs other kernels, whose rounding
#: through float16 flips a near-tie now and then; another zoo, data set or network moves it by more
LOW_PRECISION_TOLERANCE = 0.002


def reproduces(ctx: StitchContext, measured: float, recorded: float, split: str = "val") -> bool:
    """Whether ``measured`` (a rebuilt network's accuracy on ``split``) is the ``recorded`` one,
    by :func:`reproduces_count`'s rule on the images right: exactly with float32 activation
    storage; with float16, within :data:`LOW_PRECISION_TOLERANCE` or one image."""
    images = len(ctx.split(split))
    return reproduces_count(ctx, round(measured * images), round(recorded * images), images)


def reproduces_count(ctx: StitchContext, correct: int, recorded: int, images: int) -> bool:
    """:func:`reproduces` for images right on a fixed sample: exactly with float32 activation
    storage; with float16, the same share of flips, and one image however small the sample (a
    near-tie flips by whether a cut was recomputed or read from the cache, which differs
    between processes: 255 against 256 of 300 on the digits)."""
    if ctx.cache.dtype == torch.float32:
        return correct == recorded
    return abs(correct - recorded) <= max(1.0, LOW_PRECISION_TOLERANCE * images)


class Screen(Protocol):
    """A gate between growing slices of the split (multi-fidelity evaluation;
    :mod:`stitch_nas.search._fidelity` holds the rule)."""

    def slices(self, n: int) -> list[torch.Tensor]:
        """The images scored in turn, as sorted indices into a split of ``n`` (together, every
        image once)."""
        ...

    def check(self, costs: Measurement, correct: int, images: int) -> None:
        """Raise to stop after a slice (``correct`` of the ``images`` scored so far; ``costs``:
        everything but the accuracy)."""
        ...


def fit_net_head(ctx: StitchContext, net: StitchedNet) -> torch.nn.Module | None:
    """The fitted head of ``net`` (None: native), exactly as :func:`measure` scores it."""
    if net.config.head.kind == "native":
        return None
    probe = net_outputs(ctx, net, "probe")
    return fit_head(net.config.head, probe, ctx.labels("probe"), ctx.num_classes)


def measure(
    ctx: StitchContext,
    config: StitchConfig,
    *,
    split: str = "val",
    fuse: bool = False,
    latency: LatencySpec | None = None,
    cka: float | None = None,
    screen: Screen | None = None,
    net: StitchedNet | None = None,
    fit_seconds: float = 0.0,
    sample: int = SAMPLE_IMAGES,
) -> tuple[StitchedNet, Measurement]:
    """Build ``config`` and measure it on ``split``.

    With ``screen``, the accuracy pass scores the screen's slices in turn and lets it stop the
    measurement (it raises) before each further one: the same correct images as one pass.
    ``net``: ``config`` already built (by the probe-accuracy proxy), which took ``fit_seconds``.
    ``sample``: how many of the split's first images ``sample_correct`` counts (0: none).
    ``latency``: how the network is timed (None: it is not).
    """
    start = time.perf_counter() - fit_seconds
    if net is None or net.config != config or fuse:
        net = build(ctx, config, fuse=fuse)
    fitted = time.perf_counter()
    # the costs come first: a screen weighs each slice's accuracy against them
    result = Measurement(
        accuracy=math.nan,
        macs=network_macs(ctx, net),
        params=count_params_of([net]),
        cka=config_cka(ctx, config) if cka is None else cka,
        split=split,
        fit_seconds=fitted - start,
        kind=network_kind(ctx, config),
    )
    if latency is not None:
        images = ctx.split("val").read(torch.arange(1)).to(ctx.device)
        timed = time_network(net, config, images, latency)
        result.latency_ms, result.latency_how = timed.ms, timed.how
        result.latency_interval_ms = None if timed.interval is None else list(timed.interval)
    counted = time.perf_counter()
    head = fit_net_head(ctx, net)
    first = min(sample, len(ctx.labels(split)))
    if screen is None:
        correct, seen, in_first = _count(ctx, net, split, head, first=first)
    else:
        correct = seen = in_first = 0
        for i, part in enumerate(screen.slices(len(ctx.labels(split)))):
            if i:  # the screen judges what has been scored before each further slice
                screen.check(result, correct, seen)
            # most configs stop after a slice: a prefix the cache lacks is computed for the
            # slice's images only (and kept for them: every config's slices are the same
            # images); the values are those of the whole split's pass (cut by cut)
            more, extra, more_first = _count(ctx, net, split, head, part, first)
            correct, seen, in_first = correct + more, seen + extra, in_first + more_first
    if first:
        result.sample_correct, result.sample_images = in_first, first
    result.accuracy = _mean(correct, seen)
    result.eval_seconds = time.perf_counter() - counted
    return net, result
