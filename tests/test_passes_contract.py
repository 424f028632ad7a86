"""baechi_cli.passes.contract: the graph surgery behind fusion and forward-only placement.

Also home of the random-graph generators and the contraction checker that the
other pass tests (fusion, forward-only, co-placement) import.
"""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from baechi_cli.devices import parse_devices
from baechi_cli.errors import InfeasibleError
from baechi_cli.graph import CONTROL_PORT, GraphBuilder, OpGraph
from baechi_cli.passes.contract import contract, groups_of, node_index, placement_of, sequence_of
from baechi_cli.passes.coplace import coplace
from baechi_cli.passes.forward_only import forward_only
from baechi_cli.passes.fusion import fuse
from baechi_cli.passes.unionfind import UnionFind
from baechi_cli.pipeline import expand
from baechi_cli.placers import get_placer
from baechi_cli.placers.memory import own_bytes
from baechi_cli.sim import simulate

# ------------------------------------------------------------ generators


def random_graph(rng: random.Random, n: int | None = None, *, group_p: float = 0.25) -> OpGraph:
    """A random DAG (edge sources have smaller ids) with multi-port ops, control edges,
    repeated tensors and random colocation groups (canonical: smallest id)."""
    n = n if n is not None else rng.randint(2, 22)
    b = GraphBuilder()
    for i in range(n):
        b.add_op(
            f"v{i}",
            "X",
            [rng.choice([0, 8, 100, 400]) for _ in range(rng.randint(1, 3))],
            compute_us=rng.choice([0.0, 1.0, 5.0, 20.0]),
            persistent_bytes=rng.choice([0, 0, 100, 300]),
            temporary_bytes=rng.choice([0, 0, 50]),
        )
    nports = [len(p) for p in b._cols["output_bytes"]]
    for v in range(1, n):
        for u in rng.sample(range(v), k=min(v, rng.choice([0, 1, 1, 2, 3]))):
            if rng.random() < 0.15:
                b.add_edge(u, v, CONTROL_PORT)
            else:
                port = rng.randrange(nports[u])
                b.add_edge(u, v, port)
                if rng.random() < 0.1:
                    b.add_edge(u, v, port)  # the same tensor twice (AddN(x, x))
    return b.build().replace(group=random_groups(rng, n, group_p))


def random_groups(rng: random.Random, n: int, p: float) -> list[int]:
    group = list(range(n))
    for v in range(n):
        if rng.random() < p:
            group[v] = group[rng.randrange(v + 1)]
    return group


def training_graph(rng: random.Random, n_forward: int | None = None) -> OpGraph:
    """A training-like DAG: variables and forward ops, a backward op per forward op
    (mostly with ``forward_op``), gradient constants, aggregations and optimizer
    updates colocated with their variables."""
    n_forward = n_forward if n_forward is not None else rng.randint(2, 12)
    b = GraphBuilder()
    fwd: list[int] = []
    variables: list[int] = []
    inputs: dict[int, list[tuple[int, int]]] = {}
    for i in range(n_forward):
        if i == 0 or rng.random() < 0.25:
            v = b.add_op(
                f"var{i}", "VariableV2", [rng.choice([40, 200])], persistent_bytes=rng.choice([40, 200])
            )
            variables.append(v)
            inputs[v] = []
        else:
            v = b.add_op(
                f"fwd{i}",
                "X",
                [rng.choice([0, 50, 300]) for _ in range(rng.randint(1, 2))],
                compute_us=rng.choice([1.0, 5.0, 20.0]),
                temporary_bytes=rng.choice([0, 30]),
            )
            ins = []
            for u in rng.sample(fwd, k=min(len(fwd), rng.randint(1, 3))):
                port = rng.randrange(len(b._cols["output_bytes"][u]))
                b.add_edge(u, v, port)
                ins.append((u, port))
            inputs[v] = ins
        fwd.append(v)
    consumers: dict[int, list[int]] = {v: [] for v in fwd}
    for v in fwd:
        for u, _ in inputs[v]:
            consumers[u].append(v)
    grad: dict[int, int] = {}
    for v in reversed(fwd):
        if rng.random() < 0.15:
            continue  # no gradient for this op
        link = v if rng.random() < 0.85 else -1
        g = b.add_op(
            f"gradients/{b._cols['names'][v]}_grad",
            "XGrad",
            [rng.choice([0, 50, 300])],
            compute_us=rng.choice([1.0, 5.0, 20.0]),
            is_backward=True,
            forward_op=link,
        )
        grad[v] = g
        ups = [grad[w] for w in consumers[v] if w in grad]
        if len(ups) > 1 and rng.random() < 0.5:  # aggregate the incoming gradients first
            agg = b.add_op(f"gradients/AddN_{v}", "AddN", [50], compute_us=1.0, is_backward=True)
            for w in ups:
                b.add_edge(w, agg)
            ups = [agg]
        for w in ups:
            b.add_edge(w, g)
        for u, port in inputs[v]:
            if rng.random() < 0.6:
                b.add_edge(u, g, port)
        if rng.random() < 0.3:
            shape = b.add_op(f"gradients/shape_{v}", "Const", [8], is_backward=True)  # a backward source
            b.add_edge(shape, g)
    n = b.num_ops
    group = list(range(n))
    for var in variables:
        if var in grad:
            apply = b.add_op(f"{b._cols['names'][var]}/Apply", "ApplyGradientDescent", [0], is_backward=True)
            b.add_edge(var, apply)
            b.add_edge(grad[var], apply)
            group.append(var)  # colocated with its variable
    for v in range(len(group)):
        if rng.random() < 0.1:
            group[v] = group[rng.randrange(v + 1)]
    return b.build().replace(group=UnionFind(group).roots())  # canonical: named by the smallest op


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
    return node_of


def is_topological(graph: OpGraph, sequence: list[int]) -> bool:
    rank = {v: i for i, v in enumerate(sequence)}
    return sorted(sequence) == list(range(graph.num_ops)) and all(
        rank[graph.edge_src[e]] < rank[graph.edge_dst[e]] for e in range(graph.num_edges)
    )


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
@given(st.integers(0, 10**9), st.booleans())
def test_contract_any_partition(seed, drop_some):
    rng = random.Random(seed)
    g = random_graph(rng)
    m = rng.randint(1, g.num_ops)
    node_of = [rng.randrange(m) for _ in range(g.num_ops)]
    used = {x: i for i, x in enumerate(dict.fromkeys(node_of))}  # dense, in first-use order
    node_of = [used[x] for x in node_of]
    kept = {e for e in range(g.num_edges) if not drop_some or rng.random() < 0.5}
    c = contract(g, node_of, keep_edge=kept.__contains__)
    assert check_contraction(g, c, keep_edge=kept.__contains__) == node_of


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**9))
def test_sequence_of_a_pure_contraction_is_topological(seed):
    rng = random.Random(seed)
    g = random_graph(rng, group_p=0.6)
    f = fuse(g)
    seq = sequence_of(f, f.topo_order(), g)
    assert is_topological(g, seq)
    assert placement_of(f, [node % 3 for node in range(f.num_ops)], g.num_ops) == [
        node % 3 for node in node_index(f, g.num_ops)
    ]


# ------------------------------------------------------------ end to end


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 10**9),
    st.booleans(),
    st.sampled_from(["etf", "topo"]),
    st.integers(1, 4),
    st.sampled_from([1500, 4000, 10**6]),
    st.sampled_from(["parallel", "sequential"]),
    st.sampled_from(["none", "model", "device"]),
)
def test_reduced_placement_expands_to_a_feasible_one(seed, with_forward_only, algo, ndev, memory, mode, cap):
    rng = random.Random(seed)
    g = training_graph(rng, rng.randint(2, 16))
    spec = parse_devices(f"{ndev}x{memory}B").with_comm_mode(mode)
    reduced = forward_only(g) if with_forward_only else g
    # co-placement caps: none, a share of the model per device, a share of a device
    max_group_bytes = {"none": 10**12, "model": sum(own_bytes(g)) // (16 * ndev), "device": memory // 8}[cap]
    reduced = coplace(reduced, max_group_bytes=max_group_bytes)
    reduced = fuse(reduced)
    reduced.topo_order()
    try:
        placement = get_placer(algo)(reduced, spec, {})
    except InfeasibleError:
        return
    assert len(placement.device_of) == reduced.num_ops
    if reduced is not g:
        placement = expand(placement, reduced, g, with_sequence=not with_forward_only)
    if placement.sequence is not None:
        assert is_topological(g, placement.sequence)
    sim = simulate(g, spec, placement.device_of, sequence=placement.sequence)
    assert sim.feasible, (sim.peak_bytes, memory)
    for groups in (g.group, groups_of(reduced, g)):
        for v in range(g.num_ops):
            assert placement.device_of[v] == placement.device_of[groups[v]]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**9))
def test_generated_graphs_are_dags_with_canonical_groups(seed):
    for make in (random_graph, training_graph):
        g = make(random.Random(seed))
        assert is_topological(g, g.topo_order())
        assert all(g.group[g.group[v]] == g.group[v] <= v for v in range(g.num_ops))
