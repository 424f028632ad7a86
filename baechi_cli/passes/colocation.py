"""Colocation pass: the groups of ops that TensorFlow insists share a device.

Two sources, merged transitively with union-find (DESIGN.md, "TensorFlow
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

Complexity: O(V + E) with near-constant union-find steps.

Example:
    >>> from baechi_cli.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> w = b.add_op("w", "VarHandleOp", [0], output_dtypes=["resource"])
    >>> r = b.add_op("r", "ReadVariableOp", [400], attrs={"_input_types": ["resource"]})
    >>> x = b.add_op("x", "Relu", [400])
    >>> _ = b.add_edge(w, r); _ = b.add_edge(r, x)
    >>> colocate(b.build()).group
    [0, 0, 2]
"""

from __future__ import annotations

from baechi_cli.errors import InputError
from baechi_cli.graph import CONTROL_PORT, OpGraph

EXEMPT_OP_TYPES = frozenset({"IdentityN", "PartitionedCall", "StatefulPartitionedCall"})


def is_handle_type(dtype: str) -> bool:
    """True for types whose consumers must run beside their producer."""
    return dtype == "resource" or dtype.endswith("_ref")


def colocate(graph: OpGraph) -> OpGraph:
    """Return ``graph`` with ``group`` merged over TensorFlow's colocation rules."""
    n = graph.num_ops
    parent = list(graph.group)

    def find(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:  # the smaller id stays the root, so group ids are deterministic
            if ra < rb:
                parent[rb] = ra
            else:
                parent[ra] = rb

    index: dict[str, int] | None = None
    for v in range(n):
        for name in graph.colocate_with[v]:
            if index is None:
                index = graph.index()
            target = index.get(name)
            if target is None:
                raise InputError(
                    f"its _class attr colocates it with '{name}', which is not in the graph",
                    op=graph.names[v],
                )
            union(v, target)
        if graph.op_types[v] in EXEMPT_OP_TYPES:
            continue
        declared = graph.attrs[v].get("_input_types")
        k = 0
        for e in graph.in_edges[v]:
            port = graph.edge_port[e]
            if port == CONTROL_PORT:
                continue
            u = graph.edge_src[e]
            if declared is not None and k < len(declared):
                dtype = declared[k]
            else:
                dtype = graph.output_dtypes[u][port] if port < len(graph.output_dtypes[u]) else ""
            if is_handle_type(dtype):
                union(v, u)
            k += 1
    return graph.replace(group=[find(v) for v in range(n)])
