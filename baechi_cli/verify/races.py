"""Variable accesses a training step leaves unordered: the races a placement can expose.

A TensorFlow step runs every op once its inputs are ready, so two ops that
touch one variable and have no path between them run in either order. On one
device the executor happens to pick the same order every run; spread over
several devices the order follows the timing of cross-device transfers, and
a read before a write gives a different number than a read after it. Such a
graph trains non-reproducibly wherever it is placed, and a placement is
blamed for it. :func:`variable_races` finds these pairs without running
anything, so ``baechi verify`` can name them.

What counts as an access of a variable ``v`` (a ``VarHandleOp``,
``VariableV2``, ..., or a ``Placeholder``/``_Arg`` of a handle type, as a
function's graph captures one):

- **resource variables**: every op that takes ``v``'s handle (through
  ``Identity`` and the like). ``ReadVariableOp``/``ResourceGather`` read, and
  the value they output is a snapshot (TensorFlow copies the buffer before an
  update while a read's tensor is alive), so the read happens when they run.
  Initialisation checks and shape queries (:data:`_INERT`) do not access the
  value; every other consumer of the handle is taken as a write.
- **reference variables**: an input declared as a reference
  (``Assign``, ``ApplyMomentum``, ``ScatterAdd``, ...) writes; an input of a
  plain type reads -- and because the tensor it gets aliases the variable's
  buffer, an op that passes its input through unchanged (:data:`_PASS_THROUGH`,
  e.g. the ``var/read`` Identity) moves the read to its own consumers.
  (A plain input that is not a variable's -- an ``Identity`` of a resource
  read, say -- never reaches this walk: it starts at the variables.)

Only the ops a step runs count: the ancestors (data and control edges) of the
fetched nodes, e.g. the sidecar's ``loss`` and ``train_op``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from baechi_cli.core.errors import InputError
from baechi_cli.core.graph import CONTROL_PORT, OpGraph
from baechi_cli.passes.colocation import is_handle_type

#: Consumers of a resource handle that neither read nor write the value.
_INERT = frozenset({"VarIsInitializedOp", "VariableShape", "IsVariableInitialized"})
#: Consumers of a resource handle that read its value (and snapshot it).
_RESOURCE_READERS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd"})
#: Ops whose outputs are their input's buffer: a handle passes through them, and a
#: reference variable's aliased value is read by their consumers, not by them.
_PASS_THROUGH = frozenset(
    {"Identity", "RefIdentity", "Reshape", "ExpandDims", "Squeeze", "Bitcast", "Enter", "RefEnter",
     "Exit", "RefExit", "Switch", "RefSwitch", "Merge", "RefMerge", "NextIteration", "RefNextIteration"}
)  # fmt: skip
#: Ops that create a variable (or, for a function's graph, stand for one captured).
#: Other resources -- TensorArrays, queues, tables -- have their own semantics.
_VARIABLES = frozenset(
    {"VarHandleOp", "_VarHandlesOp", "VariableV2", "Variable", "TemporaryVariable", "Placeholder", "_Arg"}
)
#: Loop back edges: cut to order a loop's ops.
_BACK_EDGE = frozenset({"NextIteration", "RefNextIteration"})


class Race(NamedTuple):
    """Two accesses of ``variable`` with no path between them; ``second`` writes."""

    variable: str
    first: str
    first_access: str  # "read" or "write"
    second: str

    def message(self) -> str:
        return (
            f"'{self.first}' ({self.first_access}s) and '{self.second}' (writes) access variable "
            f"'{self.variable}' in no fixed order"
        )


def variable_races(graph: OpGraph, fetches: Sequence[str]) -> list[Race]:
    """Every unordered (read, write) or (write, write) pair on one variable in a step.

    ``graph`` is a GraphDef's structure (names, op types, declared input types
    in ``attrs["_input_types"]``, edges; see :func:`baechi_cli.verify.static.structure_graph`),
    ``fetches`` the node or tensor names a step fetches (``"loss:0"``,
    ``"train"``). Returns the races sorted by variable, then op names;
    empty for a graph whose step orders every access. Raises
    :class:`InputError` when a fetch names no node.

    Complexity: O(V + E) to find the accesses and the ops the step runs, then
    one bitset per op over the A accesses, O(L * (V + E) * A / 64) word
    operations (L: 1 plus the depth of nested loops), and O(W * A) for the pairs (W writes).

    >>> from baechi_cli.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> w = b.add_op("w", "VariableV2", [4], output_dtypes=["float32_ref"])
    >>> read = b.add_op("w/read", "Identity", [4], output_dtypes=["float32"])
    >>> use = b.add_op("use", "Square", [4], output_dtypes=["float32"])
    >>> one = b.add_op("one", "Const", [4], output_dtypes=["float32"])
    >>> put = b.add_op("put", "Assign", [4], output_dtypes=["float32_ref"],
    ...                attrs={"_input_types": ["float32_ref", "float32"]})
    >>> step = b.add_op("step", "NoOp", [])
    >>> edges = [b.add_edge(src, dst) for src, dst in ((w, read), (read, use), (w, put), (one, put))]
    >>> edges += [b.add_edge(src, step, CONTROL_PORT) for src in (use, put)]
    >>> [race.message() for race in variable_races(b.build(), ["step"])]
    ["'use' (reads) and 'put' (writes) access variable 'w' in no fixed order"]
    """
    index = graph.index()
    roots = []
    for fetch in fetches:
        name = fetch.lstrip("^").split(":")[0]
        if name not in index:
            raise InputError(f"the step fetches '{fetch}', which names no node of the graph")
        roots.append(index[name])
    runs = _ancestors(graph, roots)
    accesses = [(v, op, write) for v, op, write in _accesses(graph) if runs[op]]
    if not accesses:
        return []
    bit = {}
    for _, op, _ in accesses:
        bit.setdefault(op, len(bit))
    # before[v]: the accessing ops that every run of v waits for (bitset). A
    # loop's back edges join in once the acyclic pass is done, until nothing
    # changes: an op after a loop's Exit then waits for the body's ops. (Two
    # accesses in one loop body come out ordered: across iterations they are.)
    before = [0] * graph.num_ops
    order = _topological(graph, runs)
    changed = True
    while changed:
        changed = False
        for v in order:
            mask = before[v]
            for e in graph.in_edges[v]:
                u = graph.edge_src[e]
                mask |= before[u]
                if u in bit:
                    mask |= 1 << bit[u]
            if mask != before[v]:
                before[v], changed = mask, True
    by_variable: dict[int, list[tuple[int, bool]]] = {}
    for variable, op, write in accesses:
        by_variable.setdefault(variable, []).append((op, write))
    races = set()
    names = graph.names
    for variable, ops in by_variable.items():
        kinds: dict[int, bool] = {}
        for op, write in ops:
            kinds[op] = kinds.get(op, False) or write
        for second, writes in kinds.items():
            if not writes:
                continue
            for first, first_writes in kinds.items():
                if first == second or (first_writes and names[first] > names[second]):
                    continue  # a write pair is reported once
                ordered = (before[second] >> bit[first]) & 1 or (before[first] >> bit[second]) & 1
                if not ordered:
                    access = "write" if first_writes else "read"
                    races.add(Race(names[variable], names[first], access, names[second]))
    return sorted(races)


def _accesses(graph: OpGraph) -> Iterable[tuple[int, int, bool]]:
    """``(variable, op, writes)`` for every op that reads or writes a variable's value."""
    op_types, output_dtypes = graph.op_types, graph.output_dtypes
    out_edges, edge_dst, edge_port = graph.out_edges, graph.edge_dst, graph.edge_port
    for variable in range(graph.num_ops):
        dtypes = output_dtypes[variable]
        if op_types[variable] not in _VARIABLES or not any(is_handle_type(d) for d in dtypes):
            continue
        # Walk the ops that the handle, or the reference's aliased buffer, reaches.
        stack = [(variable, port) for port, d in enumerate(dtypes) if is_handle_type(d)]
        seen = set(stack)
        while stack:
            u, port = stack.pop()
            carried = output_dtypes[u][port] if port < len(output_dtypes[u]) else ""
            for e in out_edges[u]:
                if edge_port[e] != port:
                    continue
                v, op = edge_dst[e], op_types[edge_dst[e]]
                if op in _INERT:
                    continue
                if op in _PASS_THROUGH:
                    for out in range(len(output_dtypes[v])):
                        if (v, out) not in seen:
                            seen.add((v, out))
                            stack.append((v, out))
                    continue
                if carried == "resource":
                    yield variable, v, op not in _RESOURCE_READERS
                else:
                    yield variable, v, (_declared_type(graph, v, e) or "").endswith("_ref")


def _declared_type(graph: OpGraph, v: int, edge: int) -> str | None:
    """The type op ``v``'s signature declares for the data input on ``edge``, if known."""
    declared = graph.attrs[v].get("_input_types")
    if declared is None:
        return None
    k = 0
    for e in graph.in_edges[v]:
        if graph.edge_port[e] == CONTROL_PORT:
            continue
        if e == edge:
            return declared[k] if k < len(declared) else None
        k += 1
    return None


def _ancestors(graph: OpGraph, roots: Sequence[int]) -> list[bool]:
    """Which ops a step fetching ``roots`` runs: the roots and their ancestors."""
    runs = [False] * graph.num_ops
    stack = list(roots)
    while stack:
        v = stack.pop()
        if runs[v]:
            continue
        runs[v] = True
        stack.extend(graph.edge_src[e] for e in graph.in_edges[v])
    return runs


def _topological(graph: OpGraph, keep: list[bool]) -> list[int]:
    """The kept ops in a topological order (Kahn's), a loop's back edges (from NextIteration) cut."""
    indegree = [0] * graph.num_ops
    for v in range(graph.num_ops):
        if keep[v]:
            indegree[v] = sum(1 for e in graph.in_edges[v] if _counts(graph, e, keep))
    order = [v for v in range(graph.num_ops) if keep[v] and indegree[v] == 0]
    for v in order:
        if graph.op_types[v] in _BACK_EDGE:
            continue
        for e in graph.out_edges[v]:
            w = graph.edge_dst[e]
            if keep[w]:
                indegree[w] -= 1
                if indegree[w] == 0:
                    order.append(w)
    return order


def _counts(graph: OpGraph, edge: int, keep: list[bool]) -> bool:
    src = graph.edge_src[edge]
    return keep[src] and graph.op_types[src] not in _BACK_EDGE


def step_races(graph: OpGraph, model_path: str) -> tuple[list[Race], str]:
    """The races of the training step the sidecar beside ``model_path`` fetches, and its file name.

    The sidecar is ``<stem>.json`` (``loss``, ``train_op``); without one, or
    with one that does not validate or names ops the graph lacks, there is
    no step to judge: no races (``baechi verify --run`` reports a broken
    sidecar; placing needs none).
    """
    from pathlib import Path

    from baechi_cli.io.sidecar import load_sidecar

    sidecar = Path(model_path).with_suffix(".json")
    if sidecar == Path(model_path) or not sidecar.is_file():
        return [], sidecar.name
    try:
        fetches = load_sidecar(str(sidecar))
        return variable_races(graph, [fetches["loss"], fetches["train_op"]]), sidecar.name
    except InputError:
        return [], sidecar.name


def colocate_races(graph: OpGraph, races: Sequence[Race]) -> OpGraph:
    """``graph`` with each race's ops colocated with the variable (``colocate_with``).

    A resource variable's readers and writers are on its device already
    (TensorFlow requires it). A reference variable's value, though, is read
    by whatever consumes its aliasing ``Identity``; on another device that
    read becomes a transfer at the ``Identity``'s time, so a racy read would
    see a different value than on one device. On the variable's device it
    keeps the one-device semantics. O(V + R).
    """
    index = graph.index()
    colocate_with = list(graph.colocate_with)
    for race in races:
        for name in (race.first, race.second):
            v = index[name]
            if name != race.variable and race.variable not in colocate_with[v]:
                colocate_with[v] = (*colocate_with[v], race.variable)
    return graph.replace(colocate_with=colocate_with)
