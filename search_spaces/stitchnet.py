"""``stitchnet``: StitchNet's recursive generation (Teerapittayanon et al., seed 000, Alg. 1).

**Fragment pool** (Sec. II-C, III-A): every zoo model is cut at every one of its cut points into
consecutive pieces ``input->c0, c0->c1, ..., c_last->output`` — the paper cuts each network "at
each convolution and linear layer that has a single input"; here the cut points are the block
boundaries :mod:`stitch_nas.fragments` finds. A model's first piece is a *starting* fragment,
its last a *terminating* one, the others *middle* fragments.

**Recursion** (Alg. 1): from each starting fragment (score 1), the ``K`` middle or terminating
fragments of the pool with the highest ``CKA(X, Y)`` are tried, where ``X = Q(D)`` is the current
chain's output on the probe split and ``Y`` the candidate's model at the candidate's start cut
(:meth:`StitchContext.cka_to`). A candidate whose score ``s x CKA`` exceeds ``T`` is stitched
on by least squares (Sec. II-B) and the recursion continues until a terminating fragment is
added (the chain joins the result set ``R``) or the chain holds ``L`` fragments.

One choice the paper leaves open: a candidate that continues the chain's last model exactly
where it stopped (its next piece) is joined without a stitch and scores 1 — it *is* that
model's next layer, and least squares would fit about the identity there. So a chain is a
sequence of runs of one model, and its :class:`StitchConfig` has one fragment per run.

Defaults are the paper's (Sec. III-C): ``K=2``, ``T=0.5``, ``L=16``; least squares fused into
the next layer (Sec. II-B). The paper stitches on ``M=32`` samples; here ``D`` is the
context's probe split (128 by default). ``head="knn"`` classifies the final outputs with k-NN
fitted on the probe split (the paper's k-NN on final vectors for a new task, Sec. III-F).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import optuna
import torch

from stitch_nas.activations import StitchContext
from stitch_nas.adapters import fit_lstsq
from stitch_nas.config import AdapterSpec, Fragment, HeadSpec, StitchConfig
from stitch_nas.errors import ConfigError

from ._procedure import memoised
from ._registry import register_space
from .pairwise import joinable, zoo_models

__all__ = ["ScoredConfig", "stitchnet_search"]

logger = logging.getLogger(__name__)

#: Paper defaults, StitchNet Sec. III-C ("We set K = 2, T = 0.5 and L = 16").
K_DEFAULT, T_DEFAULT, L_DEFAULT = 2, 0.5, 16
_HEADS = ("native", "knn")


@dataclass(frozen=True)
class ScoredConfig:
    """A generated network and its StitchNet score (product of CKA over its stitches)."""

    config: StitchConfig
    score: float


@dataclass(frozen=True)
class _Run:
    """A run of one model between cut indices; -1 is the input, ``len(cuts)`` the output."""

    model: str
    start: int
    end: int


class _Recursion:
    def __init__(
        self,
        ctx: StitchContext,
        models: list[str],
        k: int,
        threshold: float,
        max_fragments: int,
        max_joints: int | None,
        max_nodes: int,
        same_model_jumps: bool,
    ) -> None:
        self.ctx, self.models, self.k, self.t = ctx, models, k, threshold
        self.same_model_jumps = same_model_jumps
        self.l, self.max_joints, self.max_nodes = max_fragments, max_joints, max_nodes
        self.nodes = 0
        self.results: list[tuple[tuple[_Run, ...], float]] = []

    def _bound(self, model: str, index: int) -> str | None:
        cuts = self.ctx.cuts(model)
        return None if index < 0 or index >= len(cuts) else cuts[index].name

    def run(self, start: str) -> None:
        if not self.ctx.cuts(start):
            return
        x = self.ctx.activation(start, self._bound(start, 0), "probe")
        self._grow((_Run(start, -1, 0),), 1, 1.0, x)

    def _grow(self, runs: tuple[_Run, ...], pieces: int, score: float, x: torch.Tensor) -> None:
        self.nodes += 1
        if self.nodes > self.max_nodes:
            raise ConfigError(
                f"the StitchNet recursion visited more than max_nodes={self.max_nodes} chains; "
                "raise T, lower K or L, or pass a larger max_nodes"
            )
        if pieces >= self.l:  # Alg. 1 line 7
            return
        last = runs[-1]
        x_cut = self.ctx.cut(last.model, self._bound(last.model, last.end) or "")
        may_stitch = self.max_joints is None or len(runs) - 1 < self.max_joints
        grams: dict[tuple, torch.Tensor] = {}  # X's Gram matrix per row rule, for this node
        candidates: list[tuple[float, str, int]] = []
        for model in self.models:
            for j, cut in enumerate(self.ctx.cuts(model)):
                if model == last.model and j == last.end:  # the chain's own next piece
                    candidates.append((1.0, model, j))
                elif (
                    may_stitch
                    and (self.same_model_jumps or model != last.model)
                    and joinable(x_cut, cut)
                ):
                    cka = self.ctx.cka_to(x, x_cut, model, cut, x_grams=grams)
                    candidates.append((cka, model, j))
        # Alg. 1 line 9: the K candidates of highest CKA (ties: model, cut order)
        candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
        for cka, model, j in candidates[: self.k]:
            s_n = score * cka
            if not s_n > self.t:  # Alg. 1 line 13
                continue
            n_cuts = len(self.ctx.cuts(model))
            if model == last.model and j == last.end:
                new_runs = (*runs[:-1], _Run(model, last.start, j + 1))
                y = x
            else:
                dst = self.ctx.cut(model, self.ctx.cuts(model)[j].name)
                target = self.ctx.activation(model, dst.name, "probe")
                stitch = fit_lstsq(x, target, x_cut, dst, ridge=self.ctx.ridge)
                new_runs = (*runs, _Run(model, j, j + 1))
                y = self.ctx.run(stitch, x)
            if j + 1 == n_cuts:  # a terminating fragment (Alg. 1 line 15)
                if len(new_runs) > 1:  # a zoo model on its own is a reference, not a result
                    self.results.append((new_runs, s_n))
                continue
            piece = self.ctx.segment(model, self.ctx.cuts(model)[j].name, self._bound(model, j + 1))
            # a piece may start with an in-place op (ReLU): never hand it x or a cached tensor
            self._grow(new_runs, pieces + 1, s_n, self.ctx.run(piece, y.clone()))

    def config(self, runs: tuple[_Run, ...], head: HeadSpec, fuse: bool) -> StitchConfig:
        fragments = tuple(
            Fragment(r.model, self._bound(r.model, r.start), self._bound(r.model, r.end))
            for r in runs
        )
        spec = AdapterSpec("lstsq", (("fuse", True),) if fuse else ())
        return StitchConfig(fragments, tuple(spec for _ in fragments[1:]), head)


def stitchnet_search(
    ctx: StitchContext,
    *,
    models: Sequence[str] | None = None,
    starts: Sequence[str] | None = None,
    K: int = K_DEFAULT,  # noqa: N803 - the paper's names
    T: float = T_DEFAULT,  # noqa: N803
    L: int = L_DEFAULT,  # noqa: N803
    max_joints: int | None = None,
    same_model_jumps: bool = False,
    fuse: bool = True,
    head: str = "native",
    k_neighbours: int = 5,
    max_nodes: int = 1000,
) -> list[ScoredConfig]:
    """Run StitchNet's Algorithm 1 on the context's zoo; the result set ``R``, best score first.

    Args:
        models: zoo models whose pieces form the pool ``P`` (default: all).
        starts: models whose starting fragment seeds a chain (default: all of ``models``; the
            paper allows all starting fragments or a subset).
        K: span, candidates tried per step (paper: 2).
        T: threshold on the running CKA product (paper: 0.5).
        L: maximum number of pool fragments (pieces) in a chain (paper: 16).
        max_joints: at most this many stitches per chain (None: no limit; 1 keeps the result
            inside the ``pairwise`` space). Not in the paper.
        same_model_jumps: also offer the chain's last model at cuts other than its next piece
            (skipping or repeating its own layers). Off by default, a choice the paper leaves
            open: neighbouring cuts of one model have CKA near 1 (e.g. before and after a
            ReLU), so with ``K=2`` such near-identity stitches crowd out every other model.
        fuse: fold each least-squares stitch into the next conv/linear layer (Sec. II-B).
        head: "native" (the last model's classifier) or "knn" (k-NN on the final outputs).
        k_neighbours: k of the k-NN head.
        max_nodes: stop with an error after this many chains (the search is O(K^L)).

    Returns:
        Every generated network with its score, highest score first.
    """
    if K < 1 or L < 2 or not 0.0 <= T < 1.0:
        raise ConfigError(f"need K >= 1, L >= 2 and 0 <= T < 1; got K={K}, L={L}, T={T}")
    if head not in _HEADS:
        raise ConfigError(f"unknown StitchNet head {head!r}; use one of {_HEADS}")
    if max_joints is not None and max_joints < 1:
        raise ConfigError(f"max_joints must be >= 1 or None, got {max_joints}")
    names = zoo_models(ctx, models, 1)
    seeds = zoo_models(ctx, starts, 1) if starts else names
    head_spec = HeadSpec("knn", (("k", k_neighbours),)) if head == "knn" else HeadSpec()
    recursion = _Recursion(ctx, names, K, T, L, max_joints, max_nodes, same_model_jumps)
    for start in seeds:  # Alg. 1 lines 3-6
        recursion.run(start)
    found: dict[str, ScoredConfig] = {}
    for runs, score in recursion.results:
        config = recursion.config(runs, head_spec, fuse)
        key = config.stable_hash()
        if key not in found or found[key].score < score:
            found[key] = ScoredConfig(config, score)
    logger.info("StitchNet: %d chains visited, %d networks", recursion.nodes, len(found))
    return sorted(found.values(), key=lambda r: (-r.score, r.config.describe()))


@register_space("stitchnet")
def stitchnet(
    trial: optuna.Trial,
    ctx: StitchContext,
    *,
    models: Sequence[str] | None = None,
    starts: Sequence[str] | None = None,
    K: int = K_DEFAULT,  # noqa: N803 - the paper's names
    T: float = T_DEFAULT,  # noqa: N803
    L: int = L_DEFAULT,  # noqa: N803
    max_joints: int | None = None,
    same_model_jumps: bool = False,
    fuse: bool = True,
    head: str = "native",
    k_neighbours: int = 5,
) -> StitchConfig:
    """One network of StitchNet's result set ``R``, chosen by its score rank.

    The recursion (see :func:`stitchnet_search`) runs once per context and options; the trial
    samples ``stitchnet_rank`` (0 = highest CKA score) and records ``stitchnet_score``.
    """
    results: list[ScoredConfig] = memoised(
        ctx,
        stitchnet_search,
        models=models,
        starts=starts,
        K=K,
        T=T,
        L=L,
        max_joints=max_joints,
        same_model_jumps=same_model_jumps,
        fuse=fuse,
        head=head,
        k_neighbours=k_neighbours,
    )
    if not results:
        raise ConfigError(
            f"StitchNet found no network with CKA score above T={T}; lower T or raise K or L"
        )
    rank = trial.suggest_int("stitchnet_rank", 0, len(results) - 1)
    trial.set_user_attr("stitchnet_score", results[rank].score)
    return results[rank].config
