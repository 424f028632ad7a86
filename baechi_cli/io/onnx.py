"""ONNX model reader and placed-model writer.

:func:`read_onnx` turns an ONNX model (``.onnx``, opset 13 or newer) into an
:class:`~baechi_cli.core.graph.OpGraph`; :func:`read_onnx_with_notes` also returns the notes
a report should show (external data not loaded, sizes that are guesses).
:func:`write_placed_onnx` writes the model back with each node annotated with its device.

Reading parses the model, checks its default-domain opset (13 or newer), runs
``onnx.checker``, binds symbolic dims (``dims`` by name; ``batch_size`` on axis 0 of the
graph inputs) and runs ``onnx.shape_inference`` once. Every failure is an
:class:`~baechi_cli.core.errors.InputError` naming the file (and the op or tensor when
there is one); so is a graph input with a dim left unbound, or a dim name that occurs
nowhere. Placement needs only dims, so weights are never read: external data is not
loaded (small integer shape operands excepted), and weights held in the file are left out
on the wire before anything is parsed (:func:`_without_weights`), since the checker and
shape inference would each copy them for nothing.

The graph: one ``Input`` op per fed graph input, then one op per node in node order, with
unique names; If/Loop/Scan are single ops whose reads of outer-scope values are implicit
data edges; an initializer read by several ops puts them in one colocation group and
counts once, on the first reader. Dims no step could determine count as 1 and are
listed in ``attrs["_size_unknown"]``. The whole mapping: docs/formats.md, "ONNX models".

Deterministic. Complexity: O(V + E + S + I) for V nodes, E node inputs, S subgraph nodes
and their inputs and I initializers, besides onnx's checker and shape inference.

Example:
    >>> import tempfile, os, onnx
    >>> from onnx import TensorProto, helper
    >>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    >>> y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    >>> node = helper.make_node("Relu", ["x"], ["y"])
    >>> model = helper.make_model(helper.make_graph([node], "g", [x], [y]),
    ...                           opset_imports=[helper.make_opsetid("", 17)])
    >>> path = os.path.join(tempfile.mkdtemp(), "relu.onnx")
    >>> onnx.save(model, path)
    >>> g = read_onnx(path, batch_size=8)
    >>> g.names, g.op_types, g.output_bytes
    (['x', 'Relu_0'], ['Input', 'Relu'], [[128], [128]])
"""

from __future__ import annotations

import math
import os
from collections import ChainMap
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from baechi_cli.core.errors import OP_NAME_LIMIT, InputError, MissingDependencyError, one_line, truncate
from baechi_cli.core.graph import GraphBuilder, OpGraph
from baechi_cli.io import protowire
from baechi_cli.io.files import mapped_input, write_atomic
from baechi_cli.io.initializers import own_initializers
from baechi_cli.io.torch_modules import CALL_SUFFIX, ModuleMap, module_map, module_paths, parameter_module

if TYPE_CHECKING:
    from onnx import GraphProto, ModelProto, NodeProto, TensorProto, TypeProto

#: ONNX TensorProto.DataType value -> (numpy-style name, bits per element).
#: Names follow the GraphDef reader (``tf.DType.name`` / ml_dtypes).
DTYPES: dict[int, tuple[str, int]] = {
    1: ("float32", 32),
    2: ("uint8", 8),
    3: ("int8", 8),
    4: ("uint16", 16),
    5: ("int16", 16),
    6: ("int32", 32),
    7: ("int64", 64),
    8: ("string", 0),
    9: ("bool", 8),
    10: ("float16", 16),
    11: ("float64", 64),
    12: ("uint32", 32),
    13: ("uint64", 64),
    14: ("complex64", 64),
    15: ("complex128", 128),
    16: ("bfloat16", 16),
    17: ("float8_e4m3fn", 8),
    18: ("float8_e4m3fnuz", 8),
    19: ("float8_e5m2", 8),
    20: ("float8_e5m2fnuz", 8),
    21: ("uint4", 4),
    22: ("int4", 4),
    23: ("float4_e2m1fn", 4),
    24: ("float8_e8m0fnu", 8),
    25: ("uint2", 2),
    26: ("int2", 2),
    27: ("float6_e2m3fn", 6),
    28: ("float6_e3m2fn", 6),
}

MIN_OPSET = 13
#: The first IR version with the multi-device fields the placed-model writer uses.
MULTI_DEVICE_IR_VERSION = 11
#: Name of the ``DeviceConfigurationProto`` the placed-model writer adds.
CONFIGURATION = "baechi"
#: Node ``metadata_props`` key holding the node's device name in a placed model.
DEVICE_KEY = "baechi.device"
INPUT_OP = "Input"
_DEFAULT_DOMAINS = ("", "ai.onnx")
_INTEGER_TYPES = frozenset({2, 3, 4, 5, 6, 7, 12, 13})
_SMALL_TENSOR = 1024  # elements: external integer tensors up to this size are loaded for inference
_COPY_BYTES = 1 << 20  # the writer copies its source's unchanged bytes this many at a time
# An external tensor's record (name, dims, location, offset) is smaller than this; the writer
# looks for external locations only in initializers this small (a bigger one holds its data).
_EXTERNAL_RECORD_BYTES = 1 << 16
# Raw bytes above which a non-integer top-level initializer is a weight that checking and
# shape inference do without (module docstring, step 4).
_WEIGHT_BYTES = 4096
_TENSOR_RAW_DATA = 9  # TensorProto.raw_data's field number
#: Characters of an onnx or onnxruntime error message kept (:func:`~baechi_cli.core.errors.one_line`).
MESSAGE_LIMIT = 300


class OnnxRead(NamedTuple):
    """What :func:`read_onnx_with_notes` returns."""

    graph: OpGraph
    notes: list[str]  # one line each, for the report: external data, guessed sizes
    opset: int  # the default-domain opset


class _Tensor(NamedTuple):
    shape: tuple[int, ...] | None
    dtype: str
    nbytes: int
    guessed: bool


_OMITTED = _Tensor(None, "", 0, False)  # an omitted optional input or output


class SubgraphNode(NamedTuple):
    """One node of an If/Loop/Scan subgraph, as the cost model sees an op (``attrs["_subgraph_nodes"]``)."""

    name: str  # "<graph attribute>/<node name, or <op_type>_<index in its graph>>": "then_branch/MatMul_0"
    op_type: str  # domain-prefixed as an op's
    attrs: dict[str, Any]  # decoded as an op's; see the module docstring
    output_shapes: list[tuple[int, ...] | None]
    output_dtypes: list[str]
    output_bytes: list[int]


def read_onnx(path: str, *, batch_size: int | None = None, dims: Mapping[str, int] | None = None) -> OpGraph:
    """Read an ONNX model into an OpGraph (see the module docstring)."""
    return read_onnx_with_notes(path, batch_size=batch_size, dims=dims).graph


def read_onnx_with_notes(
    path: str,
    *,
    batch_size: int | None = None,
    dims: Mapping[str, int] | None = None,
    infer_shapes: str = "onnx",
) -> OnnxRead:
    """Like :func:`read_onnx`, with the notes a report should show and the opset.

    ``infer_shapes="run"`` sizes what inference and baechi's propagation leave unknown by
    running the model once in onnxruntime on zero inputs (:func:`~baechi_cli.io.onnx_shapes.shapes_from_run`).
    """
    if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):
        raise InputError(f"the batch size must be a positive integer, not {batch_size}")
    binding: dict[str, int] = {}
    for name, value in (dims or {}).items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"--dim {name}={value}: the value must be a positive integer")
        binding[str(name)] = value
    try:
        with mapped_input(path, "ONNX") as source:
            data, weights = _without_weights(source)
        return _read(path, data, weights, batch_size, binding, infer_shapes == "run")
    except InputError as err:
        raise err.with_path(path) from None


def onnx_node_ops(graph: OpGraph, num_ops: int | None = None) -> list[int]:
    """The ops (among the first ``num_ops``) that are the model's nodes, in node order.

    ``Input`` ops and synthesized ops (``--training``) are not nodes; position
    ``i`` of the result is node ``i`` of the file.
    """
    upto = graph.num_ops if num_ops is None else num_ops
    ops = [v for v in range(upto) if "_onnx_node" in graph.attrs[v]]
    ops.sort(key=lambda v: graph.attrs[v]["_onnx_node"])
    return ops


def module_map_of(graph: OpGraph, num_ops: int, device_name: Sequence[str]) -> ModuleMap | None:
    """The PyTorch module map of a placement of an ONNX export (``device_name[v]``: op v's device).

    None when no node has a module path (not a PyTorch export). See
    :func:`baechi_cli.io.torch_modules.module_map`.
    """
    ops = onnx_node_ops(graph, num_ops)
    paths = [graph.attrs[v].get("_module") for v in ops]
    if all(p is None for p in paths):
        return None
    owners = [
        [m for m in map(parameter_module, graph.attrs[v].get("_initializers", ())) if m is not None]
        for v in ops
    ]
    return module_map(paths, [device_name[v] for v in ops], [graph.names[v] for v in ops], owners)


def write_placed_onnx(
    src_path: str, device_of_node: Sequence[str | None], device_names: Sequence[str], output: str
) -> list[str]:
    """Write ``src_path``'s model to ``output`` with each node annotated with its device.

    ``device_of_node[i]`` is the device of ``model.graph.node[i]`` (None:
    leave that node unannotated), one of ``device_names``. Returns the notes
    a report should show (empty, or one about external data, below).

    Encoding, ONNX's multi-device fields (IR version 11, ONNX 1.18+):

    * ``ModelProto.configuration`` gains a ``DeviceConfigurationProto`` named
      :data:`CONFIGURATION` (``"baechi"``) with ``num_devices`` and
      ``device`` = ``device_names``, in order; device k is index k.
    * Each annotated node gets a ``NodeDeviceConfigurationProto`` with that
      ``configuration_id`` and one ``ShardingSpecProto`` per distinct
      non-empty input and output name, in input-then-output order, with
      ``device: [k]`` and no ``sharded_dim``. In ONNX's sharding formalism
      (docs/proposals/0007-ShardingFormalism.md) a node first brings its
      inputs into the form its specs give, runs, and leaves its outputs in
      theirs; a spec over one device with no sharded axis is the whole,
      unsplit tensor on that device. So inputs and outputs on device k say
      "this node runs whole on device k, and its inputs are sent there":
      Baechi's model, transfers included. Outputs alone would not do: an
      input without a spec is taken to stay where its producer left it,
      which says nothing about where the node itself runs. No
      ``pipeline_stage`` is set (a placement is not a pipeline schedule).
    * The same device name in ``NodeProto.metadata_props`` under
      :data:`DEVICE_KEY` (``"baechi.device"``), for readers that know IR 10
      but not the multi-device fields.
    * ``ir_version`` becomes at least 11; nothing else changes. Re-placing a
      placed model is idempotent: the configuration named ``"baechi"``, a
      node's entry for it and its ``baechi.device`` entry are replaced where
      they stand (removed from nodes whose device is None); other
      configurations, entries and metadata are kept. Subgraph nodes (If,
      Loop bodies) are not annotated: they run with their node.

    External data is not loaded and the references are written as they are
    (locations unchanged), so a model whose weight files are absent is still
    placed. The locations are relative to the model file: when ``output`` is
    in another directory than ``src_path`` the note names the files to copy
    there (nothing is copied: weight files can be gigabytes; onnx and onnxruntime
    refuse a symbolic link).

    The model is not checked again (:func:`read_onnx` checks it): a model it
    accepts still passes ``onnx.checker`` once placed, and onnxruntime runs it
    with the same results (both observed with onnx 1.23 / onnxruntime 1.31).
    Only the nodes, ``ir_version`` and the configurations are parsed and
    serialized again (deterministically: same input, same bytes); every
    other byte, the weights above all, is copied from the source as it
    stands (:class:`_Layout`), without a second copy of the model in memory
    and without re-serializing the weights. Written whole or
    not at all. An unreadable or non-ONNX input is an
    InputError naming ``src_path``; an unwritable output one naming
    ``output``. Lengths that differ or a device not in ``device_names`` raise
    ValueError: a placement gives every node a known device, so that is a
    bug upstream. O(model size).

    Example:
        >>> import tempfile, os, onnx
        >>> from onnx import TensorProto, helper
        >>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
        >>> y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
        >>> nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
        >>> graph = helper.make_graph(nodes, "g", [x], [y])
        >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        >>> src = os.path.join(tempfile.mkdtemp(), "m.onnx")
        >>> onnx.save(model, src)
        >>> out = os.path.join(os.path.dirname(src), "placed.onnx")
        >>> write_placed_onnx(src, ["/device:GPU:0", "/device:GPU:1"], ["/device:GPU:0", "/device:GPU:1"], out)
        []
        >>> placed = onnx.load(out)
        >>> placed.ir_version, placed.configuration[0].name, list(placed.configuration[0].device)
        (11, 'baechi', ['/device:GPU:0', '/device:GPU:1'])
        >>> neg = placed.graph.node[1]
        >>> [(s.tensor_name, list(s.device)) for s in neg.device_configurations[0].sharding_spec]
        [('r', [1]), ('y', [1])]
        >>> [(e.key, e.value) for e in neg.metadata_props]
        [('baechi.device', '/device:GPU:1')]
    """
    import onnx

    index: dict[str, int] = {}
    for k, name in enumerate(device_names):
        if name in index:
            raise ValueError(f"device name {name!r} appears twice in device_names")
        index[name] = k
    with mapped_input(src_path, "ONNX") as source:
        try:
            layout = _Layout(source)
            nodes = layout.nodes()
            locations = layout.external_locations(nodes)
        except InputError as err:
            raise err.with_path(src_path) from None
        if len(device_of_node) != len(nodes):
            raise ValueError(f"{len(device_of_node)} devices for the {len(nodes)} nodes of {src_path}")
        unknown = sorted({d for d in device_of_node if d is not None and d not in index})
        if unknown:
            raise ValueError(f"device {unknown[0]!r} is not one of device_names {list(device_names)}")

        configurations = layout.configurations()
        config = onnx.DeviceConfigurationProto(
            name=CONFIGURATION, num_devices=len(device_names), device=list(device_names)
        )
        _put(configurations, lambda c: c.name == CONFIGURATION, config)
        for node, device in zip(nodes, device_of_node):
            entry = spec = None
            if device is not None:
                tensors = dict.fromkeys(t for t in (*node.input, *node.output) if t)
                spec = onnx.NodeDeviceConfigurationProto(
                    configuration_id=CONFIGURATION,
                    sharding_spec=[
                        onnx.ShardingSpecProto(tensor_name=t, device=[index[device]]) for t in tensors
                    ],
                )
                entry = onnx.StringStringEntryProto(key=DEVICE_KEY, value=device)
            _put(node.device_configurations, lambda c: c.configuration_id == CONFIGURATION, spec)
            _put(node.metadata_props, lambda e: e.key == DEVICE_KEY, entry)
        notes = _external_data_notes(locations, src_path, output)
        ir_version = max(layout.ir_version(), MULTI_DEVICE_IR_VERSION)
        write_atomic(output, layout.placed(ir_version, nodes, configurations))
    return notes


# ----------------------------------------------------------------- writing


def _put(entries: Any, match: Callable[[Any], bool], entry: Any) -> None:
    """Set ``entry`` where the first entry that ``match``es stands (else append); drop other matches.

    ``entry`` None removes every match.
    """
    found = [i for i, e in enumerate(entries) if match(e)]
    for i in reversed(found if entry is None else found[1:]):
        del entries[i]
    if entry is not None and found:
        entries[found[0]].CopyFrom(entry)
    elif entry is not None:
        entries.append(entry)


def _external_data_notes(locations: set[str], src_path: str, output: str) -> list[str]:
    """A note naming the external data files to copy when ``output`` is in another directory."""
    src_dir = os.path.dirname(os.path.abspath(src_path))
    out_dir = os.path.dirname(os.path.abspath(output))
    if not locations or os.path.realpath(src_dir) == os.path.realpath(out_dir):
        return []
    return [
        f"the placed model reads its external data from {', '.join(sorted(locations))} beside it: "
        f"copy {'it' if len(locations) == 1 else 'them'} from {src_dir} to {out_dir} "
        "(onnx and onnxruntime refuse a symbolic link)"
    ]


class _Layout:
    """Where a serialized ModelProto's fields lie (:mod:`baechi_cli.io.protowire`), for a writer
    that re-serializes the nodes and the configurations and copies every other byte.

    Protobuf merges repeated occurrences of a message field (the graph's are
    read as one, their fields in file order) and keeps the last of a scalar
    (``ir_version``). InputError when the bytes are not a model with a graph
    with nodes, as :func:`parse_model` says it.
    """

    MODEL_IR_VERSION, MODEL_GRAPH, MODEL_FUNCTIONS, MODEL_CONFIGURATION = 1, 7, 25, 26
    GRAPH_NODE, GRAPH_INITIALIZER = 1, 5
    TENSOR_EXTERNAL_DATA, TENSOR_DATA_LOCATION = 13, 14

    def __init__(self, source: Any) -> None:
        self.source = source
        try:
            self.top = protowire.fields(source)
            graphs = [f for f in self.top if f.number == self.MODEL_GRAPH]
            self.graph = [g for f in graphs for g in protowire.fields(source, f.payload, f.end)]
        except ValueError:
            raise InputError("not an ONNX model: binary protobuf parse failed") from None
        if not graphs:
            raise InputError("not an ONNX model: the protobuf holds no model graph")
        if not any(f.number == self.GRAPH_NODE for f in self.graph):
            raise InputError("not an ONNX model: the graph has no nodes")

    def _parse(self, message: Any, field: protowire.Field) -> Any:
        try:
            return message.FromString(self.source[field.payload : field.end])
        except Exception:  # DecodeError
            raise InputError("not an ONNX model: binary protobuf parse failed") from None

    def nodes(self) -> list[NodeProto]:
        from onnx import NodeProto

        return [self._parse(NodeProto, f) for f in self.graph if f.number == self.GRAPH_NODE]

    def configurations(self) -> list[Any]:
        from onnx import DeviceConfigurationProto

        return [
            self._parse(DeviceConfigurationProto, f) for f in self.top if f.number == self.MODEL_CONFIGURATION
        ]

    def ir_version(self) -> int:
        found = [f for f in self.top if f.number == self.MODEL_IR_VERSION and f.wire_type == protowire.VARINT]
        return protowire.read_varint(self.source, found[-1]) if found else 0

    def external_locations(self, nodes: list[NodeProto]) -> set[str]:
        """The ``location`` of every external tensor: top-level initializers (read off the
        wire: their data is never parsed), subgraphs' and attributes' (from ``nodes``), functions'."""
        from onnx import FunctionProto, GraphProto, ModelProto, StringStringEntryProto, TensorProto
        from onnx.external_data_helper import _get_all_tensors

        found = set()
        for f in self.graph:
            if f.number != self.GRAPH_INITIALIZER or f.end - f.payload > _EXTERNAL_RECORD_BYTES:
                continue  # a tensor that big holds its data
            try:
                tensor = protowire.fields(self.source, f.payload, f.end)
            except ValueError:
                raise InputError("not an ONNX model: binary protobuf parse failed") from None
            location = [t for t in tensor if t.number == self.TENSOR_DATA_LOCATION]
            if location and protowire.read_varint(self.source, location[-1]) == TensorProto.EXTERNAL:
                for t in tensor:
                    if t.number == self.TENSOR_EXTERNAL_DATA:
                        entry = self._parse(StringStringEntryProto, t)
                        if entry.key == "location" and entry.value:
                            found.add(entry.value)
        functions = [self._parse(FunctionProto, f) for f in self.top if f.number == self.MODEL_FUNCTIONS]
        rest = ModelProto(graph=GraphProto(node=nodes), functions=functions)
        for t in _get_all_tensors(rest):
            if t.data_location == TensorProto.EXTERNAL:
                found.update(e.value for e in t.external_data if e.key == "location" and e.value)
        return found

    def placed(self, ir_version: int, nodes: list[NodeProto], configurations: list[Any]) -> Iterator[bytes]:
        """The placed model's bytes, in parts: ``ir_version`` where the first stood (else first),
        the graph where its first occurrence stood with ``nodes`` then its other fields as they
        are, every other field as it is, ``configurations`` last."""
        wire = protowire
        node_bytes = [
            wire.message_field(self.GRAPH_NODE, n.SerializeToString(deterministic=True)) for n in nodes
        ]
        graph_rest = self._ranges(f for f in self.graph if f.number != self.GRAPH_NODE)
        graph_length = sum(map(len, node_bytes)) + sum(end - start for start, end in graph_rest)
        version = wire.tag(self.MODEL_IR_VERSION, wire.VARINT) + wire.varint(ir_version)
        if not any(f.number == self.MODEL_IR_VERSION for f in self.top):
            yield version
        kept: list[protowire.Field] = []  # fields copied as they are, up to the next one rewritten
        placed_graph = placed_version = False
        for f in self.top:
            if f.number == self.MODEL_IR_VERSION:
                if not placed_version:
                    yield from self._copy(self._ranges(kept))
                    kept.clear()
                    yield version
                    placed_version = True
            elif f.number == self.MODEL_GRAPH:
                if not placed_graph:
                    yield from self._copy(self._ranges(kept))
                    kept.clear()
                    yield wire.tag(self.MODEL_GRAPH, wire.LENGTH_DELIMITED) + wire.varint(graph_length)
                    yield from node_bytes
                    yield from self._copy(graph_rest)
                    placed_graph = True
            elif f.number != self.MODEL_CONFIGURATION:
                kept.append(f)
        yield from self._copy(self._ranges(kept))
        for c in configurations:
            yield wire.message_field(self.MODEL_CONFIGURATION, c.SerializeToString(deterministic=True))

    def _copy(self, ranges: list[tuple[int, int]]) -> Iterator[bytes]:
        """The source's bytes in ``ranges``, a MiB at a time: each copy is freed before the next
        is made (larger copies come from fresh pages each time, which are slow to write)."""
        for start, end in ranges:
            for at in range(start, end, _COPY_BYTES):
                yield self.source[at : min(end, at + _COPY_BYTES)]

    @staticmethod
    def _ranges(found: Iterable[protowire.Field]) -> list[tuple[int, int]]:
        """The byte ranges of ``found`` (in file order), adjacent ones joined."""
        out: list[tuple[int, int]] = []
        for f in found:
            if out and out[-1][1] == f.start:
                out[-1] = (out[-1][0], f.end)
            else:
                out.append((f.start, f.end))
        return out


# ----------------------------------------------------------------- steps


def _read(
    path: str, data: bytes, weights: set[str], batch_size: int | None, binding: dict[str, int], run: bool
) -> OnnxRead:
    """Steps 1-5 of the module docstring on ``data``, whose ``weights`` (initializer names) were dropped."""
    model = parse_model(data)
    opset = _check_opset(model)
    notes: list[str] = []
    external = _external_data(model, os.path.dirname(os.path.abspath(path)), notes)
    check_model(model, external | weights)
    declared = _bind(model.graph, batch_size, binding)
    inferred = _infer(model)
    types = _complete(path, model, inferred, run, notes)
    graph, guessed, inner = _build(inferred, types, declared, binding)
    if guessed:
        within = f" ({inner} of them in If/Loop/Scan subgraphs)" if inner else ""
        notes.append(
            f"{guessed} output(s){within} have sizes shape inference could not determine (data-dependent, "
            "or from external data not loaded); counted as 1 per unknown dim, 0 bytes for unknown rank"
        )
    return OnnxRead(graph, notes, opset)


def _complete(
    path: str, model: ModelProto, inferred: GraphProto, run: bool, notes: list[str]
) -> dict[str, TypeProto]:
    """The value types of ``inferred``, completed (:mod:`~baechi_cli.io.onnx_shapes`) where ONNX's
    inference left shapes unknown; with ``run``, the rest from one onnxruntime run."""
    from onnx import helper

    from baechi_cli.io.onnx_shapes import complete_shapes, unknown_values

    types = _types(inferred)
    left = unknown_values(inferred, types)
    if not left:
        return types
    types = complete_shapes(inferred, list(model.opset_import))
    still = unknown_values(inferred, types)
    if len(still) < len(left):
        notes.append(
            f"{len(left) - len(still)} output size(s) ONNX's shape inference left unknown were "
            "computed by baechi's shape propagation"
        )
    if run and still:
        measured = _run_shapes(path, model, still)
        for name, shape in measured.items():
            elem = types[name].tensor_type.elem_type if name in types else 0
            if elem:
                types[name] = helper.make_tensor_type_proto(elem, list(shape))
        notes.append(f"{len(measured)} output size(s) measured by one onnxruntime run on zero inputs")
    return types


def _run_shapes(path: str, model: ModelProto, names: list[str]) -> dict[str, tuple[int, ...]]:
    """``names``' shapes from :func:`~baechi_cli.io.onnx_shapes.shapes_from_run` on the file at
    ``path`` (weights loaded), fed zeros of the bound graph inputs' shapes."""
    import onnx
    from onnx import helper

    from baechi_cli.io.onnx_shapes import shapes_from_run

    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise MissingDependencyError(
            "--infer-shapes run needs onnxruntime: pip install 'baechi[onnx]'"
        ) from None
    inits = _initializer_names(model.graph)
    feeds = {
        info.name: (
            tuple(d.dim_value for d in _dims(info.type)),
            helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type),
        )
        for info in model.graph.input
        if info.name not in inits
    }
    try:
        full = onnx.load(path, load_external_data=True).SerializeToString()
        return shapes_from_run(full, names, feeds)
    except Exception as err:  # onnxruntime's own errors (a failed kernel, a model it cannot load)
        raise InputError(
            f"--infer-shapes run: onnxruntime could not run the model on zero inputs: {one_line(err, MESSAGE_LIMIT)}"
        ) from None


def parse_model(data: bytes) -> ModelProto:
    """``data`` as a ModelProto with a graph of at least one node, else an InputError."""
    import onnx
    from google.protobuf.message import DecodeError

    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError):
        raise InputError("not an ONNX model: binary protobuf parse failed") from None
    if not model.HasField("graph"):
        # A GraphDef starts with a node (field 1, a message: tag 0x0a); a ModelProto with ir_version.
        hint = " (it looks like a TensorFlow GraphDef: name it .pb)" if data[:1] == b"\x0a" else ""
        raise InputError(f"not an ONNX model: the protobuf holds no model graph{hint}")
    if not model.graph.node:
        raise InputError("not an ONNX model: the graph has no nodes")
    field = _undecodable_string(model)
    if field is not None:
        raise InputError(f"not an ONNX model: a string ({field}) is not UTF-8 text")
    return model


def _undecodable_string(model: ModelProto) -> str | None:
    """``Message.field`` of the first string field that is not UTF-8, or None. O(model size).

    onnx.proto is proto2, whose parser keeps such a string as ``bytes``
    instead of failing; everything downstream expects ``str``.
    """
    stack: list[Any] = [model]
    while stack:
        message = stack.pop()
        for fd, value in message.ListFields():
            repeated = fd.is_repeated
            if fd.type == fd.TYPE_STRING:
                if any(isinstance(v, bytes) for v in (value if repeated else (value,))):
                    return f"{message.DESCRIPTOR.name}.{fd.name}"
            elif fd.message_type is not None and repeated:  # onnx.proto has no map fields
                stack.extend(value)
            elif fd.message_type is not None:
                stack.append(value)
    return None


def _check_opset(model: ModelProto) -> int:
    versions = [o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS]
    if not versions:
        raise InputError("the model imports no default-domain (ai.onnx) opset")
    opset = max(versions)
    if opset < MIN_OPSET:
        raise InputError(
            f"the model uses ONNX opset {opset}; opset {MIN_OPSET} or newer is needed: convert it with "
            f"onnx.version_converter.convert_version(model, {MIN_OPSET})"
        )
    return opset


def _external_data(model: ModelProto, base_dir: str, notes: list[str]) -> set[str]:
    """Note the external tensors; load the small integer ones whose file exists.

    Returns the names of top-level initializers whose data stays external.
    """
    from onnx import TensorProto
    from onnx.external_data_helper import _get_all_tensors, load_external_data_for_tensor

    count = nbytes = 0
    locations: dict[str, bool] = {}  # location -> file exists
    for tensor in _get_all_tensors(model):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        exists = locations.get(location)
        if exists is None:
            exists = locations[location] = bool(location) and os.path.isfile(os.path.join(base_dir, location))
        if exists and tensor.data_type in _INTEGER_TYPES and math.prod(tensor.dims) <= _SMALL_TENSOR:
            try:
                load_external_data_for_tensor(tensor, base_dir)
                continue
            except Exception:  # a bad offset or a path outside base_dir: keep it external
                pass
        count += 1
        nbytes += _tensor_bytes(tensor, f"tensor '{_q(tensor.name)}'")
    if count:
        missing = sorted(loc for loc, ok in locations.items() if not ok)
        where = ", ".join(sorted(locations)) or "?"
        absent = f"; missing: {', '.join(missing)}" if missing else ""
        notes.append(
            f"external data not loaded: {count} tensor(s), {nbytes} bytes in {where}{absent}; "
            "placement uses their dims only"
        )
    return {t.name for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL}


def _without_weights(source: Any) -> tuple[bytes, set[str]]:
    """The serialized model in ``source`` without the raw bytes of its top-level weights (module
    docstring, step 4), and their names; the bytes as they are when they are not a message.

    Done on the wire (:mod:`baechi_cli.io.protowire`), so the weights are never
    parsed or copied. InputError when a weight's bytes do not match its dims
    and type. O(fields of the model and its graph).
    """
    from google.protobuf.message import DecodeError

    wire = protowire
    dropped: set[str] = set()
    parts: list[bytes] = []
    try:
        for f in wire.fields(source):
            if f.number != _Layout.MODEL_GRAPH:
                parts.append(source[f.start : f.end])
                continue
            graph = [
                _without_raw_data(source, g, dropped)
                if g.number == _Layout.GRAPH_INITIALIZER
                else source[g.start : g.end]
                for g in wire.fields(source, f.payload, f.end)
            ]
            parts.append(wire.message_field(f.number, b"".join(graph)))
    except (ValueError, RuntimeError, DecodeError):
        return source[:], set()  # not a message: parse_model says why
    return b"".join(parts), dropped


def _without_raw_data(source: Any, initializer: protowire.Field, dropped: set[str]) -> bytes:
    """An initializer field as it is, or, for a weight, without its raw data (its name in ``dropped``)."""
    from onnx import TensorProto

    whole = initializer.start, initializer.end
    if initializer.end - initializer.payload <= _WEIGHT_BYTES:
        return source[slice(*whole)]
    fields = protowire.fields(source, initializer.payload, initializer.end)
    raw = [f for f in fields if f.number == _TENSOR_RAW_DATA and f.wire_type == protowire.LENGTH_DELIMITED]
    if not raw or raw[-1].end - raw[-1].payload <= _WEIGHT_BYTES:
        return source[slice(*whole)]
    rest = b"".join(source[f.start : f.end] for f in fields if f.number != _TENSOR_RAW_DATA)
    tensor = TensorProto.FromString(rest)
    if tensor.data_location == TensorProto.EXTERNAL or tensor.data_type in _INTEGER_TYPES:
        return source[slice(*whole)]
    what = f"initializer '{_q(tensor.name)}'"
    have, need = raw[-1].end - raw[-1].payload, _tensor_bytes(tensor, what)
    if have != need:
        raise InputError(f"{what} holds {have} bytes; its dims and type need {need}")
    dropped.add(tensor.name)
    return protowire.message_field(_Layout.GRAPH_INITIALIZER, rest)


def check_model(model: ModelProto, external: set[str]) -> None:
    """``onnx.checker`` (not full) on ``model``; the initializers named in ``external`` need no file.

    Its message, on one line, is the InputError.
    """
    import onnx

    checked = model
    if external:
        # The checker opens external files relative to the working directory;
        # check a copy where those initializers are graph inputs of their type.
        checked = onnx.ModelProto()
        checked.CopyFrom(model)
        graph = checked.graph
        inputs = {i.name for i in graph.input}
        kept = [t for t in graph.initializer if t.name not in external]
        for t in graph.initializer:
            if t.name in external and t.name not in inputs:
                graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        del graph.initializer[:]
        graph.initializer.extend(kept)
    try:
        onnx.checker.check_model(checked, full_check=False)
    except Exception as err:  # ValidationError, or ValueError for a model over 2 GB
        raise InputError(f"fails the ONNX checker: {one_line(err, MESSAGE_LIMIT)}") from None


def _bind(graph: GraphProto, batch_size: int | None, binding: dict[str, int]) -> set[str]:
    """Make the graph inputs' dims concrete, in place; return the declared dim names.

    ``binding`` gains the names ``batch_size`` binds.
    """
    inits = _initializer_names(graph)
    declared: set[str] = set()
    everywhere: set[str] = set()
    # Dims named only on outputs or value_info are the exporter's names for sizes that depend on
    # data (a Loop's trip count, NonZero's count): nothing to bind, so a guess, not an error.
    for values, into in ((graph.input, declared), (graph.output, everywhere), (graph.value_info, everywhere)):
        for info in values:
            if info.name in inits:
                continue
            for dim in _dims(info.type):
                if dim.WhichOneof("value") == "dim_param":
                    into.add(dim.dim_param)
    unknown = sorted(set(binding) - declared - everywhere)
    if unknown:
        known = truncate(", ".join(sorted(declared | everywhere)), MESSAGE_LIMIT) or "none"
        raise InputError(
            f"--dim {_q(unknown[0])}: the model has no symbolic dim of that name (its dims: {known})"
        )
    feeds = [info for info in graph.input if info.name not in inits]
    if batch_size is not None:
        for info in feeds:
            dims = _dims(info.type)
            if dims:
                kind = dims[0].WhichOneof("value")
                if kind == "dim_param" and dims[0].dim_param not in binding:
                    binding[dims[0].dim_param] = batch_size
                elif kind is None:
                    dims[0].dim_value = batch_size
    for values in (graph.input, graph.output, graph.value_info):
        for info in values:
            for dim in _dims(info.type):
                if dim.WhichOneof("value") == "dim_param" and dim.dim_param in binding:
                    dim.dim_value = binding[dim.dim_param]  # clears dim_param (a oneof)
    for info in feeds:
        _check_feed(info)
    return declared


def _check_feed(info: Any) -> None:
    t = info.type
    if t.WhichOneof("value") != "tensor_type" or DTYPES.get(t.tensor_type.elem_type, ("", 1))[1] == 0:
        return
    if not t.tensor_type.HasField("shape"):
        raise InputError(
            f"graph input '{_q(info.name)}' has unknown rank, so its size cannot be estimated; "
            "export the model with input shapes"
        )
    for axis, dim in enumerate(t.tensor_type.shape.dim):
        kind = dim.WhichOneof("value")
        if kind == "dim_value":
            continue
        hint = " or --batch-size" if axis == 0 else ""
        if kind == "dim_param":
            raise InputError(
                f"graph input '{_q(info.name)}' has symbolic dim '{_q(dim.dim_param)}' (axis {axis}) with no "
                f"value; pass --dim {_q(dim.dim_param)}=VALUE{hint}"
            )
        fix = "pass --batch-size" if axis == 0 else "export the model with a named or fixed dim there"
        raise InputError(f"graph input '{_q(info.name)}' has an unknown dim at axis {axis}; {fix}")


def _infer(model: ModelProto) -> GraphProto:
    """The model's graph after shape inference: the same nodes, with the types it inferred."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(
            model, check_type=False, strict_mode=False, data_prop=True
        )
    except Exception as err:  # InferenceError, or anything the C++ side raises
        raise InputError(f"ONNX shape inference failed: {one_line(err, MESSAGE_LIMIT)}") from None
    return inferred.graph


def _types(graph: GraphProto) -> dict[str, TypeProto]:
    """Value name -> its type, from one (inferred) graph's inputs, outputs and value_info."""
    types: dict[str, TypeProto] = {}
    for values in (graph.input, graph.output, graph.value_info):
        for info in values:
            if info.HasField("type"):
                types[info.name] = info.type
    return types


# ----------------------------------------------------------------- building


def _build(
    graph: GraphProto, types: Mapping[str, TypeProto], declared: set[str], binding: dict[str, int]
) -> tuple[OpGraph, int, int]:
    """The OpGraph of the inferred ``graph`` whose values have ``types``, the number of output
    ports whose size is a guess, and how many of those are subgraph nodes'."""
    inits = _initializers(graph)
    feeds = [(i, info) for i, info in enumerate(graph.input) if info.name not in inits]
    nodes = list(graph.node)
    modules = module_paths(
        [n.name for n in nodes],
        [{p.key: p.value for p in n.metadata_props} if n.metadata_props else None for n in nodes],
        _initializer_names(graph),
    )
    names = _unique_names([info.name for _, info in feeds] + [n.name for n in nodes], len(feeds), nodes)

    builder = GraphBuilder()
    producer: dict[str, tuple[int, int]] = {}  # value name -> (op id, port)
    produced: dict[str, _Tensor] = {}  # value name -> its tensor
    consumers: dict[str, list[int]] = {}  # initializer name -> op ids, in op order
    outer_scope = ChainMap(produced, inits)  # what a subgraph may read from the top-level graph
    guessed = inner_guessed = 0

    for index, info in feeds:
        v = builder.num_ops
        t = _value(info.name, types.get(info.name, info.type), names[v], declared, binding)
        attrs: dict[str, Any] = {"_onnx_input": index}
        if t.guessed:
            attrs["_size_unknown"] = [0]
            guessed += 1
        builder.add_op(
            names[v], INPUT_OP, [t.nbytes], output_shapes=[t.shape], output_dtypes=[t.dtype], attrs=attrs
        )
        producer[info.name] = (v, 0)
        produced[info.name] = t

    for index, node in enumerate(nodes):
        v = len(feeds) + index
        name = names[v]
        outs = [_value(o, types.get(o), name, declared, binding) if o else _OMITTED for o in node.output]
        attrs = _decode_attrs(node.attribute)
        attrs["_onnx_node"] = index
        if modules[index] is not None:
            attrs["_module"] = modules[index]
        unknown = [p for p, t in enumerate(outs) if t.guessed]
        if unknown:
            attrs["_size_unknown"] = unknown
            guessed += len(unknown)

        edges: list[tuple[int, int]] = []
        data_inputs: list[int] = []  # the input position of each edge, in edge order
        used: list[str] = []  # initializers, in first-use order
        in_shapes: list[tuple[int, ...] | None] = []
        in_dtypes: list[str] = []
        for position, value in enumerate(node.input):
            if not value:
                in_shapes.append(None)
                in_dtypes.append("")
                continue
            if value in producer:
                src, port = producer[value]
                edges.append((src, port))
                data_inputs.append(position)
                in_shapes.append(produced[value].shape)
                in_dtypes.append(produced[value].dtype)
            elif value in inits:
                if value not in used:
                    used.append(value)
                in_shapes.append(inits[value].shape)
                in_dtypes.append(inits[value].dtype)
            else:
                raise InputError(
                    f"input '{_q(value)}' is produced by no node, graph input or initializer", op=name
                )
        persistent = 0
        subgraphs = _node_graphs(node)
        if subgraphs:
            walk = _SubgraphWalk(name, outer_scope, declared, binding)
            attrs["_subgraph_nodes"] = walk.graphs(subgraphs, ChainMap())
            attrs["_subgraph_ops"] = walk.count
            persistent += walk.initializer_bytes
            inner_guessed += walk.guessed
            explicit = set(node.input)
            for value in walk.outer:
                if value in explicit:
                    continue
                if value in producer:
                    edges.append(producer[value])
                elif value not in used:  # an initializer (the walk checked it is defined)
                    used.append(value)
        for value in used:
            consumers.setdefault(value, []).append(v)
        if used:
            attrs["_initializers"] = used
        attrs["_input_shapes"] = in_shapes
        attrs["_input_dtypes"] = in_dtypes
        attrs["_data_inputs"] = data_inputs

        op_type = node.op_type if node.domain in _DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"
        builder.add_op(
            name,
            op_type,
            [t.nbytes for t in outs],
            persistent_bytes=persistent,
            output_shapes=[t.shape for t in outs],
            output_dtypes=[t.dtype for t in outs],
            attrs=attrs,
        )
        for port, value in enumerate(node.output):
            if value:
                producer[value] = (v, port)
                produced[value] = outs[port]
        for src, port in edges:
            builder.add_edge(src, v, port)

    # The caller holds what it feeds and what it is returned for the whole step.
    for _, info in feeds:
        builder.hold(*producer[info.name])
    for info in graph.output:
        if info.name in producer:  # not an initializer's value
            builder.hold(*producer[info.name])
    built = builder.build()
    scopes = [None] * len(feeds) + [_call_scope(node.name) for node in nodes]
    built = built.replace(scope_holds=scope_holds(built, scopes))
    return own_initializers(built, inits, consumers), guessed + inner_guessed, inner_guessed


def _call_scope(name: str) -> list[str] | None:
    """The module calls a node ran in, outermost first, from the TorchScript exporter's name
    (``/encoder/layer.0/attention/MatMul``: ``encoder``, ``layer.0``, ``attention``); None when
    the name is not of that form."""
    if not name.startswith("/") or name.count("/") < 2:
        return None
    return name.split("/")[1:-1]


def scope_holds(graph: OpGraph, scopes: Sequence[list[str] | None]) -> tuple[tuple[int, int, int], ...]:
    """What eager PyTorch's Python frames keep alive (:attr:`OpGraph.scope_holds`).

    A tensor an op reads from outside its module call was passed into that
    call (or into a call around it), and the caller holds its arguments until
    the call returns: so the tensor lives at least until the last op of the
    outermost call it entered. ``scopes[v]`` is op v's calls (None: unknown,
    no hold); a call is a scope prefix, its last op the last in op order (the
    trace's order). Measured on transformers' ResNet-50 in ``eval()``: the
    input of each conv stays while its batch norm runs, as the module that
    called both holds it.

    A module called several times that has submodules is not one call: the
    exporter marks a repeated call on the last scope of a name only
    (``layer_3/Add``, but ``layer/attention_3/MatMul`` for its submodule), so
    the prefix ``layer`` covers every call. No hold is taken at such a prefix;
    the tensor is held by the innermost call it entered that is one (else a
    layer module called twelve times, as ALBERT's, would hold every layer's
    inputs to the twelfth call's end). O(E x scope depth).
    """
    last: dict[tuple[str, ...], int] = {}
    for v, scope in enumerate(scopes):
        for k in range(1, len(scope or ()) + 1):
            last[tuple(scope[:k])] = v  # type: ignore[index]
    repeated = set()  # prefixes whose last scope also appears as <scope>_<call>
    for scope in scopes:
        for k, name in enumerate(scope or ()):
            call = CALL_SUFFIX.fullmatch(name)
            if call:
                repeated.add((*scope[:k], call.group(1)))  # type: ignore[index]
    merged = repeated & {key[:-1] for key in last}  # ... that have submodules
    holds = set()
    for e in range(graph.num_edges):
        u, v, port = graph.edge_src[e], graph.edge_dst[e], graph.edge_port[e]
        inner = scopes[v]
        if inner is None or graph.op_types[u] == INPUT_OP:
            continue  # an input is held all step anyway
        outer = scopes[u] or []
        i = 0
        while i < len(inner) and i < len(outer) and inner[i] == outer[i]:
            i += 1
        while i < len(inner) and tuple(inner[: i + 1]) in merged:
            i += 1  # several calls under one prefix: the next scope in
        if i < len(inner):  # v's call i was entered with the tensor
            w = last[tuple(inner[: i + 1])]
            if w != v:
                holds.add((u, port, w))
    return tuple(sorted(holds))


def _unique_names(original: list[str], n_feeds: int, nodes: list[NodeProto]) -> list[str]:
    """Unique op names: original names claimed first, in op order; then the rest get suffixes."""
    names: list[str | None] = [None] * len(original)
    taken: set[str] = set()
    for v, name in enumerate(original):
        if name and name not in taken:
            taken.add(name)
            names[v] = name
    next_suffix: dict[str, int] = {}
    for v, name in enumerate(names):
        if name is not None:
            continue
        base = original[v] or f"{nodes[v - n_feeds].op_type}_{v - n_feeds}"
        candidate = base
        k = next_suffix.get(base, 0)
        while candidate in taken:
            k += 1
            candidate = f"{base}_{k}"
        next_suffix[base] = k
        taken.add(candidate)
        names[v] = candidate
    return names  # type: ignore[return-value]


class _SubgraphWalk:
    """One op's subgraphs, walked once: their nodes' records and what the op owes the outer scope.

    After :meth:`graphs`: ``count`` nodes at every depth, ``initializer_bytes``
    of the subgraphs' initializers, ``guessed`` inner output ports whose size
    is a guess, and ``outer``: the top-level values read, in first-use order.
    """

    def __init__(
        self, op: str, top: Mapping[str, _Tensor], declared: set[str], binding: dict[str, int]
    ) -> None:
        self.op = op  # the op's name, for error messages
        self.top = top  # the top-level graph's values defined before the op
        self.declared = declared
        self.binding = binding
        self.count = self.initializer_bytes = self.guessed = 0
        self.outer: dict[str, None] = {}  # an insertion-ordered set

    def graphs(
        self, graphs: list[tuple[str, GraphProto]], scope: ChainMap[str, _Tensor]
    ) -> list[SubgraphNode]:
        """The records of the nodes of ``graphs`` (labelled by attribute name), whose enclosing
        subgraphs' values are ``scope``. O(their nodes, inputs and value_info)."""
        records: list[SubgraphNode] = []
        for label, graph in graphs:
            local: dict[str, _Tensor] = dict(_initializers(graph))
            self.initializer_bytes += sum(t.nbytes for t in local.values())
            types = _types(graph)
            for info in graph.input:
                local[info.name] = self._value(info.name, types.get(info.name, info.type))
            inner = scope.new_child(local)  # lookups see this graph first, then the enclosing ones
            records += [
                self._node(f"{label}/{n.name or f'{n.op_type}_{k}'}", n, types, inner)
                for k, n in enumerate(graph.node)
            ]
        return records

    def _node(
        self, name: str, node: NodeProto, types: dict[str, TypeProto], scope: ChainMap[str, _Tensor]
    ) -> SubgraphNode:
        """The record of ``node``, labelled ``name``; its outputs join ``scope``'s innermost graph."""
        self.count += 1
        attrs = _decode_attrs(node.attribute)
        inputs = [self._read(value, scope) if value else _OMITTED for value in node.input]
        attrs["_input_shapes"] = [t.shape for t in inputs]
        attrs["_input_dtypes"] = [t.dtype for t in inputs]
        nested = _node_graphs(node)
        if nested:
            before = self.count
            attrs["_subgraph_nodes"] = self.graphs(nested, scope)
            attrs["_subgraph_ops"] = self.count - before
        outs = [self._value(o, types.get(o)) if o else _OMITTED for o in node.output]
        unknown = [p for p, t in enumerate(outs) if t.guessed]
        if unknown:
            attrs["_size_unknown"] = unknown
            self.guessed += len(unknown)
        scope.maps[0].update((o, t) for o, t in zip(node.output, outs) if o)
        op_type = node.op_type if node.domain in _DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"
        return SubgraphNode(
            name, op_type, attrs, [t.shape for t in outs], [t.dtype for t in outs], [t.nbytes for t in outs]
        )

    def _read(self, value: str, scope: ChainMap[str, _Tensor]) -> _Tensor:
        """``value`` from the innermost subgraph that defines it, else from the top-level graph."""
        tensor = scope.get(value)
        if tensor is not None:
            return tensor
        tensor = self.top.get(value)
        if tensor is None:
            raise InputError(
                f"a subgraph reads '{_q(value)}', which no outer node, input or initializer defines",
                op=self.op,
            )
        self.outer.setdefault(value)
        return tensor

    def _value(self, name: str, t: TypeProto | None) -> _Tensor:
        return _value(name, t, self.op, self.declared, self.binding)


def _node_graphs(node: NodeProto) -> list[tuple[str, GraphProto]]:
    """A node's subgraphs, labelled by attribute name (``name[i]`` in a GRAPHS attribute)."""
    graphs: list[tuple[str, GraphProto]] = []
    for a in node.attribute:
        if a.type == 5:  # GRAPH
            graphs.append((a.name, a.g))
        elif a.type == 10:  # GRAPHS
            graphs += [(f"{a.name}[{i}]", g) for i, g in enumerate(a.graphs)]
    return graphs


# ----------------------------------------------------------------- values


def _initializer_names(graph: GraphProto) -> set[str]:
    return {t.name for t in graph.initializer} | {s.values.name for s in graph.sparse_initializer}


def _initializers(graph: GraphProto) -> dict[str, _Tensor]:
    """Initializer name -> shape, dtype and bytes (from dims; data never read)."""
    out: dict[str, _Tensor] = {}
    for t in graph.initializer:
        what = f"initializer '{_q(t.name)}'"
        out[t.name] = _Tensor(tuple(t.dims), _dtype(t.data_type, what), _tensor_bytes(t, what), False)
    for s in graph.sparse_initializer:
        what = f"initializer '{_q(s.values.name)}'"
        _check_dims(s.dims, what)
        nbytes = _tensor_bytes(s.values, what) + _tensor_bytes(s.indices, what)
        out[s.values.name] = _Tensor(tuple(s.dims), _dtype(s.values.data_type, what), nbytes, False)
    return out


def _tensor_bytes(tensor: TensorProto, what: str) -> int:
    bits = DTYPES.get(tensor.data_type, (None, None))[1]
    if bits is None:
        raise InputError(f"{what} has unknown ONNX data type {tensor.data_type}")
    _check_dims(tensor.dims, what)
    return (math.prod(tensor.dims) * bits + 7) // 8


def _check_dims(dims: Sequence[int], what: str) -> None:
    """InputError when a dim is negative (the checker lets some through; a size would be negative)."""
    for axis, dim in enumerate(dims):
        if dim < 0:
            raise InputError(f"{what} has a negative dim ({dim}) at axis {axis}")


def _q(name: str) -> str:
    """A name from the file for a message, cut as an op's name is (a malformed file may hold megabytes)."""
    return truncate(name, OP_NAME_LIMIT)


def _dtype(elem_type: int, what: str) -> str:
    entry = DTYPES.get(elem_type)
    if entry is None:
        raise InputError(f"{what} has unknown ONNX data type {elem_type}")
    return entry[0]


def _dims(t: TypeProto) -> list:
    if t.WhichOneof("value") == "tensor_type" and t.tensor_type.HasField("shape"):
        return list(t.tensor_type.shape.dim)
    return []


def _value(name: str, t: TypeProto | None, op: str, declared: set[str], binding: dict[str, int]) -> _Tensor:
    """Shape, dtype and bytes of value ``name`` output by ``op``."""
    if t is None:
        return _Tensor(None, "", 0, True)
    kind = t.WhichOneof("value")
    if kind != "tensor_type":
        return _Tensor(
            None,
            {"sequence_type": "sequence", "optional_type": "optional", "map_type": "map"}.get(
                kind or "", "sparse"
            ),
            0,
            False,
        )
    tt = t.tensor_type
    if tt.elem_type == 0:
        return _Tensor(None, "", 0, True)
    dtype, bits = DTYPES.get(tt.elem_type, (None, 0))
    if dtype is None:
        raise InputError(f"tensor '{_q(name)}' has unknown ONNX data type {tt.elem_type}", op=op)
    if not tt.HasField("shape"):
        return _Tensor(None, dtype, 0, bits > 0)
    shape: list[int] = []
    guessed = False
    for axis, dim in enumerate(tt.shape.dim):
        which = dim.WhichOneof("value")
        if which == "dim_value" and dim.dim_value < 0:
            raise InputError(
                f"tensor '{_q(name)}' has a negative dim ({dim.dim_value}) at axis {axis}", op=op
            )
        if which == "dim_value":
            shape.append(dim.dim_value)
        elif which == "dim_param" and dim.dim_param in binding:
            shape.append(binding[dim.dim_param])
        elif which == "dim_param" and dim.dim_param in declared and bits:
            raise InputError(
                f"tensor '{_q(name)}' has symbolic dim '{_q(dim.dim_param)}' with no value; "
                f"pass --dim {_q(dim.dim_param)}=VALUE",
                op=op,
            )
        else:
            shape.append(1)
            guessed = bits > 0
    return _Tensor(tuple(shape), dtype, (math.prod(shape) * bits + 7) // 8, guessed)


# ----------------------------------------------------------------- attributes


def _decode_attrs(attributes: Any) -> dict[str, Any]:
    """Decoded node attributes (see the module docstring)."""
    out: dict[str, Any] = {}
    for a in attributes:
        t = a.type
        if t == 1:  # FLOAT
            out[a.name] = float(a.f)
        elif t == 2:  # INT
            out[a.name] = int(a.i)
        elif t == 3:  # STRING
            out[a.name] = a.s.decode("utf-8", "replace")
        elif t == 6:  # FLOATS
            out[a.name] = [float(f) for f in a.floats]
        elif t == 7:  # INTS
            out[a.name] = [int(i) for i in a.ints]
        elif t == 8:  # STRINGS
            out[a.name] = [s.decode("utf-8", "replace") for s in a.strings]
        elif t == 4:  # TENSOR
            out[f"{a.name}_shape"] = tuple(a.t.dims)
            out[f"{a.name}_dtype"] = DTYPES.get(a.t.data_type, ("", 0))[0]
        elif t == 11:  # SPARSE_TENSOR
            out[f"{a.name}_shape"] = tuple(a.sparse_tensor.dims)
            out[f"{a.name}_dtype"] = DTYPES.get(a.sparse_tensor.values.data_type, ("", 0))[0]
        # GRAPH(S), TENSORS, SPARSE_TENSORS, TYPE_PROTO(S): omitted
    return out
