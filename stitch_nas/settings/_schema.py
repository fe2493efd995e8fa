"""The YAML file of ``stitch-nas search``: what to search, on what, for how long.

Every key is checked: a wrong key or type is a one-line ``ConfigError`` that names it and lists
what is allowed; each value's limits are checked once, by
:func:`~stitch_nas.settings.check_settings`. ``examples/search.yaml`` shows most keys; the
YAML reference page lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from stitch_nas.errors import ConfigError, shorten
from stitch_nas.finetune import FinetuneRecipe

__all__ = [
    "ZooSettings",
    "DataSettings",
    "SearchSettings",
    "FinetuneSettings",
    "Settings",
    "load_settings",
]


@dataclass
class ZooSettings:
    """The models to stitch: the embedded mini zoo and your own entries, each checked by its
    source (:mod:`stitch_nas.settings`)."""

    #: include the embedded digits mini zoo (five small timm models); null: only when models
    #: lists none
    mini_zoo: bool | None = None
    models: list = field(default_factory=list)  #: your own models, one item each (see below)
    cache_dir: str | None = None  #: mini zoo cache (None: $STITCH_NAS_CACHE or ~/.cache/stitch_nas)

    def includes_mini_zoo(self) -> bool:
        """Whether the mini zoo is part of the zoo: ``mini_zoo`` when given, else (None) when
        ``models`` lists none (so a file that lists its own models trains no test models)."""
        return self.mini_zoo if self.mini_zoo is not None else not self.models


@dataclass
class DataSettings:
    """``kind``: digits | image_folder | npz | torchvision (:mod:`stitch_nas.settings`
    says which keys each reads)."""

    kind: str = "digits"
    root: str | None = None  #: folder of image_folder / torchvision / npz (relative: to the YAML)
    name: str | None = None  #: torchvision data set class, e.g. CIFAR10
    #: side of the square images the data set yields, in pixels (models with an eval transform
    #: of their own, timm's, crop the stored images instead); None: the largest input side the
    #: zoo.models ask for, 32 for the mini zoo alone
    size: int | None = None
    #: let models take inputs larger than the data's images (upsampled); false: refused
    upsample: bool = False
    #: probe split (stitch fits, CKA, the pruning proxy): N images (32-8192), {per_class: k},
    #: or auto: 8 per class, at least 128 and at most 2048 (stitch_nas.choices.check_probe_size)
    probe_size: int | str | dict = "auto"
    seed: int = 0  #: seed of the split permutation (npz: of each file's one shuffle)
    split_folders: bool = False  #: image_folder: keep root/train, root/val, root/test as splits
    workers: int = 2  #: image_folder: processes decoding images while a split is read (0: none)
    splits: dict = field(default_factory=dict)  #: npz: {train|probe|val|test: {file, start, count}}
    x_key: str = "x"  #: npz: name of the image array
    y_key: str = "y"  #: npz: name of the label array
    label_names: list = field(default_factory=list)  #: npz: class names (default "0", "1"...)
    shuffle: bool = True  #: npz: shuffle each file (seeded) before taking rows


@dataclass
class SearchSettings:
    """How the study runs; the CLI's --trials/--out/--sampler override these."""

    space: str = "pairwise"  #: registered search space (pairwise, chain, gap, or a seed preset)
    space_options: dict = field(default_factory=dict)  #: the space's own options
    #: registered objective names (accuracy, macs, params, latency, cka)
    objectives: list = field(default_factory=lambda: ["accuracy", "macs"])
    #: tpe, nsga2, nsga3, gp, qmc, random, or package.module:Class for any Optuna sampler
    sampler: str = "tpe"
    #: keyword arguments of the sampler's class, e.g. {population_size: 50} for nsga2
    sampler_options: dict = field(default_factory=dict)
    seed: int = 0  #: the sampler's seed
    trials: int = 50  #: total trials (repeats of a config already measured do not count)
    #: prune stitched configs whose least-squares probe accuracy is below this times chance
    probe_threshold: float = 1.5
    seed_trials: int = 8  #: configs the probe ranks best, tried first
    seed_pool: int | None = None  #: random configs probe-scored to choose them from (None: 4x)
    #: the sampler's proposals probe-scored per trial, the one adding most to the front measured
    #: (1: the sampler alone; stitch_nas.search.ProxySampler)
    proxy_candidates: int = 8
    cka_threshold: float = 0.0  #: prune stitched configs below this CKA (0: off)
    #: after the search, this many of the best least-squares networks retrained (0: off)
    refine_trials: int = 0
    #: each refined network is retrained once per entry; by default a linear stitch (joins any
    #: layout) trained by SN-Net's distillation from the destination model
    refine_adapters: list = field(
        default_factory=lambda: [{"kind": "linear", "loss": "distill", "steps": 100}]
    )
    fidelity: float = 0.15  #: share of val a config is scored on first (0: off)
    budgets: dict = field(default_factory=dict)  #: constraints, e.g. {macs: 2e6, params: 1e5}
    fuse: bool = False  #: fold least-squares stitches into the next conv/linear layer
    device: str = "auto"  #: "auto": CUDA when this machine has it, else the CPU; cpu, cuda:N...
    #: "bfloat16": passes that train nothing run under autocast (faster on a GPU); None: float32
    autocast: str | None = None
    #: GiB of host memory activations are kept in; null: 5 % of the memory this process may
    #: use (a container's cgroup limit where lower than the machine's); 0: none
    cache_memory_gb: float | None = None
    #: GiB of GPU memory activations computed there are kept in first (then host memory);
    #: null: 25 % of the GPU's free memory; unused on the CPU
    cache_device_memory_gb: float | None = None
    cache_dir: str | None = None  #: folder activations spill to, shared by processes (None: none)
    #: GiB the spill folder's files may take, every process's counted; null: what it holds
    #: plus half the disk's free space when a process opens it
    cache_disk_gb: float | None = None
    export: bool = True  #: export the Pareto front (and an elastic package) to DIR/models
    #: files each exported network gets besides model.safetensors: pt2, onnx, torchscript
    #: (``stitch-nas export DIR`` writes pt2 and onnx unless told; each costs seconds a network)
    export_formats: list = field(default_factory=lambda: ["safetensors"])
    #: how the latency objective (or a latency budget) times a network: {backend: onnxruntime
    #: (default; the onnx extra) or torch, threads: 1, batch: 1, warmup: 3, repeats: 20}, or
    #: the target device's figures: {table: FILE.yaml} (relative: to this file) or {function:
    #: package.module:fn} (stitch_nas.stitching.LatencySpec)
    latency: dict = field(default_factory=dict)
    #: also upload each exported network's folder, as one tar archive, to an Optuna artifact
    #: store in this folder (an artifact of the study; None: no upload)
    artifacts: str | None = None
    executor: str = "local"  #: "local" (this process) or "ray" (parallel Ray workers)
    workers: int = 2  #: Ray workers, i.e. trials in flight (executor "ray")
    ray_address: str | None = None  #: Ray cluster to join; None starts a local Ray
    ray_connect_timeout_s: float = 10.0  #: seconds ray_address has to answer as Ray
    cpus_per_worker: float = 1.0  #: CPUs each Ray worker reserves
    gpus_per_worker: float = -1.0  #: -1: share the visible GPUs when device is CUDA, else 0
    #: who asks the study for trials: "driver", "workers" (each opens the study), or "auto"
    ray_mode: str = "auto"
    storage: str | None = None  #: Optuna RDB URL (e.g. PostgreSQL) instead of DIR/study.db
    study_name: str | None = None  #: None: the output folder's name
    heartbeat_s: int = 60  #: Optuna heartbeat of RDB storages; dead drivers' trials FAIL after 2x


@dataclass
class FinetuneSettings:
    """The fine-tune stage after the search (also ``--finetune``): networks of the stitched
    front trained further (:mod:`stitch_nas.finetune`)."""

    enabled: bool = False  #: run the stage
    #: stitched networks trained further: the most accurate on validation in each of this many
    #: bands of MACs, among those at or above floor (the fine-tune guide: which networks)
    networks: int = 4
    #: the validation accuracy a network needs to be chosen; null: 0.15 below the most accurate
    #: zoo model's (fine-tuning lifts a stitched network of strong models by that much)
    floor: float | None = None
    #: also fine-tune zoo models alike (the honest control): true, the zoo's front models; a
    #: list of names, those and the front's (a claim against a model off the front needs it)
    control: bool | list[str] = False
    #: how they train: keys of ``FinetuneRecipe`` (train, teacher, k, epochs, lr, ...)
    recipe: FinetuneRecipe = field(default_factory=FinetuneRecipe)


@dataclass
class Settings:
    zoo: ZooSettings = field(default_factory=ZooSettings)
    data: DataSettings = field(default_factory=DataSettings)
    search: SearchSettings = field(default_factory=SearchSettings)
    finetune: FinetuneSettings = field(default_factory=FinetuneSettings)


#: keys whose default None means "decided at run time", with the type of their other values
_OR_NONE: dict[str, type] = {
    "mini_zoo": bool,
    "cache_memory_gb": float,
    "cache_device_memory_gb": float,
    "cache_disk_gb": float,
    "seed_pool": int,
    "proxy_candidates": int,
    "floor": float,
    "size": int,
}
#: what a value of each of those types is called in a message
_TYPE_NAMES = {bool: "bool (true or false)", int: "a whole number", float: "a number"}


def _typed(section: str, key: str, value: Any, default: Any) -> Any:
    """Check ``value`` against the type of the field's default (ints pass for floats)."""
    if (section, key) in (("data", "probe_size"), ("finetune", "control")):
        return value  # more than one form: its one check reads the type
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if key in _OR_NONE:
        kind = _OR_NONE[key]
        kinds = (int, float) if kind is float else (kind,)
        right = isinstance(value, kinds) and isinstance(value, bool) == (kind is bool)
        if value is None or right:
            return None if value is None else kind(value)
        raise ConfigError(
            f"{section}.{key} must be {_TYPE_NAMES[kind]}, got {type(value).__name__} "
            f"{shorten(value)}"
        )
    if default is None:
        if value is None or isinstance(value, str):
            return value
        raise ConfigError(
            f"{section}.{key} must be a string, got {type(value).__name__} {shorten(value)}"
        )
    expected = type(default)
    if isinstance(default, bool) != isinstance(value, bool) or not isinstance(value, expected):
        raise ConfigError(
            f"{section}.{key} must be {expected.__name__}, got {type(value).__name__} "
            f"{shorten(value)}"
        )
    return value


def _key(key: Any) -> str:
    """A key as a message names it: as written, or quoted short when long or not a string."""
    return key if isinstance(key, str) and len(key) <= 80 else shorten(key)


def _section(cls: type, section: str, raw: Any) -> Any:
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ConfigError(f"section {section!r} must be a mapping, got {type(raw).__name__}")
    defaults = cls()
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(
            f"unknown key {section}.{_key(unknown[0])}; valid keys in {section}: "
            f"{', '.join(sorted(known))}"
        )
    values = {k: _typed(section, k, v, getattr(defaults, k)) for k, v in raw.items()}
    return cls(**values)


def _finetune_section(raw: Any) -> FinetuneSettings:
    """The ``finetune`` section: the stage's keys checked here, the recipe by the recipe."""
    recipe = raw.get("recipe") if isinstance(raw, dict) else None
    if recipe is not None and not isinstance(recipe, dict):
        raise ConfigError(f"finetune.recipe must be a mapping, got {type(recipe).__name__}")
    stage = {k: v for k, v in raw.items() if k != "recipe"} if isinstance(raw, dict) else raw
    out = _section(FinetuneSettings, "finetune", stage)
    if recipe is not None:
        out.recipe = FinetuneRecipe.from_dict(recipe)
    return out


def settings_from_dict(raw: Any, base: Path | None = None) -> Settings:
    """Check a whole configuration (as read from YAML) and return it as :class:`Settings`.

    Args:
        raw: the mapping with ``zoo``, ``data``, ``search`` and ``finetune`` sections.
        base: the folder relative paths start from (the YAML file's); None: as given, that
            is relative to the working directory. Paths are stored absolute.
    """
    from ._data_keys import check_data
    from ._values import check_settings
    from ._zoo_keys import check_zoo_item

    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(
            "the config file must hold a mapping with zoo/data/search/finetune sections"
        )
    sections = [f.name for f in fields(Settings)]
    unknown = sorted(set(raw) - set(sections))
    if unknown:
        raise ConfigError(
            f"unknown section {shorten(unknown[0])}; valid sections: {', '.join(sections)}"
        )
    settings = Settings(
        zoo=_section(ZooSettings, "zoo", raw.get("zoo")),
        data=_section(DataSettings, "data", raw.get("data")),
        search=_section(SearchSettings, "search", raw.get("search")),
        finetune=_finetune_section(raw.get("finetune")),
    )
    items = [check_zoo_item(item, i, base) for i, item in enumerate(settings.zoo.models)]
    settings.zoo.models = items
    names = [item["name"] for item in items]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"zoo.models has two models named {repeated[0]!r}; give each a name")
    check_settings(settings)  # each value's limits, before the data kind reads its files
    table = settings.search.latency.get("table")
    if isinstance(table, str) and base is not None:  # relative to the YAML file, as data.root
        settings.search.latency["table"] = str(base / Path(table).expanduser())
    given = set(raw.get("data") or {})
    check_data(settings.data, given, base)
    return settings


def load_settings(path: str | Path) -> Settings:
    """Read and check a YAML config file (see :func:`_read_yaml` for what it refuses)."""
    file = Path(path)
    return settings_from_dict(_read_yaml(file), file.resolve().parent)


def _read_yaml(file: Path) -> Any:
    """The YAML file ``file`` as plain data, read safely.

    Beyond ``yaml.safe_load``: anchors and aliases are refused (a few lines of them expand to
    gigabytes, and a settings file has no need of them), so is a key given twice in one
    mapping (YAML keeps the last one silently). Each error names the line and column.
    """
    import yaml

    if not file.is_file():
        raise ConfigError(f"config file {str(file)!r} does not exist; check the path")
    try:
        return yaml.load(file.read_text(encoding="utf-8"), Loader=_strict_loader())
    except UnicodeDecodeError:
        raise ConfigError(f"{file} is not a text file (not UTF-8); give a YAML file") from None
    except _Refused as exc:
        raise ConfigError(f"{file}{_at(exc.mark)}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "syntax error"
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(f"{file} is not valid YAML{_at(mark)}: {first[:200]}") from None


def _at(mark: Any) -> str:
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


_LOADER: Any = None


def _strict_loader() -> Any:
    """yaml.SafeLoader refusing anchors, aliases and repeated keys (built on first use: the
    CLI imports this module before it knows it reads YAML)."""
    global _LOADER
    if _LOADER is not None:
        return _LOADER
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                sign = "*" if isinstance(event, yaml.AliasEvent) else "&"
                raise _Refused(
                    f"YAML anchors and aliases ({sign}{event.anchor[:40]}) are not "
                    "accepted; write each value out",
                    event.start_mark,
                )
            return super().compose_node(parent, index)

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable key: the base class says so
                    continue
                if first is not key_node.start_mark:
                    raise _Refused(
                        f"key {shorten(key)} is given twice (first on line {first.line + 1}); "
                        "keep one",
                        key_node.start_mark,
                    )
            return super().construct_mapping(node, deep=deep)

    _LOADER = StrictLoader
    return _LOADER


class _Refused(Exception):
    """Valid YAML that a settings file may not hold, at ``mark``."""

    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem)
        self.problem, self.mark = problem, mark
