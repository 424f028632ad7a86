"""Views and what autograd saves: the memory facts of costs/memory_rules.py, in the simulator.

Every expected peak here is counted by hand from the rule it tests.
"""

from __future__ import annotations

from baechi_cli.core.devices import parse_devices
from baechi_cli.core.graph import CONTROL_PORT, GraphBuilder, OpGraph
from baechi_cli.costs.memory_rules import (
    RESIDENT,
    composite_saved,
    mark_views,
    one_kernel_activations,
    saved_for_backward,
)
from baechi_cli.evaluator.sim import simulate
from baechi_cli.passes.training import synthesize_training

F32 = ["float32"]
SPEC = parse_devices("2x1GB")


def chain(*ops: tuple[str, str, int]) -> OpGraph:
    """x -> op1 -> op2 -> ...: (name, op type, output bytes) each, 10 µs each."""
    b = GraphBuilder()
    prev = None
    for name, op_type, nbytes in ops:
        v = b.add_op(name, op_type, [nbytes], compute_us=10.0, output_dtypes=F32)
        if prev is not None:
            b.add_edge(prev, v)
        prev = v
    return b.build()


def test_a_view_allocates_nothing_and_keeps_its_source_alive():
    g = mark_views(chain(("a", "Relu", 1000), ("r", "Reshape", 1000), ("c", "Relu", 10)), "onnx")
    assert g.view_of == {1: (0, 0)}
    sim = simulate(g, SPEC, [0, 0, 0])
    assert sim.peak_bytes[0] == 1010  # a's tensor (the view shares it) and c's output
    # a's tensor is freed when the view's consumer ends, not when the view does
    assert sim.memory_curve[0][-1] == (30.0, 0)
    assert (20.0, 1010) in sim.memory_curve[0]
    without = simulate(chain(("a", "Relu", 1000), ("r", "Reshape", 1000), ("c", "Relu", 10)), SPEC, [0, 0, 0])
    assert without.peak_bytes[0] == 2000  # a copy-counting model holds both


def test_a_view_on_another_device_keeps_the_received_copy_alive():
    g = mark_views(chain(("a", "Relu", 1000), ("r", "Reshape", 1000), ("c", "Relu", 10)), "onnx")
    sim = simulate(g, SPEC, [0, 1, 1])
    (copy,) = sim.transfers
    # the copy on device 1 lives from its receive until c (which reads it through the view) ends
    assert sim.peak_bytes[1] == 1010
    assert sim.memory_curve[1][-1] == (sim.end[2], 0)
    assert copy.dst_device == 1 and copy.nbytes == 1000


def test_views_of_views_chain_their_lifetimes():
    g = mark_views(
        chain(("a", "Relu", 1000), ("r", "Reshape", 1000), ("s", "Squeeze", 1000), ("c", "Relu", 10)), "onnx"
    )
    assert g.view_of == {1: (0, 0), 2: (1, 0)}
    sim = simulate(g, SPEC, [0] * 4)
    assert sim.peak_bytes[0] == 1010 and sim.memory_curve[0][-1] == (40.0, 0)


def test_view_types_are_per_op_set_and_a_view_of_a_parameter_keeps_nothing():
    g = chain(("a", "Relu", 1000), ("t", "Transpose", 1000), ("i", "Identity", 1000))
    assert mark_views(g, "onnx").view_of == {1: (0, 0), 2: (1, 0)}
    assert mark_views(g, "tensorflow").view_of == {2: (1, 0)}  # a TF Transpose copies
    b = GraphBuilder()
    x = b.add_op("x", "Input", [400], output_dtypes=F32)
    w_t = b.add_op("w_t", "Transpose", [4000], attrs={"_data_inputs": [], "_initializers": ["w"]})
    mm = b.add_op("mm", "MatMul", [40], attrs={"_data_inputs": [0, 1]})
    b.add_edge(x, mm)
    b.add_edge(w_t, mm)
    reshape = b.add_op("r", "Reshape", [40], attrs={"_data_inputs": [1], "_initializers": ["t"]})
    b.add_edge(x, reshape)  # input 0 is an initializer, the edge is input 1 (the shape)
    assert mark_views(b.build(), "onnx").view_of == {w_t: RESIDENT, reshape: RESIDENT}


def test_a_product_keeps_an_operand_only_for_another_operands_gradient():
    """x * 0.5 keeps nothing of x (PyTorch's MulBackward saves `other` only for self's gradient)."""
    b = GraphBuilder()
    x = b.add_op("x", "Input", [100], output_dtypes=F32)
    fc = b.add_op("fc", "Gemm", [1000], compute_us=1.0, persistent_bytes=400, output_dtypes=F32)
    half = b.add_op("half", "Constant", [4], output_dtypes=F32)
    scaled = b.add_op("scaled", "Mul", [1000], compute_us=1.0, output_dtypes=F32)
    squared = b.add_op("squared", "Mul", [1000], compute_us=1.0, output_dtypes=F32)
    for s, d in ((x, fc), (fc, scaled), (half, scaled), (scaled, squared), (scaled, squared)):
        b.add_edge(s, d)
    t = synthesize_training(b.build(), SPEC, ["zero", "flops", "zero", "flops", "flops"], "sgd")
    names = t.index()

    def saved_into(op: str) -> set[str]:
        v = names[f"gradients/{op}"]
        return {t.names[t.edge_src[e]] for e in t.in_edges[v] if t.edge_port[e] != CONTROL_PORT}

    assert "fc" not in saved_into("scaled")  # the constant needs no gradient: x is not kept
    assert "half" in saved_into("scaled")  # the constant is (for fc's gradient)
    assert "scaled" in saved_into("squared")  # x * x: each operand for the other's gradient


def test_what_autograd_saves():
    assert saved_for_backward("Gemm", "flops").inputs == (0, 1)
    assert saved_for_backward("Conv", "flops").inputs == (0,)
    assert saved_for_backward("Relu", "flops").output and not saved_for_backward("Relu", "flops").inputs
    assert saved_for_backward("Add", "flops") == saved_for_backward("Reshape", "zero")
    assert saved_for_backward("Dropout", "bytes").extra_bytes_per_output_byte == 0.25
    assert saved_for_backward("Frobnicate", "bytes").inputs == ()


def test_training_keeps_exactly_what_autograd_saves():
    """fc(W) -> relu -> add(relu, fc) -> maxpool: the step's peak, by hand."""
    b = GraphBuilder()
    x = b.add_op("x", "Input", [100], output_dtypes=F32)
    fc = b.add_op("fc", "Gemm", [1000], compute_us=10.0, persistent_bytes=400, output_dtypes=F32)
    relu = b.add_op("relu", "Relu", [1000], compute_us=1.0, output_dtypes=F32)
    add = b.add_op("add", "Add", [1000], compute_us=1.0, output_dtypes=F32)
    pool = b.add_op("pool", "MaxPool", [250], compute_us=1.0, output_dtypes=F32)
    for s, d in ((x, fc), (fc, relu), (relu, add), (fc, add), (add, pool)):
        b.add_edge(s, d)
    g = b.build()
    t = synthesize_training(g, SPEC, ["zero", "flops", "flops", "flops", "flops"], "sgd")
    names = t.index()

    def saved_into(op: str) -> set[tuple[str, int]]:
        v = names[f"gradients/{op}"]
        return {
            (t.names[t.edge_src[e]], t.edge_port[e])
            for e in t.in_edges[v]
            if t.edge_port[e] != CONTROL_PORT and not t.is_backward[t.edge_src[e]]
        }

    assert saved_into("fc") == {("x", 0)}  # its data input (W is resident)
    assert saved_into("relu") == {("relu", 0)}  # its output
    assert saved_into("add") == set()  # nothing
    assert saved_into("pool") == {("add", 0), ("pool", 1)}  # its input and int64 indices
    assert t.output_bytes[pool] == [250, 500]
    # On one device, while pool runs: the parameters, x (fc's saved input), relu's output (its
    # saved result), add's output (pool's saved input), pool's output and its indices. fc's output
    # was freed when add, its last reader, ended: neither relu nor add saves it.
    sim = simulate(t, SPEC, [0] * t.num_ops)
    levels = dict(sim.memory_curve[0])
    assert levels[sim.start[pool]] == 400 + 100 + 1000 + 1000 + 250 + 500


def exported_gelu() -> GraphBuilder:
    """x -> fc -> GELU as the TorchScript exporter writes F.gelu, ``x * (1 + erf(x / sqrt(2))) * 0.5``,
    its constants Constant ops: ops x, fc, sqrt2, one, half, div, erf, add, mul, out."""
    b = GraphBuilder()
    x = b.add_op("x", "Input", [100], output_dtypes=F32)
    fc = b.add_op("fc", "Gemm", [1000], compute_us=1.0, persistent_bytes=400, output_dtypes=F32)
    sqrt2 = b.add_op("sqrt2", "Constant", [4], output_dtypes=F32)
    one = b.add_op("one", "Constant", [4], output_dtypes=F32)
    half = b.add_op("half", "Constant", [4], output_dtypes=F32)
    div = b.add_op("div", "Div", [1000], compute_us=1.0, output_dtypes=F32)
    erf = b.add_op("erf", "Erf", [1000], compute_us=1.0, output_dtypes=F32)
    add = b.add_op("add", "Add", [1000], compute_us=1.0, output_dtypes=F32)
    mul = b.add_op("mul", "Mul", [1000], compute_us=1.0, output_dtypes=F32)
    out = b.add_op("out", "Mul", [1000], compute_us=1.0, output_dtypes=F32)
    for s, d in ((x, fc), (fc, div), (sqrt2, div), (div, erf), (erf, add), (one, add), (fc, mul), (add, mul)):
        b.add_edge(s, d)
    b.add_edge(mul, out)
    b.add_edge(half, out)
    return b


def test_an_exported_exact_gelu_keeps_its_input_once():
    """x * 0.5 * (1 + erf(x / sqrt(2))) as the TorchScript exporter writes F.gelu: GeluBackward saves x."""
    g = exported_gelu().build()
    names = g.index()
    erf, mul = names["erf"], names["mul"]
    assert set(composite_saved(g)) == {erf, mul}
    kinds = ["zero", "flops", "zero", "zero", "zero", "flops", "flops", "flops", "flops", "flops"]
    t = synthesize_training(g, SPEC, kinds, "sgd")
    names = t.index()
    forward = set(range(g.num_ops))

    def saved_into(op: str) -> set[str]:
        v = names[f"gradients/{op}"]
        return {
            t.names[t.edge_src[e]]
            for e in t.in_edges[v]
            if t.edge_port[e] != CONTROL_PORT and t.edge_src[e] in forward
        }

    assert saved_into("erf") == set() and saved_into("mul") == {"fc"}
    assert saved_into("div") == {"sqrt2"} and saved_into("out") == {"half"} and saved_into("add") == set()


def test_a_cast_to_its_own_dtype_is_a_view():
    b = GraphBuilder()
    a = b.add_op("a", "Softmax", [1000], output_dtypes=F32)
    same = b.add_op("same", "Cast", [1000], output_dtypes=F32, attrs={"_input_dtypes": ["float32"]})
    half = b.add_op("half", "Cast", [500], output_dtypes=["float16"], attrs={"_input_dtypes": ["float32"]})
    b.add_edge(a, same)
    b.add_edge(a, half)
    assert mark_views(b.build(), "onnx").view_of == {same: (a, 0)}


def test_tied_weights_share_one_gradient_buffer_until_the_update(tmp_path):
    """A weight three ops read (ALBERT's shared layers; GPT-2's embedding, also its output layer):
    autograd adds each reader's gradient into one buffer as it comes. The last reader's backward,
    the first to run, starts the buffer, which lives until the owner's update as its .grad; every
    other gradient of the weight lives only while its backward op runs, and the first add makes a
    new sum (ALBERT at 2x16 tokens: a buffer per reader, kept until the step, put the predicted
    peak at 3.28x PyTorch's measured one; one buffer, 1.08x)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from baechi_cli.io.formats import load_model

    w = numpy_helper.from_array(np.ones((10, 4), np.float32), "wte")
    nodes = [
        helper.make_node("Gather", ["wte", "ids"], ["h"], name="embed"),
        helper.make_node("Transpose", ["wte"], ["wte_t"], name="tie", perm=[1, 0]),
        helper.make_node("MatMul", ["h", "wte_t"], ["mid"], name="mid"),
        helper.make_node("Identity", ["wte"], ["wte_2"], name="tie2"),
        helper.make_node("MatMul", ["mid", "wte_2"], ["logits"], name="lm_head"),
    ]
    graph = helper.make_graph(
        nodes,
        "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 3, 4])],
        [w],
    )
    path = tmp_path / "tied.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    g = load_model(str(path), None).graph
    names = g.index()
    assert g.attrs[names["embed"]]["_accumulated_parameter_bytes"] == 160
    assert g.attrs[names["tie"]]["_shared_parameter_bytes"] == 160
    assert g.attrs[names["tie2"]]["_shared_parameter_bytes"] == 160
    assert g.attrs[names["tie2"]]["_gradient_buffer_owners"] == ["embed"]
    assert g.attrs[names["tie2"]]["_gradient_buffer_bytes"] == [160]
    assert "_gradient_buffer_bytes" not in g.attrs[names["tie"]]
    assert g.persistent_bytes[names["embed"]] == 160 and g.persistent_bytes[names["tie"]] == 0

    kinds = ["bytes" if t in ("Gather", "Transpose", "Identity") else "flops" for t in g.op_types]
    t = synthesize_training(g, SPEC, kinds, "sgd")
    tn = t.index()
    tie, tie2, embed = tn["gradients/tie"], tn["gradients/tie2"], tn["gradients/embed"]
    update = tn["optimizer/embed"]
    buffer = len(t.output_bytes[tie2]) - 1
    assert t.output_bytes[tie2][buffer] == 160  # the buffer
    readers = {t.edge_dst[e] for e in t.out_edges[tie2] if t.edge_port[e] == buffer}
    assert readers == {embed, update}  # the owner adds into it; its update reads it as .grad
    assert t.temporary_bytes[tie] == g.temporary_bytes[names["tie"]] + 2 * 160  # the first add: a new sum
    assert t.temporary_bytes[embed] == g.temporary_bytes[names["embed"]] + 160
    assert t.output_bytes[embed][-1] == 0  # the owner's .grad is the buffer
    assert all(sum(t.output_bytes[v]) < 160 for v in (tie, embed))


def test_an_infeasible_one_device_run_names_the_device_the_op_and_the_excess():
    import os

    import pytest

    from baechi_cli.app.place import PlaceOptions, place_model
    from baechi_cli.core.errors import InfeasibleError

    model = os.path.join(os.path.dirname(os.path.dirname(__file__)), "testdata", "torch_resnet.onnx")
    options = PlaceOptions(algo="single", training=True, optimizer="adam")
    with pytest.raises(InfeasibleError) as err:
        place_model(model, parse_devices("2x10MB"), options)
    message = str(err.value)
    assert "the model does not fit one device: /device:GPU:0 peaks at " in message
    peak = int(message.split("peaks at ")[1].split("(")[1].split()[0])
    excess = f"({peak - 10_000_000} bytes) over its 10.00 MB (10000000 bytes)"
    assert "while 'gradients/" in message and excess in message


def test_an_exported_exact_gelu_allocates_only_its_result():
    """F.gelu writes one tensor: the exporter's Div, Erf, Add and Mul outputs take no memory."""
    g = exported_gelu().build()
    names = g.index()
    one_kernel = one_kernel_activations(g)
    chain = {names[op] for op in ("div", "erf", "add", "mul")}
    assert [one_kernel.output_bytes[v] == [0] for v in range(g.num_ops)] == [
        v in chain for v in range(g.num_ops)
    ]
    assert [one_kernel.output_bytes[v] for v in range(g.num_ops) if v not in chain] == [
        g.output_bytes[v] for v in range(g.num_ops) if v not in chain
    ]
    # On one device, 1 µs each: fc at 0, the Constants (4 B each) with it, div at 1 ... out at 5.
    # Before, from div's start on: the weights (400), fc's output (GELU's x, read by mul) and
    # two or three of the chain's 1000-byte tensors (3408 while erf and add run). After: the
    # weights, x, the constants not yet read and, from out's start, its result.
    before = simulate(g, SPEC, [0] * g.num_ops)
    after = simulate(one_kernel, SPEC, [0] * g.num_ops)
    assert before.memory_curve[0] == [
        (0.0, 1500),
        (1.0, 400 + 1000 + 12 + 1000),
        (2.0, 400 + 1000 + 8 + 2000),
        (3.0, 400 + 1000 + 8 + 2000),
        (4.0, 400 + 1000 + 4 + 2000),
        (5.0, 400 + 4 + 2000),
        (6.0, 400),
    ]
    assert after.memory_curve[0] == [
        (0.0, 1500),
        (1.0, 1412),
        (2.0, 1408),
        (4.0, 1404),
        (5.0, 1404),
        (6.0, 400),
    ]
    assert after.start == before.start and after.end == before.end


def test_a_gelu_whose_intermediate_is_read_elsewhere_keeps_it():
    """Where another op reads the Mul's output, the chain is not one kernel's: nothing changes."""
    b = exported_gelu()
    names = b.build().index()
    other = b.add_op("other", "Relu", [1000], compute_us=1.0, output_dtypes=F32)
    b.add_edge(names["mul"], other)
    g = b.build()
    assert one_kernel_activations(g) is g
