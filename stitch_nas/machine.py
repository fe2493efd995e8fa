"""What this machine has: its physical memory, which sets default budgets and data limits."""

from __future__ import annotations

import os

__all__ = ["machine_memory_bytes"]


def machine_memory_bytes() -> int:
    """Physical memory of this machine in bytes (0 where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return 0
