"""OpGraph, the intermediate representation every stage reads and returns.

Ops have dense integer ids ``0..n-1``; every per-op attribute is a flat list
indexed by id and every per-edge attribute a flat list indexed by edge id, so
the hot loops of the simulator and the placers never touch per-node dicts.

An edge carries one tensor ``(producer, port)`` to one consumer. Control
dependencies are edges with ``port == CONTROL_PORT`` and 0 bytes. A tensor
consumed by several ops on one device is transferred there once (see
``sim.py``).

Units: time in microseconds (float), memory in bytes (int).

Stages never mutate a graph they were given: they build a new one with
:class:`GraphBuilder` or :meth:`OpGraph.replace`.

Example:
    >>> b = GraphBuilder()
    >>> x = b.add_op("x", "Placeholder", output_bytes=[400])
    >>> y = b.add_op("y", "Relu", output_bytes=[400], compute_us=2.0)
    >>> _ = b.add_edge(x, y)
    >>> g = b.build()
    >>> g.num_ops, g.num_edges, g.topo_order()
    (2, 1, [0, 1])
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from baechi_cli.core.errors import InputError

CONTROL_PORT = -1


@dataclass(frozen=True)
class TensorTable:
    """The distinct tensors ``(producer, port)`` of a graph, control tensors included.

    A tensor's bytes and measured transfer time are the largest among the
    edges that carry it (they agree in every input format we read).
    """

    edge_tensor: list[int]  # edge id -> tensor id
    src: list[int]
    port: list[int]
    nbytes: list[int]
    measured_us: list[float | None]


@dataclass(frozen=True)
class MemoryTable:
    """What the simulator's memory count needs of a graph, as numpy arrays (``OpGraph.memory_table``).

    The allocations that do not depend on the placement: the ops with
    temporary bytes, and the outputs that allocate (a positive size, not a
    view's), each with its *slot*: the output's free time as the count
    tracks it, one per tensor (tensor ids first) and one per view source no
    edge carries (-1: none, the output is freed when its op ends). The data
    edges (control edges free nothing) with their consumer and tensor. And
    the views in reverse topological order, as (view, its source's producer,
    the source's slot, the slots of the view's outputs, its in-edges
    carrying the source), so that a view of a view hands its lifetime down
    the chain.
    """

    total_bytes: int  # of every op's persistent, output and temporary bytes (exact)
    temporary_ops: Any  # np.ndarray[int64]: ops with temporary bytes (int64, or object when huge)
    temporary_bytes: Any
    output_ops: Any  # per allocating output: its op, bytes and slot (-1: none)
    output_bytes: Any
    output_slot: Any
    held_slots: Any  # the slots of ``OpGraph.held_outputs``: freed when the step ends
    hold_slots: Any  # per scope hold (``OpGraph.scope_holds``): the tensor's slot and the op
    hold_ops: Any  # until whose end it stays
    data_edges: Any  # edge ids of the data (non-control) edges
    data_dst: Any
    data_tensor: Any
    slot_src: Any  # per slot: the op producing it
    views: list[tuple[int, int, int, list[int], list[int]]]


@dataclass(frozen=True)
class OpGraph:
    """A directed acyclic graph of ops (cycles are rejected by :meth:`topo_order`)."""

    # --- per op ---------------------------------------------------------
    names: list[str]
    op_types: list[str]
    output_bytes: list[list[int]]  # bytes of each output port
    compute_us: list[float]  # on the reference device kind
    persistent_bytes: list[int]  # weights, optimizer slots: resident all step
    temporary_bytes: list[int]  # scratch while the op runs
    group: list[int]  # colocation group: ops with equal ids share a device
    is_backward: list[bool]
    forward_op: list[int]  # for a backward op its forward op, else -1
    # Format-specific facts kept for the cost model and writers; never read in
    # hot loops. ``output_shapes[v][port]`` is a tuple of ints (None when
    # unknown); ``attrs[v]`` holds decoded attributes the cost rules need;
    # ``colocate_with[v]`` names the ops TensorFlow's ``_class`` attr ties v to.
    output_shapes: list[list[tuple[int, ...] | None]]
    output_dtypes: list[list[str]]
    attrs: list[dict[str, Any]]
    colocate_with: list[tuple[str, ...]]
    # --- per edge -------------------------------------------------------
    edge_src: list[int]
    edge_port: list[int]  # CONTROL_PORT for control edges
    edge_dst: list[int]
    edge_bytes: list[int]
    edge_transfer_us: list[float | None]  # measured transfer time, overrides the comm model
    # --- derived adjacency (edge ids) -------------------------------------
    out_edges: list[list[int]] = field(repr=False)
    in_edges: list[list[int]] = field(repr=False)
    # Per-kind compute times for heterogeneous devices: kind name -> per-op µs.
    compute_us_by_kind: dict[str, list[float]] = field(default_factory=dict, repr=False)
    # For a fused graph: the original op ids behind each node.
    members: list[list[int]] | None = field(default=None, repr=False)
    # Views: op -> the tensor (producer, port) whose storage every output of the op
    # shares (Reshape, Squeeze, a PyTorch transpose, ...): the op allocates nothing
    # and keeps that tensor alive as long as its own outputs are (see sim.py).
    # Sparse; set by costs.memory_rules.mark_views, read only by the simulator.
    view_of: dict[int, tuple[int, int]] = field(default_factory=dict, repr=False)
    # Tensors (op, port) the caller holds for the whole step: the fed inputs (a
    # framework's caller keeps the batch it passed) and, for an inference step,
    # the declared outputs (returned to it). Allocated when their op starts, freed
    # when the step ends; a view among them keeps its source alive as long.
    held_outputs: frozenset[tuple[int, int]] = field(default_factory=frozenset, repr=False)
    # (op, port, w): the tensor (op, port) stays allocated at least until op w ends, as
    # an eager framework's Python frames keep it: it is an argument of a module call
    # whose last op is w, and the caller holds its arguments until the call returns.
    # Set by the ONNX reader from the exporter's module scopes; read by the simulator.
    scope_holds: tuple[tuple[int, int, int], ...] = field(default=(), repr=False)

    @property
    def num_ops(self) -> int:
        return len(self.names)

    @property
    def num_edges(self) -> int:
        return len(self.edge_src)

    def replace(self, **changes: Any) -> OpGraph:
        """A copy with some columns replaced (columns are shared, not copied)."""
        return dataclasses.replace(self, **changes)

    def without_edges(self, drop: set[int]) -> OpGraph:
        """A copy without the edges whose ids are in ``drop`` (edges are renumbered). O(V + E)."""
        keep = [e for e in range(self.num_edges) if e not in drop]
        out_edges: list[list[int]] = [[] for _ in range(self.num_ops)]
        in_edges: list[list[int]] = [[] for _ in range(self.num_ops)]
        for new, e in enumerate(keep):
            out_edges[self.edge_src[e]].append(new)
            in_edges[self.edge_dst[e]].append(new)
        return self.replace(
            edge_src=[self.edge_src[e] for e in keep],
            edge_port=[self.edge_port[e] for e in keep],
            edge_dst=[self.edge_dst[e] for e in keep],
            edge_bytes=[self.edge_bytes[e] for e in keep],
            edge_transfer_us=[self.edge_transfer_us[e] for e in keep],
            out_edges=out_edges,
            in_edges=in_edges,
        )

    def durations(self, kind: str | None = None) -> list[float]:
        """Per-op compute time in µs on devices of ``kind`` (reference kind if absent)."""
        if kind is not None and kind in self.compute_us_by_kind:
            return self.compute_us_by_kind[kind]
        return self.compute_us

    @functools.cached_property
    def tensors(self) -> TensorTable:
        """Distinct tensors and the edge -> tensor map (built once per graph). O(E).

        Tensors are numbered in the order of their first edge.
        """
        stride = self._port_stride
        ids: dict[int, int] = {}
        edge_tensor = [0] * self.num_edges
        src: list[int] = []
        port: list[int] = []
        nbytes: list[int] = []
        measured: list[float | None] = []
        edge_bytes, edge_transfer_us = self.edge_bytes, self.edge_transfer_us
        for e, (u, p) in enumerate(zip(self.edge_src, self.edge_port)):
            key = u * stride + p + 1
            t = ids.get(key)
            if t is None:
                t = ids[key] = len(src)
                src.append(u)
                port.append(p)
                nbytes.append(edge_bytes[e] if edge_bytes[e] > 0 else 0)
                measured.append(edge_transfer_us[e])
            else:
                if edge_bytes[e] > nbytes[t]:
                    nbytes[t] = edge_bytes[e]
                m = edge_transfer_us[e]
                if m is not None and (measured[t] is None or m > measured[t]):
                    measured[t] = m
            edge_tensor[e] = t
        return TensorTable(edge_tensor, src, port, nbytes, measured)

    def tensor_of(self, v: int, port: int) -> int:
        """The tensor (:attr:`tensors` id) of op ``v``'s output ``port``; -1 when no edge carries it.

        O(out-degree of ``v``).

        >>> b = GraphBuilder()
        >>> a, c = b.add_op("a", "Split", [4, 4]), b.add_op("c", "Relu", [4])
        >>> _ = b.add_edge(a, c, 1)
        >>> g = b.build()
        >>> g.tensor_of(a, 1), g.tensor_of(a, 0)
        (0, -1)
        """
        carried = next((e for e in self.out_edges[v] if self.edge_port[e] == port), -1)
        return self.tensors.edge_tensor[carried] if carried >= 0 else -1

    @functools.cached_property
    def _port_stride(self) -> int:
        """Keys a tensor (src, port) as one int, ``src * stride + port + 1`` (ports >= CONTROL_PORT):
        ints hash several times faster than (src, port) tuples on 1M-edge graphs."""
        stride = max((len(b) for b in self.output_bytes), default=0) + 2
        return max(stride, max(self.edge_port, default=0) + 2)

    @functools.cached_property
    def memory_table(self) -> MemoryTable:
        """The placement-independent facts of the simulator's memory count (built once per graph). O(V + E)."""
        import numpy as np

        tensors = self.tensors
        # A slot per output whose free time the count tracks: each tensor, each held output and
        # each view source that no edge carries (a fused graph's view of an output inside its
        # own node).
        stride = self._port_stride
        slot_keys = [u * stride + p + 1 for u, p in zip(tensors.src, tensors.port)]  # then the others'
        slot_src = list(tensors.src)
        views = []
        view_of = self.view_of
        slot_of = {key: t for t, key in enumerate(slot_keys)} if view_of else {}
        held_slots = []
        for v, p in sorted(self.held_outputs):
            t = self.tensor_of(v, p)
            if t >= 0:  # a tensor: its slot
                held_slots.append(t)
                continue
            held_slots.append(len(slot_src))
            slot_src.append(v)
            slot_keys.append(v * stride + p + 1)
            if view_of:
                slot_of[slot_keys[-1]] = held_slots[-1]
        hold_slots, hold_ops = [], []
        for v, p, w in self.scope_holds:  # a held argument is read over an edge: a tensor
            t = self.tensor_of(v, p)
            if t >= 0:
                hold_slots.append(t)
                hold_ops.append(w)
        for v in reversed(self.topo_order()) if view_of else ():
            if v not in view_of or view_of[v][0] < 0:  # not a view, or a view of resident storage
                continue
            src, port = view_of[v]
            source = src * stride + port + 1
            if source not in slot_of:
                slot_of[source] = len(slot_src)
                slot_src.append(src)
                slot_keys.append(source)
            own = [slot_of.get(v * stride + p + 1, -1) for p in range(len(self.output_bytes[v]))]
            reads = [e for e in self.in_edges[v] if self.edge_src[e] == src and self.edge_port[e] == port]
            views.append((v, src, slot_of[source], own, reads))
        # The outputs that allocate, flat: a positive size, not a view's.
        counts = np.fromiter(map(len, self.output_bytes), dtype=np.int64, count=self.num_ops)
        flat = list(itertools.chain.from_iterable(self.output_bytes))
        op = np.repeat(np.arange(self.num_ops, dtype=np.int64), counts)
        port = np.arange(len(flat), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        keep = np.fromiter((b != 0 for b in flat), dtype=bool, count=len(flat))
        if view_of:
            is_view = np.zeros(self.num_ops, dtype=bool)
            is_view[list(view_of)] = True
            keep &= ~is_view[op]
        kept = np.flatnonzero(keep)
        out_ops = op[kept]
        out_bytes = [flat[i] for i in kept.tolist()]  # Python ints: exact at any size
        # Each output's slot: the one with its key, if any (keys are distinct).
        out_slot = np.full(len(kept), -1, dtype=np.int64)
        if slot_keys:
            keys = np.array(slot_keys, dtype=np.int64)
            ranked = np.argsort(keys)
            in_order = keys[ranked]
            wanted = out_ops * stride + port[kept] + 1
            at = np.minimum(np.searchsorted(in_order, wanted), len(ranked) - 1)
            hit = in_order[at] == wanted
            out_slot[hit] = ranked[at[hit]]
        edge_port = np.array(self.edge_port, dtype=np.int64)
        data = np.flatnonzero(edge_port != CONTROL_PORT)
        temporary = [v for v, nbytes in enumerate(self.temporary_bytes) if nbytes]

        temporary_bytes = [self.temporary_bytes[v] for v in temporary]
        total = sum(self.persistent_bytes) + sum(out_bytes) + sum(temporary_bytes)

        def ints(values: Any) -> Any:
            return np.array(values, dtype=np.int64)

        # Bytes as Python ints where int64 could overflow (absurd sizes must stay exact).
        def byte_counts(values: list[int]) -> Any:
            return np.array(values, dtype=np.int64 if total < 2**62 else object)

        return MemoryTable(
            total_bytes=total,
            temporary_ops=ints(temporary),
            temporary_bytes=byte_counts(temporary_bytes),
            output_ops=ints(out_ops),
            output_bytes=byte_counts(out_bytes),
            output_slot=out_slot,
            held_slots=ints(held_slots),
            hold_slots=ints(hold_slots),
            hold_ops=ints(hold_ops),
            data_edges=data,
            data_dst=ints(self.edge_dst)[data],
            data_tensor=ints(tensors.edge_tensor)[data],
            slot_src=ints(slot_src),
            views=views,
        )

    def index(self) -> dict[str, int]:
        """Map op name -> id (built on demand; not for hot loops)."""
        return {name: i for i, name in enumerate(self.names)}

    def topo_order(self) -> list[int]:
        """Kahn's algorithm, lowest id first among ready ops: deterministic.

        O((V + E) log V) the first time, then cached (do not mutate the list).
        Raises :class:`InputError` naming the ops on a cycle.
        """
        return self._topo_order

    @functools.cached_property
    def _topo_order(self) -> list[int]:
        n = self.num_ops
        indeg = [0] * n
        for d in self.edge_dst:
            indeg[d] += 1
        ready = [v for v in range(n) if indeg[v] == 0]
        heapq.heapify(ready)
        order: list[int] = []
        out_edges, edge_dst = self.out_edges, self.edge_dst
        while ready:
            v = heapq.heappop(ready)
            order.append(v)
            for e in out_edges[v]:
                w = edge_dst[e]
                indeg[w] -= 1
                if indeg[w] == 0:
                    heapq.heappush(ready, w)
        if len(order) != n:
            cycle = self.find_cycle([v for v in range(n) if indeg[v] > 0])
            shown = " -> ".join(self.names[v] for v in cycle[:8])
            more = f" (+{len(cycle) - 8} more)" if len(cycle) > 8 else ""
            raise InputError(
                f"the graph has a cycle: {shown} -> {self.names[cycle[0]]}{more}",
                op=self.names[cycle[0]],
            )
        return order

    def find_cycle(self, among: Iterable[int]) -> list[int]:
        """One cycle (as op ids in edge order) within the ops ``among``."""
        import networkx as nx

        sub = nx.DiGraph()
        keep = set(among)
        for e in range(self.num_edges):
            s, d = self.edge_src[e], self.edge_dst[e]
            if s in keep and d in keep:
                sub.add_edge(s, d)
        edges = nx.find_cycle(sub)  # not from a fixed source: it may lie downstream of every cycle
        cycle = [s for s, _ in edges]
        first = cycle.index(min(cycle))  # start at the lowest id, so messages are stable
        return cycle[first:] + cycle[:first]

    def successors(self, v: int) -> list[int]:
        return [self.edge_dst[e] for e in self.out_edges[v]]

    def predecessors(self, v: int) -> list[int]:
        return [self.edge_src[e] for e in self.in_edges[v]]

    def group_members(self) -> dict[int, list[int]]:
        """Colocation group id -> its op ids, in id order."""
        groups: dict[int, list[int]] = {}
        for v, g in enumerate(self.group):
            groups.setdefault(g, []).append(v)
        return groups


class GraphBuilder:
    """Accumulates ops and edges, then :meth:`build` freezes them into an OpGraph."""

    def __init__(self) -> None:
        self._cols: dict[str, list] = {
            name: []
            for name in (
                "names",
                "op_types",
                "output_bytes",
                "compute_us",
                "persistent_bytes",
                "temporary_bytes",
                "group",
                "is_backward",
                "forward_op",
                "output_shapes",
                "output_dtypes",
                "attrs",
                "colocate_with",
                "edge_src",
                "edge_port",
                "edge_dst",
                "edge_bytes",
                "edge_transfer_us",
            )
        }
        self._view_of: dict[int, tuple[int, int]] = {}
        self._held: set[tuple[int, int]] = set()
        self._scope_holds: list[tuple[int, int, int]] = []

    @classmethod
    def from_graph(cls, graph: OpGraph) -> GraphBuilder:
        """A builder holding ``graph``'s ops, edges, groups and views (ids unchanged), to add more. O(V + E)."""
        builder = cls()
        for name, column in builder._cols.items():
            column.extend(getattr(graph, name))
        # Output lists are extended by add_output: copy them rather than share the graph's.
        builder._cols["output_bytes"] = [list(b) for b in graph.output_bytes]
        builder._cols["output_shapes"] = [list(x) for x in graph.output_shapes]
        builder._cols["output_dtypes"] = [list(x) for x in graph.output_dtypes]
        builder._view_of = dict(graph.view_of)
        builder._held = set(graph.held_outputs)
        builder._scope_holds = list(graph.scope_holds)
        return builder

    def hold(self, v: int, port: int) -> None:
        """Have the caller hold tensor ``(v, port)`` for the whole step (:attr:`OpGraph.held_outputs`)."""
        self._held.add((v, port))

    def hold_until(self, v: int, port: int, w: int) -> None:
        """Keep tensor ``(v, port)`` allocated at least until op ``w`` ends (:attr:`OpGraph.scope_holds`)."""
        self._scope_holds.append((v, port, w))

    def set_view(self, v: int, src: int, port: int) -> None:
        """Make op ``v``'s outputs views of tensor ``(src, port)`` (:attr:`OpGraph.view_of`)."""
        self._view_of[v] = (src, port)

    def add_temporary(self, v: int, nbytes: int) -> None:
        """Give op ``v`` ``nbytes`` more scratch while it runs."""
        self._cols["temporary_bytes"][v] += int(nbytes)

    def add_output(self, v: int, nbytes: int, shape: tuple[int, ...] | None = None, dtype: str = "") -> int:
        """Give op ``v`` one more output port of ``nbytes``; returns the port."""
        c = self._cols
        c["output_bytes"][v].append(int(nbytes))
        c["output_shapes"][v].append(shape)
        c["output_dtypes"][v].append(dtype)
        return len(c["output_bytes"][v]) - 1

    @property
    def num_ops(self) -> int:
        return len(self._cols["names"])

    def set_group(self, v: int, group: int) -> None:
        """Put op ``v`` in colocation group ``group`` (an op id)."""
        self._cols["group"][v] = group

    def set_forward_op(self, v: int, forward: int) -> None:
        """Make op ``forward`` the forward op of backward op ``v``."""
        self._cols["forward_op"][v] = forward

    def add_op(
        self,
        name: str,
        op_type: str,
        output_bytes: Sequence[int] = (),
        *,
        compute_us: float = 0.0,
        persistent_bytes: int = 0,
        temporary_bytes: int = 0,
        is_backward: bool = False,
        forward_op: int = -1,
        output_shapes: Sequence[tuple[int, ...] | None] | None = None,
        output_dtypes: Sequence[str] | None = None,
        attrs: dict[str, Any] | None = None,
        colocate_with: Sequence[str] = (),
    ) -> int:
        """Add an op and return its id. Its colocation group starts as itself."""
        c = self._cols
        v = len(c["names"])
        nports = len(output_bytes)
        c["names"].append(name)
        c["op_types"].append(op_type)
        c["output_bytes"].append([int(b) for b in output_bytes])
        c["compute_us"].append(float(compute_us))
        c["persistent_bytes"].append(int(persistent_bytes))
        c["temporary_bytes"].append(int(temporary_bytes))
        c["group"].append(v)
        c["is_backward"].append(bool(is_backward))
        c["forward_op"].append(int(forward_op))
        c["output_shapes"].append(list(output_shapes) if output_shapes is not None else [None] * nports)
        c["output_dtypes"].append(list(output_dtypes) if output_dtypes is not None else [""] * nports)
        c["attrs"].append(attrs if attrs is not None else {})
        c["colocate_with"].append(tuple(colocate_with))
        return v

    def add_edge(
        self,
        src: int,
        dst: int,
        port: int = 0,
        *,
        nbytes: int | None = None,
        transfer_us: float | None = None,
    ) -> int:
        """Add an edge carrying ``(src, port)`` to ``dst``; bytes default to the port's size."""
        c = self._cols
        if nbytes is None:
            nbytes = 0 if port == CONTROL_PORT else c["output_bytes"][src][port]
        e = len(c["edge_src"])
        c["edge_src"].append(src)
        c["edge_port"].append(port)
        c["edge_dst"].append(dst)
        c["edge_bytes"].append(int(nbytes))
        c["edge_transfer_us"].append(transfer_us)
        return e

    def build(self) -> OpGraph:
        c = self._cols
        out_edges, in_edges = adjacency(len(c["names"]), c["edge_src"], c["edge_dst"])
        return OpGraph(
            out_edges=out_edges,
            in_edges=in_edges,
            view_of=dict(self._view_of),
            held_outputs=frozenset(self._held),
            scope_holds=tuple(sorted(set(self._scope_holds))),
            **c,
        )


def adjacency(
    n: int, edge_src: Sequence[int], edge_dst: Sequence[int]
) -> tuple[list[list[int]], list[list[int]]]:
    """Each op's out-edge and in-edge ids, in edge order. O(V + E)."""
    out_edges: list[list[int]] = [[] for _ in range(n)]
    in_edges: list[list[int]] = [[] for _ in range(n)]
    for e, (s, d) in enumerate(zip(edge_src, edge_dst)):
        out_edges[s].append(e)
        in_edges[d].append(e)
    return out_edges, in_edges


def graph_from_columns(
    names: list[str],
    op_types: list[str],
    compute_us: list[float],
    persistent_bytes: list[int],
    edge_src: list[int],
    edge_dst: list[int],
    edge_bytes: list[int],
    edge_transfer_us: list[float | None],
    **columns: Any,
) -> OpGraph:
    """An OpGraph of ``len(names)`` ops with one output port each and edges from port 0, built
    from whole columns: what :class:`GraphBuilder` makes op by op, at about half its cost
    (a reader of a million ops saves seconds).

    Every op's port holds 0 bytes unless ``output_bytes`` is given; any other per-op
    column of :class:`OpGraph` may be given by keyword (``group``, ``is_backward``,
    ``forward_op``, ``attrs``, ...), else it takes :meth:`GraphBuilder.add_op`'s
    default. Columns are used as given (typed as OpGraph's), not copied. O(V + E).
    """
    n = len(names)
    out_edges, in_edges = adjacency(n, edge_src, edge_dst)
    defaults: dict[str, Any] = {
        "output_bytes": lambda: [[0] for _ in range(n)],
        "temporary_bytes": lambda: [0] * n,
        "group": lambda: list(range(n)),
        "is_backward": lambda: [False] * n,
        "forward_op": lambda: [-1] * n,
        "output_shapes": lambda: [[None] for _ in range(n)],
        "output_dtypes": lambda: [[""] for _ in range(n)],
        "attrs": lambda: [{} for _ in range(n)],
        "colocate_with": lambda: [()] * n,
    }
    unknown = set(columns) - set(defaults)
    if unknown:
        raise TypeError(f"unknown columns: {', '.join(sorted(unknown))}")
    for name, make in defaults.items():
        if name not in columns:
            columns[name] = make()
    return OpGraph(
        names=names,
        op_types=op_types,
        compute_us=compute_us,
        persistent_bytes=persistent_bytes,
        edge_src=edge_src,
        edge_port=[0] * len(edge_src),
        edge_dst=edge_dst,
        edge_bytes=edge_bytes,
        edge_transfer_us=edge_transfer_us,
        out_edges=out_edges,
        in_edges=in_edges,
        **columns,
    )


def own_bytes(graph: OpGraph) -> list[int]:
    """Bytes each op holds on its device for the whole step in the ledger: persistent + outputs.

    Temporary bytes are not summed: the ledger charges a device the largest
    of its ops' temporaries once.
    """
    return [graph.persistent_bytes[v] + sum(graph.output_bytes[v]) for v in range(graph.num_ops)]
