"""Per-op-type memory facts, beside the cost rules: which ops are views, and what autograd saves.

Two tables keyed by op type, like the cost rules' name tables:

* :data:`VIEW_OPS` — ops whose outputs share their first data input's storage
  and allocate nothing: TensorFlow's aliasing ops (``Identity``,
  ``Reshape``, ``Squeeze``, ``ExpandDims``, ``ReadVariableOp`` of a
  variable's buffer, ...) and, for ONNX models (which reach us from
  PyTorch), the ops PyTorch runs as views: ``Reshape``, ``Flatten``,
  ``Squeeze``, ``Unsqueeze``, ``Identity``, and ``Transpose``, ``Slice``,
  ``Split`` and ``Expand``, which are strided views in PyTorch (a kernel
  that needs them contiguous copies into its own scratch). :func:`mark_views`
  records them in :attr:`OpGraph.view_of`, which the simulator reads: a
  view's outputs take no memory and keep their source alive as long as
  they are used.
* :data:`SAVED_FOR_BACKWARD` — for ONNX ops, what PyTorch's autograd keeps
  from the forward pass until the op's backward runs
  (``torch/csrc/autograd/generated`` / ``derivatives.yaml``: which of
  ``self``, ``other``, ``result`` a ``*Backward`` node saves). The training
  pass (:mod:`baechi_cli.passes.training`) turns each entry into edges from
  the saved tensors to the backward op, so the simulator holds exactly those
  until the backward op ends: Gemm/MatMul/Conv keep their data inputs, Relu
  and Softmax their output, Add nothing, LayerNorm its input and statistics,
  Dropout a one-byte mask, MaxPool its input and int64 indices. An op type
  without an entry keeps what its cost-rule kind implies
  (:func:`saved_for_backward`).

Both are facts about frameworks, kept apart from the FLOP and byte counts
(:mod:`baechi_cli.costs.registry`) and from the simulator.

Example:
    >>> saved_for_backward("Relu", "flops")
    Saved(inputs=(), output=True, extra_bytes_per_output_byte=0.0, cross=False, row_stats=0)
    >>> saved_for_backward("Add", "flops").inputs
    ()
    >>> saved_for_backward("NoSuchOp", "flops").inputs  # unknown: every data input, to be safe
    (0, 1, 2, 3, 4, 5, 6, 7)
"""

from __future__ import annotations

from typing import NamedTuple

from baechi_cli.core.graph import CONTROL_PORT, OpGraph

VIEW_OPS: dict[str, frozenset[str]] = {
    "tensorflow": frozenset(
        {
            "Identity",
            "IdentityN",
            "Reshape",
            "Squeeze",
            "ExpandDims",
            "StopGradient",
            "PreventGradient",
            "ReadVariableOp",
            "Bitcast",
            "EnsureShape",
        }
    ),
    "onnx": frozenset(
        {
            "Identity",
            "Reshape",
            "Flatten",
            "Squeeze",
            "Unsqueeze",
            "Transpose",
            "Slice",
            "Split",
            "Expand",
        }
    ),
}


def _aten_views() -> frozenset[str]:
    from baechi_cli.costs.rules_aten import VIEW_OPS as ATEN_VIEWS

    return ATEN_VIEWS


VIEW_OPS["aten"] = _aten_views()  # a PyTorch program's views (rules_aten.VIEW_OPS)
#: Per op set, the suffix of in-place op types, whose output is their first input's storage
#: (``aten.add_``): views too.
INPLACE_SUFFIX: dict[str, str] = {"aten": "_"}

# view_of's value for a view of resident storage (a parameter): no tensor to keep alive.
RESIDENT = (-1, 0)


class Saved(NamedTuple):
    """What a backward op reads from its forward op's time.

    ``inputs``: the ONNX input positions whose tensors are kept (positions
    that are initializers are parameters, resident anyway, and skipped);
    ``output``: the op's first output is kept; ``extra_bytes_per_output_byte``:
    one more tensor the forward op writes only for its backward (a dropout
    mask, pooling indices, normalization statistics), sized against the
    first output; ``cross``: an input is kept only when another input needs
    a gradient (the operands of a product).
    """

    inputs: tuple[int, ...] = ()
    output: bool = False
    extra_bytes_per_output_byte: float = 0.0
    # Products: an operand is kept only to compute another operand's gradient
    # (x * 0.5 keeps nothing of x; x @ W keeps x because W needs a gradient).
    cross: bool = False
    # float32 statistics kept per normalized row (the output's dims from attribute ``axis``,
    # default -1, on): LayerNorm's mean and inverse std.
    row_stats: int = 0


_NOTHING = Saved()
_ALL_INPUTS = Saved(inputs=tuple(range(8)))
_FIRST_INPUT = Saved(inputs=(0,))
_PRODUCT = Saved(inputs=(0, 1), cross=True)
_OUTPUT = Saved(output=True)

SAVED_FOR_BACKWARD: dict[str, Saved] = {
    # Products keep their operands (dX = dY·W^T, dW = X^T·dY).
    "MatMul": _PRODUCT,
    "Gemm": _PRODUCT,
    "Conv": Saved(inputs=(0,), cross=True),
    "ConvTranspose": Saved(inputs=(0,), cross=True),
    "Mul": _PRODUCT,
    # a / b keeps b for a's gradient, and a and b for b's: both whenever b needs one.
    "Div": _PRODUCT,
    "Einsum": Saved(inputs=tuple(range(8)), cross=True),
    # Sums, copies, views and casts keep nothing (their gradient is the incoming one, reshaped).
    "Add": _NOTHING,
    "Sub": _NOTHING,
    "Neg": _NOTHING,
    "Sum": _NOTHING,
    "Concat": _NOTHING,
    "Cast": _NOTHING,
    "Identity": _NOTHING,
    "Reshape": _NOTHING,
    "Flatten": _NOTHING,
    "Squeeze": _NOTHING,
    "Unsqueeze": _NOTHING,
    "Transpose": _NOTHING,
    "Slice": _NOTHING,
    "Split": _NOTHING,
    "Expand": _NOTHING,
    "Pad": _NOTHING,
    "Gather": _NOTHING,  # the indices are integers of the input's producer, kept there
    "ReduceSum": _NOTHING,
    "ReduceMean": _NOTHING,
    "GlobalAveragePool": _NOTHING,
    "Where": _NOTHING,
    # Activations whose derivative is a function of their result.
    "Relu": _OUTPUT,
    "Sigmoid": _OUTPUT,
    "Tanh": _OUTPUT,
    "Softmax": _OUTPUT,
    "LogSoftmax": _OUTPUT,
    "Exp": _OUTPUT,
    "Sqrt": _OUTPUT,
    # ... or of their input.
    "Erf": _FIRST_INPUT,
    "Gelu": _FIRST_INPUT,
    "Pow": _FIRST_INPUT,
    "Log": _FIRST_INPUT,
    "Reciprocal": _OUTPUT,
    "LeakyRelu": _FIRST_INPUT,
    "Elu": _OUTPUT,
    "HardSigmoid": _FIRST_INPUT,
    "HardSwish": _FIRST_INPUT,
    "Softplus": _FIRST_INPUT,
    "Clip": _FIRST_INPUT,
    "AveragePool": _FIRST_INPUT,
    "ReduceMax": Saved(inputs=(0,), output=True),
    "ReduceMin": Saved(inputs=(0,), output=True),
    # Input plus int64 indices, one per output element (twice a float32 output's bytes).
    "MaxPool": Saved(inputs=(0,), extra_bytes_per_output_byte=2.0),
    # Input plus per-channel mean and inverse std (small against the input); LayerNorm's and
    # RMSNorm's per-row statistics are counted.
    "BatchNormalization": _FIRST_INPUT,
    "LayerNormalization": Saved(inputs=(0,), row_stats=2),
    "GroupNormalization": _FIRST_INPUT,
    "InstanceNormalization": _FIRST_INPUT,
    "RMSNormalization": Saved(inputs=(0,), row_stats=1),
    # A one-byte mask per element (bool), a quarter of a float32 output.
    "Dropout": Saved(extra_bytes_per_output_byte=0.25),
}

# Cost-rule kinds whose ops, when not in the table, keep every data input (conservative:
# a flops op's backward usually reads its inputs); data movement and views keep nothing.
_KIND_DEFAULT = {"flops": _ALL_INPUTS, "uncovered": _ALL_INPUTS, "fallback": _ALL_INPUTS}


def saved_for_backward(op_type: str, kind: str) -> Saved:
    """What autograd keeps for ``op_type``'s backward (ONNX op types); by ``kind`` when unknown."""
    return SAVED_FOR_BACKWARD.get(op_type) or _KIND_DEFAULT.get(kind, _NOTHING)


def _same_dtype_cast(graph: OpGraph, v: int) -> bool:
    """A Cast to the dtype it already has: PyTorch's ``.to(dtype)`` returns the tensor itself."""
    if graph.op_types[v] != "Cast":
        return False
    dtypes = graph.attrs[v].get("_input_dtypes") or [""]
    return bool(dtypes[0]) and graph.output_dtypes[v][:1] == [dtypes[0]]


class ExactGelu(NamedTuple):
    """The ops of one exported exact GELU: ``x * (1 + erf(x / sqrt(2)))`` then ``* 0.5``
    (TorchScript exporter), or ``x * (0.5 * (1 + erf(x / sqrt(2))))`` (dynamo exporter)."""

    div: int
    erf: int
    add: int
    mul: int  # multiplies by x
    x_position: int  # the position of x among the Mul's inputs
    half: int = -1  # the Mul by 0.5 between the Add and ``mul`` (dynamo's order); -1: after ``mul``


class Silu(NamedTuple):
    """The ops of one exported SiLU (Swish), ``x * sigmoid(x)``."""

    sigmoid: int
    mul: int  # multiplies the sigmoid by x
    x_position: int  # the position of x among the Mul's inputs


def _data_in(graph: OpGraph, v: int) -> list[int]:
    return [e for e in graph.in_edges[v] if graph.edge_port[e] != CONTROL_PORT]


def _only_reader(graph: OpGraph, v: int) -> int:
    readers = {graph.edge_dst[e] for e in graph.out_edges[v] if graph.edge_port[e] != CONTROL_PORT}
    return readers.pop() if len(readers) == 1 else -1


def _position_of(graph: OpGraph, mul: int, x: tuple[int, int]) -> int | None:
    """The input position at which ``mul`` reads tensor ``x`` (None: it does not)."""
    edges = _data_in(graph, mul)
    if graph.op_types[mul] != "Mul" or len(edges) != 2:
        return None
    positions = graph.attrs[mul].get("_data_inputs") or [0, 1]
    keep = [p for p, f in zip(positions, edges) if (graph.edge_src[f], graph.edge_port[f]) == x]
    return keep[0] if keep else None


def exact_gelus(graph: OpGraph) -> list[ExactGelu]:
    """Every exact GELU the TorchScript exporter wrote as Div, Erf, Add, Mul (then a Mul by 0.5). O(V + E)."""
    out: list[ExactGelu] = []
    types, src, dst, port = graph.op_types, graph.edge_src, graph.edge_dst, graph.edge_port
    for erf, op_type in enumerate(types):
        if op_type != "Erf":
            continue
        into_erf = _data_in(graph, erf)
        if len(into_erf) != 1 or types[src[into_erf[0]]] != "Div":
            continue
        div = src[into_erf[0]]
        div_in = _data_in(graph, div)
        if not div_in:
            continue
        x = (src[div_in[0]], port[div_in[0]])
        adds = [dst[e] for e in graph.out_edges[erf] if types[dst[e]] == "Add"]
        for add in adds:
            for e in graph.out_edges[add]:
                position = _position_of(graph, dst[e], x)
                if position is not None:
                    out.append(ExactGelu(div, erf, add, dst[e], position))
                elif _by_constant(graph, dst[e]):
                    half = dst[e]
                    for f in graph.out_edges[half]:
                        position = _position_of(graph, dst[f], x)
                        if position is not None:
                            out.append(ExactGelu(div, erf, add, dst[f], position, half))
    return out


def _by_constant(graph: OpGraph, v: int) -> bool:
    """``v`` is a Mul whose other data inputs all come from Constant ops."""
    edges = _data_in(graph, v)
    constants = [e for e in edges if graph.op_types[graph.edge_src[e]] == "Constant"]
    return graph.op_types[v] == "Mul" and len(edges) == 2 and len(constants) == 1


def silus(graph: OpGraph) -> list[Silu]:
    """Every SiLU an exporter wrote as Sigmoid then Mul by the Sigmoid's own input. O(V + E)."""
    out: list[Silu] = []
    types, src, dst, port = graph.op_types, graph.edge_src, graph.edge_dst, graph.edge_port
    for sigmoid, op_type in enumerate(types):
        if op_type != "Sigmoid":
            continue
        into = _data_in(graph, sigmoid)
        if len(into) != 1:
            continue
        x = (src[into[0]], port[into[0]])
        for e in graph.out_edges[sigmoid]:
            position = _position_of(graph, dst[e], x)
            if position is not None and port[e] == 0:
                out.append(Silu(sigmoid, dst[e], position))
    return out


def one_kernel_activations(graph: OpGraph) -> OpGraph:
    """``graph`` with the intermediate tensors of every exported exact GELU and SiLU taking no memory.

    ``torch.nn.functional.gelu`` and ``silu`` are one kernel each: they read
    ``x`` and write their result, and their backward one more. The exporter's
    ops (GELU: Div, Erf, Add, Mul, then a Mul by 0.5, or the two Muls the other
    way round; SiLU: Sigmoid, Mul) each
    write a tensor of x's size that eager PyTorch never allocates, so where
    each is read only by the next op of the chain (GELU: and the Mul only by
    the Mul by a constant, whose output is GELU's), their outputs, and so the
    gradients the training pass would give them, are 0 bytes. Their times are
    unchanged, and a placement that splits the chain is charged no transfer
    inside it. O(V + E).
    """
    types, src, port = graph.op_types, graph.edge_src, graph.edge_port
    inner: list[int] = []
    for gelu in exact_gelus(graph):
        chain = _only_reader(graph, gelu.div) == gelu.erf and _only_reader(graph, gelu.erf) == gelu.add
        if gelu.half >= 0:  # dynamo: ... Add, Mul by 0.5, Mul by x (GELU's output)
            if (
                chain
                and _only_reader(graph, gelu.add) == gelu.half
                and _only_reader(graph, gelu.half) == gelu.mul
            ):
                inner += [gelu.div, gelu.erf, gelu.add, gelu.half]
            continue
        last = _only_reader(graph, gelu.mul)
        if (
            not chain
            or _only_reader(graph, gelu.add) != gelu.mul
            or last < 0
            or types[last] != "Mul"
            or any(
                port[e] != CONTROL_PORT and src[e] != gelu.mul and types[src[e]] != "Constant"
                for e in graph.in_edges[last]
            )
        ):
            continue
        inner += [gelu.div, gelu.erf, gelu.add, gelu.mul]
    inner += [silu.sigmoid for silu in silus(graph) if _only_reader(graph, silu.sigmoid) == silu.mul]
    if not inner:
        return graph
    output_bytes = list(graph.output_bytes)
    for v in inner:
        output_bytes[v] = [0] * len(output_bytes[v])
    return graph.replace(output_bytes=output_bytes)


def composite_saved(graph: OpGraph) -> dict[int, Saved]:
    """What autograd saves for the ops of an exported exact GELU, SiLU or rsqrt.

    ``F.gelu`` and ``F.silu`` are one op each that saves its input (``GeluBackward0``,
    ``SiluBackward0``); the TorchScript exporter writes GELU as ``x * 0.5 * (1 + erf(x /
    sqrt(2)))`` and SiLU as ``x * sigmoid(x)``, whose ops would each keep their own
    operands. Returns, for GELU's Erf and SiLU's Sigmoid: keep nothing; for the Mul that
    multiplies by ``x``: keep ``x`` only. ``torch.rsqrt`` saves its result
    (``RsqrtBackward0``); exported as ``Div(1, Sqrt(x))`` or ``Reciprocal(Sqrt(x))``, its
    Sqrt keeps nothing and the Div or Reciprocal its output. O(V + E).
    """
    out: dict[int, Saved] = {}
    for gelu in exact_gelus(graph):
        out[gelu.erf] = _NOTHING
        out[gelu.mul] = Saved(inputs=(gelu.x_position,))
    for silu in silus(graph):
        out[silu.sigmoid] = _NOTHING
        out[silu.mul] = Saved(inputs=(silu.x_position,))
    for sqrt, div in rsqrts(graph):
        out[sqrt] = _NOTHING
        out[div] = _OUTPUT
    return out


def rsqrts(graph: OpGraph) -> list[tuple[int, int]]:
    """Every ``torch.rsqrt`` an exporter wrote as ``Div(1, Sqrt(x))`` (TorchScript) or
    ``Reciprocal(Sqrt(x))`` (dynamo): (Sqrt, Div or Reciprocal) pairs whose second op is the
    Sqrt's only reader (a Div dividing a Constant by it). O(V + E)."""
    out: list[tuple[int, int]] = []
    for sqrt, op_type in enumerate(graph.op_types):
        div = _only_reader(graph, sqrt) if op_type == "Sqrt" else -1
        if div >= 0 and graph.op_types[div] == "Reciprocal":
            out.append((sqrt, div))
            continue
        if div < 0 or graph.op_types[div] != "Div":
            continue
        edges = _data_in(graph, div)
        positions = graph.attrs[div].get("_data_inputs") or list(range(len(edges)))
        by_position = {p: graph.edge_src[e] for p, e in zip(positions, edges)}
        if by_position.get(1) == sqrt and graph.op_types[by_position.get(0, sqrt)] == "Constant":
            out.append((sqrt, div))
    return out


def mark_views(graph: OpGraph, op_set: str) -> OpGraph:
    """``graph`` with :attr:`~OpGraph.view_of` set for every op of a view type that has a data input.

    ``op_set`` is the cost-rule name table the graph's op types belong to
    (``tensorflow`` or ``onnx``). O(V + E).
    """
    types = VIEW_OPS.get(op_set, frozenset())
    suffix = INPLACE_SUFFIX.get(op_set)
    view_of: dict[int, tuple[int, int]] = {}
    for v, op_type in enumerate(graph.op_types):
        inplace = suffix is not None and op_type.endswith(suffix) and not op_type.endswith("__")
        if op_type not in types and not inplace and not (op_set == "onnx" and _same_dtype_cast(graph, v)):
            continue
        positions = graph.attrs[v].get("_data_inputs")
        if positions is not None and positions[:1] != [0]:
            # An ONNX op whose first input is an initializer views a parameter, which is
            # resident anyway (a PyTorch `weight.t()`): it allocates nothing, keeps nothing.
            if graph.attrs[v].get("_initializers"):
                view_of[v] = RESIDENT
            continue
        first = next((e for e in graph.in_edges[v] if graph.edge_port[e] != CONTROL_PORT), None)
        if first is not None:
            view_of[v] = (graph.edge_src[first], graph.edge_port[first])
    return graph.replace(view_of=view_of) if view_of or graph.view_of else graph
