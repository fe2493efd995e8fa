"""Exported networks as Optuna artifacts: uploaded by the export, listed by Optuna, loaded back."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import optuna
import pytest
import torch

import stitch_nas
from stitch_nas import attrs
from stitch_nas.cli import main
from stitch_nas.errors import ConfigError, IntegrityError
from stitch_nas.search import load_folder_study


@pytest.fixture(scope="module")
def searched(tmp_path_factory, mini_zoo, mini_zoo_dir) -> tuple[Path, Path]:
    """A small digits search whose own export step uploads its networks."""
    root = tmp_path_factory.mktemp("artifacts")
    out, store = root / "run", root / "store"
    argv = ["demo", "--out", str(out), "--cache-dir", str(mini_zoo_dir), "--no-progress"]
    assert main([*argv, "--trials", "6", "--artifacts", str(store)]) == 0
    return out, store


def _listed(study: optuna.Study) -> set[tuple[str, str]]:
    """Optuna's own list of the study's artifacts: (file name, artifact id) pairs."""
    metas = optuna.artifacts.get_all_artifact_meta(study_or_trial=study, storage=study._storage)
    return {(m.filename, m.artifact_id) for m in metas}


def _same_outputs(a: torch.nn.Module, b: torch.nn.Module, digits) -> None:
    x = digits.val.x[:16]
    with torch.no_grad():
        assert torch.equal(a(x), b(x))


def test_the_search_uploads_each_exported_network_and_optuna_lists_them(searched, digits):
    out, store = searched
    study = load_folder_study(out)
    uploaded = study.user_attrs[attrs.ARTIFACTS]
    folders = sorted(p.name for p in (out / "models").iterdir() if p.is_dir())
    assert sorted(uploaded) == folders and "elastic" in folders
    assert {(f"{name}.tar", artifact) for name, artifact in uploaded.items()} == _listed(study)
    for name, artifact in uploaded.items():
        from_artifact = stitch_nas.load(artifact_id=artifact, artifact_store=store)
        from_folder = stitch_nas.load(out / "models" / name)
        assert type(from_artifact) is type(from_folder)
        if name != "elastic":
            assert from_artifact.metrics == from_folder.metrics
        _same_outputs(from_artifact, from_folder, digits)


def test_stitch_nas_export_uploads_to_another_store(searched, capsys, digits):
    out, _ = searched
    store = out.parent / "second_store"
    argv = ["export", str(out), "--format", "safetensors", "--artifacts", str(store)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "uploaded" in printed and "artifact_id=" in printed
    study = load_folder_study(out)
    uploaded = study.user_attrs[attrs.ARTIFACTS]  # the latest upload of each folder
    listed = _listed(study)
    assert {(f"{name}.tar", artifact) for name, artifact in uploaded.items()} <= listed
    assert len(listed) > len(uploaded)  # the search's own uploads are listed too
    name = next(n for n in uploaded if n.startswith("trial_"))
    store_obj = optuna.artifacts.FileSystemArtifactStore(str(store))  # a store object works too
    net = stitch_nas.load(artifact_id=uploaded[name], artifact_store=store_obj)
    _same_outputs(net, stitch_nas.load(out / "models" / name), digits)


def _store_with(tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    store = tmp_path / "store"
    store.mkdir()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    buffer.seek(0)
    optuna.artifacts.FileSystemArtifactStore(str(store)).write("bad", buffer)
    return store


def _file(name: str, data: bytes = b"{}") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info, None


@pytest.mark.parametrize(
    "member",
    [_file("../meta.json"), _file("/tmp/meta.json"), _file("a/../../x"), _link("meta.json", "/")],
)
def test_an_archive_member_outside_its_folder_is_refused(tmp_path, member):
    store = _store_with(tmp_path, [_file("stitch.json"), member])
    with pytest.raises(IntegrityError, match="refusing to unpack"):
        stitch_nas.load(artifact_id="bad", artifact_store=store)
    assert not (tmp_path / "meta.json").exists() and not Path("/tmp/meta.json").exists()


def test_load_takes_a_folder_or_an_artifact(tmp_path):
    with pytest.raises(ConfigError, match="exactly one"):
        stitch_nas.load()
    with pytest.raises(ConfigError, match="exactly one"):
        stitch_nas.load(tmp_path, artifact_id="x", artifact_store=tmp_path)
    with pytest.raises(ConfigError, match="needs artifact_store"):
        stitch_nas.load(artifact_id="x")
    with pytest.raises(ConfigError, match="not in the artifact store"):
        stitch_nas.load(artifact_id="nope", artifact_store=tmp_path)
    with pytest.raises(ConfigError, match="is not a folder"):
        stitch_nas.load(artifact_id="nope", artifact_store=tmp_path / "missing")


def test_bad_artifact_flags_are_one_line_before_torch(tmp_path, capsys):
    taken = tmp_path / "file"
    taken.write_text("not a folder")
    out = tmp_path / "out"
    assert main(["demo", "--out", str(out), "--artifacts", str(taken)]) == 2
    assert main(["demo", "--out", str(out), "--no-export", "--artifacts", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--artifacts" in err[0] and "--no-export" in err[1], err
    assert not out.exists()
