"""A fast zoo of untrained timm test models, for tests that need structure, not accuracy."""

from __future__ import annotations

import timm
import torch

from stitch_nas.activations import StitchContext
from stitch_nas.data import load_digits_splits
from stitch_nas.zoo import InputSpec, Zoo, ZooEntry

LABELS = tuple(str(i) for i in range(10))
SPEC = InputSpec(size=(32, 32), mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
ARCHS = {
    "resnet": ("test_resnet", {}),
    "efficientnet": ("test_efficientnet", {}),
    "vit": ("test_vit", {"img_size": 32, "patch_size": 4}),
}


def tiny_swin() -> torch.nn.Module:
    """A Swin small enough for tests: 32x32 input, NHWC cut points, three stages."""
    from timm.models.swin_transformer import SwinTransformer

    return SwinTransformer(
        img_size=32,
        patch_size=2,
        window_size=4,
        embed_dim=16,
        depths=(1, 1, 1),
        num_heads=(1, 2, 2),
        num_classes=10,
    )


def tiny_zoo(names=tuple(ARCHS)) -> Zoo:
    zoo = Zoo()
    for name in names:
        arch, kwargs = ARCHS[name]
        torch.manual_seed(0)
        model = timm.create_model(arch, pretrained=False, num_classes=10, **kwargs).eval()
        zoo.add(
            ZooEntry(
                name=name, model=model, input_spec=SPEC, label_names=LABELS, source=f"timm:{arch}"
            )
        )
    return zoo


def tiny_context(**kwargs) -> StitchContext:
    return StitchContext(tiny_zoo(), load_digits_splits(probe_size=64), **kwargs)
