"""The TensorFlow op rules of the analytic cost model (op set ``tensorflow``).

Contract. Importing this module registers a rule for every TensorFlow op type
it covers into :data:`~baechi_cli.costs.registry.RULES`: a table of small
functions keyed by op type, each seeing one op through an
:class:`~baechi_cli.costs.registry.OpView` in TensorFlow's conventions (NHWC
unless ``data_format`` says otherwise, ``transpose_a``, ``ksize``, ...) and
returning its :class:`~baechi_cli.costs.registry.OpCount`. The rule contract,
the kinds and the lookups are :mod:`baechi_cli.costs.registry`'s, which loads
this module on the first lookup; callers look rules up there rather than
import this module. :mod:`baechi_cli.costs.rules_onnx` reuses these rules for
the ONNX ops TensorFlow has a counterpart for, so each formula here is the one
both op sets count with.

FLOPs are 2 per multiply-add. Elementwise ops, reductions and pooling are
counted as ``tf.compat.v1.profiler`` counts them ("tf" in a rule's note) or,
where it does not, at one FLOP per elementwise operation ("ours"); fused
kernels (convolutions, recurrent blocks, batch norm, softmax cross-entropies,
optimizer updates) as their TensorFlow kernels write them, with the derivation
next to each rule. ``COVERAGE.md`` lists every rule. Every rule is
O(rank + inputs).
"""

from __future__ import annotations

from baechi_cli.costs.registry import (
    BYTES,
    FLOPS,
    VARIABLE,
    ZERO,
    CannotCount,
    OpCount,
    OpView,
    Shape,
    bytes_only,
    data_bytes_read,
    dtype_size,
    is_handle,
    is_state,
    known,
    known_shape,
    no_kernel,
    numel,
    out_or_in_numel,
    per_element,
    register,
    with_flops,
)

# --- zero-compute bookkeeping -----------------------------------------------------


register(
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
        "RefSwitch "
        # integer bookkeeping whose GPU kernels keep every tensor in host memory
        "ConcatOffset InvertPermutation StatelessRandomGetKeyCounter StatelessRandomGetAlg "
        "StatelessRandomGetKeyCounterAlg "
        # TensorArrays and stacks (TF1 dynamic_rnn and its gradient): handles, and
        # reads, writes, pushes and pops that store or return a reference to the
        # tensor (stack swap_memory copies are not modelled)
        "TensorArrayV3 TensorArrayGradV3 TensorArrayGradWithShape TensorArrayReadV3 "
        "TensorArrayWriteV3 TensorArraySizeV3 TensorArrayCloseV3 StackV2 StackPushV2 StackPopV2 "
        "StackCloseV2"
    ).split(),
    kind=ZERO,
)(no_kernel)


# --- variables --------------------------------------------------------------------


@register("VariableV2", "Variable", "VarHandleOp", kind=VARIABLE)
def _variable(view: OpView) -> OpCount:
    """persistent bytes = attr shape x dtype size (else the output's bytes)"""
    shape, dtype = view.attrs.get("shape"), view.attrs.get("dtype")
    if known(shape) and isinstance(dtype, str) and dtype_size(dtype):
        return OpCount(persistent_bytes=numel(shape) * dtype_size(dtype))
    # A ref variable's output is the variable itself; a handle's output is 0
    # bytes, and analytic.py then sizes it from the ops that read it.
    return OpCount(persistent_bytes=sum(view.output_bytes))


# --- convolutions -----------------------------------------------------------------


def _conv_forward_out_numel(view: OpView) -> int:
    """Output elements of a forward convolution, inferred from input/filter/attrs.

    Used only when the output shape is unknown; this is where data_format,
    strides, dilations and padding matter (TF's output-size formulas).
    """
    x = known_shape(view.input_shapes, 0, "input")
    f = known_shape(view.input_shapes, 1, "filter")
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
    window = numel(filt[:-2]) * (1 if depthwise else filt[-2])
    return 2 * fwd_out_numel * window


@register("Conv2D", "Conv3D", "DepthwiseConv2dNative", kind=FLOPS)
def _conv(view: OpView) -> OpCount:
    """2 * out elements * Kh*Kw(*Kd) * Cin/groups (depthwise: no Cin sum)"""
    filt = known_shape(view.input_shapes, 1, "filter")
    out = view.output_shapes[0] if view.output_shapes else None
    out_numel = numel(out) if known(out) else _conv_forward_out_numel(view)  # type: ignore[arg-type]
    return with_flops(view, _conv_flops(out_numel, filt, view.op_type.startswith("Depthwise")))


@register(
    *"Conv2DBackpropInput Conv2DBackpropInputV2 Conv3DBackpropInput Conv3DBackpropInputV2 "
    "DepthwiseConv2dNativeBackpropInput".split(),
    kind=FLOPS,
)
def _conv_backprop_input(view: OpView) -> OpCount:
    """input gradient = forward FLOPs (filter = input 1, out_backprop = input 2)"""
    filt = known_shape(view.input_shapes, 1, "filter")
    dy = known_shape(view.input_shapes, 2, "out_backprop")
    return with_flops(view, _conv_flops(numel(dy), filt, view.op_type.startswith("Depthwise")))


@register(
    *"Conv2DBackpropFilter Conv2DBackpropFilterV2 Conv3DBackpropFilter Conv3DBackpropFilterV2 "
    "DepthwiseConv2dNativeBackpropFilter".split(),
    kind=FLOPS,
)
def _conv_backprop_filter(view: OpView) -> OpCount:
    """filter gradient = forward FLOPs (filter shape = the output, out_backprop = input 2)"""
    # The output is the filter gradient, so its shape is the filter's (and
    # equals the filter_sizes Const input of the V1 ops).
    dy = known_shape(view.input_shapes, 2, "out_backprop")
    filt = view.output_shapes[0] if view.output_shapes else None
    if not known(filt):
        # Input 1 is the filter itself only in the V2 ops; in V1 it is the
        # filter_sizes vector, whose value the view does not carry.
        filt = known_shape(view.input_shapes, 1, "filter")
        if len(filt) != len(dy):  # type: ignore[arg-type]
            raise CannotCount("filter shape unknown")
    return with_flops(view, _conv_flops(numel(dy), filt, view.op_type.startswith("Depthwise")))  # type: ignore[arg-type]


# --- matrix products --------------------------------------------------------------


@register("MatMul", "SparseMatMul", kind=FLOPS)
def _matmul(view: OpView) -> OpCount:
    """2 * M * N * K, K from input a (transpose_a aware); gradients are MatMuls too"""
    a = known_shape(view.input_shapes, 0, "a")
    if len(a) != 2:
        raise CannotCount("a is not a matrix")
    ta, tb = bool(view.attrs.get("transpose_a")), bool(view.attrs.get("transpose_b"))
    k = a[0] if ta else a[1]
    out = view.output_shapes[0] if view.output_shapes else None
    if known(out):
        mn = numel(out)  # type: ignore[arg-type]
    else:
        b = known_shape(view.input_shapes, 1, "b")
        if len(b) != 2:
            raise CannotCount("b is not a matrix")
        mn = (a[1] if ta else a[0]) * (b[0] if tb else b[1])
    return with_flops(view, 2 * mn * k)


def _broadcast(a: Shape, b: Shape) -> Shape:
    """NumPy broadcasting of two (batch) shapes."""
    rank = max(len(a), len(b))
    a = (1,) * (rank - len(a)) + a
    b = (1,) * (rank - len(b)) + b
    return tuple(max(x, y) if 1 in (x, y) else x for x, y in zip(a, b, strict=True))


@register("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", kind=FLOPS)
def _batch_matmul(view: OpView) -> OpCount:
    """2 * batch * M * N * K with broadcast batch dims (adj_x/adj_y aware)"""
    x = known_shape(view.input_shapes, 0, "x")
    adj_x, adj_y = bool(view.attrs.get("adj_x")), bool(view.attrs.get("adj_y"))
    if len(x) < 2:
        raise CannotCount("x has rank < 2")
    k = x[-2] if adj_x else x[-1]
    out = view.output_shapes[0] if view.output_shapes else None
    if known(out):
        out_numel = numel(out)  # type: ignore[arg-type]
    else:
        y = known_shape(view.input_shapes, 1, "y")
        m = x[-1] if adj_x else x[-2]
        n = y[-2] if adj_y else y[-1]
        out_numel = numel(_broadcast(x[:-2], y[:-2])) * m * n
    return with_flops(view, 2 * out_numel * k)


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
        shape = known_shape(view.input_shapes, i, f"operand {i}")
        head, dots, tail = term.partition("...")
        n_ell = len(shape) - len(head) - len(tail)
        if n_ell < 0 or (n_ell and not dots):
            raise CannotCount("einsum equation does not match operand rank")
        for letter, dim in zip(head + "." * n_ell + tail, shape, strict=True):
            if letter != ".":
                sizes[letter] = max(sizes.get(letter, 1), dim)
        if dots:
            ellipsis = _broadcast(ellipsis, tuple(shape[len(head) : len(head) + n_ell]))
    products = numel(tuple(sizes.values())) * numel(ellipsis)
    summed = bool(set(sizes) - set(rhs)) or (bool(ellipsis) and "..." not in rhs)
    if len(terms) == 1:
        flops = products if summed else 0  # a transpose, or a reduction's adds
    else:
        flops = 2 * products if summed else products
    return with_flops(view, flops)


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
        "Rint Erf Erfc Lgamma Digamma Softplus Softsign Sin Cos Tan Asin Acos Atan Atan2 Sinh Cosh "
        "Asinh Acosh Atanh Inv Div DivNoNan FloorDiv FloorMod Mod TruncateDiv TruncateMod MulNoNan "
        "Xdivy Xlogy IsNan IsInf IsFinite LogicalAnd LogicalOr LogicalNot Select SelectV2 BiasAddV1 "
        "ReluGrad Relu6Grad LeakyReluGrad EluGrad SeluGrad SigmoidGrad TanhGrad SqrtGrad "
        "ReciprocalGrad InvGrad SoftplusGrad SoftsignGrad".split(),
        (1, "ours"),
    ),
    "ClipByValue": (2, "ours"),  # a max and a min
    "LogSoftmax": (5, "ours"),
}


_elementwise = per_element(_ELEMENTWISE)
for _t, (_k, _src) in _ELEMENTWISE.items():
    register(_t, kind=FLOPS, note=f"{_k} FLOP{'s' if _k > 1 else ''}/element ({_src})")(_elementwise)


@register("AddN", kind=FLOPS, note="(inputs - 1) FLOPs/element (tf)")
def _add_n(view: OpView) -> OpCount:
    return with_flops(view, max(len(view.input_shapes) - 1, 0) * out_or_in_numel(view))


@register("L2Loss", kind=FLOPS, note="3 * input elements - 1 (tf)")
def _l2_loss(view: OpView) -> OpCount:
    return with_flops(view, 3 * numel(known_shape(view.input_shapes, 0, "input")) - 1)


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
    n_in = numel(known_shape(view.input_shapes, 0, "input"))
    n_out = numel(known_shape(view.output_shapes, 0, "output"))
    return with_flops(view, n_in * reduce + n_out * (finalize - reduce))


for _t, (_r, _f, _src) in _REDUCTIONS.items():
    _tail = " - output elements" if _f - _r < 0 else ""
    register(_t, kind=FLOPS, note=f"input elements{_tail} ({_src})")(_reduction)


def _ksize_area(view: OpView) -> int:
    ksize = view.attrs.get("ksize")
    if not ksize or any(k < 1 for k in ksize):
        raise CannotCount("ksize attr missing")
    return numel(tuple(ksize))


@register("MaxPool", "AvgPool", "MaxPool3D", "AvgPool3D", kind=FLOPS)
def _pool(view: OpView) -> OpCount:
    """window area * output elements (tf)"""
    return with_flops(view, _ksize_area(view) * numel(known_shape(view.output_shapes, 0, "output")))


@register("AvgPoolGrad", "AvgPool3DGrad", kind=FLOPS)
def _avg_pool_grad(view: OpView) -> OpCount:
    """2 * window area * out_backprop elements (tf)"""
    return with_flops(view, 2 * _ksize_area(view) * numel(known_shape(view.input_shapes, 1, "grad")))


@register("MaxPoolGrad", "MaxPool3DGrad", kind=FLOPS)
def _max_pool_grad(view: OpView) -> OpCount:
    """(window area + 1) * forward output elements (tf)"""
    return with_flops(view, (_ksize_area(view) + 1) * numel(known_shape(view.input_shapes, 1, "orig_output")))


# --- normalisation and losses ------------------------------------------------------


def _is_training(view: OpView) -> bool:
    return bool(view.attrs.get("is_training", True))  # TensorFlow's default


def _nhwc_on_cudnn_temp(view: OpView, copies: int) -> int:
    """Scratch of TensorFlow's GPU batch norm: channels-last tensors transposed for cuDNN.

    In training mode (forward and gradient) the GPU kernel runs cuDNN in NCHW
    and so allocates NCHW copies of its channels-last operands; channels-first
    data needs none, nor does inference (a custom NHWC kernel).
    """
    channels_first = str(view.attrs.get("data_format", "NHWC")).startswith("NC")
    if channels_first or not _is_training(view):
        return 0
    return copies * view.input_bytes[0]


@register("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3", kind=FLOPS)
def _fused_batch_norm(view: OpView) -> OpCount:
    """training: 6 FLOPs/element, inference: 3; training scratch: NCHW copies of x and y"""
    # Training: mean (sum: 1), variance (center, square, sum: 3), then
    # y = centered * scale/sqrt(var + eps) + offset (2; the centered values are
    # shared). Inference: y = (x - mean) * a + offset with a per channel (3).
    # Per-channel work (O(channels)) is not counted.
    n = numel(known_shape(view.input_shapes, 0, "x"))
    count = with_flops(view, (6 if _is_training(view) else 3) * n)
    return count._replace(temporary_bytes=_nhwc_on_cudnn_temp(view, 2))


@register("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3", kind=FLOPS)
def _fused_batch_norm_grad(view: OpView) -> OpCount:
    """training: 8 FLOPs/element, inference: 5; training scratch: NCHW copies of dy, x, dx"""
    # Training (TF's formula): offset_grad = sum(dy) (1); c = x - mean (1),
    # scale_grad = sum(dy * c) * rsqrt(var + eps) (2); x_grad = k1 * (dy -
    # mean(dy) - c * k2) with per-channel k1, k2 (4). Inference: offset_grad
    # (1), scale_grad = sum(dy * (x - mean)) * rsqrt(...) (3), x_grad = dy * k (1).
    n = numel(known_shape(view.input_shapes, 0, "y_backprop"))
    count = with_flops(view, (8 if _is_training(view) else 5) * n)
    return count._replace(temporary_bytes=_nhwc_on_cudnn_temp(view, 3))


def _rows_cols(view: OpView) -> tuple[int, int]:
    """[batch, classes] of a softmax cross-entropy: its backprop output (input 0 if unknown)."""
    shape = view.output_shapes[1] if len(view.output_shapes) > 1 else None
    if not known(shape):
        shape = known_shape(view.input_shapes, 0, "features")
    if len(shape) != 2:  # type: ignore[arg-type]
        raise CannotCount("logits are not a matrix")
    return shape[0], shape[1]  # type: ignore[index]


@register("SoftmaxCrossEntropyWithLogits", kind=FLOPS)
def _softmax_xent(view: OpView) -> OpCount:
    """10 FLOPs/logit + 1/row (xent_op.h); scratch [batch, 1]"""
    # Per logit: row max (1), shift (1), exp (1), row sum (1), loss terms
    # labels * (log(sum) - shifted) summed (3), backprop exp / sum - labels (3:
    # the kernel recomputes exp). Per row: log(sum).
    rows, cols = _rows_cols(view)
    itemsize = dtype_size(view.input_dtypes[0])
    return with_flops(view, 10 * rows * cols + rows)._replace(temporary_bytes=rows * itemsize)


@register("SparseSoftmaxCrossEntropyWithLogits", kind=FLOPS)
def _sparse_softmax_xent(view: OpView) -> OpCount:
    """8 FLOPs/logit + 2/row (sparse_xent_op.h); scratch [batch]"""
    # Per logit: row max (1), shift (1), exp and row sum (2), the loss
    # generator's row sum (1), backprop exp / sum - onehot (3). Per row: the
    # loss log(sum) - shifted[label] (2).
    rows, cols = _rows_cols(view)
    itemsize = dtype_size(view.input_dtypes[0])
    return with_flops(view, 8 * rows * cols + 2 * rows)._replace(temporary_bytes=rows * itemsize)


# --- recurrent blocks ---------------------------------------------------------------

# TensorFlow's fused LSTM/GRU kernels (tensorflow/core/kernels/rnn/{lstm,gru}_ops.h),
# counted as their Eigen expressions are written: one FLOP per elementwise
# operation (sigmoid and tanh included, as the TF profiler counts Softmax's exp),
# 2*M*N*K per GEMM.
_LSTM_CELL_CLIP_DEFAULT = {"LSTMBlockCell": 3.0, "BlockLSTM": 3.0, "BlockLSTMV2": 0.0}


def _lstm_sizes(view: OpView, x_index: int) -> tuple[int, int, int]:
    """(batch, input size, cell size) from x [.., batch, input] and cs_prev [batch, cell]."""
    x = known_shape(view.input_shapes, x_index, "x")
    cs_prev = known_shape(view.input_shapes, x_index + 1, "cs_prev")
    if len(x) < 2 or len(cs_prev) != 2:
        raise CannotCount("LSTM operands have the wrong rank")
    return cs_prev[0], x[-1], cs_prev[1]


def _lstm_fprop(view: OpView, b: int, i: int, h: int) -> int:
    """One LSTM step: xh @ w [i+h, 4h] plus 14 FLOPs per (batch, cell) element."""
    # Bias add (4); i = sigmoid (1); ci = tanh (1); f = sigmoid(. + forget_bias)
    # (2); cs = i*ci + f*cs_prev (3); co = tanh(cs) (1); o = sigmoid (1);
    # h = o*co (1). Peepholes add a multiply-add to each of i, f, o (6); a
    # positive cell_clip clamps cs (a max and a min: 2).
    peephole = bool(view.attrs.get("use_peephole", False))
    clip = float(view.attrs.get("cell_clip", _LSTM_CELL_CLIP_DEFAULT[view.op_type])) > 0
    return 2 * b * (i + h) * 4 * h + (14 + 6 * peephole + 2 * clip) * b * h


def _lstm_cell_bprop(view: OpView, b: int, h: int) -> int:
    """The elementwise gate gradients of one LSTM step (LSTMBlockCellBprop)."""
    # do (4), dcs (5), dci (4), df (4), di (4), cs_prev_grad = dcs*f (1).
    # Peepholes: dcs += do*wco (2), cs_prev_grad += di*wci + df*wcf (4), and
    # three weight gradients, each a product summed over the batch (2b - 1 per cell).
    peephole = bool(view.attrs.get("use_peephole", False))
    return 22 * b * h + peephole * (6 * b * h + 3 * (2 * b - 1) * h)


@register("LSTMBlockCell", kind=FLOPS)
def _lstm_block_cell(view: OpView) -> OpCount:
    """xh @ w (2*b*(i+h)*4h) + 14 FLOPs/(batch, cell) (+6 peephole, +2 cell_clip); scratch xh, gates"""
    b, i, h = _lstm_sizes(view, 0)
    itemsize = dtype_size(view.input_dtypes[0])
    temp = (b * (i + h) + b * 4 * h) * itemsize  # xh and the gate pre-activations
    return with_flops(view, _lstm_fprop(view, b, i, h))._replace(temporary_bytes=temp)


@register("LSTMBlockCellGrad", kind=FLOPS)
def _lstm_block_cell_grad(view: OpView) -> OpCount:
    """22 FLOPs/(batch, cell) (+peephole terms); the weight and input GEMMs are separate MatMuls"""
    b, _, h = _lstm_sizes(view, 0)
    itemsize = dtype_size(view.input_dtypes[0])
    temp = 5 * b * h * itemsize  # do, dcs, dci, df, di
    return with_flops(view, _lstm_cell_bprop(view, b, h))._replace(temporary_bytes=temp)


def _timesteps(view: OpView) -> int:
    # x is [time, batch, input]; the kernel runs seq_len_max <= time steps,
    # a runtime value, so the full length is counted (an upper bound).
    x = known_shape(view.input_shapes, 1, "x")
    if len(x) != 3:
        raise CannotCount("x is not [time, batch, input]")
    return x[0]


@register("BlockLSTM", "BlockLSTMV2", kind=FLOPS)
def _block_lstm(view: OpView) -> OpCount:
    """time steps x LSTMBlockCell (cell_clip default 3, V2: 0); scratch xh, gates"""
    b, i, h = _lstm_sizes(view, 1)
    itemsize = dtype_size(view.input_dtypes[1])
    temp = (b * (i + h) + b * 4 * h) * itemsize  # reused by every step
    return with_flops(view, _timesteps(view) * _lstm_fprop(view, b, i, h))._replace(temporary_bytes=temp)


@register("BlockLSTMGrad", "BlockLSTMGradV2", kind=FLOPS)
def _block_lstm_grad(view: OpView) -> OpCount:
    """per step: gate gradients + 28 FLOPs/(batch, cell) + xh_grad and w_grad GEMMs"""
    # Per step (BlockLSTMBprop): cs_grad and h_grad accumulation (2), the gate
    # gradients (22, + peepholes), b_grad += sum of dgates (4); xh_grad =
    # dgates @ w^T and w_grad += xh^T @ dgates (2 GEMMs, + the accumulation).
    b, i, h = _lstm_sizes(view, 1)
    gemms = 2 * (2 * b * (i + h) * 4 * h) + (i + h) * 4 * h
    step = gemms + 6 * b * h + _lstm_cell_bprop(view, b, h)
    itemsize = dtype_size(view.input_dtypes[1])
    # xh, xh_grad; do, dcs, dci, df, di, cs_grad, h_grad; dgates
    temp = (2 * b * (i + h) + 7 * b * h + b * 4 * h) * itemsize
    return with_flops(view, _timesteps(view) * step)._replace(temporary_bytes=temp)


def _gru_sizes(view: OpView) -> tuple[int, int, int]:
    x = known_shape(view.input_shapes, 0, "x")
    h_prev = known_shape(view.input_shapes, 1, "h_prev")
    if len(x) != 2 or len(h_prev) != 2:
        raise CannotCount("GRU operands are not matrices")
    return x[0], x[1], h_prev[1]


@register("GRUBlockCell", kind=FLOPS)
def _gru_block_cell(view: OpView) -> OpCount:
    """2*b*(i+h)*3h (two GEMMs) + 10 FLOPs/(batch, cell); scratch x_h_prev, x_h_prevr, r_u_bar"""
    # Bias adds (3), r and u sigmoids (2), h_prev*r (1), c = tanh (1),
    # h = u*(h_prev - c) + c (3).
    b, i, h = _gru_sizes(view)
    itemsize = dtype_size(view.input_dtypes[0])
    temp = (2 * b * (i + h) + 2 * b * h) * itemsize
    return with_flops(view, 2 * b * (i + h) * 3 * h + 10 * b * h)._replace(temporary_bytes=temp)


@register("GRUBlockCellGrad", kind=FLOPS)
def _gru_block_cell_grad(view: OpView) -> OpCount:
    """2*b*(i+h)*3h (two GEMMs) + 18 FLOPs/(batch, cell) + b*i; weight GEMMs are separate MatMuls"""
    # d_c_bar (5), d_u_bar (5), d_r_bar (4), d_h_prev = comp1 + d_hr*r + d_h*u
    # (4); d_x = comp1 + comp2 (b*i).
    b, i, h = _gru_sizes(view)
    itemsize = dtype_size(view.input_dtypes[0])
    temp = (3 * b * h + 2 * b * (i + h)) * itemsize  # d_r_bar, d_u_bar, d_hr, two [b, i+h] GEMM results
    return with_flops(view, 2 * b * (i + h) * 3 * h + 18 * b * h + b * i)._replace(temporary_bytes=temp)


# cuDNN RNN modes: (gates, forward FLOPs, backward FLOPs per (batch, hidden unit,
# step)) from cuDNN's mode equations, counted as above. Every gate adds two
# GEMM results and two biases (3). LSTM forward: 4 gates x (3 + activation) +
# c = f*c' + i*g (3) + h = o*tanh(c) (2) = 21; GRU: 2 gates x 4 + h' (5) +
# h = (1-z)*h' + z*h (4) = 17; plain RNN: 3 + activation = 4. Backward: the
# block cells' gate gradients plus the h-gradient sum (1) and both bias
# gradients (2 per gate): LSTM 22 + 1 + 8 = 31, GRU 18 + 1 + 6 = 25, tanh 3 + 1 + 2 = 6,
# relu 1 + 1 + 2 = 4.
_CUDNN_MODES = {"lstm": (4, 21, 31), "gru": (3, 17, 25), "rnn_tanh": (1, 4, 6), "rnn_relu": (1, 4, 4)}


def _cudnn_rnn_flops(view: OpView, backward: bool) -> int:
    attrs = view.attrs
    mode = str(attrs.get("rnn_mode", "lstm"))
    if mode not in _CUDNN_MODES:
        raise CannotCount(f"unknown rnn_mode {mode!r}")
    gates, forward_ew, backward_ew = _CUDNN_MODES[mode]
    # The backward pass runs the data-gradient and the weight-gradient GEMMs.
    gemm_passes, elementwise = (2, backward_ew) if backward else (1, forward_ew)
    x = known_shape(view.input_shapes, 0, "input")
    h0 = known_shape(view.input_shapes, 1, "input_h")
    if len(x) != 3 or len(h0) != 3:
        raise CannotCount("cuDNN RNN operands have the wrong rank")
    steps, batch = (x[0], x[1]) if attrs.get("time_major", True) else (x[1], x[0])
    dirs = 2 if attrs.get("direction", "unidirectional") == "bidirectional" else 1
    layers = h0[0] // dirs
    proj = int(attrs.get("num_proj", 0))  # LSTM projection: h has proj units, the cell state hidden
    hidden = known_shape(view.input_shapes, 2, "input_c")[-1] if proj else h0[-1]
    rec = proj or hidden
    flops = 0
    for layer in range(layers):
        # Layer 0 reads the input (none with skip_input); later layers the
        # previous layer's (concatenated) outputs.
        if layer:
            fan_in = dirs * rec
        else:
            fan_in = 0 if attrs.get("input_mode", "linear_input") == "skip_input" else x[2]
        gemm = 2 * batch * gates * hidden * (fan_in + rec) + 2 * batch * hidden * proj
        flops += dirs * steps * (gemm_passes * gemm + elementwise * batch * hidden)
    return flops


@register("CudnnRNN", "CudnnRNNV2", "CudnnRNNV3", kind=FLOPS)
def _cudnn_rnn(view: OpView) -> OpCount:
    """per layer, direction, step: gates * 2*b*h*(fan_in + h) + 21 (LSTM) / 17 (GRU) / 4 FLOPs per (b, h)"""
    return with_flops(view, _cudnn_rnn_flops(view, backward=False))


@register("CudnnRNNBackprop", "CudnnRNNBackpropV2", "CudnnRNNBackpropV3", kind=FLOPS)
def _cudnn_rnn_backprop(view: OpView) -> OpCount:
    """2 x the forward GEMMs (data and weight gradients) + 31 (LSTM) / 25 (GRU) / 6 / 4 FLOPs per (b, h)"""
    return with_flops(view, _cudnn_rnn_flops(view, backward=True))


# --- in-place updates -------------------------------------------------------------


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


# FLOPs per gradient element of each optimizer update, counted on the update
# formula as TensorFlow's kernels write it (tensorflow/core/kernels/training_ops.cc):
# one FLOP per elementwise operation on a tensor (+ - * /, square, sqrt, rsqrt,
# exp, sign, abs, max, compare, select), each distinct subexpression once;
# scalar-only terms (lr * l1, 1 - beta) are computed once per step and not
# counted. Sparse variants apply the same update to the gradient's rows. Where
# an input's value picks the branch (l1 > 0), the costlier branch is counted.
_OPTIMIZER_FLOPS: dict[str, int] = {
    "GradientDescent": 2,  # var -= grad*lr
    "ProximalGradientDescent": 8,  # v = var - grad*lr (2); sign(v) * max(|v| - lr*l1, 0) / c (6)
    "Momentum": 4,  # accum = accum*m + grad (2); var -= accum*lr (2)
    "KerasMomentum": 4,  # accum = accum*m - grad*lr (3); var += accum (1)
    "Adagrad": 6,  # accum += grad^2 (2); var -= grad*lr*rsqrt(accum) (4)
    "AdagradV2": 7,  # accum += grad^2 (2); var -= grad*lr / (sqrt(accum) + eps) (5)
    # accum (2); r = lr*rsqrt(accum) (2); v = var - grad*r (2); sign(v) * max(|v| - r*l1, 0) / (1 + l2*r) (9)
    "ProximalAdagrad": 15,
    # g += grad (1); gg += grad^2 (2); -lr * sign(g) * max(|g| - l1*t, 0) / (c + sqrt(gg)) (9)
    "AdagradDA": 12,
    # accum = accum*rho + grad^2*(1-rho) (4); u = sqrt(au + eps) * rsqrt(accum + eps) * grad (6);
    # var -= u*lr (2); au = au*rho + u^2*(1-rho) (4)
    "Adadelta": 16,
    "Adam": 12,  # m += (grad - m)*(1-b1) (3); v += (grad^2 - v)*(1-b2) (4); var -= m*a / (sqrt(v) + eps) (5)
    "AdamWithAmsgrad": 13,  # Adam's, with vhat = max(vhat, v) (1) in place of v
    "AdaMax": 10,  # m (3); v = max(b2*v, |grad|) (3); var -= c * m / (v + eps) (4)
    # ms += (grad^2 - ms)*(1-rho) (4); mom = mom*k + grad*lr / sqrt(ms + eps) (6); var -= mom (1)
    "RMSProp": 11,
    # ms (4); mg += (grad - mg)*(1-rho) (3); d = ms - mg^2 + eps (3); mom = mom*k + grad*lr / sqrt(d) (5);
    # var -= mom (1)
    "CenteredRMSProp": 16,
    "AddSign": 11,  # m = m*b + grad*(1-b) (3); s = sign(grad)*sign(m) (3); var -= lr*(a + d*s)*grad (5)
    "PowerSign": 11,  # m (3); s (3); e = exp(c*s) (2); var -= lr*e*grad (3)
    # n = accum + grad^2 (2); sqrt(n), sqrt(accum) (2); linear += grad - (sqrt(n) - sqrt(accum))/lr*var (5);
    # x = l1*sign(linear) - linear (3); y = sqrt(n)/lr + 2*l2 (2); x/y (1); |linear| > l1 ? x/y : 0 (3);
    # accum = n (0)
    "Ftrl": 18,
    "FtrlV2": 20,  # Ftrl's, with grad + 2*l2_shrinkage*var (2) in the linear update
}
# With use_nesterov=True: Momentum's var -= grad*lr + accum*m*lr (5); Keras
# momentum's var += accum*m - grad*lr (3, grad*lr shared); Adam's
# var -= (grad*(1-b1) + b1*m)*a / (sqrt(v) + eps) (8).
_NESTEROV_FLOPS = {"Momentum": 7, "KerasMomentum": 6, "Adam": 15}
# With update_slots=False the accumulator is not updated (-2).
_NO_SLOT_UPDATE_FLOPS = {"Adagrad": 4, "AdagradV2": 5}

# Every optimizer update op TensorFlow 2.21 registers (tf.raw_ops), dense and
# sparse, by algorithm.
_APPLY_PREFIXES = {
    "Apply": "AdaMax Adadelta Adagrad AdagradDA AdagradV2 Adam AddSign CenteredRMSProp Ftrl FtrlV2 "
    "GradientDescent Momentum PowerSign ProximalAdagrad ProximalGradientDescent RMSProp",
    "ResourceApply": "AdaMax Adadelta Adagrad AdagradDA AdagradV2 Adam AdamWithAmsgrad AddSign "
    "CenteredRMSProp Ftrl FtrlV2 GradientDescent KerasMomentum Momentum PowerSign ProximalAdagrad "
    "ProximalGradientDescent RMSProp",
    "SparseApply": "Adadelta Adagrad AdagradDA AdagradV2 CenteredRMSProp Ftrl FtrlV2 Momentum "
    "ProximalAdagrad ProximalGradientDescent RMSProp",
    "ResourceSparseApply": "Adadelta Adagrad AdagradDA AdagradV2 CenteredRMSProp Ftrl FtrlV2 "
    "KerasMomentum Momentum ProximalAdagrad ProximalGradientDescent RMSProp",
}
_APPLY_ALGORITHM = {
    f"{prefix}{algo}": algo for prefix, algos in _APPLY_PREFIXES.items() for algo in algos.split()
}


def _update_numel(view: OpView) -> int:
    """Elements of an update's gradient (or value): its largest plain input."""
    # Dense: the gradient has the variable's shape; sparse: [rows, ...], which
    # has at least as many elements as the indices; the rest are scalars.
    plain = [s for s, dt in zip(view.input_shapes, view.input_dtypes, strict=True) if not is_state(dt)]
    if not plain or not all(known(s) for s in plain):
        raise CannotCount("update shape unknown")
    return max(numel(s) for s in plain)  # type: ignore[arg-type]


def _apply(view: OpView) -> OpCount:
    algo = _APPLY_ALGORITHM[view.op_type]
    per_element = _OPTIMIZER_FLOPS[algo]
    if view.attrs.get("use_nesterov") and algo in _NESTEROV_FLOPS:
        per_element = _NESTEROV_FLOPS[algo]
    elif algo in _NO_SLOT_UPDATE_FLOPS and not view.attrs.get("update_slots", True):
        per_element = _NO_SLOT_UPDATE_FLOPS[algo]
    return _stateful(view, reads_state=True, flops=per_element * _update_numel(view))


for _algo, _k in _OPTIMIZER_FLOPS.items():
    _variants = [t for t, a in _APPLY_ALGORITHM.items() if a == _algo]
    _extra = f"; {_NESTEROV_FLOPS[_algo]} with use_nesterov" if _algo in _NESTEROV_FLOPS else ""
    _extra += (
        f"; {_NO_SLOT_UPDATE_FLOPS[_algo]} without update_slots" if _algo in _NO_SLOT_UPDATE_FLOPS else ""
    )
    _note = f"{_algo} update: {_k} FLOPs/gradient element{_extra}; var and slots read+written"
    register(*_variants, kind=FLOPS, note=_note)(_apply)


@register("AssignAdd", "AssignSub", "AssignAddVariableOp", "AssignSubVariableOp", kind=FLOPS)
def _assign_update(view: OpView) -> OpCount:
    """1 FLOP/element; reads and writes the variable (tf for AssignAdd/AssignSub)"""
    value = known_shape(view.input_shapes, 1, "value")
    return _stateful(view, reads_state=True, flops=numel(value))


@register("Assign", "AssignVariableOp", kind=BYTES)
def _assign(view: OpView) -> OpCount:
    """reads the value, writes the variable"""
    return _stateful(view, reads_state=False)


# --- gathers, scatters, segment reductions (embeddings and their gradients) --------


@register("Gather", "GatherV2", "GatherNd", "ResourceGather", "ResourceGatherNd", kind=BYTES)
def _gather(view: OpView) -> OpCount:
    """reads indices + the gathered rows (not the whole table), writes the output"""
    rest = sum(
        b for b, dt in zip(view.input_bytes[1:], view.input_dtypes[1:], strict=True) if not is_handle(dt)
    )
    out = sum(view.output_bytes)
    return OpCount(0.0, rest + out, out)


def _scatter_into_variable(view: OpView, flops_per_update: int) -> OpCount:
    # Inputs: the variable (ref or handle), indices, updates. Only the rows
    # named by the indices are touched: read (unless overwritten) and written
    # at the updates' size; a ref input's bytes (the whole table) are not read.
    updates = view.input_bytes[2]
    plain = sum(b for b, dt in zip(view.input_bytes, view.input_dtypes, strict=True) if not is_state(dt))
    flops = flops_per_update * numel(known_shape(view.input_shapes, 2, "updates"))
    return OpCount(float(flops), plain + (updates if flops_per_update else 0), updates)


@register(
    *(
        f"{prefix}{op}{suffix}"
        for prefix in ("", "Resource")
        for op in ("Scatter", "ScatterNd")
        for suffix in ("Add", "Sub", "Mul", "Div", "Min", "Max")
        if not (op == "ScatterNd" and suffix in ("Mul", "Div"))
    ),
    kind=FLOPS,
)
def _scatter_combine(view: OpView) -> OpCount:
    """1 FLOP/update element; reads indices, updates and the touched rows, writes those rows"""
    return _scatter_into_variable(view, 1)


@register("ScatterUpdate", "ResourceScatterUpdate", "ScatterNdUpdate", "ResourceScatterNdUpdate", kind=BYTES)
def _scatter_update(view: OpView) -> OpCount:
    """reads indices and updates, writes the touched rows"""
    return _scatter_into_variable(view, 0)


@register("TensorScatterAdd", "TensorScatterSub", "TensorScatterMin", "TensorScatterMax", kind=FLOPS)
def _tensor_scatter(view: OpView) -> OpCount:
    """1 FLOP/update element; reads all inputs, writes the (copied) tensor"""
    return with_flops(view, numel(known_shape(view.input_shapes, 2, "updates")))


@register(
    "UnsortedSegmentSum",
    "UnsortedSegmentProd",
    "UnsortedSegmentMax",
    "UnsortedSegmentMin",
    "SegmentSum",
    "SegmentProd",
    "SegmentMax",
    "SegmentMin",
    kind=FLOPS,
)
def _segment_reduction(view: OpView) -> OpCount:
    """1 FLOP per data element (each is combined into its segment)"""
    return with_flops(view, numel(known_shape(view.input_shapes, 0, "data")))


@register("SegmentMean", kind=FLOPS)
def _segment_mean(view: OpView) -> OpCount:
    """data elements + output elements (the division by the segment size)"""
    data = numel(known_shape(view.input_shapes, 0, "data"))
    return with_flops(view, data + numel(known_shape(view.output_shapes, 0, "output")))


def _gathered_rows(view: OpView) -> tuple[int, int]:
    """(elements, bytes) of the rows a sparse segment op reads: one row of input 0 per index."""
    data = known_shape(view.input_shapes, 0, "data")
    indices = numel(known_shape(view.input_shapes, 1, "indices"))
    if not data or not data[0]:
        raise CannotCount("data has no rows")
    elements = indices * (numel(data) // data[0])
    return elements, elements * dtype_size(view.input_dtypes[0])


def _sparse_segment(view: OpView, flops_per_row_element: int, per_output: int) -> OpCount:
    # Reads the indexed rows of input 0 (not the whole table) and the other
    # inputs; writes the output.
    elements, row_bytes = _gathered_rows(view)
    out = sum(view.output_bytes)
    flops = flops_per_row_element * elements
    if per_output:
        flops += per_output * numel(known_shape(view.output_shapes, 0, "output"))
    return OpCount(float(flops), row_bytes + sum(view.input_bytes[1:]), out)


@register("SparseSegmentSum", "SparseSegmentSumWithNumSegments", kind=FLOPS)
def _sparse_segment_sum(view: OpView) -> OpCount:
    """1 FLOP per gathered element (indices x row size); reads the gathered rows only"""
    return _sparse_segment(view, 1, 0)


@register(
    "SparseSegmentMean",
    "SparseSegmentMeanWithNumSegments",
    "SparseSegmentSqrtN",
    "SparseSegmentSqrtNWithNumSegments",
    kind=FLOPS,
)
def _sparse_segment_mean(view: OpView) -> OpCount:
    """gathered elements + output elements (the per-segment scaling); reads the gathered rows only"""
    return _sparse_segment(view, 1, 1)


@register("SparseSegmentSumGrad", kind=FLOPS)
def _sparse_segment_sum_grad(view: OpView) -> OpCount:
    """1 FLOP per scattered element (indices x row size): output[index] += grad[segment]"""
    return _sparse_segment(view, 1, 0)


@register("SparseSegmentMeanGrad", "SparseSegmentSqrtNGrad", kind=FLOPS)
def _sparse_segment_scaled_grad(view: OpView) -> OpCount:
    """2 FLOPs per scattered element: output[index] += grad[segment] * weight"""
    return _sparse_segment(view, 2, 0)


@register("Unique", "UniqueWithCounts", kind=BYTES)
def _unique(view: OpView) -> OpCount:
    """memory-bound; scratch: the GPU kernel's sort buffers, N*(T + 2*idx) + 3*N*idx bytes (4 with counts)"""
    # TF's GPU kernel (unique_op_gpu.cu.h) radix-sorts a copy of the input with
    # its permutation and prefix-sums segment ids: three input-sized buffers.
    # Then up to three (four with counts) buffers of the unique count U, which
    # is known only at run time; U <= N gives the bound used here.
    n = numel(known_shape(view.input_shapes, 0, "x"))
    value = dtype_size(view.input_dtypes[0])
    index = dtype_size(view.output_dtypes[1]) if len(view.output_dtypes) > 1 else 4
    unique_sized = 4 if view.op_type == "UniqueWithCounts" else 3
    temp = n * (value + 2 * index) + unique_sized * n * index
    return bytes_only(view)._replace(temporary_bytes=temp)


# --- TensorArrays (TF1 dynamic_rnn) ------------------------------------------------

# Reads and writes store and return references (zero-kind above); scatter and
# split copy the value into per-element tensors, gather and concat copy them
# back into one.
_TENSOR_ARRAY_VALUE_INPUT = {"TensorArrayScatterV3": 2, "TensorArraySplitV3": 1}


@register(*_TENSOR_ARRAY_VALUE_INPUT, kind=BYTES)
def _tensor_array_scatter(view: OpView) -> OpCount:
    """reads the value (and indices), writes its elements into the array"""
    value = view.input_bytes[_TENSOR_ARRAY_VALUE_INPUT[view.op_type]]
    return OpCount(0.0, data_bytes_read(view), value)


@register("TensorArrayGatherV3", "TensorArrayConcatV3", kind=BYTES)
def _tensor_array_gather(view: OpView) -> OpCount:
    """reads the elements (output 0's bytes) and indices, writes the stacked value"""
    value = view.output_bytes[0]
    return OpCount(0.0, data_bytes_read(view) + value, sum(view.output_bytes))


# --- other memory-bound ops -------------------------------------------------------

register(
    *(
        # data movement
        "Transpose ConjugateTranspose ConcatV2 Concat Pack Unpack Split SplitV Slice StridedSlice "
        "StridedSliceGrad Pad PadV2 MirrorPad Tile BroadcastTo ReverseV2 DynamicStitch "
        "ParallelDynamicStitch ScatterNd TensorScatterUpdate OneHot Cast Snapshot CheckNumerics Fill "
        "ZerosLike OnesLike Range "
        # random number generation (integer Philox work, no floating point)
        "RandomUniform RandomStandardNormal TruncatedNormal StatelessRandomUniformV2 "
        "StatelessRandomNormalV2 StatelessTruncatedNormalV2 "
        # local response normalisation: not in the real graphs, bytes only
        "LRN LRNGrad"
    ).split(),
    kind=BYTES,
)(bytes_only)
