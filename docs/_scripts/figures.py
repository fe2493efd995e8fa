"""Measured figures rendered from the results files they come from, never typed by hand.

A page (or the README's template) writes ``{{ figure("demo.json", "wall_seconds.median",
"{:.1f} s") }}``: the value at that dotted path of ``benchmarks/results/demo.json``, through
that format (default ``{}``). In a path, a number indexes a list, ``[key=value,...]`` takes
the list's first item with those values (``results[method=default,trials=100,
reference_accuracy=0.9].hv_fraction_median``), and ``[key]`` is a key that holds dots
(``hv_at[0.9].zoo``). ``*`` takes every item of a list, and a last step ``min``, ``max``,
``median`` or ``count`` reduces them: ``rounds.*.driver_ms.min`` is the least of every
round's, ``rounds.*[workers=2].driver_ms.max`` the most of those with two workers, and
``*.*`` the items of every item (a mapping's values count as its items; a range stays the
range of whatever the file holds). A fourth argument divides the value before it
is formatted: ``"{:.1f} M", 1e6`` writes 10143940 MACs as ``10.1 M``, and ``"{:.1f} %", 0.01``
a fraction as the docs write percentages.

On the site each figure carries its file, machine, date and commit as a tooltip
(``hooks.py``); the README is written from ``README.template.md`` beside this file
(``python docs/_scripts/figures.py``, and ``tests/test_docs.py`` fails when the committed
README is not what the template renders), so a new results file changes both without a hand
edit. A missing file or path stops the build with a line naming it.

Imports nothing beyond the standard library: the docs build never imports torch.
"""

from __future__ import annotations

import decimal
import functools
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
TEMPLATE = Path(__file__).resolve().parent / "README.template.md"
README = ROOT / "README.md"

#: ``{{ figure("file.json", "a.b.0.c", "{:.2f}", 1e6) }}`` (the format and scale are optional)
FIGURE = re.compile(
    r"""\{\{\s*figure\(\s*"(?P<file>[^"]+)"\s*,\s*"(?P<path>[^"]+)"\s*"""
    r"""(?:,\s*"(?P<format>[^"]*)"\s*)?(?:,\s*(?P<scale>[0-9.eE+-]+)\s*)?\)\s*\}\}"""
)


class FigureError(Exception):
    """A figure names a file or a path its results do not have."""


def _results(path: Path) -> Any:
    if not path.is_file():
        raise FigureError(f"no results file {path}")
    stat = path.stat()
    return _load(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _load(path: str, mtime_ns: int, size: int) -> Any:
    """A results file's contents, read once per version of the file."""
    return json.loads(Path(path).read_text())


#: a path's steps: ``[key=value,...]`` selectors (which may hold dots) or plain keys
STEP = re.compile(r"\[[^\]]*\]|[^.\[\]]+")


def _matches(item: Any, selector: str) -> bool:
    """Whether the dict ``item`` has every ``key=value`` of ``selector`` (numbers compared as
    numbers: ``0.9`` matches ``0.90``)."""
    if not isinstance(item, dict):
        return False
    for pair in selector.split(","):
        key, _, wanted = (part.strip() for part in pair.partition("="))
        have = item.get(key)
        try:
            same = float(have) == float(wanted)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            same = str(have) == wanted
        if not same:
            return False
    return True


def value(file: str, path: str, results: Path = RESULTS) -> Any:
    """The value at ``path`` (see the module's doc) of the results ``file``."""
    return _trail(file, path, results)[-1]


def _trail(file: str, path: str, results: Path = RESULTS) -> list[Any]:
    """The file's contents and each node ``path`` passes through, down to its value."""
    node = _results(results / file)
    trail, every = [node], False  # every: the node is a list of items ``*`` took
    for part in STEP.findall(path):
        try:
            if every and part in REDUCE:
                node, every = REDUCE[part](node), False
            elif every and part == "*":  # every item of every item: one level flatter
                node = [x for item in node for x in _items(item)]
            elif every and part.startswith("[") and "=" in part:  # those items only
                node = [item for item in node if _matches(item, part[1:-1])]
            elif every:
                node = [_step(item, part) for item in node]
            elif part == "*":
                node, every = _items(node), True
            else:
                node = _step(node, part)
        except (KeyError, IndexError, ValueError, TypeError, StopIteration):
            raise FigureError(f"{file} has no {path!r} (stopped at {part!r})") from None
        trail.append(node)
    if every:
        raise FigureError(f"{file}: {path!r} takes every item but reduces them to no value")
    return trail


def _items(node: Any) -> list[Any]:
    """What ``*`` takes: every item of a list, every value of a mapping."""
    return list(node.values() if isinstance(node, dict) else node)


def _step(node: Any, part: str) -> Any:
    if part.startswith("[") and "=" not in part:  # a key that holds dots: [0.9]
        return node[part[1:-1]]
    if part.startswith("["):
        return next(item for item in node if _matches(item, part[1:-1]))
    return node[int(part)] if isinstance(node, list) else node[part]


#: how the items ``*`` took become one value
REDUCE = {"min": min, "max": max, "median": statistics.median, "count": len}


def provenance(file: str, path: str = "", results: Path = RESULTS) -> str:
    """Where the figure at ``path`` of ``file`` was measured: the file's machine and the date
    and commit of the nearest record above it that names them (a row of runs may carry its
    own commit)."""
    trail = _trail(file, path, results) if path else [_results(results / file)]
    records = [node for node in trail if isinstance(node, dict)]
    parts = [f"benchmarks/results/{file}"]
    machine = next((r["machine"] for r in reversed(records) if r.get("machine")), None)
    if isinstance(machine, dict):
        machine = ", ".join(f"{k} {v}" for k, v in machine.items() if v is not None)
    if machine:
        parts.append(str(machine))
    for key in ("date", "commit"):
        found = next((r[key] for r in reversed(records) if r.get(key)), None)
        if found:
            parts.append(f"{key} {found}")
    return "; ".join(parts)


#: a format that writes an exponent
SCIENTIFIC = re.compile(r":[^}]*[eEgG]\}")


def figure(
    file: str, path: str, fmt: str = "{}", scale: float = 1.0, results: Path = RESULTS
) -> str:
    """The value at ``path`` of ``file``, divided by ``scale`` and formatted (a number rounded
    half up, as a reader rounds the digits the file shows: 1.055 to 1.06, where a float's
    binary value rounds it to 1.05)."""
    found = value(file, path, results)
    shown = found
    if SCIENTIFIC.search(fmt):  # as Python writes it (3.5e-05: a Decimal writes 3.5e-5)
        shown = found / scale if scale != 1.0 else found
    elif isinstance(found, (int, float)) and not isinstance(found, bool):
        exact = decimal.Decimal(repr(found))  # the digits the file shows
        if scale != 1.0:
            shown = exact / decimal.Decimal(repr(scale))
        elif isinstance(found, float):
            shown = exact
    try:
        with decimal.localcontext(rounding=decimal.ROUND_HALF_UP):
            return fmt.format(shown)
    except (ValueError, IndexError, TypeError) as exc:
        fits = f"format {fmt!r} does not fit {found!r}"
        raise FigureError(f"{fits} ({file}: {path}): {exc}") from None


def render(text: str, tooltip: bool = False, results: Path = RESULTS) -> str:
    """``text`` with every ``{{ figure(...) }}`` replaced by its value (with ``tooltip``, an
    ``<abbr>`` whose title says where it was measured, except in a code block, which shows
    markup as text: a printout kept in a results file is shown as it ran)."""

    def one(match: re.Match[str], plain: bool) -> str:
        file, fmt = match["file"], match["format"] or "{}"
        scale = float(match["scale"] or 1.0)
        shown = figure(file, match["path"], fmt, scale, results)
        if plain:
            return shown
        title = provenance(file, match["path"], results).replace('"', "'")
        return f'<abbr title="{title}">{shown}</abbr>'

    parts = FENCE.split(text)  # odd parts are fenced code blocks
    return "".join(
        FIGURE.sub(lambda m, plain=not tooltip or i % 2 == 1: one(m, plain), part)
        for i, part in enumerate(parts)
    )


#: a fenced code block, whole (its fences on lines of their own)
FENCE = re.compile(r"(^[ \t]*```[^\n]*\n.*?^[ \t]*```[ \t]*$)", re.M | re.S)


#: a number with a unit of measure, as prose states a measurement: ``1.83×``, ``24.2 s``,
#: ``3.44 GB``, ``+23 %``, ``10 M MACs`` (a range ``20.7–25.3 s`` counts once)
MEASURED = re.compile(
    r"(?<![\w.])(?<![A-Za-z]-)\d[\d,]*(?:\.\d+)?(?:\s?[–-]\s?\d[\d,]*(?:\.\d+)?)?\s?"
    r"(?:[kMG]\s?|[kMG]-)?(?:s|ms|min|minutes?|seconds?|hours?|h|[kMGT]i?B|%|MACs?|×|x)(?!\w)"
)
#: a number with two or more decimals, as a measured accuracy, hypervolume, p-value or ratio is
#: written (``0.989``, ``0.3356``, ``1.83``); a version (``2.14.1``) is not one
DECIMAL = re.compile(r"(?<![\w.])[-+−]?\d+\.\d{2,}(?![\w.])")
#: a line that states a definition (a default, a limit, a formula), not a measurement
DEFINITION = "<!-- definition -->"


def hand_typed(text: str) -> list[tuple[int, str]]:
    """Lines of a page (1-based, with the line) that state a number with a unit, or one with
    two or more decimals, outside a rendered figure, a code block, inline code or a line marked
    :data:`DEFINITION`."""
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or DEFINITION in line:
            continue
        prose = re.sub(r"`[^`]*`", "", FIGURE.sub("", line))
        if MEASURED.search(prose) or DECIMAL.search(prose):
            found.append((number, line))
    return found


def readme(results: Path = RESULTS) -> str:
    """The README as its template renders it (plain figures: GitHub shows no tooltips; the
    definition marks, which only the hand-typed check reads, left out)."""
    return render(TEMPLATE.read_text(), results=results).replace(f" {DEFINITION}", "")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--hand-typed"]:  # which lines of these pages state figures by hand
        for name in sys.argv[2:]:
            for number, line in hand_typed(Path(name).read_text()):
                print(f"{name}:{number}: {line.strip()}")
        sys.exit(0)
    README.write_text(readme())
    print(f"wrote {README.relative_to(ROOT)} from {TEMPLATE.relative_to(ROOT)}", file=sys.stderr)
