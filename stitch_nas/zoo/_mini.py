"""The embedded mini zoo: five small timm classifiers trained on the bundled digits.

It lets the whole package run and be tested with no download at all. Each model is a timm
test architecture created with ``pretrained=False`` and trained deterministically for a few
epochs (AdamW, one-cycle schedule, batch 64, seeded shuffling); all five build in well under a
minute on two CPU cores, to deliberately different sizes and accuracies.

Input specs: size = the data's image size (32x32 for the digits), mean/std = the
architecture's own timm ``pretrained_cfg`` (0.5/0.5 for resnet, convnext and vit; ImageNet
statistics for efficientnet and byobnet). The mix is deliberate: a real zoo mixes
normalisations, and stitching must cope with each model normalising its own input.

Trained weights are cached under ``<cache_dir>/mini_zoo/<name>.safetensors`` with a
``manifest.json`` that records each file's sha256, its recipe (architecture, training
settings, data fingerprint, library versions) and its validation accuracy. A file whose
sha256 does not match, or whose recipe or data changed, is rebuilt. Every file is written to a
temporary file in the same folder and moved into place with ``os.replace``, so an interrupted
build never leaves a half-written file that looks valid.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save
from torch import nn

from stitch_nas.data import DataSplits, load_digits_splits
from stitch_nas.errors import DataError, UnknownModelError
from stitch_nas.files import atomic_write, default_cache_dir, sha256_file

from ._checkpoints import load_into
from ._entry import InputSpec, Zoo, ZooEntry

__all__ = ["MINI_ZOO_NAMES", "architecture_of", "build_model", "default_cache_dir", "load_mini_zoo"]

logger = logging.getLogger(__name__)

_FORMAT = 1  # bump when the manifest layout changes; older manifests are then ignored
_SUBDIR = "mini_zoo"
_MANIFEST = "manifest.json"

# Architecture and training recipe per model. Epochs and learning rates were tuned so each
# model trains in seconds on two CPU cores yet reaches > 90% validation accuracy.
_RECIPES: dict[str, dict[str, Any]] = {
    "resnet": {"architecture": "test_resnet", "kwargs": {}, "epochs": 4, "lr": 3e-3},
    "convnext": {"architecture": "test_convnext", "kwargs": {}, "epochs": 5, "lr": 3e-3},
    "efficientnet": {"architecture": "test_efficientnet", "kwargs": {}, "epochs": 4, "lr": 3e-3},
    "vit": {
        "architecture": "test_vit",
        # 32 / 4 = 8x8 = 64 patch tokens plus the class token; a fixed image size keeps
        # the model traceable by torch.fx; depth 4 (not 6) trains as well in 2/3 of the time
        "kwargs": {"patch_size": 4, "depth": 4, "dynamic_img_size": False},
        "epochs": 10,
        "lr": 3e-3,
        # timm's std 0.02 position embedding leaves a tiny ViT blind to position for most of
        # a short run (it plateaus near 40%); a larger init reaches > 90% in 10 epochs
        "pos_embed_std": 0.3,
    },
    "byobnet": {"architecture": "test_byobnet", "kwargs": {}, "epochs": 4, "lr": 3e-3},
}
_COMMON = {"batch_size": 64, "weight_decay": 0.05, "seed": 0, "warmup_fraction": 0.15}

MINI_ZOO_NAMES: tuple[str, ...] = tuple(_RECIPES)
"""Names of the mini zoo models, in build order."""


def _recipe_of(name: str) -> dict[str, Any]:
    if name not in _RECIPES:
        raise UnknownModelError(
            f"unknown mini zoo model {name!r}; available: {', '.join(MINI_ZOO_NAMES)}"
        )
    return _RECIPES[name]


def build_model(name: str, *, num_classes: int = 10, img_size: int = 32) -> nn.Module:
    """Create the untrained architecture of a mini zoo model (uses the global torch RNG).

    Args:
        name: One of :data:`MINI_ZOO_NAMES`.
        num_classes: Number of outputs.
        img_size: Input side in pixels (only the ViT depends on it).

    Returns:
        The randomly initialised timm model, in train mode.

    Raises:
        UnknownModelError: If ``name`` is not a mini zoo model.
    """
    from ._architectures import create_architecture

    recipe = _recipe_of(name)
    model = create_architecture(architecture_of(name, num_classes=num_classes, img_size=img_size))
    if "pos_embed_std" in recipe:
        std = recipe["pos_embed_std"]
        pos_embed = cast(nn.Parameter, model.pos_embed)  # Module.__getattr__ is untyped
        nn.init.trunc_normal_(pos_embed, std=std, a=-2 * std, b=2 * std)
    return model


def architecture_of(name: str, *, num_classes: int = 10, img_size: int = 32) -> dict[str, Any]:
    """The timm recipe of a mini zoo model's architecture (see ``ZooEntry.architecture``)."""
    recipe = _recipe_of(name)
    kwargs = {**recipe["kwargs"], "num_classes": num_classes}
    if recipe["architecture"] == "test_vit":
        kwargs["img_size"] = img_size
    return {"source": "timm", "name": recipe["architecture"], "kwargs": kwargs}


def _input_spec(name: str, img_size: tuple[int, int]) -> InputSpec:
    import timm

    architecture = _recipe_of(name)["architecture"]
    cfg = timm.models.get_pretrained_cfg(architecture)
    if cfg is None:
        raise UnknownModelError(
            f"timm {timm.__version__} has no pretrained config for {architecture!r}, the "
            f"architecture of mini zoo model {name!r}; install a timm version that has it"
        )
    # timm types mean and std as tuple[float, ...]; they hold one value per RGB channel
    rgb = tuple[float, float, float]
    return InputSpec(size=img_size, mean=cast(rgb, cfg.mean), std=cast(rgb, cfg.std))


def _full_recipe(name: str, data: DataSplits) -> dict[str, Any]:
    """Everything that determines a model's weights; any change triggers a rebuild."""
    import timm

    recipe = {
        **_RECIPES[name],
        **_COMMON,
        "num_classes": data.num_classes,
        "img_size": list(data.image_size),
        "data_fingerprint": data.fingerprint(),
        "timm_version": timm.__version__,
        "torch_version": torch.__version__,
    }
    return json.loads(json.dumps(recipe))  # the form it takes in the manifest, for comparison


@torch.no_grad()
def _accuracy(entry: ZooEntry, data: DataSplits) -> float:
    predictions = entry.logits(data.val.read()).argmax(dim=1)
    return float((predictions == data.val.y).float().mean())


def _train(name: str, recipe: dict[str, Any], data: DataSplits, bar: Any) -> nn.Module:
    """Train one model deterministically, leaving the global RNG state untouched."""
    spec = _input_spec(name, data.image_size)
    x, y = data.train.read(), data.train.y
    batch, epochs = recipe["batch_size"], recipe["epochs"]
    steps = epochs * -(-len(y) // batch)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe["seed"])
        model = build_model(name, num_classes=data.num_classes, img_size=data.image_size[0])
        generator = torch.Generator().manual_seed(recipe["seed"])
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=recipe["lr"], weight_decay=recipe["weight_decay"]
        )
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=recipe["lr"], total_steps=steps, pct_start=recipe["warmup_fraction"]
        )
        model.train()
        for _ in range(epochs):
            for index in torch.randperm(len(y), generator=generator).split(batch):
                loss = F.cross_entropy(model(spec.preprocess(x[index])), y[index])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                schedule.step()
            bar.update(1)
    return model.eval()


def _read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / _MANIFEST
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        logger.warning("mini zoo manifest %s is unreadable (%s); rebuilding all models", path, exc)
        return {}
    if not isinstance(raw, dict) or raw.get("format") != _FORMAT:
        logger.warning("mini zoo manifest %s has an old or unknown format; rebuilding", path)
        return {}
    models = raw.get("models")
    return models if isinstance(models, dict) else {}


def _write_record(folder: Path, name: str, record: dict[str, Any]) -> None:
    # re-read so that records written meanwhile by another process are kept
    models = _read_manifest(folder)
    models[name] = record
    text = json.dumps({"format": _FORMAT, "models": models}, indent=2, sort_keys=True)
    atomic_write(folder / _MANIFEST, text.encode())


def _load_cached(
    folder: Path, name: str, recipe: dict[str, Any], record: Any, data: DataSplits
) -> nn.Module | None:
    """Return the cached model if its file and recipe are intact, else None (with a reason)."""
    path = folder / f"{name}.safetensors"
    if not isinstance(record, dict):
        logger.info("mini zoo model %s is not cached yet; building it", name)
        return None
    if record.get("recipe") != recipe:
        logger.info("recipe or data of mini zoo model %s changed; rebuilding it", name)
        return None
    if not path.is_file():
        logger.warning("cached mini zoo file %s is missing; rebuilding it", path)
        return None
    if sha256_file(path) != record.get("sha256"):
        logger.warning("cached mini zoo file %s is corrupt (sha256 mismatch); rebuilding", path)
        return None
    model = build_model(name, num_classes=data.num_classes, img_size=data.image_size[0])
    try:
        load_into(model, load_file(str(path)), f"in {str(path)!r}")
    except (SafetensorError, DataError, OSError) as exc:
        logger.warning("cached mini zoo file %s does not load (%s); rebuilding it", path, exc)
        return None
    return model.eval()


def _summary(record: dict[str, Any]) -> str:
    return (
        f"{record['train_seconds']:.1f} s, val accuracy {record['val_accuracy']:.3f}, "
        f"{record['num_params']:,} params"
    )


def _save(folder: Path, name: str, model: nn.Module, record: dict[str, Any]) -> str:
    # clone: safetensors refuses tensors that share storage
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    path = folder / f"{name}.safetensors"
    atomic_write(path, save(state, metadata={"name": name, "source": "stitch_nas.mini_zoo"}))
    record["sha256"] = sha256_file(path)
    _write_record(folder, name, record)
    return record["sha256"]


def load_mini_zoo(
    data: DataSplits | None = None,
    *,
    cache_dir: str | Path | None = None,
    progress: bool = False,
    names: tuple[str, ...] = MINI_ZOO_NAMES,
) -> Zoo:
    """Load the mini zoo from the cache, training whatever is missing, stale or corrupt.

    Args:
        data: Data the models are trained and validated on; the digits when None. Its
            fingerprint is part of each recipe, so other data gets its own models.
        cache_dir: Cache root; defaults to :func:`default_cache_dir`.
        progress: Show a tqdm bar over the training epochs.
        names: Subset of :data:`MINI_ZOO_NAMES` to load.

    Returns:
        A zoo whose entries carry ``info["val_accuracy"]`` and ``info["recipe"]``.

    Raises:
        UnknownModelError: If ``names`` holds an unknown model.
        OSError: If the cache folder cannot be created or written (bad cached files are
            not errors: they are logged and rebuilt).
    """
    from tqdm.auto import tqdm

    for name in names:
        _recipe_of(name)  # fail early on an unknown name, before any work
    data = data if data is not None else load_digits_splits()
    folder = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    folder = folder / _SUBDIR
    folder.mkdir(parents=True, exist_ok=True)
    records = _read_manifest(folder)
    recipes = {name: _full_recipe(name, data) for name in names}
    models = {n: _load_cached(folder, n, recipes[n], records.get(n), data) for n in names}
    todo = [n for n in names if models[n] is None]
    total = sum(recipes[n]["epochs"] for n in todo)
    zoo = Zoo()
    with tqdm(total=total, disable=not progress or not total, desc="mini zoo", unit="epoch") as bar:
        for name in names:
            model = models[name]
            record = records.get(name) if model is not None else None
            if record is None or model is None:
                bar.set_postfix_str(name)
                start = time.perf_counter()
                model = _train(name, recipes[name], data, bar)
                record = {"recipe": recipes[name], "train_seconds": time.perf_counter() - start}
            entry = ZooEntry(
                name=name,
                model=model,
                input_spec=_input_spec(name, data.image_size),
                label_names=data.label_names,
                source="mini_zoo",
                info={"architecture": recipes[name]["architecture"], "recipe": recipes[name]},
                architecture=architecture_of(
                    name, num_classes=data.num_classes, img_size=data.image_size[0]
                ),
            )
            if "sha256" not in record:
                record["val_accuracy"] = _accuracy(entry, data)
                record["num_params"] = entry.num_params
                _save(folder, name, entry.model, record)
                logger.info("built mini zoo model %s: %s", name, _summary(record))
            entry.weights_sha256 = record["sha256"]
            entry.info["val_accuracy"] = record.get("val_accuracy")
            zoo.add(entry)
    return zoo
