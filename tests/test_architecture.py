"""The package's architecture holds: the import contract, no private names across modules, short
module docstrings, and a DESIGN.md that lists every package in its layer."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "baechi_cli"
MODULE_DOCSTRING_LINES = 40


def _sources(*folders: Path) -> list[Path]:
    return sorted(p for folder in folders for p in folder.rglob("*.py") if "proto_gen" not in p.parts)


def test_the_import_contract_is_kept():
    """import-linter's layers and acyclic-siblings contracts (pyproject.toml), TYPE_CHECKING imports
    included: zero cycles, no import from a lower package into a higher one."""
    lint = Path(sys.executable).parent / "lint-imports"
    if not lint.exists():
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    done = subprocess.run(
        [str(lint), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "2 kept, 0 broken" in done.stdout


def test_no_private_name_is_imported_across_modules():
    offenders = []
    for path in _sources(PACKAGE, ROOT / "bench"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("baechi_cli"):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        offenders.append(
                            f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{alias.name}"
                        )
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if any(
                        part.startswith("_") and not part.startswith("__") for part in alias.name.split(".")
                    ):
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {alias.name}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("path", _sources(PACKAGE), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_docstring_fits_on_a_screen(path):
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
    if path.name == "__init__.py":
        assert docstring, f"{path.relative_to(ROOT)}: a package says what it is in its __init__ docstring"
    if docstring:
        lines = len(docstring.strip().splitlines())
        assert lines <= MODULE_DOCSTRING_LINES, (
            f"{lines} lines: the contract goes here, measurements in bench/"
        )


def _contract_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (layers,) = [c["layers"] for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return [name.strip() for layer in layers for name in layer.split("|")]


def test_every_package_is_in_the_contract_and_in_design_md():
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    contract = _contract_layers()
    assert sorted(contract) == packages
    design = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    table = re.search(r"\n## Layers\n(.*?)\n## ", design, re.S)
    assert table, "docs/DESIGN.md has a '## Layers' section"
    named = re.findall(r"^\| \d+ \| `([a-z_]+)/` \|", table.group(1), re.M)
    assert sorted(set(named)) == packages, "DESIGN.md's layer table names every package once"
    # and in the contract's order, top to bottom
    assert sorted(named, key=named.index) == [n for n in contract if n in named]
