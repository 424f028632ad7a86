"""MemoryLedger: what placers count against each device's memory while placing.

The simulator frees tensors when their last consumer ends; a placer deciding
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
    >>> from baechi_cli.graph import GraphBuilder
    >>> from baechi_cli.devices import parse_devices
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

from collections.abc import Sequence

from baechi_cli.devices import DeviceSpec
from baechi_cli.errors import InfeasibleError
from baechi_cli.graph import CONTROL_PORT, OpGraph


def own_bytes(graph: OpGraph) -> list[int]:
    """Bytes each op holds on its device for the whole step in the ledger: persistent + outputs.

    Temporary bytes are not summed: the ledger charges a device the largest
    of its ops' temporaries once.
    """
    return [graph.persistent_bytes[v] + sum(graph.output_bytes[v]) for v in range(graph.num_ops)]


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
        for g, nbytes in self._big:
            if g == placing or self.device_of[g] >= 0:
                continue
            for x in range(len(free)):
                if free[x] >= nbytes:
                    free[x] -= nbytes
                    break
            else:
                return False
        return True

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
    own = own_bytes(graph)
    groups = graph.group_members()
    largest_device = max(d.memory_bytes for d in devices.devices)
    total = devices.total_memory
    gives = f"devices give {_fmt(largest_device)} on the largest one / {_fmt(total)} in total"

    def need(per_op: Sequence[int]) -> tuple[int, int, int]:
        """(largest group's bytes, total bytes, the heaviest op of that group)."""
        by_group = {g: sum(per_op[v] for v in ops) for g, ops in groups.items()}
        worst = max(by_group, key=lambda g: (by_group[g], -g))
        heaviest = max(groups[worst], key=lambda v: (per_op[v], -v))
        return by_group[worst], sum(per_op), heaviest

    one, all_, worst = need(graph.persistent_bytes)
    if one > largest_device or all_ > total:
        return InfeasibleError(
            f"the model does not fit: it needs at least {_fmt(one)} on one device "
            f"(colocation group of '{graph.names[worst]}') / {_fmt(all_)} in total "
            f"for weights alone; {gives}"
        )
    pair = _worst_pair(graph)
    if pair is not None and pair[0] > largest_device:
        together, apart, e = pair[1], pair[2], pair[3]
        u, v = graph.edge_src[e], graph.edge_dst[e]
        return InfeasibleError(
            f"the model does not fit: '{graph.names[v]}' reads a {_fmt(graph.edge_bytes[e]).split(' (')[0]} "
            f"tensor from '{graph.names[u]}'; on one device their colocation groups hold "
            f"{_fmt(together)}, apart the received copy makes {_fmt(apart)} on the reader's device; {gives}"
        )
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
    one, all_, worst = need(own)
    return InfeasibleError(
        f"{algorithm} could not fit the model: counting every tensor live for the whole step, "
        f"it needs at least {_fmt(one)} on one device (colocation group of '{graph.names[worst]}') "
        f"/ {_fmt(all_)} in total; {gives}"
    )


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
    """Bytes in the SI units the device spec uses, with the exact count."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit} ({nbytes} bytes)"
    return f"{nbytes} bytes"
