"""The simulator: the one yardstick every placement is judged by.

``simulate(graph, devices, device_of)`` runs one step of ``graph``, op ``v`` on ``device_of[v]``,
and returns the timeline, per-device memory peaks and the step time (docs/simulator.md):

* A device runs one op at a time, once all its inputs are present there: the earliest-ready
  first, ties to the lower topological index, or in a placer's own per-device ``order``.
* A tensor ``(producer, port)`` is sent once to each other device that consumes it, when its
  producer ends; all consumers there reuse the copy. Transfers are issued in the order producers
  end (ties: topological index of the producer, then port, then destination device index; 0 µs
  ops started at that instant count as ending then too), and each channel serves them in that
  order (first come, first served; no back-filling).
  Control edges are 0-byte tensors (across devices they cost the latency). A tensor's bytes and
  measured transfer time are the largest among the edges that carry it.
* ``parallel`` mode: a transfer starts when its producer ends and never waits. ``sequential``:
  each device has one channel for sending and receiving; the send starts at max(producer end,
  sender free), the receive at max(send start, receiver free), each holding its channel for the
  transfer time, and the tensor is present at the receive's end.
* Memory per device, as half-open intervals [alloc, free): persistent bytes for the whole step;
  an output from its op's start until its last consumer there and its last send have finished
  (its own end if unused), until the step ends if the caller holds it (``graph.held_outputs``),
  and at least until op ``w`` ends for each ``graph.scope_holds`` entry; a received copy from
  the receive's start until its last consumer there has finished; temporaries while the op runs.
  A view (``graph.view_of``) allocates nothing; what it reads lives as long as its outputs would.
* Step time: the end of the last op or transfer.

Complexity: O((V + E) log V) time, O(V + E) memory; flat lists throughout.

Example:
    >>> from baechi_cli.core.graph import GraphBuilder
    >>> from baechi_cli.core.devices import parse_devices
    >>> b = GraphBuilder()
    >>> a = b.add_op("a", "A", [1000], compute_us=10)
    >>> c = b.add_op("c", "C", [], compute_us=5)
    >>> _ = b.add_edge(a, c)
    >>> spec = parse_devices("2x1GB")
    >>> simulate(b.build(), spec, [0, 0]).step_time_us
    15.0
    >>> round(simulate(b.build(), spec, [0, 1]).step_time_us, 3)
    149.175
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from baechi_cli.core.devices import DeviceSpec, Interconnect
from baechi_cli.core.graph import CONTROL_PORT, MemoryTable, OpGraph, TensorTable


@dataclass(frozen=True, slots=True)  # slots: a million of them at scale, each without a __dict__
class Transfer:
    """One tensor copied from ``src_device`` to ``dst_device``."""

    src_op: int
    port: int  # CONTROL_PORT for a control dependency
    src_device: int
    dst_device: int
    nbytes: int
    send_start: float
    recv_start: float  # equals send_start in parallel mode
    end: float  # the tensor is present on dst_device from here on
    # How long each channel is busy. Kept as the simulator computed it: recomputed as
    # end - recv_start it can differ in the last bit, and then a send would seem to
    # overlap the next one on its channel.
    length: float | None = field(default=None, compare=False)

    @property
    def send_end(self) -> float:
        """When the sender's channel is free again (sequential mode)."""
        length = self.length if self.length is not None else self.end - self.recv_start
        return self.send_start + length


@dataclass
class SimResult:
    device_of: list[int]
    start: list[float]
    end: list[float]
    order: list[list[int]]  # ops of each device in the order they ran
    transfers: list[Transfer]
    step_time_us: float
    compute_us: list[float]  # busy time per device
    peak_bytes: list[int]
    persistent_bytes: list[int]
    # (time, bytes in use from then on) per device, for timelines.
    memory_curve: list[list[tuple[float, int]]]
    memory_limits: list[int]
    # The run it came from when StepTimer ran it (readiness and copies too): refinement
    # walks the critical path of the plan it starts from without running it again.
    trace: Timing | None = field(default=None, repr=False, compare=False)

    @property
    def comm_bytes(self) -> int:
        return sum(t.nbytes for t in self.transfers)

    @property
    def feasible(self) -> bool:
        return all(p <= m for p, m in zip(self.peak_bytes, self.memory_limits))

    def over_memory(self) -> list[int]:
        """Devices whose peak exceeds their memory."""
        return [d for d, (p, m) in enumerate(zip(self.peak_bytes, self.memory_limits)) if p > m]


def simulate(
    graph: OpGraph,
    devices: DeviceSpec,
    device_of: Sequence[int],
    order: Sequence[Sequence[int]] | None = None,
) -> SimResult:
    """Simulate one step of ``graph`` placed by ``device_of`` (see module docstring).

    ``order``, when given, fixes the sequence of ops on each device; it must
    list every op of that device exactly once and respect dependencies within
    the device, else ``ValueError``. Judge placements through
    :func:`baechi_cli.evaluator.evaluate.evaluate`, which calls this (or, for many
    placements of one graph, :meth:`StepTimer.simulate`, the same run
    without building the timer each time).
    """
    return StepTimer(graph, devices).simulate(device_of, order)


def check_placement(graph: OpGraph, devices: DeviceSpec, device_of: Sequence[int]) -> None:
    """ValueError unless ``device_of`` gives every op of ``graph`` a device of ``devices``."""
    if len(device_of) != graph.num_ops:
        raise ValueError(f"placement covers {len(device_of)} ops, graph has {graph.num_ops}")
    if device_of and not (0 <= min(device_of) and max(device_of) < devices.count):
        raise ValueError("placement names a device index out of range")


def transfer_length(tensors: TensorTable, ic: Interconnect, tid: int, src: int, dst: int) -> float:
    """µs to copy tensor ``tid`` from ``src`` to ``dst``: measured, else the comm model."""
    measured = tensors.measured_us[tid]
    return measured if measured is not None else ic.transfer_time(tensors.nbytes[tid], src, dst)


class ListSchedule:
    """A schedule built one op at a time, in the order ops are committed.

    Committing op ``v`` to device ``d`` starts it at the earliest time ``d``
    is free and all of v's inputs are on ``d``. An input produced on another
    device and not yet there (or, with caching, not yet sent there for an
    earlier consumer) is sent now, in v's input order: in ``sequential`` mode
    it takes each channel when that channel is next free after the producer
    ended (channels serve transfers in commit order, no back-filling); in
    ``parallel`` mode it leaves when the producer ends.

    :meth:`data_ready` asks "when could v's inputs be on d?" without changing
    anything: the question m-ETF and m-SCT ask of every candidate device. Both
    methods cost O(indegree of v); data_ready remembers its answers (in
    ``sequential`` mode, or with per-link overrides) until a commit sends a
    copy, so a placer may ask again and again for free.

    This is a planning API, not a judge. In ``parallel`` mode the evaluator
    (:func:`simulate` with the same per-device order) reproduces the planned
    timeline exactly: the same start times, the same transfers (listed in the
    order they were issued rather than committed) and the same memory. In ``sequential`` mode it
    can differ: the evaluator's channels serve transfers in the order their
    producers end, which a placer committing ops one at a time cannot know
    yet, so here they are served in commit order and the plan is an estimate.
    """

    def __init__(
        self, graph: OpGraph, devices: DeviceSpec, device_of: list[int], *, cache_transfers: bool = True
    ) -> None:
        n, ndev = graph.num_ops, devices.count
        self.graph = graph
        self.devices = devices
        self.device_of = device_of  # -1 for ops not placed yet; placers fill it in
        self.ndev = ndev
        self.ic = devices.interconnect
        self.sequential = self.ic.mode == "sequential"
        self.cache = cache_transfers
        self.tensors = graph.tensors
        self.dur_by_device = [graph.durations(d.kind) for d in devices.devices]
        self.dev_free = [0.0] * ndev
        self.chan_free = [0.0] * ndev
        self.start = [0.0] * n
        self.end = [0.0] * n
        self.scheduled = [False] * n
        self.sequence: list[int] = []
        self.transfers: list[Transfer] = []
        self.edge_transfer = [-1] * graph.num_edges
        self._sent: dict[int, int] = {}  # tensor * ndev + device (or -1 - edge) -> transfer index
        # v * ndev + d -> (transfers sent then, data_ready(v, d)): valid while no copy is sent
        self._asked: dict[int, tuple[int, float]] = {}
        # Without per-link overrides a tensor's transfer time is the same between any two
        # devices: µs per tensor id, else None.
        t = self.tensors
        self.transfer_us = (
            None
            if self.ic.links
            else [
                m if m is not None else self.ic.transfer_time(b, 0, 1)
                for m, b in zip(t.measured_us, t.nbytes)
            ]
        )

    def data_ready(self, v: int, d: int) -> float:
        """When all of v's inputs could be on d if v were committed there now."""
        length = self.transfer_us
        if self.sequential or length is None:
            # The answer changes only when a commit sends a copy (busier channels, a copy
            # already on its way): until then it is remembered.
            key = v * self.ndev + d
            known = self._asked.get(key)
            if known is not None and known[0] == len(self.transfers):
                return known[1]
            ready = self._inputs(v, d, False)
            self._asked[key] = (len(self.transfers), ready)
            return ready
        # In parallel mode a copy arrives at producer end + transfer time, whether it was
        # sent earlier (cached) or would be sent now (as data_ready_on reasons).
        g = self.graph
        edge_src, edge_tensor = g.edge_src, self.tensors.edge_tensor
        device_of, end, scheduled = self.device_of, self.end, self.scheduled
        ready = 0.0
        for e in g.in_edges[v]:
            u = edge_src[e]
            if not scheduled[u]:
                raise ValueError(f"op {v} is scheduled before its input {u}")
            t = end[u] if device_of[u] == d else end[u] + length[edge_tensor[e]]
            if t > ready:
                ready = t
        return ready

    def data_ready_on(self, v: int, targets: Sequence[int]) -> list[float]:
        """``data_ready(v, d)`` for each device d of ``targets`` (parallel mode: O(indegree + targets))."""
        if self.sequential or self.transfer_us is None:
            return [self.data_ready(v, d) for d in targets]
        # In parallel mode a copy arrives at producer end + transfer time whether
        # it was sent earlier (cached) or would be sent now: ready on d is the
        # latest of the local inputs' ends and the remote inputs' arrivals.
        g = self.graph
        edge_src, edge_tensor, length = g.edge_src, self.tensors.edge_tensor, self.transfer_us
        device_of, end, scheduled = self.device_of, self.end, self.scheduled
        local: dict[int, float] = {}  # device -> latest end of an input made there
        best, best_dev, second = 0.0, -1, 0.0  # latest remote arrivals from two different devices
        for e in g.in_edges[v]:
            u = edge_src[e]
            if not scheduled[u]:
                raise ValueError(f"op {v} is scheduled before its input {u}")
            du = device_of[u]
            t = end[u]
            if t > local.get(du, 0.0):
                local[du] = t
            a = t + length[edge_tensor[e]]
            if a > best:
                if du != best_dev:
                    second = best
                best, best_dev = a, du
            elif du != best_dev and a > second:
                second = a
        return [max(local.get(d, 0.0), second if d == best_dev else best) for d in targets]

    def commit(self, v: int, d: int) -> float:
        """Schedule v on d; returns its start time. Its predecessors must be committed."""
        ready = self._inputs(v, d, True)
        start = max(self.dev_free[d], ready)
        end = start + self.dur_by_device[d][v]
        self.device_of[v] = d
        self.start[v] = start
        self.end[v] = end
        self.dev_free[d] = end
        self.scheduled[v] = True
        self.sequence.append(v)
        return start

    def _inputs(self, v: int, d: int, commit: bool) -> float:
        g = self.graph
        edge_src, edge_tensor = g.edge_src, self.tensors.edge_tensor
        device_of, end, scheduled = self.device_of, self.end, self.scheduled
        ndev, sent, transfers = self.ndev, self._sent, self.transfers
        lengths, cache, sequential = self.transfer_us, self.cache, self.sequential
        chan = self.chan_free if commit else None
        tentative: dict[int, float] | None = None  # uncommitted: tensor key -> arrival
        ready = 0.0
        for e in g.in_edges[v]:
            u = edge_src[e]
            if not scheduled[u]:
                raise ValueError(f"op {v} is scheduled before its input {u}")
            du = device_of[u]
            if du == d:
                arrival = end[u]
            else:
                tid = edge_tensor[e]
                key = tid * ndev + d if cache else -1 - e
                x = sent.get(key)
                if x is not None:
                    arrival = transfers[x].end
                    if commit:
                        self.edge_transfer[e] = x
                elif tentative is not None and key in tentative:
                    arrival = tentative[key]
                else:
                    length = (
                        lengths[tid]
                        if lengths is not None
                        else transfer_length(self.tensors, self.ic, tid, du, d)
                    )
                    send = recv = end[u]
                    if sequential:
                        if chan is None:  # a question, not a commitment: work on a copy
                            chan = list(self.chan_free)
                        if chan[du] > send:
                            send = chan[du]
                        chan[du] = send + length
                        recv = chan[d] if chan[d] > send else send
                        chan[d] = recv + length
                    arrival = recv + length
                    if commit:
                        sent[key] = len(transfers)
                        self.edge_transfer[e] = len(transfers)
                        transfers.append(
                            Transfer(
                                u,
                                g.edge_port[e],
                                du,
                                d,
                                self.tensors.nbytes[tid],
                                send,
                                recv,
                                arrival,
                                length,
                            )
                        )
                    elif tentative is None:
                        tentative = {key: arrival}
                    else:
                        tentative[key] = arrival
            if arrival > ready:
                ready = arrival
        return ready

    def result(self) -> SimResult:
        """The finished schedule as a SimResult (every op must be committed)."""
        if len(self.sequence) != self.graph.num_ops:
            raise ValueError("not every op is scheduled")
        n, ndev, device_of = self.graph.num_ops, self.ndev, self.device_of
        ran: list[list[int]] = [[] for _ in range(ndev)]
        for v in self.sequence:
            ran[device_of[v]].append(v)
        step = max(self.end, default=0.0)
        if self.transfers:
            step = max(step, max(t.end for t in self.transfers))
        compute = [0.0] * ndev
        for v in range(n):
            compute[device_of[v]] += self.end[v] - self.start[v]
        return _counted(
            self.graph,
            self.devices,
            device_of,
            self.start,
            self.end,
            ran,
            self.transfers,
            self.edge_transfer,
            step,
            compute,
        )


def _check_order(order: Sequence[Sequence[int]], device_of: Sequence[int], ndev: int) -> None:
    if len(order) != ndev:
        raise ValueError(f"order has {len(order)} device lists, spec has {ndev} devices")
    seen = [False] * len(device_of)
    for d, seq in enumerate(order):
        for v in seq:
            if device_of[v] != d or seen[v]:
                raise ValueError(f"op {v} is listed twice or on a device it is not placed on")
            seen[v] = True
    if not all(seen):
        raise ValueError("order leaves some ops out")


def _counted(
    graph: OpGraph,
    devices: DeviceSpec,
    device_of: Sequence[int],
    start: list[float],
    end: list[float],
    order: list[list[int]],
    transfers: list[Transfer],
    edge_transfer: list[int],
    step_time_us: float,
    compute_us: list[float],
) -> SimResult:
    """A timeline (the evaluator's or a placer's plan) as a SimResult, its memory counted."""
    peak, persistent, curve = _memory(graph, devices, device_of, start, end, transfers, edge_transfer)
    return SimResult(
        device_of=list(device_of),
        start=start,
        end=end,
        order=order,
        transfers=transfers,
        step_time_us=step_time_us,
        compute_us=compute_us,
        peak_bytes=peak,
        persistent_bytes=persistent,
        memory_curve=curve,
        memory_limits=[d.memory_bytes for d in devices.devices],
    )


def _memory(
    graph: OpGraph,
    devices: DeviceSpec,
    device_of: Sequence[int],
    start: list[float],
    end: list[float],
    transfers: list[Transfer],
    edge_transfer: list[int],
) -> tuple[list[int], list[int], list[list[tuple[float, int]]]]:
    """Per-device peak bytes, persistent bytes and memory curve (see module docstring).

    O((V + E) log V), in numpy: every allocation and free becomes a (device,
    time, bytes) change, sorted, and each device's running sum is its level.
    Byte counts stay exact however large (Python ints beyond int64's reach).
    """
    table = graph.memory_table
    ndev = devices.count
    persistent = [0] * ndev
    for d, nbytes in zip(device_of, graph.persistent_bytes):
        persistent[d] += nbytes
    dev = np.asarray(device_of, dtype=np.int64)
    start_at = np.asarray(start, dtype=np.float64)
    end_at = np.asarray(end, dtype=np.float64)
    # When each tensor is last used on its producer's device (its consumers there end, its sends
    # end), and each received copy on its receiver's (its consumers there end).
    slot_free = end_at[table.slot_src]
    copy_free = np.fromiter((t.end for t in transfers), dtype=np.float64, count=len(transfers))
    send_end = np.fromiter((t.send_end for t in transfers), dtype=np.float64, count=len(transfers))
    served = np.asarray(edge_transfer, dtype=np.int64)[table.data_edges]
    consumer_end = end_at[table.data_dst]
    remote = served >= 0
    np.maximum.at(copy_free, served[remote], consumer_end[remote])
    free = consumer_end.copy()
    free[remote] = send_end[served[remote]]
    np.maximum.at(slot_free, table.data_tensor, free)
    if len(table.hold_slots):  # an argument of a module call: until the call's last op ends
        np.maximum.at(slot_free, table.hold_slots, end_at[table.hold_ops])
    if len(table.held_slots):  # the caller's: until the step ends
        slot_free[table.held_slots] = max(end_at.max(initial=0.0), copy_free.max(initial=0.0))
    if table.views:
        slot_free, copy_free = _keep_view_sources(table, device_of, end, edge_transfer, slot_free, copy_free)
    sent = [x for x, t in enumerate(transfers) if t.nbytes and t.port != CONTROL_PORT]
    copy_ids = np.array(sent, dtype=np.int64)
    copy_dst = np.array([transfers[x].dst_device for x in sent], dtype=np.int64)
    copy_at = np.array([transfers[x].recv_start for x in sent], dtype=np.float64)
    copy_bytes = [transfers[x].nbytes for x in sent]
    # Bytes in int64 while no sum can overflow it, else as Python ints (exact at any size).
    exact = table.total_bytes + sum(copy_bytes) < 2**62
    kind: Any = np.int64 if exact else object
    outputs, temps = table.output_ops, table.temporary_ops
    kept = table.output_slot >= 0
    output_free = end_at[outputs]
    output_free[kept] = slot_free[table.output_slot[kept]]
    where = np.concatenate((dev[temps], dev[temps], dev[outputs], dev[outputs], copy_dst, copy_dst))
    when = np.concatenate(
        (start_at[temps], end_at[temps], start_at[outputs], output_free, copy_at, copy_free[copy_ids])
    )
    temp_bytes, out_bytes = table.temporary_bytes.astype(kind), table.output_bytes.astype(kind)
    sent_bytes = np.array(copy_bytes, dtype=kind)
    delta = np.concatenate((temp_bytes, -temp_bytes, out_bytes, -out_bytes, sent_bytes, -sent_bytes))
    ranked = np.lexsort((when, where))  # by device, then time
    where, when = where[ranked], when[ranked]
    level = np.cumsum(delta[ranked])
    peaks = list(persistent)
    curves = [[(0.0, b)] for b in persistent]
    if len(where):
        # Each device's run of changes: its level is the persistent bytes plus the changes so far.
        first = np.flatnonzero(np.r_[True, where[1:] != where[:-1]])
        before = np.r_[0, level[first[1:] - 1]].astype(kind)
        runs = np.diff(np.r_[first, len(where)])
        level += np.repeat(np.array(persistent, dtype=kind)[where[first]] - before, runs)
        # One point per instant: the level after all its changes (intervals are half-open, so
        # what is freed at an instant is gone before what is allocated then counts; in between
        # the level is never higher than either end).
        keep = np.flatnonzero(np.r_[(where[1:] != where[:-1]) | (when[1:] != when[:-1]), True])
        where, when, level = where[keep], when[keep], level[keep]
        first = np.flatnonzero(np.r_[True, where[1:] != where[:-1]])
        highest = np.maximum.reduceat(level, first).tolist()
        bounds = np.r_[first, len(where)].tolist()
        times, levels = when.tolist(), level.tolist()
        for i, d in enumerate(where[first].tolist()):
            lo, hi = bounds[i], bounds[i + 1]
            peaks[d] = max(persistent[d], highest[i])
            curve = curves[d]
            if times[lo] == 0.0:  # a change at 0 replaces the starting point
                curve.pop()
            curve.extend(zip(times[lo:hi], levels[lo:hi]))
    return peaks, persistent, curves


def _keep_view_sources(
    table: MemoryTable,
    device_of: Sequence[int],
    end: list[float],
    edge_transfer: list[int],
    slot_free: np.ndarray,
    copy_free: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Extend each view's source tensor (or the received copy it reads) to the view's last use.

    Latest views first (``table.views``), so that a view of a view hands its
    lifetime down the chain. O(views and their in-edges).
    """
    local, copies = slot_free.tolist(), copy_free.tolist()
    for v, src, source, own, reads in table.views:
        free = max((local[t] if t >= 0 else end[v] for t in own), default=end[v])
        if device_of[src] == device_of[v]:
            if free > local[source]:
                local[source] = free
            continue
        for e in reads:
            x = edge_transfer[e]
            if x >= 0:
                if free > copies[x]:
                    copies[x] = free
                break
    return np.array(local), np.array(copies)


def step_time_ceiling(graph: OpGraph, devices: DeviceSpec) -> tuple[float, str]:
    """An upper bound on every step time :func:`simulate` can give ``graph`` on ``devices``, and
    what contributes most to it (an op or a transfer, for messages).

    Until the step ends some op runs or some channel is busy (an op waits only
    for a running producer or a transfer, a transfer only for a busy channel),
    so the step is at most every op at its slowest device kind plus, per edge,
    one transfer of its tensor at the dearest link occupying two channels.
    Infinite when those times overflow a float: then no timeline can be
    computed. O(V x kinds + E + links), the sums at C speed.
    """
    columns = [graph.durations(k) for k in sorted({d.kind for d in devices.devices})]
    slowest = columns[0] if len(columns) == 1 else [max(times) for times in zip(*columns)]
    total = sum(slowest)
    largest, what = 0.0, ""
    if slowest:
        v = max(range(graph.num_ops), key=slowest.__getitem__)
        largest, what = slowest[v], f"op '{graph.names[v]}' ({slowest[v]:.3g} µs)"
    if devices.count > 1 and graph.num_edges:
        ic = devices.interconnect
        links = [(ic.latency_us, ic.bandwidth_bytes_per_us), *ic.links.values()]
        latency, bandwidth = max(lat for lat, _ in links), min(bw for _, bw in links)

        def length(measured: float | None, nbytes: int) -> float:
            if measured is not None:
                return measured
            try:
                return latency + nbytes / bandwidth
            except OverflowError:  # a byte count too large for a float
                return math.inf

        tensors = graph.tensors
        lengths = list(map(length, tensors.measured_us, tensors.nbytes))
        total += 2 * sum(map(lengths.__getitem__, tensors.edge_tensor))
        t = max(range(len(lengths)), key=lengths.__getitem__)
        if lengths[t] > largest:
            largest = lengths[t]
            what = f"the transfer of '{graph.names[tensors.src[t]]}' ({largest:.3g} µs)"
    return total, what


def lower_bound(graph: OpGraph, devices: DeviceSpec) -> float:
    """The best of the critical path, work and transfer-cut bounds: no placement that keeps
    colocation groups whole steps faster (:func:`baechi_cli.evaluator.bounds.lower_bounds`, O(V + E log E)).
    """
    from baechi_cli.evaluator.bounds import lower_bounds

    return lower_bounds(graph, devices).best_us


@dataclass
class Timing:
    """What :meth:`StepTimer.timing` records: enough to walk a schedule's critical path.

    ``ready[v]`` is when the last of v's inputs was present on v's device;
    ``copies`` maps ``tensor id * device count + device`` to (send start,
    receive start, arrival, length) of the copy of that tensor sent to that
    device, as :class:`Transfer` has them; ``dispatched`` every op in the
    order it started, on ``device_of`` (the placement run, not copied).
    :attr:`order` splits it by device on first use: few traced runs are ever
    looked at by device, and a list per device per run would cost more than
    the run on thousands of devices.
    """

    step_time_us: float
    start: list[float]
    end: list[float]
    ready: list[float]
    dispatched: list[int]
    copies: dict[int, tuple[float, float, float, float]]
    device_of: Sequence[int]
    devices: int

    @functools.cached_property
    def order(self) -> list[list[int]]:
        """The ops of each device in the order they ran. O(V + devices) on first use."""
        order: list[list[int]] = [[] for _ in range(self.devices)]
        device_of = self.device_of
        for v in self.dispatched:
            order[device_of[v]].append(v)
        return order


class StepTimer:
    """The simulator's engine for many placements of one graph on one set of devices.

    :func:`simulate` is ``StepTimer(graph, devices).simulate(device_of,
    order)``. What depends on the graph alone is computed once here
    (topological ranks, each op's tensors and their consumers in port order,
    control first, transfer times); a run then costs O((V + E) log V):
    events are (time, int) pairs; an op's consumers are visited once when it
    ends (the local ones released, the remote ones kept for the transfers,
    and one ready now goes straight to its device's queue, with no event:
    nothing reads the queues before the instant's dispatch); and only the
    devices something happened to are dispatched.

    * :meth:`step_time`: the step time alone;
    * :meth:`timing`: the step time, with start, end and readiness of every
      op and every copy sent, in the order sent (for critical-path analysis;
      refinement times a move so when it expects to take it, and then counts
      its memory and walks its critical path on that run);
    * :meth:`simulate`: the :class:`SimResult`, transfers and memory counted
      (:meth:`result` of a :meth:`timing`).

    Complexity: O(V + E) to build (a twentieth of a second at 27k ops).
    """

    def __init__(self, graph: OpGraph, devices: DeviceSpec) -> None:
        n = graph.num_ops
        self.graph = graph
        self.devices = devices
        self.n = n
        self.ndev = devices.count
        topo = graph.topo_order()
        rank = [0] * n
        for i, v in enumerate(topo):
            rank[v] = i
        self.topo = topo
        self.rank = rank
        self.dur_by_device = [graph.durations(d.kind) for d in devices.devices]
        self.ic = devices.interconnect
        self.sequential = self.ic.mode == "sequential"
        tensors = graph.tensors
        self.tensors = tensors
        # Per op: its tensors in port order (control first: the order transfers are issued
        # in), each with the consumer of every edge that carries it, in edge order.
        by_tensor: list[list[int]] = [[] for _ in tensors.src]  # every tensor has an edge
        for tid, w in zip(tensors.edge_tensor, graph.edge_dst):
            by_tensor[tid].append(w)
        outs: list[list[tuple[int, list[int]]]] = [[] for _ in range(n)]
        src = tensors.src
        for tid in np.lexsort((tensors.port, src)).tolist():  # by (producer, port)
            outs[src[tid]].append((tid, by_tensor[tid]))
        self.outs = outs
        self.in_degree = [len(x) for x in graph.in_edges]
        self.source_ranks = sorted(rank[v] for v in range(n) if not graph.in_edges[v])
        # Without per-link overrides a tensor takes the same time between any two devices.
        self.length: list[float] | None = (
            None
            if self.ic.links
            else [
                m if m is not None else self.ic.transfer_time(b, 0, 1)
                for m, b in zip(tensors.measured_us, tensors.nbytes)
            ]
        )

    def check_serves(self, graph: OpGraph, devices: DeviceSpec) -> None:
        """ValueError unless this timer was built for ``graph`` on ``devices`` (the same objects)."""
        if self.graph is not graph or self.devices is not devices:
            raise ValueError("the timer was built for another graph or other devices")

    def step_time(self, device_of: Sequence[int], order: Sequence[Sequence[int]] | None = None) -> float:
        """The step time :func:`simulate` gives this placement (and per-device order), and no
        more: the run without its trace, a little cheaper."""
        return self._run(device_of, order, False).step_time_us

    def timing(self, device_of: Sequence[int], order: Sequence[Sequence[int]] | None = None) -> Timing:
        """The step time with every op's start, end and readiness and every copy's arrival."""
        return self._run(device_of, order, True)

    def simulate(self, device_of: Sequence[int], order: Sequence[Sequence[int]] | None = None) -> SimResult:
        """:func:`simulate` of this graph on these devices: the whole timeline and memory."""
        check_placement(self.graph, self.devices, device_of)
        return self.result(device_of, self.timing(device_of, order))

    def result(self, device_of: Sequence[int], trace: Timing) -> SimResult:
        """The :class:`SimResult` of a run :meth:`timing` traced: its transfers and memory counted.

        O(V + E) beside the memory count's O((V + E) log V).
        """
        graph, ndev, tensors = self.graph, self.ndev, self.tensors
        transfers: list[Transfer] = []
        # The copies in the order they were issued (the trace records them so).
        index: dict[int, int] = {}
        src, port, nbytes = tensors.src, tensors.port, tensors.nbytes
        for key, (send, recv, arrival, length) in trace.copies.items():
            tid, dst = divmod(key, ndev)
            u = src[tid]
            index[key] = len(transfers)
            transfers.append(
                Transfer(u, port[tid], device_of[u], dst, nbytes[tid], send, recv, arrival, length)
            )
        edge_transfer = [-1] * graph.num_edges
        for e, (u, w, tid) in enumerate(zip(graph.edge_src, graph.edge_dst, tensors.edge_tensor)):
            d = device_of[w]
            if device_of[u] != d:
                edge_transfer[e] = index[tid * ndev + d]
        compute = [0.0] * ndev
        durs = self.dur_by_device
        for v, d in enumerate(device_of):
            compute[d] += durs[d][v]
        counted = _counted(
            graph,
            self.devices,
            device_of,
            trace.start,
            trace.end,
            trace.order,
            transfers,
            edge_transfer,
            trace.step_time_us,
            compute,
        )
        counted.trace = trace
        return counted

    def _run(self, device_of: Sequence[int], order: Sequence[Sequence[int]] | None, tracing: bool) -> Timing:
        n, ndev = self.n, self.ndev
        if len(device_of) != n:
            raise ValueError(f"placement covers {len(device_of)} ops, graph has {n}")
        rank, topo, outs, sequential = self.rank, self.topo, self.outs, self.sequential
        length, tensors, ic = self.length, self.tensors, self.ic
        durs = self.dur_by_device
        heappush, heappop = heapq.heappush, heapq.heappop
        remaining = list(self.in_degree)
        ready_at = [0.0] * n
        end = [0.0] * n
        start = [0.0] * n if tracing else end  # untraced, a start is written nowhere
        dispatched: list[int] = []
        dispatch = dispatched.append
        copies: dict[int, tuple[float, float, float, float]] = {}
        busy = [False] * ndev
        chan_free = [0.0] * ndev
        last = 0.0  # the latest arrival of a transfer
        fixed = order is not None
        if fixed:
            _check_order(order, device_of, ndev)  # type: ignore[arg-type]
            pos = [0] * ndev
            is_ready = [False] * n
        avail: dict[int, list[tuple[float, int]]] = {}  # per device holding ops: its ready ops
        # Events are (time, code): code = rank for an op's end, n + rank for an op
        # becoming ready, so at equal times ends come first, then topological order.
        events = [(0.0, n + r) for r in self.source_ranks]
        done = 0
        while events:
            now = events[0][0]
            shipping: list[tuple[int, int, list]] = []  # (rank, op, its remote tensors)
            while True:
                touched: list[int] = []  # devices that became free or got a ready op
                while events and events[0][0] == now:
                    code = heappop(events)[1]
                    if code >= n:  # ready
                        r = code - n
                        u = topo[r]
                        d = device_of[u]
                        if fixed:
                            is_ready[u] = True
                        else:
                            queue = avail.get(d)
                            if queue is None:
                                avail[d] = queue = []
                            heappush(queue, (ready_at[u], r))
                        touched.append(d)
                        continue
                    u = topo[code]
                    done += 1
                    src = device_of[u]
                    busy[src] = False
                    touched.append(src)
                    remote = None
                    for tid, dsts in outs[u]:
                        far = None
                        for w in dsts:
                            if device_of[w] == src:
                                if now > ready_at[w]:
                                    ready_at[w] = now
                                remaining[w] -= 1
                                if remaining[w]:
                                    continue
                                if ready_at[w] > now:  # an input is still on its way
                                    heappush(events, (ready_at[w], n + rank[w]))
                                elif fixed:  # ready now, on src (touched): no event needed
                                    is_ready[w] = True
                                else:
                                    queue = avail.get(src)
                                    if queue is None:
                                        avail[src] = queue = []
                                    heappush(queue, (now, rank[w]))
                            elif far is None:
                                far = [w]
                            else:
                                far.append(w)
                        if far is not None:
                            if remote is None:
                                remote = [(tid, far)]
                            else:
                                remote.append((tid, far))
                    if remote is not None:
                        shipping.append((code, u, remote))
                # Dispatch: devices are independent, so only those touched need a look.
                for d in touched:
                    if busy[d]:
                        continue
                    if fixed:
                        seq = order[d]  # type: ignore[index]
                        p = pos[d]
                        if p == len(seq) or not is_ready[seq[p]]:
                            continue
                        v = seq[p]
                        pos[d] = p + 1
                        r = rank[v]
                    else:
                        queue = avail.get(d)
                        if not queue:
                            continue
                        r = heappop(queue)[1]
                        v = topo[r]
                    busy[d] = True
                    t = now + durs[d][v]
                    end[v] = t
                    if tracing:
                        start[v] = now
                        dispatch(v)
                    heappush(events, (t, r))
                if events and events[0][0] == now:
                    continue  # 0 µs ops just started: they end now too
                if not shipping:
                    break
                # Every op ending now has ended: issue its transfers in topological order.
                if len(shipping) > 1:
                    shipping.sort()
                for _, u, remote in shipping:
                    src = device_of[u]
                    for tid, far in remote:
                        if len(far) == 1:
                            targets = [device_of[far[0]]]
                        else:
                            targets = sorted({device_of[w] for w in far})
                        for dst in targets:
                            size = (
                                length[tid]
                                if length is not None
                                else transfer_length(tensors, ic, tid, src, dst)
                            )
                            send = recv = now
                            if sequential:
                                if chan_free[src] > send:
                                    send = chan_free[src]
                                chan_free[src] = send + size
                                recv = chan_free[dst] if chan_free[dst] > send else send
                                chan_free[dst] = recv + size
                            t = recv + size
                            if t > last:
                                last = t
                            if tracing:
                                copies[tid * ndev + dst] = (send, recv, t, size)
                            for w in far:
                                if device_of[w] == dst:
                                    if t > ready_at[w]:
                                        ready_at[w] = t
                                    remaining[w] -= 1
                                    if not remaining[w]:
                                        heappush(events, (ready_at[w], n + rank[w]))
                shipping = []
        if done != n:
            raise ValueError("the per-device order contradicts the graph's dependencies (deadlock)")
        step = max(max(end, default=0.0), last)
        return Timing(step, start, end, ready_at, dispatched, copies, device_of, ndev)
