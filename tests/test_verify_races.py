"""Races on variables (baechi_cli/verify/races.py) and the run check's reproducibility checks.

The static finder runs on GraphBuilder graphs and on every committed
TensorFlow graph with its sidecar's fetches (no TensorFlow needed). Tests
marked ``tf`` build a graph with a planted race in TensorFlow and run
``baechi verify --run`` on it, and check that a graph TensorFlow itself runs
non-reproducibly is told apart from a placement that does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from baechi_cli.cli.commands import main
from baechi_cli.core.errors import InputError
from baechi_cli.core.graph import CONTROL_PORT, GraphBuilder, OpGraph
from baechi_cli.io.graphdef import parse_graphdef_file
from baechi_cli.verify.races import variable_races
from baechi_cli.verify.static import structure_graph

TESTDATA = Path(__file__).resolve().parent.parent / "testdata"


def _resource_step(*, ordered: bool) -> OpGraph:
    """v (resource) read by `read` for `loss`, written by `update`; `step` fetches both."""
    b = GraphBuilder()
    v = b.add_op("v", "VarHandleOp", [0], output_dtypes=["resource"])
    read = b.add_op("read", "ReadVariableOp", [4], output_dtypes=["float32"])
    loss = b.add_op("loss", "Square", [4], output_dtypes=["float32"])
    delta = b.add_op("delta", "Const", [4], output_dtypes=["float32"])
    update = b.add_op("update", "AssignAddVariableOp", [], attrs={"_input_types": ["resource", "float32"]})
    init = b.add_op("init", "AssignVariableOp", [], attrs={"_input_types": ["resource", "float32"]})
    step = b.add_op("step", "NoOp", [])
    for src, dst in ((v, read), (read, loss), (v, update), (delta, update), (v, init), (delta, init)):
        b.add_edge(src, dst)
    b.add_edge(update, step, CONTROL_PORT)
    if ordered:
        b.add_edge(read, update, CONTROL_PORT)
    return b.build()


def test_an_unordered_read_and_write_is_a_race() -> None:
    races = variable_races(_resource_step(ordered=False), ["loss:0", "step"])
    assert [(r.variable, r.first, r.first_access, r.second) for r in races] == [
        ("v", "read", "read", "update")
    ]
    assert "'read' (reads) and 'update' (writes) access variable 'v'" in races[0].message()


def test_a_control_edge_orders_them() -> None:
    assert variable_races(_resource_step(ordered=True), ["loss:0", "step"]) == []


def test_ops_the_step_does_not_run_do_not_count() -> None:
    # `init` writes v unordered with both, but the step fetches neither it nor `update`.
    assert variable_races(_resource_step(ordered=False), ["loss"]) == []


def _ref_write(b: GraphBuilder, name: str, op_type: str) -> int:
    """An op writing a float32 reference variable (its first input) with a value (its second)."""
    return b.add_op(
        name, op_type, [4], output_dtypes=["float32_ref"], attrs={"_input_types": ["float32_ref", "float32"]}
    )


def test_two_unordered_writes_are_one_race() -> None:
    b = GraphBuilder()
    v = b.add_op("v", "VariableV2", [4], output_dtypes=["float32_ref"])
    one = b.add_op("one", "Const", [4], output_dtypes=["float32"])
    a, c = _ref_write(b, "a", "AssignAdd"), _ref_write(b, "c", "AssignSub")
    step = b.add_op("step", "NoOp", [])
    for w in (a, c):
        b.add_edge(v, w)
        b.add_edge(one, w)
        b.add_edge(w, step, CONTROL_PORT)
    races = variable_races(b.build(), ["step"])
    assert [(r.first, r.first_access, r.second) for r in races] == [("a", "write", "c")]


def test_a_reference_read_happens_where_the_aliased_value_is_used() -> None:
    # w/read (Identity) runs early, but the buffer it aliases is read by `late`,
    # which an Assign may precede; with `late` before the Assign, no race.
    for ordered in (False, True):
        b = GraphBuilder()
        w = b.add_op("w", "VariableV2", [4], output_dtypes=["float32_ref"])
        read = b.add_op("w/read", "Identity", [4], output_dtypes=["float32"])
        late = b.add_op("late", "MatMul", [4], output_dtypes=["float32"])
        one = b.add_op("one", "Const", [4], output_dtypes=["float32"])
        put = _ref_write(b, "put", "Assign")
        step = b.add_op("step", "NoOp", [])
        for src, dst in ((w, read), (read, late), (read, late), (w, put), (one, put)):
            b.add_edge(src, dst)
        b.add_edge(read, put, CONTROL_PORT)  # orders the Identity, not the real read
        b.add_edge(put, step, CONTROL_PORT)
        b.add_edge(late, step, CONTROL_PORT)
        if ordered:
            b.add_edge(late, put, CONTROL_PORT)
        races = variable_races(b.build(), ["step"])
        assert [(r.first, r.second) for r in races] == ([] if ordered else [("late", "put")])


def test_a_fetch_naming_no_node_is_input_error() -> None:
    with pytest.raises(InputError, match="'nope:0', which names no node"):
        variable_races(_resource_step(ordered=True), ["nope:0"])


@pytest.mark.parametrize("name", ["mlp", "cnn", "inception_v3", "resnet50", "transformer", "gnmt_dynamic"])
def test_committed_training_graphs_have_no_races(name: str) -> None:
    sidecar = json.loads((TESTDATA / f"{name}.json").read_text())
    graph = structure_graph(parse_graphdef_file(str(TESTDATA / f"{name}.pb")))
    assert variable_races(graph, [sidecar["loss"], sidecar["train_op"]]) == []


# --- TensorFlow: a planted race, and TensorFlow's own nondeterminism ---------


def _write(tf: Any, graph: Any, path: Path, devices: dict[str, str]) -> str:
    graph_def = graph.as_graph_def()
    for node in graph_def.node:
        node.device = devices.get(node.name, "/device:GPU:0")
    path.write_bytes(graph_def.SerializeToString(deterministic=True))
    return str(path)


def _write_sidecar(
    path: Path, shape: list[int], value_range: list[float] | None = None, seed: int = 0
) -> str:
    """The sidecar of the graphs built here: float input `x:0`, `loss:0`, `train`, `init`."""
    entry: dict[str, Any] = {"name": "x:0", "dtype": "float32", "shape": shape}
    if value_range is not None:
        entry["range"] = value_range
    sidecar = {"inputs": [entry], "loss": "loss:0", "train_op": "train", "init_op": "init", "seed": seed}
    path.write_text(json.dumps(sidecar))
    return str(path)


def _planted_race(tf: Any, tmp_path: Path) -> tuple[str, str, str]:
    """(original, placed, sidecar): `loss` reads v while `train` adds to it, unordered."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 64], name="x")
        v = tf.compat.v1.get_variable("v", initializer=tf.ones([64, 64]), use_resource=True)
        h = x
        for _ in range(8):  # a chain that delays the read's consumer
            h = tf.tanh(tf.matmul(h, h))
        loss = tf.reduce_sum(tf.matmul(h, v.read_value()), name="loss")
        tf.group(v.assign_add(tf.ones([64, 64])), name="train")
        tf.group(v.initializer, name="init")
    original = tmp_path / "race.pb"
    original.write_bytes(graph.as_graph_def().SerializeToString(deterministic=True))
    # The chain and the loss on GPU:1, the variable and its ops on GPU:0.
    devices = {op.name: "/device:GPU:1" for op in graph.get_operations() if op.type in ("MatMul", "Tanh")}
    devices[loss.op.name] = "/device:GPU:1"
    placed = _write(tf, graph, tmp_path / "race.placed.pb", devices)
    sidecar = _write_sidecar(tmp_path / "race.json", [64, 64], value_range=[-0.1, 0.1], seed=1)
    return str(original), placed, sidecar


@pytest.mark.tf
def test_verify_run_flags_a_planted_race(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    original, placed, sidecar = _planted_race(tf, tmp_path)
    result = CliRunner().invoke(
        main, ["verify", placed, "--original", original, "--run", "--sidecar", sidecar, "--json"]
    )
    assert result.exit_code == 1, result.output
    run = json.loads(result.output)["run"]
    assert not run["ok"]
    assert run["races_count"] == 1
    assert "access variable 'v' in no fixed order" in run["races"][0]
    assert run["deterministic"] in (True, False)  # timing decides; the race is flagged either way


@pytest.mark.tf
def test_tensorflow_nondeterminism_is_told_apart_from_the_placement(tmp_path: Path) -> None:
    # An unseeded random op: every session draws anew, placed or not.
    tf = pytest.importorskip("tensorflow")
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 8], name="x")
        v = tf.compat.v1.get_variable("v", initializer=tf.ones([8, 8]), use_resource=True)
        noisy = tf.matmul(x, v.read_value()) * tf.random.uniform([8, 8])
        loss = tf.reduce_sum(noisy, name="loss")
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
        tf.group(v.initializer, name="init")
    original = tmp_path / "noisy.pb"
    original.write_bytes(graph.as_graph_def().SerializeToString(deterministic=True))
    placed = _write(tf, graph, tmp_path / "noisy.placed.pb", {})
    sidecar = _write_sidecar(tmp_path / "noisy.json", [8, 8])
    from baechi_cli.verify.run import verify_placed_graph

    run = verify_placed_graph(placed, sidecar, 1, steps=2, original_path=str(original))
    assert not run.ok
    assert not run.deterministic and run.reference_deterministic is False
    assert run.races_count == 0
    assert any("TensorFlow runs the original so too" in p for p in run.problems())


@pytest.mark.tf
def test_place_notes_the_race_and_survives_shape_inference(tmp_path: Path) -> None:
    # The planted graph has no _output_shapes, so reading it imports TensorFlow
    # for shape inference; CP-SAT (exact, auto) used to die with SIGSEGV after that.
    import subprocess
    import sys

    tf = pytest.importorskip("tensorflow")
    original, _, _ = _planted_race(tf, tmp_path)
    for algo in ("exact", "auto"):
        report = tmp_path / f"{algo}.json"
        proc = subprocess.run(
            [sys.executable, "-m", "baechi_cli", "place", original, "--devices", "2x1GB", "--algo", algo]
            + ["-o", str(tmp_path / f"{algo}.pb"), "--report", str(report), "-q"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        notes = json.loads(report.read_text())["notes"]
        assert any("1 race on variables" in note and "'v'" in note for note in notes), notes


@pytest.mark.tf
def test_place_keeps_a_racy_reference_read_on_its_variables_device(tmp_path: Path) -> None:
    # `late` reads ref variable w (through w/read) with no order against the Assign:
    # elsewhere it would read w at w/read's transfer, not when it runs as on one device.
    tf = pytest.importorskip("tensorflow")
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [256, 256], name="x")
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([256, 256]), use_resource=False)
        branches = [tf.matmul(x, x + i) for i in range(6)]  # work for the other device
        late = tf.matmul(tf.add_n(branches), w, name="late")
        tf.reduce_sum(late, name="loss")
        tf.group(tf.compat.v1.assign_add(w, tf.ones([256, 256])), name="train")
        tf.group(w.initializer, name="init")
    model = tmp_path / "ref_race.pb"
    model.write_bytes(graph.as_graph_def(add_shapes=True).SerializeToString(deterministic=True))
    _write_sidecar(tmp_path / "ref_race.json", [256, 256])
    structure = structure_graph(parse_graphdef_file(str(model)))
    assert [(r.first, r.second) for r in variable_races(structure, ["loss:0", "train"])] == [
        ("late", "AssignAdd")
    ]
    for algo in ("topo", "etf", "sct"):
        placed, report = tmp_path / f"{algo}.pb", tmp_path / f"{algo}.json"
        result = CliRunner().invoke(
            main,
            ["place", str(model), "--devices", "4x1GB", "--algo", algo, "-o", str(placed)]
            + ["--report", str(report), "-q"],
        )
        assert result.exit_code == 0, result.output
        devices = {n.name: n.device for n in parse_graphdef_file(str(placed)).node}
        assert devices["late"] == devices["w"], algo
        assert any("race on variables" in n for n in json.loads(report.read_text())["notes"])
