"""Which code a benchmark measured: the commit each results file and row records."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def commit() -> str:
    """The checkout's short commit hash (``STITCH_NAS_COMMIT`` when set: a run from a copy of
    the tree that is not a checkout); empty where git cannot tell."""
    return (
        os.environ.get("STITCH_NAS_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    )
