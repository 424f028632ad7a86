"""The list-scheduling engine behind m-ETF and m-SCT.

Repeatedly commits the (ready op, device) pair with the earliest possible start, ties broken by
the op's topological index, then a placer-given preference among that op's devices, then the
device index. An op is ready once all its predecessors are committed, and a device is a
candidate for it when the op's colocation group is already there, or the group is unplaced and
the op fits there at the time it would start (co-adjusted colocation: committing the group's
first op places the whole group; memory counted along the schedule by
:class:`~baechi_cli.placers.liveness.LiveLedger`, when there is a budget).

Later ops of a placed group go to its device whatever the memory; should one exceed the budget
there, or should no device have room for any ready op, the schedule goes on over budget and says
so in its estimate, and :func:`~baechi_cli.placers.memory.place_in_memory` retries with a margin.

Start times come from :class:`~baechi_cli.evaluator.sim.ListSchedule`, the simulator's
list-schedule API (device channels and cached copies in ``sequential`` mode). The placement
carries the commit order; the evaluator judges it (exactly as planned in ``parallel`` mode).
Per-device heaps with lazily re-checked keys and one visible device per class of
interchangeable empty devices keep each step from rescanning (:func:`list_schedule`).

Complexity: O((V·A + E·A) log V) heap work for V ops, E edges and A visible devices (those used
or refused, plus one per class: A <= D) in ``parallel`` mode, where data-ready times never
change; in ``sequential`` mode each re-check of a top costs O(indegree) and tops are re-checked
only when their channel got busier. O(D) memory for the per-device state.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.graph import OpGraph
from baechi_cli.evaluator.placement import Placement
from baechi_cli.evaluator.sim import ListSchedule
from baechi_cli.placers.liveness import LiveLedger

# (op, device, device_of so far) -> 0 most preferred; breaks ties between one op's devices. It must
# give every device of one class holding no op the same answer (only one of them is asked).
Preference = Callable[[int, int, list[int]], int]


def list_schedule(
    graph: OpGraph,
    devices: DeviceSpec,
    algorithm: str,
    preference: Preference | None = None,
    preference_first: bool = False,
    budget: Sequence[int] | None = None,
) -> Placement:
    """Place and order every op, within ``budget`` bytes per device (None: memory is ample).

    ``preference`` breaks ties between one op's devices; with
    ``preference_first`` it also ranks ops: among candidates that can start
    at the same time, preferred (op, device) pairs go before lower
    topological indices. With a budget, the placement's ``info`` has the
    ledger's ``estimated_peak_bytes`` per device; when some op fits no device
    it goes where it exceeds the budget least (the estimate then says so, and
    :func:`~baechi_cli.placers.memory.place_in_memory` retries).

    Data structures: per device, ``waiting`` is a heap of candidates keyed by (data-ready time,
    rank, preference), and ``available`` a heap keyed by (rank, preference) of candidates whose
    inputs are there by the time the device is free. A device's best candidate is the top of
    ``available`` (it starts when the device is free) or else the top of ``waiting``. Keys grow
    (devices and channels only get busier), so a stale key is a lower bound: tops are re-checked
    lazily and re-pushed when their time has moved. The devices are asked in order of their tops'
    stale keys, and only while one could still beat the choice so far. One exception, in
    ``sequential`` mode: a copy sent for another consumer frees the op from queueing that input on
    the channels, so its ready time can move *earlier* (tests/test_placer_timelines.py has a
    case); its stale key then overstates it, and another op may be committed first where ETF's
    rule would take it. The evaluator judges the result either way.

    Interchangeable devices (:meth:`~baechi_cli.core.devices.DeviceSpec.classes`: same kind, same
    budget, no per-pair link) that hold nothing yet are in the same state, so of such a class only
    the lowest-index device is *visible* (the one the device-index tie-break would pick). A device
    leaves its class when it first gets an op or refuses a group on its own (the look-ahead, which
    packs devices in index order); it takes a copy of the class's heaps, and the next one becomes
    visible. A group the visible device refuses for room is refused by the whole class at once,
    as each of them would refuse it in turn.
    """
    n, ndev = graph.num_ops, devices.count
    order = graph.topo_order()
    rank = [0] * n
    for i, v in enumerate(order):
        rank[v] = i
    device_of = [-1] * n
    schedule = ListSchedule(graph, devices, device_of)
    ledger = None if budget is None else LiveLedger(graph, devices, schedule, budget)
    groups = graph.group_members()
    group, in_edges, out_edges, edge_dst = graph.group, graph.in_edges, graph.out_edges, graph.edge_dst
    group_device: dict[int, int] = {}  # colocation group -> its device, once its first op is committed
    sequential = schedule.sequential
    dev_free = schedule.dev_free
    pref = preference or (lambda v, d, device_of: 0)

    waiting: list[list[tuple[float, int, int, int]]] = [[] for _ in range(ndev)]
    available: list[list[tuple[int, int, int]]] = [[] for _ in range(ndev)]
    dead: list[set[int]] = [set() for _ in range(ndev)]  # ops whose group was refused by that device
    missing = [len(in_edges[v]) for v in range(n)]
    pending = 0  # ready, uncommitted ops

    # Interchangeable devices still holding nothing: only the lowest of each class is visible
    # and its heaps and refusals stand for all of them (docstring above).
    device_class = devices.classes(budget)
    class_members: list[list[int]] = []
    for d, c in enumerate(device_class):
        if c == len(class_members):
            class_members.append([])
        class_members[c].append(d)
    fresh_from = [1] * len(class_members)  # class_members[c][fresh_from[c]:] are the class's hidden devices
    representative = [False] * ndev  # whether d is visible and stands for its class's hidden devices
    visible = [m[0] for m in class_members]  # grows as devices leave their class; never shrinks
    for d in visible:
        representative[d] = True

    def leave_class(d: int) -> None:
        """d is about to differ from the rest of its class: the next one of them becomes visible."""
        if not representative[d]:
            return
        representative[d] = False
        c = device_class[d]
        if fresh_from[c] < len(class_members[c]):
            x = class_members[c][fresh_from[c]]
            fresh_from[c] += 1
            waiting[x], available[x], dead[x] = list(waiting[d]), list(available[d]), set(dead[d])
            representative[x] = True
            visible.append(x)

    def offer(v: int) -> None:
        placed = group_device.get(group[v], -1)
        if placed < 0:
            ds = [d for d in visible if v not in dead[d]]
            targets = zip(ds, schedule.data_ready_on(v, ds))
        else:
            targets = [(placed, schedule.data_ready(v, placed))]
        for d, ready in targets:
            p = pref(v, d, device_of)
            k1, k2 = (p, rank[v]) if preference_first else (rank[v], p)
            if ready <= dev_free[d]:
                heapq.heappush(available[d], (k1, k2, v))
            else:
                heapq.heappush(waiting[d], (ready, k1, k2, v))

    def valid(v: int, d: int) -> bool:
        if schedule.scheduled[v] or v in dead[d]:
            return False
        placed = group_device.get(group[v], -1)
        return placed < 0 or placed == d

    def best(d: int) -> tuple[float, int, int, int] | None:
        """(start, key1, key2, op) of device d's best candidate, keys refreshed."""
        w, a, free = waiting[d], available[d], dev_free[d]
        while w and w[0][0] <= free:
            _, k1, k2, v = heapq.heappop(w)
            if not valid(v, d):
                continue
            ready = schedule.data_ready(v, d) if sequential else 0.0
            if ready <= free:
                heapq.heappush(a, (k1, k2, v))
            else:
                heapq.heappush(w, (ready, k1, k2, v))
        while a:
            k1, k2, v = a[0]
            if not valid(v, d):
                heapq.heappop(a)
                continue
            if sequential:
                ready = schedule.data_ready(v, d)
                if ready > free:
                    heapq.heappop(a)
                    heapq.heappush(w, (ready, k1, k2, v))
                    continue
            return (free, k1, k2, v)
        while w:
            t, k1, k2, v = w[0]
            if not valid(v, d):
                heapq.heappop(w)
                continue
            if sequential:
                ready = schedule.data_ready(v, d)
                if ready > t:
                    heapq.heapreplace(w, (ready, k1, k2, v))
                    continue
            return (t, k1, k2, v)
        return None

    def floor(d: int) -> tuple[float, float, float, float] | None:
        """A lower bound of best(d) from its heaps' tops as they are (no refresh), None if both are empty.

        A top's stale key is at most any candidate's fresh one (keys grow; for the
        exception in ``sequential`` mode see list_schedule's docstring); a waiting top
        due by the time d is free may hide candidates of any key that start then."""
        a, w, free = available[d], waiting[d], dev_free[d]
        bound = (free, *a[0]) if a else None
        if w:
            t, k1, k2, v = w[0]
            due = (t, k1, k2, v) if t > free else (free, -math.inf, -math.inf, -math.inf)
            if bound is None or due < bound:
                bound = due
        return bound

    def commit(v: int, d: int) -> None:
        nonlocal pending
        schedule.commit(v, d)
        if ledger is not None:
            ledger.commit(v, d)
        pending -= 1
        for e in out_edges[v]:
            w = edge_dst[e]
            missing[w] -= 1
            if missing[w] == 0:
                offer(w)
                pending += 1

    def place_group(v: int, d: int) -> None:
        members = groups[group[v]]
        # Members refused by d earlier, now bound to it, and ready: offer them to d.
        refused = [
            x for x in members if x != v and x in dead[d] and missing[x] == 0 and not schedule.scheduled[x]
        ]
        group_device[group[v]] = d
        dead[d].difference_update(members)
        for x in refused:
            offer(x)
        if ledger is not None:
            ledger.place_group(group[v], d)

    look_ahead = True  # refuse placements that would strand a big colocation group
    stranded: list[tuple[int, int]] = []  # (op, device) refused only by the look-ahead
    for v in order:
        if missing[v] == 0:
            offer(v)
            pending += 1
    while pending:
        # The device with the earliest (start, keys) candidate, ties to the lowest index. Each
        # device's best is refreshed only while its floor could still beat the choice so far:
        # a refresh may ask when inputs arrive (O(indegree), again and again for an op
        # whose arrival keeps slipping as channels fill).
        floors = sorted((f, d) for d in visible if (f := floor(d)) is not None)
        choice = None
        for f, d in floors:
            if choice is not None and choice < (f, d):
                break
            top = best(d)
            if top is not None and (choice is None or (top, d) < choice):
                choice = (top, d)
        if choice is None:
            if stranded:  # only the look-ahead stood in the way: place greedily from here on
                look_ahead = False
                for v, d in stranded:
                    dead[d].discard(v)
                for v in sorted({v for v, _ in stranded}):
                    if missing[v] == 0 and not schedule.scheduled[v]:
                        offer(v)
                stranded.clear()
                continue
            # No device has room for any ready op: the least bad goes over its budget.
            assert ledger is not None  # without a budget every op is admitted
            v = min(
                (v for v in range(n) if missing[v] == 0 and not schedule.scheduled[v]), key=rank.__getitem__
            )
            # A hidden device would exceed by as much as its class's visible one, a higher index.
            d = min(visible, key=lambda d: (ledger.excess(v, d), d))
            leave_class(d)
            place_group(v, d)
            commit(v, d)
            continue
        (_, _, _, v), d = choice
        if group_device.get(group[v], -1) < 0:  # first op of its group: place the whole group
            if ledger is not None:
                ops = groups[group[v]]
                if not ledger.admits(v, d):
                    # For a visible class device: every hidden one has as little room.
                    dead[d].update(ops)
                    continue
                if look_ahead and not ledger.leaves_room(group[v], d):
                    leave_class(d)  # the packing depends on d's index: the others may not refuse
                    dead[d].update(ops)
                    stranded.extend((x, d) for x in ops)
                    continue
            leave_class(d)
            place_group(v, d)
        commit(v, d)  # a device a placed group is bound to has left its class already
    info = {} if ledger is None else {"estimated_peak_bytes": ledger.peak_bytes()}
    return Placement(list(device_of), sequence=list(schedule.sequence), schedule=schedule, info=info)
