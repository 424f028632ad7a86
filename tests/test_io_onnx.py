"""The ONNX reader: small real models built with onnx.helper (opset 17) into tmp_path.

Byte counts are hand-computed: float32 is 4 bytes, int64 8.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from baechi_cli.core.errors import InputError
from baechi_cli.io.onnx import read_onnx, read_onnx_with_notes

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    return helper.make_model(graph, opset_imports=opsets)


def _save(tmp_path, model, name="m.onnx", **kwargs):
    path = str(tmp_path / name)
    onnx.save_model(model, path, **kwargs)
    return path


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _cnn():
    """x[N,3,8,8] -> Conv(4 3x3, pad 1) -> Relu -> MaxPool 2x2 -> Reshape [0,-1] -> Gemm(64->10)."""
    inits = [
        _init("w", np.zeros((4, 3, 3, 3), np.float32)),  # 432 bytes
        _init("b", np.zeros(4, np.float32)),  # 16
        _init("s", np.array([0, -1], np.int64)),  # 16
        _init("W", np.zeros((10, 64), np.float32)),  # 2560
        _init("B", np.zeros(10, np.float32)),  # 40
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Reshape", ["p", "s"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "W", "B"], ["y"], transB=1),  # unnamed: Gemm_4
    ]
    x = helper.make_tensor_value_info("x", F, ["N", 3, 8, 8])
    y = helper.make_tensor_value_info("y", F, ["N", 10])
    return _model(nodes, [x], [y], inits)


CNN_NAMES = ["x", "conv", "relu", "pool", "flat", "Gemm_4"]
# Batch 2: x 2*3*8*8*4, conv/relu 2*4*8*8*4, pool 2*4*4*4*4, flat 2*64*4, Gemm 2*10*4.
CNN_BYTES_B2 = [[1536], [2048], [2048], [512], [512], [80]]
# conv: w 432 + b 16; flat: s 16; Gemm: W 2560 + B 40.
CNN_PERSISTENT = [0, 448, 0, 0, 16, 2600]


def test_cnn_ops_edges_ports_and_bytes_with_batch_size(tmp_path):
    """Ops, op types, edges, ports, inferred output bytes, persistent bytes and attrs of a small CNN."""
    g = read_onnx(_save(tmp_path, _cnn()), batch_size=2)
    assert g.names == CNN_NAMES
    assert g.op_types == ["Input", "Conv", "Relu", "MaxPool", "Reshape", "Gemm"]
    assert g.output_bytes == CNN_BYTES_B2
    assert g.output_shapes[4] == [(2, 64)]  # Reshape resolved from the initializer's values
    assert g.output_dtypes == [["float32"]] * 6
    assert g.persistent_bytes == CNN_PERSISTENT
    assert list(zip(g.edge_src, g.edge_port, g.edge_dst)) == [
        (0, 0, 1),
        (1, 0, 2),
        (2, 0, 3),
        (3, 0, 4),
        (4, 0, 5),
    ]
    assert g.edge_bytes == [1536, 2048, 2048, 512, 512]
    assert g.group == list(range(6))
    assert g.is_backward == [False] * 6 and g.forward_op == [-1] * 6
    conv = g.attrs[1]
    assert conv["pads"] == [1, 1, 1, 1] and conv["kernel_shape"] == [3, 3]
    assert conv["_input_shapes"] == [(2, 3, 8, 8), (4, 3, 3, 3), (4,)]
    assert conv["_input_dtypes"] == ["float32"] * 3
    assert conv["_initializers"] == ["w", "b"] and conv["_onnx_node"] == 0
    assert g.attrs[5]["transB"] == 1 and g.attrs[0] == {"_onnx_input": 0}


def test_the_caller_holds_the_fed_inputs_and_the_graph_outputs(tmp_path):
    """x is fed, y returned: both held for the step; an output read inside the graph is held too."""
    assert read_onnx(_save(tmp_path, _cnn()), batch_size=2).held_outputs == {(0, 0), (5, 0)}
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu"),  # returned and read by tanh
        helper.make_node("Tanh", ["h"], ["y"], name="tanh"),
    ]
    x = helper.make_tensor_value_info("x", F, [2, 3])
    outputs = [helper.make_tensor_value_info(v, F, [2, 3]) for v in ("h", "y")]
    g = read_onnx(_save(tmp_path, _model(nodes, [x], outputs), name="two.onnx"))
    assert g.held_outputs == {(0, 0), (1, 0), (2, 0)}


def test_a_module_call_holds_its_arguments_until_it_returns(tmp_path):
    """TorchScript node names give the module calls: a tensor passed into /a/b stays until b's last op."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="/a/Relu"),
        helper.make_node("Tanh", ["r"], ["t"], name="/a/b/Tanh"),  # r enters call a/b ...
        helper.make_node("Sigmoid", ["t"], ["s"], name="/a/b/Sigmoid"),  # ... whose last op this is
        helper.make_node("Neg", ["s"], ["y"], name="/c/Neg"),  # s enters c, which ends here
    ]
    x = helper.make_tensor_value_info("x", F, [2, 3])
    y = helper.make_tensor_value_info("y", F, [2, 3])
    g = read_onnx(_save(tmp_path, _model(nodes, [x], [y])))
    names = g.index()
    assert g.scope_holds == ((names["/a/Relu"], 0, names["/a/b/Sigmoid"]),)
    # Names of no exporter's form (no scope) hold nothing.
    for node in nodes:
        node.name = node.name.rsplit("/", 1)[-1]
    assert read_onnx(_save(tmp_path, _model(nodes, [x], [y]), name="plain.onnx")).scope_holds == ()


def test_a_module_called_twice_is_two_calls_not_one(tmp_path):
    """ALBERT's one layer module runs twelve times; the exporter suffixes only a name's last scope
    (/layer_1/Add, /layer/ffn_1/Tanh), so the prefix /layer spans both calls. The first call's
    input is held by the call it entered that the names tell apart (ffn), not to the second's end."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="/embed/Relu"),
        helper.make_node("Tanh", ["r"], ["a"], name="/layer/ffn/Tanh"),  # r enters layer and ffn
        helper.make_node("Sigmoid", ["a"], ["b"], name="/layer/ffn/Sigmoid"),
        helper.make_node("Add", ["b", "r"], ["c"], name="/layer/Add"),
        helper.make_node("Tanh", ["c"], ["d"], name="/layer/ffn_1/Tanh"),  # the second call
        helper.make_node("Sigmoid", ["d"], ["e"], name="/layer/ffn_1/Sigmoid"),
        helper.make_node("Add", ["e", "c"], ["y"], name="/layer_1/Add"),
    ]
    x = helper.make_tensor_value_info("x", F, [2, 3])
    y = helper.make_tensor_value_info("y", F, [2, 3])
    g = read_onnx(_save(tmp_path, _model(nodes, [x], [y]), name="twice.onnx"))
    names = g.index()
    held_until = {(g.names[u], g.names[w]) for u, _, w in g.scope_holds}
    assert ("/embed/Relu", "/layer/ffn/Sigmoid") in held_until  # ffn's first call
    # Not held into the second call, as one call spanning both would hold it (to /layer/ffn_1/Sigmoid).
    assert all(w <= names["/layer/Add"] for u, _, w in g.scope_holds if u == names["/embed/Relu"])


def test_cnn_batch_bound_by_dims_and_dims_win_over_batch_size(tmp_path):
    """--dim N=2 gives the same sizes as --batch-size 2; a --dim beats --batch-size for that name."""
    path = _save(tmp_path, _cnn())
    assert read_onnx(path, dims={"N": 2}).output_bytes == CNN_BYTES_B2
    g = read_onnx(path, batch_size=2, dims={"N": 3})
    assert g.output_bytes[-1] == [3 * 10 * 4]


def test_same_file_same_graph(tmp_path):
    """Reading is deterministic."""
    path = _save(tmp_path, _cnn())
    assert read_onnx(path, batch_size=2) == read_onnx(path, batch_size=2)


def test_unbound_dim_is_an_error_naming_input_and_dim(tmp_path):
    """Without --batch-size or --dim, the symbolic batch dim of input x is an error naming both."""
    path = _save(tmp_path, _cnn())
    with pytest.raises(InputError) as err:
        read_onnx(path)
    text = str(err.value)
    assert text.startswith(path) and "'x'" in text and "'N'" in text
    assert "--dim N=VALUE" in text and "--batch-size" in text and "\n" not in text


def test_batch_size_binds_only_axis_0(tmp_path):
    """A symbolic dim on axis 1 is not bound by --batch-size; --dim binds it."""
    x = helper.make_tensor_value_info("x", F, ["N", "T"])
    y = helper.make_tensor_value_info("y", F, ["N", "T"])
    path = _save(tmp_path, _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y]))
    with pytest.raises(InputError, match=r"'T' \(axis 1\).*--dim T=VALUE"):
        read_onnx(path, batch_size=2)
    assert read_onnx(path, batch_size=2, dims={"T": 5}).output_bytes == [[40], [40]]


def test_unknown_dim_name_is_an_error(tmp_path):
    """--dim with a name the model does not use is a typo, not silently ignored."""
    with pytest.raises(InputError, match=r"--dim M: the model has no symbolic dim .*its dims: N"):
        read_onnx(_save(tmp_path, _cnn()), dims={"M": 2})


def test_shared_initializer_colocates_consumers_and_counts_once(tmp_path):
    """W[4,4] (64 bytes) read by two MatMuls: one group, bytes on the first only; Relu stays alone."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m1"], name="m1"),
        helper.make_node("Relu", ["m1"], ["r"], name="r"),
        helper.make_node("MatMul", ["r", "W"], ["m2"], name="m2"),
    ]
    x = helper.make_tensor_value_info("x", F, [2, 4])
    y = helper.make_tensor_value_info("m2", F, [2, 4])
    g = read_onnx(_save(tmp_path, _model(nodes, [x], [y], [_init("W", np.zeros((4, 4), np.float32))])))
    assert g.names == ["x", "m1", "r", "m2"]
    assert g.persistent_bytes == [0, 64, 0, 0]
    assert g.group == [0, 1, 2, 1]


def test_names_ports_and_custom_domain(tmp_path):
    """Duplicate and missing names made unique as documented; Split's ports; a custom-domain op."""
    nodes = [
        helper.make_node("Split", ["x"], ["s0", "s1"], name="a", axis=1),
        helper.make_node("Mul", ["s1", "s0"], ["m"], name="a"),  # duplicate: a_1
        helper.make_node("Relu", ["m"], ["r1"]),  # no name: Relu_2, but node 3 claims it: Relu_2_1
        helper.make_node("Relu", ["r1"], ["r2"], name="Relu_2"),
        helper.make_node("Foo", ["r2"], ["z"], name="foo", domain="com.example"),
    ]
    x = helper.make_tensor_value_info("x", F, [2, 4])
    z = helper.make_tensor_value_info("z", F, [2, 2])
    model = _model(nodes, [x], [z], extra_opsets=[("com.example", 1)])
    got = read_onnx_with_notes(_save(tmp_path, model))
    g = got.graph
    assert g.names == ["x", "a", "a_1", "Relu_2_1", "Relu_2", "foo"]
    assert g.op_types[5] == "com.example.Foo"
    assert g.output_bytes[1] == [16, 16]  # two [2,2] float32 halves
    assert list(zip(g.edge_src, g.edge_port, g.edge_dst))[:3] == [(0, 0, 1), (1, 1, 2), (1, 0, 2)]
    # Foo's output is a graph output declared [2,2]: known. A custom op's typed output is fine.
    assert g.output_bytes[5] == [16]
    assert got.opset == 17


def test_uninferable_output_is_flagged_and_noted(tmp_path):
    """NonZero's output dim depends on data: counted as 1 and flagged, with a note."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="nz"), helper.make_node("Neg", ["nz"], ["y"])]
    x = helper.make_tensor_value_info("x", F, [3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [2, None])
    got = read_onnx_with_notes(_save(tmp_path, _model(nodes, [x], [y])))
    g = got.graph
    assert g.output_shapes[1] == [(2, 1)] and g.output_bytes[1] == [16]  # 2 x 1 int64
    assert g.attrs[1]["_size_unknown"] == [0]
    assert any("could not determine" in n for n in got.notes)


def _save_cnn_with_external_weights(tmp_path) -> str:
    """The CNN with every initializer in tmp_path/weights.bin."""
    return _save(
        tmp_path,
        _cnn(),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )


def test_external_data_absent_still_reads_with_a_note(tmp_path):
    """Weights in weights.bin, then deleted: dims still give persistent bytes; a note says so."""
    path = _save_cnn_with_external_weights(tmp_path)
    os.remove(tmp_path / "weights.bin")
    got = read_onnx_with_notes(path, batch_size=2)
    g = got.graph
    assert g.persistent_bytes == CNN_PERSISTENT
    assert g.output_bytes[:4] == CNN_BYTES_B2[:4] and g.output_bytes[5] == [80]
    # Reshape's shape operand [0,-1] is in the missing file: its output is a guess.
    assert g.attrs[4]["_size_unknown"] == [0]
    note = got.notes[0]
    assert "external data not loaded: 5 tensor(s), 3064 bytes in weights.bin; missing: weights.bin" in note


def test_external_data_present_loads_only_small_integer_tensors(tmp_path):
    """With weights.bin present, the int64 shape operand is loaded so Reshape resolves; weights stay unloaded."""
    path = _save_cnn_with_external_weights(tmp_path)
    got = read_onnx_with_notes(path, batch_size=2)
    assert got.graph.output_bytes == CNN_BYTES_B2
    assert got.notes == [
        "external data not loaded: 4 tensor(s), 3048 bytes in weights.bin; placement uses their dims only"
    ]


def _wide_gemm():
    """x[2,2048] -> Gemm(W 2048x64, in the file: 512 KiB) -> y; s, an int64 weight, stays whole."""
    w = _init("W", np.arange(2048 * 64, dtype=np.float32).reshape(2048, 64))
    s = _init("s", np.array([2, 64], np.int64))
    nodes = [
        helper.make_node("Gemm", ["x", "W"], ["g"], name="gemm"),
        helper.make_node("Reshape", ["g", "s"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", F, [2, 2048])
    y = helper.make_tensor_value_info("y", F, [2, 64])
    return _model(nodes, [x], [y], [w, s])


def test_weights_in_the_file_read_as_their_dims_say(tmp_path):
    """Checking and inference do without the 512 KiB of W: the graph equals the one read with W external."""
    inline = read_onnx_with_notes(_save(tmp_path, _wide_gemm()), batch_size=None)
    external = read_onnx_with_notes(
        _save(
            tmp_path,
            _wide_gemm(),
            "e.onnx",
            save_as_external_data=True,
            location="w.bin",
            size_threshold=4096,
        ),
        batch_size=None,
    )
    assert inline.notes == [] and "1 tensor(s), 524288 bytes" in external.notes[0]
    assert inline.graph.persistent_bytes == external.graph.persistent_bytes == [0, 2048 * 64 * 4, 16]
    assert (
        inline.graph.output_bytes
        == external.graph.output_bytes
        == [[2 * 2048 * 4], [2 * 64 * 4], [2 * 64 * 4]]
    )


def test_a_weight_whose_bytes_do_not_match_its_dims_is_an_error(tmp_path):
    model = _wide_gemm()
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:-4]
    with pytest.raises(
        InputError, match=r"initializer 'W' holds 524284 bytes; its dims and type need 524288"
    ):
        read_onnx(_save(tmp_path, model))


@pytest.mark.parametrize("garbage", [b"\xff\xff", b"\x0a" + b"\xff" * 5000])
def test_an_undecodable_initializer_is_not_an_onnx_model(tmp_path, garbage):
    """A graph field holding an initializer that is not a tensor, small or past the weight size."""
    from baechi_cli.io.protowire import fields, tag, varint

    data = _wide_gemm().SerializeToString()
    (graph,) = [f for f in fields(data) if f.number == 7]
    initializer = tag(5, 2) + varint(len(garbage)) + garbage
    payload = data[graph.payload : graph.end] + initializer
    path = tmp_path / "m.onnx"
    path.write_bytes(data[: graph.start] + tag(7, 2) + varint(len(payload)) + payload + data[graph.end :])
    with pytest.raises(InputError, match=r"m.onnx: not an ONNX model: binary protobuf parse failed"):
        read_onnx(str(path))


def test_old_opset_is_an_error(tmp_path):
    """Opset 11 is refused, saying which opset, that 13+ is needed and how to convert."""
    x = helper.make_tensor_value_info("x", F, [2])
    y = helper.make_tensor_value_info("y", F, [2])
    path = _save(tmp_path, _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y], opset=11))
    with pytest.raises(InputError, match=r"opset 11; opset 13 or newer is needed.*version_converter"):
        read_onnx(path)


@pytest.mark.parametrize("data", [b"\xff\xff\xff\xff garbage \x00\x01", b"hello, this is plain text\n"])
def test_not_an_onnx_file(tmp_path, data):
    """Bytes that do not decode, or decode to no model graph, are 'not an ONNX model'."""
    path = tmp_path / "x.onnx"
    path.write_bytes(data)
    with pytest.raises(InputError, match="not an ONNX model"):
        read_onnx(str(path))


def test_checker_failure_names_the_problem(tmp_path):
    """A node reading an undefined value fails onnx.checker; its message, on one line, is the error."""
    x = helper.make_tensor_value_info("x", F, [2])
    y = helper.make_tensor_value_info("y", F, [2])
    path = _save(tmp_path, _model([helper.make_node("Relu", ["zz"], ["y"], name="r")], [x], [y]))
    with pytest.raises(InputError) as err:
        read_onnx(path)
    text = str(err.value)
    assert "fails the ONNX checker" in text and "zz" in text and "\n" not in text


def test_if_is_one_op_with_an_edge_from_the_outer_value(tmp_path):
    """If's branches read h (outer Relu): one If op, edges from c (explicit) and from h's producer."""
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["h"], ["t"])], "then", [], [helper.make_tensor_value_info("t", F, [2, 3])]
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["h"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F, [2, 3])]
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="h"),
        helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g),
    ]
    inputs = [
        helper.make_tensor_value_info("x", F, [2, 3]),
        helper.make_tensor_value_info("c", TensorProto.BOOL, []),
    ]
    g = read_onnx(_save(tmp_path, _model(nodes, inputs, [helper.make_tensor_value_info("y", F, [2, 3])])))
    assert g.names == ["x", "c", "h", "if"]
    assert list(zip(g.edge_src, g.edge_port, g.edge_dst)) == [(0, 0, 2), (1, 0, 3), (2, 0, 3)]
    assert g.output_bytes[1] == [1] and g.output_bytes[3] == [24]
    assert g.attrs[3]["_subgraph_ops"] == 2
    assert "then_branch" not in g.attrs[3]


def test_loop_reads_outer_value_and_initializer(tmp_path):
    """Loop body reads h (outer op) and b (top-level initializer, also read by Add): edge, shared group, bytes."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["v_in", "b"], ["a"]),
            helper.make_node("Mul", ["a", "h"], ["v_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", F, [2, 3]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", F, [2, 3]),
        ],
    )
    nodes = [
        helper.make_node("Add", ["x", "b"], ["h"], name="h"),
        helper.make_node("Loop", ["M", "", "x"], ["y"], name="loop", body=body),
    ]
    inits = [_init("M", np.array(3, np.int64)), _init("b", np.zeros(3, np.float32))]  # 8 and 12 bytes
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, [2, 3])],
        inits,
    )
    g = read_onnx(_save(tmp_path, model))
    assert g.names == ["x", "h", "loop"]
    # Explicit x, then the implicit h; "" (omitted cond) and initializer M make no edge.
    assert list(zip(g.edge_src, g.edge_port, g.edge_dst)) == [(0, 0, 1), (0, 0, 2), (1, 0, 2)]
    assert g.attrs[2]["_subgraph_ops"] == 3
    assert g.attrs[2]["_input_shapes"] == [(), None, (2, 3)]
    assert g.attrs[2]["_initializers"] == ["M", "b"]
    assert g.persistent_bytes == [0, 12, 8]  # b goes to its first consumer h; M to the loop
    assert g.group == [0, 1, 1]
    assert g.output_bytes[2] == [24]


def _record(node):
    """A SubgraphNode without its attrs' nested records: what a test compares."""
    return (node.name, node.op_type, node.output_shapes, node.output_dtypes, node.output_bytes)


def test_if_records_its_branch_nodes_with_inferred_shapes(tmp_path):
    """Each branch node is recorded as an op is: shapes inferred inside the branch, outer values and
    initializers (top-level W, the branch's own V) resolved by name."""
    then_g = helper.make_graph(
        [helper.make_node("MatMul", ["h", "W"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", F, None)],  # no shape declared: inference gives [2, 4]
    )
    else_g = helper.make_graph(
        [helper.make_node("MatMul", ["h", "V"], ["m"], name="mm"), helper.make_node("Relu", ["m"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", F, None)],
        [_init("V", np.zeros((3, 4), np.float32))],  # 48 bytes, the branch's own
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="h"),
        helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g),
    ]
    inputs = [
        helper.make_tensor_value_info("x", F, [2, 3]),
        helper.make_tensor_value_info("c", TensorProto.BOOL, []),
    ]
    model = _model(
        nodes,
        inputs,
        [helper.make_tensor_value_info("y", F, [2, 4])],
        [_init("W", np.zeros((3, 4), np.float32))],
    )
    got = read_onnx_with_notes(_save(tmp_path, model))
    g = got.graph
    records = g.attrs[3]["_subgraph_nodes"]
    # In attribute order (onnx.helper sorts attributes by name), then node order.
    assert [_record(r) for r in records] == [
        ("else_branch/mm", "MatMul", [(2, 4)], ["float32"], [32]),
        ("else_branch/Relu_1", "Relu", [(2, 4)], ["float32"], [32]),
        ("then_branch/MatMul_0", "MatMul", [(2, 4)], ["float32"], [32]),
    ]
    assert [(r.attrs["_input_shapes"], r.attrs["_input_dtypes"]) for r in records] == [
        ([(2, 3), (3, 4)], ["float32", "float32"]),  # h from the top-level Relu, V the branch's initializer
        ([(2, 4)], ["float32"]),  # m from the branch itself
        ([(2, 3), (3, 4)], ["float32", "float32"]),  # W a top-level initializer
    ]
    assert g.attrs[3]["_subgraph_ops"] == 3 and g.attrs[3]["_initializers"] == ["W"]
    assert g.persistent_bytes == [0, 0, 0, 48 + 48]  # W (its only consumer) and V
    assert list(zip(g.edge_src, g.edge_port, g.edge_dst)) == [(0, 0, 2), (1, 0, 3), (2, 0, 3)]
    assert got.notes == []


def _loop_with_nested_if(v_shape):
    """Loop body: m = v_in @ B (B the body's initializer); If(cond_in) then m + h (h a top-level op's
    output) else -m; the If's output is v_out."""
    then_g = helper.make_graph(
        [helper.make_node("Add", ["m", "h"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", F, None)],
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["m"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F, None)]
    )
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["v_in", "B"], ["m"]),
            helper.make_node("If", ["cond_in"], ["v_out"], then_branch=then_g, else_branch=else_g),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
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
        [_init("B", np.zeros((3, 3), np.float32))],  # 36 bytes
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="h"),
        helper.make_node("Loop", ["M", "c", "x"], ["y"], name="loop", body=body),
    ]
    inputs = [
        helper.make_tensor_value_info("x", F, [2, 3]),
        helper.make_tensor_value_info("c", TensorProto.BOOL, []),
    ]
    outputs = [helper.make_tensor_value_info("y", F, [2, 3])]
    return _model(nodes, inputs, outputs, [_init("M", np.array(3, np.int64))])


def test_loop_records_a_nested_if_with_its_own_branch_nodes(tmp_path):
    """A nested If's record carries its branches' records; the branches read m from the enclosing body
    and h from the top-level graph (an implicit edge into the Loop)."""
    got = read_onnx_with_notes(_save(tmp_path, _loop_with_nested_if([2, 3])))
    g = got.graph
    assert g.names == ["x", "c", "h", "loop"]
    assert g.attrs[3]["_subgraph_ops"] == 5
    body = g.attrs[3]["_subgraph_nodes"]
    assert [_record(r) for r in body] == [
        ("body/MatMul_0", "MatMul", [(2, 3)], ["float32"], [24]),
        ("body/If_1", "If", [(2, 3)], ["float32"], [24]),
        ("body/Identity_2", "Identity", [()], ["bool"], [1]),
    ]
    assert body[0].attrs["_input_shapes"] == [(2, 3), (3, 3)]  # v_in as the body declares it, B
    nested = body[1].attrs
    assert nested["_subgraph_ops"] == 2 and nested["_input_shapes"] == [()]
    assert [_record(r) for r in nested["_subgraph_nodes"]] == [
        ("else_branch/Neg_0", "Neg", [(2, 3)], ["float32"], [24]),
        ("then_branch/Add_0", "Add", [(2, 3)], ["float32"], [24]),
    ]
    assert nested["_subgraph_nodes"][1].attrs["_input_shapes"] == [(2, 3), (2, 3)]  # m (body), h (top)
    # Explicit c and x, then the implicit h; M is an initializer.
    assert list(zip(g.edge_src, g.edge_port, g.edge_dst)) == [(0, 0, 2), (1, 0, 3), (0, 0, 3), (2, 0, 3)]
    assert g.persistent_bytes == [0, 0, 0, 8 + 36]  # M and the body's B
    assert got.notes == []


def test_subgraph_values_of_unknown_size_are_flagged_and_noted(tmp_path):
    """ONNX's Loop inference drops loop-carried shapes: a body input declared without one leaves the
    nodes computed from it unknown (rank unknown: 0 bytes), flagged on their records and counted in the note."""
    got = read_onnx_with_notes(_save(tmp_path, _loop_with_nested_if(None)))
    body = got.graph.attrs[3]["_subgraph_nodes"]
    assert body[0].output_shapes == [None] and body[0].output_bytes == [0]
    assert body[0].attrs["_size_unknown"] == [0] and body[0].attrs["_input_shapes"] == [None, (3, 3)]
    flagged = [r.name for r in body[1].attrs["_subgraph_nodes"] if "_size_unknown" in r.attrs]
    assert flagged == ["else_branch/Neg_0", "then_branch/Add_0"]
    assert "_size_unknown" in body[1].attrs and "_size_unknown" not in body[2].attrs
    assert got.notes == [
        "4 output(s) (4 of them in If/Loop/Scan subgraphs) have sizes shape inference could not determine "
        "(data-dependent, or from external data not loaded); counted as 1 per unknown dim, 0 bytes for unknown rank"
    ]


def test_unknown_dtype_names_the_tensor(tmp_path):
    """An element type outside ONNX's DataType enum (99; the checker lets it pass) is an error naming the tensor."""
    x = helper.make_tensor_value_info("x", 99, [2])
    y = helper.make_tensor_value_info("y", 99, [2])
    path = _save(tmp_path, _model([helper.make_node("Identity", ["x"], ["y"])], [x], [y]))
    with pytest.raises(InputError, match=r"tensor 'x' has unknown ONNX data type 99"):
        read_onnx(path)


def test_dims_named_only_on_outputs_are_guesses_not_errors(tmp_path):
    """torch's exporter names data-dependent output dims (a Loop's trip count, NonZero's count):
    there is nothing to bind, so they count as 1 and are noted, like inference's own unknowns."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [2, "nonzero_dim_1"])
    model = helper.make_model(
        helper.make_graph([helper.make_node("NonZero", ["x"], ["y"], name="nz")], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    path = tmp_path / "nonzero.onnx"
    onnx.save(model, str(path))
    read = read_onnx_with_notes(str(path))
    nz = read.graph.index()["nz"]
    assert read.graph.output_shapes[nz] == [(2, 1)]
    assert read.graph.attrs[nz]["_size_unknown"] == [0]
    assert any("1 output" in n for n in read.notes), read.notes
