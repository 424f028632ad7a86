"""baechi_cli.passes.control_flow: TF1 while loops become colocated, acyclic units."""

from __future__ import annotations

import os
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import dags
from test_io_graphdef import _cyclic, write

from baechi_cli.core.errors import InputError
from baechi_cli.core.graph import CONTROL_PORT, GraphBuilder, OpGraph
from baechi_cli.core.unionfind import UnionFind
from baechi_cli.io.graphdef import read_graphdef
from baechi_cli.passes.control_flow import control_flow


def add_loop(b: GraphBuilder, frame: str, init: int, body=None) -> tuple[list[int], int]:
    """A TF1 while loop over ``init``, built the way ``tf.compat.v1.while_loop`` builds it.

    ``body(b, x)`` may add ops to the loop body (``x``: the Switch's true
    output, through an Identity) and returns the op the NextIteration reads.
    Returns the loop's ops (in creation order) and its Exit.
    """
    first = b.num_ops
    enter = b.add_op(f"{frame}/Enter", "Enter", [4], attrs={"frame_name": frame})
    merge = b.add_op(f"{frame}/Merge", "Merge", [4, 4])
    limit = b.add_op(f"{frame}/Less/y", "Const", [4])  # in-loop constant: a control input from the pivot
    less = b.add_op(f"{frame}/Less", "Less", [1])
    cond = b.add_op(f"{frame}/LoopCond", "LoopCond", [1])
    switch = b.add_op(f"{frame}/Switch", "Switch", [4, 4])
    ident = b.add_op(f"{frame}/Identity", "Identity", [4])
    last = body(b, ident) if body is not None else ident
    add = b.add_op(f"{frame}/add", "AddV2", [4])
    nxt = b.add_op(f"{frame}/NextIteration", "NextIteration", [4])
    ext = b.add_op(f"{frame}/Exit", "Exit", [4])
    b.add_edge(init, enter)
    b.add_edge(enter, merge)
    b.add_edge(nxt, merge)
    b.add_edge(merge, limit, CONTROL_PORT)
    b.add_edge(merge, less)
    b.add_edge(limit, less)
    b.add_edge(less, cond)
    b.add_edge(merge, switch)
    b.add_edge(cond, switch)
    b.add_edge(switch, ident, 1)
    b.add_edge(last, add)
    b.add_edge(add, nxt)
    b.add_edge(switch, ext, 0)
    return list(range(first, b.num_ops)), ext


def edge_set(g: OpGraph) -> Counter:
    return Counter(
        (g.names[g.edge_src[e]], g.edge_port[e], g.names[g.edge_dst[e]], g.edge_bytes[e])
        for e in range(g.num_edges)
    )


def back_edges(g: OpGraph) -> Counter:
    return Counter({k: c for k, c in edge_set(g).items() if g.op_types[g.index()[k[0]]] == "NextIteration"})


def check_back_edges_removed(before: OpGraph, after: OpGraph) -> None:
    removed = back_edges(before)
    assert removed, "the test graph should have back edges"
    assert edge_set(after) == edge_set(before) - removed
    assert not back_edges(after)
    order = after.topo_order()
    assert sorted(order) == list(range(after.num_ops))
    rank = {v: i for i, v in enumerate(order)}
    assert all(rank[after.edge_src[e]] < rank[after.edge_dst[e]] for e in range(after.num_edges))


def test_one_loop_is_one_group_without_back_edges():
    b = GraphBuilder()
    x = b.add_op("x", "Placeholder", [4])
    loop, ext = add_loop(b, "w", x)
    y = b.add_op("y", "Relu", [4])
    z = b.add_op("z", "Relu", [4])  # unrelated
    b.add_edge(ext, y)
    b.add_edge(x, z)
    g = b.build()
    with pytest.raises(InputError, match="cycle"):
        g.topo_order()  # the input really is cyclic
    out = control_flow(g)
    assert len({out.group[v] for v in loop}) == 1
    assert out.group[loop[0]] == min(loop)  # union-find: the smallest id names the group
    for v in (x, y, z):
        assert out.group[v] == v
    assert out.names == g.names and out.op_types == g.op_types
    check_back_edges_removed(g, out)
    assert g.group == list(range(g.num_ops))  # the input is not mutated


def test_loop_group_merges_with_groups_its_ops_already_had():
    b = GraphBuilder()
    x = b.add_op("x", "Placeholder", [4])
    var = b.add_op("var", "VariableV2", [4])  # colocated with a body op, outside the frame
    loop, ext = add_loop(b, "w", x)
    other = b.add_op("other", "Relu", [4])  # in a group with x: stays out of the loop
    b.add_edge(ext, other)
    g = b.build()
    body_op = loop[-3]  # the add
    group = list(g.group)
    group[body_op] = var
    group[other] = x
    out = control_flow(g.replace(group=group))
    loop_group = out.group[loop[0]]
    assert all(out.group[v] == loop_group for v in loop)
    assert out.group[var] == loop_group == var  # the smaller root wins
    assert out.group[x] == out.group[other] == x != loop_group


def test_nested_loop_is_one_group_with_the_outer_loop():
    b = GraphBuilder()
    x = b.add_op("x", "Placeholder", [4])
    inner: list[int] = []

    def body(b, ident):
        ops, inner_exit = add_loop(b, "outer/inner", ident)
        inner.extend(ops)
        after = b.add_op("outer/after_inner", "Relu", [4])  # back in the outer frame
        b.add_edge(inner_exit, after)
        return after

    outer, ext = add_loop(b, "outer", x, body)
    y = b.add_op("y", "Relu", [4])
    b.add_edge(ext, y)
    g = b.build()
    assert set(inner) < set(outer)
    out = control_flow(g)
    assert {out.group[v] for v in outer} == {outer[0]}
    assert out.group[x] == x and out.group[y] == y
    check_back_edges_removed(g, out)
    assert sum(1 for t in g.op_types if t == "NextIteration") == 2


def test_inner_frame_named_like_a_root_frame_is_still_nested():
    # Frames are told apart by (parent frame, name): an inner frame "w" inside
    # the frame "w" is a different frame, and still part of the outer loop.
    b = GraphBuilder()
    x = b.add_op("x", "Placeholder", [4])
    outer, ext = add_loop(b, "w", x, lambda b, ident: add_loop(b, "w", ident)[1])
    y = b.add_op("y", "Relu", [4])
    b.add_edge(ext, y)
    out = control_flow(b.build())
    assert {out.group[v] for v in outer} == {outer[0]}
    assert out.group[y] == y


def test_sibling_loops_are_two_groups():
    b = GraphBuilder()
    x = b.add_op("x", "Placeholder", [4])
    first, ext1 = add_loop(b, "first", x)
    mid = b.add_op("mid", "Relu", [4])
    second, ext2 = add_loop(b, "second", mid)
    y = b.add_op("y", "Relu", [4])
    parallel, _ = add_loop(b, "parallel", x)  # a third loop, beside the first
    for s, d in ((ext1, mid), (ext2, y)):
        b.add_edge(s, d)
    g = b.build()
    out = control_flow(g)
    groups = [{out.group[v] for v in loop} for loop in (first, second, parallel)]
    assert all(len(s) == 1 for s in groups)
    assert len(set.union(*groups)) == 3
    for v in (x, mid, y):
        assert out.group[v] == v
    check_back_edges_removed(g, out)


def test_cycle_outside_loops_raises_naming_its_ops():
    b = GraphBuilder()
    x = b.add_op("x", "Placeholder", [4])
    _, ext = add_loop(b, "w", x)
    p = b.add_op("p", "AddV2", [4])
    q = b.add_op("q", "Relu", [4])
    for s, d in ((ext, p), (p, q), (q, p)):
        b.add_edge(s, d)
    with pytest.raises(InputError, match=r"cycle: p -> q -> p") as info:
        control_flow(b.build())
    assert info.value.op == "p"


def test_cycle_inside_a_loop_body_not_through_next_iteration_raises():
    names = {}

    def body(b, ident):
        names["a"] = a = b.add_op("w/a", "AddV2", [4])
        names["c"] = c = b.add_op("w/c", "Relu", [4])
        b.add_edge(ident, a)
        b.add_edge(c, a)
        b.add_edge(a, c)
        return c

    b = GraphBuilder()
    x = b.add_op("x", "Placeholder", [4])
    add_loop(b, "w", x, body)
    with pytest.raises(InputError, match=r"cycle: w/a -> w/c -> w/a"):
        control_flow(b.build())


def test_cycle_in_a_graphdef_is_rejected_by_the_pass_not_the_reader(tmp_path):
    g = read_graphdef(write(tmp_path, _cyclic()), batch_size=1)  # the reader accepts it
    with pytest.raises(InputError, match="cycle: a -> b -> a") as info:
        control_flow(g)
    assert info.value.op == "a"


def test_graph_without_loops_comes_back_unchanged():
    b = GraphBuilder()
    x = b.add_op("x", "Placeholder", [4])
    y = b.add_op("y", "Relu", [4])
    z = b.add_op("z", "Merge", [4, 4])  # a Merge alone (tf.cond) is no loop
    b.add_edge(x, y)
    b.add_edge(y, z)
    b.add_edge(x, z, CONTROL_PORT)
    g = b.build()
    g = g.replace(group=[0, 0, 2])
    out = control_flow(g)
    assert out.group == [0, 0, 2]
    assert edge_set(out) == edge_set(g)
    assert out.topo_order() == [0, 1, 2]


def test_graph_without_loops_but_with_a_cycle_raises():
    b = GraphBuilder()
    a = b.add_op("a", "Relu", [4])
    c = b.add_op("c", "Relu", [4])
    b.add_edge(a, c)
    b.add_edge(c, a)
    with pytest.raises(InputError, match="cycle: a -> c -> a"):
        control_flow(b.build())


# ------------------------------------------------------------ properties


@st.composite
def graphs_with_loops(draw):
    """A drawn DAG with 0..3 while loops added (some nested, some chained one after
    another, some sharing a group with an op outside); returns the graph and each
    outermost loop's ops."""
    base = draw(dags(1, 10, max_ports=1, group_p=0.2))
    b = GraphBuilder.from_graph(base)
    outside = list(range(base.num_ops))  # ops in no loop frame: a loop may start from them
    loops: list[list[int]] = []
    for k in range(draw(st.integers(0, 3))):
        init = outside[draw(st.integers(0, len(outside) - 1))]
        nested = draw(st.booleans())

        def body(b, ident, k=k, nested=nested):
            if not nested:
                return ident
            _, inner_exit = add_loop(b, f"w{k}/inner", ident)
            after = b.add_op(f"w{k}/after_inner", "Relu", [4])
            b.add_edge(inner_exit, after)
            return after

        ops, ext = add_loop(b, f"w{k}", init, body)
        loops.append(ops)
        after = b.add_op(f"after{k}", "Relu", [4])
        b.add_edge(ext, after)
        outside.append(after)
    g = b.build()
    group = list(g.group)
    for ops in loops:
        if draw(st.booleans()):  # a loop op already shares a group with an op outside
            v = ops[draw(st.integers(0, len(ops) - 1))]
            group[v] = outside[draw(st.integers(0, len(outside) - 1))]
    return g.replace(group=UnionFind(group).roots()), loops


@settings(max_examples=60, deadline=None)
@given(graphs_with_loops())
def test_every_loop_becomes_one_group_without_its_back_edges(case):
    g, loops = case
    out = control_flow(g)
    uf = UnionFind(g.group)
    for ops in loops:
        for v in ops:
            uf.union(ops[0], v)
    assert out.group == uf.roots()
    assert out.names == g.names and out.op_types == g.op_types
    if loops:
        check_back_edges_removed(g, out)
    else:
        assert edge_set(out) == edge_set(g)
        assert out.topo_order() == g.topo_order()
    assert control_flow(out).group == out.group  # what is left has no loops


# ------------------------------------------------------- a real TF1 graph


@pytest.fixture(scope="module")
def tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return pytest.importorskip("tensorflow")


@pytest.mark.tf
def test_real_tf1_nested_while_loop(tmp_path, tf):
    was_v2 = tf.compat.v1.control_flow_v2_enabled()
    tf.compat.v1.disable_control_flow_v2()
    try:
        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
            i0 = tf.constant(0, name="i0")  # outside the loops (a Python 0 would be named outer/Const)

            def body(i, s):
                _, t = tf.compat.v1.while_loop(
                    lambda j, t: j < 2, lambda j, t: (j + 1, t * 2.0), [0, s], name="inner"
                )
                return i + 1, t + 1.0

            _, out = tf.compat.v1.while_loop(lambda i, s: i < 3, body, [i0, x], name="outer")
            y = tf.identity(out, name="y")
            _, out2 = tf.compat.v1.while_loop(
                lambda i, s: i < 3, lambda i, s: (i + 1, s * 3.0), [i0, y], name="second"
            )
            tf.nn.relu(out2, name="z")
        graph_def = graph.as_graph_def(add_shapes=True)
    finally:
        if was_v2:
            tf.compat.v1.enable_control_flow_v2()
    path = tmp_path / "loop.pb"
    path.write_bytes(graph_def.SerializeToString())
    g = read_graphdef(str(path))
    frames = {str(g.attrs[v].get("frame_name", "")) for v in range(g.num_ops) if g.op_types[v] == "Enter"}
    assert "outer/inner/while_context" in frames, frames  # the nested frame is there

    out = control_flow(g)
    ids = out.index()
    outer = [v for v, name in enumerate(out.names) if name.startswith("outer/")]
    second = [v for v, name in enumerate(out.names) if name.startswith("second/")]
    assert any(out.names[v].startswith("outer/inner/") for v in outer)
    assert len({out.group[v] for v in outer}) == 1
    assert len({out.group[v] for v in second}) == 1
    assert out.group[outer[0]] != out.group[second[0]]
    inside = set(outer) | set(second)
    for v in range(out.num_ops):
        if v not in inside:
            assert out.group[v] == g.group[v], out.names[v]
    assert out.group[ids["x"]] != out.group[outer[0]]
    check_back_edges_removed(g, out)
