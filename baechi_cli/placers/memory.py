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
from dataclasses import dataclass
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
        free = ", ".join(_short(c - u) for c, u in zip(ledger.capacity, ledger.used))
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
    weights the devices together; every op needs, on its device while it runs,
    what :func:`op_need` counts; a producer/consumer pair needs, on one device,
    either both groups' weights or the consumer's plus a copy of the tensor.
    The message names the group, op or pair and ends with what would fit it.
    O(V + E).
    """
    groups = graph.group_members()
    largest_device = max(d.memory_bytes for d in devices.devices)
    one, all_, worst = _need(groups, graph.persistent_bytes)
    if one > largest_device or all_ > devices.total_memory:
        return InfeasibleError(
            f"the model does not fit: it needs at least {_fmt(one)} on one device "
            f"(colocation group of '{graph.names[worst]}') / {_fmt(all_)} in total "
            f"for weights alone; {_gives(devices)}; {_to_fit(devices, one, all_)}"
        )
    need = op_need(graph)
    if need is not None and need.total > largest_device:
        vocabulary = vocabulary_dim(graph, need.op)
        return InfeasibleError(
            f"the model does not fit: {need.describe(graph)}; {_gives(devices)}; "
            f"{_to_fit(devices, need.total, vocabulary=vocabulary)}"
        )
    pair = _worst_pair(graph)
    if pair is not None and pair[0] > largest_device:
        together, apart, e = pair[1], pair[2], pair[3]
        u, v = graph.edge_src[e], graph.edge_dst[e]
        return InfeasibleError(
            f"the model does not fit: '{graph.names[v]}' reads a {_short(graph.edge_bytes[e])} "
            f"tensor from '{graph.names[u]}'; on one device their colocation groups hold "
            f"{_fmt(together)}, apart the received copy makes {_fmt(apart)} on the reader's device; "
            f"{_gives(devices)}; {_to_fit(devices, pair[0])}"
        )
    return None


@dataclass(frozen=True)
class NoFit:
    """Why no placement of a model fits its devices, beyond what one placer saw (:meth:`of`)."""

    minimum: str | None  # hard_minimum's message: a group, op or pair that fits no device
    clause: str  # else: the op that needs the most, and the one-device peak against the total

    @staticmethod
    def of(graph: OpGraph, devices: DeviceSpec, one_device_peak: Callable[[], int]) -> NoFit:
        """The reason for ``graph`` on ``devices``: the model's own, not a placer's contracted graph
        or cut budgets. ``one_device_peak`` gives the model's simulated peak on one device (called
        only when no group, op or pair is too big by itself). O(V + E)."""
        minimum = hard_minimum(graph, devices)
        if minimum is not None:
            return NoFit(minimum.problem, "")
        need = op_need(graph)
        most = "" if need is None else f" ('{graph.names[need.op]}' needs the most, {_short(need.total)})"
        peak, total = one_device_peak(), devices.total_memory
        than = "more than" if peak > total else "against"
        together = "the device" if devices.count == 1 else f"the {devices.count} devices together"
        return NoFit(
            None,
            f"no op alone needs more than the largest device{most}, and the whole model peaks at "
            f"{_fmt(peak)} on one device, {than} {_fmt(total)} on {together}: to fit, use more or "
            "larger devices",
        )

    def error(self, failed: InfeasibleError) -> InfeasibleError:
        """The error for the model when a placer that respects memory failed with ``failed``.

        :func:`hard_minimum`'s message (naming what fits no device, what it
        needs and what would fit it) replaces ``failed``'s; otherwise
        ``failed``'s goes on with :attr:`clause`. ``failed``'s path and op are
        kept.
        """
        problem = self.minimum if self.minimum is not None else f"{failed.problem}; {self.clause}"
        return InfeasibleError(problem, path=failed.path, op=failed.op)


@dataclass(frozen=True)
class OpNeed:
    """What one op needs on its device while it runs, whatever the placement (:func:`op_need`)."""

    op: int
    weights: int  # its colocation group's persistent bytes
    own: int  # its outputs (unless it is a view) and temporaries
    inputs: int  # the input tensors counted
    input_count: int  # how many tensors ``inputs`` sums

    @property
    def total(self) -> int:
        return self.weights + self.own + self.inputs

    def describe(self, graph: OpGraph) -> str:
        """``'op' needs at least ... on one device while it runs: ...``, with each part's bytes."""
        counted = "its largest input" if self.input_count <= 1 else f"its {self.input_count} inputs"
        return (
            f"'{graph.names[self.op]}' needs at least {_fmt(self.total)} on one device while it runs: "
            f"its colocation group's weights {_short(self.weights)}, its outputs and temporaries "
            f"{_short(self.own)}, {counted} {_short(self.inputs)}"
        )


def op_need(graph: OpGraph) -> OpNeed | None:
    """The op needing the most memory on its device while it runs, whatever the placement (None
    for an empty graph); the first such op on ties.

    Its group's weights, its temporaries and its outputs (unless it is a
    view), and its inputs that are not views (a view may share storage with
    the weights or another input), each distinct tensor once. An input is
    there as its producer's output (beside it) or as a received copy (apart),
    so it counts the smaller of the two: a workload JSON's ports hold 0 bytes,
    and its producer beside it needs no room for a tensor however big its
    edges say it is. The simulator holds every input until the op ends, so
    all of them count for an op that runs for a positive time on every
    device kind; for a 0 µs op, or a node of a contracted graph (which holds
    its members' inputs one member at a time), only the largest. O(V + E).
    """
    weights: dict[int, int] = {}
    for v, g in enumerate(graph.group):
        weights[g] = weights.get(g, 0) + graph.persistent_bytes[v]
    best = None
    for v in range(graph.num_ops):
        inputs = _input_bytes(graph, v)
        counted = inputs if _holds_all_inputs(graph, v) else sorted(inputs)[-1:]
        own = graph.temporary_bytes[v] + (0 if v in graph.view_of else sum(graph.output_bytes[v]))
        need = OpNeed(v, weights[graph.group[v]], own, sum(counted), len(counted))
        if best is None or need.total > best.total:
            best = need
    return best


def _input_bytes(graph: OpGraph, v: int) -> list[int]:
    """Bytes of each distinct tensor ``v`` reads that is not a view's and holds bytes (see :func:`op_need`)."""
    tensor_of = graph.tensors.edge_tensor
    src, port, output_bytes = graph.edge_src, graph.edge_port, graph.output_bytes
    by_tensor: dict[int, int] = {}
    for e in graph.in_edges[v]:
        if port[e] == CONTROL_PORT or src[e] in graph.view_of:
            continue
        nbytes = min(graph.edge_bytes[e], output_bytes[src[e]][port[e]])
        t = tensor_of[e]
        by_tensor[t] = max(by_tensor.get(t, 0), nbytes)
    return [b for b in by_tensor.values() if b > 0]


def _holds_all_inputs(graph: OpGraph, v: int) -> bool:
    """Whether the simulator holds all of ``v``'s inputs at once while it runs: ``v`` is an op (not a
    contracted node) with a positive time on every device kind."""
    if graph.members is not None or not graph.compute_us[v] > 0:
        return False
    return all(times[v] > 0 for times in graph.compute_us_by_kind.values())


# A loss or softmax (or its gradient) over a last dim at least this wide is over a vocabulary:
# its tensors grow with the tokens per microbatch (Llama's 32,000 words, GPT-2's 50,257).
VOCABULARY_DIM = 10_000
_LOSS_WORDS = ("loss", "softmax", "crossentropy", "nll")


def vocabulary_dim(graph: OpGraph, v: int) -> int:
    """The widest last dim among the tensors ``v`` reads and writes when ``v`` is a loss, a softmax
    or the gradient of one (by its op type or its forward op's), or reads such an op's output (the
    logits' gradient), and that dim is at least :data:`VOCABULARY_DIM`; else 0. O(in-degree)."""
    data = [e for e in graph.in_edges[v] if graph.edge_port[e] != CONTROL_PORT]
    if not (_loss_like(graph, v) or any(_loss_like(graph, graph.edge_src[e]) for e in data)):
        return 0
    shapes = list(graph.output_shapes[v])
    shapes += [graph.output_shapes[graph.edge_src[e]][graph.edge_port[e]] for e in data]
    widest = max((s[-1] for s in shapes if s), default=0)
    return widest if widest >= VOCABULARY_DIM else 0


def _loss_like(graph: OpGraph, v: int) -> bool:
    forward = graph.forward_op[v]
    types = [graph.op_types[v]] + ([graph.op_types[forward]] if forward >= 0 else [])
    return any(word in t.lower() for t in types for word in _LOSS_WORDS)


def _to_fit(devices: DeviceSpec, one: int, total: int = 0, vocabulary: int = 0) -> str:
    """What would fit a model that needs ``one`` byte on some device and ``total`` in all, and when
    the op is a loss over a ``vocabulary``, fewer tokens."""
    options = []
    too_big, too_few = one > max(d.memory_bytes for d in devices.devices), total > devices.total_memory
    if too_big and too_few:
        options.append(f"devices of at least {size_at_least(one)} each, {size_at_least(total)} in all")
    elif too_big:
        options.append(f"devices of at least {size_at_least(one)} (one device must hold it)")
    elif too_few:
        options.append(f"more or larger devices, {size_at_least(total)} in all")
    if vocabulary:
        options.append(
            f"fewer tokens per microbatch (--batch-size / --microbatches): it is a loss over a last "
            f"dim of {vocabulary:,}"
        )
    return "to fit, use " + "; or ".join(options)


def size_at_least(nbytes: int) -> str:
    """The device size of 3 significant digits, in SI units, that holds ``nbytes`` and is the smallest.

    >>> size_at_least(327_680_001), size_at_least(6_291_456), size_at_least(999), size_at_least(1200)
    ('328MB', '6.3MB', '999B', '1.2KB')
    """
    step = 10 ** max(len(str(nbytes)) - 3, 0)
    up = -(-nbytes // step) * step
    for unit, exp in (("TB", 12), ("GB", 9), ("MB", 6), ("KB", 3)):
        if up >= 10**exp:
            return f"{up / 10**exp:g}{unit}".replace("e+", "e")
    return f"{up}B"


def _short(nbytes: int) -> str:
    """:func:`_fmt` without the exact count."""
    return _fmt(nbytes).split(" (")[0]


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
