"""MkDocs hook: every page's measured figures rendered from their results files
(:mod:`figures`), each with a tooltip naming the file, machine, date and commit."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from figures import render  # noqa: E402


def on_page_markdown(markdown: str, **_: Any) -> str:
    return render(markdown, tooltip=True)
