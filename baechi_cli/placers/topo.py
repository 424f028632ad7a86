"""m-TOPO: Baechi's memory-constrained topological placer (the strawman).

Walks the ops in topological order and fills the devices in turn: each device
takes whole colocation groups until the next group would push its compute
past an equal share (total compute / device count), then the next device
starts. A group that does not fit the current device's memory goes to the
next device with room (wrapping around), so m-TOPO fails only when no device
can take the group; a device where the group would leave no room for a big
unplaced group (:meth:`MemoryLedger.leaves_room`) is passed over when another
one will do.

Complexity: O((V + E) log V) for the order plus O(V + E) ledger work per
device tried.

Example:
    >>> from baechi_cli.graph import GraphBuilder
    >>> from baechi_cli.devices import parse_devices
    >>> b = GraphBuilder()
    >>> ids = [b.add_op(f"op{i}", "X", [8], compute_us=10) for i in range(4)]
    >>> for s, d in zip(ids, ids[1:]): _ = b.add_edge(s, d)
    >>> place(b.build(), parse_devices("2x1KB"), NoOptions()).device_of
    [0, 0, 1, 1]
"""

from __future__ import annotations

from baechi_cli.devices import DeviceSpec
from baechi_cli.graph import OpGraph
from baechi_cli.placers import NoOptions, Placement
from baechi_cli.placers.memory import MemoryLedger, infeasible


def place(graph: OpGraph, devices: DeviceSpec, options: NoOptions) -> Placement:
    """Place ``graph`` with m-TOPO; raises InfeasibleError when a group fits nowhere."""
    ndev = devices.count
    dur = graph.compute_us
    share = sum(dur) / ndev
    groups = graph.group_members()
    ledger = MemoryLedger(graph, devices)
    load = [0.0] * ndev
    current = 0
    for v in graph.topo_order():
        if ledger.device_of[v] >= 0:
            continue
        ops = groups[graph.group[v]]
        compute = sum(dur[x] for x in ops)
        if current < ndev - 1 and load[current] > 0 and load[current] + compute > share:
            current += 1
        d, extra = _first_with_room(ledger, ops, [(current + step) % ndev for step in range(ndev)])
        if d < 0:
            raise infeasible(graph, devices, "m-TOPO", ledger, ops)
        ledger.commit(ops, d, extra)
        load[d] += compute
    return Placement(ledger.device_of, info={"compute_share_us": share})


def _first_with_room(
    ledger: MemoryLedger, ops: list[int], candidates: list[int]
) -> tuple[int, dict[int, int]]:
    """The first device where ``ops`` fit without stranding a big group, else the first where they fit."""
    fallback: tuple[int, dict[int, int]] = (-1, {})
    for d in candidates:
        extra = ledger.extra(ops, d)
        if ledger.fits(extra):
            if ledger.leaves_room(ops, d, extra):
                return d, extra
            if fallback[0] < 0:
                fallback = (d, extra)
    return fallback
