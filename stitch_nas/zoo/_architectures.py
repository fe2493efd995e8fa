"""Create a zoo model's untrained architecture from its JSON recipe.

An export stores, for every source model, how to create its architecture again (timm or
torchvision name plus keyword arguments) and the weights it uses, so ``stitch_nas.load`` needs
neither the zoo nor any download. Nothing here runs code named in a file: a user's own module
class cannot be recreated from JSON and must be passed in by the caller.

The keyword arguments a recipe may hold are restricted to a list per source: structural
hyper-parameters with plain values only. ``stitch.json`` is read from folders that travel, so
nothing in it may name a file (timm's ``checkpoint_path`` or ``pretrained_cfg_overlay``, a
``weights`` enum that downloads), a device, or code; a string value must be a bare name such
as ``"gelu"``. A model built with other arguments is exported as a user module would be.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import partial
from typing import Any

from torch import nn

from stitch_nas.errors import ConfigError, UnknownModelError

__all__ = [
    "ARCHITECTURE_KWARGS",
    "ARCHITECTURE_SOURCES",
    "architecture_problem",
    "check_architecture",
    "create_architecture",
]

ARCHITECTURE_SOURCES = ("timm", "torchvision")

# what the model classes of each library take that shapes the network; everything else
# (files, downloads, devices, dtypes, classes) stays out of stitch.json
_COMMON = ("num_classes", "in_chans", "img_size", "global_pool", "output_stride", "drop_rate")
ARCHITECTURE_KWARGS: dict[str, frozenset[str]] = {
    "timm": frozenset(
        (
            *_COMMON,
            *("drop_path_rate", "drop_block_rate", "proj_drop_rate", "attn_drop_rate"),
            *("pos_drop_rate", "patch_drop_rate", "act_layer", "norm_layer"),
            # transformers
            *("patch_size", "embed_dim", "depth", "depths", "num_heads", "head_dim"),
            *("mlp_ratio", "qkv_bias", "qk_norm", "init_values", "class_token", "reg_tokens"),
            *("num_reg_tokens", "no_embed_class", "pos_embed", "pre_norm", "final_norm"),
            *("fc_norm", "use_fc_norm", "dynamic_img_size", "dynamic_img_pad", "weight_init"),
            *("window_size", "strict_img_size"),
            # convolutional networks
            *("layers", "channels", "cardinality", "base_width", "stem_width", "stem_type"),
            *("stem_size", "avg_down", "down_kernel_size", "block_reduce_first"),
            *("zero_init_last", "dims", "kernel_sizes", "ls_init_value", "head_norm_first"),
            *("head_hidden_size", "conv_mlp", "conv_bias", "use_grn", "channel_multiplier"),
            *("depth_multiplier", "fix_stem", "num_features", "width_mult", "depth_mult"),
            *("growth_rate", "block_config", "bn_size", "se_ratio"),
        )
    ),
    "torchvision": frozenset(
        (
            *_COMMON,
            *("aux_logits", "transform_input", "init_weights", "dropout", "attention_dropout"),
            *("stochastic_depth_prob", "width_mult", "image_size", "patch_size"),
            *("zero_init_residual", "groups", "width_per_group"),
            *("replace_stride_with_dilation", "round_nearest", "memory_efficient"),
        )
    ),
}
# a bare name: no path separator, no dot (a file's extension), no colon (timm's "hf-hub:")
_PLAIN_STRING = re.compile(r"[A-Za-z0-9_]*")
_MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def _plain(value: Any) -> bool:
    """A number, bool, None, bare name, or a list of those (image sizes, depths per stage)."""
    if isinstance(value, str):
        return _PLAIN_STRING.fullmatch(value) is not None
    if isinstance(value, list):
        return all(_plain(v) and not isinstance(v, list) for v in value)
    return value is None or isinstance(value, (bool, int, float))


def architecture_problem(recipe: Mapping[str, Any]) -> str | None:
    """Why ``recipe`` may not be created from JSON, in a few words; None when it may."""
    source, name, kwargs = recipe.get("source"), recipe.get("name"), recipe.get("kwargs")
    if source not in ARCHITECTURE_SOURCES:
        return f"source {source!r} is not one of {', '.join(ARCHITECTURE_SOURCES)}"
    if not isinstance(name, str) or _MODEL_NAME.fullmatch(name) is None:
        return f"{source} model name {name!r} is not a plain model name"
    extra = sorted(set(recipe) - {"source", "name", "kwargs"})
    if extra:
        return f"key {extra[0]!r} is not part of an architecture recipe"
    if kwargs is None:
        return None
    if not isinstance(kwargs, Mapping):
        return f"{source} kwargs of {name!r} are a {type(kwargs).__name__}, not a mapping"
    for key, value in kwargs.items():
        if key not in ARCHITECTURE_KWARGS[source]:
            return f"{source} kwarg {key!r} of {name!r} is not on the {source} allow-list"
        if not _plain(value):
            return f"{source} kwarg {key!r} of {name!r} has value {value!r}, not a plain value"
    return None


def check_architecture(name: str, recipe: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The recipe as plain JSON, or None; a recipe that JSON cannot hold is an error."""
    if recipe is None:
        return None
    try:
        plain = json.loads(json.dumps(dict(recipe)))
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"the architecture of model {name!r} has arguments JSON cannot store ({exc}); "
            "create it with plain-value keyword arguments to make it exportable"
        ) from exc
    problem = architecture_problem(plain)
    if problem is not None:
        raise ConfigError(
            f"model {name!r} cannot be exported: {problem}; create it without that argument, "
            "or add it with from_module and pass it to stitch_nas.load(path, modules=...)"
        )
    return plain


def create_architecture(recipe: Mapping[str, Any]) -> nn.Module:
    """The randomly initialised model ``recipe`` describes, in eval mode.

    Args:
        recipe: ``{"source": "timm" | "torchvision", "name": str, "kwargs": dict}``.

    Raises:
        ConfigError: If the recipe is malformed, names an unknown source, or holds a kwarg
            that is not on its source's allow-list (:data:`ARCHITECTURE_KWARGS`).
        UnknownModelError: If timm or torchvision does not know the name.
    """
    problem = architecture_problem(recipe)
    if problem is not None:
        raise ConfigError(f"architecture recipe refused: {problem}")
    source, name = recipe["source"], recipe["name"]
    kwargs = dict(recipe.get("kwargs") or {})
    if source == "timm":
        import timm

        if not timm.is_model(name):
            raise UnknownModelError(
                f"timm {timm.__version__} has no model {name!r}; install the timm version the "
                "export was made with"
            )
        create: Any = partial(timm.create_model, name, pretrained=False)
    else:
        import torchvision

        if name not in torchvision.models.list_models():
            raise UnknownModelError(
                f"torchvision {torchvision.__version__} has no model {name!r}; install the "
                "torchvision version the export was made with"
            )
        create = partial(torchvision.models.get_model, name, weights=None)
    try:
        return create(**kwargs).eval()
    except TypeError as exc:  # an allowed kwarg this model's class does not take
        raise ConfigError(f"{source} model {name!r} refuses its kwargs: {exc}") from exc
