"""Tensors written in place and read around the write: the nodes of a program that run together.

Contract. :func:`write_groups` takes a program's nodes in program order, each as an
:class:`Access` (the tensors it makes and reads, the read ones its outputs may be views of, the
read ones it writes in place), and returns the groups of nodes that must run in one process: for
each tensor (its storage: a tensor and every view of it, through any chain of views and writes)
that a node writes in place and that some node reads on both sides of a write, the nodes that
made it or a view of it up to its last write, and the nodes that read it before that write.

Why. Torch's graph orders such a read after the write only by program order: no value flows
from the write to the reader. A process that receives a copy of the tensor (another pipeline
stage, another device) never sees a write made elsewhere, and a copy of a view is no view of
the copy. In one process the nodes run in program order on one tensor; a reader after the last
write may receive it from there. The planner keeps each group on one device and the runtime
cuts it there, from this one function, so what is planned is what runs.

:func:`schema_aliasing` reads an op's views and writes from its schema (``Tensor(a)``: a view of
an argument; ``Tensor(a!)``: written). Torch-free (a schema is any object with torch's
``FunctionSchema`` fields); deterministic; O(nodes + reads) with union-find.

Example:
    >>> nodes = [
    ...     Access("zeros", ("zeros",), ()),
    ...     Access("first", ("first",), ("zeros",), views=frozenset({"zeros"})),
    ...     Access("early", ("early",), ("zeros",)),  # read before the write
    ...     Access("fill_", ("fill_",), ("first",), views=frozenset({"first"}),
    ...            writes=frozenset({"first"})),
    ...     Access("late", ("late",), ("zeros",)),  # read after it: may run anywhere later
    ... ]
    >>> write_groups(nodes)
    [['zeros', 'first', 'early', 'fill_']]
    >>> write_groups(nodes[:1] + nodes[3:4])  # written, never read around the write: free
    []
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Access:
    """One node: the tensors it makes and reads, by name, and which reads it views or writes."""

    node: str
    makes: tuple[str, ...]
    reads: tuple[str, ...]
    views: frozenset[str] = frozenset()  # read tensors its outputs may be views of
    writes: frozenset[str] = frozenset()  # read tensors it writes in place


def schema_aliasing(schema: Any, names_of: Callable[[int, Any], set[str]]) -> tuple[set[str], set[str]]:
    """(the tensors an op's outputs may be views of, those it writes in place) from its schema;
    ``names_of(i, argument)`` names the tensors passed as the schema's ``i``-th argument."""
    returned: set[str] = set()
    for r in schema.returns:
        if r.alias_info is not None:
            returned |= set(r.alias_info.before_set)
    views: set[str] = set()
    writes: set[str] = set()
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is None:
            continue
        names = names_of(i, arg)
        if arg.alias_info.is_write:
            writes |= names
        if returned & set(arg.alias_info.before_set):
            views |= names
    return views, writes


def write_groups(nodes: Sequence[Access]) -> list[list[str]]:
    """The node groups that must run together (module docstring), each in program order; the
    groups in the order of their first node."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.get(x, x) != x:
            parent[x] = parent.get(parent[x], parent[x])
            x = parent[x]
        return x

    made_at: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    writes_at: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for t in node.reads:
            readers.setdefault(t, []).append(i)
        for t in node.makes:
            made_at[t] = i
            for a in node.views | node.writes:
                parent[find(t)] = find(a)
    for i, node in enumerate(nodes):
        for t in node.writes:
            writes_at.setdefault(find(t), []).append(i)
    members: dict[str, list[str]] = {}
    for t in sorted({*made_at, *readers}, key=lambda t: made_at.get(t, -1)):
        members.setdefault(find(t), []).append(t)
    groups: list[list[int]] = []
    for root, at in writes_at.items():
        at = sorted(set(at))
        last = at[-1]
        tensors = members.get(root, [])

        def across(t: str, r: int, at: list[int] = at) -> bool:  # a write after t is made, before r
            k = bisect.bisect_right(at, made_at.get(t, -1))
            return k < len(at) and at[k] < r

        if not any(across(t, r) for t in tensors for r in readers.get(t, ())):
            continue
        group = {made_at[t] for t in tensors if t in made_at and made_at[t] <= last}
        group |= {r for t in tensors for r in readers.get(t, ()) if r < last}
        groups.append(sorted(group))
    groups.sort()
    return [[nodes[i].node for i in g] for g in groups]


def program_accesses(nodes: Sequence[Mapping[str, Any]], schema_of: Callable[[str], Any]) -> list[Access]:
    """The :class:`Access` of each of a program's nodes in torch's export schema (JSON: ``inputs``
    by schema argument name, ``outputs``), for :func:`write_groups`; ``schema_of(target)`` is the
    op's schema (None: no views, no writes)."""
    accesses = []
    for node in nodes:
        args = {str(item.get("name")): item.get("arg") or {} for item in node.get("inputs") or []}
        reads = tuple(n for arg in args.values() for n in tensor_names(arg))
        makes = tuple(n for out in node.get("outputs") or [] for n in tensor_names(out))
        schema = schema_of(str(node.get("target")))
        views, writes = (
            schema_aliasing(schema, lambda i, arg, args=args: set(tensor_names(args.get(arg.name) or {})))
            if schema is not None
            else (set(), set())
        )
        accesses.append(Access(str(node.get("name")), makes, reads, frozenset(views), frozenset(writes)))
    return accesses


def tensor_names(arg: Any, keep_none: bool = False) -> list[str]:
    """The tensor names an argument or output refers to ('' for an absent output with ``keep_none``)."""
    if not isinstance(arg, dict):
        return []
    if "as_tensor" in arg:
        return [str(arg["as_tensor"]["name"])]
    if "as_tensors" in arg:
        return [str(t["name"]) for t in arg["as_tensors"]]
    if "as_optional_tensor" in arg:
        inner = arg["as_optional_tensor"]
        return [str(inner["as_tensor"]["name"])] if "as_tensor" in inner else []
    if "as_optional_tensors" in arg:
        return [str(t["as_tensor"]["name"]) for t in arg["as_optional_tensors"] if "as_tensor" in t]
    if keep_none and "as_none" in arg:
        return [""]
    return []
