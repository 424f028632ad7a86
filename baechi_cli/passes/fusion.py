"""Operator fusion: contract directly connected ops of one group into one node.

Ops of one colocation (or co-placement) group land on one device anyway; fusing the connected
ones shrinks the graph a placer works on (m-SCT's LP, above all) without taking any choice away.

Contracting an edge ``U -> V`` creates a cycle exactly when another path leads from U to V.
Looking for such paths is expensive, so the pass uses Baechi's conservative test: contract only
when V is U's only successor, or U is V's only predecessor, so no other path can exist. The test
looks at the current, partly fused graph, so chains of any length collapse and the result is
acyclic by construction; it may miss safe contractions, never makes an unsafe one.

A fused node starts when all its inputs are there and hands its outputs on when it ends, so a
careless fusion makes work wait (a branch fused into its concat waits for every other branch:
Inception-V3's modules would run their branches one by one). Of the safe contractions the pass
makes only those that delay nothing but tiny amounts: a chain link (V is U's only successor and
U is V's only predecessor); a source into its only consumer (a variable, a constant); a sink into
its only producer.

Edges are visited in topological order of their sources, repeatedly until a sweep fuses nothing,
so the result is deterministic. Each merge costs the smaller neighbour set (small into large):
O((V + E) log V) per sweep, and a sweep enables at most a few more.

Example: a chain in one group fuses whole.

    >>> from baechi_cli.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> for name in "abc":
    ...     _ = b.add_op(name, "Relu", [4])
    >>> _ = b.add_edge(0, 1); _ = b.add_edge(1, 2)
    >>> fuse(b.build().replace(group=[0, 0, 0])).members
    [[0, 1, 2]]

Add ``a -> c``: fusing ``a`` with ``c`` would close the cycle ``ac -> b -> ac``; ``a -> b`` or
``b -> c`` would not, but would hold ``c`` (or ``b``) until the other ends, so nothing fuses.

    >>> _ = b.add_edge(0, 2)
    >>> g = b.build().replace(group=[0, 0, 0])
    >>> fuse(g) is g
    True
"""

from __future__ import annotations

from baechi_cli.core.graph import OpGraph
from baechi_cli.core.unionfind import UnionFind
from baechi_cli.passes.contract import contract


def fuse(graph: OpGraph) -> OpGraph:
    """Return the graph with same-group neighbours fused (module docstring); ``graph`` if none are."""
    n = graph.num_ops
    group, src, dst = graph.group, graph.edge_src, graph.edge_dst
    candidates = [e for v in graph.topo_order() for e in graph.out_edges[v] if group[v] == group[dst[e]]]
    if not candidates:
        return graph
    uf = UnionFind(range(n))
    # Neighbour sets, made on first use: only the ends of candidate edges need one,
    # and a set per op of a 1M-op graph would cost hundreds of MB.
    succ: list[set[int] | None] = [None] * n
    pred: list[set[int] | None] = [None] * n
    out_edges, in_edges = graph.out_edges, graph.in_edges

    def current(successors: bool, node: int) -> set[int]:
        """``node``'s successor (else predecessor) set in terms of current roots (stored back:
        later calls are cheap)."""
        sets = succ if successors else pred
        neighbours = sets[node]
        if neighbours is None:  # an op not merged yet: its own edges
            if successors:
                neighbours = {dst[e] for e in out_edges[node] if dst[e] != node}
            else:
                neighbours = {src[e] for e in in_edges[node] if src[e] != node}
            sets[node] = neighbours
        parent = uf.parent
        for x in neighbours:
            if parent[x] != x:
                break
        else:  # every neighbour is a root still
            return neighbours
        fresh = {uf.find(x) for x in neighbours}
        fresh.discard(node)
        neighbours.clear()
        neighbours.update(fresh)
        return neighbours

    def merged(a: set[int], b: set[int], drop: tuple[int, int]) -> set[int]:
        big, small = (a, b) if len(a) >= len(b) else (b, a)
        big |= small
        big.difference_update(drop)
        return big

    fused_any = False
    changed = True
    while changed:
        changed = False
        for e in candidates:
            u, v = uf.find(src[e]), uf.find(dst[e])
            if u == v:
                continue
            su, pv = current(True, u), current(False, v)
            if len(su) != 1 and len(pv) != 1:
                continue
            pu, sv = current(False, u), current(True, v)
            if not ((len(su) == 1 and (len(pv) == 1 or not pu)) or (len(pv) == 1 and not sv)):
                continue  # safe, but it would make one of them wait (module docstring)
            uf.union(u, v)
            root = uf.find(u)
            succ[root] = merged(su, sv, (u, v))
            pred[root] = merged(pu, pv, (u, v))
            changed = fused_any = True
    if not fused_any:
        return graph
    succ.clear()  # before the node graph is built beside them
    pred.clear()
    roots = uf.roots()
    node_id: dict[int, int] = {}
    return contract(graph, [node_id.setdefault(r, len(node_id)) for r in roots])
