"""StitchConfig: what a trial samples, what a report lists and what an export stores.

A stitched network is a sequence of fragments ``(model, start_cut, end_cut)`` of zoo models, an
adapter between each consecutive pair, and a head. ``start_cut=None`` means the model's input,
``end_cut=None`` its output. Configs are frozen, round-trip through JSON, and hash stably.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from stitch_nas.errors import ConfigError
from stitch_nas.plugins import HEADS

__all__ = ["Fragment", "AdapterSpec", "HeadSpec", "StitchConfig", "DIRECTIONS"]

#: the order of two models in a stitch: the cheaper one first, or the costlier one first
DIRECTIONS = ("fast_to_slow", "slow_to_fast")


def _freeze(options: dict[str, Any] | tuple | None) -> tuple[tuple[str, Any], ...]:
    if not options:
        return ()
    items = options.items() if isinstance(options, dict) else options
    return tuple(sorted((str(k), v) for k, v in items))


@dataclass(frozen=True)
class Fragment:
    """A run of one zoo model from ``start`` (None: input) to ``end`` (None: output)."""

    model: str
    start: str | None = None
    end: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "start": self.start, "end": self.end}

    def __str__(self) -> str:
        return f"{self.model}[{self.start or 'input'}:{self.end or 'output'}]"


@dataclass(frozen=True)
class _Spec:
    """A named kind plus options, kept as a sorted tuple so specs hash and compare by value."""

    kind: str
    options: tuple[tuple[str, Any], ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", _freeze(self.options))

    def option(self, key: str, default: Any = None) -> Any:
        return dict(self.options).get(key, default)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "options": dict(self.options)}


@dataclass(frozen=True)
class AdapterSpec(_Spec):
    """How two consecutive fragments are joined: an adapter name plus its options."""

    kind: str = "lstsq"


@dataclass(frozen=True)
class HeadSpec(_Spec):
    """What turns the last fragment's output into predictions.

    ``native`` uses the last model's own classifier (its labels must match the task);
    ``knn`` and ``linear_probe`` fit a classifier on the final features for a new label space.
    """

    kind: str = "native"

    def __post_init__(self) -> None:
        if self.kind != "native" and self.kind not in HEADS:
            raise ConfigError(
                f"unknown head kind {self.kind!r}; use native or one of {HEADS.list()}"
            )
        super().__post_init__()


@dataclass(frozen=True)
class StitchConfig:
    """A stitched network: fragments, one adapter per joint, and a head."""

    fragments: tuple[Fragment, ...]
    adapters: tuple[AdapterSpec, ...] = ()
    head: HeadSpec = HeadSpec()

    def __post_init__(self) -> None:
        object.__setattr__(self, "fragments", tuple(self.fragments))
        object.__setattr__(self, "adapters", tuple(self.adapters))
        if not self.fragments:
            raise ConfigError("a StitchConfig needs at least one fragment")
        if len(self.adapters) != len(self.fragments) - 1:
            raise ConfigError(
                f"{len(self.fragments)} fragments need {len(self.fragments) - 1} adapters, "
                f"got {len(self.adapters)}"
            )
        if self.fragments[0].start is not None:
            raise ConfigError(
                f"the first fragment must start at the input (start=None), got "
                f"{self.fragments[0].start!r}"
            )
        for frag in self.fragments[1:]:
            if frag.start is None:
                raise ConfigError(f"fragment {frag} after the first must start at a cut point")
        for frag in self.fragments[:-1]:
            if frag.end is None:
                raise ConfigError(f"fragment {frag} before the last must end at a cut point")
        if self.head.kind == "native" and self.fragments[-1].end is not None:
            raise ConfigError(
                "a native head needs the last fragment to run to the model's output (end=None); "
                "use head kind 'knn' or 'linear_probe' to classify intermediate features"
            )

    @property
    def models(self) -> tuple[str, ...]:
        """Distinct source models, in order of first use."""
        return tuple(dict.fromkeys(f.model for f in self.fragments))

    @property
    def is_stitched(self) -> bool:
        return len(self.fragments) > 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "fragments": [f.to_dict() for f in self.fragments],
            "adapters": [a.to_dict() for a in self.adapters],
            "head": self.head.to_dict(),
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, **kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StitchConfig:
        if not isinstance(data, dict) or "fragments" not in data:
            raise ConfigError("a StitchConfig dict needs a 'fragments' list")
        unknown = set(data) - {"fragments", "adapters", "head"}
        if unknown:
            raise ConfigError(
                f"unknown StitchConfig keys {sorted(unknown)}; valid: fragments, adapters, head"
            )
        try:
            fragments = tuple(Fragment(**f) for f in data["fragments"])
            adapters = tuple(
                AdapterSpec(a["kind"], _freeze(a.get("options"))) for a in data.get("adapters", [])
            )
            head_data = data.get("head") or {"kind": "native"}
            head = HeadSpec(head_data["kind"], _freeze(head_data.get("options")))
        except (TypeError, KeyError) as exc:
            raise ConfigError(f"malformed StitchConfig: {exc}") from exc
        return cls(fragments, adapters, head)

    @classmethod
    def from_json(cls, text: str) -> StitchConfig:
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"StitchConfig JSON does not parse: {exc}") from exc

    @classmethod
    def single(cls, model: str) -> StitchConfig:
        """A zoo model on its own (the reference points on a Pareto plot)."""
        return cls((Fragment(model),))

    def stable_hash(self) -> str:
        """First 16 hex digits of the sha256 of the canonical JSON; equal configs, equal hash."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def describe(self) -> str:
        """One line, e.g. ``resnet[input:layer2.0] -lstsq-> vit[blocks.3:output]``."""
        parts = [str(self.fragments[0])]
        for adapter, frag in zip(self.adapters, self.fragments[1:], strict=True):
            parts.append(f"-{adapter.kind}-> {frag}")
        return " ".join(parts)
