"""Hypothesis strategies that draw graph *structure*, and the checks the property tests share.

Every choice (op count, each op's compute time, ports and bytes, each edge,
each colocation group, each forward/backward link, the device count and
memory) is its own Hypothesis draw, so a failing example shrinks to a small
graph with few edges and plain values instead of an opaque seed. Values shrink
towards the first entry of each pool; probabilities are drawn so that they
shrink towards "no": no control edge, no group, no backward op.

Compute times are small integers, so sums are exact and timelines can be
compared with ``==`` (the lower bound too).

* :func:`dags`: a random DAG (edges from lower to higher position, so
  acyclic), with multi-port ops, control edges, measured transfer times,
  repeated tensors, colocation groups drawn as a partition (canonical: a
  group is named by its smallest op id), forward/backward links, and
  optionally op ids that differ from the topological order.
* :func:`training_dags`: a training-like DAG: variables and forward ops, a
  backward op per forward op (mostly linked by ``forward_op``), gradient
  aggregations and constants, optimizer updates colocated with their variables.
* :func:`device_specs`: 1..4 devices whose memory is sized from the graph
  (plenty, just enough for everything on one device, or tight), parallel or
  sequential channels, optional per-link overrides and device kinds.
* :func:`placement_cases`: a graph and a device spec to place it on (with
  per-kind compute times when the devices differ).

Checks: :func:`same_timeline`, :func:`check_timeline` (a timeline is a valid
schedule of the graph) and :func:`is_topological`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from itertools import pairwise

from hypothesis import strategies as st

from baechi_cli.core.devices import DEFAULT_FLOPS, Device, DeviceSpec, Interconnect
from baechi_cli.core.graph import CONTROL_PORT, GraphBuilder, OpGraph
from baechi_cli.core.unionfind import UnionFind
from baechi_cli.evaluator.sim import SimResult, Transfer
from baechi_cli.placers.memory import own_bytes

COMPUTE_US = (10.0, 0.0, 1.0, 50.0, 200.0)
OUTPUT_BYTES = (100, 0, 1000, 20000)
PERSISTENT_BYTES = (0, 500, 5000)
TEMPORARY_BYTES = (0, 300)
MEASURED_US = (3.0, 40.0)
MODES = ("parallel", "sequential")
# (latency µs, bandwidth bytes/µs): exact arithmetic first (b bytes take 10 + b/100 µs),
# then the default PCIe fit, then communication so cheap that splitting always pays.
COMM = ((10.0, 100.0), (134.0, 1 / 0.0001754), (1.0, 10_000.0))
# Device memory as a share of memory_need(graph); None: plenty (1 TB).
MEMORY_SHARES = (None, 1.0, 0.5, 0.3, 0.15)


def op_durations(graph: OpGraph, devices: DeviceSpec, device_of: Sequence[int]) -> list[float]:
    """Compute time of each op on the device it is placed on (the oracle the timeline checks use)."""
    by_device = {d: graph.durations(devices.devices[d].kind) for d in set(device_of)}
    return [by_device[d][v] for v, d in enumerate(device_of)]


@functools.cache
def ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    """``st.integers(lo, hi)``, built once: building strategies per draw is half the drawing time."""
    return st.integers(lo, hi)


@functools.cache
def pick(values: tuple) -> st.SearchStrategy:
    """``st.sampled_from(values)``, built once (shrinks towards ``values[0]``)."""
    return st.sampled_from(values)


@functools.cache
def subsets(n: int, max_size: int, min_size: int = 0) -> st.SearchStrategy[list[int]]:
    """Distinct indices below ``n`` (at most ``max_size``, at least ``min_size``), in drawn order."""
    return st.lists(st.integers(0, n - 1), min_size=min_size, max_size=min(n, max_size), unique=True)


def chance(draw, p: float) -> bool:
    """A drawn coin that comes up True with probability about ``p`` and shrinks to False."""
    if p <= 0:
        return False
    if p >= 1:
        return True
    return draw(ints(0, 99)) >= 100 - round(100 * p)


@st.composite
def dags(
    draw,
    min_ops: int = 1,
    max_ops: int = 12,
    *,
    min_ports: int = 1,
    max_ports: int = 2,
    max_inputs: int = 3,
    compute_us: Sequence[float] = COMPUTE_US,
    output_bytes: Sequence[int] = OUTPUT_BYTES,
    persistent_bytes: Sequence[int] = PERSISTENT_BYTES,
    temporary_bytes: Sequence[int] = TEMPORARY_BYTES,
    control_p: float = 0.1,
    measured_us: Sequence[float] = (),
    repeat_p: float = 0.0,
    group_p: float = 0.25,
    backward_p: float = 0.0,
    view_p: float = 0.0,
    held_p: float = 0.0,
    scope_hold_p: float = 0.0,
    relabel: bool = False,
) -> OpGraph:
    """A DAG of ``min_ops..max_ops`` ops (module docstring).

    Each op has ``min_ports..max_ports`` output ports and up to ``max_inputs``
    distinct producers among the ops before it; an edge from an op without
    ports, or with probability ``control_p``, is a control edge. A data edge
    carries a drawn port, a measured transfer time from ``measured_us`` (or
    none) and, with probability ``repeat_p``, is added twice (``AddN(x, x)``).
    With probability ``group_p`` an op joins the group of an earlier op; with
    ``backward_p`` it is a backward op whose ``forward_op`` is another op or
    -1. With ``view_p`` an op that reads a tensor is a view of it (its
    outputs take no memory, :attr:`OpGraph.view_of`), or of resident storage.
    With ``held_p`` each output port is one the caller holds for the whole step
    (:attr:`OpGraph.held_outputs`); with ``scope_hold_p`` a data edge's tensor
    is kept until some drawn op ends (:attr:`OpGraph.scope_holds`).
    ``relabel`` draws op ids independent of the topological order.
    """
    n = draw(ints(min_ops, max_ops))
    ops = []
    for _ in range(n):
        nports = draw(ints(min_ports, max_ports))
        ops.append(
            {
                "output_bytes": [draw(pick(tuple(output_bytes))) for _ in range(nports)],
                "compute_us": draw(pick(tuple(compute_us))),
                "persistent_bytes": draw(pick(tuple(persistent_bytes))),
                "temporary_bytes": draw(pick(tuple(temporary_bytes))),
            }
        )
    # Edges by position: sources before destinations, so the graph is acyclic.
    edges: list[tuple[int, int, int, float | None]] = []
    for j in range(1, n):
        preds = draw(subsets(j, max_inputs))
        for i in preds:
            nports = len(ops[i]["output_bytes"])
            if nports == 0 or chance(draw, control_p):
                port = CONTROL_PORT
            else:
                port = draw(ints(0, nports - 1))
            measured = draw(pick((None, *measured_us))) if measured_us else None
            edges.append((i, j, port, measured))
            if port != CONTROL_PORT and chance(draw, repeat_p):
                edges.append((i, j, port, measured))
    # Position -> op id.
    id_of = list(draw(st.permutations(range(n)))) if relabel else list(range(n))
    pos_of = [0] * n
    for pos, v in enumerate(id_of):
        pos_of[v] = pos
    is_backward = [False] * n
    forward_op = [-1] * n
    for v in range(n):
        if n > 1 and chance(draw, backward_p):
            is_backward[v] = True
            f = draw(ints(-1, n - 2))
            forward_op[v] = f + 1 if f >= v else f
    b = GraphBuilder()
    for v in range(n):
        op = ops[pos_of[v]]
        b.add_op(f"v{v}", "X", is_backward=is_backward[v], forward_op=forward_op[v], **op)
    for i, j, port, measured in edges:
        b.add_edge(id_of[i], id_of[j], port, transfer_us=measured)
    if view_p:
        first_read: dict[int, tuple[int, int]] = {}
        for i, j, port, _ in edges:
            if port != CONTROL_PORT:
                first_read.setdefault(j, (i, port))
        for j in sorted(first_read):
            if chance(draw, view_p):
                i, port = first_read[j] if draw(st.booleans()) else (-1, 0)
                b.set_view(id_of[j], id_of[i] if i >= 0 else -1, port)
    if scope_hold_p:
        for i, _, port, _ in edges:
            if port != CONTROL_PORT and chance(draw, scope_hold_p):
                b.hold_until(id_of[i], port, id_of[draw(ints(0, n - 1))])
    if held_p:
        for pos, op in enumerate(ops):
            for port in range(len(op["output_bytes"])):
                if chance(draw, held_p):
                    b.hold(id_of[pos], port)
    group = list(range(n))
    for v in range(1, n):
        if chance(draw, group_p):
            group[v] = group[draw(ints(0, v - 1))]  # canonical: group[u] <= u < v
    return b.build().replace(group=group)


@st.composite
def training_dags(draw, min_forward: int = 2, max_forward: int = 12) -> OpGraph:
    """A training-like DAG (module docstring); groups canonical (named by their smallest op)."""
    n_forward = draw(ints(min_forward, max_forward))
    b = GraphBuilder()
    fwd: list[int] = []
    variables: list[int] = []
    ports: list[int] = []
    inputs: dict[int, list[tuple[int, int]]] = {}
    for i in range(n_forward):
        if i == 0 or chance(draw, 0.25):
            v = b.add_op(
                f"var{i}",
                "VariableV2",
                [draw(pick((40, 200)))],
                persistent_bytes=draw(pick((40, 200))),
            )
            variables.append(v)
            ports.append(1)
            inputs[v] = []
        else:
            out = [draw(pick((50, 0, 300))) for _ in range(draw(ints(1, 2)))]
            v = b.add_op(
                f"fwd{i}",
                "X",
                out,
                compute_us=draw(pick((5.0, 1.0, 20.0))),
                temporary_bytes=draw(pick((0, 30))),
            )
            ports.append(len(out))
            ins = []
            for u in [fwd[i] for i in draw(subsets(len(fwd), 3, min_size=1))]:
                port = draw(ints(0, ports[u] - 1))
                b.add_edge(u, v, port)
                ins.append((u, port))
            inputs[v] = ins
        fwd.append(v)
    consumers: dict[int, list[int]] = {v: [] for v in fwd}
    for v in fwd:
        for u, _ in inputs[v]:
            consumers[u].append(v)
    grad: dict[int, int] = {}
    for v in reversed(fwd):
        if chance(draw, 0.15):
            continue  # no gradient for this op
        g = b.add_op(
            f"gradients/{b._cols['names'][v]}_grad",
            "XGrad",
            [draw(pick((50, 0, 300)))],
            compute_us=draw(pick((5.0, 1.0, 20.0))),
            is_backward=True,
            forward_op=-1 if chance(draw, 0.15) else v,
        )
        grad[v] = g
        ups = [grad[w] for w in consumers[v] if w in grad]
        if len(ups) > 1 and chance(draw, 0.5):  # aggregate the incoming gradients first
            agg = b.add_op(f"gradients/AddN_{v}", "AddN", [50], compute_us=1.0, is_backward=True)
            for w in ups:
                b.add_edge(w, agg)
            ups = [agg]
        for w in ups:
            b.add_edge(w, g)
        for u, port in inputs[v]:
            if chance(draw, 0.6):
                b.add_edge(u, g, port)
        if chance(draw, 0.3):
            shape = b.add_op(f"gradients/shape_{v}", "Const", [8], is_backward=True)  # a backward source
            b.add_edge(shape, g)
    group = list(range(b.num_ops))
    for var in variables:
        if var in grad:
            apply = b.add_op(f"{b._cols['names'][var]}/Apply", "ApplyGradientDescent", [0], is_backward=True)
            b.add_edge(var, apply)
            b.add_edge(grad[var], apply)
            group.append(var)  # colocated with its variable
    for v in range(1, len(group)):
        if chance(draw, 0.1):
            group[v] = group[draw(ints(0, v - 1))]
    return b.build().replace(group=UnionFind(group).roots())


def memory_need(graph: OpGraph) -> int:
    """Bytes that hold the whole graph on one device however it is placed and scheduled:
    every op's own bytes, the largest temporary, and one copy of every tensor."""
    t = graph.tensors
    copies = sum(t.nbytes[x] for x in range(len(t.src)) if t.port[x] != CONTROL_PORT)
    return sum(own_bytes(graph)) + max(graph.temporary_bytes, default=0) + copies


@st.composite
def device_specs(
    draw,
    graph: OpGraph | None = None,
    *,
    min_devices: int = 1,
    max_devices: int = 4,
    modes: Sequence[str] = MODES,
    links: bool = True,
    kinds: bool = False,
) -> DeviceSpec:
    """Devices to place ``graph`` on, memory sized from :func:`memory_need` (module docstring).

    Shares of 1.0 or more always fit the whole graph on one device (no
    placer that respects memory may give up); smaller shares are tight and
    may be infeasible. ``kinds`` draws two device kinds (one twice as fast);
    ``links`` may override the pair (0, 1)'s latency and bandwidth.
    """
    ndev = draw(pick(tuple(range(min_devices, max_devices + 1))))  # uniform: ints() favours the ends
    need = max(memory_need(graph), 1) if graph is not None else 10**6
    if draw(pick((True, False))):  # all devices alike
        shares = [draw(pick(MEMORY_SHARES))] * ndev
    else:
        shares = [draw(pick(MEMORY_SHARES)) for _ in range(ndev)]
    memory = [10**12 if s is None else max(1, int(need * s)) for s in shares]
    flops = [DEFAULT_FLOPS] * ndev
    if kinds and ndev > 1:
        flops = [draw(pick((DEFAULT_FLOPS, 2 * DEFAULT_FLOPS))) for _ in range(ndev)]
    latency, bandwidth = draw(pick(COMM))
    overrides = {}
    if links and ndev > 1 and draw(pick((False, True))):
        overrides[(0, 1)] = draw(pick(COMM))
    mode = draw(pick(tuple(modes)))
    devices = tuple(Device(f"/device:GPU:{i}", m, flops=f) for i, (m, f) in enumerate(zip(memory, flops)))
    return DeviceSpec(devices, Interconnect(mode, latency, bandwidth, overrides))


def with_kind_times(graph: OpGraph, devices: DeviceSpec) -> OpGraph:
    """``graph`` with per-kind compute times for ``devices``' kinds (inversely proportional to FLOP/s)."""
    if devices.homogeneous:
        return graph
    by_kind = {}
    for d in devices.devices:
        # Only factors 1 and 1/2 are drawn: times stay exact.
        by_kind[d.kind] = [c * DEFAULT_FLOPS / d.flops for c in graph.compute_us]
    return graph.replace(compute_us_by_kind=by_kind)


@st.composite
def placement_cases(draw, graphs: st.SearchStrategy[OpGraph] | None = None, **spec_options) -> tuple:
    """(graph, devices): a drawn graph (default ``dags(1, 20, ...)``) and devices sized for it."""
    graph = draw(graphs if graphs is not None else dags(1, 20, measured_us=MEASURED_US, relabel=True))
    spec_options.setdefault("kinds", True)
    devices = draw(device_specs(graph, **spec_options))
    return with_kind_times(graph, devices), devices


# ------------------------------------------------------------------ checks


def _transfer_key(t: Transfer) -> tuple:
    return (t.src_op, t.port, t.dst_device, t.send_start, t.recv_start, t.end)


def same_timeline(a: SimResult, b: SimResult) -> bool:
    """Exactly the same placement, op times, transfers, memory peaks and step time.

    Transfers are compared as a collection: a list schedule records them in the
    order it committed their consumers, the simulator in the order it issued them.
    """
    return (
        a.device_of == b.device_of
        and a.start == b.start
        and a.end == b.end
        and sorted(a.transfers, key=_transfer_key) == sorted(b.transfers, key=_transfer_key)
        and a.peak_bytes == b.peak_bytes
        and a.step_time_us == b.step_time_us
    )


def is_topological(graph: OpGraph, sequence: Sequence[int]) -> bool:
    """``sequence`` lists every op once, each after its producers."""
    rank = {v: i for i, v in enumerate(sequence)}
    return sorted(sequence) == list(range(graph.num_ops)) and all(
        rank[graph.edge_src[e]] < rank[graph.edge_dst[e]] for e in range(graph.num_edges)
    )


def check_timeline(graph: OpGraph, devices: DeviceSpec, r: SimResult) -> None:
    """Assert ``r`` is a valid schedule of ``graph``: every op once on its device for its
    duration, no overlap on a device (or, in sequential mode, on a channel), every input
    present on the consumer's device before it starts, and the step time the last end."""
    n = graph.num_ops
    place = r.device_of
    assert sorted(v for seq in r.order for v in seq) == list(range(n))
    for d, seq in enumerate(r.order):
        assert all(place[v] == d for v in seq)
        for prev, nxt in pairwise(seq):
            assert r.end[prev] <= r.start[nxt], (d, prev, nxt)
    dur = op_durations(graph, devices, place)
    for v in range(n):
        assert r.start[v] >= 0.0 and r.end[v] == r.start[v] + dur[v]
    arrivals: dict[tuple[int, int, int], list[float]] = {}
    for t in r.transfers:
        assert t.src_device == place[t.src_op] != t.dst_device
        assert r.end[t.src_op] <= t.send_start <= t.recv_start <= t.end
        arrivals.setdefault((t.src_op, t.port, t.dst_device), []).append(t.end)
    for e in range(graph.num_edges):
        u, v = graph.edge_src[e], graph.edge_dst[e]
        if place[u] == place[v]:
            assert r.end[u] <= r.start[v], ("local input late", u, v)
        else:
            got = arrivals.get((u, graph.edge_port[e], place[v]))
            assert got, ("input never sent", u, v)
            assert len(got) == 1 and got[0] <= r.start[v], ("input late", u, v, got, r.start[v])
    if devices.interconnect.mode == "sequential":
        busy: list[list[tuple[float, float]]] = [[] for _ in range(devices.count)]
        for t in r.transfers:
            busy[t.src_device].append((t.send_start, t.send_end))
            busy[t.dst_device].append((t.recv_start, t.end))
        for intervals in busy:
            intervals.sort()
            for (_, e1), (s2, _) in pairwise(intervals):
                assert e1 <= s2, ("channel overlap", intervals)
    assert r.step_time_us == max([*r.end, *(t.end for t in r.transfers)], default=0.0)
