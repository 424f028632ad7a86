"""bench/'s modules for tests that reuse them (synthetic.py's graphs, framework.py), loaded from their
files: bench/ is not a package, and tests do not put it on ``sys.path``."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py``, loaded once per process under its own name, as ``python bench/NAME.py``
    (where bench/ is ``sys.path[0]``) imports it: a bench module it imports (benchlib) must be
    loaded first."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, f"{name}.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]
