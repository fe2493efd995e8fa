"""A search that joins a two-node Ray cluster by address and runs trials on both nodes.

The cluster is Ray's own test helper, ``ray.cluster_utils.Cluster``: a head and a second node
with one CPU each, on 127.0.0.1 only, torn down at the end. It runs in a child process because
Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (keep 127.0.0.1 addresses as they are rather
than rewrite them to the machine's outward address) when it is imported.
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

node = {"num_cpus": 1, "node_ip_address": "127.0.0.1"}
cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
try:
    cluster.add_node(**node)
    cluster.wait_for_nodes()
    objective = StitchObjective(tiny_context())
    study = create_study(objective, tempfile.mkdtemp(), sampler="random", seed=0)
    executor = RayExecutor(workers=2, address=cluster.address)
    run_search(objective, study, 12, executor=executor)
    print(json.dumps({
        "trial_nodes": [t.user_attrs.get(RAY_NODE) for t in study.trials],
        "per_node": executor.last_run["trials_per_node"],
        "states": [t.state.name for t in study.trials],
    }))
finally:
    ray.shutdown()
    cluster.shutdown()
"""


@pytest.mark.slow
def test_search_joins_a_two_node_cluster_and_runs_on_both_nodes():
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=420
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    per_node = result["per_node"]
    assert len(per_node) == 2 and all(count > 0 for count in per_node.values()), per_node
    ran = [n for n, s in zip(result["trial_nodes"], result["states"], strict=True) if n]
    assert set(ran) == set(per_node)  # every worker trial records the node it ran on
