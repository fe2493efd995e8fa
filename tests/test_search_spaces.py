"""Search spaces sample valid StitchConfigs; CKA pruning happens before any fitting."""

from __future__ import annotations

import optuna
import pytest

import search_spaces
from stitch_nas import errors
from stitch_nas.config import StitchConfig
from stitch_nas.lstsq import check_pair
from stitch_nas.measure import fragment_macs
from tests._tiny import tiny_context


@pytest.fixture(scope="module")
def ctx():
    return tiny_context()


def _sample(space, ctx, n=30, seed=0, **options):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    configs = []
    for _ in range(n):
        trial = study.ask()
        configs.append(search_spaces.sample(space, trial, ctx, **options))
        study.tell(trial, 0.0)
    return configs


def test_registry_lists_and_refuses_unknown_and_duplicates():
    assert {"pairwise", "chain"} <= set(search_spaces.list_spaces())
    with pytest.raises(errors.UnknownNameError, match="pairwise"):
        search_spaces.get_space("pairwize")
    with pytest.raises(errors.ConfigError, match="already registered"):
        search_spaces.register_space("pairwise")(lambda trial, ctx: None)


def test_pairwise_samples_joinable_two_model_configs(ctx):
    configs = _sample("pairwise", ctx)
    directions = set()
    for config in configs:
        assert isinstance(config, StitchConfig)
        src, dst = config.fragments
        assert src.model != dst.model and src.start is None and dst.end is None
        check_pair(ctx.cut(src.model, src.end), ctx.cut(dst.model, dst.start))  # never raises
        assert StitchConfig.from_json(config.to_json()) == config
        macs = {m: fragment_macs(ctx, m, None, None) for m in config.models}
        directions.add(macs[src.model] <= macs[dst.model])
    assert directions == {True, False}  # both fast-to-slow and slow-to-fast are sampled


def test_chain_samples_ordered_fragments_up_to_the_limit(ctx):
    configs = _sample("chain", ctx, n=40, max_fragments=3)
    lengths = {len(c.fragments) for c in configs}
    assert lengths == {1, 2, 3}
    for config in configs:
        for frag in config.fragments[1:-1]:
            cuts = [c.name for c in ctx.cuts(frag.model)]
            assert cuts.index(frag.end) > cuts.index(frag.start)


def test_unknown_model_in_space_options(ctx):
    study = optuna.create_study()
    with pytest.raises(errors.UnknownModelError, match="resnet"):
        search_spaces.sample("pairwise", study.ask(), ctx, models=["resnet", "nope"])
