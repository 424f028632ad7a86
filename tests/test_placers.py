"""The placers: hand-made cases per placer, and the placer contract as a property of every
registered placer over drawn graphs and devices (tests/strategies.py)."""

from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import (
    check_timeline,
    dags,
    is_topological,
    memory_need,
    placement_cases,
    same_timeline,
)

from baechi_cli import placers
from baechi_cli.core.devices import parse_devices
from baechi_cli.core.errors import InfeasibleError
from baechi_cli.core.graph import GraphBuilder
from baechi_cli.evaluator.evaluate import device_order, evaluate
from baechi_cli.evaluator.sim import lower_bound
from baechi_cli.placers.memory import MemoryLedger


def chain(n, out_bytes=100, compute=10.0, persistent=0):
    b = GraphBuilder()
    ids = [
        b.add_op(f"op{i}", "X", [out_bytes], compute_us=compute, persistent_bytes=persistent)
        for i in range(n)
    ]
    for s, d in zip(ids, ids[1:]):
        b.add_edge(s, d)
    return b


def test_topo_fills_devices_in_turn_up_to_equal_share():
    g = chain(8).build()
    p = placers.get("topo").place(g, parse_devices("4x1MB"))
    assert p.device_of == [0, 0, 1, 1, 2, 2, 3, 3]


def test_topo_places_whole_colocation_groups():
    b = chain(6)
    g = b.build()
    # ops 0 and 5 must share a device: the group goes where op 0 goes
    g = g.replace(group=[0, 1, 2, 3, 4, 0])
    p = placers.get("topo").place(g, parse_devices("3x1MB"))
    assert p.device_of[5] == p.device_of[0]


def test_topo_skips_a_device_without_room():
    b = GraphBuilder()
    big = b.add_op("big", "X", [10], compute_us=1, persistent_bytes=900)
    small = b.add_op("small", "X", [10], compute_us=1)
    b.add_edge(small, big)
    # device 0 has 500 bytes, device 1 has 2000: big cannot go to device 0
    spec = parse_devices("500B,2000B")
    p = placers.get("topo").place(b.build(), spec)
    assert p.device_of[big] == 1
    assert evaluate(b.build(), spec, p).feasible


def test_infeasible_says_what_is_needed_and_given():
    g = chain(2, persistent=600).build().replace(group=[0, 0])
    with pytest.raises(InfeasibleError) as info:
        placers.get("topo").place(g, parse_devices("2x1KB"))
    msg = str(info.value)
    assert "1.20 KB (1200 bytes) on one device" in msg and "2.00 KB" in msg
    assert info.value.exit_code == 3


def test_ledger_counts_one_copy_per_tensor_and_device():
    b = GraphBuilder()
    a = b.add_op("a", "A", [100])
    c1 = b.add_op("c1", "C", [0])
    c2 = b.add_op("c2", "C", [0])
    b.add_edge(a, c1)
    b.add_edge(a, c2)
    led = MemoryLedger(b.build(), parse_devices("2x1KB"))
    led.commit([c1], 1, led.extra([c1], 1))
    led.commit([c2], 1, led.extra([c2], 1))
    # the consumers reserved one copy of a's output on device 1, before a was placed
    assert led.used == [0, 100]
    # a on device 0 adds its output there; on device 1 the reserved copy comes back
    assert led.extra([a], 0) == {0: 100}
    assert led.extra([a], 1) == {1: 0}
    led.commit([a], 1, led.extra([a], 1))
    assert led.used == [0, 100]


# ------------------------------------------------------------ properties


def run(name, graph, devices):
    """Place with the registered placer ``name`` (a solver time limit where it takes one)."""
    spec = placers.get(name)
    return spec.place(graph, devices, spec.make_options({"solver_time_limit": 30.0}))


def plenty(graph, devices) -> bool:
    """Every device could hold the whole graph, counted as a MemoryLedger counts it at most."""
    return all(d.memory_bytes >= memory_need(graph) for d in devices.devices)


@pytest.mark.parametrize("name", placers.names())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=placement_cases())
def test_every_placer_keeps_the_placer_contract(name, case):
    g, spec = case
    algo = placers.get(name)
    try:
        p = run(name, g, spec)
    except InfeasibleError:
        # The ledger never counts more than memory_need: with that much, nothing is infeasible.
        assert not plenty(g, spec)
        with pytest.raises(InfeasibleError):  # and giving up is deterministic too
            run(name, g, spec)
        return
    # Every op on a valid device; every colocation group on one device.
    assert len(p.device_of) == g.num_ops
    assert all(0 <= d < spec.count for d in p.device_of)
    for v in range(g.num_ops):
        assert p.device_of[v] == p.device_of[g.group[v]]
    if p.sequence is not None:
        assert is_topological(g, p.sequence)
    ev = evaluate(g, spec, p)
    check_timeline(g, spec, ev.timeline)
    if p.sequence is not None:  # the evaluator runs each device's ops in the planned order
        assert ev.timeline.order == device_order(p.sequence, p.device_of, spec.count)
    if algo.respects_memory:
        assert ev.feasible, (ev.timeline.peak_bytes, ev.timeline.memory_limits)
    assert ev.value_us == ev.timeline.step_time_us >= lower_bound(g, spec)
    # Deterministic: the same input gives the same placement, order and judgement.
    again = run(name, g, spec)
    assert again.device_of == p.device_of and again.sequence == p.sequence
    assert same_timeline(evaluate(g, spec, again).timeline, ev.timeline)


@settings(max_examples=60, deadline=None)
@given(g=dags(1, 20, group_p=0.3, relabel=True), ndev=st.integers(1, 4))
def test_topo_fills_devices_in_turn_when_memory_is_plentiful(g, ndev):
    p = placers.get("topo").place(g, parse_devices(f"{ndev}x1TB"))
    rank = {v: i for i, v in enumerate(g.topo_order())}
    # Groups in the order m-TOPO meets them (their first op in topological order).
    groups = sorted(g.group_members().values(), key=lambda ops: min(rank[v] for v in ops))
    devices = [p.device_of[ops[0]] for ops in groups]
    assert devices == sorted(devices)
    # Devices are filled one after another, each left for the next only once the next
    # group would push it past an equal share of the compute.
    share = sum(g.compute_us) / ndev
    load = [0.0] * ndev
    for ops in groups:
        load[p.device_of[ops[0]]] += sum(g.compute_us[v] for v in ops)
    assert not devices or devices[0] == 0
    for prev, ops in pairwise(groups):
        d = p.device_of[ops[0]]
        if d != p.device_of[prev[0]]:
            assert d == p.device_of[prev[0]] + 1
            assert load[d - 1] > 0 and load[d - 1] + sum(g.compute_us[v] for v in ops) > share


@pytest.mark.parametrize("algo", ["etf", "topo"])
def test_placers_do_not_strand_a_big_group(algo):
    # Four 20-byte ops that m-ETF would spread over both devices (they run in
    # parallel), then one 90-byte op: spread 40/40, nothing has room for it.
    b = GraphBuilder()
    for i in range(4):
        b.add_op(f"small{i}", "X", [0], compute_us=10, persistent_bytes=20)
    b.add_op("big", "X", [0], compute_us=10, persistent_bytes=90)
    g = b.build()
    spec = parse_devices("2x100B")
    p = placers.get(algo).place(g, spec)
    assert evaluate(g, spec, p).feasible
