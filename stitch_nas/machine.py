"""What this machine has (its physical memory, which sets default budgets and data limits) and
what this process has used of it (its peak resident set, reported per phase of a run)."""

from __future__ import annotations

import os
import sys

__all__ = ["available_memory_bytes", "machine_memory_bytes", "peak_rss_bytes"]


def machine_memory_bytes() -> int:
    """Physical memory of this machine in bytes (0 where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return 0


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
