"""Colocation pass: the groups of ops that TensorFlow insists share a device.

Two sources, merged transitively with union-find (docs/DESIGN.md, "TensorFlow
facts"):

* ``_class: ["loc:@name"]`` attributes (variables, their initializers,
  optimizer slots and apply ops, and every gradient op when
  ``colocate_gradients_with_ops`` was used);
* a consumer whose *declared* input type is a resource handle
  (``resource``) or a reference (``*_ref``) — ReadVariableOp,
  AssignVariableOp, ResourceApply*, Assign, ApplyGradientDescent, ... — runs
  on its producer's device even under strict placement, silently. IdentityN,
  PartitionedCall and StatefulPartitionedCall are exempt, as in TensorFlow.

Without these groups a placement looks fine on paper but TensorFlow re-places
ops behind the user's back. The declared input types come from the reader
(``attrs["_input_types"]``); for op types it does not know, the producer's
output type stands in.

:func:`colocation_pairs` yields the individual constraints, one
``(op, other, kind)`` per ``_class`` entry or handle input, so that
``baechi verify`` checks a placed graph against exactly the rules this pass
groups by; :func:`describe_pair` words one for a message.

Complexity: O(V + E) with near-constant union-find steps.

Example:
    >>> from baechi_cli.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> w = b.add_op("w", "VarHandleOp", [0], output_dtypes=["resource"])
    >>> r = b.add_op("r", "ReadVariableOp", [400], attrs={"_input_types": ["resource"]})
    >>> x = b.add_op("x", "Relu", [400])
    >>> _ = b.add_edge(w, r); _ = b.add_edge(r, x)
    >>> colocate(b.build()).group
    [0, 0, 2]
"""

from __future__ import annotations

from collections.abc import Iterator

from baechi_cli.core.errors import InputError
from baechi_cli.core.graph import CONTROL_PORT, OpGraph
from baechi_cli.core.unionfind import UnionFind

EXEMPT_OP_TYPES = frozenset({"IdentityN", "PartitionedCall", "StatefulPartitionedCall"})

#: The ``kind`` of a pair that comes from a ``_class: loc:@name`` entry; any
#: other kind is the dtype of a handle input ("resource", "float32_ref", ...).
CLASS_ATTR = "_class"


def is_handle_type(dtype: str) -> bool:
    """True for types whose consumers must run beside their producer."""
    return dtype == "resource" or dtype.endswith("_ref")


def colocation_pairs(graph: OpGraph) -> Iterator[tuple[int, int, str]]:
    """Yield ``(op, other, kind)`` for every pair TensorFlow puts on one device.

    ``kind`` is :data:`CLASS_ATTR` when ``op``'s ``_class`` attr names
    ``other``, else the dtype of ``op``'s data input that ``other`` produces
    (a resource or reference type). Pairs come in op-id order; a pair may
    repeat (an input used twice). Raises :class:`InputError` when a
    ``_class`` entry names an op the graph lacks. O(V + E).
    """
    index: dict[str, int] | None = None
    op_types, in_edges, edge_port, edge_src = graph.op_types, graph.in_edges, graph.edge_port, graph.edge_src
    for v in range(graph.num_ops):
        for name in graph.colocate_with[v]:
            if index is None:
                index = graph.index()
            target = index.get(name)
            if target is None:
                raise InputError(
                    f"its _class attr colocates it with '{name}', which is not in the graph",
                    op=graph.names[v],
                )
            yield v, target, CLASS_ATTR
        if op_types[v] in EXEMPT_OP_TYPES:
            continue
        declared = graph.attrs[v].get("_input_types")
        k = 0
        for e in in_edges[v]:
            port = edge_port[e]
            if port == CONTROL_PORT:
                continue
            u = edge_src[e]
            if declared is not None and k < len(declared):
                dtype = declared[k]
            else:
                dtype = graph.output_dtypes[u][port] if port < len(graph.output_dtypes[u]) else ""
            if is_handle_type(dtype):
                yield v, u, dtype
            k += 1


def describe_pair(graph: OpGraph, op: int, other: int, kind: str) -> str:
    """Why ``op`` must run on ``other``'s device, as a phrase about ``op``.

    >>> from baechi_cli.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> w = b.add_op("w", "VarHandleOp", [0], output_dtypes=["resource"])
    >>> r = b.add_op("w/read", "ReadVariableOp", [4], colocate_with=["w"])
    >>> g = b.build()
    >>> describe_pair(g, r, w, "resource"), describe_pair(g, r, w, CLASS_ATTR)
    ("reads resource 'w'", "is colocated with 'w' by its _class attr")
    """
    name = graph.names[other]
    if kind == CLASS_ATTR:
        return f"is colocated with '{name}' by its _class attr"
    if kind == "resource":
        verb = "reads" if graph.op_types[op] == "ReadVariableOp" else "uses"
        return f"{verb} resource '{name}'"
    return f"uses reference '{name}' ({kind})"


def colocate(graph: OpGraph) -> OpGraph:
    """Return ``graph`` with ``group`` merged over TensorFlow's colocation rules."""
    uf = UnionFind(graph.group)
    for v, u, _ in colocation_pairs(graph):
        uf.union(v, u)
    return graph.replace(group=uf.roots())
