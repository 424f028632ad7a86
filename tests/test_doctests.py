"""Every docstring example in baechi_cli runs and shows what it claims."""

from __future__ import annotations

import ast
import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import baechi_cli


def _imports_tensorflow_at_import_time(name: str) -> bool:
    """Whether the module imports TensorFlow outside any function body."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return False
    with open(spec.origin, encoding="utf-8") as f:
        stack: list[ast.AST] = [ast.parse(f.read())]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue  # runs later, if ever
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            names = []
        if any(n == "tensorflow" or n.startswith("tensorflow.") for n in names):
            return True
        stack.extend(ast.iter_child_nodes(node))
    return False


def _modules() -> list[str]:
    names = [baechi_cli.__name__]
    for info in pkgutil.walk_packages(baechi_cli.__path__, baechi_cli.__name__ + "."):
        name = info.name
        if name.startswith("baechi_cli.proto_gen") or name.rsplit(".", 1)[-1] == "__main__":
            continue  # generated code; __main__ runs the CLI when imported
        if _imports_tensorflow_at_import_time(name):
            continue
        names.append(name)
    return names


MODULES = _modules()


def test_discovery_finds_the_passes():
    for name in (
        "baechi_cli.core.graph",
        "baechi_cli.evaluator.sim",
        "baechi_cli.passes.fusion",
        "baechi_cli.placers.memory",
    ):
        assert name in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} doctest examples in {name} failed"
    with open(module.__file__, encoding="utf-8") as f:
        if ">>> " in f.read():
            assert result.attempted > 0, f"{name} shows examples that doctest does not collect"
