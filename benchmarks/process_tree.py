"""Peak memory of a command and of every process it starts, the object store's peak, and how
many of the machine's cores were busy between two readings (:func:`busy_jiffies`).

Ray starts its workers as grandchildren of the driver (through the raylet), so the driver's own
``ru_maxrss`` says nothing about them and ``RUSAGE_CHILDREN`` folds them into one number.
:class:`ProcessTree` polls ``/proc`` every ``interval`` seconds for the command's descendants and
keeps, per process, the kernel's own high-water mark (``VmHWM``: the peak resident set, not a
sample of it), so a short spike between two polls is still counted. The resident set also
counts the pages of files a process maps (a spill file it writes or reads through a memory
map), which the kernel writes back or drops under memory pressure; so the largest anonymous
resident set seen at a poll (``RssAnon``: memory nothing but swap could free) is kept beside it,
a sample that can miss a spike shorter than ``interval``. Ray's object store on Linux
is a memory-mapped file in ``/dev/shm`` whose pages, once written, stay allocated for the life of
the cluster: the folder's use at its largest is the store's peak (on a machine where nothing else
writes there; the starting use is subtracted).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ProcessTree", "busy_jiffies", "cores_busy", "run_measured"]


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process (``/proc/PID/stat``'s fourth field)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # the command name (second field) may hold spaces; it ends at the last ')'
            after = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # the process ended meanwhile
            continue
        parents[int(stat.parent.name)] = int(after[1])
    return parents


def _status(pid: int) -> tuple[str, int, int] | None:
    """(command name, VmHWM, RssAnon) of ``pid`` in bytes, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    hwm, anon = (int(fields.get(key, "0 kB").split()[0]) * 1024 for key in ("VmHWM", "RssAnon"))
    return fields.get("Name", "?").strip(), hwm, anon


def busy_jiffies() -> tuple[int, int] | None:
    """(busy, total) CPU time of the whole machine so far, in clock ticks; None off Linux."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


def cores_busy(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """How many of the machine's cores were busy between two :func:`busy_jiffies` readings
    (every process counts: meaningful on a machine where nothing else runs)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    share = (after[0] - before[0]) / (after[1] - before[1])
    return round(share * (os.cpu_count() or 1), 2)


def _shm_used() -> int:
    try:
        return shutil.disk_usage("/dev/shm").used
    except OSError:
        return 0


@dataclass
class ProcessTree:
    """Polls the descendants of ``root`` (and ``root``) until :meth:`stop`."""

    root: int
    interval: float = 0.2
    peaks: dict[int, tuple[str, int, int]] = field(default_factory=dict)  #: name, VmHWM, anon
    shm_start: int = field(default_factory=_shm_used)
    shm_peak: int = 0

    def __post_init__(self) -> None:
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._done.is_set():
            self.poll()
            self._done.wait(self.interval)

    def poll(self) -> None:
        children: dict[int, list[int]] = {}
        for pid, parent in _parents().items():
            children.setdefault(parent, []).append(pid)
        todo, seen = [self.root], set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            status = _status(pid)
            if status is not None:
                name, hwm, anon = status
                _, old_hwm, old_anon = self.peaks.get(pid, (name, 0, 0))
                self.peaks[pid] = (name, max(old_hwm, hwm), max(old_anon, anon))
            todo += children.get(pid, [])
        self.shm_peak = max(self.shm_peak, _shm_used())

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def summary(self) -> dict:
        """Each process's peak RSS and largest anonymous RSS seen in GB (largest peak first,
        by name), the command's own process's peak (a Ray driver's) and the object store's
        peak."""
        rows = sorted(self.peaks.values(), key=lambda row: -row[1])
        root = self.peaks.get(self.root)
        return {
            "root_peak_rss_gb": None if root is None else round(root[1] / 1e9, 3),
            "peak_rss_gb_per_process": [round(hwm / 1e9, 3) for _, hwm, _ in rows],
            "peak_anon_rss_gb_per_process": [round(anon / 1e9, 3) for _, _, anon in rows],
            "process_names": [name for name, _, _ in rows],
            "object_store_peak_gb": round(max(0, self.shm_peak - self.shm_start) / 1e9, 3),
        }


def run_measured(command: list[str], **kwargs) -> tuple[float, dict, str]:  # type: ignore[no-untyped-def]
    """Run ``command`` to its end (raising on failure); its wall seconds,
    :meth:`ProcessTree.summary` and its standard output (when ``stdout=subprocess.PIPE``,
    else ""). Processes whose peak stays under 50 MB (Ray's small helpers,
    shells) are left out of the per-process list; they are counted in ``processes_seen``."""
    start = time.perf_counter()
    process = subprocess.Popen(command, **kwargs)
    tree = ProcessTree(process.pid)
    output, _ = process.communicate()
    code = process.returncode
    tree.stop()
    seconds = time.perf_counter() - start
    if code != 0:
        raise subprocess.CalledProcessError(code, command)
    summary = tree.summary()
    big = [i for i, gb in enumerate(summary["peak_rss_gb_per_process"]) if gb >= 0.05]
    summary["processes_seen"] = len(summary["process_names"])
    for key in ("peak_rss_gb_per_process", "peak_anon_rss_gb_per_process", "process_names"):
        summary[key] = [summary[key][i] for i in big]
    return seconds, summary, output or ""
