"""The Ray executor: parallel trials, workers' own caches, failure isolation, kill-and-resume.

One local Ray (2 CPUs, no dashboard) serves the module; models are timm's tiny test models.
"""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import ray
import timm
import torch
from safetensors.torch import save_file

from stitch_nas import errors
from stitch_nas.activations import ActivationCache
from stitch_nas.config import StitchConfig
from stitch_nas.report import write_report
from stitch_nas.search import (
    RAY_NODE,
    RayExecutor,
    StitchObjective,
    StudyWorker,
    TrialOutcome,
    _loop,
    completed_count,
    create_study,
    evaluate_config,
    proxy_sampler,
    run_search,
)
from stitch_nas.search._ray_resources import context_bytes
from stitch_nas.snnet import SNNETS
from stitch_nas.stitching import Measurement
from tests._faults import FaultyWorker, NoReferenceWorker, NoTrainingWorker
from tests._tiny import tiny_context

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parents[1]
Complete, Fail = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL


@pytest.fixture(scope="module")
def ray_session():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def ctx():
    return tiny_context()


def _states(study: optuna.Study) -> list[str]:
    return [t.state.name for t in study.trials]


def test_ray_workers_fill_their_own_caches_and_record_what_the_local_executor_does(
    ray_session, tmp_path, monkeypatch
):
    # no memory budget and a spill folder the two workers share, as search.cache_dir gives them:
    # every activation goes to the folder (a small budget spilled only when the probe's
    # one-pass fill overflowed it, which it no longer does)
    ctx = tiny_context(cache=ActivationCache(memory_gb=0, spill_dir=tmp_path / "spill"))
    measure_all = {"fidelity": 0, "cka_threshold": 0.0, "probe_threshold": 0.0}  # untrained zoo
    put, stored = ray.put, []

    def put_and_keep(value, **options):  # what the driver puts in the object store
        stored.append(put(value, **options))
        return stored[-1]

    monkeypatch.setattr(ray, "put", put_and_keep)
    measured, measure = [], _loop.measure  # what this process, the driver, runs of a network

    def measure_and_count(*args, **kwargs):
        measured.append(args[1])
        return measure(*args, **kwargs)

    monkeypatch.setattr(_loop, "measure", measure_and_count)
    objective = StitchObjective(ctx, **measure_all)
    remote = create_study(objective, tmp_path / "ray", sampler="random", seed=2)
    executor = RayExecutor(workers=2)
    run_search(objective, remote, 4, executor=executor)

    assert completed_count(remote) == 4, _states(remote)
    # the zoo's models on their own were measured on the workers, not here
    assert measured == [] and len(remote.user_attrs["references"]) == len(ctx.zoo.names())
    assert executor.last_run["mode"] == "workers"  # a study in a file, Ray on this machine
    assert sum(executor.last_run["trials_per_node"].values()) == 4
    # the object store got the zoo and the images once, no activation; the driver computed none
    sizes = [loc["object_size"] for loc in ray.experimental.get_object_locations(stored).values()]
    assert len(sizes) == 1 and sizes[0] < context_bytes(ctx) + 2**20, sizes
    assert ctx.cache.stats()["misses"] == 0
    # each worker filled its own cache on demand, within the driver's budget, spilling to the
    # shared folder, where every spill file is whole
    for stats in executor.last_run["worker_cache"]:
        assert stats["misses"] > 0 and stats["budget_bytes"] == ctx.cache.budget_bytes, stats
        assert stats["peak_bytes"] <= stats["budget_bytes"], stats
    assert sum(stats["spilled_files"] for stats in executor.last_run["worker_cache"]) > 0
    spilled = {p.stem for p in (tmp_path / "spill").glob("*.npy")}
    assert spilled and spilled == {p.stem for p in (tmp_path / "spill").glob("*.json")}
    # the same configs run locally, with another cache, record the same values
    local_objective = StitchObjective(tiny_context(), **measure_all)
    local = create_study(local_objective, tmp_path / "local", sampler="random", seed=1)
    # a worker reads the others' configs at most once a second, so two workers may measure the
    # same config at once (a documented waste, see search/_seen.py): compare each config once
    firsts = {}
    for t in remote.trials:
        if "duplicate_of" not in t.user_attrs:
            firsts.setdefault(json.dumps(t.params, sort_keys=True), t)
    done = list(firsts.values())
    for trial in done:
        local.enqueue_trial(trial.params)
    run_search(local_objective, local, len(done))
    assert len(measured) == len(ctx.zoo.names())  # the local executor measures them here
    timed = {"fit_seconds", "eval_seconds"}
    for here, there in zip(*(s.user_attrs["references"] for s in (local, remote)), strict=True):
        assert {k: v for k, v in here.items() if k not in timed} == {
            k: v for k, v in there.items() if k not in timed
        }
    assert [t.params for t in local.trials] == [t.params for t in done]
    for here, there in zip(local.trials, done, strict=True):
        assert here.state == there.state == Complete and here.values == there.values
        for name in ("accuracy", "macs", "params", "sample_correct"):
            assert here.user_attrs[name] == there.user_attrs[name], name
        # a worker's forward passes run on one thread, here on several: float32 activations
        # differ in their last bits (about 1e-7), and CKA, summed in float64, by about 1e-9
        assert math.isclose(here.user_attrs["cka"], there.user_attrs["cka"], rel_tol=1e-6)
    # same report files, same columns, same user attributes as the local executor
    local_report, remote_report = write_report(local, tmp_path / "local"), None
    remote_report = write_report(remote, tmp_path / "ray")
    assert local_report.objectives == remote_report.objectives
    heads = []
    for folder in ("local", "ray"):
        with open(tmp_path / folder / "trials.csv") as handle:
            heads.append(next(csv.reader(handle)))
        pareto = json.loads((tmp_path / folder / "pareto.json").read_text())
        heads.append(sorted(pareto))
    assert heads[0] == heads[2] and heads[1] == heads[3]
    local_keys = {k for t in local.trials if t.state == Complete for k in t.user_attrs}
    remote_keys = {k for t in done for k in t.user_attrs}
    assert local_keys - {"duplicate_of"} <= remote_keys


def test_a_budget_below_one_batch_is_refused_on_the_driver_before_workers_start():
    from stitch_nas.search._ray_shared import share_context

    ctx = tiny_context(cache=ActivationCache(memory_gb=1e-6))  # the workers would all fail
    with pytest.raises(errors.ConfigError, match="is below one batch of"):
        share_context(ctx, put=lambda value: value)


def test_a_crashing_worker_and_a_raising_trial_do_not_stop_the_study(ray_session, ctx, tmp_path):
    objective = StitchObjective(ctx)
    study = create_study(objective, tmp_path / "run", sampler="random", seed=3)
    executor = RayExecutor(workers=2, worker_class=FaultyWorker)  # dies on 1, raises on 2
    run_search(objective, study, 5, executor=executor)
    assert completed_count(study) == 5, _states(study)
    crashed, raised = study.trials[1], study.trials[2]
    assert crashed.state == Fail and "worker died" in crashed.user_attrs["fail_reason"]
    assert raised.state == Fail and "trial 2 raises" in raised.user_attrs["fail_reason"]
    node = ray.get_runtime_context().get_node_id()
    assert all(t.user_attrs[RAY_NODE] == node for t in study.trials if t.state == Complete)
    assert executor.last_run["worker_restarts"] == 1
    assert executor.last_run["failed"] == 2


def test_a_worker_failing_to_measure_a_zoo_model_stops_the_search_before_any_trial(
    ray_session, ctx, tmp_path
):
    objective = StitchObjective(ctx)
    study = create_study(objective, tmp_path / "run", sampler="random", seed=3)
    executor = RayExecutor(workers=2, worker_class=NoReferenceWorker)
    with pytest.raises(errors.StitchNASError, match="measuring the zoo's models on the Ray"):
        run_search(objective, study, 2, executor=executor)
    assert study.trials == [] and "references" not in study.user_attrs


def test_a_joint_snnet_trains_once_on_the_driver_and_reaches_the_workers(ray_session, tmp_path):
    ctx = tiny_context()
    joint = {"steps": 12, "lr": 1e-3}
    objective = StitchObjective(ctx, space="snnet", space_options={"joint": joint})
    study = create_study(objective, tmp_path / "run", sampler="random", seed=0)
    executor = RayExecutor(workers=2, worker_class=NoTrainingWorker)
    run_search(objective, study, 4, executor=executor)

    assert completed_count(study) == 4 and executor.last_run["failed"] == 0, _states(study)
    trained = SNNETS.values(ctx)
    assert len(trained) == 1 and trained[0].report is not None  # trained here, once
    # the workers measured the driver's weights: a fresh context trains the same SN-Net
    done = [t for t in study.trials if t.state == Complete and "duplicate_of" not in t.user_attrs]
    assert done
    for trial in done:
        config = StitchConfig.from_dict(trial.user_attrs["config"])
        here = evaluate_config(ctx, config).measurement
        assert here is not None and math.isclose(here.accuracy, trial.values[0], abs_tol=1e-6)


def test_an_snnet_that_cannot_train_fails_its_trials_with_the_reason(ray_session, tmp_path):
    ctx = tiny_context()
    objective = StitchObjective(
        ctx, space="snnet", space_options={"joint": {"steps": 5, "lr": 1e30}}
    )
    study = create_study(objective, tmp_path / "run", sampler="random", seed=0)
    executor = RayExecutor(workers=1, max_failures_in_a_row=2)
    with pytest.raises(errors.StitchNASError, match="the last 2 trials all failed"):
        run_search(objective, study, 3, executor=executor)
    assert _states(study) == ["FAIL", "FAIL"]
    assert all("SN-Net" in t.user_attrs["fail_reason"] for t in study.trials)


def test_a_worker_that_dies_in_workers_mode_fails_only_its_trial(ray_session, ctx, tmp_path):
    died = tmp_path / "died"

    class DiesOnce(StudyWorker):  # defined here: Ray ships it by value, with ``died``
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            evaluate = StitchObjective.evaluate

            def dies_once(objective, *rest, **options):
                if not died.exists():  # the first evaluation of the search, in any worker
                    died.write_text("")
                    os._exit(17)  # as the OOM killer would end it
                return evaluate(objective, *rest, **options)

            StitchObjective.evaluate = dies_once

    objective = StitchObjective(ctx)
    study = create_study(objective, tmp_path / "run", sampler="random", seed=4)
    executor = RayExecutor(workers=2, mode="workers", worker_class=DiesOnce)
    run_search(objective, study, 5, executor=executor)

    assert completed_count(study) == 5, _states(study)
    failed = [t for t in study.trials if t.state == Fail]
    assert len(failed) == 1 and failed[0].user_attrs["fail_reason"].startswith("worker died")
    assert executor.last_run["failed"] == 1 and executor.last_run["worker_restarts"] == 1
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    node = ray.get_runtime_context().get_node_id()
    workers = {t.user_attrs["ray_worker"] for t in study.trials}
    assert len(workers) >= 2 and all(t.user_attrs[RAY_NODE] == node for t in study.trials)


def test_tickets_let_a_search_start_no_more_trials_than_its_total():
    from stitch_nas.search._ray_study_workers import _Tickets

    tickets = _Tickets(2)
    assert tickets.take("a") and tickets.take("b")
    assert not tickets.take("a")  # two workers reading the study at once cannot both pass
    tickets.give_back("a")  # a repeat or a failure does not count
    assert tickets.take("b") and not tickets.take("a")
    tickets.spend("b")
    tickets.release("b")  # b died holding one ticket: it is free again, the spent one is not
    assert tickets.take("a") and not tickets.take("a")


def test_in_workers_mode_too_many_failed_trials_stop_the_search(ray_session, tmp_path):
    ctx = tiny_context()  # every trial fails: its SN-Net cannot train at this learning rate
    options = {"joint": {"steps": 5, "lr": 1e30}}
    objective = StitchObjective(ctx, space="snnet", space_options=options)
    study = create_study(objective, tmp_path / "run", sampler="random", seed=0)
    executor = RayExecutor(workers=1, max_failures_in_a_row=2, mode="workers")
    with pytest.raises(errors.StitchNASError, match="the last 2 trials all failed"):
        run_search(objective, study, 3, executor=executor)
    assert _states(study) == ["FAIL", "FAIL"]
    assert all("SN-Net" in t.user_attrs["fail_reason"] for t in study.trials)


def test_the_ray_mode_follows_where_the_study_lives(ctx, tmp_path):
    objective = StitchObjective(ctx)
    on_file = create_study(objective, tmp_path / "run")
    in_memory = optuna.create_study(directions=objective.directions)
    assert RayExecutor().mode_for(objective, on_file) == "workers"
    resumed = create_study(objective, tmp_path / "run", resume=True)
    assert RayExecutor().mode_for(objective, resumed) == "workers"
    assert RayExecutor().mode_for(objective, in_memory) == "driver"
    journal = create_study(objective, tmp_path / "j", storage=str(tmp_path / "study.log"))
    assert RayExecutor().mode_for(objective, journal) == "driver"  # its ask and tell are cheap
    assert RayExecutor(mode="workers").mode_for(objective, journal) == "workers"
    # a cluster's other nodes may not see this machine's file
    assert RayExecutor(address="auto").mode_for(objective, on_file) == "driver"
    assert RayExecutor(mode="driver").mode_for(objective, on_file) == "driver"
    assert RayExecutor(worker_class=FaultyWorker).mode_for(objective, on_file) == "driver"
    joint = StitchObjective(ctx, space="snnet", space_options={"joint": True})
    assert RayExecutor().mode_for(joint, on_file) == "driver"  # its SN-Net is trained once
    with pytest.raises(errors.ConfigError, match="needs a study that every worker can open"):
        RayExecutor(mode="workers").mode_for(objective, in_memory)
    with pytest.raises(errors.ConfigError, match="mode='both' is unknown"):
        RayExecutor(mode="both")
    with pytest.raises(errors.ConfigError, match="derived from StudyWorker"):
        RayExecutor(mode="workers", worker_class=FaultyWorker)


USER_ARCH = """
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.conv2 = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(self.pool(self.conv2(self.conv1(x))).flatten(1))
"""


def test_a_model_class_from_a_module_path_folder_reaches_the_workers(ray_session, tmp_path):
    from stitch_nas.activations import StitchContext
    from stitch_nas.data import load_digits_splits
    from stitch_nas.zoo import from_module, import_factory, user_code_modules
    from tests._tiny import LABELS, SPEC, tiny_zoo

    folder = tmp_path / "archs"  # on this process's sys.path only, as module_path puts it
    folder.mkdir()
    (folder / "stitch_nas_test_user_arch.py").write_text(USER_ARCH)
    factory = import_factory("stitch_nas_test_user_arch:SmallCNN", str(folder))
    assert "stitch_nas_test_user_arch" in [m.__name__ for m in user_code_modules()]
    zoo = tiny_zoo(("resnet",))
    torch.manual_seed(0)
    zoo.add(from_module("mine", factory().eval(), input_spec=SPEC, label_names=LABELS))
    ctx = StitchContext(zoo, load_digits_splits(probe_size=64))
    objective = StitchObjective(ctx)
    study = create_study(objective, tmp_path / "run", sampler="random", seed=0)
    # the workers unpickle the zoo: without the module shipped by value they cannot start
    run_search(objective, study, 3, executor=RayExecutor(workers=1))
    assert completed_count(study) == 3, _states(study)
    assert not [t for t in study.trials if t.state == Fail]


def test_a_nan_result_is_recorded_as_failed_with_its_reason(ctx):
    objective = StitchObjective(ctx)
    study = optuna.create_study(directions=objective.directions)
    trial = study.ask()
    config = objective.sample(trial)
    nan = Measurement(accuracy=math.nan, macs=10, params=5, cka=0.5)
    state, values = objective.finish(trial, config, TrialOutcome("complete", measurement=nan))
    assert state == Fail and values is None
    assert "non-finite" in trial.user_attrs["fail_reason"]


def test_bad_executor_options_are_one_line_errors():
    with pytest.raises(errors.ConfigError, match="workers=0: give an integer >= 1"):
        RayExecutor(workers=0)
    with pytest.raises(errors.ConfigError, match="cpus_per_worker"):
        RayExecutor(cpus_per_worker=0)


TINY_SEARCH = """
zoo:
  mini_zoo: false
  models:
    - {{source: timm, model: test_resnet, weights: {dir}/resnet.safetensors, img_size: 32}}
    - {{source: timm, model: test_efficientnet, weights: {dir}/effnet.safetensors, img_size: 32}}
search:
  sampler: random
  cka_threshold: 0.0
  probe_threshold: 0.0  # untrained models: every stitch is at chance, none may be pruned
"""


def _write_tiny_search(folder: Path) -> Path:
    """A search file over two seeded timm test models, so every run loads the same weights."""
    for name, arch in [("resnet", "test_resnet"), ("effnet", "test_efficientnet")]:
        torch.manual_seed(0)
        model = timm.create_model(arch, pretrained=False, num_classes=10)
        save_file(model.state_dict(), folder / f"{name}.safetensors")
    path = folder / "search.yaml"
    path.write_text(TINY_SEARCH.format(dir=folder))
    return path


def _count(db: Path, state: str) -> int:
    try:
        with sqlite3.connect(db, timeout=1) as conn:
            row = conn.execute("SELECT count(*) FROM trials WHERE state = ?", (state,)).fetchone()
    except sqlite3.Error:  # not created yet, or locked by the writer
        return 0
    return int(row[0])


def test_killed_driver_resumes_keeping_completed_trials(tmp_path):
    config = _write_tiny_search(tmp_path)
    out, total = tmp_path / "run", 10
    command = [sys.executable, "-m", "stitch_nas.cli._main", "search", str(config)]
    command += ["--out", str(out), "--trials", str(total)]
    command += ["--executor", "ray", "--workers", "2", "--no-progress"]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    # trials 0.5 s slower, injected by the test's wrapper: time to kill the driver mid-search
    slow = [sys.executable, "-m", "tests._faults", "0.5", *command[3:]]
    # its own session, so that what the killed driver's Ray leaves behind can be cleaned up
    driver = subprocess.Popen(
        slow, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 240
        while _count(out / "study.db", "COMPLETE") < 3:
            if driver.poll() is not None:
                output = driver.stdout.read().decode() if driver.stdout else ""
                pytest.fail(f"the driver ended before it was killed: {output[-2000:]}")
            assert time.monotonic() < deadline, "no trial completed in time"
            time.sleep(0.1)
        driver.send_signal(signal.SIGKILL)  # the driver only, as an OOM kill would
        driver.wait()
    finally:
        try:  # Ray's node agents outlive a SIGKILLed driver: end them
            os.killpg(driver.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    before = optuna.load_study(study_name="run", storage=f"sqlite:///{out}/study.db")
    kept = {t.number: t.values for t in before.trials if t.state == Complete}
    running = [t.number for t in before.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert 3 <= len(kept) < total

    resumed = subprocess.run(command + ["--resume"], env=env, capture_output=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    after = optuna.load_study(study_name="run", storage=f"sqlite:///{out}/study.db")
    assert completed_count(after) == total
    for number, values in kept.items():
        assert after.trials[number].state == Complete and after.trials[number].values == values
    for number in running:
        assert after.trials[number].state == Fail
        assert after.trials[number].user_attrs["fail_reason"] == "driver stopped mid-trial"
    assert b"Pareto front" in resumed.stdout


def test_a_second_driver_joins_a_study_in_shared_storage(ctx, tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    first = StitchObjective(ctx)
    study = create_study(first, tmp_path / "a", sampler="random", storage=url)
    run_search(first, study, 2)
    second = StitchObjective(ctx)
    name = study.study_name
    with pytest.raises(errors.ConfigError, match=f"already holds a study named '{name}'"):
        create_study(second, tmp_path / "a", sampler="random", storage=url)
    joined = create_study(second, tmp_path / "a", sampler="random", seed=5, storage=url, join=True)
    assert completed_count(joined) == 2  # joined, without --resume, nothing marked FAIL
    run_search(second, joined, 4)
    assert completed_count(study) == 4
    with pytest.raises(errors.ConfigError, match="cannot open the study at storage"):
        create_study(first, tmp_path / "c", storage="nosuchdb://x")


def test_cli_executor_options_are_checked_before_any_work(capsys, tmp_path):
    from stitch_nas.cli import main

    out = str(tmp_path / "o")
    assert main(["demo", "--executor", "local", "--workers", "2", "--out", out]) == 2
    assert "--workers and --ray-address need --executor ray" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("search: {executor: dask}\n")
    assert main(["search", str(bad), "--out", out]) == 2
    assert "search.executor='dask' is unknown; use one of local, ray" in capsys.readouterr().err


def test_a_running_ray_answers_the_address_check(ray_session):
    """The handshake check_ray_address asks for is what a real GCS answers (tests/test_faults.py
    has the addresses where no Ray answers)."""
    from stitch_nas.search import check_ray_address

    check_ray_address(ray.get_runtime_context().gcs_address, 5.0)


def test_in_workers_mode_the_proxy_scores_candidates_on_each_workers_own_context(
    ray_session, ctx, tmp_path
):
    scored = tmp_path / "scored"
    scored.mkdir()

    class Records(StudyWorker):  # defined here: Ray ships it by value, with ``scored``
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            from stitch_nas.search import _proxy_sampler

            probe, worker = _proxy_sampler.probe_accuracy, self

            def recorded(on, config, *rest, **options):
                mark = "own" if on is worker.ctx else "shipped"  # the driver's, pickled
                (scored / f"{mark}-{os.getpid()}-{time.monotonic_ns()}").write_text("")
                return probe(on, config, *rest, **options)

            _proxy_sampler.probe_accuracy = recorded

    objective = StitchObjective(ctx, fidelity=0, probe_threshold=0.0)
    study = create_study(objective, tmp_path / "run", sampler="random", seed=3)
    study.sampler = proxy_sampler(objective, study.sampler, candidates=3, seed=3)
    executor = RayExecutor(workers=2, mode="workers", worker_class=Records)
    misses = ctx.cache.stats()["misses"]  # the module's context: earlier tests used it too
    run_search(objective, study, 4, executor=executor)

    assert completed_count(study) == 4, _states(study)
    marks = [p.name.split("-")[0] for p in scored.iterdir()]
    assert marks and set(marks) == {"own"}, marks  # the driver's context never travelled
    assert ctx.cache.stats()["misses"] == misses  # and the driver scored nothing itself


def test_joining_a_cluster_waits_for_its_address_as_long_as_the_settings_say(monkeypatch):
    """search.ray_connect_timeout_s holds when Ray starts as in the pre-flight check (the
    executor asked again with the default 10 s, so a slower cluster passed one, not the other)."""
    from stitch_nas.pipeline._executor import executor_from_settings
    from stitch_nas.search import _ray_executor
    from stitch_nas.settings import Settings

    search = Settings().search
    search.executor, search.ray_address, search.ray_connect_timeout_s = "ray", "10.0.0.1:6379", 42
    executor = executor_from_settings(search)
    asked = []

    def unreachable(address, timeout_s):
        asked.append((address, timeout_s))
        raise errors.ConfigError("no Ray there")

    monkeypatch.setattr(_ray_executor, "check_ray_address", unreachable)

    class NotStarted:
        is_initialized = staticmethod(lambda: False)

    with pytest.raises(errors.ConfigError, match="no Ray there"):
        executor._init_ray(NotStarted)
    assert asked == [("10.0.0.1:6379", 42)]
