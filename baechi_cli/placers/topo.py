"""m-TOPO: Baechi's memory-constrained topological placer (the strawman).

Walks the ops in topological order and fills the devices in turn: each device
takes whole colocation groups until the next group would push its compute
past an equal share (total compute / device count), then the next device
starts. A group that does not fit the current device's memory goes to the
next device with room (wrapping around); a device where the group would
leave no room for a big unplaced group
(:meth:`~baechi_cli.placers.liveness.LiveLedger.leaves_room`) is passed over
when another one will do.

Memory is counted by liveness, as m-ETF counts it: the walk commits each op to
a list schedule on its device (ops in topological order per device), and a
group fits a device when its first op fits there at the time it would start.
The evaluator, which orders each device's ops itself, confirms the placement
(:func:`~baechi_cli.placers.memory.place_in_memory`).

Complexity: O((V + E) log V) for the order; with memory to count, O(V + E)
for the schedule and the ledger, times the devices tried per group.

Example:
    >>> from baechi_cli.core.graph import GraphBuilder
    >>> from baechi_cli.core.devices import parse_devices
    >>> b = GraphBuilder()
    >>> ids = [b.add_op(f"op{i}", "X", [8], compute_us=10) for i in range(4)]
    >>> for s, d in zip(ids, ids[1:]): _ = b.add_edge(s, d)
    >>> place(b.build(), parse_devices("2x1KB"), NoOptions()).device_of
    [0, 0, 1, 1]
"""

from __future__ import annotations

from collections.abc import Iterable

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.graph import OpGraph
from baechi_cli.evaluator.placement import Placement
from baechi_cli.evaluator.sim import ListSchedule
from baechi_cli.placers import NoOptions
from baechi_cli.placers.liveness import LiveLedger
from baechi_cli.placers.memory import place_in_memory


def place(graph: OpGraph, devices: DeviceSpec, options: NoOptions) -> Placement:
    """Place ``graph`` with m-TOPO; raises InfeasibleError when no placement it finds fits memory."""
    return place_in_memory(graph, devices, "m-TOPO", lambda budget: _fill(graph, devices, budget))


def _fill(graph: OpGraph, devices: DeviceSpec, budget: list[int] | None) -> Placement:
    """One walk, within ``budget`` bytes per device (None: no memory to count)."""
    ndev = devices.count
    dur = graph.compute_us
    share = sum(dur) / ndev
    groups = graph.group_members()
    device_of = [-1] * graph.num_ops
    schedule = ledger = None
    if budget is not None:
        schedule = ListSchedule(graph, devices, [-1] * graph.num_ops)
        ledger = LiveLedger(graph, devices, schedule, budget)
    load = [0.0] * ndev
    current = 0
    for v in graph.topo_order():
        if device_of[v] < 0:
            ops = groups[graph.group[v]]
            compute = sum(dur[x] for x in ops)
            if current < ndev - 1 and load[current] > 0 and load[current] + compute > share:
                current += 1
            d = current
            if ledger is not None:
                d = _first_with_room(ledger, v, ((current + step) % ndev for step in range(ndev)))
                ledger.place_group(graph.group[v], d)
            for x in ops:
                device_of[x] = d
            load[d] += compute
        if ledger is not None:
            schedule.commit(v, device_of[v])
            ledger.commit(v, device_of[v])
    info = {"compute_share_us": share}
    if ledger is not None:
        info["estimated_peak_bytes"] = ledger.peak_bytes()
    return Placement(device_of, info=info)


def _first_with_room(ledger: LiveLedger, v: int, candidates: Iterable[int]) -> int:
    """The first device where ``v`` fits without stranding a big group, else the first where it
    fits, else the one it exceeds least.

    ``candidates`` is consumed lazily: with thousands of devices the first one or two usually
    have room, and the rest are never asked."""
    group = ledger.graph.group[v]
    fallback = -1
    excess = []
    for d in candidates:
        over = ledger.excess(v, d)
        if over <= 0:
            if ledger.leaves_room(group, d):
                return d
            if fallback < 0:
                fallback = d
        excess.append((over, d))
    return fallback if fallback >= 0 else min(excess)[1]
