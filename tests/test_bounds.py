"""Lower bounds (baechi_cli.evaluator.bounds): never above any simulated step, and the transfer-cut bound's reach.

The property test draws a graph, devices (parallel or sequential channels,
per-link overrides, two device kinds) and a device per colocation group, and
checks that no simulated step beats any bound; a second one tries every
placement of small graphs, so the bound is checked against the best of them.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import dags, device_specs, with_kind_times

from baechi_cli.core.devices import Interconnect, parse_devices
from baechi_cli.core.graph import GraphBuilder, OpGraph
from baechi_cli.evaluator.bounds import LowerBounds, lower_bounds
from baechi_cli.evaluator.sim import simulate

TESTDATA = os.path.join(os.path.dirname(__file__), "..", "testdata")


def by_group(graph: OpGraph, choice: tuple[int, ...] | list[int]) -> list[int]:
    """A placement giving group k (in sorted group-id order) device ``choice[k]``."""
    where = dict(zip(sorted(set(graph.group)), choice))
    return [where[g] for g in graph.group]


@st.composite
def placed(draw) -> tuple:
    graph = draw(dags(1, 12, measured_us=(3.0, 40.0), relabel=True))
    devices = draw(device_specs(graph, min_devices=2, kinds=True))
    choice = [draw(st.integers(0, devices.count - 1)) for _ in set(graph.group)]
    return with_kind_times(graph, devices), devices, by_group(graph, choice)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(placed())
def test_no_simulated_step_beats_a_bound(case):
    graph, devices, device_of = case
    bounds = lower_bounds(graph, devices)
    step = simulate(graph, devices, device_of).step_time_us
    assert bounds.best_us <= step * (1 + 1e-9), (bounds, step)
    assert bounds.transfer_cut_us >= bounds.critical_path_us


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_transfer_cut_bound_is_at_most_the_best_placement(data):
    graph = data.draw(dags(2, 7, measured_us=(3.0, 40.0)))
    devices = data.draw(device_specs(graph, min_devices=2, max_devices=3, kinds=True))
    graph = with_kind_times(graph, devices)
    groups = len(set(graph.group))
    best = min(
        simulate(graph, devices, by_group(graph, choice)).step_time_us
        for choice in itertools.product(range(devices.count), repeat=groups)
    )
    assert lower_bounds(graph, devices).transfer_cut_us <= best * (1 + 1e-9)


def chain_with_branch(latency_us: float) -> tuple[OpGraph, object]:
    """x -> y -> z with w reading x: w can run beside y only across a transfer."""
    b = GraphBuilder()
    x = b.add_op("x", "X", [1000], compute_us=10)
    y = b.add_op("y", "Y", [1000], compute_us=40)
    z = b.add_op("z", "Z", [], compute_us=10)
    w = b.add_op("w", "W", [], compute_us=40)
    for u, v in ((x, y), (y, z), (x, w)):
        b.add_edge(u, v)
    devices = replace(
        parse_devices("2x1GB"), interconnect=Interconnect(latency_us=latency_us, bandwidth_bytes_per_us=1000)
    )
    return b.build(), devices


def test_an_unaffordable_split_makes_one_device_the_bound():
    # Critical path 60 µs; w beside y costs 10 + 51 (the copy) + 40 = 101 µs > 100 on one device.
    graph, devices = chain_with_branch(latency_us=50)
    bounds = lower_bounds(graph, devices)
    assert bounds.critical_path_us == 60
    assert bounds.transfer_cut_us == 100 == simulate(graph, devices, [0, 0, 0, 0]).step_time_us
    assert bounds.best_source == "transfer cuts"


def test_an_affordable_split_leaves_the_critical_path():
    # With 1 µs of latency, w beside y costs 10 + 2 + 40 = 52 µs, under the critical path.
    graph, devices = chain_with_branch(latency_us=1)
    bounds = lower_bounds(graph, devices)
    assert bounds.transfer_cut_us == bounds.critical_path_us == 60
    assert simulate(graph, devices, [0, 0, 0, 1]).step_time_us == 60
    assert bounds.best_source == "critical path"


def test_colocation_groups_count_in_the_bound():
    # y and w in one group: they queue on one device, whatever the links.
    graph, devices = chain_with_branch(latency_us=1)
    grouped = graph.replace(group=[0, 1, 2, 1])
    bounds = lower_bounds(grouped, devices)
    assert bounds.transfer_cut_us == 10 + 40 + 40  # x, then y and w queued on one device
    assert bounds.transfer_cut_us == min(
        simulate(grouped, devices, by_group(grouped, choice)).step_time_us
        for choice in itertools.product(range(2), repeat=3)
    )


def test_one_device_and_an_empty_graph():
    graph, _ = chain_with_branch(latency_us=50)
    one = lower_bounds(graph, parse_devices("1x1GB"))
    assert one.transfer_cut_us == one.critical_path_us and one.best_us == one.work_us == 100
    empty = lower_bounds(GraphBuilder().build(), parse_devices("2x1GB"))
    assert empty.best_us == empty.transfer_cut_us == 0


def test_on_a_real_training_graph_the_bound_charges_transfers():
    # mlp.pb on Baechi's PCIe testbed: any split pays a 134 µs latency against a 338 µs
    # step, so the bound is more than twice the critical path.
    from baechi_cli.app.place import PlaceOptions, prepare

    prepared = prepare(
        os.path.join(TESTDATA, "mlp.pb"), parse_devices("rtx2080x4"), PlaceOptions(), lambda _: None
    )
    bounds = prepared.bounds
    assert bounds.best_source == "transfer cuts"
    assert bounds.transfer_cut_us > 2 * bounds.critical_path_us
    assert bounds.transfer_cut_us < prepared.single_device.step_time_us


def test_a_step_a_rounding_below_its_bound_has_no_gap():
    # keras_cnn's training step read 302.65024280039717 against a transfer-cut bound of
    # 302.6502428003972: the same sum in another order, not a plan beating its bound
    bounds = LowerBounds(critical_path_us=277.0, work_us=75.7, transfer_cut_us=302.6502428003972)
    assert bounds.gap(302.65024280039717) == 0.0
    assert bounds.gap(302.6502428003972 * 1.01) > 0.0099
    assert LowerBounds(0.0, 0.0).gap(1.0) is None
