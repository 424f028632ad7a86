"""Tests for baechi_cli.verify: the checker accepts legal placements and catches bad ones.

Placed graphs are built here by editing NodeDef.device with TensorFlow's own
graph_pb2, independently of the project's GraphDef writer. Each
verify_placed_graph call starts a TensorFlow subprocess (a few seconds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from baechi_cli.errors import InputError
from baechi_cli.verify import map_device, shorten_tf_message, verify_placed_graph

TESTDATA = Path(__file__).resolve().parent.parent / "testdata"

# Consumers of resource/ref inputs that TensorFlow does not pull onto the variable's device.
_RESOURCE_EXEMPT = {"IdentityN", "PartitionedCall", "StatefulPartitionedCall"}


@pytest.fixture(scope="module")
def graph_pb2() -> Any:
    pytest.importorskip("tensorflow")
    from tensorflow.core.framework import graph_pb2

    return graph_pb2


def _load(graph_pb2: Any, name: str) -> Any:
    graph_def = graph_pb2.GraphDef()
    graph_def.ParseFromString((TESTDATA / f"{name}.pb").read_bytes())
    return graph_def


def _write(graph_def: Any, path: Path, devices: dict[str, str]) -> str:
    for node in graph_def.node:
        node.device = devices[node.name]
    path.write_bytes(graph_def.SerializeToString(deterministic=True))
    return str(path)


def _colocation_groups(graph_def: Any) -> dict[str, str]:
    """Node name -> group representative, from ``_class`` and resource/ref inputs (op defs)."""
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


def test_map_device_spellings() -> None:
    assert map_device("/device:GPU:3") == "/device:CPU:3"
    assert map_device("/GPU:1") == "/device:CPU:1"
    assert map_device("/gpu:2") == "/device:CPU:2"
    assert map_device("/job:localhost/replica:0/task:0/device:GPU:1") == "/device:CPU:1"
    assert map_device("/job:localhost/replica:0/task:0/device:CPU:0") == "/device:CPU:0"
    assert map_device("") == ""
    assert map_device("/device:TPU:0") == "/device:TPU:0"  # left for TensorFlow to reject


def test_shorten_tf_message_keeps_the_informative_line() -> None:
    message = (
        "Graph execution error:\n\nDetected at node 'a' defined at (most recent call last):\n"
        "Node: 'a'\nCannot colocate nodes {{colocation_node a}} and {{colocation_node b}}: "
        "Cannot merge devices\n\t [[{{node a}}]]"
    )
    assert shorten_tf_message(message) == "Cannot colocate nodes a and b: Cannot merge devices"


def test_bad_sidecar_is_input_error(tmp_path: Path) -> None:
    sidecar = tmp_path / "s.json"
    sidecar.write_text('{"inputs": []}')
    with pytest.raises(InputError, match="lacks 'loss'"):
        verify_placed_graph(str(TESTDATA / "mlp.pb"), str(sidecar), 2)


@pytest.mark.tf
def test_single_device_placement_verifies(graph_pb2: Any, tmp_path: Path) -> None:
    graph_def = _load(graph_pb2, "mlp")
    placed = _write(graph_def, tmp_path / "p.pb", {n.name: "/device:GPU:0" for n in graph_def.node})
    result = verify_placed_graph(placed, str(TESTDATA / "mlp.json"), 2, steps=2)
    assert result.error is None
    assert result.ok and result.losses_equal and not result.misplaced
    assert len(result.loss_placed) == 2
    assert list(result.devices_used) == ["/device:CPU:0"]
    assert result.ops_checked > 0.8 * result.ops_total


@pytest.mark.tf
def test_resource_read_on_other_device_is_caught(graph_pb2: Any, tmp_path: Path) -> None:
    # A ReadVariableOp without _class: TF silently runs it on its variable's device.
    graph_def = _load(graph_pb2, "cnn")
    bad = "conv0/Conv2D/ReadVariableOp"
    devices = {n.name: "/device:GPU:1" if n.name == bad else "/device:GPU:0" for n in graph_def.node}
    result = verify_placed_graph(_write(graph_def, tmp_path / "p.pb", devices), str(TESTDATA / "cnn.json"), 2)
    assert not result.ok
    assert result.misplaced == [(bad, "/device:GPU:1", "/device:CPU:0")]


@pytest.mark.tf
def test_split_class_group_is_rejected(graph_pb2: Any, tmp_path: Path) -> None:
    # dense0/kernel/read carries _class loc:@dense0/kernel; strict placement refuses the split.
    graph_def = _load(graph_pb2, "mlp")
    devices = {
        n.name: "/device:GPU:1" if n.name == "dense0/kernel/read" else "/GPU:0" for n in graph_def.node
    }
    result = verify_placed_graph(_write(graph_def, tmp_path / "p.pb", devices), str(TESTDATA / "mlp.json"), 2)
    assert not result.ok
    assert result.error is not None and "Cannot colocate nodes" in result.error
    assert "\n" not in result.error and "Traceback" not in result.error


@pytest.mark.tf
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_variable_groups_on_second_device_verify(graph_pb2: Any, tmp_path: Path, name: str) -> None:
    # Every variable with all ops colocated with it (by _class or as a resource/ref
    # consumer) on device 1, everything else on device 0: a legal split in which
    # every forward and gradient op reads its weights across devices.
    graph_def = _load(graph_pb2, name)
    groups = _colocation_groups(graph_def)
    variables = {n.name for n in graph_def.node if n.op in ("VariableV2", "VarHandleOp")}
    weight_groups = {groups[v] for v in variables}
    devices = {
        n.name: "/device:GPU:1" if groups[n.name] in weight_groups else "/device:GPU:0"
        for n in graph_def.node
    }
    result = verify_placed_graph(
        _write(graph_def, tmp_path / "p.pb", devices), str(TESTDATA / f"{name}.json"), 2, steps=2
    )
    assert result.error is None
    assert result.ok, result.misplaced
    assert result.losses_bitwise_equal  # observed with TF 2.21 on CPU: placement does not reorder math
    assert set(result.devices_used) == {"/device:CPU:0", "/device:CPU:1"}
    assert min(result.devices_used.values()) > 10


@pytest.mark.tf
def test_matmul_and_bias_add_on_different_devices_verify(graph_pb2: Any, tmp_path: Path) -> None:
    # Grappler's remapper would fuse each MatMul+BiasAdd(+Relu) and run it on
    # the MatMul's device; verification turns grappler off, so this split holds.
    graph_def = _load(graph_pb2, "mlp")
    groups = _colocation_groups(graph_def)
    bias_add_groups = {groups[n.name] for n in graph_def.node if n.op == "BiasAdd"}
    devices = {
        n.name: "/device:GPU:1" if groups[n.name] in bias_add_groups else "/device:GPU:0"
        for n in graph_def.node
    }
    result = verify_placed_graph(_write(graph_def, tmp_path / "p.pb", devices), str(TESTDATA / "mlp.json"), 2)
    assert result.ok, (result.error, result.misplaced)
    assert set(result.devices_used) == {"/device:CPU:0", "/device:CPU:1"}
