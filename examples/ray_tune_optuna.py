"""Search stitched networks inside your own Ray Tune ``Tuner``, with Optuna as the searcher.

Run:  python examples/ray_tune_optuna.py              (the embedded digits mini zoo)
      python examples/ray_tune_optuna.py --tiny       (untrained timm test models: seconds)

Needs Ray Tune (pip install -e '.[ray]'). The space is define-by-run, the zoo, data and cached
activations go to the workers once through ``tune.with_parameters``, and the MAC budget reaches
Optuna as a constraint through ``StitchOptunaSearch``. Prints the Pareto front of feasible
networks.
"""

from __future__ import annotations

import argparse
import tempfile

import optuna
import ray
from ray import tune

import stitch_nas
from stitch_nas.data import load_digits_splits
from stitch_nas.search import StitchOptunaSearch, make_trainable
from stitch_nas.zoo import InputSpec, Zoo, from_timm


def tiny_zoo() -> Zoo:
    """Two untrained timm test models on 32x32 inputs (structure, not accuracy)."""
    spec = InputSpec(size=(32, 32), mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    zoo = Zoo()
    for arch in ("test_resnet", "test_efficientnet"):
        zoo.add(from_timm(arch, num_classes=10, input_spec=spec))
    return zoo


def main(argv: list[str] | None = None) -> optuna.Study:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="timm test models, untrained")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--concurrent", type=int, default=2, help="trials in flight")
    parser.add_argument("--macs-budget", type=float, default=2e6)
    parser.add_argument("--results", default=None, help="Tune's folder (default: a temp folder)")
    args = parser.parse_args(argv)

    ray.init(num_cpus=args.concurrent, include_dashboard=False, log_to_driver=False)
    data = load_digits_splits()
    if args.tiny:
        zoo = tiny_zoo()
    else:
        from stitch_nas.zoo import load_mini_zoo

        zoo = load_mini_zoo(data, progress=True)
    objective = stitch_nas.make_objective(
        zoo,
        data,
        objectives=["accuracy", "macs"],
        budgets={"macs": args.macs_budget},
        # untrained models predict at chance: pruning stitches that do would prune them all
        probe_threshold=0.0 if args.tiny else None,
    )
    searcher = StitchOptunaSearch(
        objective, sampler=optuna.samplers.TPESampler(seed=0, constant_liar=True)
    )
    tuner = tune.Tuner(
        tune.with_resources(make_trainable(objective), {"cpu": 1}),
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            num_samples=args.trials,
            max_concurrent_trials=args.concurrent,
            reuse_actors=True,  # each worker builds its context once, then reuses it
        ),
        run_config=tune.RunConfig(
            name="stitch_nas_tune",
            storage_path=args.results or tempfile.mkdtemp(prefix="stitch_nas_tune_"),
            verbose=0,
        ),
    )
    results = tuner.fit()
    study = searcher.study
    states = [t.state.name for t in study.trials]
    print(
        f"{len(results)} Tune trials: {states.count('COMPLETE')} complete, "
        f"{states.count('PRUNED')} pruned, {states.count('FAIL')} failed"
    )
    print(f"Pareto front (MACs budget {args.macs_budget:,.0f}): {len(study.best_trials)} networks")
    for trial in sorted(study.best_trials, key=lambda t: t.values[1]):
        print(
            f"#{trial.number:3d}  accuracy {trial.values[0]:.3f}  MACs {trial.values[1]:>11,.0f}  "
            f"{trial.user_attrs['describe']}"
        )
    ray.shutdown()
    return study


if __name__ == "__main__":
    main()
