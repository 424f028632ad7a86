"""The ONNX op rules of the analytic cost model (op set ``onnx``).

Contract. Importing this module registers a rule for every ONNX op type it
covers into :data:`~baechi_cli.costs.registry.ONNX_RULES` (non-default
domains prefixed: ``com.microsoft.Attention``). The registry loads this
module on the first lookup, so callers look rules up there
(:func:`~baechi_cli.costs.registry.rule_for`); this module imports
:mod:`baechi_cli.costs.rules_tf` first, for its aliases reuse those rules.
An ONNX op type is counted in one of three ways:

* by a TensorFlow rule (:data:`ALIASES`), where TensorFlow has a counterpart;
* by a rule of its own, where TensorFlow has none (LayerNormalization, Gelu,
  Attention, ...): counted on the ONNX function body that defines the op, so
  a model exported with the fused op and one that spells out its body node
  by node cost the same;
* control flow (:data:`CONTROL_FLOW`): its subgraphs' nodes, each by its own
  rule.

Aliases keep one copy of the maths: an :class:`Alias` restates the ONNX op in the
TensorFlow op's conventions -- an *adapter* per convention that differs (Conv: NCHW and
the weight's layout; Gemm: ``transA``/``transB``; MatMul: 1-D operands) -- and may add
work the ONNX op fuses (:class:`Plus`: Conv's bias as a BiasAdd), counted by that op's
TensorFlow rule. Adapters keep every input, so the bytes read are the ONNX op's own.
:func:`onnx_view` sees an op's explicit inputs through the reader's
``attrs["_input_shapes"]`` / ``attrs["_input_dtypes"]``, since initializers make no edges.

Control flow (:func:`count_control_flow`): the op's own input and output bytes plus every
node of its subgraphs (``attrs["_subgraph_nodes"]``), each by its own rule, recursively.
Trip counts and branches are runtime values, so a Loop, Scan or SequenceMap body counts
once (one iteration, as a TensorFlow while loop's body), an If counts both branches (an
upper bound), and temporary bytes are the largest inner node's. :class:`InnerCount` says
what each inner node was counted as, for the cost report's coverage and fallbacks.

Complexity: :func:`onnx_view`, every rule and every adapter are
O(inputs + rank); :func:`count_control_flow` is O(subgraph nodes, at every
depth, and their inputs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

# The aliases below adapt the TensorFlow rules: importing rules_tf registers them into RULES first.
import baechi_cli.costs.rules_tf  # noqa: F401
from baechi_cli.core.graph import OpGraph
from baechi_cli.costs.registry import (
    BYTES,
    FLOPS,
    ONNX,
    RULES,
    ZERO,
    CannotCount,
    OpCount,
    OpView,
    Rule,
    Shape,
    bytes_only,
    count_view,
    has_input,
    known,
    known_shape,
    no_kernel,
    numel,
    out_or_in_numel,
    per_element,
    register,
    rule_for,
    with_flops,
)
from baechi_cli.io.onnx import DTYPES, SubgraphNode

__all__ = ["ALIASES", "CONTROL_FLOW", "Alias", "InnerCount", "Plus", "count_control_flow", "onnx_view"]

Adapter = Callable[[OpView], OpView]

# Bits per element of each dtype name the ONNX reader writes (int4: 4, two per byte).
_BITS = {name: bits for name, bits in DTYPES.values()}


def onnx_view(
    op_type: str,
    attrs: Mapping[str, Any],
    output_shapes: Sequence[Shape | None],
    output_dtypes: Sequence[str],
    output_bytes: Sequence[int],
) -> OpView:
    """The view of one op of an ONNX graph: inputs from the reader's ``_input_shapes``/``_input_dtypes``.

    Input bytes are elements x bits per element, rounded up to whole bytes
    (as the reader sizes outputs); 0 for an unknown shape, an omitted input or
    a non-tensor value. An op without those attrs has no inputs.
    """
    shapes = attrs.get("_input_shapes", ())
    dtypes = attrs.get("_input_dtypes", ())
    nbytes = [
        (math.prod(s) * _BITS.get(dt, 0) + 7) // 8 if known(s) else 0
        for s, dt in zip(shapes, dtypes, strict=True)
    ]
    return OpView(op_type, attrs, shapes, dtypes, nbytes, output_shapes, output_dtypes, output_bytes)


# --- ONNX op types TensorFlow has no op for ---------------------------------------
#
# Counted on the ONNX function body that defines each op (onnx/defs), node by
# node with the TensorFlow rules' conventions: one FLOP per elementwise
# operation on a tensor (erf, tanh, sigmoid, exp included), a ReduceMean or
# ReduceSum one per input element (as rules_tf's Mean and Sum); operations on
# scalars (epsilon, constants) are not counted. A model exported with the fused
# op and one that spells out its body node by node (an older opset) so cost the
# same. The ONNX names of ops TensorFlow does have are in ALIASES, below.


# FLOPs per output element, and the function body they are counted on.
_ONNX_ELEMENTWISE: dict[str, tuple[int, str]] = {
    "HardSigmoid": (4, "Mul, Add, Min, Max"),
    "HardSwish": (5, "HardSigmoid, Mul"),
    "Mish": (3, "Softplus, Tanh, Mul"),
    "Celu": (3, "Div, Elu, Mul"),
    "ThresholdedRelu": (2, "Less, Where"),
    "Shrink": (6, "Less, Add, Sub, Less, Where, Where"),
    "PRelu": (3, "Less, Mul, Where"),
    "Swish": (3, "Mul, Sigmoid, Mul"),
    "SwiGLU": (4, "Swish of one half of the input, Mul by the other"),
    "RotaryEmbedding": (3, "x * cos + rotated x * sin"),
    "Hardmax": (1, "a compare: argmax along the axis, written one-hot"),
    "CumSum": (1, "an add"),
    "CumProd": (1, "a multiply"),
    **dict.fromkeys(
        "BitShift BitwiseAnd BitwiseOr BitwiseXor BitwiseNot".split(), (1, "an integer operation")
    ),
    "DequantizeLinear": (2, "Sub zero point, Mul scale"),
    "QuantizeLinear": (5, "Div scale, Round, Add zero point, saturating Clip 2"),
    "DynamicQuantizeLinear": (7, "ReduceMin, ReduceMax, then QuantizeLinear 5"),
    "com.microsoft.Gelu": (5, "as Gelu"),
    "com.microsoft.BiasGelu": (6, "Add bias, then Gelu 5"),
    "com.microsoft.QuickGelu": (3, "Mul alpha, Sigmoid, Mul"),
}

_onnx_elementwise = per_element(_ONNX_ELEMENTWISE)
for _t, (_k, _body) in _ONNX_ELEMENTWISE.items():
    register(_t, kind=FLOPS, op_set=ONNX, note=f"{_k} FLOP{'s' if _k > 1 else ''}/element ({_body})")(
        _onnx_elementwise
    )

# Gelu's body: none: Div, Erf, Add, Mul, Mul; tanh: Pow, Mul, Add, Mul, Tanh, Add, Mul, Mul.
_GELU_FLOPS = {"none": 5, "tanh": 8}


@register("Gelu", kind=FLOPS, op_set=ONNX)
def _gelu(view: OpView) -> OpCount:
    """5 FLOPs/element (Div, Erf, Add, Mul, Mul); approximate=tanh: 8 (Pow, Mul, Add, Mul, Tanh, Add, Mul, Mul)"""
    per_element = _GELU_FLOPS.get(str(view.attrs.get("approximate", "none")))
    if per_element is None:
        raise CannotCount("unknown Gelu approximation")
    return with_flops(view, per_element * out_or_in_numel(view))


@register("com.microsoft.FastGelu", kind=FLOPS, op_set=ONNX)
def _fast_gelu(view: OpView) -> OpCount:
    """8 FLOPs/element (Gelu with approximate=tanh), 9 with a bias input"""
    return with_flops(view, (_GELU_FLOPS["tanh"] + has_input(view, 1)) * out_or_in_numel(view))


class _Normalization(NamedTuple):
    per_element: int  # FLOPs per element of X, every optional input given
    element_body: str
    per_row: int  # FLOPs per normalized row (the statistics' scalar work)
    row_body: str
    rows: Callable[[OpView, Shape], int]  # how many rows X has
    optional: tuple[int, ...] = ()  # optional inputs that add one FLOP per element each


def _rows_before_axis(view: OpView, x: Shape) -> int:
    return numel(x[: int(view.attrs.get("axis", -1))])


def _rows_per_group(view: OpView, x: Shape) -> int:
    groups = view.attrs.get("num_groups")
    if not isinstance(groups, int):
        raise CannotCount("num_groups attr missing")
    return x[0] * groups


def _rows_per_channel(view: OpView, x: Shape) -> int:
    return x[0] * x[1]


def _rows_outside_axes(view: OpView, x: Shape) -> int:
    axes = view.attrs.get("axes", [0, 2, 3])
    return numel(x) // numel(tuple(x[a] for a in axes))


def _rows_along_axis(view: OpView, x: Shape) -> int:
    return numel(x) // x[int(view.attrs.get("axis", -1))]


_LAYER_NORM_BODY = "ReduceMean, Mul, ReduceMean, Sub, Div, Mul, Add bias"
_LAYER_NORM_ROW = "Mul, Sub, Add, Sqrt, Reciprocal"
_RMS_NORM_BODY = "Mul, ReduceMean, Div, Mul"
_NORMALIZATIONS: dict[str, _Normalization] = {
    "LayerNormalization": _Normalization(7, _LAYER_NORM_BODY, 5, _LAYER_NORM_ROW, _rows_before_axis, (2,)),
    "GroupNormalization": _Normalization(7, _LAYER_NORM_BODY, 4, "Mul, Sub, Add, Sqrt", _rows_per_group),
    "InstanceNormalization": _Normalization(7, _LAYER_NORM_BODY, 4, "Mul, Sub, Add, Sqrt", _rows_per_channel),
    "RMSNormalization": _Normalization(4, _RMS_NORM_BODY, 2, "Add, Sqrt", _rows_before_axis),
    # onnxruntime's RMS norm, registered in the default domain
    "SimplifiedLayerNormalization": _Normalization(4, _RMS_NORM_BODY, 2, "Add, Sqrt", _rows_before_axis),
    "MeanVarianceNormalization": _Normalization(
        5, "ReduceMean, Pow, ReduceMean, Sub, Div", 4, "Pow, Sub, Add, Sqrt", _rows_outside_axes
    ),
    "LpNormalization": _Normalization(3, "Abs or Mul, ReduceSum, Div", 1, "Sqrt", _rows_along_axis),
    "com.microsoft.SkipLayerNormalization": _Normalization(
        9, f"Add skip, Add bias, {_LAYER_NORM_BODY}", 5, _LAYER_NORM_ROW, _rows_before_axis, (3, 4)
    ),
    "com.microsoft.SkipSimplifiedLayerNormalization": _Normalization(
        6, f"Add skip, Add bias, {_RMS_NORM_BODY}", 2, "Add, Sqrt", _rows_before_axis, (3,)
    ),
}


def _normalization(view: OpView) -> OpCount:
    norm = _NORMALIZATIONS[view.op_type]
    x = known_shape(view.input_shapes, 0, "X")
    per_element = norm.per_element - sum(not has_input(view, i) for i in norm.optional)
    return with_flops(view, per_element * numel(x) + norm.per_row * norm.rows(view, x))


for _t, _norm in _NORMALIZATIONS.items():
    _less = f"; 1 less per absent input {', '.join(map(str, _norm.optional))}" if _norm.optional else ""
    _note = (
        f"{_norm.per_element} FLOPs/element ({_norm.element_body}{_less}) "
        f"+ {_norm.per_row}/normalized row ({_norm.row_body})"
    )
    register(_t, kind=FLOPS, op_set=ONNX, note=_note)(_normalization)


# Per attention score: the scale (1) and TensorFlow's Softmax (5).
_SCORE_FLOPS = 6


def _attention_flops(
    query_elements: int, output_elements: int, kv_len: int, scores: int, per_score: int
) -> int:
    """Q @ K^T and softmax(scores) @ V, 2 FLOPs per (element, key) each, plus ``per_score`` per score."""
    return 2 * kv_len * (query_elements + output_elements) + per_score * scores


@register("Attention", kind=FLOPS, op_set=ONNX)
def _attention(view: OpView) -> OpCount:
    """2 * keys * (Q + Y elements) (Q@K^T, P@V) + 6 FLOPs/score (scale, Softmax 5), +1 masked or causal, +3 softcap"""
    q = known_shape(view.input_shapes, 0, "Q")
    k = known_shape(view.input_shapes, 1, "K")
    y = known_shape(view.output_shapes, 0, "Y")
    if len(q) == 4:  # [batch, heads, queries, head size]
        rows = q[0] * q[1] * q[2]
    elif len(q) == 3 and isinstance(view.attrs.get("q_num_heads"), int):  # [batch, queries, hidden]
        rows = q[0] * q[1] * view.attrs["q_num_heads"]
    else:
        raise CannotCount("Q is neither 4-D nor 3-D with q_num_heads")
    kv_len = k[-2]  # K: [batch, heads, keys, head size] or [batch, keys, hidden]
    if has_input(view, 4):
        kv_len += known_shape(view.input_shapes, 4, "past_key")[-2]
    masked = has_input(view, 3) or bool(view.attrs.get("is_causal", 0))
    softcap = float(view.attrs.get("softcap", 0.0)) > 0
    per_score = _SCORE_FLOPS + masked + 3 * softcap  # softcap: Div, Tanh, Mul
    return with_flops(view, _attention_flops(numel(q), numel(y), kv_len, rows * kv_len, per_score))


@register("com.microsoft.Attention", kind=FLOPS, op_set=ONNX)
def _fused_attention(view: OpView) -> OpCount:
    """input @ weights (2*B*S*D*(Dq+Dk+Dv)) + bias, then Attention over num_heads heads (+1/score masked)"""
    x = known_shape(view.input_shapes, 0, "input")
    w = known_shape(view.input_shapes, 1, "weights")
    heads = view.attrs.get("num_heads")
    if len(x) != 3 or len(w) != 2 or not isinstance(heads, int):
        raise CannotCount("input is not [batch, sequence, hidden] or num_heads missing")
    q_size, _, v_size = view.attrs.get("qkv_hidden_sizes") or [w[1] // 3] * 3
    batch, seq = x[0], x[1]
    projection = 2 * batch * seq * x[2] * w[1] + has_input(view, 2) * batch * seq * w[1]
    kv_len = seq + (known_shape(view.input_shapes, 4, "past")[3] if has_input(view, 4) else 0)
    masked = has_input(view, 3) or has_input(view, 5) or bool(view.attrs.get("unidirectional", 0))
    scores = batch * heads * seq * kv_len
    core = _attention_flops(batch * seq * q_size, batch * seq * v_size, kv_len, scores, _SCORE_FLOPS + masked)
    return with_flops(view, projection + core)


# Control flow (If, Loop, Scan, SequenceMap) counts its subgraphs' nodes, each
# by its own ONNX rule: in the last section of this module.

register(
    *(
        # data movement without a TensorFlow rule of the same meaning
        "Trilu Compress NonZero MaxUnpool EyeLike CenterCropPad DepthToSpace SpaceToDepth"
    ).split(),
    kind=BYTES,
    op_set=ONNX,
)(bytes_only)

register(
    "Resize",
    "Upsample",
    "TopK",
    kind=BYTES,
    op_set=ONNX,
    note="memory-bound: interpolation and selection arithmetic not counted",
)(bytes_only)

# Optionals and sequences hold references to tensors, as TensorArrays do.
register(
    *(
        "Optional OptionalGetElement OptionalHasElement SequenceAt SequenceConstruct SequenceEmpty "
        "SequenceErase SequenceInsert SequenceLength"
    ).split(),
    kind=ZERO,
    op_set=ONNX,
)(no_kernel)


# --- adapters: the ONNX op in the TensorFlow op's conventions ---------------------


def _with_input_shape(view: OpView, i: int, shape: Shape) -> OpView:
    shapes = list(view.input_shapes)
    shapes[i] = shape
    return view._replace(input_shapes=shapes)


def _reordered(view: OpView, order: Sequence[int | None]) -> OpView:
    """Inputs ``order`` first (None: an empty slot), then the others in their order; bytes kept."""
    rest = [i for i in range(len(view.input_shapes)) if i not in order]
    picks = [*order, *rest]
    return view._replace(
        input_shapes=[None if i is None else view.input_shapes[i] for i in picks],
        input_dtypes=["" if i is None else view.input_dtypes[i] for i in picks],
        input_bytes=[0 if i is None else view.input_bytes[i] for i in picks],
    )


def _filter(weight: Shape) -> Shape:
    """An ONNX (transposed) convolution weight ``[a, b, *kernel]`` as TensorFlow's ``[*kernel, b, a]``."""
    if len(weight) < 3:
        raise CannotCount("weight rank < 3")
    return (*weight[2:], weight[1], weight[0])


_AUTO_PAD = {"SAME_UPPER": "SAME", "SAME_LOWER": "SAME", "VALID": "VALID"}  # NOTSET: the pads attr


def _conv_view(view: OpView) -> OpView:
    """NCHW; weight [M, C/group, *kernel] as filter [*kernel, C/group, M]; strides, dilations, pads, auto_pad"""
    # The output shape (known after shape inference) settles the count; the
    # attrs matter only when it is not known.
    weight = known_shape(view.input_shapes, 1, "weight")
    spatial = len(weight) - 2
    attrs = view.attrs
    pads = list(attrs.get("pads") or [0] * 2 * spatial)
    tf_attrs = {
        "data_format": "NCHW",  # the rules read only the channels-first prefix
        "strides": [1, 1, *(attrs.get("strides") or [1] * spatial)],
        "dilations": [1, 1, *(attrs.get("dilations") or [1] * spatial)],
        "padding": _AUTO_PAD.get(str(attrs.get("auto_pad", "NOTSET")), "EXPLICIT"),
        # ONNX: [begin_1, ..., begin_n, end_1, ..., end_n]; TF: (begin, end) per dimension
        "explicit_paddings": [0, 0, 0, 0, *(p for d in range(spatial) for p in (pads[d], pads[spatial + d]))],
    }
    return _with_input_shape(view._replace(attrs=tf_attrs), 1, _filter(weight))


def _qlinear_conv_view(view: OpView) -> OpView:
    """x and w (inputs 0 and 3) as Conv's; scales and zero points read, not counted"""
    return _conv_view(_reordered(view, (0, 3)))


def _conv_transpose_view(view: OpView) -> OpView:
    """X as out_backprop; weight [C, M/group, *kernel] as filter [*kernel, M/group, C]"""
    weight = known_shape(view.input_shapes, 1, "weight")
    # Conv2DBackpropInput's inputs: input_sizes (not read), filter, out_backprop.
    return _with_input_shape(_reordered(view, (None, 1, 0)), 1, _filter(weight))


def _gemm_view(view: OpView) -> OpView:
    """transA/transB as transpose_a/transpose_b"""
    attrs = view.attrs
    return view._replace(
        attrs={"transpose_a": bool(attrs.get("transA", 0)), "transpose_b": bool(attrs.get("transB", 0))}
    )


def _matmul_view(view: OpView) -> OpView:
    """numpy matmul: a 1-D a as [1, K], a 1-D b as [K, 1]"""
    shapes = list(view.input_shapes)
    a, b = shapes[0], shapes[1]
    if a is not None and len(a) == 1:
        shapes[0] = (1, a[0])
    if b is not None and len(b) == 1:
        shapes[1] = (b[0], 1)
    return view._replace(attrs={}, input_shapes=shapes)


def _qlinear_matmul_view(view: OpView) -> OpView:
    """a and b (inputs 0 and 3) as MatMul's; scales and zero points read, not counted"""
    return _matmul_view(_reordered(view, (0, 3)))


def _fused_matmul_view(view: OpView) -> OpView:
    """transA/transB as adj_x/adj_y (alpha folded into the product, not counted)"""
    adj = {"adj_x": bool(view.attrs.get("transA", 0)), "adj_y": bool(view.attrs.get("transB", 0))}
    return _matmul_view(view)._replace(attrs=adj)


def in_training_mode(graph: OpGraph) -> OpGraph:
    """``graph`` with every BatchNormalization in training mode (``training_mode`` 1): the step
    ``--training`` places runs the model in ``train()`` mode, batch statistics and all, whatever
    mode the export was made in. O(V)."""
    attrs = [
        {**a, "training_mode": 1} if t == "BatchNormalization" else a
        for t, a in zip(graph.op_types, graph.attrs, strict=True)
    ]
    return graph.replace(attrs=attrs)


def _batch_norm_view(view: OpView) -> OpView:
    """training_mode as is_training; NCHW"""
    return view._replace(
        attrs={"is_training": bool(view.attrs.get("training_mode", 0)), "data_format": "NCHW"}
    )


def _pool_view(view: OpView) -> OpView:
    """kernel_shape as ksize, each dim clipped to the padded input's

    A window is clipped at the input: ``nn.AvgPool2d(1280, ceil_mode=True)`` on 7x7 averages
    49 elements, not 1280^2."""
    kernel = view.attrs.get("kernel_shape")
    if not kernel:
        raise CannotCount("kernel_shape attr missing")
    x = view.input_shapes[0] if view.input_shapes else None
    if x is not None and len(x) == len(kernel) + 2:
        pads = list(view.attrs.get("pads") or [0] * (2 * len(kernel)))
        rank = len(kernel)
        kernel = [min(k, size + pads[i] + pads[i + rank]) for i, (k, size) in enumerate(zip(kernel, x[2:]))]
    return view._replace(attrs={"ksize": [1, 1, *kernel]})


def _global_pool_view(view: OpView) -> OpView:
    """the input's spatial dims as ksize"""
    x = known_shape(view.input_shapes, 0, "X")
    return view._replace(attrs={"ksize": [1, 1, *x[2:]]})


# ONNX recurrent op -> cuDNN's rnn_mode, from the op's attrs.
_RNN_MODES: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "LSTM": lambda attrs: "lstm",
    "GRU": lambda attrs: "gru",
    "RNN": lambda attrs: "rnn_relu" if (attrs.get("activations") or ["Tanh"])[0] == "Relu" else "rnn_tanh",
}


def _recurrent_view(view: OpView) -> OpView:
    """X [T, B, I] (layout 1: [B, T, I]) as input, [directions, B, hidden_size] as input_h/input_c"""
    # cuDNN reads the hidden size and the number of layers (here 1) off
    # input_h, which ONNX may omit: it is made from the attrs and R
    # [directions, gates * hidden, hidden]. W's and R's bytes stay.
    x = known_shape(view.input_shapes, 0, "X")
    recurrence = known_shape(view.input_shapes, 2, "R")
    attrs = view.attrs
    time_major = not attrs.get("layout", 0)
    bidirectional = attrs.get("direction", "forward") == "bidirectional"
    h = (1 + bidirectional, x[1] if time_major else x[0], int(attrs.get("hidden_size") or recurrence[-1]))
    cudnn_attrs = {
        "rnn_mode": _RNN_MODES[view.op_type](attrs),
        "direction": "bidirectional" if bidirectional else "unidirectional",
        "time_major": time_major,
    }
    return view._replace(attrs=cudnn_attrs, input_shapes=[x, h, h, *view.input_shapes[3:]])


def _split_to_sequence_view(view: OpView) -> OpView:
    """the input as TensorArraySplitV3's value (input 1)"""
    return _reordered(view, (None, 0))


# --- FLOPs the ONNX op fuses: counted by another TensorFlow rule -------------------


class Plus(NamedTuple):
    """Work an ONNX op does beyond its TensorFlow counterpart: TensorFlow elementwise rule ``rule``
    run over the shape ``over(view)`` returns (None: no such work in this op)."""

    rule: str
    over: Callable[[OpView], Shape | None]
    note: str


def _input_elements(view: OpView) -> Shape | None:
    return view.input_shapes[0]


def _output_elements(view: OpView) -> Shape | None:
    return view.output_shapes[0]


def _bias(i: int) -> Plus:
    """A bias input ``i``, added to the output as TensorFlow's BiasAdd."""

    def over(view: OpView) -> Shape | None:
        return view.output_shapes[0] if has_input(view, i) else None

    return Plus("BiasAdd", over, f"+ BiasAdd's 1 FLOP/output element with bias input {i}")


def _plus_flops(plus: Plus, view: OpView) -> float:
    shape = plus.over(view)
    if shape is None:
        return 0.0
    if not known(shape):
        raise CannotCount(f"{plus.rule} shape unknown")
    elements = OpView(plus.rule, {}, (), (), (), (shape,), ("",), (0,))
    return RULES[plus.rule].fn(elements).flops


_SQUARE_INPUT = Plus("Square", _input_elements, "+ Square on the input")
_SQRT_OUTPUT = Plus("Sqrt", _output_elements, "+ Sqrt on the output")
_LOG_OUTPUT = Plus("Log", _output_elements, "+ Log on the output")


# --- the table ------------------------------------------------------------------------


class Alias(NamedTuple):
    """How an ONNX op type is counted by TensorFlow op type ``rule``'s rule."""

    rule: str
    adapt: Adapter | None = None  # the ONNX view in the TensorFlow op's conventions; None: as it is
    plus: tuple[Plus, ...] = ()


def _as(rule: str, names: str) -> dict[str, Alias]:
    """Each of the space-separated ONNX op types ``names`` as TensorFlow op type ``rule``, as it is."""
    return dict.fromkeys(names.split(), Alias(rule))


def _same_names(names: str) -> dict[str, Alias]:
    """ONNX op types whose TensorFlow counterpart has the same name and conventions."""
    return {name: Alias(name) for name in names.split()}


ALIASES: dict[str, Alias] = {
    # no kernel: graph inputs, constants, views, shape arithmetic
    "Input": Alias("Placeholder"),
    "Constant": Alias("Const"),
    **_same_names("Identity Reshape Squeeze Shape Size"),
    **_as("Reshape", "Flatten"),
    **_as("ExpandDims", "Unsqueeze"),
    **_as("Bitcast", "BitCast"),
    **_as("Identity", "Dropout"),  # inference: the identity
    # convolutions and matrix products
    "Conv": Alias("Conv2D", _conv_view, (_bias(2),)),
    "ConvInteger": Alias("Conv2D", _conv_view),
    "QLinearConv": Alias("Conv2D", _qlinear_conv_view, (_bias(8),)),
    "ConvTranspose": Alias("Conv2DBackpropInput", _conv_transpose_view, (_bias(2),)),
    "Gemm": Alias("MatMul", _gemm_view, (_bias(2),)),
    "MatMul": Alias("BatchMatMulV2", _matmul_view),
    "MatMulInteger": Alias("BatchMatMulV2", _matmul_view),
    "QLinearMatMul": Alias("BatchMatMulV2", _qlinear_matmul_view),
    "com.microsoft.FusedMatMul": Alias("BatchMatMulV2", _fused_matmul_view),
    "Einsum": Alias("Einsum"),
    # normalisation, pooling, recurrent blocks
    "BatchNormalization": Alias("FusedBatchNormV3", _batch_norm_view),
    "LRN": Alias("LRN"),
    "MaxPool": Alias("MaxPool", _pool_view),
    "AveragePool": Alias("AvgPool", _pool_view),
    "GlobalMaxPool": Alias("MaxPool", _global_pool_view),
    "GlobalAveragePool": Alias("AvgPool", _global_pool_view),
    **{op: Alias("CudnnRNN", _recurrent_view) for op in _RNN_MODES},
    # elementwise math (counted on the output)
    **_same_names(
        "Abs Acos Acosh Asin Asinh Atan Atanh Ceil Cos Cosh Elu Erf Exp Floor LeakyRelu Log Neg "
        "Reciprocal Relu Round Selu Sigmoid Sign Sin Sinh Softplus Softsign Sqrt Tan Tanh Sub Mul Pow "
        "Equal Greater Less IsInf Softmax LogSoftmax"
    ),
    **_as("AddV2", "Add"),
    **_as("RealDiv", "Div"),
    **_as("GreaterEqual", "GreaterOrEqual"),
    **_as("LessEqual", "LessOrEqual"),
    **_as("IsNan", "IsNaN"),
    **_as("FloorMod", "Mod"),
    **_as("LogicalAnd", "And"),
    **_as("LogicalOr", "Or"),
    **_as("LogicalNot", "Not"),
    **_as("NotEqual", "Xor"),  # on booleans, a xor b is a != b
    **_as("SelectV2", "Where"),
    **_as("ClipByValue", "Clip"),
    # variadic elementwise ops: one FLOP per extra operand and element (AddN)
    **_as("AddN", "Sum Max Min"),
    "Mean": Alias("AddN", plus=(Plus("RealDiv", _output_elements, "+ RealDiv on the output"),)),
    # reductions: ONNX's function bodies around a ReduceSum
    **_as("Sum", "ReduceSum"),
    **_as("Mean", "ReduceMean"),
    **_as("Max", "ReduceMax"),
    **_as("Min", "ReduceMin"),
    **_as("Prod", "ReduceProd"),
    **_same_names("ArgMax ArgMin"),
    "ReduceSumSquare": Alias("Sum", plus=(_SQUARE_INPUT,)),
    "ReduceL1": Alias("Sum", plus=(Plus("Abs", _input_elements, "+ Abs on the input"),)),
    "ReduceL2": Alias("Sum", plus=(_SQUARE_INPUT, _SQRT_OUTPUT)),
    "ReduceLogSum": Alias("Sum", plus=(_LOG_OUTPUT,)),
    "ReduceLogSumExp": Alias("Sum", plus=(Plus("Exp", _input_elements, "+ Exp on the input"), _LOG_OUTPUT)),
    # gathers, scatters
    **_as("GatherV2", "Gather GatherElements"),
    **_as("GatherNd", "GatherND"),
    **_as("TensorScatterUpdate", "ScatterND ScatterElements Scatter"),
    **_as("UniqueWithCounts", "Unique"),
    # data movement
    **_same_names("Transpose Tile Cast Range OneHot"),
    **_as("ConcatV2", "Concat"),
    **_as("SplitV", "Split"),
    **_as("StridedSlice", "Slice"),
    **_as("PadV2", "Pad"),
    **_as("Cast", "CastLike"),
    **_as("BroadcastTo", "Expand"),
    **_as("Fill", "ConstantOfShape"),
    **_as("ReverseV2", "ReverseSequence"),
    **_as("RandomUniform", "RandomUniform RandomUniformLike Bernoulli"),
    **_as("RandomStandardNormal", "RandomNormal RandomNormalLike"),
    **_as("TensorArrayConcatV3", "ConcatFromSequence"),
    "SplitToSequence": Alias("TensorArraySplitV3", _split_to_sequence_view),
}


def _counted_as(alias: Alias) -> Rule:
    """The ONNX rule of ``alias``: the TensorFlow rule on the adapted view, plus the fused work."""
    tf_rule = RULES[alias.rule].fn

    def count(view: OpView) -> OpCount:
        adapted = alias.adapt(view) if alias.adapt is not None else view
        counted = tf_rule(adapted._replace(op_type=alias.rule))
        if not alias.plus:
            return counted
        return counted._replace(flops=counted.flops + sum(_plus_flops(p, view) for p in alias.plus))

    return count


def _note(alias: Alias) -> str:
    """The coverage table's line: the TensorFlow rule's note, the adapter's docstring, the fused work."""
    adapter = [f"seen as: {(alias.adapt.__doc__ or '').strip().splitlines()[0]}"] if alias.adapt else []
    return "; ".join([f"TF rule: {RULES[alias.rule].note}", *adapter, *(p.note for p in alias.plus)])


for _onnx_type, _alias in ALIASES.items():
    register(_onnx_type, kind=RULES[_alias.rule].kind, note=_note(_alias), op_set=ONNX, shares=_alias.rule)(
        _counted_as(_alias)
    )


# --- control flow: each subgraph node counted by its own rule ---------------------

#: ONNX op types whose subgraphs' nodes are counted into the op (see the module docstring).
CONTROL_FLOW = ("If", "Loop", "Scan", "SequenceMap")


class InnerCount(NamedTuple):
    """What one subgraph node of a control-flow op was counted as."""

    path: str  # its SubgraphNode name, through the nested ones: "body/If_1/then_branch/Relu_0"
    op_type: str
    kind: str  # the kind of the rule that counted it; uncovered: none
    fell_back: bool  # its rule could not count it: bytes only


def _subgraph_nodes(attrs: Mapping[str, Any]) -> Sequence[SubgraphNode]:
    return attrs.get("_subgraph_nodes", ())


def _inner_counts(nodes: Sequence[SubgraphNode], prefix: str) -> Iterator[tuple[InnerCount, OpCount]]:
    """Every node of ``nodes``, nested ones after their control-flow node, with its own count."""
    for node in nodes:
        path = prefix + node.name
        entry = rule_for(node.op_type, ONNX)
        view = onnx_view(node.op_type, node.attrs, node.output_shapes, node.output_dtypes, node.output_bytes)
        if node.op_type in CONTROL_FLOW:
            yield InnerCount(path, node.op_type, entry.kind, False), bytes_only(view)
            yield from _inner_counts(_subgraph_nodes(node.attrs), f"{path}/")
        else:
            count, fell_back = count_view(entry, view)
            yield InnerCount(path, node.op_type, entry.kind, fell_back), count


def count_control_flow(view: OpView) -> tuple[OpCount, list[InnerCount]]:
    """An If/Loop/Scan/SequenceMap's count, and what each of its subgraph nodes was counted as.

    Explicit inputs' and outputs' bytes plus every subgraph node's count
    (FLOPs and bytes summed, temporary bytes the largest); conventions in the
    module docstring. O(subgraph nodes at every depth and their inputs).
    """
    own = bytes_only(view)
    flops, read, written, temporary = own.flops, own.bytes_read, own.bytes_written, 0
    inner: list[InnerCount] = []
    for item, count in _inner_counts(_subgraph_nodes(view.attrs), ""):
        inner.append(item)
        flops += count.flops
        read += count.bytes_read
        written += count.bytes_written
        temporary = max(temporary, count.temporary_bytes)
    return OpCount(flops, read, written, temporary), inner


def _control_flow(view: OpView) -> OpCount:
    return count_control_flow(view)[0]


register(
    *CONTROL_FLOW,
    kind=FLOPS,
    op_set=ONNX,
    note=(
        "explicit inputs' and outputs' bytes + each subgraph node counted by its own rule (nested ones too; "
        "bytes only where it cannot be counted); a Loop/Scan/SequenceMap body once (one iteration: trip "
        "counts are runtime values), an If both branches (an upper bound); scratch: the largest inner node's"
    ),
)(_control_flow)
