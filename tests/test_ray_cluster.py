"""A search that joins a Ray cluster by address and runs its trials there.

The cluster is Ray's own test helper, ``ray.cluster_utils.Cluster``: a head (and, in the slow
variant, a second node), one CPU each, on 127.0.0.1 only, no dashboard, torn down at the end.
It runs in a child process because Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (keep
127.0.0.1 addresses as they are rather than rewrite them to the machine's outward address) when
it is imported, and the suite has imported Ray long before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys, tempfile
from ray.cluster_utils import Cluster
import ray
from stitch_nas.search import RAY_NODE, RayExecutor, StitchObjective, create_study, run_search
from tests._tiny import tiny_context

nodes, workers, trials = (int(a) for a in sys.argv[1:4])
joined = []  # the address each ray.init in this process was given (Ray also finds a running
init = ray.init  # local cluster by itself, so where the trials ran does not show it alone)
ray.init = lambda *args, **kwargs: joined.append(kwargs.get("address")) or init(*args, **kwargs)
node = {"num_cpus": 1, "node_ip_address": "127.0.0.1"}
cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
try:
    for _ in range(nodes - 1):
        cluster.add_node(**node)
    cluster.wait_for_nodes()
    objective = StitchObjective(tiny_context())
    study = create_study(objective, tempfile.mkdtemp(), sampler="random", seed=0)
    executor = RayExecutor(workers=workers, address=cluster.address)
    run_search(objective, study, trials, executor=executor)
    print(json.dumps({
        "address": cluster.address,
        "joined": joined,
        "cluster_nodes": [n.node_id for n in cluster.list_all_nodes()],
        "trial_nodes": [t.user_attrs.get(RAY_NODE) for t in study.trials],
        "per_node": executor.last_run["trials_per_node"],
        "mode": executor.last_run["mode"],
        "states": [t.state.name for t in study.trials],
    }))
finally:
    ray.shutdown()
    cluster.shutdown()
"""


def _search_on_a_cluster(nodes: int, workers: int, trials: int) -> dict:
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(nodes), str(workers), str(trials)],
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_search_joins_a_one_node_cluster_by_address():
    """The fast variant: one node, one worker, three trials, all run on the cluster joined
    (not on a Ray the executor started itself, whose node would be another)."""
    result = _search_on_a_cluster(nodes=1, workers=1, trials=3)
    assert result["joined"] == [result["address"]], result  # the executor joined by address
    assert result["mode"] == "driver"  # a study in a file, a cluster given by address
    (head,) = result["cluster_nodes"]
    assert set(result["per_node"]) == {head} and sum(result["per_node"].values()) >= 3, result
    ran = [n for n in result["trial_nodes"] if n]
    assert ran and set(ran) == {head}, result
    assert "FAIL" not in result["states"], result


@pytest.mark.slow
def test_search_joins_a_two_node_cluster_and_runs_on_both_nodes():
    result = _search_on_a_cluster(nodes=2, workers=2, trials=12)
    per_node = result["per_node"]
    assert result["joined"] == [result["address"]], result
    assert len(per_node) == 2 and all(count > 0 for count in per_node.values()), per_node
    assert set(per_node) == set(result["cluster_nodes"])
    ran = [n for n, s in zip(result["trial_nodes"], result["states"], strict=True) if n]
    assert set(ran) == set(per_node)  # every worker trial records the node it ran on
