"""The memory one microbatch takes on each pipeline stage, from the liveness of its tensors.

``MicrobatchMemory(graph, skip)`` indexes a training (or inference) graph once; its
``per_stage(stage_of, stages, microbatches)`` returns, per stage, what one microbatch holds there
(:class:`StageMemory`):

* ``retained``: between its forward and its backward, the tensors the stage's backward reads
  and the outputs it sent on (a torch ``PipelineStage`` keeps them for ``backward``);
* ``forward_peak`` and ``backward_peak``: the most it holds at once while its forward (its
  backward) runs, temporaries included;
* ``weight_pending``: where the backward is split (zbv), what it holds from its input gradient
  to its weight gradient beyond ``retained``: the backward's tensors that weight-gradient ops read.

The stage runs its forward ops in program (topological) order, then its backward ops. A tensor is
allocated when its op runs and freed after its last reader on the stage; a forward tensor another
stage reads is kept until the stage's last backward op. A view allocates nothing and keeps its
source alive as long as itself; a view of a weight counts nothing. Not counted (held elsewhere):
the ops in ``skip`` and their outputs (optimizer updates: the gradients they read are the stage's
persistent ``.grad``), the inputs the caller feeds, values a stage receives (the receive buffers
are persistent) and gradients it sends back. Sizes are the graph's (one minibatch) divided by the
microbatches, but for the weight gradients an update reads (a microbatch's is the weight's
size) and an op's temporaries up to the bytes of the weights it reads (its forward op's, for a
backward op) or its workspace (``attrs["_workspace_bytes"]``): a kernel's copy of its weights
(oneDNN's reorder) and a workspace sized by them are as large for a microbatch. A stage's
gradients of one weight live until the last of them is made (autograd sums them before
``.grad``); the sum of a tied weight's gradients allocates nothing. A stage runs as a graph
module, which frees each value after its last use (``OpGraph.scope_holds`` do not apply).

Complexity: O(V + E) to index, O(V + E) per call (numpy).

Example: a forward op whose 400-byte output its backward reads, with 100 bytes of scratch:

    >>> from baechi_cli.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.add_op("x", "Relu", [400], temporary_bytes=100)
    >>> dx = b.add_op("dx", "ReluGrad", [400], is_backward=True, forward_op=x)
    >>> _ = b.add_edge(x, dx)
    >>> MicrobatchMemory(b.build()).per_stage([0, 0], 1, 2)
    [StageMemory(retained=200, forward_peak=250, backward_peak=400, weight_pending=0)]
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import NamedTuple

import numpy as np

from baechi_cli.core.graph import CONTROL_PORT, OpGraph

_SUMS = frozenset({"add", "add_", "addn", "sum"})  # op types (after the last dot) that add tensors


class StageMemory(NamedTuple):
    """One microbatch's bytes on a stage (module docstring)."""

    retained: int
    forward_peak: int
    backward_peak: int
    weight_pending: int = 0  # held from its input gradient (I) to its weight gradient (W), split


class MicrobatchMemory:
    """A graph's tensors indexed for :meth:`per_stage` (module docstring)."""

    def __init__(self, graph: OpGraph, skip: Collection[int] = ()) -> None:
        n = graph.num_ops
        self.num_ops = n
        skipped = np.zeros(n, dtype=bool)
        skipped[list(skip)] = True
        backward = np.array(graph.is_backward, dtype=bool)
        # Program position: every forward op (topological order), then every backward op.
        topo = np.array(graph.topo_order(), dtype=np.int64)
        rank = np.empty(n, dtype=np.int64)
        rank[topo] = np.arange(n, dtype=np.int64)
        order = np.lexsort((rank, backward))
        self.pos = np.empty(n, dtype=np.int64)
        self.pos[order] = np.arange(n, dtype=np.int64)
        self.backward = backward
        self.forward_ops = int((~backward).sum())

        # Each output's storage: its own, its source's for a view (None: a weight's), resolved
        # along view chains in topological order.
        stride = max((len(b) for b in graph.output_bytes), default=0) + 1
        held = {v * stride + p for v, p in graph.held_outputs}
        base: dict[int, int | None] = {}
        for v in topo.tolist():
            source = graph.view_of.get(v)
            if source is None:
                continue
            src, port = source
            key = src * stride + port if src >= 0 else -1
            root = None if src < 0 else base.get(key, key)
            for p in range(len(graph.output_bytes[v])):
                base[v * stride + p] = root
        ids: dict[int, int] = {}
        src_of: list[int] = []
        nbytes: list[int] = []

        def storage(v: int, p: int) -> int:
            """The id of the storage (v, p) lives in, -1 when nothing counts."""
            key = v * stride + p
            root = base.get(key, key)
            if root is None or root in held:
                return -1
            t = ids.get(root)
            if t is None:
                owner, port = divmod(root, stride)
                size = graph.output_bytes[owner][port] if not skipped[owner] else 0
                if size <= 0:
                    ids[root] = -1
                    return -1
                t = ids[root] = len(src_of)
                src_of.append(owner)
                nbytes.append(size)
            return t

        for v in range(n):
            if v not in graph.view_of:
                for p in range(len(graph.output_bytes[v])):
                    storage(v, p)
        reads_t: list[int] = []
        reads_op: list[int] = []
        gradients: list[int] = []
        for e in range(graph.num_edges):
            dst = graph.edge_dst[e]
            if graph.edge_port[e] == CONTROL_PORT:
                continue
            t = storage(graph.edge_src[e], graph.edge_port[e])
            if t < 0:
                continue
            if skipped[dst]:  # a weight's gradient, as large for a microbatch as for the batch
                gradients.append(t)
                continue
            reads_t.append(t)
            reads_op.append(dst)
        # A sum of a weight's gradients (a tied weight's readers') adds gradients: its inputs of
        # its size are gradients too, and it allocates nothing (torch adds each into ``.grad``).
        grad = set(gradients)
        weight = {t: t for t in gradients}  # each gradient's weight: the storage its update reads
        summed = set()
        for v in reversed(topo.tolist()):
            if not graph.is_backward[v] or graph.op_types[v].lower().rsplit(".", 1)[-1] not in _SUMS:
                continue
            outputs = {storage(v, p) for p in range(len(graph.output_bytes[v]))} & grad
            if not outputs:
                continue
            size = max(nbytes[t] for t in outputs)
            summed |= outputs
            owner = weight[min(outputs)]
            for e in graph.in_edges[v]:
                if graph.edge_port[e] != CONTROL_PORT:
                    t = storage(graph.edge_src[e], graph.edge_port[e])
                    if t >= 0 and nbytes[t] == size:
                        grad.add(t)
                        weight.setdefault(t, owner)
        gradients = sorted(grad)
        # The backward's own tensors that an op making a weight gradient reads (its output's
        # gradient), by that op: held from the input-gradient pass to the weight pass when split.
        makers = {src_of[t] for t in gradients}
        pending: set[tuple[int, int]] = set()
        for t, v in zip(reads_t, reads_op):
            if v in makers and t not in grad and backward[src_of[t]]:
                pending.add((t, v))
        ordered = sorted(pending)
        self.pending_t = np.array([t for t, _ in ordered], dtype=np.int64)
        self.pending_op = np.array([v for _, v in ordered], dtype=np.int64)
        self.src = np.array(src_of, dtype=np.int64)
        for t in summed:
            nbytes[t] = 0
        self.nbytes = np.array(nbytes, dtype=np.float64)
        self.per_sample = np.ones(len(nbytes), dtype=bool)
        self.per_sample[gradients] = False
        self.weight_of = np.full(len(nbytes), -1, dtype=np.int64)
        for t, w in weight.items():
            self.weight_of[t] = w
        self.reads_t = np.array(reads_t, dtype=np.int64)
        self.reads_op = np.array(reads_op, dtype=np.int64)
        temporary = [v for v in range(n) if graph.temporary_bytes[v] > 0 and not skipped[v]]
        self.temp_op = np.array(temporary, dtype=np.int64)
        self.temp_bytes = np.array([graph.temporary_bytes[v] for v in temporary], dtype=np.float64)
        weights = [
            graph.persistent_bytes[graph.forward_op[v] if backward[v] and graph.forward_op[v] >= 0 else v]
            for v in temporary
        ]
        # A kernel's workspace that does not grow with the batch (the traced step's: its reader's
        # ``_workspace_bytes``) is a call's too.
        fixed = [(graph.attrs[v] or {}).get("_workspace_bytes", 0) for v in temporary]
        self.temp_per_call = np.minimum(
            self.temp_bytes,
            np.maximum(np.array(weights, dtype=np.float64), np.array(fixed, dtype=np.float64)),
        )

    def per_stage(self, stage_of: Sequence[int], stages: int, microbatches: int) -> list[StageMemory]:
        """Per stage, one microbatch's :class:`StageMemory` under ``stage_of`` (a stage per op)."""
        if len(stage_of) != self.num_ops:
            raise ValueError(f"stage_of has {len(stage_of)} entries for {self.num_ops} ops")
        stage = np.asarray(stage_of, dtype=np.int64)
        pos, src = self.pos, self.src
        # The stage's last backward position: where a forward tensor sent on is released.
        end = np.full(stages, -1, dtype=np.int64)
        np.maximum.at(end, stage, np.where(self.backward, pos, -1))
        last = pos[src].copy()
        if len(self.reads_t):
            reader_stage = stage[self.reads_op]
            own = stage[src][self.reads_t]
            same = reader_stage == own
            np.maximum.at(last, self.reads_t[same], pos[self.reads_op[same]])
            sent = ~same & (reader_stage > own) & ~self.backward[src][self.reads_t]
            kept = np.maximum(end[own[sent]], pos[src][self.reads_t[sent]])
            np.maximum.at(last, self.reads_t[sent], kept)
        # A stage's gradients of one weight (a tied weight's readers there) are summed in
        # autograd's buffer before they reach .grad: each lives until the stage's last of them.
        grads = np.flatnonzero(self.weight_of >= 0)
        if len(grads):
            _, group = np.unique(
                np.stack([stage[src[grads]], self.weight_of[grads]]), axis=1, return_inverse=True
            )
            group = group.reshape(-1)
            ready = np.full(group.max() + 1, -1, dtype=np.int64)
            np.maximum.at(ready, group, pos[src[grads]])
            last[grads] = np.maximum(last[grads], ready[group])
        # Events: allocations at 2*pos, frees at 2*last+1; live bytes after each, per stage.
        nbytes = np.where(self.per_sample, self.nbytes / microbatches, self.nbytes)
        temp = self.temp_per_call + (self.temp_bytes - self.temp_per_call) / microbatches
        keys = np.concatenate([2 * pos[src], 2 * last + 1, 2 * pos[self.temp_op], 2 * pos[self.temp_op] + 1])
        deltas = np.concatenate([nbytes, -nbytes, temp, -temp])
        owner = np.concatenate([stage[src], stage[src], stage[self.temp_op], stage[self.temp_op]])
        # What a split backward holds from I to W: each such tensor once per stage reading it.
        pending = np.zeros(stages)
        if len(self.pending_t):
            pairs = np.unique(np.stack([stage[self.pending_op], self.pending_t]), axis=1)
            np.add.at(pending, pairs[0], nbytes[pairs[1]])
        out = []
        by = np.lexsort((keys, owner))
        keys, deltas, owner = keys[by], deltas[by], owner[by]
        bounds = np.searchsorted(owner, np.arange(stages + 1))
        split = 2 * self.forward_ops  # keys below: the forward's
        for s in range(stages):
            k, live = keys[bounds[s] : bounds[s + 1]], np.cumsum(deltas[bounds[s] : bounds[s + 1]])
            forward = k < split
            retained = float(live[forward][-1]) if forward.any() else 0.0
            forward_peak = float(live[forward].max()) if forward.any() else 0.0
            backward_peak = float(live[~forward].max()) if (~forward).any() else 0.0
            out.append(
                StageMemory(
                    *(
                        int(np.ceil(max(0.0, x)))
                        for x in (retained, forward_peak, max(backward_peak, retained), pending[s])
                    )
                )
            )
        return out
