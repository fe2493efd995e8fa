"""A sampler class of the tests' own, named on the command line as ``tests._samplers:...``."""

from __future__ import annotations

from typing import Any

import optuna


class RecordingSampler(optuna.samplers.RandomSampler):
    """Random sampling that records how it was made and how often it was asked."""

    made: list[dict[str, Any]] = []  #: the keyword arguments of each instance, in order
    asked = 0  #: independent samples drawn, over all instances

    def __init__(self, seed: int | None = None, *, note: str = "none") -> None:
        super().__init__(seed=seed)
        RecordingSampler.made.append({"seed": seed, "note": note})

    def sample_independent(self, *args: Any, **kwargs: Any) -> Any:
        RecordingSampler.asked += 1
        return super().sample_independent(*args, **kwargs)


class Picky(optuna.samplers.RandomSampler):
    """Refuses a value, as a sampler's own check of its arguments would."""

    def __init__(self, *, width: int = 1) -> None:
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        super().__init__()


class Broken(optuna.samplers.RandomSampler):
    """A sampler whose constructor fails whatever it is given."""

    def __init__(self) -> None:
        raise RuntimeError("no backend here")


NOT_A_CLASS = 3
