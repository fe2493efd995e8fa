"""Plug stitch_nas into your own Optuna study: your sampler, your storage, your dashboard.

Run:  python examples/optuna_own_study.py  (uses the embedded digits zoo; no downloads)
"""

from __future__ import annotations

import optuna

import stitch_nas
from stitch_nas.data import load_digits_splits
from stitch_nas.zoo import load_mini_zoo


def main(n_trials: int = 20) -> optuna.Study:
    data = load_digits_splits()
    zoo = load_mini_zoo(data, progress=True)
    objective = stitch_nas.make_objective(
        zoo, data, space="pairwise", objectives=["accuracy", "macs"], probe_threshold=1.5
    )
    study = optuna.create_study(
        directions=objective.directions,  # ["maximize", "minimize"]
        sampler=optuna.samplers.NSGAIISampler(seed=0, population_size=10),
    )
    study.optimize(objective, n_trials=n_trials)
    for trial in study.best_trials:
        print(
            f"#{trial.number:3d}  accuracy {trial.values[0]:.3f}  MACs {trial.values[1]:,.0f}  "
            f"{trial.user_attrs['describe']}"
        )
    return study


if __name__ == "__main__":
    main()
