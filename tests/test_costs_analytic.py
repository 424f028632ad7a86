"""The analytic cost model: hand-computed FLOPs and bytes on hand-built graphs, and
(when TensorFlow is installed) agreement with TensorFlow's own FLOP statistics."""

from __future__ import annotations

import json
import math
import pathlib
from dataclasses import replace

import pytest
from realgraphs import REAL_GRAPHS, real_graph

from baechi_cli.core.devices import Device, DeviceSpec, parse_devices
from baechi_cli.core.graph import CONTROL_PORT, GraphBuilder, OpGraph
from baechi_cli.costs.analytic import RULES, estimate_costs
from baechi_cli.costs.registry import ZERO, dtype_size, register, rules_markdown

SPEC = parse_devices("2x8GB")  # RTX 2080 defaults: 10.07 TFLOP/s, 448 GB/s, 5 us launch
DEV = SPEC.devices[0]
TESTDATA = pathlib.Path(__file__).parents[1] / "testdata"


def op(b: GraphBuilder, name: str, op_type: str, *outputs, inputs=(), attrs=None) -> int:
    """Add an op whose outputs are (shape, dtype) pairs (or bare shapes: float32); wire data inputs."""
    shapes, dtypes, nbytes = [], [], []
    for out in outputs:
        shape, dtype = (
            out if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], str) else (out, "float32")
        )
        shapes.append(shape)
        dtypes.append(dtype)
        nbytes.append(dtype_size(dtype) * math.prod(shape) if shape is not None else 0)
    v = b.add_op(name, op_type, nbytes, output_shapes=shapes, output_dtypes=dtypes, attrs=attrs or {})
    for src in inputs:
        src, port = src if isinstance(src, tuple) else (src, 0)
        b.add_edge(src, v, port)
    return v


def cost(g: OpGraph, spec: DeviceSpec = SPEC):
    return estimate_costs(g, spec)


def nbytes(shape, dtype="float32") -> int:
    return dtype_size(dtype) * math.prod(shape)


# --- convolutions -----------------------------------------------------------------

# x [8,32,32,3] * filter [3,3,3,16], stride 2, SAME -> [8,16,16,16]
CONV_FLOPS = 2 * (8 * 16 * 16 * 16) * (3 * 3 * 3)


def conv_graph(data_format: str, out_known: bool = True) -> tuple[OpGraph, int]:
    """x [8,32,32,3] * filter [3,3,3,24], stride 2, SAME -> [8,16,16,24] (or NCHW)."""
    b = GraphBuilder()
    nhwc = data_format == "NHWC"
    x = op(b, "x", "Placeholder", (8, 32, 32, 3) if nhwc else (8, 3, 32, 32))
    w = op(b, "w", "Const", (3, 3, 3, 24))
    out = ((8, 16, 16, 24) if nhwc else (8, 24, 16, 16)) if out_known else None
    strides = [1, 2, 2, 1] if nhwc else [1, 1, 2, 2]
    attrs = {"strides": strides, "padding": "SAME", "data_format": data_format, "dilations": [1, 1, 1, 1]}
    c = op(b, "conv", "Conv2D", out, inputs=[x, w], attrs=attrs)
    return b.build(), c


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("out_known", [True, False])
def test_conv2d_stride2_same(data_format, out_known):
    g, c = conv_graph(data_format, out_known)
    costed, report = cost(g)
    assert report.flops[c] == 2 * (8 * 16 * 16 * 24) * (3 * 3 * 3) == 2_654_208
    assert report.fallback_ops == []
    # Reads input + filter, writes output (0 bytes when the output shape is unknown).
    out_bytes = nbytes((8, 16, 16, 24)) if out_known else 0
    assert report.bytes_accessed[c] == nbytes((8, 32, 32, 3)) + nbytes((3, 3, 3, 24)) + out_bytes
    assert costed.compute_us[c] > DEV.launch_overhead_us


@pytest.mark.parametrize(
    "padding, dilation, extra, expected_hw",
    [
        ("VALID", 1, {}, 8),  # 10 - 3 + 1
        ("VALID", 2, {}, 6),  # effective kernel 5
        ("SAME", 2, {}, 10),
        ("EXPLICIT", 1, {"explicit_paddings": [0, 0, 0, 0, 2, 2, 2, 2]}, 12),  # NCHW: pads on H, W
    ],
)
def test_conv2d_output_inferred_from_attrs_when_unknown(padding, dilation, extra, expected_hw):
    b = GraphBuilder()
    x = op(b, "x", "Placeholder", (2, 5, 10, 10))  # NCHW
    w = op(b, "w", "Const", (3, 3, 5, 7))
    attrs = {
        "strides": [1, 1, 1, 1],
        "padding": padding,
        "data_format": "NCHW",
        "dilations": [1, 1, dilation, dilation],
    }
    c = op(b, "conv", "Conv2D", None, inputs=[x, w], attrs={**attrs, **extra})
    _, report = cost(b.build())
    assert report.flops[c] == 2 * (2 * 7 * expected_hw * expected_hw) * (3 * 3 * 5)


def test_grouped_and_depthwise_conv():
    b = GraphBuilder()
    x = op(b, "x", "Placeholder", (1, 8, 8, 4))
    wg = op(b, "wg", "Const", (3, 3, 2, 8))  # 2 groups: each output sums over 2 input channels
    grouped = op(b, "grouped", "Conv2D", (1, 8, 8, 8), inputs=[x, wg], attrs={"padding": "SAME"})
    wd = op(b, "wd", "Const", (3, 3, 4, 2))  # depthwise, channel multiplier 2
    dw = op(b, "dw", "DepthwiseConv2dNative", (1, 8, 8, 8), inputs=[x, wd], attrs={"padding": "SAME"})
    _, report = cost(b.build())
    assert report.flops[grouped] == 2 * 512 * 9 * 2
    assert report.flops[dw] == 2 * 512 * 9


def test_conv2d_backprops_equal_forward_flops():
    b = GraphBuilder()
    x = op(b, "x", "Placeholder", (8, 32, 32, 3))
    w = op(b, "w", "Const", (3, 3, 3, 16))
    dy = op(b, "dy", "Placeholder", (8, 16, 16, 16))
    input_sizes = op(b, "input_sizes", "Const", ((4,), "int32"))
    filter_sizes = op(b, "filter_sizes", "Const", ((4,), "int32"))
    attrs = {"strides": [1, 2, 2, 1], "padding": "SAME", "data_format": "NHWC"}
    dx = op(b, "dx", "Conv2DBackpropInput", (8, 32, 32, 3), inputs=[input_sizes, w, dy], attrs=attrs)
    dw = op(b, "dw", "Conv2DBackpropFilter", (3, 3, 3, 16), inputs=[x, filter_sizes, dy], attrs=attrs)
    # Without an output shape the V1 filter grad cannot know the filter (input 1 is its sizes).
    dw_blind = op(b, "dw_blind", "Conv2DBackpropFilter", None, inputs=[x, filter_sizes, dy], attrs=attrs)
    _, report = cost(b.build())
    assert report.flops[dx] == CONV_FLOPS
    assert report.flops[dw] == CONV_FLOPS
    assert report.flops[dw_blind] == 0 and report.fallback_ops == ["dw_blind"]
    # input_sizes (4 x int32), filter and out_backprop read; the input gradient written.
    assert report.bytes_accessed[dx] == 16 + nbytes((3, 3, 3, 16)) + nbytes((8, 16, 16, 16)) + nbytes(
        (8, 32, 32, 3)
    )


def test_depthwise_backprops():
    b = GraphBuilder()
    x = op(b, "x", "Placeholder", (2, 8, 8, 4))
    w = op(b, "w", "Const", (3, 3, 4, 2))
    dy = op(b, "dy", "Placeholder", (2, 8, 8, 8))
    sizes = op(b, "sizes", "Const", ((4,), "int32"))
    dx = op(b, "dx", "DepthwiseConv2dNativeBackpropInput", (2, 8, 8, 4), inputs=[sizes, w, dy])
    dw = op(b, "dw", "DepthwiseConv2dNativeBackpropFilter", (3, 3, 4, 2), inputs=[x, sizes, dy])
    _, report = cost(b.build())
    assert report.flops[dx] == report.flops[dw] == 2 * (2 * 8 * 8 * 8) * 9


# --- matrix products ----------------------------------------------------------------


@pytest.mark.parametrize("out_known", [True, False])
def test_matmul_with_transposes(out_known):
    b = GraphBuilder()
    a = op(b, "a", "Placeholder", (64, 32))  # transposed: M=32, K=64
    w = op(b, "w", "Placeholder", (16, 64))  # transposed: K=64, N=16
    attrs = {"transpose_a": True, "transpose_b": True}
    m = op(b, "mm", "MatMul", (32, 16) if out_known else None, inputs=[a, w], attrs=attrs)
    _, report = cost(b.build())
    assert report.flops[m] == 2 * 32 * 16 * 64


@pytest.mark.parametrize("out_known", [True, False])
def test_batch_matmul_broadcasts_batch_dims(out_known):
    b = GraphBuilder()
    x = op(b, "x", "Placeholder", (2, 1, 5, 6))
    y = op(b, "y", "Placeholder", (3, 6, 7))
    bmm = op(b, "bmm", "BatchMatMulV2", (2, 3, 5, 7) if out_known else None, inputs=[x, y])
    xa = op(b, "xa", "Placeholder", (4, 6, 5))  # adj_x: M=5, K=6
    ya = op(b, "ya", "Placeholder", (1, 7, 6))  # adj_y: N=7
    adj = op(
        b,
        "adj",
        "BatchMatMulV3",
        (4, 5, 7) if out_known else None,
        inputs=[xa, ya],
        attrs={"adj_x": True, "adj_y": True},
    )
    _, report = cost(b.build())
    assert report.flops[bmm] == 2 * (2 * 3) * 5 * 7 * 6
    assert report.flops[adj] == 2 * 4 * 5 * 7 * 6


def test_einsum_contraction():
    b = GraphBuilder()
    x = op(b, "x", "Placeholder", (4, 10, 64))
    w = op(b, "w", "Placeholder", (64, 8, 16))
    e = op(b, "e", "Einsum", (4, 10, 8, 16), inputs=[x, w], attrs={"equation": "abc,cde->abde"})
    f = op(b, "f", "Einsum", (4, 8, 10, 10), inputs=[e, e], attrs={"equation": "...qhd,...khd->...hqk"})
    _, report = cost(b.build())
    assert report.flops[e] == 2 * 4 * 10 * 64 * 8 * 16
    assert report.flops[f] == 2 * 4 * 10 * 8 * 16 * 10


# --- roofline and devices ----------------------------------------------------------


def test_roofline_elementwise_is_memory_bound_and_matmul_compute_bound():
    b = GraphBuilder()
    x = op(b, "x", "Placeholder", (1024, 1024))
    r = op(b, "relu", "Relu", (1024, 1024), inputs=[x])
    m = op(b, "mm", "MatMul", (1024, 1024), inputs=[x, x])
    costed, report = cost(b.build())
    moved = 2 * nbytes((1024, 1024))
    assert report.flops[r] == 1024 * 1024
    assert report.flops[r] / DEV.flops < moved / DEV.memory_bandwidth
    assert costed.compute_us[r] == pytest.approx(moved / DEV.memory_bandwidth * 1e6 + DEV.launch_overhead_us)
    flops = 2 * 1024**3
    assert costed.compute_us[m] == pytest.approx(flops / DEV.flops * 1e6 + DEV.launch_overhead_us)
    assert costed.compute_us[x] == 0.0  # a Placeholder launches no kernel


def test_a_device_without_overlap_adds_compute_and_memory_time():
    b = GraphBuilder()
    x = op(b, "x", "Placeholder", (1024, 1024))
    r = op(b, "relu", "Relu", (1024, 1024), inputs=[x])
    m = op(b, "mm", "MatMul", (1024, 1024), inputs=[x, x])
    overlapping = Device(
        "/device:CPU:0", 8 * 10**9, flops=1e11, memory_bandwidth=2e10, launch_overhead_us=5.0
    )
    adding = replace(overlapping, overlap=False)
    g = b.build()
    (max_costed, report), (sum_costed, _) = (cost(g, DeviceSpec((d,))) for d in (overlapping, adding))
    for v in (r, m):
        compute = report.flops[v] / 1e11 * 1e6
        memory = report.bytes_accessed[v] / 2e10 * 1e6
        assert max_costed.compute_us[v] == pytest.approx(max(compute, memory) + 5.0)
        assert sum_costed.compute_us[v] == pytest.approx(compute + memory + 5.0)
    assert sum_costed.compute_us[x] == 0.0  # no kernel, no time, either way
    assert set(sum_costed.compute_us_by_kind) == {adding.kind} != {overlapping.kind}


def test_heterogeneous_devices_time_each_kind():
    fast = Device("/device:GPU:0", 8 * 10**9)
    slow = Device("/device:GPU:1", 8 * 10**9, flops=1e12, memory_bandwidth=100e9, launch_overhead_us=10.0)
    spec = DeviceSpec((fast, slow))
    b = GraphBuilder()
    x = op(b, "x", "Placeholder", (512, 512))
    m = op(b, "mm", "MatMul", (512, 512), inputs=[x, x])
    r = op(b, "relu", "Relu", (512, 512), inputs=[m])
    g = b.build()
    costed, report = cost(g, spec)
    assert set(costed.compute_us_by_kind) == {fast.kind, slow.kind}
    assert costed.compute_us == costed.compute_us_by_kind[fast.kind] == costed.durations(fast.kind)
    assert report.device_kind == fast.kind
    on_slow = costed.durations(slow.kind)
    assert on_slow[m] == pytest.approx(2 * 512**3 / 1e12 * 1e6 + 10.0)
    assert on_slow[r] == pytest.approx(2 * nbytes((512, 512)) / 100e9 * 1e6 + 10.0)
    assert on_slow[m] > costed.compute_us[m] and on_slow[x] == costed.compute_us[x] == 0.0
    # Homogeneous devices still get their one kind filled.
    homogeneous, _ = cost(g)
    assert list(homogeneous.compute_us_by_kind) == [DEV.kind]


def test_returns_a_new_graph_and_leaves_the_input_alone():
    b = GraphBuilder()
    x = op(b, "x", "Placeholder", (4, 4))
    op(b, "relu", "Relu", (4, 4), inputs=[x])
    g = b.build()
    costed, _ = cost(g)
    assert costed is not g and g.compute_us == [0.0, 0.0] and costed.compute_us[1] > 0
    assert costed.names is g.names and costed.edge_src is g.edge_src


def test_control_inputs_are_not_read():
    b = GraphBuilder()
    x = op(b, "x", "Placeholder", (100,))
    big = op(b, "big", "Placeholder", (10_000,))
    r = op(b, "relu", "Relu", (100,), inputs=[x])
    b.add_edge(big, r, CONTROL_PORT)
    _, report = cost(b.build())
    assert report.bytes_accessed[r] == 800


# --- variables and persistent bytes --------------------------------------------------


def test_variablev2_and_varhandleop_persistent_bytes():
    b = GraphBuilder()
    v2 = op(
        b,
        "w",
        "VariableV2",
        ((3, 3, 64, 64), "float32_ref"),
        attrs={"shape": (3, 3, 64, 64), "dtype": "float32"},
    )
    h = op(b, "h", "VarHandleOp", ((), "resource"), attrs={"shape": (10,), "dtype": "float16"})
    old = op(b, "old", "Variable", ((5, 5), "float64_ref"), attrs={"shape": None, "dtype": "float64"})
    rd = op(b, "read", "ReadVariableOp", ((10,), "float16"), inputs=[h])
    grad = op(b, "g", "Placeholder", (3, 3, 64, 64))
    lr = op(b, "lr", "Const", ())
    apply = op(b, "apply", "ApplyGradientDescent", ((3, 3, 64, 64), "float32_ref"), inputs=[v2, lr, grad])
    costed, report = cost(b.build())
    assert costed.persistent_bytes[v2] == 3 * 3 * 64 * 64 * 4
    assert costed.persistent_bytes[h] == 20
    assert costed.persistent_bytes[old] == 200  # unknown attr shape: the ref output's bytes
    assert costed.persistent_bytes[rd] == 0 and costed.compute_us[rd] == 0.0
    assert costed.compute_us[v2] == costed.compute_us[h] == 0.0
    assert report.total_persistent_bytes == 3 * 3 * 64 * 64 * 4 + 20 + 200
    # The update reads gradient, learning rate and variable, and writes the variable.
    w_bytes = nbytes((3, 3, 64, 64))
    assert report.bytes_accessed[apply] == (w_bytes + 4 + w_bytes) + w_bytes


def test_tf2_resource_placeholders_are_sized_by_their_users():
    b = GraphBuilder()
    w = op(b, "w", "Placeholder", ((), "resource"), attrs={"dtype": "resource", "shape": ()})
    m = op(b, "m", "Placeholder", ((), "resource"), attrs={"dtype": "resource", "shape": ()})
    v = op(b, "v", "Placeholder", ((), "resource"), attrs={"dtype": "resource", "shape": ()})
    read1 = op(b, "read1", "ReadVariableOp", (100, 50), inputs=[w])
    op(b, "read2", "ReadVariableOp", (100, 50), inputs=[w])  # two reads: still counted once
    grad = op(b, "grad", "Placeholder", (100, 50))
    scalars = [op(b, f"s{i}", "Const", ()) for i in range(6)]
    apply = op(b, "adam", "ResourceApplyAdam", inputs=[w, m, v, *scalars, grad])
    costed, report = cost(b.build())
    w_bytes = 100 * 50 * 4
    assert [costed.persistent_bytes[i] for i in (w, m, v)] == [w_bytes] * 3
    assert costed.persistent_bytes[read1] == 0
    assert report.total_persistent_bytes == 3 * w_bytes
    # Adam reads gradient, scalars, variable and two slots, and writes the three.
    assert report.bytes_accessed[apply] == (w_bytes + 6 * 4 + 3 * w_bytes) + 3 * w_bytes


# --- recurrent blocks ------------------------------------------------------------------

# batch 4, input size 8, cell size 16: 64 (batch, cell) elements; the gate GEMM [4, 24] @ [24, 64]
B, D, H = 4, 8, 16
LSTM_GEMM = 2 * B * (D + H) * 4 * H  # 12,288


def lstm_weights(b: GraphBuilder) -> list[int]:
    """w, wci, wcf, wco, b of an LSTM block op."""
    return [
        op(b, "w", "Placeholder", (D + H, 4 * H)),
        *(op(b, name, "Placeholder", (H,)) for name in ("wci", "wcf", "wco")),
        op(b, "bias", "Placeholder", (4 * H,)),
    ]


def test_lstm_block_cell_and_its_gradient():
    b = GraphBuilder()
    x = op(b, "x", "Placeholder", (B, D))
    cs, h = op(b, "cs", "Placeholder", (B, H)), op(b, "h", "Placeholder", (B, H))
    weights = lstm_weights(b)
    seven = [(B, H)] * 7  # i, cs, f, o, ci, co, h
    cell = op(b, "cell", "LSTMBlockCell", *seven, inputs=[x, cs, h, *weights])  # cell_clip 3 by default
    no_clip = {"use_peephole": True, "cell_clip": 0.0}
    peep = op(b, "peep", "LSTMBlockCell", *seven, inputs=[x, cs, h, *weights], attrs=no_clip)
    saved = [(cell, port) for port in range(6)]  # i, cs, f, o, ci, co
    grad_inputs = [x, cs, h, *weights, *saved, cs, h]  # ..., cs_grad, h_grad
    grad_out = [(B, H), (B, 4 * H), (H,), (H,), (H,)]
    grad = op(b, "grad", "LSTMBlockCellGrad", *grad_out, inputs=grad_inputs)
    peep_grad = op(
        b, "peep_grad", "LSTMBlockCellGrad", *grad_out, inputs=grad_inputs, attrs={"use_peephole": True}
    )
    costed, report = cost(b.build())
    # 14 gate FLOPs per element + 2 for the cell clip; peepholes add 6.
    assert report.flops[cell] == LSTM_GEMM + 16 * B * H == 13_312
    assert report.flops[peep] == LSTM_GEMM + 20 * B * H == 13_568
    # Gradient: 22 per element; peepholes add 6 per element and three weight sums of 2*4 - 1 per cell.
    assert report.flops[grad] == 22 * B * H == 1_408
    assert report.flops[peep_grad] == 28 * B * H + 3 * 7 * H == 2_128
    # Reads all inputs, writes the seven outputs.
    in_bytes = (
        nbytes((B, D)) + 2 * nbytes((B, H)) + nbytes((D + H, 4 * H)) + 3 * nbytes((H,)) + nbytes((4 * H,))
    )
    assert report.bytes_accessed[cell] == in_bytes + 7 * nbytes((B, H))
    # Scratch: xh [4, 24] and the gates [4, 64]; the gradient's do, dcs, dci, df, di.
    assert costed.temporary_bytes[cell] == nbytes((B, D + H)) + nbytes((B, 4 * H)) == 1_408
    assert costed.temporary_bytes[grad] == 5 * nbytes((B, H)) == 1_280


def test_block_lstm_runs_the_cell_per_time_step():
    b = GraphBuilder()
    steps = op(b, "seq_len_max", "Placeholder", ((), "int64"))
    x = op(b, "x", "Placeholder", (5, B, D))
    cs, h = op(b, "cs", "Placeholder", (B, H)), op(b, "h", "Placeholder", (B, H))
    inputs = [steps, x, cs, h, *lstm_weights(b)]
    seven = [(5, B, H)] * 7
    v1 = op(b, "v1", "BlockLSTM", *seven, inputs=inputs)  # cell_clip 3 by default
    v2 = op(b, "v2", "BlockLSTMV2", *seven, inputs=inputs)  # cell_clip 0 by default
    grad_out = [(5, B, D), (B, H), (B, H), (D + H, 4 * H), (H,), (H,), (H,), (4 * H,)]
    grad = op(b, "grad", "BlockLSTMGradV2", *grad_out, inputs=[*inputs, *[(v2, p) for p in range(7)], v2, v2])
    costed, report = cost(b.build())
    assert report.flops[v1] == 5 * (LSTM_GEMM + 16 * B * H) == 66_560
    assert report.flops[v2] == 5 * (LSTM_GEMM + 14 * B * H) == 65_920
    # Per step: dgates @ w^T and xh^T @ dgates accumulated into w_grad, the
    # 22 gate FLOPs, 2 gradient sums and the bias gradient (4) per element.
    assert report.flops[grad] == 5 * (2 * LSTM_GEMM + (D + H) * 4 * H + 28 * B * H) == 139_520
    assert costed.temporary_bytes[v1] == 1_408
    # xh, xh_grad [4, 24]; seven [4, 16] buffers; dgates [4, 64]
    assert costed.temporary_bytes[grad] == (2 * B * (D + H) + 7 * B * H + 4 * B * H) * 4 == 3_584


def test_gru_block_cell_and_its_gradient():
    b = GraphBuilder()
    x, h = op(b, "x", "Placeholder", (B, D)), op(b, "h", "Placeholder", (B, H))
    w_ru, w_c = op(b, "w_ru", "Placeholder", (D + H, 2 * H)), op(b, "w_c", "Placeholder", (D + H, H))
    b_ru, b_c = op(b, "b_ru", "Placeholder", (2 * H,)), op(b, "b_c", "Placeholder", (H,))
    inputs = [x, h, w_ru, w_c, b_ru, b_c]
    cell = op(b, "cell", "GRUBlockCell", *[(B, H)] * 4, inputs=inputs)
    grad_out = [(B, D), (B, H), (B, H), (B, 2 * H)]
    grad = op(b, "grad", "GRUBlockCellGrad", *grad_out, inputs=[*inputs, (cell, 0), (cell, 1), (cell, 2), h])
    costed, report = cost(b.build())
    gemms = 2 * B * (D + H) * 3 * H  # [4, 24] @ [24, 32] and [4, 24] @ [24, 16]
    assert report.flops[cell] == gemms + 10 * B * H == 9_856
    assert report.flops[grad] == gemms + 18 * B * H + B * D == 10_400
    assert costed.temporary_bytes[cell] == (2 * B * (D + H) + 2 * B * H) * 4 == 1_280
    assert costed.temporary_bytes[grad] == (3 * B * H + 2 * B * (D + H)) * 4 == 1_536


def test_cudnn_rnn_counts_every_layer_direction_and_step():
    b = GraphBuilder()
    x = op(b, "x", "Placeholder", (3, 2, 4))  # [time 3, batch 2, input 4]
    h0, c0 = op(b, "h0", "Placeholder", (2, 2, 5)), op(b, "c0", "Placeholder", (2, 2, 5))  # 2 layers
    params = op(b, "params", "Placeholder", (500,))
    outs = [(3, 2, 5), (2, 2, 5), (2, 2, 5), (100,)]
    lstm = op(b, "lstm", "CudnnRNN", *outs, inputs=[x, h0, c0, params])
    back = op(b, "back", "CudnnRNNBackprop", *outs[:3], (500,), inputs=[x, h0, c0, params, *[lstm] * 7])
    # A bidirectional one-layer GRU, batch-major: input [batch 2, time 3, input 4].
    xb = op(b, "xb", "Placeholder", (2, 3, 4))
    lengths = op(b, "lengths", "Placeholder", ((2,), "int32"))
    attrs = {"rnn_mode": "gru", "direction": "bidirectional", "time_major": False}
    gru_outs = [(2, 3, 10), (2, 2, 5), (2, 2, 5), (100,), ((), "int8")]
    gru = op(b, "gru", "CudnnRNNV3", *gru_outs, inputs=[xb, h0, c0, params, lengths], attrs=attrs)
    _, report = cost(b.build())
    # LSTM, 4 gates, hidden 5: layer 0 GEMMs 2*2*4*5*(4 + 5), layer 1 2*2*4*5*(5 + 5),
    # 21 FLOPs per (batch, unit); backward: twice the GEMMs and 31 per (batch, unit).
    layer0, layer1, ew = 720, 800, 21 * 2 * 5
    assert report.flops[lstm] == 3 * (layer0 + ew + layer1 + ew) == 5_820
    assert report.flops[back] == 3 * (2 * layer0 + 2 * layer1 + 2 * 31 * 2 * 5) == 10_980
    # GRU, 3 gates, both directions: 2 * 3 steps * (2*2*3*5*(4 + 5) + 17*2*5).
    assert report.flops[gru] == 2 * 3 * (540 + 170) == 4_260


# --- normalisation and losses --------------------------------------------------------


@pytest.mark.parametrize(
    "attrs, flops, grad_flops, temp, grad_temp",
    [
        ({}, 6 * 96, 8 * 96, 2 * 384, 3 * 384),  # is_training defaults to True; NHWC
        ({"is_training": False}, 3 * 96, 5 * 96, 0, 0),
        ({"data_format": "NCHW"}, 6 * 96, 8 * 96, 0, 0),  # cuDNN's own layout: no copies
    ],
)
def test_fused_batch_norm_and_its_gradient(attrs, flops, grad_flops, temp, grad_temp):
    b = GraphBuilder()
    x = op(b, "x", "Placeholder", (2, 4, 4, 3))  # 96 elements, 384 bytes
    c = [op(b, f"c{i}", "Placeholder", (3,)) for i in range(4)]  # scale, offset, mean, variance
    bn = op(b, "bn", "FusedBatchNormV3", (2, 4, 4, 3), *[(3,)] * 5, inputs=[x, *c], attrs=attrs)
    grad_in = [x, x, c[0], (bn, 3), (bn, 4), (bn, 5)]
    grad = op(b, "grad", "FusedBatchNormGradV3", (2, 4, 4, 3), *[(3,)] * 4, inputs=grad_in, attrs=attrs)
    costed, report = cost(b.build())
    assert report.flops[bn] == flops and report.flops[grad] == grad_flops
    assert costed.temporary_bytes[bn] == temp and costed.temporary_bytes[grad] == grad_temp
    assert report.bytes_accessed[bn] == 384 + 4 * 12 + 384 + 5 * 12


def test_softmax_cross_entropies():
    b = GraphBuilder()
    logits = op(b, "logits", "Placeholder", (4, 10))
    dense = op(b, "dense", "SoftmaxCrossEntropyWithLogits", (4,), (4, 10), inputs=[logits, logits])
    labels = op(b, "labels", "Placeholder", ((4,), "int64"))
    sparse = op(b, "sparse", "SparseSoftmaxCrossEntropyWithLogits", (4,), (4, 10), inputs=[logits, labels])
    costed, report = cost(b.build())
    assert report.flops[dense] == 10 * 40 + 4 == 404  # 10 per logit, a log per row
    assert report.flops[sparse] == 8 * 40 + 2 * 4 == 328  # 8 per logit, log and pick per row
    assert costed.temporary_bytes[dense] == costed.temporary_bytes[sparse] == 4 * 4  # one float per row
    assert report.bytes_accessed[sparse] == 160 + 32 + 16 + 160


# --- optimizer updates -----------------------------------------------------------------


@pytest.mark.parametrize(
    "op_type, n_state, n_scalars, attrs, per_element",
    [
        ("ApplyGradientDescent", 1, 1, {}, 2),
        ("ApplyMomentum", 2, 2, {}, 4),
        ("ApplyMomentum", 2, 2, {"use_nesterov": True}, 7),
        ("ResourceApplyKerasMomentum", 2, 2, {"use_nesterov": True}, 6),
        ("ResourceApplyAdam", 3, 6, {}, 12),
        ("ResourceApplyAdam", 3, 6, {"use_nesterov": True}, 15),
        ("ResourceApplyAdamWithAmsgrad", 4, 6, {}, 13),
        ("ApplyAdagrad", 2, 1, {"update_slots": False}, 4),
        ("ResourceApplyRMSProp", 3, 4, {}, 11),
        ("ApplyFtrlV2", 3, 5, {}, 20),
    ],
)
def test_optimizer_updates_count_flops_per_gradient_element(op_type, n_state, n_scalars, attrs, per_element):
    b = GraphBuilder()
    ref = not op_type.startswith("Resource")
    state = [
        op(
            b,
            f"s{i}",
            "VariableV2" if ref else "VarHandleOp",
            ((10, 20), "float32_ref") if ref else ((), "resource"),
        )
        for i in range(n_state)
    ]
    scalars = [op(b, f"k{i}", "Const", ()) for i in range(n_scalars)]
    grad = op(b, "grad", "Placeholder", (10, 20))
    apply = op(b, "apply", op_type, inputs=[*state, *scalars, grad], attrs=attrs)
    _, report = cost(b.build())
    assert report.flops[apply] == per_element * 200
    # Unchanged bytes: gradient and scalars read, variable and slots read and written.
    assert report.bytes_accessed[apply] == 800 + 4 * n_scalars + 2 * n_state * 800


def test_sparse_optimizer_update_counts_the_gradient_rows():
    b = GraphBuilder()
    var, accum = (op(b, n, "VarHandleOp", ((), "resource")) for n in ("var", "accum"))
    lr, eps = op(b, "lr", "Const", ()), op(b, "eps", "Const", ())
    grad = op(b, "grad", "Placeholder", (5, 20))  # 5 rows of a [1000, 20] table
    indices = op(b, "indices", "Placeholder", ((5,), "int64"))
    apply = op(b, "apply", "ResourceSparseApplyAdagradV2", inputs=[var, accum, lr, eps, grad, indices])
    _, report = cost(b.build())
    assert report.flops[apply] == 7 * 100
    assert report.bytes_accessed[apply] == (400 + 8 + 40 + 2 * 400) + 2 * 400


# --- embeddings' sparse gradients: scatters, segments, Unique ----------------------------


def test_scatter_updates_touch_only_the_indexed_rows():
    b = GraphBuilder()
    handle = op(b, "handle", "VarHandleOp", ((), "resource"))
    table = op(b, "table", "VariableV2", ((100, 16), "float32_ref"))
    indices = op(b, "indices", "Placeholder", ((7,), "int32"))
    updates = op(b, "updates", "Placeholder", (7, 16))
    add = op(b, "add", "ResourceScatterAdd", inputs=[handle, indices, updates])
    ref_add = op(b, "ref_add", "ScatterAdd", ((100, 16), "float32_ref"), inputs=[table, indices, updates])
    assign = op(b, "assign", "ScatterUpdate", ((100, 16), "float32_ref"), inputs=[table, indices, updates])
    dense = op(b, "dense", "Placeholder", (100, 16))
    nd_indices = op(b, "nd_indices", "Placeholder", ((7, 1), "int32"))
    tensor_add = op(b, "tensor_add", "TensorScatterAdd", (100, 16), inputs=[dense, nd_indices, updates])
    _, report = cost(b.build())
    # 1 FLOP per update element; indices and updates read, 7 rows read and written.
    assert report.flops[add] == report.flops[ref_add] == 7 * 16
    assert report.bytes_accessed[add] == report.bytes_accessed[ref_add] == (28 + 448 + 448) + 448
    assert report.flops[assign] == 0 and report.bytes_accessed[assign] == (28 + 448) + 448
    # The functional form copies the whole tensor.
    assert report.flops[tensor_add] == 112
    assert report.bytes_accessed[tensor_add] == 6400 + 28 + 448 + 6400


def test_segment_reductions():
    b = GraphBuilder()
    data = op(b, "data", "Placeholder", (10, 8))
    ids = op(b, "ids", "Placeholder", ((10,), "int32"))
    num = op(b, "num", "Const", ((), "int32"))
    unsorted = op(b, "unsorted", "UnsortedSegmentSum", (3, 8), inputs=[data, ids, num])
    table = op(b, "table", "Placeholder", (100, 8))
    indices, seg = (
        op(b, "indices", "Placeholder", ((6,), "int32")),
        op(b, "seg", "Placeholder", ((6,), "int32")),
    )
    mean = op(b, "mean", "SparseSegmentMean", (3, 8), inputs=[table, indices, seg])
    mean_grad = op(b, "mean_grad", "SparseSegmentMeanGrad", (100, 8), inputs=[mean, indices, seg, num])
    _, report = cost(b.build())
    assert report.flops[unsorted] == 80  # one add per data element
    # 6 gathered rows of 8, then a scaling per output element; reads 6 rows, not the table.
    assert report.flops[mean] == 6 * 8 + 3 * 8 == 72
    assert report.bytes_accessed[mean] == (6 * 8 * 4 + 24 + 24) + 96
    assert report.flops[mean_grad] == 2 * 6 * 8 == 96  # scale and add per scattered element


def test_unique_scratch_is_the_gpu_kernels_sort_buffers():
    b = GraphBuilder()
    x = op(b, "x", "Placeholder", ((100,), "int64"))
    unique = op(b, "unique", "Unique", ((100,), "int64"), ((100,), "int32"), inputs=[x])
    counts = op(
        b, "counts", "UniqueWithCounts", ((100,), "int64"), ((100,), "int32"), ((100,), "int32"), inputs=[x]
    )
    costed, report = cost(b.build())
    # Sorted copy (8 B) and two index arrays (4 B) per element, then three
    # (four with counts) index arrays of at most 100 unique values.
    assert costed.temporary_bytes[unique] == 100 * (8 + 2 * 4) + 3 * 100 * 4 == 2_800
    assert costed.temporary_bytes[counts] == 100 * (8 + 2 * 4) + 4 * 100 * 4 == 3_200
    assert report.flops[unique] == 0 and report.bytes_accessed[unique] == 800 + 800 + 400


# --- TensorArrays, stacks and host-side bookkeeping --------------------------------------


def test_tensor_arrays_and_stacks():
    b = GraphBuilder()
    size = op(b, "size", "Const", ((), "int32"))
    ta = op(b, "ta", "TensorArrayV3", ((2,), "resource"), ((), "float32"), inputs=[size])
    value = op(b, "value", "Placeholder", (40, 128, 512))
    indices = op(b, "indices", "Placeholder", ((40,), "int32"))
    scatter = op(
        b, "scatter", "TensorArrayScatterV3", ((), "float32"), inputs=[(ta, 0), indices, value, (ta, 1)]
    )
    read = op(b, "read", "TensorArrayReadV3", (128, 512), inputs=[(ta, 0), size, scatter])
    gather = op(b, "gather", "TensorArrayGatherV3", (40, 128, 512), inputs=[(ta, 0), indices, scatter])
    stack = op(b, "stack", "StackV2", ((2,), "resource"), inputs=[size])
    push = op(b, "push", "StackPushV2", (128, 512), inputs=[stack, read])
    pop = op(b, "pop", "StackPopV2", (128, 512), inputs=[stack])
    shape = op(b, "shape", "Const", ((4,), "int32"))
    offset = op(b, "offset", "ConcatOffset", ((4,), "int32"), ((4,), "int32"), inputs=[size, shape, shape])
    perm = op(b, "perm", "InvertPermutation", ((4,), "int32"), inputs=[shape])
    seed = op(b, "seed", "Const", ((2,), "int64"))
    key = op(b, "key", "StatelessRandomGetKeyCounter", ((1,), "uint64"), ((2,), "uint64"), inputs=[seed])
    costed, report = cost(b.build())
    big = nbytes((40, 128, 512))
    # Scatter copies the value into the array's elements; gather copies them back.
    assert report.bytes_accessed[scatter] == (160 + big + 4) + big
    assert report.bytes_accessed[gather] == (160 + 4 + big) + big
    # Handles, reads, pushes and pops pass references; the rest is host-side bookkeeping.
    for v in (ta, read, stack, push, pop, offset, perm, key):
        assert report.bytes_accessed[v] == 0 and costed.compute_us[v] == 0.0, costed.names[v]
    assert report.uncovered == []


# --- coverage -----------------------------------------------------------------------


def test_coverage_lists_unknown_op_types_as_uncovered():
    b = GraphBuilder()
    x = op(b, "x", "Placeholder", (256,))
    f = op(b, "frob", "FrobnicateV7", (256,), inputs=[x])
    r = op(b, "relu", "Relu", (256,), inputs=[f])
    t = op(b, "t", "Transpose", (256,), inputs=[r])
    costed, report = cost(b.build())
    assert report.uncovered == ["FrobnicateV7"]
    assert report.coverage == {
        "zero": {"Placeholder": 1},
        "uncovered": {"FrobnicateV7": 1},
        "flops": {"Relu": 1},
        "bytes": {"Transpose": 1},
    }
    # Uncovered: bytes only, timed like any kernel.
    assert report.flops[f] == 0 and report.bytes_accessed[f] == 2048
    assert costed.compute_us[f] == pytest.approx(2048 / DEV.memory_bandwidth * 1e6 + DEV.launch_overhead_us)
    assert report.flops[t] == 0
    js = report.to_json()
    assert js["uncovered"] == ["FrobnicateV7"] and js["total_flops"] == 256


def test_registry_and_documentation():
    assert RULES["Conv2D"].kind == "flops" and RULES["Reshape"].kind == ZERO
    assert RULES["VarHandleOp"].kind == "variable" and RULES["ResourceApplyAdam"].kind == "flops"
    with pytest.raises(ValueError, match="already has a rule"):
        register("Conv2D", kind="flops")(lambda view: None)
    coverage_md = pathlib.Path(__file__).parents[1] / "baechi_cli" / "costs" / "COVERAGE.md"
    # COVERAGE.md embeds the generated table; regenerate it when a rule changes.
    assert rules_markdown() in coverage_md.read_text(encoding="utf-8")


# --- agreement with TensorFlow ------------------------------------------------------


def _attr_value(a):
    """Decode a TF AttrValue the way the GraphDef reader does (i, f, b, s, type, shape, list)."""
    import tensorflow as tf

    def shape(s):
        return None if s.unknown_rank else tuple(d.size for d in s.dim)

    which = a.WhichOneof("value")
    if which == "s":
        return a.s.decode()
    if which in ("i", "f", "b"):
        return getattr(a, which)
    if which == "type":
        return tf.dtypes.as_dtype(a.type).name
    if which == "shape":
        return shape(a.shape)
    if which == "list":
        lst = a.list
        if lst.s:
            return [s.decode() for s in lst.s]
        if lst.type:
            return [tf.dtypes.as_dtype(t).name for t in lst.type]
        if lst.shape:
            return [shape(s) for s in lst.shape]
        return list(lst.i or lst.f or lst.b)
    return None  # tensors and functions: not needed by the cost rules


def _from_tf_graph(graph) -> OpGraph:
    """tf.Graph -> OpGraph, standing in for the GraphDef reader (same conventions)."""
    b = GraphBuilder()
    ids = {}
    ops = graph.get_operations()
    for o in ops:
        shapes, dtypes, sizes = [], [], []
        for t in o.outputs:
            shape = tuple(t.shape.as_list()) if t.shape.is_fully_defined() else None
            shapes.append(shape)
            dtypes.append(t.dtype.name)
            sizes.append(dtype_size(t.dtype.name) * math.prod(shape) if shape is not None else 0)
        attrs = {k: _attr_value(v) for k, v in o.node_def.attr.items() if not k.startswith("_")}
        ids[o.name] = b.add_op(o.name, o.type, sizes, output_shapes=shapes, output_dtypes=dtypes, attrs=attrs)
    for o in ops:
        for t in o.inputs:
            b.add_edge(ids[t.op.name], ids[o.name], t.value_index)
        for c in o.control_inputs:
            b.add_edge(ids[c.name], ids[o.name], CONTROL_PORT)
    return b.build()


@pytest.mark.tf
def test_flops_agree_with_tensorflow_statistics():
    tf = pytest.importorskip("tensorflow")
    from tensorflow.python.framework import ops as tf_ops

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 32, 32, 3], name="x")
        w1 = tf.compat.v1.get_variable("w1", [3, 3, 3, 16])
        w2 = tf.compat.v1.get_variable("w2", [3, 3, 16, 32])
        w3 = tf.compat.v1.get_variable("w3", [16 * 16 * 32, 10])
        h = tf.nn.relu(tf.nn.conv2d(x, w1, strides=2, padding="SAME"))  # [8,16,16,16]
        h = tf.nn.conv2d(h, w2, strides=1, padding="SAME")  # [8,16,16,32]
        logits = tf.matmul(tf.reshape(h, [8, -1]), w3)
        loss = tf.reduce_sum(tf.square(logits))
        tf.compat.v1.train.AdamOptimizer().minimize(loss)
        variables = tf.compat.v1.global_variables()

    g = _from_tf_graph(graph)
    _, report = estimate_costs(g, SPEC)
    checked = {}
    for o in graph.get_operations():
        theirs = tf_ops.get_stats_for_node_def(graph, o.node_def, "flops").value
        if theirs is None:
            continue
        ours = report.flops[g.index()[o.name]]
        assert ours == pytest.approx(theirs, rel=0.01), (o.name, o.type)
        checked[o.type] = checked.get(o.type, 0) + 1
    # Forward convs, both conv gradients, forward matmul and its two gradient matmuls.
    assert checked["Conv2D"] == 2 and checked["MatMul"] == 3
    assert checked["Conv2DBackpropInput"] >= 1 and checked["Conv2DBackpropFilter"] == 2
    # Variables plus Adam's slots and beta powers, each counted once.
    expected = sum(v.shape.num_elements() * v.dtype.base_dtype.size for v in variables)
    assert report.total_persistent_bytes == expected
    assert report.fallback_ops == []


@pytest.mark.tf
def test_tf2_function_graph_captures_are_sized():
    tf = pytest.importorskip("tensorflow")

    w = tf.Variable(tf.zeros([32, 10]))
    bias = tf.Variable(tf.zeros([10]))

    @tf.function
    def step(x):
        y = tf.matmul(x, w) + bias
        w.assign_sub(tf.ones([32, 10]))
        return y

    fg = step.get_concrete_function(tf.TensorSpec([4, 32], tf.float32)).graph
    g = _from_tf_graph(fg)
    _, report = estimate_costs(g, SPEC)
    resource_inputs = [
        v for v in range(g.num_ops) if g.op_types[v] == "Placeholder" and g.output_dtypes[v] == ["resource"]
    ]
    assert len(resource_inputs) == 2
    assert report.total_persistent_bytes == (32 * 10 + 10) * 4
    assert report.flops[g.op_types.index("MatMul")] == 2 * 4 * 10 * 32


@pytest.mark.parametrize(
    "name, persistent",
    [
        ("mlp", 1_881_168),  # ref variables + Momentum slots (testdata/README.md)
        ("cnn", 7_444_352),  # resource variables + Adam slots and beta powers
        ("tf2_function", (8 * 16 + 16 + 16 * 4 + 4) * 4),  # captured resource Placeholders
    ],
)
def test_committed_graphs_through_the_reader(name, persistent):
    graphdef = pytest.importorskip("baechi_cli.io.graphdef")
    path = TESTDATA / f"{name}.pb"
    costed, report = estimate_costs(graphdef.read_graphdef(str(path)), SPEC)
    assert report.total_persistent_bytes == persistent
    assert report.uncovered == [] and report.fallback_ops == []
    assert report.total_flops > 0 and all(t >= 0 for t in costed.compute_us)


# The real graphs plus the small committed ones; a graph that is not committed
# must first be generated (gnmt_static: about 10 s with TensorFlow), so its case is slow.
REAL_GRAPH_CASES = [
    name if (TESTDATA / f"{name}.pb").exists() else pytest.param(name, marks=pytest.mark.slow)
    for name in ("mlp", "cnn", *REAL_GRAPHS)
]


@pytest.mark.parametrize("name", REAL_GRAPH_CASES)
def test_every_op_type_of_the_real_graphs_has_a_rule(name):
    from baechi_cli.io.graphdef import read_graphdef

    try:
        path = real_graph(name)
    except ModuleNotFoundError as err:  # generating it needs TensorFlow or tf_keras
        pytest.skip(str(err))
    batch_size = json.loads(path.with_suffix(".json").read_text())["batch_size"]
    _, report = estimate_costs(read_graphdef(str(path), batch_size=batch_size), SPEC)
    assert report.uncovered == [] and report.fallback_ops == []


def test_malformed_attrs_fall_back_instead_of_crashing():
    b = GraphBuilder()
    x = op(b, "x", "Placeholder", (1, 8, 8, 3))
    w = op(b, "w", "Const", (3, 3, 3, 4))
    attrs = {"strides": [1, 0, 0, 1], "padding": "SAME"}  # stride 0, and no output shape
    c = op(b, "conv", "Conv2D", None, inputs=[x, w], attrs=attrs)
    v = op(b, "v", "Placeholder", (5,))
    m = op(b, "mm", "MatMul", None, inputs=[v, v])  # not matrices
    e = op(b, "e", "Einsum", (5,), inputs=[v], attrs={"equation": "ij->j"})  # rank mismatch
    _, report = cost(b.build())
    assert report.fallback_ops == ["conv", "mm", "e"]
    assert report.flops[c] == report.flops[m] == report.flops[e] == 0
    assert report.bytes_accessed[c] == nbytes((1, 8, 8, 3)) + nbytes((3, 3, 3, 4))
