"""Static check of a placed GraphDef: devices and colocation, never importing TensorFlow.

:func:`static_check` parses the placed GraphDef (and the original, when given)
with the project's own schema and reports, as a :class:`StaticResult`:

* with an original: the same node names in the same order, every NodeDef
  equal to the original's once both device fields are cleared, and every
  other GraphDef field (``versions``, ``library``, ...) equal
  (:func:`baechi_cli.verify.diff.compare_graphs`). Each difference is one
  line naming the op and what changed.
* every node has a device;
* every colocation constraint holds: each ``_class: loc:@name`` entry, each
  consumer of a resource or reference input and its producer (the pairs of
  :func:`baechi_cli.passes.colocation.colocation_pairs`, the same rules the
  placer groups by), and every op of a TF1 while loop with the loop's
  outermost ``Enter`` (:func:`baechi_cli.passes.control_flow.loop_frames`)
  are on one device. Devices are compared after
  :func:`~baechi_cli.io.tfsupport.normalize_device`: ``/device:GPU:1``,
  ``/GPU:1``, ``/gpu:1`` and ``/job:localhost/replica:0/task:0/device:GPU:1``
  are one device.

Lists keep the first :data:`~baechi_cli.verify.diff.KEEP` problems of each
kind and count them all. Differences, missing devices and broken constraints
are results (``ok=False``); only unreadable or malformed graphs raise
:class:`~baechi_cli.core.errors.InputError`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from baechi_cli.core.errors import InputError
from baechi_cli.io.tfsupport import device_index, normalize_device
from baechi_cli.verify.diff import KEEP, compare_graphs

if TYPE_CHECKING:
    from baechi_cli.core.graph import OpGraph
    from baechi_cli.proto_gen.tf_graph_pb2 import GraphDef

#: Kinds of colocation constraint, as counted in ``StaticResult.constraints``.
CONSTRAINT_KINDS = ("_class", "resource/ref", "loop frame")


@dataclass
class ColocationViolation:
    """Two ops that must share a device but do not; ``reason`` is a phrase about ``op``."""

    op: str
    other: str
    kind: str  # one of CONSTRAINT_KINDS
    reason: str  # e.g. "reads resource 'dense0/kernel'"
    device: str  # op's device, normalised (normalize_device)
    other_device: str

    def message(self) -> str:
        return f"'{self.op}' {self.reason} but is on {self.device} and it on {self.other_device}"


@dataclass
class StaticResult:
    """Outcome of :func:`static_check`; ``ok`` is the verdict.

    Lists keep the first :data:`KEEP` entries; the ``*_count`` fields count
    them all. ``devices`` counts ops by normalised device; ``num_devices`` is
    one more than the largest ``GPU:i``/``CPU:i`` index used (0 when none).
    ``constraints`` counts the colocation constraints checked (both ops
    have a device), by kind.
    """

    ok: bool
    placed: str
    original: str | None = None
    ops_total: int = 0
    devices: dict[str, int] = field(default_factory=dict)
    num_devices: int = 0
    differences: list[str] = field(default_factory=list)
    differences_count: int = 0
    without_device: list[str] = field(default_factory=list)
    without_device_count: int = 0
    violations: list[ColocationViolation] = field(default_factory=list)
    violations_count: int = 0
    constraints: dict[str, int] = field(default_factory=dict)

    def problems(self) -> list[str]:
        """One line per problem kept, differences first; see the counts for the rest."""
        lines = list(self.differences)
        if self.without_device:
            shown = ", ".join(f"'{n}'" for n in self.without_device[:5])
            more = f" and {self.without_device_count - 5} more" if self.without_device_count > 5 else ""
            lines.append(f"{self.without_device_count} op(s) have no device: {shown}{more}")
        lines.extend(v.message() for v in self.violations)
        return lines

    def problems_count(self) -> int:
        return self.differences_count + (1 if self.without_device_count else 0) + self.violations_count

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for entry, violation in zip(data["violations"], self.violations, strict=True):
            entry["message"] = violation.message()
        return data


def static_check(placed: str, original: str | None = None) -> StaticResult:
    """Check ``placed`` without TensorFlow (see the module docstring).

    Raises :class:`InputError` when either file is not a readable GraphDef or
    the placed graph is malformed (duplicate names, inputs naming no node,
    ``_class`` naming no node). Differences, missing devices and broken
    colocation constraints are results (``ok=False``), never exceptions.
    O(V + E) plus the proto comparison.
    """
    from baechi_cli.io.graphdef import parse_graphdef_file
    from baechi_cli.passes.colocation import CLASS_ATTR, colocation_pairs, describe_pair
    from baechi_cli.passes.control_flow import ROOT_FRAME, loop_frames

    placed_def = parse_graphdef_file(placed)
    original_def = parse_graphdef_file(original) if original is not None else None
    result = StaticResult(ok=False, placed=placed, original=original)
    devices = [normalize_device(node.device) for node in placed_def.node]
    try:
        graph = structure_graph(placed_def)
    except InputError as err:
        raise err.with_path(placed) from None
    result.ops_total = graph.num_ops

    if original_def is not None:
        count, first = compare_graphs(placed_def, original_def)
        result.differences_count, result.differences = count, first

    for name, device in zip(graph.names, devices, strict=True):
        if device:
            result.devices[device] = result.devices.get(device, 0) + 1
        else:
            result.without_device_count += 1
            if len(result.without_device) < KEEP:
                result.without_device.append(name)
    result.devices = dict(sorted(result.devices.items()))
    indices = [i for i in map(device_index, result.devices) if i is not None]
    result.num_devices = max(indices) + 1 if indices else 0

    constraints = dict.fromkeys(CONSTRAINT_KINDS, 0)
    seen: set[tuple[int, int]] = set()

    def check(v: int, u: int, kind: str, reason: Any) -> None:
        if v == u or (v, u) in seen:
            return
        seen.add((v, u))
        if not (devices[v] and devices[u]):
            return  # an op without a device is reported as such
        constraints[kind] += 1
        if devices[v] != devices[u]:
            result.violations_count += 1
            if len(result.violations) < KEEP:
                violation = ColocationViolation(
                    graph.names[v], graph.names[u], kind, reason(), devices[v], devices[u]
                )
                result.violations.append(violation)

    try:
        for v, u, kind in colocation_pairs(graph):
            group = "_class" if kind == CLASS_ATTR else "resource/ref"
            check(v, u, group, lambda v=v, u=u, kind=kind: describe_pair(graph, v, u, kind))
    except InputError as err:
        raise err.with_path(placed) from None
    for v, frame in enumerate(loop_frames(graph)):
        if frame != ROOT_FRAME:
            check(v, frame, "loop frame", lambda frame=frame: _loop_reason(graph, frame))
    result.constraints = constraints
    result.ok = result.problems_count() == 0
    return result


def _loop_reason(graph: OpGraph, enter: int) -> str:
    frame = graph.attrs[enter].get("frame_name", "")
    return f"is in the while loop that '{graph.names[enter]}' enters (frame '{frame}')"


def structure_graph(graph_def: GraphDef) -> OpGraph:
    """The OpGraph the checks need -- names, op types, attrs, ``_class``, declared
    types, edges -- without shapes or bytes, so TensorFlow is never needed.

    Decoded as :func:`baechi_cli.io.graphdef.read_graphdef` decodes it (the
    same op registry and attr decoding), but lenient about types: a node whose
    types cannot be worked out gets none (its resource inputs then go unchecked).
    """
    from baechi_cli.core.graph import GraphBuilder
    from baechi_cli.io.graphdef import decode_nodes

    decoded = decode_nodes(graph_def, lenient_types=True)
    builder = GraphBuilder()
    for i, info in enumerate(decoded.infos):
        attrs = info.public
        if decoded.in_types[i] is not None:
            attrs["_input_types"] = decoded.in_types[i]
        out_types = decoded.out_types[i]
        builder.add_op(
            decoded.names[i], decoded.ops[i], [0] * len(out_types), output_dtypes=out_types, attrs=attrs,
            colocate_with=info.colocate_with(),
        )  # fmt: skip
    for dst, node_inputs in enumerate(decoded.inputs):
        for src, port in node_inputs:
            builder.add_edge(src, dst, port, nbytes=0)
    return builder.build()
