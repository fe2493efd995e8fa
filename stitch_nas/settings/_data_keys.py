"""The ``data`` section of a ``stitch-nas search`` file: kinds, their keys, their checks.

``data.kind`` names an entry of :data:`DATA_KINDS` (``digits``, ``image_folder``, ``npz``,
``torchvision``; plug-ins add more through the entry-point group ``stitch_nas.data_kinds``).
Each kind declares which keys of the section it reads; a key it does not read, a missing
folder or file, or a malformed split is a one-line :class:`~stitch_nas.errors.ConfigError`
raised while the file is parsed, before torch loads. Nothing here imports torch.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stitch_nas.choices import PROBE_SIZE_RANGE
from stitch_nas.errors import ConfigError, UnknownNameError
from stitch_nas.registry import Registry

from ._zoo_keys import expand_path

__all__ = ["DATA_KINDS", "DataKind", "SPLITS", "check_data", "register_data_kind"]

SPLITS = ("train", "probe", "val", "test")


@dataclass(frozen=True)
class DataKind:
    """One kind of data set.

    Attributes:
        keys: the keys of the ``data`` section this kind reads (``kind`` aside).
        check: ``(data settings, where) -> None``: checks done while parsing (files exist).
        build: ``data settings -> DataSplits``; it may import torch.
    """

    keys: tuple[str, ...]
    check: Callable[[Any, str], None]
    build: Callable[[Any], Any]


DATA_KINDS: Registry[DataKind] = Registry("data kind", group="stitch_nas.data_kinds")


def register_data_kind(
    name: str, keys: tuple[str, ...], check: Callable[[Any, str], None] | None = None
) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    """Decorator: register ``build(data settings) -> DataSplits`` as data kind ``name``."""

    def add(build: Callable[[Any], Any]) -> Callable[[Any], Any]:
        DATA_KINDS.register(name, DataKind(keys, check or (lambda s, w: None), build))
        return build

    return add


_COMMON = ("size", "upsample", "probe_size", "seed")

#: the image side a data set is loaded at when ``data.size`` is None and nothing set it from the
#: zoo (``stitch-nas search`` does, :func:`stitch_nas.pipeline.data_size`): the mini zoo's
FALLBACK_SIZE = 32


def _size(settings: Any) -> int:
    return FALLBACK_SIZE if settings.size is None else int(settings.size)


def _folder(settings: Any, where: str) -> Path:
    if settings.root is None:
        raise ConfigError(f"{where} needs data.root (a local folder); add it")
    root = Path(settings.root)
    if not root.is_dir():
        raise ConfigError(f"data.root {str(root)!r} is not an existing folder; fix the path")
    return root


def _check_image_folder(settings: Any, where: str) -> None:
    root = _folder(settings, where)
    present = {p.name for p in root.iterdir() if p.is_dir()}
    if settings.split_folders:
        missing = [s for s in ("train", "val") if s not in present]
        if missing:
            raise ConfigError(
                f"data.split_folders is true but {str(root)!r} has no {missing[0]}/ folder; "
                "add train/, val/ and optionally test/ (each with one folder per class; "
                "without test/, val/ is cut in two)"
            )
    elif present and present <= {"train", "val", "test"}:
        raise ConfigError(
            f"data.root {str(root)!r} holds {'/, '.join(sorted(present))}/ folders; set "
            "data.split_folders: true to keep those splits (otherwise they would be classes)"
        )


@register_data_kind("digits", _COMMON)
def _digits(settings: Any) -> Any:
    from stitch_nas.data import load_digits_splits

    return load_digits_splits(
        size=_size(settings), probe_size=settings.probe_size, seed=settings.seed
    )


@register_data_kind(
    "image_folder", ("root", "split_folders", "workers", *_COMMON), _check_image_folder
)
def _image_folder(settings: Any) -> Any:
    from stitch_nas.data import load_image_folder, load_split_folders

    load = load_split_folders if settings.split_folders else load_image_folder
    return load(
        settings.root,
        size=_size(settings),
        probe_size=settings.probe_size,
        seed=settings.seed,
        workers=settings.workers,
    )


def _check_torchvision(settings: Any, where: str) -> None:
    _folder(settings, where)
    if settings.name is None:
        raise ConfigError(f"{where} needs data.name, a torchvision data set class such as CIFAR10")


@register_data_kind("torchvision", ("root", "name", "workers", *_COMMON), _check_torchvision)
def _torchvision(settings: Any) -> Any:
    from stitch_nas.data import load_torchvision_dataset

    return load_torchvision_dataset(
        settings.name,
        settings.root,
        size=_size(settings),
        probe_size=settings.probe_size,
        seed=settings.seed,
        workers=settings.workers,
    )


def _array_length(file: Path, key: str, where: str) -> int:
    """Rows of array ``key`` in an ``.npz`` file, read from its header only."""
    import numpy as np

    try:
        with zipfile.ZipFile(file) as archive, archive.open(f"{key}.npy") as member:
            version = np.lib.format.read_magic(member)
            read = {(1, 0): np.lib.format.read_array_header_1_0}
            header = read.get(version, np.lib.format.read_array_header_2_0)(member)
    except KeyError:
        with zipfile.ZipFile(file) as archive:
            names = [n.removesuffix(".npy") for n in archive.namelist()]
        raise ConfigError(
            f"{where}: {str(file)!r} has no array {key!r} (it has {', '.join(names)}); set "
            "data.x_key / data.y_key"
        ) from None
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"{where}: {str(file)!r} is not a readable .npz file ({exc})") from exc
    shape = header[0]
    return int(shape[0]) if shape else 0


def _check_npz(settings: Any, where: str) -> None:
    splits = settings.splits
    if not isinstance(splits, dict) or sorted(splits) != sorted(SPLITS):
        got = sorted(splits) if isinstance(splits, dict) else splits
        raise ConfigError(
            f"data.splits must map each of {', '.join(SPLITS)} to {{file, start, count}}, got "
            f"{got!r}; every split is fixed by its file and rows"
        )
    root = _folder(settings, where) if settings.root else Path()
    ranges: dict[str, list[tuple[int, int, str]]] = {}
    for name in SPLITS:
        spec, at = splits[name], f"data.splits.{name}"
        if (
            not isinstance(spec, Mapping)
            or "file" not in spec
            or set(spec) - {"file", "start", "count"}
        ):
            raise ConfigError(f"{at} must be {{file: x.npz, start: 0, count: N}}, got {spec!r}")
        start, count = spec.get("start", 0), spec.get("count")
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise ConfigError(f"{at}.start must be an int >= 0, got {start!r}")
        if count is not None and (
            not isinstance(count, int) or isinstance(count, bool) or count < 1
        ):
            raise ConfigError(f"{at}.count must be an int >= 1 or null (to the end), got {count!r}")
        file = Path(expand_path(str(spec["file"]), root, f"{at}.file"))
        if not file.is_file():
            raise ConfigError(f"{at}.file {str(file)!r} does not exist; fix data.root or the file")
        rows = _array_length(file, settings.x_key, at)
        if _array_length(file, settings.y_key, at) != rows:
            raise ConfigError(f"{at}: {settings.x_key!r} and {settings.y_key!r} differ in length")
        stop = rows if count is None else start + count
        if stop > rows or start >= rows:
            raise ConfigError(
                f"{at} takes rows {start}..{stop - 1} but {file.name} has {rows}; lower start/count"
            )
        low, high = PROBE_SIZE_RANGE
        if name == "probe" and not low <= stop - start <= high:
            raise ConfigError(f"{at} has {stop - start} images; use {low} to {high}")
        for other_start, other_stop, other in ranges.get(str(file), []):
            if start < other_stop and other_start < stop:
                raise ConfigError(
                    f"{at} and data.splits.{other} overlap in {file.name} (rows "
                    f"{start}..{stop - 1} and {other_start}..{other_stop - 1}); make the splits "
                    "disjoint"
                )
        ranges.setdefault(str(file), []).append((start, stop, name))
        splits[name] = {"file": str(file), "start": start, "count": stop - start}


@register_data_kind(
    "npz",
    ("root", "splits", "x_key", "y_key", "label_names", "shuffle", "size", "upsample", "seed"),
    _check_npz,
)
def _npz(settings: Any) -> Any:
    from stitch_nas.data import load_npz_splits

    return load_npz_splits(
        settings.splits,
        x_key=settings.x_key,
        y_key=settings.y_key,
        label_names=settings.label_names or None,
        size=settings.size,
        seed=settings.seed if settings.shuffle else None,
    )


def check_data(settings: Any, given: set[str], base: Path | None) -> None:
    """Check the ``data`` section for its kind and make its paths absolute, in place.

    Args:
        settings: the section (a ``DataSettings``), its values already type-checked.
        given: the keys the file gave (a key the kind does not read, set to anything but its
            default, is an error).
        base: the folder relative paths start from (the YAML file's), or None.
    """
    try:
        kind = DATA_KINDS.get(settings.kind)
    except UnknownNameError as exc:
        raise ConfigError(f"data.kind: {exc}") from None
    defaults = type(settings)()
    # a key the kind does not read may still be listed at its default (examples/search.yaml)
    unused = sorted(
        k for k in given - {"kind", *kind.keys} if getattr(settings, k) != getattr(defaults, k)
    )
    if unused:
        raise ConfigError(
            f"data.{unused[0]} is not read by data.kind {settings.kind!r}; its keys are "
            f"{', '.join(kind.keys)}"
        )
    if settings.root is not None:
        settings.root = expand_path(settings.root, base, "data.root")
    elif settings.kind == "npz" and base is not None:
        settings.root = str(base)
    kind.check(settings, f"data.kind {settings.kind!r}")
