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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from baechi_cli.core.errors import InputError
from baechi_cli.core.graph import OpGraph

# A serialized ONNX ModelProto starts with its ir_version: field 1, varint (tag 0x08).
# A binary GraphDef never does: its field 1 is `node`, a message (tag 0x0a).
_ONNX_FIRST_BYTE = b"\x08"

#: The largest batch size: a profile records it as an int32 (proto/profile.proto).
MAX_BATCH_SIZE = 2**31 - 1


#: ``--infer-shapes`` choices: ``onnx`` (ONNX's inference, then baechi's propagation: no model
#: is run) or ``run`` (also one onnxruntime run on zero inputs for what those leave unknown).
INFER_SHAPES = ("onnx", "run")


class Read(NamedTuple):
    graph: OpGraph
    notes: list[str]  # what the reader wants the user to know (ONNX: external data not loaded, ...)


class ReadOptions(NamedTuple):
    """What a reader may be told besides the path (each reader uses what applies to its format)."""

    batch_size: int | None = None  # the value of unknown batch dims
    dims: dict[str, int] | None = None  # symbolic dims bound by name (--dim)
    infer_shapes: str = "onnx"  # one of INFER_SHAPES
    training: str | None = None  # an optimizer: a format that traces_training reads the training step


def _read_graphdef(path: str, options: ReadOptions) -> Read:
    from baechi_cli.io.graphdef import read_graphdef

    return Read(read_graphdef(path, batch_size=options.batch_size), [])


def _read_onnx(path: str, options: ReadOptions) -> Read:
    from baechi_cli.io.onnx import read_onnx_with_notes

    read = read_onnx_with_notes(
        path, batch_size=options.batch_size, dims=options.dims, infer_shapes=options.infer_shapes
    )
    return Read(read.graph, list(read.notes))


def _read_pt2(path: str, options: ReadOptions) -> Read:
    from baechi_cli.io.pt2 import read_pt2_with_notes

    read = read_pt2_with_notes(
        path, batch_size=options.batch_size, dims=options.dims, training=options.training
    )
    return Read(read.graph, list(read.notes))


def _read_workload(path: str, options: ReadOptions) -> Read:
    from baechi_cli.io.workload_json import read_workload_json

    return Read(read_workload_json(path), [])


def _write_graphdef(
    path: str, graph: OpGraph, model_ops: int, device_of: Sequence[int], names: Sequence[str], output: str
) -> list[str]:
    from baechi_cli.io.graphdef import write_placed_graphdef

    write_placed_graphdef(path, {graph.names[v]: names[device_of[v]] for v in range(model_ops)}, output)
    return []


def _write_onnx(
    path: str, graph: OpGraph, model_ops: int, device_of: Sequence[int], names: Sequence[str], output: str
) -> list[str]:
    from baechi_cli.io.onnx import onnx_node_ops, write_placed_onnx

    nodes = onnx_node_ops(graph, model_ops)
    return write_placed_onnx(path, [names[device_of[v]] for v in nodes], names, output)


@dataclass(frozen=True)
class InputFormat:
    """Everything the tool knows about one input format; the commands read it, not the format's name.

    ``read(path, ReadOptions)`` returns the graph and the reader's notes; ``write(path,
    graph, model_ops, device_of, device_names, output)`` writes the input back placed, each of
    its ops on ``device_names[device_of[op]]`` (None: ``-o`` is refused with ``no_output``). ``op_set`` names the cost-rule table its op types are looked
    up in (None: the file carries its own measured costs).
    """

    name: str
    title: str
    extension: str  # what a placed model's file name ends with
    suffixes: tuple[
        str, ...
    ]  # names always of this format (lower case); the others are sniffed (detect_format)
    read: Callable[[str, ReadOptions], Read]
    op_set: str | None
    write: Callable[[str, OpGraph, int, Sequence[int], Sequence[str], str], list[str]] | None = None
    output_error: str = ""  # why -o names the wrong kind of file
    no_output: str = ""  # why -o is refused
    symbolic_dims: bool = False  # --dim binds its symbolic dims
    constraint_passes: tuple[str, ...] = ()  # passes its framework imposes (run before any other)
    # A sidecar may state its step (race check), and profile --measure runs it.
    runs_in_tensorflow: bool = False
    split_activations: bool = (
        False  # exporters write GELU and SiLU as several ops the runtime runs as one kernel
    )
    module_paths: bool = False  # node names carry PyTorch module paths (the report's module map)
    # The reader sizes every tensor it can (ONNX: inference, propagation, --infer-shapes run), so
    # a size it leaves unknown refuses the model unless --allow-unknown-sizes. TensorFlow's own
    # inference leaves workspaces unsized (FusedBatchNormV3's reserve_space_3): a note only.
    refuses_unknown_sizes: bool = False
    # --training reads the step the framework itself traces (autograd's backward, the optimizer's
    # update) instead of the training pass synthesizing one.
    traces_training: bool = False


#: Every input format by name, in detection order of preference (see :func:`detect_format`).
FORMATS: dict[str, InputFormat] = {
    "graphdef": InputFormat(
        "graphdef",
        "TensorFlow GraphDef",
        ".pb",
        (".pbtxt",),  # a .pb may be an ONNX model: its first byte says (detect_format)
        _read_graphdef,
        op_set="tensorflow",
        write=_write_graphdef,
        output_error="-o must name a .pb or .pbtxt file for a GraphDef input",
        constraint_passes=("colocation", "control_flow"),
        runs_in_tensorflow=True,
    ),
    "onnx": InputFormat(
        "onnx",
        "ONNX model",
        ".onnx",
        (".onnx",),
        _read_onnx,
        op_set="onnx",
        write=_write_onnx,
        output_error="-o must name an .onnx file for an ONNX input (the placed model)",
        symbolic_dims=True,
        split_activations=True,
        module_paths=True,
        refuses_unknown_sizes=True,
    ),
    "pt2": InputFormat(
        "pt2",
        "PyTorch program (torch.export)",
        ".pt2",
        (".pt2",),
        _read_pt2,
        op_set="aten",
        no_output="-o writes a placed model, but the input is a PyTorch program; the report (--report) "
        "names its nodes",
        symbolic_dims=True,
        refuses_unknown_sizes=True,
        traces_training=True,
    ),
    "workload": InputFormat(
        "workload",
        "cost-annotated workload JSON",
        ".json",
        (".json",),
        _read_workload,
        op_set=None,
        no_output="-o writes a placed model, but the input is a workload JSON; use --report",
    ),
}


def op_set_of(fmt: str) -> str:
    """The cost-rule table ``fmt``'s op types are looked up in (a format with its own costs: TensorFlow's)."""
    return FORMATS[fmt].op_set or "tensorflow"


def detect_format(path: str) -> str:
    """The name of ``path``'s format: the one whose ``suffixes`` end the name; else an ONNX model
    when the file's first byte says so (``model.pb`` saved by onnx), else ``graphdef``.

    >>> detect_format("model.onnx"), detect_format("workload.json"), detect_format("graph.pbtxt")
    ('onnx', 'workload', 'graphdef')
    """
    name = os.path.basename(path).lower()
    for fmt in FORMATS.values():
        if fmt.suffixes and name.endswith(fmt.suffixes):
            return fmt.name
    try:
        with open(path, "rb") as f:
            if f.read(1) == _ONNX_FIRST_BYTE:
                return "onnx"
    except OSError:
        pass  # reading it fails again, with its error, in the reader
    return "graphdef"


def format_of(path: str) -> InputFormat:
    """The :class:`InputFormat` of the file at ``path`` (:func:`detect_format`)."""
    return FORMATS[detect_format(path)]


class LoadedModel(NamedTuple):
    graph: OpGraph
    format: str  # a key of FORMATS
    notes: list[str]  # what the reader wants the user to know (ONNX: external data not loaded, ...)


def load_model(
    path: str,
    batch_size: int | None,
    dims: dict[str, int] | None = None,
    infer_shapes: str = "onnx",
    training: str | None = None,
) -> LoadedModel:
    """Read ``path`` into an OpGraph, with its format name and the reader's notes.

    ``dims`` binds ONNX symbolic dims by name; another format given ``dims``
    is an InputError (TensorFlow graphs have only the batch dim to fill), and
    so is a ``batch_size`` above :data:`MAX_BATCH_SIZE`. ``infer_shapes`` is one of
    :data:`INFER_SHAPES`; ``training`` (an optimizer) reaches a format that ``traces_training``.
    """
    if not os.path.exists(path):
        raise InputError("no such file", path=path)
    if batch_size is not None and batch_size > MAX_BATCH_SIZE:
        raise InputError(f"the batch size must be at most {MAX_BATCH_SIZE}, not {batch_size}", path=path)
    fmt = format_of(path)
    if dims and not fmt.symbolic_dims:
        raise InputError(
            f"--dim binds ONNX symbolic dims; this input is {fmt.name} (use --batch-size)", path=path
        )
    try:
        read = fmt.read(path, ReadOptions(batch_size, dims, infer_shapes, training))
    except InputError as err:
        raise err.with_path(path) from None
    return LoadedModel(read.graph, fmt.name, read.notes)


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
    fmt = format_of(path)
    if fmt.write is None:
        raise InputError(fmt.no_output, path=path)
    if detect_format(output) != fmt.name:
        raise InputError(fmt.output_error, path=output)


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
    write = FORMATS[fmt].write
    if write is None:
        raise InputError(FORMATS[fmt].no_output, path=path)
    return write(path, graph, model_ops, device_of, device_names, output)
