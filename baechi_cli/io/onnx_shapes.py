"""Tensor shapes that ``onnx.shape_inference`` leaves unknown, completed.

ONNX's inference (even with ``data_prop``) stops at the first op whose output
shape depends on a value it did not propagate: a ``Pad`` whose pads are
computed from the input's shape (TensorFlow-style "same" padding, Swin's
window padding), a ``Reshape`` or ``Range`` fed by shape arithmetic. Every op
after it is then unknown too. :func:`complete_shapes` walks the graph once in
node order and, per node:

1. evaluates it when it is shape arithmetic whose inputs are known (a rule in
   :data:`VALUE_RULES`: ``Shape``, ``Gather``, ``Concat``, ``Slice``,
   arithmetic and comparisons, ``Range``, ... on integer tensors of at most
   :data:`SMALL` elements, or a ``Shape``/``Size`` of a tensor whose shape
   is known), and
2. where an output's shape is still incomplete, runs ONNX's own inference
   function for that one node (``onnx.shape_inference.infer_node_outputs``)
   on the completed input types, with the evaluated values as input data, so
   each op's shape rule stays ONNX's.

:func:`shapes_from_run` is the last resort (``--infer-shapes run``): it runs
the model in onnxruntime on zero inputs and reads the shapes of the values
still unknown. Nothing here changes a shape ONNX's inference determined.

Subgraphs (If/Loop/Scan bodies) are left as inferred. O(V + E) node visits,
each a few small numpy operations and at most one per-node inference call.

Example:
    >>> import numpy as np, onnx
    >>> from onnx import TensorProto, helper, numpy_helper
    >>> x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (("x", [2, 3]), ("y", None)))
    >>> one = numpy_helper.from_array(np.array([1], np.int64), "one")
    >>> nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Add", ["s", "one"], ["t"]),
    ...          helper.make_node("Sub", ["t", "s"], ["d"]),  # [1, 1], computed from the shape
    ...          helper.make_node("Concat", ["d", "d"], ["p"], axis=0), helper.make_node("Pad", ["x", "p"], ["y"])]
    >>> g = helper.make_graph(nodes, "g", [x], [y], [one])
    >>> m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    >>> inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
    >>> done = complete_shapes(inferred.graph, list(m.opset_import))
    >>> [d.dim_value for d in done["y"].tensor_type.shape.dim]
    [4, 5]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from onnx import GraphProto, NodeProto, OperatorSetIdProto, TypeProto

#: Elements: an evaluated value larger than this is not kept (shape arithmetic is small).
SMALL = 1024

#: What a value rule gets: the node's decoded attributes, its inputs' values (None where
#: unknown) and its inputs' shapes (None where unknown); it returns the outputs' values or None.
ValueRule = Callable[[dict[str, Any], list[Any], list[tuple[int, ...] | None]], list[Any] | None]

#: Op type -> its value rule (default domain). One small function per op, as tf2onnx's handlers.
VALUE_RULES: dict[str, ValueRule] = {}


def value_rule(*op_types: str) -> Callable[[ValueRule], ValueRule]:
    """Register the decorated function as the value rule of ``op_types``."""

    def add(fn: ValueRule) -> ValueRule:
        for op_type in op_types:
            VALUE_RULES[op_type] = fn
        return fn

    return add


def _known(values: list[Any]) -> bool:
    return all(v is not None for v in values)


@value_rule("Shape")
def _shape(attrs: dict[str, Any], values: list[Any], shapes: list[Any]) -> list[Any] | None:
    if shapes[0] is None:
        return None
    dims = list(shapes[0])
    start, end = attrs.get("start", 0), attrs.get("end", len(dims))
    return [np.array(dims[slice(start, end)], dtype=np.int64)]


@value_rule("Size")
def _size(attrs: dict[str, Any], values: list[Any], shapes: list[Any]) -> list[Any] | None:
    return None if shapes[0] is None else [np.array(int(np.prod(shapes[0])), dtype=np.int64)]


def _elementwise(fn: Callable[..., Any]) -> ValueRule:
    def rule(attrs: dict[str, Any], values: list[Any], shapes: list[Any]) -> list[Any] | None:
        return [np.asarray(fn(*values))] if _known(values) else None

    return rule


def _div(a: Any, b: Any) -> Any:
    if np.issubdtype(a.dtype, np.integer):
        return np.trunc(a / b).astype(a.dtype)  # ONNX integer Div truncates toward zero
    return a / b


def _mod(a: Any, b: Any, fmod: int = 0) -> Any:
    return np.fmod(a, b) if fmod else np.mod(a, b)


for _name, _fn in {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": _div,
    "Pow": lambda a, b: np.power(a, b).astype(a.dtype),
    "Neg": np.negative,
    "Abs": np.abs,
    "Floor": np.floor,
    "Ceil": np.ceil,
    "Sqrt": np.sqrt,
    "Reciprocal": np.reciprocal,
    "Sign": np.sign,
    "Equal": np.equal,
    "Less": np.less,
    "LessOrEqual": np.less_equal,
    "Greater": np.greater,
    "GreaterOrEqual": np.greater_equal,
    "Not": np.logical_not,
    "And": np.logical_and,
    "Or": np.logical_or,
    "Where": np.where,
    "Identity": lambda a: a,
}.items():
    VALUE_RULES[_name] = _elementwise(_fn)


@value_rule("Mod")
def _mod_rule(attrs: dict[str, Any], values: list[Any], shapes: list[Any]) -> list[Any] | None:
    return [_mod(values[0], values[1], attrs.get("fmod", 0))] if _known(values) else None


@value_rule("Max", "Min")
def _max_min(attrs: dict[str, Any], values: list[Any], shapes: list[Any]) -> list[Any] | None:
    if not _known(values) or not values:
        return None
    fn = np.maximum if attrs["_op"] == "Max" else np.minimum
    out = values[0]
    for v in values[1:]:
        out = fn(out, v)
    return [np.asarray(out)]


@value_rule("Cast")
def _cast(attrs: dict[str, Any], values: list[Any], shapes: list[Any]) -> list[Any] | None:
    from onnx import helper

    if values[0] is None:
        return None
    dtype = helper.tensor_dtype_to_np_dtype(attrs["to"])
    return [values[0].astype(dtype)]


@value_rule("Constant")
def _constant(attrs: dict[str, Any], values: list[Any], shapes: list[Any]) -> list[Any] | None:
    from onnx import numpy_helper

    node: NodeProto = attrs["_node"]
    for a in node.attribute:
        if a.name == "value":
            return [numpy_helper.to_array(a.t)]
        if a.name == "value_int":
            return [np.array(a.i, dtype=np.int64)]
        if a.name == "value_ints":
            return [np.array(list(a.ints), dtype=np.int64)]
        if a.name == "value_float":
            return [np.array(a.f, dtype=np.float32)]
        if a.name == "value_floats":
            return [np.array(list(a.floats), dtype=np.float32)]
    return None


@value_rule("Gather")
def _gather(attrs: dict[str, Any], values: list[Any], shapes: list[Any]) -> list[Any] | None:
    return [np.take(values[0], values[1], axis=attrs.get("axis", 0))] if _known(values) else None


@value_rule("Concat")
def _concat(attrs: dict[str, Any], values: list[Any], shapes: list[Any]) -> list[Any] | None:
    return [np.concatenate(values, axis=attrs["axis"])] if _known(values) and values else None


def _axes(attrs: dict[str, Any], values: list[Any]) -> list[int] | None:
    if len(values) > 1 and values[1] is not None:
        return [int(a) for a in np.ravel(values[1])]
    return attrs.get("axes")


@value_rule("Unsqueeze")
def _unsqueeze(attrs: dict[str, Any], values: list[Any], shapes: list[Any]) -> list[Any] | None:
    axes = _axes(attrs, values)
    if values[0] is None or axes is None:
        return None
    rank = values[0].ndim + len(axes)
    return [np.expand_dims(values[0], tuple(sorted(a % rank for a in axes)))]


@value_rule("Squeeze")
def _squeeze(attrs: dict[str, Any], values: list[Any], shapes: list[Any]) -> list[Any] | None:
    if values[0] is None:
        return None
    axes = _axes(attrs, values)
    return [np.squeeze(values[0], axis=None if axes is None else tuple(axes))]


@value_rule("Slice")
def _slice(attrs: dict[str, Any], values: list[Any], shapes: list[Any]) -> list[Any] | None:
    data = values[0]
    if data is None or any(v is None for v in values[1:3]):
        return None
    starts, ends = np.ravel(values[1]), np.ravel(values[2])
    axes = np.ravel(values[3]) if len(values) > 3 and values[3] is not None else range(len(starts))
    steps = np.ravel(values[4]) if len(values) > 4 and values[4] is not None else [1] * len(starts)
    index = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=False):
        index[int(axis)] = slice(int(start), int(end), int(step))
    return [data[tuple(index)]]


@value_rule("Reshape")
def _reshape(attrs: dict[str, Any], values: list[Any], shapes: list[Any]) -> list[Any] | None:
    if not _known(values):
        return None
    target = [int(d) for d in values[1]]
    if not attrs.get("allowzero", 0):
        target = [values[0].shape[i] if d == 0 else d for i, d in enumerate(target)]
    return [values[0].reshape(target)]


@value_rule("Range")
def _range(attrs: dict[str, Any], values: list[Any], shapes: list[Any]) -> list[Any] | None:
    if not _known(values):
        return None
    start, limit, delta = (v.item() for v in values)
    return [np.arange(start, limit, delta, dtype=values[0].dtype)]


@value_rule("ConstantOfShape")
def _constant_of_shape(attrs: dict[str, Any], values: list[Any], shapes: list[Any]) -> list[Any] | None:
    from onnx import numpy_helper

    if values[0] is None:
        return None
    fill = np.zeros(1, dtype=np.float32)
    for a in attrs["_node"].attribute:
        if a.name == "value":
            fill = numpy_helper.to_array(a.t)
    return [np.full([int(d) for d in values[0]], fill.ravel()[0], dtype=fill.dtype)]


@value_rule("Expand")
def _expand(attrs: dict[str, Any], values: list[Any], shapes: list[Any]) -> list[Any] | None:
    if not _known(values):
        return None
    shape = np.broadcast_shapes(values[0].shape, tuple(int(d) for d in values[1]))
    return [np.broadcast_to(values[0], shape).copy()]


@value_rule("Transpose")
def _transpose(attrs: dict[str, Any], values: list[Any], shapes: list[Any]) -> list[Any] | None:
    return [np.transpose(values[0], attrs.get("perm"))] if values[0] is not None else None


def _reduce(fn: Callable[..., Any]) -> ValueRule:
    def rule(attrs: dict[str, Any], values: list[Any], shapes: list[Any]) -> list[Any] | None:
        if values[0] is None:
            return None
        axes = _axes(attrs, values)
        keep = bool(attrs.get("keepdims", 1))
        if not axes and attrs.get("noop_with_empty_axes", 0):
            return [values[0]]
        axis = None if not axes else tuple(axes)
        return [np.asarray(fn(values[0], axis=axis, keepdims=keep))]

    return rule


for _name, _fn in {
    "ReduceProd": np.prod,
    "ReduceSum": np.sum,
    "ReduceMax": np.max,
    "ReduceMin": np.min,
}.items():
    VALUE_RULES[_name] = _reduce(_fn)


# ----------------------------------------------------------------- the walk


def complete_shapes(graph: GraphProto, opset_imports: Sequence[OperatorSetIdProto]) -> dict[str, TypeProto]:
    """Every top-level value's type, with shapes completed where the module docstring's two
    steps can: value name -> TypeProto (graph inputs, initializers and node outputs).

    ``graph`` is the graph after ``onnx.shape_inference.infer_shapes``; it is not modified.
    """
    from onnx import numpy_helper

    types = _types_of(graph)
    values: dict[str, Any] = {}
    for init in graph.initializer:
        if _small_integer(init):
            try:
                values[init.name] = numpy_helper.to_array(init)
            except Exception:  # data left out (a weight) or external: not a value we know
                pass
    opsets = {o.domain or "": o.version for o in opset_imports}
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or any(a.g.node or a.graphs for a in node.attribute):
            continue
        _visit(node, types, values, opsets, opset_imports)
    return types


def unknown_values(graph: GraphProto, types: Mapping[str, TypeProto]) -> list[str]:
    """The node outputs (in node order) whose type is missing or whose shape is incomplete."""
    return [o for node in graph.node for o in node.output if o and not _complete(types.get(o))]


def shapes_from_run(
    model_bytes: bytes, names: Iterable[str], feeds: Mapping[str, tuple[tuple[int, ...], Any]]
) -> dict[str, tuple[int, ...]]:
    """The shapes of values ``names`` when onnxruntime runs the model (``model_bytes``, weights
    included) on zero inputs: ``feeds`` maps each graph input to its (shape, numpy dtype).

    Raises ImportError when onnxruntime is not installed, and whatever onnxruntime raises
    when the model does not run.
    """
    import onnx
    import onnxruntime as ort

    model = onnx.ModelProto.FromString(model_bytes)
    wanted = [n for n in dict.fromkeys(names) if n]
    have = {o.name for o in model.graph.output}
    for name in wanted:
        if name not in have:
            model.graph.output.append(onnx.ValueInfoProto(name=name))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    inputs = {name: np.zeros(shape, dtype=dtype) for name, (shape, dtype) in feeds.items()}
    outputs = session.run(wanted, inputs)
    return {name: tuple(np.shape(out)) for name, out in zip(wanted, outputs, strict=True)}


def _visit(
    node: NodeProto,
    types: dict[str, TypeProto],
    values: dict[str, Any],
    opsets: dict[str, int],
    opset_imports: Sequence[OperatorSetIdProto],
) -> None:
    """Steps 1 and 2 of the module docstring for one node, updating ``types`` and ``values``."""
    inputs = [i for i in node.input if i]
    shapes = [_shape_of(types.get(i)) if i else None for i in node.input]
    rule = VALUE_RULES.get(node.op_type)
    if rule is not None:
        _evaluate(node, rule, shapes, types, values)
    if all(_complete(types.get(o)) for o in node.output if o):
        return
    if any(i not in types for i in inputs):
        return
    _infer_node(node, {i: types[i] for i in inputs}, values, opsets, opset_imports, types)


def _evaluate(
    node: NodeProto, rule: ValueRule, shapes: list[Any], types: dict[str, TypeProto], values: dict[str, Any]
) -> None:
    from onnx import helper

    attrs: dict[str, Any] = {
        a.name: helper.get_attribute_value(a) for a in node.attribute if a.type in (1, 2, 3, 6, 7)
    }
    attrs["_op"], attrs["_node"] = node.op_type, node
    try:
        out = rule(attrs, [values.get(i) if i else None for i in node.input], shapes)
    except Exception:  # a value this rule cannot handle: leave it to ONNX's inference
        return
    if out is None:
        return
    for name, value in zip(node.output, out, strict=False):
        value = np.asarray(value)
        if not name or value.size > SMALL or value.dtype.kind not in "biuf":
            continue
        values[name] = value
        if not _complete(types.get(name)):
            elem = types[name].tensor_type.elem_type if name in types else 0
            types[name] = _tensor_type(elem or helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)


def _infer_node(
    node: NodeProto,
    input_types: dict[str, TypeProto],
    values: dict[str, Any],
    opsets: dict[str, int],
    opset_imports: Sequence[OperatorSetIdProto],
    types: dict[str, TypeProto],
) -> None:
    import onnx
    from onnx import numpy_helper

    try:
        schema = onnx.defs.get_schema(node.op_type, opsets.get(node.domain or "", 0), node.domain or "")
        data = {i: numpy_helper.from_array(values[i]) for i in input_types if i in values}
        inferred = onnx.shape_inference.infer_node_outputs(
            schema, node, input_types, data, opset_imports=list(opset_imports)
        )
    except Exception:  # no schema, or ONNX's inference rejects the inputs: leave it unknown
        return
    for name, t in inferred.items():
        if _complete(t) and not _complete(types.get(name)):
            types[name] = t


def _types_of(graph: GraphProto) -> dict[str, TypeProto]:
    types: dict[str, TypeProto] = {}
    for init in graph.initializer:
        types[init.name] = _tensor_type(init.data_type, tuple(init.dims))
    for values in (graph.input, graph.output, graph.value_info):
        for info in values:
            if info.HasField("type") and (info.name not in types or _complete(info.type)):
                types[info.name] = info.type
    return types


def _tensor_type(elem_type: int, shape: Sequence[int]) -> TypeProto:
    from onnx import helper

    return helper.make_tensor_type_proto(elem_type, [int(d) for d in shape])


def _small_integer(init: Any) -> bool:
    import math

    from onnx import TensorProto

    integer = init.data_type in (
        TensorProto.INT64,
        TensorProto.INT32,
        TensorProto.INT16,
        TensorProto.INT8,
        TensorProto.UINT8,
        TensorProto.BOOL,
    )
    return integer and math.prod(init.dims) <= SMALL and init.data_location != TensorProto.EXTERNAL


def _shape_of(t: TypeProto | None) -> tuple[int, ...] | None:
    return tuple(d.dim_value for d in t.tensor_type.shape.dim) if _complete(t) else None


def _complete(t: TypeProto | None) -> bool:
    """Whether ``t`` is a tensor type with a shape whose every dim has a value (non-tensors count
    as complete: there is nothing to size)."""
    if t is None:
        return False
    kind = t.WhichOneof("value")
    if kind != "tensor_type":
        return kind is not None
    tt = t.tensor_type
    return tt.elem_type != 0 and tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim)
