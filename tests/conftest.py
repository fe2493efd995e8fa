"""Shared session fixtures: the digits splits and the embedded mini zoo, built once per session.

The mini zoo is trained into a temporary folder so the suite never touches the user's cache.
Set ``STITCH_NAS_TEST_CACHE`` to a folder to reuse a build across sessions while iterating.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stitch_nas.data import DataSplits, load_digits_splits
from stitch_nas.zoo import Zoo, load_mini_zoo

# Ray's local clusters here run without token authentication, as .ci/run says: set once for
# the session, since a Ray process caches the mode it started with (a test that set it and
# undid it left the next test's Ray head expecting a token the client never sends)
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="session")
def digits() -> DataSplits:
    """The default digits splits (32x32, probe 128, seed 0)."""
    return load_digits_splits()


@pytest.fixture(scope="session")
def mini_zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cache root of the session's mini zoo."""
    reuse = os.environ.get("STITCH_NAS_TEST_CACHE")
    return Path(reuse) if reuse else tmp_path_factory.mktemp("stitch_nas_cache")


@pytest.fixture(scope="session")
def mini_zoo(digits: DataSplits, mini_zoo_dir: Path) -> Zoo:
    """The trained mini zoo; treat it as read-only, other tests share it."""
    return load_mini_zoo(digits, cache_dir=mini_zoo_dir)


@pytest.fixture(autouse=True)
def no_default_probe_pruning(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most tests search the untrained tiny zoo (``tests._tiny``), where every stitch predicts
    at chance and the default probe pruning would prune them all. Objectives made without an
    explicit ``probe_threshold`` skip probe pruning here; tests of it pass the threshold, and
    the CLI's settings always pass theirs (``tests/test_proxy.py``). A test marked
    ``real_probe_default`` keeps the documented default (on the trained mini zoo)."""
    if request.node.get_closest_marker("real_probe_default") is not None:
        return
    monkeypatch.setattr("stitch_nas.search._runner.DEFAULT_PROBE_THRESHOLD", 0.0)
