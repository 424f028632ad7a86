"""Cost profiles: the ``baechi.profile/v1`` file, built from costs and applied to a graph.

Contract. A profile records, for every op of one model (matched by name),
its compute time (µs), analytic FLOPs, output bytes per port, temporary and
persistent bytes and where those came from (``analytic`` or ``measured``),
plus measured transfer times of edges where known. The schema is
``proto/profile.proto``; the file is that message through protobuf's JSON
mapping with the proto field names kept, written one op per line so a diff
of two profiles reads op by op. The keys docs/DESIGN.md lists ("Outputs") are a contract.

* :func:`build_profile` turns a costed graph (analytic, merged with
  measurements by :func:`merge_measurements`, or a workload's given costs)
  into the message;
* :func:`dumps` / :func:`write_profile` serialise it (same profile -> same bytes);
* :func:`load_profile` reads and validates one: a wrong schema, malformed
  JSON, a negative, NaN or infinite cost, or a fractional byte count is an
  :class:`~baechi_cli.core.errors.InputError` naming the file and the op;
* :func:`apply_profile` puts a profile's costs on a graph read from the same
  model; missing or extra op names and port counts that differ are an error
  listing the first mismatches.

Example (a two-op graph, costed by hand, through JSON and back):

    >>> from baechi_cli.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.add_op("x", "Placeholder", output_bytes=[400])
    >>> y = b.add_op("y", "Relu", output_bytes=[400], compute_us=2.5)
    >>> _ = b.add_edge(x, y)
    >>> g = b.build()
    >>> p = build_profile(g, source_of=["analytic"] * 2, rule_of=["zero", "flops"], flops=[0.0, 100.0],
    ...                   device="test", model={"path": "m.pb", "format": "graphdef"})
    >>> p.source, p.totals.compute_us, list(p.ops[1].output_bytes)
    ('analytic', 2.5, [400.0])
    >>> again = parse(dumps(p), "costs.json")
    >>> apply_profile(g, again, "costs.json").compute_us
    [0.0, 2.5]

Complexity: every function is O(V + E) in the graph and profile sizes.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format

from baechi_cli.core.errors import InputError, one_line, truncate
from baechi_cli.core.graph import CONTROL_PORT, OpGraph
from baechi_cli.proto_gen import profile_pb2

if TYPE_CHECKING:
    from baechi_cli.costs.analytic import CostReport
    from baechi_cli.costs.measured import MeasuredRun
    from baechi_cli.evaluator.sim import SimResult

SCHEMA = "baechi.profile/v1"
ANALYTIC, MEASURED, MIXED = "analytic", "measured", "mixed"
# The rule of ops whose costs a workload JSON file gives (measured by whoever
# published the workload; their source is ``measured``).
GIVEN = "given"
FALLBACK = "fallback"
# How many mismatching names an error or a profile lists before "and N more".
FIRST = 3
NOT_RUN_LISTED = 100
# Characters of a value from the file that an error message quotes.
_QUOTED = 60

CostProfile = profile_pb2.CostProfile

__all__ = [
    "SCHEMA",
    "CostProfile",
    "apply_profile",
    "build_profile",
    "dumps",
    "load_profile",
    "merge_measurements",
    "parse",
    "rule_kinds",
    "write_profile",
]


def rule_kinds(graph: OpGraph, report: CostReport, op_set: str = "tensorflow") -> list[str]:
    """The analytic rule kind that costed each op: flops | bytes | zero | variable | uncovered,
    or ``fallback`` where the rule lacked a shape or attr and bytes alone were counted.

    ``op_set`` is the one ``report`` was counted with (see :func:`~baechi_cli.costs.registry.rule_for`).
    """
    from baechi_cli.costs.registry import rule_for

    kinds = [rule_for(t, op_set).kind for t in graph.op_types]
    if report.fallback_ops:
        fell_back = set(report.fallback_ops)
        kinds = [FALLBACK if name in fell_back else k for name, k in zip(graph.names, kinds, strict=True)]
    return kinds


def merge_measurements(graph: OpGraph, run: MeasuredRun) -> tuple[OpGraph, list[str], list[str]]:
    """Put a measured run's costs on an (analytically costed) graph.

    Returns ``(graph, source per op, device per op)``. An op that ran gets its
    median compute time, the output bytes TensorFlow's allocator recorded
    (ports it recorded nothing for keep theirs) and its temporary bytes where
    TensorFlow reported them; its source is ``measured``. Ops that did not run
    keep every analytic cost and are ``analytic``. Persistent bytes stay
    analytic: variables are allocated by the init op, outside the measured
    steps, and their size is exact from their shapes. The measured times are
    for one device, so per-kind times are dropped. O(V + E).
    """
    compute = list(graph.compute_us)
    out_bytes = [list(b) for b in graph.output_bytes]
    temporary = list(graph.temporary_bytes)
    source = [ANALYTIC] * graph.num_ops
    device = [""] * graph.num_ops
    for v, name in enumerate(graph.names):
        m = run.ops.get(name)
        if m is None:
            continue
        source[v], device[v] = MEASURED, m.device
        compute[v] = m.compute_us
        for port, nbytes in enumerate(m.output_bytes[: len(out_bytes[v])]):
            if nbytes is not None:
                out_bytes[v][port] = nbytes
        if m.temporary_bytes is not None:
            temporary[v] = m.temporary_bytes
    merged = _with_costs(graph, compute, out_bytes, temporary, list(graph.persistent_bytes), None)
    return merged, source, device


def _with_costs(
    graph: OpGraph,
    compute: list[float],
    out_bytes: list[list[int]],
    temporary: list[int],
    persistent: list[int],
    transfer_us: list[float | None] | None,
) -> OpGraph:
    """A copy of ``graph`` with these costs; edge bytes follow their tensor's output bytes."""
    edge_bytes = [
        0 if p == CONTROL_PORT else out_bytes[s][p]
        for s, p in zip(graph.edge_src, graph.edge_port, strict=True)
    ]
    changes: dict[str, Any] = {
        "compute_us": compute,
        "compute_us_by_kind": {},
        "output_bytes": out_bytes,
        "temporary_bytes": temporary,
        "persistent_bytes": persistent,
        "edge_bytes": edge_bytes,
    }
    if transfer_us is not None:
        changes["edge_transfer_us"] = transfer_us
    return graph.replace(**changes)


def build_profile(
    graph: OpGraph,
    *,
    source_of: Sequence[str],
    rule_of: Sequence[str],
    flops: Sequence[float],
    device: str,
    model: dict[str, Any],
    device_of: Sequence[str] | None = None,
    single: SimResult | None = None,
    run: MeasuredRun | None = None,
    generator: str = "",
) -> CostProfile:
    """The profile message of a costed graph (see the module docstring).

    ``source_of``, ``rule_of``, ``flops`` and ``device_of`` are per op;
    ``model`` holds the :class:`Model` fields (path, sha256, format, ops,
    edges, batch_size); ``single`` is the one-device simulation the totals'
    peak activation memory and step time come from (zero without one);
    ``run`` describes a measurement.
    """
    n = graph.num_ops
    names = graph.names
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InputError(f"op name '{name}' occurs twice; a profile matches ops by name", op=name)
        seen.add(name)
    p = CostProfile(schema=SCHEMA, device=device, generator=generator)
    fields = {k: v for k, v in model.items() if v is not None}
    p.model.CopyFrom(profile_pb2.Model(ops=n, edges=graph.num_edges, **fields))
    measured = sum(1 for s in source_of if s == MEASURED)
    if measured == n and n:
        p.source = MEASURED
    elif measured:
        p.source = MIXED
    else:
        p.source = ANALYTIC
    for v in range(n):
        op = p.ops.add(
            name=names[v],
            type=graph.op_types[v],
            compute_us=graph.compute_us[v],
            flops=flops[v],
            output_bytes=graph.output_bytes[v],
            temporary_bytes=graph.temporary_bytes[v],
            persistent_bytes=graph.persistent_bytes[v],
            source=source_of[v],
            rule=rule_of[v],
        )
        if device_of is not None and device_of[v]:
            op.device = device_of[v]
    for e, us in enumerate(graph.edge_transfer_us):
        if us is not None:
            p.edges.add(
                src=names[graph.edge_src[e]],
                port=graph.edge_port[e],
                dst=names[graph.edge_dst[e]],
                transfer_us=us,
            )
    coverage: dict[tuple[str, str], int] = {}
    for t, r in zip(graph.op_types, rule_of, strict=True):
        coverage[(t, r)] = coverage.get((t, r), 0) + 1
    for (t, r), count in sorted(coverage.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        p.coverage.add(op_type=t, rule=r, ops=count)
    totals = p.totals
    totals.compute_us = math.fsum(graph.compute_us)
    totals.flops = math.fsum(flops)
    totals.persistent_bytes = sum(graph.persistent_bytes)
    totals.temporary_bytes = max(graph.temporary_bytes, default=0)
    totals.measured_ops = measured
    totals.analytic_ops = n - measured
    if single is not None:
        totals.peak_activation_bytes = max(single.peak_bytes) - sum(graph.persistent_bytes)
        totals.single_device_step_us = single.step_time_us
    if run is not None:
        not_run = [names[v] for v in range(n) if source_of[v] != MEASURED]
        p.measurement.CopyFrom(
            profile_pb2.Measurement(
                tensorflow=run.tensorflow,
                warmup=run.warmup,
                steps=run.steps,
                init_op=run.init_op or "",
                fetches=run.fetches,
                not_run=not_run[:NOT_RUN_LISTED],
                not_run_count=len(not_run),
                torch=run.torch,
                threads=run.threads,
            )
        )
    return p


# --- JSON ---------------------------------------------------------------------------

# Top-level keys in the order a person reads them; the per-op and per-edge
# lists come last, one entry per line.
_HEAD = ("schema", "source", "device", "generator", "model", "totals", "measurement")
_LISTS = ("coverage", "ops", "edges")


def to_json(profile: CostProfile) -> dict[str, Any]:
    """The profile as protobuf's JSON mapping makes it (field names kept, defaults printed),
    keys in field-number order at every level.

    The per-op, per-edge and coverage lists -- messages of scalars, the bulk
    of a profile -- are mapped field by field here, as MessageToDict maps
    them (a test checks the two agree) but without its per-field overhead,
    which dominates on large graphs.
    """
    doc: dict[str, Any] = {}
    for fd in profile.DESCRIPTOR.fields:
        value = getattr(profile, fd.name)
        if fd.name in _LISTS:
            doc[fd.name] = [_flat_to_json(m) for m in value]
        elif fd.message_type is not None:
            if profile.HasField(fd.name):
                mapped = json_format.MessageToDict(
                    value, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
                )
                doc[fd.name] = _in_field_order(mapped, fd.message_type)
        else:
            doc[fd.name] = value
    return doc


def _flat_to_json(message: Any) -> dict[str, Any]:
    """A message of scalar and repeated scalar fields as the JSON mapping gives it."""
    out: dict[str, Any] = {}
    for name, repeated, floating in _flat_fields(message.DESCRIPTOR):
        value = getattr(message, name)
        if repeated:
            value = [_json_float(x) for x in value] if floating else list(value)
        elif floating:
            value = _json_float(value)
        out[name] = value
    return out


@functools.cache
def _flat_fields(descriptor: Any) -> tuple[tuple[str, bool, bool], ...]:
    floating = (descriptor.fields[0].TYPE_DOUBLE, descriptor.fields[0].TYPE_FLOAT)
    return tuple((fd.name, fd.is_repeated, fd.type in floating) for fd in descriptor.fields)


def _json_float(x: float) -> float | str:
    # The JSON mapping spells non-finite doubles as strings.
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _in_field_order(doc: dict[str, Any], descriptor: Any) -> dict[str, Any]:
    # MessageToDict lists the fields that are set before the defaults it adds;
    # a fixed order keeps profiles of different models diffable.
    out: dict[str, Any] = {}
    for fd in descriptor.fields:
        if fd.name not in doc:
            continue
        value = doc[fd.name]
        if fd.message_type is not None:
            if isinstance(value, list):
                value = [_in_field_order(v, fd.message_type) for v in value]
            else:
                value = _in_field_order(value, fd.message_type)
        out[fd.name] = value
    return out


def dumps(profile: CostProfile) -> str:
    """Serialise ``profile`` as JSON text, one op (and one edge) per line; deterministic."""
    doc = to_json(profile)
    lines = ["{"]
    keys = [k for k in _HEAD if k in doc] + [k for k in doc if k not in _HEAD and k not in _LISTS]
    for key in keys:
        lines.append(f"  {json.dumps(key)}: {_json_line(doc[key])},")
    for i, key in enumerate(_LISTS):
        items = doc.get(key, [])
        tail = "," if i + 1 < len(_LISTS) else ""
        if not items:
            lines.append(f"  {json.dumps(key)}: []{tail}")
            continue
        lines.append(f"  {json.dumps(key)}: [")
        lines += [
            f"    {_json_line(item)}{',' if j + 1 < len(items) else ''}" for j, item in enumerate(items)
        ]
        lines.append(f"  ]{tail}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _compact(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, list):
        return [_compact(x) for x in value]
    return value


def _json_line(value: Any) -> str:
    """``value`` as JSON on one line; a dict's integral floats are written as integers."""
    if isinstance(value, dict):
        value = {k: _compact(v) for k, v in value.items()}
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def write_profile(profile: CostProfile, path: str) -> None:
    """Write ``profile`` to ``path`` atomically (a temporary file, then a rename)."""
    from baechi_cli.io.files import write_atomic

    write_atomic(path, dumps(profile).encode())


def load_profile(path: str) -> CostProfile:
    """Read and validate the profile at ``path`` (see :func:`parse`)."""
    from baechi_cli.io.files import read_input

    data = read_input(path, "profile")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"not a baechi profile: not UTF-8 text ({err.reason})", path=path) from None
    return parse(text, path)


def parse(text: str, path: str) -> CostProfile:
    """Parse profile JSON text; ``path`` names the file in errors.

    Fields this version does not know are ignored (a newer baechi may add
    some); a missing or other ``schema`` is an error.
    """
    try:
        # Bare NaN / Infinity (not JSON, but Python writes them) become the
        # quoted forms the JSON mapping accepts, so validation names the op.
        doc = json.loads(text, parse_constant=str)
    except json.JSONDecodeError as err:
        raise InputError(f"not a baechi profile: invalid JSON ({err})", path=path) from None
    except (ValueError, RecursionError):  # an integer of thousands of digits; absurdly deep nesting
        raise InputError("not a baechi profile: a number too long or nesting too deep", path=path) from None
    if not isinstance(doc, dict) or "schema" not in doc:
        raise InputError(f'not a baechi profile: no "schema" key (expected {SCHEMA!r})', path=path)
    if doc["schema"] != SCHEMA:
        shown = truncate(repr(doc["schema"]), _QUOTED)
        raise InputError(f"profile schema {shown} is not {SCHEMA!r}", path=path)
    try:
        profile = json_format.ParseDict(doc, CostProfile(), ignore_unknown_fields=True)
    except (json_format.ParseError, OverflowError) as err:  # OverflowError: an integer beyond a double
        raise InputError(f"malformed profile: {truncate(one_line(err), 3 * _QUOTED)}", path=path) from None
    _validate(profile, path)
    return profile


def _bad_number(value: float, *, integral: bool) -> str | None:
    if math.isnan(value):
        return "is NaN"
    if math.isinf(value):
        return "is infinite"
    if value < 0:
        return f"is negative ({value:g})"
    if integral and not value.is_integer():
        return f"is not a whole number of bytes ({value:g})"
    return None


def _validate(profile: CostProfile, path: str) -> None:
    seen: set[str] = set()
    for op in profile.ops:
        if not op.name:
            raise InputError("an op has no name", path=path)
        if op.name in seen:
            raise InputError("occurs twice in the profile", path=path, op=op.name)
        seen.add(op.name)
        checks = [
            ("compute_us", op.compute_us, False),
            ("flops", op.flops, False),
            ("temporary_bytes", op.temporary_bytes, True),
            ("persistent_bytes", op.persistent_bytes, True),
        ]
        checks += [(f"output_bytes[{i}]", b, True) for i, b in enumerate(op.output_bytes)]
        for field, value, integral in checks:
            problem = _bad_number(value, integral=integral)
            if problem:
                raise InputError(f"{field} {problem}", path=path, op=op.name)
    for edge in profile.edges:
        problem = _bad_number(edge.transfer_us, integral=False)
        if problem:
            edge_name = f"{truncate(edge.src, _QUOTED)}:{edge.port} -> {truncate(edge.dst, _QUOTED)}"
            raise InputError(f"edge {edge_name}: transfer_us {problem}", path=path)


# --- applying a profile to a graph ----------------------------------------------------


def _listing(names: list[str]) -> str:
    shown = ", ".join(f"'{truncate(x, _QUOTED)}'" for x in names[:FIRST])
    return shown + (f" and {len(names) - FIRST} more" if len(names) > FIRST else "")


def apply_profile(graph: OpGraph, profile: CostProfile, path: str, model_path: str | None = None) -> OpGraph:
    """``graph`` with the costs of ``profile`` (read from ``path``); see the module docstring.

    The profile must name exactly the graph's ops, each with as many output
    ports; otherwise an InputError lists the first mismatches of each kind.
    Edge transfer times apply to the edges the profile names (by producer,
    port and consumer); an edge it names that the graph lacks is a mismatch.
    """
    index = graph.index()
    by_name = {op.name: op for op in profile.ops}
    missing = [name for name in graph.names if name not in by_name]
    extra = [op.name for op in profile.ops if op.name not in index]
    ports = [
        f"'{truncate(op.name, _QUOTED)}' has {len(op.output_bytes)} in the profile, "
        f"{len(graph.output_bytes[index[op.name]])} "
        "in the model"
        for op in profile.ops
        if op.name in index and len(op.output_bytes) != len(graph.output_bytes[index[op.name]])
    ]
    edge_at = {(graph.edge_src[e], graph.edge_port[e], graph.edge_dst[e]): e for e in range(graph.num_edges)}
    transfer: list[float | None] = list(graph.edge_transfer_us)
    unknown_edges = []
    for edge in profile.edges:
        e = edge_at.get((index.get(edge.src, -1), edge.port, index.get(edge.dst, -1)))
        if e is None:
            unknown_edges.append(f"{edge.src}:{edge.port}->{edge.dst}")
        else:
            transfer[e] = edge.transfer_us
    if missing or extra or ports or unknown_edges:
        what = f"the profile (of {profile.model.path or 'an unnamed model'}) does not match {model_path or 'the model'}"
        problems = []
        if missing:
            problems.append(
                f"{len(missing)} op(s) of the model missing from the profile: {_listing(missing)}"
            )
        if extra:
            problems.append(f"{len(extra)} op(s) not in the model: {_listing(extra)}")
        if ports:
            problems.append(f"{len(ports)} output port count(s) differ: {'; '.join(ports[:FIRST])}")
        if unknown_edges:
            problems.append(f"{len(unknown_edges)} edge(s) not in the model: {_listing(unknown_edges)}")
        raise InputError(f"{what}: {'; '.join(problems)}", path=path)
    ops = [by_name[name] for name in graph.names]
    return _with_costs(
        graph,
        [op.compute_us for op in ops],
        [[int(b) for b in op.output_bytes] for op in ops],
        [int(op.temporary_bytes) for op in ops],
        [int(op.persistent_bytes) for op in ops],
        transfer,
    )
