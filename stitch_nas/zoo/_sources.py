"""Sources of zoo entries: timm, torchvision, any ``nn.Module`` and YAML settings items.

:func:`from_timm` (weights from a local file, timm's pretrained weights, or random),
:func:`from_torchvision` (local file) and :func:`from_module` each return a
:class:`~stitch_nas.zoo.ZooEntry` (YAML items are built by :mod:`stitch_nas.zoo._yaml`).
Only ``from_timm(..., pretrained=True)`` may download, as timm does (never with
``HF_HUB_OFFLINE`` set); checkpoints are read with safetensors or
``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from stitch_nas.errors import CacheError, ConfigError, UnknownModelError
from stitch_nas.files import sha256_file

from ._checkpoints import BAD_FILE, load_into, load_state_dict_file
from ._entry import IMAGENET_MEAN, IMAGENET_STD, InputSpec, ZooEntry

__all__ = [
    "from_timm",
    "from_torchvision",
    "from_module",
    "load_state_dict_file",
    "sha256_file",
]

logger = logging.getLogger(__name__)

_HUB_FILES = ("model.safetensors", "pytorch_model.bin")


def _labels(
    given: Sequence[str] | None, outputs: int, imagenet: Sequence[str] | None, name: str
) -> tuple[str, ...]:
    """Check given label names, or default to ImageNet's (1000 outputs) or "0", "1"..."""
    if given is None:
        default = [str(i) for i in range(outputs)]
        given = imagenet if imagenet is not None and len(imagenet) == outputs else default
    labels = tuple(str(label) for label in given)
    if len(labels) != outputs:
        raise ConfigError(
            f"{len(labels)} label names given for model {name!r} with {outputs} outputs; "
            "give one name per class"
        )
    return labels


def _unknown_name(kind: str, name: str, choices: Sequence[str], hint: str) -> UnknownModelError:
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    suggestion = f"did you mean {', '.join(close)}? " if close else ""
    return UnknownModelError(f"unknown {kind} model {name!r}; {suggestion}{hint}")


def _hub_cached_file(name: str) -> Path:
    """Find the weights of a timm model in the local caches only (no network)."""
    import timm
    from huggingface_hub import try_to_load_from_cache

    cfg = timm.models.get_pretrained_cfg(name)
    candidates: list[Path] = []
    if cfg is not None and cfg.hf_hub_id:
        for filename in (cfg.hf_hub_filename,) if cfg.hf_hub_filename else _HUB_FILES:
            found = try_to_load_from_cache(cfg.hf_hub_id, filename)
            if isinstance(found, str):  # otherwise None or a "known missing" sentinel
                candidates.append(Path(found))
    if cfg is not None and cfg.url:  # timm saves a (url, filename) pair's file as filename
        file = cfg.url[1] if isinstance(cfg.url, (tuple, list)) else Path(cfg.url).name
        candidates.append(Path(torch.hub.get_dir()) / "checkpoints" / file)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise CacheError(
        f"pretrained weights of timm model {name!r} are not in the local cache "
        f"({', '.join(str(c) for c in candidates) or 'timm names no file for it'}); pass "
        "weights='path/to/file.safetensors' instead"
    )


def _cached_or_downloaded(name: str, kwargs: dict[str, Any]) -> Path:
    """The weights file of a timm model: from the local cache, else downloaded by timm itself
    into it unless ``HF_HUB_OFFLINE`` is set (timm's own behaviour)."""
    import timm
    from huggingface_hub import constants

    try:
        return _hub_cached_file(name)
    except CacheError:
        if constants.HF_HUB_OFFLINE:
            raise CacheError(
                f"pretrained weights of timm model {name!r} are not in the local cache and "
                "HF_HUB_OFFLINE is set; unset it to let timm download them, or pass "
                "weights='path/to/file.safetensors' (YAML: weights: path)"
            ) from None
    logger.warning("downloading the pretrained weights of timm model %s", name)
    try:  # downloads into the Hugging Face (or torch hub) cache, as timm.create_model does
        timm.create_model(name, pretrained=True, **kwargs)
    except (OSError, RuntimeError, ValueError) as exc:
        raise CacheError(
            f"could not download the pretrained weights of timm model {name!r} ({exc}); "
            "download them where the network is reachable (they land in the Hugging Face "
            "cache) or pass weights='path/to/file.safetensors' (YAML: weights: path)"
        ) from exc
    return _hub_cached_file(name)


def _classifier_outputs(state: Mapping[str, torch.Tensor], key: str | None) -> int | None:
    """Outputs of the classifier ``key``; when None, of the last 2-D weight (a final Linear)."""
    if key is None:
        matrices = [k for k, v in state.items() if k.endswith(".weight") and v.ndim == 2]
        key = matrices[-1][: -len(".weight")] if matrices else None
    weight = state.get(f"{key}.weight") if key else None
    return int(weight.shape[0]) if weight is not None and weight.ndim >= 1 else None


def _create_timm(
    name: str, weights: str | Path | None, pretrained: bool, kwargs: dict[str, Any]
) -> tuple[nn.Module, str | None]:
    """Create a timm model with its weights; return it and the weights file's sha256."""
    import timm

    if weights is not None:
        state = load_state_dict_file(weights)
        if "num_classes" not in kwargs:
            cfg = timm.models.get_pretrained_cfg(name)
            found = _classifier_outputs(state, cfg.classifier if cfg is not None else None)
            if found is not None:
                kwargs["num_classes"] = found
        model = timm.create_model(name, pretrained=False, **kwargs)
        load_into(model, state, f"file {str(weights)!r}")
        return model, sha256_file(Path(weights).expanduser())
    if pretrained:
        cached = _cached_or_downloaded(name, kwargs)
        # timm reads .safetensors with safetensors and anything else with weights_only=True
        overlay = {"file": str(cached)}
        try:
            model = timm.create_model(
                name, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs
            )
        except BAD_FILE as exc:
            raise CacheError(
                f"cached weights {str(cached)!r} are unreadable ({exc}); delete that cached copy "
                "to download it again"
            ) from exc
        return model, sha256_file(cached)
    logger.info("timm model %s is randomly initialised (no weights, pretrained=False)", name)
    return timm.create_model(name, pretrained=False, **kwargs), None


def _timm_spec(model: nn.Module, img_size: int | Sequence[int] | None) -> InputSpec:
    """The model's eval transform as timm resolves it from its ``pretrained_cfg`` (size, mean,
    std, crop_pct, interpolation, crop mode). A model built for another ``img_size`` is no
    longer the one the config describes: its images are resized to that size whole (no crop)."""
    from timm.data import resolve_model_data_config

    cfg = resolve_model_data_config(model)
    own = tuple(cfg["input_size"][-2:])
    size = own if img_size is None else img_size
    side = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    return InputSpec(
        side,
        cfg["mean"],
        cfg["std"],
        crop_pct=cfg["crop_pct"] if side == own else None,
        interpolation=cfg["interpolation"],
        crop_mode=cfg.get("crop_mode") or "center",
    )


def from_timm(
    name: str,
    *,
    weights: str | Path | None = None,
    num_classes: int | None = None,
    label_names: Sequence[str] | None = None,
    pretrained: bool = False,
    entry_name: str | None = None,
    input_spec: InputSpec | None = None,
    **kwargs: Any,
) -> ZooEntry:
    """Create a zoo entry from a timm architecture.

    Args:
        name: timm model name, optionally with a pretrained tag (``"resnet18.a1_in1k"``).
        weights: Local ``.safetensors`` or ``.pt``/``.pth`` state dict to load strictly. When
            ``num_classes`` is None it is read from the checkpoint's classifier.
        num_classes: Number of outputs (timm's default when None).
        label_names: Class names; ImageNet names for 1000 classes, else ``"0"``, ``"1"``...
        pretrained: Load timm's pretrained weights from the local Hugging Face (or torch hub)
            cache; weights not cached are downloaded by timm into it, unless
            ``HF_HUB_OFFLINE`` is set. A different ``num_classes`` gets a fresh classifier.
        entry_name: Name in the zoo; defaults to ``name``.
        input_spec: Override the spec timm resolves from the model's ``pretrained_cfg``
            (``timm.data.resolve_model_data_config``: size, mean, std and the eval transform's
            crop_pct, interpolation and crop mode); when None and ``img_size`` is in
            ``kwargs``, that size is used.
        **kwargs: Passed to ``timm.create_model``.

    Raises:
        UnknownModelError: If timm does not know ``name``.
        CacheError: If ``pretrained=True`` but the weights are neither cached nor downloadable
            (offline, or the download failed).
        DataError: If the weights file is missing, corrupt or does not fit.
    """
    import timm

    if not timm.is_model(name):
        raise _unknown_name(
            "timm", name, timm.list_models(), "list them with timm.list_models('*pattern*')"
        )
    if weights is not None and pretrained:
        raise ConfigError(f"from_timm({name!r}) got weights= and pretrained=True; pass only one")
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    model, sha = _create_timm(name, weights, pretrained, kwargs)
    if input_spec is None:
        input_spec = _timm_spec(model, kwargs.get("img_size"))
    from timm.data import ImageNetInfo

    # label_descriptions() is typed list | dict; it returns a list unless as_dict=True
    imagenet = cast(list[str], ImageNetInfo().label_descriptions()) if label_names is None else None
    return ZooEntry(
        name=entry_name or name,
        model=model,
        input_spec=input_spec,
        label_names=_labels(label_names, int(cast(int, model.num_classes)), imagenet, name),
        source=f"timm:{name}",
        weights_sha256=sha,
        architecture={"source": "timm", "name": name, "kwargs": dict(kwargs)},
    )


def from_torchvision(
    name: str,
    weights_path: str | Path,
    *,
    num_classes: int | None = None,
    label_names: Sequence[str] | None = None,
    input_spec: InputSpec | None = None,
    entry_name: str | None = None,
    **kwargs: Any,
) -> ZooEntry:
    """Create a zoo entry from a torchvision classification architecture and a local file.

    Args:
        name: Name for ``torchvision.models.get_model``, e.g. ``"resnet18"``.
        weights_path: Local state dict (``.pth``/``.pt`` or ``.safetensors``).
        num_classes: Number of outputs; read from the checkpoint's last 2-D weight if None.
        label_names: Class names; torchvision's ImageNet categories for 1000 classes.
        input_spec: Defaults to 224x224 with ImageNet mean and std.
        entry_name: Name in the zoo; defaults to ``name``.
        **kwargs: Passed to ``torchvision.models.get_model``.

    Raises:
        UnknownModelError: If torchvision does not know ``name``.
        DataError: If the weights file is missing, corrupt or does not fit.
    """
    import torchvision

    choices = torchvision.models.list_models()
    if name not in choices:
        raise _unknown_name(
            "torchvision", name, choices, "list them with torchvision.models.list_models()"
        )
    state = load_state_dict_file(weights_path)
    num_classes = num_classes or _classifier_outputs(state, None)
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    model = torchvision.models.get_model(name, weights=None, **kwargs)
    load_into(model, state, f"file {str(weights_path)!r}")
    outputs = _classifier_outputs(model.state_dict(), None) or kwargs.get("num_classes", 1000)
    try:
        categories = torchvision.models.get_model_weights(name).DEFAULT.meta["categories"]
    except (ValueError, KeyError, AttributeError):  # architectures without published weights
        categories = None
    return ZooEntry(
        name=entry_name or name,
        model=model,
        input_spec=input_spec or InputSpec((224, 224), IMAGENET_MEAN, IMAGENET_STD),
        label_names=_labels(label_names, outputs, categories, name),
        source=f"torchvision:{name}",
        weights_sha256=sha256_file(Path(weights_path).expanduser()),
        architecture={"source": "torchvision", "name": name, "kwargs": dict(kwargs)},
    )


def from_module(
    name: str,
    module: nn.Module,
    *,
    checkpoint: str | Path | None = None,
    input_spec: InputSpec,
    label_names: Sequence[str],
    source: str = "user",
) -> ZooEntry:
    """Create a zoo entry from any ``nn.Module`` classifier of your own.

    Args:
        name: Name in the zoo.
        module: The classifier; it must map ``(N, 3, *input_spec.size)`` to ``(N, classes)``.
        checkpoint: Optional local state dict loaded strictly into ``module``.
        input_spec: Size and normalisation the module expects.
        label_names: Class names, one per output.
        source: Provenance string stored in the entry.

    Raises:
        DataError: If the checkpoint is missing, corrupt or does not fit.
    """
    sha = None
    if checkpoint is not None:
        load_into(module, load_state_dict_file(checkpoint), f"file {str(checkpoint)!r}")
        sha = sha256_file(Path(checkpoint).expanduser())
    return ZooEntry(
        name=name,
        model=module,
        input_spec=input_spec,
        label_names=tuple(label_names),
        source=source,
        weights_sha256=sha,
    )
