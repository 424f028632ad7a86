"""baechi_cli.io.graphdef: GraphDef -> OpGraph, and the placed-graph writer.

Most graphs here are built by hand with our own proto module, so the suite
runs without TensorFlow; tests marked ``tf`` build real graphs with
TensorFlow's graph mode and are skipped without it.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from baechi_cli.core.errors import InputError
from baechi_cli.core.graph import CONTROL_PORT
from baechi_cli.io.graphdef import DTYPE_NAMES, DTYPE_SIZES, read_graphdef, write_placed_graphdef
from baechi_cli.proto_gen import tf_graph_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ helpers


class Dt:
    """A DataType attr value (plain ints are int attrs)."""

    def __init__(self, enum: int) -> None:
        self.enum = enum


F32, I32, STR, RES = Dt(pb.DT_FLOAT), Dt(pb.DT_INT32), Dt(pb.DT_STRING), Dt(pb.DT_RESOURCE)


def _shape(dims) -> pb.TensorShapeProto:
    if dims is None:
        return pb.TensorShapeProto(unknown_rank=True)
    return pb.TensorShapeProto(dim=[pb.TensorShapeProto.Dim(size=d) for d in dims])


def _attr(value) -> pb.AttrValue:
    if isinstance(value, pb.AttrValue):
        return value
    if isinstance(value, Dt):
        return pb.AttrValue(type=value.enum)
    if isinstance(value, bool):
        return pb.AttrValue(b=value)
    if isinstance(value, int):
        return pb.AttrValue(i=value)
    if isinstance(value, float):
        return pb.AttrValue(f=value)
    if isinstance(value, str):
        return pb.AttrValue(s=value.encode())
    if isinstance(value, bytes):
        return pb.AttrValue(s=value)
    if value is None or isinstance(value, tuple):  # None: a shape of unknown rank
        return pb.AttrValue(shape=_shape(value))
    assert isinstance(value, list)
    if value and isinstance(value[0], Dt):
        return pb.AttrValue(list=pb.AttrValue.ListValue(type=[v.enum for v in value]))
    if value and isinstance(value[0], str):
        return pb.AttrValue(list=pb.AttrValue.ListValue(s=[v.encode() for v in value]))
    return pb.AttrValue(list=pb.AttrValue.ListValue(i=value))


def node(name, op, inputs=(), *, shapes=(), device="", **attrs) -> pb.NodeDef:
    """A NodeDef; ``shapes`` becomes ``_output_shapes`` unless None."""
    n = pb.NodeDef(name=name, op=op, input=list(inputs), device=device)
    for key, value in attrs.items():
        n.attr[key].CopyFrom(_attr(value))
    if shapes is not None:
        n.attr["_output_shapes"].list.shape.extend(_shape(s) for s in shapes)
    return n


def graph(*nodes, library=None) -> pb.GraphDef:
    g = pb.GraphDef(node=list(nodes), versions=pb.VersionDef(producer=2100))
    if library is not None:
        g.library.CopyFrom(library)
    return g


def write(tmp_path: Path, graph_def: pb.GraphDef, name: str = "g.pb") -> str:
    from google.protobuf import text_format

    path = tmp_path / name
    if name.endswith((".pbtxt", ".txt")):
        path.write_text(text_format.MessageToString(graph_def))
    else:
        path.write_bytes(graph_def.SerializeToString())
    return str(path)


def small_graph() -> pb.GraphDef:
    """x, w -> read -> matmul -> split -> addn, with control edges and _class."""
    const = node("c", "Const", shapes=[()], dtype=I32)
    const.attr["value"].tensor.CopyFrom(
        pb.TensorProto(dtype=pb.DT_INT32, tensor_shape=_shape(()), int_val=[1])
    )
    return graph(
        node("x", "Placeholder", shapes=[(-1, 4)], dtype=F32, shape=(-1, 4)),
        node("w", "VarHandleOp", shapes=[()], dtype=F32, shape=(4, 2), shared_name="w", _class=["loc:@w"]),
        node("read", "ReadVariableOp", ["w"], shapes=[(4, 2)], dtype=F32, _class=["loc:@w"]),
        node(
            "mm", "MatMul", ["x", "read"], shapes=[(-1, 2)], T=F32, transpose_a=False, device="/device:GPU:1"
        ),
        const,
        node("split", "Split", ["c", "mm"], shapes=[(-1, 1), (-1, 1)], T=F32, num_split=2),
        node("noop", "NoOp", ["^mm", "^split"], shapes=None),
        node("sum", "AddN", ["split:1", "split", "^noop"], shapes=[(-1, 1)], T=F32, N=2),
    )


@pytest.fixture(scope="module")
def tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return pytest.importorskip("tensorflow")


def read_error(path: str, **kwargs) -> InputError:
    with pytest.raises(InputError) as info:
        read_graphdef(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(path), message
    return info.value


# ------------------------------------------------------------------ reading


def test_ops_edges_types_shapes_and_bytes(tmp_path):
    g = read_graphdef(write(tmp_path, small_graph()), batch_size=8)
    assert g.names == ["x", "w", "read", "mm", "c", "split", "noop", "sum"]
    assert g.op_types[3] == "MatMul"
    ids = g.index()
    # Data inputs in input order, then control inputs; "x" is port 0.
    edges = [(g.names[g.edge_src[e]], g.edge_port[e]) for e in g.in_edges[ids["sum"]]]
    assert edges == [("split", 1), ("split", 0), ("noop", CONTROL_PORT)]
    assert [g.edge_bytes[e] for e in g.in_edges[ids["sum"]]] == [32, 32, 0]
    assert g.output_dtypes[ids["w"]] == ["resource"]
    assert g.output_bytes[ids["w"]] == [0]
    assert g.output_shapes[ids["x"]] == [(8, 4)]
    assert g.output_bytes[ids["x"]] == [8 * 4 * 4]
    assert g.output_dtypes[ids["split"]] == ["float32", "float32"]
    assert g.output_shapes[ids["split"]] == [(8, 1), (8, 1)]
    assert g.output_bytes[ids["c"]] == [4]  # a scalar
    assert g.output_dtypes[ids["noop"]] == [] and g.output_bytes[ids["noop"]] == []
    assert g.colocate_with[ids["read"]] == ("w",)
    assert g.colocate_with[ids["mm"]] == ()
    assert g.held_outputs == {(ids["x"], 0)}  # the caller feeds x and keeps it for the step


def test_attrs_are_decoded(tmp_path):
    g = read_graphdef(write(tmp_path, small_graph()), batch_size=8)
    ids = g.index()
    assert g.attrs[ids["w"]] == {
        "dtype": "float32",
        "shape": (4, 2),
        "shared_name": "w",
        "_input_types": [],
    }
    assert g.attrs[ids["x"]]["shape"] == (-1, 4)  # attrs keep TensorFlow's -1
    assert g.attrs[ids["mm"]] == {
        "T": "float32",
        "transpose_a": False,
        "_device": "/device:GPU:1",
        "_input_types": ["float32", "float32"],
    }
    assert g.attrs[ids["c"]] == {"dtype": "int32", "value_shape": (), "_input_types": []}
    assert g.attrs[ids["split"]]["num_split"] == 2
    assert g.attrs[ids["split"]]["_input_types"] == ["int32", "float32"]
    assert g.attrs[ids["read"]]["_input_types"] == ["resource"]
    assert g.attrs[ids["sum"]]["_input_types"] == ["float32", "float32"]


def test_attr_kinds(tmp_path):
    n = node(
        "p",
        "Placeholder",
        shapes=[(2,)],
        dtype=F32,
        shape=None,
        f=0.5,
        s=b"\xffok",
        ints=[1, 2],
        types=[F32, I32],
        strs=["a", "b"],
    )
    n.attr["fn"].func.name = "body"
    n.attr["shapes"].list.shape.extend([_shape((1, -1)), _shape(None)])
    n.attr["fns"].list.func.add(name="f1")
    n.attr["tensors"].list.tensor.add(dtype=pb.DT_FLOAT)
    n.attr["empty"].list.SetInParent()
    attrs = read_graphdef(write(tmp_path, graph(n))).attrs[0]
    assert attrs["shape"] is None
    assert attrs["f"] == 0.5
    assert attrs["s"] == "\ufffdok"
    assert attrs["ints"] == [1, 2]
    assert attrs["types"] == ["float32", "int32"]
    assert attrs["strs"] == ["a", "b"]
    assert attrs["fn"] == "body"
    assert attrs["shapes"] == [(1, -1), None]
    assert attrs["fns"] == ["f1"]
    assert attrs["empty"] == []
    assert "tensors" not in attrs


def test_batch_size_is_required_only_for_sized_tensors(tmp_path):
    path = write(
        tmp_path,
        graph(
            node("names", "Placeholder", shapes=[(-1,)], dtype=STR, shape=(-1,)),
            node("handle", "VarHandleOp", shapes=[None], dtype=F32, shape=(2,)),
            node("x", "Placeholder", shapes=[(-1, 3)], dtype=F32, shape=(-1, 3)),
            node("y", "Placeholder", shapes=[(-1, 5)], dtype=F32, shape=(-1, 5)),
        ),
    )
    err = read_error(path)
    assert err.op == "x"
    assert "--batch-size" in str(err) and "[?, 3]" in str(err)
    g = read_graphdef(path, batch_size=2)
    assert g.output_shapes == [[(2,)], [None], [(2, 3)], [(2, 5)]]
    assert g.output_bytes == [[0], [0], [24], [40]]


def test_text_and_binary_are_told_apart_by_content(tmp_path):
    expected = read_graphdef(write(tmp_path, small_graph()), batch_size=1)
    for name in ("g.pbtxt", "g.txt"):
        assert read_graphdef(write(tmp_path, small_graph(), name), batch_size=1).names == expected.names
    text_as_pb = tmp_path / "text.pb"
    text_as_pb.write_bytes((tmp_path / "g.pbtxt").read_bytes())
    binary_as_pbtxt = tmp_path / "binary.pbtxt"
    binary_as_pbtxt.write_bytes((tmp_path / "g.pb").read_bytes())
    for path in (text_as_pb, binary_as_pbtxt):
        g = read_graphdef(str(path), batch_size=1)
        assert (g.names, g.output_bytes, g.attrs) == (expected.names, expected.output_bytes, expected.attrs)


def test_ref_variables_and_stripped_default_attrs(tmp_path):
    g = read_graphdef(
        write(
            tmp_path,
            graph(
                node("v", "VariableV2", shapes=[(3,)], dtype=F32, shape=(3,)),
                node("init", "Const", shapes=[(3,)], dtype=F32),
                node("assign", "Assign", ["v", "init"], shapes=[(3,)], T=F32),
                node("axis", "Const", shapes=[()], dtype=I32),
                # ConcatV2 written without its Tidx attr (default int32), as
                # strip_default_attrs does.
                node("cat", "ConcatV2", ["v", "init", "axis"], shapes=[(6,)], T=F32, N=2),
            ),
        )
    )
    assert g.output_dtypes[0] == ["float32_ref"]
    assert g.output_bytes[0] == [12]
    assert g.attrs[2]["_input_types"] == ["float32_ref", "float32"]
    assert g.output_dtypes[2] == ["float32_ref"]
    assert g.attrs[4]["_input_types"] == ["float32", "float32", "int32"]


def test_library_function_called_by_op_name(tmp_path):
    signature = pb.OpDef(
        name="my_fn",
        input_arg=[pb.OpDef.ArgDef(name="a", type=pb.DT_FLOAT)],
        output_arg=[
            pb.OpDef.ArgDef(name="b", type=pb.DT_FLOAT),
            pb.OpDef.ArgDef(name="c", type_attr="Tc", number_attr="n"),
        ],
        attr=[
            pb.OpDef.AttrDef(name="Tc", type="type", default_value=pb.AttrValue(type=pb.DT_INT64)),
            pb.OpDef.AttrDef(name="n", type="int", default_value=pb.AttrValue(i=2)),
        ],
    )
    library = pb.FunctionDefLibrary(function=[pb.FunctionDef(signature=signature)])
    g = read_graphdef(
        write(
            tmp_path,
            graph(
                node("x", "Placeholder", shapes=[(2,)], dtype=F32),
                node("call", "my_fn", ["x"], shapes=[(2,), (), ()]),
                node("use", "Identity", ["call:2"], shapes=[()], T=Dt(pb.DT_INT64)),
                library=library,
            ),
        )
    )
    assert g.output_dtypes[1] == ["float32", "int64", "int64"]
    assert g.output_bytes[1] == [8, 8, 8]
    assert g.attrs[1]["_input_types"] == ["float32"]


def test_unknown_op_types_fall_back_to_type_attrs(tmp_path):
    custom = node("two", "MyCustomOp", ["x"], shapes=[(2,), (2,)], T=F32)
    listed = node("listed", "OtherCustomOp", ["x"], shapes=[(2,), ()], _output_types=[I32, Dt(pb.DT_BOOL)])
    g = read_graphdef(
        write(tmp_path, graph(node("x", "Placeholder", shapes=[(2,)], dtype=F32), custom, listed))
    )
    assert g.output_dtypes[1] == ["float32", "float32"]
    assert g.output_dtypes[2] == ["int32", "bool"]
    assert g.output_bytes[2] == [8, 1]
    assert "_input_types" not in g.attrs[1]  # the colocation pass uses the producers' types


def test_tf1_while_loop_back_edges_are_kept(tmp_path):
    g = read_graphdef(
        write(
            tmp_path,
            graph(
                node("i0", "Const", shapes=[()], dtype=I32),
                node("enter", "Enter", ["i0"], shapes=[()], T=I32, frame_name="loop"),
                node("merge", "Merge", ["enter", "next"], shapes=[(), ()], T=I32, N=2),
                node("cond", "Less", ["merge", "i0"], shapes=[()], T=I32),
                node("loop_cond", "LoopCond", ["cond"], shapes=[()]),
                node("switch", "Switch", ["merge", "loop_cond"], shapes=[(), ()], T=I32),
                node("body", "Identity", ["switch:1"], shapes=[()], T=I32),
                node("next", "NextIteration", ["body"], shapes=[()], T=I32),
                node("exit", "Exit", ["switch"], shapes=[()], T=I32),
            ),
        )
    )
    ids = g.index()
    assert g.output_dtypes[ids["merge"]] == ["int32", "int32"]
    assert g.output_dtypes[ids["loop_cond"]] == ["bool"]
    back = [e for e in range(g.num_edges) if g.edge_src[e] == ids["next"]]
    assert [g.edge_dst[e] for e in back] == [ids["merge"]]


# -------------------------------------------------------------- bad input


def _cyclic() -> pb.GraphDef:
    return graph(
        node("x", "Placeholder", shapes=[(1,)], dtype=F32),
        node("a", "AddV2", ["x", "b"], shapes=[(1,)], T=F32),
        node("b", "Relu", ["a"], shapes=[(1,)], T=F32),
    )


def _bad_dtype() -> pb.GraphDef:
    g = graph(node("x", "Placeholder", shapes=[(1,)], dtype=F32), node("y", "Relu", ["x"], shapes=[(1,)]))
    g.node[1].attr["T"].type = 999
    return g


BAD_GRAPHS = {
    "empty graph": (graph(), None, "empty"),
    "missing input": (
        graph(node("y", "Relu", ["nope:0"], shapes=[(1,)], T=F32)),
        "y",
        "input 'nope:0' names no node",
    ),
    "duplicate names": (
        graph(
            node("x", "Placeholder", shapes=[(1,)], dtype=F32),
            node("x", "Placeholder", shapes=[(1,)], dtype=F32),
        ),
        "x",
        "duplicate node name",
    ),
    "unknown dtype enum": (_bad_dtype(), "y", "unknown DataType enum value 999"),
    "port out of range": (
        graph(
            node("x", "Placeholder", shapes=[(1,)], dtype=F32),
            node("y", "Relu", ["x:1"], shapes=[(1,)], T=F32),
        ),
        "y",
        "'x:1' is out of range: 'x' (Placeholder) has 1 outputs",
    ),
    "malformed input": (
        graph(
            node("x", "Placeholder", shapes=[(1,)], dtype=F32),
            node("y", "Relu", ["x:a"], shapes=[(1,)], T=F32),
        ),
        "y",
        "malformed",
    ),
    "data after control input": (
        graph(
            node("x", "Placeholder", shapes=[(1,)], dtype=F32),
            node("y", "AddV2", ["x", "^x", "x"], shapes=[(1,)], T=F32),
        ),
        "y",
        "follows a control input",
    ),
    "too few inputs": (
        graph(
            node("x", "Placeholder", shapes=[(1,)], dtype=F32),
            node("y", "AddV2", ["x"], shapes=[(1,)], T=F32),
        ),
        "y",
        "has 1 data inputs but op type AddV2 declares 2",
    ),
    "type attr of the wrong kind": (
        graph(node("x", "Placeholder", shapes=[(1,)], dtype="float32")),
        "x",
        "attr 'dtype' must be a type",
    ),
    "negative number attr": (
        graph(node("x", "Split", shapes=[], T=F32, num_split=-1)),
        "x",
        "attr 'num_split' is negative (-1)",
    ),
    "missing type attr": (graph(node("x", "Placeholder", shapes=[(1,)])), "x", "attr 'dtype' is missing"),
    "unknown op type": (
        graph(node("x", "NoSuchOp", shapes=[(1,)])),
        "x",
        "unknown op type 'NoSuchOp'",
    ),
    "unknown rank": (
        graph(node("x", "Placeholder", shapes=[None], dtype=F32)),
        "x",
        "output 0 (float32) has unknown rank",
    ),
    "shape count": (
        graph(node("x", "Placeholder", shapes=[(1,), (1,)], dtype=F32)),
        "x",
        "has 2 output shapes but op type Placeholder has 1 outputs",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_GRAPHS))
def test_bad_graphs_give_one_line_naming_file_and_op(tmp_path, case):
    graph_def, op, problem = BAD_GRAPHS[case]
    err = read_error(write(tmp_path, graph_def), batch_size=1)
    assert err.op == op
    if op is not None:
        assert f"op '{op}'" in str(err)
    assert problem in str(err)


def test_batch_size_must_be_positive(tmp_path):
    with pytest.raises(InputError, match="positive"):
        read_graphdef(write(tmp_path, small_graph()), batch_size=0)


def test_missing_file(tmp_path):
    assert "no such file" in str(read_error(str(tmp_path / "absent.pb")))


def test_directory(tmp_path):
    assert "directory" in str(read_error(str(tmp_path)))


PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489") + b"\x00" * 16


@pytest.mark.parametrize(
    "name,data",
    [
        ("image.pb", PNG),
        ("image.pbtxt", PNG),
        ("random.pb", random.Random(0).randbytes(4096)),
        ("notes.pbtxt", b"this is { not a graph"),
        ("workload.json", b'{"nodes": []}'),
    ],
)
def test_not_a_graphdef(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    assert "not a" in str(read_error(str(path)))


@pytest.mark.parametrize("keep", [0.5, 0.9, -1])
def test_truncated_file(tmp_path, keep):
    data = small_graph().SerializeToString()
    cut = len(data) - 1 if keep == -1 else int(len(data) * keep)
    path = tmp_path / "cut.pb"
    path.write_bytes(data[:cut])
    err = read_error(str(path), batch_size=1)
    assert "truncated" in str(err) or "names no node" in str(err)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.pb"
    path.write_bytes(b"")
    assert "the file is empty" in str(read_error(str(path)))


def test_missing_shapes_without_tensorflow(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # makes `import tensorflow` raise ImportError
    path = write(
        tmp_path,
        graph(
            node("init", "NoOp", shapes=None),  # no outputs: needs no shapes
            node("x", "Placeholder", shapes=None, dtype=F32, shape=(2,)),
        ),
    )
    err = read_error(path)
    assert err.op == "x"
    assert "add_shapes=True" in str(err) and "baechi[tf]" in str(err)


# ---------------------------------------------------------- import hygiene


def test_reading_never_imports_tensorflow(tmp_path):
    path = write(tmp_path, small_graph())
    code = (
        "import sys\n"
        "import baechi_cli.io.graphdef as m\n"
        "assert 'baechi_cli.proto_gen.tf_graph_pb2' not in sys.modules, 'proto import must be lazy'\n"
        f"g = m.read_graphdef({path!r}, batch_size=2)\n"
        "assert g.num_ops == 8\n"
        "assert 'tensorflow' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ----------------------------------------------------------------- writing


def test_write_sets_every_device_and_nothing_else(tmp_path):
    source = small_graph()
    in_path = write(tmp_path, source)
    devices = {n.name: f"/device:GPU:{i % 2}" for i, n in enumerate(source.node)}
    for out_name in ("placed.pb", "placed.pbtxt"):
        out_path = str(tmp_path / out_name)
        write_placed_graphdef(in_path, devices, out_path)
        placed = read_graphdef(out_path, batch_size=1)
        assert [a["_device"] for a in placed.attrs] == [devices[n] for n in placed.names]
    placed = pb.GraphDef.FromString((tmp_path / "placed.pb").read_bytes())
    for n in placed.node:
        n.device = ""
    for n in source.node:
        n.device = ""
    assert placed == source


def test_write_is_deterministic(tmp_path):
    in_path = write(tmp_path, small_graph())
    devices = {n.name: "/device:GPU:0" for n in small_graph().node}
    outputs = []
    for name in ("a.pb", "b.pb"):
        write_placed_graphdef(in_path, devices, str(tmp_path / name))
        outputs.append((tmp_path / name).read_bytes())
    assert outputs[0] == outputs[1]


def test_write_without_a_device_for_every_node_writes_nothing(tmp_path):
    in_path = write(tmp_path, small_graph())
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(KeyError, match="no device for 7 node"):
        write_placed_graphdef(in_path, {"x": "/device:GPU:0"}, str(tmp_path / "out.pb"))
    assert sorted(os.listdir(tmp_path)) == before


# ------------------------------------------------------ with TensorFlow


@pytest.mark.tf
def test_dtype_tables_match_tensorflow(tf):
    from tensorflow.core.framework import types_pb2

    for value in types_pb2.DataType.DESCRIPTOR.values:
        if value.number == 0:
            assert value.number not in DTYPE_NAMES
            continue
        dtype = tf.dtypes.as_dtype(value.number)
        assert DTYPE_NAMES[value.number] == dtype.name
        assert DTYPE_SIZES[dtype.name] == dtype.size


def _save(tmp_path: Path, graph_def, name: str) -> str:
    path = tmp_path / name
    path.write_bytes(graph_def.SerializeToString())
    return str(path)


@pytest.fixture(scope="module")
def tf1_graph(tf):
    """A TF1 training step: resource and ref variables, Adam, colocated gradients."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 6], name="x")
        labels = tf.compat.v1.placeholder(tf.int64, [None], name="labels")
        w1 = tf.compat.v1.get_variable("w1", [6, 5], use_resource=True)
        w2 = tf.compat.v1.get_variable("w2", [5, 3], use_resource=False)
        logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        tf.compat.v1.train.AdamOptimizer().minimize(loss, colocate_gradients_with_ops=True)
    return g


@pytest.mark.tf
def test_tf1_resource_and_ref_variable_graph(tmp_path, tf1_graph):
    g = read_graphdef(_save(tmp_path, tf1_graph.as_graph_def(add_shapes=True), "tf1.pb"), batch_size=4)
    ids = g.index()
    assert g.output_dtypes[ids["w1"]] == ["resource"]
    assert g.output_dtypes[ids["w2"]] == ["float32_ref"]
    assert g.output_shapes[ids["x"]] == [(4, 6)]
    apply_w1 = ids["Adam/update_w1/ResourceApplyAdam"]
    assert g.attrs[apply_w1]["_input_types"][:3] == ["resource"] * 3
    assert g.colocate_with[apply_w1] == ("w1",)
    apply_w2 = ids["Adam/update_w2/ApplyAdam"]
    assert g.attrs[apply_w2]["_input_types"][:3] == ["float32_ref"] * 3
    # Every op TensorFlow's graph has, with TensorFlow's output dtypes.
    for op in tf1_graph.get_operations():
        assert g.output_dtypes[ids[op.name]] == [t.dtype.name for t in op.outputs], op.name


@pytest.mark.tf
def test_shape_inference_fallback_matches_recorded_shapes(tmp_path, tf1_graph):
    recorded = read_graphdef(_save(tmp_path, tf1_graph.as_graph_def(add_shapes=True), "a.pb"), batch_size=4)
    inferred = read_graphdef(_save(tmp_path, tf1_graph.as_graph_def(), "b.pb"), batch_size=4)
    assert inferred.output_shapes == recorded.output_shapes
    assert inferred.output_bytes == recorded.output_bytes


@pytest.fixture(scope="module")
def tf2_graph_def(tf):
    """The graph of a tf.function training step: captured variables, a call, a While."""
    w = tf.Variable(tf.ones([4, 2]), name="w")

    @tf.function
    def inner(a):
        return tf.nn.relu(a)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = inner(tf.matmul(x, w))
            total = tf.while_loop(lambda i, s: i < 3, lambda i, s: (i + 1, s + tf.reduce_sum(h)), [0, 0.0])[1]
        w.assign_sub(0.1 * tape.gradient(total, w))
        return total

    return step.get_concrete_function(tf.TensorSpec([8, 4], tf.float32)).graph.as_graph_def(add_shapes=True)


@pytest.mark.tf
def test_tf2_function_graph_loads(tmp_path, tf2_graph_def):
    assert tf2_graph_def.library.function
    g = read_graphdef(_save(tmp_path, tf2_graph_def, "tf2.pb"))
    by_type: dict[str, list[int]] = {}
    for v, t in enumerate(g.op_types):
        by_type.setdefault(t, []).append(v)
    captured = [v for v in by_type["Placeholder"] if g.output_dtypes[v] == ["resource"]]
    assert captured, "the variable should be captured as a DT_RESOURCE Placeholder"
    assert by_type.get("StatefulPartitionedCall") or by_type.get("PartitionedCall")
    functions = {f.signature.name for f in tf2_graph_def.library.function}
    calls = by_type.get("StatefulPartitionedCall", []) + by_type.get("PartitionedCall", [])
    assert all(g.attrs[v]["f"] in functions for v in calls)
    assert any(t in by_type for t in ("While", "StatelessWhile"))


@pytest.mark.tf
def test_tf1_while_loop_graph_loads(tmp_path, tf):
    from tensorflow.python.ops import control_flow_util

    saved = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = False
    try:
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
            tf.while_loop(lambda i, s: i < 3, lambda i, s: (i + 1, s * 2.0), [tf.constant(0), x])
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = saved
    graph = read_graphdef(_save(tmp_path, g.as_graph_def(add_shapes=True), "loop.pb"))
    assert "NextIteration" in graph.op_types


@pytest.mark.tf
@pytest.mark.parametrize("out_name", ["placed.pb", "placed.pbtxt"])
def test_placed_graph_equals_input_but_devices_in_tensorflow(tmp_path, tf, tf2_graph_def, out_name):
    from google.protobuf import text_format
    from tensorflow.core.framework import graph_pb2

    in_path = _save(tmp_path, tf2_graph_def, "in.pb")
    devices = {n.name: f"/device:GPU:{i % 3}" for i, n in enumerate(tf2_graph_def.node)}
    out_path = str(tmp_path / out_name)
    write_placed_graphdef(in_path, devices, out_path)
    data = Path(out_path).read_bytes()
    if out_name.endswith(".pbtxt"):
        placed = text_format.Parse(data.decode(), graph_pb2.GraphDef())
    else:
        placed = graph_pb2.GraphDef.FromString(data)
    assert {n.name: n.device for n in placed.node} == devices
    for n in placed.node:
        n.device = ""
    assert placed == graph_pb2.GraphDef.FromString(Path(in_path).read_bytes())
    write_placed_graphdef(in_path, devices, str(tmp_path / ("again" + out_name)))
    assert (tmp_path / ("again" + out_name)).read_bytes() == data
