"""Weights the readers do not make ops of (ONNX initializers, a PyTorch program's parameters and
buffers): whose op holds their bytes, and which ops share a colocation group because of them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from baechi_cli.core.graph import OpGraph


class Initializer(NamedTuple):
    """One weight: its bytes and dtype name."""

    nbytes: int
    dtype: str


def own_initializers(
    graph: OpGraph, inits: Mapping[str, Initializer], consumers: Mapping[str, list[int]]
) -> OpGraph:
    """``graph`` with each initializer's bytes on its first consumer (``consumers[name]``, in op
    order) and the consumers of a shared one in one colocation group; a shared float one marks
    its readers for the training pass's one gradient buffer. Consumers whose outputs are all
    integers (a ``Shape`` of a weight) read only its size: they neither own it nor make a
    gradient of it, unless nothing else reads it. Consumers after the forward pass (a traced
    training step's backward and optimizer update) are in the group but do not share the weight:
    they read it for its own gradient and update. O(V + total consumers).

    >>> from baechi_cli.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> a, c = b.add_op("a", "MatMul", [4]), b.add_op("c", "MatMul", [4])
    >>> g = own_initializers(b.build(), {"w": Initializer(64, "float32")}, {"w": [a, c]})
    >>> g.persistent_bytes, g.group[a] == g.group[c]
    ([64, 0], True)
    """
    parent = list(range(graph.num_ops))

    def find(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    persistent = list(graph.persistent_bytes)
    for name, every in consumers.items():
        ops = [v for v in every if not _sizes_only(graph, v) and not graph.is_backward[v]] or every[:1]
        persistent[ops[0]] += inits[name].nbytes
        if len(ops) > 1 and inits[name].dtype.startswith(("float", "bfloat")):
            # A shared weight (tied embeddings, ALBERT's shared layers): every reader's backward
            # computes a gradient of its size, which autograd adds into one buffer as it comes;
            # the last reader's, computed first, starts the buffer, and the owner's .grad is it
            # (see passes.training).
            for v in ops[1:]:
                attrs = graph.attrs[v]
                attrs["_shared_parameter_bytes"] = (
                    attrs.get("_shared_parameter_bytes", 0) + inits[name].nbytes
                )
            owner = graph.attrs[ops[0]]
            owner["_accumulated_parameter_bytes"] = owner.get("_accumulated_parameter_bytes", 0) + (
                inits[name].nbytes
            )
            last = graph.attrs[ops[-1]]
            last.setdefault("_gradient_buffer_owners", []).append(graph.names[ops[0]])
            last.setdefault("_gradient_buffer_bytes", []).append(inits[name].nbytes)
            # The first add is counted as making a new buffer (passes.training says why).
            first_add = graph.attrs[ops[-2]]
            first_add["_gradient_sum_bytes"] = first_add.get("_gradient_sum_bytes", 0) + inits[name].nbytes
        root = find(ops[0])
        for v in every:
            other = find(v)
            if other != root:
                root, other = min(root, other), max(root, other)
                parent[other] = root
    group = [find(v) for v in range(graph.num_ops)]  # a root is its set's lowest id
    return graph.replace(persistent_bytes=persistent, group=group)


def _sizes_only(graph: OpGraph, v: int) -> bool:
    """Op ``v``'s outputs are all integers: it reads a weight's size, not its values."""
    dtypes = graph.output_dtypes[v]
    return bool(dtypes) and all(d.startswith(("int", "uint", "bool")) for d in dtypes)
