"""Pipeline stages of a PyTorch export: where a stage may begin, and the ``split_spec`` that cuts there.

Contract. A pipeline split cuts a model into S stages contiguous in program order; PyTorch runs it
with ``pipeline(module, mb_args=..., split_spec={"layer2": SplitPoint.BEGINNING, ...})``
(``torch.distributed.pipelining``). Per its ``_IR.py`` (torch 2.13) a split marker is traced in
*before every call* of each named submodule, a marker directly after another is dropped, and a
new stage starts at each marker (what was traced before it, the parent's functional ops included,
stays in the earlier stage). A module never called (an ``nn.ModuleList``) gets no marker.

The legacy exporter (``dynamo=False``) writes ONNX nodes in execution order, so ``paths[i]``, the
module path of the i-th op (:func:`baechi_cli.io.torch_modules.module_paths`; None: none, ``""``
the root), says which module calls it ran inside. A **boundary** (:func:`stage_boundaries`, which
states the rules) is a position where a new stage may begin, with the outermost module that
begins there, is called once and whose ``forward`` is known to run. Ops with no path (graph
inputs, unscoped nodes, shape arithmetic: :func:`graph_boundaries`) begin no stage.

Known limits: a module called twice in a row (``self.act(self.act(x))``) is told apart only by a
legacy export's call suffixes (with the dynamo exporter torch makes more stages than planned:
check ``pipe.num_stages``); the keys have :mod:`baechi_cli.io.torch_modules`' limits.

The report carries the split as ``module_map.pipeline.split_points`` (:func:`split_points`);
tests/test_torch_pipeline.py runs it on real models::

    spec = {m: SplitPoint.BEGINNING for m in plan["module_map"]["pipeline"]["split_points"]}
    pipe = pipeline(model, mb_args=(microbatch,), split_spec=spec)

Deterministic. Complexity: O(N x D) for N ops and module depth D; the graph functions
O(N x D + E) for E edges.

Example:
    >>> paths = [None, "conv1", "layer1.0.conv1", "layer1.0.relu", "layer1.0", "layer1.0.relu",
    ...          "layer1.1.conv1", "layer1.1", "", "fc"]
    >>> stage_boundaries(paths)
    [Boundary(index=2, module='layer1.0'), Boundary(index=6, module='layer1.1'), Boundary(index=9, module='fc')]
    >>> split_points(paths, [0, 0, 0, 0, 0, 0, 1, 1, 1, 2])
    {'layer1.1': 'beginning', 'fc': 'beginning'}
    >>> split_points(paths, [0, 0, 0, 1, 1, 1, 1, 1, 1, 1])
    Traceback (most recent call last):
    ...
    baechi_cli.core.errors.InputError: op '3': stage 1 cannot begin here: module 'layer1.0.relu' begins here but is called more than once; a stage can begin only where a module call begins (stage_boundaries)
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, NamedTuple

from baechi_cli.core.errors import InputError
from baechi_cli.io.onnx import onnx_node_ops

if TYPE_CHECKING:
    from baechi_cli.core.graph import OpGraph

#: The value of each ``split_points`` entry: torch's ``SplitPoint.BEGINNING``.
BEGINNING = "beginning"

_FOLDED = frozenset({"Constant", "Shape", "Size"})  # ONNX nodes torch.export traces as no op
_REPEATED_CALL = re.compile(r".*_\d+")  # a legacy scope with a call suffix: relu_1, block_1, downsample.0_1


class Boundary(NamedTuple):
    """A position in program order at which a pipeline stage may begin."""

    index: int  # the new stage's first op, a position in the sequence of paths
    module: str  # the split_spec key that cuts there: the outermost module called once beginning there


def stage_boundaries(paths: Sequence[str | None], repeated: Collection[str] = ()) -> list[Boundary]:
    """The positions at which a stage may begin, in order, each with its ``split_spec`` module.

    ``paths[i]`` is the module path of the i-th op in program order (None:
    none, ``""`` the root); ``repeated`` the modules known to be called more
    than once. O(N x D). A module M *covers* op i when ``paths[i]`` is M or
    starts with ``M + "."``. Position i (1 <= i < n) is a boundary, keyed by
    the outermost module M (shortest path) such that

    1. M is not the root and begins at op i: op i is the first op M covers;
    2. M is called once: the ops with a path from M's first op to its last are
       all covered by M (torch would cut before each call of a module called
       twice), and neither M nor a module M is inside is in ``repeated``;
    3. M's ``forward`` is known to run: some op sits directly in M
       (``paths[j] == M``); a bare container (``nn.Sequential`` with no op of
       its own, an ``nn.ModuleList``) does not qualify, an inner module that
       begins at the same op does, and torch cuts at the same place;
    4. some op with a path runs before op i, so the earlier stage is not empty.

    Ops with no path begin no stage and a module's run may hold them. A root-level
    functional op (``/Flatten``) or a parent's just before a module's first op stays
    in the earlier stage: torch traces it before the module's ``pipe_split()``.

    >>> stage_boundaries(["", "blocks.0.ln", "blocks.0", "blocks.1.ln", "blocks.1", "head"])
    [Boundary(index=1, module='blocks.0'), Boundary(index=3, module='blocks.1'), Boundary(index=5, module='head')]
    >>> stage_boundaries(["a", "b", "a"]), stage_boundaries(["a", "b", "b"], repeated={"b"})
    ([Boundary(index=1, module='b')], [])
    """
    return [Boundary(i, module) for i, module in enumerate(_Scan(paths, repeated).begins) if module]


def split_points(
    paths: Sequence[str | None],
    stage_of_op: Sequence[int],
    names: Sequence[str] | None = None,
    repeated: Collection[str] = (),
) -> dict[str, str]:
    """The ``split_spec`` of a split: ``{module: "beginning"}`` for each op that begins a stage.

    ``stage_of_op[i]`` is the stage of the i-th op (``paths`` and
    ``repeated`` as for :func:`stage_boundaries`; ``names[i]`` names op i in
    errors, default its index). Over the ops with a path the stages start at
    0 and never decrease or skip one; the stages of ops with no path are
    ignored but must be among those. Raises InputError naming the op where
    that fails or where a stage begins at an op that is not a boundary;
    ValueError when the sequences differ in length. O(N x D).

    >>> split_points(["a", "a.x", None, "b", ""], [0, 0, 1, 1, 1])
    {'b': 'beginning'}
    """
    if len(stage_of_op) != len(paths) or (names is not None and len(names) != len(paths)):
        raise ValueError(
            f"split_points: {len(paths)} paths but {len(stage_of_op)} stages or {len(names or ())} names"
        )
    scan = _Scan(paths, repeated)
    points: dict[str, str] = {}
    last = -1  # the stage of the last op with a path so far
    for i, path in enumerate(paths):
        if path is None or stage_of_op[i] == last:
            continue
        name = names[i] if names is not None else str(i)
        if stage_of_op[i] != last + 1:
            expected = "stage 0" if last < 0 else f"stage {last} or {last + 1}"
            raise InputError(
                f"in stage {stage_of_op[i]} but must be in {expected}: pipeline stages are contiguous "
                "in program order and numbered from 0",
                op=name,
            )
        last += 1
        if last > 0:
            module = scan.begins[i]
            if module is None:
                raise InputError(
                    f"stage {last} cannot begin here: {scan.why_not(i)}; a stage can begin only "
                    "where a module call begins (stage_boundaries)",
                    op=name,
                )
            points[module] = BEGINNING
    for i, path in enumerate(paths):
        if path is None and not 0 <= stage_of_op[i] <= max(last, 0):
            raise InputError(
                f"in stage {stage_of_op[i]}, but the ops with a module path are in stages 0 to "
                f"{max(last, 0)}: a stage of ops with no path would be empty in torch",
                op=names[i] if names is not None else str(i),
            )
    return points


def graph_boundaries(graph: OpGraph, num_ops: int | None = None) -> dict[int, str]:
    """The ops of an ONNX-read PyTorch export at which a stage may begin: op id -> ``split_spec`` module.

    In program order (the ONNX node order, :func:`~baechi_cli.io.onnx.onnx_node_ops`
    of the first ``num_ops`` ops); paths from ``attrs[v]["_module"]``, but
    None for shape arithmetic, and repeated calls from the legacy exporter's
    call suffixes in the names (``/block_1/Add``). Empty when the graph is not
    a PyTorch export. O(N x D + E) for E edges.

    None goes to graph inputs and to nodes torch does not trace as ops: the
    exporter's unscoped nodes (``Identity_0``, ``Constant_114``), ``Constant``,
    ``Shape`` and ``Size`` nodes, and nodes that read no initializer and only
    such nodes' outputs, or nothing (shape arithmetic, which ``torch.export``
    folds into constants). ``pipeline()`` merges two split markers with nothing
    traced between them, so two cuts with only such nodes between would give one
    stage fewer than planned; dropping a path is the safe error (the op then
    only begins no stage).
    """
    ops = onnx_node_ops(graph, num_ops)
    paths, repeated = _program(graph, ops)
    return {ops[b.index]: b.module for b in stage_boundaries(paths, repeated)}


def graph_split_points(graph: OpGraph, num_ops: int | None, stage: Sequence[int]) -> dict[str, str]:
    """:func:`split_points` of an ONNX-read PyTorch export, ``stage[v]`` op v's stage (by op id).

    Graph inputs and other ops that are no ONNX node are ignored; nodes with
    no module path or that are shape arithmetic are as ops with no path to
    :func:`split_points`. Stages are numbered by where their first op with a
    path comes in program order (a stage of ops with no path, a Constant the
    last stage reads, say, keeps its number). Errors name the op.
    O(N x D + E).
    """
    ops = onnx_node_ops(graph, num_ops)
    paths, repeated = _program(graph, ops)
    number: dict[int, int] = {}
    for v, path in zip(ops, paths):
        if path is not None:
            number.setdefault(stage[v], len(number))
    stages = [number.get(stage[v], stage[v]) for v in ops]
    return split_points(paths, stages, [graph.names[v] for v in ops], repeated)


class Skip(NamedTuple):
    """A value a stage sends past the next one: torch's pipelining runtime (2.13) runs no backward
    through it ("Backward of skip connections not supported yet")."""

    op: str  # its producer
    from_stage: int
    to_stage: int  # the furthest stage that reads it
    # Whether its backward sends a gradient back (a training step's activation, not a mask):
    # under 1F1B and GPipe torch runs only the skips that need none.
    needs_gradient: bool = False


class SkipFinder:
    """The values of a split of a PyTorch export that skip a stage (:func:`graph_skips`), for many
    splits of one graph: O(N + E) to build, O(V_fw + E_fw) per split."""

    def __init__(self, graph: OpGraph, num_ops: int | None = None) -> None:
        ops = onnx_node_ops(graph, num_ops)
        paths, _ = _program(graph, ops)
        nodes = set(ops)
        limit = graph.num_ops if num_ops is None else num_ops
        self._names = graph.names
        path_of = dict(zip(ops, paths))
        # Ops with a backward op (passes.training makes one exactly for those needing a gradient).
        self._graded = {f for b, f in enumerate(graph.forward_op) if graph.is_backward[b] and f >= 0}
        # (producer, is a graph input, its forward readers that are nodes), in program order
        self._values: list[tuple[int, bool, list[int]]] = []
        for v in [u for u in range(limit) if graph.op_types[u] == "Input"] + ops:
            is_input = v not in nodes
            traced = (
                is_input
                or path_of[v] is not None
                or any(d and not d.startswith(("int", "uint")) for d in graph.output_dtypes[v])
            )
            readers = sorted(
                {
                    w
                    for e in graph.out_edges[v]
                    if (w := graph.edge_dst[e]) in nodes and not graph.is_backward[w] and w != v
                }
            )
            if traced and readers:
                self._values.append((v, is_input, readers))

    def skips(self, stage: Sequence[int]) -> list[Skip]:
        """The values that skip a stage when op ``v`` is in stage ``stage[v]`` (numbered in program
        order), in program order."""
        found = []
        for v, is_input, readers in self._values:
            source = 0 if is_input else stage[v]  # a graph input enters at the first stage
            furthest = max(stage[w] for w in readers)
            if furthest > source + 1:
                found.append(Skip(self._names[v], source, furthest, v in self._graded))
        return found


def graph_skips(graph: OpGraph, num_ops: int | None, stage: Sequence[int]) -> list[Skip]:
    """The values of a split of a PyTorch export that skip a stage, in program order.

    A value counts when torch traces its producer as an op (a node with a
    module path, or shape arithmetic that yields a float or bool tensor: a
    mask made from the input's shape) and a forward op more than one stage
    later reads it; a graph input read past the second stage counts too.
    Integer shape arithmetic does not: ``torch.export`` folds it into
    constants. What the ONNX export does not show is not found: a value
    ``torch.export`` traces but the legacy exporter evaluated away (a
    Hugging Face attention mask built from ``arange``, say). ``stage[v]`` by
    op id, numbered in program order. O(N + E).
    """
    return SkipFinder(graph, num_ops).skips(stage)


# ----------------------------------------------------------------- internals


def _program(graph: OpGraph, ops: Sequence[int]) -> tuple[list[str | None], set[str]]:
    """The module paths of ``ops`` (None for shape arithmetic) and the modules their legacy names
    show called more than once. O(N x D + E)."""
    folded: set[int] = set()  # Constant, Shape, Size and what is computed from them alone
    paths: list[str | None] = []
    repeated: set[str] = set()
    for v in ops:  # node order is topological
        if graph.op_types[v] in _FOLDED or (
            not graph.attrs[v].get("_initializers") and all(u in folded for u in graph.predecessors(v))
        ):
            folded.add(v)
            paths.append(None)
            continue
        path = graph.attrs[v].get("_module")
        paths.append(path)
        scope = _last_scope(graph.names[v])
        # module_paths resolved a suffixed scope (relu_1, block_1, downsample.0_1) to its first
        # call's path when the path does not end in the scope as written.
        if (
            path is not None
            and scope is not None
            and _REPEATED_CALL.fullmatch(scope)
            and path != scope
            and not path.endswith("." + scope)
        ):
            repeated.add(path)
    return paths, repeated


def _last_scope(name: str) -> str | None:
    """The last scope of a legacy ``/<scope>/.../<OpType>`` node name, or None."""
    if not name.startswith("/"):
        return None
    parts = name.split("/")
    return parts[-2] if len(parts) >= 3 else None


def _modules(path: str) -> list[str]:
    """The modules covering an op of ``path``, outermost first, the root left out."""
    if not path:
        return []
    atoms = path.split(".")
    return [".".join(atoms[:k]) for k in range(1, len(atoms) + 1)]


class _Scan:
    """One pass over the paths: each module's first and last op, and the boundary module at each op."""

    def __init__(self, paths: Sequence[str | None], repeated: Collection[str]) -> None:
        self.paths = paths
        self.repeated = repeated
        self.first: dict[str, int] = {}
        self.last: dict[str, int] = {}
        self.count: dict[str, int] = {}  # ops covered
        self.direct: set[str] = set()  # modules with an op of their own
        self.rank = [0] * (len(paths) + 1)  # rank[i]: ops with a path before op i
        for i, path in enumerate(paths):
            self.rank[i + 1] = self.rank[i] + (path is not None)
            if path is None:
                continue
            self.direct.add(path)
            for module in _modules(path):
                self.first.setdefault(module, i)
                self.last[module] = i
                self.count[module] = self.count.get(module, 0) + 1
        #: begins[i]: the boundary module at op i, None where no stage may begin.
        self.begins: list[str | None] = [self._boundary(i) for i in range(len(paths))]

    def _boundary(self, i: int) -> str | None:
        path = self.paths[i]
        if path is None or self.rank[i] == 0:
            return None
        for module in _modules(path):
            if module in self.repeated:
                return None  # so is every module inside it
            if self.first[module] == i and self._reason(module) is None:
                return module
        return None

    def _reason(self, module: str) -> str | None:
        """Why ``module`` cannot be a boundary module where it begins (None: it can)."""
        span = self.rank[self.last[module] + 1] - self.rank[self.first[module]]
        if module in self.repeated or span != self.count[module]:
            return "is called more than once"
        if module not in self.direct:
            return "has no op of its own (a container whose forward may never run, such as nn.ModuleList)"
        return None

    def why_not(self, i: int) -> str:
        """Why no stage may begin at op i (an op with a path after the first), for an error message."""
        path = self.paths[i]
        if not path:  # the root: split_points never asks about an op with no path
            return "it is a root-level op, in no submodule"
        starting = [m for m in _modules(path) if self.first[m] == i]
        if not starting:
            return f"no module begins at it (it runs in module '{path}', which began earlier)"
        for module in _modules(path):
            if module in self.repeated:
                return f"module '{module}' is called more than once"
        return f"module '{starting[-1]}' begins here but {self._reason(starting[-1])}"
