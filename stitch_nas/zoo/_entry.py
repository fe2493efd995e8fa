"""The model zoo's data types: :class:`InputSpec`, :class:`ZooEntry` and :class:`Zoo`.

A :class:`Zoo` maps short names to :class:`ZooEntry` objects, each a classifier with the input
spec (size, normalisation) and label names it expects. Entries are made by the sources in
:mod:`stitch_nas.zoo` (timm, torchvision, any ``nn.Module``, YAML settings) or by
:mod:`stitch_nas.zoo` (the embedded digits zoo).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stitch_nas.errors import ConfigError, UnknownModelError

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "InputSpec", "ZooEntry", "Zoo"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


#: how a model's own eval transform crops (timm's ``crop_mode``)
CROP_MODES = ("center", "squash", "border")


@dataclass(frozen=True, repr=False)
class InputSpec:
    """What a model expects: image size and per-channel normalisation, and how its authors
    made its inputs from images of any size.

    With ``crop_pct`` None, the data's images (all of one size) are resized to :attr:`size`
    bilinearly and normalised (:meth:`preprocess`). With ``crop_pct`` set, each model's inputs
    are made from the stored images by timm's eval transform (:meth:`image_transform`: resize to
    ``size / crop_pct`` with ``interpolation``, crop to ``size`` by ``crop_mode``), as timm
    evaluates its models, and then normalised; :func:`~stitch_nas.zoo.from_timm` reads these
    from the model's ``pretrained_cfg``.

    Attributes:
        size: Height and width the model is fed.
        mean: Per-channel mean subtracted from ``[0, 1]`` images.
        std: Per-channel standard deviation divided out after the mean.
        crop_pct: Share of the resized image the centre crop keeps (None: no transform of
            its own; the images are resized to ``size`` whole).
        interpolation: Resize filter of the eval transform (``bilinear``, ``bicubic``...).
        crop_mode: ``center`` (shorter side to ``size / crop_pct``, then a centre crop),
            ``squash`` or ``border`` (timm's meanings).
    """

    size: tuple[int, int]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    crop_pct: float | None = None
    interpolation: str = "bilinear"
    crop_mode: str = "center"

    def __post_init__(self) -> None:
        # normalise lists (from JSON or YAML) to tuples so specs compare and hash reliably
        object.__setattr__(self, "size", tuple(int(v) for v in self.size))
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "std", tuple(float(v) for v in self.std))
        if len(self.size) != 2 or min(self.size) < 1:
            raise ConfigError(f"input size {self.size} is invalid; use (height, width) > 0")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ConfigError(
                f"mean {self.mean} / std {self.std} are invalid; use 3 values each, std > 0"
            )
        if self.crop_pct is not None:
            object.__setattr__(self, "crop_pct", float(self.crop_pct))
        if self.crop_pct is not None and not 0.0 < self.crop_pct <= 1.0:
            raise ConfigError(f"crop_pct {self.crop_pct!r} is invalid; use a share in (0, 1]")
        if self.crop_mode not in CROP_MODES:
            raise ConfigError(
                f"crop_mode {self.crop_mode!r} is invalid; use one of {', '.join(CROP_MODES)}"
            )

    def __repr__(self) -> str:
        # part of every activation's key: a spec without a transform of its own keeps the
        # repr (and so the cached activations) it had before the transform fields existed
        own = f"size={self.size!r}, mean={self.mean!r}, std={self.std!r}"
        if self.crop_pct is not None:
            own += (
                f", crop_pct={self.crop_pct!r}, interpolation={self.interpolation!r}, "
                f"crop_mode={self.crop_mode!r}"
            )
        return f"InputSpec({own})"

    def image_transform(self) -> Callable[[Any], Any] | None:
        """The model's eval transform without normalisation (None: ``crop_pct`` is None).

        timm's own ``create_transform(..., is_training=False, normalize=False)``: a PIL image
        (or a float ``(N, 3, H, W)`` batch) in, a uint8 ``(3, *size)`` tensor (or a float
        batch) out; :meth:`preprocess` normalises it afterwards, as timm's ``Normalize`` would.
        """
        return None if self.crop_pct is None else _eval_transform(self)

    def preprocess(self, x: torch.Tensor) -> torch.Tensor:
        """Resize ``[0, 1]`` images ``(N, 3, H, W)`` to :attr:`size` if needed, then normalise.

        Bilinear without antialiasing, exactly as :class:`stitch_nas.stitching.Preprocess`, so a
        stitched network sees the same inputs as its models did.
        """
        if tuple(x.shape[-2:]) != self.size:
            x = F.interpolate(x, size=self.size, mode="bilinear", align_corners=False)
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        return (x - mean) / std


@functools.lru_cache(maxsize=64)
def _eval_transform(spec: InputSpec) -> Callable[[Any], Any]:
    from timm.data import create_transform

    return create_transform(  # type: ignore[no-any-return]
        input_size=(3, *spec.size),
        is_training=False,
        interpolation=spec.interpolation,
        crop_pct=spec.crop_pct,
        crop_mode=spec.crop_mode,
        mean=spec.mean,
        std=spec.std,
        normalize=False,
    )


@dataclass(eq=False)
class ZooEntry:
    """One model of the zoo.

    Attributes:
        name: Short unique name in the zoo.
        model: The classifier, put in eval mode on creation.
        input_spec: Size and normalisation the model expects.
        label_names: Name of each output class, indexed by logit.
        source: Provenance, e.g. ``"timm:test_resnet"``, ``"mini_zoo"``, ``"user"``.
        weights_sha256: sha256 of the weights file the model was loaded from, if any.
        info: Free-form facts such as ``val_accuracy`` or the training recipe.
        architecture: How to create the untrained model again (JSON: ``{"source": "timm",
            "name": ..., "kwargs": {...}}`` or torchvision), so an export can be loaded
            without the zoo; None for user modules (pass them to ``stitch_nas.load``).
    """

    name: str
    model: nn.Module
    input_spec: InputSpec
    label_names: tuple[str, ...]
    source: str
    weights_sha256: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    architecture: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"zoo entry name {self.name!r} is invalid; use a non-empty string")
        if not isinstance(self.model, nn.Module):
            kind = type(self.model).__name__
            raise ConfigError(f"model of entry {self.name!r} is a {kind}; pass an nn.Module")
        self.label_names = tuple(str(label) for label in self.label_names)
        self.model.eval()

    @property
    def num_classes(self) -> int:
        """Number of output classes."""
        return len(self.label_names)

    @property
    def num_params(self) -> int:
        """Number of parameters of the model."""
        return sum(p.numel() for p in self.model.parameters())

    @torch.no_grad()
    def logits(self, x: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
        """Preprocess ``[0, 1]`` images and return the model's logits, in batches."""
        device = next(self.model.parameters(), torch.empty(0)).device
        out = [self.model(self.input_spec.preprocess(b.to(device))) for b in x.split(batch_size)]
        return torch.cat(out)


class Zoo(Mapping[str, ZooEntry]):
    """An ordered, name-keyed, read-only mapping of :class:`ZooEntry` objects (add to grow it)."""

    def __init__(self, entries: Iterable[ZooEntry] = ()) -> None:
        self._entries: dict[str, ZooEntry] = {}
        for entry in entries:
            self.add(entry)

    def add(self, entry: ZooEntry) -> ZooEntry:
        """Add an entry and return it.

        Raises:
            ConfigError: If an entry of the same name is already in the zoo.
        """
        if not isinstance(entry, ZooEntry):
            raise ConfigError(f"Zoo.add got a {type(entry).__name__}; pass a ZooEntry")
        if entry.name in self._entries:
            raise ConfigError(
                f"model {entry.name!r} is already in the zoo; give the new one another name"
            )
        self._entries[entry.name] = entry
        return entry

    def remove(self, name: str) -> ZooEntry:
        """Remove the entry called ``name`` and return it."""
        entry = self[name]
        del self._entries[name]
        return entry

    def names(self) -> list[str]:
        """Return the entry names in insertion order."""
        return list(self._entries)

    def __getitem__(self, name: str) -> ZooEntry:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            available = ", ".join(self._entries) or "none"
            raise UnknownModelError(
                f"unknown model {name!r}; available: {available} "
                "(add one with zoo.add(from_timm(...)) or from_module(...))"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Zoo({', '.join(self._entries)})"
