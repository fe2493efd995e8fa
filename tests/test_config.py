"""StitchConfig: JSON round trip, stable hash, validation."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

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


# The stable hash keys duplicate detection (``SeenConfigs``) across resumed runs and across
# drivers that share one storage: a config evaluated by one process must be recognised by another,
# on another machine, months later. So the value is pinned here as a literal. What may change it:
# the canonical JSON (``StitchConfig.to_dict`` keys, field names, option freezing, ``json.dumps``
# settings) or the digest (sha256, first 16 hex digits). A change to any of those silently
# re-evaluates every config of a resumed study; if deliberate, update these literals and say so.
_CONFIG_HASH = "e48a1556e041244a"
_SINGLE_RESNET_HASH = "6dc0dc6a210d9ee5"

_HASH_IN_A_CHILD = """
from stitch_nas.config import AdapterSpec, Fragment, HeadSpec, StitchConfig
config = StitchConfig(
    (
        Fragment("resnet", None, "layer2.0"),
        Fragment("vit", "blocks.3", "blocks.5"),
        Fragment("convnext", "stages.2.blocks.0", None),
    ),
    (AdapterSpec("lstsq", {"ridge": 1e-3}), AdapterSpec("lstsq")),
    HeadSpec("native"),
)
print(config.stable_hash(), StitchConfig.single("resnet").stable_hash())
"""


def test_json_round_trip_and_stable_hash():
    config = _config()
    again = StitchConfig.from_json(config.to_json())
    assert again == config
    assert again.stable_hash() == config.stable_hash()
    assert StitchConfig.single("resnet").stable_hash() != StitchConfig.single("vit").stable_hash()


def test_stable_hash_is_a_pinned_literal():
    assert _config().stable_hash() == _CONFIG_HASH
    assert StitchConfig.single("resnet").stable_hash() == _SINGLE_RESNET_HASH
    # what the literal is: sha256 of the canonical JSON, independently of stable_hash's code
    canonical = (
        '{"adapters": [{"kind": "lstsq", "options": {"ridge": 0.001}}, '
        '{"kind": "lstsq", "options": {}}], '
        '"fragments": [{"end": "layer2.0", "model": "resnet", "start": null}, '
        '{"end": "blocks.5", "model": "vit", "start": "blocks.3"}, '
        '{"end": null, "model": "convnext", "start": "stages.2.blocks.0"}], '
        '"head": {"kind": "native", "options": {}}}'
    )
    assert hashlib.sha256(canonical.encode()).hexdigest()[:16] == _CONFIG_HASH


@pytest.mark.parametrize("seed", ["0", "12345"])
def test_stable_hash_is_the_same_in_another_process(seed):
    """Another interpreter and PYTHONHASHSEED (str hashing, set order): the same literal."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONHASHSEED": seed}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-c", _HASH_IN_A_CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.split() == [_CONFIG_HASH, _SINGLE_RESNET_HASH]


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
