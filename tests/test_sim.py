"""Tests for baechi_cli.evaluator.sim: hand-computed timelines and random-DAG properties.

Every spec here uses latency 10 µs and bandwidth 100 bytes/µs, so moving b
bytes between two devices takes exactly ``10 + b / 100`` µs:
1000 B -> 20 µs, 500 B -> 15 µs, 100 B -> 11 µs, 0 B (control) -> 10 µs.
All durations are small integers, so every expected time below is exact.
"""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import dags, op_durations

from baechi_cli.core.devices import Device, DeviceSpec, Interconnect
from baechi_cli.core.graph import CONTROL_PORT, GraphBuilder
from baechi_cli.evaluator.sim import Transfer, lower_bound, simulate

LAT, BW = 10.0, 100.0


def spec(n: int = 2, mode: str = "parallel", memories: list[int] | None = None) -> DeviceSpec:
    mems = memories if memories is not None else [10**9] * n
    devices = tuple(Device(f"/device:GPU:{i}", m) for i, m in enumerate(mems))
    return DeviceSpec(devices, Interconnect(mode, latency_us=LAT, bandwidth_bytes_per_us=BW))


def xfer_time(nbytes: int) -> float:
    return LAT + nbytes / BW


# --------------------------------------------------------------------------
# chains
# --------------------------------------------------------------------------


def _chain():
    b = GraphBuilder()
    a = b.add_op("a", "A", [1000], compute_us=10)
    bb = b.add_op("b", "B", [500], compute_us=20)
    c = b.add_op("c", "C", [], compute_us=30)
    b.add_edge(a, bb)
    b.add_edge(bb, c)
    return b.build()


def test_chain_on_one_device():
    # a: 0-10, b: 10-30, c: 30-60; nothing leaves the device.
    g = _chain()
    r = simulate(g, spec(1), [0, 0, 0])
    assert r.start == [0.0, 10.0, 30.0]
    assert r.end == [10.0, 30.0, 60.0]
    assert r.order == [[0, 1, 2]]
    assert r.transfers == []
    assert r.comm_bytes == 0
    assert r.step_time_us == 60.0
    assert r.compute_us == [60.0]


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_chain_split_over_two_devices(mode):
    # a on GPU0: 0-10; a's 1000 B to GPU1: 10 -> 10 + 20 = 30.
    # b on GPU1: 30-50; b's 500 B to GPU0: 50 -> 50 + 15 = 65.
    # c on GPU0: 65-95. No two transfers ever compete, so both modes agree.
    g = _chain()
    r = simulate(g, spec(2, mode), [0, 1, 0])
    assert r.start == [0.0, 30.0, 65.0]
    assert r.end == [10.0, 50.0, 95.0]
    assert r.transfers == [
        Transfer(0, 0, 0, 1, 1000, 10.0, 10.0, 30.0),
        Transfer(1, 0, 1, 0, 500, 50.0, 50.0, 65.0),
    ]
    assert r.comm_bytes == 1500
    assert r.step_time_us == 95.0
    assert r.compute_us == [40.0, 20.0]
    assert r.order == [[0, 2], [1]]


# --------------------------------------------------------------------------
# diamond, earliest-ready selection, topological tie-break
# --------------------------------------------------------------------------


def test_diamond_across_two_devices():
    # a (GPU0, 10 µs, 1000 B) -> b (GPU0, 30 µs, 200 B), c (GPU1, 20 µs, 500 B) -> d (GPU0, 5 µs)
    # a: 0-10. b: 10-40 (input local at 10). a -> GPU1: 10 -> 30. c: 30-50.
    # c -> GPU0 (500 B, 15 µs): 50 -> 65. d ready at max(40, 65) = 65: 65-70.
    b = GraphBuilder()
    a = b.add_op("a", "A", [1000], compute_us=10)
    bb = b.add_op("b", "B", [200], compute_us=30)
    c = b.add_op("c", "C", [500], compute_us=20)
    d = b.add_op("d", "D", [], compute_us=5)
    for u, v in ((a, bb), (a, c), (bb, d), (c, d)):
        b.add_edge(u, v)
    g = b.build()
    r = simulate(g, spec(2), [0, 0, 1, 0])
    assert r.start == [0.0, 10.0, 30.0, 65.0]
    assert r.end == [10.0, 40.0, 50.0, 70.0]
    assert r.transfers == [
        Transfer(a, 0, 0, 1, 1000, 10.0, 10.0, 30.0),
        Transfer(c, 0, 1, 0, 500, 50.0, 50.0, 65.0),
    ]
    assert r.step_time_us == 70.0
    # Critical path a-b-d = 45 > total 65 / 2 = 32.5; but running c beside b costs
    # a + copy + c + d = 10 + 20 + 20 + 5 = 55 (the transfer-cut bound), all on one device 65.
    assert lower_bound(g, spec(2)) == 55.0 <= simulate(g, spec(2), [0, 0, 0, 0]).step_time_us == 65.0


def test_earliest_ready_beats_lower_topological_index():
    # GPU0 is busy with L (0-100) while two of its ops become ready:
    #   s1 (GPU1): 0-10, 100 B -> GPU0: 10 -> 21, so y is ready at 21;
    #   s2 (GPU1): 10-40, 100 B -> GPU0: 40 -> 51, so x is ready at 51.
    # Topological indices: L 0, s1 1, s2 2, x 3, y 4 (x < y), yet at 100 the
    # earliest-ready y runs first: y 100-105, x 105-110.
    b = GraphBuilder()
    big = b.add_op("L", "L", [], compute_us=100)
    s1 = b.add_op("s1", "S", [100], compute_us=10)
    s2 = b.add_op("s2", "S", [100], compute_us=30)
    x = b.add_op("x", "X", [], compute_us=5)
    y = b.add_op("y", "Y", [], compute_us=5)
    b.add_edge(s1, y)
    b.add_edge(s1, s2)
    b.add_edge(s2, x)
    g = b.build()
    assert g.topo_order() == [0, 1, 2, 3, 4]
    r = simulate(g, spec(2), [0, 1, 1, 0, 0])
    assert r.end[big] == 100.0
    assert r.transfers == [
        Transfer(s1, 0, 1, 0, 100, 10.0, 10.0, 21.0),
        Transfer(s2, 0, 1, 0, 100, 40.0, 40.0, 51.0),
    ]
    assert (r.start[y], r.end[y]) == (100.0, 105.0)
    assert (r.start[x], r.end[x]) == (105.0, 110.0)
    assert r.order[0] == [big, y, x]
    assert r.step_time_us == 110.0


def test_simultaneous_ready_tie_goes_to_lower_topological_index_not_id():
    # ids: a 0 (GPU0), y 1 (GPU1, needs a and m), x 2 (GPU1, needs a), m 3 (GPU1).
    # Kahn's order (lowest id first): a, x, m, y -> ranks a 0, x 1, m 2, y 3.
    # m: 0-5 on GPU1. a: 0-10; one cached transfer a -> GPU1: 10 -> 30.
    # At 30 both x and y become ready; x has the lower topological index
    # (though the higher id): x 30-37, y 37-42.
    b = GraphBuilder()
    a = b.add_op("a", "A", [1000], compute_us=10)
    y = b.add_op("y", "Y", [], compute_us=5)
    x = b.add_op("x", "X", [], compute_us=7)
    m = b.add_op("m", "M", [100], compute_us=5)
    b.add_edge(a, y)
    b.add_edge(a, x)
    b.add_edge(m, y)
    g = b.build()
    assert g.topo_order() == [a, x, m, y]
    r = simulate(g, spec(2), [0, 1, 1, 1])
    assert (r.start[m], r.end[m]) == (0.0, 5.0)
    assert r.transfers == [Transfer(a, 0, 0, 1, 1000, 10.0, 10.0, 30.0)]
    assert (r.start[x], r.end[x]) == (30.0, 37.0)
    assert (r.start[y], r.end[y]) == (37.0, 42.0)
    assert r.order[1] == [m, x, y]
    assert r.step_time_us == 42.0


# --------------------------------------------------------------------------
# fork-join: caching of received tensors
# --------------------------------------------------------------------------


def _fork_join():
    # a (GPU0, 10 µs, 1000 B) -> c1, c2, c3 (GPU1, 5 µs, 100 B each) -> j (GPU1, 5 µs)
    b = GraphBuilder()
    a = b.add_op("a", "A", [1000], compute_us=10)
    cs = [b.add_op(f"c{i}", "C", [100], compute_us=5) for i in (1, 2, 3)]
    j = b.add_op("j", "J", [], compute_us=5)
    for c in cs:
        b.add_edge(a, c)
        b.add_edge(c, j)
    return b.build(), [0, 1, 1, 1, 1]


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_fork_join_cached_transfer(mode):
    # One transfer a -> GPU1: 10 -> 30 (no contention, so both modes agree).
    # c1 30-35, c2 35-40, c3 40-45, j 45-50.
    # GPU1 memory: copy of a [10, 45) (last consumer c3 ends 45);
    # c1 out [30, 50), c2 out [35, 50), c3 out [40, 50) (j ends 50).
    #   10: 1000; 30: 1100; 35: 1200; 40: 1300; 45: 300; 50: 0.
    # GPU0: a's output [0, 30) (its one send ends at 30).
    g, place = _fork_join()
    r = simulate(g, spec(2, mode), place)
    assert r.transfers == [Transfer(0, 0, 0, 1, 1000, 10.0, 10.0, 30.0)]
    assert r.comm_bytes == 1000
    assert r.start == [0.0, 30.0, 35.0, 40.0, 45.0]
    assert r.end == [10.0, 35.0, 40.0, 45.0, 50.0]
    assert r.step_time_us == 50.0
    assert r.memory_curve[1] == [
        (0.0, 0),
        (10.0, 1000),
        (30.0, 1100),
        (35.0, 1200),
        (40.0, 1300),
        (45.0, 300),
        (50.0, 0),
    ]
    assert r.peak_bytes == [1000, 1300]
    assert r.memory_curve[0] == [(0.0, 1000), (30.0, 0)]


# --------------------------------------------------------------------------
# sequential-channel contention
# --------------------------------------------------------------------------


def _two_tensors_out():
    # a (GPU0, 10 µs) has port 0 (1000 B) -> x (GPU1) and e (GPU0, 30 µs),
    # port 1 (500 B) -> y (GPU2). x, y: 5 µs.
    b = GraphBuilder()
    a = b.add_op("a", "A", [1000, 500], compute_us=10)
    x = b.add_op("x", "X", [], compute_us=5)
    y = b.add_op("y", "Y", [], compute_us=5)
    e = b.add_op("e", "E", [], compute_us=30)
    b.add_edge(a, x, 0)
    b.add_edge(a, y, 1)
    b.add_edge(a, e, 0)
    return b.build(), [0, 1, 2, 0]


def test_sequential_sends_queue_on_sender_channel():
    # Both tensors leave GPU0 at 10; issue order is port 0 then port 1.
    #   port 0 -> GPU1: send [10, 30), recv [10, 30): present at 30.
    #   port 1 -> GPU2: send waits for GPU0's channel: [30, 45), recv [30, 45).
    # x 30-35, y 45-50. e runs 10-40 on GPU0 while GPU0 sends (overlap).
    # GPU0 memory: port 0 until max(e end 40, send end 30) = 40; port 1 until
    # its send ends at 45: 0: 1500; 40: 500; 45: 0.
    g, place = _two_tensors_out()
    r = simulate(g, spec(3, "sequential"), place)
    assert r.transfers == [
        Transfer(0, 0, 0, 1, 1000, 10.0, 10.0, 30.0),
        Transfer(0, 1, 0, 2, 500, 30.0, 30.0, 45.0),
    ]
    assert r.start == [0.0, 30.0, 45.0, 10.0]
    assert r.end == [10.0, 35.0, 50.0, 40.0]
    assert r.step_time_us == 50.0
    assert r.memory_curve[0] == [(0.0, 1500), (40.0, 500), (45.0, 0)]
    assert r.memory_curve[1] == [(0.0, 0), (10.0, 1000), (35.0, 0)]
    assert r.memory_curve[2] == [(0.0, 0), (30.0, 500), (50.0, 0)]


def test_parallel_sends_do_not_queue():
    # Same graph, parallel: port 0: 10 -> 30, port 1: 10 -> 25.
    # x 30-35, y 25-30, e 10-40: step 40 (sequential needed 50).
    g, place = _two_tensors_out()
    r = simulate(g, spec(3, "parallel"), place)
    assert r.transfers == [
        Transfer(0, 0, 0, 1, 1000, 10.0, 10.0, 30.0),
        Transfer(0, 1, 0, 2, 500, 10.0, 10.0, 25.0),
    ]
    assert r.start == [0.0, 30.0, 25.0, 10.0]
    assert r.end == [10.0, 35.0, 30.0, 40.0]
    assert r.step_time_us == 40.0
    assert r.memory_curve[0] == [(0.0, 1500), (25.0, 1000), (40.0, 0)]


def _two_senders_one_receiver():
    # a (GPU0, 10 µs, 1000 B) and b (GPU1, 10 µs, 1000 B) -> c (GPU2, 5 µs)
    b = GraphBuilder()
    a = b.add_op("a", "A", [1000], compute_us=10)
    bb = b.add_op("b", "B", [1000], compute_us=10)
    c = b.add_op("c", "C", [], compute_us=5)
    b.add_edge(a, c)
    b.add_edge(bb, c)
    return b.build(), [0, 1, 2]


def test_sequential_receives_queue_on_receiver_channel():
    # a and b end at 10; a (lower topological index) is issued first.
    #   a -> GPU2: send [10, 30) on GPU0, recv [10, 30) on GPU2: present at 30.
    #   b -> GPU2: send [10, 30) on GPU1 (free), recv waits for GPU2's channel:
    #   [30, 50): present at 50.
    # c 50-55.
    # Memory: b's output on GPU1 is freed when its *send* ends (30), not when
    # the receive ends; GPU2 holds a's copy from 10 and b's copy from its
    # receive start 30, both until c ends at 55.
    g, place = _two_senders_one_receiver()
    r = simulate(g, spec(3, "sequential"), place)
    assert r.transfers == [
        Transfer(0, 0, 0, 2, 1000, 10.0, 10.0, 30.0),
        Transfer(1, 0, 1, 2, 1000, 10.0, 30.0, 50.0),
    ]
    assert r.start[2] == 50.0
    assert r.step_time_us == 55.0
    assert r.memory_curve[0] == [(0.0, 1000), (30.0, 0)]
    assert r.memory_curve[1] == [(0.0, 1000), (30.0, 0)]
    assert r.memory_curve[2] == [(0.0, 0), (10.0, 1000), (30.0, 2000), (55.0, 0)]
    assert r.peak_bytes == [1000, 1000, 2000]


def test_parallel_receives_do_not_queue():
    # Both transfers 10 -> 30; c 30-35. GPU2 holds both copies over [10, 35).
    g, place = _two_senders_one_receiver()
    r = simulate(g, spec(3, "parallel"), place)
    assert r.transfers == [
        Transfer(0, 0, 0, 2, 1000, 10.0, 10.0, 30.0),
        Transfer(1, 0, 1, 2, 1000, 10.0, 10.0, 30.0),
    ]
    assert (r.start[2], r.end[2]) == (30.0, 35.0)
    assert r.step_time_us == 35.0
    assert r.memory_curve[2] == [(0.0, 0), (10.0, 2000), (35.0, 0)]


def test_sequential_channel_busy_with_receive_delays_a_send():
    # One channel per device serves sends *and* receives.
    # a (GPU0, 10 µs, 1000 B) -> r (GPU1, 5 µs); s (GPU1, 10 µs, 500 B) -> t (GPU0, 5 µs).
    # Issue order at 10: a (rank 0) then s.
    #   a -> GPU1: send [10, 30) on GPU0, recv [10, 30) on GPU1.
    #   s -> GPU0: GPU1's channel is receiving until 30: send [30, 45);
    #   GPU0's channel free at 30: recv [30, 45): present at 45.
    # r 30-35, t 45-50. Parallel: s's tensor arrives at 25, t 25-30, step 35.
    b = GraphBuilder()
    a = b.add_op("a", "A", [1000], compute_us=10)
    r_ = b.add_op("r", "R", [], compute_us=5)
    s = b.add_op("s", "S", [500], compute_us=10)
    t = b.add_op("t", "T", [], compute_us=5)
    b.add_edge(a, r_)
    b.add_edge(s, t)
    g = b.build()
    place = [0, 1, 1, 0]
    r = simulate(g, spec(2, "sequential"), place)
    assert r.transfers == [
        Transfer(a, 0, 0, 1, 1000, 10.0, 10.0, 30.0),
        Transfer(s, 0, 1, 0, 500, 30.0, 30.0, 45.0),
    ]
    assert r.start == [0.0, 30.0, 0.0, 45.0]
    assert r.step_time_us == 50.0
    p = simulate(g, spec(2, "parallel"), place)
    assert p.transfers[1] == Transfer(s, 0, 1, 0, 500, 10.0, 10.0, 25.0)
    assert p.start == [0.0, 30.0, 0.0, 25.0]
    assert p.step_time_us == 35.0


# --------------------------------------------------------------------------
# control edges and measured transfer times
# --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_control_edge_across_devices_costs_latency_and_no_bytes(mode):
    # a (GPU0, 10 µs, 1000 B, consumed by nobody) --ctrl--> b (GPU1, 5 µs)
    #                                              --ctrl--> c (GPU0, 5 µs)
    # Control to GPU1: latency only, 10 -> 20; b 20-25. Control on GPU0: free, c 10-15.
    # No memory moves: GPU1 never holds anything; a's output lives [0, 10).
    b = GraphBuilder()
    a = b.add_op("a", "A", [1000], compute_us=10)
    bb = b.add_op("b", "B", [], compute_us=5)
    c = b.add_op("c", "C", [], compute_us=5)
    b.add_edge(a, bb, CONTROL_PORT)
    b.add_edge(a, c, CONTROL_PORT)
    g = b.build()
    assert g.edge_bytes == [0, 0]
    r = simulate(g, spec(2, mode), [0, 1, 0])
    assert r.transfers == [Transfer(a, CONTROL_PORT, 0, 1, 0, 10.0, 10.0, 20.0)]
    assert r.comm_bytes == 0
    assert r.start == [0.0, 20.0, 10.0]
    assert r.end == [10.0, 25.0, 15.0]
    assert r.step_time_us == 25.0
    assert r.memory_curve[1] == [(0.0, 0)]
    assert r.memory_curve[0] == [(0.0, 1000), (10.0, 0)]
    assert r.peak_bytes == [1000, 0]


def test_measured_transfer_time_overrides_comm_model():
    # a (GPU0, 10 µs) port 0 (1000 B, measured 7 µs) -> b (GPU1, 5 µs);
    #                 port 1 (500 B, model 15 µs)     -> c (GPU1, 5 µs).
    # Parallel: port 0: 10 -> 17 (not 30); port 1: 10 -> 25. b 17-22, c 25-30.
    # Sequential: port 0 occupies both channels for the measured 7 µs
    # [10, 17); port 1 follows [17, 32). b 17-22, c 32-37.
    b = GraphBuilder()
    a = b.add_op("a", "A", [1000, 500], compute_us=10)
    bb = b.add_op("b", "B", [], compute_us=5)
    c = b.add_op("c", "C", [], compute_us=5)
    b.add_edge(a, bb, 0, transfer_us=7.0)
    b.add_edge(a, c, 1)
    g = b.build()
    r = simulate(g, spec(2, "parallel"), [0, 1, 1])
    assert r.transfers == [
        Transfer(a, 0, 0, 1, 1000, 10.0, 10.0, 17.0),
        Transfer(a, 1, 0, 1, 500, 10.0, 10.0, 25.0),
    ]
    assert r.comm_bytes == 1500  # the bytes still count
    assert r.start == [0.0, 17.0, 25.0]
    assert r.step_time_us == 30.0
    s = simulate(g, spec(2, "sequential"), [0, 1, 1])
    assert s.transfers == [
        Transfer(a, 0, 0, 1, 1000, 10.0, 10.0, 17.0),
        Transfer(a, 1, 0, 1, 500, 17.0, 17.0, 32.0),
    ]
    assert s.start == [0.0, 17.0, 32.0]
    assert s.step_time_us == 37.0


# --------------------------------------------------------------------------
# memory
# --------------------------------------------------------------------------


def _memory_graph():
    # GPU0: a (10 µs, out 1000, persistent 50, temp 200)
    #       b (5 µs, out 400, temp 300) <- a;   d (5 µs, out 100) <- b
    # GPU1: c (10 µs, out [0], persistent 70) <- a;  c2 (10 µs, temp 30) <- a
    b = GraphBuilder()
    a = b.add_op("a", "A", [1000], compute_us=10, persistent_bytes=50, temporary_bytes=200)
    bb = b.add_op("b", "B", [400], compute_us=5, temporary_bytes=300)
    d = b.add_op("d", "D", [100], compute_us=5)
    c = b.add_op("c", "C", [0], compute_us=10, persistent_bytes=70)
    c2 = b.add_op("c2", "C", [], compute_us=10, temporary_bytes=30)
    b.add_edge(a, bb)
    b.add_edge(bb, d)
    b.add_edge(a, c)
    b.add_edge(a, c2)
    return b.build(), [0, 0, 0, 1, 1]


def test_memory_timeline_and_peak():
    # Timeline: a 0-10; b 10-15; d 15-20; a -> GPU1 (one cached copy) 10 -> 30;
    # c 30-40; c2 40-50.
    # GPU0 (persistent 50 from time 0):
    #   a out 1000  [0, 30)   local consumer b ends 15, but the send ends 30
    #   a temp 200  [0, 10)
    #   b out 400   [10, 20)  last local consumer d ends 20
    #   b temp 300  [10, 15)
    #   d out 100   [15, 20)  nobody uses it: freed at its own end
    #   0: 50+1000+200 = 1250; 10: -200 +300 +400 = 1750; 15: -300 +100 = 1550;
    #   20: -400 -100 = 1050; 30: -1000 = 50.   Peak 1750.
    #   (Half-open: a's temp ends exactly when b's starts; closed intervals
    #   would have given 1950.)
    # GPU1 (persistent 70): copy of a [10, 50) (recv start .. last consumer c2 end);
    #   c2 temp 30 [40, 50).  0: 70; 10: 1070; 40: 1100; 50: 70.   Peak 1100.
    g, place = _memory_graph()
    r = simulate(g, spec(2), place)
    assert r.start == [0.0, 10.0, 15.0, 30.0, 40.0]
    assert r.end == [10.0, 15.0, 20.0, 40.0, 50.0]
    assert r.transfers == [Transfer(0, 0, 0, 1, 1000, 10.0, 10.0, 30.0)]
    assert r.persistent_bytes == [50, 70]
    assert r.memory_curve[0] == [(0.0, 1250), (10.0, 1750), (15.0, 1550), (20.0, 1050), (30.0, 50)]
    assert r.memory_curve[1] == [(0.0, 70), (10.0, 1070), (40.0, 1100), (50.0, 70)]
    assert r.peak_bytes == [1750, 1100]
    assert r.feasible
    assert r.over_memory() == []
    assert r.memory_limits == [10**9, 10**9]


def test_a_held_tensor_lives_until_the_step_ends():
    # x (fed, 1000 B) -> a (0-10, out 100) -> b (10-20, out 10): x is read by a only, yet
    # the caller holds it until b ends. b's output is held too (returned), a's is not.
    b = GraphBuilder()
    x = b.add_op("x", "Input", [1000])
    a = b.add_op("a", "A", [100], compute_us=10)
    out = b.add_op("b", "B", [10], compute_us=10)
    b.add_edge(x, a)
    b.add_edge(a, out)
    free = simulate(b.build(), spec(1), [0, 0, 0])
    b.hold(x, 0)
    b.hold(out, 0)
    held = simulate(b.build(), spec(1), [0, 0, 0])
    assert free.memory_curve[0] == [(0.0, 1100), (10.0, 110), (20.0, 0)]
    assert held.memory_curve[0] == [(0.0, 1100), (10.0, 1110), (20.0, 0)]
    assert held.start == free.start and held.end == free.end


def test_a_scope_hold_keeps_a_tensor_until_its_op_ends():
    # a (0-10, out 100) -> b (10-20, out 10) -> c (20-30, out 1): a's output, read by b only,
    # is an argument of a call whose last op is c: it lives until c ends, not b.
    b = GraphBuilder()
    a = b.add_op("a", "A", [100], compute_us=10)
    mid = b.add_op("b", "B", [10], compute_us=10)
    c = b.add_op("c", "C", [1], compute_us=10)
    b.add_edge(a, mid)
    b.add_edge(mid, c)
    free = simulate(b.build(), spec(1), [0, 0, 0])
    b.hold_until(a, 0, c)
    held = simulate(b.build(), spec(1), [0, 0, 0])
    assert free.memory_curve[0] == [(0.0, 100), (10.0, 110), (20.0, 11), (30.0, 0)]
    assert held.memory_curve[0] == [(0.0, 100), (10.0, 110), (20.0, 111), (30.0, 0)]
    assert held.start == free.start and held.end == free.end


def test_a_held_output_nothing_reads_and_a_held_view_keep_their_storage():
    # a (0-10, out 100) -> v (10-20, a view of a's output, held) ; c (20-30, out 5) after v.
    # v's storage is a's output: held, it lives until c ends although nothing reads v.
    # d (30-40, out 7, held, unread) counts from its start to the end.
    b = GraphBuilder()
    a = b.add_op("a", "A", [100], compute_us=10)
    v = b.add_op("v", "Reshape", [100], compute_us=10)
    c = b.add_op("c", "C", [5], compute_us=10)
    d = b.add_op("d", "D", [7], compute_us=10)
    b.add_edge(a, v)
    b.add_edge(v, c, CONTROL_PORT)
    b.add_edge(c, d, CONTROL_PORT)
    b.set_view(v, a, 0)
    b.hold(v, 0)
    b.hold(d, 0)
    r = simulate(b.build(), spec(1), [0, 0, 0, 0])
    assert r.memory_curve[0] == [(0.0, 100), (20.0, 105), (30.0, 107), (40.0, 0)]


def test_memory_feasibility_limits_are_inclusive():
    g, place = _memory_graph()
    exact = simulate(g, spec(2, memories=[1750, 1100]), place)
    assert exact.feasible and exact.over_memory() == []
    tight0 = simulate(g, spec(2, memories=[1749, 1100]), place)
    assert not tight0.feasible and tight0.over_memory() == [0]
    tight_both = simulate(g, spec(2, memories=[1749, 1099]), place)
    assert tight_both.over_memory() == [0, 1]
    # Memory never changes the timeline.
    assert tight_both.start == exact.start and tight_both.end == exact.end


def test_persistent_bytes_count_from_time_zero():
    # p (GPU0, persistent 500) waits for q (GPU1, 10 µs, control): p runs 20-25,
    # yet its weights occupy GPU0 for the whole step.
    b = GraphBuilder()
    q = b.add_op("q", "Q", [], compute_us=10)
    p = b.add_op("p", "P", [], compute_us=5, persistent_bytes=500)
    b.add_edge(q, p, CONTROL_PORT)
    r = simulate(b.build(), spec(2), [1, 0])
    assert r.start[p] == 20.0
    assert r.memory_curve[0] == [(0.0, 500)]
    assert r.peak_bytes == [500, 0]
    assert r.persistent_bytes == [500, 0]


# --------------------------------------------------------------------------
# explicit order
# --------------------------------------------------------------------------


def _order_graph():
    # r (GPU1, 10 µs, 100 B) -> q (GPU0, 5 µs); p (GPU0, 10 µs) independent.
    b = GraphBuilder()
    r_ = b.add_op("r", "R", [100], compute_us=10)
    b.add_op("p", "P", [], compute_us=10)
    q = b.add_op("q", "Q", [], compute_us=5)
    b.add_edge(r_, q)
    return b.build(), [1, 0, 0]


def test_explicit_order_is_followed_even_if_not_earliest_ready():
    # r -> GPU0 (100 B, 11 µs): 10 -> 21.
    # Default: p (ready at 0) 0-10, q 21-26.
    # order [[q, p], [r]]: GPU0 idles until q is ready: q 21-26, p 26-36.
    g, place = _order_graph()
    d = simulate(g, spec(2), place)
    assert d.start == [0.0, 0.0, 21.0]
    assert d.order == [[1, 2], [0]]
    assert d.step_time_us == 26.0
    r = simulate(g, spec(2), place, order=[[2, 1], [0]])
    assert r.start == [0.0, 26.0, 21.0]
    assert r.end == [10.0, 36.0, 26.0]
    assert r.order == [[2, 1], [0]]
    assert r.step_time_us == 36.0


def test_explicit_order_on_one_device_tie():
    # Two independent ops on one device: default runs them by topological
    # index; an explicit order reverses them.
    b = GraphBuilder()
    b.add_op("x", "X", [], compute_us=10)
    b.add_op("y", "Y", [], compute_us=20)
    g = b.build()
    assert simulate(g, spec(1), [0, 0]).start == [0.0, 10.0]
    r = simulate(g, spec(1), [0, 0], order=[[1, 0]])
    assert r.start == [20.0, 0.0]
    assert r.end == [30.0, 20.0]


def test_order_contradicting_dependencies_raises():
    # Same device: b needs a, but the order puts b first.
    b = GraphBuilder()
    a = b.add_op("a", "A", [100], compute_us=10)
    bb = b.add_op("b", "B", [], compute_us=10)
    b.add_edge(a, bb)
    g = b.build()
    with pytest.raises(ValueError):
        simulate(g, spec(1), [0, 0], order=[[bb, a]])


def test_order_deadlocking_across_devices_raises():
    # a (GPU0) -> b (GPU1); c (GPU1) -> d (GPU0).
    # GPU0 order [d, a] waits for c; GPU1 order [b, c] waits for a: deadlock.
    b = GraphBuilder()
    a = b.add_op("a", "A", [100], compute_us=1)
    bb = b.add_op("b", "B", [], compute_us=1)
    c = b.add_op("c", "C", [100], compute_us=1)
    d = b.add_op("d", "D", [], compute_us=1)
    b.add_edge(a, bb)
    b.add_edge(c, d)
    g = b.build()
    place = [0, 1, 1, 0]
    with pytest.raises(ValueError):
        simulate(g, spec(2), place, order=[[d, a], [bb, c]])
    ok = simulate(g, spec(2), place, order=[[a, d], [c, bb]])
    assert ok.order == [[a, d], [c, bb]]


@pytest.mark.parametrize(
    "order",
    [
        [[1, 2], []],  # r (on GPU1) missing
        [[1, 2, 0], []],  # r listed on the wrong device
        [[1, 2, 2], [0]],  # q twice
        [[1, 2], [0], []],  # one list too many
    ],
)
def test_malformed_order_raises(order):
    g, place = _order_graph()
    with pytest.raises(ValueError):
        simulate(g, spec(2), place, order=order)


def test_placement_errors():
    g, _ = _order_graph()
    with pytest.raises(ValueError):
        simulate(g, spec(2), [0, 0])
    with pytest.raises(ValueError):
        simulate(g, spec(2), [0, 0, 2])


# --------------------------------------------------------------------------
# lower bound
# --------------------------------------------------------------------------


def test_lower_bound_critical_path_dominates():
    # Chain 10 + 20 + 30 = 60 > total 60 / 2 = 30.
    g = _chain()
    assert lower_bound(g, spec(2)) == 60.0
    assert simulate(g, spec(2), [0, 0, 0]).step_time_us == 60.0


def test_lower_bound_average_load_dominates():
    # Four independent 10 µs ops + a 15 µs one on 2 devices:
    # critical path 15 < total 55 / 2 = 27.5.
    b = GraphBuilder()
    for i in range(4):
        b.add_op(f"o{i}", "O", [], compute_us=10)
    b.add_op("long", "O", [], compute_us=15)
    g = b.build()
    assert lower_bound(g, spec(2)) == 27.5
    assert lower_bound(g, spec(1)) == 55.0
    assert lower_bound(g, spec(4)) == 15.0
    # [o0, o1, long] on GPU0 = 35, [o2, o3] on GPU1 = 20.
    r = simulate(g, spec(2), [0, 0, 1, 1, 0])
    assert r.step_time_us == 35.0 >= lower_bound(g, spec(2))


def test_lower_bound_empty_graph():
    g = GraphBuilder().build()
    assert lower_bound(g, spec(2)) == 0.0
    r = simulate(g, spec(2), [])
    assert r.step_time_us == 0.0
    assert r.peak_bytes == [0, 0]


# --------------------------------------------------------------------------
# step time and zero-duration ops
# --------------------------------------------------------------------------


def test_step_time_ends_with_a_trailing_transfer():
    # a (GPU0, 10 µs, 1000 B) -> z (GPU1, 0 µs); f (GPU0, 15 µs) after a.
    # a 0-10, f 10-25; transfer 10 -> 30; z 30-30. The last thing to finish is
    # the transfer (z adds nothing): step time 30, not f's 25.
    b = GraphBuilder()
    a = b.add_op("a", "A", [1000], compute_us=10)
    z = b.add_op("z", "Z", [], compute_us=0)
    f = b.add_op("f", "F", [], compute_us=15)
    b.add_edge(a, z)
    b.add_edge(a, f, CONTROL_PORT)
    g = b.build()
    r = simulate(g, spec(2), [0, 1, 0])
    assert r.transfers == [Transfer(a, 0, 0, 1, 1000, 10.0, 10.0, 30.0)]
    assert (r.start[f], r.end[f]) == (10.0, 25.0)
    assert (r.start[z], r.end[z]) == (30.0, 30.0)
    assert r.step_time_us == 30.0
    assert r.compute_us == [25.0, 0.0]


def test_zero_duration_chain_runs_at_one_instant():
    # z0 (0 µs, 100 B) -> z1 (0 µs, 100 B) -> a (10 µs) -> z2 (0 µs), one device.
    # z0 0-0, z1 0-0, a 0-10, z2 10-10.
    b = GraphBuilder()
    z0 = b.add_op("z0", "Z", [100], compute_us=0)
    z1 = b.add_op("z1", "Z", [100], compute_us=0, temporary_bytes=5000)
    a = b.add_op("a", "A", [100], compute_us=10)
    z2 = b.add_op("z2", "Z", [], compute_us=0)
    b.add_edge(z0, z1)
    b.add_edge(z1, a)
    b.add_edge(a, z2)
    g = b.build()
    r = simulate(g, spec(1), [0, 0, 0, 0])
    assert r.start == [0.0, 0.0, 0.0, 10.0]
    assert r.end == [0.0, 0.0, 10.0, 10.0]
    assert r.order == [[z0, z1, a, z2]]
    assert r.step_time_us == 10.0
    # Half-open intervals: z0's output [0, 0) and z1's temp [0, 0) are empty;
    # z1's output [0, 10) (a ends 10) and a's [0, 10) overlap: peak 200.
    assert r.memory_curve[0] == [(0.0, 200), (10.0, 0)]
    assert r.peak_bytes == [200]


def test_zero_duration_ops_tie_in_topological_order():
    # Three 0 µs ops on one device, all at t = 0: x (id 0) needs w (id 2), y (id 1)
    # has no input. Kahn: ready {1, 2} -> y, w, then x: ranks y 0, w 1, x 2.
    # y and w are ready at 0 together: y (lower index) first, then w, then x.
    b = GraphBuilder()
    x = b.add_op("x", "X", [], compute_us=0)
    y = b.add_op("y", "Y", [], compute_us=0)
    w = b.add_op("w", "W", [100], compute_us=0)
    b.add_edge(w, x)
    g = b.build()
    assert g.topo_order() == [y, w, x]
    r = simulate(g, spec(1), [0, 0, 0])
    assert r.order == [[y, w, x]]
    assert r.start == r.end == [0.0, 0.0, 0.0]
    assert r.step_time_us == 0.0


def test_zero_duration_producer_across_devices():
    # z (GPU0, 0 µs, 1000 B) -> b (GPU1, 5 µs): transfer 0 -> 20, b 20-25.
    b = GraphBuilder()
    z = b.add_op("z", "Z", [1000], compute_us=0)
    bb = b.add_op("b", "B", [], compute_us=5)
    b.add_edge(z, bb)
    r = simulate(b.build(), spec(2, "sequential"), [0, 1])
    assert r.transfers == [Transfer(z, 0, 0, 1, 1000, 0.0, 0.0, 20.0)]
    assert (r.start[bb], r.end[bb]) == (20.0, 25.0)
    # z's output lives until its send ends: [0, 20).
    assert r.memory_curve[0] == [(0.0, 1000), (20.0, 0)]


def test_issue_order_tie_with_zero_duration_producer():
    # CONTRACT CHECK (module docstring of sim.py): "Transfers are issued in the
    # order producers end (ties: topological index of the producer, ...)".
    # ids/ranks: P 0 (GPU1, 10 µs) -> Z 1 (GPU1, 0 µs, 1000 B) -> W0 3 (GPU0, 5 µs)
    #            X 2 (GPU0, 10 µs, 1000 B) -> W1 4 (GPU1, 5 µs)
    # Z and X both end at 10; Z has the lower topological index, so Z's
    # transfer is issued first:
    #   Z -> GPU0: send [10, 30) on GPU1, recv [10, 30) on GPU0: W0 30-35.
    #   X -> GPU1: send [30, 50) on GPU0, recv [30, 50) on GPU1: W1 50-55.
    # sim.py issues X first (Z's finish is processed after the dispatch round
    # at t = 10), giving W1 30-35 and W0 50-55.
    b = GraphBuilder()
    p = b.add_op("P", "P", [100], compute_us=10)
    z = b.add_op("Z", "Z", [1000], compute_us=0)
    x = b.add_op("X", "X", [1000], compute_us=10)
    w0 = b.add_op("W0", "W", [], compute_us=5)
    w1 = b.add_op("W1", "W", [], compute_us=5)
    b.add_edge(p, z)
    b.add_edge(z, w0)
    b.add_edge(x, w1)
    g = b.build()
    assert g.topo_order() == [p, z, x, w0, w1]
    r = simulate(g, spec(2, "sequential"), [1, 1, 0, 0, 1])
    assert r.end[z] == r.end[x] == 10.0
    assert r.transfers == [
        Transfer(z, 0, 1, 0, 1000, 10.0, 10.0, 30.0),
        Transfer(x, 0, 0, 1, 1000, 30.0, 30.0, 50.0),
    ]
    assert r.start[w0] == 30.0
    assert r.start[w1] == 50.0


# --------------------------------------------------------------------------
# properties on random small DAGs
# --------------------------------------------------------------------------


@st.composite
def placed_graphs(draw):
    # Op ids differ from topological indices (relabel); ops with no output port, 0 µs ops,
    # control edges and measured transfer times all appear. Shared strategy: tests/strategies.py.
    g = draw(
        dags(
            1,
            8,
            min_ports=0,
            max_ports=2,
            max_inputs=7,
            compute_us=(0.0, 5.0, 10.0, 20.0),
            output_bytes=(0, 100, 500, 1000),
            persistent_bytes=(0, 50),
            temporary_bytes=(0, 30),
            control_p=1 / 3,
            measured_us=(7.0, 25.0),
            group_p=0.0,
            relabel=True,
        )
    )
    ndev = draw(st.integers(1, 3))
    place = draw(st.lists(st.integers(0, ndev - 1), min_size=g.num_ops, max_size=g.num_ops))
    mode = draw(st.sampled_from(["parallel", "sequential"]))
    return g, spec(ndev, mode), place


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(placed_graphs())
def test_properties_on_random_dags(case):
    g, sp, place = case
    r = simulate(g, sp, place)
    n, ndev = g.num_ops, sp.count
    dur = op_durations(g, sp, place)
    rank = {v: i for i, v in enumerate(g.topo_order())}
    sequential = sp.interconnect.mode == "sequential"

    # Every op runs once, for its duration, on its device.
    assert sorted(v for seq in r.order for v in seq) == list(range(n))
    for d, seq in enumerate(r.order):
        assert all(place[v] == d for v in seq)
    for v in range(n):
        assert r.end[v] == r.start[v] + dur[v]
        assert r.start[v] >= 0.0

    # No two ops on one device overlap (order is the run order).
    for seq in r.order:
        for prev, nxt in pairwise(seq):
            assert r.end[prev] <= r.start[nxt]

    # Transfers: only across devices, after the producer ends, one per
    # (tensor, destination) with caching, one per cross-device edge without.
    groups: dict[tuple[int, int, int], list[int]] = {}
    for e in range(g.num_edges):
        u, v = g.edge_src[e], g.edge_dst[e]
        if place[u] != place[v]:
            groups.setdefault((u, g.edge_port[e], place[v]), []).append(e)
    by_key: dict[tuple[int, int, int], list[Transfer]] = {}
    for t in r.transfers:
        assert t.src_device == place[t.src_op] != t.dst_device
        assert t.send_start >= r.end[t.src_op]
        assert t.recv_start >= t.send_start
        if not sequential:
            assert t.send_start == t.recv_start == r.end[t.src_op]
        length = t.end - t.recv_start
        # A tensor's measured time and bytes are the largest over all its edges.
        tensor_edges = [e for e in g.out_edges[t.src_op] if g.edge_port[e] == t.port]
        measured = [g.edge_transfer_us[e] for e in tensor_edges if g.edge_transfer_us[e] is not None]
        assert length == (max(measured) if measured else xfer_time(t.nbytes))
        assert t.nbytes == max(g.edge_bytes[e] for e in tensor_edges)
        by_key.setdefault((t.src_op, t.port, t.dst_device), []).append(t)
    assert set(by_key) == set(groups)
    assert all(len(copies) == 1 for copies in by_key.values())  # one copy per tensor and device

    # Every op starts no earlier than each input is present on its device.
    ready = [0.0] * n
    for e in range(g.num_edges):
        u, v = g.edge_src[e], g.edge_dst[e]
        if place[u] == place[v]:
            assert r.start[v] >= r.end[u]
            ready[v] = max(ready[v], r.end[u])
    for key, edges in groups.items():
        starts = sorted(r.start[g.edge_dst[e]] for e in edges)
        (arrival,) = (t.end for t in by_key[key])
        assert starts[0] >= arrival
        for e in edges:
            ready[g.edge_dst[e]] = max(ready[g.edge_dst[e]], arrival)

    # Earliest-ready selection (positive transfer times make readiness at an
    # instant known before that instant's dispatch): each op starts as soon as
    # its device is free and it is ready, and no op that was already ready
    # and not yet started had a better (ready time, topological index).
    for seq in r.order:
        free = 0.0
        for i, v in enumerate(seq):
            assert r.start[v] == max(free, ready[v])
            for w in seq[i + 1 :]:
                if ready[w] <= r.start[v]:
                    assert (ready[v], rank[v]) < (ready[w], rank[w])
            free = r.end[v]

    # Sequential mode: no two transfers overlap on any device's channel.
    if sequential:
        busy: list[list[tuple[float, float]]] = [[] for _ in range(ndev)]
        for t in r.transfers:
            length = t.end - t.recv_start
            busy[t.src_device].append((t.send_start, t.send_start + length))
            busy[t.dst_device].append((t.recv_start, t.end))
        for intervals in busy:
            intervals.sort()
            for (_, e1), (s2, _) in pairwise(intervals):
                assert e1 <= s2

    # Step time: the last op or transfer to end; never below the lower bound.
    last = max([*r.end, *(t.end for t in r.transfers)], default=0.0)
    assert r.step_time_us == last
    assert r.step_time_us >= lower_bound(g, sp)
    assert r.comm_bytes == sum(t.nbytes for t in r.transfers)

    # Memory: the curve starts at 0 with persistent bytes, never dips below
    # them, returns to them, and its maximum is the peak.
    for d in range(ndev):
        persistent = sum(g.persistent_bytes[v] for v in range(n) if place[v] == d)
        assert r.persistent_bytes[d] == persistent
        curve = r.memory_curve[d]
        assert curve[0][0] == 0.0
        assert [tm for tm, _ in curve] == sorted({tm for tm, _ in curve})
        assert all(level >= persistent for _, level in curve)
        assert curve[-1][1] == persistent
        assert r.peak_bytes[d] == max(level for _, level in curve) >= persistent

    # Replaying the run order reproduces the timeline exactly.
    again = simulate(g, sp, place, order=r.order)
    assert again.start == r.start
    assert again.end == r.end
    assert again.order == r.order
    assert again.transfers == r.transfers
    assert again.peak_bytes == r.peak_bytes
