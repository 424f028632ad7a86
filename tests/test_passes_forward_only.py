"""baechi_cli.passes.forward_only: place the forward ops; backward ops follow them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import dags, training_dags
from test_passes_contract import check_contraction

from baechi_cli.core.devices import parse_devices
from baechi_cli.core.graph import GraphBuilder, OpGraph
from baechi_cli.evaluator.evaluate import evaluate
from baechi_cli.evaluator.placement import Placement
from baechi_cli.passes.contract import groups_of, placement_of
from baechi_cli.passes.forward_only import forward_only
from baechi_cli.placers.memory import safe_peaks


def test_backward_ops_follow_their_forward_op():
    b = GraphBuilder()
    x = b.add_op("x", "MatMul", [100], compute_us=4.0, persistent_bytes=10)
    y = b.add_op("y", "Relu", [100], compute_us=1.0)
    z = b.add_op("z", "Softmax", [100], compute_us=2.0)
    dz = b.add_op("gradients/z_grad", "SoftmaxGrad", [100], compute_us=3.0, is_backward=True, forward_op=z)
    dy = b.add_op("gradients/y_grad", "ReluGrad", [100], compute_us=1.0, is_backward=True, forward_op=y)
    dx = b.add_op("gradients/x_grad", "MatMul", [100], compute_us=8.0, is_backward=True, forward_op=x)
    for s, d in ((x, y), (y, z), (z, dz), (dz, dy), (y, dy), (dy, dx), (x, dx)):
        b.add_edge(s, d)
    g = b.build()
    f = forward_only(g)
    assert f.names == ["x", "y", "z"]
    assert f.members == [[x, dx], [y, dy], [z, dz]]
    assert f.compute_us == [12.0, 2.0, 5.0]
    assert sorted(zip(f.edge_src, f.edge_dst)) == [(0, 1), (1, 2)]  # only forward edges stay
    # dropped edges: z -> dz and y -> dy stay inside nodes; dz -> dy costs node y a copy of
    # dz's output (100), dy -> dx costs node x a copy of dy's output (100).
    assert f.persistent_bytes == [10 + 100, 100, 0]
    assert groups_of(f, g) == [x, y, z, z, y, x]
    assert f.group == [0, 1, 2]
    heads = {x, y, z}
    check_contraction(g.replace(group=groups_of(f, g)), f, keep_edge=keep_between(g, heads))


def keep_between(g: OpGraph, heads: set[int]):
    return lambda e: g.edge_src[e] in heads and g.edge_dst[e] in heads


def test_rule_order():
    b = GraphBuilder()
    a = b.add_op("a", "X", [10])
    bb = b.add_op("b", "X", [10])
    c = b.add_op("c", "X", [10])
    # 1. forward_op wins over the group and the producers
    g1 = b.add_op("g1", "G", [10], is_backward=True, forward_op=a)
    # 2. the group's lowest-id forward op wins over the producers
    g2 = b.add_op("g2", "G", [10], is_backward=True)
    # 3. the first producer that follows something: g3 reads const (which follows
    #    nothing yet), then c, then g1 (which follows a); a forward_op naming a
    #    backward op counts as none
    const = b.add_op("shape", "Const", [10], is_backward=True)
    g3 = b.add_op("g3", "G", [10], is_backward=True, forward_op=g1)
    g5 = b.add_op("g5", "G", [10], is_backward=True)  # reads const, then a: follows a
    # 4. a source (const) follows its first consumer: g3 (so c), not g5 (a)
    # 5. touching no forward op: itself (and its producers follow it)
    lone_src = b.add_op("lone_src", "G", [10], is_backward=True)
    lone = b.add_op("lone", "G", [10], is_backward=True)
    for s, d in ((c, g1), (bb, g2), (const, g3), (c, g3), (g1, g3), (const, g5), (a, g5), (lone_src, lone)):
        b.add_edge(s, d)
    group = list(range(b.num_ops))
    group[g1] = bb  # g1 in b's group: rule 1 still sends it to a
    group[g2] = c  # g2 with c: rule 2 beats its producer b
    g = b.build().replace(group=group)
    f = forward_only(g)
    assert f.members == [[a, g1, g5], [bb], [c, g2, const, g3], [lone_src, lone]]
    assert f.names[3] == "lone_src"  # a node is named after its lowest id
    # groups merge with what they follow: g1 brought b's group to a
    assert groups_of(f, g)[g1] == groups_of(f, g)[a] == groups_of(f, g)[bb]


def test_backward_op_with_a_lower_id_than_its_forward_op():
    b = GraphBuilder()
    dy = b.add_op("gradients/y_grad", "ReluGrad", [4], is_backward=True)
    x = b.add_op("x", "X", [4])
    y = b.add_op("y", "Relu", [4])
    b.add_edge(x, y)
    b.add_edge(y, dy)
    g = b.build().replace(forward_op=[y, -1, -1])
    f = forward_only(g)
    assert f.members == [[x], [dy, y]]
    assert f.is_backward == [False, False]
    assert list(zip(f.edge_src, f.edge_dst)) == [(0, 1)]


def test_graph_without_backward_ops_is_returned_unchanged():
    b = GraphBuilder()
    b.add_op("x", "X", [4])
    b.add_op("y", "X", [4])
    b.add_edge(0, 1)
    g = b.build()
    assert forward_only(g) is g


# ------------------------------------------------------------ properties


@settings(max_examples=60, deadline=None)
@given(
    g=st.one_of(training_dags(), dags(1, 16, max_ports=3, control_p=0.15, repeat_p=0.1, backward_p=0.5)),
    ndev=st.integers(1, 3),
    mode=st.sampled_from(["parallel", "sequential"]),
    data=st.data(),
)
def test_reduced_graph_memory_bounds_the_simulated_peak(g, ndev, mode, data):
    f = forward_only(g)
    if f is g:
        assert not any(g.is_backward)
        return
    # one node per forward op and per leftover head, with only the edges between heads
    heads = {_head(g, ms) for ms in f.members}
    assert len(heads) == f.num_ops
    assert {v for v in range(g.num_ops) if not g.is_backward[v]} <= heads
    node_of = check_contraction(g.replace(group=groups_of(f, g)), f, keep_edge=keep_between(g, heads))
    f.topo_order()
    for v in range(g.num_ops):  # rule 1
        fwd = g.forward_op[v]
        if fwd >= 0 and not g.is_backward[fwd]:
            assert node_of[v] == node_of[fwd]
    # memory: any placement of the nodes that keeps their groups, expanded onto the ops
    device_of_group = data.draw(
        st.lists(st.integers(0, ndev - 1), min_size=f.num_ops, max_size=f.num_ops), label="device_of_group"
    )
    device_of_node = [device_of_group[f.group[node]] for node in range(f.num_ops)]
    device_of = placement_of(f, device_of_node, g.num_ops)
    spec = parse_devices(f"{ndev}x1GB").with_comm_mode(mode)
    sim = evaluate(g, spec, Placement(device_of)).timeline
    bound = safe_peaks(f, device_of_node, ndev)  # what a MemoryLedger counts for the whole placement
    for d in range(ndev):
        assert sim.peak_bytes[d] <= bound[d], (d, sim.peak_bytes, bound)
    # so every colocation group of the original ends up on one device
    for ops in g.group_members().values():
        assert len({device_of[v] for v in ops}) == 1


def _head(g: OpGraph, members: list[int]) -> int:
    """The op a node was built around: its forward op; for a node of backward ops only,
    the op that followed itself, which has no consumers (they would have led it elsewhere)."""
    forward = [v for v in members if not g.is_backward[v]]
    if not forward:
        forward = [v for v in members if not g.out_edges[v]]
    assert len(forward) == 1, members
    return forward[0]
