"""Tests of stitch_nas.registry: one Registry class for every extension point."""

from __future__ import annotations

import sys
import types
from importlib.metadata import EntryPoint

import pytest

from stitch_nas import errors, registry
from stitch_nas.registry import Registry, check_options, choice, integer, keyword_options


def test_register_get_and_list_with_a_wildcard():
    reg: Registry[int] = Registry("widget")
    reg.register("alpha", 1)

    @reg.register("beta")
    def beta():  # the decorator form returns the object unchanged
        return 2

    assert reg.get("alpha") == 1 and reg.get("beta") is beta
    assert reg.list() == ["alpha", "beta"] and reg.list("b*") == ["beta"]
    assert "alpha" in reg and "gamma" not in reg


def test_a_duplicate_name_is_an_error_and_nothing_is_replaced():
    reg: Registry[int] = Registry("widget")
    reg.register("alpha", 1)
    with pytest.raises(errors.ConfigError, match="widget 'alpha' is already registered"):
        reg.register("alpha", 2)
    assert reg.get("alpha") == 1


def test_an_unknown_name_lists_the_available_ones():
    reg: Registry[int] = Registry("widget")
    reg.register("alpha", 1)
    with pytest.raises(errors.UnknownNameError, match="unknown widget 'alhpa'; available: alpha"):
        reg.get("alhpa")
    with pytest.raises(KeyError):  # UnknownNameError is a KeyError too
        reg.get("alhpa")


def test_plug_ins_register_through_their_entry_point_group(monkeypatch):
    module = types.ModuleType("fake_plugin")

    def load_module():  # importing a plug-in module runs its decorators
        reg.register("from_module", 10)
        return module

    points = [
        EntryPoint("by_object", "fake_plugin:THING", "stitch_nas.widgets"),
        EntryPoint("whole_module", "fake_plugin", "stitch_nas.widgets"),
        EntryPoint("broken", "missing_plugin_module", "stitch_nas.widgets"),
    ]
    module.THING = 42  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_plugin", module)
    monkeypatch.setattr(
        registry, "entry_points", lambda group: points if group == "stitch_nas.widgets" else []
    )
    monkeypatch.setattr(EntryPoint, "load", lambda self: _load(self, load_module))
    reg: Registry[int] = Registry("widget", group="stitch_nas.widgets")
    assert reg.get("by_object") == 42
    assert reg.get("from_module") == 10
    assert reg.list() == ["by_object", "from_module"]  # the broken plug-in is skipped, logged


def _load(point: EntryPoint, load_module):
    if point.value == "fake_plugin":
        return load_module()
    if point.value == "fake_plugin:THING":
        return 42
    raise ModuleNotFoundError(point.value)


def test_the_builtin_plug_ins_are_found_through_entry_points():
    from stitch_nas.plugins import HEADS, OBJECTIVES, SPACES

    assert {"pairwise", "chain", "gap", "snnet"} <= set(SPACES.list())
    assert {"accuracy", "macs", "params"} <= set(OBJECTIVES.list())
    assert {"knn", "linear_probe"} <= set(HEADS.list())


def test_declared_options_are_checked():
    table = {"k": integer(5, 1), "mode": choice("a", "a", "b")}
    assert check_options(table, {"k": 3}, "head 'knn'") == {"k": 3, "mode": "a"}
    with pytest.raises(errors.ConfigError, match=r"unknown option\(s\) \['kk'\] for head 'knn'"):
        check_options(table, {"kk": 3}, "head 'knn'")
    with pytest.raises(errors.ConfigError, match="option k=0 of head 'knn' is invalid"):
        check_options(table, {"k": 0}, "head 'knn'")


def test_keyword_options_of_a_function_are_checked():
    def space(trial, ctx, *, models=None, adapter="lstsq"):
        return None

    keyword_options(space, {"models": ["a"]}, "search space 'x'")
    with pytest.raises(errors.ConfigError, match=r"\['adaptor'\] for search space 'x'"):
        keyword_options(space, {"adaptor": "lstsq"}, "search space 'x'")
