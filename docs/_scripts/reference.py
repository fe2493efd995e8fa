"""The YAML key reference and the CLI flag table, generated from the code's own definitions.

Nothing here is written by hand beside the code it describes, so the pages cannot drift:

- the YAML sections and their keys come from the ``Settings`` dataclass and its section
  dataclasses (``stitch_nas/settings/_schema.py``), with the ``#:`` comment beside each field as
  its description;
- the keys of a ``zoo.models`` item come from the zoo-source registry
  (``stitch_nas/settings/_zoo_keys.py``), and which ``data`` keys each ``data.kind`` reads from the
  data-kind registry (``stitch_nas/settings/_data_keys.py``);
- the commands and flags come from the argparse parser of ``stitch-nas``
  (``stitch_nas/cli/_parser.py``).

All of these are torch-free by design, so the docs build never imports torch. The module
imports neither mkdocs nor mkdocs-gen-files: ``gen_pages.py`` writes its output into the site,
and ``tests/test_docs.py`` calls it directly.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import json
import textwrap
import tokenize
from typing import Any

__all__ = [
    "cli_reference",
    "data_kind_keys",
    "field_comments",
    "section_classes",
    "yaml_reference",
    "zoo_item_keys",
]


# ---------------------------------------------------------------------------- YAML settings


def section_classes() -> dict[str, type]:
    """Each section of the settings file (``zoo``, ``data``, ``search``, ...) and its dataclass,
    in the order ``Settings`` declares them."""
    from stitch_nas.settings import Settings

    sections = {}
    for f in dataclasses.fields(Settings):
        if f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
            raise TypeError(f"Settings.{f.name} has no default_factory; cannot document it")
        sections[f.name] = type(f.default_factory())  # type: ignore[misc]
    return sections


def field_comments(cls: type) -> dict[str, str]:
    """The ``#:`` comment of each field of dataclass ``cls``: on the field's own line, or on
    the lines just above it (joined), as Sphinx and griffe read them."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    trailing: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and token.string.startswith("#:"):
            trailing[token.start[0]] = token.string[2:].strip()
    comments: dict[str, str] = {}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        parts = []
        line = node.lineno - 1  # the lines above the field, nearest last
        while line >= 1 and lines[line - 1].strip().startswith("#:"):
            parts.insert(0, lines[line - 1].strip()[2:].strip())
            line -= 1
        parts += [
            trailing[n]
            for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)
            if n in trailing and not lines[n - 1].strip().startswith("#:")
        ]
        if parts:
            comments[node.target.id] = " ".join(parts)
    return comments


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _yaml_value(value: Any) -> str:
    """A default as it is written in YAML (``null``, ``true``, flow-style lists and maps)."""
    if value is dataclasses.MISSING:
        return "(required)"
    if dataclasses.is_dataclass(value):  # a nested mapping: its keys get a table of their own
        return "(a mapping: see below)"
    return f"`{json.dumps(value)}`" if not isinstance(value, str) else f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def zoo_item_keys() -> dict[str, dict[str, Any]]:
    """Every key a ``zoo.models`` item may hold: ``{key: {"sources": [...], "required": [...],
    "expect": "..."}}``, in the order the sources declare them."""
    from stitch_nas.settings._zoo_keys import COMMON_KEYS, ZOO_SOURCES

    sources = list(ZOO_SOURCES)
    keys: dict[str, dict[str, Any]] = {}
    for key, option in COMMON_KEYS.items():
        keys[key] = {"sources": list(sources), "required": [], "expect": option.expect}
    for name in sources:
        spec = ZOO_SOURCES.get(name)
        for key, option in spec.keys.items():
            entry = keys.setdefault(key, {"sources": [], "required": [], "expect": option.expect})
            if name not in entry["sources"]:
                entry["sources"].append(name)
        for key in spec.required:
            keys[key]["required"].append(name)
    return keys


def data_kind_keys() -> dict[str, tuple[str, ...]]:
    """Each registered ``data.kind`` and the keys of the ``data`` section it reads."""
    from stitch_nas.settings import DATA_KINDS

    return {name: tuple(DATA_KINDS.get(name).keys) for name in DATA_KINDS}


def attribute_docs(cls: type) -> dict[str, str]:
    """The descriptions of a class's fields in the ``Attributes:`` section of its docstring
    (Google style, as mkdocstrings reads it)."""
    docs: dict[str, str] = {}
    current = None
    inside = False
    for line in inspect.cleandoc(cls.__doc__ or "").splitlines():
        if line.strip() == "Attributes:":
            inside = True
            continue
        if not inside:
            continue
        if line and not line.startswith(" "):  # the next section
            break
        head, sep, text = line.strip().partition(": ")
        if line.startswith("    ") and not line.startswith("     ") and sep and head.isidentifier():
            current = head
            docs[current] = text.strip()
        elif current and line.strip():
            docs[current] += " " + line.strip()
    return docs


def nested_sections(cls: type) -> dict[str, type]:
    """Fields of section ``cls`` that are mappings of their own (a dataclass default)."""
    return {
        f.name: type(_default(f))
        for f in dataclasses.fields(cls)
        if dataclasses.is_dataclass(_default(f))
    }


def _section_table(cls: type) -> list[str]:
    comments = {**attribute_docs(cls), **field_comments(cls)}
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        rows.append(
            f"| `{f.name}` | `{_cell(kind)}` | {_cell(_yaml_value(_default(f)))} | "
            f"{_cell(comments.get(f.name, ''))} |"
        )
    return rows


def yaml_reference() -> str:
    """The Markdown page listing every section and key of a ``stitch-nas search`` file."""
    sections = section_classes()
    out = [
        "# YAML key reference",
        "",
        "<!-- generated by docs/_scripts/reference.py from stitch_nas/settings/_schema.py, "
        "_zoo_keys.py and _data_keys.py; do not edit -->",
        "",
        "Generated from the settings parser's own definitions when the site is built. "
        "A `stitch-nas search` file holds up to "
        f"{len(sections)} sections: " + ", ".join(f"`{s}`" for s in sections) + ". Every "
        "section and key is optional; an unknown key, a value of the wrong type, a missing "
        "file or folder is one line naming it and exit code 2, before torch loads. "
        "See [Your own zoo and data in YAML](../guide/yaml.md) for how the keys work together, "
        "and `examples/search.yaml` for a commented file that uses most of them.",
        "",
    ]
    for name, cls in sections.items():
        out += [f"## `{name}`", ""]
        doc = inspect.cleandoc(cls.__doc__ or "")
        if doc and not doc.startswith(f"{cls.__name__}("):  # not dataclass's generated one
            out += [" ".join(doc.split()), ""]
        out += _section_table(cls) + [""]
        for key, nested in nested_sections(cls).items():
            out += [f"### `{name}.{key}`", ""] + _section_table(nested) + [""]
        if name == "zoo":
            out += _zoo_items()
        if name == "data":
            out += _data_kinds()
    return "\n".join(out).rstrip() + "\n"


def _zoo_items() -> list[str]:
    keys = zoo_item_keys()
    from stitch_nas.settings import ZOO_SOURCES

    everywhere = set(ZOO_SOURCES)
    out = [
        "### `zoo.models` items",
        "",
        "Each item of `zoo.models` is one model; its `source` says which keys it takes.",
        "",
        "| key | sources | required by | value |",
        "|---|---|---|---|",
    ]
    for key, entry in keys.items():
        sources = "all" if set(entry["sources"]) == everywhere else ", ".join(entry["sources"])
        required = ", ".join(entry["required"]) or "–"
        out.append(f"| `{key}` | {sources} | {required} | {_cell(entry['expect'])} |")
    return out + [""]


def _data_kinds() -> list[str]:
    out = [
        "### Keys read by each `data.kind`",
        "",
        "A key a kind does not read may be listed at its default, and is refused otherwise.",
        "",
        "| `data.kind` | keys it reads |",
        "|---|---|",
    ]
    for kind, keys in data_kind_keys().items():
        out.append(f"| `{kind}` | {', '.join(f'`{k}`' for k in keys)} |")
    return out + [""]


# ---------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    from stitch_nas.cli._parser import build_parser as build

    return build()


def _subcommands(parser: argparse.ArgumentParser) -> tuple[dict[str, Any], dict[str, str]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return dict(action.choices), helps
    return {}, {}


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices:
        return " \\| ".join(f"`{c}`" for c in action.choices)
    return f"`{action.metavar or action.dest.upper()}`"


def _action_rows(parser: argparse.ArgumentParser, top: bool = False) -> list[str]:
    rows = ["| argument | value | default | description |", "|---|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        if isinstance(action, argparse._HelpAction) and not top:
            continue  # listed once, among the options of every command
        names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
        default = action.default
        shown = (
            ""
            if default in (None, False, argparse.SUPPRESS) or action.nargs == 0
            else f"`{default}`"
        )
        text = action.help or ""
        if isinstance(action, argparse._AppendAction):
            text += " (repeatable)"
        rows.append(f"| {names} | {_value(action)} | {shown} | {_cell(text)} |")
    return rows


def cli_reference() -> str:
    """The Markdown page listing every command of ``stitch-nas`` and each of its flags."""
    parser = _parser()
    commands, helps = _subcommands(parser)
    out = [
        "# Command-line reference",
        "",
        "<!-- generated by docs/_scripts/reference.py from stitch_nas/cli/_parser.py; "
        "do not edit -->",
        "",
        "Generated from the `stitch-nas` argument parser when the site is built. Every flag is "
        "checked right after parsing, before torch, Optuna or the zoo load: a bad value is one "
        "line naming it and exit code 2. See [the command line](../guide/cli.md) for how the "
        "commands fit together.",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    out += [f"| [`{name}`](#{name}) | {_cell(helps.get(name, ''))} |" for name in commands]
    out += [
        "",
        "## `stitch-nas`: options of every command",
        "",
        "Given before the command; `-h` / `--help` also after it, for that command's own help.",
        "",
    ]
    out += _action_rows(parser, top=True) + [""]
    for name, sub in commands.items():
        out += [f"## `{name}`", "", f"`{_usage(sub)}`", "", helps.get(name, ""), ""]
        out += _action_rows(sub) + [""]
    return "\n".join(out).rstrip() + "\n"


def _usage(parser: argparse.ArgumentParser) -> str:
    usage = parser.format_usage().strip()
    return " ".join(usage.removeprefix("usage:").split())
