"""Studies as Optuna users run them: names, resume and join, optuna-dashboard, journal files,
several drivers on one PostgreSQL server, one of them killed mid-trial, and Ray workers that
open a PostgreSQL study themselves.

The PostgreSQL fixture starts a throwaway server (PostgreSQL's own ``initdb`` and ``pg_ctl``,
found on the PATH or under ``/usr/lib/postgresql/<major>/bin`` by ``tests._postgres``) in a
temporary folder, listening on 127.0.0.1 at a free port and on a unix socket in that folder, with
trust authentication and ``fsync=off`` (nothing in it outlives the test). initdb refuses to run as
root, so as root the folder is handed to the ``nobody`` user and the server runs as ``nobody``
through ``runuser``. The server is stopped (``-m immediate``) and the folder removed after the
test. Without initdb, pg_ctl, runuser (as root) or psycopg the tests skip and say which is
missing and where it was looked for.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import optuna
import pytest
import timm
import torch
from safetensors.torch import save_file

from stitch_nas import attrs, errors
from stitch_nas.search import (
    LEGACY_STUDY_NAME,
    StitchObjective,
    completed_count,
    create_study,
    load_folder_study,
    run_search,
)
from tests._postgres import server_programs
from tests._tiny import tiny_context

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parents[1]
Complete, Fail, Running = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.FAIL,
    optuna.trial.TrialState.RUNNING,
)


@pytest.fixture(scope="module")
def ctx():
    return tiny_context()


# --- names, resume, join -------------------------------------------------------------------


def test_study_is_named_after_its_folder_and_names_its_objectives(ctx, tmp_path):
    objective = StitchObjective(ctx, objectives=["accuracy", "macs", "params"])
    study = create_study(objective, tmp_path / "cifar_run", sampler="random")
    assert study.study_name == "cifar_run"
    assert study.metric_names == ["accuracy", "macs", "params"]
    named = create_study(objective, tmp_path / "other", sampler="random", study_name="mine")
    assert named.study_name == "mine"
    assert load_folder_study(tmp_path / "other").study_name == "mine"


def test_a_taken_name_is_refused_unless_resumed_or_joined(ctx, tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    objective = StitchObjective(ctx)
    first = create_study(objective, tmp_path / "a", sampler="random", storage=url)
    run_search(objective, first, 2)
    # another folder, same default name "a"? no: another folder "b" gets its own study
    other = create_study(objective, tmp_path / "b", sampler="random", storage=url)
    assert other.study_name == "b" and completed_count(other) == 0
    with pytest.raises(errors.ConfigError, match=r"already holds a study named 'a'; pass --resume"):
        create_study(objective, tmp_path / "a", storage=url)
    joined = create_study(objective, tmp_path / "x", storage=url, study_name="a", join=True)
    assert completed_count(joined) == 2
    with pytest.raises(errors.ConfigError, match="holds no study named 'nope'"):
        create_study(objective, tmp_path / "x", storage=url, study_name="nope", resume=True)
    with pytest.raises(errors.ConfigError, match=r"optimises \['accuracy', 'macs'\]"):
        create_study(
            StitchObjective(ctx, objectives=["accuracy"]), tmp_path / "a", storage=url, join=True
        )


def test_a_folder_written_before_studies_had_names_resumes(ctx, tmp_path):
    out = tmp_path / "old_run"
    out.mkdir()
    objective = StitchObjective(ctx)
    old = optuna.create_study(  # what earlier versions wrote: one study called "stitch_nas"
        storage=f"sqlite:///{out / 'study.db'}",
        study_name=LEGACY_STUDY_NAME,
        directions=objective.directions,
    )
    old.set_user_attr("objectives", objective.names)
    old.optimize(objective, n_trials=2)
    with pytest.raises(errors.ConfigError, match="already holds a study"):
        create_study(objective, out)
    resumed = create_study(objective, out, sampler="random", resume=True)
    assert resumed.study_name == LEGACY_STUDY_NAME
    assert resumed.metric_names == objective.names  # named on the way
    run_search(objective, resumed, 3)
    assert completed_count(load_folder_study(out)) == 3


def test_a_users_own_study_gets_metric_names_from_the_objective(ctx):
    objective = StitchObjective(ctx)
    study = optuna.create_study(directions=objective.directions)
    study.optimize(objective, n_trials=1)
    assert study.metric_names == ["accuracy", "macs"]
    named = optuna.create_study(directions=objective.directions)
    named.set_metric_names(["acc", "cost"])  # the user's own names are kept
    named.optimize(StitchObjective(ctx), n_trials=1)
    assert named.metric_names == ["acc", "cost"]


# --- journal file: several drivers on one machine, no server ----------------------------------


def test_two_drivers_share_a_journal_file(ctx, tmp_path):
    journal = str(tmp_path / "study.log")
    studies = [
        create_study(
            StitchObjective(ctx),
            tmp_path / f"d{i}",
            sampler="random",
            seed=i,
            storage=journal,
            study_name="shared",
            join=True,
        )
        for i in range(2)
    ]
    errors_seen: list[BaseException] = []

    def drive(study: optuna.Study) -> None:
        try:
            run_search(StitchObjective(ctx), study, 6)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors_seen.append(exc)

    threads = [threading.Thread(target=drive, args=(s,)) for s in studies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors_seen, errors_seen
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    storage = JournalStorage(JournalFileBackend(journal))  # as a third process would open it
    reread = optuna.load_study(study_name="shared", storage=storage)
    assert completed_count(reread) >= 6
    assert reread.metric_names == ["accuracy", "macs"]


# --- optuna-dashboard --------------------------------------------------------------------------


def test_optuna_dashboard_reads_the_objective_names(ctx, tmp_path):
    dashboard = pytest.importorskip(
        "optuna_dashboard",
        reason="optuna-dashboard is not installed (pip install -e '.[dashboard]')",
    )
    import json
    import urllib.request
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    objective = StitchObjective(ctx)
    study = create_study(objective, tmp_path / "demo", sampler="random")
    run_search(objective, study, 3)

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: object) -> None:  # no access log on stderr
            pass

    app = dashboard.wsgi(f"sqlite:///{tmp_path / 'demo' / 'study.db'}")
    server = make_server("127.0.0.1", 0, app, handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_port}/api/studies"
        with urllib.request.urlopen(base, timeout=30) as response:
            listed = json.load(response)["study_summaries"]
        assert [s["study_name"] for s in listed] == ["demo"]
        with urllib.request.urlopen(f"{base}/{listed[0]['study_id']}", timeout=30) as response:
            detail = json.load(response)
    finally:
        server.shutdown()
        server.server_close()
    assert detail["objective_names"] == ["accuracy", "macs"]
    assert len(detail["trials"]) == 3


# --- PostgreSQL: two drivers, one SIGKILLed mid-trial ------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL server; yields its URL (see the module docstring)."""
    programs = server_programs()
    if isinstance(programs, str):
        pytest.skip(programs)
    initdb, pg_ctl = programs
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[postgres]')")
    as_user: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="stitch_nas_pg_"))
    if os.geteuid() == 0:  # initdb refuses root: the server runs as nobody
        # runuser lives in sbin, which a non-login PATH (a CI runner's) may leave out
        search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
        runuser = shutil.which("runuser", path=search)
        if runuser is None:
            shutil.rmtree(root)
            pytest.skip("running as root and runuser is missing: initdb cannot run as root")
        nobody = pwd.getpwnam("nobody")
        os.chown(root, nobody.pw_uid, nobody.pw_gid)
        as_user = [runuser, "-u", "nobody", "--"]
    data, port = root / "data", _free_port()

    def run(*command: str) -> None:
        done = subprocess.run([*as_user, *command], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{command[:2]} failed: {done.stderr[-1000:]}"

    try:
        run(initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        options = f"-h 127.0.0.1 -p {port} -k {root} -c fsync=off -c max_connections=50"
        run(pg_ctl, "-D", str(data), "-l", str(root / "server.log"), "-w", "-o", options, "start")
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            run(pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _programs(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for name in ("initdb", "pg_ctl"):
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    return folder


def test_postgresql_programs_are_found_where_debian_and_ubuntu_put_them(tmp_path):
    """Not on the PATH: the newest ``<root>/<major>/bin`` holding both wins (Debian, Ubuntu)."""
    root, empty = tmp_path / "usr/lib/postgresql", str(tmp_path / "empty")
    _programs(root / "9.6/bin")
    newest = _programs(root / "16/bin")
    (root / "17/bin").mkdir(parents=True)  # a client-only install: no server programs
    (root / "17/bin/pg_ctl").write_text("#!/bin/sh\n")
    _programs(root / "15/bin")
    found = server_programs(path=empty, roots=[tmp_path / "absent", root])
    assert found == (str(newest / "initdb"), str(newest / "pg_ctl"))
    # the PATH comes first
    on_path = _programs(tmp_path / "bin")
    assert server_programs(path=str(on_path), roots=[root]) == (
        str(on_path / "initdb"),
        str(on_path / "pg_ctl"),
    )
    # none anywhere: the skip reason says where they were looked for
    missing = server_programs(path=empty, roots=[tmp_path / "absent"])
    assert isinstance(missing, str) and "neither on the PATH nor in" in missing
    assert f"{tmp_path / 'absent'}/<version>/bin" in missing


SEARCH = """
zoo:
  mini_zoo: false
  models:
    - {{source: timm, model: test_resnet, weights: {dir}/resnet.safetensors, img_size: 32}}
    - {{source: timm, model: test_efficientnet, weights: {dir}/effnet.safetensors, img_size: 32}}
search:
  sampler: random
  cka_threshold: 0.0
  probe_threshold: 0.0  # untrained models: every stitch is at chance, none may be pruned
  export: false
  heartbeat_s: 1
"""


def _tiny_search(folder: Path) -> Path:
    for name, arch in [("resnet", "test_resnet"), ("effnet", "test_efficientnet")]:
        torch.manual_seed(0)
        save_file(
            timm.create_model(arch, num_classes=10).state_dict(), folder / f"{name}.safetensors"
        )
    path = folder / "search.yaml"
    path.write_text(SEARCH.format(dir=folder))
    return path


def test_two_drivers_on_postgresql_survive_one_killed_mid_trial(postgres, tmp_path):
    config, total = _tiny_search(tmp_path), 12
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def driver(name: str, delay_s: float) -> subprocess.Popen:
        command = [sys.executable, "-m", "tests._faults", str(delay_s), "-q", "search", str(config)]
        command += ["--out", str(tmp_path / name), "--trials", str(total), "--storage", postgres]
        command += ["--study-name", "shared", "--join"]
        log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    # the test reads through one storage (one connection pool); psycopg 3 is the driver
    storage = optuna.storages.RDBStorage(postgres.replace("postgresql:", "postgresql+psycopg:"))
    victim, survivor = driver("victim", 1.5), driver("survivor", 0.4)
    try:
        deadline = time.monotonic() + 240
        while True:  # both drivers at work, the victim in the middle of a trial
            assert victim.poll() is None, (tmp_path / "victim.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the drivers did not start in time"
            time.sleep(0.3)
            try:
                study = optuna.load_study(study_name="shared", storage=storage)
            except KeyError:
                continue
            trials = study.get_trials(deepcopy=False)
            running = [t for t in trials if t.state == Running]
            # every running trial sampled (its config recorded), new (a repeat of an earlier
            # config is pruned at once, without the delay) and started under a second ago: the
            # victim's lasts at least 1.5 s, so it is still under way when the kill lands (a
            # busy machine could otherwise let it finish between this look and it)
            fresh = all(
                attrs.CONFIG in t.user_attrs
                and attrs.PRUNE_REASON not in t.user_attrs
                and t.datetime_start is not None
                and (datetime.now() - t.datetime_start).total_seconds() < 1.0
                for t in running
            )
            if sum(t.state == Complete for t in trials) >= 2 and len(running) == 2 and fresh:
                break
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        at_kill = optuna.load_study(study_name="shared", storage=storage).get_trials()
        assert survivor.wait(timeout=240) == 0, (tmp_path / "survivor.log").read_text()[-2000:]
    finally:
        for process in (victim, survivor):
            if process.poll() is None:
                process.kill()
                process.wait()
    after = optuna.load_study(study_name="shared", storage=storage)
    assert after.metric_names == ["accuracy", "macs"]
    assert completed_count(after) == total, [t.state.name for t in after.trials]
    complete = {t.number: t.values for t in at_kill if t.state == Complete}
    for number, values in complete.items():  # no COMPLETE trial lost or changed
        assert after.trials[number].state == Complete and after.trials[number].values == values
    running = [after.trials[t.number] for t in at_kill if t.state == Running]
    killed = [t for t in running if t.state == Fail]
    # the victim's trial, failed by the survivor's fail_stale_trials (our own failures write a
    # fail_reason; a heartbeat failure has none), and the survivor's finished normally
    assert len(killed) == 1, [(t.number, t.state.name) for t in running]
    assert "fail_reason" not in killed[0].user_attrs
    assert "config" in killed[0].user_attrs  # it was sampled and under way when killed
    assert not [t for t in after.trials if t.state == Running]
    storage.engine.dispose()


def test_ray_workers_open_a_postgresql_study_themselves(postgres, ctx, tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    from stitch_nas.search import RayExecutor

    objective = StitchObjective(ctx)
    study = create_study(objective, tmp_path / "run", sampler="random", seed=0, storage=postgres)
    executor = RayExecutor(workers=2)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        run_search(objective, study, 4, executor=executor)
    finally:
        ray.shutdown()

    assert executor.last_run["mode"] == "workers"  # a database server every worker reaches
    assert completed_count(study) == 4, [t.state.name for t in study.trials]
    ran = [t for t in study.trials if t.state != Running and "ray_worker" in t.user_attrs]
    assert len(ran) >= 4 and not [t for t in study.trials if t.state == Running]
    assert sum(executor.last_run["trials_per_node"].values()) >= 4


# --- secrets -------------------------------------------------------------------------------

PASSWORD = "s3cret-Pw-4711"


def _with_password(url: str) -> str:
    # the server trusts every connection, so any password opens it
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{PASSWORD}@")


def test_no_storage_password_is_shown_in_output_files_or_the_study(postgres, tmp_path):
    config, out = _tiny_search(tmp_path), tmp_path / "run"
    url = _with_password(postgres)
    unreachable = f"postgresql://postgres:{PASSWORD}@127.0.0.1:1/postgres"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    shown = []
    commands = [
        ["-v", "search", str(config), "--out", str(out), "--trials", "2", "--storage", url],
        ["-v", "report", str(out), "--storage", url, "--no-test"],
        # refused: the study exists; a server that cannot be reached
        ["search", str(config), "--out", str(tmp_path / "again" / "run"), "--storage", url],
        ["search", str(config), "--out", str(tmp_path / "c"), "--storage", unreachable],
    ]
    codes = []
    for argv in commands:
        proc = subprocess.run(
            [sys.executable, "-c", _CONSOLE, *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        codes.append(proc.returncode)
        shown += [proc.stdout, proc.stderr]
    assert codes[:2] == [0, 0], shown[-4:]
    assert codes[2:] == [2, 2], shown[4:]
    assert "***" in shown[-1] and "127.0.0.1" in shown[-1]  # named, password masked
    shown += [p.read_text(errors="replace") for p in out.rglob("*") if p.is_file()]
    storage = optuna.storages.RDBStorage(postgres.replace("postgresql:", "postgresql+psycopg:"))
    study = optuna.load_study(study_name="run", storage=storage)
    shown += [repr(study.user_attrs), repr([t.user_attrs for t in study.trials])]
    storage.engine.dispose()
    assert study.user_attrs["settings"]["search"]["storage"].count("***") == 1
    leaked = [text[max(0, text.find(PASSWORD) - 80) :][:200] for text in shown if PASSWORD in text]
    assert not leaked, leaked


def test_shown_url_masks_the_password_only():
    from stitch_nas.search import shown_url

    assert shown_url("postgresql://u:pw@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert shown_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert shown_url("mysql://u@h/db?password=pw&x=1") == "mysql://u@h/db?password=***&x=1"
    assert shown_url("runs/study.log") == "runs/study.log"
    assert shown_url("postgresql://u:pw@h/db", "bad URL 'postgresql://u:pw@h/db'") == (
        "bad URL 'postgresql://u:***@h/db'"
    )


# what the stitch-nas console script runs, without needing it on PATH
_CONSOLE = "import sys; from stitch_nas.cli import main; sys.exit(main(sys.argv[1:]))"
