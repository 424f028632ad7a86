"""baechi_cli.passes.contract: the graph surgery behind fusion and forward-only placement.

Also home of the contraction checker that the other pass tests (fusion,
forward-only) import; the graphs the properties run on are drawn by the
strategies in tests/strategies.py, so failures shrink to small graphs.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import check_timeline, dags, device_specs, is_topological, same_timeline, training_dags

from baechi_cli import placers
from baechi_cli.core.errors import InfeasibleError
from baechi_cli.core.graph import CONTROL_PORT, GraphBuilder, OpGraph
from baechi_cli.evaluator.evaluate import evaluate
from baechi_cli.passes.contract import contract, groups_of, node_index, placement_of, sequence_of
from baechi_cli.passes.coplace import coplace
from baechi_cli.passes.forward_only import forward_only
from baechi_cli.passes.fusion import fuse
from baechi_cli.placers.memory import own_bytes
from baechi_cli.search.candidates import expand

# ------------------------------------------------------------ checker


def expected_node_of(inp: OpGraph, out: OpGraph) -> list[int]:
    """The node of ``out`` every op (or node) of ``inp`` went to."""
    first = node_index(out, max(x for ms in out.members for x in ms) + 1)
    if inp.members is None:
        return first[: inp.num_ops]
    return [first[ms[0]] for ms in inp.members]


def check_contraction(inp: OpGraph, out: OpGraph, keep_edge=None) -> list[int]:
    """Assert ``out`` is ``contract(inp, node_of, keep_edge=keep_edge)`` for the node_of its members give."""
    assert out.members is not None
    node_of = expected_node_of(inp, out)
    m = out.num_ops
    assert sorted(set(node_of)) == list(range(m))
    # members partition the original ops
    original = inp.members if inp.members is not None else [[v] for v in range(inp.num_ops)]
    for node in range(m):
        want = sorted(x for v in range(inp.num_ops) if node_of[v] == node for x in original[v])
        assert out.members[node] == want
    by_node: list[list[int]] = [[] for _ in range(m)]
    for v in range(inp.num_ops):
        by_node[node_of[v]].append(v)
    port_base = [0] * inp.num_ops
    for ops in by_node:
        base = 0
        for v in ops:
            port_base[v] = base
            base += len(inp.output_bytes[v])
    # edges: kept edges between nodes, each (tensor, node) once; nothing else
    want: dict[tuple[int, int, int], set[int]] = {}
    extra = [0] * m
    counted = set()
    tensors = inp.tensors
    for e in range(inp.num_edges):
        u, d = inp.edge_src[e], inp.edge_dst[e]
        s, t = node_of[u], node_of[d]
        if s == t:
            continue
        port = inp.edge_port[e]
        if keep_edge is None or keep_edge(e):
            key = (s, CONTROL_PORT if port == CONTROL_PORT else port_base[u] + port, t)
            want.setdefault(key, set()).add(inp.edge_bytes[e])
        elif port != CONTROL_PORT and (tensors.edge_tensor[e], t) not in counted:
            counted.add((tensors.edge_tensor[e], t))
            extra[t] += tensors.nbytes[tensors.edge_tensor[e]]
    got = Counter((out.edge_src[e], out.edge_port[e], out.edge_dst[e]) for e in range(out.num_edges))
    assert set(got) == set(want)
    assert all(c == 1 for c in got.values())
    for e in range(out.num_edges):
        key = (out.edge_src[e], out.edge_port[e], out.edge_dst[e])
        assert out.edge_bytes[e] in want[key]
        if key[1] != CONTROL_PORT:
            assert 0 <= key[1] < len(out.output_bytes[key[0]])
    # per-node columns
    for node, ops in enumerate(by_node):
        assert out.names[node] == inp.names[ops[0]]
        assert out.output_bytes[node] == [x for v in ops for x in inp.output_bytes[v]]
        assert out.compute_us[node] == sum(inp.compute_us[v] for v in ops)
        assert out.temporary_bytes[node] == max(inp.temporary_bytes[v] for v in ops)
        assert out.persistent_bytes[node] == sum(inp.persistent_bytes[v] for v in ops) + extra[node]
        assert out.is_backward[node] == all(inp.is_backward[v] for v in ops)
        for k, times in inp.compute_us_by_kind.items():
            assert out.compute_us_by_kind[k][node] == sum(times[v] for v in ops)
    assert abs(sum(out.compute_us) - sum(inp.compute_us)) < 1e-6
    # a scope hold until another node ends stays; within the producer's own node it is moot
    assert set(out.scope_holds) == {
        (node_of[v], port_base[v] + p, node_of[w]) for v, p, w in inp.scope_holds if node_of[w] != node_of[v]
    }
    return node_of


# ------------------------------------------------------------ hand-made cases


def four_ops():
    """a (2 ports) -> b, c; b -> d; c -> d (1 port each but a); with a control edge a -> d."""
    b = GraphBuilder()
    a = b.add_op("a", "Split", [10, 20], compute_us=1.0, persistent_bytes=5, temporary_bytes=7)
    x = b.add_op("b", "Relu", [30], compute_us=2.0, temporary_bytes=3)
    c = b.add_op("c", "Relu", [40], compute_us=4.0, is_backward=True)
    d = b.add_op("d", "AddN", [50], compute_us=8.0, persistent_bytes=1, is_backward=True)
    b.add_edge(a, x, 0)
    b.add_edge(a, c, 1, transfer_us=3.5)
    b.add_edge(x, d)
    b.add_edge(c, d)
    b.add_edge(a, d, CONTROL_PORT)
    return b.build()


def test_ports_of_a_node_are_its_members_ports_back_to_back():
    g = four_ops()
    c = contract(g, [0, 1, 0, 1])  # {a, c}, {b, d}
    assert c.names == ["a", "b"] and c.op_types == ["Fused", "Fused"]
    assert c.output_bytes == [[10, 20, 40], [30, 50]]
    assert c.members == [[0, 2], [1, 3]]
    # a:0 -> b is port 0; c:0 -> d is port 2 (after a's two ports); the control edge stays one
    edges = sorted(zip(c.edge_src, c.edge_port, c.edge_dst, c.edge_bytes))
    assert edges == [(0, CONTROL_PORT, 1, 0), (0, 0, 1, 10), (0, 2, 1, 40)]
    assert c.compute_us == [5.0, 10.0]
    assert c.temporary_bytes == [7, 3]
    assert c.persistent_bytes == [5, 1]
    assert c.is_backward == [False, False]
    check_contraction(g, c)


def test_a_scope_hold_moves_to_the_nodes_and_one_within_a_node_goes():
    b = GraphBuilder.from_graph(four_ops())
    b.hold_until(0, 1, 3)  # a's second output until d ends
    b.hold_until(1, 0, 2)  # b's output until c ends
    b.hold_until(0, 0, 2)  # a's first output until c ends
    g = b.build()
    c = contract(g, [0, 1, 0, 1])  # {a, c}, {b, d}: the third stays within a node
    assert c.scope_holds == ((0, 1, 1), (1, 0, 0))
    c = contract(g, [0, 0, 1, 1])  # {a, b}, {c, d}: b's output is the node's port 2
    assert c.scope_holds == ((0, 0, 1), (0, 1, 1), (0, 2, 1))
    check_contraction(g, c)


def test_singletons_keep_their_type_and_measured_transfer_times():
    g = four_ops()
    c = contract(g, [0, 1, 2, 1])  # only b and d merge
    assert c.op_types == ["Split", "Fused", "Relu"]
    assert c.is_backward == [False, False, True]
    ac = [e for e in range(c.num_edges) if (c.edge_src[e], c.edge_dst[e]) == (0, 2)]
    assert [(c.edge_port[e], c.edge_transfer_us[e]) for e in ac] == [(1, 3.5)]
    check_contraction(g, c)


def test_edges_inside_a_node_vanish_and_duplicate_tensors_merge():
    b = GraphBuilder()
    x = b.add_op("x", "X", [100, 7])
    p = b.add_op("p", "Relu", [1])
    q = b.add_op("q", "Relu", [1])
    for dst in (p, q, q):
        b.add_edge(x, dst, 0)
    b.add_edge(x, q, 1)
    b.add_edge(p, q)
    g = b.build()
    c = contract(g, [0, 1, 1])
    # x:0 reaches the node {p, q} three times: one edge; x:1 is another tensor
    assert sorted(zip(c.edge_src, c.edge_port, c.edge_dst)) == [(0, 0, 1), (0, 1, 1)]
    assert c.output_bytes == [[100, 7], [1, 1]]
    check_contraction(g, c)


def test_dropped_edges_add_one_received_copy_per_tensor_and_node():
    b = GraphBuilder()
    x = b.add_op("x", "X", [100, 7])
    p = b.add_op("p", "Relu", [1])
    q = b.add_op("q", "Relu", [1])
    r = b.add_op("r", "Relu", [1], persistent_bytes=1000)
    s = b.add_op("s", "Relu", [1])
    b.add_edge(x, p, 0)
    b.add_edge(x, q, 0, nbytes=300)  # a tensor's bytes: the largest edge carrying it
    b.add_edge(x, q, 1)
    b.add_edge(x, r, 0)
    b.add_edge(x, r, CONTROL_PORT)  # control edges cost no copy
    b.add_edge(p, q)  # inside a node: dropped by keep_edge, but no copy either
    b.add_edge(s, r)  # kept
    g = b.build()
    keep = {6}
    c = contract(g, [0, 1, 1, 2, 3], keep_edge=keep.__contains__)
    # node {p, q}: one copy of x:0 (300, not twice) and one of x:1 (7); node r: one copy of x:0
    assert c.persistent_bytes == [0, 307, 1300, 0]
    assert list(zip(c.edge_src, c.edge_port, c.edge_dst)) == [(3, 0, 2)]
    check_contraction(g, c, keep_edge=keep.__contains__)


def test_members_of_a_contracted_graph_are_original_ops():
    g = four_ops()
    once = contract(g, [0, 1, 2, 1])  # {a}, {b, d}, {c}
    twice = contract(once, [0, 1, 0])  # {a, c}, {b, d}
    assert twice.members == [[0, 2], [1, 3]]
    assert node_index(twice, 4) == [0, 1, 0, 1]
    assert node_index(g, 4) == [0, 1, 2, 3]
    assert placement_of(twice, [1, 0], 4) == [1, 0, 1, 0]
    assert placement_of(g, [1, 0, 1, 1], 4) == [1, 0, 1, 1]


def test_node_groups_are_the_first_node_of_their_group():
    g = four_ops().replace(group=[0, 1, 0, 3])
    c = contract(g, [0, 1, 2, 3])
    assert c.group == [0, 1, 0, 3]
    c = contract(g.replace(group=[0, 1, 0, 1]), [0, 1, 0, 1])
    assert c.group == [0, 1]


def test_groups_of_expands_node_groups_onto_original_ops():
    g = four_ops().replace(group=[0, 0, 2, 3])
    c = contract(g, [0, 0, 1, 2])  # {a, b}, {c}, {d}
    assert groups_of(c, g) == [0, 0, 2, 3]
    merged = c.replace(group=[0, 1, 0])  # a later pass put {a, b} with {d}
    assert groups_of(merged, g) == [0, 0, 2, 0]
    assert groups_of(g, g) == [0, 0, 2, 3]


def test_sequence_of_orders_members_topologically_not_by_id():
    b = GraphBuilder()
    late = b.add_op("late", "Relu", [4])  # id 0, but it runs after 'early'
    early = b.add_op("early", "Relu", [4])
    tail = b.add_op("tail", "Relu", [4])
    b.add_edge(early, late)
    b.add_edge(late, tail)
    g = b.build()
    c = contract(g, [0, 0, 1])
    assert c.members == [[0, 1], [2]]
    assert sequence_of(c, [0, 1], g) == [early, late, tail]
    assert sequence_of(g, [1, 0, 2], g) == [1, 0, 2]  # not contracted: as given


# ------------------------------------------------------------ properties


@settings(max_examples=60, deadline=None)
@given(g=dags(1, 22, max_ports=3, control_p=0.15, repeat_p=0.1, scope_hold_p=0.2), data=st.data())
def test_contract_any_partition(g, data):
    m = data.draw(st.integers(1, g.num_ops), label="nodes")
    node_of = data.draw(
        st.lists(st.integers(0, m - 1), min_size=g.num_ops, max_size=g.num_ops), label="node_of"
    )
    used = {x: i for i, x in enumerate(dict.fromkeys(node_of))}  # dense, in first-use order
    node_of = [used[x] for x in node_of]
    dropped = data.draw(
        st.sets(st.integers(0, max(g.num_edges - 1, 0)), max_size=g.num_edges), label="dropped"
    )
    keep = lambda e: e not in dropped  # noqa: E731
    c = contract(g, node_of, keep_edge=keep)
    assert check_contraction(g, c, keep_edge=keep) == node_of
    # Totals: compute is kept; bytes only grow, by the received copies of dropped edges.
    assert sum(c.compute_us) == sum(g.compute_us)
    assert sum(map(sum, c.output_bytes)) == sum(map(sum, g.output_bytes))
    assert sum(c.persistent_bytes) >= sum(g.persistent_bytes)
    if not dropped:
        assert sum(c.persistent_bytes) == sum(g.persistent_bytes)


@settings(max_examples=60, deadline=None)
@given(dags(2, 22, max_ports=3, control_p=0.15, repeat_p=0.1, group_p=0.6, relabel=True), st.integers(1, 4))
def test_sequence_of_a_pure_contraction_is_topological(g, ndev):
    f = fuse(g)
    seq = sequence_of(f, f.topo_order(), g)
    assert is_topological(g, seq)
    assert placement_of(f, [node % ndev for node in range(f.num_ops)], g.num_ops) == [
        node % ndev for node in node_index(f, g.num_ops)
    ]


# ------------------------------------------------------------ end to end


@pytest.mark.parametrize("algo", placers.names())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    g=training_dags(2, 16),
    with_forward_only=st.booleans(),
    cap=st.sampled_from(["none", "model", "device"]),
    data=st.data(),
)
def test_reduced_placement_expands_to_a_valid_one(algo, g, with_forward_only, cap, data):
    spec = data.draw(device_specs(g, kinds=False), label="devices")
    ndev, memory = spec.count, min(d.memory_bytes for d in spec.devices)
    reduced = forward_only(g) if with_forward_only else g
    # co-placement caps: none, a share of the model per device, a share of a device
    max_group_bytes = {"none": 10**12, "model": sum(own_bytes(g)) // (16 * ndev), "device": memory // 8}[cap]
    reduced = coplace(reduced, max_group_bytes=max_group_bytes)
    reduced = fuse(reduced)
    reduced.topo_order()
    spec_ = placers.get(algo)
    try:
        placement = spec_.place(reduced, spec, spec_.make_options({"solver_time_limit": 30.0}))
    except InfeasibleError:
        return
    assert len(placement.device_of) == reduced.num_ops
    if spec_.respects_memory:  # within memory on the graph it placed; the pipeline re-checks the ops
        assert evaluate(reduced, spec, placement).feasible
    if placement.schedule is not None and spec.interconnect.mode == "parallel":
        # the plan is judged on the graph it was made for
        assert same_timeline(placement.predicted, evaluate(reduced, spec, placement).timeline)
    if reduced is not g:
        placement = expand(placement, reduced, g, with_sequence=not with_forward_only)
    if placement.sequence is not None:
        assert is_topological(g, placement.sequence)
    ev = evaluate(g, spec, placement)
    check_timeline(g, spec, ev.timeline)
    for groups in (g.group, groups_of(reduced, g)):
        for v in range(g.num_ops):
            assert placement.device_of[v] == placement.device_of[groups[v]]


@settings(max_examples=30, deadline=None)
@given(st.one_of(dags(1, 22, control_p=0.15, repeat_p=0.1, backward_p=0.2, relabel=True), training_dags()))
def test_drawn_graphs_are_dags_with_canonical_groups(g):
    assert is_topological(g, g.topo_order())
    assert all(g.group[g.group[v]] == g.group[v] <= v for v in range(g.num_ops))
    assert all(f != v and -1 <= f < g.num_ops for v, f in enumerate(g.forward_op))
