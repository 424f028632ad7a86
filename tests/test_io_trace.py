"""Tests for baechi_cli.io.trace: Chrome trace-event JSON of a simulated step.

Besides the format's own rules (complete events, paired flow ids, counters),
every trace is replayed through a model of Perfetto's JSON importer: events
in its processing order (timestamp, then ``X`` slices longest first, then
file order), one slice stack per track, a slice that partially overlaps the
open one dropped, and a flow event bound to the innermost open slice. Each
flow must bind the two slices it was meant to link: producer op -> its
transfer, send -> receive, transfer -> an op it feeds.

Specs use latency 10 µs and bandwidth 100 bytes/µs unless a test says
otherwise: 1000 B take 20 µs, 500 B 15 µs, 0 B (control) 10 µs.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
from benchmodules import bench_module
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baechi_cli.core.devices import Device, DeviceSpec, Interconnect, parse_devices
from baechi_cli.core.errors import InputError
from baechi_cli.core.graph import CONTROL_PORT, GraphBuilder, OpGraph
from baechi_cli.evaluator.sim import SimResult, simulate
from baechi_cli.io import trace as trace_mod
from baechi_cli.io.trace import build_trace, merge_traces, write_trace

TRANSFER_CATS = {"transfer", "send", "recv"}


def spec(n: int = 2, mode: str = "parallel", latency: float = 10.0) -> DeviceSpec:
    devices = tuple(Device(f"/device:GPU:{i}", 10**9) for i in range(n))
    return DeviceSpec(devices, Interconnect(mode, latency_us=latency, bandwidth_bytes_per_us=100.0))


def ns(us: float) -> int:
    return round(us * 1000)


# --------------------------------------------------------------------------
# the checker
# --------------------------------------------------------------------------


def perfetto_bindings(events: list[dict]) -> dict[int, tuple[int, int]]:
    """flow id -> (source X index, target X index), as Perfetto's JSON importer binds them."""
    order = sorted(
        (ns(e["ts"]), -ns(e["dur"]) if e["ph"] == "X" else 0, i)
        for i, e in enumerate(events)
        if e["ph"] != "M"
    )
    stacks: dict[tuple[int, int], list[int]] = {}
    src: dict[int, int] = {}
    dst: dict[int, int] = {}
    for ts, _, i in order:
        e = events[i]
        stack = stacks.setdefault((e["pid"], e["tid"]), [])
        if e["ph"] == "X":
            dur = ns(e["dur"])
            while stack:
                top = events[stack[-1]]
                top_dur = ns(top["dur"])
                top_end = ns(top["ts"]) + top_dur
                # Half-open intervals; coincident instants stack instead.
                if top_end < ts or (top_end == ts and not (top_dur == 0 and dur == 0)):
                    stack.pop()
                else:
                    assert ts + dur <= top_end, (
                        f"Perfetto would drop {e['name']!r}: it overlaps {top['name']!r}"
                    )
                    break
            stack.append(i)
        elif e["ph"] == "s":
            assert stack, f"flow {e['id']} starts outside any slice"
            assert e["id"] not in src, f"flow {e['id']} starts twice"
            src[e["id"]] = stack[-1]
        elif e["ph"] == "f":
            assert stack, f"flow {e['id']} ends outside any slice"
            assert e["id"] in src, f"flow {e['id']} ends before it starts"
            assert e["id"] not in dst, f"flow {e['id']} ends twice"
            dst[e["id"]] = stack[-1]
    assert src.keys() == dst.keys()
    return {fid: (src[fid], dst[fid]) for fid in src}


def check_trace(g: OpGraph, sp: DeviceSpec, r: SimResult, trace: dict) -> None:
    """Every structural promise of the module docstring, on one trace."""
    assert json.loads(json.dumps(trace)) == trace
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    sequential = sp.interconnect.mode == "sequential"
    ndev = sp.count

    # Names: every device is a named process; every track in use is a named thread.
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert procs == {d + 1: name for d, name in enumerate(sp.names)}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert all(threads[(e["pid"], e["tid"])] for e in events)
    pid_of_tid = {tid: pid for pid, tid in threads}
    assert len(pid_of_tid) == len(threads), "tids must be unique across processes"
    assert not set(pid_of_tid) & set(procs), "a tid equal to a pid reads as a main thread"

    # Complete events: non-negative; one per op, one (parallel) or two (sequential) per transfer.
    xs = [e for e in events if e["ph"] == "X"]
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in xs)
    ops = [e for e in xs if e["cat"] not in TRANSFER_CATS]
    assert sorted(e["args"]["op_id"] for e in ops) == list(range(g.num_ops))
    for e in ops:
        v = e["args"]["op_id"]
        assert e["name"] == g.names[v] and e["cat"] == e["args"]["op_type"] == g.op_types[v]
        assert e["pid"] == r.device_of[v] + 1
        assert (ns(e["ts"]), ns(e["dur"])) == (ns(r.start[v]), ns(r.end[v]) - ns(r.start[v]))
        want = "compute" if ns(e["dur"]) > 0 else "0 µs ops"
        assert threads[(e["pid"], e["tid"])].startswith(want)
    cats = Counter(e["cat"] for e in xs if e["cat"] in TRANSFER_CATS)
    if sequential:
        assert cats == Counter({"send": len(r.transfers), "recv": len(r.transfers)} if r.transfers else {})
    else:
        assert cats == Counter({"transfer": len(r.transfers)} if r.transfers else {})

    # No two slices on a track overlap; 0 µs slices stack only on coincident instants.
    tracks: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for e in xs:
        tracks.setdefault((e["pid"], e["tid"]), []).append((ns(e["ts"]), ns(e["dur"])))
    for key, spans in tracks.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        for (a, da), (b, db) in zip(spans, spans[1:]):
            assert b >= a + da, f"overlap on {threads[key]}"
            assert b > a or da == db == 0, f"a 0 µs slice shares an instant with a slice on {threads[key]}"

    # In sequential mode the simulator never uses a channel twice at once: one track suffices.
    if sequential and all(t.end > t.recv_start for t in r.transfers):
        assert not [name for name in threads.values() if name.startswith("channel ")]

    # Flows: one start and one finish per id, same name and cat, finish not before start.
    flows = [e for e in events if e["ph"] in "sf"]
    by_id: dict[int, dict[str, dict]] = {}
    for e in flows:
        assert e["ph"] not in by_id.setdefault(e["id"], {})
        by_id[e["id"]][e["ph"]] = e
    for pair in by_id.values():
        s, f = pair["s"], pair["f"]
        assert (s["name"], s["cat"]) == (f["name"], f["cat"])
        assert f["bp"] == "e"
        assert f["ts"] >= s["ts"]

    # ... each inside a slice of its own track, and bound by Perfetto to the slices it links.
    bound = perfetto_bindings(events)
    assert bound.keys() == by_id.keys()
    index = g.index()
    links = set()
    for fid, (a, b) in bound.items():
        x, y = events[a], events[b]
        for ev, slice_ in ((by_id[fid]["s"], x), (by_id[fid]["f"], y)):
            assert (ev["pid"], ev["tid"]) == (slice_["pid"], slice_["tid"])
            assert slice_["ts"] <= ev["ts"] <= slice_["ts"] + slice_["dur"]
        if x["cat"] not in TRANSFER_CATS:  # producer -> its transfer
            assert y["cat"] in ({"send"} if sequential else {"transfer"})
            assert y["args"]["producer"] == x["name"] and y["args"]["src"] == sp.names[x["pid"] - 1]
        elif x["cat"] == "send":  # send -> its receive
            assert y["cat"] == "recv" and y["args"] == x["args"]
        else:  # transfer -> an op it feeds
            assert y["cat"] not in TRANSFER_CATS
            u, port, v = index[x["args"]["producer"]], x["args"]["port"], y["args"]["op_id"]
            assert any(g.edge_dst[e] == v and g.edge_port[e] == port for e in g.out_edges[u])
            assert x["args"]["dst"] == sp.names[r.device_of[v]]
            links.add((u, port, v))
    # Every cross-device edge is drawn.
    assert links == {
        (g.edge_src[e], g.edge_port[e], g.edge_dst[e])
        for e in range(g.num_edges)
        if r.device_of[g.edge_src[e]] != r.device_of[g.edge_dst[e]]
    }

    # Memory counters replay the memory curve.
    for d in range(ndev):
        got = [(ns(e["ts"]), e["args"]["bytes"]) for e in events if e["ph"] == "C" and e["pid"] == d + 1]
        assert all(e["name"] == "memory" for e in events if e["ph"] == "C")
        assert got == [(ns(t), level) for t, level in r.memory_curve[d]]


def run(g: OpGraph, sp: DeviceSpec, place: list[int], **kw) -> tuple[SimResult, dict]:
    r = simulate(g, sp, place, **kw)
    trace = build_trace(g, sp, r, title="test")
    check_trace(g, sp, r, trace)
    return r, trace


def threads_of(trace: dict, pid: int) -> list[str]:
    return [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name" and e["pid"] == pid]


# --------------------------------------------------------------------------
# small graphs
# --------------------------------------------------------------------------


def _fan_in() -> OpGraph:
    """Three producers on GPU1-3 feed GPU0 at once; a 0 µs op and a control edge join in."""
    b = GraphBuilder()
    prods = [b.add_op(f"p{i}", "P", [1000, 500], compute_us=10) for i in range(3)]
    z = b.add_op("z", "Zero", [100], compute_us=0)
    c = b.add_op("c", "C", [], compute_us=5)
    for p in prods:
        b.add_edge(p, c)
    b.add_edge(prods[0], c, 1)
    b.add_edge(prods[1], z)
    b.add_edge(z, c)
    b.add_edge(prods[2], c, CONTROL_PORT)
    return b.build()


def test_parallel_transfers_into_one_device_get_lanes():
    g = _fan_in()
    r, trace = run(g, spec(4, "parallel"), [1, 2, 3, 2, 0])
    # p0:0, p0:1, p1:0, p2:0, ^p2 and z:0 (z runs at 10, right after p1) all start at 10
    # and overlap on GPU0.
    into0 = [t for t in r.transfers if t.dst_device == 0]
    assert len(into0) == 6 and all(t.recv_start == 10.0 for t in into0)
    assert threads_of(trace, 1) == ["compute"] + [f"recv {i}" for i in range(1, 7)]
    assert threads_of(trace, 3) == ["compute", "0 µs ops"]


def test_sequential_uses_one_channel_per_device():
    g = _fan_in()
    r, trace = run(g, spec(4, "sequential"), [1, 2, 3, 2, 0])
    assert threads_of(trace, 1) == ["compute", "channel"]
    assert threads_of(trace, 2) == ["compute", "channel"]
    # GPU0's channel serialises the receives that overlapped in parallel mode.
    recvs = sorted((t.recv_start, t.end) for t in r.transfers if t.dst_device == 0)
    assert all(a[1] <= b[0] for a, b in zip(recvs, recvs[1:]))


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_event_contents(mode):
    # a on GPU0: 0-10; its 1000 B reach GPU1 at 30 (both channels free); b on GPU1: 30-50.
    b = GraphBuilder()
    a = b.add_op("a", "MatMul", [1000], compute_us=10)
    c = b.add_op("b", "Relu", [], compute_us=20)
    b.add_edge(a, c)
    b.add_edge(a, c, CONTROL_PORT)
    g = b.build()
    _, trace = run(g, spec(2, mode), [0, 1])
    events = trace["traceEvents"]
    op_a = next(e for e in events if e["name"] == "a")
    assert op_a == {
        "name": "a",
        "cat": "MatMul",
        "ph": "X",
        "ts": 0.0,
        "dur": 10.0,
        "pid": 1,
        "tid": op_a["tid"],
        "args": {"op_type": "MatMul", "op_id": 0, "duration_us": 10.0},
    }
    moved = [e for e in events if e["ph"] == "X" and e["cat"] in TRANSFER_CATS]
    args = {"bytes": 1000, "producer": "a", "port": 0, "src": "/device:GPU:0", "dst": "/device:GPU:1"}
    if mode == "parallel":
        data = next(e for e in moved if e["args"]["port"] == 0)
        assert (data["name"], data["cat"], data["pid"], data["ts"], data["dur"]) == (
            "a:0 -> /device:GPU:1",
            "transfer",
            2,
            10.0,
            20.0,
        )
        assert data["args"] == {**args, "transfer_us": 20.0}
        assert {e["name"] for e in moved} == {"a:0 -> /device:GPU:1", "^a -> /device:GPU:1"}
    else:
        names = {(e["name"], e["cat"], e["pid"]) for e in moved}
        assert ("a:0 -> /device:GPU:1", "send", 1) in names
        assert ("a:0 <- /device:GPU:0", "recv", 2) in names
        assert ("^a <- /device:GPU:0", "recv", 2) in names
    # The arrow leaves a on its last nanosecond and enters the transfer at its start.
    starts = sorted(e["ts"] for e in events if e["ph"] == "s" and e["pid"] == 1 and e["tid"] == op_a["tid"])
    assert starts == [9.999, 9.999]
    assert trace["otherData"]["title"] == "test"
    assert trace["otherData"]["comm_mode"] == mode


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_zero_duration_ops_keep_flows_apart(mode):
    # z0, z1 (0 µs) and x (10 µs) are all ready at 0 on GPU0: z0 and z1 run at 0, then x
    # starts at 0 too. Perfetto would nest z0/z1 under x on one track; on their own track
    # each still binds its own arrows.
    b = GraphBuilder()
    z0 = b.add_op("z0", "Const", [100])
    z1 = b.add_op("z1", "Const", [100])
    x = b.add_op("x", "MatMul", [1000], compute_us=10)
    y = b.add_op("y", "Add", [], compute_us=5)
    for u in (z0, z1, x):
        b.add_edge(u, y)
    g = b.build()
    r, trace = run(g, spec(2, mode), [0, 0, 0, 1])
    assert r.start[:3] == [0.0, 0.0, 0.0]
    assert threads_of(trace, 1) == ["compute", "0 µs ops"] + (["channel"] if mode == "sequential" else [])


def test_coincident_zero_duration_ops_spill_over_stacks(monkeypatch):
    monkeypatch.setattr(trace_mod, "MAX_STACK", 3)
    b = GraphBuilder()
    zs = [b.add_op(f"z{i}", "Const", [10]) for i in range(7)]
    sink = b.add_op("sink", "AddN", [], compute_us=1)
    for z in zs:
        b.add_edge(z, sink)
    g = b.build()
    _, trace = run(g, spec(2), [0] * 7 + [1])
    assert threads_of(trace, 1) == ["compute", "0 µs ops", "0 µs ops 2", "0 µs ops 3"]


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_zero_length_transfers(mode):
    # Latency 0: control edges and 0-byte tensors move in no time, at the instant their
    # producer ends; ties everywhere.
    b = GraphBuilder()
    a = b.add_op("a", "A", [0, 100])
    c = b.add_op("c", "C", [0])
    d = b.add_op("d", "D", [], compute_us=3)
    b.add_edge(a, c)
    b.add_edge(a, c, CONTROL_PORT)
    b.add_edge(a, d, 1)
    b.add_edge(c, d)
    b.add_edge(a, d)
    g = b.build()
    r, _ = run(g, spec(3, mode, latency=0.0), [0, 1, 2])
    assert any(t.end == t.recv_start for t in r.transfers)


def test_empty_device_and_empty_graph():
    g = GraphBuilder().build()
    r, trace = run(g, spec(2), [])
    assert threads_of(trace, 2) == ["compute"]
    assert [e for e in trace["traceEvents"] if e["ph"] not in "MC"] == []


# --------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_write_is_compact_and_deterministic(tmp_path, mode):
    g = _fan_in()
    sp = spec(4, mode)
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    write_trace(str(first), build_trace(g, sp, simulate(g, sp, [1, 2, 3, 2, 0])))
    write_trace(str(second), build_trace(g, sp, simulate(g, sp, [1, 2, 3, 2, 0])))
    data = first.read_bytes()
    assert data == second.read_bytes()
    assert data.startswith(b'{"traceEvents":[') and data.endswith(b"}")  # nothing after the object
    assert b'", "' not in data and b'": ' not in data
    assert "µs".encode() in data  # UTF-8, not \u escapes
    r = simulate(g, sp, [1, 2, 3, 2, 0])
    check_trace(g, sp, r, json.loads(data))


def test_write_into_a_missing_directory_is_an_input_error(tmp_path):
    with pytest.raises(InputError):
        write_trace(str(tmp_path / "missing" / "t.json"), {"traceEvents": []})


# --------------------------------------------------------------------------
# properties on random small DAGs
# --------------------------------------------------------------------------


@st.composite
def placed_graphs(draw):
    n = draw(st.integers(1, 9))
    ndev = draw(st.integers(1, 3))
    perm = draw(st.permutations(range(n)))  # edges go forward in perm: ids != topological order
    b = GraphBuilder()
    for v in range(n):
        nports = draw(st.integers(0, 2))
        b.add_op(
            f"op{v}",
            draw(st.sampled_from(["A", "B"])),
            [draw(st.sampled_from([0, 100, 1000])) for _ in range(nports)],
            compute_us=draw(st.sampled_from([0.0, 0.0, 0.0005, 1.25, 10.0, 20.0])),
        )
    g0 = b.build()
    for j in range(n):
        for i in range(j):
            u, v = perm[i], perm[j]
            kind = draw(st.sampled_from(["none", "none", "data", "data", "control"]))
            if kind == "none":
                continue
            measured = draw(st.sampled_from([None, None, None, 0.0, 7.0]))
            nports = len(g0.output_bytes[u])
            port = CONTROL_PORT if kind == "control" or nports == 0 else draw(st.integers(0, nports - 1))
            b.add_edge(u, v, port, transfer_us=measured)
    place = draw(st.lists(st.integers(0, ndev - 1), min_size=n, max_size=n))
    mode = draw(st.sampled_from(["parallel", "sequential"]))
    latency = draw(st.sampled_from([0.0, 10.0, 10.0]))
    return b.build(), spec(ndev, mode, latency), place


def test_back_to_back_sends_share_one_channel_track():
    """Found by the property test below: three sends queued on device 0's channel, each
    starting where the one before ends. Recomputed as send_start + (end - recv_start), the
    second's end came out one bit above the third's start (27.000500000000002 against
    27.0005), rounded a nanosecond later, and opened a second channel track. (Found as
    three copies of one control tensor; here three 0-byte tensors, sent alike.)"""
    b = GraphBuilder()
    ops = [
        b.add_op(
            f"op{i}",
            "A",
            [0] if i == 6 else [0, 0, 0] if i == 1 else [],
            compute_us=0.0005 if i == 6 else 0.0,
        )
        for i in range(7)
    ]
    b.add_edge(ops[6], ops[1], 0, transfer_us=7.0)
    b.add_edge(ops[1], ops[2], 0)
    b.add_edge(ops[1], ops[4], 1)
    b.add_edge(ops[6], ops[3], 0)
    b.add_edge(ops[1], ops[3], 2)
    r, trace = run(b.build(), spec(3, "sequential"), [0, 0, 1, 1, 1, 0, 2])
    sends = [t for t in r.transfers if t.src_device == 0]
    assert len(sends) == 3
    assert all(b.send_start == a.send_end for a, b in zip(sends, sends[1:]))
    assert threads_of(trace, 1).count("channel") == 1 and "channel 2" not in threads_of(trace, 1)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(placed_graphs())
def test_properties_on_random_dags(case):
    g, sp, place = case
    r, trace = run(g, sp, place)
    assert build_trace(g, sp, r, title="test") == trace
    # A device has as many receive lanes as transfers into it overlap at the worst instant
    # (a 0-length transfer counts as overlapping one that starts or sits at its instant).
    if sp.interconnect.mode == "parallel":
        for d in range(sp.count):
            spans = [(2 * ns(t.recv_start), 2 * ns(t.end)) for t in r.transfers if t.dst_device == d]
            spans = [(a, b if b > a else a + 1) for a, b in spans]
            worst = max((sum(a <= s < b for a, b in spans) for s, _ in spans), default=0)
            assert sum(name.startswith("recv ") for name in threads_of(trace, d + 1)) == worst


# --------------------------------------------------------------------------
# scale
# --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_100k_ops_trace_is_complete(mode):
    layered_dag = bench_module("synthetic").layered_dag

    g = layered_dag(100_000, seed=7)
    sp = parse_devices("4x1TB").with_comm_mode(mode)
    r = simulate(g, sp, [v % 4 for v in range(g.num_ops)])  # a transfer on most edges
    trace = build_trace(g, sp, r)  # how long this takes is `make bench`'s business, not a test's
    events = trace["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == g.num_ops + len(r.transfers) * (1 + (mode == "sequential"))
    ids = Counter(e["id"] for e in events if e["ph"] in "sf")
    assert set(ids.values()) == {2}


def test_merged_traces_keep_each_placement_apart():
    g = _fan_in()
    sp = spec(2)
    (_, t1), (_, t2) = (
        run(g, sp, [0, 1] * (g.num_ops // 2) + [0] * (g.num_ops % 2)),
        run(g, sp, [0] * g.num_ops),
    )
    t1["otherData"]["title"], t2["otherData"]["title"] = "etf", "single"
    merged = merge_traces([t1, t2])
    events = merged["traceEvents"]
    assert len(events) == len(t1["traceEvents"]) + len(t2["traceEvents"])
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names.values()) == sorted(
        [f"etf: {d.name}" for d in sp.devices] + [f"single: {d.name}" for d in sp.devices]
    )
    # threads and flow ids stay unique across the merged placements
    tids = {}
    for e in events:
        assert tids.setdefault(e["tid"], e["pid"]) == e["pid"]
    ids = Counter(e["id"] for e in events if e["ph"] in "sf")
    assert set(ids.values()) <= {2}
    json.loads(json.dumps(merged))


def test_cli_writes_traces(tmp_path):
    from click.testing import CliRunner

    from baechi_cli.cli.commands import main

    cnn = os.path.join(os.path.dirname(__file__), "..", "testdata", "cnn.pb")
    out = tmp_path / "place.json"
    r = CliRunner().invoke(main, ["place", cnn, "-d", "2x8GB", "--algo", "etf", "--trace", str(out), "-q"])
    assert r.exit_code == 0, r.output
    trace = json.loads(out.read_text())
    assert trace["otherData"]["title"] == "etf"
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) >= 355
    out = tmp_path / "compare.json"
    r = CliRunner().invoke(
        main, ["compare", cnn, "-d", "2x8GB", "--algos", "topo,etf", "--trace", str(out), "-q"]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["otherData"]["titles"] == ["topo", "etf"]
