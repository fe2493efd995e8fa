"""Trained adapters kept by their trials: the export and the test pass load them, train nothing,
check them on the trial's fixed sample, refuse a stale file, and retrain an old study's."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from stitch_nas import attrs, load
from stitch_nas.activations import StitchContext
from stitch_nas.cli import main
from stitch_nas.config import StitchConfig
from stitch_nas.errors import ConfigError, ExportError
from stitch_nas.export import export_study
from stitch_nas.search import load_folder_study
from stitch_nas.stitching import (
    build,
    fit_net_head,
    has_trained_adapters,
    load_tuned,
    measure,
    reproduces,
    reproduces_count,
    sample_correct,
)

REFINE = "[{kind: linear, loss: distill, steps: 20, eval_every: 10}]"


@pytest.fixture(scope="module")
def searched(tmp_path_factory, mini_zoo_dir) -> SimpleNamespace:
    """A 16-trial digits search whose 3 best least-squares networks are refined (trained)."""
    root = tmp_path_factory.mktemp("kept_weights")
    config = root / "kept.yaml"
    config.write_text(
        f"search: {{trials: 16, seed: 0, refine_trials: 3, refine_adapters: {REFINE}}}\n"
        f"zoo: {{cache_dir: {mini_zoo_dir}}}\n"
    )
    out = root / "out"
    assert main(["search", str(config), "--out", str(out), "-q", "--no-export"]) == 0
    study = load_folder_study(out)
    trained = [
        t
        for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        if has_trained_adapters(StitchConfig.from_dict(t.user_attrs[attrs.CONFIG]))
    ]
    assert trained, "the refinements completed no trained network"
    return SimpleNamespace(out=out, study=study, trained=trained)


@pytest.fixture(scope="module")
def ctx(mini_zoo, digits) -> StitchContext:
    return StitchContext(mini_zoo, digits)


def _copy(searched: SimpleNamespace, tmp_path: Path) -> Path:
    """The search's folder copied, so a test may spoil it."""
    out = tmp_path / "out"
    shutil.copytree(searched.out, out, ignore=shutil.ignore_patterns("models"))
    return out


def _no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("an adapter trained during the export")

    monkeypatch.setattr("stitch_nas.adapters._joint.train", refuse)


def test_each_trained_trial_keeps_its_adapters_and_its_sample(searched) -> None:
    for trial in searched.trained:
        relative = trial.user_attrs[attrs.WEIGHTS]
        assert relative.startswith("trained/trial_")
        file = searched.out / relative
        with safe_open(str(file), framework="pt") as handle:
            keys = list(handle.keys())
        # the adapter at the one joint (parts[1]) and the preprocessing: nothing of the zoo's
        assert keys and all(k.startswith(("parts.1.", "preprocess.")) for k in keys), keys
        assert not list(file.parent.glob(".*.tmp"))  # written atomically
        assert trial.user_attrs["sample_images"] > 0
        assert 0 <= trial.user_attrs["sample_correct"] <= trial.user_attrs["sample_images"]


def test_the_kept_adapters_rebuild_the_trial_network_without_training(
    searched, ctx, monkeypatch
) -> None:
    trial = searched.trained[0]
    config = StitchConfig.from_dict(trial.user_attrs[attrs.CONFIG])
    trained = build(ctx, config)  # trained again from its seed: the trial's network
    _no_training(monkeypatch)
    net = load_tuned(ctx, config, searched.out / trial.user_attrs[attrs.WEIGHTS])
    x = ctx.split("val").read(torch.arange(16))
    with torch.no_grad():
        torch.testing.assert_close(net(x), trained(x), atol=1e-5, rtol=1e-4)
    # the export's rule: the same images right with float32 activations; with the float16 cache
    # a near-tie may flip when this context recomputes a cut the search's read (one image)
    _, result = measure(ctx, config, net=net)
    assert reproduces(ctx, result.accuracy, trial.user_attrs["accuracy"]), result.accuracy
    images = trial.user_attrs["sample_images"]
    correct = sample_correct(ctx, net, fit_net_head(ctx, net), images)
    assert reproduces_count(ctx, correct, trial.user_attrs["sample_correct"], images), correct


def test_export_trains_no_adapter_and_loads_with_the_trial_outputs(
    searched, ctx, monkeypatch, tmp_path
) -> None:
    out = _copy(searched, tmp_path)
    numbers = ",".join(str(t.number) for t in searched.trained)
    configs = {
        t.number: StitchConfig.from_dict(t.user_attrs[attrs.CONFIG]) for t in searched.trained
    }
    expected = {n: build(ctx, c) for n, c in configs.items()}  # before training is refused
    _no_training(monkeypatch)
    assert main(["export", str(out), "--trials", numbers, "--format", "safetensors", "-q"]) == 0
    x = ctx.split("test").read(torch.arange(16))
    for number, net in expected.items():
        loaded = load(out / "models" / f"trial_{number}")
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), net(x), atol=1e-5, rtol=1e-4)


def test_a_stale_weights_file_is_refused_in_one_line(searched, ctx, tmp_path) -> None:
    out = _copy(searched, tmp_path)
    trial = searched.trained[0]
    file = out / trial.user_attrs[attrs.WEIGHTS]
    tensors = load_file(str(file))
    # the same tensors, other values: only the fixed sample can tell
    spoiled = {
        k: (v + 0.5 * v.std() * torch.randn_like(v)) if v.is_floating_point() else v
        for k, v in tensors.items()
    }
    save_file(spoiled, str(file), metadata={"stitch_nas": "trained"})
    with pytest.raises(ExportError) as caught:
        export_study(
            searched.study,
            ctx,
            tmp_path / "m",
            trials=[trial.number],
            folder=out,
            formats=["safetensors"],
        )
    message = str(caught.value)
    assert "stale" in message and len(message.splitlines()) == 1
    # tensors of another network: refused before anything is measured
    save_file({"a": torch.zeros(2)}, str(file), metadata={"stitch_nas": "trained"})
    with pytest.raises(ExportError, match="does not hold the weights of") as caught:
        export_study(
            searched.study,
            ctx,
            tmp_path / "m",
            trials=[trial.number],
            folder=out,
            formats=["safetensors"],
        )
    assert len(str(caught.value).splitlines()) == 1
    config = StitchConfig.from_dict(trial.user_attrs[attrs.CONFIG])
    with pytest.raises(ConfigError, match="does not hold the weights of"):
        load_tuned(ctx, config, file)


def _old_study(study: optuna.Study) -> optuna.Study:
    """``study`` as a search before this version recorded it: no kept weights, no sample."""
    old = optuna.create_study(directions=study.directions)
    for key, value in study.user_attrs.items():
        old.set_user_attr(key, value)
    dropped = (attrs.WEIGHTS, "sample_correct", "sample_images")
    for t in study.get_trials():
        old.add_trial(
            optuna.trial.create_trial(
                state=t.state,
                values=t.values,
                params=t.params,
                distributions=t.distributions,
                user_attrs={k: v for k, v in t.user_attrs.items() if k not in dropped},
                constraints=dict(t.constraints) or None,
            )
        )
    return old


def test_an_old_study_exports_by_training_again_and_says_so(
    searched, ctx, tmp_path, caplog
) -> None:
    trial = searched.trained[0]
    config = StitchConfig.from_dict(trial.user_attrs[attrs.CONFIG])
    with caplog.at_level(logging.WARNING, logger="stitch_nas"):
        summary = export_study(
            _old_study(searched.study),
            ctx,
            tmp_path / "m",
            trials=[trial.number],
            folder=searched.out,
            formats=["safetensors"],
        )
    assert len(summary.folders) == 1
    said = [r.getMessage() for r in caplog.records if "again from their seed" in r.getMessage()]
    assert len(said) == 1 and f"trial_{trial.number}" in said[0]
    loaded = load(summary.folders[0])
    x = ctx.split("test").read(torch.arange(16))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), build(ctx, config)(x), atol=1e-5, rtol=1e-4)


def test_weights_kept_on_another_machine_are_trained_again(searched, ctx, tmp_path, caplog):
    out = _copy(searched, tmp_path)
    shutil.rmtree(out / "trained")
    trial = searched.trained[0]
    with caplog.at_level(logging.WARNING, logger="stitch_nas"):
        summary = export_study(
            searched.study,
            ctx,
            tmp_path / "m",
            trials=[trial.number],
            folder=out,
            formats=["safetensors"],
        )
    assert len(summary.folders) == 1
    assert any("not at hand" in r.getMessage() for r in caplog.records)
