"""Lower bounds on the step time any placement can reach: what every plan's gap is measured against.

Four bounds, each valid for every placement the evaluator can judge that
keeps colocation groups whole (every placer's; TensorFlow requires it):

* the critical path: the longest chain of compute with communication free
  (each op at its fastest device kind);
* the work bound: total compute over the device count (each op at its
  fastest kind), since a device runs one op at a time;
* the transfer-cut bound (:func:`transfer_cut_bound`): a step shorter than
  M cannot afford to cut an edge whose path, with its cheapest transfer,
  is longer than M, so the ops those edges join share a device and queue
  there; the smallest M consistent with that;
* CP-SAT's proven bound (:mod:`baechi_cli.placers.exact`) when auto ran the
  exact solver on the op graph itself with no memory constraint (one on a
  fused graph, or with memory constraints, bounds only the plans that keep
  its nodes whole or meet them: reported, not counted).

The best is the largest. A plan's gap is ``step / best - 1``; a gap of 0 is
a proven optimum.

Complexity: O(V + E) for the first two, O(V + E log E) for the third.

Example:
    >>> from baechi_cli.core.graph import GraphBuilder
    >>> from baechi_cli.core.devices import parse_devices
    >>> b = GraphBuilder()
    >>> a = b.add_op("a", "A", [8], compute_us=10)
    >>> c = b.add_op("c", "C", [], compute_us=30)
    >>> d = b.add_op("d", "D", [], compute_us=20)
    >>> _ = b.add_edge(a, c); _ = b.add_edge(a, d)
    >>> lb = lower_bounds(b.build(), parse_devices("2x1GB"))
    >>> lb.critical_path_us, lb.work_us
    (40.0, 30.0)

Splitting a from c or d costs a 134 µs transfer, more than running all three
on one device (60 µs), so that is the bound:

    >>> lb.transfer_cut_us, lb.best_us, lb.best_source
    (60.0, 60.0, 'transfer cuts')
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.graph import OpGraph

# A step within this relative distance of the best bound meets it (LowerBounds.gap).
ROUNDING = 1e-9


@dataclass
class LowerBounds:
    """The lower bounds known for one model on one device set (µs)."""

    critical_path_us: float
    work_us: float
    transfer_cut_us: float = 0.0  # :func:`transfer_cut_bound`
    exact_us: float | None = None  # CP-SAT's bound, when it bounds every plan
    # CP-SAT's bound on a fused graph or under memory constraints: reported, not counted.
    exact_restricted_us: float | None = None
    exact_scope: str | None = None  # what the exact bound was proven on

    def _by_source(self) -> list[tuple[float, str]]:
        # In order of preference on a tie: the simplest argument first.
        return [
            (self.critical_path_us, "critical path"),
            (self.work_us, "work / devices"),
            (self.transfer_cut_us, "transfer cuts"),
            (self.exact_us or 0.0, "exact"),
        ]

    @property
    def best_us(self) -> float:
        return max(value for value, _ in self._by_source())

    @property
    def best_source(self) -> str:
        """Which bound is the best: ``critical path``, ``work / devices``, ``transfer cuts`` or ``exact``."""
        best = self.best_us
        return next(source for value, source in self._by_source() if value == best)

    def gap(self, step_us: float) -> float | None:
        """``step / best - 1`` (None when the bound is 0: an empty graph); 0 within :data:`ROUNDING`.

        The bounds are sums in another order than the simulator's, so a step that meets its
        bound can read a rounding below it (keras_cnn's training step: 2.2e-16): that is 0,
        a proven optimum, not a negative gap.
        """
        best = self.best_us
        if best <= 0:
            return None
        gap = step_us / best - 1
        return 0.0 if abs(gap) <= ROUNDING else gap

    def to_json(self) -> dict[str, Any]:
        return {
            "best_us": self.best_us,
            "best": self.best_source,
            "critical_path_us": self.critical_path_us,
            "work_per_device_us": self.work_us,
            "transfer_cut_us": self.transfer_cut_us,
            "exact_us": self.exact_us,
            "exact_restricted_us": self.exact_restricted_us,
            "exact_scope": self.exact_scope,
        }


def fastest_durations(graph: OpGraph, devices: DeviceSpec) -> list[float]:
    """Each op's compute time on the fastest device kind of ``devices``. O(V x kinds)."""
    kinds = sorted({d.kind for d in devices.devices})
    columns = [graph.durations(k) for k in kinds]
    if len(columns) == 1:
        return columns[0]
    return [min(c[v] for c in columns) for v in range(graph.num_ops)]


def lower_bounds(graph: OpGraph, devices: DeviceSpec) -> LowerBounds:
    """The critical path, work and transfer-cut bounds of ``graph`` on ``devices`` (module docstring).

    O(V + E log E).
    """
    fastest = fastest_durations(graph, devices)
    topo = graph.topo_order()
    head = _longest_paths(topo, graph.in_edges, graph.edge_src, fastest)
    tail = _longest_paths(topo[::-1], graph.out_edges, graph.edge_dst, fastest)
    critical_path = max(map(sum, zip(head, fastest, tail)), default=0.0)
    work = sum(fastest) / devices.count
    cut = transfer_cut_bound(graph, devices, fastest, head, tail) if devices.count > 1 else critical_path
    return LowerBounds(critical_path, work, cut)


def _longest_paths(
    order: Sequence[int], edges: list[list[int]], other: list[int], times: list[float]
) -> list[float]:
    """Per op, the longest chain of ``times`` through the ops ``edges`` lead to (``other`` end), in ``order``.

    With in-edges and sources: when each op can start at the earliest; with
    out-edges, the reverse order and destinations: how much must follow its end.
    """
    longest = [0.0] * len(times)
    for v in order:
        best = 0.0
        for e in edges[v]:
            u = other[e]
            t = longest[u] + times[u]
            if t > best:
                best = t
        longest[v] = best
    return longest


def transfer_cut_bound(
    graph: OpGraph,
    devices: DeviceSpec,
    fastest: list[float],
    head: list[float],
    tail: list[float],
) -> float:
    """A lower bound on the step time that charges transfers: the smallest M no argument below rules out.

    ``head[v]``: the longest compute chain before v can start; ``tail[v]``:
    the longest after it ends (``fastest`` times, communication free).

    The argument. An edge u -> v placed across devices makes v wait for the
    tensor's copy, at least its cheapest transfer c (a measured time, else
    the smallest latency plus bytes over the largest bandwidth), so a plan
    that cuts it takes at least ``cut(e) = head[u] + t(u) + c + t(v) +
    tail[v]``. A plan with step time M therefore keeps every edge with
    ``cut(e) > M`` on one device: the clusters those edges (and colocation
    groups) join each run on one device, one op at a time, so M is at least
    any such cluster's ``min head + work + min tail``. Call the largest of
    those F(M). It grows as M falls (more edges are forced), and every plan
    has ``M >= F(M)``; the bound is the smallest M that satisfies it.

    Computed by adding the forced edges in falling ``cut`` order (union-find)
    and stopping at the first M the clusters rule out. A cluster's bound is
    kept as the largest over the clusters merged into it: each of them still
    runs on one device, and the smaller one may start later or end earlier.
    Colocation groups join their ops from the start, which loses those
    sub-clusters, so with groups the walk runs twice, with and without them,
    and the larger result counts. Never below the critical path.

    Complexity: O(V + E log E); the walk visits only edges whose cut is
    above the bound it returns; the two longest-path sweeps dominate.
    """
    n = graph.num_ops
    if n == 0:
        return 0.0
    ic = devices.interconnect
    links = [(ic.latency_us, ic.bandwidth_bytes_per_us), *ic.links.values()]
    latency = min(lat for lat, _ in links)
    bandwidth = max(bw for _, bw in links)
    tensors = graph.tensors
    with np.errstate(over="ignore"):
        copy = np.array(tensors.nbytes, dtype=np.float64) / bandwidth + latency
    measured = [t for t, m in enumerate(tensors.measured_us) if m is not None]
    if measured:
        copy[measured] = [tensors.measured_us[t] for t in measured]
    src = np.asarray(graph.edge_src, dtype=np.int64)
    dst = np.asarray(graph.edge_dst, dtype=np.int64)
    reach = np.asarray(head) + np.asarray(fastest)  # earliest end
    rest = np.asarray(fastest) + np.asarray(tail)  # from the earliest start to the end
    cut = reach[src] + copy[np.asarray(tensors.edge_tensor, dtype=np.int64)] + rest[dst]
    # The walk stops before it reaches a cut at or below the critical path (it never gets
    # below its clusters' bound): only the edges above it are sorted.
    critical_path = float((reach + np.asarray(tail)).max())
    above = np.flatnonzero(cut > critical_path)
    order = above[np.argsort(-cut[above], kind="stable")]
    edges = (cut[order].tolist(), src[order].tolist(), dst[order].tolist())
    # Colocation groups as pairs of ops to join: each member with the next of its group.
    group = np.asarray(graph.group, dtype=np.int64)
    members = np.argsort(group, kind="stable")
    same = group[members[1:]] == group[members[:-1]]
    joined = (members[:-1][same].tolist(), members[1:][same].tolist())
    bound = _smallest_consistent(fastest, head, tail, critical_path, edges, ([], []))
    if joined[0]:
        bound = max(bound, _smallest_consistent(fastest, head, tail, critical_path, edges, joined))
    return bound


def _smallest_consistent(
    times: list[float],
    head: list[float],
    tail: list[float],
    critical_path: float,
    edges: tuple[list[float], list[int], list[int]],
    joined: tuple[list[int], list[int]],
) -> float:
    """:func:`transfer_cut_bound`'s walk: edges as (cut, src, dst) columns in falling cut order;
    ``joined``: pairs of ops (two columns) that share a device in every plan. ``critical_path``:
    the largest ``head + time + tail``, every op's bound as a cluster of its own."""
    parent = list(range(len(times)))
    work = list(times)
    first = list(head)  # a cluster's earliest start
    after = list(tail)  # and the least that must follow it
    cluster_bound = critical_path

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = x = parent[parent[x]]
        return x

    def union(a: int, b: int) -> None:
        nonlocal cluster_bound
        a, b = find(a), find(b)
        if a == b:
            return
        parent[b] = a
        work[a] += work[b]
        first[a] = min(first[a], first[b])
        after[a] = min(after[a], after[b])
        cluster_bound = max(cluster_bound, first[a] + work[a] + after[a])

    for a, b in zip(*joined):
        union(a, b)
    cuts, srcs, dsts = edges
    m = len(cuts)
    best = math.inf
    above = math.inf  # the interval [below, above) of step times with the same forced edges
    i = 0
    while True:
        below = cuts[i] if i < m else 0.0
        candidate = max(below, cluster_bound)
        if candidate >= above:  # no step time in [below, above) is consistent, nor any lower
            break
        best = min(best, candidate)
        if i == m or below <= cluster_bound:  # lower intervals' candidates are cluster_bound or more
            break
        above = cuts[i]
        while i < m and cuts[i] == above:
            union(srcs[i], dsts[i])
            i += 1
    return best
