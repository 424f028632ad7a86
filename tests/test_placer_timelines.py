"""A scheduling placer's plan against the evaluator's judgement.

In ``parallel`` mode the plan (the placer's ListSchedule) is exactly the
timeline the evaluator computes from the same per-device order, transfers and
memory included. In ``sequential`` mode the evaluator's channels serve
transfers in the order their producers end and the plan's in commit order, so
they may differ; the evaluator is the judge, and its timeline must be a valid,
feasible (for placers that respect memory) and deterministic schedule.
"""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import check_timeline, dags, device_specs, placement_cases, same_timeline, with_kind_times

from baechi_cli import placers
from baechi_cli.core.devices import Device, DeviceSpec, Interconnect, parse_devices
from baechi_cli.core.errors import InfeasibleError
from baechi_cli.core.graph import GraphBuilder
from baechi_cli.evaluator.evaluate import device_order, evaluate
from baechi_cli.evaluator.sim import ListSchedule, simulate
from baechi_cli.placers.listsched import list_schedule


def run(name, graph, devices):
    spec = placers.get(name)
    return spec.place(graph, devices, spec.make_options({"solver_time_limit": 30.0}))


def _plans(name: str) -> bool:
    """Whether the placer returns its own schedule (tried on a two-op graph)."""
    b = GraphBuilder()
    a = b.add_op("a", "A", [8], compute_us=1.0)
    c = b.add_op("c", "C", [], compute_us=1.0)
    b.add_edge(a, c)
    return run(name, b.build(), parse_devices("2x1GB")).schedule is not None


SCHEDULING_PLACERS = [name for name in placers.names() if _plans(name)]


def test_the_list_schedulers_plan():
    assert {"etf", "sct"} <= set(SCHEDULING_PLACERS)


@pytest.mark.parametrize("name", SCHEDULING_PLACERS)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=placement_cases())
def test_plan_against_evaluation(name, case):
    g, spec = case
    try:
        p = run(name, g, spec)
    except InfeasibleError:
        return
    plan = p.predicted
    assert plan is not None and p.sequence is not None
    assert plan.device_of == p.device_of
    assert plan.order == device_order(p.sequence, p.device_of, spec.count)
    check_timeline(g, spec, plan)  # the plan itself is a valid schedule
    ev = evaluate(g, spec, p)
    check_timeline(g, spec, ev.timeline)
    assert ev.timeline.order == plan.order  # the evaluator follows the planned order
    if spec.interconnect.mode == "parallel":
        assert same_timeline(plan, ev.timeline)
        assert plan.memory_curve == ev.timeline.memory_curve
    if placers.get(name).respects_memory:
        assert ev.feasible, (ev.timeline.peak_bytes, ev.timeline.memory_limits)
    again = run(name, g, spec)
    assert again.sequence == p.sequence and same_timeline(again.predicted, plan)
    assert same_timeline(evaluate(g, spec, again).timeline, ev.timeline)


def test_parallel_plan_equals_event_simulation_with_the_same_device_order():
    rng = random.Random(3)
    b = GraphBuilder()
    for i in range(40):
        b.add_op(f"v{i}", "X", [rng.choice([100, 5000])], compute_us=rng.choice([1.0, 20.0]))
    for v in range(1, 40):
        for u in rng.sample(range(v), k=min(v, 2)):
            b.add_edge(u, v)
    g = b.build()
    spec = parse_devices("3x1GB")
    p = placers.get("etf").place(g, spec)
    plan = p.predicted
    assert len({d for d in p.device_of}) > 1  # a real split, with transfers
    event = simulate(g, spec, p.device_of, order=plan.order)
    assert plan.start == event.start and plan.end == event.end
    assert same_timeline(plan, evaluate(g, spec, p).timeline)


def test_sequential_channels_serve_transfers_in_commit_order_in_the_plan_only():
    # a (dev 0) feeds c1 and c2 on dev 1, x (dev 2) feeds c2. The plan commits
    # c2 before c1, so c2's inputs take the channels first, in c2's input
    # order; c1 then reuses the cached copy of a's output.
    b = GraphBuilder()
    a = b.add_op("a", "A", [1000], compute_us=10)
    x = b.add_op("x", "X", [1000], compute_us=10)
    c1 = b.add_op("c1", "C", [], compute_us=5)
    c2 = b.add_op("c2", "C", [], compute_us=5)
    b.add_edge(a, c1)
    b.add_edge(x, c2)
    b.add_edge(a, c2)
    g = b.build()
    spec = DeviceSpec(
        (Device("/d:0", 10**9), Device("/d:1", 10**9), Device("/d:2", 10**9)),
        Interconnect("sequential", latency_us=10.0, bandwidth_bytes_per_us=100.0),
    )
    # a on 0 [0,10); x on 2 [0,10); c2 committed before c1, both on 1.
    device_of = [0, 2, 1, 1]
    schedule = ListSchedule(g, spec, [-1] * 4)
    for v in (a, x, c2, c1):
        schedule.commit(v, device_of[v])
    r = schedule.result()
    # c2 needs x (from 2) then a (from 0), in its input order (in_edges lists edges in
    # insertion order: x, a). x: send 10 on ch2, recv on ch1 [10,30); a: send on ch0
    # at 10 -> [10,30), recv on ch1 [30,50). c2 runs [50,55); c1 reuses a's copy: [55,60).
    assert [(t.src_op, t.send_start, t.recv_start, t.end) for t in r.transfers] == [
        (x, 10.0, 10.0, 30.0),
        (a, 10.0, 30.0, 50.0),
    ]
    assert (r.start[c2], r.end[c2], r.start[c1], r.end[c1]) == (50.0, 55.0, 55.0, 60.0)
    # The evaluator, given the same per-device order, issues transfers in the order their
    # producers end (a and x both at 10; a has the lower topological index): a takes ch1
    # first [10,30), x's receive waits [30,50). Same step time here, other transfers.
    e = simulate(g, spec, device_of, order=r.order)
    assert [(t.src_op, t.send_start, t.recv_start, t.end) for t in e.transfers] == [
        (a, 10.0, 10.0, 30.0),
        (x, 10.0, 30.0, 50.0),
    ]
    assert (e.start[c2], e.start[c1], e.step_time_us) == (50.0, 55.0, 60.0)
    assert not same_timeline(r, e)


def brute_force_etf(graph, devices):
    """m-ETF's rule without memory, by brute force: each step, every ready op on every device it
    may go to (its colocation group's, once placed), the earliest start first, then the op's
    topological rank, then the lowest device."""
    n = graph.num_ops
    rank = {v: i for i, v in enumerate(graph.topo_order())}
    schedule = ListSchedule(graph, devices, [-1] * n)
    group_device: dict[int, int] = {}
    missing = [len(graph.in_edges[v]) for v in range(n)]
    ready = {v for v in range(n) if not missing[v]}
    while ready:
        choices = []
        for v in ready:
            placed = group_device.get(graph.group[v])
            for d in range(devices.count) if placed is None else [placed]:
                start = max(schedule.dev_free[d], schedule.data_ready(v, d))
                choices.append((start, rank[v], d, v))
        _, _, d, v = min(choices)
        schedule.commit(v, d)
        group_device.setdefault(graph.group[v], d)
        ready.remove(v)
        for e in graph.out_edges[v]:
            w = graph.edge_dst[e]
            missing[w] -= 1
            if not missing[w]:
                ready.add(w)
    return schedule.device_of, schedule.sequence


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_list_scheduler_commits_what_brute_force_commits(data):
    # The engine refreshes a device's candidates only while they could beat the choice so
    # far, and hides empty devices of a class behind one: neither may change a choice.
    # Parallel mode, where an op's ready time on a device never changes once its inputs
    # are committed; in sequential mode it can move earlier (listsched's docstring), and
    # the engine then may commit another op first where brute force would not.
    g = data.draw(dags(1, 14, max_inputs=6, measured_us=(3.0, 40.0)))
    spec = data.draw(device_specs(g, max_devices=4, kinds=True, modes=("parallel",)))
    g = with_kind_times(g, spec)
    p = list_schedule(g, spec, "m-ETF")
    assert (p.device_of, p.sequence) == brute_force_etf(g, spec)


def test_a_copy_sent_for_another_consumer_can_bring_a_ready_time_earlier():
    # Sequential channels: op 6 (on device 0) reads v5 and v2 from device 1. Asked before,
    # both copies queue on the channels in its input order; once v11 has had v2's output
    # sent to device 0, only v5's copy queues, and 6 is ready sooner. So in sequential mode
    # the list scheduler's stale keys are not always lower bounds (listsched's docstring).
    b = GraphBuilder()
    for i, us in enumerate([10, 50, 10, 10, 10, 50, 10, 10, 10, 10, 10, 10]):
        b.add_op(f"v{i}", "X", [100], compute_us=us)
    for src, dst in [(0, 1), (0, 5), (5, 6), (2, 6), (0, 11), (1, 11), (2, 11)]:
        b.add_edge(src, dst)
    g = b.build()
    spec = DeviceSpec(
        (Device("/d:0", 10**12), Device("/d:1", 10**12)), Interconnect("sequential", 10.0, 100.0)
    )
    schedule = ListSchedule(g, spec, [-1] * g.num_ops)
    for v, d in [(0, 0), (2, 1), (1, 0), (5, 1)]:
        schedule.commit(v, d)
    before = schedule.data_ready(6, 0)
    schedule.commit(11, 0)  # sends v2's output to device 0 (v5's is still on its way only to 6)
    assert schedule.data_ready(6, 0) < before
