"""Comparing a placed graph with its original: what differs, one line each, counted.

Shared by the GraphDef and the ONNX verifier (:mod:`baechi_cli.verify.onnx`):
:class:`Differences` counts differences and keeps the first :data:`KEEP`;
:func:`name_differences` tells two ordered name lists apart. The GraphDef
comparison itself is :func:`compare_graphs`: every GraphDef field and every
NodeDef, device fields aside, with the first difference of each node or
field described in a few words. Never imports TensorFlow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from baechi_cli.core.errors import truncate

if TYPE_CHECKING:
    from baechi_cli.proto_gen.tf_graph_pb2 import GraphDef, NodeDef

#: How many problems of each kind a result keeps (their counts are exact).
KEEP = 100


class Differences:
    """Counts differences and keeps the first :data:`KEEP` of them as lines."""

    def __init__(self) -> None:
        self.count = 0
        self.found: list[str] = []

    def note(self, line: str) -> None:
        self.count += 1
        if len(self.found) < KEEP:
            self.found.append(line)


def name_differences(placed: list[str], original: list[str], noun: str) -> list[str]:
    """What tells two name lists (ops or nodes, in order) apart: missing, added, reordered.

    O(n). ``noun`` names an entry in the lines ("op 'x' of the original is missing").
    """
    if placed == original:
        return []
    placed_set, original_set = set(placed), set(original)
    lines = [f"{noun} '{name}' of the original is missing" for name in original if name not in placed_set]
    lines += [f"{noun} '{name}' is not in the original" for name in placed if name not in original_set]
    if placed_set == original_set:
        i = next((i for i, (a, b) in enumerate(zip(placed, original)) if a != b), None)
        if i is None:  # one list is the other plus repeats of its names
            lines.append(f"the original has {len(original)} entries with these names, this one {len(placed)}")
        else:
            lines.append(
                f"the node order changed: node #{i} is '{placed[i]}', in the original '{original[i]}'"
            )
    return lines


def compare_graphs(placed: GraphDef, original: GraphDef) -> tuple[int, list[str]]:
    """(number of differences, the first :data:`KEEP` as lines) between two GraphDefs,
    NodeDef device fields aside. Clears the device fields of both."""
    differences = Differences()
    note = differences.note

    for descriptor in type(placed).DESCRIPTOR.fields:
        name = descriptor.name
        if name != "node" and getattr(placed, name) != getattr(original, name):
            note(_field_difference(placed, original, name))

    placed_names = [node.name for node in placed.node]
    original_names = [node.name for node in original.node]
    for line in name_differences(placed_names, original_names, "op"):
        note(line)
    by_name = {node.name: node for node in original.node}
    for node in placed.node:
        other = by_name.get(node.name)
        if other is None:
            continue
        node.device = ""
        other.device = ""
        if node != other:
            note(f"op '{node.name}': {_node_difference(node, other)}")
    return differences.count, differences.found


def _field_difference(placed: GraphDef, original: GraphDef, name: str) -> str:
    if name == "library":
        mine = {f.signature.name: f for f in placed.library.function}
        theirs = {f.signature.name: f for f in original.library.function}
        for fname in sorted(mine.keys() | theirs.keys()):
            if fname not in mine:
                return f"the function library lacks the original's function '{fname}'"
            if fname not in theirs:
                return f"the function library has a function the original lacks: '{fname}'"
            if mine[fname] != theirs[fname]:
                return f"function '{fname}' of the library differs from the original's"
        return "the function library (gradients) differs from the original's"
    return f"GraphDef field '{name}' differs from the original's: {_show(getattr(placed, name))} " + (
        f"instead of {_show(getattr(original, name))}"
    )


def _node_difference(node: NodeDef, other: NodeDef) -> str:
    """What differs between two NodeDefs of one name, in a few words."""
    if node.op != other.op:
        return f"op type {node.op} instead of {other.op}"
    if list(node.input) != list(other.input):
        mine, theirs = list(node.input), list(other.input)
        for i, (a, b) in enumerate(zip(mine, theirs)):
            if a != b:
                return f"input #{i} is '{a}' instead of '{b}'"
        return f"{len(mine)} inputs instead of {len(theirs)}"
    if node.attr != other.attr:
        for key in sorted(node.attr.keys() | other.attr.keys()):
            if key not in node.attr:
                return f"attr '{key}' is missing"
            if key not in other.attr:
                return f"attr '{key}' is not in the original ({_show(node.attr[key])})"
            if node.attr[key] != other.attr[key]:
                return f"attr '{key}' is {_show(node.attr[key])} instead of {_show(other.attr[key])}"
    for descriptor in type(node).DESCRIPTOR.fields:
        name = descriptor.name
        if name not in ("name", "op", "input", "attr", "device") and getattr(node, name) != getattr(
            other, name
        ):
            return f"field '{name}' differs"
    return "differs (in fields unknown to baechi's schema)"


def _show(value: Any, limit: int = 80) -> str:
    """A protobuf message or scalar on one short line."""
    from google.protobuf import message, text_format

    if isinstance(value, message.Message):
        text = text_format.MessageToString(value, as_one_line=True) or "{}"
    else:
        text = repr(value)
    return truncate(text, limit)
