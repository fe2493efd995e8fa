"""Create a zoo model's untrained architecture from its JSON recipe.

An export stores, for every source model, how to create its architecture again (timm or
torchvision name plus keyword arguments) and the weights it uses, so ``stitch_nas.load`` needs
neither the zoo nor any download. Nothing here runs code named in a file: a user's own module
class cannot be recreated from JSON and must be passed in by the caller.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from torch import nn

from stitch_nas.errors import ConfigError, UnknownModelError

__all__ = ["ARCHITECTURE_SOURCES", "create_architecture", "check_architecture"]

ARCHITECTURE_SOURCES = ("timm", "torchvision")


def check_architecture(name: str, recipe: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The recipe as plain JSON, or None; a recipe that JSON cannot hold is an error."""
    if recipe is None:
        return None
    try:
        return json.loads(json.dumps(dict(recipe)))
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"the architecture of model {name!r} has arguments JSON cannot store ({exc}); "
            "create it with plain-value keyword arguments to make it exportable"
        ) from exc


def create_architecture(recipe: Mapping[str, Any]) -> nn.Module:
    """The randomly initialised model ``recipe`` describes, in eval mode.

    Args:
        recipe: ``{"source": "timm" | "torchvision", "name": str, "kwargs": dict}``.

    Raises:
        ConfigError: If the recipe is malformed or names an unknown source.
        UnknownModelError: If timm or torchvision does not know the name.
    """
    source, name = recipe.get("source"), recipe.get("name")
    kwargs = dict(recipe.get("kwargs") or {})
    if source not in ARCHITECTURE_SOURCES or not isinstance(name, str):
        raise ConfigError(
            f"architecture recipe {dict(recipe)!r} is invalid; it needs source in "
            f"{ARCHITECTURE_SOURCES} and a model name"
        )
    if source == "timm":
        import timm

        if not timm.is_model(name):
            raise UnknownModelError(
                f"timm {timm.__version__} has no model {name!r}; install the timm version the "
                "export was made with"
            )
        return timm.create_model(name, pretrained=False, **kwargs).eval()
    import torchvision

    if name not in torchvision.models.list_models():
        raise UnknownModelError(
            f"torchvision {torchvision.__version__} has no model {name!r}; install the "
            "torchvision version the export was made with"
        )
    return torchvision.models.get_model(name, weights=None, **kwargs).eval()
