"""SN-Net's joint training (Pan et al., seed 001, Alg. 1): anchors and stitching layers trained
together as one elastic network, one randomly drawn stitch per step.

The configuration set E holds the anchors and every stitch SN-Net's plan makes between them
(:func:`stitch_nas.snnet.snnet_stitches`: nearest stitching, sliding windows). Every
stitching layer is a 1x1 convolution (the ``linear`` adapter, ``norm="none"`` by default, as in
SN-Net) initialised by least squares on the probe split (SN-Net uses 100 training images).
Then each step draws one member of E uniformly, runs a mini-batch of the train split through
it and takes an AdamW step on the cross-entropy, or with ``loss="distill"`` on the KL
divergence from a teacher's logits (SN-Net distils from a RegNetY-160 for DeiT; here a zoo
model: ``teacher="best"``, the best on the probe split, by default, a zoo name, or
``"destination"``, each member's last model; softened by ``temperature``, 1 by default, as
the adapters' ``distill`` loss) (SN-Net trains with DeiT's recipe: AdamW,
lr 1e-4, weight decay 0.05, cosine schedule). ``train="all"`` (SN-Net's default, Sec. 4.2)
updates the anchors too; ``train="adapter"`` only the stitching layers, and then anchors are
not drawn, having nothing to train. Anchors are private copies shared by every stitch that
uses them, so the zoo never changes; they stay in eval mode (BatchNorm statistics as trained).

Stitches share a layer when SN-Net's plan gives them the same one (a sliding window, or a
front cut of an unpaired pair) *and* their cut points have equal shapes: one 1x1 convolution
cannot map two widths, so a window across a CNN stage boundary gives such stitches their own.
A shared layer is initialised by least squares over all its stitches' probe activations.

In a search, a stitch of a jointly trained SN-Net is a StitchConfig whose one adapter is
``AdapterSpec("snnet", options)``; the options name the SN-Net (anchors, windows, layer and
training options). :func:`joint_network` trains it once per context and returns the stitch's
network. Training is seeded, so another process (a Ray worker, ``stitch-nas export``) trains
the same weights; the export re-measures each network, which would catch any difference.

Not built: SN-Net's per-family learning rates beyond ``anchor_lr_scale`` (SN-Net: 0.1 for
hierarchical models, 1.0 for DeiT).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from stitch_nas import adapters
from stitch_nas.activations import ActivationRows, InputRows, Memo, Rows, StitchContext, take
from stitch_nas.adapters import cosine_schedule, resolve_teacher, take_step, training_loss
from stitch_nas.config import AdapterSpec, StitchConfig
from stitch_nas.errors import ConfigError
from stitch_nas.fragments import CutPoint, PieceChain, count_params_of
from stitch_nas.stitching import (
    Preprocess,
    StitchedNet,
    head_accuracy,
    net_outputs,
    network_macs,
)

from ._plan import SNStitch, snnet_stitches
from ._spec import JOINT_KIND, LAYER_OPTIONS, joint_layer, joint_spec, resolve_joint_options

__all__ = ["SNNETS", "JointReport", "JointSNNet", "joint_network", "joint_stitches", "train_snnet"]

logger = logging.getLogger(__name__)


def _shape_key(cut: CutPoint) -> tuple[Any, ...]:
    return (cut.layout, cut.shape, cut.prefix_tokens)


@dataclass
class JointReport:
    """What one joint training run did, each figure measured during the run."""

    steps: int
    seconds: float
    members: int  #: size of the configuration set E that was drawn from
    layers: int  #: stitching layers (shared ones counted once)
    first_loss: float  #: mean training loss over the first tenth of the steps
    last_loss: float  #: mean training loss over the last tenth
    draws_min: int  #: fewest steps any member of E got
    draws_max: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class JointSNNet:
    """A trained SN-Net: anchors, stitching layers and one network per member (shared modules).

    Build it with :func:`train_snnet`; ``configs()`` lists its stitches as StitchConfigs,
    ``network(config)`` and ``anchor(name)`` give runnable networks, ``evaluate()`` measures all.
    """

    def __init__(self, ctx: StitchContext, spec: AdapterSpec, stitches: Sequence[SNStitch]):
        opts = resolve_joint_options(dict(spec.options))
        if not stitches:
            raise ConfigError(f"the SN-Net {spec.option('anchors') or 'zoo'} has no stitch")
        self.ctx, self.spec, self.stitches = ctx, spec, list(stitches)
        self.fine_tuned = opts["train"] == "all"
        self.anchors = list(dict.fromkeys(m for s in stitches for m in (s.front, s.back)))
        for name in self.anchors:
            labels = tuple(ctx.entry(name).label_names)
            if labels != tuple(ctx.data.label_names):
                raise ConfigError(
                    f"SN-Net trains with the anchors' own classifiers, but {name!r} predicts "
                    f"{labels[:3]}... not the data's labels; pick anchors trained on this task"
                )
        self.chains = {m: self._chain(m) for m in self.anchors}
        self.layers: dict[tuple[Any, ...], nn.Module] = {}
        self._layer_of = [self._layer_key(s) for s in self.stitches]
        self._index = {s.config.fragments: i for i, s in enumerate(self.stitches)}
        with torch.random.fork_rng(devices=[]):  # layers start from the same weights each time
            torch.manual_seed(int(opts["seed"]))
            self._init_layers()
        self.report: JointReport | None = None

    def _chain(self, model: str) -> PieceChain:
        if not self.fine_tuned:
            return self.ctx.chain(model)
        private = copy.deepcopy(self.ctx.entry(model).model).eval()
        return PieceChain(private, self.ctx.input_shape(model))

    def _cuts(self, stitch: SNStitch) -> tuple[CutPoint, CutPoint]:
        front, back = stitch.config.fragments
        return self.ctx.cut(front.model, str(front.end)), self.ctx.cut(back.model, str(back.start))

    def _layer_key(self, stitch: SNStitch) -> tuple[Any, ...]:
        src, dst = self._cuts(stitch)
        return (stitch.front, stitch.back, stitch.layer, _shape_key(src), _shape_key(dst))

    def _init_layers(self) -> None:
        """Least squares per layer, over the probe activations of every stitch sharing it."""
        ctx = self.ctx
        for key in dict.fromkeys(self._layer_of):
            members = [s for s, k in zip(self.stitches, self._layer_of, strict=True) if k == key]
            src, dst = self._cuts(members[0])

            def pairs(
                members: list[SNStitch] = members,
            ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
                """Each member's probe activations on both sides, a batch at a time."""
                for s in members:
                    front, back = s.config.fragments
                    yield from zip(
                        ctx.activation_batches(front.model, front.end, "probe"),
                        ctx.activation_batches(back.model, back.start, "probe"),
                        strict=True,
                    )

            layer = joint_layer(self.spec, src, dst).to(ctx.device)
            adapters.initialise_batches(layer, pairs, src=src, dst=dst, ridge=ctx.ridge)
            self.layers[key] = layer.eval()

    # -- networks ----------------------------------------------------------------------------
    def configs(self) -> list[StitchConfig]:
        """Every stitch of this SN-Net as a StitchConfig (anchors excluded)."""
        return [self.config_of(s) for s in self.stitches]

    def config_of(self, stitch: SNStitch) -> StitchConfig:
        return StitchConfig(stitch.config.fragments, (self.spec,))

    def _preprocess(self, model: str) -> Preprocess:
        spec = self.ctx.entry(model).input_spec
        return Preprocess(spec.size, spec.mean, spec.std).to(self.ctx.device)

    def _fragment(self, model: str, start: str | None, end: str | None) -> nn.Module:
        if self.fine_tuned:
            return self.chains[model].fragment(start, end)
        return self.ctx.segment(model, start, end)  # the zoo's own, as a search builds it

    def network(self, config: StitchConfig) -> StitchedNet:
        """The network of the stitch ``config`` names (its head is kept)."""
        index = self._index.get(config.fragments)
        named = [joint_spec(**dict(a.options)) for a in config.adapters if a.kind == JOINT_KIND]
        if index is None or named != [self.spec]:
            raise ConfigError(f"{config.describe()} is not a stitch of this SN-Net")
        front, back = config.fragments
        src, dst = self._cuts(self.stitches[index])
        layer_cost = ("adapter", JOINT_KIND, self.spec.options, _shape_key(src), _shape_key(dst))
        parts = [
            self._fragment(front.model, None, front.end),
            self.layers[self._layer_of[index]],
            self._fragment(back.model, back.start, None),
        ]
        info = [
            (("fragment", front.model, None, front.end), self.ctx.input_shape(front.model)[1:]),
            (layer_cost, src.shape),
            (("fragment", back.model, back.start, None), dst.shape),
        ]
        return StitchedNet(
            config, self._preprocess(front.model), parts, info, cached_prefix=not self.fine_tuned
        )

    def anchor(self, name: str) -> StitchedNet:
        """Anchor ``name`` on its own, as trained (the zoo's model with ``train="adapter"``)."""
        if name not in self.chains:
            raise ConfigError(f"{name!r} is not an anchor of this SN-Net; anchors: {self.anchors}")
        info: list[tuple[tuple[Any, ...], tuple[int, ...]]] = [
            (("fragment", name, None, None), self.ctx.input_shape(name)[1:])
        ]
        parts = [self._fragment(name, None, None)]
        return StitchedNet(
            StitchConfig.single(name),
            self._preprocess(name),
            parts,
            info,
            cached_prefix=not self.fine_tuned,
        )

    def members(self) -> list[StitchedNet]:
        """E: the anchors (when they train), then every stitch."""
        anchors = [self.anchor(m) for m in self.anchors] if self.fine_tuned else []
        return anchors + [self.network(c) for c in self.configs()]

    def num_params(self) -> int:
        """Parameters of the whole SN-Net: every anchor and stitching layer, each counted once."""
        return count_params_of([*(c.model for c in self.chains.values()), *self.layers.values()])

    def evaluate(self, split: str = "val") -> list[dict[str, Any]]:
        """Accuracy (native head), MACs and parameters of every member, on ``split``."""
        rows = []
        nets = [self.anchor(m) for m in self.anchors] + [self.network(c) for c in self.configs()]
        for net in nets:
            outputs = net_outputs(self.ctx, net, split)
            accuracy = head_accuracy(self.ctx, net.config, outputs, self.ctx.labels(split), None)
            rows.append(
                {
                    "describe": net.config.describe(),
                    "anchor": not net.config.is_stitched,
                    "accuracy": accuracy,
                    "macs": network_macs(self.ctx, net),
                    "params": count_params_of([net]),
                }
            )
        return rows


def _train_input(ctx: StitchContext, net: StitchedNet) -> tuple[int, Rows]:
    """Where ``net`` starts on the train split: after the zoo's own first fragment, from its
    cached activation, or else at the top, from the preprocessed images; read a mini-batch at
    a time, never whole (:mod:`stitch_nas.activations._rows`)."""
    first = net.config.fragments[0]
    if net.cached_prefix and net.config.is_stitched:
        return 1, ActivationRows(ctx, first.model, first.end, "train")
    return 0, InputRows(ctx, first.model, "train")


def _targets(
    ctx: StitchContext, members: list[StitchedNet], opts: dict[str, Any]
) -> list[torch.Tensor]:
    """Each member's training targets on the train split: the labels (``loss="task"``) or its
    teacher's logits (``"distill"``: the zoo model ``teacher`` names, ``"best"`` by probe
    accuracy, or ``"destination"``, the member's last model), each teacher run once."""
    if opts["loss"] == "task":
        return [ctx.labels("train")] * len(members)
    teachers = [
        resolve_teacher(ctx, str(opts["teacher"]), net.config.fragments[-1].model)
        for net in members
    ]
    logits = {t: ctx.activation(t, None, "train") for t in dict.fromkeys(teachers)}
    return [logits[t] for t in teachers]


def _optimiser(sn: JointSNNet, opts: dict[str, Any]) -> torch.optim.Optimizer:
    lr = float(opts["lr"])
    groups = [{"params": [p for m in sn.layers.values() for p in m.parameters()], "lr": lr}]
    if sn.fine_tuned:
        anchors = {id(p): p for c in sn.chains.values() for p in c.model.parameters()}
        groups.append({"params": list(anchors.values()), "lr": lr * opts["anchor_lr_scale"]})
    return torch.optim.AdamW(groups, lr=lr, weight_decay=float(opts["weight_decay"]))


def _train(sn: JointSNNet, opts: dict[str, Any], progress: bool) -> JointReport:
    """SN-Net Alg. 1: each step, a random member of E, a mini-batch, one optimiser step."""
    from tqdm.auto import tqdm

    ctx, steps = sn.ctx, int(opts["steps"])
    members = sn.members()
    optimiser = _optimiser(sn, opts)
    schedule = cosine_schedule(optimiser, steps)
    trained = [p for group in optimiser.param_groups for p in group["params"]]
    everything = nn.ModuleList([*(c.model for c in sn.chains.values()), *sn.layers.values()])
    generator = torch.Generator().manual_seed(int(opts["seed"]))
    n = ctx.labels("train").shape[0]
    size = min(int(opts["batch_size"]), n)
    sources = [_train_input(ctx, net) for net in members]  # looked up once, not every step
    targets = _targets(ctx, members, opts)
    draws, losses = [0] * len(members), []
    start = time.perf_counter()
    with adapters.only_training(everything, trained), torch.enable_grad():
        for step in tqdm(range(steps), disable=not progress, desc="SN-Net", unit="step"):
            q = int(torch.randint(len(members), (1,), generator=generator))
            index = torch.randperm(n, generator=generator)[:size]
            part, x = sources[q]
            out = members[q].forward_from(part, x.take(index))
            target = take(targets[q], index).to(out.device)
            loss = training_loss(opts["loss"], out, target, float(opts["temperature"]))
            what = f"SN-Net member {members[q].config.describe()}"
            fix = f"lower lr (now {opts['lr']})"
            losses.append(take_step(loss, optimiser, schedule, what=what, step=step, fix=fix))
            draws[q] += 1
    tenth = max(1, steps // 10)
    return JointReport(
        steps=steps,
        seconds=time.perf_counter() - start,
        members=len(members),
        layers=len(sn.layers),
        first_loss=sum(losses[:tenth]) / tenth,
        last_loss=sum(losses[-tenth:]) / tenth,
        draws_min=min(draws),
        draws_max=max(draws),
    )


def joint_stitches(ctx: StitchContext, spec: AdapterSpec) -> list[SNStitch]:
    """The stitches of the SN-Net ``spec`` names (its plan; nothing is built or trained)."""
    opts = resolve_joint_options(dict(spec.options))
    layer = AdapterSpec("linear", tuple((k, opts[k]) for k in LAYER_OPTIONS))
    return snnet_stitches(
        ctx,
        anchors=[a for a in opts["anchors"].split(",") if a] or None,
        kernel=opts["kernel"],
        stride=opts["stride"],
        nearest=opts["nearest"],
        direction=opts["direction"],
        adapter=layer,
    )


def train_snnet(ctx: StitchContext, *, progress: bool = False, **options: Any) -> JointSNNet:
    """Build and jointly train the SN-Net ``options`` describe (see ``snnet_spec.JOINT_OPTIONS``).

    Trained once per context and options: a second call, or a search over its stitches,
    returns the same object.

    Args:
        options: anchors (list or comma-joined; default the zoo ordered by MACs), kernel,
            stride, nearest, direction (as :func:`stitch_nas.snnet.snnet_stitches`); the
            stitching layer's resize, norm, cls, pos; train ("all" or "adapter"), loss ("task"
            or "distill"), teacher, temperature, steps, lr, anchor_lr_scale, weight_decay,
            batch_size, seed.
    """
    return _trained(ctx, joint_spec(**options), progress)


#: each SN-Net trained (or installed) on a context, by its options with defaults filled in
SNNETS: Memo[tuple[Any, ...], JointSNNet] = Memo("trained SN-Nets")


def memo_key(spec: AdapterSpec) -> tuple[tuple[Any, ...], AdapterSpec]:
    """Where a context memoises the SN-Net ``spec`` names, and the spec with its defaults."""
    spec = joint_spec(**dict(spec.options))  # defaults filled in: one SN-Net, one key
    return spec.options, spec


def _trained(ctx: StitchContext, spec: AdapterSpec, progress: bool) -> JointSNNet:
    key, spec = memo_key(spec)
    sn = SNNETS.get(ctx, key)
    if sn is None:
        opts = resolve_joint_options(dict(spec.options))
        stitches = joint_stitches(ctx, spec)
        if opts["loss"] == "distill" and stitches:  # a bad teacher fails before any fitting
            resolve_teacher(ctx, str(opts["teacher"]), stitches[0].config.fragments[-1].model)
        sn = JointSNNet(ctx, spec, stitches)
        logger.info(
            "training SN-Net: %d stitches, %d stitching layers, %d steps",
            len(sn.stitches),
            len(sn.layers),
            opts["steps"],
        )
        sn.report = _train(sn, opts, progress)
        logger.info("SN-Net trained in %.1f s", sn.report.seconds)
        SNNETS.put(ctx, key, sn)
    return sn


def joint_network(ctx: StitchContext, config: StitchConfig) -> StitchedNet:
    """The network of a stitch of a jointly trained SN-Net (what ``build`` returns for it)."""
    if len(config.fragments) != 2:
        raise ConfigError(
            f"an {JOINT_KIND!r} adapter joins two anchors; {config.describe()} has "
            f"{len(config.fragments)} fragments"
        )
    return _trained(ctx, config.adapters[0], progress=False).network(config)
