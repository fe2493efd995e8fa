"""What the machine has (its memory limit, a cgroup's included) and freed memory reused
(``machine.reuse_freed_memory``): fewer page faults, the same values."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from stitch_nas import machine
from stitch_nas.cli import _main

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# a child process (the allocator's setting holds for a whole process): the minor page faults of
# the second to fifth forward pass of a small conv net over one batch (each layer's output is a
# 16 MB tensor), and a digest of its output
_CHILD = """
import hashlib, json, resource, sys
import torch
from stitch_nas.machine import reuse_freed_memory
applied = reuse_freed_memory() if sys.argv[1] == "reused" else None
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.GELU(),
                          torch.nn.Conv2d(32, 32, 3, padding=1, groups=32), torch.nn.GELU())
x = torch.randn(128, 3, 32, 32)
faults = []
with torch.no_grad():
    for _ in range(5):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        out = net(x)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": sum(faults[1:]),
                  "digest": hashlib.sha256(out.numpy().tobytes()).hexdigest()}))
"""


def _child(mode: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="reuse_freed_memory sets glibc's allocator only")
def test_freed_blocks_are_reused_and_values_stay_the_same():
    default, reused = _child("default"), _child("reused")
    assert reused["applied"] is True
    # glibc's default maps 16 MB outputs afresh and faults on their pages (~4,096 each), and its
    # mmap threshold moves as blocks are freed, so how many a pass varies (24,515 to about 65,000
    # faults in four passes, seen); reused, at most one block a pass: no more than four blocks'
    # faults in four passes (with slack), and at least one block's fewer than the default's
    assert default["faults"] > 4 * 4096, default
    assert reused["faults"] <= 4 * 4096 + 1024, (reused, default)
    assert default["faults"] - reused["faults"] > 4096, (reused, default)
    assert reused["digest"] == default["digest"]


def test_the_command_line_reuses_freed_memory_before_any_command(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(_main, "reuse_freed_memory", lambda: calls.append(True) or True)
    assert _main.main(["report", str(tmp_path / "no_search_here")]) == 2  # a command that fails
    assert calls == [True]


def test_the_memory_limit_is_the_lowest_of_physical_memory_and_cgroup_limits(tmp_path):
    physical = machine.machine_memory_bytes()
    assert physical > 0
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    v2.write_text(f"{physical // 4}\n")  # a container's limit
    v1.write_text("9223372036854771712\n")  # cgroup v1's "no limit"
    assert machine.memory_limit_bytes([v2, v1]) == physical // 4
    assert machine.memory_limit_bytes([v1]) == physical
    v2.write_text("max\n")  # cgroup v2's "no limit"
    assert machine.memory_limit_bytes([v2, tmp_path / "missing"]) == physical
    v1.write_text(f"{physical // 2}")
    assert machine.memory_limit_bytes([v2, v1]) == physical // 2
    assert machine.memory_limit_bytes([]) == physical
    assert machine.memory_limit_bytes() <= physical  # this machine's own files, if any
