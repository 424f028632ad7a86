"""Union-find over op ids, the way every grouping pass merges colocation groups.

The smaller root always wins, so group ids do not depend on the order of the
unions: a group's id is the smallest op id it contains whenever the initial
ids were (as ``OpGraph.group`` always is). Path halving; near-constant
amortised time per operation.

Example:
    >>> uf = UnionFind([0, 1, 2, 3])
    >>> uf.union(3, 1); uf.union(2, 3)
    True
    True
    >>> uf.roots()
    [0, 1, 1, 1]
"""

from __future__ import annotations

from collections.abc import Sequence


class UnionFind:
    """Disjoint sets of ``0..n-1`` starting from a parent array (e.g. ``OpGraph.group``)."""

    def __init__(self, parent: Sequence[int]) -> None:
        self.parent = list(parent)

    def find(self, v: int) -> int:
        parent = self.parent
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    def union(self, a: int, b: int) -> bool:
        """Merge the sets of ``a`` and ``b``; False when they were one already."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        if ra < rb:
            self.parent[rb] = ra
        else:
            self.parent[ra] = rb
        return True

    def roots(self) -> list[int]:
        """The root of every element."""
        return [self.find(v) for v in range(len(self.parent))]
