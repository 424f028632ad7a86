"""A disk cache of traced training steps, so that placing a ``.pt2`` again needs no torch.

``cached_joint(program, sizes, optimizer, trace)`` returns ``trace(program, sizes, optimizer)``
(:func:`baechi_cli.io.pt2_joint.joint_program`: a program of torch's export schema, plain JSON),
kept as a JSON file under the cache folder and read back on the next call with the same key: the
program, the placeholders' sizes, the optimizer, the installed torch's version and the source of
the modules that trace (``pt2.py``, ``pt2_joint.py``), so that a changed program, torch or
tracer traces anew. The file is JSON: reading it runs nothing. The folder is ``$BAECHI_CACHE_DIR``
(empty: no cache), else ``$XDG_CACHE_HOME/baechi`` or ``~/.cache/baechi``. A folder that cannot
be written, or an entry that cannot be read, costs only the trace. Writes are atomic (a
temporary file renamed).

Complexity: O(size of the program) to hash; a hit reads one JSON file.

Example:
    >>> import os, tempfile
    >>> before = os.environ.get("BAECHI_CACHE_DIR")
    >>> os.environ["BAECHI_CACHE_DIR"] = tempfile.mkdtemp()
    >>> calls = []
    >>> trace = lambda program, sizes, optimizer: calls.append(1) or {"graph_module": {"n": 1}}
    >>> cached_joint({"graph_module": {}}, {"x": (2, 3)}, "sgd", trace)
    {'graph_module': {'n': 1}}
    >>> cached_joint({"graph_module": {}}, {"x": (2, 3)}, "sgd", trace), len(calls)
    ({'graph_module': {'n': 1}}, 1)
    >>> _ = os.environ.pop("BAECHI_CACHE_DIR") if before is None else os.environ.update(BAECHI_CACHE_DIR=before)
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

_TRACERS = ("pt2.py", "pt2_joint.py", "aliasing.py")  # the modules whose code makes the cached value


def cache_folder() -> str | None:
    """The cache's folder (module docstring); None when ``$BAECHI_CACHE_DIR`` is empty."""
    folder = os.environ.get("BAECHI_CACHE_DIR")
    if folder is not None:
        return folder or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "baechi")


def cached_joint(
    program: Mapping[str, Any],
    sizes: Mapping[str, tuple[int, ...]],
    optimizer: str,
    trace: Callable[[Mapping[str, Any], Mapping[str, tuple[int, ...]], str], dict[str, Any]],
) -> dict[str, Any]:
    """``trace(program, sizes, optimizer)``, from the cache when it holds it (module docstring)."""
    folder = cache_folder()
    if folder is None:
        return trace(program, sizes, optimizer)
    path = os.path.join(folder, "pt2-steps", _key(program, sizes, optimizer) + ".json")
    try:
        with open(path, encoding="utf-8") as f:
            cached = json.load(f)
        if isinstance(cached, dict) and isinstance(cached.get("graph_module"), dict):
            return cached
    except (OSError, ValueError):
        pass
    joint = trace(program, sizes, optimizer)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), suffix=".tmp", delete=False) as f:
            json.dump(joint, f, separators=(",", ":"))
        os.replace(f.name, path)
    except OSError:
        pass
    return joint


def _key(program: Mapping[str, Any], sizes: Mapping[str, tuple[int, ...]], optimizer: str) -> str:
    digest = hashlib.sha256()
    digest.update(_tracer_version().encode())
    digest.update(json.dumps([optimizer, sorted((k, list(v)) for k, v in sizes.items())]).encode())
    digest.update(json.dumps(program, sort_keys=True, separators=(",", ":")).encode())
    return digest.hexdigest()


@functools.cache
def _tracer_version() -> str:
    """The installed torch's version and a hash of the tracing modules' source, without importing torch."""
    from importlib import metadata

    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "none"
    digest = hashlib.sha256(torch.encode())
    here = os.path.dirname(os.path.abspath(__file__))
    for name in _TRACERS:
        with open(os.path.join(here, name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()
