"""The sidecar of a GraphDef: what ``baechi verify --run`` feeds, fetches and initialises.

Written by ``testdata/generate.py`` beside each test model as ``<stem>.json``::

    {"inputs": [{"name": "x:0", "dtype": "float32", "shape": [64, 784]},
                {"name": "labels:0", "dtype": "int64", "shape": [64], "range": [0, 10]}],
     "loss": "loss:0", "train_op": "train", "init_op": "init", "seed": 20200101, ...}

:func:`load_sidecar` reads and validates one (``inputs``, ``loss``,
``train_op`` and ``init_op`` are required; every input has a name, dtype and
shape); :func:`default_sidecar` finds it: ``<stem>.json`` beside the original,
or beside the placed file without one. Problems are
:class:`~baechi_cli.errors.InputError` naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from baechi_cli.errors import InputError


def load_sidecar(path: str) -> dict[str, Any]:
    """Read and validate a sidecar JSON; raises InputError naming the file."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError("no such file", path=path) from None
    except (OSError, ValueError) as exc:
        raise InputError(f"not a readable JSON sidecar: {exc}", path=path) from None
    if not isinstance(data, dict):
        raise InputError("sidecar must be a JSON object", path=path)
    for key in ("inputs", "loss", "train_op", "init_op"):
        if key not in data:
            raise InputError(f"sidecar lacks '{key}'", path=path)
    if not isinstance(data["inputs"], list):
        raise InputError("sidecar 'inputs' must be a list", path=path)
    for entry in data["inputs"]:
        if not isinstance(entry, dict) or not {"name", "dtype", "shape"} <= entry.keys():
            raise InputError(f"sidecar input {entry!r} needs name, dtype and shape", path=path)
    return data


def default_sidecar(placed: str, original: str | None = None) -> str:
    """``<stem>.json`` beside the original (beside ``placed`` without one); InputError when absent."""
    model = original if original is not None else placed
    candidate = Path(model).with_suffix(".json")
    if not candidate.is_file():
        raise InputError(
            f"--run needs a sidecar JSON (inputs, loss, train_op, init_op) and there is no {candidate} "
            "beside it; pass --sidecar",
            path=model,
        )
    return str(candidate)
