"""The JSON report: a versioned contract (``baechi.report/v1``) that CI jobs parse.

Keys are documented in the README ("Report schema"). Keys are only ever
added, never renamed. Same input and options give the same report apart from
``timings_s`` and ``candidates[].place_seconds``.
"""

from __future__ import annotations

import json
from typing import Any

from baechi_cli.io.files import write_atomic

REPORT_SCHEMA = "baechi.report/v1"


def dumps(report: dict[str, Any]) -> str:
    """Stable text form: insertion-ordered keys, two-space indent, trailing newline."""
    return json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def write_report(path: str, report: dict[str, Any]) -> None:
    write_atomic(path, dumps(report).encode("utf-8"))
