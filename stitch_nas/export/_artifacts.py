"""Exported networks as Optuna artifacts: one archive per network folder, and loading one back.

With an artifact store (``--artifacts DIR``: a :class:`optuna.artifacts.FileSystemArtifactStore`
there; or any Optuna store, e.g. Boto3 or GCS, from Python) each exported folder is packed into
one uncompressed tar (``trial_12.tar``: the weights are incompressible) and uploaded with
:func:`optuna.artifacts.upload_artifact`, so optuna-dashboard lists and downloads it and
:func:`optuna.artifacts.get_all_artifact_meta` reads it back. Optuna refuses to change a finished
trial (``UpdateFinishedTrialError``) and every exported trial has finished, so the archives are
artifacts of the study, each named after its network's folder; the study user attribute
``artifacts`` (:data:`stitch_nas.attrs.ARTIFACTS`) maps each folder name to its artifact id.

:func:`unpacked` downloads one into a temporary folder and unpacks it there, refusing any
member that is not a plain file or folder inside it (an absolute path, ``..``, a link, a
device); ``stitch_nas.load(artifact_id=..., artifact_store=...)`` loads that folder as it loads
any: checksums (and signature) checked, nothing unpickled.
"""

from __future__ import annotations

import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

import optuna

from stitch_nas import attrs
from stitch_nas.errors import ConfigError, IntegrityError

__all__ = ["artifact_store", "unpacked", "upload_folder"]

_MIMETYPE = "application/x-tar"


def artifact_store(store: Any) -> Any:
    """``store`` as an Optuna artifact store: a folder (str or Path, created if missing)
    becomes a :class:`~optuna.artifacts.FileSystemArtifactStore`; a store is kept as it is."""
    if isinstance(store, (str, Path)):
        folder = Path(store).expanduser()
        if folder.exists() and not folder.is_dir():
            raise ConfigError(f"artifact store {str(folder)!r} is a file; give a folder")
        folder.mkdir(parents=True, exist_ok=True)
        return optuna.artifacts.FileSystemArtifactStore(str(folder))
    if not all(callable(getattr(store, m, None)) for m in ("open_reader", "write", "remove")):
        raise ConfigError(
            f"artifact_store={type(store).__name__}: give a folder or an Optuna artifact store "
            "(optuna.artifacts.FileSystemArtifactStore, Boto3ArtifactStore, GCSArtifactStore)"
        )
    return store


def upload_folder(study: optuna.Study, folder: Path, store: Any) -> str:
    """Pack ``folder`` (an exported network) into ``<name>.tar``, upload it as an artifact of
    ``study`` and record its id under ``attrs.ARTIFACTS``; return the artifact id."""
    folder = Path(folder)
    with tempfile.TemporaryDirectory(prefix="stitch_nas-artifact-") as tmp:
        archive = Path(tmp) / f"{folder.name}.tar"
        with tarfile.open(archive, "w") as tar:
            for path in sorted(folder.rglob("*")):
                if path.is_file() and not path.is_symlink():
                    tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False)
        artifact_id = optuna.artifacts.upload_artifact(
            artifact_store=store,
            file_path=str(archive),
            study_or_trial=study,
            mimetype=_MIMETYPE,
        )
    known = dict(study.user_attrs.get(attrs.ARTIFACTS) or {})
    known[folder.name] = artifact_id
    study.set_user_attr(attrs.ARTIFACTS, known)
    return artifact_id


def _safe_members(tar: tarfile.TarFile, where: str) -> list[tarfile.TarInfo]:
    """Every member, each a plain file or folder with a relative path inside the archive."""
    members = tar.getmembers()
    for member in members:
        path = PurePosixPath(member.name)
        if path.is_absolute() or ".." in path.parts or "\\" in member.name or ":" in member.name:
            raise IntegrityError(
                f"{where}: member {member.name!r} points outside the archive; refusing to unpack"
            )
        if not (member.isfile() or member.isdir()):
            raise IntegrityError(
                f"{where}: member {member.name!r} is not a plain file (a link or device); "
                "refusing to unpack"
            )
    return members


@contextmanager
def unpacked(artifact_id: str, store: Any) -> Iterator[Path]:
    """The folder the archive ``upload_folder`` uploaded as ``artifact_id`` to ``store`` (a
    folder or an Optuna artifact store) unpacks to, in a temporary folder removed on exit."""
    store = artifact_store(store) if not isinstance(store, (str, Path)) else _existing(store)
    where = f"artifact {artifact_id!r}"
    with tempfile.TemporaryDirectory(prefix="stitch_nas-artifact-") as tmp:
        archive = Path(tmp) / "network.tar"
        try:
            optuna.artifacts.download_artifact(
                artifact_store=store, file_path=str(archive), artifact_id=artifact_id
            )
        except optuna.artifacts.exceptions.ArtifactNotFound:
            raise ConfigError(
                f"{where} is not in the artifact store; list the study's with "
                "optuna.artifacts.get_all_artifact_meta(study)"
            ) from None
        folder = Path(tmp) / "network"
        folder.mkdir()
        try:
            with tarfile.open(archive, "r:") as tar:
                members = _safe_members(tar, where)
                # Python's own "data" filter too, where this Python has it (3.10.12, 3.11.4)
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(folder, members=members, filter="data")
                else:  # noqa: S202 - every member was checked above
                    tar.extractall(folder, members=members)
        except tarfile.TarError as exc:
            raise IntegrityError(f"{where} is not a tar archive of an export ({exc})") from None
        yield folder


def _existing(folder: str | Path) -> Any:
    """A folder given to read from must exist: reading never creates a store."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise ConfigError(f"artifact store {str(path)!r} is not a folder; give the --artifacts DIR")
    return optuna.artifacts.FileSystemArtifactStore(str(path))
