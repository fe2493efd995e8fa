"""The generated reference pages list exactly what the parsers accept.

``docs/_scripts/reference.py`` writes the YAML key reference and the CLI flag table from the
code's own definitions when the site is built. These tests call it directly (no mkdocs needed)
and compare what the page lists with what the settings parser and the argparse parser accept,
asked through their own error messages, so a key added to the code and missed by the page (or
the reverse) fails here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest

from stitch_nas.errors import ConfigError
from stitch_nas.settings import ZOO_SOURCES, settings_from_dict
from stitch_nas.settings._zoo_keys import check_zoo_item
from tests._docs_scripts import load_docs_script

ROOT = Path(__file__).resolve().parents[1]


reference = load_docs_script("reference")


def _listed_after(message: str, marker: str) -> set[str]:
    """The comma-separated names a ConfigError lists after ``marker``."""
    assert marker in message, message
    return {name.strip() for name in message.split(marker, 1)[1].split(",")}


def _refusal(call) -> str:
    with pytest.raises(ConfigError) as info:
        call()
    return str(info.value)


def _page_tables(page: str) -> dict[str, list[list[str]]]:
    """The rows (as lists of cells) of the tables under each ``## `name` `` heading of the
    page; rows under a ``###`` subsection are kept apart, under ``name/subsection``."""
    tables: dict[str, list[list[str]]] = {}
    current = None
    for line in page.splitlines():
        if line.startswith("## `"):
            current = line[4 : line.index("`", 4)]
            tables[current] = []
        elif line.startswith("### "):
            current = f"{current.split('/')[0]}/{line[4:]}" if current else None
            tables.setdefault(current, [])
        elif current and line.startswith("| `"):
            cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
            tables[current].append([c.strip() for c in cells])
    return tables


def _page_sections(page: str) -> dict[str, list[str]]:
    """The keys (first column, unquoted) of each table of :func:`_page_tables`."""
    return {name: [row[0].strip("`") for row in rows] for name, rows in _page_tables(page).items()}


def test_the_yaml_reference_lists_every_section_the_parser_accepts_and_no_other():
    page = _page_sections(reference.yaml_reference())
    accepted = _listed_after(
        _refusal(lambda: settings_from_dict({"no_such_section": {}})), "valid sections: "
    )
    documented = {name for name in page if "/" not in name}
    assert documented == accepted
    for name in documented:  # each documented section is accepted, empty, on its own
        settings_from_dict({name: {}})


def test_the_yaml_reference_lists_every_key_of_each_section_and_no_other():
    page = _page_sections(reference.yaml_reference())
    for section in (name for name in page if "/" not in name):
        message = _refusal(lambda s=section: settings_from_dict({s: {"no_such_key": 1}}))
        accepted = _listed_after(message, f"valid keys in {section}: ")
        listed = page[section]
        assert len(listed) == len(set(listed)), f"{section}: a key is listed twice"
        assert set(listed) == accepted, section
        defaults = reference.section_classes()[section]()
        for key in listed:  # and each is accepted at its default value (as YAML writes it)
            value = getattr(defaults, key)
            if dataclasses.is_dataclass(value):
                value = dataclasses.asdict(value)
            settings_from_dict({section: {key: value}})


def test_the_yaml_reference_lists_every_key_of_a_nested_mapping():
    """``finetune.recipe`` is a mapping of its own, checked by ``FinetuneRecipe``."""
    page = _page_sections(reference.yaml_reference())
    nested = {
        f"{section}/`{section}.{key}`"
        for section, cls in reference.section_classes().items()
        for key in reference.nested_sections(cls)
    }
    assert "finetune/`finetune.recipe`" in nested
    for name in nested:
        section, key = name.split("/")[0], name.split(".")[-1].strip("`")
        message = _refusal(lambda s=section, k=key: settings_from_dict({s: {k: {"nope": 1}}}))
        assert set(page[name]) == _listed_after(message, "use any of "), name
    rows = _page_tables(reference.yaml_reference())["finetune/`finetune.recipe`"]
    described = {row[0].strip("`"): row[3] for row in rows}
    assert "held out" in described["holdout"]  # from the recipe's Attributes docstring


def test_the_yaml_reference_lists_every_zoo_item_key_of_each_source():
    rows = _page_tables(reference.yaml_reference())["zoo/`zoo.models` items"]
    assert rows, "the zoo.models item table is missing"
    sources = list(ZOO_SOURCES)
    assert sources, "no zoo source registered"
    for source in sources:
        message = _refusal(
            lambda s=source: check_zoo_item({"source": s, "no_such_key": 1}, 0, None)
        )
        accepted = _listed_after(message, f"valid keys for source {source}: ")
        listed = {
            row[0].strip("`")
            for row in rows
            if row[1] == "all" or source in [s.strip() for s in row[1].split(",")]
        }
        assert listed == accepted, source


def test_the_yaml_reference_says_which_keys_each_data_kind_reads():
    page = reference.yaml_reference()
    found = dict(re.findall(r"^\| `(\w+)` \| (`.*`) \|$", page, flags=re.MULTILINE))
    kinds = reference.data_kind_keys()
    assert kinds, "no data kind registered"
    data_keys = set(_page_sections(page)["data"])
    for kind, keys in kinds.items():
        assert kind in found, kind
        assert re.findall(r"`(\w+)`", found[kind]) == list(keys), kind
        assert set(keys) <= data_keys, kind  # each key it reads is a documented data key


def test_every_settings_field_comment_is_found():
    """A ``#:`` comment above a field or beside it becomes its description."""
    comments = reference.field_comments(reference.section_classes()["search"])
    assert "probe accuracy" in comments["probe_threshold"]  # the comment above the field
    assert comments["fidelity"].startswith("share of val")  # the comment beside it
    assert "distillation" in comments["refine_adapters"]  # two lines above, joined


def test_the_cli_reference_lists_every_command_and_flag():
    from stitch_nas.cli._parser import build_parser as _parser

    parser = _parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    page = reference.cli_reference()
    tables = _page_tables(page)
    assert set(commands.choices) | {"stitch-nas"} == {name for name in tables if "/" not in name}
    assert {"demo", "search", "report", "export", "zoo"} <= set(commands.choices)

    def flags(rows):
        return {f for row in rows for f in re.findall(r"`(-[^`]+)`", row[0])}

    def accepted(p):
        return {o for a in p._actions for o in a.option_strings if o not in ("-h", "--help")}

    assert flags(tables["stitch-nas"]) == accepted(parser) | {"-h", "--help"}
    for name, sub in commands.choices.items():
        assert flags(tables[name]) == accepted(sub), name
        positionals = [a.dest for a in sub._actions if not a.option_strings]
        assert [row[0].strip("`") for row in tables[name] if not row[0].startswith("`-")] == (
            positionals
        ), name


def test_the_reference_generator_imports_no_torch():
    code = (
        "import sys; sys.path[:0] = [{root!r}, {scripts!r}]\n"
        "import reference\n"
        "reference.yaml_reference(); reference.cli_reference()\n"
        "assert 'torch' not in sys.modules, 'the docs generator imported torch'\n"
    ).format(root=str(ROOT), scripts=str(ROOT / "docs" / "_scripts"))
    import subprocess

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# --- figures cited from benchmarks/results -------------------------------------------------

#: a results file cited in README.md or docs/: ``benchmarks/results/NAME.json`` anywhere, or
#: ``NAME.json`` on a page under docs/benchmarks/ (where every JSON file named is a results
#: file), in backticks; ``NAME.json["key"]["sub"]`` also cites keys in it. NAME may be a glob
#: (``finetune_cuda_*.json``), which must match at least one file, each holding the keys.
CITED = re.compile(
    r"`(?P<prefix>benchmarks/results/)?(?P<name>[\w.*-]+\.json)(?P<keys>(?:\[\"[^\"]+\"\])*)`"
)


def _cited_results() -> list[tuple[str, str, list[str]]]:
    """(page, file name or glob, cited keys) of every results citation."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    cited = []
    for page in pages:
        on_benchmarks = (ROOT / "docs" / "benchmarks") in page.parents
        for match in CITED.finditer(page.read_text()):
            if match["prefix"] or on_benchmarks:
                keys = re.findall(r"\[\"([^\"]+)\"\]", match["keys"])
                cited.append((str(page.relative_to(ROOT)), match["name"], keys))
    return cited


def test_every_cited_results_file_exists_and_holds_the_cited_keys():
    results = ROOT / "benchmarks" / "results"
    cited = _cited_results()
    # the pages cite about twenty files: far fewer means the pattern no longer finds them
    assert len({name for _, name, _ in cited}) >= 15, cited
    assert any(keys for _, _, keys in cited), "no key citation found: the convention changed"
    for page, name, keys in cited:
        files = sorted(results.glob(name))
        assert files, f"{page} cites benchmarks/results/{name}, which does not exist"
        for path in files:
            value = json.loads(path.read_text())
            for depth, key in enumerate(keys):
                if not isinstance(value, dict) or key not in value:
                    where = "".join(f"[{k!r}]" for k in keys[: depth + 1])
                    pytest.fail(f"{page} cites {path.name}{where}, which {path.name} lacks")
                value = value[key]


figures = load_docs_script("figures")


def test_the_readme_is_what_its_template_renders_from_the_results_files():
    rendered = figures.readme()
    assert figures.FIGURE.search(figures.TEMPLATE.read_text()), "the template renders no figure"
    assert (ROOT / "README.md").read_text() == rendered, (
        "README.md differs from docs/_scripts/README.template.md rendered from "
        "benchmarks/results/: edit the template, then run python docs/_scripts/figures.py"
    )


def _kept_demo_printout() -> str:
    """What the demo printed, as ``benchmarks/demo.py`` keeps it in ``demo.json``."""
    return json.loads((ROOT / "benchmarks/results/demo.json").read_text())["printout"]


def test_the_readmes_demo_excerpt_is_lines_of_the_kept_printout():
    """The excerpt is typed into the template; each of its lines (one ending in ``...`` cut
    there) must be a line of the printout ``demo.json`` keeps, so a re-measured demo that
    prints otherwise fails here until the excerpt is taken from it again."""
    printed = [line.rstrip() for line in _kept_demo_printout().splitlines()]
    template = figures.TEMPLATE.read_text()
    excerpt = template.split("```\n50 trials in", 1)[1].split("```", 1)[0]
    lines = ["50 trials in" + excerpt.splitlines()[0], *excerpt.splitlines()[1:]]
    assert len(lines) > 5
    for line in lines:
        if line.endswith(" ..."):
            head = line[: -len(" ...")]
            assert any(p.startswith(head) for p in printed), f"not in demo.json's printout: {line}"
        else:
            assert line in printed, f"not in demo.json's printout: {line}"


def test_the_trials_the_claims_page_names_are_in_the_kept_printout():
    """``docs/concepts/claims.md`` reads the demo's printout by trial number (``#18``); each
    number it names must be a row of the printout ``demo.json`` keeps."""
    rows = set(re.findall(r"^\s+(#\d+) ", _kept_demo_printout(), re.M))
    named = set(re.findall(r"#\d+\b", (ROOT / "docs/concepts/claims.md").read_text()))
    assert named, "the page names no trial"
    assert named <= rows, f"not rows of demo.json's printout: {sorted(named - rows)}"


def test_a_new_results_file_changes_the_readme_and_the_pages_without_a_hand_edit(tmp_path):
    for path in (ROOT / "benchmarks" / "results").glob("*.json"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    before = figures.readme(results=tmp_path)
    demo = json.loads((tmp_path / "demo.json").read_text())
    demo["wall_seconds"]["median"] = 987.6
    demo["commit"] = "abc1234"
    (tmp_path / "demo.json").write_text(json.dumps(demo))
    after = figures.readme(results=tmp_path)
    assert "987.6 s wall" in after and "987.6 s wall" not in before
    page = 'took {{ figure("demo.json", "wall_seconds.median", "{:.1f} s") }}'
    shown = figures.render(page, tooltip=True, results=tmp_path)
    assert (
        shown.startswith("took <abbr title=") and "abc1234" in shown and ">987.6 s</abbr>" in shown
    )


def test_a_figure_the_results_do_not_hold_stops_with_its_name(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"runs": [{"size": 1, "gb": 2.5}], "a.b": 3}))
    assert (
        figures.render('{{ figure("r.json", "runs[size=1].gb", "{:.1f}") }}', results=tmp_path)
        == "2.5"
    )
    assert figures.render('{{ figure("r.json", "[a.b]") }}', results=tmp_path) == "3"
    for path, named in (("runs[size=2].gb", "runs[size=2]"), ("runs.0.mb", "mb")):
        with pytest.raises(figures.FigureError, match=re.escape(named)):
            figures.render('{{ figure("r.json", "' + path + '") }}', results=tmp_path)
    with pytest.raises(figures.FigureError, match="no results file"):
        figures.render('{{ figure("gone.json", "x") }}', results=tmp_path)


def test_a_figure_reduces_every_item_of_a_list_and_scales_its_value(tmp_path):
    rounds = [{"workers": 2, "ms": 39.0}, {"workers": 1, "ms": 33.0}, {"workers": 2, "ms": 35.5}]
    other = {"by_model": {"a": 4, "b": 2}, "grid": [[3, 1], [2]], "half": 1.055}
    (tmp_path / "r.json").write_text(
        json.dumps({"rounds": rounds, "macs": 10143940, "p": 0.49, **other})
    )

    def shown(args: str) -> str:
        return figures.render('{{ figure("r.json", ' + args + ") }}", results=tmp_path)

    assert shown('"rounds.*.ms.min"') == "33.0" and shown('"rounds.*.ms.max"') == "39.0"
    assert shown('"rounds.*[workers=2].ms.min", "{:.1f} ms"') == "35.5 ms"
    assert shown('"rounds.*[workers=2].count"') == "2"
    assert shown('"by_model.*.max"') == "4" and shown('"grid.*.*.min"') == "1"
    assert shown('"half", "{:.2f}"') == "1.06"  # half up, as the file's digits read
    assert shown('"macs", "{:.1f} M MACs", 1e6') == "10.1 M MACs"
    assert shown('"p", "{:.1f} %", 0.01') == "49.0 %"
    with pytest.raises(figures.FigureError, match="reduces them to no value"):
        shown('"rounds.*.ms"')
    # a code block shows markup as text: a figure there (a kept printout) carries no tooltip
    page = 'took {{ figure("r.json", "p") }}\n```\n{{ figure("r.json", "p") }}\n```\n'
    assert figures.render(page, tooltip=True, results=tmp_path).endswith("```\n0.49\n```\n")
    assert "<abbr" in figures.render(page, tooltip=True, results=tmp_path)


def test_the_hand_typed_check_finds_a_figure_outside_a_rendered_one():
    page = "\n".join(
        [
            "took 24.2 s and 1.21 GB",  # typed by hand: found
            'took {{ figure("demo.json", "wall_seconds.median", "{:.1f} s") }}',
            "the default is 5 % of memory <!-- definition -->",
            "`cache_memory_gb: 4.0 GB` in code, and the ResNet-20s",
            "```",
            "zoo ready in 0.6 s",
            "```",
            "a 10 M-MAC network, 1.83× as long",
            "a hypervolume fraction of 0.989 at reference 0.9",  # two decimals: measured
            "torch 2.14.1 and a threshold of 1.5 times chance",  # a version, one decimal
        ]
    )
    assert [number for number, _ in figures.hand_typed(page)] == [1, 8, 9]


def test_no_page_states_a_measured_figure_by_hand():
    """A number with a unit is a figure rendered from its results file, or its line is marked
    as a definition (a default, a limit, a formula): typed by hand, it goes stale."""
    pages = [*sorted((ROOT / "docs").rglob("*.md")), figures.TEMPLATE]
    typed = [
        f"{page.relative_to(ROOT)}:{number}: {line.strip()}"
        for page in pages
        for number, line in figures.hand_typed(page.read_text())
    ]
    assert len(pages) > 30 and not typed, "\n".join(typed)


def test_every_figure_on_the_pages_names_a_value_its_results_file_holds():
    rendered = 0
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text = page.read_text()
        rendered += len(figures.FIGURE.findall(text))
        figures.render(text, tooltip=True)  # raises FigureError naming the file and path
    assert rendered >= 20, "the pages render fewer figures than they did: the pattern changed?"
