"""Memory for placers: fitting a placement in memory, and the whole-step ledger.

:func:`place_in_memory` is how m-TOPO, m-ETF and m-SCT keep their promise
never to exceed device memory: they count memory by liveness along the
schedule they build (:class:`~baechi_cli.placers.liveness.LiveLedger`), the
evaluator confirms what their own count cannot promise, and a placement the
evaluator finds over memory is placed again with that device's budget cut
by the excess. :func:`over_memory_error` is the one error for a placement
over memory, whoever made it.

:class:`MemoryLedger` is the simple, conservative alternative for placers
that plan no schedule (see docs/ADDING_A_PLACER.md). The simulator frees tensors when their last consumer ends; a placer deciding
op by op cannot know those times yet. The ledger therefore counts an upper
bound of the simulator's peak: every op's persistent and output bytes for
the whole step, the largest temporary bytes of any op on the device (a device
runs one op at a time, and the simulator holds an op's temporaries only while
it runs), plus one received copy of every tensor a device consumes from
another device — reserved as soon as the consumer is placed, and given back
if the producer then lands on the same device. A placement that fits the
ledger fits the simulator, which is how every placer keeps its promise never
to exceed device memory.

Example:
    >>> from baechi_cli.core.graph import GraphBuilder
    >>> from baechi_cli.core.devices import parse_devices
    >>> b = GraphBuilder()
    >>> a = b.add_op("a", "A", [100], persistent_bytes=50)
    >>> c = b.add_op("c", "C", [10])
    >>> _ = b.add_edge(a, c)
    >>> ledger = MemoryLedger(b.build(), parse_devices("2x1KB"))
    >>> ledger.commit([a], 0, ledger.extra([a], 0))
    >>> ledger.extra([c], 1)   # c's output, plus a copy of a's output on device 1
    {1: 110}
    >>> ledger.extra([c], 0)   # beside a, no copy
    {0: 10}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.errors import InfeasibleError
from baechi_cli.core.graph import CONTROL_PORT, OpGraph, own_bytes

if TYPE_CHECKING:
    from baechi_cli.evaluator.placement import Placement
    from baechi_cli.evaluator.sim import SimResult

# Placements tried before giving up: the first with each device's memory as its
# budget, each later one with the budgets the evaluator showed too generous cut.
MEMORY_ATTEMPTS = 8
# Besides the excess, a cut takes this share of the device's memory more, so that
# a placement that changes a little under the cut still fits.
CUT_MARGIN = 0.02


def ample(graph: OpGraph, devices: DeviceSpec) -> bool:
    """Whether every device could hold the whole graph however it is placed and scheduled.

    Every op's persistent and output bytes, the largest temporary and one copy
    of every tensor: then no placer needs to count memory at all. O(V + E).
    """
    t = graph.tensors
    copies = sum(b for b, port in zip(t.nbytes, t.port) if port != CONTROL_PORT)
    need = sum(own_bytes(graph)) + max(graph.temporary_bytes, default=0) + copies
    return all(d.memory_bytes >= need for d in devices.devices)


def place_in_memory(
    graph: OpGraph,
    devices: DeviceSpec,
    algorithm: str,
    attempt: Callable[[list[int] | None], Placement],
) -> Placement:
    """The placement ``attempt(budget)`` makes within device memory, as the evaluator judges it.

    ``attempt`` places ``graph`` keeping each device ``d`` within
    ``budget[d]`` bytes as it counts them (``None``: memory is ample, count
    nothing) and reports its count as ``info["estimated_peak_bytes"]``. When
    memory is ample, the first attempt is the placement. Otherwise a
    placement is accepted when the evaluator's peaks fit, or without a
    simulation when the placer's count is exact or above it (``parallel``
    mode, a planned sequence: the evaluator runs the plan) and fits. Else the
    budget of each device over memory is cut by its excess plus a margin and
    the placer tries again, at most :data:`MEMORY_ATTEMPTS` times; then the
    last placement's :func:`over_memory_error` is raised.

    The placement's ``info["memory"]`` says how many attempts it took.
    """
    from baechi_cli.evaluator.evaluate import evaluate

    if ample(graph, devices):
        return attempt(None)
    capacity = [d.memory_bytes for d in devices.devices]
    budget = list(capacity)
    exact = devices.interconnect.mode == "parallel"
    for tries in range(1, MEMORY_ATTEMPTS + 1):
        placement = attempt(budget)
        estimate = placement.info.get("estimated_peak_bytes")
        if exact and placement.sequence is not None and estimate is not None:
            if all(e <= c for e, c in zip(estimate, capacity)):
                placement.info["memory"] = {"attempts": tries, "checked_by": "the placer's own count"}
                return placement
        timeline = evaluate(graph, devices, placement).timeline
        if timeline.feasible:
            placement.info["memory"] = {"attempts": tries, "checked_by": "the evaluator"}
            return placement
        budget = cut_budget(budget, timeline.peak_bytes, capacity)
        if budget is None:
            break
    minimum = hard_minimum(graph, devices)
    if minimum is not None:
        raise minimum
    raise over_memory_error(timeline, graph, devices, f"{algorithm} found no placement that fits")


def cut_budget(budget: Sequence[int], peaks: Sequence[int], capacity: Sequence[int]) -> list[int] | None:
    """``budget`` with each device whose ``peaks`` exceed its ``capacity`` cut by the excess and a margin.

    None when a budget would reach zero: no point trying again.
    """
    cut = [b - (p - c) - int(c * CUT_MARGIN) if p > c else b for b, p, c in zip(budget, peaks, capacity)]
    return cut if min(cut) > 0 else None


def over_memory_error(sim: SimResult, graph: OpGraph, devices: DeviceSpec, problem: str) -> InfeasibleError:
    """The error for a placement whose simulated peak exceeds a device's memory.

    ``problem`` opens it; it goes on with the first device over memory, the op
    running when that device's peak is reached, the peak and the excess.
    """
    d = sim.over_memory()[0]
    device = devices.devices[d]
    peak = sim.peak_bytes[d]
    at = next(t for t, level in sim.memory_curve[d] if level == peak)
    running = [v for v in sim.order[d] if sim.start[v] <= at < sim.end[v] or sim.start[v] == at]
    where = f" while '{graph.names[running[0]]}' runs" if running else ""
    return InfeasibleError(
        f"{problem}: {device.name} peaks at {_fmt(peak)}{where}, "
        f"{_fmt(peak - device.memory_bytes)} over its {_fmt(device.memory_bytes)}"
    )


def first_fit(sizes: Sequence[int], free: list[int]) -> bool:
    """Whether ``sizes`` (largest first) pack into devices with ``free`` bytes, first fit. Uses up ``free``."""
    for nbytes in sizes:
        for x in range(len(free)):
            if free[x] >= nbytes:
                free[x] -= nbytes
                break
        else:
            return False
    return True


def safe_peaks(graph: OpGraph, device_of: Sequence[int], ndev: int) -> list[int]:
    """What :class:`MemoryLedger` would count on each device for the whole placement ``device_of``.

    Every op's :func:`own_bytes`, the largest temporary, and one received copy
    of each tensor a device reads from another: an upper bound of the
    evaluator's peak whatever the schedule. O(V + E).
    """
    t = graph.tensors
    need = [0] * ndev
    temporary = [0] * ndev
    for v, own in enumerate(own_bytes(graph)):
        d = device_of[v]
        need[d] += own
        temporary[d] = max(temporary[d], graph.temporary_bytes[v])
    received: set[int] = set()  # tensor id * ndev + device
    for e in range(graph.num_edges):
        if graph.edge_port[e] == CONTROL_PORT:
            continue
        tid = t.edge_tensor[e]
        d = device_of[graph.edge_dst[e]]
        key = tid * ndev + d
        if d != device_of[t.src[tid]] and key not in received:
            received.add(key)
            need[d] += t.nbytes[tid]
    return [n + m for n, m in zip(need, temporary)]


class MemoryLedger:
    """Per-device used bytes (upper bound of the simulated peak) as ops are placed."""

    def __init__(self, graph: OpGraph, devices: DeviceSpec) -> None:
        self.graph = graph
        self.own = own_bytes(graph)
        self.temporary = graph.temporary_bytes
        self.capacity = [d.memory_bytes for d in devices.devices]
        self.used = [0] * devices.count
        # The largest temporary bytes among the ops on each device (in ``used``).
        self.temporary_peak = [0] * devices.count
        self._any_temporary = any(self.temporary)
        self.device_of = [-1] * graph.num_ops
        # Copies counted on a device: tensor id * device count + device.
        self._reserved: set[int] = set()
        self._edge_tensor = graph.tensors.edge_tensor
        self._tensor_bytes = graph.tensors.nbytes
        # Groups big enough to strand: a placer that fills devices greedily can
        # leave no device with room for one of them although the total fits.
        # (group id, bytes), largest first; see leaves_room().
        threshold = min(self.capacity) // 100
        sizes: dict[int, int] = {}
        for v, g in enumerate(graph.group):
            sizes[g] = sizes.get(g, 0) + self.own[v]
        self._big = sorted(((g, b) for g, b in sizes.items() if b >= threshold), key=lambda x: (-x[1], x[0]))
        self._big_bytes = dict(self._big)
        self._big_unplaced = sum(b for _, b in self._big)

    def extra(self, ops: Sequence[int], d: int) -> dict[int, int]:
        """Bytes each device would gain (or get back, negative) if ``ops`` went to ``d``.

        Copies are reserved when the consumer is placed, before its producer
        is (then as if the producer landed elsewhere), and given back when the
        producer lands on the consumer's device: so a device never ends up
        owing a copy it has no room for because of a later placement.
        """
        g = self.graph
        device_of, reserved = self.device_of, self._reserved
        edge_tensor, tensor_bytes = self._edge_tensor, self._tensor_bytes
        members = set(ops)
        add = {d: sum(self.own[v] for v in ops)}
        if self._any_temporary:
            temporary = max((self.temporary[v] for v in ops), default=0)
            if temporary > self.temporary_peak[d]:
                add[d] += temporary - self.temporary_peak[d]
        new: set[int] = set()
        ndev = len(self.capacity)
        for v in ops:
            for e in g.in_edges[v]:
                u = g.edge_src[e]
                if g.edge_port[e] == CONTROL_PORT or u in members or device_of[u] == d:
                    continue
                key = edge_tensor[e] * ndev + d
                if key not in reserved and key not in new:
                    new.add(key)
                    add[d] += tensor_bytes[edge_tensor[e]]
            for e in g.out_edges[v]:
                w = g.edge_dst[e]
                key = edge_tensor[e] * ndev + d
                if device_of[w] == d and w not in members and key in reserved and key not in new:
                    new.add(key)  # w reserved a copy of this tensor on d: no longer needed
                    add[d] -= tensor_bytes[edge_tensor[e]]
        return add

    def fits(self, extra: dict[int, int]) -> bool:
        return all(self.used[x] + b <= self.capacity[x] for x, b in extra.items())

    def leaves_room(self, ops: Sequence[int], d: int, extra: dict[int, int]) -> bool:
        """Whether, with ``ops`` on ``d``, the big unplaced groups still pack (first fit decreasing).

        A look-ahead against stranding a large colocation group: it runs only
        while the big groups are a sizeable share of the free memory, and costs
        O(big groups x devices) then.
        """
        placing = self.graph.group[ops[0]]
        pending = self._big_unplaced - self._big_bytes.get(placing, 0)
        if pending == 0:
            return True
        free = [c - u - extra.get(x, 0) for x, (c, u) in enumerate(zip(self.capacity, self.used))]
        if pending * 2 <= sum(free):
            return True
        return first_fit([b for g, b in self._big if g != placing and self.device_of[g] < 0], free)

    def commit(self, ops: Sequence[int], d: int, extra: dict[int, int]) -> None:
        """Place ``ops`` on ``d``; ``extra`` must be ``self.extra(ops, d)``."""
        g = self.graph
        placing = g.group[ops[0]]
        if self.device_of[placing] < 0:
            self._big_unplaced -= self._big_bytes.get(placing, 0)
        for x, b in extra.items():
            self.used[x] += b
        for v in ops:
            self.device_of[v] = d
        if self._any_temporary:
            self.temporary_peak[d] = max(
                self.temporary_peak[d], max((self.temporary[v] for v in ops), default=0)
            )
        ndev = len(self.capacity)
        edge_tensor = self._edge_tensor
        for v in ops:
            for e in g.in_edges[v]:
                u = g.edge_src[e]
                if g.edge_port[e] != CONTROL_PORT and self.device_of[u] != d:
                    self._reserved.add(edge_tensor[e] * ndev + d)
            for e in g.out_edges[v]:
                if self.device_of[g.edge_dst[e]] == d:
                    self._reserved.discard(edge_tensor[e] * ndev + d)


def infeasible(
    graph: OpGraph,
    devices: DeviceSpec,
    algorithm: str,
    ledger: MemoryLedger | None = None,
    stuck: Sequence[int] = (),
) -> InfeasibleError:
    """The error a placer raises when its ledger cannot fit the graph.

    States the hard minimum (the largest colocation group's persistent bytes
    on one device; all persistent bytes in total) when even that does not fit.
    Else, given the placer's ``ledger`` and the ops it could not place
    (``stuck``), says which group found no room and how much each device had
    left; without them, what the ledger's conservative count needs.
    """
    minimum = hard_minimum(graph, devices)
    if minimum is not None:
        return minimum
    own = own_bytes(graph)
    groups = graph.group_members()
    gives = _gives(devices)
    if ledger is not None and stuck:
        group = groups[graph.group[stuck[0]]]
        heaviest = max(group, key=lambda v: (own[v], -v))
        free = ", ".join(_fmt(c - u).split(" (")[0] for c, u in zip(ledger.capacity, ledger.used))
        placed = sum(1 for d in ledger.device_of if d >= 0)
        return InfeasibleError(
            f"{algorithm} could not fit the model: with {placed} of {graph.num_ops} ops placed, no device "
            f"has room for the colocation group of '{graph.names[heaviest]}' "
            f"({_fmt(sum(own[v] for v in group))}, plus copies of its inputs); free per device: {free}. "
            f"Counting every tensor live for the whole step and a copy of every tensor a device "
            f"receives, the model needs {_fmt(sum(own))} in total; {gives}"
        )
    one, all_, worst = _need(groups, own)
    return InfeasibleError(
        f"{algorithm} could not fit the model: counting every tensor live for the whole step, "
        f"it needs at least {_fmt(one)} on one device (colocation group of '{graph.names[worst]}') "
        f"/ {_fmt(all_)} in total; {gives}"
    )


def hard_minimum(graph: OpGraph, devices: DeviceSpec) -> InfeasibleError | None:
    """The error when no placement at all can fit, else None.

    The largest colocation group's weights must fit the largest device and all
    weights the devices together; a producer/consumer pair needs, on one
    device, either both groups' weights or the consumer's plus a copy of the
    tensor. O(V + E).
    """
    groups = graph.group_members()
    largest_device = max(d.memory_bytes for d in devices.devices)
    one, all_, worst = _need(groups, graph.persistent_bytes)
    if one > largest_device or all_ > devices.total_memory:
        return InfeasibleError(
            f"the model does not fit: it needs at least {_fmt(one)} on one device "
            f"(colocation group of '{graph.names[worst]}') / {_fmt(all_)} in total "
            f"for weights alone; {_gives(devices)}"
        )
    op_need = _largest_op_need(graph)
    if op_need is not None and op_need[0] > largest_device:
        need, v, weights, own, largest_input = op_need
        return InfeasibleError(
            f"the model does not fit: '{graph.names[v]}' needs at least {_fmt(need)} on one device "
            f"while it runs: its colocation group's weights {_fmt(weights).split(' (')[0]}, its outputs "
            f"and temporaries {_fmt(own).split(' (')[0]}, its largest input "
            f"{_fmt(largest_input).split(' (')[0]}; {_gives(devices)}"
        )
    pair = _worst_pair(graph)
    if pair is not None and pair[0] > largest_device:
        together, apart, e = pair[1], pair[2], pair[3]
        u, v = graph.edge_src[e], graph.edge_dst[e]
        return InfeasibleError(
            f"the model does not fit: '{graph.names[v]}' reads a {_fmt(graph.edge_bytes[e]).split(' (')[0]} "
            f"tensor from '{graph.names[u]}'; on one device their colocation groups hold "
            f"{_fmt(together)}, apart the received copy makes {_fmt(apart)} on the reader's device; "
            f"{_gives(devices)}"
        )
    return None


def _largest_op_need(graph: OpGraph) -> tuple[int, int, int, int, int] | None:
    """The op needing the most memory on its device while it runs, whatever the placement.

    Its group's weights, its temporaries and its outputs (unless it is a
    view), and its largest input that is not a view (a view may share storage
    with the weights or another input). An input is there as its producer's
    output (beside it) or as a received copy (apart), so it counts the smaller
    of the two: a workload JSON's ports hold 0 bytes, and its producer beside
    it needs no room for a tensor however big its edges say it is. Returns
    (bytes, op, weights, outputs and temporaries, input). O(V + E).
    """
    weights: dict[int, int] = {}
    for v, g in enumerate(graph.group):
        weights[g] = weights.get(g, 0) + graph.persistent_bytes[v]
    view_of = graph.view_of
    src, port, output_bytes = graph.edge_src, graph.edge_port, graph.output_bytes
    best = None
    for v in range(graph.num_ops):
        own = graph.temporary_bytes[v] + (0 if v in view_of else sum(output_bytes[v]))
        largest_input = max(
            (
                min(graph.edge_bytes[e], output_bytes[src[e]][port[e]])
                for e in graph.in_edges[v]
                if port[e] != CONTROL_PORT and src[e] not in view_of
            ),
            default=0,
        )
        need = weights[graph.group[v]] + own + largest_input
        if best is None or need > best[0]:
            best = (need, v, weights[graph.group[v]], own, largest_input)
    return best


def _need(groups: dict[int, list[int]], per_op: Sequence[int]) -> tuple[int, int, int]:
    """(largest group's bytes, total bytes, the heaviest op of that group)."""
    by_group = {g: sum(per_op[v] for v in ops) for g, ops in groups.items()}
    worst = max(by_group, key=lambda g: (by_group[g], -g))
    heaviest = max(groups[worst], key=lambda v: (per_op[v], -v))
    return by_group[worst], sum(per_op), heaviest


def _gives(devices: DeviceSpec) -> str:
    largest = max(d.memory_bytes for d in devices.devices)
    return f"devices give {_fmt(largest)} on the largest one / {_fmt(devices.total_memory)} in total"


def _worst_pair(graph: OpGraph) -> tuple[int, int, int, int] | None:
    """The producer/consumer pair whose groups need the most on one device, whatever the placement.

    Together, a device holds both groups' persistent bytes; apart, the
    consumer's device holds its group and a copy of the tensor. The smaller of
    the two is a hard minimum. Returns (minimum, together, apart, edge).
    """
    persistent: dict[int, int] = {}
    for v, g in enumerate(graph.group):
        persistent[g] = persistent.get(g, 0) + graph.persistent_bytes[v]
    best = None
    for e in range(graph.num_edges):
        gu, gv = graph.group[graph.edge_src[e]], graph.group[graph.edge_dst[e]]
        if gu == gv or graph.edge_port[e] == CONTROL_PORT:
            continue
        together = persistent[gu] + persistent[gv]
        apart = persistent[gv] + graph.edge_bytes[e]
        need = min(together, apart)
        if best is None or need > best[0]:
            best = (need, together, apart, e)
    return best


def _fmt(nbytes: int) -> str:
    """Bytes in the SI units the device spec uses, with the exact count; past 10^18 bytes only the
    count's first three digits and exponent (a message never holds a 300-digit number)."""
    if nbytes >= 10**18:
        digits = str(nbytes)
        return f"{digits[0]}.{digits[1:3]}e{len(digits) - 1} bytes"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit} ({nbytes} bytes)"
    return f"{nbytes} bytes"
