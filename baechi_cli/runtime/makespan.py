"""A makespan plan run op for op: every node on its device, a copy at every cross-device edge.

Contract. A makespan plan puts each node of the program on a device (``graph_devices``).
:func:`segments` cuts the program, in program order, into maximal runs of nodes on one device
(a node the plan does not name joins the run it follows); :class:`MakespanStep` runs one
training step of them on the ranks (one per device): forward in program order, each run
receiving from the run that made each value it reads, *directly* (no value passes through a
device that does not read it), then the backward in reverse, each input's gradient sent back to
the run that made it. Sends are non-blocking and receives block in the one global order every
rank follows, so no rank waits on one that waits on it; a send is waited on (gloo completes one
only then) before the first run of its rank that comes after its reader in that order, so its
bytes go when the reader has them, as the plan's memory model counts. A weight two devices read is copied to
each (:mod:`~baechi_cli.runtime.cut`'s ``tied``) and its gradients summed by the caller.

Needs torch and a gloo group. O(nodes) to segment; a step sends each cross-device value once per
run that reads it.

Example:
    >>> segments(["a", "b", "c", "d"], {"a": 0, "b": 0, "c": 1, "d": 0})
    ({'a': 0, 'b': 0, 'c': 1, 'd': 2}, [0, 1, 0])
"""

from __future__ import annotations

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

    @property
    def modules(self) -> dict[int, Any]:
        return {k: self.cut.stages[k].module for k in self.local}

    def step(self, args: Sequence[Any]) -> Any:
        """Forward and backward of one minibatch ``args`` (the user inputs, on every rank); the
        loss on the rank whose run computes it, else None."""
        import torch
        import torch.distributed as dist
        from torch.profiler import record_function

        user = dict(zip(self.user_inputs, args, strict=True))
        made: dict[str, Any] = {}  # values made here that a later run here still reads
        taps: dict[tuple[int, str], Any] = {}  # (run, value) -> the gradient its tap received
        anchors: dict[int, tuple[Any, dict[str, Any], dict[str, Any]]] = {}
        # (when in the global order its reader receives it, the send): a gloo send completes only
        # when waited on, so each is waited on once its reader is surely past its receive
        sends: list[tuple[int, Any]] = []
        last = 2 * len(self.cut.stages) - 1  # a run's forward is at k, its backward at last - k
        loss = None
        for k in self.local:
            sends = _settle(sends, k)
            stage = self.cut.stages[k]
            ins = []
            for i, v in enumerate(stage.inputs):
                src = self.cut.made_in[v]
                shape, dtype, grad = self.metas[k][0][i]
                if src < 0:
                    ins.append(user[v])
                    continue
                if self.run_rank[src] == self.rank:
                    t = made[v] if self.last_local[v] != k else made.pop(v)
                else:
                    t = torch.empty(shape, dtype=getattr(torch, dtype))
                    dist.recv(t, self.run_rank[src], tag=self.tags[(v, k)])
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
                        work = dist.isend(o.detach().contiguous(), self.run_rank[c], tag=self.tags[(v, c)])
                        sends.append((c, work))
                if v in self.last_local:
                    made[v] = o.detach()
            if needing:  # the outputs' shapes and dtypes stay for their gradients; their bytes go
                anchor = _anchor(grads, list(needing), list(needing.values()))
                anchors[k] = (anchor, grads, {v: (o.shape, o.dtype) for v, o in needing.items()})
            del outs, needing
        offset = len(self.tags)  # gradient tags follow the activations'
        for k in reversed(self.local):
            sends = _settle(sends, last - k)
            stage = self.cut.stages[k]
            if k in anchors:
                anchor, grads, needing = anchors.pop(k)
                for v in needing:
                    total = grads.get(v)
                    for c in self.consumers.get(v, ()):
                        if self.run_rank[c] == self.rank:
                            g = taps.pop((c, v), None)  # its run's backward is done
                        else:
                            g = torch.empty(needing[v][0], dtype=needing[v][1])
                            dist.recv(g, self.run_rank[c], tag=offset + self.tags[(v, c)])
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
                if g is None:
                    shape, dtype, _ = self.metas[k][0][i]
                    g = torch.zeros(shape, dtype=getattr(torch, dtype))
                work = dist.isend(g.contiguous(), self.run_rank[src], tag=offset + self.tags[(v, k)])
                sends.append((last - src, work))
                del g
        _settle(sends, last + 1)
        return loss


def _settle(sends: list[tuple[int, Any]], position: int) -> list[tuple[int, Any]]:
    """Wait on the sends whose reader comes before ``position`` in the global order, and return
    the others. Every rank runs its part in that order, receiving before each run, so a reader
    before ``position`` needs nothing this rank makes from ``position`` on: the wait ends."""
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
