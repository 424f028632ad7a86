"""The moves a refinement tries from a placement of the units, each with an estimate of its gain.

A move puts a set of units on a device (a swap: each unit on its own). :class:`MoveFinder` makes
two kinds of candidates from the placement ``dev`` (unit -> device) at hand:

* structural (:meth:`MoveFinder.structural`): every cluster (:mod:`.clusters`) holding at least
  a given compute, to every device worth trying: on alike devices without per-link overrides,
  empty devices are interchangeable, so only the first empty one is a target;
* critical (:meth:`MoveFinder.critical`): from the chain of ops and transfers that ends last in
  the placement's run: for a transfer on it, the producer's unit joins the consumer's device and
  vice versa; an op that waited for its busy device, and the op that kept it busy, go to the
  device idle longest then, or swap.

A move's estimate is the compute it balances between the devices it touches less
:data:`COMM_WEIGHT` of the transfer time it adds (most of it overlaps compute); a critical move's
is at least what it could take off the chain. Big clusters are placed and their transfers summed
in numpy (over :data:`VECTOR_MIN` units or boundary tensors): the same floats added in the same
order as the loops, so the estimates agree to the last bit. :data:`FAMILIES` groups the kinds
of move for the climb's ranking.

Complexity: a structural sweep O(clusters x targets) estimates, each O(the cluster's units and
boundary) for the first target and O(devices it touches) for the others; the critical walk
O(V + E) plus O(D log V) per wait (:class:`Busy`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass

import numpy as np

from baechi_cli.core.graph import OpGraph
from baechi_cli.evaluator.sim import Timing
from baechi_cli.search.refine.clusters import Cluster, Clusters
from baechi_cli.search.refine.units import Units

# Critical-path moves per pass: the longest waits and the transfers on the chain.
CRITICAL_WAITS = 8
CRITICAL_TRANSFERS = 8
# Ranking: the transfer time a move adds counts at this weight against the compute it
# balances; most of it overlaps compute (a pipeline crosses its cut once per step,
# but its critical path only at the ends).
COMM_WEIGHT = 0.25
# Where a cluster is (:meth:`MoveFinder.where`) is found in numpy when it has more units than
# this, its transfers when its boundary has more tensors (where numpy's fixed cost pays).
# Both ways add the same floats in the same order, so they give the
# same estimates to the last bit.
VECTOR_MIN = 250
# Families of moves, in the order that breaks ties between them.
FAMILIES = {
    "critical transfer": "critical",
    "critical wait": "critical",
    "swap": "critical",
    "scope+": "scope",
    "scope": "scope",
    "split": "split",
    "unit": "unit",
}


@dataclass
class Move:
    """Units to put on a device (or each on its own: ``targets``); ``score`` estimates the µs saved."""

    kind: str
    label: str
    units: tuple[int, ...]
    target: int
    targets: tuple[int, ...] | None = None  # per unit, for swaps
    key: tuple = ()  # identifies the move across passes
    score: float = 0.0

    def device(self, i: int) -> int:
        return self.target if self.targets is None else self.targets[i]


@dataclass
class Where:
    """Where a cluster is: for ranking its moves (:meth:`MoveFinder.where`)."""

    devices: set[int]
    share: dict[int, float]  # its compute on each of those devices
    main: int  # the device holding most of it
    # Transfer µs across its edge were it all on device d: ``total - there_too.get(d, 0.0)``,
    # kept so because only the devices its outside neighbours are on differ from ``total``.
    total: float
    there_too: dict[int, float]

    def transfers(self, d: int) -> float:
        return self.total - self.there_too.get(d, 0.0)


class MoveFinder:
    """Candidate moves of ``graph``'s units over ``clusters``, scored (module docstring).

    Stateless between calls but for caches: the placement's numpy copy, and (in the clusters)
    each cluster's boundary.
    """

    def __init__(self, graph: OpGraph, units: Units, clusters: Clusters) -> None:
        self.graph = graph
        self.units = units
        self.clusters = clusters
        self.ndev = units.ndev
        self.dev_array = np.zeros(0, dtype=np.int64)
        self.dev_array_of: list[int] | None = None

    def structural(self, dev: list[int], loads: list[float], least: float) -> list[Move]:
        """Every cluster holding at least ``least`` µs of compute (on device 0's kind) to every
        device worth trying, scored; closes the scopes that big first."""
        ndev = self.ndev
        used = [False] * ndev
        for d in dev:
            used[d] = True
        first_empty = next((d for d in range(ndev) if not used[d]), -1)
        # When every device is alike the first empty one stands for all: the others would
        # score the same (and thousands of idle devices cost nothing per cluster).
        targets = sorted({*dev, first_empty} - {-1}) if self.units.homogeneous else range(ndev)
        moves: list[Move] = []
        self.clusters.close_scopes(least)
        for i, cl in enumerate(self.clusters.clusters):
            if cl.comp[0] < least:  # on device 0's kind, the first
                continue
            where: Where | None = None
            for b in targets:
                if where is None:
                    where = self.where(cl, dev)
                if len(where.devices) == 1 and b in where.devices:
                    continue
                score = self.estimate(cl, b, dev, loads, where)
                moves.append(Move(cl.kind, cl.label, cl.units, b, key=(i, b), score=score))
        return moves

    def where(self, cl: Cluster, dev: list[int]) -> Where:
        """Where ``cl`` is in ``dev``: its devices, its compute on each, its main device, its transfers."""
        comp = self.units.comp
        devices = {dev[u] for u in cl.units}
        share: dict[int, float] = {}
        if len(devices) == 1:
            a = next(iter(devices))
            share[a] = cl.comp[self.units.kind_of[a]]
        else:
            if len(cl.units) > VECTOR_MIN:
                # The same sums: bincount adds each device's shares in the units' order.
                if cl.units_array is None:
                    cl.units_array = np.array(cl.units, dtype=np.int64)
                on = self._dev_array(dev)[cl.units_array]
                sums = np.bincount(
                    on, weights=self.units.kind_array[self.units.kind_of_array[on], cl.units_array]
                ).tolist()
                share = {d: sums[d] for d in devices}
            else:
                for u in cl.units:
                    share[dev[u]] = share.get(dev[u], 0.0) + comp[dev[u]][u]
            a = max(devices, key=lambda d: (share[d], -d))
            if share[a] <= 0.0:  # no compute anywhere: every device ties at 0, the first wins
                a = 0
        return Where(devices, share, a, *self.transfers(cl, dev))

    def estimate(
        self, cl: Cluster, b: int, dev: list[int], loads: list[float], where: Where | None = None
    ) -> float:
        """µs that moving ``cl`` to device ``b`` might save: the compute it balances between the
        devices it touches, less :data:`COMM_WEIGHT` times the transfer time it adds."""
        if where is None:
            where = self.where(cl, dev)
        share = where.share
        after = {d: loads[d] - share[d] for d in where.devices}  # the loads that change
        after[b] = after.get(b, loads[b]) + cl.comp[self.units.kind_of[b]]
        touched = [*where.devices, b]
        gain = max(loads[d] for d in touched) - max(after[d] for d in touched)
        return gain - COMM_WEIGHT * (where.transfers(b) - where.transfers(where.main))

    def transfers(self, cl: Cluster, dev: list[int]) -> tuple[float, dict[int, float]]:
        """µs of transfers across the cluster's edge were it all on device d, as (total, there_too):
        ``total - there_too.get(d, 0.0)``.

        Each tensor counts once per receiving device, as the simulator sends it.
        O(the boundary's size); the boundary is computed on first use.
        """
        self.clusters.find_boundary(cl)
        if cl.flat is not None or len(cl.boundary) > VECTOR_MIN:  # type: ignore[arg-type]
            return self._transfers_vectorized(cl, dev)
        t_len = self.units.t_len
        # Its tensors reach every device of their outside consumers but d, and outside
        # tensors come to d unless already there (made or read there).
        total = 0.0
        there_too: dict[int, float] = {}
        for tid, made_inside, others in cl.boundary:  # type: ignore[union-attr]
            length = t_len[tid]
            if len(others) == 1:
                total += length
                d = dev[others[0]]
                there_too[d] = there_too.get(d, 0.0) + length
                continue
            there = {dev[c] for c in others}
            total += length * len(there) if made_inside else length
            for d in there:
                there_too[d] = there_too.get(d, 0.0) + length
        return total, there_too

    def _transfers_vectorized(self, cl: Cluster, dev: list[int]) -> tuple[float, dict[int, float]]:
        """:meth:`transfers` of a big boundary, in numpy: the same sums in the same order (the
        total by a running sum over the tensors, each device's by bincount in tensor order)."""
        if cl.flat is None:
            assert cl.boundary is not None
            sizes = [len(others) for _, _, others in cl.boundary]
            index = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
            outside = np.fromiter(
                (c for _, _, others in cl.boundary for c in others), dtype=np.int64, count=len(index)
            )
            length = np.array([self.units.t_len[tid] for tid, _, _ in cl.boundary], dtype=np.float64)
            made = np.array([made for _, made, _ in cl.boundary], dtype=bool)
            cl.flat = index, outside, length, made
        index, outside, length, made = cl.flat
        ndev = self.ndev
        # Each (tensor, device it reaches) once, in tensor order.
        pairs = np.unique(index * ndev + self._dev_array(dev)[outside])
        tensor, device = np.divmod(pairs, ndev)
        reached = np.bincount(tensor, minlength=len(length))
        sums = np.cumsum(np.where(made, length * reached, length))
        total = float(sums[-1]) if len(sums) else 0.0  # a cluster nothing crosses the edge of
        there = np.bincount(device, weights=length[tensor]).tolist()
        return total, {d: there[d] for d in np.unique(device).tolist()}

    def _dev_array(self, dev: list[int]) -> np.ndarray:
        """``dev`` in numpy, remade when the placement changed (it is replaced, never edited)."""
        if self.dev_array_of is not dev:
            self.dev_array = np.array(dev, dtype=np.int64)
            self.dev_array_of = dev
        return self.dev_array

    def critical(self, timing: Timing, dev: list[int], device_of: list[int]) -> list[Move]:
        """Moves along the chain of ops and transfers that ends last in ``timing``, the run of
        ``device_of`` (the ops' devices when unit ``u`` is on ``dev[u]``); module docstring."""
        g, ndev = self.graph, self.ndev
        unit_of, unit_ops = self.units.unit_of, self.units.unit_ops
        start, end, ready, copies = timing.start, timing.end, timing.ready, timing.copies
        edge_tensor = g.tensors.edge_tensor
        prev_on_device = [-1] * g.num_ops
        for ops in timing.order:
            for a, b in zip(ops, ops[1:]):
                prev_on_device[b] = a
        v = end.index(max(end)) if g.num_ops else -1  # the first op to end last
        waits: list[tuple[float, int, int]] = []  # (wait, op, the op before it on its device)
        transfers: list[tuple[int, int]] = []  # (producer, consumer) on different devices
        while v >= 0 and start[v] > 0.0:
            s = start[v]
            if not g.in_edges[v] or s > ready[v]:  # it waited for its device
                p = prev_on_device[v]
                if p >= 0 and g.in_edges[v]:
                    waits.append((s - ready[v], v, p))
                v = p
                continue
            dv, nxt = device_of[v], -1
            for e in g.in_edges[v]:  # the input that arrived last
                u = g.edge_src[e]
                t = end[u] if device_of[u] == dv else copies[edge_tensor[e] * ndev + dv][2]
                if t == ready[v]:
                    nxt = u
                    if device_of[u] != dv:
                        transfers.append((u, v))
                    break
            v = nxt
        moves: list[Move] = []

        loads = self.units.loads(dev)
        clusters = self.clusters.clusters

        def move(kind: str, units: tuple[int, ...], targets: tuple[int, ...], on_path: float) -> None:
            """A move, scored by the general estimate or, when larger, by what it could take
            off the critical path (``on_path`` µs), which the general estimate cannot see."""
            label = " + ".join(g.names[unit_ops[u][0]] for u in units)
            # Units are the first clusters; a swap counts as its two moves.
            score = sum(self.estimate(clusters[u], d, dev, loads) for u, d in zip(units, targets))
            score = max(score, on_path)
            moves.append(Move(kind, label, units, targets[0], targets, key=(units, targets), score=score))

        for u, w in transfers[:CRITICAL_TRANSFERS]:
            a, b = unit_of[u], unit_of[w]
            length = max(
                (self.units.t_len[edge_tensor[e]] for e in g.in_edges[w] if g.edge_src[e] == u),
                default=0.0,
            )
            move("critical transfer", (a,), (dev[b],), length)
            move("critical transfer", (b,), (dev[a],), length)
        waits.sort(key=lambda x: (-x[0], x[1]))
        busy = Busy(timing)
        comp = self.units.comp
        # An idle device computes 0 µs in any window, the least there is: of the idle ones only
        # the first can win (ties go to the lower index), so the others need no look.
        candidates = [d for d in range(ndev) if timing.order[d]]
        idle = next((d for d in range(ndev) if not timing.order[d]), -1)
        if idle >= 0:
            candidates.append(idle)
        for wait, w, p in waits[:CRITICAL_WAITS]:
            lo, hi = ready[w], start[w]
            others = [d for d in candidates if d != device_of[w]]
            if not others:
                continue
            d = min(others, key=lambda d: (busy.within(d, lo, hi), d))
            a, b = unit_of[w], unit_of[p]
            move("critical wait", (a,), (d,), min(wait, comp[d][a]))
            if b != a:
                move("critical wait", (b,), (d,), min(wait, comp[d][b]))
            other = busy.running(d, lo)
            if other >= 0 and unit_of[other] != a:
                c = unit_of[other]
                move("swap", (a, c), (dev[c], dev[a]), min(wait, comp[d][a]))
        return moves


class Busy:
    """When each device computes in a timeline: µs within a window, the op running at an instant.

    O(V + D) to build, the lists kept for the devices that run ops only; each question
    O(log V) by bisection (a device's ops do not overlap, so their starts and ends are
    both sorted).
    """

    def __init__(self, timing: Timing) -> None:
        self.ops = timing.order
        used = [d for d, ops in enumerate(timing.order) if ops]
        self.starts = {d: [timing.start[v] for v in timing.order[d]] for d in used}
        self.ends = {d: [timing.end[v] for v in timing.order[d]] for d in used}
        self.before: dict[int, list[float]] = {}  # busy µs before each op starts
        for d in used:
            acc, cum = 0.0, [0.0]
            for s, e in zip(self.starts[d], self.ends[d]):
                acc += e - s
                cum.append(acc)
            self.before[d] = cum

    def within(self, d: int, lo: float, hi: float) -> float:
        """µs device ``d`` computes within [lo, hi)."""
        if d not in self.before:
            return 0.0
        starts, ends, cum = self.starts[d], self.ends[d], self.before[d]
        i = bisect_right(ends, lo)  # the first op ending after lo
        j = bisect_left(starts, hi)  # the first op starting at or after hi
        if i >= j:
            return 0.0
        total = cum[j] - cum[i]
        total -= max(0.0, lo - starts[i])  # clip the first op at lo
        total -= max(0.0, ends[j - 1] - hi)  # and the last at hi
        return max(0.0, total)

    def running(self, d: int, t: float) -> int:
        """The op device ``d`` runs at time ``t`` (-1: idle)."""
        if d not in self.starts:
            return -1
        i = bisect_right(self.starts[d], t) - 1
        return self.ops[d][i] if i >= 0 and self.ends[d][i] > t else -1
