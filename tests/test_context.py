"""The shared context: CKA between cut points, the ReStNet matrix, and the examples using it."""

from __future__ import annotations

import dataclasses
import math
import runpy

import pytest
import torch

from stitch_nas import similarity
from stitch_nas.activations import ActivationCache
from stitch_nas.errors import ConfigError
from tests._tiny import SPEC, tiny_context, tiny_zoo


@pytest.fixture(scope="module")
def ctx():
    return tiny_context()


def test_cka_matrix_matches_pairwise_scores(ctx):
    matrix = ctx.cka_matrix("resnet", "efficientnet")
    cuts_a, cuts_b = ctx.cuts("resnet"), ctx.cuts("efficientnet")
    assert matrix.shape == (len(cuts_a), len(cuts_b))
    assert ((matrix >= 0) & (matrix <= 1)).all()
    i = [c.name for c in cuts_a].index("layer1.0")  # by name: the deep stem adds cuts before it
    a, b = cuts_a[i], cuts_b[3]
    rows_a = similarity.to_rows(
        ctx.activation("resnet", a.name, "probe"), a.layout, spatial=(8, 8), mode="flatten"
    )
    rows_b = similarity.to_rows(
        ctx.activation("efficientnet", b.name, "probe"), b.layout, spatial=(8, 8), mode="flatten"
    )
    assert a.spatial == (8, 8) and b.spatial == (8, 8)
    # the matrix reads the cache's float16 probe activations, whose Grams are products in float32
    # (about 1e-6 of a Gram entry, gram_of_blocks); the rows here are float32, multiplied in
    # float64. The two differed by 1.5e-9 on one CPU and by less on another: their BLAS kernels
    assert matrix[i, 3].item() == pytest.approx(similarity.linear_cka(rows_a, rows_b), abs=1e-6)


def test_a_cut_against_itself_scores_one(ctx):
    for cut in ctx.cuts("vit"):
        assert ctx.joint_cka("vit", cut.name, "vit", cut.name) == pytest.approx(1.0, abs=1e-6)


def test_own_study_example_runs(monkeypatch, mini_zoo, mini_zoo_dir, capsys):
    monkeypatch.setenv("STITCH_NAS_CACHE", str(mini_zoo_dir))
    module = runpy.run_path("examples/optuna_own_study.py")
    study = module["main"](n_trials=6)
    assert len(study.trials) == 6
    assert study.best_trials and "accuracy" in capsys.readouterr().out


def test_cached_activations_survive_in_place_ops_after_the_cut():
    """test_resnet's ReLU after bn1 is in place: the cached bn1 output must stay pre-ReLU."""
    from stitch_nas.fragments import segment

    ctx = tiny_context(cache=ActivationCache(dtype="float32"))  # compared to 1e-6 below
    model = ctx.entry("resnet").model
    inputs = ctx.inputs("resnet", "probe")
    with torch.no_grad():
        direct = segment(model, None, "bn1", input_shape=(1, 3, 32, 32))(inputs.clone())
    cached = ctx.activation("resnet", "bn1", "probe")
    assert (cached < 0).any()  # not clipped by the ReLU that follows
    assert torch.allclose(cached, direct, atol=1e-6)


def test_the_context_keeps_no_copy_of_the_probes_images():
    """Preprocessed inputs are not held outside the cache's budget (1.2 GB a model at 224 px
    for a 2,000-image probe): each call preprocesses anew, equal and independent."""
    ctx = tiny_context()
    first = ctx.inputs("resnet", "probe")
    kept = first.clone()
    first.zero_()  # a memoised tensor would hand this one back on the next call
    again = ctx.inputs("resnet", "probe")
    assert kept.abs().sum() > 0 and torch.equal(again, kept)
    assert torch.equal(torch.cat(list(ctx.input_batches("resnet", "probe"))), kept)


def test_train_activations_do_not_depend_on_what_else_is_cached():
    """Adapter training amplifies rounding: a train-split activation computed from a stored
    (float16) earlier cut is the one computed from the input, so a network rebuilt later
    trains on the same numbers as the one the search measured."""
    names = [c.name for c in tiny_context().cuts("resnet")]
    early, late = names[1], names[-2]
    alone = tiny_context().activation("resnet", late, "train")
    after_early = tiny_context()
    after_early.activation("resnet", early, "train")  # now cached: a nearer start than input
    assert torch.equal(after_early.activation("resnet", late, "train"), alone)


def test_the_default_batch_bounds_one_batch_of_the_largest_activation():
    from stitch_nas.activations import MAX_BATCH, WORK_BATCH_BYTES, StitchContext

    small = tiny_context()
    assert small.batch_size == MAX_BATCH  # 32x32 images: the cap
    zoo = tiny_zoo(("resnet",))
    zoo["resnet"].input_spec = dataclasses.replace(SPEC, size=(224, 224))
    big = StitchContext(zoo, small.data)
    largest = max(3 * 224 * 224, *(math.prod(c.shape) for c in big.cuts("resnet")))
    assert big.batch_size < MAX_BATCH  # 49x the pixels: fewer images a batch
    assert 4 * largest * big.batch_size <= WORK_BATCH_BYTES < 4 * largest * (big.batch_size + 1)
    assert StitchContext(zoo, small.data, batch_size=7).batch_size == 7
    with pytest.raises(ConfigError, match="batch_size must be an integer >= 1"):
        StitchContext(zoo, small.data, batch_size=0)
