"""The sampler of a search: built-in names, ``module:Class`` with options, one-line refusals."""

from __future__ import annotations

import inspect
import subprocess
import sys

import optuna
import pytest

from stitch_nas.cli import main
from stitch_nas.errors import ConfigError
from stitch_nas.samplers import (
    CONSTRAINED,
    SAMPLERS,
    check_sampler,
    make_sampler,
    resolve_sampler,
)

from ._samplers import RecordingSampler

CLASSES = {
    "tpe": optuna.samplers.TPESampler,
    "nsga2": optuna.samplers.NSGAIISampler,
    "nsga3": optuna.samplers.NSGAIIISampler,
    "gp": optuna.samplers.GPSampler,
    "qmc": optuna.samplers.QMCSampler,
    "random": optuna.samplers.RandomSampler,
}


def _first_params(sampler: optuna.samplers.BaseSampler) -> list[dict]:
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    for _ in range(3):
        trial = study.ask()
        x = trial.suggest_float("x", 0.0, 1.0)
        trial.suggest_categorical("model", ["a", "b", "c"])
        study.tell(trial, (x, 1.0 - x))
    return [t.params for t in study.trials]


@pytest.mark.parametrize("name", SAMPLERS)
def test_each_builtin_name_is_its_optuna_sampler_and_the_seed_decides(name):
    assert set(SAMPLERS) == set(CLASSES)
    sampler = make_sampler(name, 3)
    assert type(sampler) is CLASSES[name]
    assert _first_params(make_sampler(name, 3)) == _first_params(make_sampler(name, 3))


def test_the_constrained_builtins_are_those_whose_class_reads_constraints():
    """Optuna 5 reads ``trial.set_constraint`` values (the budgets) in the samplers that took
    ``constraints_func`` before; the docs say which built-ins ignore budgets when sampling."""
    takes = {n for n, c in CLASSES.items() if "constraints_func" in inspect.signature(c).parameters}
    assert takes == set(CONSTRAINED)


def test_nsga_generations_are_sized_from_the_trials_unless_the_options_say():
    assert make_sampler("nsga2", 0, trials=200)._population_size == 40  # five generations
    assert make_sampler("nsga3", 0, trials=20)._population_size == 8  # at least 8
    assert make_sampler("nsga2", 0, {"population_size": 6}, trials=200)._population_size == 6
    assert make_sampler("tpe", 0, trials=200) is not None  # others take no population
    # a child's parameters mutate one time in ten, not Optuna's 1 / (shared parameters)
    assert make_sampler("nsga2", 0)._child_generation_strategy._mutation_prob == 0.1


def test_options_replace_the_defaults_and_reach_the_class():
    sampler = make_sampler("nsga3", 0, {"population_size": 6})
    assert sampler._population_size == 6
    assert make_sampler("nsga2", 0)._population_size == 16
    sampler = make_sampler("tests._samplers:RecordingSampler", 7, {"note": "hi"})
    assert isinstance(sampler, RecordingSampler)
    assert RecordingSampler.made[-1] == {"seed": 7, "note": "hi"}
    # a class without a seed gets none; Optuna's own classes by path work too
    assert type(make_sampler("tests._samplers:Picky", 0, {"width": 2})).__name__ == "Picky"
    assert type(make_sampler("optuna.samplers:CmaEsSampler", 0)) is optuna.samplers.CmaEsSampler


@pytest.mark.parametrize(
    "spec, options, named",
    [
        ("cmaes", None, "'cmaes'"),
        ("no_such_module_x:Sampler", None, "'no_such_module_x'"),
        ("tests._samplers:Missing", None, "'Missing'"),
        ("tests._samplers:NOT_A_CLASS", None, "'NOT_A_CLASS'"),
        ("optuna:Study", None, "'Study'"),
        ("tests._samplers:", None, "package.module:Class"),
        ("nsga2", {"population_sise": 4}, "'population_sise'"),
        ("tests._samplers:Picky", {"width": 0}, "width must be >= 1"),
        ("tests._samplers:Broken", None, "could not be built (RuntimeError: no backend here)"),
        ("tests._samplers:Broken", {"x": 1}, "takes no 'x'"),
        ("gp", {"seed": 1}, "search.seed"),
        ("random", [1], "mapping"),
    ],
)
def test_a_bad_spec_is_one_line_naming_it(spec, options, named):
    with pytest.raises(ConfigError) as info:
        check_sampler(spec, options)
    message = str(info.value)
    assert named in message and "\n" not in message, message


def test_a_builtin_name_without_options_is_checked_without_optuna():
    code = (
        "import sys; from stitch_nas.samplers import check_sampler; check_sampler('gp'); "
        "print('optuna' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr
    with pytest.raises(ConfigError, match="unknown sampler 'gq'"):
        resolve_sampler("gq")


@pytest.mark.parametrize(
    "spec, named",
    [
        ("no_such_module_x:Sampler", "no_such_module_x"),
        ("tests._samplers:Missing", "Missing"),
        ("optuna:Study", "Study"),
    ],
)
def test_a_bad_sampler_path_is_exit_2_before_torch(tmp_path, spec, named):
    code = (
        "import sys; from stitch_nas.cli import main; code = main(sys.argv[1:]); "
        "print('torch' in sys.modules); sys.exit(code)"
    )
    out = tmp_path / "out"
    argv = ["demo", "--sampler", spec, "--out", str(out)]
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and named in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and done.stdout.strip() == "False"
    assert not out.exists()


def _demo(capsys, tmp_path, mini_zoo_dir, *flags):
    out = tmp_path / "demo"
    argv = ["demo", "--out", str(out), "--cache-dir", str(mini_zoo_dir), "--no-progress"]
    code = main([*argv, "--no-export", *flags])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return out, captured.out


def test_the_demo_runs_with_the_gp_sampler(capsys, tmp_path, mini_zoo, mini_zoo_dir):
    # 8 seeded trials, then GP's 10 random startup trials are done by trial 10: the last two
    # trials are proposed by the Gaussian process
    out, stdout = _demo(capsys, tmp_path, mini_zoo_dir, "--sampler", "gp", "--trials", "12")
    assert (out / "pareto.json").is_file() and "hypervolume" in stdout
    study = optuna.load_study(study_name="demo", storage=f"sqlite:///{out / 'study.db'}")
    assert study.user_attrs["settings"]["search"]["sampler"] == "gp"


def test_the_demo_runs_with_a_sampler_class_of_ones_own(capsys, tmp_path, mini_zoo, mini_zoo_dir):
    RecordingSampler.made.clear()
    before = RecordingSampler.asked
    spec = "tests._samplers:RecordingSampler"
    out, stdout = _demo(
        capsys, tmp_path, mini_zoo_dir, "--sampler", spec, "--trials", "10", "--seed", "5"
    )
    assert (out / "pareto.json").is_file() and "hypervolume" in stdout
    assert RecordingSampler.made and RecordingSampler.made[-1]["seed"] == 5
    assert RecordingSampler.asked > before  # the search's trials were sampled by it
