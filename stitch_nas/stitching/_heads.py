"""Heads for a new label space: k-NN and a linear probe on a network's final features.

StitchNet classifies new tasks with a k-NN on the stitched network's features; a linear probe
(logistic regression) is the other usual choice. Both are fitted on the probe split and turned
into plain modules, so the accuracy a trial reports and the network an export stores come from
the same code: ``head(features).argmax(1)`` is the prediction in both places.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from stitch_nas.config import HeadSpec
from stitch_nas.errors import ConfigError
from stitch_nas.plugins import HEADS
from stitch_nas.registry import Option, check_options

from ._head_options import BUILTIN_HEADS

__all__ = [
    "HeadKind",
    "KNNHead",
    "LinearProbeHead",
    "fit_head",
    "head_from_recipe",
    "held_out_correct",
    "head_recipe",
    "register_head",
]


@dataclass(frozen=True)
class HeadKind:
    """A registered head: how to fit it, describe its structure, and rebuild it empty.

    Attributes:
        fit: ``(features, labels, num_classes, **options) -> module`` on the probe split.
        recipe: ``module -> dict`` of what ``rebuild`` needs (weights aside), stored in exports.
        rebuild: ``dict -> module`` of that structure, to load saved weights into.
        module: the module type ``fit`` returns (how an export recognises the head).
        options: the declared options of ``HeadSpec(kind, options)``.
    """

    fit: Callable[..., nn.Module]
    recipe: Callable[[Any], dict[str, Any]]
    rebuild: Callable[[dict[str, Any]], nn.Module]
    module: type[nn.Module]
    options: dict[str, Option] = field(default_factory=dict)


def register_head(name: str, kind: HeadKind) -> HeadKind:
    """Add a head kind under ``name`` (a duplicate name is an error)."""
    return HEADS.register(name, kind)


class KNNHead(nn.Module):
    """Votes of the ``k`` nearest probe samples (Euclidean), one score per class.

    A tie of votes goes to the class of the nearest sample among the tied: each vote weighs
    ``1 + 2**-(rank + 2)`` (rank 0: the nearest), which orders equal counts and never outweighs
    one more vote. With few probe images per class ties are the rule (k=5 at 2 images a class:
    five classes with one vote each), and the smallest class index winning them would throw
    the nearest neighbour away.
    """

    features: torch.Tensor  # buffers, registered in __init__
    labels: torch.Tensor

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, num_classes: int, k: int):
        super().__init__()
        if not 1 <= k <= features.shape[0]:
            raise ConfigError(f"k-NN head k={k} must be between 1 and {features.shape[0]}")
        self.k, self.num_classes = int(k), int(num_classes)
        self.register_buffer("features", features.flatten(1).float().contiguous())
        self.register_buffer("labels", labels.long().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        # squared distances without cdist, which ONNX export does not take
        dist = (
            (x * x).sum(1, keepdim=True)
            - 2 * x @ self.features.T
            + (self.features * self.features).sum(1)
        )
        nearest = dist.topk(self.k, dim=1, largest=False).indices  # nearest first
        classes = torch.arange(self.num_classes, device=x.device)
        weight = 1 + 2.0 ** -(torch.arange(self.k, device=x.device, dtype=x.dtype) + 2)
        votes = (self.labels[nearest].unsqueeze(-1) == classes).to(x.dtype)
        return (votes * weight[:, None]).sum(1)


class LinearProbeHead(nn.Module):
    """A linear classifier on flattened features (a fitted logistic regression)."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


def _linear_probe(features: np.ndarray, labels: np.ndarray, num_classes: int, max_iter: int):
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(max_iter=max_iter).fit(features, labels)
    head = LinearProbeHead(features.shape[1], num_classes)
    weight = np.zeros((num_classes, features.shape[1]))
    bias = np.full(num_classes, -1e9)  # classes absent from the probe set are never predicted
    coef, intercept = clf.coef_, clf.intercept_
    if len(clf.classes_) == 2:  # sklearn keeps one row for binary problems: class 1 vs 0
        coef = np.concatenate([np.zeros_like(coef), coef])
        intercept = np.concatenate([np.zeros_like(intercept), intercept])
    weight[clf.classes_], bias[clf.classes_] = coef, intercept
    with torch.no_grad():
        head.linear.weight.copy_(torch.from_numpy(weight))
        head.linear.bias.copy_(torch.from_numpy(bias))
    return head


def _fit_knn(features: torch.Tensor, labels: torch.Tensor, num_classes: int, *, k: int):
    return KNNHead(features.cpu(), labels.cpu(), num_classes, k)


def _fit_linear_probe(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int, *, max_iter: int
) -> nn.Module:
    x = features.flatten(1).cpu().double().numpy()
    return _linear_probe(x, labels.cpu().numpy(), num_classes, max_iter).to(features.device)


def _knn_recipe(head: KNNHead) -> dict[str, Any]:
    n, dim = head.features.shape
    return {"k": head.k, "num_classes": head.num_classes, "n": n, "dim": dim}


def _knn_rebuild(recipe: dict[str, Any]) -> nn.Module:
    n, dim = int(recipe["n"]), int(recipe["dim"])
    empty = torch.zeros(n, dim), torch.zeros(n, dtype=torch.long)
    return KNNHead(*empty, int(recipe["num_classes"]), int(recipe["k"]))


def _probe_recipe(head: LinearProbeHead) -> dict[str, Any]:
    out, dim = head.linear.weight.shape
    return {"num_classes": out, "dim": dim}


register_head(
    "knn",
    HeadKind(_fit_knn, _knn_recipe, _knn_rebuild, KNNHead, dict(BUILTIN_HEADS["knn"])),
)
register_head(
    "linear_probe",
    HeadKind(
        _fit_linear_probe,
        _probe_recipe,
        lambda r: LinearProbeHead(int(r["dim"]), int(r["num_classes"])),
        LinearProbeHead,
        dict(BUILTIN_HEADS["linear_probe"]),
    ),
)


def fit_head(
    spec: HeadSpec, features: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> nn.Module | None:
    """Fit the head ``spec`` on probe ``features``/``labels``; None for the native head."""
    if spec.kind == "native":
        return None
    kind = HEADS.get(spec.kind)
    options = check_options(kind.options, dict(spec.options), f"head {spec.kind!r}")
    return kind.fit(features, labels, num_classes, **options)


def held_out_correct(
    spec: HeadSpec, features: torch.Tensor, labels: torch.Tensor, num_classes: int, batch: int = 256
) -> int:
    """Probe images the head ``spec`` gets right when it never saw them: each class's images
    alternate between two folds, and each fold is scored by the head fitted on the other.

    Scored on the images it was fitted to, a head says little with few images per class (at
    1,000 classes, 2 each): a k-NN head finds each image itself, and a linear probe separates
    even random features; so a broken stitch would look fine. Held out, random features score
    chance. A class with one image is scored by a head that never saw that class: wrong.
    """
    fold = torch.zeros(len(labels), dtype=torch.bool)
    for label in labels.unique():
        members = (labels == label).nonzero().squeeze(1)
        fold[members[1::2]] = True
    correct = 0
    for held in (fold, ~fold):
        if held.all() or not held.any():  # nothing to fit on, or nothing to score
            continue
        head = fit_head(spec, features[~held], labels[~held], num_classes)
        if head is None:
            raise ConfigError("the native head is not fitted; score it on the probe as it is")
        for x, y in zip(features[held].split(batch), labels[held].split(batch), strict=True):
            with torch.no_grad():
                correct += int((head(x).argmax(1).cpu() == y.cpu()).sum())
    return correct


def head_recipe(head: nn.Module | None) -> dict[str, Any] | None:
    """What :func:`head_from_recipe` needs to rebuild ``head``'s structure (weights aside)."""
    if head is None:
        return None
    for name in HEADS.list():
        kind = HEADS.get(name)
        if type(head) is kind.module:
            return {"kind": name, **kind.recipe(head)}
    raise ConfigError(f"cannot describe a head of type {type(head).__name__}")


def head_from_recipe(recipe: dict[str, Any] | None) -> nn.Module | None:
    """An empty head of the recorded structure, to load saved weights into."""
    if recipe is None:
        return None
    if recipe["kind"] not in HEADS:
        raise ConfigError(
            f"unknown head kind {recipe['kind']!r} in an export; install the plug-in that "
            "defines it or use a newer stitch_nas"
        )
    return HEADS.get(recipe["kind"]).rebuild(recipe)
