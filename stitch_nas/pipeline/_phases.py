"""How long each phase of a run took and how much memory the process had used by its end, kept
on the study (``attrs.PHASES``) and printed as one line, so a user sees where a run's time went
and a benchmark can read it back from the study."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from stitch_nas import attrs
from stitch_nas.machine import peak_rss_bytes

__all__ = ["PhaseClock"]


class PhaseClock:
    """Times the phases of one run; the first began when the clock was made."""

    def __init__(self) -> None:
        self.phases: dict[str, dict[str, float]] = {}
        self._start = time.perf_counter()
        self._study: Any = None

    def mark(self, name: str) -> None:
        """End the phase ``name``, which began where the last one ended."""
        now = time.perf_counter()
        self.phases[name] = {
            "seconds": round(now - self._start, 2),
            "peak_rss_gb": round(peak_rss_bytes() / 1e9, 3),
        }
        self._start = now
        if self._study is not None:  # after each phase: a run that fails later keeps the rest
            self._study.set_user_attr(attrs.PHASES, self.phases)

    def record_on(self, study: Any) -> None:
        """Keep the phases on ``study`` from now on (the first ones ran before it existed)."""
        self._study = study
        study.set_user_attr(attrs.PHASES, self.phases)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """``with clock.phase("seeding"): ...`` times the block as the phase ``name``."""
        self._start = time.perf_counter()
        yield
        self.mark(name)

    def describe(self) -> str:
        parts = [f"{name} {row['seconds']:.1f} s" for name, row in self.phases.items()]
        total = sum(row["seconds"] for row in self.phases.values())
        peak = max((row["peak_rss_gb"] for row in self.phases.values()), default=0.0)
        return f"phases: {', '.join(parts)}; {total:.1f} s in all, peak memory {peak:.2f} GB"
