"""Where PostgreSQL's server programs are: the one place every PostgreSQL test looks for them.

``initdb`` and ``pg_ctl`` are on the PATH where a package or a user put them there, but Debian and
Ubuntu install them only under ``/usr/lib/postgresql/<major>/bin`` (their ``postgresql`` package
puts wrappers for the client programs on the PATH, not these). So both places are searched: the
PATH first, then the newest major version under each distribution folder.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

#: folders holding one ``<major>/bin`` per installed PostgreSQL version (Debian, Ubuntu)
VERSIONED_ROOTS = ("/usr/lib/postgresql",)
PROGRAMS = ("initdb", "pg_ctl")


def _major(folder: Path) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in folder.name.split("."))
    except ValueError:
        return (-1,)


def server_programs(
    path: str | None = None, roots: Sequence[str | Path] = VERSIONED_ROOTS
) -> tuple[str, str] | str:
    """``(initdb, pg_ctl)`` from one installation, or, when there is none, a line saying where
    they were looked for (for the skip reason). ``path``: the PATH to search (None: this
    process's)."""
    on_path = [
        shutil.which(p, path=path if path is not None else os.environ.get("PATH")) for p in PROGRAMS
    ]
    if all(on_path):
        return on_path[0], on_path[1]  # type: ignore[return-value]
    for root in map(Path, roots):
        if not root.is_dir():
            continue
        for version in sorted(root.iterdir(), key=_major, reverse=True):
            found = [shutil.which(p, path=str(version / "bin")) for p in PROGRAMS]
            if all(found):
                return found[0], found[1]  # type: ignore[return-value]
    where = ", ".join(f"{r}/<version>/bin" for r in roots)
    return f"PostgreSQL's initdb and pg_ctl are neither on the PATH nor in {where}"
