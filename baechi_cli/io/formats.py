"""Model files by format: which reader a path takes, and writing a placed model back.

:func:`load_model` reads a TensorFlow GraphDef (``.pb``, ``.pbtxt``), an ONNX
model (``.onnx``, or any file whose first byte says it is one) or a
cost-annotated workload JSON into an :class:`~baechi_cli.core.graph.OpGraph`;
:func:`write_placed_model` writes the input back with every op's device, in
the input's own format. Readers are imported on first use so that
``baechi --help`` stays fast.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import NamedTuple

from baechi_cli.core.errors import InputError
from baechi_cli.core.graph import OpGraph

# A serialized ONNX ModelProto starts with its ir_version: field 1, varint (tag 0x08).
# A binary GraphDef never does: its field 1 is `node`, a message (tag 0x0a).
_ONNX_FIRST_BYTE = b"\x08"

# The cost-rule name table each format's op types are looked up in.
OP_SETS = {"graphdef": "tensorflow", "onnx": "onnx", "workload": "tensorflow"}
#: The largest batch size: a profile records it as an int32 (proto/profile.proto).
MAX_BATCH_SIZE = 2**31 - 1


def detect_format(path: str) -> str:
    """'workload' for .json, 'onnx' for .onnx, 'graphdef' for .pb/.pbtxt and anything else,
    unless the file's first byte says it is an ONNX model (``model.pb`` saved by onnx)."""
    ext = os.path.splitext(path)[1].lower()
    if ext == ".json":
        return "workload"
    if ext == ".onnx":
        return "onnx"
    if ext != ".pbtxt":
        try:
            with open(path, "rb") as f:
                if f.read(1) == _ONNX_FIRST_BYTE:
                    return "onnx"
        except OSError:
            pass  # reading it fails again, with its error, in the reader
    return "graphdef"


class LoadedModel(NamedTuple):
    graph: OpGraph
    format: str  # graphdef | onnx | workload
    notes: list[str]  # what the reader wants the user to know (ONNX: external data not loaded, ...)


def load_model(path: str, batch_size: int | None, dims: dict[str, int] | None = None) -> LoadedModel:
    """Read ``path`` into an OpGraph, with its format name and the reader's notes.

    ``dims`` binds ONNX symbolic dims by name; another format given ``dims``
    is an InputError (TensorFlow graphs have only the batch dim to fill), and
    so is a ``batch_size`` above :data:`MAX_BATCH_SIZE`.
    """
    if not os.path.exists(path):
        raise InputError("no such file", path=path)
    if batch_size is not None and batch_size > MAX_BATCH_SIZE:
        raise InputError(f"the batch size must be at most {MAX_BATCH_SIZE}, not {batch_size}", path=path)
    fmt = detect_format(path)
    if dims and fmt != "onnx":
        raise InputError(f"--dim binds ONNX symbolic dims; this input is {fmt} (use --batch-size)", path=path)
    try:
        if fmt == "workload":
            from baechi_cli.io.workload_json import read_workload_json

            return LoadedModel(read_workload_json(path), fmt, [])
        if fmt == "onnx":
            from baechi_cli.io.onnx import read_onnx_with_notes

            read = read_onnx_with_notes(path, batch_size=batch_size, dims=dims)
            return LoadedModel(read.graph, fmt, list(read.notes))
        from baechi_cli.io.graphdef import read_graphdef

        return LoadedModel(read_graphdef(path, batch_size=batch_size), fmt, [])
    except InputError as err:
        raise err.with_path(path) from None


def sha256_of(path: str) -> str:
    """The file's SHA-256, hex (the report's ``input.sha256``)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_writable(path: str) -> None:
    """InputError unless ``path`` can be written (checked before any work starts)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise InputError("output directory does not exist", path=path)
    if os.path.isdir(path):
        raise InputError("output path is a directory", path=path)
    if not os.access(directory, os.W_OK):
        raise InputError("output directory is not writable", path=path)


def check_output_format(path: str, output: str) -> None:
    """``-o`` writes the input's own format: a placed GraphDef or a placed ONNX model."""
    fmt = detect_format(path)
    if fmt == "workload":
        raise InputError(
            "-o writes a placed model, but the input is a workload JSON; use --report", path=path
        )
    if fmt == "onnx" and detect_format(output) != "onnx":
        raise InputError("-o must name an .onnx file for an ONNX input (the placed model)", path=output)
    if fmt == "graphdef" and detect_format(output) != "graphdef":
        raise InputError("-o must name a .pb or .pbtxt file for a GraphDef input", path=output)


def write_placed_model(
    path: str,
    fmt: str,
    graph: OpGraph,
    model_ops: int,
    device_of: Sequence[int],
    device_names: Sequence[str],
    output: str,
) -> list[str]:
    """Write the model at ``path`` with every op's device to ``output``; returns the writer's notes.

    Only ops ``0..model_ops-1`` (the input's own) are written: with
    ``--training`` the backward and optimizer ops exist only in the plan.
    """
    if fmt == "onnx":
        from baechi_cli.io.onnx import onnx_node_ops, write_placed_onnx

        nodes = onnx_node_ops(graph, model_ops)
        return write_placed_onnx(path, [device_names[device_of[v]] for v in nodes], device_names, output)
    from baechi_cli.io.graphdef import write_placed_graphdef

    write_placed_graphdef(
        path, {graph.names[v]: device_names[device_of[v]] for v in range(model_ops)}, output
    )
    return []
