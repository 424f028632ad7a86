"""Shrink a failing input for the regression corpus (``tests/fuzz_corpus/``).

    PYTHONPATH=tests python -m fuzz.minimise TARGET INPUT [--options JSON] [-o OUTPUT]

Delta debugging over bytes (Zeller's ddmin, chunk deletion only): a
candidate is kept while the target's reader still fails it with the same
:func:`~fuzz.oracle.signature`. Run it before fixing the reader, then
check the minimised input in with the fix.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


def ddmin(data: bytes, still_fails: Callable[[bytes], bool], budget: int = 5_000) -> bytes:
    """A smaller ``data`` for which ``still_fails`` holds (calls it at most ``budget`` times)."""
    parts = 2
    while len(data) >= 2 and budget > 0:
        size = -(-len(data) // parts)
        for i in range(parts):
            candidate = data[: i * size] + data[(i + 1) * size :]
            budget -= 1
            if still_fails(candidate):
                data, parts = candidate, max(parts - 1, 2)
                break
            if budget <= 0:
                break
        else:
            if parts >= len(data):
                break
            parts = min(len(data), parts * 2)
    return data


def main(argv: list[str] | None = None) -> int:
    """Minimise INPUT for TARGET; print the failure and write the result."""
    from fuzz.oracle import check, signature
    from fuzz.targets import TARGETS

    parser = argparse.ArgumentParser(prog="python -m fuzz.minimise", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=sorted(TARGETS))
    parser.add_argument("input")
    parser.add_argument("--options", type=json.loads, default={}, help="reader options, JSON")
    parser.add_argument("-o", "--output", help="where to write it (default: INPUT.min)")
    args = parser.parse_args(argv)
    target = TARGETS[args.target]
    path = Path(tempfile.mkdtemp(prefix="baechi-minimise-")) / target.filename

    def failure(data: bytes) -> str | None:
        path.write_bytes(data)
        return check(target, str(path), args.options).failure

    data = Path(args.input).read_bytes()
    first = failure(data)
    if first is None:
        print("the input does not fail", file=sys.stderr)
        return 1
    wanted = signature(first)
    small = ddmin(data, lambda candidate: (f := failure(candidate)) is not None and signature(f) == wanted)
    output = Path(args.output or f"{args.input}.min")
    output.write_bytes(small)
    print(f"{len(data)} -> {len(small)} bytes, {output}: {failure(small)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
