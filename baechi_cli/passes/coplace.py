"""Co-placement: put ops together that gain nothing from being apart.

Two rules from Baechi, applied by merging colocation groups:
1. *forward/backward pairs*: a backward op joins its forward op's group (it reads the forward
   op's inputs and activations; apart, they would travel);
2. *single-consumer chains*: an op whose outputs all go to one op joins that op's group (a split
   there only adds a transfer). Where branches join, only one may join the consumer (merging
   every branch of an Inception module into its concat would run them one after another): a
   consumer takes each single-consumer producer that is *shallow* (at most one hop from a
   source: variables, their reads, constants, inputs) and, of the others, the most compute.

Merging is bounded: two groups merge only while the result stays within ``max_group_bytes`` (a
placer needs groups small enough to pack onto devices; the pipeline allows 1/256 of the model's
memory per device); groups already over it are left as they are. Ops are visited in topological
order, pairs first, so the result is deterministic. Groups only ever merge, so every colocation
constraint still holds. Complexity: O(V + E) plus near-constant union-find steps.

Example:
    >>> from baechi_cli.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.add_op("x", "Conv2D", [100])
    >>> y = b.add_op("y", "BiasAdd", [100])
    >>> z = b.add_op("z", "Relu", [100])
    >>> w = b.add_op("w", "Relu", [100])
    >>> for s, d in ((x, y), (y, z), (y, w)):
    ...     _ = b.add_edge(s, d)
    >>> coplace(b.build(), max_group_bytes=1000).group
    [0, 0, 2, 3]
    >>> coplace(b.build(), max_group_bytes=150).group
    [0, 1, 2, 3]

Branches ``p -> q -> s`` and ``p -> r -> s`` join at ``s``: only ``r``, with more compute, joins it.

    >>> b = GraphBuilder()
    >>> x, p, q, r, s = (b.add_op(n, "Relu", [10], compute_us=c) for n, c in zip("xpqrs", (1, 1, 2, 3, 1)))
    >>> for src, dst in ((x, p), (p, q), (p, r), (q, s), (r, s)):
    ...     _ = b.add_edge(src, dst)
    >>> coplace(b.build(), max_group_bytes=1000).group
    [0, 0, 2, 3, 3]
"""

from __future__ import annotations

from baechi_cli.core.graph import OpGraph, own_bytes
from baechi_cli.core.unionfind import UnionFind


def coplace(graph: OpGraph, *, max_group_bytes: int) -> OpGraph:
    """Return ``graph`` with co-placement groups merged into ``group`` (module docstring)."""
    uf = UnionFind(graph.group)
    group_bytes = [0] * graph.num_ops
    for v, nbytes in enumerate(own_bytes(graph)):
        group_bytes[graph.group[v]] += nbytes

    def merge(a: int, b: int) -> None:
        ra, rb = uf.find(a), uf.find(b)
        if ra != rb and group_bytes[ra] + group_bytes[rb] <= max_group_bytes:
            uf.union(ra, rb)
            group_bytes[uf.find(ra)] = group_bytes[ra] + group_bytes[rb]

    order = graph.topo_order()
    for v in order:
        f = graph.forward_op[v]
        if f >= 0:
            merge(f, v)
    src, in_edges, compute_us = graph.edge_src, graph.in_edges, graph.compute_us
    depth = [0] * graph.num_ops  # longest path from a source, in edges
    for v in order:
        for e in in_edges[v]:
            if depth[src[e]] >= depth[v]:
                depth[v] = depth[src[e]] + 1
    # The one op all of v's edges go to: -1 without edges, -2 with several consumers.
    consumer = [-1] * graph.num_ops
    for u, w in zip(src, graph.edge_dst):
        if consumer[u] == -1:
            consumer[u] = w
        elif consumer[u] != w:
            consumer[u] = -2
    for w in order:
        deep = -1
        # A producer read twice is looked at twice, to no effect: merged already, or
        # not heavier than the heaviest so far.
        for e in in_edges[w]:
            v = src[e]
            if consumer[v] != w:
                continue  # v has other consumers
            if depth[v] <= 1:
                merge(v, w)
            elif deep < 0 or compute_us[v] > compute_us[deep]:
                deep = v
        if deep >= 0:
            merge(deep, w)
    return graph.replace(group=uf.roots())
