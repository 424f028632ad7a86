"""Analytic cost model: count each op with the rule registry, then time it per device kind.

Contract. :func:`estimate_costs` takes an OpGraph whose ops carry op types,
output shapes/dtypes/bytes and decoded attrs (as the GraphDef and ONNX readers
produce them), a DeviceSpec and the op set its op types belong to
(``tensorflow`` for GraphDefs and workload JSON, ``onnx`` for ONNX models;
see :mod:`baechi_cli.costs.registry`), and returns a NEW graph with these
columns replaced -- the model owns them, whatever the input held:

* ``compute_us``          -- µs on the first device's kind;
* ``compute_us_by_kind``  -- one list per distinct :attr:`Device.kind` (always
  filled, also for homogeneous devices);
* ``persistent_bytes``    -- variables and optimizer slots, counted once, on the
  op that owns the storage (ONNX: the reader's initializer bytes);
* ``temporary_bytes``     -- scratch the op's kernel allocates while it runs
  (set by the few rules whose kernels allocate it; 0 elsewhere, including
  cuDNN convolution workspaces, which are not modelled).

plus a :class:`CostReport` (per-op FLOPs and bytes, totals, coverage).

Counting is kept apart from the device model (as XLA's HloCostAnalysis is):
rules give device-independent :class:`OpCount` s; :func:`op_time_us` times one:

    compute = flops / (device.flops * efficiency[class]);  memory = bytes moved / device.memory_bandwidth
    time_us = max(compute, memory) * 1e6 + device.launch_overhead_us          (device.overlap, the default)
    time_us = (compute + memory) * 1e6 + device.launch_overhead_us            (overlap: false)

``efficiency[class]`` is the device's factor for the compute class of the op's rule (1
when it has none); a device's ``overlap`` is false where its kernels do not hide memory
traffic under compute (``baechi devices calibrate`` measures it; a CPU's cores both compute
and wait). Ops whose rule kind is ``zero`` or ``variable`` take 0 µs: on a GPU
they launch no kernel, and charging them the launch overhead would make chains of
bookkeeping ops look expensive to the placers. Uncovered op types are timed by their bytes
plus the overhead. ONNX ops are seen through the reader's per-input attrs
(:func:`~baechi_cli.costs.rules_onnx.onnx_view`), which show the weights; control flow
counts its subgraphs' nodes (:func:`~baechi_cli.costs.rules_onnx.count_control_flow`).
A TF2 function graph's captured variable is sized by the largest use of its handle.

Complexity: O(V + E + S) Python with flat lists (S: ONNX subgraph nodes), one
pass to count and one list per device kind to time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from baechi_cli.core.devices import Device, DeviceSpec
from baechi_cli.core.graph import OpGraph
from baechi_cli.costs.registry import (
    ATEN,
    NO_KERNEL_KINDS,
    NO_RULE,
    ONNX,
    OP_SETS,
    RULES,
    TENSORFLOW,
    UNCOVERED,
    ZERO,
    OpCount,
    OpView,
    count_view,
    is_handle,
    is_state,
    name_table,
    op_compute_class,
    rule_for,
    rule_table,
    rules_markdown,
)
from baechi_cli.costs.rules_aten import aten_view
from baechi_cli.costs.rules_onnx import CONTROL_FLOW, InnerCount, count_control_flow, onnx_view

__all__ = [
    "OP_SETS",
    "RULES",
    "CostReport",
    "Counted",
    "OpCount",
    "count_ops",
    "estimate_costs",
    "op_time_us",
    "rule_for",
    "rule_table",
    "rules_markdown",
]


@dataclass(frozen=True)
class CostReport:
    """What the analytic model counted. Per-op lists are indexed by op id."""

    device_kind: str  # the kind ``compute_us`` was timed for
    flops: list[float]
    bytes_accessed: list[int]  # bytes read + bytes written
    total_flops: float
    total_bytes_read: int
    total_bytes_written: int
    total_persistent_bytes: int
    # rule kind (flops, bytes, zero, variable, uncovered) -> op type -> number of
    # ops, ONNX control flow's subgraph nodes included
    coverage: dict[str, dict[str, int]]
    # ops whose rule could not count them (a missing shape or attr, a malformed
    # attr) and that were costed by bytes only; then such subgraph nodes, by
    # path (``<op>/<graph attribute>/<node>``)
    fallback_ops: list[str]

    @property
    def total_bytes(self) -> int:
        return self.total_bytes_read + self.total_bytes_written

    @property
    def uncovered(self) -> list[str]:
        """Op types that have no rule (they were costed by bytes only), subgraph nodes' included."""
        return sorted(self.coverage.get(UNCOVERED, {}))

    def to_json(self) -> dict[str, Any]:
        """Totals and coverage for the report JSON.

        The per-op lists are left out and ``fallback_ops`` is cut to its first
        100 names (``fallback_count`` has them all): a graph without shapes
        would otherwise put every op name in the report.
        """
        return {
            "model": "analytic",
            "device_kind": self.device_kind,
            "total_flops": self.total_flops,
            "total_bytes_read": self.total_bytes_read,
            "total_bytes_written": self.total_bytes_written,
            "total_persistent_bytes": self.total_persistent_bytes,
            "coverage": {kind: dict(sorted(types.items())) for kind, types in sorted(self.coverage.items())},
            "uncovered": self.uncovered,
            "fallback_count": len(self.fallback_ops),
            "fallback_ops": self.fallback_ops[:100],
        }


def op_time_us(
    count: OpCount, device: Device, launches_kernel: bool = True, compute_class: str = ""
) -> float:
    """Roofline time of one op on ``device``: the larger of its compute and memory times (their
    sum where ``device.overlap`` is false), plus launch overhead.

    The compute time is at the device's FLOP/s for the op's ``compute_class``
    (:meth:`~baechi_cli.core.devices.Device.flops_for`).
    """
    if not launches_kernel:
        return 0.0
    compute_s = count.flops / device.flops_for(compute_class)
    memory_s = (count.bytes_read + count.bytes_written) / device.memory_bandwidth
    busy_s = max(compute_s, memory_s) if device.overlap else compute_s + memory_s
    return busy_s * 1e6 + device.launch_overhead_us


# Resource-variable holders whose size may only be known from the handle's users.
_HANDLE_OWNERS = frozenset({"Placeholder", "_Arg", "VarHandleOp"})


def _read_size(view: OpView) -> int:
    return sum(view.output_bytes)


def _assigned_size(view: OpView) -> int:
    return view.input_bytes[1] if len(view.input_bytes) > 1 else 0


def _gradient_size(view: OpView) -> int:
    # Dense updates: the gradient, the largest plain input, has the variable's shape.
    return max(
        (b for b, dt in zip(view.input_bytes, view.input_dtypes, strict=True) if not is_state(dt)), default=0
    )


# Direct users of a resource handle that reveal the variable's size.
_HANDLE_SIZE_HINTS: dict[str, Callable[[OpView], int]] = {
    "ReadVariableOp": _read_size,
    "AssignVariableOp": _assigned_size,
    "AssignAddVariableOp": _assigned_size,
    "AssignSubVariableOp": _assigned_size,
    **{t: _gradient_size for t in name_table(TENSORFLOW) if t.startswith("ResourceApply")},
}


class Counted(NamedTuple):
    """What :func:`count_ops` returns."""

    counts: list[OpCount]
    kinds: list[str]  # rule kind per op
    fallbacks: list[int]  # ids of the ops whose rule could not count them
    subgraph_nodes: list[tuple[int, InnerCount]]  # (op id, what one of its subgraph nodes was counted as)


def _count_tensorflow(graph: OpGraph) -> Counted:
    """TensorFlow op types; inputs from the in-edges; resource handles sized by their users."""
    n = graph.num_ops
    op_types, attrs = graph.op_types, graph.attrs
    shapes, dtypes, obytes = graph.output_shapes, graph.output_dtypes, graph.output_bytes
    edge_src, edge_port, in_edges = graph.edge_src, graph.edge_port, graph.in_edges
    rules, hints = name_table(TENSORFLOW), _HANDLE_SIZE_HINTS
    nothing = OpCount()
    counts: list[OpCount] = [nothing] * n
    kinds: list[str] = [UNCOVERED] * n
    fallbacks: list[int] = []
    handle_size: dict[int, int] = {}  # handle owner op -> largest size hint
    for v in range(n):
        t = op_types[v]
        entry = rules.get(t, NO_RULE)
        kinds[v] = entry.kind
        hint = hints.get(t)
        if entry.kind == ZERO and hint is None:
            continue  # a zero-kind op costs OpCount() by definition; skip building its view
        srcs: list[int] = []
        in_shapes: list[Any] = []
        in_dtypes: list[str] = []
        in_bytes: list[int] = []
        for e in in_edges[v]:
            p = edge_port[e]
            if p >= 0:  # control inputs carry no data
                s = edge_src[e]
                srcs.append(s)
                in_shapes.append(shapes[s][p])
                in_dtypes.append(dtypes[s][p])
                in_bytes.append(obytes[s][p])
        view = OpView(t, attrs[v], in_shapes, in_dtypes, in_bytes, shapes[v], dtypes[v], obytes[v])
        counts[v], fell_back = count_view(entry, view)
        if fell_back:
            fallbacks.append(v)
        if hint is not None:
            size = hint(view)
            for s, dt in zip(srcs, in_dtypes, strict=True):
                if is_handle(dt) and size > handle_size.get(s, 0):
                    handle_size[s] = size
    for s, size in handle_size.items():
        if op_types[s] in _HANDLE_OWNERS and counts[s].persistent_bytes == 0:
            counts[s] = counts[s]._replace(persistent_bytes=size)
    return Counted(counts, kinds, fallbacks, [])


def _count_viewed(graph: OpGraph, op_set: str, view_of: Callable[..., OpView]) -> Counted:
    """Op types of a reader that records each op's inputs in its attrs (ONNX, aten): each op's
    :class:`OpView` by ``view_of``, counted by its rule; control flow keeps what each subgraph
    node was counted as."""
    n = graph.num_ops
    counts: list[OpCount] = [OpCount()] * n
    kinds: list[str] = [UNCOVERED] * n
    fallbacks: list[int] = []
    inner: list[tuple[int, InnerCount]] = []
    rules = name_table(op_set)
    for v in range(n):
        t = graph.op_types[v]
        entry = rules.get(t, NO_RULE)
        kinds[v] = entry.kind
        if entry.kind == ZERO:
            continue
        view = view_of(
            t, graph.attrs[v], graph.output_shapes[v], graph.output_dtypes[v], graph.output_bytes[v]
        )
        if t in CONTROL_FLOW:  # the rule's count, keeping what each subgraph node was counted as
            counts[v], nodes = count_control_flow(view)
            inner += [(v, node) for node in nodes]
            continue
        counts[v], fell_back = count_view(entry, view)
        if fell_back:
            fallbacks.append(v)
    return Counted(counts, kinds, fallbacks, inner)


_COUNTERS: dict[str, Callable[[OpGraph], Counted]] = {
    TENSORFLOW: _count_tensorflow,
    ONNX: lambda graph: _count_viewed(graph, ONNX, onnx_view),  # inputs incl. initializers; If/Loop/Scan
    ATEN: lambda graph: _count_viewed(graph, ATEN, aten_view),  # a PyTorch program's ops
}
# Op sets whose reader already put the weights' bytes on the ops (ONNX initializers, a PyTorch
# program's parameters).
_READER_OWNS_PERSISTENT = frozenset({ONNX, ATEN})


def count_ops(graph: OpGraph, op_set: str = TENSORFLOW) -> Counted:
    """Count every op: counts, rule kind per op, ids of ops that fell back, and what
    each ONNX control-flow op's subgraph nodes were counted as (:class:`Counted`).

    ``op_set`` names the table the op types are looked up in (one of
    :data:`OP_SETS`; ValueError for another). Rule kind is ``uncovered`` for
    op types without a rule. O(V + E + S) for S subgraph nodes.
    """
    if op_set not in _COUNTERS:
        raise ValueError(f"unknown op set {op_set!r}; expected one of {', '.join(OP_SETS)}")
    return _COUNTERS[op_set](graph)


def estimate_costs(
    graph: OpGraph, devices: DeviceSpec, *, op_set: str = TENSORFLOW
) -> tuple[OpGraph, CostReport]:
    """Cost every op of ``graph``, of op set ``op_set``, on ``devices``; see the module docstring.

    O(V + E + S) plus O(V) per distinct device kind.
    """
    counts, kinds, fallbacks, inner = count_ops(graph, op_set)
    launches = [k not in NO_KERNEL_KINDS for k in kinds]
    table = name_table(op_set)
    classes = [
        op_compute_class(table.get(t, NO_RULE), a) for t, a in zip(graph.op_types, graph.attrs, strict=True)
    ]
    by_kind: dict[str, list[float]] = {}
    for device in devices.devices:
        if device.kind not in by_kind:
            by_kind[device.kind] = [
                op_time_us(c, device, lk, cc) for c, lk, cc in zip(counts, launches, classes, strict=True)
            ]
    reference = devices.devices[0].kind

    coverage: dict[str, dict[str, int]] = {}
    for t, k in zip(graph.op_types, kinds, strict=True):
        per_type = coverage.setdefault(k, {})
        per_type[t] = per_type.get(t, 0) + 1
    for _, node in inner:
        per_type = coverage.setdefault(node.kind, {})
        per_type[node.op_type] = per_type.get(node.op_type, 0) + 1
    persistent = [c.persistent_bytes for c in counts]
    if op_set in _READER_OWNS_PERSISTENT:
        persistent = [
            held + counted for held, counted in zip(graph.persistent_bytes, persistent, strict=True)
        ]
    report = CostReport(
        device_kind=reference,
        flops=[c.flops for c in counts],
        bytes_accessed=[c.bytes_read + c.bytes_written for c in counts],
        total_flops=sum(c.flops for c in counts),
        total_bytes_read=sum(c.bytes_read for c in counts),
        total_bytes_written=sum(c.bytes_written for c in counts),
        total_persistent_bytes=sum(persistent),
        coverage=coverage,
        fallback_ops=[graph.names[v] for v in fallbacks]
        + [f"{graph.names[v]}/{node.path}" for v, node in inner if node.fell_back],
    )
    costed = graph.replace(
        compute_us=by_kind[reference],
        compute_us_by_kind=by_kind,
        persistent_bytes=persistent,
        temporary_bytes=[c.temporary_bytes for c in counts],
    )
    return costed, report
