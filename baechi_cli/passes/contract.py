"""Contract ops into nodes: the graph surgery behind fusion and forward-only placement.

:func:`contract` maps every op ``v`` to a node ``node_of[v]`` (dense ids
``0..m-1``) and builds the graph of nodes. A node

* runs its members one after another: compute is their sum (per device kind too),
  temporary bytes their maximum (a device runs one op at a time);
* holds all its members' tensors, its output ports its members' ports back to back, so a
  placer's memory ledger counts every tensor once: views (``view_of``) stay views when a node is
  one view op, and inside a node a view's storage is counted at the view's port (a port only
  the node reads and a view of it uses takes no bytes; a view of resident storage none);
* keeps its members' persistent bytes, plus one received copy of every
  outside tensor that its members consume over an edge the contraction drops
  (``keep_edge``), so the ledger stays an upper bound of the real peak when
  the placement is expanded back onto the ops;
* holds what the caller holds (``held_outputs``) at the member's port, and
  keeps a scope hold (``scope_holds``) until another node ends;
* remembers its members as ops of the *original* graph (``members``), also
  when the input was itself contracted, so passes compose.

Edges between nodes carry the same tensors as before; edges inside a node vanish and duplicates
(one tensor to several members of a node) merge. The caller must keep the node graph acyclic
(fusion checks before contracting; forward-only keeps a subgraph) and a node's members in one
colocation group. :func:`placement_of` and :func:`sequence_of` expand a node placement back.

Complexity: O(V + E) plus sorting each node's members.

Example:
    >>> from baechi_cli.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.add_op("x", "MatMul", [100], compute_us=5.0)
    >>> y = b.add_op("y", "Relu", [100], compute_us=1.0)
    >>> z = b.add_op("z", "Softmax", [100], compute_us=2.0)
    >>> _ = b.add_edge(x, y); _ = b.add_edge(y, z)
    >>> g = b.build().replace(group=[0, 0, 2])
    >>> c = contract(g, [0, 0, 1])
    >>> c.names, c.compute_us, c.output_bytes, c.members
    (['x', 'z'], [6.0, 2.0], [[100, 100], [100]], [[0, 1], [2]])
    >>> c.edge_src, c.edge_port, c.edge_dst
    ([0], [1], [1])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from baechi_cli.core.graph import CONTROL_PORT, OpGraph
from baechi_cli.core.unionfind import UnionFind


def contract(
    graph: OpGraph, node_of: Sequence[int], *, keep_edge: Callable[[int], bool] | None = None
) -> OpGraph:
    """The graph of nodes ``node_of`` (module docstring); ``keep_edge(e)`` False drops edge ``e``."""
    n = graph.num_ops
    m = max(node_of, default=-1) + 1
    members: list[list[int]] = [[] for _ in range(m)]
    for v in range(n):
        members[node_of[v]].append(v)
    port_base = [0] * n
    most_ports = 0
    for ops in members:
        base = 0
        for v in ops:
            port_base[v] = base
            base += len(graph.output_bytes[v])
        most_ports = max(most_ports, base)

    # Received copies the dropped edges would have cost: one per (tensor, node).
    extra = [0] * m
    kept: list[int] = []
    edge_src, edge_dst, edge_port = graph.edge_src, graph.edge_dst, graph.edge_port
    if keep_edge is None:
        kept = [e for e in range(graph.num_edges) if node_of[edge_src[e]] != node_of[edge_dst[e]]]
    else:
        tensors = graph.tensors
        counted: set[tuple[int, int]] = set()
        for e in range(graph.num_edges):
            src, dst = node_of[edge_src[e]], node_of[edge_dst[e]]
            if src == dst:
                continue
            if keep_edge(e):
                kept.append(e)
            elif edge_port[e] != CONTROL_PORT:
                key = (tensors.edge_tensor[e], dst)
                if key not in counted:
                    counted.add(key)
                    extra[dst] += tensors.nbytes[tensors.edge_tensor[e]]

    first_node_of_group: dict[int, int] = {}
    for node, ops in enumerate(members):
        first_node_of_group.setdefault(graph.group[ops[0]], node)
    heads = [ops[0] for ops in members]

    def per_node(column: list, combine: Callable[[list], Any]) -> list:
        return [column[ops[0]] if len(ops) == 1 else combine([column[v] for v in ops]) for ops in members]

    def concat(lists: list) -> list:
        return [x for sub in lists for x in sub]

    persistent = per_node(graph.persistent_bytes, sum)
    # One edge per (src, port, dst) of nodes, as the int (src * stride + port + 1) * m + dst:
    # ints hash several times faster than tuples on 1M-edge graphs. A node's ports run
    # from CONTROL_PORT to below most_ports + the largest op port an edge names.
    stride = most_ports + max(edge_port, default=0) + 2
    seen: set[int] = set()
    new_src: list[int] = []
    new_port: list[int] = []
    new_dst: list[int] = []
    new_bytes: list[int] = []
    new_transfer: list[float | None] = []
    out_edges: list[list[int]] = [[] for _ in range(m)]
    in_edges: list[list[int]] = [[] for _ in range(m)]
    for e in kept:
        u, port = edge_src[e], edge_port[e]
        src, dst = node_of[u], node_of[edge_dst[e]]
        p = CONTROL_PORT if port == CONTROL_PORT else port_base[u] + port
        key = (src * stride + p + 1) * m + dst
        if key in seen:
            continue
        seen.add(key)
        k = len(new_src)  # one int object for both lists (two would cost 28 bytes more per edge)
        out_edges[src].append(k)
        in_edges[dst].append(k)
        new_src.append(src)
        new_port.append(p)
        new_dst.append(dst)
        new_bytes.append(graph.edge_bytes[e])
        new_transfer.append(graph.edge_transfer_us[e])
    output_bytes = per_node(graph.output_bytes, concat)
    view_of = _views(graph, members, node_of, port_base, output_bytes) if graph.view_of else {}
    original = graph.members
    return OpGraph(
        names=[graph.names[v] for v in heads],
        op_types=[graph.op_types[ops[0]] if len(ops) == 1 else "Fused" for ops in members],
        output_bytes=output_bytes,
        compute_us=per_node(graph.compute_us, sum),
        persistent_bytes=[b + x for b, x in zip(persistent, extra)] if any(extra) else persistent,
        temporary_bytes=per_node(graph.temporary_bytes, max),
        group=[first_node_of_group[graph.group[v]] for v in heads],
        is_backward=per_node(graph.is_backward, all),
        forward_op=[-1] * m,
        output_shapes=per_node(graph.output_shapes, concat),
        output_dtypes=per_node(graph.output_dtypes, concat),
        attrs=[{} for _ in range(m)],
        colocate_with=[() for _ in range(m)],
        edge_src=new_src,
        edge_port=new_port,
        edge_dst=new_dst,
        edge_bytes=new_bytes,
        edge_transfer_us=new_transfer,
        out_edges=out_edges,
        in_edges=in_edges,
        compute_us_by_kind={k: per_node(times, sum) for k, times in graph.compute_us_by_kind.items()},
        members=members
        if original is None
        else [sorted(concat([original[v] for v in ops])) for ops in members],
        view_of=view_of,
        held_outputs=frozenset((node_of[v], port_base[v] + p) for v, p in graph.held_outputs),
        # A hold until an op of the producer's own node ends is the node's: it holds its tensors.
        scope_holds=tuple(
            sorted(
                {
                    (node_of[v], port_base[v] + p, node_of[w])
                    for v, p, w in graph.scope_holds
                    if node_of[w] != node_of[v]
                }
            )
        ),
    )


def _views(
    graph: OpGraph,
    members: list[list[int]],
    node_of: Sequence[int],
    port_base: list[int],
    output_bytes: list[list[int]],
) -> dict[int, tuple[int, int]]:
    """The node graph's views; zeroes ``output_bytes`` of ports whose storage a view inside the node counts.

    A node that is one view op views its source's node port (or resident
    storage). Inside a bigger node, a view of resident storage allocates
    nothing, and a view of a member's port that only the node reads takes
    over that port's storage: the port counts no bytes and the view's ports
    keep theirs, so the storage lives until the view's readers are done.
    """
    view_of: dict[int, tuple[int, int]] = {}
    read_outside: set[tuple[int, int]] = set()
    for e in range(graph.num_edges):
        u = graph.edge_src[e]
        if node_of[u] != node_of[graph.edge_dst[e]]:
            read_outside.add((u, graph.edge_port[e]))
    for v, (src, port) in graph.view_of.items():
        node = node_of[v]
        if len(members[node]) == 1:
            view_of[node] = (-1, 0) if src < 0 else (node_of[src], port_base[src] + port)
        elif src < 0:
            for p in range(len(graph.output_bytes[v])):
                output_bytes[node][port_base[v] + p] = 0
        elif node_of[src] == node and (src, port) not in read_outside:
            output_bytes[node][port_base[src] + port] = 0
    return view_of


def node_index(graph: OpGraph, num_original_ops: int) -> list[int]:
    """For a contracted ``graph``: the node of every original op (identity when not contracted)."""
    if graph.members is None:
        return list(range(num_original_ops))
    node_of = [-1] * num_original_ops
    for node, ops in enumerate(graph.members):
        for v in ops:
            node_of[v] = node
    return node_of


def placement_of(graph: OpGraph, device_of_node: Sequence[int], num_original_ops: int) -> list[int]:
    """Expand a placement of ``graph``'s nodes onto the original ops."""
    return [device_of_node[node] for node in node_index(graph, num_original_ops)]


def sequence_of(graph: OpGraph, sequence: Sequence[int], original: OpGraph) -> list[int]:
    """Expand a node list schedule onto the original ops: members in topological order.

    Valid (every op after its producers) when ``graph`` is a pure contraction
    of ``original`` — no dropped edges — because the node sequence is then
    topological in the node graph.
    """
    if graph.members is None:
        return list(sequence)
    rank = [0] * original.num_ops
    for i, v in enumerate(original.topo_order()):
        rank[v] = i
    return [v for node in sequence for v in sorted(graph.members[node], key=rank.__getitem__)]


def groups_of(graph: OpGraph, original: OpGraph) -> list[int]:
    """The original ops' colocation groups implied by a contracted graph's node groups."""
    if graph.members is None:
        return list(graph.group)
    uf = UnionFind(original.group)
    for node, ops in enumerate(graph.members):
        anchor = graph.members[graph.group[node]][0]
        for v in ops:
            uf.union(anchor, v)
    return uf.roots()
