"""Forward-operator-based placement: place the forward ops; backward ops follow them.

A training graph has about twice as many backward ops as forward ones, and a backward op runs
best beside its forward op (it reads that op's inputs and activations). Baechi therefore places
only the forward ops and sends every backward op to its forward op's device.

:func:`forward_only` contracts each forward op with the backward ops that
follow it into one node and keeps only the edges between forward ops. A
backward op follows, in order of preference:

1. its forward op (``forward_op``, from gradient name scopes or the workload);
2. the lowest-id forward op of its colocation group (so groups stay whole);
3. the op that its first producer follows (a gradient aggregation follows what it sums);
4. the op that its first consumer follows (for sources such as gradient shape constants);
5. itself, when it touches no forward op at all (then it stays a node).

Its colocation group merges with the group of the op it follows. A node's compute is its
members' total, so the placers balance the whole step; its memory counts every member and one
received copy of each outside tensor a backward member reads
(:func:`~baechi_cli.passes.contract.contract`), so the placement stays feasible when expanded.
That bound is loose, so the pass is on by default only when every device could hold the whole
model (the peak of a one-device run), the paper's condition.

Complexity: O(V + E) plus the contraction.

Example:
    >>> from baechi_cli.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.add_op("x", "MatMul", [100], compute_us=4.0)
    >>> y = b.add_op("y", "Relu", [100], compute_us=1.0)
    >>> dy = b.add_op("gradients/y_grad/ReluGrad", "ReluGrad", [100], compute_us=1.0,
    ...               is_backward=True, forward_op=y)
    >>> dx = b.add_op("gradients/x_grad/MatMul", "MatMul", [100], compute_us=8.0,
    ...               is_backward=True, forward_op=x)
    >>> for s, d in ((x, y), (y, dy), (dy, dx)):
    ...     _ = b.add_edge(s, d)
    >>> g = forward_only(b.build())
    >>> g.names, g.compute_us, g.members, g.edge_dst
    (['x', 'y'], [12.0, 2.0], [[0, 3], [1, 2]], [1])
"""

from __future__ import annotations

from baechi_cli.core.graph import OpGraph
from baechi_cli.core.unionfind import UnionFind
from baechi_cli.passes.contract import contract


def forward_only(graph: OpGraph) -> OpGraph:
    """Contract every backward op into the forward op it follows (module docstring)."""
    n = graph.num_ops
    backward = graph.is_backward
    if not any(backward):
        return graph
    first_forward_of_group: dict[int, int] = {}
    for v in range(n):
        if not backward[v]:
            first_forward_of_group.setdefault(graph.group[v], v)
    follows = [v if not backward[v] else -1 for v in range(n)]
    order = graph.topo_order()
    for v in order:
        if follows[v] >= 0:
            continue
        f = graph.forward_op[v]
        if f < 0 or backward[f]:
            f = first_forward_of_group.get(graph.group[v], -1)
        if f < 0:
            f = next(
                (follows[graph.edge_src[e]] for e in graph.in_edges[v] if follows[graph.edge_src[e]] >= 0), -1
            )
        follows[v] = f
    for v in reversed(order):
        if follows[v] < 0:
            follows[v] = next(
                (follows[graph.edge_dst[e]] for e in graph.out_edges[v] if follows[graph.edge_dst[e]] >= 0), v
            )
    uf = UnionFind(graph.group)
    for v in range(n):
        uf.union(v, follows[v])
    heads = [v for v in range(n) if follows[v] == v]
    node_id = {v: i for i, v in enumerate(heads)}
    node_of = [node_id[follows[v]] for v in range(n)]
    is_head = [follows[v] == v for v in range(n)]
    src, dst = graph.edge_src, graph.edge_dst
    return contract(
        graph.replace(group=uf.roots()),
        node_of,
        keep_edge=lambda e: is_head[src[e]] and is_head[dst[e]],
    )
