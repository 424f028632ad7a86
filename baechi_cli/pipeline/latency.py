"""Single-sample latency splits: Tarnawski et al.'s latency objective and an exact solver for it.

The model (Tarnawski et al., NeurIPS 2020, Appendix A/F; their ``lip.py`` and ``greedy.cpp
-computeLatency``): one sample passes through the graph. ``k`` identical accelerators of
``memory`` bytes each run one *contiguous* subgraph (the difference of two ideals) as one call,
which starts when every op outside it that feeds it has finished, then receives its inputs,
computes and sends its outputs, communication not overlapped with compute::

    finish(S) = max(finish of S's producers outside S) + in(S) + compute(S) + out(S)

``in(S)`` is the transfer time of every tensor made outside ``S`` and read in it (once per
tensor), ``out(S)`` of every tensor made in ``S`` and read outside it. An op on a CPU runs as
soon as its inputs are ready, at its CPU time, with no transfers (their model has as many CPU
cores as the graph is wide; ``maxCPUs`` only says whether CPUs may be used). The split's
*latency* is the last finish. Valid splits keep colocation groups on one device and each
accelerator's ops within its memory (``size``).

:func:`evaluate_latency` prices any assignment as ``greedy.cpp -computeLatency`` does: an
accelerator's ops that are not contiguous are cut into the fewest contiguous pieces, each a
call of its own. :func:`solve_latency` is exact within the model: a DP over ranges of a few
topological orders gives an upper bound, a label search over chains of ideals proves or improves
it, and past ``max_sets`` the best split is returned with ``proven=False``, a valid lower bound
and a local-search polish. A unit on a CPU is timed as one block (exact for a unit of one op;
the evaluator, timing each op by itself, can only be earlier).

Example:
    >>> from baechi_cli.pipeline.maxload import LoadModel
    >>> m = LoadModel.chain([4.0, 1.0, 3.0, 2.0], send_us=[0.5, 0.5, 0.5, 0.0], accelerators=2)
    >>> s = solve_latency(m)
    >>> s.latency_us, s.stage_units, s.proven
    (10.0, [[0, 1, 2, 3]], True)
    >>> m2 = LoadModel(**{**m.__dict__, "size": [5, 5, 5, 5], "memory": 10.0})
    >>> s2 = solve_latency(m2)
    >>> s2.latency_us, s2.stage_units, s2.proven
    (11.0, [[0, 1], [2, 3]], True)
    >>> evaluate_latency(m2, [0, 0, 1, 1]).finish_us
    [5.5, 11.0]
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from baechi_cli.core.devices import format_si
from baechi_cli.core.errors import InfeasibleError, InputError
from baechi_cli.pipeline.maxload import Growing, LoadModel, Units, build_units, fixed_costs, other_orders

# Floating-point slack when comparing times summed in different orders.
_EPS = 1e-9
# Splits the local search after an unfinished exact search may judge (about a second's worth).
IMPROVE_EVALUATIONS = 300
# Calls the exact search may enumerate before it settles for the best found with a bound: the
# pipeline may run it again on cut memory, so keep it near a second (bench/history/placement.md).
DEFAULT_MAX_SETS = 40_000


@dataclass(frozen=True)
class LatencyEvaluation:
    """One assignment judged by the latency model: its calls in the order they were timed."""

    latency_us: float
    call_device: list[int]  # per call (a contiguous piece of one accelerator's ops, or a CPU op), its device
    call_of_op: list[int]
    start_us: list[float]  # per call, when its inputs were all ready
    finish_us: list[float]  # per call, when its outputs were sent
    bytes_used: list[int]  # per accelerator
    within_memory: bool


def evaluate_latency(model: LoadModel, device_of_op: Sequence[int]) -> LatencyEvaluation:
    """The latency of any assignment of ops to devices (module docstring); O(k (V + E)).

    Devices ``0 .. accelerators-1`` are the accelerators, higher ones CPU
    cores. An accelerator's ops that are not contiguous are cut into
    contiguous calls, as ``greedy.cpp -computeLatency`` does. Raises
    InfeasibleError when calls wait on each other in a cycle (two contiguous
    sets can each feed the other), which no order of calls can run.

    >>> m = LoadModel.chain([1.0, 2.0, 3.0], send_us=[0.5, 0.25], accelerators=2)
    >>> evaluate_latency(m, [0, 1, 0]).finish_us  # device 0 runs two calls, one each side of device 1's
    [1.5, 7.5, 4.25]
    """
    n, k = model.num_ops, model.accelerators
    succs: list[list[int]] = [[] for _ in range(n)]
    preds: list[list[int]] = [[] for _ in range(n)]
    for a, b in set(model.edges):
        if a != b:
            succs[a].append(b)
            preds[b].append(a)
    order = _op_order(n, preds, succs)
    # Calls: (device, piece) for accelerator ops, one per op on a CPU.
    call_of = [-1] * n
    call_device: list[int] = []
    for d in sorted({d for d in device_of_op if d < k}):
        piece = [0] * n
        ids: dict[int, int] = {}
        for v in order:
            mine = device_of_op[v] == d
            level = 1 if mine else 0
            for p in preds[v]:
                level = max(level, piece[p] + (mine and device_of_op[p] != d))
            piece[v] = level
            if mine:
                if level not in ids:
                    ids[level] = len(call_device)
                    call_device.append(d)
                call_of[v] = ids[level]
    for v in range(n):
        if device_of_op[v] >= k:
            call_of[v] = len(call_device)
            call_device.append(device_of_op[v])
    calls = len(call_device)
    members: list[list[int]] = [[] for _ in range(calls)]
    for v in range(n):
        members[call_of[v]].append(v)
    cost = [0.0] * calls
    for c, ops in enumerate(members):
        on_accel = call_device[c] < k
        cost[c] = sum(model.accel_us[v] if on_accel else model.cpu_us[v] for v in ops)
    for t, src in enumerate(model.tensor_src):
        home = call_of[src]
        readers = {call_of[w] for w in model.tensor_dst[t]} - {home}
        if not readers:
            continue
        if call_device[home] < k:
            cost[home] += model.tensor_us[t]  # sent once
        for c in readers:
            if call_device[c] < k:
                cost[c] += model.tensor_us[t]  # received once per call
    call_preds: list[set[int]] = [set() for _ in range(calls)]
    for b in range(n):
        for a in preds[b]:
            if call_of[a] != call_of[b]:
                call_preds[call_of[b]].add(call_of[a])
    call_succs: list[list[int]] = [[] for _ in range(calls)]
    missing = [len(p) for p in call_preds]
    for c, ps in enumerate(call_preds):
        for p in ps:
            call_succs[p].append(c)
    start = [0.0] * calls
    finish = [0.0] * calls
    ready = [c for c in range(calls) if missing[c] == 0]
    timed = 0
    while ready:  # the calls in a topological order
        c = ready.pop()
        timed += 1
        start[c] = max((finish[p] for p in call_preds[c]), default=0.0)
        finish[c] = start[c] + cost[c]
        for s in call_succs[c]:
            missing[s] -= 1
            if missing[s] == 0:
                ready.append(s)
    if timed != calls:
        # Two contiguous calls can still feed each other (a -> b and b' -> a'): no call can start.
        raise InfeasibleError("the split's calls wait on each other in a cycle")
    used = [0] * k
    for v, d in enumerate(device_of_op):
        if d < k:
            used[d] += model.size[v]
    return LatencyEvaluation(
        latency_us=max(finish, default=0.0),
        call_device=call_device,
        call_of_op=call_of,
        start_us=start,
        finish_us=finish,
        bytes_used=used,
        within_memory=all(b <= model.memory for b in used),
    )


def _op_order(n: int, preds: list[list[int]], succs: list[list[int]]) -> list[int]:
    """A topological order of the ops (Kahn's, smallest id first among the ready)."""
    missing = [len(p) for p in preds]
    ready = [v for v in range(n) if missing[v] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        v = heapq.heappop(ready)
        order.append(v)
        for s in succs[v]:
            missing[s] -= 1
            if missing[s] == 0:
                heapq.heappush(ready, s)
    if len(order) != n:
        raise InputError("the latency objective needs an acyclic graph")
    return order


@dataclass(frozen=True)
class LatencySplit:
    """A latency split: its calls in start order, each on one device."""

    latency_us: float
    stage_units: list[list[int]]  # per call, the units (ids of maxload.units) in it
    stage_device: list[int]
    stage_start_us: list[float]
    stage_finish_us: list[float]
    device_of_op: list[int]
    proven: bool  # the search completed: no contiguous split has a lower latency
    lower_bound_us: float
    seconds: float
    sets_enumerated: int
    units: int

    def to_json(self) -> dict[str, object]:
        return {
            "latency_us": round(self.latency_us, 6),
            "stages": [
                {"device": d, "start_us": round(s, 6), "finish_us": round(f, 6)}
                for d, s, f in zip(self.stage_device, self.stage_start_us, self.stage_finish_us)
            ],
            "proven_optimal": self.proven,
            "optimal_among": "contiguous",
            "lower_bound_us": round(self.lower_bound_us, 6),
            "solver": {
                "seconds": round(self.seconds, 6),
                "sets_enumerated": self.sets_enumerated,
                "units": self.units,
            },
        }


# A stage of a split under construction: its units and whether it is on an accelerator.
_Stage = tuple[list[int], bool]


def solve_latency(model: LoadModel, *, max_sets: int = DEFAULT_MAX_SETS) -> LatencySplit:
    """The contiguous split of least latency (module docstring), proven unless ``max_sets`` ran out.

    Raises InfeasibleError when no contiguous split fits the accelerators'
    memory (and no CPU may take the rest), InputError on a model without
    devices. Deterministic: the same model gives the same split.

    Algorithm, exact within the model:

    1. *Upper bound.* Splits into consecutive ranges of a few topological orders of the units
       (:mod:`baechi_cli.pipeline.throughput`'s units: colocation groups, cycles fused), each range
       on its own accelerator, run one after another: the least sum of range costs is a DP over
       ``(ranges, end)``, O(k n w) for ranges of at most ``w`` units that fit memory. The best,
       judged by :func:`evaluate_latency` (independent ranges overlap), is ``U``.
    2. *Exact search* over chains of ideals ``0 = I_0 < I_1 < ... < I_m = all``: every contiguous
       split is one (its calls in a topological order of the call graph), each step one call on a
       new accelerator or one unit on a CPU. A *label* at ideal ``I`` holds the accelerators used,
       the finish of each unit of ``I`` with a successor outside ``I`` (the frontier: all a later
       call can wait for), and the latest finish of the others; dominated labels are dropped.
       Ideals are expanded by size, so an ideal's labels are final when expanded. Exact pruning: a
       call grows by sibling-exclusion branching while its start, compute and the transfers no
       growth can undo stay below ``U`` and its bytes within memory; a label whose frontier finish
       plus the cheapest-compute path after it reaches ``U`` is dropped, as is one whose remaining
       bytes cannot fit the accelerators left.
    3. A search that completes *proves* the result optimal. Past ``max_sets`` enumerated calls
       the best split is returned with ``proven=False`` and the least lower bound of the labels
       not yet expanded (every split not found completes one), at least the critical path.
    4. An unproven split is improved by local search (:func:`_improve`): a unit on a call's
       boundary moves to a neighbouring call, an unused accelerator or a CPU while the latency
       drops, within a fixed number of judged splits.
    """
    if model.accelerators < 0 or model.cpus < 0 or model.num_devices == 0:
        raise InputError("a latency split needs at least one device")
    t0 = time.perf_counter()
    u = build_units(model)
    k, cpus = model.accelerators, model.cpus
    if any(not (ok and k) and not cpus for ok in u.accel_ok):
        raise InfeasibleError("an op no accelerator can run needs a CPU core: the model has none")
    hop = _hops(u)
    tail = _tails(u, k, cpus, model.memory, hop)
    critical = max((min(t) for t in tail), default=0.0)

    best_value, best_stages = math.inf, []
    for order in (list(range(u.n)), *other_orders(u)):
        seeds = [_serial_ranges(u, order, k, model.memory)]
        if cpus:
            seeds.append(_fill(u, order, k, model.memory))
        for stages in seeds:
            if stages is None:
                continue
            value = _judge(model, u, stages).latency_us
            if value < best_value * (1 - _EPS):
                best_value, best_stages = value, stages
    search = _LatencySearch(u, k, cpus, model.memory, tail, hop, best_value, best_stages, max_sets)
    proven = search.run()
    if not search.best_stages:
        devices = (
            f"{k} accelerator(s) of {format_si(model.memory, 'B', 4, ' ')} ({model.memory:.0f} bytes)"
            + (" and the CPU cores" if cpus else "")
        )
        if proven:
            raise InfeasibleError(f"no contiguous split of the model fits {devices}")
        raise InfeasibleError(
            f"the search found no contiguous split of the model on {devices} within its effort"
        )
    stages = search.best_stages if proven else _improve(model, u, search.best_stages, IMPROVE_EVALUATIONS)
    judged = evaluate_latency(model, _device_of_op(model, u, stages))
    lower = judged.latency_us if proven else min(judged.latency_us, max(critical, search.open_bound))
    order_of = sorted(range(len(judged.start_us)), key=lambda c: (judged.start_us[c], judged.finish_us[c], c))
    device_of_op = _device_of_op(model, u, stages)
    members: list[set[int]] = [set() for _ in judged.call_device]
    for v, c in enumerate(judged.call_of_op):
        members[c].add(u.of_op[v])
    return LatencySplit(
        latency_us=judged.latency_us,
        stage_units=[sorted(members[c]) for c in order_of],
        stage_device=[judged.call_device[c] for c in order_of],
        stage_start_us=[judged.start_us[c] for c in order_of],
        stage_finish_us=[judged.finish_us[c] for c in order_of],
        device_of_op=device_of_op,
        proven=proven,
        lower_bound_us=lower,
        seconds=time.perf_counter() - t0,
        sets_enumerated=search.sets,
        units=u.n,
    )


def _improve(model: LoadModel, u: Units, stages: list[_Stage], evaluations: int) -> list[_Stage]:
    """Local search from ``stages``: move a unit on a call's boundary to a neighbour's accelerator,
    an unused one or a CPU while the latency drops; at most ``evaluations`` splits judged.

    A move is kept only when the split stays valid (one contiguous call per
    accelerator, calls that do not wait on each other in a cycle, memory) and
    is faster. Units and targets are tried in a fixed order: deterministic.
    """
    k = model.accelerators
    device_of_unit = [0] * u.n
    next_accel = 0
    for members, on_accel in stages:
        d = next_accel if on_accel else k  # the CPUs are one device here: they never queue
        next_accel += on_accel
        for w in members:
            device_of_unit[w] = d

    def judge(assignment: list[int]) -> float:
        try:
            e = evaluate_latency(model, [assignment[w] for w in u.of_op])
        except InfeasibleError:
            return math.inf
        calls = [d for d in e.call_device if d < k]
        return e.latency_us if e.within_memory and len(calls) == len(set(calls)) else math.inf

    best = judge(device_of_unit)
    improved = True
    while improved and evaluations > 0:
        improved = False
        for w in range(u.n):
            here = device_of_unit[w]
            neighbours = {device_of_unit[x] for x in (*u.preds[w], *u.succs[w])} - {here}
            if not neighbours:
                continue
            used = set(device_of_unit)
            targets = sorted(d for d in neighbours if d < k)
            targets += [d for d in range(k) if d not in used][:1]
            if model.cpus and here < k:
                targets.append(k)
            for d in targets:
                if evaluations <= 0 or not (u.accel_ok[w] or d >= k):
                    continue
                evaluations -= 1
                device_of_unit[w] = d
                value = judge(device_of_unit)
                if value < best * (1 - _EPS):
                    best, here, improved = value, d, True
                    break
                device_of_unit[w] = here
    by_device: dict[int, list[int]] = {}
    for w, d in enumerate(device_of_unit):
        by_device.setdefault(d, []).append(w)
    return [(by_device[d], True) for d in sorted(by_device) if d < k] + [
        ([w], False) for w in by_device.get(k, [])
    ]


def _hops(u: Units) -> list[dict[int, float]]:
    """Per unit x and successor s: the transfer time of x's tensors that s reads."""
    hop: list[dict[int, float]] = [{} for _ in range(u.n)]
    for t, src in enumerate(u.t_src):
        for w in u.t_dst[t]:
            hop[src][w] = hop[src].get(w, 0.0) + u.t_us[t]
    return hop


def _tails(
    u: Units, k: int, cpus: int, memory: float, hop: list[dict[int, float]]
) -> list[tuple[float, float]]:
    """Per unit x: lower bounds of the time from x's call beginning x to the last finish, x first in
    an accelerator call and x on a CPU (inf where it cannot run).

    A path bound that counts the calls memory forces: along any path every
    unit adds its compute, and where the path passes from one call to
    another the transfer between them is paid once by each accelerator end
    (its call sends it, the next receives it). A call holding path units
    ``y .. x`` holds every unit on a path between them, so it can continue
    to ``s`` only if those (``y``'s descendants that are ``s``'s ancestors)
    fit memory and run on an accelerator. ``V[x][y]`` (x in a call that the
    path entered at ``y``) is the most over x's successors of the least over
    continuing the call, a new accelerator call, or a CPU: no split's path
    does better. O(n^3) to size every interval (numpy), then O(sum over x of
    the y that fit, times degree).
    """
    n = u.n
    reach = np.zeros((n, n), dtype=np.float64)  # reach[a, b]: b is a descendant of a
    for x in range(n - 1, -1, -1):
        for s in u.succs[x]:
            reach[x, s] = 1.0
            np.maximum(reach[x], reach[s], out=reach[x])
    size = np.asarray(u.size, dtype=np.float64)
    bad = np.asarray([0.0 if ok else 1.0 for ok in u.accel_ok])
    # Bytes and accelerator-less units of the call from y to s: y, s and everything between.
    between = (reach * size) @ reach
    blocked = (reach * bad) @ reach
    fits = (between + size[:, None] + size[None, :] <= memory) & (blocked + bad[:, None] + bad[None, :] == 0)
    fits &= reach > 0
    np.fill_diagonal(fits, (size <= memory) & (bad == 0))
    inf = math.inf
    v_accel: list[dict[int, float]] = [{} for _ in range(n)]
    v_cpu = [inf] * n
    for x in range(n - 1, -1, -1):
        after_cpu = 0.0
        for s in u.succs[x]:
            t = hop[x].get(s, 0.0)
            after_cpu = max(after_cpu, min(v_accel[s].get(s, inf) + t, v_cpu[s]))
        v_cpu[x] = u.cpu_us[x] + after_cpu if cpus else inf
        if not k:
            continue
        leave = []  # per successor: its best if the path leaves x's call there
        for s in u.succs[x]:
            t = hop[x].get(s, 0.0)
            leave.append((s, min(v_accel[s].get(s, inf) + 2 * t, v_cpu[s] + t)))
        for y in np.flatnonzero(fits[:, x]).tolist():
            after = 0.0
            for s, out in leave:
                after = max(after, min(v_accel[s].get(y, inf), out))
            v_accel[x][y] = u.accel_us[x] + after
    return [(v_accel[x].get(x, inf), v_cpu[x]) for x in range(n)]


def _device_of_op(model: LoadModel, u: Units, stages: list[_Stage]) -> list[int]:
    """Accelerators in stage order; units on CPUs dealt to the cores in turn (in the model CPUs never queue)."""
    device_of_unit = [0] * u.n
    next_accel = next_cpu = 0
    for members, on_accel in stages:
        if on_accel:
            d, next_accel = next_accel, next_accel + 1
        else:
            d, next_cpu = model.accelerators + next_cpu % model.cpus, next_cpu + 1
        for w in members:
            device_of_unit[w] = d
    return [device_of_unit[w] for w in u.of_op]


def _judge(model: LoadModel, u: Units, stages: list[_Stage]) -> LatencyEvaluation:
    return evaluate_latency(model, _device_of_op(model, u, stages))


def _serial_ranges(u: Units, order: list[int], k: int, memory: float) -> list[_Stage] | None:
    """At most ``k`` consecutive ranges of ``order`` on accelerators, least sum of call costs; None if none fits.

    A range is priced as it grows from each start (O(degree) a unit) until
    its bytes pass ``memory`` or it holds a unit an accelerator cannot run.
    """
    n = u.n
    if n == 0 or k == 0:
        return [] if n == 0 else None
    price = np.full((n + 1, n + 1), np.inf)
    grow = Growing(u)
    for a in range(n):
        added = 0
        for b in range(a, n):
            grow.add(order[b])
            added += 1
            if grow.bad or grow.size > memory:
                break
            price[a, b + 1] = grow.accel + grow.comm
        for b in range(a, a + added):
            grow.remove(order[b])
    value = np.full(n + 1, np.inf)
    value[0] = 0.0
    rows, backs = [value], []
    for _ in range(k):
        candidates = rows[-1][:, None] + price
        origin = candidates.argmin(axis=0)
        rows.append(candidates[origin, np.arange(n + 1)])
        backs.append(origin)
    ends = [row[n] for row in rows[1:]]
    used = int(np.argmin(ends)) + 1
    if not math.isfinite(ends[used - 1]):
        return None
    stages: list[_Stage] = []
    i = n
    for j in range(used, 0, -1):
        a = int(backs[j - 1][i])
        stages.append((order[a:i], True))
        i = a
    stages.reverse()
    return stages


def _fill(u: Units, order: list[int], k: int, memory: float) -> list[_Stage]:
    """Accelerators filled in ``order`` while the units fit, the rest one by one on CPUs (their greedy)."""
    stages: list[_Stage] = []
    current: list[int] = []
    size = 0
    for w in order:
        fits = u.accel_ok[w] and u.size[w] <= memory
        if current and fits and size + u.size[w] <= memory:
            current.append(w)
            size += u.size[w]
            continue
        if current:
            stages.append((current, True))
            current, size = [], 0
        if fits and sum(on for _, on in stages) < k:
            current, size = [w], u.size[w]
        else:
            stages.append(([w], False))
    if current:
        stages.append((current, True))
    return stages


@dataclass
class _Label:
    """A partial split reaching an ideal (:func:`solve_latency`, step 2)."""

    ideal: int
    accels: int
    done_us: float  # the latest finish of units whose successors are all inside the ideal
    finish: dict[int, float]  # frontier unit -> its finish
    bound: float  # a lower bound of the latency of every completion
    parent: _Label | None
    stage: _Stage | None
    alive: bool = True  # False once expanded, or once a label at the same ideal dominates it


class _LatencySearch:
    """The exact search over chains of ideals, least bound first; ``best_*`` improve in place."""

    def __init__(
        self,
        u: Units,
        k: int,
        cpus: int,
        memory: float,
        tail: list[tuple[float, float]],
        hop: list[dict[int, float]],
        best_value: float,
        best_stages: list[_Stage],
        max_sets: int,
    ) -> None:
        self.u, self.k, self.cpus, self.memory, self.tail, self.hop = u, k, cpus, memory, tail, hop
        self.accel_tail = [a for a, _ in tail]
        self.best_value, self.best_stages = best_value, best_stages
        self.max_sets = max_sets
        self.sets = 0
        self.full = (1 << u.n) - 1
        self.total_size = sum(u.size)
        self.open_bound = math.inf  # set when the search stops early
        self.labels: dict[int, list[_Label]] = {}
        self.heap: list[tuple[float, int, _Label]] = []
        self.deep: list[tuple[int, float, int, _Label]] = []
        self.pushed = 0

    def run(self) -> bool:
        """Search until done (True: proven) or out of effort (False, ``open_bound`` set).

        Expansions alternate between the open label of least bound (which
        raises the proven bound) and the one nearest completion (a dive,
        which finds complete splits and so lowers ``best_value`` early).
        An expanded label is retired: its children stand for it.
        """
        if self.u.n == 0:
            return True
        self._offer(_Label(0, 0, 0.0, {}, 0.0, None, None))
        dive = False
        while True:
            while self.heap and not self.heap[0][2].alive:
                heapq.heappop(self.heap)
            if not self.heap or self.heap[0][0] >= self.best_value * (1 - _EPS):
                return True  # every open label is at least this bound
            label = None
            if dive:
                while self.deep and label is None:
                    candidate = heapq.heappop(self.deep)[3]
                    if candidate.alive and candidate.bound < self.best_value * (1 - _EPS):
                        label = candidate
            if label is None:
                label = heapq.heappop(self.heap)[2]
            dive = not dive
            label.alive = False
            if not self._expand(label):
                alive = [b for b, _, other in self.heap if other.alive]
                self.open_bound = min([label.bound, *alive])
                return False

    def _offer(self, label: _Label) -> None:
        """Keep ``label`` unless a label at its ideal dominates it; retire those it dominates."""
        ideal = label.ideal
        if ideal == self.full:
            if label.done_us < self.best_value * (1 - _EPS):
                self.best_value, self.best_stages = label.done_us, _unwind(label)
            return
        group = self.labels.setdefault(ideal, [])
        kept = []
        for other in group:
            if _dominates(other, label):
                return
            if _dominates(label, other):
                other.alive = False
            else:
                kept.append(other)
        kept.append(label)
        self.labels[ideal] = kept
        self.pushed += 1
        heapq.heappush(self.heap, (label.bound, self.pushed, label))
        heapq.heappush(self.deep, (-ideal.bit_count(), label.bound, self.pushed, label))

    def _expand(self, label: _Label) -> bool:
        """Every call (or CPU unit) that can follow ``label``; False when the effort ran out."""
        u, n, ideal = self.u, self.u.n, label.ideal
        missing = [0] * n
        for w in range(n):
            if not ideal >> w & 1:
                missing[w] = sum(1 for p in u.preds[w] if not ideal >> p & 1)
        available = [w for w in range(n) if not ideal >> w & 1 and missing[w] == 0]
        finish = label.finish
        if self.cpus:
            for w in available:
                ready = max((finish[p] for p in u.preds[w]), default=0.0)
                self._step(label, [w], False, ready + u.cpu_us[w])
        if label.accels >= self.k:
            return True
        fixed_of = fixed_costs(u, ideal)
        grow = Growing(u)
        fixed = 0.0
        ready = [0.0]  # the call's start as it grows (a stack: start with each unit added)
        # The most of the units' path bounds (a stack too): the call computes each after
        # its start and the transfers it must receive, and no unit's path can do better.
        path = [0.0]
        accel_tail = self.accel_tail
        chosen: list[int] = []
        mask = ideal
        stack: list[tuple[list[int], int]] = [(available, 0)]
        while stack:
            avail, i = stack[-1]
            if i >= len(avail):
                stack.pop()
                if chosen:
                    w = chosen.pop()
                    grow.remove(w)
                    fixed -= fixed_of[w]
                    mask ^= 1 << w
                    ready.pop()
                    path.pop()
                    for s in u.succs[w]:
                        missing[s] += 1
                continue
            stack[-1] = (avail, i + 1)
            w = avail[i]
            start = max([ready[-1], *(finish[p] for p in u.preds[w] if ideal >> p & 1)])
            longest = max(path[-1], accel_tail[w], grow.accel + u.accel_us[w])
            if (
                not u.accel_ok[w]
                or grow.size + u.size[w] > self.memory
                or start + fixed + fixed_of[w] + longest >= self.best_value * (1 - _EPS)
            ):
                continue  # every call in this branch holds w: it cannot run it, or is too late
            self.sets += 1
            if self.sets > self.max_sets:
                return False
            grow.add(w)
            fixed += fixed_of[w]
            chosen.append(w)
            ready.append(start)
            path.append(longest)
            mask |= 1 << w
            opened = []
            for s in u.succs[w]:
                missing[s] -= 1
                if missing[s] == 0:
                    opened.append(s)
            stack.append((avail[i + 1 :] + opened, 0))
            self._step(label, list(chosen), True, start + grow.accel + grow.comm, mask)
        return True

    def _step(self, label: _Label, members: list[int], on_accel: bool, end: float, mask: int = -1) -> None:
        """Offer the label reached by running ``members`` as the next call, finishing at ``end``."""
        u = self.u
        target = mask if mask >= 0 else label.ideal | 1 << members[0]
        limit = self.best_value * (1 - _EPS)
        if end >= limit:
            return
        accels = label.accels + on_accel
        if not self.cpus and target != self.full:
            # Without CPUs the rest needs accelerators, and room on them.
            left = self.total_size - sum(u.size[w] for w in range(u.n) if target >> w & 1)
            if accels >= self.k or left > (self.k - accels) * self.memory:
                return
        done = label.done_us
        bound = done
        finish: dict[int, float] = {}
        tail, hop = self.tail, self.hop
        accel_left = accels < self.k
        for w, f in [*label.finish.items(), *((w, end) for w in members)]:
            after = [s for s in u.succs[w] if not target >> s & 1]
            if not after:
                done = max(done, f)
                continue
            finish[w] = f
            for s in after:
                # s runs in a later call: on an accelerator it receives w's tensors first.
                s_accel, s_cpu = tail[s]
                bound = max(bound, f + min(s_accel + hop[w].get(s, 0.0) if accel_left else math.inf, s_cpu))
        bound = max(bound, done)
        if bound >= limit:
            return
        self._offer(_Label(target, accels, done, finish, bound, label, (sorted(members), on_accel)))


def _dominates(a: _Label, b: _Label) -> bool:
    """Whether ``a`` is no worse than ``b`` in everything a completion depends on (same ideal)."""
    if a.accels > b.accels or a.done_us > b.done_us:
        return False
    return all(f <= b.finish[w] for w, f in a.finish.items())


def _unwind(label: _Label) -> list[_Stage]:
    stages: list[_Stage] = []
    while label.parent is not None:
        assert label.stage is not None
        stages.append(label.stage)
        label = label.parent
    stages.reverse()
    return stages
