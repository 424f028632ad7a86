"""TensorFlow GraphDef reader and placed-graph writer.

Contract
--------
:func:`read_graphdef` turns a binary (``.pb``) or text (``.pbtxt``) GraphDef
into an :class:`~baechi_cli.core.graph.OpGraph`, parsed with the project's own
schema (``proto/tf_graph.proto``), so reading never imports TensorFlow unless
the file lacks output shapes (see below). The format is decided by content:
text when the bytes look like text or the extension is ``.pbtxt``/``.txt``,
binary otherwise, the other format tried when the first fails.

* Ops get dense ids in NodeDef order; ``names`` keeps the NodeDef names.
* Edges: per node, its data inputs in NodeDef input order (``"x"`` is port 0,
  ``"x:k"`` port k), then its control inputs (``"^x"``, port
  :data:`~baechi_cli.core.graph.CONTROL_PORT`, 0 bytes).
* Output dtypes come from TF 2.21's op registry (``tf_op_registry.json``) or a library
  function's signature, named as ``tf.DType.name`` (:data:`DTYPE_NAMES`); output shapes
  from the ``_output_shapes`` attr, unknown dims being ``batch_size`` (without that attr,
  TensorFlow's shape inference runs when it is installed); bytes from
  :data:`DTYPE_SIZES`.
* ``attrs[v]``: every attr whose name does not start with ``_``, decoded; ``_class``
  gives ``colocate_with``; every Placeholder's tensor is held for the whole step.
* TF1 while loops close cycles through NextIteration -> Merge back edges;
  the reader keeps every edge: the control-flow pass removes those back
  edges and rejects every other cycle.

The whole mapping (dtypes, private attrs, backward marks): docs/formats.md,
"TensorFlow GraphDef".

Every problem with the input raises :class:`~baechi_cli.core.errors.InputError`
naming the file, the op when there is one, and the problem.

:func:`write_placed_graphdef` writes the input graph back with every
``NodeDef.device`` set and nothing else changed, atomically.
"""

from __future__ import annotations

import functools
import gc
import json
import math
import os
import re
from typing import TYPE_CHECKING, Any, NamedTuple

from baechi_cli.core.errors import OP_NAME_LIMIT, InputError, one_line, truncate
from baechi_cli.core.graph import CONTROL_PORT, GraphBuilder, OpGraph
from baechi_cli.io.files import read_input, write_atomic

if TYPE_CHECKING:
    from baechi_cli.proto_gen.tf_graph_pb2 import AttrValue, GraphDef, NodeDef, OpDef, TensorShapeProto

# (DataType enum value, TensorFlow's DType.name, DType.size in bytes). A *_REF
# enum is the base value + 100, named base name + "_ref", of the same size.
_BASE_DTYPES = (
    (1, "float32", 4),
    (2, "float64", 8),
    (3, "int32", 4),
    (4, "uint8", 1),
    (5, "int16", 2),
    (6, "int8", 1),
    (7, "string", 0),
    (8, "complex64", 8),
    (9, "int64", 8),
    (10, "bool", 1),
    (11, "qint8", 1),
    (12, "quint8", 1),
    (13, "qint32", 4),
    (14, "bfloat16", 2),
    (15, "qint16", 2),
    (16, "quint16", 2),
    (17, "uint16", 2),
    (18, "complex128", 16),
    (19, "float16", 2),
    (20, "resource", 0),
    (21, "variant", 0),
    (22, "uint32", 4),
    (23, "uint64", 8),
    (24, "float8_e5m2", 1),
    (25, "float8_e4m3fn", 1),
    (26, "float8_e4m3fnuz", 1),
    (27, "float8_e4m3b11fnuz", 1),
    (28, "float8_e5m2fnuz", 1),
    (29, "int4", 1),
    (30, "uint4", 1),
    (31, "int2", 1),
    (32, "uint2", 1),
    (33, "float4_e2m1fn", 1),
)
_REF_OFFSET = 100

#: DataType enum value -> dtype name (``tf.as_dtype(value).name``).
DTYPE_NAMES: dict[int, str] = {e: n for e, n, _ in _BASE_DTYPES} | {
    e + _REF_OFFSET: f"{n}_ref" for e, n, _ in _BASE_DTYPES
}
#: dtype name -> bytes per element (``tf.as_dtype(name).size``; 0 for
#: string, resource and variant, whose size a shape does not tell).
DTYPE_SIZES: dict[str, int] = {n: s for _, n, s in _BASE_DTYPES} | {f"{n}_ref": s for _, n, s in _BASE_DTYPES}

_TEXT_EXTENSIONS = (".pbtxt", ".txt")
_MESSAGE_LIMIT = 300  # characters of a protobuf parser's message kept
_CONTROL_BYTES = bytes(b for b in range(0x20) if b not in b"\t\n\r") + b"\x7f"
# Graph inputs: their unknown dims are the batch, never data-dependent.
_INPUT_OPS = frozenset({"Placeholder", "PlaceholderV2", "PlaceholderWithDefault"})
# Ops the caller must feed (a PlaceholderWithDefault may read its default instead).
_FED_OPS = frozenset({"Placeholder", "PlaceholderV2"})
# The root name scope tf.gradients gives the ops it builds: "gradients", "gradients_1", ...
_GRADIENT_SCOPE_RE = re.compile(r"gradients(?:_\d+)?")


# ----------------------------------------------------------------- reading


def read_graphdef(path: str, *, batch_size: int | None = None) -> OpGraph:
    """Read a binary or text GraphDef into an OpGraph (see the module docstring).

    ``batch_size`` replaces dims left unknown in the graph's shapes; without it
    an unknown dim that affects a tensor's size is an InputError.
    """
    if batch_size is not None and batch_size < 1:
        raise InputError(f"the batch size must be a positive integer, not {batch_size}")
    graph_def = parse_graphdef_file(path)
    # Building allocates millions of small objects and no reference cycles;
    # pausing the cyclic collector meanwhile saves about a third of the time.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _build(graph_def, batch_size)
    except InputError as err:
        raise err.with_path(path) from None
    finally:
        if collecting:
            gc.enable()


def parse_graphdef_file(path: str) -> GraphDef:
    """Read and parse ``path`` with our schema, binary or text (see module docstring)."""
    from google.protobuf import message, text_format

    from baechi_cli.proto_gen.tf_graph_pb2 import GraphDef

    data = read_input(path, "GraphDef")

    def parse_binary() -> GraphDef:
        try:
            graph_def = GraphDef.FromString(data)
        except message.DecodeError:
            raise InputError("not a GraphDef, or a truncated one (binary protobuf parse failed)") from None
        if not graph_def.ListFields():
            # Bytes that happen to decode, but only as fields GraphDef does not have.
            raise InputError("not a GraphDef (no GraphDef field in the binary protobuf)")
        return graph_def

    def parse_text() -> GraphDef:
        try:
            return text_format.Parse(data.decode("utf-8"), GraphDef())
        except UnicodeDecodeError:
            raise InputError("not a GraphDef (neither binary protobuf nor UTF-8 text)") from None
        except text_format.ParseError as err:
            # The parser quotes the token it stopped at, which may be megabytes long.
            problem = one_line(str(err).replace('"baechi.tf.', '"'), _MESSAGE_LIMIT)
            raise InputError(f"not a text-format GraphDef: {problem}") from None

    text_first = path.lower().endswith(_TEXT_EXTENSIONS) or _looks_like_text(data)
    parsers = (parse_text, parse_binary) if text_first else (parse_binary, parse_text)
    try:
        return parsers[0]()
    except InputError as first:
        try:
            return parsers[1]()
        except InputError:
            raise first.with_path(path) from None


def _looks_like_text(data: bytes) -> bool:
    """True when the first 4 KiB hold no control bytes other than whitespace.

    A binary GraphDef fails this: every NodeDef's ``op`` field starts with the
    byte 0x12.
    """
    head = data[:4096]
    return bool(head) and len(head.translate(None, _CONTROL_BYTES)) == len(head)


@functools.cache
def _op_registry() -> dict[str, dict[str, Any]]:
    """Op type -> {"inputs", "outputs", "defaults"} from the committed TF table."""
    from importlib import resources

    data = resources.files("baechi_cli.io").joinpath("tf_op_registry.json").read_bytes()
    return json.loads(data)["ops"]


def _q(name: str) -> str:
    """A name from the file (op, op type, attr, input) for a message, cut as an op's name is."""
    return truncate(name, OP_NAME_LIMIT)


def _dtype_name(value: int, what: str) -> str:
    name = DTYPE_NAMES.get(value)
    if name is None:
        raise InputError(f"{what} has unknown DataType enum value {value}")
    return name


def _signature_entry(signature: OpDef) -> dict[str, Any]:
    """A library function's signature in the registry table's format."""

    def arg(a: Any) -> dict[str, Any]:
        entry: dict[str, Any] = {}
        if a.type_list_attr:
            entry["type_list_attr"] = a.type_list_attr
        elif a.type_attr:
            entry["type_attr"] = a.type_attr
        else:
            entry["type"] = _dtype_name(a.type, f"argument '{_q(a.name)}' of function '{_q(signature.name)}'")
        if a.number_attr:
            entry["number_attr"] = a.number_attr
        if a.is_ref:
            entry["is_ref"] = True
        return entry

    defaults: dict[str, Any] = {}
    for attr_def in signature.attr:
        if attr_def.HasField("default_value"):
            _, decoded = _decode_attr(attr_def.default_value, attr_def.name)
            if decoded is not _OMIT:
                defaults[attr_def.name] = decoded
    return {
        "inputs": [arg(a) for a in signature.input_arg],
        "outputs": [arg(a) for a in signature.output_arg],
        "defaults": defaults,
    }


class _Node:
    """One NodeDef's attrs, each decoded once.

    ``public``: the attrs the OpGraph keeps (see the module docstring);
    ``kinds``: attr name -> the AttrValue field it uses ("type", "i", ...;
    "list(type)" and so on for lists, "list()" for an empty one);
    ``private``: the raw ``_``-prefixed attrs.
    """

    __slots__ = ("op", "device", "public", "kinds", "private")

    def __init__(self, node: NodeDef) -> None:
        self.op = node.op
        self.device = node.device
        self.public: dict[str, Any] = {}
        self.kinds: dict[str, str] = {}
        self.private: dict[str, AttrValue] = {}
        for key, value in sorted(node.attr.items()):
            if key.startswith("_"):
                self.private[key] = value
                continue
            kind, decoded = _decode_attr(value, key)
            self.kinds[key] = kind
            if kind == "tensor":
                self.public[f"{key}_shape"] = _decode_shape(value.tensor.tensor_shape)
            elif decoded is not _OMIT:
                self.public[key] = decoded

    def typing_attr(self, name: str, defaults: dict[str, Any], kind: str) -> Any:
        """An attr that types the node's tensors: a dtype name, a list of them, or an int.

        ``kind`` is "type", "list(type)" or "i". An attr the NodeDef omits takes
        its OpDef default, as TensorFlow does.
        """
        if name in self.kinds:
            found = self.kinds[name]
            if found != kind and not (kind == "list(type)" and found == "list()"):
                raise InputError(f"attr '{_q(name)}' must be {_TYPING_KINDS[kind]}")
            return self.public[name]
        if name in defaults:
            return defaults[name]
        raise InputError(f"attr '{_q(name)}' is missing; op type {_q(self.op)} needs it to type its tensors")

    def arg_types(self, args: list[dict[str, Any]], defaults: dict[str, Any]) -> list[str]:
        """Expand declared arguments into one dtype name per tensor."""
        types: list[str] = []
        for arg in args:
            if "type_list_attr" in arg:
                types.extend(self.typing_attr(arg["type_list_attr"], defaults, "list(type)"))
                continue
            base = arg["type"] if "type" in arg else self.typing_attr(arg["type_attr"], defaults, "type")
            count = 1
            if "number_attr" in arg:
                count = self.typing_attr(arg["number_attr"], defaults, "i")
                if count < 0:
                    raise InputError(f"attr '{_q(arg['number_attr'])}' is negative ({count})")
            # A ref argument of a ref type (RefIdentity of a float32_ref) stays one level deep.
            name = f"{base}_ref" if arg.get("is_ref") and not base.endswith("_ref") else base
            types.extend([name] * count)
        return types

    def fallback_output_types(self) -> list[str]:
        """Output types of an op type neither the registry nor the library knows."""
        if "_output_types" in self.private:
            kind, listed = _decode_attr(self.private["_output_types"], "_output_types")
            if kind in ("list(type)", "list()"):
                return listed
        for key in ("T", "dtype"):
            if self.kinds.get(key) == "type":
                shapes = self.private.get("_output_shapes")
                return [self.public[key]] * (len(shapes.list.shape) if shapes is not None else 1)
        raise InputError(
            f"unknown op type '{_q(self.op)}' (not in TensorFlow 2.21's op registry nor in the graph's "
            "function library) and no _output_types, T or dtype attr to tell its output types"
        )

    def colocate_with(self) -> tuple[str, ...]:
        """The names of ``loc:@name`` entries of the ``_class`` attr."""
        if "_class" not in self.private:
            return ()
        entries = [s.decode("utf-8", errors="replace") for s in self.private["_class"].list.s]
        return tuple([e[len("loc:@") :] for e in entries if e.startswith("loc:@")])


_TYPING_KINDS = {"type": "a type", "list(type)": "a list of types", "i": "an int"}
_OMIT = object()  # marks attr values that are not kept (tensors, placeholders, unset)


def _decode_shape(shape: TensorShapeProto) -> tuple[int, ...] | None:
    if shape.unknown_rank:
        return None
    dims = tuple([d.size for d in shape.dim])
    return dims if min(dims, default=0) >= -1 else tuple([max(d, -1) for d in dims])


def _decode_attr(value: AttrValue, key: str) -> tuple[str, Any]:
    """(kind, value as plain Python) of an AttrValue; the value is _OMIT when not kept.

    The kind is the AttrValue field set: "s", "i", "type", ...; for a list
    "list(<field>)", or "list()" when it is empty; "" when nothing is set.
    """
    kind = value.WhichOneof("value")
    if kind == "s":
        return kind, value.s.decode("utf-8", errors="replace")
    if kind in ("i", "f", "b"):
        return kind, getattr(value, kind)
    if kind == "type":
        return kind, _dtype_name(value.type, f"attr '{_q(key)}'")
    if kind == "shape":
        return kind, _decode_shape(value.shape)
    if kind == "func":
        return kind, value.func.name
    if kind == "list":
        fields = value.list.ListFields()
        if not fields:
            return "list()", []
        field, items = fields[0]
        kind = f"list({field.name})"
        if field.name == "s":
            return kind, [s.decode("utf-8", errors="replace") for s in items]
        if field.name == "type":
            return kind, [_dtype_name(t, f"attr '{_q(key)}'") for t in items]
        if field.name == "shape":
            return kind, [_decode_shape(s) for s in items]
        if field.name == "func":
            return kind, [f.name for f in items]
        if field.name == "tensor":
            return kind, _OMIT
        return kind, list(items)
    return kind or "", _OMIT  # tensor (the caller keeps its shape), placeholder, or nothing set


def _parse_input(text: str) -> tuple[str, int]:
    """``"x"`` -> (x, 0); ``"x:k"`` -> (x, k); ``"^x"`` -> (x, CONTROL_PORT)."""
    if text.startswith("^"):
        return text[1:], CONTROL_PORT
    name, sep, port = text.partition(":")
    if not sep:
        return name, 0
    if not port.isdigit():
        raise InputError(f"input '{_q(text)}' is malformed (expected 'name', 'name:port' or '^name')")
    return name, int(port)


class DecodedNodes(NamedTuple):
    """Per node of a GraphDef: what the reader and the verifier build an OpGraph from."""

    names: list[str]
    ops: list[str]
    infos: list[_Node]
    out_types: list[list[str]]
    in_types: list[list[str] | None]  # declared input types; None for unknown op types
    inputs: list[list[tuple[int, int]]]  # (producer id, port), data inputs first


def decode_nodes(graph_def: GraphDef, *, lenient_types: bool = False) -> DecodedNodes:
    """Names, attrs, output and declared input types, and inputs of every node.

    Raises :class:`InputError` naming the op for an empty graph, a nameless
    or typeless node, a duplicate name, a malformed input or one naming no
    node. A node whose types cannot be worked out (a missing or unknown type
    attr) is an error too, unless ``lenient_types``: then it gets no output
    types and no declared input types. O(V + E).
    """
    nodes = list(graph_def.node)
    if not nodes:
        raise InputError("the graph is empty (no nodes)")
    # Each access to a field of a protobuf message builds a new Python object:
    # read the strings once.
    names = [node.name for node in nodes]
    ops = [node.op for node in nodes]
    index: dict[str, int] = {}
    for i, name in enumerate(names):
        if not name:
            raise InputError(f"node #{i} has no name")
        if not ops[i]:
            raise InputError("the node has no op type", op=name)
        if name in index:
            raise InputError("duplicate node name (names must be unique)", op=name)
        index[name] = i

    functions = {f.signature.name: f.signature for f in graph_def.library.function}
    signatures: dict[str, dict[str, Any]] = {}
    registry = _op_registry()
    decoded = DecodedNodes(names, ops, [], [], [], [])
    for node, op in zip(nodes, ops, strict=True):
        try:
            info = _Node(node)
            try:
                entry = registry.get(op)
                if op in functions:  # TF forbids a function named like an op; the library decides
                    if op not in signatures:
                        signatures[op] = _signature_entry(functions[op])
                    entry = signatures[op]
                if entry is not None:
                    defaults = entry.get("defaults", {})
                    types = (
                        info.arg_types(entry["outputs"], defaults),
                        info.arg_types(entry["inputs"], defaults),
                    )
                else:
                    types = (info.fallback_output_types(), None)
            except InputError:
                if not lenient_types:
                    raise
                types = ([], None)
            decoded.out_types.append(types[0])
            decoded.in_types.append(types[1])
            decoded.inputs.append(_node_inputs(node, index))
            decoded.infos.append(info)
        except InputError as err:
            if err.op is None:
                err.op = node.name
            raise
    return decoded


def _build(graph_def: GraphDef, batch_size: int | None) -> OpGraph:
    # Pass 1: attrs, types and inputs of every node, and the inputs checked against the types
    # (before TensorFlow's shape inference sees them: an input port beyond int32 crashes it).
    names, ops, decoded, out_types, in_types, inputs = decode_nodes(graph_def)
    _check_inputs(names, ops, out_types, in_types, inputs)

    # Pass 2: shapes and bytes.
    need_inference = [
        i for i, info in enumerate(decoded) if out_types[i] and "_output_shapes" not in info.private
    ]
    inferred = _infer_shapes(graph_def, names[need_inference[0]]) if need_inference else {}

    builder = GraphBuilder()
    for i, info in enumerate(decoded):
        types = out_types[i]
        shapes: list[tuple[int, ...] | None] = []
        sizes: list[int] = []
        raw = _raw_shapes(names[i], info, types, inferred)
        is_input = ops[i] in _INPUT_OPS
        guessed = []
        for port, (dtype, shape) in enumerate(zip(types, raw, strict=True)):
            shape, nbytes, guess = _resolve(shape, dtype, batch_size, port, names[i], is_input)
            shapes.append(shape)
            sizes.append(nbytes)
            if guess:
                guessed.append(port)
        attrs = info.public
        if guessed:
            attrs["_size_unknown"] = guessed
        if info.device:
            attrs["_device"] = info.device
        if in_types[i] is not None:
            attrs["_input_types"] = in_types[i]
        builder.add_op(
            names[i],
            ops[i],
            sizes,
            output_shapes=shapes,
            output_dtypes=types,
            attrs=attrs,
            colocate_with=info.colocate_with(),
        )
        if ops[i] in _FED_OPS:  # the caller holds what it feeds for the whole step
            builder.hold(i, 0)

    # Pass 3: edges.
    for dst, node_inputs in enumerate(inputs):
        for src, port in node_inputs:
            builder.add_edge(src, dst, port)

    return mark_backward(builder.build())


def _check_inputs(
    names: list[str],
    ops: list[str],
    out_types: list[list[str]],
    in_types: list[list[str] | None],
    inputs: list[list[tuple[int, int]]],
) -> None:
    """InputError naming the op whose data inputs are not as many as its op type declares, or
    that reads an output port its producer does not have. O(V + E)."""
    for dst, node_inputs in enumerate(inputs):
        declared = in_types[dst]
        if declared is not None:
            data_inputs = sum(1 for _, port in node_inputs if port != CONTROL_PORT)
            if len(declared) != data_inputs:
                raise InputError(
                    f"has {data_inputs} data inputs but op type {_q(ops[dst])} declares {len(declared)}",
                    op=names[dst],
                )
        for src, port in node_inputs:
            if port >= len(out_types[src]):
                raise InputError(
                    f"input '{_q(names[src])}:{port}' is out of range: "
                    f"'{_q(names[src])}' ({_q(ops[src])}) has {len(out_types[src])} outputs",
                    op=names[dst],
                )


def _node_inputs(node: NodeDef, index: dict[str, int]) -> list[tuple[int, int]]:
    """(producer id, port) per input: data inputs first, then control inputs."""
    data: list[tuple[int, int]] = []
    control: list[tuple[int, int]] = []
    for text in node.input:
        name, port = _parse_input(text)
        src = index.get(name)
        if src is None:
            raise InputError(f"input '{_q(text)}' names no node of the graph")
        if port == CONTROL_PORT:
            control.append((src, port))
        elif control:
            raise InputError(f"data input '{_q(text)}' follows a control input (data inputs come first)")
        else:
            data.append((src, port))
    return data + control


def _raw_shapes(
    name: str, info: _Node, types: list[str], inferred: dict[str, list[tuple[int, ...] | None]]
) -> list[tuple[int, ...] | None]:
    """Output shapes as TensorFlow recorded or inferred them (-1 = unknown dim)."""
    if not types:
        return []
    if "_output_shapes" in info.private:
        shapes = [_decode_shape(s) for s in info.private["_output_shapes"].list.shape]
    else:
        shapes = inferred[name]
    if len(shapes) != len(types):
        raise InputError(
            f"has {len(shapes)} output shapes but op type {_q(info.op)} has {len(types)} outputs", op=name
        )
    return shapes


def _resolve(
    shape: tuple[int, ...] | None, dtype: str, batch_size: int | None, port: int, op: str, is_input: bool
) -> tuple[tuple[int, ...] | None, int, bool]:
    """(shape with unknown dims filled, bytes, whether the size is a guess) of one output.

    A graph input (Placeholder) must have a known size: its unknown dims are
    the batch, which ``--batch-size`` fills. A computed output whose size
    depends on the data (``Unique``, ``Where``, the unknown-rank reserve
    outputs of ``FusedBatchNormV3``) cannot be known before running: its
    unknown dims count as 1 (or the batch size, when given) and an unknown
    rank as 0 bytes, and the output is flagged so the report can say so.
    """
    itemsize = DTYPE_SIZES[dtype]
    if shape is None:
        if itemsize and is_input:
            raise InputError(
                f"output {port} ({dtype}) has unknown rank, so its size cannot be estimated; "
                "export the graph with static shapes",
                op=op,
            )
        return None, 0, bool(itemsize)
    if -1 in shape:
        if batch_size is None:
            if itemsize and is_input:
                raise InputError(
                    f"output {port} ({dtype}) has shape {_show(shape)} with an unknown dimension; "
                    "pass --batch-size to fill it in",
                    op=op,
                )
            if not itemsize:
                return None, 0, False
        filled = tuple((batch_size or 1) if d == -1 else d for d in shape)
        return filled, itemsize * math.prod(filled), bool(itemsize) and not is_input and batch_size is None
    return shape, itemsize * math.prod(shape), False


def _show(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join("?" if d == -1 else str(d) for d in shape) + "]"


def _infer_shapes(graph_def: GraphDef, first_op: str) -> dict[str, list[tuple[int, ...] | None]]:
    """Output shapes of every node by TensorFlow's shape inference (imports TensorFlow)."""
    try:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        from baechi_cli.io.tfsupport import import_tensorflow

        tf = import_tensorflow()
    except ImportError:
        raise InputError(
            "has no _output_shapes attr, so output sizes are unknown; re-export the graph with "
            "as_graph_def(add_shapes=True), or install TensorFlow (pip install 'baechi[tf]') "
            "to infer them",
            op=first_op,
        ) from None
    tf_graph_def = tf.compat.v1.GraphDef.FromString(graph_def.SerializeToString())
    graph = tf.Graph()
    try:
        with graph.as_default():
            tf.compat.v1.import_graph_def(tf_graph_def, name="")
    except Exception as err:  # TensorFlow raises ValueError or any of its OpError kinds here
        from baechi_cli.io.tfsupport import shorten_tf_message

        # TensorFlow quotes whole NodeDefs, names and attrs included: keep its first line, shortened.
        first_line = shorten_tf_message(str(err)) if str(err).strip() else type(err).__name__
        raise InputError(
            f"has no _output_shapes attr and TensorFlow could not import the graph to infer shapes: {first_line}",
            op=first_op,
        ) from None
    return {
        op.name: [
            None if t.shape.rank is None else tuple(-1 if d is None else d for d in t.shape.as_list())
            for t in op.outputs
        ]
        for op in graph.get_operations()
    }


def mark_backward(graph: OpGraph) -> OpGraph:
    """Set ``is_backward`` and ``forward_op`` from TensorFlow's gradient naming.

    Rules, in order (documented in docs/formats.md):

    1. An op whose outermost name scope is ``gradients`` (``gradients_1``, ...)
       is backward, and so is every op that depends on one (optimizer updates,
       the train op): the backward phase is what the gradients feed.
    2. A backward op's forward op is named by its first ``<name>_grad`` scope:
       ``gradients/conv1/Conv2D_grad/Conv2DBackpropInput`` belongs to
       ``conv1/Conv2D`` (also inside while loops:
       ``gradients/rnn/while/mul_grad/Mul`` belongs to ``rnn/while/mul``).
    3. Otherwise the first op its ``_class`` attr names that is a forward op
       (``colocate_gradients_with_ops`` puts the forward op there).

    Backward ops matching neither rule (gradient aggregation, shapes, the
    optimizer's updates) keep ``forward_op = -1``. O(V + E).
    """
    n = graph.num_ops
    backward = [bool(_GRADIENT_SCOPE_RE.fullmatch(name.split("/", 1)[0])) for name in graph.names]
    queue = [v for v in range(n) if backward[v]]
    while queue:
        v = queue.pop()
        for e in graph.out_edges[v]:
            w = graph.edge_dst[e]
            if not backward[w]:
                backward[w] = True
                queue.append(w)
    if not any(backward):
        return graph
    index = graph.index()
    forward = [-1] * n
    for v in range(n):
        if not backward[v]:
            continue
        parts = graph.names[v].split("/")
        if _GRADIENT_SCOPE_RE.fullmatch(parts[0]):
            for i in range(1, len(parts) - 1):
                if parts[i].endswith("_grad"):
                    u = index.get("/".join([*parts[1:i], parts[i][: -len("_grad")]]), -1)
                    if u >= 0 and not backward[u]:
                        forward[v] = u
                    break
        if forward[v] < 0:
            forward[v] = next(
                (u for u in (index.get(c, -1) for c in graph.colocate_with[v]) if u >= 0 and not backward[u]),
                -1,
            )
    return graph.replace(is_backward=backward, forward_op=forward)


# ----------------------------------------------------------------- writing


def write_placed_graphdef(in_path: str, devices_by_name: dict[str, str], out_path: str) -> None:
    """Write ``in_path``'s graph to ``out_path`` with every NodeDef.device set.

    Everything else (names, inputs, attrs, library, versions, debug info,
    unknown fields in binary output) is unchanged. Text format when
    ``out_path`` ends with ``.pbtxt``, else binary with deterministic
    serialization (same input, same bytes). The file is written whole or not
    at all. Raises KeyError when ``devices_by_name`` lacks a node: every op
    of a placement has a device, so a missing one is a bug upstream.
    """
    from google.protobuf import text_format

    graph_def = parse_graphdef_file(in_path)
    missing = [node.name for node in graph_def.node if node.name not in devices_by_name]
    if missing:
        raise KeyError(f"no device for {len(missing)} node(s) of {in_path}, e.g. {missing[:5]}")
    for node in graph_def.node:
        node.device = devices_by_name[node.name]
    if out_path.lower().endswith(".pbtxt"):
        data = text_format.MessageToString(graph_def).encode("utf-8")
    else:
        data = graph_def.SerializeToString(deterministic=True)
    write_atomic(out_path, data)
