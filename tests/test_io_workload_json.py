"""baechi_cli.io.workload_json: workload JSON -> OpGraph, and the file's device limits.

The five committed workloads (testdata/workloads/) are checked against the
files themselves and against the bounds in their REFERENCE.md; small
hand-written documents cover the mapping's corner cases and every kind of bad
input. No TensorFlow.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from baechi_cli.core.errors import InputError
from baechi_cli.core.graph import OpGraph
from baechi_cli.io.workload_json import WorkloadMeta, read_workload_json, read_workload_meta

WORKLOADS = Path(__file__).resolve().parent.parent / "testdata" / "workloads"


def _reference_rows() -> dict[str, tuple[int, float, float, float]]:
    """REFERENCE.md's bounds table: workload -> (ops, one device ms, critical path ms, size / memory)."""
    rows = {}
    for line in (WORKLOADS / "REFERENCE.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and (WORKLOADS / f"{cells[0]}.json").is_file():
            ratio = float(cells[4].split()[0])
            rows[cells[0]] = (int(cells[1]), float(cells[2]), float(cells[3]), ratio)
    return rows


REFERENCE = _reference_rows()
NAMES = sorted(REFERENCE)


def _critical_path_us(graph: OpGraph) -> float:
    """Longest compute-only path, by relaxing edges in topological order."""
    finish = [0.0] * graph.num_ops
    for v in graph.topo_order():
        start = max((finish[graph.edge_src[e]] for e in graph.in_edges[v]), default=0.0)
        finish[v] = start + graph.compute_us[v]
    return max(finish)


def _write(tmp_path: Path, doc: Any, name: str = "w.json") -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def _node(node_id: int, name: str | None = None, **fields: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"id": node_id, "fpgaLatency": 1.0, "size": 8.0, **fields}
    if name is not None:
        node["name"] = name
    return node


def _edge(src: int, dst: int, **fields: Any) -> dict[str, Any]:
    return {"sourceId": src, "destId": dst, "cost": 0.5, "size": 16.0, **fields}


# ------------------------------------------------------- committed workloads


def test_reference_table_lists_all_five_workloads():
    assert len(NAMES) == 5
    assert sorted(p.stem for p in WORKLOADS.glob("*.json")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_workload_matches_file_and_reference(name):
    path = WORKLOADS / f"{name}.json"
    doc = json.loads(path.read_text())
    ops, one_device_ms, critical_ms, size_ratio = REFERENCE[name]
    graph = read_workload_json(str(path))
    nodes, edges = doc["nodes"], doc["edges"]

    assert graph.num_ops == len(nodes) == ops
    assert graph.num_edges == len(edges)
    assert graph.names == [n["name"] for n in nodes]  # all names in these files are unique
    assert set(graph.op_types) == {"workload"}
    assert sum(graph.compute_us) / 1000 == pytest.approx(one_device_ms, abs=0.01)
    assert _critical_path_us(graph) / 1000 == pytest.approx(critical_ms, abs=0.01)
    meta = read_workload_meta(str(path))
    assert sum(graph.persistent_bytes) / meta.max_size_per_fpga == pytest.approx(size_ratio, abs=0.01)

    classes = {n["colorClass"] for n in nodes if n.get("colorClass") is not None}
    uncolored = sum(1 for n in nodes if n.get("colorClass") is None)
    groups = graph.group_members()
    assert len(groups) == len(classes) + uncolored
    assert all(g == members[0] for g, members in groups.items())  # group id = smallest op id

    op_of_id = {n["id"]: v for v, n in enumerate(nodes)}
    assert all(us is not None for us in graph.edge_transfer_us)
    for e, edge in enumerate(edges):
        assert (graph.edge_src[e], graph.edge_dst[e]) == (
            op_of_id[edge["sourceId"]],
            op_of_id[edge["destId"]],
        )
        assert graph.edge_port[e] == 0
        assert graph.edge_transfer_us[e] == pytest.approx(edge["cost"] * 1000)
        assert graph.edge_bytes[e] == math.ceil(edge["size"])
    # `size` holds the output already: the port adds no memory of its own.
    assert graph.output_bytes == [[0]] * graph.num_ops
    assert graph.is_backward == [bool(n["isBackwardNode"]) for n in nodes]


@pytest.mark.parametrize(
    ("name", "backward", "paired"),
    [
        ("throughput_LayerGraphs_gnmt_training", 96, 96),
        ("throughput_OperatorGraphs_bert_l-3_training", 365, 342),
        ("throughput_OperatorGraphs_resnet50_training", 639, 619),
        ("throughput_LayerGraphs_inceptionv3_inference", 0, 0),
        ("latency_OperatorGraphs_bert_l-3_inference", 0, 0),
    ],
)
def test_backward_ops_find_their_forward_op(name, backward, paired):
    graph = read_workload_json(str(WORKLOADS / f"{name}.json"))
    assert sum(graph.is_backward) == backward
    fwd = graph.forward_op
    assert sum(1 for f in fwd if f >= 0) == paired
    for v, f in enumerate(fwd):
        if f >= 0:
            assert graph.is_backward[v] and not graph.is_backward[f]


def test_forward_naming_schemes():
    bert = read_workload_json(str(WORKLOADS / "throughput_OperatorGraphs_bert_l-3_training.json"))
    index = bert.index()

    def forward_name(op: str) -> str | None:
        f = bert.forward_op[index[op]]
        return bert.names[f] if f >= 0 else None

    assert forward_name("MatMul26_Grad/Reshape_6") == "MatMul26"
    assert forward_name("AdamOptimizer_cls.seq_relationship.weight") == "cls.seq_relationship.weight"
    assert forward_name("Bert_Total_Loss") is None  # a loss has no forward counterpart
    assert forward_name("AccumulateGrad_459_grad") is None
    gnmt = read_workload_json(str(WORKLOADS / "throughput_LayerGraphs_gnmt_training.json"))
    assert all(gnmt.names[v] == gnmt.names[f] + "grad" for v, f in enumerate(gnmt.forward_op) if f >= 0)


def test_meta_of_committed_workloads():
    meta = read_workload_meta(str(WORKLOADS / "latency_OperatorGraphs_bert_l-3_inference.json"))
    assert meta == WorkloadMeta(max_size_per_fpga=629_145_600, max_fpgas=4, max_cpus=8)
    assert meta.device_spec(4) == "4x629145600"
    meta = read_workload_meta(str(WORKLOADS / "throughput_LayerGraphs_gnmt_training.json"))
    assert meta == WorkloadMeta(max_size_per_fpga=17_185_374_208, max_fpgas=6, max_cpus=1)


# ------------------------------------------------------------ the mapping


def test_mapping_of_a_small_document(tmp_path):
    doc = {
        "nodes": [
            _node(10, "a", colorClass=7, fpgaLatency=0.25, size=100.0),
            _node(3, "b", colorClass=None, isBackwardNode=0),
            _node(42, "c", colorClass=7, isBackwardNode=1, type="MatMul"),
            _node(5, "a"),  # duplicate name: both fall back to their ids
            _node(6),  # no name
        ],
        "edges": [
            _edge(10, 3, size=0.125, cost=0.002),
            _edge(10, 42, size=64.0),
            _edge(3, 5, cost=None),
            {"sourceId": 42, "destId": 6},
        ],
    }
    g = read_workload_json(_write(tmp_path, doc))
    assert g.names == ["10", "b", "c", "5", "6"]
    assert g.op_types == ["workload", "workload", "MatMul", "workload", "workload"]
    assert g.compute_us == [250.0, 1000.0, 1000.0, 1000.0, 1000.0]
    assert g.persistent_bytes == [100, 8, 8, 8, 8]
    assert g.group == [0, 1, 0, 3, 4]
    assert g.is_backward == [False, False, True, False, False]
    assert g.output_bytes == [[0]] * 5
    assert g.edge_bytes == [1, 64, 16, 0]  # a one-bit tensor still takes a byte
    assert g.edge_transfer_us == [2.0, 500.0, None, None]  # no cost: the comm model decides
    assert (g.edge_src, g.edge_dst) == ([0, 0, 1, 2], [1, 2, 3, 4])


def test_fallback_names_never_clash(tmp_path):
    # Node 1's fallback "1" is node 2's name, so node 2 falls back to "2",
    # which is node 3's name, so node 3 falls back to "3".
    doc = {"nodes": [_node(1), _node(2, "1"), _node(3, "2"), _node(4, "x")], "edges": []}
    g = read_workload_json(_write(tmp_path, doc))
    assert g.names == ["1", "2", "3", "x"]


def test_forward_op_needs_a_uniquely_named_forward_node(tmp_path):
    doc = {
        "nodes": [
            _node(1, "node1"),
            _node(2, "node1grad", isBackwardNode=True),
            _node(3, "dup"),
            _node(4, "dup"),
            _node(5, "dup_Grad/x", isBackwardNode=True),
            _node(6, "SGDOptimizer_node1", isBackwardNode=True),
        ],
        "edges": [],
    }
    g = read_workload_json(_write(tmp_path, doc))
    assert g.forward_op == [-1, 0, -1, -1, -1, 0]


def test_meta_keys_are_optional(tmp_path):
    path = _write(tmp_path, {"nodes": [_node(0)], "edges": []})
    meta = read_workload_meta(path)
    assert meta == WorkloadMeta(None, None, None)
    assert meta.device_spec(4) is None


# ------------------------------------------------------------- bad input


def _error(path: str, reader=read_workload_json) -> str:
    with pytest.raises(InputError) as info:
        reader(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(path)
    return message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "the file is empty"),
        ("not json at all", "not JSON"),
        ('{"nodes": [{"id": 0, "fpgaLatency": 1}], "edges": [', "truncated JSON"),
        ("[]", "the top level is a list, not an object"),
        ('"nodes"', "the top level is a string"),
        ('{"edges": []}', "no 'nodes' list"),
        ('{"nodes": [{"id": 0, "fpgaLatency": 1}]}', "no 'edges' list"),
        ('{"nodes": {}, "edges": []}', "'nodes' is an object, not a list"),
        ('{"nodes": [], "edges": []}', "the workload has no nodes"),
        ('{"nodes": [7], "edges": []}', "node #0 is a number"),
    ],
)
def test_bad_document(tmp_path, text, expected):
    assert expected in _error(_write(tmp_path, text))


def test_undecodable_bytes(tmp_path):
    path = tmp_path / "w.json"
    path.write_bytes(b'{"nodes": "\xff\xfe\xff"}')
    assert "not JSON" in _error(str(path))


def test_missing_file_and_directory(tmp_path):
    assert "no such file" in _error(str(tmp_path / "absent.json"))
    assert "is a directory" in _error(str(tmp_path))


@pytest.mark.parametrize(
    ("node", "op", "expected"),
    [
        ({"name": "a", "fpgaLatency": 1}, "a", "node #1 has no 'id'"),
        ({"name": "a", "id": "5", "fpgaLatency": 1}, "a", "id must be an integer, not a string ('5')"),
        ({"name": "a", "id": 5}, "a", "no 'fpgaLatency'"),
        ({"id": 5}, "5", "no 'fpgaLatency'"),
        (_node(5, "a", fpgaLatency="1"), "a", "fpgaLatency must be a number, not a string ('1')"),
        (_node(5, "a", fpgaLatency=True), "a", "fpgaLatency must be a number, not a boolean"),
        (_node(5, "a", fpgaLatency=None), "a", "fpgaLatency must be a number, not null"),
        (_node(5, "a", fpgaLatency=-1.0), "a", "fpgaLatency must be finite and >= 0, not -1.0"),
        (_node(5, "a", fpgaLatency=math.nan), "a", "fpgaLatency must be finite and >= 0, not nan"),
        (_node(5, "a", fpgaLatency=math.inf), "a", "fpgaLatency must be finite and >= 0, not inf"),
        (_node(5, "a", size=-8), "a", "size must be finite and >= 0, not -8"),
        (_node(5, "a", size=10**400), "a", "size must be finite and >= 0"),
        (_node(5, "a", size=[1]), "a", "size must be a number, not a list"),
        (_node(5, "a", colorClass=[1]), "a", "colorClass must be an integer, a string or null"),
        (_node(5, "a", isBackwardNode="yes"), "a", "isBackwardNode must be true/false or 1/0"),
        (_node(5, "a", type=3), "a", "type must be a non-empty string"),
        (_node(5, 12), None, "node #1: name must be a string, not a number"),
        (_node(0, "dup"), "dup", "duplicate node id 0 (also node #0)"),
    ],
)
def test_bad_node(tmp_path, node, op, expected):
    path = _write(tmp_path, {"nodes": [_node(0, "first"), node], "edges": []})
    message = _error(path)
    assert expected in message
    if op is not None:
        assert f"op '{op}'" in message


@pytest.mark.parametrize(
    ("edge", "op", "expected"),
    [
        ("x", None, "edge #0 is a string"),
        ({"destId": 1}, None, "edge #0 has no 'sourceId'"),
        ({"sourceId": 0}, "a", "edge #0 has no 'destId'"),
        (_edge(9, 1), None, "edge #0: sourceId 9 is not a node id"),
        (_edge(0, 9), "a", "edge #0: destId 9 is not a node id"),
        (_edge(0, [1]), "a", "edge #0: destId [1] is not a node id"),
        (_edge(0, 1, cost=-0.5), "a", "edge to 'b': cost must be finite and >= 0, not -0.5"),
        (_edge(0, 1, cost=math.inf), "a", "edge to 'b': cost must be finite and >= 0, not inf"),
        (_edge(0, 1, cost="1"), "a", "edge to 'b': cost must be a number, not a string"),
        (_edge(0, 1, size=math.nan), "a", "edge to 'b': size must be finite and >= 0, not nan"),
        (_edge(0, 1, size=False), "a", "edge to 'b': size must be a number, not a boolean"),
    ],
)
def test_bad_edge(tmp_path, edge, op, expected):
    path = _write(tmp_path, {"nodes": [_node(0, "a"), _node(1, "b")], "edges": [edge]})
    message = _error(path)
    assert expected in message
    if op is not None:
        assert f"op '{op}'" in message
    else:
        assert "op '" not in message


def test_cycle(tmp_path):
    doc = {
        "nodes": [_node(0, "a"), _node(1, "b"), _node(2, "c")],
        "edges": [_edge(0, 1), _edge(1, 2), _edge(2, 0)],
    }
    message = _error(_write(tmp_path, doc))
    assert "cycle" in message and "'a'" in message


def test_self_loop(tmp_path):
    doc = {"nodes": [_node(0, "a")], "edges": [_edge(0, 0)]}
    assert "cycle: a -> a" in _error(_write(tmp_path, doc))


def test_cycle_upstream_of_a_lower_id(tmp_path):
    doc = {
        "nodes": [_node(0, "sink"), _node(1, "b"), _node(2, "c")],
        "edges": [_edge(1, 2), _edge(2, 1), _edge(2, 0)],
    }
    assert "cycle" in _error(_write(tmp_path, doc))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"maxSizePerFPGA": "16GB"}, "maxSizePerFPGA must be a number, not a string"),
        ({"maxSizePerFPGA": -1.0}, "maxSizePerFPGA must be finite and >= 0"),
        ({"maxFPGAs": 2.5}, "maxFPGAs must be a whole number, not 2.5"),
    ],
)
def test_bad_meta(tmp_path, fields, expected):
    path = _write(tmp_path, {"nodes": [_node(0)], "edges": [], **fields})
    assert expected in _error(path, read_workload_meta)
