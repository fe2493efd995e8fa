"""Heads for a new label space decide as the scikit-learn classifiers they are fitted from."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier

from stitch_nas.config import HeadSpec
from stitch_nas.errors import ConfigError
from stitch_nas.stitching import KNNHead, fit_head, head_from_recipe, head_recipe


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
    theirs = KNeighborsClassifier(n_neighbors=5).fit(x.numpy(), y.numpy()).predict(test.numpy())
    assert np.mean(ours == theirs) >= 0.99  # only exact vote ties may break differently


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
