"""Heads for a new label space decide as the scikit-learn classifiers they are fitted from."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier

from stitch_nas.config import HeadSpec
from stitch_nas.errors import ConfigError
from stitch_nas.stitching import (
    KNNHead,
    fit_head,
    head_from_recipe,
    head_recipe,
    held_out_correct,
)


def _blobs(n: int, dim: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    centres = torch.randn(classes, dim, generator=gen) * 2
    return centres[labels] + torch.randn(n, dim, generator=gen), labels


def test_knn_head_predicts_like_sklearn():
    x, y = _blobs(120, 16, 5, seed=0)
    test, _ = _blobs(200, 16, 5, seed=1)
    head = fit_head(HeadSpec("knn", {"k": 5}), x, y, num_classes=5)
    ours = head(test).argmax(1).numpy()
    knn = KNeighborsClassifier(n_neighbors=5).fit(x.numpy(), y.numpy())
    votes = knn.predict_proba(test.numpy())
    tied = (votes == votes.max(1, keepdims=True)).sum(1) > 1
    assert 0 < tied.sum() < len(tied) // 10
    assert np.array_equal(ours[~tied], knn.predict(test.numpy())[~tied])
    # a tie goes to the class of the nearest neighbour among the tied, not the smallest index
    nearest = knn.kneighbors(test.numpy(), return_distance=False)
    for row in np.flatnonzero(tied):
        best = np.flatnonzero(votes[row] == votes[row].max())
        first = next(label for label in y.numpy()[nearest[row]] if label in best)
        assert ours[row] == first


@pytest.mark.parametrize("classes", [2, 4])
def test_linear_probe_head_predicts_like_logistic_regression(classes):
    x, y = _blobs(100, 8, classes, seed=2)
    test, _ = _blobs(300, 8, classes, seed=3)
    head = fit_head(HeadSpec("linear_probe"), x, y, num_classes=classes + 1)
    ours = head(test).argmax(1).numpy()
    clf = LogisticRegression(max_iter=500).fit(x.double().numpy(), y.numpy())
    assert np.array_equal(ours, clf.predict(test.double().numpy()))
    assert (ours < classes).all()  # a class absent from the probe set is never predicted


@pytest.mark.parametrize("kind", ["knn", "linear_probe"])
def test_recipe_rebuilds_the_same_structure(kind):
    x, y = _blobs(40, 6, 3, seed=4)
    head = fit_head(HeadSpec(kind), x, y, num_classes=3)
    empty = head_from_recipe(head_recipe(head))
    empty.load_state_dict(head.state_dict())
    assert torch.equal(empty(x), head(x))


def test_native_head_is_none_and_bad_k_is_refused():
    x, y = _blobs(10, 4, 2, seed=5)
    assert fit_head(HeadSpec("native"), x, y, 2) is None
    with pytest.raises(ConfigError, match="k=11"):
        KNNHead(x, y, 2, k=11)


@pytest.mark.parametrize("kind", ["knn", "linear_probe"])
def test_held_out_scores_tell_signal_from_noise_at_two_images_a_class(kind):
    """At 1,000 classes and 2 probe images each, a head scored on its own images passes
    random features; held out, random features score about chance (0.1 %) and class-separated
    ones far above it."""
    classes, spec = 1000, HeadSpec(kind, {"max_iter": 50} if kind == "linear_probe" else {})
    noise, labels = torch.randn(2000, 32, generator=torch.Generator().manual_seed(6)), None
    signal, labels = _blobs(2000, 32, classes, seed=7)
    if kind == "knn":  # the linear probe's fit on all 2,000 images is the slow half
        own = fit_head(spec, noise, labels, classes)(noise).argmax(1)
        assert float((own == labels).float().mean()) > 0.1  # scored on its own images
    chance = 2000 / classes  # images right by chance: 2 (binomial, so 5 is rare)
    assert held_out_correct(spec, noise, labels, classes) <= 2.5 * chance
    assert held_out_correct(spec, signal, labels, classes) / 2000 > 0.5
