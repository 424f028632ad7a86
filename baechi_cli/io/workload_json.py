"""Reader for cost-annotated workload JSON (Tarnawski et al., NeurIPS 2020).

Contract
--------
:func:`read_workload_json` turns a workload file into an
:class:`~baechi_cli.core.graph.OpGraph` that is already costed: the analytic cost
model has nothing to add to it. The format (``testdata/workloads/`` holds the
five published files; ``REFERENCE.md`` there documents the mapping)::

    {"maxSizePerFPGA": 17185374208.0, "maxFPGAs": 6, "maxCPUs": 1,
     "nodes": [{"id": 4, "name": "node4", "fpgaLatency": 0.14, "size": 145489920.0,
                "colorClass": 4, "isBackwardNode": 0, "cpuLatency": 1.4,
                "supportedOnFpga": 1}, ...],
     "edges": [{"sourceId": 4, "destId": 5, "cost": 0.0061, "size": 13107200.0}, ...]}

Times in the file are milliseconds, sizes bytes. Ops get dense ids in file order; a node's
``fpgaLatency`` is its compute time, its ``size`` persistent bytes, its ``colorClass`` a
colocation group; a backward node's ``forward_op`` comes from its name. Each node has one
output port of 0 bytes: its ``size`` already holds its output, so only the copies other
devices receive (edge bytes) add memory; counting the port too would count activations
twice. An edge's ``cost`` is its transfer time (absent: the device spec's comm model
decides). Field by field: docs/formats.md, "Workload JSON".

:func:`read_workload_meta` returns the file's device limits
(:class:`WorkloadMeta`), from which the CLI suggests a device spec.

Every problem with the input raises :class:`~baechi_cli.core.errors.InputError`
naming the file, the node when there is one, and the problem: unreadable or
non-JSON bytes, a wrong top-level shape, a node without ``id`` or
``fpgaLatency``, a duplicate id, a number that is not finite and >= 0, an
edge naming an unknown id, a cycle, no nodes at all.

Complexity: O(V + E) to parse and build, plus the O((V + E) log V)
topological sort that rejects cycles.
"""

from __future__ import annotations

import gc
import json
import math
from dataclasses import dataclass
from typing import Any

from baechi_cli.core.errors import InputError, truncate
from baechi_cli.core.graph import OpGraph, graph_from_columns
from baechi_cli.io.files import read_input

DEFAULT_OP_TYPE = "workload"
_US_PER_MS = 1000.0
_GRAD_SUFFIX = "grad"
_GRAD_INFIX = "_Grad/"
_OPTIMIZER_MARK = "Optimizer_"
_QUOTED = 60  # characters of a value from the file that an error message quotes


@dataclass(frozen=True)
class WorkloadMeta:
    """The device limits a workload file states (None when a key is absent)."""

    max_size_per_fpga: int | None  # bytes of one accelerator (``maxSizePerFPGA``)
    max_fpgas: int | None  # accelerators the authors allowed (``maxFPGAs``)
    max_cpus: int | None  # CPUs the authors allowed (``maxCPUs``)

    def device_spec(self, count: int) -> str | None:
        """A ``--devices`` value for ``count`` devices of ``maxSizePerFPGA`` bytes."""
        if not self.max_size_per_fpga:
            return None
        return f"{count}x{self.max_size_per_fpga}"


def read_workload_json(path: str) -> OpGraph:
    """Read a workload JSON file into a costed OpGraph (see the module docstring)."""
    # Parsing and building allocate millions of small objects and no reference
    # cycles; pausing the cyclic collector meanwhile saves about a third of the time.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _read_graph(path)
    finally:
        if collecting:
            gc.enable()


def _read_graph(path: str) -> OpGraph:
    doc = _load_document(path)
    nodes = _list_field(doc, "nodes", path)
    edges = _list_field(doc, "edges", path)
    if not nodes:
        raise InputError("the workload has no nodes", path=path)

    # Pass 1: validate the nodes, collecting their columns.
    op_of_id: dict[int, int] = {}
    raw_names: list[str | None] = []
    ids: list[int] = []
    op_types: list[str] = []
    compute_us: list[float] = []
    persistent: list[int] = []
    backward: list[bool] = []
    classes: list[Any] = []
    attrs: list[dict[str, Any]] = []
    for v, node in enumerate(nodes):
        if type(node) is not dict:
            raise InputError(f"node #{v} is {_describe(node)}, not an object", path=path)
        name = node.get("name")
        if name is not None and type(name) is not str:
            raise InputError(f"node #{v}: name must be a string, not {_describe(name)}", path=path)
        if "id" not in node:
            raise InputError(f"node #{v} has no 'id'", path=path, op=name)
        node_id = node["id"]
        label = name if name is not None else str(node_id)
        if type(node_id) is not int:
            raise InputError(
                f"node #{v}: id must be an integer, not {_describe(node_id)}", path=path, op=label
            )
        if node_id in op_of_id:
            first = op_of_id[node_id]
            raise InputError(f"duplicate node id {node_id} (also node #{first})", path=path, op=label)
        op_of_id[node_id] = v
        if "fpgaLatency" not in node:
            raise InputError("node has no 'fpgaLatency'", path=path, op=label)
        op_type = node.get("type", node.get("opType", DEFAULT_OP_TYPE))
        if type(op_type) is not str or not op_type:
            raise InputError(
                f"type must be a non-empty string, not {_describe(op_type)}", path=path, op=label
            )
        color = node.get("colorClass")
        if color is not None and type(color) not in (int, str):
            raise InputError(
                f"colorClass must be an integer, a string or null, not {_describe(color)}",
                path=path,
                op=label,
            )
        is_bwd = node.get("isBackwardNode", False)
        if is_bwd not in (True, False):  # 0 and 1 compare equal to False and True
            raise InputError(
                f"isBackwardNode must be true/false or 1/0, not {_shown(is_bwd)}", path=path, op=label
            )
        on_accelerator = node.get("supportedOnFpga", True)
        if on_accelerator not in (True, False):
            raise InputError(
                f"supportedOnFpga must be true/false or 1/0, not {_shown(on_accelerator)}",
                path=path,
                op=label,
            )
        try:
            latency_us = _amount(node["fpgaLatency"], "fpgaLatency", _US_PER_MS)
            cpu_us = (
                _amount(node["cpuLatency"], "cpuLatency", _US_PER_MS) if "cpuLatency" in node else latency_us
            )
            size = _amount(node.get("size", 0), "size")
        except InputError as err:
            raise InputError(err.problem, path=path, op=label) from None
        raw_names.append(name)
        ids.append(node_id)
        op_types.append(op_type)
        compute_us.append(latency_us)
        attrs.append({"cpu_us": cpu_us, "accelerator": bool(on_accelerator)})
        persistent.append(math.ceil(size))
        backward.append(bool(is_bwd))
        classes.append(color)
    names = _unique_names(raw_names, ids)

    # Pass 2: the edges.
    edge_src: list[int] = []
    edge_dst: list[int] = []
    edge_bytes: list[int] = []
    edge_us: list[float | None] = []
    for k, edge in enumerate(edges):
        try:
            src = op_of_id[edge["sourceId"]]
            dst = op_of_id[edge["destId"]]
        except (KeyError, TypeError):  # not an object, a key missing, an unknown id
            raise _edge_error(edge, k, op_of_id, names, path) from None
        size, cost = edge.get("size", 0), edge.get("cost")
        try:
            nbytes = math.ceil(_amount(size, "size"))
            us = None if cost is None else _amount(cost, "cost", _US_PER_MS)
        except InputError as err:
            raise InputError(f"edge to '{names[dst]}': {err.problem}", path=path, op=names[src]) from None
        edge_src.append(src)
        edge_dst.append(dst)
        edge_bytes.append(nbytes)
        edge_us.append(us)

    del doc, nodes, edges  # the parsed file (most of a big reader's memory) is not needed now
    forward = _forward_ops(raw_names, names, backward)
    # Ops are numbered in file order, so a class's first node has its smallest id.
    first_of_class: dict[Any, int] = {}
    group = [v if c is None else first_of_class.setdefault(c, v) for v, c in enumerate(classes)]
    # One output port per op, of 0 bytes: the node's `size` already holds its output and
    # is resident all step (REFERENCE.md's mapping); edge bytes still size the copies
    # other devices receive.
    graph = graph_from_columns(
        names,
        op_types,
        compute_us,
        persistent,
        edge_src,
        edge_dst,
        edge_bytes,
        edge_us,
        group=group,
        is_backward=backward,
        forward_op=forward,
        attrs=attrs,
    )
    try:
        graph.topo_order()
    except InputError as err:
        raise err.with_path(path) from None
    return graph


def stated_devices(path: str) -> tuple[str, int]:
    """The devices the file states, as a ``--devices`` spec and its number of CPU cores (the last).

    maxFPGAs accelerators of maxSizePerFPGA bytes, then maxCPUs CPU cores, whose memory the
    model does not limit (1 PB stands for that). InputError when the file states no accelerators.
    """
    meta = read_workload_meta(path)
    if not meta.max_fpgas or not meta.max_size_per_fpga:
        raise InputError(
            "the workload states no maxFPGAs and maxSizePerFPGA to take the devices from: give --devices",
            path=path,
        )
    cpus = meta.max_cpus or 0
    spec = f"{meta.max_fpgas}x{meta.max_size_per_fpga}"
    return (spec + f",{cpus}x1000000000000000" if cpus else spec), cpus


def read_workload_meta(path: str) -> WorkloadMeta:
    """The file's ``maxSizePerFPGA``, ``maxFPGAs`` and ``maxCPUs`` (no graph is built)."""
    doc = _load_document(path)
    values = []
    for key in ("maxSizePerFPGA", "maxFPGAs", "maxCPUs"):
        value = doc.get(key)
        if value is not None:
            # Sizes and counts are written as floats (17185374208.0) in the files.
            try:
                amount = _amount(value, key)
            except InputError as err:
                raise err.with_path(path) from None
            if amount != int(amount):
                raise InputError(f"{key} must be a whole number, not {_shown(value)}", path=path)
            value = int(amount)
        values.append(value)
    return WorkloadMeta(*values)


# ----------------------------------------------------------------- helpers


def _load_document(path: str) -> dict[str, Any]:
    """Read and parse ``path``; the top level must be a JSON object."""
    data = read_input(path, "workload JSON")
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as err:
        raise InputError(
            f"not JSON, or truncated JSON: {err.msg} at line {err.lineno} column {err.colno}", path=path
        ) from None
    except (ValueError, RecursionError):  # undecodable bytes; absurdly deep nesting
        raise InputError("not JSON (undecodable or too deeply nested)", path=path) from None
    if type(doc) is not dict:
        raise InputError(
            f"the top level is {_describe(doc)}, not an object with 'nodes' and 'edges'", path=path
        )
    return doc


def _list_field(doc: dict[str, Any], key: str, path: str) -> list[Any]:
    if key not in doc:
        raise InputError(f"no '{key}' list at the top level", path=path)
    value = doc[key]
    if type(value) is not list:
        raise InputError(f"'{key}' is {_describe(value)}, not a list", path=path)
    return value


def _amount(value: Any, what: str, scale: float = 1.0) -> float:
    """``value`` times ``scale`` (a unit conversion) as a finite float >= 0; bools, strings, NaN and
    values whose conversion overflows are rejected.

    Raises an InputError without path or op: the caller knows which node it is.
    """
    if type(value) is int or type(value) is float:  # type(), not isinstance: bool is an int
        try:
            x = float(value) * scale
        except OverflowError:  # an integer too large for a float
            x = math.inf
        if 0.0 <= x < math.inf:  # false for NaN too
            return x
        raise InputError(f"{what} must be finite and >= 0, not {_shown(value)}")
    raise InputError(f"{what} must be a number, not {_describe(value)}")


def _edge_error(edge: Any, k: int, op_of_id: dict[int, int], names: list[str], path: str) -> InputError:
    """Why edge #k's endpoints do not both resolve to nodes (the caller knows one does not)."""
    if type(edge) is not dict:
        return InputError(f"edge #{k} is {_describe(edge)}, not an object", path=path)
    if "sourceId" not in edge:
        return InputError(f"edge #{k} has no 'sourceId'", path=path)
    src = _lookup(op_of_id, edge["sourceId"])
    if src is None:
        return InputError(f"edge #{k}: sourceId {_shown(edge['sourceId'])} is not a node id", path=path)
    if "destId" not in edge:
        return InputError(f"edge #{k} has no 'destId'", path=path, op=names[src])
    return InputError(
        f"edge #{k}: destId {_shown(edge['destId'])} is not a node id", path=path, op=names[src]
    )


def _lookup(op_of_id: dict[int, int], node_id: Any) -> int | None:
    return None if type(node_id) in (list, dict) else op_of_id.get(node_id)


def _describe(value: Any) -> str:
    """A JSON value's kind, for messages (``"a string ('12')"``)."""
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    kind = kinds.get(type(value), "a number")
    return f"{kind} ({_shown(value)})" if type(value) in (str, bool, int, float) else kind


def _shown(value: Any) -> str:
    """``repr(value)`` cut to :data:`_QUOTED` characters, for messages (a value may be megabytes)."""
    return truncate(repr(value), _QUOTED)


def _unique_names(raw: list[str | None], ids: list[int]) -> list[str]:
    """``name`` when unique, else ``str(id)``; a name that equals a fallback falls back too.

    Ids are unique, so fallbacks never clash with one another; each demotion
    can clash with at most one kept name, so the worklist runs O(V) steps.
    """
    count: dict[str, int] = {}
    for name in raw:
        if name is not None:
            count[name] = count.get(name, 0) + 1
    kept = {name: v for v, name in enumerate(raw) if name is not None and count[name] == 1}
    names = [name if name in kept else str(ids[v]) for v, name in enumerate(raw)]
    work = [v for v, name in enumerate(raw) if name not in kept]
    while work:
        clash = kept.pop(str(ids[work.pop()]), None)
        if clash is not None:
            names[clash] = str(ids[clash])
            work.append(clash)
    return names


def _forward_ops(raw: list[str | None], names: list[str], backward: list[bool]) -> list[int]:
    """Each backward op's forward op by the naming schemes in the module docstring."""
    # A forward op can be named only when it kept its own (hence unique) name.
    forward_of = {name: v for v, name in enumerate(names) if not backward[v] and name == raw[v]}
    forward = [-1] * len(raw)
    for v, name in enumerate(raw):
        if not backward[v] or name is None:
            continue
        candidates = []
        if name.endswith(_GRAD_SUFFIX):
            candidates.append(name[: -len(_GRAD_SUFFIX)])
        if _GRAD_INFIX in name:
            candidates.append(name.split(_GRAD_INFIX, 1)[0])
        if _OPTIMIZER_MARK in name:
            candidates.append(name.split(_OPTIMIZER_MARK, 1)[1])
        forward[v] = next((forward_of[c] for c in candidates if c in forward_of), -1)
    return forward
