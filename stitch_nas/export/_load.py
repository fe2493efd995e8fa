"""Exported networks as modules: rebuild from ``stitch.json`` + weights, no zoo, no pickle.

An export describes each network by a JSON *recipe*: its StitchConfig, how each joint was made
(separate adapter, or fused into the next layer), its head, and for every source model the
architecture to create (timm/torchvision name and arguments). :func:`assemble` turns a recipe
into the same module structure that :func:`stitch_nas.stitching.build` produced in the search —
fragments from :class:`~stitch_nas.fragments.PieceChain`, adapters from their constructors — so the
saved state dict loads strictly and the outputs are those of the measured network.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from stitch_nas.activations import is_convolutional
from stitch_nas.adapters import FusedStitch, LinearStitch, fuse_into_segment
from stitch_nas.config import AdapterSpec, StitchConfig
from stitch_nas.errors import BudgetError, ConfigError, IntegrityError
from stitch_nas.fragments import CutPoint, PieceChain
from stitch_nas.stitching import NETWORKS, Preprocess, StitchedNet, head_from_recipe
from stitch_nas.zoo import create_architecture

from ._files import load_weights, verify_checksums
from ._signing import check_signature

__all__ = ["ExportedNet", "ElasticNet", "assemble", "joint_recipes", "load", "FORMAT_VERSION"]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1


class ExportedNet(nn.Module):
    """A stitched network plus its head: ``[0, 1]`` images in, class scores out.

    Attributes:
        net: the stitched body (preprocessing, fragments, adapters).
        head: the fitted k-NN / linear-probe head, or None when the last model's own
            classifier makes the predictions.
        label_names: the class of each output score.
        metrics: what the search measured (accuracy, params, MACs, ...).
    """

    def __init__(
        self,
        net: StitchedNet,
        head: nn.Module | None,
        label_names: tuple[str, ...],
        metrics: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.net, self.head = net, head
        self.label_names = tuple(label_names)
        self.metrics = dict(metrics or {})
        self.eval()  # a new Module starts in train mode; its parts are inference-only

    @property
    def config(self) -> StitchConfig:
        return self.net.config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.net(x)
        return y if self.head is None else self.head(y)


class ElasticNet(nn.Module):
    """Several stitched networks sharing their fragments; one is active at a time.

    ``select`` switches the active network at run time to meet a budget (SN-Net's promise),
    ``configs`` lists them with the metrics the search measured.
    """

    def __init__(self, networks: Mapping[str, ExportedNet]) -> None:
        super().__init__()
        if not networks:
            raise ConfigError("an elastic package needs at least one network")
        self.networks = nn.ModuleDict(dict(networks))
        self.eval()
        self.active = max(networks, key=lambda n: networks[n].metrics.get("accuracy", 0.0))

    def configs(self) -> list[dict[str, Any]]:
        """Each network: name, one-line description, StitchConfig dict and its metrics."""
        rows = []
        for name, module in self.networks.items():
            net = cast(ExportedNet, module)
            rows.append(
                {
                    "name": name,
                    "describe": net.config.describe(),
                    "config": net.config.to_dict(),
                    **net.metrics,
                }
            )
        return rows

    def select(
        self,
        *,
        trial: int | str | None = None,
        max_macs: float | None = None,
        max_params: float | None = None,
    ) -> str:
        """Make one network active and return its name.

        Args:
            trial: a trial number or network name to pick directly.
            max_macs: pick the most accurate network with at most this many MACs.
            max_params: ... and at most this many parameters.

        Raises:
            ConfigError: an unknown trial, or no argument at all.
            BudgetError: no network meets the budgets.
        """
        if trial is not None:
            name = trial if isinstance(trial, str) else f"trial_{trial}"
            if name not in self.networks:
                have = ", ".join(self.networks)
                raise ConfigError(f"no network {name!r} in this package; it has {have}")
            self.active = name
            return name
        if max_macs is None and max_params is None:
            raise ConfigError("select() needs trial=, max_macs= or max_params=")
        rows = self.configs()
        fits = [
            r
            for r in rows
            if (max_macs is None or r["macs"] <= max_macs)
            and (max_params is None or r["params"] <= max_params)
        ]
        if not fits:
            cheapest = min(rows, key=lambda r: (r["macs"], r["params"]))
            raise BudgetError(
                f"no network meets max_macs={max_macs}, max_params={max_params}; the cheapest "
                f"is {cheapest['name']} with {cheapest['macs']} MACs, {cheapest['params']} params"
            )
        self.active = max(fits, key=lambda r: r["accuracy"])["name"]
        return self.active

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.networks[self.active](x)


def joint_recipes(net: StitchedNet) -> list[dict[str, Any]]:
    """How each joint of a built network was made: fused or not, and a fused bias map's shape."""
    joints = []
    for part, (key, _) in zip(net.parts, net.part_info, strict=True):
        if key[0] == "fused":
            fused = next(m for m in part.modules() if isinstance(m, FusedStitch))
            bias_map = cast("torch.Tensor | None", fused.bias_map)
            shape = None if bias_map is None else list(bias_map.shape)
            joints.append({"fused": True, "bias_map": shape})
        elif key[0] != "fragment":
            joints.append({"fused": False, "bias_map": None})
    return joints


def _empty_adapter(spec: AdapterSpec, src: CutPoint, dst: CutPoint) -> nn.Module:
    """The adapter's structure: ``create`` with the same arguments gives the same state dict."""
    from stitch_nas import adapters

    if spec.kind in NETWORKS:  # a stitching layer of a jointly trained network (SN-Net's)
        return NETWORKS.get(spec.kind).layer(spec, src, dst)
    return adapters.create(spec.kind, src, dst, **dict(spec.options))


def _split_first(seg: nn.Module) -> tuple[Any, list[nn.Module]]:
    pieces = list(seg) if isinstance(seg, nn.Sequential) else [seg]
    return pieces[0], pieces[1:]


def _fused_joint(stitch: LinearStitch, seg: nn.Module, bias_map: list[int] | None) -> nn.Module:
    head, rest = _split_first(seg)
    fused = fuse_into_segment(stitch, head)
    if bias_map is not None:  # the buffer exists only when conv(b) varies with position
        fused.get_submodule("stitch_fused").bias_map = torch.zeros(bias_map)
    return nn.Sequential(fused, *rest) if rest else fused


def assemble(recipe: Mapping[str, Any], chains: Mapping[str, PieceChain]) -> StitchedNet:
    """The empty network ``recipe`` describes, built from the source models in ``chains``."""
    config = StitchConfig.from_dict(recipe["config"])
    copies = set(recipe.get("own_copies", ()))

    def fragment(chain: PieceChain, start: str | None, end: str | None, index: int) -> nn.Module:
        # fine-tuned fragments get pieces of their own; the others share the source model
        seg = chain.fragment(start, end)
        return copy.deepcopy(seg) if index in copies else seg

    first = config.fragments[0]
    chain = chains[first.model]
    parts: list[nn.Module] = [fragment(chain, None, first.end, 0)]
    info: list[tuple[tuple[Any, ...], tuple[int, ...]]] = [
        (("fragment", first.model, None, first.end), chain.input_shape[1:])
    ]
    x_cut = chain.cut(first.end) if first.end else None
    joints = recipe["joints"]
    for adapter, frag, joint in zip(config.adapters, config.fragments[1:], joints, strict=True):
        if x_cut is None or frag.start is None:  # StitchConfig rules these out
            raise IntegrityError(f"joint before {frag} in stitch.json has no cut point")
        chain = chains[frag.model]
        dst = chain.cut(frag.start)
        stitch = _empty_adapter(adapter, x_cut, dst)
        seg = fragment(chain, frag.start, frag.end, len(parts) + 1)  # index after the adapter
        src_key = (x_cut.layout, x_cut.shape, x_cut.prefix_tokens)
        if joint["fused"]:
            if not isinstance(stitch, LinearStitch):
                raise IntegrityError(f"stitch.json fuses a {adapter.kind!r} adapter")
            parts.append(_fused_joint(stitch, seg, joint["bias_map"]))
            info.append((("fused", frag.model, frag.start, frag.end, src_key), x_cut.shape))
        else:
            dst_key = (dst.layout, dst.shape, dst.prefix_tokens)
            parts += [stitch, seg]
            info.append((("stitch", type(stitch).__name__, src_key, dst_key), x_cut.shape))
            info.append((("fragment", frag.model, frag.start, frag.end), dst.shape))
        x_cut = chain.cut(frag.end) if frag.end else None
    spec = recipe["input_spec"]
    preprocess = Preprocess(tuple(spec["size"]), tuple(spec["mean"]), tuple(spec["std"]))
    return StitchedNet(config, preprocess, parts, info)


def _source_chains(
    sources: Mapping[str, Any], modules: Mapping[str, nn.Module]
) -> dict[str, PieceChain]:
    chains = {}
    for name, source in sources.items():
        if name in modules:
            model = modules[name].eval()
        elif source.get("architecture") is None:
            raise ConfigError(
                f"model {name!r} was a user module, which JSON cannot recreate; pass it: "
                f"stitch_nas.load(path, modules={{{name!r}: YourModel()}})"
            )
        else:
            try:
                model = create_architecture(source["architecture"])
            except ConfigError as exc:  # a kwarg off the allow-list: not what export writes
                raise IntegrityError(f"stitch.json, source model {name!r}: {exc}") from exc
        if is_convolutional(model):  # as in the search: same arithmetic, and faster on CPU
            model.to(memory_format=torch.channels_last)
        chains[name] = PieceChain(model, tuple(source["input_shape"]))
    return chains


def _network(recipe: Mapping[str, Any], chains: Mapping[str, PieceChain]) -> ExportedNet:
    net = assemble(recipe, chains)
    head = head_from_recipe(recipe.get("head"))
    return ExportedNet(net, head, tuple(recipe["label_names"]), recipe.get("metrics"))


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise IntegrityError(f"{str(path)!r} is missing; is this a stitch_nas export folder?")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"{str(path)!r} is not valid JSON ({exc})") from exc


def load(
    path: str | Path | None = None,
    *,
    modules: Mapping[str, nn.Module] | None = None,
    require_signature: bool | None = None,
    artifact_id: str | None = None,
    artifact_store: Any = None,
) -> ExportedNet | ElasticNet:
    """Rebuild an exported network (or elastic package) from its folder, or from the Optuna
    artifact an export uploaded (``artifact_id`` and ``artifact_store``).

    Reads ``stitch.json`` and ``model.safetensors`` after checking both against the sha256 in
    ``meta.json``; creates each source architecture from its timm/torchvision recipe (no
    weights downloaded, nothing unpickled, only allow-listed keyword arguments) and loads the
    saved weights strictly. When ``STITCH_NAS_EXPORT_KEY`` is set, the folder's signature is
    verified first and every file ``meta.json`` lists is checked.

    Args:
        path: an export folder (``.../models/<name>``) holding meta.json.
        artifact_id: instead of ``path``, the id of the archive an export uploaded
            (``--artifacts``, ``export_study(artifact_store=...)``); the study user attribute
            ``artifacts`` maps folder names to ids, and
            ``optuna.artifacts.get_all_artifact_meta(study)`` lists them. It is unpacked into
            a temporary folder (members outside it, links and devices refused) and loaded
            from there as a folder is.
        artifact_store: with ``artifact_id``: the ``--artifacts`` folder, or an Optuna
            artifact store (``FileSystemArtifactStore``, ``Boto3ArtifactStore``, ...).
        modules: instances for source models that were user modules, by zoo name.
        require_signature: None: a signature is required exactly when the key is set.
            False: load an unsigned folder even with the key set. True: refuse an unsigned
            folder, or any folder when the key is not set.

    Raises:
        IntegrityError: a missing, tampered or mismatched file, a signature that does not
            match, or a missing one where it is required; an archive member outside it.
        ConfigError: both or neither of ``path`` and ``artifact_id``, or an artifact id the
            store does not hold.
    """
    if (path is None) == (artifact_id is None):
        raise ConfigError(
            "load() takes a folder, or artifact_id= and artifact_store=; give exactly one"
        )
    if artifact_id is not None:
        if artifact_store is None:
            raise ConfigError("load(artifact_id=...) needs artifact_store= too")
        from ._artifacts import unpacked

        with unpacked(artifact_id, artifact_store) as folder:  # removed once loaded
            return load(folder, modules=modules, require_signature=require_signature)
    folder = Path(str(path)).expanduser()  # not None: exactly one of the two was given
    meta = _read_json(folder / "meta.json")
    signed = check_signature(folder, require_signature)
    files = meta.get("files", {})
    needed = {name: files.get(name) for name in ("stitch.json", "model.safetensors")}
    if None in needed.values():
        raise IntegrityError(
            f"{folder}/meta.json lists no sha256 for stitch.json or model.safetensors"
        )
    # a verified signature vouches for every file meta.json lists (the graph formats too)
    verify_checksums(folder, files if signed else cast(dict[str, str], needed))
    recipe = _read_json(folder / "stitch.json")
    if recipe.get("format") != FORMAT_VERSION:
        raise IntegrityError(
            f"{folder}/stitch.json has format {recipe.get('format')!r}; this stitch_nas reads "
            f"format {FORMAT_VERSION}; install the version that wrote it"
        )
    chains = _source_chains(recipe["sources"], modules or {})
    module: ExportedNet | ElasticNet
    if "networks" in recipe:
        module = ElasticNet({n: _network(r, chains) for n, r in recipe["networks"].items()})
    else:
        module = _network(recipe, chains)
    load_weights(module, folder / "model.safetensors")
    return module.eval()
