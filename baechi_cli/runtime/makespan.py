"""A makespan plan run op for op: every node on its device, a copy at every cross-device edge.

Contract. A makespan plan puts each node of the program on a device (``graph_devices``).
:func:`segments` cuts the program, in program order, into maximal runs of nodes on one device
(a node the plan does not name joins the run it follows); :class:`MakespanStep` runs one
training step of them on the ranks (one per device): forward in program order, each run
receiving from the run that made each value it reads, *directly* (no value passes through a
device that does not read it), then the backward in reverse, each input's gradient sent back to
the run that made it. The forward of run k and the backward of run k are positions k and
2 * runs - 1 - k of one global order that every rank follows. Sends are non-blocking; at each of
its positions a rank first posts the receives of everything sent to it before that position
(non-blocking too) and waits on its own sends that their receivers have posted by then (gloo
completes a send only when waited on); a run waits on a receive when it reads it. A receiver
reaches a position needing only what was sent before it, so no rank waits on one that waits on
it, and a value's bytes move to its reader's rank when it is sent, as the plan's memory model
counts. A weight two devices read is copied to each (:mod:`~baechi_cli.runtime.cut`'s ``tied``)
and its gradients summed by the caller; runs of one rank share one copy (the caller's
``_share_tied``).

Needs torch and a gloo group. O(nodes) to segment; a step sends each cross-device value once per
run that reads it.

Example:
    >>> segments(["a", "b", "c", "d"], {"a": 0, "b": 0, "c": 1, "d": 0})
    ({'a': 0, 'b': 0, 'c': 1, 'd': 2}, [0, 1, 0])
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any

from baechi_cli.core.errors import InputError


def segments(order: Sequence[str], device_of: Mapping[str, int]) -> tuple[dict[str, int], list[int]]:
    """``({node: run}, [device of each run])``: maximal runs of consecutive nodes (in ``order``)
    on one device; nodes without a device are left to the cut (they join their input's run)."""
    stage_of: dict[str, int] = {}
    run_device: list[int] = []
    for name in order:
        device = device_of.get(name)
        if device is None:
            continue
        if not run_device or run_device[-1] != device:
            run_device.append(device)
        stage_of[name] = len(run_device) - 1
    if not run_device:
        raise InputError("the plan places none of this program's nodes")
    return stage_of, run_device


class MakespanStep:
    """One rank's part of a makespan plan: its runs, and one training step over them.

    A tensor lives as the plan's memory model says (:mod:`~baechi_cli.placers.liveness`), not
    until the step ends: a run's output until its last reader on this rank has run and its sends
    have completed (autograd keeps what a backward saves); a received value until its reader's
    forward has run, unless that backward saved it; a gradient until it is summed or sent. So
    each run's backward starts from an *anchor* (:func:`_anchor`), which holds its outputs'
    autograd nodes but not their bytes, and each input enters through a *tap* (:func:`_tap`),
    which hands its gradient back without keeping the input alive as a leaf would."""

    def __init__(
        self, cut: Any, run_rank: Sequence[int], rank: int, metas: Sequence[Any], user_inputs: Sequence[str]
    ):
        self.cut, self.run_rank, self.rank, self.metas = cut, list(run_rank), rank, metas
        self.user_inputs = list(user_inputs)
        self.local = [k for k, r in enumerate(self.run_rank) if r == rank]
        self.consumers: dict[str, list[int]] = {}
        for k, stage in enumerate(cut.stages):
            for v in stage.inputs:
                self.consumers.setdefault(v, []).append(k)
        self.tags: dict[tuple[str, int], int] = {}  # (value, reading run) -> a tag both ends agree on
        for k, stage in enumerate(cut.stages):
            for v in stage.inputs:
                self.tags[(v, k)] = len(self.tags)
        # A value made here: the last run on this rank that reads it (its bytes go after).
        self.last_local: dict[str, int] = {}
        for k in self.local:
            for v in cut.stages[k].inputs:
                if cut.made_in[v] >= 0 and self.run_rank[cut.made_in[v]] == rank:
                    self.last_local[v] = k
        # The global order: run k's forward at position k, its backward at last - k. A rank posts
        # its receives for what was sent before a position when it gets there (:meth:`step`).
        self.last = 2 * len(cut.stages) - 1
        self.positions: dict[int, list[int]] = {}  # rank -> its positions, in order
        for k, r in enumerate(self.run_rank):
            self.positions.setdefault(r, []).append(k)
        for ks in self.positions.values():
            ks.extend(self.last - k for k in reversed(ks))
        # What this rank receives, by the position it is sent at: (position, kind, value, reader,
        # the value's index among the reader's inputs)
        incoming = []
        for k in self.local:
            for i, v in enumerate(cut.stages[k].inputs):
                src = cut.made_in[v]
                if src >= 0 and self.run_rank[src] != rank:
                    incoming.append((src, 0, v, k, i))  # an activation, sent after run src's forward
            for v in cut.stages[k].outputs:
                for c in self.consumers.get(v, ()):
                    i = cut.stages[c].inputs.index(v)
                    if self.run_rank[c] != rank and metas[c][0][i][2]:
                        incoming.append((self.last - c, 1, v, c, i))  # its gradient, after c's backward
        self.incoming = sorted(incoming, key=lambda m: (m[0], m[1], m[3], m[2]))

    def due(self, receiver: int, sent_at: int) -> int:
        """The position at which rank ``receiver`` posts the receive of what was sent at position
        ``sent_at``: its first position after it (past the last: it posts at the end)."""
        ks = self.positions[receiver]
        i = bisect_right(ks, sent_at)
        return ks[i] if i < len(ks) else self.last + 1

    @property
    def modules(self) -> dict[int, Any]:
        return {k: self.cut.stages[k].module for k in self.local}

    def step(self, args: Sequence[Any]) -> Any:
        """Forward and backward of one minibatch ``args`` (the user inputs, on every rank); the
        loss on the rank whose run computes it, else None.

        Every rank goes through its positions in the global order. At each it first posts the
        receives of everything sent to it before that position (a buffer and a non-blocking
        receive each, as the plan's model receives a value when it is sent), and waits on each of
        its own sends that the receiver has posted by now (gloo completes a send only when
        waited on; its bytes go then). A run waits on its receives when it reads them."""
        import torch
        import torch.distributed as dist
        from torch.profiler import record_function

        user = dict(zip(self.user_inputs, args, strict=True))
        made: dict[str, Any] = {}  # values made here that a later run here still reads
        taps: dict[tuple[int, str], Any] = {}  # (run, value) -> the gradient its tap received
        anchors: dict[int, tuple[Any, dict[str, Any], list[str]]] = {}
        posted: dict[tuple[int, str, int], tuple[Any, Any]] = {}  # (kind, value, reader) -> buffer, work
        sends: list[tuple[int, Any]] = []  # (the position its receiver posts it at, the send)
        pending = iter(self.incoming)
        coming = next(pending, None)  # the next receive to post
        offset = len(self.tags)  # gradient tags follow the activations'
        last = self.last
        loss = None

        def arrive(position: int) -> None:  # post what was sent before ``position``
            nonlocal sends, coming
            while coming is not None and coming[0] < position:
                _, kind, v, c, i = coming
                coming = next(pending, None)
                shape, dtype, _, strides = self.metas[c][0][i]  # a value and its gradient alike
                buffer = torch.empty_strided(shape, strides, dtype=getattr(torch, dtype))
                wire = _wire(buffer)  # the buffer's storage, as gloo receives it
                if kind == 0:  # run c's input v, from the run that made it
                    src, tag = self.run_rank[self.cut.made_in[v]], self.tags[(v, c)]
                else:  # the gradient of v, from run c
                    src, tag = self.run_rank[c], offset + self.tags[(v, c)]
                posted[(kind, v, c)] = (buffer, dist.irecv(wire, src, tag=tag))
            sends = _settle(sends, position)

        def received(kind: int, v: str, c: int) -> Any:  # None: nothing is sent (no gradient)
            if (kind, v, c) not in posted:
                return None
            buffer, work = posted.pop((kind, v, c))
            work.wait()
            return buffer

        for k in self.local:
            arrive(k)
            stage = self.cut.stages[k]
            ins = []
            for i, v in enumerate(stage.inputs):
                src = self.cut.made_in[v]
                grad = self.metas[k][0][i][2]
                if src < 0:
                    ins.append(user[v])
                    continue
                if self.run_rank[src] == self.rank:
                    t = made[v] if self.last_local[v] != k else made.pop(v)
                else:
                    t = received(0, v, k)
                ins.append(_tap(t, taps, (k, v)) if grad else t)
                del t
            with record_function(f"baechi run {k} forward"):
                outs = stage.module(*ins)
            del ins
            grads: dict[str, Any] = {}
            needing = {v: o for v, o in zip(stage.outputs, outs, strict=True) if o.requires_grad}
            for v, o in zip(stage.outputs, outs, strict=True):
                if not self.consumers.get(v) and o.requires_grad:  # the loss
                    loss = o.detach()
                    grads[v] = torch.ones_like(o)
                for c in self.consumers.get(v, ()):
                    if self.run_rank[c] != self.rank:
                        work = dist.isend(_wire(o.detach()), self.run_rank[c], tag=self.tags[(v, c)])
                        sends.append((self.due(self.run_rank[c], k), work))
                if v in self.last_local:
                    made[v] = o.detach()
            if needing:  # the outputs' shapes and dtypes stay for their gradients; their bytes go
                anchor = _anchor(grads, list(needing), list(needing.values()))
                anchors[k] = (anchor, grads, list(needing))
            del outs, needing
        for k in reversed(self.local):
            arrive(last - k)
            stage = self.cut.stages[k]
            if k in anchors:
                anchor, grads, needing = anchors.pop(k)
                for v in needing:
                    total = grads.get(v)
                    for c in self.consumers.get(v, ()):
                        if self.run_rank[c] == self.rank:
                            g = taps.pop((c, v), None)  # its run's backward is done
                        else:
                            g = received(1, v, c)
                        if g is not None:
                            total = g if total is None else total + g
                    grads[v] = total
                    del total
                if any(g is not None for g in grads.values()):
                    with record_function(f"baechi run {k} backward"):
                        anchor.backward()
                del anchor, grads
            for i, v in enumerate(stage.inputs):
                src = self.cut.made_in[v]
                if src < 0 or self.run_rank[src] == self.rank or not self.metas[k][0][i][2]:
                    continue
                g = taps.pop((k, v), None)
                shape, dtype, _, strides = self.metas[k][0][i]  # sent as its value was
                if g is None or tuple(g.stride()) != tuple(strides):
                    buffer = torch.empty_strided(shape, strides, dtype=getattr(torch, dtype))
                    g = buffer.zero_() if g is None else buffer.copy_(g)
                g = _wire(g)
                work = dist.isend(g, self.run_rank[src], tag=offset + self.tags[(v, k)])
                sends.append((self.due(self.run_rank[src], last - k), work))
                del g
        arrive(last + 2)
        assert not posted, f"received but not read: {sorted(posted)[:3]}"
        return loss


def _wire(value: Any) -> Any:
    """A dense tensor as gloo sends and receives it, plainly contiguous: its view in
    :func:`~baechi_cli.runtime.cut.dense_order` (the same storage; a channels-last one as NHWC)."""
    from baechi_cli.runtime.cut import dense_order

    order = dense_order(value.stride(), value.shape)
    return value.contiguous() if order is None else value.permute(order)


def _settle(sends: list[tuple[int, Any]], position: int) -> list[tuple[int, Any]]:
    """Wait on the sends whose receiver posts them before ``position`` in the global order, and
    return the others. Every rank runs its part in that order, so a receiver before ``position``
    needs nothing this rank makes from ``position`` on: the wait ends."""
    for due, work in sends:
        if due < position:
            work.wait()
    return [(due, work) for due, work in sends if due >= position]


def _tap(value: Any, sink: dict[Any, Any], key: Any) -> Any:
    """``value`` (no gradient of its own) as an input that carries one: autograd's gradient for
    it lands in ``sink[key]``. Unlike a leaf, whose gradient accumulator keeps it alive until
    the backward, a tap holds nothing: the bytes go when no saved tensor needs them."""
    tap, _ = _functions()
    return tap.apply(_requires_grad(), value, sink, key)


def _anchor(grads: dict[str, Any], names: Sequence[str], outputs: Sequence[Any]) -> Any:
    """A 0-d tensor whose backward feeds ``grads[name]`` (None: no gradient) into each output
    and drops it from ``grads``: it keeps the outputs' autograd nodes, not their bytes, so a run's
    backward can start when its outputs' gradients are known though the outputs are gone."""
    _, anchor = _functions()
    return anchor.apply(grads, list(names), *outputs)


_FUNCTIONS: list[Any] = []


def _functions() -> tuple[Any, Any]:
    """The tap and anchor autograd functions (made once: torch is imported only to run a plan;
    a class made per call would hold its gradients in a reference cycle until a collection)."""
    if _FUNCTIONS:
        return _FUNCTIONS[0], _FUNCTIONS[1]
    import torch

    class Tap(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, _: Any, x: Any, sink: dict[Any, Any], key: Any) -> Any:
            ctx.sink, ctx.key = sink, key
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            sink, key = ctx.sink, ctx.key
            sink[key] = grad if key not in sink else sink[key] + grad
            return None, None, None, None

    class Anchor(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, grads: dict[str, Any], names: list[str], *xs: Any) -> Any:
            ctx.grads, ctx.names = grads, names
            return torch.zeros(())

        @staticmethod
        def backward(ctx: Any, _: Any) -> Any:
            return (None, None, *(ctx.grads.pop(name, None) for name in ctx.names))

    _FUNCTIONS.extend((Tap, Anchor))
    return Tap, Anchor


_REQUIRES_GRAD: list[Any] = []


def _requires_grad() -> Any:
    """An empty tensor that requires a gradient: it makes a tap's output carry one."""
    import torch

    if not _REQUIRES_GRAD:
        _REQUIRES_GRAD.append(torch.empty(0, requires_grad=True))
    return _REQUIRES_GRAD[0]
