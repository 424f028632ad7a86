"""The clusters of units a refinement moves together, and the tensors crossing their edges.

:class:`Clusters` lists, deduplicated (the first to hold a set of units names it):

* ``unit``: each unit alone, the first ``len(units)`` clusters, in unit order;
* ``scope``: the units with an op under a name-scope prefix (:func:`scope_keys`), at every depth,
  and the same with one numbered level wildcarded (``decoder/step*/softmax``: one module across
  all time steps);
* ``scope+``: a scope *closed*: joined, repeatedly, by every outside unit that exchanges more
  transfer time with it than with the rest (a layer's weights, its gradient sum, its optimizer
  update). Closing is done on demand, biggest scopes first (:meth:`Clusters.close_scopes`);
* ``split``: pipeline splits, ranges of 1/2 to 1/:data:`MAX_SPLIT` of the compute along a
  topological order of the units, plain and with each backward op at its forward op's position,
  and every suffix from a multiple of 1/:data:`CUT_STEPS` on.

A cluster's *boundary* (the tensors crossing its edge) is computed on first use: by a Python loop,
or, for a big cluster, in numpy straight into the flat form its transfers are summed from
(:meth:`Clusters.boundary_flat`); both list the same tensors in the same order.

Complexity: O(V + E) per scope depth to build; closing a scope O(the degrees of the units it
visits); a boundary O(its units' tensors), in numpy O(P) over the graph's (tensor, consumer) pairs.
"""

from __future__ import annotations

import functools
import re
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from baechi_cli.core.graph import OpGraph
from baechi_cli.search.refine.units import Units

# Pipeline splits: ranges of 1/2, 1/4, ... of the compute down to 1/MAX_SPLIT,
# and suffixes from multiples of 1/CUT_STEPS on.
MAX_SPLIT = 16
CUT_STEPS = 16
# A cluster's boundary is found in numpy, straight into the flat form its transfers are summed
# from, when its units' tensors (made and used) number more than this: below it a Python loop
# is cheaper than the numpy steps' fixed cost.
VECTOR_BOUNDARY = 1000

_GRADIENT_SCOPE = re.compile(r"gradients(_\d+)?")
_DIGITS = re.compile(r"\d+")

# A boundary: (tensor, made inside?, outside units: the consumers, after the producer when it
# is made outside).
Boundary = list[tuple[int, bool, list[int]]]
# A boundary flat: per outside unit its tensor's index in the boundary, the outside units, and
# each tensor's µs and made-inside flag.
FlatBoundary = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass
class Cluster:
    """Units that move together, with what ranking their moves needs (fixed for the whole search)."""

    kind: str  # unit | scope | scope+ | split
    label: str  # the scope, the range of the order, the unit's first op
    units: tuple[int, ...]
    comp: list[float]  # per device kind (Units.kind_of): the units' compute on it
    # Tensors crossing the cluster's edge. A big cluster's is only flat.
    boundary: Boundary | None = None
    # For big clusters, in numpy (made on first use): the units, and the boundary flat.
    units_array: np.ndarray | None = None
    flat: FlatBoundary | None = None


def scope_keys(name: str, levels: dict[tuple[str, ...], list[str]] | None = None) -> list[str]:
    """The scopes an op's name lies under, with one numbered level wildcarded in turn.

    ``gradients/`` (TensorFlow's backward scope) is stripped, so a gradient op
    shares its forward op's scopes. ``a/step3/b/MatMul`` gives ``a``,
    ``a/step3``, ``a/step*``, ``a/step3/b``, ``a/step*/b`` and ``a/step3/b``
    with ``b`` unchanged (it has no digits).

        >>> scope_keys("gradients/dec/step3/softmax/MatMul_grad/MatMul")
        ['dec', 'dec/step3', 'dec/step*', 'dec/step3/softmax', 'dec/step*/softmax', 'dec/step3/softmax/MatMul_grad', 'dec/step*/softmax/MatMul_grad']
        >>> scope_keys("/encoder/layer.0/attention/MatMul")
        ['encoder', 'encoder/layer.0', 'encoder/layer.*', 'encoder/layer.0/attention', 'encoder/layer.*/attention']

    ``levels``, when given, remembers each depth's keys by the scope down to it:
    names that share a scope's prefix (every op of a layer, every layer of a
    network) build its keys once.
    """
    parts = [p for p in name.split("/") if p]
    while parts and _GRADIENT_SCOPE.fullmatch(parts[0]):
        parts = parts[1:]
    scope = tuple(parts[:-1])
    if levels is None:
        levels = {}
    keys: list[str] = []
    level: list[str] = []  # the keys of the scope one level up
    for depth in range(1, len(scope) + 1):
        prefix = scope[:depth]
        known = levels.get(prefix)
        if known is None:
            # The parent's keys, each extended by this part, then the parent with this
            # part wildcarded: O(keys) per new scope, not O(depth^2).
            part = prefix[-1]
            wild = _wildcard(part)
            known = [f"{key}/{part}" for key in level] if level else [part]
            if wild != part:
                known.append(f"{level[0]}/{wild}" if level else wild)
            levels[prefix] = known
        level = known
        keys.extend(level)
    return keys


@functools.lru_cache(maxsize=1 << 16)
def _wildcard(part: str) -> str:
    """A name part with each run of digits replaced by ``*`` (``layer.12`` -> ``layer.*``)."""
    return _DIGITS.sub("*", part)


class Clusters:
    """The clusters of ``graph``'s units (module docstring), ``rank`` its ops' topological ranks.

    :attr:`clusters` only grows (closing a scope appends); a cluster's index in it is stable.
    """

    def __init__(self, graph: OpGraph, units: Units, rank: Sequence[int]) -> None:
        self.units = units
        self.clusters: list[Cluster] = []
        self.found: dict[tuple[int, ...], None] = {}  # the units of every cluster in it
        self.unclosed: list[tuple[str, tuple[int, ...], float]] = []  # scopes: (label, units, compute)
        self.closed_down_to = float("inf")  # every scope holding at least this much compute is closed
        self._build(graph, rank)

    def __getitem__(self, i: int) -> Cluster:
        return self.clusters[i]

    def _add(self, kind: str, label: str, key: tuple[int, ...], comp: list[float] | None = None) -> None:
        """Append a cluster of more than one unit and fewer than all, unless one holds those units
        (``comp``: its compute per kind, when the caller summed it)."""
        if 1 < len(key) < len(self.units.unit_ops) and key not in self.found:
            self.found[key] = None
            if comp is None:
                comp = [sum(map(c.__getitem__, key)) for c in self.units.kind_columns]
            self.clusters.append(Cluster(kind, label, key, comp))

    def close_scopes(self, least: float) -> None:
        """Close the scopes that hold at least ``least`` µs of compute (on device 0's kind), not
        closed yet.

        Closing every scope up front takes most of the search's setup, while a coarse pass
        ranks only the big ones (bench/history/placement.md).
        """
        if least >= self.closed_down_to:
            return  # every scope this big is closed already
        self.closed_down_to = least
        waiting = []
        for label, units, comp in self.unclosed:
            if comp < least:
                waiting.append((label, units, comp))
                continue
            members = self._close(units)
            if len(members) > len(units):
                self._add("scope+", label + " (closed)", tuple(sorted(members)))
        self.unclosed = waiting

    def _build(self, g: OpGraph, rank: Sequence[int]) -> None:
        """Units, name-scope clusters and pipeline splits, deduplicated; each scope closed later,
        when a pass first ranks clusters of its size (:meth:`close_scopes`)."""
        units_ = self.units
        nunits = len(units_.unit_ops)
        add = self._add

        for u, ops in enumerate(units_.unit_ops):
            comp = [c[u] for c in units_.kind_columns]
            self.clusters.append(Cluster("unit", g.names[ops[0]], (u,), comp))

        # The units under each scope head (a name less its last part), heads in order of first op:
        # the ops of one head share their scopes, so each head's keys are computed once.
        heads: dict[str, tuple[str, dict[int, None]]] = {}  # head -> (its first op's name, units)
        for name, u in zip(g.names, units_.unit_of):
            head = name.rpartition("/")[0]
            under = heads.get(head)
            if under is None:
                heads[head] = (name, {u: None})
            else:
                under[1][u] = None
        scopes: dict[str, dict[int, None]] = {}  # in order of first op, as the keys of each first appear
        levels: dict[tuple[str, ...], list[str]] = {}
        for name, units in heads.values():
            for key in scope_keys(name, levels):
                into = scopes.get(key)
                if into is None:
                    scopes[key] = dict(units)
                else:
                    into.update(units)
        distinct: dict[tuple[int, ...], str] = {}  # many scopes hold the same units: the first names them
        for key, units in scopes.items():
            distinct.setdefault(tuple(sorted(units)), key)
        first_kind = units_.kind_of[0]  # device 0's, whose column weighs the scopes
        for units, label in distinct.items():
            comp = [sum(map(c.__getitem__, units)) for c in units_.kind_columns]
            add("scope", label, units, comp)
            self.unclosed.append((label, units, comp[first_kind]))

        # Pipeline splits over a topological order of the units; a backward op counts at
        # its forward op's position, so a split takes a layer's backward pass along.
        pos_plain = [g.num_ops] * nunits
        pos_fwd = [g.num_ops] * nunits
        for v in range(g.num_ops):
            u = units_.unit_of[v]
            pos_plain[u] = min(pos_plain[u], rank[v])
            f = g.forward_op[v]
            pos_fwd[u] = min(pos_fwd[u], rank[f] if f >= 0 else rank[v])
        weight = units_.comp[0]
        total = sum(weight) or 1.0
        for name, pos in (("forward order", pos_fwd), ("topological order", pos_plain)):
            order = sorted(range(nunits), key=lambda u: (pos[u], u))
            cum: list[float] = []  # the share of compute before each unit of the order
            acc = 0.0
            for u in order:
                cum.append(acc / total)
                acc += weight[u]

            def span(
                lo: float, hi: float, order: list[int] = order, cum: list[float] = cum
            ) -> tuple[int, ...]:
                return tuple(sorted(order[bisect_left(cum, lo) : bisect_left(cum, hi)]))

            k = 2
            while k <= MAX_SPLIT and k <= nunits:
                for i in range(k):
                    add("split", f"{name} {i + 1}/{k}", span(i / k, (i + 1) / k if i + 1 < k else 2.0))
                k *= 2
            if pos is pos_fwd:  # pipeline cuts: everything after it goes elsewhere
                for j in range(1, CUT_STEPS):
                    add("split", f"{name} after {j}/{CUT_STEPS}", span(j / CUT_STEPS, 2.0))

    def _close(self, units: Sequence[int]) -> list[int]:
        """``units`` joined by every outside unit that exchanges more with them than with the rest,
        repeatedly. O(sum of the degrees of the units visited)."""
        adj, total = self.units.adj, self.units.adj_total
        inside = set(units)
        w_in: dict[int, float] = {}
        for x in units:
            for y, w in adj[x].items():
                if y not in inside:
                    w_in[y] = w_in.get(y, 0.0) + w
        members = list(units)
        queue = deque(sorted(w_in))
        while queue:
            y = queue.popleft()
            if y in inside or 2 * w_in[y] <= total[y]:
                continue
            inside.add(y)
            members.append(y)
            for z, w in adj[y].items():
                if z not in inside:
                    w_in[z] = w_in.get(z, 0.0) + w
                    queue.append(z)
        return members

    def find_boundary(self, cl: Cluster) -> None:
        """Fill ``cl``'s boundary on first use: flat, in numpy, for a big cluster
        (over :data:`VECTOR_BOUNDARY` tensors), else as a list."""
        if cl.flat is None and cl.boundary is None:
            if len(cl.units) > 1 and sum(map(self.units.degree.__getitem__, cl.units)) > VECTOR_BOUNDARY:
                cl.flat = self.boundary_flat(cl.units)
            else:
                cl.boundary = self.boundary(cl.units)

    def boundary(self, units: Sequence[int]) -> Boundary:
        """The tensors crossing the edge of ``units`` (:attr:`Cluster.boundary`)."""
        t_prod, t_cons = self.units.t_prod, self.units.t_cons
        made, used = self.units.made, self.units.used
        if len(units) == 1:
            (u,) = units
            return [(tid, True, t_cons[tid]) for tid in made[u]] + [
                (tid, False, [t_prod[tid], *(c for c in t_cons[tid] if c != u)]) for tid in used[u]
            ]
        inside = set(units)
        out: Boundary = []
        seen: set[int] = set()
        for u in units:
            for tid in made[u]:
                others = [c for c in t_cons[tid] if c not in inside]
                if others:
                    out.append((tid, True, others))
            for tid in used[u]:
                p = t_prod[tid]
                if p not in inside and tid not in seen:
                    seen.add(tid)
                    out.append((tid, False, [p, *(c for c in t_cons[tid] if c not in inside)]))
        return out

    def boundary_flat(self, units: Sequence[int]) -> FlatBoundary:
        """:meth:`boundary` of a big cluster as :attr:`Cluster.flat` holds it, built in numpy:
        O(P) steps over the P (tensor, consuming unit) pairs of the graph, no list in between.

        The tensors come in the loop's order: it visits the units in order, each one's
        tensors made (by id) before its tensors used, so a tensor made inside sorts by (its
        producer, 0, id), one made outside by (its first consumer inside, 1, id). Each
        tensor's outside units (its consumers there, and its producer when that is outside)
        are a set to the transfers summed from it, so their order is left as it falls.
        """
        tensor, consumer, producer = self.units.tensor_pairs()
        t_prod_array, t_len_array = self.units.t_prod_array, self.units.t_len_array
        inside = np.zeros(len(self.units.unit_ops), dtype=bool)
        inside[np.fromiter(units, dtype=np.int64, count=len(units))] = True
        made_in, used_in = inside[producer], inside[consumer]
        made = made_in & ~used_in  # a tensor made inside, read outside
        used = used_in & ~made_in  # one made outside, read inside
        unit = np.concatenate((producer[made], consumer[used]))
        flag = np.concatenate(
            (np.zeros(np.count_nonzero(made), np.int8), np.ones(np.count_nonzero(used), np.int8))
        )
        tid = np.concatenate((tensor[made], tensor[used]))
        ranked = np.lexsort((tid, flag, unit))
        # Each tensor once, at its first (least) key; then back in key order.
        _, first = np.unique(tid[ranked], return_index=True)
        ranked = ranked[np.sort(first)]
        tids, made_outside = tid[ranked], flag[ranked] == 1
        position = np.full(len(self.units.t_cons), -1, dtype=np.int64)
        position[tids] = np.arange(len(tids), dtype=np.int64)
        # The units outside reading each boundary tensor, and the producers outside.
        outside = ~used_in & (position[tensor] >= 0)
        index = np.concatenate((position[tensor[outside]], np.flatnonzero(made_outside)))
        units_outside = np.concatenate((consumer[outside], t_prod_array[tids[made_outside]]))
        return index, units_outside, t_len_array[tids], ~made_outside
