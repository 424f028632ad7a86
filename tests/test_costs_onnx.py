"""ONNX cost rules: ONNX ops counted by the TensorFlow rules (the shared maths), ONNX-only rules
on their function bodies, the op-set lookup, and models exported by torch and tf2onnx.

Every single-op model is built with onnx.helper, read through ``read_onnx`` and costed with
``estimate_costs(..., op_set="onnx")``; where TensorFlow has the op, the count must equal the
TensorFlow rule's for the equivalent TensorFlow op (NHWC where ONNX is NCHW), computed here from
a hand-made TensorFlow view. Run this file as a script to print the per-model coverage table that
``baechi_cli/costs/COVERAGE.md`` embeds.
"""

from __future__ import annotations

import json
import math
import pathlib
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxmodels import ONNX_MODELS

from baechi_cli.core.devices import parse_devices
from baechi_cli.costs.analytic import count_ops, estimate_costs
from baechi_cli.costs.profile import rule_kinds
from baechi_cli.costs.registry import (
    NO_RULE,
    ONNX,
    ONNX_RULES,
    UNCOVERED,
    OpCount,
    OpView,
    dtype_size,
    rule_for,
    rules_markdown,
)
from baechi_cli.costs.rules_onnx import ALIASES, onnx_view
from baechi_cli.io.onnx import read_onnx

SPEC = parse_devices("2x8GB")
ROOT = pathlib.Path(__file__).parents[1]
TESTDATA = ROOT / "testdata"
COVERAGE_MD = ROOT / "baechi_cli" / "costs" / "COVERAGE.md"
F = TensorProto.FLOAT

Shape = tuple[int, ...]


# --- helpers ---------------------------------------------------------------------------


def cost_node(
    tmp_path: pathlib.Path,
    op_type: str,
    inputs: Sequence[Shape | np.ndarray | None],
    outputs: Sequence[Shape],
    *,
    opset: int = 17,
    domain: str = "",
    out_type: int = F,
    **attrs: Any,
) -> tuple[Any, Any, int]:
    """Cost a one-node ONNX model: ``(report, graph, the node's op id)``.

    ``inputs`` in node order: a shape is a float32 graph input, an array an
    initializer, None an omitted optional input. ``outputs``: their shapes.
    """
    feeds, inits, names = [], [], []
    for i, value in enumerate(inputs):
        if value is None:
            names.append("")
        elif isinstance(value, np.ndarray):
            inits.append(numpy_helper.from_array(value, f"w{i}"))
            names.append(f"w{i}")
        else:
            feeds.append(helper.make_tensor_value_info(f"x{i}", F, list(value)))
            names.append(f"x{i}")
    outs = [helper.make_tensor_value_info(f"y{i}", out_type, list(s)) for i, s in enumerate(outputs)]
    node = helper.make_node(op_type, names, [o.name for o in outs], domain=domain, **attrs)
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(helper.make_graph([node], "g", feeds, outs, inits), opset_imports=opsets)
    path = tmp_path / f"{op_type}.onnx"
    onnx.save_model(model, str(path))
    graph = read_onnx(str(path))
    _, report = estimate_costs(graph, SPEC, op_set=ONNX)
    assert report.fallback_ops == [] and report.uncovered == []
    return report, graph, graph.num_ops - 1


def onnx_flops(
    tmp_path: pathlib.Path, op_type: str, inputs: Sequence[Any], outputs: Sequence[Shape], **kw
) -> float:
    report, _, v = cost_node(tmp_path, op_type, inputs, outputs, **kw)
    return report.flops[v]


def tf_count(
    op_type: str, inputs: Sequence[Shape | tuple[Shape, str]], output: Shape, **attrs: Any
) -> OpCount:
    """The TensorFlow rule's count of ``op_type`` with these input shapes (float32 unless given)."""
    shapes, dtypes = [], []
    for value in inputs:
        shape, dtype = value if len(value) == 2 and isinstance(value[1], str) else (value, "float32")
        shapes.append(tuple(shape))
        dtypes.append(dtype)
    nbytes = [math.prod(s) * dtype_size(dt) for s, dt in zip(shapes, dtypes, strict=True)]
    view = OpView(op_type, attrs, shapes, dtypes, nbytes, [output], ["float32"], [math.prod(output) * 4])
    return rule_for(op_type).fn(view)


def nhwc(shape: Shape) -> Shape:
    return (shape[0], *shape[2:], shape[1])


def tf_filter(weight: Shape) -> Shape:
    """ONNX [M, C/group, *kernel] as TensorFlow's [*kernel, C/group, M]."""
    return (*weight[2:], weight[1], weight[0])


def zeros(*shape: int, dtype=np.float32) -> np.ndarray:
    return np.zeros(shape, dtype)


# --- convolutions ------------------------------------------------------------------------

# (x, weight, ONNX attrs, output); group conv, strides, pads (asymmetric too),
# dilations, auto_pad, 1-D and 3-D.
CONVS = {
    "pads": ((2, 3, 16, 16), (8, 3, 3, 3), {"pads": [1, 1, 1, 1]}, (2, 8, 16, 16)),
    "group_stride": (
        (2, 8, 16, 16),
        (12, 4, 3, 3),
        {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]},
        (2, 12, 8, 8),
    ),
    "dilations": ((1, 4, 20, 20), (6, 4, 3, 3), {"dilations": [2, 2]}, (1, 6, 16, 16)),
    "same_upper": ((1, 3, 15, 15), (5, 3, 4, 4), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, (1, 5, 8, 8)),
    "same_lower": ((1, 3, 15, 15), (5, 3, 4, 4), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}, (1, 5, 8, 8)),
    "valid": ((1, 3, 11, 11), (5, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}, (1, 5, 5, 5)),
    "asymmetric_pads": ((1, 3, 10, 10), (4, 3, 3, 3), {"pads": [0, 1, 2, 3]}, (1, 4, 10, 12)),
    "conv1d": ((2, 4, 32), (6, 4, 5), {"strides": [3]}, (2, 6, 10)),
    "conv3d": ((1, 2, 8, 8, 8), (4, 2, 3, 3, 3), {"pads": [1] * 6}, (1, 4, 8, 8, 8)),
}


@pytest.mark.parametrize("case", CONVS)
def test_conv_counts_as_tensorflow_conv(tmp_path, case):
    x, w, attrs, out = CONVS[case]
    report, _, v = cost_node(tmp_path, "Conv", [x, zeros(*w)], [out], **attrs)
    group = attrs.get("group", 1)
    assert report.flops[v] == 2 * math.prod(out) * math.prod(w[2:]) * (x[1] // group)
    tf_op = "Conv3D" if len(x) == 5 else "Conv2D"
    tf = tf_count(tf_op, [nhwc(x), tf_filter(w)], nhwc(out))
    assert report.flops[v] == tf.flops
    assert report.bytes_accessed[v] == tf.bytes_read + tf.bytes_written


@pytest.mark.parametrize("case", CONVS)
def test_conv_attrs_translate_when_the_output_shape_is_unknown(case):
    """Without an output shape the adapter's strides, dilations, pads and auto_pad decide."""
    x, w, attrs, out = CONVS[case]
    inputs = {"_input_shapes": [x, w], "_input_dtypes": ["float32", "float32"]}
    known_out = onnx_view("Conv", {**attrs, **inputs}, [out], ["float32"], [0])
    unknown_out = onnx_view("Conv", {**attrs, **inputs}, [None], [""], [0])
    rule = rule_for("Conv", ONNX)
    assert rule.fn(unknown_out).flops == rule.fn(known_out).flops > 0


def test_depthwise_conv_counts_as_depthwise_conv2d(tmp_path):
    x, w, out = (2, 8, 16, 16), (8, 1, 3, 3), (2, 8, 16, 16)
    flops = onnx_flops(tmp_path, "Conv", [x, zeros(*w)], [out], group=8, pads=[1, 1, 1, 1])
    # TensorFlow's depthwise filter: [kh, kw, in channels, multiplier].
    assert (
        flops == tf_count("DepthwiseConv2dNative", [nhwc(x), (3, 3, 8, 1)], nhwc(out)).flops == 2 * 4096 * 9
    )


def test_conv_bias_is_a_bias_add(tmp_path):
    x, w, out = (2, 3, 16, 16), (8, 3, 3, 3), (2, 8, 16, 16)
    flops = onnx_flops(tmp_path, "Conv", [x, zeros(*w), zeros(8)], [out], pads=[1, 1, 1, 1])
    tf = tf_count("Conv2D", [nhwc(x), tf_filter(w)], nhwc(out)).flops
    assert flops == tf + tf_count("BiasAdd", [nhwc(out), (8,)], nhwc(out)).flops


def test_conv_transpose_counts_as_conv2d_backprop_input(tmp_path):
    x, w, out = (1, 8, 5, 5), (8, 4, 3, 3), (1, 4, 11, 11)
    report, _, v = cost_node(tmp_path, "ConvTranspose", [x, zeros(*w)], [out], strides=[2, 2])
    # Conv2DBackpropInput: input_sizes, filter [kh, kw, out channels, in channels], out_backprop.
    tf = tf_count("Conv2DBackpropInput", [((4,), "int32"), (3, 3, 4, 8), nhwc(x)], nhwc(out))
    assert report.flops[v] == tf.flops == 2 * math.prod(x) * 9 * 4
    # Grouped: each input element feeds kernel x (out channels / group) outputs.
    flops = onnx_flops(
        tmp_path, "ConvTranspose", [x, zeros(8, 2, 3, 3)], [(1, 4, 11, 11)], strides=[2, 2], group=2
    )
    assert flops == 2 * math.prod(x) * 9 * 2


# --- matrix products -----------------------------------------------------------------------


def test_gemm_with_transposes_and_bias_counts_as_matmul_plus_bias_add(tmp_path):
    a, b, out = (8, 4), (5, 8), (4, 5)  # A^T @ B^T + C
    report, _, v = cost_node(tmp_path, "Gemm", [a, zeros(*b), zeros(5)], [out], transA=1, transB=1)
    tf = tf_count("MatMul", [a, b], out, transpose_a=True, transpose_b=True)
    assert report.flops[v] == tf.flops + tf_count("BiasAdd", [out, (5,)], out).flops == 2 * 4 * 5 * 8 + 20
    no_bias = onnx_flops(tmp_path, "Gemm", [a, zeros(*b)], [out], transA=1, transB=1)
    assert no_bias == tf.flops


@pytest.mark.parametrize(
    "a, b, out",
    [
        ((2, 1, 4, 8), (3, 8, 5), (2, 3, 4, 5)),  # broadcast batch dims
        ((4, 8), (8, 5), (4, 5)),
    ],
)
def test_batched_matmul_with_broadcasting_counts_as_batch_matmul(tmp_path, a, b, out):
    report, _, v = cost_node(tmp_path, "MatMul", [a, b], [out])
    tf = tf_count("BatchMatMulV2", [a, b], out)
    assert report.flops[v] == tf.flops == 2 * math.prod(out) * 8
    assert report.bytes_accessed[v] == tf.bytes_read + tf.bytes_written


@pytest.mark.parametrize(
    "a, b, out, as_matrices",
    [
        ((8,), (8, 5), (5,), ((1, 8), (8, 5))),
        ((4, 8), (8,), (4,), ((4, 8), (8, 1))),
        ((8,), (8,), (), ((1, 8), (8, 1))),
    ],
)
def test_matmul_of_vectors_counts_as_matmul_of_matrices(tmp_path, a, b, out, as_matrices):
    flops = onnx_flops(tmp_path, "MatMul", [a, b], [out])
    product = (as_matrices[0][0], as_matrices[1][1])
    assert flops == tf_count("MatMul", list(as_matrices), product).flops == 2 * max(math.prod(out), 1) * 8


def test_fused_matmul_counts_as_batch_matmul_with_adjoints(tmp_path):
    a, b, out = (2, 8, 4), (2, 5, 8), (2, 4, 5)  # a^T @ b^T per batch
    flops = onnx_flops(tmp_path, "FusedMatMul", [a, b], [out], domain="com.microsoft", transA=1, transB=1)
    assert flops == tf_count("BatchMatMulV2", [a, b], out, adj_x=True, adj_y=True).flops == 2 * 40 * 8


def test_einsum_counts_as_tensorflow_einsum(tmp_path):
    a, b, out = (2, 3, 4), (2, 4, 5), (2, 3, 5)
    flops = onnx_flops(tmp_path, "Einsum", [a, b], [out], equation="bij,bjk->bik")
    assert flops == tf_count("Einsum", [a, b], out, equation="bij,bjk->bik").flops == 2 * 2 * 3 * 4 * 5


# --- normalisation, pooling, recurrent blocks ------------------------------------------------


@pytest.mark.parametrize("training", [0, 1])
def test_batch_normalization_counts_as_fused_batch_norm(tmp_path, training):
    x = (2, 8, 4, 4)
    params = [zeros(8) for _ in range(4)]
    outputs = [x, (8,), (8,)] if training else [x]
    report, graph, v = cost_node(
        tmp_path, "BatchNormalization", [x, *params], outputs, opset=15, training_mode=training
    )
    tf = tf_count("FusedBatchNormV3", [nhwc(x), *[(8,)] * 4], nhwc(x), is_training=bool(training))
    assert report.flops[v] == tf.flops == (6 if training else 3) * math.prod(x)
    assert graph.temporary_bytes[v] == 0  # NCHW: no copies for cuDNN


def test_pooling_counts_as_tensorflow_pooling(tmp_path):
    x = (2, 8, 16, 16)
    flops = onnx_flops(
        tmp_path, "MaxPool", [x], [(2, 8, 8, 8)], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4
    )
    assert flops == tf_count("MaxPool", [nhwc(x)], (2, 8, 8, 8), ksize=[1, 3, 3, 1]).flops == 9 * 1024
    flops = onnx_flops(tmp_path, "AveragePool", [x], [(2, 8, 8, 8)], kernel_shape=[2, 2], strides=[2, 2])
    assert flops == tf_count("AvgPool", [nhwc(x)], (2, 8, 8, 8), ksize=[1, 2, 2, 1]).flops == 4 * 1024


def test_global_average_pool_counts_as_avg_pool_and_as_mean(tmp_path):
    x = (2, 8, 7, 7)
    flops = onnx_flops(tmp_path, "GlobalAveragePool", [x], [(2, 8, 1, 1)])
    assert flops == tf_count("AvgPool", [nhwc(x)], (2, 1, 1, 8), ksize=[1, 7, 7, 1]).flops
    # Keras' GlobalAveragePooling2D is a Mean over H and W: the same count.
    assert flops == tf_count("Mean", [nhwc(x), ((2,), "int32")], (2, 8)).flops == math.prod(x)
    assert onnx_flops(tmp_path, "GlobalMaxPool", [x], [(2, 8, 1, 1)]) == math.prod(x)


@pytest.mark.parametrize(
    "op_type, cudnn_mode, gates", [("LSTM", "lstm", 4), ("GRU", "gru", 3), ("RNN", "rnn_tanh", 1)]
)
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_recurrent_ops_count_as_cudnn_rnn(tmp_path, op_type, cudnn_mode, gates, direction):
    steps, batch, size, hidden = 5, 2, 3, 4
    dirs = 2 if direction == "bidirectional" else 1
    w, r = zeros(dirs, gates * hidden, size), zeros(dirs, gates * hidden, hidden)
    y = (steps, dirs, batch, hidden)
    flops = onnx_flops(
        tmp_path, op_type, [(steps, batch, size), w, r], [y], hidden_size=hidden, direction=direction
    )
    h = (dirs, batch, hidden)
    tf_direction = "bidirectional" if dirs == 2 else "unidirectional"
    tf = tf_count(
        "CudnnRNN", [(steps, batch, size), h, h, (1000,)], y, rnn_mode=cudnn_mode, direction=tf_direction
    )
    assert flops == tf.flops > 0


def test_rnn_with_relu_counts_as_cudnn_rnn_relu(tmp_path):
    w, r = zeros(1, 4, 3), zeros(1, 4, 4)
    flops = onnx_flops(
        tmp_path, "RNN", [(5, 2, 3), w, r], [(5, 1, 2, 4)], hidden_size=4, activations=["Relu"]
    )
    h = (1, 2, 4)
    assert flops == tf_count("CudnnRNN", [(5, 2, 3), h, h, (100,)], (5, 2, 4), rnn_mode="rnn_relu").flops


# --- elementwise, variadic, reductions, softmax ------------------------------------------------


CONDITION = np.zeros((4, 5), bool)


@pytest.mark.parametrize(
    "onnx_type, tf_type, onnx_inputs, tf_inputs",
    [
        ("Relu", "Relu", [(4, 5)], [(4, 5)]),
        ("Add", "AddV2", [(4, 5), (4, 5)], [(4, 5), (4, 5)]),
        ("Div", "RealDiv", [(4, 5), (4, 5)], [(4, 5), (4, 5)]),
        ("Where", "SelectV2", [CONDITION, (4, 5), (4, 5)], [((4, 5), "bool"), (4, 5), (4, 5)]),
    ],
)
def test_elementwise_ops_count_as_their_tensorflow_op(tmp_path, onnx_type, tf_type, onnx_inputs, tf_inputs):
    report, _, v = cost_node(tmp_path, onnx_type, onnx_inputs, [(4, 5)])
    tf = tf_count(tf_type, tf_inputs, (4, 5))
    assert report.flops[v] == tf.flops == 20
    assert report.bytes_accessed[v] == tf.bytes_read + tf.bytes_written


def test_variadic_sum_max_min_count_as_add_n(tmp_path):
    inputs = [(4, 5), (5,), (1, 5)]  # broadcast to [4, 5]
    add_n = tf_count("AddN", [(4, 5)] * 3, (4, 5)).flops
    for op_type in ("Sum", "Max", "Min"):
        assert onnx_flops(tmp_path, op_type, inputs, [(4, 5)]) == add_n == 2 * 20
    # Two operands: one op per element, as Maximum.
    assert (
        onnx_flops(tmp_path, "Max", [(4, 5), (4, 5)], [(4, 5)])
        == tf_count("Maximum", [(4, 5)] * 2, (4, 5)).flops
    )
    # Mean: the adds, then a division per element.
    mean = onnx_flops(tmp_path, "Mean", inputs, [(4, 5)])
    assert mean == add_n + tf_count("RealDiv", [(4, 5)] * 2, (4, 5)).flops == 3 * 20


def test_tensorflow_reductions_keep_their_meaning():
    """``Sum`` is a reduction in TensorFlow and a variadic add in ONNX: the op set decides."""
    assert rule_for("Sum").note == "input elements - output elements (tf)"
    assert rule_for("Sum", ONNX).shares == "AddN" and rule_for("ReduceSum", ONNX).shares == "Sum"
    assert rule_for("MatMul", ONNX).shares == "BatchMatMulV2" and rule_for("MatMul").shares == ""


@pytest.mark.parametrize(
    "onnx_type, tf_type, extra_in, extra_out",
    [
        ("ReduceSum", "Sum", (), ()),
        ("ReduceMean", "Mean", (), ()),
        ("ReduceMax", "Max", (), ()),
        ("ReduceMin", "Min", (), ()),
        ("ReduceProd", "Prod", (), ()),
        ("ReduceSumSquare", "Sum", ("Square",), ()),
        ("ReduceL1", "Sum", ("Abs",), ()),
        ("ReduceL2", "Sum", ("Square",), ("Sqrt",)),
        ("ReduceLogSum", "Sum", (), ("Log",)),
        ("ReduceLogSumExp", "Sum", ("Exp",), ("Log",)),
    ],
)
def test_reductions_count_as_tensorflow_reductions_and_their_body(
    tmp_path, onnx_type, tf_type, extra_in, extra_out
):
    x, out = (4, 6, 5), (4, 5)
    # Opset 18: the axes are an input (ReduceSum's since 13).
    flops = onnx_flops(tmp_path, onnx_type, [x, np.array([1], np.int64)], [out], opset=18, keepdims=0)
    expected = tf_count(tf_type, [x, ((1,), "int32")], out).flops
    expected += sum(tf_count(t, [x], x).flops for t in extra_in)
    expected += sum(tf_count(t, [out], out).flops for t in extra_out)
    assert flops == expected


def test_reduce_mean_with_axes_attr_and_argmax(tmp_path):
    x = (4, 6, 5)
    flops = onnx_flops(tmp_path, "ReduceMean", [x], [(4, 1, 5)], axes=[1])
    assert flops == tf_count("Mean", [x, ((1,), "int32")], (4, 5)).flops == 120
    flops = onnx_flops(tmp_path, "ArgMax", [x], [(4, 5)], out_type=TensorProto.INT64, axis=1, keepdims=0)
    assert flops == tf_count("ArgMax", [x, ((), "int32")], (4, 5)).flops == 120 - 20


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
def test_softmax_counts_as_tensorflow_softmax(tmp_path, op_type):
    flops = onnx_flops(tmp_path, op_type, [(4, 10)], [(4, 10)], axis=0)
    assert flops == tf_count(op_type, [(4, 10)], (4, 10)).flops == 5 * 40


# --- gathers ------------------------------------------------------------------------------


def test_gather_from_an_embedding_reads_only_the_rows(tmp_path):
    table, indices, out = (100, 16), np.zeros((4, 7), np.int64), (4, 7, 16)
    report, graph, v = cost_node(tmp_path, "Gather", [zeros(*table), indices], [out])
    tf = tf_count("GatherV2", [table, ((4, 7), "int64"), ((), "int32")], out)
    # Indices (the axis is an attr in ONNX, an input in TensorFlow) + rows read, output written.
    assert report.bytes_accessed[v] == tf.bytes_read - 4 + tf.bytes_written == 28 * 8 + 2 * 448 * 4
    assert graph.persistent_bytes[v] == 100 * 16 * 4 + 28 * 8  # the table and the indices: initializers


# --- ONNX-only ops: counted on their function bodies -------------------------------------------


def _model_of(nodes, inputs, outputs, inits=(), opset=18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _total_flops(tmp_path, model, name) -> float:
    path = tmp_path / f"{name}.onnx"
    onnx.save_model(model, str(path))
    _, report = estimate_costs(read_onnx(str(path)), SPEC, op_set=ONNX)
    assert report.uncovered == [] and report.fallback_ops == []
    return report.total_flops


def test_layer_normalization_costs_what_its_function_body_costs(tmp_path):
    x = helper.make_tensor_value_info("x", F, [2, 3, 8])
    y = helper.make_tensor_value_info("y", F, [2, 3, 8])
    inits = [numpy_helper.from_array(zeros(8), n) for n in ("scale", "bias")]
    fused = _model_of(
        [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"])], [x], [y], inits
    )
    assert _total_flops(tmp_path, fused, "fused") == 7 * 48 + 5 * 6
    # The opset-17 function body, node by node, each costed by its (TensorFlow) rule.
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    eps = numpy_helper.from_array(np.array(1e-5, np.float32), "eps")
    body = [
        helper.make_node("ReduceMean", ["x", "axes"], ["mean"]),
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["mean_sq"]),
        helper.make_node("Mul", ["mean", "mean"], ["sq_mean"]),
        helper.make_node("Sub", ["mean_sq", "sq_mean"], ["var"]),
        helper.make_node("Add", ["var", "eps"], ["var_eps"]),
        helper.make_node("Sqrt", ["var_eps"], ["std"]),
        helper.make_node("Sub", ["x", "mean"], ["dev"]),
        helper.make_node("Div", ["dev", "std"], ["norm"]),
        helper.make_node("Mul", ["norm", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bias"], ["y"]),
        helper.make_node("Reciprocal", ["std"], ["inv_std"]),
    ]
    inv = helper.make_tensor_value_info("inv_std", F, [2, 3, 1])
    spelled_out = _model_of(body, [x], [y, inv], [*inits, axes, eps])
    assert _total_flops(tmp_path, spelled_out, "body") == _total_flops(tmp_path, fused, "fused")


def test_layer_normalization_without_bias_and_on_an_axis(tmp_path):
    x = (2, 3, 8)
    assert onnx_flops(tmp_path, "LayerNormalization", [x, zeros(8)], [x]) == 6 * 48 + 5 * 6
    assert onnx_flops(tmp_path, "LayerNormalization", [x, zeros(3, 8)], [x], axis=1) == 6 * 48 + 5 * 2


@pytest.mark.parametrize(
    "op_type, inputs, attrs, opset, expected",
    [
        ("GroupNormalization", [(2, 6, 4, 4), zeros(6), zeros(6)], {"num_groups": 3}, 21, 7 * 192 + 4 * 6),
        ("InstanceNormalization", [(2, 6, 4, 4), zeros(6), zeros(6)], {}, 17, 7 * 192 + 4 * 12),
        ("RMSNormalization", [(2, 3, 8), zeros(8)], {}, 23, 4 * 48 + 2 * 6),
        ("MeanVarianceNormalization", [(2, 6, 4, 4)], {}, 17, 5 * 192 + 4 * 6),
        ("LpNormalization", [(2, 6, 4)], {"axis": 1}, 17, 3 * 48 + 8),
    ],
)
def test_normalizations_count_their_function_bodies(tmp_path, op_type, inputs, attrs, opset, expected):
    assert onnx_flops(tmp_path, op_type, inputs, [inputs[0]], opset=opset, **attrs) == expected


@pytest.mark.parametrize(
    "approximate, body",
    [
        (
            "none",
            [
                ("Div", ["x", "c"]),
                ("Erf", ["t0"]),
                ("Add", ["t1", "c"]),
                ("Mul", ["x", "t2"]),
                ("Mul", ["t3", "c"]),
            ],
        ),
        (
            "tanh",
            [
                ("Pow", ["x", "c"]),
                ("Mul", ["t0", "c"]),
                ("Add", ["x", "t1"]),
                ("Mul", ["t2", "c"]),
                ("Tanh", ["t3"]),
                ("Add", ["t4", "c"]),
                ("Mul", ["x", "t5"]),
                ("Mul", ["t6", "c"]),
            ],
        ),
    ],
)
def test_gelu_costs_what_its_function_body_costs(tmp_path, approximate, body):
    x = helper.make_tensor_value_info("x", F, [4, 16])
    y = helper.make_tensor_value_info("y", F, [4, 16])
    fused = _model_of([helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)], [x], [y], opset=20)
    const = numpy_helper.from_array(np.array(0.5, np.float32), "c")
    outs = [f"t{i}" for i in range(len(body) - 1)] + ["y"]
    nodes = [helper.make_node(op, ins, [out]) for (op, ins), out in zip(body, outs, strict=True)]
    spelled_out = _model_of(nodes, [x], [y], [const], opset=20)
    assert (
        _total_flops(tmp_path, fused, "fused")
        == _total_flops(tmp_path, spelled_out, "body")
        == len(body) * 64
    )


@pytest.mark.parametrize("masked", [False, True])
def test_attention_costs_what_matmul_softmax_matmul_cost(tmp_path, masked):
    b, h, sq, skv, dk, dv = 2, 4, 8, 10, 16, 32
    q = helper.make_tensor_value_info("q", F, [b, h, sq, dk])
    k = helper.make_tensor_value_info("k", F, [b, h, skv, dk])
    v = helper.make_tensor_value_info("v", F, [b, h, skv, dv])
    y = helper.make_tensor_value_info("y", F, [b, h, sq, dv])
    mask = [numpy_helper.from_array(zeros(sq, skv), "mask")] if masked else []
    fused = _model_of(
        [helper.make_node("Attention", ["q", "k", "v", "mask" if masked else ""], ["y"])],
        [q, k, v],
        [y],
        mask,
        23,
    )
    scale = numpy_helper.from_array(np.array(0.25, np.float32), "scale")
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["scaled"]),
        *([helper.make_node("Add", ["scaled", "mask"], ["masked"])] if masked else []),
        helper.make_node("Softmax", ["masked" if masked else "scaled"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    spelled_out = _model_of(nodes, [q, k, v], [y], [scale, *mask], 23)
    scores = b * h * sq * skv
    expected = 2 * scores * (dk + dv) + (6 + masked) * scores
    assert _total_flops(tmp_path, fused, "fused") == _total_flops(tmp_path, spelled_out, "body") == expected


def test_onnxruntime_attention_counts_projection_and_attention(tmp_path):
    batch, seq, hidden, heads = 2, 6, 16, 4
    inputs = [(batch, seq, hidden), zeros(hidden, 3 * hidden), zeros(3 * hidden)]
    flops = onnx_flops(
        tmp_path, "Attention", inputs, [(batch, seq, hidden)], domain="com.microsoft", num_heads=heads
    )
    projection = 2 * batch * seq * hidden * 3 * hidden + batch * seq * 3 * hidden  # with its bias
    products = 2 * 2 * seq * (batch * seq * hidden)  # Q @ K^T and P @ V
    assert flops == projection + products + 6 * batch * heads * seq * seq


def test_onnx_only_elementwise_ops_state_flops_per_element(tmp_path):
    for op_type, per_element in [("HardSigmoid", 4), ("HardSwish", 5), ("Mish", 3), ("CumSum", 1)]:
        inputs = [(4, 5), np.array(0, np.int64)] if op_type == "CumSum" else [(4, 5)]
        assert onnx_flops(tmp_path, op_type, inputs, [(4, 5)], opset=18) == per_element * 20
        assert f"{per_element} FLOP" in rule_for(op_type, ONNX).note


# --- persistent bytes, coverage, the lookup ---------------------------------------------------


def _small_cnn(tmp_path) -> Any:
    """x[2,3,8,8] -> Conv(4 3x3, pad 1, bias) -> Relu -> MaxPool 2x2 -> Reshape -> Gemm(64->10, bias)."""
    inits = [
        numpy_helper.from_array(zeros(4, 3, 3, 3), "w"),
        numpy_helper.from_array(zeros(4), "b"),
        numpy_helper.from_array(np.array([0, -1], np.int64), "s"),
        numpy_helper.from_array(zeros(10, 64), "W"),
        numpy_helper.from_array(zeros(10), "B"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Reshape", ["p", "s"], ["f"]),
        helper.make_node("Gemm", ["f", "W", "B"], ["y"], transB=1),
    ]
    x = helper.make_tensor_value_info("x", F, [2, 3, 8, 8])
    y = helper.make_tensor_value_info("y", F, [2, 10])
    path = tmp_path / "cnn.onnx"
    onnx.save_model(_model_of(nodes, [x], [y], inits, opset=17), str(path))
    return read_onnx(str(path))


def test_estimate_costs_keeps_the_readers_persistent_bytes(tmp_path):
    graph = _small_cnn(tmp_path)
    assert graph.persistent_bytes == [0, 448, 0, 0, 16, 2600]
    costed, report = estimate_costs(graph, SPEC, op_set=ONNX)
    assert costed.persistent_bytes == graph.persistent_bytes
    assert report.total_persistent_bytes == 448 + 16 + 2600
    conv = 2 * (2 * 4 * 8 * 8) * 27 + 2 * 4 * 8 * 8
    gemm = 2 * 2 * 10 * 64 + 20
    assert report.flops == [0, conv, 512, 4 * 128, 0, gemm]
    # Conv reads x and its weights (from the initializers, which make no edges).
    assert report.bytes_accessed[1] == 2 * 3 * 64 * 4 + 432 + 16 + 2 * 4 * 64 * 4
    assert report.coverage == {
        "zero": {"Input": 1, "Reshape": 1},
        "flops": {"Conv": 1, "Relu": 1, "MaxPool": 1, "Gemm": 1},
    }
    assert rule_kinds(costed, report, ONNX) == ["zero", "flops", "flops", "flops", "zero", "flops"]
    # The TensorFlow table knows none of Conv, Gemm, MaxPool's ONNX attrs or Input.
    assert rule_kinds(costed, report) == ["uncovered", "uncovered", "flops", "flops", "zero", "uncovered"]


def test_uncovered_onnx_op_types_are_listed(tmp_path):
    x = helper.make_tensor_value_info("x", F, [3, 4, 4])
    y = helper.make_tensor_value_info("y", F, [3])
    path = tmp_path / "det.onnx"
    onnx.save_model(_model_of([helper.make_node("Det", ["x"], ["y"])], [x], [y], opset=17), str(path))
    graph = read_onnx(str(path))
    _, report = estimate_costs(graph, SPEC, op_set=ONNX)
    assert report.uncovered == ["Det"] and report.coverage == {"zero": {"Input": 1}, UNCOVERED: {"Det": 1}}
    assert report.bytes_accessed[1] == 48 * 4 + 3 * 4
    assert rule_for("Det", ONNX) is NO_RULE


def test_unknown_op_set_is_an_error(tmp_path):
    graph = _small_cnn(tmp_path)
    with pytest.raises(ValueError, match="unknown op set 'caffe'"):
        count_ops(graph, "caffe")
    with pytest.raises(ValueError, match="unknown op set"):
        rule_for("Conv", "caffe")


def test_onnx_view_sizes_inputs_from_the_reader_attrs():
    attrs = {"_input_shapes": [(5,), None, (2, 3)], "_input_dtypes": ["int4", "", "float16"]}
    view = onnx_view("DequantizeLinear", attrs, [(5,)], ["float32"], [20])
    assert view.input_bytes == [3, 0, 12]  # int4 packs two per byte; an omitted input is 0
    assert view.input_shapes == [(5,), None, (2, 3)]


def test_every_alias_names_a_tensorflow_rule_of_its_kind():
    for onnx_type, alias in ALIASES.items():
        entry = ONNX_RULES[onnx_type]
        assert entry.shares == alias.rule and entry.kind == rule_for(alias.rule).kind
        assert entry.note.startswith(f"TF rule: {rule_for(alias.rule).note}")


# --- control flow: If, Loop, Scan count their subgraphs' nodes --------------------------------


def _costed(tmp_path, model, name="m"):
    path = tmp_path / f"{name}.onnx"
    onnx.save_model(model, str(path))
    graph = read_onnx(str(path))
    costed, report = estimate_costs(graph, SPEC, op_set=ONNX)
    return graph, costed, report


def _branch(name, nodes, output):
    """An If branch: ``nodes``, no inputs, ``output`` declared without a shape (inference gives it)."""
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(output, F, None)])


def test_if_counts_both_branches_and_its_own_bytes(tmp_path):
    """then: x[4,8] @ W[8,16]; else: Relu(z[4,16]). Both branches' FLOPs and bytes, plus the If's own."""
    then_g = _branch("then", [helper.make_node("MatMul", ["x", "W"], ["t"])], "t")
    else_g = _branch("else", [helper.make_node("Relu", ["z"], ["e"])], "e")
    node = helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)
    inputs = [
        helper.make_tensor_value_info("c", TensorProto.BOOL, []),
        helper.make_tensor_value_info("x", F, [4, 8]),
        helper.make_tensor_value_info("z", F, [4, 16]),
    ]
    model = _model_of(
        [node],
        inputs,
        [helper.make_tensor_value_info("y", F, [4, 16])],
        [numpy_helper.from_array(zeros(8, 16), "W")],
    )
    graph, costed, report = _costed(tmp_path, model)
    v = graph.names.index("if")
    matmul = tf_count("BatchMatMulV2", [(4, 8), (8, 16)], (4, 16))
    relu = tf_count("Relu", [(4, 16)], (4, 16))
    assert report.flops[v] == matmul.flops + relu.flops == 2 * 4 * 8 * 16 + 4 * 16
    own = 1 + 4 * 16 * 4  # reads the condition, writes y
    inner = matmul.bytes_read + matmul.bytes_written + relu.bytes_read + relu.bytes_written
    assert report.bytes_accessed[v] == own + inner
    assert report.coverage == {"zero": {"Input": 3}, "flops": {"If": 1, "MatMul": 1, "Relu": 1}}
    assert report.fallback_ops == [] and rule_kinds(costed, report, ONNX)[v] == "flops"
    # The registered rule, called on its own, counts the same.
    view = onnx_view(
        "If", graph.attrs[v], graph.output_shapes[v], graph.output_dtypes[v], graph.output_bytes[v]
    )
    assert rule_for("If", ONNX).fn(view).flops == report.flops[v]


def _loop(body_nodes, v_shape, trip_count=3, body_inits=()):
    """Loop(M, "", v) over a body reading v_in [v_shape] and writing v_out; cond passed through."""
    body = helper.make_graph(
        [*body_nodes, helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", F, v_shape),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", F, None),
        ],
        list(body_inits),
    )
    node = helper.make_node("Loop", ["M", "", "v"], ["y"], name="loop", body=body)
    return _model_of(
        [node],
        [helper.make_tensor_value_info("v", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, [2, 3])],
        [numpy_helper.from_array(np.array(trip_count, np.int64), "M")],
    )


@pytest.mark.parametrize("trip_count", [1, 10])
def test_a_loop_body_is_counted_once_whatever_the_trip_count(tmp_path, trip_count):
    """Body v_out = v_in[2,3] @ B[3,3]: one MatMul's FLOPs, 1 or 10 iterations alike."""
    mm = helper.make_node("MatMul", ["v_in", "B"], ["v_out"])
    model = _loop([mm], [2, 3], trip_count, [numpy_helper.from_array(zeros(3, 3), "B")])
    graph, costed, report = _costed(tmp_path, model)
    v = graph.names.index("loop")
    matmul = tf_count("BatchMatMulV2", [(2, 3), (3, 3)], (2, 3))
    assert report.flops[v] == matmul.flops == 2 * 2 * 3 * 3
    own = 8 + 24 + 24  # reads M and v, writes y
    assert report.bytes_accessed[v] == own + matmul.bytes_read + matmul.bytes_written  # Identity: zero
    assert report.coverage["flops"] == {"Loop": 1, "MatMul": 1} and report.coverage["zero"]["Identity"] == 1
    assert costed.persistent_bytes[v] == 8 + 36  # M and the body's B, as the reader put them


def test_a_scan_body_is_counted_once(tmp_path):
    """Scan over xs[5,4]: state s + x_t and x_t[4] @ W[4,3], counted for one step (the body once)."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
            helper.make_node("MatMul", ["x_t", "W"], ["y_t"]),
        ],
        "body",
        [helper.make_tensor_value_info("s_in", F, None), helper.make_tensor_value_info("x_t", F, None)],
        [helper.make_tensor_value_info("s_out", F, None), helper.make_tensor_value_info("y_t", F, None)],
    )
    node = helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], name="scan", num_scan_inputs=1, body=body)
    model = _model_of(
        [node],
        [helper.make_tensor_value_info("s0", F, [4]), helper.make_tensor_value_info("xs", F, [5, 4])],
        [helper.make_tensor_value_info("s", F, [4]), helper.make_tensor_value_info("ys", F, [5, 3])],
        [numpy_helper.from_array(zeros(4, 3), "W")],
    )
    graph, _, report = _costed(tmp_path, model)
    # ONNX's Scan inference gives the body its per-step shapes: s_in [4], x_t [4].
    assert report.flops[graph.names.index("scan")] == 4 + 2 * 4 * 3
    assert report.fallback_ops == []


def _nested(then_op="Relu", v_shape=(2, 3)):
    """Loop body: m = v_in @ B; v_out = If(cond_in, then: then_op(m), else: Neg(m))."""
    then_g = _branch("then", [helper.make_node(then_op, ["m"], ["t"])], "t")
    else_g = _branch("else", [helper.make_node("Neg", ["m"], ["e"])], "e")
    nodes = [
        helper.make_node("MatMul", ["v_in", "B"], ["m"]),
        helper.make_node("If", ["cond_in"], ["v_out"], then_branch=then_g, else_branch=else_g),
    ]
    shape = None if v_shape is None else list(v_shape)
    return _loop(nodes, shape, body_inits=[numpy_helper.from_array(zeros(3, 3), "B")])


def test_nested_control_flow_counts_every_level(tmp_path):
    """The Loop counts its body's MatMul and its nested If's two branches; coverage lists them all."""
    graph, _, report = _costed(tmp_path, _nested())
    v = graph.names.index("loop")
    assert report.flops[v] == 2 * 2 * 3 * 3 + 6 + 6  # MatMul, Relu, Neg
    assert report.coverage == {
        "zero": {"Input": 1, "Identity": 1},
        "flops": {"Loop": 1, "MatMul": 1, "If": 1, "Relu": 1, "Neg": 1},
    }
    assert report.fallback_ops == []


def test_an_inner_node_without_a_rule_is_uncovered_and_counts_its_bytes(tmp_path):
    """Det in a branch has no rule: bytes only, listed in coverage and uncovered as a top-level op would be."""
    det = helper.make_node("Det", ["sq"], ["d"])
    then_g = _branch("then", [helper.make_node("MatMul", ["x", "x"], ["t"]), det], "t")
    else_g = _branch("else", [helper.make_node("Neg", ["x"], ["e"])], "e")
    node = helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)
    inputs = [
        helper.make_tensor_value_info("c", TensorProto.BOOL, []),
        helper.make_tensor_value_info("x", F, [3, 3]),
        helper.make_tensor_value_info("sq", F, [2, 4, 4]),
    ]
    model = _model_of([node], inputs, [helper.make_tensor_value_info("y", F, [3, 3])])
    graph, _, report = _costed(tmp_path, model)
    v = graph.names.index("if")
    assert report.uncovered == ["Det"] and report.coverage[UNCOVERED] == {"Det": 1}
    assert report.fallback_ops == []
    assert report.flops[v] == 2 * 3 * 3 * 3 + 9  # MatMul and Neg; Det none
    det_bytes = 2 * 16 * 4 + 2 * 4  # reads sq, writes d [2]
    matmul_bytes = 2 * 36 + 36
    assert report.bytes_accessed[v] == (1 + 36) + det_bytes + matmul_bytes + (36 + 36)


def test_an_inner_node_its_rule_cannot_count_falls_back_by_path(tmp_path):
    """With the loop-carried shape unknown (ONNX's Loop inference drops it), the body's MatMul and the
    nested branches cannot be counted: bytes only, each in fallback_ops by its path through the ops."""
    graph, costed, report = _costed(tmp_path, _nested(v_shape=None))
    v = graph.names.index("loop")
    assert report.fallback_ops == [
        "loop/body/MatMul_0",
        "loop/body/If_1/else_branch/Neg_0",
        "loop/body/If_1/then_branch/Relu_0",
    ]
    assert report.flops[v] == 0
    # own, B read by the MatMul, the nested If's condition
    assert report.bytes_accessed[v] == (8 + 24 + 24) + 36 + 1
    # the top-level op is not a fallback itself: its rule counted it
    assert rule_kinds(costed, report, ONNX)[v] == "flops"


def test_temporary_bytes_are_the_largest_inner_nodes(tmp_path):
    """Unique over 6 and over 10 elements in the two branches: the If's scratch is the larger, not the sum."""
    then_g = _branch("then", [helper.make_node("Unique", ["a"], ["ua", "ia", "va", "ca"])], "ua")
    else_g = _branch("else", [helper.make_node("Unique", ["b"], ["ub", "ib", "vb", "cb"])], "ub")
    node = helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)
    inputs = [
        helper.make_tensor_value_info("c", TensorProto.BOOL, []),
        helper.make_tensor_value_info("a", F, [6]),
        helper.make_tensor_value_info("b", F, [10]),
    ]
    model = _model_of([node], inputs, [helper.make_tensor_value_info("y", F, [None])])
    graph, costed, _ = _costed(tmp_path, model)
    records = graph.attrs[graph.names.index("if")]["_subgraph_nodes"]
    scratch = [
        rule_for("Unique", ONNX).fn(
            onnx_view(r.op_type, r.attrs, r.output_shapes, r.output_dtypes, r.output_bytes)
        )
        for r in records
    ]
    assert [s.temporary_bytes for s in scratch] == [52 * 10, 52 * 6]  # else first: attribute order
    assert costed.temporary_bytes[graph.names.index("if")] == 52 * 10


def test_torch_scripted_loop_with_an_if_reads_and_costs(tmp_path):
    """torch.jit.script of a loop over a Linear with an if inside, by the legacy exporter: a Loop whose body
    holds a nested If; every inner node counted, none falls back."""
    torch = pytest.importorskip("torch")

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x, n: int):
            for _ in range(n):
                x = self.lin(x)
                if x.sum() > 0:
                    x = torch.relu(x)
                else:
                    x = -x
            return x

    path = tmp_path / "loop.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        torch.onnx.export(
            torch.jit.script(Model()), (torch.randn(4, 8), 3), str(path), dynamo=False, opset_version=17
        )
    # The exporter names the Loop output's dims (data-dependent to it): bind them to [4, 8].
    out = onnx.load(str(path), load_external_data=False).graph.output[0].type.tensor_type.shape.dim
    dims = {d.dim_param: size for d, size in zip(out, (4, 8), strict=True) if d.dim_param}
    graph = read_onnx(str(path), dims=dims)
    _, report = estimate_costs(graph, SPEC, op_set=ONNX)
    assert report.uncovered == [] and report.fallback_ops == []
    assert {"Loop", "Gemm", "If", "Relu", "Neg"} <= set(report.coverage["flops"])
    loop = graph.op_types.index("Loop")
    gemm = 2 * 4 * 8 * 8 + 4 * 8  # with its bias
    branches = 4 * 8 + 4 * 8  # Relu and Neg
    condition = (4 * 8 - 1) + 1  # ReduceSum to a scalar, Greater
    assert report.flops[loop] == gemm + branches + condition


# --- real exported models ---------------------------------------------------------------------


# The committed ONNX test models whose graph is here (external weights are not needed).
MODELS = {model.name: model for model in ONNX_MODELS if model.path.exists()}


def _costed_model(name: str) -> tuple[Any, Any]:
    model = MODELS[name]
    graph = read_onnx(str(model.path), **model.read_options)
    return graph, estimate_costs(graph, SPEC, op_set=ONNX)[1]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_op_type_of_the_onnx_test_models_has_a_rule(name):
    _, report = _costed_model(name)
    assert report.uncovered == [] and report.fallback_ops == []
    assert report.total_flops > 0


# tf2onnx's export of a Keras model, and TensorFlow's own training graph of the same model.
KERAS_IN_BOTH_DIALECTS = [
    (onnx_name, tf_name)
    for onnx_name, tf_name in [("keras_resnet50", "resnet50"), ("keras_inception_v3", "inception_v3")]
    if onnx_name in MODELS and (TESTDATA / f"{tf_name}.pb").exists()
]


@pytest.mark.parametrize("onnx_name, tf_name", KERAS_IN_BOTH_DIALECTS)
def test_a_keras_model_has_the_same_conv_and_matmul_flops_in_both_dialects(onnx_name, tf_name):
    from baechi_cli.io.graphdef import read_graphdef

    graph, report = _costed_model(onnx_name)
    ops = [v for v in range(graph.num_ops) if graph.op_types[v] in ("Conv", "Gemm")]
    # tf2onnx folds batch norm into the Conv's bias: Keras' BiasAdd and batch norm are other ops in TF.
    biases = sum(
        math.prod(graph.output_shapes[v][0]) for v in ops if len(graph.attrs[v]["_input_shapes"]) > 2
    )
    onnx_flops_total = sum(report.flops[v] for v in ops) - biases

    batch_size = json.loads((TESTDATA / f"{tf_name}.json").read_text())["batch_size"]
    tf_graph = read_graphdef(str(TESTDATA / f"{tf_name}.pb"), batch_size=batch_size)
    _, tf_report = estimate_costs(tf_graph, SPEC)
    forward = [
        v
        for v in range(tf_graph.num_ops)
        if tf_graph.op_types[v] in ("Conv2D", "MatMul") and not tf_graph.names[v].startswith("gradients/")
    ]
    assert onnx_flops_total == sum(tf_report.flops[v] for v in forward) > 0


def onnx_coverage_markdown() -> str:
    """COVERAGE.md's table of the ONNX test models: ops per rule kind, FLOPs, persistent bytes."""
    lines = [
        "| model | input | ops | op types | flops | bytes | zero | uncovered | fallback | GFLOPs | persistent bytes |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in sorted(MODELS):
        graph, report = _costed_model(name)
        feeds = ", ".join(
            f"{graph.names[v]} {list(graph.output_shapes[v][0])}"
            for v in range(graph.num_ops)
            if graph.op_types[v] == "Input"
        )
        per_kind = {kind: (sum(types.values()), len(types)) for kind, types in report.coverage.items()}
        cells = [
            f"{per_kind[k][0]:,} ({per_kind[k][1]})" if k in per_kind else "0"
            for k in ("flops", "bytes", "zero")
        ]
        lines.append(
            f"| {name} | {feeds} | {graph.num_ops:,} | {len(set(graph.op_types))} | {' | '.join(cells)} "
            f"| {per_kind.get(UNCOVERED, (0, 0))[0]} | {len(report.fallback_ops)} "
            f"| {report.total_flops / 1e9:.3f} | {report.total_persistent_bytes:,} |"
        )
    return "\n".join(lines) + "\n"


def test_coverage_md_has_the_onnx_tables():
    text = COVERAGE_MD.read_text(encoding="utf-8")
    assert rules_markdown(ONNX) in text  # regenerate: see COVERAGE.md
    if MODELS:
        assert onnx_coverage_markdown() in text  # regenerate: python tests/test_costs_onnx.py


def test_torch_resnet_flops_are_twice_its_multiply_adds(tmp_path):
    """A ResNet-18 exported by torch (legacy exporter, BN folded): FLOPs = 2 x conv and fc MACs, within 1%."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                nn.BatchNorm2d(cout),
            )
            self.shortcut = (
                nn.Identity()
                if stride == 1 and cin == cout
                else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            )

        def forward(self, x):
            return torch.relu(self.body(x) + self.shortcut(x))

    widths = (64, 128, 256, 512)
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    for i, (cin, cout) in enumerate(zip((64, *widths), widths)):
        layers += [Block(cin, cout, 1 if i == 0 else 2), Block(cout, cout, 1)]
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)).eval()
    images = torch.randn(2, 3, 64, 64)

    macs = []

    def count(module, inputs, output):
        if isinstance(module, nn.Conv2d):
            macs.append(output.numel() * module.in_channels // module.groups * math.prod(module.kernel_size))
        elif isinstance(module, nn.Linear):
            macs.append(output.numel() * module.in_features)

    hooks = [m.register_forward_hook(count) for m in model.modules()]
    with torch.no_grad():
        model(images)
    for hook in hooks:
        hook.remove()

    path = tmp_path / "resnet18.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        torch.onnx.export(model, (images,), str(path), dynamo=False, opset_version=17)
    graph = read_onnx(str(path))
    _, report = estimate_costs(graph, SPEC, op_set=ONNX)
    assert report.uncovered == [] and report.fallback_ops == []
    assert {"Conv", "Gemm", "MaxPool", "GlobalAveragePool", "Relu", "Add"} <= set(graph.op_types)
    assert report.total_flops == pytest.approx(2 * sum(macs), rel=0.01)


if __name__ == "__main__":
    print(onnx_coverage_markdown(), end="")


def test_a_pooling_window_larger_than_its_input_is_clipped():
    """transformers' EfficientNet pools with nn.AvgPool2d(1280, ceil_mode=True) over 7x7: 49
    elements an output, not 1280^2 (which priced the pool at 72 ms of a 374 ms step)."""
    from baechi_cli.costs.registry import count_view, rule_for
    from baechi_cli.costs.rules_onnx import onnx_view

    def flops(kernel, pads=None):
        attrs = {"kernel_shape": kernel, "_input_shapes": [(8, 1280, 7, 7)], "_input_dtypes": ["float32"]}
        if pads:
            attrs["pads"] = pads
        view = onnx_view("AveragePool", attrs, [(8, 1280, 1, 1)], ["float32"], [8 * 1280 * 4])
        return count_view(rule_for("AveragePool", "onnx"), view)[0].flops

    assert flops([1280, 1280]) == flops([7, 7]) == 49 * 8 * 1280
    assert flops([9, 9], pads=[1, 1, 1, 1]) == 81 * 8 * 1280
