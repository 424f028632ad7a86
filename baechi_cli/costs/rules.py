"""Per-op-type counting rules for the analytic cost model: the registry.

Contract. A rule is a small function keyed by an op type (tf2onnx-handler
style: ``@register("Conv2D", kind=FLOPS)``). It sees one op through an
:class:`OpView` -- op type, decoded attrs, and the shape, dtype and bytes of
each data input and each output -- and returns an :class:`OpCount`: FLOPs
(2 per multiply-add), bytes read, bytes written, temporary bytes and
persistent bytes. Rules count; they know nothing about devices (turning counts
into time is :mod:`baechi_cli.costs.analytic`'s job, as in XLA's
HloCostAnalysis). A rule that lacks the shapes or attrs it needs raises
:class:`CannotCount`; the caller then uses :func:`bytes_only` and reports the
op (it does the same for IndexError, TypeError, ValueError and
ZeroDivisionError, so malformed attrs in an input graph never crash costing).

Every registered rule has a *kind*, which the coverage report and the device
model both read:

* ``flops``    -- FLOPs counted from shapes (convolutions, matmuls, einsum,
  pooling, reductions, elementwise math); bytes as in ``bytes``.
* ``bytes``    -- memory-bound: no FLOPs, only the bytes the op moves.
* ``zero``     -- bookkeeping that launches no kernel (NoOp, Const,
  Placeholder, Identity, Reshape, ReadVariableOp, control-flow plumbing);
  such an op costs ``OpCount()`` by definition, so the counting loop may
  skip calling its rule.
* ``variable`` -- holds a variable (or optimizer slot): persistent bytes only.

Op types with no rule are *uncovered*; they get :func:`bytes_only`.

Shapes are tuples of ints; ``None`` (unknown rank) or a negative dimension
(unknown size) makes a shape unknown. Every rule is O(rank + inputs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

Shape = tuple[int, ...]

FLOPS = "flops"
BYTES = "bytes"
ZERO = "zero"
VARIABLE = "variable"
UNCOVERED = "uncovered"
KINDS = (FLOPS, BYTES, ZERO, VARIABLE)
# Kinds whose ops run no kernel: the device model charges them nothing.
NO_KERNEL_KINDS = frozenset({ZERO, VARIABLE})


# OpCount and OpView are NamedTuples, not frozen dataclasses: one of each is
# built per op, and a frozen dataclass's __init__ is several times slower.
class OpCount(NamedTuple):
    """What one op costs, device-independently. Memory in bytes."""

    flops: float = 0.0
    bytes_read: int = 0
    bytes_written: int = 0
    temporary_bytes: int = 0
    persistent_bytes: int = 0


class OpView(NamedTuple):
    """One op as a rule sees it: data inputs only (no control inputs), in NodeDef order."""

    op_type: str
    attrs: Mapping[str, Any]
    input_shapes: Sequence[Shape | None]
    input_dtypes: Sequence[str]
    input_bytes: Sequence[int]
    output_shapes: Sequence[Shape | None]
    output_dtypes: Sequence[str]
    output_bytes: Sequence[int]


class CannotCount(Exception):
    """A rule lacks a shape or attr it needs; the op falls back to :func:`bytes_only`."""


Rule = Callable[[OpView], OpCount]


@dataclass(frozen=True, slots=True)
class RuleEntry:
    op_type: str
    kind: str
    fn: Rule
    note: str  # one line for the coverage table


RULES: dict[str, RuleEntry] = {}


def register(*op_types: str, kind: str, note: str | None = None) -> Callable[[Rule], Rule]:
    """Decorator: register ``fn`` as the rule for ``op_types``.

    ``note`` (default: the first line of ``fn``'s docstring) documents the rule
    in :func:`rule_table`. Registering an op type twice is an error, so two
    modules cannot silently fight over one op type.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown rule kind {kind!r}")

    def deco(fn: Rule) -> Rule:
        text = note if note is not None else (fn.__doc__ or "").strip().split("\n")[0]
        for t in op_types:
            if t in RULES:
                raise ValueError(f"op type {t!r} already has a rule")
            RULES[t] = RuleEntry(t, kind, fn, text)
        return fn

    return deco


def rule_table() -> list[tuple[str, str, str]]:
    """``(op type, kind, note)`` for every registered rule, by kind then op type."""
    order = {k: i for i, k in enumerate(KINDS)}
    rows = sorted(RULES.values(), key=lambda r: (order[r.kind], r.op_type))
    return [(r.op_type, r.kind, r.note) for r in rows]


def rules_markdown() -> str:
    """The rule table as Markdown, one row per (kind, rule); COVERAGE.md embeds it verbatim."""
    groups: dict[tuple[str, str], list[str]] = {}
    for op_type, kind, note in rule_table():
        groups.setdefault((kind, note), []).append(op_type)
    lines = ["| rule | what is counted | op types |", "|---|---|---|"]
    lines += [f"| {kind} | {note} | {', '.join(types)} |" for (kind, note), types in groups.items()]
    return "\n".join(lines) + "\n"


# --- helpers ----------------------------------------------------------------------

_ITEMSIZE = {
    "bfloat16": 2,
    "half": 2,
    "qint8": 1,
    "quint8": 1,
    "qint16": 2,
    "quint16": 2,
    "qint32": 4,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int4": 1,
    "uint4": 1,
    # Handles and opaque values: their storage is not the tensor's to count.
    "resource": 0,
    "variant": 0,
    "string": 0,
}


def dtype_size(dtype: str) -> int:
    """Bytes per element of a numpy-style dtype name (``float32_ref`` as ``float32``); 0 if unknown."""
    name = dtype.removesuffix("_ref")
    size = _ITEMSIZE.get(name)
    if size is None:
        try:
            size = np.dtype(name).itemsize
        except TypeError:
            size = 0
        _ITEMSIZE[name] = size
    return size


def is_handle(dtype: str) -> bool:
    """A resource handle: its bytes are not the variable's, so reading it moves nothing."""
    return dtype == "resource"


def is_state(dtype: str) -> bool:
    """A variable passed by handle or by reference (an update writes it in place)."""
    return dtype == "resource" or dtype.endswith("_ref")


def known(shape: Shape | None) -> bool:
    return shape is not None and (not shape or min(shape) >= 0)


def _shape(shapes: Sequence[Shape | None], i: int, what: str) -> Shape:
    """Shape ``i`` of ``shapes``, fully known, or :class:`CannotCount`."""
    s = shapes[i] if i < len(shapes) else None
    if not known(s):
        raise CannotCount(f"{what} shape unknown")
    return s  # type: ignore[return-value]


def _numel(shape: Shape) -> int:
    return math.prod(shape)


def data_bytes_read(view: OpView) -> int:
    """Bytes of the data inputs, resource handles excluded."""
    if "resource" not in view.input_dtypes:
        return sum(view.input_bytes)
    return sum(b for b, dt in zip(view.input_bytes, view.input_dtypes, strict=True) if not is_handle(dt))


def bytes_only(view: OpView) -> OpCount:
    """memory-bound: reads its data inputs (handles excluded), writes its outputs"""
    return OpCount(0.0, data_bytes_read(view), sum(view.output_bytes))


def _with_flops(view: OpView, flops: float) -> OpCount:
    return OpCount(float(flops), data_bytes_read(view), sum(view.output_bytes))


def _out_or_in_numel(view: OpView) -> int:
    """Elements of output 0, else of input 0 (elementwise ops keep the shape)."""
    if view.output_shapes and known(view.output_shapes[0]):
        return _numel(view.output_shapes[0])  # type: ignore[arg-type]
    return _numel(_shape(view.input_shapes, 0, "input 0"))


# --- zero-compute bookkeeping -----------------------------------------------------


@register(
    *(
        # graph inputs, constants, no-ops
        "NoOp Const HostConst Placeholder PlaceholderV2 PlaceholderWithDefault _Arg _Retval "
        "ControlTrigger "
        # views and aliases: the output shares the input's buffer
        "Identity IdentityN Reshape Squeeze ExpandDims StopGradient PreventGradient EnsureShape "
        "Bitcast "
        # shape arithmetic on the host
        "Shape ShapeN Size Rank BroadcastGradientArgs "
        # resource variables: reads alias the variable's buffer
        "ReadVariableOp VarIsInitializedOp IsVariableInitialized "
        # TF1 control-flow plumbing forwards tensors without touching them
        "Enter Exit NextIteration Merge Switch LoopCond RefEnter RefExit RefNextIteration RefMerge "
        "RefSwitch"
    ).split(),
    kind=ZERO,
)
def _no_kernel(view: OpView) -> OpCount:
    """no kernel: no FLOPs, no bytes moved"""
    return OpCount()


# --- variables --------------------------------------------------------------------


@register("VariableV2", "Variable", "VarHandleOp", kind=VARIABLE)
def _variable(view: OpView) -> OpCount:
    """persistent bytes = attr shape x dtype size (else the output's bytes)"""
    shape, dtype = view.attrs.get("shape"), view.attrs.get("dtype")
    if known(shape) and isinstance(dtype, str) and dtype_size(dtype):
        return OpCount(persistent_bytes=_numel(shape) * dtype_size(dtype))
    # A ref variable's output is the variable itself; a handle's output is 0
    # bytes, and analytic.py then sizes it from the ops that read it.
    return OpCount(persistent_bytes=sum(view.output_bytes))


# --- convolutions -----------------------------------------------------------------


def _conv_forward_out_numel(view: OpView) -> int:
    """Output elements of a forward convolution, inferred from input/filter/attrs.

    Used only when the output shape is unknown; this is where data_format,
    strides, dilations and padding matter (TF's output-size formulas).
    """
    x = _shape(view.input_shapes, 0, "input")
    f = _shape(view.input_shapes, 1, "filter")
    rank = len(x)
    fmt = str(view.attrs.get("data_format", "NHWC"))
    channels_first = fmt.startswith("NC")
    spatial = list(range(2, rank)) if channels_first else list(range(1, rank - 1))
    strides = list(view.attrs.get("strides") or [1] * rank)
    dilations = list(view.attrs.get("dilations") or [1] * rank)
    padding = str(view.attrs.get("padding", "VALID"))
    explicit = list(view.attrs.get("explicit_paddings") or [])
    if len(strides) != rank or len(dilations) != rank or len(f) != rank:
        raise CannotCount("conv attrs do not match the input rank")
    n = x[0]
    for k, dim in enumerate(spatial):
        size, s, d, kernel = x[dim], strides[dim], dilations[dim], f[k]
        eff = (kernel - 1) * d + 1
        if padding == "SAME":
            out = -(-size // s)
        elif padding == "EXPLICIT":
            if len(explicit) != 2 * rank:
                raise CannotCount("explicit_paddings missing")
            out = (size + explicit[2 * dim] + explicit[2 * dim + 1] - eff) // s + 1
        else:
            out = (size - eff) // s + 1
        n *= max(out, 0)
    depthwise = view.op_type.startswith("Depthwise")
    return n * (f[-2] * f[-1] if depthwise else f[-1])


def _conv_flops(fwd_out_numel: int, filt: Shape, depthwise: bool) -> int:
    # Each forward output element is a dot product over the kernel window and
    # the input channels of its group: filter = [*spatial, in/groups, out].
    # A depthwise filter [*spatial, in, multiplier] has no channel sum.
    if len(filt) < 3:
        raise CannotCount("filter rank < 3")
    window = _numel(filt[:-2]) * (1 if depthwise else filt[-2])
    return 2 * fwd_out_numel * window


@register("Conv2D", "Conv3D", "DepthwiseConv2dNative", kind=FLOPS)
def _conv(view: OpView) -> OpCount:
    """2 * out elements * Kh*Kw(*Kd) * Cin/groups (depthwise: no Cin sum)"""
    filt = _shape(view.input_shapes, 1, "filter")
    out = view.output_shapes[0] if view.output_shapes else None
    out_numel = _numel(out) if known(out) else _conv_forward_out_numel(view)  # type: ignore[arg-type]
    return _with_flops(view, _conv_flops(out_numel, filt, view.op_type.startswith("Depthwise")))


@register(
    *"Conv2DBackpropInput Conv2DBackpropInputV2 Conv3DBackpropInput Conv3DBackpropInputV2 "
    "DepthwiseConv2dNativeBackpropInput".split(),
    kind=FLOPS,
)
def _conv_backprop_input(view: OpView) -> OpCount:
    """input gradient = forward FLOPs (filter = input 1, out_backprop = input 2)"""
    filt = _shape(view.input_shapes, 1, "filter")
    dy = _shape(view.input_shapes, 2, "out_backprop")
    return _with_flops(view, _conv_flops(_numel(dy), filt, view.op_type.startswith("Depthwise")))


@register(
    *"Conv2DBackpropFilter Conv2DBackpropFilterV2 Conv3DBackpropFilter Conv3DBackpropFilterV2 "
    "DepthwiseConv2dNativeBackpropFilter".split(),
    kind=FLOPS,
)
def _conv_backprop_filter(view: OpView) -> OpCount:
    """filter gradient = forward FLOPs (filter shape = the output, out_backprop = input 2)"""
    # The output is the filter gradient, so its shape is the filter's (and
    # equals the filter_sizes Const input of the V1 ops).
    dy = _shape(view.input_shapes, 2, "out_backprop")
    filt = view.output_shapes[0] if view.output_shapes else None
    if not known(filt):
        # Input 1 is the filter itself only in the V2 ops; in V1 it is the
        # filter_sizes vector, whose value the view does not carry.
        filt = _shape(view.input_shapes, 1, "filter")
        if len(filt) != len(dy):  # type: ignore[arg-type]
            raise CannotCount("filter shape unknown")
    return _with_flops(view, _conv_flops(_numel(dy), filt, view.op_type.startswith("Depthwise")))  # type: ignore[arg-type]


# --- matrix products --------------------------------------------------------------


@register("MatMul", "SparseMatMul", kind=FLOPS)
def _matmul(view: OpView) -> OpCount:
    """2 * M * N * K, K from input a (transpose_a aware); gradients are MatMuls too"""
    a = _shape(view.input_shapes, 0, "a")
    if len(a) != 2:
        raise CannotCount("a is not a matrix")
    ta, tb = bool(view.attrs.get("transpose_a")), bool(view.attrs.get("transpose_b"))
    k = a[0] if ta else a[1]
    out = view.output_shapes[0] if view.output_shapes else None
    if known(out):
        mn = _numel(out)  # type: ignore[arg-type]
    else:
        b = _shape(view.input_shapes, 1, "b")
        if len(b) != 2:
            raise CannotCount("b is not a matrix")
        mn = (a[1] if ta else a[0]) * (b[0] if tb else b[1])
    return _with_flops(view, 2 * mn * k)


def _broadcast(a: Shape, b: Shape) -> Shape:
    """NumPy broadcasting of two (batch) shapes."""
    rank = max(len(a), len(b))
    a = (1,) * (rank - len(a)) + a
    b = (1,) * (rank - len(b)) + b
    return tuple(max(x, y) if 1 in (x, y) else x for x, y in zip(a, b, strict=True))


@register("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", kind=FLOPS)
def _batch_matmul(view: OpView) -> OpCount:
    """2 * batch * M * N * K with broadcast batch dims (adj_x/adj_y aware)"""
    x = _shape(view.input_shapes, 0, "x")
    adj_x, adj_y = bool(view.attrs.get("adj_x")), bool(view.attrs.get("adj_y"))
    if len(x) < 2:
        raise CannotCount("x has rank < 2")
    k = x[-2] if adj_x else x[-1]
    out = view.output_shapes[0] if view.output_shapes else None
    if known(out):
        out_numel = _numel(out)  # type: ignore[arg-type]
    else:
        y = _shape(view.input_shapes, 1, "y")
        m = x[-1] if adj_x else x[-2]
        n = y[-2] if adj_y else y[-1]
        out_numel = _numel(_broadcast(x[:-2], y[:-2])) * m * n
    return _with_flops(view, 2 * out_numel * k)


@register("Einsum", kind=FLOPS)
def _einsum(view: OpView) -> OpCount:
    """2 * product of all index sizes when an index is summed (1 operand: reductions only)"""
    eq = str(view.attrs.get("equation", "")).replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    if not arrow:
        raise CannotCount("einsum equation without '->'")
    terms = lhs.split(",")
    sizes: dict[str, int] = {}
    ellipsis: Shape = ()
    for i, term in enumerate(terms):
        shape = _shape(view.input_shapes, i, f"operand {i}")
        head, dots, tail = term.partition("...")
        n_ell = len(shape) - len(head) - len(tail)
        if n_ell < 0 or (n_ell and not dots):
            raise CannotCount("einsum equation does not match operand rank")
        for letter, dim in zip(head + "." * n_ell + tail, shape, strict=True):
            if letter != ".":
                sizes[letter] = max(sizes.get(letter, 1), dim)
        if dots:
            ellipsis = _broadcast(ellipsis, tuple(shape[len(head) : len(head) + n_ell]))
    products = _numel(tuple(sizes.values())) * _numel(ellipsis)
    summed = bool(set(sizes) - set(rhs)) or (bool(ellipsis) and "..." not in rhs)
    if len(terms) == 1:
        flops = products if summed else 0  # a transpose, or a reduction's adds
    else:
        flops = 2 * products if summed else products
    return _with_flops(view, flops)


# --- elementwise math, reductions, pooling (TF profiler conventions) -------------

# FLOPs per element, counted on the output (on input 0 when the output shape
# is unknown). "tf" = the number tf.compat.v1.profiler uses; "ours" = ops the
# profiler does not count, at one FLOP per element (two for the few that are
# visibly two operations).
_ELEMENTWISE: dict[str, tuple[int, str]] = {
    **dict.fromkeys(
        "Add AddV2 Sub Mul RealDiv Maximum Minimum Pow GreaterEqual Greater LessEqual Less Equal "
        "NotEqual Reciprocal Square Log Neg BiasAdd".split(),
        (1, "tf"),
    ),
    "Rsqrt": (2, "tf"),
    "RsqrtGrad": (4, "tf"),
    "SquaredDifference": (2, "tf"),
    "Softmax": (5, "tf"),
    **dict.fromkeys(
        "Relu Relu6 LeakyRelu Elu Selu Sigmoid Tanh Exp Expm1 Log1p Sqrt Abs Sign Floor Ceil Round "
        "Erf Softplus Softsign Sin Cos Div DivNoNan FloorDiv FloorMod TruncateDiv MulNoNan Xdivy "
        "Xlogy LogicalAnd LogicalOr LogicalNot Select SelectV2 ReluGrad Relu6Grad LeakyReluGrad "
        "EluGrad SeluGrad SigmoidGrad TanhGrad SqrtGrad ReciprocalGrad SoftplusGrad".split(),
        (1, "ours"),
    ),
    "LogSoftmax": (5, "ours"),
}


def _elementwise(view: OpView) -> OpCount:
    return _with_flops(view, _ELEMENTWISE[view.op_type][0] * _out_or_in_numel(view))


for _t, (_k, _src) in _ELEMENTWISE.items():
    register(_t, kind=FLOPS, note=f"{_k} FLOP{'s' if _k > 1 else ''}/element ({_src})")(_elementwise)


@register("AddN", kind=FLOPS, note="(inputs - 1) FLOPs/element (tf)")
def _add_n(view: OpView) -> OpCount:
    return _with_flops(view, max(len(view.input_shapes) - 1, 0) * _out_or_in_numel(view))


@register("L2Loss", kind=FLOPS, note="3 * input elements - 1 (tf)")
def _l2_loss(view: OpView) -> OpCount:
    return _with_flops(view, 3 * _numel(_shape(view.input_shapes, 0, "input")) - 1)


# (reduce FLOPs per input element, finalize FLOPs per output element, source)
_REDUCTIONS: dict[str, tuple[int, int, str]] = {
    "Sum": (1, 0, "tf"),
    "Mean": (1, 1, "tf"),
    "ArgMax": (1, 0, "tf"),
    "ArgMin": (1, 0, "tf"),
    "BiasAddGrad": (1, 0, "tf"),
    "Max": (1, 0, "ours"),
    "Min": (1, 0, "ours"),
    "Prod": (1, 0, "ours"),
    "All": (1, 0, "ours"),
    "Any": (1, 0, "ours"),
}


def _reduction(view: OpView) -> OpCount:
    reduce, finalize, _ = _REDUCTIONS[view.op_type]
    n_in = _numel(_shape(view.input_shapes, 0, "input"))
    n_out = _numel(_shape(view.output_shapes, 0, "output"))
    return _with_flops(view, n_in * reduce + n_out * (finalize - reduce))


for _t, (_r, _f, _src) in _REDUCTIONS.items():
    _tail = " - output elements" if _f - _r < 0 else ""
    register(_t, kind=FLOPS, note=f"input elements{_tail} ({_src})")(_reduction)


def _ksize_area(view: OpView) -> int:
    ksize = view.attrs.get("ksize")
    if not ksize or any(k < 1 for k in ksize):
        raise CannotCount("ksize attr missing")
    return _numel(tuple(ksize))


@register("MaxPool", "AvgPool", "MaxPool3D", "AvgPool3D", kind=FLOPS)
def _pool(view: OpView) -> OpCount:
    """window area * output elements (tf)"""
    return _with_flops(view, _ksize_area(view) * _numel(_shape(view.output_shapes, 0, "output")))


@register("AvgPoolGrad", "AvgPool3DGrad", kind=FLOPS)
def _avg_pool_grad(view: OpView) -> OpCount:
    """2 * window area * out_backprop elements (tf)"""
    return _with_flops(view, 2 * _ksize_area(view) * _numel(_shape(view.input_shapes, 1, "grad")))


@register("MaxPoolGrad", "MaxPool3DGrad", kind=FLOPS)
def _max_pool_grad(view: OpView) -> OpCount:
    """(window area + 1) * forward output elements (tf)"""
    return _with_flops(view, (_ksize_area(view) + 1) * _numel(_shape(view.input_shapes, 1, "orig_output")))


@register("AssignAdd", "AssignSub", "AssignAddVariableOp", "AssignSubVariableOp", kind=FLOPS)
def _assign_update(view: OpView) -> OpCount:
    """1 FLOP/element; reads and writes the variable (tf for AssignAdd/AssignSub)"""
    value = _shape(view.input_shapes, 1, "value")
    return _stateful(view, reads_state=True, flops=_numel(value))


# --- memory-bound ops -------------------------------------------------------------


def _stateful(view: OpView, *, reads_state: bool, flops: float = 0.0) -> OpCount:
    """Bytes of an in-place update: each state input moves as many bytes as the update."""
    # The update's size is that of its largest plain input (the gradient or
    # the assigned value; learning rates and betas are scalars). Resource
    # handles carry no bytes and a ref input carries the whole variable even
    # when a sparse update touches a few rows, so neither is used here.
    plain = [b for b, dt in zip(view.input_bytes, view.input_dtypes, strict=True) if not is_state(dt)]
    n_state = sum(1 for dt in view.input_dtypes if is_state(dt))
    size = max(plain, default=0)
    read = sum(plain) + (n_state * size if reads_state else 0)
    return OpCount(float(flops), read, n_state * size)


# Every optimizer update op TensorFlow 2.21 registers (tf.raw_ops), dense and sparse.
_APPLY_OPS = [
    f"{prefix}{name}"
    for prefix, names in (
        (
            "Apply",
            "AdaMax Adadelta Adagrad AdagradDA AdagradV2 Adam AddSign CenteredRMSProp Ftrl FtrlV2 "
            "GradientDescent Momentum PowerSign ProximalAdagrad ProximalGradientDescent RMSProp",
        ),
        (
            "ResourceApply",
            "AdaMax Adadelta Adagrad AdagradDA AdagradV2 Adam AdamWithAmsgrad AddSign CenteredRMSProp "
            "Ftrl FtrlV2 GradientDescent KerasMomentum Momentum PowerSign ProximalAdagrad "
            "ProximalGradientDescent RMSProp",
        ),
        (
            "SparseApply",
            "Adadelta Adagrad AdagradDA AdagradV2 CenteredRMSProp Ftrl FtrlV2 Momentum ProximalAdagrad "
            "ProximalGradientDescent RMSProp",
        ),
        (
            "ResourceSparseApply",
            "Adadelta Adagrad AdagradDA AdagradV2 CenteredRMSProp Ftrl FtrlV2 KerasMomentum Momentum "
            "ProximalAdagrad ProximalGradientDescent RMSProp",
        ),
    )
    for name in names.split()
]


@register(*_APPLY_OPS, kind=BYTES)
def _apply(view: OpView) -> OpCount:
    """optimizer update: reads inputs, reads+writes var and slots at the gradient's size"""
    return _stateful(view, reads_state=True)


@register("Assign", "AssignVariableOp", kind=BYTES)
def _assign(view: OpView) -> OpCount:
    """reads the value, writes the variable"""
    return _stateful(view, reads_state=False)


@register("Gather", "GatherV2", "GatherNd", "ResourceGather", "ResourceGatherNd", kind=BYTES)
def _gather(view: OpView) -> OpCount:
    """reads indices + the gathered rows (not the whole table), writes the output"""
    rest = sum(
        b for b, dt in zip(view.input_bytes[1:], view.input_dtypes[1:], strict=True) if not is_handle(dt)
    )
    out = sum(view.output_bytes)
    return OpCount(0.0, rest + out, out)


register(
    *(
        # data movement
        "Transpose ConjugateTranspose ConcatV2 Concat Pack Unpack Split SplitV Slice StridedSlice "
        "StridedSliceGrad Pad PadV2 MirrorPad Tile BroadcastTo ReverseV2 DynamicStitch "
        "ParallelDynamicStitch ScatterNd TensorScatterUpdate UnsortedSegmentSum OneHot Cast Snapshot "
        "CheckNumerics Fill ZerosLike OnesLike Range "
        # random number generation
        "RandomUniform RandomStandardNormal TruncatedNormal StatelessRandomUniformV2 "
        "StatelessRandomNormalV2 StatelessTruncatedNormalV2 "
        # normalisation and losses: memory-bound; their FLOPs are a later rule
        "FusedBatchNorm FusedBatchNormV2 FusedBatchNormV3 FusedBatchNormGrad FusedBatchNormGradV2 "
        "FusedBatchNormGradV3 LRN LRNGrad SoftmaxCrossEntropyWithLogits "
        "SparseSoftmaxCrossEntropyWithLogits"
    ).split(),
    kind=BYTES,
)(bytes_only)
