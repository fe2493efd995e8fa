"""What this machine has (its physical memory, or the lower limit of a container's cgroup, which
set default budgets and data limits), what this process has used of it (its peak resident set,
reported per phase of a run), and how it hands memory to tensors (:func:`reuse_freed_memory`)."""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "ARENAS",
    "CGROUP_MEMORY_FILES",
    "RELEASED_ABOVE",
    "REUSED_BYTES",
    "available_memory_bytes",
    "machine_memory_bytes",
    "memory_limit_bytes",
    "peak_rss_bytes",
    "release_freed_memory",
    "reuse_freed_memory",
]

#: blocks up to this size are kept by the allocator for reuse once freed, and at most this much
#: free memory is kept at the top of the heap before it goes back to the system
REUSED_BYTES = 256 * 2**20
#: freed memory the allocator may hold before :func:`release_freed_memory` gives it all back
RELEASED_ABOVE = 2**30
#: how many heaps (arenas) the allocator may keep: each keeps its own freed blocks, so this bounds
#: the freed memory a process holds, whatever its number of threads and cores
ARENAS = 2
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # glibc's mallopt (malloc.h)
#: where a container's memory limit is read: cgroup v2's ``memory.max`` ("max": none), then
#: cgroup v1's ``memory.limit_in_bytes`` (a number near 2**63 when there is none)
CGROUP_MEMORY_FILES = (
    "/sys/fs/cgroup/memory.max",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
)


def machine_memory_bytes() -> int:
    """Physical memory of this machine in bytes (0 where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return 0


def memory_limit_bytes(cgroup_files: Sequence[str | Path] = CGROUP_MEMORY_FILES) -> int:
    """The memory this process may use in bytes: the machine's physical memory, or the memory
    limit of its cgroup where that is lower (0 where neither is known).

    A container or a batch job sees the whole machine's memory in ``/proc`` yet is killed at
    its cgroup's limit, so budgets taken as a share of physical memory would overrun it.

    Args:
        cgroup_files: the files a limit is read from; missing or unreadable ones, and those that
            say "max" (no limit), are skipped.
    """
    limits = [machine_memory_bytes()]
    for path in cgroup_files:
        try:
            text = Path(path).read_text().strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text.isdigit():
            limits.append(int(text))
    known = [limit for limit in limits if limit > 0]
    return min(known, default=0)


def available_memory_bytes() -> int:
    """Memory this machine can give new processes now (Linux ``MemAvailable``), else its
    physical memory (0 where the OS says neither)."""
    try:
        with open("/proc/meminfo") as stream:
            for line in stream:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return machine_memory_bytes()


def peak_rss_bytes() -> int:
    """The largest resident set this process has had so far, in bytes (0 where the OS does not
    say)."""
    try:
        import resource
    except ImportError:  # Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # macOS: bytes, else KiB


class _MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2 (malloc.h, glibc 2.33 on)
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """glibc, loaded once (None under another C library): ``platform.libc_ver`` reads the
    Python executable's file, too slow for every pass."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    if hasattr(libc, "mallinfo2"):
        libc.mallinfo2.restype = _MallInfo2
    return libc


def reuse_freed_memory(largest: int = REUSED_BYTES, arenas: int = ARENAS) -> bool:
    """Have glibc's allocator reuse freed blocks up to ``largest`` bytes instead of returning
    each to the system; returns whether it applied (False on other C libraries).

    A CPU forward pass allocates a new output tensor at every layer: at a batch of 256 CIFAR
    images one is 4 to 75 MB. glibc maps a block that large afresh from the system and unmaps it
    when freed, so every layer's output is new memory, and the page faults on it cost as much
    as the layer's arithmetic for cheap layers: a MobileNet with GELU and depthwise convolutions
    ran 1.97x faster with freed blocks reused, a CIFAR ResNet-56 1.00x, on a 2-core CPU
    (``benchmarks/allocator.py``, ``benchmarks/results/allocator.json``). Only where memory comes
    from changes, so every value computed is the same.
    What it costs: up to ``largest`` bytes of freed memory stay with the process (its resident
    set) instead of going back to the system; blocks larger than ``largest`` (a cached
    activation of a whole split) are still mapped and unmapped as before.
    glibc gives threads their own heaps (up to 8 per core: 16 on 2 cores, 512 on 64), and each
    heap keeps its own freed blocks, so the freed memory kept grows with the threads that ever
    allocated. At most ``arenas`` heaps are used instead (tested: eight threads that each free
    a 32 MiB block leave eight blocks' memory with the process under glibc's rule, two here).

    The command line calls it once per process (and Ray workers in theirs); a Python program
    that runs a search may call it at its start.
    """
    libc = _glibc()
    if libc is None:
        return False
    size = ctypes.c_int(min(int(largest), 2**31 - 1))
    return all(
        libc.mallopt(parameter, value)
        for parameter, value in (
            (_M_MMAP_THRESHOLD, size),
            (_M_TRIM_THRESHOLD, size),
            (_M_ARENA_MAX, ctypes.c_int(max(1, int(arenas)))),
        )
    )


def release_freed_memory(keep: int | None = None) -> bool:
    """Give the system back the freed memory glibc's heaps hold (``malloc_trim``) once more
    than ``keep`` bytes of it is resident (None: :data:`RELEASED_ABOVE`, read at each call, so
    a process may set its own mark); returns whether it did.

    :func:`reuse_freed_memory` keeps freed blocks for the next batch, but a heap only returns
    its free top to the system: a freed block with a block in use above it stays resident. Over
    passes of different models, whose layers free blocks of other sizes, those holes add up: in
    an ImageNet-size search (``benchmarks/imagenet_scale.py``, 1,000 validation images) the
    heaps held 0.8 to 1.6 GB free beside 0.6 to 1.5 GB in use (``mallinfo2``), and the process
    peaked at 3.79 GB and ran 66.3 trials an hour; releasing everything free at the end of
    every pass once 256 MiB was, 3.36 GB and 70.6 trials an hour (one run each).

    Holes also add up within one pass, batch after batch, so the passes call this after every
    batch, not only at their end: in the sixteen-trial search of that benchmark (one thread,
    sampled every 0.25 s) one pass's free memory grew from 1.45 to 2.49 GB while the memory in
    use stayed at 2.3 GB. What is resident is what counts: ``malloc_trim`` leaves
    the blocks it gave back on the heap's free lists (``mallinfo2`` still counts them free), so
    the free memory still resident is estimated as the process's anonymous resident set less
    the heap's memory in use less what was resident beside the heap right after the last
    release; until the first release all free memory counts as resident.

    ``malloc_trim`` gives back every free page, not only what is beyond ``keep``, and the next
    batch takes the same memory from the system again, a page fault per page. So ``keep`` is
    well above what one pass frees: at 256 MiB (of free memory, resident or not, checked at the
    end of each pass), the real-zoo search (``examples/realzoo.yaml`` at 140 trials without
    refining; probe passes of 256 images, slices of 750) released about 1,230 times in 320 s,
    its trials took 172 and 169 s and its seeding 90 and 89 s (two runs); at 1 GiB it released
    none, and took 144 and 147 s, 83 and 81 s, the same trials, peaking at 6.1 GB instead of
    5.7 GB. The 1,000-image ImageNet-size search above peaked at 3.69 GB at 1 GiB (3.44 GB at
    256 MiB, another day).
    """
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):  # mallinfo2: glibc 2.33 on
        return False
    info = libc.mallinfo2()
    in_use, anonymous = info.uordblks + info.hblkhd, _anonymous_resident_bytes()
    if anonymous == 0:  # /proc unreadable: count all free memory as resident
        resident_free = info.fordblks
    else:
        if _BESIDE_HEAP[0] is None:
            _BESIDE_HEAP[0] = anonymous - in_use - info.fordblks
        resident_free = anonymous - in_use - _BESIDE_HEAP[0]
    if resident_free <= (RELEASED_ABOVE if keep is None else keep):
        return False
    libc.malloc_trim(0)
    _BESIDE_HEAP[0] = _anonymous_resident_bytes() - in_use
    return True


#: this process's anonymous resident memory outside glibc's heaps' blocks in use, as of its
#: last release (None: none yet); see :func:`release_freed_memory`
_BESIDE_HEAP: list[int | None] = [None]


def _anonymous_resident_bytes() -> int:
    """This process's anonymous resident set (``/proc/self/statm``: resident less the pages of
    files and shared memory) in bytes; 0 where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as stream:
            fields = stream.read().split()
        return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
