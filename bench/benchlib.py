"""What the bench scripts share: the repository's paths, progress lines, markdown tables, files
written, the machine's load, and the test suite's model helpers.

Every script runs as ``python bench/NAME.py`` from the repository root with baechi installed in
the environment (``make install``, an editable install), so ``import baechi_cli`` finds the
package and ``import benchlib`` finds this module (bench/ is ``sys.path[0]``); nothing edits
``sys.path``. The scripts use the package's public API only. Tables name files relative to the
repository (:func:`rel`, :func:`scrub`), so they read the same whichever machine made them.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import platform
import resource
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
TESTDATA = os.path.join(ROOT, "testdata")
WORKLOADS = os.path.join(TESTDATA, "workloads")


def log(message: str) -> None:
    """A progress line on stderr (stdout is kept for what a script prints as its result)."""
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- paths


def rel(path: str | os.PathLike[str]) -> str:
    """``path`` relative to the repository root, as the tables name files."""
    return os.path.relpath(path, ROOT)


def scrub(text: str) -> str:
    """``text`` (an error message, a report field) with this checkout's absolute paths made
    repository-relative: the library names a file as it was given, and the benches give absolute
    paths so that they run from any folder."""
    return text.replace(ROOT + os.sep, "")


@functools.cache
def tests_module(name: str) -> ModuleType:
    """The test suite's helper module ``tests/<name>.py`` (realgraphs, onnxmodels), loaded from its
    file as those helpers load testdata's generators: tests/ is not a package, and is not put on
    ``sys.path``."""
    path = os.path.join(ROOT, "tests", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"baechi_tests_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and NamedTuples look their module up there
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- output


def row(cells: Iterable[str]) -> str:
    """One markdown table row."""
    return "| " + " | ".join(cells) + " |"


def table(header: list[str], rows: Iterable[Iterable[str]]) -> list[str]:
    """A markdown table: the header, its rule and the rows, one line each (no blank line after)."""
    return [row(header), "|" + "---|" * len(header), *(row(r) for r in rows)]


def write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_json(path: str, data: Any) -> None:
    """``data`` as JSON, one space of indent, with a final newline."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def ms(us: float | None) -> str:
    """Microseconds as milliseconds with three decimals; "-" for none."""
    return "-" if us is None else f"{us / 1000:.3f}"


# ---------------------------------------------------------------- the machine


def peak_rss_bytes() -> int:
    """This process's peak resident set so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def load_averages() -> str:
    """The 1-, 5- and 15-minute load averages, as "1.3, 0.9, 0.7"."""
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


@dataclass
class Run:
    """A bench run's wall time and the machine's 1-minute load average before and after it: on a
    shared machine other work inflates the times, so every table says how busy it was."""

    start: float = field(default_factory=time.perf_counter)
    load_before: float = field(default_factory=lambda: os.getloadavg()[0])
    seconds: float = 0.0
    load_after: float = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def stop(self) -> Run:
        self.seconds = self.elapsed()
        self.load_after = os.getloadavg()[0]
        return self

    def load_text(self) -> str:
        return f"1-minute load average {self.load_before:.1f} before, {self.load_after:.1f} after"

    def facts(self) -> dict[str, Any]:
        """The machine and the run, for a bench's JSON."""
        return {
            "machine": platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1min_before": self.load_before,
            "load_average_1min_after": self.load_after,
            "total_seconds": self.seconds,
        }
