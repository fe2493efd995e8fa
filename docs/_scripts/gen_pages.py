"""mkdocs-gen-files script: writes the generated reference pages into the site at build time.

The pages come from ``reference.py`` beside this file, which reads the code's own definitions
(the settings dataclasses, the zoo and data registries, the argparse parser) without importing
torch. The repository root is put first on ``sys.path`` so the build reads this checkout's
code, installed or not.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mkdocs_gen_files

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]

from reference import cli_reference, yaml_reference  # noqa: E402

for page, text in {
    "reference/yaml.md": yaml_reference(),
    "reference/cli.md": cli_reference(),
}.items():
    with mkdocs_gen_files.open(page, "w") as f:
        f.write(text)
    mkdocs_gen_files.set_edit_path(page, "docs/_scripts/reference.py")
