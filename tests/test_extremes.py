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
import random

import pytest
from click.testing import CliRunner

from baechi_cli.cli.commands import main
from baechi_cli.core.devices import DeviceSpec
from baechi_cli.proto_gen import tf_graph_pb2 as pb

ALGOS = ("auto", "topo", "etf", "sct", "single")
MAX_DEVICES = 65536  # the most --devices accepts (baechi_cli/core/devices.py, MAX_DEVICES)
BERT = "testdata/workloads/latency_OperatorGraphs_bert_l-3_inference.json"


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


@pytest.mark.parametrize("count", [MAX_DEVICES + 1, 99999999999999])
def test_more_devices_than_the_cap_are_refused_naming_the_limit(tmp_path, count):
    nodes, edges = chain(10)
    r, _ = place(tmp_path, workload(tmp_path, nodes, edges), f"{count}x8GB", "auto")
    assert r.exit_code == 2
    assert f"more than {MAX_DEVICES} devices" in r.stderr


def _used(doc):
    return [d["name"] for d in doc["per_device"] if d["ops"]]


@pytest.mark.parametrize("algo", ALGOS)
def test_ten_thousand_devices_place_with_every_algorithm(tmp_path, algo):
    # Placers look at one idle device per class of interchangeable ones: about as fast as on 4.
    nodes, edges = chain(200, latency_ms=0.5, size=1000, edge_size=4096, fanout=3)
    r, doc = place(tmp_path, workload(tmp_path, nodes, edges), "10000x8GB", algo)
    assert r.exit_code == 0
    assert len(doc["per_device"]) == len(doc["devices"]) == 10000
    assert set(doc["placement"].values()) == set(_used(doc))
    assert sum(d["ops"] for d in doc["per_device"]) == 200


@pytest.mark.parametrize("algo", ("etf", "sct", "single"))
def test_devices_left_idle_change_nothing(tmp_path, algo):
    # The list schedulers (and single) choose among the same devices whatever the idle ones
    # beyond: placed on exactly the devices a 10,000-device plan used, the plan is the same.
    # (m-TOPO's share is total compute / device count, and auto's refinement tries an
    # empty device: both depend on the count.)
    nodes, edges = chain(200, latency_ms=0.5, size=1000, edge_size=4096, fanout=3)
    path = workload(tmp_path, nodes, edges)
    _, many = place(tmp_path, path, "10000x8GB", algo)
    used = _used(many)
    assert used == [f"/device:GPU:{i}" for i in range(len(used))]  # the lowest ones
    _, few = place(tmp_path, path, f"{len(used)}x8GB", algo)
    assert few["placement"] == many["placement"]
    assert few["result"]["step_time_us"] == many["result"]["step_time_us"]


@pytest.mark.parametrize("algo", ("auto", "exact"))
def test_ten_thousand_devices_for_the_exact_solver(tmp_path, algo):
    # auto runs CP-SAT on graphs of at most 40 nodes. Its model, a transfer term per edge and
    # device pair, keeps of each class of interchangeable devices as many as the graph has
    # groups: on 10,000 devices the same model, and plan, as on exactly that many.
    nodes, edges = chain(20, latency_ms=0.5, size=1000, edge_size=4096, fanout=3)
    path = workload(tmp_path, nodes, edges)
    r, many = place(tmp_path, path, "10000x8GB", algo)
    assert r.exit_code == 0
    assert len(many["per_device"]) == 10000
    if algo == "exact":
        _, few = place(tmp_path, path, "20x8GB", algo)
        assert few["placement"] == many["placement"]
        assert few["result"]["step_time_us"] == many["result"]["step_time_us"]


def _every_device_its_own_class(spec, memory_bytes=None):
    return list(range(spec.count))


def _links_yaml(tmp_path, count, memory):
    """``count`` devices, every fifth twice as fast, two per-pair links."""
    lines = ["devices:"]
    for i in range(count):
        lines.append(f"- {{name: d{i}, memory: {memory}, flops: {'20T' if i % 5 == 0 else '10.07T'}}}")
    lines += [
        "interconnect:",
        "  links:",
        "  - {a: d1, b: d2, latency: 10us, bandwidth: 50GB/s}",
        "  - {a: d3, b: d7, latency: 400us}",
    ]
    path = tmp_path / "devices.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _crowded(tmp_path):
    """150 ops of 5-15 MB each, each reading 1-3 of the 20 before: on ~50 MB devices memory
    binds, devices refuse groups and most devices get some."""
    rng = random.Random(7)
    nodes = [
        {"id": i, "name": f"n{i}", "fpgaLatency": rng.uniform(0.1, 1.0), "size": rng.randint(5, 15) * 10**6}
        for i in range(150)
    ]
    edges = [
        {"sourceId": j, "destId": i, "size": rng.randint(1, 8) * 10**5}
        for i in range(1, 150)
        for j in rng.sample(range(max(0, i - 20), i), min(i, rng.randint(1, 3)))
    ]
    return workload(tmp_path, nodes, edges, "crowded.json")


@pytest.mark.parametrize(
    ("graph", "devices", "comm"),
    [
        ("crowded", "30x55MB", "parallel"),
        ("crowded", "36x55MB", "sequential"),
        ("crowded", "6x100MB,30x40MB", "parallel"),
        ("crowded", "links", "parallel"),
        # Refused for want of room and by the look-ahead; no placement fits in the end.
        (BERT, "8x400MB", "parallel"),
    ],
)
@pytest.mark.parametrize("algo", ("etf", "sct"))
def test_idle_interchangeable_devices_are_a_shortcut_only(tmp_path, monkeypatch, graph, devices, comm, algo):
    # The list scheduler asks one idle device per class (DeviceSpec.classes); asking every
    # device, each a class of its own, must give the same plan: same devices, same order.
    path = _crowded(tmp_path) if graph == "crowded" else graph
    if devices == "links":
        devices = _links_yaml(tmp_path, 30, "55MB")
    fast, fast_doc = place(tmp_path, path, devices, algo, "--comm", comm)
    monkeypatch.setattr(DeviceSpec, "classes", _every_device_its_own_class)
    slow, slow_doc = place(tmp_path, path, devices, algo, "--comm", comm)
    assert (fast.exit_code, fast.stderr) == (slow.exit_code, slow.stderr)
    if fast_doc is not None:
        assert fast_doc["placement"] == slow_doc["placement"]
        assert fast_doc["result"] == slow_doc["result"]
        assert len(_used(fast_doc)) > 20


@pytest.mark.parametrize("algo", ALGOS)
def test_the_most_devices_allowed_place_a_modest_graph(tmp_path, algo):
    # About 2 s each on 2 cores, most of it the report: 65,536 devices listed twice.
    nodes, edges = chain(200, latency_ms=0.5, size=1000, edge_size=4096, fanout=3)
    r, doc = place(tmp_path, workload(tmp_path, nodes, edges), f"{MAX_DEVICES}x8GB", algo)
    assert r.exit_code == 0
    assert len(doc["per_device"]) == MAX_DEVICES
