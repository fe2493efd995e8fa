"""What the machine has (its memory limit, a cgroup's included) and freed memory reused
(``machine.reuse_freed_memory``): fewer page faults, the same values, and freed memory kept
by a bounded number of heaps whatever the threads."""

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


def _child(mode: str, source: str = _CHILD) -> dict:
    """What the child process ``source`` printed last, run with argument ``mode``."""
    done = subprocess.run(
        [sys.executable, "-c", source, mode], capture_output=True, text=True, check=True
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


# a child process: eight threads, alive together, each allocate, fill and free a 32 MiB block in
# turn; returns how many blocks' worth of memory the process still holds once all are freed
_THREADS_CHILD = """
import ctypes, json, os, sys, threading
from stitch_nas.machine import reuse_freed_memory
assert reuse_freed_memory(arenas=int(sys.argv[1]))
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
SIZE, THREADS = 32 * 2**20, 8
page = os.sysconf("SC_PAGE_SIZE")
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
turn, started = threading.Lock(), threading.Barrier(THREADS)
def work():
    libc.free(libc.malloc(64))  # this thread's heap, chosen while all threads are alive
    started.wait()
    with turn:  # one block at a time: a heap that kept a freed block serves the next one
        block = libc.malloc(SIZE)
        libc.memset(block, 1, SIZE)
        libc.free(block)
before = resident()
threads = [threading.Thread(target=work) for _ in range(THREADS)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"kept_blocks": (resident() - before) / SIZE}))
"""


@pytest.mark.skipif(not GLIBC, reason="reuse_freed_memory sets glibc's allocator only")
def test_freed_memory_is_kept_by_at_most_the_set_number_of_heaps():
    def kept(arenas: int) -> float:
        return _child(str(arenas), _THREADS_CHILD)["kept_blocks"]

    # a heap per thread (glibc allows 8 per core) keeps each thread's freed block; two heaps
    # keep two blocks, each reused by the threads that share its heap (seen: 8.0 and 2.0)
    assert kept(64) > 6, kept(64)
    assert kept(machine.ARENAS) < machine.ARENAS + 1, kept(machine.ARENAS)


# a child process: eight 16 MiB blocks, each followed by a smaller block that stays, are filled
# and freed; how many blocks' worth of memory the process holds then, and after it releases what
# is free beyond argv[1] blocks
_RELEASE_CHILD = """
import ctypes, json, os, sys
from stitch_nas.machine import release_freed_memory, reuse_freed_memory
assert reuse_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
SIZE = 16 * 2**20
page = os.sysconf("SC_PAGE_SIZE")
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
before = resident()
blocks, pins = [], []
for _ in range(8):  # each block followed by a smaller one that stays
    blocks.append(libc.malloc(SIZE))
    libc.memset(blocks[-1], 1, SIZE)
    pins.append(libc.malloc(200000))
for block in blocks:
    libc.free(block)
kept = (resident() - before) / SIZE
released = release_freed_memory(keep=int(sys.argv[1]) * SIZE)
print(json.dumps({"kept_blocks": kept, "released": released,
                  "after_release": (resident() - before) / SIZE}))
"""


@pytest.mark.skipif(not GLIBC, reason="release_freed_memory calls glibc's malloc_trim")
def test_freed_memory_beyond_what_is_kept_goes_back_to_the_system():
    # the freed blocks lie between blocks in use, so the heap keeps them until released, and
    # it releases only when more than ``keep`` is free
    within, beyond = _child("16", _RELEASE_CHILD), _child("1", _RELEASE_CHILD)
    assert within["kept_blocks"] > 7 and not within["released"], within
    assert within["after_release"] > 7, within
    assert beyond["kept_blocks"] > 7 and beyond["released"], beyond
    assert beyond["after_release"] < 1, beyond


# the same child, the mark set for the whole process (as a driver that runs no trial may)
# rather than passed to the call
_MODULE_MARK_CHILD = _RELEASE_CHILD.replace(
    "released = release_freed_memory(keep=int(sys.argv[1]) * SIZE)",
    "import stitch_nas.machine as machine\n"
    "machine.RELEASED_ABOVE = int(sys.argv[1]) * SIZE\n"
    "released = release_freed_memory()",
)


@pytest.mark.skipif(not GLIBC, reason="release_freed_memory calls glibc's malloc_trim")
def test_a_process_may_set_its_own_mark():
    assert _MODULE_MARK_CHILD != _RELEASE_CHILD
    within, beyond = _child("16", _MODULE_MARK_CHILD), _child("1", _MODULE_MARK_CHILD)
    assert within["kept_blocks"] > 7 and not within["released"], within
    assert beyond["released"] and beyond["after_release"] < 1, beyond


# a child process: the blocks above are freed and released; then released again at once (the
# free lists still hold them, but none is resident), then filled and freed again and released
_RELEASE_AGAIN_CHILD = (
    _RELEASE_CHILD.rsplit("kept = ", 1)[0]
    + """
keep = SIZE
first = release_freed_memory(keep=keep)
again = release_freed_memory(keep=keep)
for i in range(8):  # the same blocks again: their pages come back from the system
    blocks[i] = libc.malloc(SIZE)
    libc.memset(blocks[i], 1, SIZE)
refilled = (resident() - before) / SIZE
for block in blocks:
    libc.free(block)
print(json.dumps({"first": first, "again": again, "refilled_blocks": refilled,
                  "after_refill": release_freed_memory(keep=keep),
                  "after_release": (resident() - before) / SIZE}))
"""
)


@pytest.mark.skipif(not GLIBC, reason="release_freed_memory calls glibc's malloc_trim")
def test_only_freed_memory_still_resident_counts_towards_a_release():
    # malloc_trim leaves the blocks it gave back on the free lists: a rule on free memory alone
    # would release again at every call (each a page fault per page for the next batch)
    out = _child("0", _RELEASE_AGAIN_CHILD)
    assert out["first"] and not out["again"], out
    assert out["refilled_blocks"] > 7, out  # reused: resident again
    assert out["after_refill"] and out["after_release"] < 1, out


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
