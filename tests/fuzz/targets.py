"""The fuzzed readers: for each, its seed files, its structure-aware mutations and the call under test.

A :class:`Target` names one reader as the CLI calls it:

=========  ==================  ===================================================================
name       file                call
=========  ==================  ===================================================================
graphdef   ``model.pb``        :func:`baechi_cli.io.formats.load_model` (binary GraphDef reader)
pbtxt      ``model.pbtxt``     :func:`~baechi_cli.io.formats.load_model` (text GraphDef reader)
onnx       ``model.onnx``      :func:`~baechi_cli.io.formats.load_model` (ONNX reader)
workload   ``model.json``      :func:`~baechi_cli.io.formats.load_model` and ``read_workload_meta``
sidecar    ``model.json``      ``load_sidecar`` as ``verify --run`` and as the profiler call it,
                               then ``verify``'s feeds for small inputs
devices    ``devices.yaml``    :func:`baechi_cli.core.devices.parse_devices` of the path (``--devices F``)
devspec    ``spec.txt``        ``parse_devices`` of the file's text (``--devices 4x8GB``)
profile    ``costs.json``      ``load_profile`` then ``apply_profile`` to the seed's model, as
                               ``place --profile`` does
=========  ==================  ===================================================================

Seeds are the committed files in ``testdata/`` (GraphDefs, their text form,
ONNX models, workloads, sidecars), small graphs cut out of them (the
ancestors of one node: whole enough that mutations reach the deep checks),
ONNX models built here for what the committed ones lack (If/Loop subgraphs,
sparse initializers, symbolic dims), device YAML written by
``dump_devices_yaml`` and the README's example, and profiles ``baechi
profile`` writes for a few models. Each seed carries the reader options
(batch size, ONNX dims, the profile's model) its cases are read with.
"""

from __future__ import annotations

import copy
import datetime
import functools
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fuzz.mutators import (
    dump_json,
    interesting_int,
    interesting_string,
    mutate_document,
    mutate_message,
)

TESTDATA = Path(__file__).resolve().parents[2] / "testdata"


@dataclass(frozen=True)
class Seed:
    """One seed input of a target."""

    name: str
    data: bytes
    options: dict[str, Any] = field(default_factory=dict)
    weight: float = 1.0  # how often it is picked, relative to the target's other seeds


def _same_options(rng: random.Random, options: dict[str, Any]) -> dict[str, Any]:
    return options


@dataclass(frozen=True)
class Target:
    """A reader under test (see the module docstring)."""

    name: str
    filename: str  # what a case is written as
    seeds: Callable[[], list[Seed]]
    structure: Callable[[random.Random, Seed], bytes]  # a structure-aware mutation of the seed
    read: Callable[[str, dict[str, Any]], Any]  # the call under test
    # How a case's reader options may differ from its seed's (batch size, dims).
    options: Callable[[random.Random, dict[str, Any]], dict[str, Any]] = _same_options

    def names_input(self, message: str, path: str) -> bool:
        """Whether an error message names the input (the file; the option for a spec string)."""
        return path in message or (self.name == "devspec" and "--devices" in message)


# --------------------------------------------------------------------------- GraphDef


def _graphdef_cls() -> Any:
    from baechi_cli.proto_gen.tf_graph_pb2 import GraphDef

    return GraphDef


def _ancestor_cut(graph_def: Any, root: str) -> Any:
    """The subgraph of ``root`` and everything it depends on, in file order."""
    nodes = {n.name: n for n in graph_def.node}
    keep: set[str] = set()
    stack = [root]
    while stack:
        name = stack.pop()
        if name in keep or name not in nodes:
            continue
        keep.add(name)
        stack.extend(i.lstrip("^").split(":")[0] for i in nodes[name].input)
    cut = _graphdef_cls()()
    cut.versions.CopyFrom(graph_def.versions)
    cut.library.CopyFrom(graph_def.library)
    cut.node.extend(n for n in graph_def.node if n.name in keep)
    return cut


def _small_cuts(path: Path, count: int, most: int) -> list[Any]:
    """``count`` ancestor cuts of at most ``most`` nodes (fixed choice: the same seeds every run)."""
    graph_def = _graphdef_cls().FromString(path.read_bytes())
    rng = random.Random(f"cuts:{path.name}")
    cuts: list[Any] = []
    names = [n.name for n in graph_def.node]
    for name in rng.sample(names, len(names)):
        cut = _ancestor_cut(graph_def, name)
        if 3 <= len(cut.node) <= most:
            cuts.append(cut)
        if len(cuts) == count:
            break
    return cuts


@functools.cache
def graphdef_seeds() -> list[Seed]:
    seeds = [
        Seed(p, (TESTDATA / p).read_bytes(), weight=w)
        for p, w in (("mlp.pb", 3), ("tf2_function.pb", 3), ("cnn.pb", 1), ("gnmt_dynamic.pb", 0.2))
    ]
    for source in ("mlp.pb", "cnn.pb", "gnmt_dynamic.pb"):
        for k, cut in enumerate(_small_cuts(TESTDATA / source, 4, 40)):
            seeds.append(Seed(f"{source}[cut {k}]", cut.SerializeToString(), weight=2))
    seeds.append(Seed("mlp.pb (batch 4)", (TESTDATA / "mlp.pb").read_bytes(), {"batch_size": 4}))
    return seeds


@functools.cache
def pbtxt_seeds() -> list[Seed]:
    from google.protobuf import text_format

    seeds = [Seed("mlp.pbtxt", (TESTDATA / "mlp.pbtxt").read_bytes(), weight=0.5)]
    for seed in graphdef_seeds():
        if seed.name == "mlp.pb" or seed.data.startswith(b"\x08"):
            continue
        graph_def = _graphdef_cls().FromString(seed.data)
        if len(graph_def.node) <= 60:
            text = text_format.MessageToString(graph_def).encode()
            seeds.append(Seed(seed.name.replace(".pb", ".pbtxt"), text, seed.options, seed.weight))
    return seeds


def _graph_cycle(rng: random.Random, g: Any, names: Sequence[str]) -> None:
    """A node consumes one of its consumers: a cycle through a data or control edge."""
    with_inputs = [n for n in g.node if n.input]
    if not with_inputs:
        return
    node = rng.choice(with_inputs)
    producer = node.input[rng.randrange(len(node.input))].lstrip("^").split(":")[0]
    for other in g.node:
        if other.name == producer:
            mark = rng.choice(("", "^"))
            if mark:
                other.input.append(f"^{node.name}")
            else:
                other.input.insert(0, node.name)


def _graph_dangling(rng: random.Random, g: Any, names: Sequence[str]) -> None:
    if g.node:
        node = rng.choice(g.node)
        node.input.insert(rng.randrange(len(node.input) + 1), rng.choice(("nope", "^nope", "nope:3", "")))


def _graph_duplicate_name(rng: random.Random, g: Any, names: Sequence[str]) -> None:
    if len(g.node) > 1:
        rng.choice(g.node).name = rng.choice(names)


def _graph_huge_shape(rng: random.Random, g: Any, names: Sequence[str]) -> None:
    """A declared-huge, negative or unknown dim in an ``_output_shapes`` or ``shape`` attr."""
    shaped = [n for n in g.node for key in ("_output_shapes", "shape") if key in n.attr]
    if not shaped:
        return
    node = rng.choice(shaped)
    attr = node.attr["_output_shapes"] if "_output_shapes" in node.attr else node.attr["shape"]
    shapes = list(attr.list.shape) if attr.HasField("list") else [attr.shape]
    if not shapes:
        return
    shape = rng.choice(shapes)
    if rng.random() < 0.3:
        del shape.dim[:]
        for _ in range(rng.randint(1, 4)):
            shape.dim.add().size = rng.choice((2**40, 2**40, 2**62, -1))
    elif shape.dim:
        shape.dim[rng.randrange(len(shape.dim))].size = rng.choice(
            (2**40, 2**62, 2**63 - 1, -1, -2, -(2**63))
        )
    else:
        shape.unknown_rank = not shape.unknown_rank


def _graph_drop_shapes(rng: random.Random, g: Any, names: Sequence[str]) -> None:
    """No ``_output_shapes`` on some nodes: the reader asks TensorFlow's shape inference."""
    for node in g.node:
        if "_output_shapes" in node.attr and rng.random() < 0.1:
            del node.attr["_output_shapes"]


def _graph_retype(rng: random.Random, g: Any, names: Sequence[str]) -> None:
    if g.node:
        ops = sorted({n.op for n in g.node})
        rng.choice(g.node).op = rng.choice([*ops, "NoSuchOp", "", "Placeholder", "Const", "Merge", "Switch"])


def _graph_attr_kind(rng: random.Random, g: Any, names: Sequence[str]) -> None:
    """A typing attr (T, dtype, N, ...) of another kind or an unknown DataType."""
    with_attrs = [n for n in g.node if any(not k.startswith("_") for k in n.attr)]
    if not with_attrs:
        return
    node = rng.choice(with_attrs)
    key = rng.choice(sorted(k for k in node.attr if not k.startswith("_")))
    value = node.attr[key]
    choice = rng.randrange(5)
    if choice == 0:
        value.i = interesting_int(rng)
    elif choice == 1:
        value.type = rng.choice((0, 99, 120, 2**31 - 1))
    elif choice == 2:
        value.list.type.extend([1, 9])
    elif choice == 3:
        value.s = b"\xff\xfe"
    else:
        value.Clear()


def _graph_input_order(rng: random.Random, g: Any, names: Sequence[str]) -> None:
    """A control input before a data input, or a port out of range."""
    with_inputs = [n for n in g.node if n.input]
    if not with_inputs:
        return
    node = rng.choice(with_inputs)
    if rng.random() < 0.5:
        node.input.insert(0, f"^{rng.choice(names)}")
    else:
        i = rng.randrange(len(node.input))
        name = node.input[i].lstrip("^").split(":")[0]
        node.input[i] = f"{name}:{rng.choice((1, 7, 2**31, 2**64))}"


def _graph_library(rng: random.Random, g: Any, names: Sequence[str]) -> None:
    """A library function named like a node's op type, with an odd signature."""
    if not g.node:
        return
    node = rng.choice(g.node)
    function = g.library.function.add()
    function.signature.name = node.op
    arg = function.signature.output_arg.add()
    arg.name = "out"
    choice = rng.randrange(3)
    if choice == 0:
        arg.type = rng.choice((0, 99, 1))
    elif choice == 1:
        arg.type_attr = "T"
    else:
        arg.number_attr = "N"
        arg.type = 1


_GRAPH_OPS = (
    _graph_cycle,
    _graph_dangling,
    _graph_duplicate_name,
    _graph_huge_shape,
    _graph_huge_shape,
    _graph_drop_shapes,
    _graph_retype,
    _graph_attr_kind,
    _graph_input_order,
    _graph_library,
)


def _mutate_graphdef(rng: random.Random, g: Any) -> None:
    names = [n.name for n in g.node]
    for _ in range(rng.choice((1, 1, 2, 3))):
        if rng.random() < 0.45:
            mutate_message(rng, g, names)
        else:
            rng.choice(_GRAPH_OPS)(rng, g, names)


def graphdef_structure(rng: random.Random, seed: Seed) -> bytes:
    g = _graphdef_cls().FromString(seed.data)
    _mutate_graphdef(rng, g)
    return g.SerializeToString()


def pbtxt_structure(rng: random.Random, seed: Seed) -> bytes:
    from google.protobuf import text_format

    g = text_format.Parse(seed.data.decode(), _graphdef_cls()())
    _mutate_graphdef(rng, g)
    return text_format.MessageToString(g, as_utf8=rng.random() < 0.5).encode()


# --------------------------------------------------------------------------- ONNX


def _handmade_onnx() -> list[tuple[str, Any, dict[str, Any]]]:
    """Small models for what the committed ones lack: subgraphs, sparse initializers, symbolic dims."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    F = TensorProto.FLOAT

    def model(nodes: list, inputs: list, outputs: list, inits: Sequence = (), sparse: Sequence = ()) -> Any:
        graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits), sparse_initializer=list(sparse))
        return helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
        )

    x = helper.make_tensor_value_info("x", F, ["N", 4])
    y = helper.make_tensor_value_info("y", F, ["N", 4])
    chain = model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("MatMul", ["r", "w"], ["m"]),
            helper.make_node("Reshape", ["m", "s"], ["y"], name="reshape"),
        ],
        [x],
        [y],
        [
            numpy_helper.from_array(np.ones((4, 4), np.float32), "w"),
            numpy_helper.from_array(np.array([-1, 4]), "s"),
        ],
    )
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["h"], ["t"])], "then", [], [helper.make_tensor_value_info("t", F, [2, 3])]
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["h"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F, [2, 3])]
    )
    branch = model(
        [
            helper.make_node("Relu", ["a"], ["h"], name="h"),
            helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g),
        ],
        [
            helper.make_tensor_value_info("a", F, [2, 3]),
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", F, [2, 3])],
    )
    body = helper.make_graph(
        [
            helper.make_node("Add", ["v_in", "b"], ["s"]),
            helper.make_node("Mul", ["s", "h"], ["v_out"]),
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
    loop = model(
        [
            helper.make_node("Add", ["a", "b"], ["h"], name="h"),
            helper.make_node("Loop", ["M", "", "a"], ["y"], name="loop", body=body),
        ],
        [helper.make_tensor_value_info("a", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, [2, 3])],
        [
            numpy_helper.from_array(np.array(3, np.int64), "M"),
            numpy_helper.from_array(np.zeros(3, np.float32), "b"),
        ],
    )
    values = numpy_helper.from_array(np.ones(2, np.float32), "sp")
    indices = numpy_helper.from_array(np.array([0, 5], np.int64), "sp_idx")
    sparse = model(
        [
            helper.make_node("Add", ["x", "sp"], ["z"], name="add"),
            helper.make_node("FusedMatMul", ["z", "z"], ["y"], name="fused", domain="com.microsoft"),
        ],
        [helper.make_tensor_value_info("x", F, [2, 4])],
        [helper.make_tensor_value_info("y", F, [2, 4])],
        sparse=[helper.make_sparse_tensor(values, indices, [2, 4])],
    )
    for m in (chain, branch, loop, sparse):
        onnx.checker.check_model(m)
    return [
        ("chain", chain, {"batch_size": 2}),
        ("if", branch, {}),
        ("loop", loop, {}),
        ("sparse", sparse, {}),
        ("chain (dims)", chain, {"dims": {"N": 3}}),
    ]


def _light(model: Any) -> Any:
    """The model with its float initializers over 1 KB moved to an absent external file: the same
    graph in a few KB (the reader never reads weights; see io/onnx.py)."""
    from onnx import TensorProto

    light = copy.deepcopy(model)
    offset = 0
    for t in light.graph.initializer:
        if t.data_type == TensorProto.FLOAT and len(t.raw_data) > 1024:
            length = len(t.raw_data)
            t.ClearField("raw_data")
            t.data_location = TensorProto.EXTERNAL
            for key, value in (("location", "weights.bin"), ("offset", str(offset)), ("length", str(length))):
                entry = t.external_data.add()
                entry.key, entry.value = key, value
            offset += length
    return light


@functools.cache
def onnx_seeds() -> list[Seed]:
    import onnx
    from onnxmodels import ONNX_MODELS

    seeds = []
    for m in ONNX_MODELS:
        data = m.path.read_bytes()
        model = onnx.load_model_from_string(data)
        seeds.append(Seed(m.path.name, data, m.read_options, weight=0.3))
        seeds.append(
            Seed(f"{m.path.name} (light)", _light(model).SerializeToString(), m.read_options, weight=1.5)
        )
    for name, model, options in _handmade_onnx():
        seeds.append(Seed(name, model.SerializeToString(), options, weight=2))
    return seeds


def _value_infos(model: Any) -> list[Any]:
    g = model.graph
    return [*g.input, *g.output, *g.value_info]


def _onnx_dims(rng: random.Random, model: Any, names: Sequence[str]) -> None:
    """A graph input's, output's or value_info's dim: negative, huge, symbolic, unset; or its type."""
    infos = _value_infos(model)
    if not infos:
        return
    t = rng.choice(infos).type
    choice = rng.randrange(6)
    if choice == 0 and t.HasField("tensor_type"):
        t.tensor_type.elem_type = rng.choice((0, 8, 16, 99, 2**31 - 1))
    elif choice == 1:
        t.ClearField("tensor_type") if rng.random() < 0.5 else t.tensor_type.ClearField("shape")
    elif choice == 2:
        t.sequence_type.elem_type.tensor_type.elem_type = 1
    else:
        dims = t.tensor_type.shape.dim
        dim = dims[rng.randrange(len(dims))] if len(dims) and rng.random() < 0.8 else dims.add()
        if rng.random() < 0.6:
            dim.dim_value = rng.choice((-1, -5, 0, 2**40, 2**62, 2**63 - 1, -(2**63)))
        else:
            dim.dim_param = rng.choice(("N", "", "seq", "💥", "unk__1", interesting_string(rng)))


def _onnx_initializer(rng: random.Random, model: Any, names: Sequence[str]) -> None:
    """An initializer's dims declared huge or negative, its type odd, or its data external."""
    inits = list(model.graph.initializer)
    if not inits:
        return
    t = rng.choice(inits)
    choice = rng.randrange(4)
    if choice == 0:
        del t.dims[:]
        t.dims.extend(rng.choice(([2**40, 2**40], [-1], [2**62, 4], [0], [3, -2])))
    elif choice == 1:
        t.data_type = rng.choice((0, 8, 99, 17, 22))
    elif choice == 2:
        t.data_location = 1  # EXTERNAL
        del t.external_data[:]
        for key, value in (("location", rng.choice(("w.bin", "../../etc/passwd", "", "/dev/zero"))),
                           ("offset", rng.choice(("0", "-1", "x", str(2**70)))),
                           ("length", rng.choice(("4", "-4", str(2**62))))):  # fmt: skip
            entry = t.external_data.add()
            entry.key, entry.value = key, value
    else:
        t.name = rng.choice(names) if names else ""


def _onnx_opset(rng: random.Random, model: Any, names: Sequence[str]) -> None:
    if model.opset_import and rng.random() < 0.7:
        o = rng.choice(model.opset_import)
        o.version = rng.choice((1, 12, 13, 21, 99, 10**6, -1, 2**62))
        if rng.random() < 0.3:
            o.domain = rng.choice(("ai.onnx", "", "com.microsoft", "💥"))
    else:
        model.ir_version = rng.choice((0, 1, 3, 7, 11, 12, 99, -1))


def _onnx_edges(rng: random.Random, model: Any, names: Sequence[str]) -> None:
    """A dangling input, a cycle (an input read from a later node), or a duplicated output name."""
    nodes = model.graph.node
    if not nodes:
        return
    i = rng.randrange(len(nodes))
    node = nodes[i]
    choice = rng.randrange(3)
    later = [o for n in nodes[i:] for o in n.output if o]
    if choice == 0:
        node.input.append(rng.choice(("nope", "", "x")))
    elif choice == 1 and later:
        node.input.insert(0, rng.choice(later))
    elif node.output:
        node.output[0] = rng.choice([o for n in nodes for o in n.output if o] or ["y"])


def _onnx_node(rng: random.Random, model: Any, names: Sequence[str]) -> None:
    """A node's op type or domain replaced, or its attributes cleared."""
    if not model.graph.node:
        return
    node = rng.choice(model.graph.node)
    choice = rng.randrange(3)
    if choice == 0:
        node.op_type = rng.choice(("Relu", "Loop", "If", "Scan", "NoSuchOp", "", "Conv", "Reshape", "MatMul"))
    elif choice == 1:
        node.domain = rng.choice(("com.microsoft", "ai.onnx.ml", "nope", "ai.onnx"))
    else:
        del node.attribute[:]


_ONNX_OPS = (_onnx_dims, _onnx_dims, _onnx_initializer, _onnx_opset, _onnx_edges, _onnx_node)


def onnx_structure(rng: random.Random, seed: Seed) -> bytes:
    import onnx

    model = onnx.ModelProto.FromString(seed.data)
    names = [n.name for n in model.graph.node if n.name] + [i.name for i in model.graph.input]
    for _ in range(rng.choice((1, 1, 2, 3))):
        if rng.random() < 0.4:
            mutate_message(rng, model, names)
        else:
            rng.choice(_ONNX_OPS)(rng, model, names)
    return model.SerializeToString()


def onnx_options(rng: random.Random, options: dict[str, Any]) -> dict[str, Any]:
    """Sometimes another batch size or dims than the seed's."""
    if rng.random() < 0.1:
        options = dict(options)
        options["batch_size"] = rng.choice((None, 1, 3, 2**40))
        if rng.random() < 0.3:
            options["dims"] = {rng.choice(("N", "seq", "batch", "x")): rng.choice((1, 7, 2**40))}
    return options


# --------------------------------------------------------------------------- JSON documents


def _json_seed(name: str, doc: Any, options: dict[str, Any] | None = None, weight: float = 1.0) -> Seed:
    return Seed(name, json.dumps(doc).encode(), options or {}, weight)


@functools.cache
def workload_seeds() -> list[Seed]:
    seeds = []
    for path in sorted((TESTDATA / "workloads").glob("*.json")):
        data = path.read_bytes()
        seeds.append(Seed(path.name, data, weight=0.1 if len(data) > 100_000 else 0.5))
        doc = json.loads(data)
        for size in (5, 30):  # the first nodes and the edges among them
            nodes = doc["nodes"][:size]
            ids = {n["id"] for n in nodes}
            edges = [e for e in doc["edges"] if e["sourceId"] in ids and e["destId"] in ids]
            seeds.append(
                _json_seed(f"{path.stem}[:{size}]", {**doc, "nodes": nodes, "edges": edges}, weight=2)
            )
    return seeds


def _workload_graph(rng: random.Random, doc: Any) -> Any:
    """A cycle, a self loop, a dangling or duplicate id, or bulk deletion."""
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("nodes"), list)
        or not isinstance(doc.get("edges"), list)
    ):
        return doc
    nodes, edges = doc["nodes"], doc["edges"]
    ids = [n["id"] for n in nodes if isinstance(n, dict) and "id" in n]
    choice = rng.randrange(5)
    edge = rng.choice(edges) if edges else None
    node = rng.choice(nodes) if nodes else None
    if choice == 0 and isinstance(edge, dict):  # reverse an edge: a 2-cycle
        edges.append({"sourceId": edge.get("destId"), "destId": edge.get("sourceId"), "size": 1})
    elif choice == 1 and ids:
        i = rng.choice(ids)
        edges.append({"sourceId": i, "destId": i if rng.random() < 0.5 else 10**9})
    elif choice == 2 and isinstance(node, dict):
        node["id"] = rng.choice(ids) if ids else 0
    elif choice == 3:
        del nodes[rng.randrange(len(nodes) + 1) :]
    else:
        del edges[rng.randrange(len(edges) + 1) :]
    return doc


def _document_structure(
    graph_op: Callable[[random.Random, Any], Any] | None, extra: Sequence[Any] = ()
) -> Callable[[random.Random, Seed], bytes]:
    """A structure mutation of JSON seeds: generic value mutations and ``graph_op``."""

    def structure(rng: random.Random, seed: Seed) -> bytes:
        doc = json.loads(seed.data)
        for _ in range(rng.choice((1, 1, 2, 3))):
            if graph_op is not None and rng.random() < 0.3:
                doc = graph_op(rng, doc)
            else:
                doc = mutate_document(rng, doc, extra)
        return dump_json(doc, rng)

    return structure


@functools.cache
def sidecar_seeds() -> list[Seed]:
    seeds = [Seed(p.name, p.read_bytes()) for p in sorted(TESTDATA.glob("*.json"))]
    inputs = [
        {"name": "x:0", "dtype": "float32", "shape": [4, 3], "range": [-1.0, 1.0]},
        {"name": "h", "dtype": "float16", "shape": [8], "range": [0, 1]},
        {"name": "labels:0", "dtype": "int64", "shape": [-1], "range": [0, 10]},
        {"name": "mask:0", "dtype": "bool", "shape": [2]},
        {"name": "b:0", "dtype": "bfloat16", "shape": [2, 2]},
    ]
    common = {"loss": "loss:0", "train_op": "train", "init_op": "init", "batch_size": 4, "seed": 1}
    seeds.append(_json_seed("ranges", {"inputs": inputs, **common}, weight=3))
    seeds.append(_json_seed("profiler", {"inputs": inputs[:2], "seed": 2}, weight=2))
    return seeds


def _sidecar_inputs(rng: random.Random, doc: Any) -> Any:
    """An input's range, dtype or shape replaced by a borderline one."""
    inputs = doc.get("inputs") if isinstance(doc, dict) else None
    if not isinstance(inputs, list) or not inputs or not isinstance(inputs[0], dict):
        return doc
    entry = rng.choice(inputs)
    if not isinstance(entry, dict):
        return doc
    key = rng.choice(("range", "range", "dtype", "shape"))
    if key == "range":
        entry["range"] = rng.choice(
            ([0.0, 1.0], [1, 1], [2, 1], [math.nan, 1], [0, math.inf], [-1e308, 1e308], [0, 2**64], [-(2**63), 2**63],
             [0.5, 0.5000001], ["a", "b"], [True, False], [0, 256], [1e5, 1e6], [0], None)
        )  # fmt: skip
    elif key == "dtype":
        entry["dtype"] = rng.choice(
            ("float16", "bfloat16", "uint64", "int8", "bool", "string", "complex64", "resource", "half", "")
        )
    else:
        entry["shape"] = rng.choice(([2**40, 2**40], [-1], [-2], [], [0], [2**63], [3.5], [3, "x"], [1] * 64))
    return doc


@functools.cache
def profile_seeds() -> list[Seed]:
    import tempfile

    from baechi_cli.app.profile import profile_model
    from baechi_cli.core.devices import parse_devices

    seeds = []
    models = [
        (TESTDATA / "mlp.pb", {}),
        (TESTDATA / "tf2_function.pb", {}),
        (TESTDATA / "keras_cnn.onnx", {}),
        (TESTDATA / "workloads" / "throughput_LayerGraphs_gnmt_training.json", {}),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for model, options in models:
            out = str(Path(tmp) / "costs.json")
            profile_model(str(model), parse_devices("1x8GB"), output=out, **options)
            seeds.append(
                Seed(f"profile of {model.name}", Path(out).read_bytes(), {"model": str(model), **options})
            )
    return seeds


def _profile_ops(rng: random.Random, doc: Any) -> Any:
    """An op duplicated, dropped or renamed; a cost as a quoted non-finite; an edge to nowhere."""
    ops = doc.get("ops") if isinstance(doc, dict) else None
    if not isinstance(ops, list) or not ops or not isinstance(ops[0], dict):
        return doc
    choice = rng.randrange(5)
    i = rng.randrange(len(ops))
    if choice == 0:
        ops.append(copy.deepcopy(ops[i]))
    elif choice == 1:
        del ops[i]
    elif choice == 2 and isinstance(ops[i], dict):
        ops[i][rng.choice(("compute_us", "flops", "temporary_bytes", "persistent_bytes"))] = rng.choice(
            ("NaN", "Infinity", "-Infinity", "1e308", -1, 0.5, "12", 1e308, 2**64)
        )
    elif choice == 3 and isinstance(ops[i], dict):
        ops[i]["output_bytes"] = rng.choice(([], [1e308], [-1], [0.5], [0] * 9, ["1"], [2**64]))
    elif isinstance(ops[i], dict):
        edges = doc.setdefault("edges", [])
        if isinstance(edges, list):
            edges.append(
                {
                    "src": ops[i].get("name", ""),
                    "port": rng.choice((0, -1, 9, 2**31)),
                    "dst": "nope",
                    "transfer_us": 1,
                }
            )
    return doc


# --------------------------------------------------------------------------- devices


_README_YAML = """\
devices:                      # a list, or one template: {count: 4, memory: 8GiB, ...}
  - name: /device:GPU:0       # written into NodeDef.device (default /device:GPU:<i>)
    memory: 8GiB              # or a plain integer: bytes
    flops: 13.4T              # peak FLOP/s, for the analytic cost model
    memory_bandwidth: 448GB/s
    launch_overhead: 5us      # fixed cost per kernel (default 5us)
  - name: /device:GPU:1
    memory: 8GiB
interconnect:
  mode: sequential            # or parallel
  latency: 134us
  bandwidth: 5.7GB/s
  links:                      # optional per-pair overrides; a and b are names or indices
    - {a: 0, b: 1, latency: 10us, bandwidth: 25GB/s}
"""

_TEMPLATE_YAML = """\
devices: {count: 4, memory: 8GiB, flops: 10T, efficiency: {conv: 0.8, gemm: 0.9}}
interconnect: {mode: parallel}
"""


@functools.cache
def devices_seeds() -> list[Seed]:
    from baechi_cli.core.devices import PRESETS, dump_devices_yaml, parse_devices

    seeds = [
        Seed("README", _README_YAML.encode(), weight=3),
        Seed("template", _TEMPLATE_YAML.encode(), weight=3),
    ]
    for name, (spec, _) in PRESETS.items():
        seeds.append(Seed(name, dump_devices_yaml(spec, [f"preset {name}"]).encode()))
    seeds.append(Seed("2x16GB,2x8GB", dump_devices_yaml(parse_devices("2x16GB,2x8GB")).encode()))
    return seeds


# YAML values JSON has not: dates, binary, sets, non-string keys.
_YAML_EXTRA = (datetime.date(2020, 1, 1), b"\x00\xff", {1: "x"}, {None: 1}, {(1, 2): 3}, 1.0e400, ".nan")


def devices_structure(rng: random.Random, seed: Seed) -> bytes:
    import yaml

    doc = yaml.safe_load(seed.data)
    for _ in range(rng.choice((1, 1, 2, 3))):
        if rng.random() < 0.3 and isinstance(doc, dict):
            devices = doc.get("devices")
            entry = (
                devices
                if isinstance(devices, dict)
                else (rng.choice(devices) if isinstance(devices, list) and devices else None)
            )
            if isinstance(entry, dict):
                key = rng.choice(
                    ("count", "memory", "flops", "memory_bandwidth", "launch_overhead", "efficiency", "name")
                )
                entry[key] = rng.choice(
                    (10**12, 2**62, 10**400, -1, 0, "1e400GB", "nanGB", "infGB", "-8GB", "1e-30", ".5KB", "8 XB",
                     "0us", "1e400s", {"conv": math.nan}, {"conv": 0}, {"tpu": 1}, {1: 2}, [], None, "1" * 5000)
                )  # fmt: skip
        else:
            doc = mutate_document(rng, doc, _YAML_EXTRA)
    try:
        return yaml.safe_dump(
            doc, allow_unicode=rng.random() < 0.5, default_flow_style=rng.choice((None, False, True))
        ).encode()
    except yaml.YAMLError:  # a value YAML cannot represent
        return seed.data


@functools.cache
def devspec_seeds() -> list[Seed]:
    specs = (
        "4x8GB",
        "2x16GB,2x8GB",
        "8GiB",
        "rtx2080x4",
        "a100x8",
        "3 x 1.5TB",
        "1x1000000000000000",
        "2*512MiB",
    )
    return [Seed(s, s.encode()) for s in specs]


def devspec_structure(rng: random.Random, seed: Seed) -> bytes:
    """A spec rebuilt from extreme counts, sizes, units and separators."""
    terms = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        count = rng.choice(("", "1", "0", "4", "10000000", "99999999999999", "1" * 400, "-1", "٣"))
        size = rng.choice(
            ("8", "0", ".5", "1e400", "1e-9", "nan", "inf", "1" * 400, "9" * 30, "", "-8", "1.5e3")
        )
        unit = rng.choice(("GB", "GiB", "", "B", "kb", "XB", "G", "💥", " GB"))
        sep = rng.choice(("x", "X", "*", " x ", "", "xx"))
        terms.append(f"{count}{sep if count else ''}{size}{unit}")
    return rng.choice((",", ", ", ",,", ";")).join(terms).encode()


# --------------------------------------------------------------------------- reading


def _load(path: str, options: dict[str, Any]) -> Any:
    from baechi_cli.io.formats import load_model

    return load_model(path, options.get("batch_size"), options.get("dims")).graph


def _read_workload(path: str, options: dict[str, Any]) -> Any:
    from baechi_cli.io.workload_json import read_workload_meta

    read_workload_meta(path)
    return _load(path, options)


#: Inputs with at most this many elements get verify's feeds made (bigger ones only validated).
_FEED_ELEMENTS = 100_000


def _read_sidecar(path: str, options: dict[str, Any]) -> Any:
    from baechi_cli.costs.measured import _read_sidecar as profiler_read
    from baechi_cli.io.sidecar import load_sidecar
    from baechi_cli.verify.run import _make_feeds

    profiler_read(str(Path(path).with_suffix(".pb")))  # the profiler's reading of <model>.json
    data = load_sidecar(path)
    if sum(math.prod(entry["shape"]) for entry in data["inputs"]) <= _FEED_ELEMENTS:
        _make_feeds(data, 1)
    return data


def _read_devices_file(path: str, options: dict[str, Any]) -> Any:
    from baechi_cli.core.devices import parse_devices

    return parse_devices(path)


def _read_devspec(path: str, options: dict[str, Any]) -> Any:
    from baechi_cli.core.devices import parse_devices

    # As the shell hands it over: any bytes, undecodable ones as surrogates.
    return parse_devices(Path(path).read_bytes().decode("utf-8", "surrogateescape"))


@functools.cache
def _profiled_graph(model: str, batch_size: int | None, dims: str | None) -> Any:
    from baechi_cli.app.place import with_views
    from baechi_cli.io.formats import load_model

    graph, fmt, _ = load_model(model, batch_size, json.loads(dims) if dims else None)
    return with_views(graph, fmt)


def _read_profile(path: str, options: dict[str, Any]) -> Any:
    from baechi_cli.costs.profile import apply_profile, load_profile

    dims = json.dumps(options["dims"]) if options.get("dims") else None
    graph = _profiled_graph(options["model"], options.get("batch_size"), dims)
    return apply_profile(graph, load_profile(path), path, options["model"])


def _graphdef_options(rng: random.Random, options: dict[str, Any]) -> dict[str, Any]:
    if rng.random() < 0.1:
        return {**options, "batch_size": rng.choice((None, 1, 5, 2**40))}
    return options


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("graphdef", "model.pb", graphdef_seeds, graphdef_structure, _load, _graphdef_options),
        Target("pbtxt", "model.pbtxt", pbtxt_seeds, pbtxt_structure, _load, _graphdef_options),
        Target("onnx", "model.onnx", onnx_seeds, onnx_structure, _load, onnx_options),
        Target(
            "workload", "model.json", workload_seeds, _document_structure(_workload_graph), _read_workload
        ),
        Target("sidecar", "model.json", sidecar_seeds, _document_structure(_sidecar_inputs), _read_sidecar),
        Target("devices", "devices.yaml", devices_seeds, devices_structure, _read_devices_file),
        Target("devspec", "spec.txt", devspec_seeds, devspec_structure, _read_devspec),
        Target("profile", "costs.json", profile_seeds, _document_structure(_profile_ops), _read_profile),
    )
}
