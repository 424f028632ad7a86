"""LiveLedger: the memory a list schedule holds on each device, counted as the evaluator counts it.

m-ETF, m-SCT and m-TOPO build a :class:`~baechi_cli.evaluator.sim.ListSchedule` one op at a
time, so they know when each committed op runs. The ledger follows that schedule with the
evaluator's memory rules (:mod:`baechi_cli.evaluator.sim`: persistent bytes all step; an output
until its last consumer there and its last send have ended; a received copy until its last
consumer there has ended; temporaries while the op runs; views allocate nothing; a held output
is never freed; a scope hold keeps a tensor where it was made until the keeping op has ended).

What the future may still decide is counted on the safe side: a tensor stays live on a device
while a consumer that might still run there (its group not pinned elsewhere) is not committed;
where the sends of a tensor are not known in advance (``sequential`` mode, per-link rates) it
stays live on its producer's device until every consumer is committed. Once a tensor's free
time is known, levels already recorded after it are lowered. So the ledger's level at each
committed op's start, and its peak, are upper bounds of the evaluator's whenever it runs the
planned schedule (``parallel`` mode with the placer's sequence; tests/test_liveness.py checks
this on drawn graphs).
:meth:`LiveLedger.admits` asks whether op v fits on device d if committed there next.

Cost: O(indegree + outdegree) per commit and per question, plus, for a copy received while other
ops run, the number of ops it spans on that device. Flat lists; buffers numbered as allocated.

Example:
    >>> from baechi_cli.core.graph import GraphBuilder
    >>> from baechi_cli.core.devices import parse_devices
    >>> from baechi_cli.evaluator.sim import ListSchedule
    >>> b = GraphBuilder()
    >>> a = b.add_op("a", "A", [100], compute_us=1)
    >>> c = b.add_op("c", "C", [10], compute_us=1)
    >>> _ = b.add_edge(a, c)
    >>> g, spec = b.build(), parse_devices("1x1KB")
    >>> schedule = ListSchedule(g, spec, [-1, -1])
    >>> ledger = LiveLedger(g, spec, schedule, [1000])
    >>> for v in (a, c):
    ...     _ = schedule.commit(v, 0); ledger.commit(v, 0)
    >>> ledger.peak_bytes()   # a's output is still live while c writes its own
    [110]
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Sequence

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.graph import CONTROL_PORT, OpGraph
from baechi_cli.evaluator.sim import ListSchedule
from baechi_cli.placers.memory import first_fit

INF = float("inf")


class LiveLedger:
    """Live bytes per device along a list schedule (module docstring).

    ``budget`` is the bytes each device may hold (its memory, or less when a
    placer retries with a margin). Call :meth:`place_group` when a group's
    device is chosen and :meth:`commit` right after ``schedule.commit``.

    A *buffer* is one allocation (an op's output, a received copy); a
    *location* ``tensor * devices + device`` is where a tensor can be read,
    and views make several locations share a buffer. A buffer is freed once
    every location on it is settled: no read that might still happen there.
    """

    def __init__(self, graph: OpGraph, devices: DeviceSpec, schedule: ListSchedule, budget: Sequence[int]):
        n, ndev = graph.num_ops, devices.count
        self.graph = graph
        self.schedule = schedule
        self.ndev = ndev
        self.budget = list(budget)
        tensors = graph.tensors
        self._edge_tensor = tensors.edge_tensor
        self._copy_bytes = tensors.nbytes
        # Sends leave when the producer ends and take a known time: a tensor whose
        # remaining readers are all elsewhere is freed by then.
        self._sends_known = not schedule.sequential and schedule.transfer_us is not None
        self._reads: list[list[int]] = [[] for _ in range(len(tensors.src))]  # data edges per tensor
        consumed: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # (port, tensor) read per op
        for e in range(graph.num_edges):
            if graph.edge_port[e] == CONTROL_PORT:
                continue
            t = self._edge_tensor[e]
            if not self._reads[t]:
                consumed[graph.edge_src[e]].append((graph.edge_port[e], t))
            self._reads[t].append(e)
        self._read_done = bytearray(graph.num_edges)
        self._consumed = consumed
        # Scope holds (graph.scope_holds): per tensor the ops that keep it where it was made,
        # per op the tensors it keeps; and which ops are committed.
        self._tensor_src = tensors.src
        self._keepers: dict[int, list[int]] = {}
        self._keeps: dict[int, list[int]] = {}
        for v, port, w in graph.scope_holds:
            t = graph.tensor_of(v, port)
            if t >= 0:
                self._keepers.setdefault(t, []).append(w)
                self._keeps.setdefault(w, []).append(t)
        self._committed = bytearray(n)
        view_of = graph.view_of
        self._view_of = view_of
        # Bytes v allocates at its start that outlive it (``fresh``), and those that do
        # not: temporaries and outputs nothing reads (``transient``).
        output_bytes, temporary_bytes = graph.output_bytes, graph.temporary_bytes
        self._fresh = fresh = [0] * n
        self._transient = transient = list(temporary_bytes)
        # Held outputs (graph.held_outputs) outlive the step: per op, its held ports.
        self._held_ports: dict[int, list[int]] = {}
        for v, port in sorted(graph.held_outputs):
            self._held_ports.setdefault(v, []).append(port)
        for v, sizes in enumerate(output_bytes):
            if v in view_of:
                continue
            if v in self._held_ports:  # a held output outlives v whether read or not
                kept = {p for p, _ in consumed[v]}.union(self._held_ports[v])
                fresh[v] = sum(sizes[p] for p in kept)
            elif consumed[v]:
                fresh[v] = sum(sizes[p] for p, _ in consumed[v])
            transient[v] += sum(sizes) - fresh[v]
        self._members = graph.group_members()
        self._group_persistent = dict.fromkeys(self._members, 0)
        for v, g in enumerate(graph.group):
            self._group_persistent[g] += graph.persistent_bytes[v]
        self.group_device: dict[int, int] = {}
        # Groups whose weights are big enough to strand: a placer filling devices
        # greedily can leave no device with room for one of them although the
        # total fits. (group, persistent bytes), largest first; see leaves_room().
        self._big_threshold = max(min(self.budget, default=0) // 100, 1)
        self._big = sorted(
            ((g, b) for g, b in self._group_persistent.items() if b >= self._big_threshold),
            key=lambda x: (-x[1], x[0]),
        )
        self._big_unplaced = sum(b for _, b in self._big)

        self._buf_device: list[int] = []
        self._buf_bytes: list[int] = []
        self._buf_free: list[float] = []  # latest known end of a use
        self._buf_holds: list[int] = []  # unsettled locations on it
        self._loc: dict[int, int] = {}  # location -> buffer
        self._located: dict[int, list[int]] = {}  # tensor -> devices it has a location on
        self._pending: dict[int, int] = {}  # unsettled location -> reads that still hold it
        self._producer: dict[int, int] = {}  # location where its tensor is produced -> the producing op
        self._waits_for_all: set[int] = set()  # producer locations held by every uncommitted read

        self.persistent = [0] * ndev
        # sum(budget) and sum(persistent + _peak_level), kept as they change: the free memory
        # of all devices in O(1), not O(devices) per question on thousands of devices.
        self._total_budget = sum(self.budget)
        self._held = 0
        self._live = [0] * ndev  # bytes of the buffers not freed by the time ``_advanced``
        self._advanced = [float("-inf")] * ndev
        self._frees: list[list[tuple[float, int]]] = [[] for _ in range(ndev)]
        self._starts: list[list[float]] = [[] for _ in range(ndev)]  # committed ops' starts
        self._level: list[list[int]] = [[] for _ in range(ndev)]  # non-persistent bytes at each
        self._peak_level = [0] * ndev  # at least max(level); exact unless _peak_stale
        self._peak_stale = [False] * ndev

    # ---------------------------------------------------------------- queries

    def peak_bytes(self) -> list[int]:
        """The ledger's peak per device: at least the evaluator's when it runs this schedule."""
        return [p + max(level, default=0) for p, level in zip(self.persistent, self._level)]

    def excess(self, v: int, d: int) -> int:
        """Bytes by which committing ``v`` on ``d`` next exceeds d's budget (<= 0: it fits).

        Counted when ``d`` is next free: v starts then or later, when no more is live. Everything
        live then, v's fresh outputs, temporaries and received copies count; a received copy over
        the whole window from its arrival; and, when v's group is not placed yet, its persistent
        bytes over the whole step.
        """
        self._advance(d, self.schedule.dev_free[d])
        g = self.graph
        budget = self.budget[d]
        base = self.persistent[d]
        if self.group_device.get(g.group[v], -1) < 0:
            base += self._group_persistent[g.group[v]]
        copies, arrival = self._new_copies(v, d)
        worst = base + self._live[d] + copies + self._fresh[v] + self._transient[v] - budget
        if (copies or base > self.persistent[d]) and base + self._peak_level[d] + copies > budget:
            level = self._level[d]
            if self._peak_stale[d]:
                self._set_peak(d, max(level, default=0))
                self._peak_stale[d] = False
            worst = max(worst, base + self._peak_level[d] - budget)
            if copies and level:
                i = max(bisect_right(self._starts[d], arrival) - 1, 0)
                worst = max(worst, base + max(level[i:]) + copies - budget)
        return worst

    def admits(self, v: int, d: int) -> bool:
        """Whether ``v`` fits on ``d`` if committed there next (see :meth:`excess`)."""
        return self.excess(v, d) <= 0

    def leaves_room(self, group: int, d: int) -> bool:
        """Whether, with ``group`` on ``d``, the big unplaced groups' weights still pack (first fit decreasing).

        A look-ahead against stranding a large group: it packs only while the big
        groups are a sizeable share of the free memory, and costs
        O(big groups x devices) then; else O(1).
        """
        own = self._group_persistent[group]
        pending = self._big_unplaced - (own if own >= self._big_threshold else 0)
        if pending <= 0:
            return True
        if pending * 2 <= self._total_budget - self._held - own:
            return True
        free = [b - p - lvl for b, p, lvl in zip(self.budget, self.persistent, self._peak_level)]
        free[d] -= own
        return first_fit([b for g, b in self._big if g != group and g not in self.group_device], free)

    # ---------------------------------------------------------------- updates

    def place_group(self, group: int, d: int) -> None:
        """Pin colocation group ``group`` to ``d``: its weights live there all step, and its
        ops' reads settle the tensors they read on every other device.

        O(in-edges of the group's ops x devices each tensor is on)."""
        self.group_device[group] = d
        nbytes = self._group_persistent[group]
        self.persistent[d] += nbytes
        self._held += nbytes
        if nbytes >= self._big_threshold:
            self._big_unplaced -= nbytes
        g, ndev, pending = self.graph, self.ndev, self._pending
        for x in self._members[group]:
            for e in g.in_edges[x]:
                if g.edge_port[e] == CONTROL_PORT or self._read_done[e]:
                    continue
                t = self._edge_tensor[e]
                for y in sorted(self._located.get(t, ())):
                    key = t * ndev + y
                    if y != d and key in pending and key not in self._waits_for_all:
                        self._release_read(key)

    def commit(self, v: int, d: int) -> None:
        """Follow ``schedule.commit(v, d)``, which must have just run."""
        g, schedule, ndev = self.graph, self.schedule, self.ndev
        s, f = schedule.start[v], schedule.end[v]
        self._advance(d, s)
        level, starts = self._level[d], self._starts[d]
        loc, buf_free = self._loc, self._buf_free
        device_of = schedule.device_of
        edge_tensor, edge_src = self._edge_tensor, g.edge_src
        reads: list[tuple[int, int]] = []  # (edge, location of its producer when elsewhere, else -1)
        for e in g.in_edges[v]:
            if g.edge_port[e] == CONTROL_PORT:
                continue
            t = edge_tensor[e]
            du = device_of[edge_src[e]]
            key = t * ndev + d
            origin = -1
            if du != d:
                origin = t * ndev + du
                transfer = schedule.transfers[schedule.edge_transfer[e]]
                source = loc.get(origin)
                if source is not None and transfer.send_end > buf_free[source]:
                    buf_free[source] = transfer.send_end
                if key not in loc and self._copy_bytes[t]:
                    nbytes = self._copy_bytes[t]
                    self._locate(key, self._allocate(d, nbytes, transfer.end), -1)
                    # The copy is there from the receive's start: raise the levels since.
                    i = max(bisect_right(starts, transfer.recv_start) - 1, 0)
                    for j in range(i, len(level)):
                        level[j] += nbytes
                        if level[j] > self._peak_level[d]:
                            self._set_peak(d, level[j])
            b = loc.get(key)
            if b is not None and f > buf_free[b]:
                buf_free[b] = f
            reads.append((e, origin))
        source = self._view_of.get(v)
        held = self._held_ports.get(v, ())
        for port, t in self._consumed[v]:
            if source is None:
                nbytes = g.output_bytes[v][port]
                if nbytes:
                    self._locate(t * ndev + d, self._allocate(d, nbytes, INF if port in held else f), v)
            else:
                b = self._viewed(v, source, d)
                if b is not None:
                    self._locate(t * ndev + d, b, v)
        for port in held:  # the caller's until the step ends: never freed here
            if source is not None:
                b = self._viewed(v, source, d)
                if b is not None:
                    buf_free[b] = INF
            elif not any(p == port for p, _ in self._consumed[v]) and g.output_bytes[v][port]:
                self._allocate(d, g.output_bytes[v][port], INF)
        sample = self._live[d] + self._transient[v]
        starts.append(s)
        level.append(sample)
        if sample > self._peak_level[d]:
            self._set_peak(d, sample)
        for e, origin in reads:
            self._read_done[e] = 1
            key = edge_tensor[e] * ndev + d
            if key in self._pending:
                self._release_read(key)
            if origin in self._waits_for_all:
                self._release_read(origin)
        self._committed[v] = 1
        for t in self._keeps.get(v, ()):  # v ends a module call that t is an argument of
            made_on = device_of[self._tensor_src[t]]
            b = loc.get(t * ndev + made_on) if made_on >= 0 else None
            if b is None:
                continue  # not made yet: _locate makes it wait for v's end when it is
            key = t * ndev + made_on
            if f > buf_free[b]:
                buf_free[b] = f
            if key in self._pending:
                self._release_read(key)

    # ---------------------------------------------------------------- internals

    def _set_peak(self, d: int, level: int) -> None:
        self._held += level - self._peak_level[d]
        self._peak_level[d] = level

    def _allocate(self, d: int, nbytes: int, free: float) -> int:
        b = len(self._buf_device)
        self._buf_device.append(d)
        self._buf_bytes.append(nbytes)
        self._buf_free.append(free)
        self._buf_holds.append(0)
        self._live[d] += nbytes
        return b

    def _locate(self, key: int, b: int, producer: int) -> None:
        """Put location ``key`` on buffer ``b`` (``producer``: the op making it there, or -1 for a copy)."""
        ndev = self.ndev
        t, y = divmod(key, ndev)
        if key not in self._loc:
            self._located.setdefault(t, []).append(y)
        self._loc[key] = b
        self._buf_holds[b] += 1
        waits_for_all = producer >= 0 and not self._sends_known
        group, group_device, done = self.graph.group, self.group_device, self._read_done
        edge_dst = self.graph.edge_dst
        holding = 0
        for e in self._reads[t]:
            if not done[e] and (waits_for_all or group_device.get(group[edge_dst[e]], y) == y):
                holding += 1
        if producer >= 0:  # where it was made, until its keepers, wherever they run, have ended
            end, buf_free = self.schedule.end, self._buf_free
            for w in self._keepers.get(t, ()):
                if not self._committed[w]:
                    holding += 1
                elif end[w] > buf_free[b]:  # committed first, elsewhere, and still running
                    buf_free[b] = end[w]
        if producer >= 0:
            self._producer[key] = producer
        if waits_for_all:
            self._waits_for_all.add(key)
        self._pending[key] = holding
        if holding == 0:
            self._settle(key)

    def _release_read(self, key: int) -> None:
        self._pending[key] -= 1
        if self._pending[key] == 0:
            self._settle(key)

    def _settle(self, key: int) -> None:
        """No read can still happen at ``key``: its buffer is free once its other locations settle."""
        del self._pending[key]
        self._waits_for_all.discard(key)
        b = self._loc[key]
        producer = self._producer.pop(key, -1)
        if producer >= 0 and self._sends_known:
            t = key // self.ndev
            if any(not self._read_done[e] for e in self._reads[t]):  # readers elsewhere, sent at once
                free = self.schedule.end[producer] + self.schedule.transfer_us[t]
                if free > self._buf_free[b]:
                    self._buf_free[b] = free
        self._buf_holds[b] -= 1
        if self._buf_holds[b] == 0:
            self._free(b)

    def _free(self, b: int) -> None:
        d, free, nbytes = self._buf_device[b], self._buf_free[b], self._buf_bytes[b]
        if free > self._advanced[d]:
            heapq.heappush(self._frees[d], (free, nbytes))
            return
        # Freed in the past: lower the levels recorded after. (A level recorded at the
        # free time itself keeps the buffer: it stands for the moment just before too.)
        self._live[d] -= nbytes
        level = self._level[d]
        for j in range(bisect_right(self._starts[d], free), len(level)):
            level[j] -= nbytes
            self._peak_stale[d] = True

    def _viewed(self, v: int, source: tuple[int, int], d: int) -> int | None:
        """The buffer a view ``v`` on ``d`` aliases (None for a view of resident storage)."""
        src, port = source
        if src < 0:
            return None
        g = self.graph
        for e in g.in_edges[v]:
            if g.edge_src[e] == src and g.edge_port[e] == port:
                return self._loc.get(self._edge_tensor[e] * self.ndev + d)
        return None

    def _new_copies(self, v: int, d: int) -> tuple[int, float]:
        """Bytes of the copies ``v`` would receive on ``d``, and the earliest they could arrive."""
        g, schedule, ndev = self.graph, self.schedule, self.ndev
        device_of, end = schedule.device_of, schedule.end
        nbytes, arrival = 0, float("inf")
        counted: list[int] = []
        for e in g.in_edges[v]:
            u = g.edge_src[e]
            if g.edge_port[e] == CONTROL_PORT or device_of[u] == d:
                continue
            t = self._edge_tensor[e]
            if t * ndev + d in self._loc or t in counted:
                continue
            counted.append(t)
            nbytes += self._copy_bytes[t]
            arrival = min(arrival, end[u])  # a copy is received no earlier than its producer ends
        return nbytes, arrival

    def _advance(self, d: int, t: float) -> None:
        """Give back the buffers of ``d`` freed by time ``t`` (no later op on d starts before t)."""
        frees = self._frees[d]
        while frees and frees[0][0] <= t:
            self._live[d] -= heapq.heappop(frees)[1]
        if t > self._advanced[d]:
            self._advanced[d] = t
