"""Control-flow pass: TF1 while loops become colocated, acyclic units.

A TF1 while loop (``tf.compat.v1.disable_control_flow_v2``) is a *frame*: ``Enter`` ops carry
values into it, ``Merge`` joins the first and the later iterations, ``Switch`` on ``LoopCond``
either feeds the body or leaves through ``Exit``, and ``NextIteration -> Merge`` closes the
cycle. TensorFlow runs Enter, NextIteration and Exit on their loop neighbours' device whatever
the graph asks (docs/DESIGN.md, "TensorFlow facts"), and runs a loop as a whole, so the pass

* finds every frame as TensorFlow's executor does: walking from the
  sources, a node inherits its producer's frame, an ``Enter`` opens the frame
  named by its ``frame_name`` attr inside its producer's frame, and the
  consumers of an ``Exit`` return to the parent frame;
* puts each outermost loop (with every loop nested in it) into one colocation
  group, merged with whatever groups its ops already had;
* removes the back edges (every edge out of a ``NextIteration``) from the
  scheduling graph: the placement still covers those ops, but a simulated
  step runs the loop body once, as the cost model counts it.

Any cycle left afterwards is not a loop's and raises :class:`InputError` naming the ops on it.
Graphs without loops come back unchanged (but checked for cycles).

Complexity: O(V + E) plus the union-find steps.

Example:
    >>> from baechi_cli.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.add_op("x", "Const", [4])
    >>> enter = b.add_op("w/Enter", "Enter", [4], attrs={"frame_name": "w"})
    >>> merge = b.add_op("w/Merge", "Merge", [4, 4])
    >>> body = b.add_op("w/add", "AddV2", [4])
    >>> nxt = b.add_op("w/NextIteration", "NextIteration", [4])
    >>> ext = b.add_op("w/Exit", "Exit", [4])
    >>> y = b.add_op("y", "Relu", [4])
    >>> for s, d in ((x, enter), (enter, merge), (merge, body), (body, nxt), (nxt, merge),
    ...              (body, ext), (ext, y)):
    ...     _ = b.add_edge(s, d)
    >>> g = control_flow(b.build())
    >>> g.group, g.num_edges
    ([0, 1, 1, 1, 1, 1, 6], 6)
"""

from __future__ import annotations

from collections import deque

from baechi_cli.core.graph import OpGraph
from baechi_cli.core.unionfind import UnionFind

BACK_EDGE_OPS = frozenset({"NextIteration", "RefNextIteration"})
ENTER_OPS = frozenset({"Enter", "RefEnter"})
EXIT_OPS = frozenset({"Exit", "RefExit"})
ROOT_FRAME = -1


def loop_frames(graph: OpGraph) -> list[int]:
    """Each op's outermost loop frame, as the id of the ``Enter`` that opened it (-1: no loop).

    Frames are told apart by ``(parent frame, frame_name)``, as TensorFlow does.
    O(V + E).
    """
    n = graph.num_ops
    op_types = graph.op_types
    if not any(t in ENTER_OPS for t in op_types):
        return [ROOT_FRAME] * n
    frame = [ROOT_FRAME - 1] * n  # ROOT_FRAME - 1: not reached yet
    parent: dict[int, int] = {}  # frame id -> its parent frame id
    by_name: dict[tuple[int, str], int] = {}
    queue = deque(v for v in range(n) if not graph.in_edges[v])
    for v in queue:
        frame[v] = ROOT_FRAME
    while queue:
        v = queue.popleft()
        for e in graph.out_edges[v]:
            w = graph.edge_dst[e]
            if frame[w] != ROOT_FRAME - 1:
                continue
            if op_types[w] in ENTER_OPS:
                key = (frame[v], str(graph.attrs[w].get("frame_name", "")))
                f = by_name.setdefault(key, w)
                parent.setdefault(f, frame[v])
            elif op_types[v] in EXIT_OPS and frame[v] != ROOT_FRAME:
                f = parent[frame[v]]
            else:
                f = frame[v]
            frame[w] = f
            queue.append(w)
    # Ops reached only through a cycle (none in a graph TensorFlow built) stay
    # outside every frame; the cycle check reports them.
    outermost = [ROOT_FRAME] * n
    for v in range(n):
        f = frame[v]
        while f >= 0 and parent[f] != ROOT_FRAME:
            f = parent[f]
        outermost[v] = f if f >= 0 else ROOT_FRAME
    return outermost


def control_flow(graph: OpGraph) -> OpGraph:
    """Return ``graph`` with loop frames colocated and loop back edges removed.

    Raises :class:`~baechi_cli.core.errors.InputError` naming the ops of a cycle
    that does not pass through a loop's back edge.
    """
    frames = loop_frames(graph)
    if any(f != ROOT_FRAME for f in frames):
        uf = UnionFind(graph.group)
        for v, f in enumerate(frames):
            if f != ROOT_FRAME:
                uf.union(f, v)
        graph = graph.replace(group=uf.roots())
    back = {e for e in range(graph.num_edges) if graph.op_types[graph.edge_src[e]] in BACK_EDGE_OPS}
    if back:
        graph = graph.without_edges(back)
    graph.topo_order()  # raises on a cycle that is not a loop's
    return graph
