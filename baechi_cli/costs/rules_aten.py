"""The aten op rules of the analytic cost model (op set ``aten``): PyTorch's own ops, as
``torch.export`` and AOTAutograd's joint graphs spell them.

Contract. Importing this module registers a rule per aten op it covers into
:data:`~baechi_cli.costs.registry.ATEN_RULES` (the registry loads it on the first
:func:`~baechi_cli.costs.registry.rule_for` ``(op_type, "aten")``). Rules count as the
TensorFlow and ONNX ones do: FLOPs (2 per multiply-add), bytes read (the tensor
arguments') and written (the outputs'); an op its rule cannot count, or one without a rule
(``uncovered``), costs the bytes it moves and is named in the report. What a reader gives
each op (details: :func:`aten_view`): op type ``aten.<overload packet>`` (``aten.add``
for ``add.Tensor``; the in-place ``aten.add_`` counted alike); ``attrs["_input_shapes"]``
/ ``["_input_dtypes"]``, the tensor arguments in schema order (a ``Tensor[]``'s in list
order; an absent optional tensor or a number in a ``Tensor`` slot ``None``/``""`` or left
out: both count the same); ``attrs["_args"]``, the other arguments by schema name (those
a count reads: :data:`ARGS_READ`); one output entry per returned tensor.

FLOPs. Matrix products, convolutions and scaled-dot-product attention, forward and
backward, use ``torch.utils.flop_counter``'s formulas and equal ``FlopCounterMode``'s
count of the same op (attention: its two or five products; no bias FLOPs). Composites that
stay whole in ``torch.export``'s graph (``aten.linear``, ``aten.matmul``, ``aten.einsum``,
``aten.conv2d``, ``aten.scaled_dot_product_attention``) count what the counter counts for
their decomposition; the CPU attention kernels it has no formula for, and ``mv``/``dot``,
use the same formulas. One deliberate difference: a grouped convolution's weight gradient
counts the forward's FLOPs (the counter counts it ``groups`` times). Matrix products are
of compute class ``gemm``, convolutions ``conv``, grouped ones (``_args["groups"]`` > 1)
``depthwise``, as ONNX's ``Conv``. Elementwise, activation, reduction, normalization,
softmax, pooling and loss ops are memory-bound, at elements x a small constant: the
TensorFlow rule's ("tf"), ONNX's function body's, or one per operation of the definition.

Views. :data:`VIEW_OPS` (which a reader marks as views too) alias their first tensor
argument: no kernel, no bytes, no time. ``aten.reshape``/``flatten``/``unflatten`` are
among them; one that copies should reach the cost model as ``aten.clone`` or
``aten._reshape_copy``. Copies (``clone``, ``_to_copy``, ``cat``, the functionalized
``*_copy`` views) move their bytes; gathers (``embedding``, ``index``) read the indices
and the gathered elements, not the table.

Every rule is O(rank + tensor arguments).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

# aten.einsum is counted by TensorFlow's Einsum rule: importing rules_tf registers it into RULES.
import baechi_cli.costs.rules_tf  # noqa: F401
from baechi_cli.core.devices import CONV, GEMM
from baechi_cli.costs.registry import (
    ATEN,
    BYTES,
    FLOPS,
    RULES,
    ZERO,
    CannotCount,
    OpCount,
    OpView,
    Shape,
    bytes_only,
    dtype_size,
    known,
    known_shape,
    no_kernel,
    numel,
    out_or_in_numel,
    per_element,
    register,
    with_flops,
)

__all__ = ["ARGS_READ", "VIEW_OPS", "aten_view"]


def aten_view(
    op_type: str,
    attrs: Mapping[str, Any],
    output_shapes: Sequence[Shape | None],
    output_dtypes: Sequence[str],
    output_bytes: Sequence[int],
) -> OpView:
    """The view of one op of an aten graph, in the reader's convention:

    * ``op_type``: the overload packet, ``aten.<name>``: ``aten.add`` for ``aten.add.Tensor``
      and ``aten.add.Scalar`` (a rule tells overloads apart, where it must, by ``_args``);
      the in-place ``aten.add_`` is its own type, counted as ``aten.add``.
    * ``attrs["_input_shapes"]`` / ``attrs["_input_dtypes"]``: the tensor arguments in schema
      order (keyword-only ones included), a ``Tensor[]`` argument's tensors in list order: a
      shape tuple and a numpy-style dtype name (``float32``, ``bfloat16``, ``int64``, ``bool``).
      An absent optional tensor (``bias=None``) or a number where the schema has a ``Tensor``
      (``aten.add.Tensor(x, 1)``) is ``None`` and ``""``, or is left out: rules read by
      position only the leading tensor arguments every call has (a convolution's ``input``,
      ``weight``; attention's ``query``, ``key``, ``value``) and count optional ones (a
      layer norm's ``weight``, ``bias``) by how many are given.
    * ``attrs["_args"]``: the other arguments by schema name (``stride``, ``groups``,
      ``transposed``, ``output_mask``, ``dim``, ``approximate``, ``training``, ...) as plain
      values; one left out takes its schema default. :data:`ARGS_READ` lists those a count reads.
    * outputs: one entry per returned tensor (a ``Tensor[]`` return flattened); ``None`` /
      ``""`` / 0 for one not returned (``convolution_backward`` with ``output_mask`` False).

    An argument's bytes are its elements x its dtype's size; 0 for ``None`` or an unknown
    shape. An op without those attrs has no inputs.

    >>> v = aten_view("aten.addmm", {"_input_shapes": [(3,), (2, 4), (4, 3)],
    ...                              "_input_dtypes": ["float32", "bfloat16", "bfloat16"]},
    ...               [(2, 3)], ["float32"], [24])
    >>> v.input_bytes
    [12, 16, 24]
    """
    shapes = list(attrs.get("_input_shapes") or ())
    dtypes = [str(d or "") for d in attrs.get("_input_dtypes") or ()]
    dtypes += [""] * (len(shapes) - len(dtypes))
    nbytes = [numel(s) * dtype_size(dt) if known(s) and dt else 0 for s, dt in zip(shapes, dtypes)]  # type: ignore[arg-type]
    return OpView(
        op_type, attrs, shapes, dtypes[: len(shapes)], nbytes, output_shapes, output_dtypes, output_bytes
    )


# --- helpers ---------------------------------------------------------------------------


def _arg(view: OpView, name: str, default: Any = None) -> Any:
    """Non-tensor argument ``name`` (``attrs["_args"]``), ``default`` when not given."""
    args = view.attrs.get("_args") or {}
    return args.get(name, default) if isinstance(args, Mapping) else default


def _given(view: OpView, start: int) -> int:
    """How many tensor arguments from position ``start`` on are given (not None)."""
    return sum(s is not None for s in view.input_shapes[start:])


def _output_or_none(view: OpView, i: int) -> Shape | None:
    s = view.output_shapes[i] if i < len(view.output_shapes) else None
    return s if known(s) else None


def _mask(view: OpView, name: str, n: int) -> list[bool]:
    """A backward op's ``output_mask``-like argument; absent: which of its ``n`` outputs are returned."""
    mask = _arg(view, name)
    if isinstance(mask, (list, tuple)) and len(mask) >= n:
        return [bool(m) for m in mask[:n]]
    return [i < len(view.output_shapes) and view.output_shapes[i] is not None for i in range(n)]


def _ints(value: Any, rank: int, default: int) -> tuple[int, ...]:
    """An int or int list argument, one per spatial dimension (``[2]`` for ``[2, 2]``)."""
    if value is None:
        return (default,) * rank
    if isinstance(value, int):
        return (value,) * rank
    values = tuple(int(v) for v in value)
    if len(values) == 1:
        return values * rank
    if len(values) != rank:
        raise CannotCount("an argument does not match the spatial rank")
    return values


def _names(words: str) -> Iterator[str]:
    """``aten.<w>`` for each of the space-separated ``words``, and ``aten.<w>_`` where aten
    has that in-place variant (:data:`_IN_PLACE`), counted the same."""
    for w in words.split():
        yield f"aten.{w}"
        if w in _IN_PLACE:
            yield f"aten.{w}_"


# The ops of _names' words that have an in-place variant ``<name>_`` in aten.
_IN_PLACE = frozenset(
    (
        "add sub mul div true_divide floor_divide remainder fmod pow float_power eq ne lt le gt ge neg "
        "reciprocal relu relu6 abs sign sgn floor ceil round trunc frac exp exp2 expm1 log log2 log10 log1p "
        "sqrt rsqrt sigmoid tanh sin cos tan asin acos atan atan2 sinh cosh asinh acosh atanh erf erfc "
        "erfinv lgamma digamma logical_and logical_or logical_not logical_xor bitwise_and bitwise_or "
        "bitwise_xor bitwise_not bitwise_left_shift bitwise_right_shift masked_fill clamp clamp_min "
        "clamp_max clip threshold leaky_relu elu selu celu square lerp addcmul addcdiv xlogy copysign hypot "
        "heaviside nan_to_num logit hardtanh hardsigmoid hardswish mish silu gelu dropout fill zero cumsum "
        "cumprod index_put scatter scatter_add scatter_reduce index_add index_copy index_fill masked_scatter "
        "copy bernoulli uniform normal random exponential tril triu _foreach_add _foreach_sub _foreach_mul "
        "_foreach_div _foreach_addcmul _foreach_addcdiv _foreach_sqrt _foreach_lerp _foreach_neg "
        "_foreach_maximum _foreach_minimum _foreach_copy _foreach_pow _foreach_exp _foreach_reciprocal "
        "_foreach_sign _foreach_abs _foreach_clamp_max _foreach_clamp_min _foreach_zero _foreach_rsqrt "
        "squeeze unsqueeze t transpose as_strided detach"
    ).split()
)

#: The non-tensor arguments (``attrs["_args"]``) each rule's count reads, by op (the
#: others' counts depend on shapes alone). A reader must carry at least these.
ARGS_READ: dict[str, tuple[str, ...]] = {}


def _reads(*names: str, args: tuple[str, ...]) -> None:
    for name in names:
        ARGS_READ[name] = args


# --- views and bookkeeping: no kernel --------------------------------------------------

#: Ops whose outputs alias their first tensor argument (their storage): no kernel, no bytes.
VIEW_OPS: frozenset[str] = frozenset(
    _names(
        "view _unsafe_view reshape view_as reshape_as _reshape_alias permute t transpose swapaxes swapdims "
        "movedim moveaxis numpy_T mT mH adjoint expand expand_as slice select unsqueeze squeeze alias "
        "detach lift_fresh split split_with_sizes unsafe_split unsafe_split_with_sizes tensor_split chunk "
        "unsafe_chunk unbind hsplit vsplit dsplit as_strided narrow diagonal unfold unflatten flatten "
        "view_as_real view_as_complex real imag _conj _neg_view conj positive"
    )
)

register(*sorted(VIEW_OPS), kind=ZERO, op_set=ATEN, note="a view: aliases its input, no kernel")(no_kernel)

# The reader's own ops: a user input (fed by the caller) and, in a traced training step, the
# point where opt.step() starts once backward() has returned.
register("Input", "OptimizerStep", kind=ZERO, op_set=ATEN, note="no kernel: the reader's own op")(no_kernel)

register(
    *_names(
        # allocation without a kernel, symbolic-size arithmetic, assertions, metadata
        "empty empty_like empty_strided empty_permuted new_empty new_empty_strided resize "
        "sym_size sym_numel sym_stride sym_storage_offset sym_constrain_range "
        "sym_constrain_range_for_size _assert_async _assert_scalar _assert_tensor_metadata "
        "_functional_assert_async _functional_sym_constrain_range _functional_sym_constrain_range_for_size "
        "_make_dep_token"
    ),
    kind=ZERO,
    op_set=ATEN,
    note="no kernel: allocation, symbolic sizes, assertions",
)(no_kernel)


# --- matrix products (FlopCounterMode's formulas) -----------------------------------------


def _matrix(view: OpView, i: int, what: str, rank: int) -> Shape:
    shape = known_shape(view.input_shapes, i, what)
    if len(shape) != rank:
        raise CannotCount(f"{what} is not {rank}-D")
    return shape


def _broadcast(a: Shape, b: Shape) -> Shape:
    """NumPy broadcasting of two batch shapes."""
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b
    return tuple(max(x, y) if 1 in (x, y) else x for x, y in zip(a, b, strict=True))


@register("aten.mm", "aten._scaled_mm", "aten._int_mm", kind=FLOPS, op_set=ATEN, compute_class=GEMM)
def _mm(view: OpView) -> OpCount:
    """2 * M * K * N (self [M, K], mat2 [K, N]; FlopCounterMode's)"""
    a, b = _matrix(view, 0, "self", 2), _matrix(view, 1, "mat2", 2)
    return with_flops(view, 2 * a[0] * a[1] * b[1])


@register("aten.addmm", kind=FLOPS, op_set=ATEN, compute_class=GEMM)
def _addmm(view: OpView) -> OpCount:
    """2 * M * K * N (mat1, mat2 = arguments 1, 2; the added self not counted, as FlopCounterMode)"""
    a, b = _matrix(view, 1, "mat1", 2), _matrix(view, 2, "mat2", 2)
    return with_flops(view, 2 * a[0] * a[1] * b[1])


@register("aten.bmm", kind=FLOPS, op_set=ATEN, compute_class=GEMM)
def _bmm(view: OpView) -> OpCount:
    """2 * B * M * K * N (FlopCounterMode's)"""
    a, b = _matrix(view, 0, "self", 3), _matrix(view, 1, "mat2", 3)
    return with_flops(view, 2 * a[0] * a[1] * a[2] * b[2])


@register("aten.baddbmm", "aten.addbmm", kind=FLOPS, op_set=ATEN, compute_class=GEMM)
def _baddbmm(view: OpView) -> OpCount:
    """2 * B * M * K * N (batch1, batch2 = arguments 1, 2; the added self not counted)"""
    a, b = _matrix(view, 1, "batch1", 3), _matrix(view, 2, "batch2", 3)
    return with_flops(view, 2 * a[0] * a[1] * a[2] * b[2])


@register("aten._grouped_mm", "transformers.grouped_mm_fallback", kind=FLOPS, op_set=ATEN, compute_class=GEMM)
def _grouped_mm(view: OpView) -> OpCount:
    """2 * M * K * N of each group's product, summed: rows [S, K] x groups [G, K, N] (a mixture
    of experts' tokens, each through its expert), [G, M, K] x [G, K, N], or a side cut by offsets"""
    a, b = known_shape(view.input_shapes, 0, "self"), known_shape(view.input_shapes, 1, "mat2")
    if (len(a), len(b)) == (2, 2):  # [M, K] x [K, N], K cut into groups
        return with_flops(view, 2 * a[0] * a[1] * b[1])
    if (len(a), len(b)) == (2, 3):  # [S, K] x [G, K, N], the rows cut into groups
        return with_flops(view, 2 * a[0] * a[1] * b[2])
    if (len(a), len(b)) == (3, 2):  # [G, M, K] x [K, N], the columns cut into groups
        return with_flops(view, 2 * a[1] * a[2] * b[1])
    if (len(a), len(b)) == (3, 3):
        return with_flops(view, 2 * a[0] * a[1] * a[2] * b[2])
    raise CannotCount("self and mat2 are not 2-D or 3-D")


@register("transformers.grouped_mm_fallback_backward", kind=FLOPS, op_set=ATEN, compute_class=GEMM)
def _grouped_mm_backward(view: OpView) -> OpCount:
    """4 * S * K * N: the input's and the weights' gradients of rows [S, K] x groups [G, K, N]"""
    a, b = _matrix(view, 0, "input", 2), _matrix(view, 1, "weight", 3)
    return with_flops(view, 4 * a[0] * a[1] * b[2])


@register("aten.mv", "aten.dot", "aten.vdot", kind=FLOPS, op_set=ATEN, compute_class=GEMM)
def _mv(view: OpView) -> OpCount:
    """2 * self elements (a matrix-vector or dot product)"""
    return with_flops(view, 2 * numel(known_shape(view.input_shapes, 0, "self")))


@register("aten.addmv", kind=FLOPS, op_set=ATEN, compute_class=GEMM)
def _addmv(view: OpView) -> OpCount:
    """2 * mat elements (argument 1; the added self not counted)"""
    return with_flops(view, 2 * numel(known_shape(view.input_shapes, 1, "mat")))


@register("aten.linear", kind=FLOPS, op_set=ATEN, compute_class=GEMM)
def _linear(view: OpView) -> OpCount:
    """2 * input elements * out features (weight [N, K]); the bias not counted (as its addmm)"""
    x = known_shape(view.input_shapes, 0, "input")
    w = known_shape(view.input_shapes, 1, "weight")
    return with_flops(view, 2 * numel(x) * (w[0] if len(w) == 2 else 1))


@register("aten.matmul", kind=FLOPS, op_set=ATEN, compute_class=GEMM)
def _matmul(view: OpView) -> OpCount:
    """2 * output elements * K (NumPy matmul: 1-D operands, broadcast batch dims)"""
    a = known_shape(view.input_shapes, 0, "self")
    b = known_shape(view.input_shapes, 1, "other")
    if not a or not b:
        raise CannotCount("matmul of a 0-D tensor")
    out = _output_or_none(view, 0)
    if out is None:
        rows = a[-2:-1] if len(a) > 1 else ()
        cols = b[-1:] if len(b) > 1 else ()
        out = (*_broadcast(a[:-2], b[:-2]), *rows, *cols)
    return with_flops(view, 2 * numel(out) * a[-1])


@register("aten.einsum", kind=FLOPS, op_set=ATEN, compute_class=GEMM)
def _einsum(view: OpView) -> OpCount:
    """TF rule: 2 * product of all index sizes when an index is summed (equation from _args)"""
    equation = _arg(view, "equation")
    if not isinstance(equation, str):
        raise CannotCount("einsum equation missing")
    return RULES["Einsum"].fn(view._replace(op_type="Einsum", attrs={"equation": equation}))


_reads("aten.einsum", args=("equation",))


# --- convolutions (FlopCounterMode's formula) ----------------------------------------

# Convolutions by how their schema says whether they are transposed: always, never, or
# by the ``transposed`` argument (None).
_TRANSPOSED: dict[str, bool | None] = {
    **dict.fromkeys(("aten.convolution", "aten._convolution", "aten.convolution_overrideable"), None),
    **dict.fromkeys(
        (
            "aten.conv1d aten.conv2d aten.conv3d aten.cudnn_convolution aten.mkldnn_convolution "
            "aten._slow_conv2d_forward aten.slow_conv3d aten.slow_conv_dilated2d aten.slow_conv_dilated3d "
            "aten._conv_depthwise2d aten.miopen_convolution aten.miopen_depthwise_convolution"
        ).split(),
        False,
    ),
    **dict.fromkeys(
        (
            "aten.conv_transpose1d aten.conv_transpose2d aten.conv_transpose3d aten.cudnn_convolution_transpose "
            "aten.slow_conv_transpose2d aten.slow_conv_transpose3d aten.miopen_convolution_transpose"
        ).split(),
        True,
    ),
}


def _transposed(view: OpView) -> bool:
    fixed = _TRANSPOSED.get(view.op_type)
    return bool(_arg(view, "transposed", False)) if fixed is None else fixed


def _conv_flops(x: Shape, w: Shape, out_spatial: Shape, transposed: bool) -> int:
    """FlopCounterMode's conv_flop_count: 2 * batch * every point of the input (transposed)
    or output spatial grid * weight elements ([a, b, *kernel]: a * b * kernel area)."""
    return 2 * x[0] * numel(x[2:] if transposed else out_spatial) * numel(w)


def _conv_out_spatial(view: OpView, x: Shape, w: Shape) -> Shape:
    """The spatial dims of a (non-transposed) convolution's output: output 0's, else from
    ``stride``, ``padding`` ('same'/'valid' too) and ``dilation``."""
    out = _output_or_none(view, 0)
    if out is not None and len(out) == len(x):
        return out[2:]
    rank = len(x) - 2
    stride = _ints(_arg(view, "stride"), rank, 1)
    dilation = _ints(_arg(view, "dilation"), rank, 1)
    padding = _arg(view, "padding")
    if padding == "same":
        return tuple(x[2:])
    pads = _ints(None if padding == "valid" else padding, rank, 0)
    return tuple(
        (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, k, s, p, d in zip(x[2:], w[2:], stride, pads, dilation, strict=True)
    )


def _conv_shapes(view: OpView, x_index: int) -> tuple[Shape, Shape]:
    x = known_shape(view.input_shapes, x_index, "input")
    w = known_shape(view.input_shapes, x_index + 1, "weight")
    if len(x) < 3 or len(w) != len(x):
        raise CannotCount("input and weight are not [N, C, *spatial] and [a, b, *kernel]")
    return x, w


@register(*_TRANSPOSED, kind=FLOPS, op_set=ATEN, compute_class=CONV)
def _convolution(view: OpView) -> OpCount:
    """2 * N * output (transposed: input) spatial size * weight elements (FlopCounterMode's; bias not counted)"""
    x, w = _conv_shapes(view, 0)
    transposed = _transposed(view)
    spatial = () if transposed else _conv_out_spatial(view, x, w)
    return with_flops(view, _conv_flops(x, w, spatial, transposed))


_reads(*_TRANSPOSED, args=("transposed", "groups", "stride", "padding", "dilation"))


@register("aten.convolution_backward", kind=FLOPS, op_set=ATEN, compute_class=CONV)
def _convolution_backward(view: OpView) -> OpCount:
    """the forward's FLOPs for grad_input and for grad_weight, per output_mask (FlopCounterMode's but for groups); scratch: the kernel's workspace the tracer found (attrs["_workspace_bytes"])"""
    # FlopCounterMode counts a grouped convolution's weight gradient `groups` times; grad_bias
    # (a sum over grad_output) is not counted, as there.
    dy = known_shape(view.input_shapes, 0, "grad_output")
    x, w = _conv_shapes(view, 1)
    transposed = bool(_arg(view, "transposed", False))
    forward = _conv_flops(x, w, dy[2:], transposed)
    grad_input, grad_weight, _ = _mask(view, "output_mask", 3)
    count = with_flops(view, forward * (grad_input + grad_weight))
    return count._replace(temporary_bytes=int(view.attrs.get("_workspace_bytes", 0)))


_reads("aten.convolution_backward", args=("transposed", "output_mask", "groups"))


# --- scaled-dot-product attention (FlopCounterMode's formulas) -------------------------


def _qkv(view: OpView, first: int) -> tuple[int, int, int, int, int]:
    """(batch * query heads, queries, keys, query head size, value head size) of
    query/key/value = tensor arguments ``first``, +1, +2 ([..., heads, sequence, head size])."""
    q = known_shape(view.input_shapes, first, "query")
    k = known_shape(view.input_shapes, first + 1, "key")
    v = known_shape(view.input_shapes, first + 2, "value")
    if len(q) < 3 or len(k) != len(q) or len(v) != len(q):
        raise CannotCount("query, key, value are not [batch, heads, sequence, head size]")
    return numel(q[:-2]), q[-2], k[-2], q[-1], v[-1]


_SDPA = (
    "aten.scaled_dot_product_attention aten._scaled_dot_product_attention_math "
    "aten._scaled_dot_product_efficient_attention aten._scaled_dot_product_flash_attention "
    "aten._scaled_dot_product_flash_attention_for_cpu aten._scaled_dot_product_cudnn_attention "
    "aten._scaled_dot_product_fused_attention_overrideable"
).split()


@register(*_SDPA, kind=FLOPS, op_set=ATEN)
def _sdpa(view: OpView) -> OpCount:
    """2 * B*H * Lq * Lk * (Dq + Dv): Q @ K^T and P @ V (FlopCounterMode's; scale, mask, softmax not counted)"""
    bh, lq, lk, dq, dv = _qkv(view, 0)
    return with_flops(view, 2 * bh * lq * lk * (dq + dv))


@register(*(f"{t}_backward" for t in _SDPA[2:]), kind=FLOPS, op_set=ATEN)
def _sdpa_backward(view: OpView) -> OpCount:
    """2 * B*H * Lq * Lk * (3 Dq + 2 Dv): scores again, dP, dV, dQ, dK (FlopCounterMode's)"""
    bh, lq, lk, dq, dv = _qkv(view, 1)
    return with_flops(view, 2 * bh * lq * lk * (3 * dq + 2 * dv))


# --- elementwise ops (memory-bound; FLOPs per output element) --------------------------

# FLOPs per element of output 0, and what they are: "tf" = the TensorFlow rule's constant
# for the same op (so the three op sets agree), else one per operation of the definition.
_ELEMENTWISE: dict[str, tuple[int, str]] = {
    **dict.fromkeys(
        _names(
            "add sub rsub mul div true_divide floor_divide remainder fmod maximum minimum fmax fmin pow "
            "float_power eq ne lt le gt ge neg reciprocal relu abs sign sgn floor ceil round trunc frac "
            "exp exp2 expm1 log log2 log10 log1p sqrt sigmoid tanh sin cos tan asin acos atan atan2 sinh "
            "cosh asinh acosh atanh erf erfc erfinv lgamma digamma logical_and logical_or logical_not "
            "logical_xor bitwise_and bitwise_or bitwise_xor bitwise_not bitwise_left_shift "
            "bitwise_right_shift isnan isinf isfinite isneginf isposinf where masked_fill clamp_min "
            "clamp_max threshold threshold_backward leaky_relu elu selu softplus square xlogy copysign "
            "heaviside signbit"
        ),
        (1, "tf: one operation"),
    ),
    **dict.fromkeys(_names("rsqrt"), (2, "tf")),
    **dict.fromkeys(_names("clamp clip hardtanh relu6 nan_to_num hypot"), (2, "two operations")),
    **dict.fromkeys(_names("silu"), (2, "Sigmoid, Mul (ONNX's SiLU)")),
    **dict.fromkeys(_names("lerp addcmul addcdiv"), (3, "three operations (a + w * (b - a), a + v * b * c)")),
    **dict.fromkeys(_names("celu mish"), (3, "ONNX's body: Div, Elu, Mul / Softplus, Tanh, Mul")),
    **dict.fromkeys(_names("logit log_sigmoid_forward"), (3, "three operations")),
    **dict.fromkeys(_names("hardsigmoid"), (4, "ONNX's body: Mul, Add, Min, Max")),
    **dict.fromkeys(_names("hardswish"), (5, "ONNX's body: HardSigmoid, Mul")),
    **dict.fromkeys(_names("_prelu_kernel prelu"), (3, "ONNX's body: Less, Mul, Where")),
    # backward of activations: the derivative's operations, times the incoming gradient
    **dict.fromkeys(_names("sigmoid_backward tanh_backward"), (3, "g * y * (1 - y), g * (1 - y * y)")),
    **dict.fromkeys(
        _names(
            "hardtanh_backward leaky_relu_backward elu_backward hardsigmoid_backward log_sigmoid_backward"
        ),
        (2, "a compare, a select or multiply"),
    ),
    **dict.fromkeys(_names("softplus_backward hardswish_backward"), (4, "four operations")),
    **dict.fromkeys(_names("silu_backward"), (6, "g * s * (1 + x * (1 - s)), s = sigmoid(x)")),
    **dict.fromkeys(_names("mish_backward"), (9, "tanh(softplus), its derivative, products")),
    # dropout: a compare with a random number and a scaled multiply (random bits not counted)
    **dict.fromkeys(_names("native_dropout dropout"), (2, "compare with a random number, scaled multiply")),
    **dict.fromkeys(_names("native_dropout_backward"), (2, "g * mask * scale")),
    **dict.fromkeys(_names("cumsum cumprod"), (1, "one add or multiply")),
    **dict.fromkeys(_names("logcumsumexp"), (3, "exp, add, log")),
}

_elementwise = per_element(_ELEMENTWISE)
for _t, (_k, _what) in _ELEMENTWISE.items():
    register(_t, kind=FLOPS, op_set=ATEN, note=f"{_k} FLOP{'s' if _k > 1 else ''}/element ({_what})")(
        _elementwise
    )

# GELU: ONNX's Gelu body (5: Div, Erf, Add, Mul, Mul; tanh: 8); its derivative as aten's
# kernel writes it (erf: cdf 4, pdf 4, g * (cdf + x * pdf) 3; tanh: 18).
_GELU = {"none": (5, 11), "tanh": (8, 18)}


def _approximation(view: OpView) -> tuple[int, int]:
    per_element = _GELU.get(str(_arg(view, "approximate", "none")))
    if per_element is None:
        raise CannotCount("unknown GELU approximation")
    return per_element


@register(*_names("gelu"), kind=FLOPS, op_set=ATEN)
def _gelu(view: OpView) -> OpCount:
    """5 FLOPs/element (ONNX's Gelu: Div, Erf, Add, Mul, Mul); approximate=tanh: 8"""
    return with_flops(view, _approximation(view)[0] * out_or_in_numel(view))


@register("aten.gelu_backward", kind=FLOPS, op_set=ATEN)
def _gelu_backward(view: OpView) -> OpCount:
    """11 FLOPs/element (g * (cdf + x * pdf): cdf 4, pdf 4, 3); approximate=tanh: 18"""
    return with_flops(view, _approximation(view)[1] * out_or_in_numel(view))


_reads("aten.gelu", "aten.gelu_", "aten.gelu_backward", args=("approximate",))

# foreach ops (the optimizers' updates): per element of every output tensor.
_FOREACH: dict[str, int] = {
    **dict.fromkeys(
        _names(
            "_foreach_add _foreach_sub _foreach_mul _foreach_div _foreach_sqrt _foreach_neg _foreach_maximum "
            "_foreach_minimum _foreach_pow _foreach_exp _foreach_reciprocal _foreach_sign _foreach_abs "
            "_foreach_clamp_max _foreach_clamp_min"
        ),
        1,
    ),
    **dict.fromkeys(_names("_foreach_rsqrt"), 2),
    **dict.fromkeys(_names("_foreach_addcmul _foreach_addcdiv _foreach_lerp"), 3),
}


@register(*_FOREACH, kind=FLOPS, op_set=ATEN)
def _foreach(view: OpView) -> OpCount:
    """as the elementwise op, per element of every output (in place: its mutated tensors as outputs)"""
    outs = [s for s in view.output_shapes if s is not None]
    if not outs or not all(known(s) for s in outs):
        raise CannotCount("a foreach op's outputs are not known")
    return with_flops(view, _FOREACH[view.op_type] * sum(numel(s) for s in outs))  # type: ignore[arg-type]


# --- reductions -------------------------------------------------------------------------

# (FLOPs per input element, per output element): flops = a * input + b * output. A
# reduction's adds are input - output (TensorFlow's Sum), a mean's division one per output.
_REDUCTIONS: dict[str, tuple[int, int, str]] = {
    **dict.fromkeys(
        _names("sum nansum prod amax amin max min argmax argmin any all count_nonzero"),
        (1, -1, "input - output elements (tf: Sum, Max, ArgMax)"),
    ),
    "aten.mean": (1, 0, "input elements (tf: Mean)"),
    "aten.nanmean": (1, 0, "input elements (tf: Mean)"),
    "aten.aminmax": (2, -2, "2 * (input - output elements): a min and a max"),
    **dict.fromkeys(
        _names("var var_mean"), (4, 0, "4/input element (mean, subtract, square, sum) + a divide per output")
    ),
    **dict.fromkeys(_names("std std_mean"), (4, 1, "as var, + a square root per output")),
    **dict.fromkeys(_names("logsumexp"), (4, 0, "max, subtract, exp, sum per input; log, add per output")),
    **dict.fromkeys(
        _names("linalg_vector_norm norm _foreach_norm"),
        (2, 0, "abs or square, sum per input; a root per output"),
    ),
}


# Reductions with an elementwise overload of two tensors (max.other, min.other).
_BINARY_TOO = frozenset({"aten.max", "aten.min"})


def _reduction(view: OpView) -> OpCount:
    per_input, per_output, _ = _REDUCTIONS[view.op_type]
    if len(view.input_shapes) > 1 and view.input_shapes[1] is not None and view.op_type in _BINARY_TOO:
        return with_flops(view, out_or_in_numel(view))  # max.other, min.other: elementwise
    if view.op_type.startswith("aten._foreach"):  # every tensor of the list, one output each
        n_in = sum(numel(known_shape(view.input_shapes, i, "input")) for i in range(len(view.input_shapes)))
        n_out = len(view.input_shapes)
    else:
        n_in = numel(known_shape(view.input_shapes, 0, "input"))
        n_out = numel(known_shape(view.output_shapes, 0, "output"))
    return with_flops(view, max(per_input * n_in + per_output * n_out, 0))


_by_note: dict[str, list[str]] = {}
for _t, (*_, _what) in _REDUCTIONS.items():
    _by_note.setdefault(_what, []).append(_t)
for _what, _types in _by_note.items():
    register(*_types, kind=FLOPS, op_set=ATEN, note=_what)(_reduction)


# --- normalizations (ONNX's function bodies, TensorFlow's batch norm) --------------------


def _rows(view: OpView, x: Shape, normalized: str) -> int:
    """Rows a layer or RMS norm normalizes: ``x``'s elements over the ``normalized`` argument's."""
    shape = _arg(view, normalized)
    if isinstance(shape, int):
        shape = [shape]
    if not isinstance(shape, (list, tuple)) or not shape:
        raise CannotCount(f"{normalized} missing")
    return numel(x) // max(numel(tuple(int(d) for d in shape)), 1)


@register("aten.native_layer_norm", "aten.layer_norm", kind=FLOPS, op_set=ATEN)
def _layer_norm(view: OpView) -> OpCount:
    """5 FLOPs/element + 1 each for weight and bias given, + 5/row (ONNX's LayerNormalization body)"""
    x = known_shape(view.input_shapes, 0, "input")
    return with_flops(view, (5 + _given(view, 1)) * numel(x) + 5 * _rows(view, x, "normalized_shape"))


@register("aten.rms_norm", "aten._fused_rms_norm", kind=FLOPS, op_set=ATEN)
def _rms_norm(view: OpView) -> OpCount:
    """3 FLOPs/element + 1 with weight, + 2/row (ONNX's RMSNormalization body)"""
    x = known_shape(view.input_shapes, 0, "input")
    return with_flops(view, (3 + _given(view, 1)) * numel(x) + 2 * _rows(view, x, "normalized_shape"))


_reads(
    "aten.native_layer_norm",
    "aten.layer_norm",
    "aten.rms_norm",
    "aten._fused_rms_norm",
    args=("normalized_shape",),
)


@register("aten.native_group_norm", "aten.group_norm", kind=FLOPS, op_set=ATEN)
def _group_norm(view: OpView) -> OpCount:
    """5 FLOPs/element + 1 each for weight and bias given, + 4 per (sample, group) (ONNX's GroupNormalization)"""
    x = known_shape(view.input_shapes, 0, "input")
    groups = _arg(view, "group", _arg(view, "num_groups"))
    if not isinstance(groups, int):
        raise CannotCount("group argument missing")
    return with_flops(view, (5 + _given(view, 1)) * numel(x) + 4 * x[0] * groups)


_reads("aten.native_group_norm", "aten.group_norm", args=("group", "num_groups"))


@register("aten.instance_norm", kind=FLOPS, op_set=ATEN)
def _instance_norm(view: OpView) -> OpCount:
    """7 FLOPs/element + 4 per (sample, channel) (ONNX's InstanceNormalization)"""
    x = known_shape(view.input_shapes, 0, "input")
    return with_flops(view, 7 * numel(x) + 4 * x[0] * (x[1] if len(x) > 1 else 1))


# The layer, group and RMS norms' backward, per element: x_hat = (x - mean) * rstd (2,
# when grad_input or grad_weight is asked for), grad_input = rstd * (g' - mean(g') -
# x_hat * mean(g' * x_hat)) with g' = grad * weight (8), grad_weight = sum(grad * x_hat)
# (2), grad_bias = sum(grad) (1).
def _norm_backward_flops(n: int, grad_input: bool, grad_weight: bool, grad_bias: bool) -> int:
    return n * (2 * (grad_input or grad_weight) + 8 * grad_input + 2 * grad_weight + grad_bias)


@register(
    "aten.native_layer_norm_backward",
    "aten.native_group_norm_backward",
    "aten._fused_rms_norm_backward",
    kind=FLOPS,
    op_set=ATEN,
)
def _norm_backward(view: OpView) -> OpCount:
    """per element: 8 for grad_input, 2 for grad_weight, 1 for grad_bias, + 2 (x_hat) per output_mask"""
    n = numel(known_shape(view.input_shapes, 0, "grad_out"))
    return with_flops(view, _norm_backward_flops(n, *_mask(view, "output_mask", 3)))


_reads("aten.native_layer_norm_backward", "aten.native_group_norm_backward", args=("output_mask",))

_BATCH_NORMS = (
    "aten.native_batch_norm aten._native_batch_norm_legit aten._native_batch_norm_legit_functional "
    "aten.batch_norm aten.cudnn_batch_norm aten.miopen_batch_norm aten._batch_norm_with_update "
    "aten._batch_norm_with_update_functional aten._batch_norm_no_update aten._native_batch_norm_legit_no_training"
).split()


def _batch_norm_training(view: OpView) -> bool:
    if view.op_type in ("aten._native_batch_norm_legit_no_training", "aten._batch_norm_no_update"):
        return False
    if view.op_type.startswith("aten._batch_norm_with_update"):
        return True
    return bool(_arg(view, "training", _arg(view, "train", True)))


@register(*_BATCH_NORMS, kind=FLOPS, op_set=ATEN)
def _batch_norm(view: OpView) -> OpCount:
    """tf: training 6 FLOPs/element, inference 3 (FusedBatchNorm)"""
    n = numel(known_shape(view.input_shapes, 0, "input"))
    return with_flops(view, (6 if _batch_norm_training(view) else 3) * n)


@register(
    "aten.native_batch_norm_backward",
    "aten.cudnn_batch_norm_backward",
    "aten.miopen_batch_norm_backward",
    "aten.batch_norm_backward",
    kind=FLOPS,
    op_set=ATEN,
)
def _batch_norm_backward(view: OpView) -> OpCount:
    """tf: training 8 FLOPs/element, inference 5 (FusedBatchNormGrad)"""
    n = numel(known_shape(view.input_shapes, 0, "grad_out"))
    training = bool(_arg(view, "train", _arg(view, "update", True)))
    return with_flops(view, (8 if training else 5) * n)


_reads(
    *_BATCH_NORMS,
    "aten.native_batch_norm_backward",
    "aten.batch_norm_backward",
    args=("training", "train", "update"),
)


# --- softmax ------------------------------------------------------------------------------

register(
    *_names("_softmax softmax _log_softmax log_softmax _safe_softmax"),
    kind=FLOPS,
    op_set=ATEN,
    note="5 FLOPs/element (tf: Softmax)",
)(per_element(dict.fromkeys(_names("_softmax softmax _log_softmax log_softmax _safe_softmax"), (5, ""))))

register(
    "aten._softmax_backward_data",
    "aten._log_softmax_backward_data",
    kind=FLOPS,
    op_set=ATEN,
    note="4 FLOPs/element: y * (g - sum(g * y)); g - exp(y) * sum(g)",
)(per_element(dict.fromkeys(("aten._softmax_backward_data", "aten._log_softmax_backward_data"), (4, ""))))


# --- losses -------------------------------------------------------------------------------


@register(
    *_names(
        "mse_loss mse_loss_backward l1_loss smooth_l1_loss smooth_l1_loss_backward huber_loss huber_loss_backward"
    ),
    kind=FLOPS,
    op_set=ATEN,
)
def _pointwise_loss(view: OpView) -> OpCount:
    """3 FLOPs per element of the largest tensor argument (subtract, square or abs, reduce or scale)"""
    sizes = [numel(s) for s in view.input_shapes if known(s)]  # type: ignore[arg-type]
    if not sizes:
        raise CannotCount("no tensor argument of known shape")
    return with_flops(view, 3 * max(sizes))


@register(
    "aten.nll_loss_forward",
    "aten.nll_loss2d_forward",
    "aten.nll_loss",
    "aten.nll_loss_nd",
    "aten.nll_loss_backward",
    "aten.nll_loss2d_backward",
    kind=FLOPS,
    op_set=ATEN,
)
def _nll_loss(view: OpView) -> OpCount:
    """1 FLOP per target; reads targets and picked elements (backward: the gradient), writes outputs"""
    backward = view.op_type.endswith("_backward")
    target = known_shape(view.input_shapes, 2 if backward else 1, "target")
    picked = numel(target) * dtype_size(view.input_dtypes[1 if backward else 0])
    read = sum(view.input_bytes[2 if backward else 1 :]) + (view.input_bytes[0] if backward else picked)
    return OpCount(float(numel(target)), read, sum(view.output_bytes))


# --- pooling (TensorFlow's rules) ---------------------------------------------------------


def _window(view: OpView, rank: int) -> int:
    """The pooling window's area, each dim at most the padded input's (a window is clipped there)."""
    kernel = list(_ints(_arg(view, "kernel_size"), rank, 0))
    x = view.input_shapes[0] if view.input_shapes else None
    if x is not None and known(x) and len(x) >= rank:
        padding = list(_ints(_arg(view, "padding", 0), rank, 0))
        kernel = [min(k, size + 2 * p) for k, size, p in zip(kernel, x[-rank:], padding)]
    return numel(tuple(kernel))


_POOL_RANK = {"1d": 1, "2d": 2, "3d": 3}


def _pool_rank(view: OpView) -> int:
    for suffix, rank in _POOL_RANK.items():
        if suffix in view.op_type:
            return rank
    raise CannotCount("pool without a spatial rank")


_POOLS = [f"aten.{k}_pool{d}" for k in ("max", "avg") for d in _POOL_RANK] + [
    f"aten.max_pool{d}_with_indices" for d in _POOL_RANK if d != "1d"
]


@register(*_POOLS, kind=FLOPS, op_set=ATEN)
def _pool(view: OpView) -> OpCount:
    """tf: window area * output elements (MaxPool, AvgPool)"""
    window = _window(view, _pool_rank(view))
    if window <= 0:
        raise CannotCount("kernel_size missing")
    return with_flops(view, window * numel(known_shape(view.output_shapes, 0, "output")))


@register(*(f"aten.max_pool{d}_with_indices_backward" for d in ("2d", "3d")), kind=FLOPS, op_set=ATEN)
def _max_pool_backward(view: OpView) -> OpCount:
    """tf: (window area + 1) * grad_output elements (MaxPoolGrad)"""
    window = _window(view, _pool_rank(view))
    return with_flops(view, (window + 1) * numel(known_shape(view.input_shapes, 0, "grad_output")))


@register(*(f"aten.avg_pool{d}_backward" for d in ("2d", "3d")), kind=FLOPS, op_set=ATEN)
def _avg_pool_backward(view: OpView) -> OpCount:
    """tf: 2 * window area * grad_output elements (AvgPoolGrad)"""
    window = _window(view, _pool_rank(view))
    return with_flops(view, 2 * window * numel(known_shape(view.input_shapes, 0, "grad_output")))


_reads(
    *_POOLS,
    "aten.max_pool2d_with_indices_backward",
    "aten.max_pool3d_with_indices_backward",
    "aten.avg_pool2d_backward",
    "aten.avg_pool3d_backward",
    args=("kernel_size",),
)

register(
    *_names(
        "adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool2d "
        "adaptive_max_pool3d _adaptive_avg_pool2d _adaptive_avg_pool3d adaptive_avg_pool3d_backward "
        "adaptive_max_pool2d_backward adaptive_max_pool3d_backward _adaptive_avg_pool2d_backward "
        "_adaptive_avg_pool3d_backward"
    ),
    kind=FLOPS,
    op_set=ATEN,
    note="1 FLOP per input element (each summed or compared once; the backward: per grad_input element)",
)(
    lambda view: with_flops(
        view, max(numel(known_shape(view.input_shapes, 0, "input")), out_or_in_numel(view))
    )
)


# --- gathers, scatters, embeddings --------------------------------------------------------


@register(
    *_names("embedding index _unsafe_index index_select gather take take_along_dim"),
    kind=BYTES,
    op_set=ATEN,
)
def _gather(view: OpView) -> OpCount:
    """reads the indices + the gathered elements (not the whole table), writes the output"""
    out = sum(view.output_bytes)
    return OpCount(0.0, sum(view.input_bytes[1:]) + out, out)


@register("aten.embedding_dense_backward", "aten.embedding_backward", kind=FLOPS, op_set=ATEN)
def _embedding_backward(view: OpView) -> OpCount:
    """1 FLOP per grad_output element (accumulated into its row); writes the whole table"""
    return with_flops(view, numel(known_shape(view.input_shapes, 0, "grad_output")))


@register(
    *_names("scatter_add scatter_reduce index_add _unsafe_index_put index_put"), kind=FLOPS, op_set=ATEN
)
def _scatter_combine(view: OpView) -> OpCount:
    """1 FLOP per source element (last tensor argument) where it is combined (index_put: accumulate=True)"""
    if view.op_type.removesuffix("_").endswith("index_put") and not _arg(view, "accumulate", False):
        return bytes_only(view)
    src = next((s for s in reversed(view.input_shapes) if s is not None), None)
    return with_flops(view, numel(known_shape([src], 0, "source")))


_reads("aten.index_put", "aten.index_put_", "aten._unsafe_index_put", args=("accumulate",))


# --- copies, padding, creation: memory-bound ----------------------------------------------

register(
    *_names(
        # copies and layout changes
        "clone _to_copy to contiguous _copy_from _copy_from_and_resize lift_fresh_copy cat concat "
        "concatenate stack hstack vstack dstack constant_pad_nd pad reflection_pad1d reflection_pad2d "
        "reflection_pad3d replication_pad1d replication_pad2d replication_pad3d repeat repeat_interleave "
        "tile roll flip tril triu masked_scatter masked_select index_copy index_fill scatter "
        "slice_scatter select_scatter diagonal_scatter as_strided_scatter slice_backward select_backward "
        "unfold_backward diagonal_backward pixel_shuffle pixel_unshuffle channel_shuffle im2col col2im "
        "one_hot _local_scalar_dense item nonzero sort argsort topk kthvalue _unique _unique2 unique_dim "
        "unique_consecutive searchsorted bucketize histc bincount "
        # the functionalized *_copy views: real copies
        "view_copy _reshape_copy permute_copy t_copy transpose_copy expand_copy unsqueeze_copy "
        "squeeze_copy slice_copy select_copy split_copy split_with_sizes_copy unbind_copy alias_copy "
        "detach_copy as_strided_copy diagonal_copy unfold_copy narrow_copy view_as_real_copy "
        "view_as_complex_copy _foreach_copy "
        # resampling: interpolation arithmetic not counted (ONNX's Resize)
        "upsample_nearest1d upsample_nearest2d upsample_nearest3d _upsample_nearest_exact1d "
        "_upsample_nearest_exact2d _upsample_nearest_exact3d upsample_linear1d upsample_bilinear2d "
        "upsample_bicubic2d upsample_trilinear3d _upsample_bilinear2d_aa _upsample_bicubic2d_aa "
        "upsample_nearest1d_backward upsample_nearest2d_backward upsample_nearest3d_backward "
        "upsample_linear1d_backward upsample_bilinear2d_backward upsample_bicubic2d_backward "
        "upsample_trilinear3d_backward grid_sampler_2d "
        # creation: writes its output (random bits not counted)
        "zeros ones full zeros_like ones_like full_like new_zeros new_ones new_full scalar_tensor "
        "arange linspace logspace eye fill zero _foreach_zero rand randn randint randperm rand_like "
        "randn_like randint_like bernoulli normal uniform random exponential multinomial"
    ),
    kind=BYTES,
    op_set=ATEN,
)(bytes_only)


@register(*_names("copy"), kind=BYTES, op_set=ATEN)
def _copy(view: OpView) -> OpCount:
    """reads src (argument 1), writes self"""
    return OpCount(0.0, sum(view.input_bytes[1:]), sum(view.output_bytes))
