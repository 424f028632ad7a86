"""Tests for `baechi verify` and baechi_cli.verify.

The static checks (no TensorFlow) are fast and run on placed graphs built
here by editing NodeDef.device with the project's own proto, independently
of the GraphDef writer. Tests marked `tf` start a TensorFlow subprocess (a
few seconds each).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from baechi_cli.cli.commands import main
from baechi_cli.cli.render.verify import SHOWN
from baechi_cli.core.errors import InputError
from baechi_cli.io.sidecar import default_sidecar
from baechi_cli.io.tfsupport import map_device, normalize_device, shorten_tf_message
from baechi_cli.proto_gen import tf_graph_pb2 as pb
from baechi_cli.verify.run import verify_placed_graph
from baechi_cli.verify.static import StaticResult, static_check

TESTDATA = Path(__file__).resolve().parent.parent / "testdata"
CNN, MLP = str(TESTDATA / "cnn.pb"), str(TESTDATA / "mlp.pb")
HAS_TF = importlib.util.find_spec("tensorflow") is not None

# Consumers of resource/ref inputs that TensorFlow does not pull onto the variable's device.
_RESOURCE_EXEMPT = {"IdentityN", "PartitionedCall", "StatefulPartitionedCall"}


def run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def _load(path: str) -> pb.GraphDef:
    return pb.GraphDef.FromString(Path(path).read_bytes())


def _placed(
    tmp_path: Path, source: str | pb.GraphDef, device: Callable[[pb.NodeDef], str], name: str = "placed.pb"
) -> str:
    """Write ``source`` with NodeDef.device = device(node); the path."""
    graph_def = _load(source) if isinstance(source, str) else source
    for node in graph_def.node:
        node.device = device(node)
    path = tmp_path / name
    path.write_bytes(graph_def.SerializeToString(deterministic=True))
    return str(path)


def _all_on(device: str) -> Callable[[pb.NodeDef], str]:
    return lambda node: device


def _except(names: dict[str, str], default: str = "/device:GPU:0") -> Callable[[pb.NodeDef], str]:
    return lambda node: names.get(node.name, default)


def _problem_lines(output: str) -> list[str]:
    lines = output.splitlines()
    start = lines.index("problems:") + 1
    return [line.strip() for line in lines[start:] if line.startswith("  ")]


def _while_loop() -> pb.GraphDef:
    """A TF1 while loop, as tf.compat.v1.while_loop(i < 3, (i + 1, a * 2)) builds it."""

    def node(name: str, op: str, inputs: list[str] = (), **attrs: Any) -> pb.NodeDef:  # type: ignore[assignment]
        n = pb.NodeDef(name=name, op=op, input=list(inputs))
        for key, value in attrs.items():
            if key == "frame_name":
                n.attr[key].s = value.encode()
            elif key == "N":
                n.attr[key].i = value
            else:
                n.attr[key].type = value
        return n

    f, i = pb.DT_FLOAT, pb.DT_INT32
    nodes = [
        node("x", "Placeholder", dtype=f),
        node("i0", "Const", dtype=i),
        node("loop/Enter", "Enter", ["i0"], T=i, frame_name="loop"),
        node("loop/Enter_1", "Enter", ["x"], T=f, frame_name="loop"),
        node("loop/Merge", "Merge", ["loop/Enter", "loop/NextIteration"], T=i, N=2),
        node("loop/Merge_1", "Merge", ["loop/Enter_1", "loop/NextIteration_1"], T=f, N=2),
        node("loop/Less/y", "Const", ["^loop/Merge"], dtype=i),
        node("loop/Less", "Less", ["loop/Merge", "loop/Less/y"], T=i),
        node("loop/LoopCond", "LoopCond", ["loop/Less"]),
        node("loop/Switch", "Switch", ["loop/Merge", "loop/LoopCond"], T=i),
        node("loop/Switch_1", "Switch", ["loop/Merge_1", "loop/LoopCond"], T=f),
        node("loop/Identity", "Identity", ["loop/Switch:1"], T=i),
        node("loop/Identity_1", "Identity", ["loop/Switch_1:1"], T=f),
        node("loop/add/y", "Const", ["^loop/Identity"], dtype=i),
        node("loop/add", "AddV2", ["loop/Identity", "loop/add/y"], T=i),
        node("loop/mul/y", "Const", ["^loop/Identity"], dtype=f),
        node("loop/mul", "Mul", ["loop/Identity_1", "loop/mul/y"], T=f),
        node("loop/NextIteration", "NextIteration", ["loop/add"], T=i),
        node("loop/NextIteration_1", "NextIteration", ["loop/mul"], T=f),
        node("loop/Exit", "Exit", ["loop/Switch"], T=i),
        node("loop/Exit_1", "Exit", ["loop/Switch_1"], T=f),
        node("y", "Identity", ["loop/Exit_1"], T=f),
    ]
    return pb.GraphDef(node=nodes)


# --- devices ------------------------------------------------------------------


def test_map_device_spellings() -> None:
    assert map_device("/device:GPU:3") == "/device:CPU:3"
    assert map_device("/GPU:1") == "/device:CPU:1"
    assert map_device("/gpu:2") == "/device:CPU:2"
    assert map_device("/job:localhost/replica:0/task:0/device:GPU:1") == "/device:CPU:1"
    assert map_device("/job:localhost/replica:0/task:0/device:CPU:0") == "/device:CPU:0"
    assert map_device("") == ""
    assert map_device("/device:TPU:0") == "/device:TPU:0"  # left for TensorFlow to reject


def test_normalize_device_spellings() -> None:
    for spelling in (
        "/device:GPU:1",
        "/GPU:1",
        "/gpu:1",
        "GPU:1",
        "/job:localhost/replica:0/task:0/device:GPU:1",
    ):
        assert normalize_device(spelling) == "/device:GPU:1", spelling
    assert normalize_device("/job:worker/replica:0/task:1/device:GPU:1") != "/device:GPU:1"
    assert normalize_device("/device:CPU:0") != normalize_device("/device:GPU:0")
    assert normalize_device("") == ""


def test_shorten_tf_message_keeps_the_informative_line() -> None:
    message = (
        "Graph execution error:\n\nDetected at node 'a' defined at (most recent call last):\n"
        "Node: 'a'\nCannot colocate nodes {{colocation_node a}} and {{colocation_node b}}: "
        "Cannot merge devices\n\t [[{{node a}}]]"
    )
    assert shorten_tf_message(message) == "Cannot colocate nodes a and b: Cannot merge devices"


# --- static check: passing -------------------------------------------------------


def test_placed_by_baechi_passes_against_the_original(tmp_path: Path) -> None:
    out = tmp_path / "placed.pb"
    assert run("place", CNN, "--devices", "2x8GB", "--algo", "etf", "-o", str(out), "-q").exit_code == 0
    r = run("verify", str(out), "--original", CNN)
    assert r.exit_code == 0, r.output
    assert "same graph as" in r.output and "every op has a device" in r.output
    assert r.output.rstrip().endswith("verified")
    # Only the device fields changed, so the original is also a valid "placed" graph's original.
    assert run("verify", str(out)).exit_code == 0


def test_static_check_api_counts_constraints(tmp_path: Path) -> None:
    result = static_check(_placed(tmp_path, CNN, _all_on("/device:GPU:3")), CNN)
    assert isinstance(result, StaticResult)
    assert result.ok and result.problems() == []
    assert result.ops_total == 355
    assert result.devices == {"/device:GPU:3": 355}
    assert result.num_devices == 4  # up to index 3
    # 230 nodes carry _class (a variable's own entry names itself); every ReadVariableOp,
    # AssignVariableOp, VarIsInitializedOp and ResourceApplyAdam consumes a resource.
    assert result.constraints["_class"] > 200
    assert result.constraints["resource/ref"] > 100
    assert result.constraints["loop frame"] == 0


def test_device_spellings_count_as_one_device(tmp_path: Path) -> None:
    spellings = ["/device:GPU:1", "/GPU:1", "/gpu:1", "/job:localhost/replica:0/task:0/device:GPU:1"]
    nodes = iter(range(10**6))
    placed = _placed(tmp_path, MLP, lambda node: spellings[next(nodes) % len(spellings)])
    result = static_check(placed, MLP)
    assert result.ok, result.problems()
    assert result.devices == {"/device:GPU:1": 138}


def test_ref_variable_graph_on_two_devices_passes(tmp_path: Path) -> None:
    # mlp: ref variables, _class on every variable-related and gradient op.
    # Everything colocated with dense2's variables on GPU:1 is a legal split.
    from baechi_cli.io.graphdef import read_graphdef
    from baechi_cli.passes.colocation import colocate

    graph = colocate(read_graphdef(MLP))
    index = graph.index()
    groups = {graph.group[index[n]] for n in ("dense2/kernel", "dense2/bias")}
    on_one = {name for v, name in enumerate(graph.names) if graph.group[v] in groups}
    placed = _placed(tmp_path, MLP, lambda n: "/device:GPU:1" if n.name in on_one else "/device:GPU:0")
    result = static_check(placed, MLP)
    assert result.ok, result.problems()
    assert set(result.devices) == {"/device:GPU:0", "/device:GPU:1"}


def test_while_loop_on_one_device_passes(tmp_path: Path) -> None:
    loop = _while_loop()
    original = _placed(tmp_path, pb.GraphDef.FromString(loop.SerializeToString()), _all_on(""), "loop.pb")
    # The loop on GPU:1, what feeds it and what it feeds on GPU:0.
    placed = _placed(tmp_path, loop, lambda n: "/device:GPU:1" if n.name.startswith("loop/") else "/GPU:0")
    result = static_check(placed, original)
    assert result.ok, result.problems()
    assert result.constraints["loop frame"] == 18  # the 19 ops of the frame but the Enter named in messages


# --- static check: failing ------------------------------------------------------


def test_resource_read_moved_away_from_its_variable(tmp_path: Path) -> None:
    # The forward ReadVariableOps carry no _class: only the resource input ties them.
    placed = _placed(tmp_path, CNN, _except({"conv0/Conv2D/ReadVariableOp": "/GPU:1"}))
    r = run("verify", placed, "--original", CNN)
    assert r.exit_code == 1, r.output
    assert _problem_lines(r.output) == [
        "'conv0/Conv2D/ReadVariableOp' reads resource 'conv0/kernel' but is on /device:GPU:1 "
        "and it on /device:GPU:0"
    ]
    assert "FAIL 1 of" in r.output and "colocation constraints broken" in r.output
    assert r.output.rstrip().endswith("FAILED: 1 problem")


def test_class_member_moved(tmp_path: Path) -> None:
    # mlp's dense0/kernel/read (Identity of a ref variable) has _class loc:@dense0/kernel.
    placed = _placed(tmp_path, MLP, _except({"dense0/kernel/read": "/device:GPU:1"}))
    result = static_check(placed)
    assert not result.ok
    assert [v.message() for v in result.violations] == [
        "'dense0/kernel/read' is colocated with 'dense0/kernel' by its _class attr "
        "but is on /device:GPU:1 and it on /device:GPU:0"
    ]
    assert result.violations[0].kind == "_class"


def test_ref_consumer_moved(tmp_path: Path) -> None:
    # A ref input ties its consumer even without _class: drop the _class to see that rule alone.
    graph_def = _load(MLP)
    for node in graph_def.node:
        if node.name == "dense0/kernel/Assign":
            del node.attr["_class"]
    placed = _placed(tmp_path, graph_def, _except({"dense0/kernel/Assign": "/device:GPU:1"}))
    messages = [v.message() for v in static_check(placed).violations]
    assert messages == [
        "'dense0/kernel/Assign' uses reference 'dense0/kernel' (float32_ref) but is on /device:GPU:1 "
        "and it on /device:GPU:0"
    ]


def test_loop_frame_split(tmp_path: Path) -> None:
    placed = _placed(tmp_path, _while_loop(), _except({"loop/mul": "/device:GPU:1"}))
    r = run("verify", placed)
    assert r.exit_code == 1, r.output
    assert _problem_lines(r.output) == [
        "'loop/mul' is in the while loop that 'loop/Enter_1' enters (frame 'loop') "
        "but is on /device:GPU:1 and it on /device:GPU:0"
    ]


def test_attr_changed_against_the_original(tmp_path: Path) -> None:
    graph_def = _load(CNN)
    for node in graph_def.node:
        if node.name == "conv1/Conv2D":
            node.attr["padding"].s = b"VALID"
    r = run("verify", _placed(tmp_path, graph_def, _all_on("/device:GPU:0")), "--original", CNN)
    assert r.exit_code == 1, r.output
    assert "FAIL 1 difference(s) from" in r.output
    assert _problem_lines(r.output) == [
        "op 'conv1/Conv2D': attr 'padding' is s: \"VALID\" instead of s: \"SAME\""
    ]


def _move_first_node_last(graph_def: pb.GraphDef) -> None:
    first = pb.NodeDef()
    first.CopyFrom(graph_def.node[0])
    del graph_def.node[0]
    graph_def.node.append(first)


# In cnn.pb: node 0 'images', 1 'labels', 3 a Const, 7 a Mul of two inputs, 10 a
# VarIsInitializedOp nothing consumes.
@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda g: g.node[7].input.append("^images"), "op '{7}': 3 inputs instead of 2"),
        (lambda g: g.node[7].input.reverse(), "op '{7}': input #0 is '{6}' instead of '{5}'"),
        (lambda g: setattr(g.node[3], "op", "Relu"), "op '{3}': op type Relu instead of Const"),
        (lambda g: g.node[3].attr.pop("dtype"), "op '{3}': attr 'dtype' is missing"),
        (lambda g: g.node.pop(10), "op '{10}' of the original is missing"),
        (lambda g: g.node.add(name="extra", op="NoOp"), "op 'extra' is not in the original"),
        (lambda g: setattr(g.node[10], "name", "renamed"), "op 'renamed' is not in the original"),
        (_move_first_node_last, "the node order changed: node #0 is '{1}', in the original '{0}'"),
        (
            lambda g: setattr(g.versions, "producer", 1),
            "GraphDef field 'versions' differs from the original's: producer: 1 instead of producer: 2474",
        ),
        (
            lambda g: setattr(g.library.function.add().signature, "name", "f"),
            "the function library has a function the original lacks: 'f'",
        ),
    ],
    ids=[
        "input-added",
        "inputs-swapped",
        "op",
        "attr",
        "missing",
        "extra",
        "renamed",
        "order",
        "versions",
        "library",
    ],
)
def test_graph_differences_name_the_op(tmp_path: Path, edit: Callable, expected: str) -> None:
    graph_def = _load(CNN)
    names = [node.name for node in graph_def.node]
    edit(graph_def)
    result = static_check(_placed(tmp_path, graph_def, _all_on("/device:GPU:0")), CNN)
    assert not result.ok
    assert expected.format(*names) in result.differences, result.differences


def test_node_without_device(tmp_path: Path) -> None:
    placed = _placed(tmp_path, CNN, _except({"conv1/BiasAdd": "", "labels": ""}))
    r = run("verify", placed)
    assert r.exit_code == 1, r.output
    assert "FAIL 2 of 355 ops have no device" in r.output
    assert _problem_lines(r.output) == ["2 op(s) have no device: 'labels', 'conv1/BiasAdd'"]


def test_many_problems_are_cut_short_with_a_count(tmp_path: Path) -> None:
    # Alternate devices: nearly every colocation constraint breaks.
    flip = iter(range(10**6))
    placed = _placed(tmp_path, CNN, lambda node: f"/device:GPU:{next(flip) % 2}")
    result = static_check(placed)
    assert result.violations_count > 50
    r = run("verify", placed)
    assert r.exit_code == 1
    lines = _problem_lines(r.output)
    assert len(lines) == SHOWN + 1
    assert lines[-1] == f"... and {result.violations_count - SHOWN} more"


def test_json_output(tmp_path: Path) -> None:
    placed = _placed(tmp_path, CNN, _except({"conv0/Conv2D/ReadVariableOp": "/GPU:1"}))
    r = run("verify", placed, "--original", CNN, "--json")
    assert r.exit_code == 1
    doc = json.loads(r.output)
    assert doc["schema"] == "baechi.verify/v1"
    assert doc["ok"] is False and doc["run"] is None
    assert doc["original"] == CNN
    static = doc["static"]
    assert static["differences"] == [] and static["without_device_count"] == 0
    assert static["violations_count"] == 1
    assert static["violations"][0] == {
        "op": "conv0/Conv2D/ReadVariableOp",
        "other": "conv0/kernel",
        "kind": "resource/ref",
        "reason": "reads resource 'conv0/kernel'",
        "device": "/device:GPU:1",
        "other_device": "/device:GPU:0",
        "message": "'conv0/Conv2D/ReadVariableOp' reads resource 'conv0/kernel' but is on /device:GPU:1 "
        "and it on /device:GPU:0",
    }
    assert static["devices"] == {"/device:GPU:0": 354, "/device:GPU:1": 1}


def test_static_check_never_imports_tensorflow(tmp_path: Path) -> None:
    placed = _placed(tmp_path, CNN, _all_on("/device:GPU:0"))
    code = (
        "import sys\nfrom baechi_cli.cli.commands import main\n"
        f"try:\n    main(['verify', {placed!r}, '--original', {CNN!r}])\n"
        "except SystemExit as e:\n    assert e.code in (0, None), e.code\n"
        "print(any(m == 'tensorflow' or m.startswith('tensorflow.') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "False", out


# --- bad input ------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["{tmp}/nope.pb"], "no such file"),
        (["{tmp}/junk.pb"], "not a GraphDef"),
        (["{placed}", "--original", "{tmp}/nope.pb"], "nope.pb: no such file"),
        (["{placed}", "--steps", "2"], "apply only with --run"),
        (["{placed}", "--devices", "2"], "apply only with --run"),
        (["{placed}", "{tmp}/s.json", "--sidecar", "{tmp}/s.json"], "not both"),
    ],
    ids=["missing", "junk", "missing-original", "steps-without-run", "devices-without-run", "two-sidecars"],
)
def test_bad_input_exits_2(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "junk.pb").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    placed = _placed(tmp_path, CNN, _all_on("/device:GPU:0"))
    r = run("verify", *(a.format(tmp=tmp_path, placed=placed) for a in args))
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_default_sidecar_sits_beside_the_model(tmp_path: Path) -> None:
    placed = _placed(tmp_path, CNN, _all_on("/device:GPU:0"))
    assert default_sidecar(placed, CNN) == str(TESTDATA / "cnn.json")
    with pytest.raises(InputError, match=r"no .*placed\.json beside it; pass --sidecar"):
        default_sidecar(placed)


@pytest.mark.skipif(not HAS_TF, reason="--run checks TensorFlow is installed first")
def test_run_input_errors_come_before_tensorflow_runs(tmp_path: Path) -> None:
    placed = _placed(tmp_path, CNN, _except({"labels": "/device:GPU:3"}))
    r = run("verify", placed, "--run")
    assert r.exit_code == 2 and "pass --sidecar" in r.output
    r = run("verify", placed, "--original", CNN, "--run", "--devices", "2")
    assert r.exit_code == 2
    assert "the placement uses 4 devices (up to index 3) but --devices is 2" in r.output


def test_run_without_tensorflow_exits_5(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorflow" else find_spec(name, *a)
    )
    r = run("verify", _placed(tmp_path, CNN, _all_on("/device:GPU:0")), "--original", CNN, "--run")
    assert r.exit_code == 5
    assert "pip install 'baechi[tf]'" in r.output


def test_bad_sidecar_is_input_error(tmp_path: Path) -> None:
    sidecar = tmp_path / "s.json"
    sidecar.write_text('{"inputs": []}')
    with pytest.raises(InputError, match="lacks 'loss'"):
        verify_placed_graph(MLP, str(sidecar), 2)


# --- TensorFlow runs ------------------------------------------------------------


@pytest.fixture(scope="module")
def tf_graph_pb2() -> Any:
    pytest.importorskip("tensorflow")
    from tensorflow.core.framework import graph_pb2

    return graph_pb2


def _tf_load(graph_pb2: Any, name: str) -> Any:
    graph_def = graph_pb2.GraphDef()
    graph_def.ParseFromString((TESTDATA / f"{name}.pb").read_bytes())
    return graph_def


def _tf_write(graph_def: Any, path: Path, devices: dict[str, str]) -> str:
    for node in graph_def.node:
        node.device = devices[node.name]
    path.write_bytes(graph_def.SerializeToString(deterministic=True))
    return str(path)


def _colocation_groups(graph_def: Any) -> dict[str, str]:
    """Node name -> group representative, from ``_class`` and resource/ref inputs (TF's op defs)."""
    from tensorflow.core.framework import types_pb2
    from tensorflow.python.framework import op_def_registry

    parent = {node.name: node.name for node in graph_def.node}

    def find(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    def union(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    for node in graph_def.node:
        if "_class" in node.attr:
            for spec in node.attr["_class"].list.s:
                union(node.name, spec.decode().removeprefix("loc:@"))
        if node.op in _RESOURCE_EXEMPT:
            continue
        arg_types: list[tuple[int, bool]] = []
        for arg in op_def_registry.get(node.op).input_arg:
            if arg.type_list_attr:
                types = list(node.attr[arg.type_list_attr].list.type)
            else:
                count = node.attr[arg.number_attr].i if arg.number_attr else 1
                types = [arg.type or node.attr[arg.type_attr].type] * count
            arg_types += [(t, arg.is_ref) for t in types]
        data_inputs = [i for i in node.input if not i.startswith("^")]
        for source, (dtype, is_ref) in zip(data_inputs, arg_types, strict=True):
            if dtype == types_pb2.DT_RESOURCE or is_ref:
                union(node.name, source.split(":")[0])
    return {name: find(name) for name in parent}


@pytest.mark.tf
def test_single_device_placement_verifies(tf_graph_pb2: Any, tmp_path: Path) -> None:
    graph_def = _tf_load(tf_graph_pb2, "mlp")
    placed = _tf_write(graph_def, tmp_path / "p.pb", {n.name: "/device:GPU:0" for n in graph_def.node})
    result = verify_placed_graph(placed, str(TESTDATA / "mlp.json"), 2, steps=2)
    assert result.error is None
    assert result.ok and result.losses_equal and not result.misplaced
    assert len(result.loss_placed) == 2
    assert list(result.devices_used) == ["/device:CPU:0"]
    assert result.ops_checked > 0.8 * result.ops_total


@pytest.mark.tf
def test_resource_read_on_other_device_is_caught(tf_graph_pb2: Any, tmp_path: Path) -> None:
    # A ReadVariableOp without _class: TF silently runs it on its variable's device.
    graph_def = _tf_load(tf_graph_pb2, "cnn")
    bad = "conv0/Conv2D/ReadVariableOp"
    devices = {n.name: "/device:GPU:1" if n.name == bad else "/device:GPU:0" for n in graph_def.node}
    result = verify_placed_graph(
        _tf_write(graph_def, tmp_path / "p.pb", devices), str(TESTDATA / "cnn.json"), 2
    )
    assert not result.ok
    assert result.misplaced == [(bad, "/device:GPU:1", "/device:CPU:0")]


@pytest.mark.tf
def test_split_class_group_is_rejected(tf_graph_pb2: Any, tmp_path: Path) -> None:
    # dense0/kernel/read carries _class loc:@dense0/kernel; strict placement refuses the split.
    graph_def = _tf_load(tf_graph_pb2, "mlp")
    devices = {
        n.name: "/device:GPU:1" if n.name == "dense0/kernel/read" else "/GPU:0" for n in graph_def.node
    }
    result = verify_placed_graph(
        _tf_write(graph_def, tmp_path / "p.pb", devices), str(TESTDATA / "mlp.json"), 2
    )
    assert not result.ok
    assert result.error is not None and "Cannot colocate nodes" in result.error
    assert "\n" not in result.error and "Traceback" not in result.error


@pytest.mark.tf
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_variable_groups_on_second_device_verify(tf_graph_pb2: Any, tmp_path: Path, name: str) -> None:
    # Every variable with all ops colocated with it (by _class or as a resource/ref
    # consumer, per TensorFlow's own op defs) on device 1, everything else on
    # device 0: a legal split in which every forward and gradient op reads its
    # weights across devices. The static check agrees with TensorFlow's op defs.
    graph_def = _tf_load(tf_graph_pb2, name)
    groups = _colocation_groups(graph_def)
    variables = {n.name for n in graph_def.node if n.op in ("VariableV2", "VarHandleOp")}
    weight_groups = {groups[v] for v in variables}
    devices = {
        n.name: "/device:GPU:1" if groups[n.name] in weight_groups else "/device:GPU:0"
        for n in graph_def.node
    }
    placed = _tf_write(graph_def, tmp_path / "p.pb", devices)
    assert static_check(placed, str(TESTDATA / f"{name}.pb")).ok
    result = verify_placed_graph(placed, str(TESTDATA / f"{name}.json"), 2, steps=2)
    assert result.error is None
    assert result.ok, result.misplaced
    assert result.losses_bitwise_equal  # observed with TF 2.21 on CPU: placement does not reorder math
    assert set(result.devices_used) == {"/device:CPU:0", "/device:CPU:1"}
    assert min(result.devices_used.values()) > 10


@pytest.mark.tf
def test_matmul_and_bias_add_on_different_devices_verify(tf_graph_pb2: Any, tmp_path: Path) -> None:
    # Grappler's remapper would fuse each MatMul+BiasAdd(+Relu) and run it on
    # the MatMul's device; verification turns grappler off, so this split holds.
    graph_def = _tf_load(tf_graph_pb2, "mlp")
    groups = _colocation_groups(graph_def)
    bias_add_groups = {groups[n.name] for n in graph_def.node if n.op == "BiasAdd"}
    devices = {
        n.name: "/device:GPU:1" if groups[n.name] in bias_add_groups else "/device:GPU:0"
        for n in graph_def.node
    }
    result = verify_placed_graph(
        _tf_write(graph_def, tmp_path / "p.pb", devices), str(TESTDATA / "mlp.json"), 2
    )
    assert result.ok, (result.error, result.misplaced)
    assert set(result.devices_used) == {"/device:CPU:0", "/device:CPU:1"}


@pytest.mark.tf
def test_cli_run_against_the_original(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    out = tmp_path / "placed.pb"
    assert run("place", CNN, "--devices", "2x8GB", "--algo", "etf", "-o", str(out), "-q").exit_code == 0
    # The sidecar is testdata/cnn.json (beside the original); devices: as many as the placement uses.
    r = run("verify", str(out), "--original", CNN, "--run", "--steps", "2", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["ok"] and doc["static"]["ok"] and doc["run"]["ok"]
    assert doc["run"]["num_devices"] == doc["static"]["num_devices"] == 2
    assert doc["run"]["reference"] == CNN and doc["run"]["sidecar"] == str(TESTDATA / "cnn.json")
    assert doc["run"]["losses_bitwise_equal"] and len(doc["run"]["loss_placed"]) == 2
    assert doc["run"]["misplaced"] == []


@pytest.mark.tf
def test_cli_run_reports_a_silent_re_placement(tmp_path: Path) -> None:
    # TensorFlow runs the moved ReadVariableOp on its variable's device: both
    # the static check and the run say so.
    pytest.importorskip("tensorflow")
    placed = _placed(tmp_path, CNN, _except({"conv0/Conv2D/ReadVariableOp": "/device:GPU:1"}))
    r = run("verify", placed, "--original", CNN, "--run")
    assert r.exit_code == 1, r.output
    assert _problem_lines(r.output) == [
        "'conv0/Conv2D/ReadVariableOp' reads resource 'conv0/kernel' but is on /device:GPU:1 "
        "and it on /device:GPU:0",
        "'conv0/Conv2D/ReadVariableOp' is placed on /device:GPU:1 but ran on /device:CPU:0",
    ]
    assert "FAIL TensorFlow (1 step on 2 CPU devices)" in r.output


def _torch_doc(schedule: str, stages_of_rank: list[list[int]]) -> dict:
    """A ``baechi verify --torch --json`` document of a run that passed, ``stages_of_rank[r]`` on rank r."""
    rank_of = {s: r for r, stages in enumerate(stages_of_rank) for s in stages}
    return {
        "ok": True,
        "ran": True,
        "error": None,
        "gradients_match": True,
        "rtol": 1e-5,
        "worst": {"parameter": "w", "relative_l2": 1e-7, "tolerance": 1e-5},
        "loss": {"pipeline": [0.5], "one_process": [0.5], "relative": 0.0},
        "parameters_compared": 1,
        "parameters_missing": [],
        "schedule": schedule,
        "torch_schedule": "Schedule1F1B",
        "stages": len(rank_of),
        "ranks": len(stages_of_rank),
        "microbatches": 4,
        "steps": 1,
        "cut_by": "program nodes",
        "threaded": [],
        "tied": [],
        "moved_nodes": [],
        "displaced_nodes": [],
        "split_nodes": [],
        "per_rank": [
            {"rank": r, "stages": stages, "peak_bytes": 2_000_000, "predicted_peak_bytes": 2_100_000}
            for r, stages in enumerate(stages_of_rank)
        ],
        "per_stage": [
            {"stage": s, "rank": rank_of[s], "compute_us": 1000.0 * (s + 1), "predicted_compute_us": None}
            for s in sorted(rank_of)
        ],
        "minibatch_us": {"measured": 9000.0, "predicted": 8000.0, "threads_per_rank": 1},
        "compute_imbalance": {"measured": 1.5, "predicted": None},
    }


def test_a_makespan_runs_compute_is_summed_per_rank_and_a_pipelines_shown_per_stage():
    """A makespan plan has tens to hundreds of runs of a few ops: the summary gives each rank's
    runs and their summed compute (each run stays in --json), and no balance line, which its runs
    do not aim for; a pipeline's stages are listed one per line."""
    from rich.console import Console

    from baechi_cli.cli.render.verify import render_torch_result

    console = Console(record=True, width=200)
    render_torch_result(console, _torch_doc("makespan", [[0, 2, 4], [1, 3]]))
    text = console.export_text()
    assert (
        "rank 0 (3 runs): peak 2.00 MB, predicted 2.10 MB (0.95x); forward+backward of its runs 9.000 ms"
        in text
    )
    assert "rank 1 (2 runs)" in text and "forward+backward of its runs 6.000 ms" in text
    assert "run 0" not in text and "slowest" not in text and "step: 9.000 ms measured" in text

    console = Console(record=True, width=200)
    render_torch_result(console, _torch_doc("1f1b", [[0], [1]]))
    text = console.export_text()
    assert "rank 0 (stage 0): peak" in text and "stage 1 (rank 1): forward+backward 2.000 ms" in text
    assert "slowest stage / mean: measured 1.50" in text and "minibatch: 9.000 ms" in text
