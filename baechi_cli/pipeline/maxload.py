"""Tarnawski et al.'s max-load model of a pipeline split, and how it prices one.

The model (Tarnawski et al., "Efficient Algorithms for Device Placement of DNN Graph Operators",
NeurIPS 2020, and their ``dp.cpp``): samples stream through a pipeline of ``k`` identical
accelerators of ``memory`` bytes and ``cpus`` CPU cores. A split gives every op one device; a
device's *load* is its time per sample: on an accelerator the compute of its ops plus the
transfer time of every tensor it sends (once, however many devices consume it) or receives (once
per receiving device), on a CPU core its ops' CPU compute. The split's *max-load* is the largest
load, the bottleneck's time per sample, so its throughput is ``1 / max-load``. A split is valid when

* every colocation group, and every backward op with its forward op, sits on one device (a *unit*);
* every accelerator holds at most ``memory`` bytes of its ops' ``size``, and ops that an
  accelerator cannot run sit on a CPU;
* each device holds one *contiguous* set of units, the difference of two ideals (downward-closed
  sets) of the forward graph of units, so activations only flow forward (gradients back).

Units (:func:`build_units`): ops joined by colocation group and ``forward_op``; a unit with backward
ops only (a loss, an accumulator) is ordered by mirroring its backward edges, as ``dp.cpp`` does;
cycles the joining creates are fused, and a unit with no compute, no backward ops and one forward
neighbour joins it (this cannot cost memory: it removes a crossing and adds none).
:func:`evaluate_loads` prices any assignment by the model's rules, contiguous or not, and equals
``dp.exe -expert`` on the same split (tests/test_throughput.py). :func:`load_model` builds the
model of an op graph on a device spec. The solvers are :mod:`~baechi_cli.pipeline.throughput`
and :mod:`~baechi_cli.pipeline.latency`.

Example:
    >>> m = LoadModel.chain([4.0, 1.0, 3.0, 2.0], send_us=[0.5, 0.5, 0.5, 0.0], accelerators=2)
    >>> evaluate_loads(m, [0, 0, 1, 1]).loads_us, evaluate_loads(m, [0, 1, 1, 1]).max_load_us
    ([5.5, 5.5], 6.5)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.errors import InputError
from baechi_cli.core.graph import OpGraph
from baechi_cli.core.unionfind import UnionFind


@dataclass(frozen=True)
class LoadModel:
    """The max-load model's inputs, per op and per tensor (times in µs, sizes in bytes).

    Devices ``0 .. accelerators-1`` are the accelerators, the next ``cpus``
    the CPU cores.
    """

    accel_us: list[float]  # per op, on an accelerator
    cpu_us: list[float]  # per op, on a CPU core
    accel_ok: list[bool]  # whether an accelerator can run the op
    size: list[int]  # bytes the op keeps on an accelerator
    is_backward: list[bool]
    unit_of_op: list[int]  # ops with equal ids share a device (colocation, backward with forward)
    edges: list[tuple[int, int]]  # producer op -> consumer op
    # A tensor: its producer, transfer time and consumer ops (other than its producer).
    tensor_src: list[int]
    tensor_us: list[float]
    tensor_dst: list[list[int]]
    accelerators: int
    memory: float  # bytes per accelerator (inf: unlimited)
    cpus: int = 0
    names: list[str] = field(default_factory=list)
    # Weights several ops read, each copied to every stage that reads it (load_model's
    # replicate_tied); empty: every reader shares the owner's unit.
    tied: tuple[TiedWeight, ...] = ()
    tensor_bytes: list[int] = field(default_factory=list)  # per tensor (empty: not known)

    @property
    def num_ops(self) -> int:
        return len(self.accel_us)

    @property
    def num_devices(self) -> int:
        return self.accelerators + self.cpus

    @staticmethod
    def chain(compute_us: Sequence[float], *, send_us: Sequence[float], accelerators: int) -> LoadModel:
        """A chain of ops ``0 -> 1 -> ...``, op i's output costing ``send_us[i]`` to move (examples, tests)."""
        n = len(compute_us)
        return LoadModel(
            accel_us=[float(c) for c in compute_us],
            cpu_us=[float(c) for c in compute_us],
            accel_ok=[True] * n,
            size=[0] * n,
            is_backward=[False] * n,
            unit_of_op=list(range(n)),
            edges=[(i, i + 1) for i in range(n - 1)],
            tensor_src=list(range(n - 1)),
            tensor_us=[float(send_us[i]) for i in range(n - 1)],
            tensor_dst=[[i + 1] for i in range(n - 1)],
            accelerators=accelerators,
            memory=math.inf,
            names=[str(i) for i in range(n)],
        )


@dataclass(frozen=True)
class TiedWeight:
    """A weight several ops read (tied embeddings), copied into each stage that reads it.

    ``owner`` holds the weight (its bytes are in the owner's size); every
    other stage with a reader in ``readers`` holds a copy of
    ``replica_bytes`` (the weight, its gradient and optimizer state), and once per
    minibatch the stages holding it all-reduce its gradient of ``nbytes``
    before the optimizer step, as PyTorch's ``REPLICATE`` multi-use
    parameters and Megatron-LM's tied embeddings need.
    """

    owner: int
    readers: tuple[int, ...]
    nbytes: int
    replica_bytes: int
    latency_us: float  # the link's, per message
    send_us: float  # nbytes over the link's bandwidth

    def stages(self, stage_of: Sequence[int]) -> list[int]:
        """The stages holding the weight under ``stage_of`` (per op), ascending."""
        return sorted({stage_of[self.owner], *(stage_of[r] for r in self.readers)})

    def allreduce_us(self, holders: int) -> float:
        """A ring all-reduce of the gradient among ``holders`` devices (NCCL's): ``2 (k - 1)``
        steps, each a message of ``1 / k`` of it; 0 for one holder."""
        return 2 * (holders - 1) * (self.latency_us + self.send_us / holders)


@dataclass(frozen=True)
class LoadEvaluation:
    """One split judged by the model: per device load (µs per sample) and accelerator bytes."""

    loads_us: list[float]
    bytes_used: list[int]
    within_memory: bool

    @property
    def max_load_us(self) -> float:
        return max(self.loads_us, default=0.0)


def evaluate_loads(model: LoadModel, device_of_op: Sequence[int]) -> LoadEvaluation:
    """Each device's load and bytes under ``device_of_op`` (any assignment; O(V + E)).

    >>> m = LoadModel.chain([1.0, 2.0], send_us=[0.25, 0.0], accelerators=2)
    >>> evaluate_loads(m, [0, 1]).loads_us, evaluate_loads(m, [0, 0]).loads_us
    ([1.25, 2.25], [3.0, 0.0])
    """
    k = model.accelerators
    loads = [0.0] * model.num_devices
    used = [0] * k
    for v, d in enumerate(device_of_op):
        if d < k:
            loads[d] += model.accel_us[v]
            used[d] += model.size[v]
        else:
            loads[d] += model.cpu_us[v]
    for t, src in enumerate(model.tensor_src):
        home = device_of_op[src]
        receivers = {device_of_op[w] for w in model.tensor_dst[t]} - {home}
        if not receivers:
            continue
        cost = model.tensor_us[t]
        if home < k:
            loads[home] += cost
        for d in receivers:
            if d < k:
                loads[d] += cost
    return LoadEvaluation(loads, used, all(b <= model.memory for b in used))


@dataclass
class Units:
    """The search's graph: units (after fusion) in topological order, with flat per-unit columns."""

    of_op: list[int]
    accel_us: list[float]
    cpu_us: list[float]
    accel_ok: list[bool]
    size: list[int]
    preds: list[list[int]]
    succs: list[list[int]]
    # Tensors between units: producer unit, cost, consumer units (distinct, not the producer).
    t_src: list[int]
    t_us: list[float]
    t_dst: list[list[int]]
    produces: list[list[int]] = field(default_factory=list)
    consumes: list[list[int]] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.accel_us)


def units(model: LoadModel) -> list[int]:
    """The unit of each op after every fusion the solver makes (ids in topological order)."""
    return build_units(model).of_op


def build_units(model: LoadModel) -> Units:
    n = model.num_ops
    uf = UnionFind(range(n))
    first: dict[int, int] = {}
    for v, u in enumerate(model.unit_of_op):
        if u in first:
            uf.union(v, first[u])
        else:
            first[u] = v
    fused = True
    while fused:
        root = [uf.find(v) for v in range(n)]
        fused = _fuse_cycles(sorted(set(root)), _unit_edges(model, root, n), uf)
    root = [uf.find(v) for v in range(n)]
    _fuse_trivial(model, root, uf)
    return _columns(model, [uf.find(v) for v in range(n)])


def _unit_edges(model: LoadModel, unit: list[int], n: int) -> dict[int, set[int]]:
    """The forward graph of units (ids below ``n``): forward edges, and mirrored backward edges
    of a unit with backward ops only (module docstring)."""
    has_forward = [False] * n
    for v in range(model.num_ops):
        if not model.is_backward[v]:
            has_forward[unit[v]] = True
    adjacency: dict[int, set[int]] = {}
    for a, b in model.edges:
        ua, ub = unit[a], unit[b]
        if ua == ub:
            continue
        fa, fb = model.is_backward[a], model.is_backward[b]
        if not fa and not fb:
            adjacency.setdefault(ua, set()).add(ub)
        elif fa and fb and not (has_forward[ua] and has_forward[ub]):
            adjacency.setdefault(ub, set()).add(ua)
    return adjacency


def _fuse_cycles(nodes: list[int], adjacency: dict[int, set[int]], uf: UnionFind) -> bool:
    """Union every strongly connected component of the unit graph (Tarjan's, iterative); True if any."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    fused = False
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(adjacency.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, successors = work[-1]
            w = next(successors, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(adjacency.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                for other in component[1:]:
                    uf.union(component[0], other)
                fused = fused or len(component) > 1
    return fused


def _fuse_trivial(model: LoadModel, root: list[int], uf: UnionFind) -> None:
    """Fuse a unit with no compute, no backward ops and exactly one neighbour into that neighbour."""
    n = model.num_ops
    members: dict[int, list[int]] = {}
    for v in range(n):
        members.setdefault(root[v], []).append(v)
    neighbours: dict[int, set[int]] = {u: set() for u in members}
    for a, b in model.edges:
        ra, rb = root[a], root[b]
        if ra != rb:
            neighbours[ra].add(rb)
            neighbours[rb].add(ra)
    total_size = sum(model.size)
    for u, ops in members.items():
        if len(neighbours[u]) != 1:
            continue
        if any(model.is_backward[v] or model.accel_us[v] > 0 or model.cpu_us[v] > 0 for v in ops):
            continue
        # Its bytes move to the neighbour's device: safe when they are none or everything fits.
        if any(model.size[v] for v in ops) and total_size > model.memory:
            continue
        (other,) = neighbours[u]
        if not all(model.accel_ok[v] for v in ops) and model.cpus == 0:
            continue
        uf.union(u, other)


def _columns(model: LoadModel, root: list[int]) -> Units:
    """Number the units topologically (forward order) and gather their columns."""
    ids = sorted(set(root))
    index = {r: i for i, r in enumerate(ids)}
    of_op = [index[r] for r in root]
    n = len(ids)
    adjacency = _unit_edges(model, of_op, n)
    succ_sets: list[set[int]] = [adjacency.get(w, set()) for w in range(n)]
    order = _topological(n, succ_sets)
    rank = [0] * n
    for i, u in enumerate(order):
        rank[u] = i
    of_op = [rank[u] for u in of_op]
    accel = [0.0] * n
    cpu = [0.0] * n
    ok = [True] * n
    size = [0] * n
    for v in range(model.num_ops):
        u = of_op[v]
        accel[u] += model.accel_us[v]
        cpu[u] += model.cpu_us[v]
        ok[u] = ok[u] and model.accel_ok[v]
        size[u] += model.size[v]
    succs = [sorted(rank[b] for b in succ_sets[a]) for a in order]
    preds: list[list[int]] = [[] for _ in range(n)]
    for a in range(n):
        for b in succs[a]:
            preds[b].append(a)
    t_src: list[int] = []
    t_us: list[float] = []
    t_dst: list[list[int]] = []
    for t, src in enumerate(model.tensor_src):
        home = of_op[src]
        dst = sorted({of_op[w] for w in model.tensor_dst[t]} - {home})
        if dst and model.tensor_us[t] > 0:
            t_src.append(home)
            t_us.append(model.tensor_us[t])
            t_dst.append(dst)
    produces: list[list[int]] = [[] for _ in range(n)]
    consumes: list[list[int]] = [[] for _ in range(n)]
    for t, home in enumerate(t_src):
        produces[home].append(t)
        for w in t_dst[t]:
            consumes[w].append(t)
    return Units(of_op, accel, cpu, ok, size, preds, succs, t_src, t_us, t_dst, produces, consumes)


def _topological(n: int, succ_sets: list[set[int]]) -> list[int]:
    indegree = [0] * n
    for s in succ_sets:
        for b in s:
            indegree[b] += 1
    ready = [u for u in range(n) if indegree[u] == 0]
    ready.reverse()
    order: list[int] = []
    while ready:
        u = ready.pop()
        order.append(u)
        for b in sorted(succ_sets[u], reverse=True):
            indegree[b] -= 1
            if indegree[b] == 0:
                ready.append(b)
    if len(order) != n:  # _fuse_cycles leaves none
        raise AssertionError("the unit graph has a cycle")
    return order


class Growing:
    """A set of units on one device, its compute, bytes and communication kept as units join or leave."""

    __slots__ = ("u", "inside", "cin", "accel", "cpu", "size", "comm", "bad")

    def __init__(self, u: Units) -> None:
        self.u = u
        self.inside = [False] * u.n
        self.cin = [0] * len(u.t_src)  # consumer units of each tensor inside
        self.accel = self.cpu = self.comm = 0.0
        self.size = 0
        self.bad = 0  # units an accelerator cannot run

    def add(self, w: int) -> None:
        u = self.u
        inside, cin, t_dst, t_us, t_src = self.inside, self.cin, u.t_dst, u.t_us, u.t_src
        comm = self.comm
        for t in u.produces[w]:
            # before: outside producer, paid iff some consumer inside; after: paid iff one is outside
            comm += t_us[t] * ((cin[t] < len(t_dst[t])) - (cin[t] > 0))
        inside[w] = True
        for t in u.consumes[w]:
            c = cin[t]
            if inside[t_src[t]]:
                if c + 1 == len(t_dst[t]):
                    comm -= t_us[t]
            elif c == 0:
                comm += t_us[t]
            cin[t] = c + 1
        self.comm = comm
        self.accel += u.accel_us[w]
        self.cpu += u.cpu_us[w]
        self.size += u.size[w]
        self.bad += not u.accel_ok[w]

    def remove(self, w: int) -> None:
        u = self.u
        inside, cin, t_dst, t_us, t_src = self.inside, self.cin, u.t_dst, u.t_us, u.t_src
        comm = self.comm
        for t in u.consumes[w]:
            c = cin[t] - 1
            cin[t] = c
            if inside[t_src[t]]:
                if c + 1 == len(t_dst[t]):
                    comm += t_us[t]
            elif c == 0:
                comm -= t_us[t]
        inside[w] = False
        for t in u.produces[w]:
            comm -= t_us[t] * ((cin[t] < len(t_dst[t])) - (cin[t] > 0))
        self.comm = comm
        self.accel -= u.accel_us[w]
        self.cpu -= u.cpu_us[w]
        self.size -= u.size[w]
        self.bad -= not u.accel_ok[w]


def unit_order(u: Units, op_order: Sequence[int]) -> list[int]:
    """The units in the order of their first op in ``op_order``, made topological."""
    first: dict[int, int] = {}
    for i, v in enumerate(op_order):
        first.setdefault(u.of_op[v], i)
    key = [first.get(w, len(op_order) + w) for w in range(u.n)]
    return _kahn(u, lambda w: key[w])


def other_orders(u: Units) -> list[list[int]]:
    """Topological orders that keep branches together (depth first) or levels together (breadth first)."""
    level = [0] * u.n
    for w in range(u.n):
        for p in u.preds[w]:
            level[w] = max(level[w], level[p] + 1)
    by_level = _kahn(u, lambda w: (level[w], w))
    depth_first: list[int] = []
    seen = [False] * u.n
    missing = [len(p) for p in u.preds]
    stack = [w for w in range(u.n - 1, -1, -1) if missing[w] == 0]
    while stack:
        w = stack.pop()
        if seen[w]:
            continue
        seen[w] = True
        depth_first.append(w)
        for s in reversed(u.succs[w]):
            missing[s] -= 1
            if missing[s] == 0:
                stack.append(s)
    return [by_level, depth_first]


def _kahn(u: Units, key) -> list[int]:
    import heapq

    missing = [len(p) for p in u.preds]
    heap = [(key(w), w) for w in range(u.n) if missing[w] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        _, w = heapq.heappop(heap)
        order.append(w)
        for s in u.succs[w]:
            missing[s] -= 1
            if missing[s] == 0:
                heapq.heappush(heap, (key(s), s))
    return order


def fixed_costs(u: Units, base: int) -> list[float]:
    """Per unit w outside ``base``: transfers that w joining a set above ``base`` makes certain.

    A tensor from ``base`` to a consumer in the set is received by the set
    however the set grows (its producer stays below), and one from the set
    to a consumer in ``base`` is sent. Each tensor may be counted once only,
    so a tensor from ``base`` is charged to its consumer when it has exactly
    one outside ``base`` and to no one otherwise: the sum over a set's units
    stays a lower bound of the set's communication, and only grows with it.
    """
    fixed = [0.0] * u.n
    for t, src in enumerate(u.t_src):
        dst = u.t_dst[t]
        if base >> src & 1:
            outside = [w for w in dst if not base >> w & 1]
            if len(outside) == 1:
                fixed[outside[0]] += u.t_us[t]
        elif any(base >> w & 1 for w in dst):
            fixed[src] += u.t_us[t]
    return fixed


def load_model(
    graph: OpGraph,
    devices: DeviceSpec,
    *,
    cpus: int = 0,
    follow_forward: bool = True,
    replicate_tied: bool = False,
) -> LoadModel:
    """The max-load model of ``graph`` on ``devices``, the last ``cpus`` of which are CPU cores.

    Compute is the graph's on the accelerators' kind, and memory theirs (the
    model's accelerators are identical: mixed ones count at the slowest kind
    and the smallest memory); an op's CPU time
    and whether an accelerator can run it come from the workload reader's
    ``attrs`` (``cpu_us``, ``accelerator``), else equal the accelerator's
    and true. A tensor's transfer time is its measured time, else the
    interconnect's for its bytes. ``follow_forward``: also tie each backward
    op to its ``forward_op`` (Tarnawski's files tie them by colorClass only).
    ``replicate_tied``: a weight several ops read (the ONNX reader's
    ``_shared_parameter_bytes`` / ``_accumulated_parameter_bytes``) does not
    keep its readers on one device; they are listed in ``tied`` instead, and
    the gradient a reader sends its owner costs no transfer (a copy's
    gradient stays on its stage until the minibatch's all-reduce).
    """
    accelerators = devices.devices[: devices.count - cpus]
    if not accelerators:
        raise InputError("a pipeline needs at least one accelerator besides the CPU cores")
    n = graph.num_ops
    # The model's accelerators are identical: mixed ones count at the slowest kind and the
    # smallest memory, so every split it accepts fits and its loads are not understated.
    kinds = sorted({d.kind for d in accelerators})
    accel = [max(times) for times in zip(*(graph.durations(kind) for kind in kinds))]
    cpu = [graph.attrs[v].get("cpu_us", accel[v]) for v in range(n)]
    ok = [bool(graph.attrs[v].get("accelerator", True)) for v in range(n)]
    ic = devices.interconnect
    tied = _tied_weights(graph, ic.latency_us, ic.bandwidth_bytes_per_us) if replicate_tied else ()
    copies = {r for weight in tied for r in weight.readers}
    # A copy's reader runs as one with the other ops of its program node (a linear's t, addmm).
    copy_nodes = {graph.attrs[r]["_source"] for r in copies if "_source" in graph.attrs[r]}
    uf = UnionFind(range(n))
    source_op: dict[str, int] = {}
    for v in range(n):
        forward = graph.forward_op[v] if graph.is_backward[v] and graph.forward_op[v] >= 0 else v
        if forward not in copies and graph.attrs[forward].get("_source") not in copy_nodes:
            # a copy's reader (its node's ops), its backward and update go with it alone
            uf.union(v, graph.group[v])
        if follow_forward and forward != v:
            uf.union(v, forward)
        # The ops traced from one node of a PyTorch program (a tied head's t and mm) run as one.
        source = graph.attrs[v].get("_source")
        if source is not None and not graph.is_backward[v]:
            uf.union(v, source_op.setdefault(source, v))
    tensors = graph.tensors
    dst: list[set[int]] = [set() for _ in tensors.src]
    for e in range(graph.num_edges):
        dst[tensors.edge_tensor[e]].add(graph.edge_dst[e])
    cost = [
        # The model has one cost per tensor: the default link's (per-link overrides are not modelled).
        m if m is not None else ic.latency_us + b / ic.bandwidth_bytes_per_us
        for m, b in zip(tensors.measured_us, tensors.nbytes)
    ]
    owner_of = {r: weight.owner for weight in tied for r in weight.readers}
    for t, src in enumerate(tensors.src):
        # A copy's gradient of the weight (passes.training: the buffer its owner's backward adds
        # into and its update reads) stays put: the all-reduce moves it.
        reader = graph.forward_op[src]
        if (
            graph.is_backward[src]
            and reader in owner_of
            and all(graph.forward_op[w] == owner_of[reader] for w in dst[t])
        ):
            cost[t] = 0.0
    return LoadModel(
        accel_us=list(accel),
        cpu_us=cpu,
        accel_ok=ok,
        size=list(graph.persistent_bytes),
        is_backward=list(graph.is_backward),
        unit_of_op=[uf.find(v) for v in range(n)],
        edges=list(zip(graph.edge_src, graph.edge_dst)),
        tensor_src=list(tensors.src),
        tensor_us=cost,
        tensor_dst=[sorted(d - {s}) for d, s in zip(dst, tensors.src)],
        accelerators=len(accelerators),
        memory=min(d.memory_bytes for d in accelerators),
        cpus=cpus,
        names=list(graph.names),
        tied=tied,
        tensor_bytes=list(tensors.nbytes),
    )


def _tied_weights(graph: OpGraph, latency_us: float, bytes_per_us: float) -> tuple[TiedWeight, ...]:
    """The weights several ops of an ONNX graph read, by colocation group (:func:`load_model`).

    The reader marks the first reader of a shared float initializer (the
    owner) with ``_accumulated_parameter_bytes`` and every other with
    ``_shared_parameter_bytes``; they share a colocation group. A copy also
    holds its gradient (training) and the optimizer state the owner's update keeps per parameter
    byte.
    O(V).
    """
    owners: dict[int, int] = {}
    readers: dict[int, list[int]] = {}
    for v in range(graph.num_ops):
        attrs = graph.attrs[v]
        if attrs.get("_accumulated_parameter_bytes"):
            owners.setdefault(graph.group[v], v)
        if attrs.get("_shared_parameter_bytes"):
            readers.setdefault(graph.group[v], []).append(v)
    owner_ops = set(owners.values())
    state: dict[int, int] = {}  # owner -> its update's optimizer-state bytes
    for v in range(graph.num_ops):
        owner = graph.forward_op[v]
        if graph.is_backward[v] and owner in owner_ops and graph.persistent_bytes[v]:
            state[owner] = state.get(owner, 0) + graph.persistent_bytes[v]
    tied = []
    training = any(graph.is_backward)
    for group, owner in sorted(owners.items()):
        if group not in readers:
            continue
        nbytes = graph.attrs[owner]["_accumulated_parameter_bytes"]
        per_byte = state.get(owner, 0) / max(1, graph.persistent_bytes[owner])
        gradient = nbytes if training else 0  # the copy's gradient, held until the all-reduce
        tied.append(
            TiedWeight(
                owner,
                tuple(readers[group]),
                nbytes,
                nbytes + gradient + math.ceil(nbytes * per_byte),
                latency_us,
                nbytes / bytes_per_us,
            )
        )
    return tuple(tied)
