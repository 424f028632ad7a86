"""baechi_cli.passes.training: a training step synthesized from a forward-only graph."""

from __future__ import annotations

import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import dags, is_topological

from baechi_cli.core.devices import parse_devices
from baechi_cli.core.errors import InputError
from baechi_cli.core.graph import CONTROL_PORT, GraphBuilder, OpGraph
from baechi_cli.evaluator.sim import simulate
from baechi_cli.passes.forward_only import forward_only
from baechi_cli.passes.training import (
    LOSS_OP,
    LOSS_TEMPORARIES,
    OPTIMIZER_SLOTS,
    STEP_OP,
    UPDATE_OP,
    needs_gradient,
    synthesize_training,
)

DEVICES = parse_devices("2x8GB")
F32 = ["float32"]


def cnn() -> tuple[OpGraph, list[str]]:
    """x -> conv(W) -> relu -> fc(W) -> out, plus an integer Shape op off conv's output.

    Returns the graph and each op's cost-rule kind.
    """
    b = GraphBuilder()
    x = b.add_op("x", "Input", [4000], output_dtypes=F32)
    conv = b.add_op("conv", "Conv", [8000], compute_us=20.0, persistent_bytes=1200, output_dtypes=F32)
    relu = b.add_op("relu", "Relu", [8000], compute_us=2.0, output_dtypes=F32)
    shape = b.add_op("shape", "Shape", [32], output_dtypes=["int64"])
    reshape = b.add_op("flat", "Reshape", [8000], output_dtypes=F32)
    fc = b.add_op("fc", "Gemm", [400], compute_us=10.0, persistent_bytes=80_400, output_dtypes=F32)
    for s, d in ((x, conv), (conv, relu), (relu, shape), (relu, reshape), (shape, reshape), (reshape, fc)):
        b.add_edge(s, d)
    return b.build(), ["zero", "flops", "flops", "zero", "zero", "flops"]


def test_which_ops_need_a_gradient():
    g, _ = cnn()
    # inputs never; integer shape arithmetic never; everything downstream of a weight
    assert needs_gradient(g) == [False, True, True, False, True, True]


def test_backward_ops_mirror_the_forward_graph():
    g, kinds = cnn()
    t = synthesize_training(g, DEVICES, kinds, "sgd")
    n = g.num_ops
    assert t.names[:n] == g.names and t.op_types[:n] == g.op_types
    names = t.index()
    # the loss on the model's output, one backward op per op that needs a gradient, in reverse
    # topological order, then the updates
    assert t.names[n:] == [
        "loss/fc",
        "gradients/fc",
        "gradients/flat",
        "gradients/relu",
        "gradients/conv",
        "optimizer/step",
        "optimizer/conv",
        "optimizer/fc",
    ]
    for v in range(n, t.num_ops):
        f = t.forward_op[v]
        assert t.is_backward[v] and f >= 0 and not t.is_backward[f]
        assert t.group[v] == t.group[f]  # autograd runs a backward where its forward ran
    assert not any(t.is_backward[:n])
    assert t.op_types[names["gradients/conv"]] == "ConvGrad"
    assert t.op_types[names["optimizer/fc"]] == "ApplyGradientDescent"

    def edges_into(op: str) -> list[tuple[str, int, int]]:
        v = names[op]
        return sorted((t.names[t.edge_src[e]], t.edge_port[e], t.edge_bytes[e]) for e in t.in_edges[v])

    # reversed data edges carry gradients the size of the activations; what autograd saves is
    # kept alive until the backward op: Gemm and Conv their data input, Relu its output, views
    # (Reshape) nothing; a control edge orders each backward op after its forward op.
    assert edges_into("loss/fc") == [("fc", 0, 400)]
    assert edges_into("gradients/fc") == [("fc", CONTROL_PORT, 0), ("flat", 0, 8000), ("loss/fc", 0, 400)]
    assert edges_into("gradients/flat") == [("flat", CONTROL_PORT, 0), ("gradients/fc", 0, 8000)]
    assert edges_into("gradients/relu") == [
        ("gradients/flat", 0, 8000),
        ("relu", CONTROL_PORT, 0),
        ("relu", 0, 8000),
    ]
    assert edges_into("gradients/conv") == [
        ("conv", CONTROL_PORT, 0),
        ("gradients/relu", 0, 8000),
        ("x", 0, 4000),
    ]
    # the parameter gradient buffer is the last port, the size of the parameters
    assert t.output_bytes[names["gradients/fc"]] == [8000, 80_400]
    assert t.output_bytes[names["gradients/conv"]] == [1200]  # the input needs no gradient: dW only
    # updates wait for opt.step(), which waits for the end of the backward pass
    assert edges_into("optimizer/conv") == [("gradients/conv", 0, 1200), ("optimizer/step", CONTROL_PORT, 0)]
    assert edges_into("optimizer/fc") == [("gradients/fc", 1, 80_400), ("optimizer/step", CONTROL_PORT, 0)]
    assert edges_into("optimizer/step") == [("gradients/conv", CONTROL_PORT, 0)]
    t.topo_order()  # still a DAG


def test_backward_compute_multipliers():
    g, kinds = cnn()
    t = synthesize_training(g, DEVICES, kinds, "sgd")
    us = dict(zip(t.names, t.compute_us))
    assert us["gradients/fc"] == 2 * us["fc"]  # dX and dW
    assert us["gradients/conv"] == us["conv"]  # first layer: dW only
    assert us["gradients/relu"] == us["relu"]
    assert us["gradients/flat"] == 0.0  # the gradient of a view is a view


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_optimizer_state_and_update_cost(optimizer: str):
    g, kinds = cnn()
    t = synthesize_training(g, DEVICES, kinds, optimizer)
    names = t.index()
    slots = OPTIMIZER_SLOTS[optimizer]
    assert t.persistent_bytes[names["optimizer/fc"]] == slots * 80_400
    assert t.persistent_bytes[names["optimizer/conv"]] == slots * 1200
    assert sum(t.persistent_bytes) == (1 + slots) * (80_400 + 1200)
    # the update is timed as PyTorch runs it: per float32 element, sgd's add_ reads 2 and
    # writes 1; momentum's mul_, add_, add_ read 5 and write 3; Adam's lerp_, mul_, addcmul_,
    # sqrt, div, add_, addcdiv_ read 11 and write 7 (torch/optim/adam.py), a few FLOPs each
    reads, writes, flops = {"sgd": (2, 1, 2), "momentum": (5, 3, 4), "adam": (11, 7, 13)}[optimizer]
    elements = 80_400 // 4
    device = DEVICES.devices[0]
    expected = max(flops * elements / device.flops, (reads + writes) * 80_400 / device.memory_bandwidth)
    assert t.compute_us[names["optimizer/fc"]] == pytest.approx(expected * 1e6 + device.launch_overhead_us)
    assert t.op_types[names["optimizer/fc"]] == UPDATE_OP[optimizer]


def test_updates_ordered_by_optimizer_cost():
    g, kinds = cnn()
    times = {o: synthesize_training(g, DEVICES, kinds, o).compute_us[-1] for o in ("sgd", "momentum", "adam")}
    assert times["sgd"] < times["momentum"] < times["adam"]


def test_activations_stay_alive_until_their_backward_use():
    g, kinds = cnn()
    t = synthesize_training(g, DEVICES, kinds, "sgd")
    forward = simulate(g, DEVICES, [0] * g.num_ops)
    step = simulate(t, DEVICES, [0] * t.num_ops)
    # forward alone frees conv's output once relu has read it; in training it stays for
    # gradients/relu and x's stays for gradients/conv
    assert step.peak_bytes[0] >= forward.peak_bytes[0] + 8000
    assert step.step_time_us > forward.step_time_us


def test_forward_only_contracts_back_to_the_model():
    g, kinds = cnn()
    t = synthesize_training(g, DEVICES, kinds, "adam")
    f = forward_only(t)
    assert f.names == g.names
    assert sum(f.compute_us) == pytest.approx(sum(t.compute_us))


def test_heterogeneous_devices_get_per_kind_times():
    devices = parse_devices("2x8GB")
    fast = devices.devices[0].__class__(name="fast", memory_bytes=8_000_000_000, flops=100e12)
    spec = devices.__class__((devices.devices[0], fast), devices.interconnect)
    g, kinds = cnn()
    slow_kind, fast_kind = spec.devices[0].kind, fast.kind
    g = g.replace(
        compute_us_by_kind={slow_kind: list(g.compute_us), fast_kind: [c / 2 for c in g.compute_us]}
    )
    t = synthesize_training(g, spec, kinds, "momentum")
    names = t.index()
    by = t.compute_us_by_kind
    assert by[fast_kind][names["gradients/fc"]] == 2 * by[fast_kind][names["fc"]]
    assert len(by[slow_kind]) == len(by[fast_kind]) == t.num_ops


def test_names_stay_unique():
    b = GraphBuilder()
    x = b.add_op("x", "Input", [40], output_dtypes=F32)
    fc = b.add_op("fc", "Gemm", [40], compute_us=1.0, persistent_bytes=400, output_dtypes=F32)
    clash = b.add_op("gradients/fc", "Relu", [40], compute_us=1.0, output_dtypes=F32)
    b.add_edge(x, fc)
    b.add_edge(fc, clash)
    t = synthesize_training(b.build(), DEVICES, ["zero", "flops", "flops"], "sgd")
    assert len(set(t.names)) == t.num_ops
    assert "gradients/fc_1" in t.names


def test_refuses_a_training_graph_and_a_model_without_weights():
    g, kinds = cnn()
    t = synthesize_training(g, DEVICES, kinds, "sgd")
    with pytest.raises(InputError, match="already has 8 backward ops"):
        synthesize_training(t, DEVICES, kinds + ["flops"] * 7, "sgd")
    with pytest.raises(InputError, match="nothing to train"):
        synthesize_training(g.replace(persistent_bytes=[0] * g.num_ops), DEVICES, kinds, "sgd")
    with pytest.raises(InputError, match="unknown optimizer 'lamb'"):
        synthesize_training(g, DEVICES, kinds, "lamb")


@pytest.mark.parametrize(
    "onnx_name, pb", [("keras_resnet50", "resnet50.pb"), ("keras_inception_v3", "inception_v3.pb")]
)
def test_synthesized_step_is_close_to_tensorflows_own(onnx_name: str, pb: str):
    """The same Keras model: its inference ONNX export with --training against TensorFlow's
    own Momentum training graph (bench/onnx.md, "Synthesized against real"). The memory model
    itself is judged against PyTorch's measured steps in bench/framework.md."""
    from baechi_cli.app.place import PlaceOptions, prepare

    testdata = pathlib.Path(__file__).resolve().parent.parent / "testdata"
    devices = parse_devices("1x1000GB")
    bare = {"algo": "single", "coplace": False, "fusion": False, "forward_only": False}
    ours = prepare(
        str(testdata / f"{onnx_name}.onnx"),
        devices,
        PlaceOptions(**bare, training=True, optimizer="momentum"),
        lambda _: None,
    )
    real = prepare(str(testdata / pb), devices, PlaceOptions(**bare, batch_size=32), lambda _: None)
    # parameters plus one momentum slot each: the same bytes (TensorFlow adds a few counters)
    assert sum(ours.graph.persistent_bytes) == pytest.approx(sum(real.graph.persistent_bytes), rel=0.01)
    ratio_ours = sum(ours.graph.compute_us) / sum(ours.graph.compute_us[: ours.model_ops])
    forward_real = sum(c for c, b in zip(real.graph.compute_us, real.graph.is_backward, strict=True) if not b)
    ratio_real = sum(real.graph.compute_us) / forward_real
    assert ratio_ours == pytest.approx(ratio_real, rel=0.25)
    # Activations kept for the backward pass. tf2onnx folded the batch norms into the
    # convolutions, TensorFlow's graph keeps them: per conv + batch norm + relu, autograd's
    # rules keep one tensor of the folded model (the relu's output, which the next conv also
    # saves) where TensorFlow keeps two (the conv's output for the batch norm, and the relu's).
    # So ours holds between half of TensorFlow's activations and all of them.
    activations_ours = max(ours.single_device.peak_bytes) - sum(ours.graph.persistent_bytes)
    activations_real = max(real.single_device.peak_bytes) - sum(real.graph.persistent_bytes)
    assert 0.45 * activations_real <= activations_ours <= activations_real


# ------------------------------------------------------------ properties

KINDS = ("flops", "bytes", "zero", "variable", "uncovered", "fallback")


@st.composite
def models(draw):
    """(forward-only graph, cost-rule kinds): a drawn DAG with graph inputs, integer and
    untyped outputs, parameters on some ops and names that clash with gradient names."""
    g = draw(dags(1, 12, max_ports=2, control_p=0.1, group_p=0.2, relabel=True))
    n = g.num_ops
    op_types = [draw(st.sampled_from(("X", "Input"))) for _ in range(n)]
    dtypes = [[draw(st.sampled_from(("float32", "int64", ""))) for _ in ports] for ports in g.output_bytes]
    names = [f"gradients/v{v - 1}" if v and draw(st.booleans()) else f"v{v}" for v in range(n)]
    kinds = [draw(st.sampled_from(KINDS)) for _ in range(n)]
    return g.replace(op_types=op_types, output_dtypes=dtypes, names=names), kinds


@settings(max_examples=60, deadline=None)
@given(models(), st.sampled_from(("sgd", "momentum", "adam")))
def test_training_step_of_drawn_models(case, optimizer):
    g, kinds = case
    n = g.num_ops
    if not any(g.persistent_bytes):
        with pytest.raises(InputError, match="nothing to train"):
            synthesize_training(g, DEVICES, kinds, optimizer)
        return
    t = synthesize_training(g, DEVICES, kinds, optimizer)
    need = needs_gradient(g)
    # The model is untouched: same ops and edges first.
    assert t.names[:n] == g.names and t.op_types[:n] == g.op_types and t.group[:n] == g.group
    assert list(zip(t.edge_src, t.edge_port, t.edge_dst))[: g.num_edges] == list(
        zip(g.edge_src, g.edge_port, g.edge_dst)
    )
    assert len(set(t.names)) == t.num_ops
    assert is_topological(t, t.topo_order())
    # One backward op per op that needs a gradient, one update per such op owning
    # parameters; each beside its forward op and after it; one optimizer step between them.
    grad, update, steps, losses = {}, {}, [], {}
    for x in range(n, t.num_ops):
        v = t.forward_op[x]
        assert t.is_backward[x] and 0 <= v < n and t.group[x] == g.group[v]
        if t.op_types[x] == f"{g.op_types[v]}Grad":
            assert v not in grad
            grad[v] = x
        elif t.op_types[x] == LOSS_OP:
            assert v not in losses
            losses[v] = x
        elif t.op_types[x] == STEP_OP:
            steps.append(x)
        else:
            assert t.op_types[x] == UPDATE_OP[optimizer] and v not in update
            update[v] = x
    assert len(steps) == (1 if grad else 0)
    assert sorted(grad) == [v for v in range(n) if need[v]]
    # A loss on each such op's float outputs that nothing reads, sending their gradients to it.
    read = {(g.edge_src[e], g.edge_port[e]) for e in range(g.num_edges)}
    outputs = {
        v: [
            p
            for p, (nbytes, dtype) in enumerate(zip(g.output_bytes[v], g.output_dtypes[v]))
            if nbytes and (v, p) not in read and (dtype == "" or dtype.startswith("float"))
        ]
        for v in range(n)
        if need[v]
    }
    assert sorted(losses) == [v for v, ports in outputs.items() if ports]
    for v, x in losses.items():
        assert t.output_bytes[x] == [g.output_bytes[v][p] for p in outputs[v]]
        assert [t.edge_port[e] for e in t.in_edges[x]] == outputs[v]
        assert {(t.edge_dst[e], t.edge_port[e]) for e in t.out_edges[x]} == {
            (grad[v], k) for k in range(len(outputs[v]))
        }
    assert sorted(update) == [v for v in range(n) if need[v] and g.persistent_bytes[v]]
    edges = set(zip(t.edge_src, t.edge_port, t.edge_dst))
    for v, x in grad.items():
        assert (v, CONTROL_PORT, x) in edges
    # Every update waits for the step, and the step for the whole backward pass.
    order = {v: i for i, v in enumerate(t.topo_order())}
    for step in steps:
        assert all((step, CONTROL_PORT, x) in edges for x in update.values())
        assert all(order[x] < order[step] for x in grad.values())
    # Gradients flow back along every data edge between ops that need them.
    srcs = set(zip(t.edge_src, t.edge_dst))
    for e in range(g.num_edges):
        u, w = g.edge_src[e], g.edge_dst[e]
        if g.edge_port[e] != CONTROL_PORT and need[u] and need[w]:
            assert (grad[w], grad[u]) in srcs
    slots = OPTIMIZER_SLOTS[optimizer]
    assert sum(t.persistent_bytes) == sum(g.persistent_bytes) + slots * sum(
        g.persistent_bytes[v] for v in update
    )
    # Forward-only placement contracts the step back onto the model.
    f = forward_only(t)
    assert f.names == g.names
    assert sum(f.compute_us) == pytest.approx(sum(t.compute_us))


def test_the_loss_reads_the_outputs_and_sends_their_gradients_to_their_backward():
    g, kinds = cnn()
    t = synthesize_training(g, DEVICES, kinds, "sgd")
    names = t.index()
    # fc's 400-byte output is the model's, the only one: relu's output is read (by shape and
    # flat), and shape's int64 output needs no gradient
    assert [t.names[v] for v in range(t.num_ops) if t.op_types[v] == LOSS_OP] == ["loss/fc"]
    loss, fc, grad_fc = names["loss/fc"], names["fc"], names["gradients/fc"]
    assert t.output_bytes[loss] == [400] and t.temporary_bytes[loss] == LOSS_TEMPORARIES * 400
    assert t.is_backward[loss] and t.forward_op[loss] == fc and t.group[loss] == t.group[fc]
    edges = set(zip(t.edge_src, t.edge_dst, t.edge_port))
    assert (fc, loss, 0) in edges and (loss, grad_fc, 0) in edges
    # the loss's scratch is the loss op's, not the output's backward's
    assert t.temporary_bytes[grad_fc] == 0
    # the loss's time is its passes over the output
    assert 0 < t.compute_us[loss]
    step = simulate(t, DEVICES, [0] * t.num_ops)
    # while the loss runs: its temporaries, fc's output and its gradient, conv's weights
    assert step.peak_bytes[0] >= LOSS_TEMPORARIES * 400 + 400 + 400 + 1200


def test_the_caller_holds_its_inputs_but_not_the_outputs_the_loss_takes():
    b = GraphBuilder()
    x = b.add_op("x", "Input", [400], output_dtypes=F32)
    fc = b.add_op("fc", "Gemm", [40], compute_us=10.0, persistent_bytes=4000, output_dtypes=F32)
    b.add_edge(x, fc)
    b.hold(x, 0)
    b.hold(fc, 0)
    t = synthesize_training(b.build(), DEVICES, ["zero", "flops"], "sgd")
    assert t.held_outputs == {(x, 0)}


def test_an_output_read_by_nothing_needs_the_loss_only_when_it_is_a_float():
    b = GraphBuilder()
    x = b.add_op("x", "Input", [400], output_dtypes=F32)
    fc = b.add_op(
        "fc", "Gemm", [40, 8], compute_us=10.0, persistent_bytes=4000, output_dtypes=["float32", "int64"]
    )
    b.add_edge(x, fc)
    t = synthesize_training(b.build(), DEVICES, ["zero", "flops"], "sgd")
    loss = t.index()["loss/fc"]
    assert t.output_bytes[loss] == [40] and t.output_dtypes[loss] == ["float32"]


def test_a_weight_whose_first_reader_takes_its_shape_is_still_trained(tmp_path):
    """The dynamo exporter reads a conv weight's Shape before the Conv: the Conv owns the weight,
    its gradient and its update, not the Shape (whose int64 output needs no gradient)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from baechi_cli.app.place import place_model
    from baechi_cli.core.devices import parse_devices
    from baechi_cli.search.candidates import PlaceOptions

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8, 8])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [4])
    w = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((4, 4, 3, 3)).astype(np.float32), "w"
    )
    nodes = [
        helper.make_node("Shape", ["w"], ["s"]),
        helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y, s], [w]), opset_imports=[helper.make_opsetid("", 17)]
    )
    path = tmp_path / "conv.onnx"
    onnx.save(model, str(path))
    outcome = place_model(
        str(path), parse_devices("1x1GB"), PlaceOptions(algo="single", training=True, optimizer="adam")
    )
    g = outcome.graph
    conv = (
        g.index()["Conv_1"]
        if "Conv_1" in g.index()
        else next(v for v in range(g.num_ops) if g.op_types[v] == "Conv")
    )
    assert g.persistent_bytes[conv] == 4 * 4 * 3 * 3 * 4
    updates = [v for v in range(g.num_ops) if g.op_types[v] == "ApplyAdam"]
    assert [g.forward_op[v] for v in updates] == [conv]
