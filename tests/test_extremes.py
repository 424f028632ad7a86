"""Extreme values through the CLI: zero costs, terabyte tensors, astronomic compute, many or one device.

Each case is a small workload JSON (or GraphDef) placed by ``baechi place``
with every algorithm. What must hold: the documented exit code (0 placed, 2
bad input, 3 does not fit), a failure is one line on stderr and leaves no
file behind, and a report is valid JSON (no NaN or Infinity tokens, which
Python's json would write and a strict reader rejects) with finite times.
"""

from __future__ import annotations

import json
import math
import os

import pytest
from click.testing import CliRunner

from baechi_cli.cli import main
from baechi_cli.proto_gen import tf_graph_pb2 as pb

ALGOS = ("auto", "topo", "etf", "sct", "single")
MAX_DEVICES = 4096  # the most --devices accepts (baechi_cli/devices.py, MAX_DEVICES)


def workload(tmp_path, nodes, edges, name="w.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"nodes": nodes, "edges": edges}))
    return str(path)


def chain(n, latency_ms=1.0, size=0.0, edge_size=0.0, fanout=1):
    """n nodes, node i feeding the next ``fanout`` nodes (workload JSON)."""
    nodes = [{"id": i, "name": f"n{i}", "fpgaLatency": latency_ms, "size": size} for i in range(n)]
    edges = [
        {"sourceId": i, "destId": j, "size": edge_size}
        for i in range(n)
        for j in range(i + 1, min(n, i + 1 + fanout))
    ]
    return nodes, edges


def _reject(token):
    raise ValueError(f"not JSON: {token}")


def place(tmp_path, path, devices, algo, *extra):
    """Run ``baechi place``; returns (result, report or None). Checks what every run must meet."""
    report = tmp_path / "report.json"
    if report.exists():
        report.unlink()
    r = CliRunner().invoke(
        main, ["place", path, "--devices", devices, "--algo", algo, "--report", str(report), "-q", *extra]
    )
    assert "Traceback" not in r.output and r.exit_code in (0, 2, 3), (r.exit_code, r.output)
    if r.exit_code != 0:
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
        assert not report.exists()
        assert not [p for p in os.listdir(tmp_path) if p.startswith(".baechi-")]
        return r, None
    doc = json.loads(report.read_text(), parse_constant=_reject)
    result = doc["result"]
    assert math.isfinite(result["step_time_us"]) and math.isfinite(result["lower_bound_us"])
    assert result["step_time_us"] >= result["lower_bound_us"] * (1 - 1e-9)
    return r, doc


@pytest.mark.parametrize("algo", ALGOS)
def test_zero_costs_place_in_zero_time(tmp_path, algo):
    nodes, edges = chain(20, latency_ms=0.0, fanout=2)
    r, doc = place(tmp_path, workload(tmp_path, nodes, edges), "4x8GB", algo)
    assert r.exit_code == 0
    assert doc["result"]["step_time_us"] == 0.0 and doc["result"]["lower_bound_us"] == 0.0
    assert all(c["gap"] is None for c in doc["candidates"])  # no gap to a zero bound
    assert all(d["utilization"] == 0.0 and d["peak_bytes"] == 0 for d in doc["per_device"])


@pytest.mark.parametrize("algo", ALGOS)
def test_terabyte_tensors_stay_where_they_are_made(tmp_path, algo):
    # A workload's ports hold no bytes (a node's size holds its output): a 1 TB edge
    # costs memory only as a received copy, so the chain places on one 8 GB device.
    # (auto exited 3 here: its exact stage counted every input as a copy.)
    nodes, edges = chain(6, edge_size=1e12, fanout=2)
    r, doc = place(tmp_path, workload(tmp_path, nodes, edges), "4x8GB", algo)
    assert r.exit_code == 0, r.output
    assert doc["result"]["comm_bytes"] == 0 and doc["result"]["step_time_us"] == 6000.0


@pytest.mark.parametrize("algo", ALGOS)
def test_a_terabyte_copy_that_must_be_made_does_not_fit(tmp_path, algo):
    # Together the pair's weights exceed 8 GB; apart, b receives a 1 TB copy.
    nodes = [
        {"id": 0, "name": "a", "fpgaLatency": 1.0, "size": 5e9},
        {"id": 1, "name": "b", "fpgaLatency": 1.0, "size": 5e9},
    ]
    edges = [{"sourceId": 0, "destId": 1, "size": 1e12}]
    path = workload(tmp_path, nodes, edges)
    r, _ = place(tmp_path, path, "4x8GB", algo)
    assert r.exit_code == 3
    assert "does not fit" in r.stderr and path in r.stderr
    r, doc = place(tmp_path, path, "2x2TB", algo)
    assert r.exit_code == 0
    assert max(d["peak_bytes"] for d in doc["per_device"]) <= 2 * 10**12


def _tensor_graph(tmp_path, rows, cols):
    """x (float32 [rows, cols]) -> relu -> out, as a GraphDef with output shapes."""

    def node(name, op, inputs=()):
        n = pb.NodeDef(name=name, op=op, input=list(inputs))
        n.attr["dtype" if op == "Placeholder" else "T"].type = pb.DT_FLOAT
        shape = n.attr["_output_shapes"].list.shape.add()
        for d in (rows, cols):
            shape.dim.add(size=d)
        return n

    path = tmp_path / "big.pb"
    graph = pb.GraphDef(
        node=[node("x", "Placeholder"), node("relu", "Relu", ["x"]), node("out", "Relu", ["relu"])]
    )
    path.write_bytes(graph.SerializeToString())
    return str(path)


@pytest.mark.parametrize("algo", ALGOS)
def test_terabyte_outputs_of_a_graphdef(tmp_path, algo):
    path = _tensor_graph(tmp_path, 250_000, 1_000_000)  # 1e12 bytes per tensor
    placed = tmp_path / "placed.pb"
    r, _ = place(tmp_path, path, "4x8GB", algo, "-o", str(placed))
    assert r.exit_code == 3 and " TB" in r.stderr
    assert not placed.exists()
    r, doc = place(tmp_path, path, "4x5TB", algo, "-o", str(placed))
    assert r.exit_code == 0 and placed.exists()
    assert doc["result"]["feasible"] is True


@pytest.mark.parametrize("algo", ALGOS)
def test_astronomic_compute_stays_finite(tmp_path, algo):
    nodes, edges = chain(10, latency_ms=1e12, edge_size=1000, fanout=2)  # 1e15 µs per op
    r, doc = place(tmp_path, workload(tmp_path, nodes, edges), "4x8GB", algo)
    assert r.exit_code == 0
    assert doc["result"]["step_time_us"] == pytest.approx(1e16)


def test_times_that_overflow_a_float_are_bad_input(tmp_path):
    nodes, edges = chain(4, latency_ms=1e305)  # each finite, the sum is not
    path = workload(tmp_path, nodes, edges)
    for algo in ALGOS:
        r, _ = place(tmp_path, path, "4x8GB", algo)
        assert r.exit_code == 2
        assert "add up past the largest float" in r.stderr and "op 'n0'" in r.stderr


def test_absurd_sizes_give_a_short_message(tmp_path):
    nodes, edges = chain(4, size=1e300)
    r, _ = place(tmp_path, workload(tmp_path, nodes, edges), "4x8GB", "auto")
    assert r.exit_code == 3
    assert "1.00e300 bytes" in r.stderr and len(r.stderr) < 400  # not a 300-digit number


@pytest.mark.parametrize("algo", ALGOS)
def test_one_device(tmp_path, algo):
    nodes, edges = chain(30, latency_ms=0.5, size=1000, edge_size=4096, fanout=3)
    r, doc = place(tmp_path, workload(tmp_path, nodes, edges), "1x8GB", algo)
    assert r.exit_code == 0
    assert doc["result"]["step_time_us"] == pytest.approx(30 * 500.0)
    assert doc["result"]["transfers"] == 0


@pytest.mark.parametrize("algo", ALGOS)
def test_one_op(tmp_path, algo):
    r, doc = place(
        tmp_path, workload(tmp_path, [{"id": 7, "name": "a", "fpgaLatency": 2.0}], []), "4x8GB", algo
    )
    assert r.exit_code == 0
    assert doc["result"]["step_time_us"] == 2000.0 == doc["result"]["lower_bound_us"]
    assert set(doc["placement"]) == {"a"}


@pytest.mark.parametrize("algo", ALGOS)
def test_no_edges(tmp_path, algo):
    nodes = [{"id": i, "name": f"n{i}", "fpgaLatency": 1.0 + i, "size": 10} for i in range(50)]
    r, doc = place(tmp_path, workload(tmp_path, nodes, []), "4x8GB", algo)
    assert r.exit_code == 0
    assert doc["result"]["transfers"] == 0 and len(doc["placement"]) == 50
    # nothing to wait for: any split beats one device unless the placer keeps one
    assert doc["result"]["step_time_us"] <= sum(1000.0 + 1000.0 * i for i in range(50))


def test_ten_thousand_devices_are_refused_naming_the_limit(tmp_path):
    nodes, edges = chain(10)
    r, _ = place(tmp_path, workload(tmp_path, nodes, edges), "10000x8GB", "auto")
    assert r.exit_code == 2
    assert f"more than {MAX_DEVICES} devices" in r.stderr


@pytest.mark.parametrize("algo", ("topo", "etf", "single"))
def test_the_most_devices_allowed_place_a_modest_graph(tmp_path, algo):
    nodes, edges = chain(200, latency_ms=0.5, size=1000, edge_size=4096, fanout=3)
    r, doc = place(tmp_path, workload(tmp_path, nodes, edges), f"{MAX_DEVICES}x8GB", algo)
    assert r.exit_code == 0
    assert len(doc["per_device"]) == MAX_DEVICES


@pytest.mark.slow
@pytest.mark.parametrize("algo", ("sct", "auto"))
def test_the_most_devices_allowed_with_the_slower_placers(tmp_path, algo):
    # m-SCT's LP does not grow with the devices, its list scheduling does (O(V x D));
    # auto runs every placer (about 6 s here on 2 cores).
    nodes, edges = chain(200, latency_ms=0.5, size=1000, edge_size=4096, fanout=3)
    r, doc = place(tmp_path, workload(tmp_path, nodes, edges), f"{MAX_DEVICES}x8GB", algo)
    assert r.exit_code == 0
    assert len(doc["per_device"]) == MAX_DEVICES
