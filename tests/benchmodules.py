"""bench/'s modules for tests that reuse them (bench/synthetic.py's graphs), loaded from their files:
bench/ is not a package, and tests do not put it on ``sys.path``."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py`` as a module (loaded once per process)."""
    key = f"baechi_bench_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, os.path.join(BENCH, f"{name}.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[key]
