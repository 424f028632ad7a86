"""baechi_cli.passes.fusion: contract connected ops of one group, never closing a cycle."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import dags, training_dags
from test_passes_contract import check_contraction

from baechi_cli.core.graph import CONTROL_PORT, GraphBuilder, OpGraph
from baechi_cli.passes.contract import node_index
from baechi_cli.passes.coplace import coplace
from baechi_cli.passes.fusion import fuse


def build(n: int, edges, group=None) -> OpGraph:
    b = GraphBuilder()
    for i in range(n):
        b.add_op(chr(ord("a") + i), "Relu", [4 * (i + 1)], compute_us=float(i + 1))
    for s, d in edges:
        b.add_edge(s, d)
    g = b.build()
    return g if group is None else g.replace(group=group)


def test_chain_of_one_group_fuses_whole():
    g = build(5, [(0, 1), (1, 2), (2, 3), (3, 4)], group=[0] * 5)
    f = fuse(g)
    assert f.members == [[0, 1, 2, 3, 4]]
    assert f.num_edges == 0 and f.compute_us == [15.0]
    assert f.output_bytes == [[4, 8, 12, 16, 20]]
    check_contraction(g, f)


def test_chain_fuses_within_groups_only():
    g = build(5, [(0, 1), (1, 2), (2, 3), (3, 4)], group=[0, 0, 2, 2, 2])
    f = fuse(g)
    assert f.members == [[0, 1], [2, 3, 4]]
    assert f.group == [0, 1]
    assert list(zip(f.edge_src, f.edge_port, f.edge_dst)) == [(0, 1, 1)]  # b's port, after a's
    check_contraction(g, f)


def test_ops_of_different_groups_never_fuse():
    g = build(4, [(0, 1), (1, 2), (2, 3)])
    assert fuse(g) is g
    g = build(4, [(0, 1), (1, 2), (2, 3)], group=[0, 1, 0, 1])  # alternating groups
    assert fuse(g) is g


def test_triangle_fuses_nothing():
    g = build(3, [(0, 1), (1, 2), (0, 2)], group=[0, 0, 0])
    assert fuse(g) is g


def test_naive_fusion_would_close_a_cycle():
    # a and c share a group and an edge, but a -> b -> c: fusing them gives ac -> b -> ac.
    g = build(3, [(0, 1), (1, 2), (0, 2)], group=[0, 1, 0])
    assert fuse(g) is g
    # The same through a longer detour whose links fuse among themselves.
    g = build(4, [(0, 1), (1, 2), (2, 3), (0, 3)], group=[0, 1, 1, 0])
    f = fuse(g)
    assert f.members == [[0], [1, 2], [3]]
    assert f.topo_order() == [0, 1, 2]
    check_contraction(g, f)
    # A control edge is a path too.
    b = GraphBuilder()
    for name in "abc":
        b.add_op(name, "Relu", [4])
    b.add_edge(0, 2)
    b.add_edge(0, 1, CONTROL_PORT)
    b.add_edge(1, 2, CONTROL_PORT)
    g = b.build().replace(group=[0, 1, 0])
    assert fuse(g) is g


def test_diamond_fuses_nothing():
    # Fusing a -> b would be safe (b's only input is a), but the node ab would
    # hold c until b ends, and bd would hold d... the pass refuses (module docstring).
    g = build(4, [(0, 1), (0, 2), (1, 3), (2, 3)], group=[0] * 4)
    assert fuse(g) is g


def test_source_fuses_into_its_only_consumer():
    # w (no inputs) feeds only m; m has another input x from another group.
    g = build(4, [(0, 2), (1, 2), (2, 3)], group=[0, 1, 0, 0])
    f = fuse(g)
    assert f.members == [[0, 2, 3], [1]]
    check_contraction(g, f)
    # not when the producer has inputs of its own (it is no source) and the consumer has two
    g = build(4, [(0, 1), (1, 3), (2, 3)], group=[0, 1, 2, 1])
    assert fuse(g) is g


def test_sink_fuses_into_its_only_producer():
    # y feeds z and the sink s (no consumers); y, s share a group
    g = build(3, [(0, 1), (0, 2)], group=[0, 1, 0])
    f = fuse(g)
    assert f.members == [[0, 2], [1]]
    check_contraction(g, f)
    # s has consumers: no longer a sink; z and s are two successors of y
    g = build(4, [(0, 1), (0, 2), (2, 3)], group=[0, 1, 0, 3])
    assert fuse(g) is g


def test_fusion_looks_at_the_partly_fused_graph():
    # a feeds b and the sink c; b feeds d (another group). a -> b is no chain
    # link while a has two successors, but once the sink c fused into a, it is.
    g = build(4, [(0, 1), (0, 2), (1, 3)], group=[0, 0, 0, 3])
    f = fuse(g)
    assert f.members == [[0, 1, 2], [3]]
    check_contraction(g, f)
    # a -> b -> c -> d with a -> c: only c -> d is a link; a -> b never becomes one
    g = build(4, [(0, 1), (1, 2), (2, 3), (0, 2)], group=[0, 0, 0, 0])
    assert fuse(g).members == [[0], [1], [2, 3]]


# ------------------------------------------------------------ properties


def check_fused(g: OpGraph, f: OpGraph) -> None:
    if f is g:
        return
    check_contraction(g, f)
    order = f.topo_order()  # acyclic
    assert sorted(order) == list(range(f.num_ops))
    # the expansion covers every original op, once
    original = max(v for ops in f.members for v in ops) + 1
    assert sorted(v for ops in f.members for v in ops) == list(range(original))
    assert -1 not in node_index(f, original)
    for node, ops in enumerate(f.members):
        assert len({g.group[v] for v in ops}) == 1, "a node mixes groups"
        # members are connected through edges among themselves
        inside = set(ops)
        seen, stack = {ops[0]}, [ops[0]]
        while stack:
            v = stack.pop()
            for w in g.successors(v) + g.predecessors(v):
                if w in inside and w not in seen:
                    seen.add(w)
                    stack.append(w)
        assert seen == inside, f"node {node} is not connected"
    # node groups: equal exactly when the members' groups are equal
    for x in range(f.num_ops):
        for y in range(f.num_ops):
            same = g.group[f.members[x][0]] == g.group[f.members[y][0]]
            assert (f.group[x] == f.group[y]) == same


@settings(max_examples=60, deadline=None)
@given(group_p=st.sampled_from([0.3, 0.7, 1.0]), data=st.data())
def test_fusion_of_drawn_dags(group_p, data):
    g = data.draw(dags(1, 22, max_ports=3, control_p=0.15, repeat_p=0.1, group_p=group_p, relabel=True))
    f = fuse(g)
    check_fused(g, f)
    again = fuse(f)
    assert again.num_ops == f.num_ops  # a fixed point: nothing more to fuse
    check_fused(f, again)


@settings(max_examples=40, deadline=None)
@given(training_dags(), st.sampled_from([500, 2000, 10**9]))
def test_fusion_after_coplace_of_training_graphs(g, cap):
    c = coplace(g, max_group_bytes=cap)
    f = fuse(c)
    check_fused(c, f)
    assert fuse(f).num_ops == f.num_ops
