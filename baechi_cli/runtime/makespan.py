"""A makespan plan run op for op: every node on its device, a copy at every cross-device edge.

Contract. A makespan plan puts each node of the program on a device (``graph_devices``).
:func:`segments` cuts the program, in program order, into maximal runs of nodes on one device
(a node the plan does not name joins the run it follows); :class:`MakespanStep` runs one
training step of them on the ranks (one per device): forward in program order, each run
receiving from the run that made each value it reads, *directly* (no value passes through a
device that does not read it), then the backward in reverse, each input's gradient sent back to
the run that made it. Sends are non-blocking and receives block in the one global order every
rank follows, so no rank waits on one that waits on it. A weight two devices read is copied to
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
    """One rank's part of a makespan plan: its runs, and one training step over them."""

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

    @property
    def modules(self) -> dict[int, Any]:
        return {k: self.cut.stages[k].module for k in self.local}

    def step(self, args: Sequence[Any]) -> Any:
        """Forward and backward of one minibatch ``args`` (the user inputs, on every rank); the
        loss on the rank whose run computes it, else None."""
        import torch
        import torch.distributed as dist

        user = dict(zip(self.user_inputs, args, strict=True))
        made, leaves, outputs, sends = {}, {}, {}, []
        loss = None
        for k in self.local:
            stage = self.cut.stages[k]
            ins = []
            for i, v in enumerate(stage.inputs):
                src = self.cut.made_in[v]
                shape, dtype, grad = self.metas[k][0][i]
                if src < 0:
                    t = user[v]
                elif self.run_rank[src] == self.rank:
                    t = made[v].detach().requires_grad_(grad)
                else:
                    t = torch.empty(shape, dtype=getattr(torch, dtype))
                    dist.recv(t, self.run_rank[src], tag=self.tags[(v, k)])
                    t.requires_grad_(grad)
                leaves[(k, v)] = t
                ins.append(t)
            outs = stage.module(*ins)
            outputs[k] = outs
            for v, o in zip(stage.outputs, outs, strict=True):
                made[v] = o
                for c in self.consumers.get(v, ()):
                    if self.run_rank[c] != self.rank:
                        sends.append(
                            dist.isend(o.detach().contiguous(), self.run_rank[c], tag=self.tags[(v, c)])
                        )
        offset = len(self.tags)  # gradient tags follow the activations'
        for k in reversed(self.local):
            stage = self.cut.stages[k]
            pairs = []
            for v, o in zip(stage.outputs, outputs[k], strict=True):
                if not o.requires_grad:
                    continue
                total = None
                for c in self.consumers.get(v, ()):
                    if self.run_rank[c] == self.rank:
                        g = leaves.pop((c, v)).grad  # its run's backward is done: the leaf goes
                    else:
                        g = torch.empty(o.shape, dtype=o.dtype)
                        dist.recv(g, self.run_rank[c], tag=offset + self.tags[(v, c)])
                    if g is not None:
                        total = g if total is None else total + g
                if not self.consumers.get(v):  # the loss
                    loss, total = o, torch.ones_like(o)
                if total is not None:
                    pairs.append((o, total))
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
            del pairs, outputs[k]  # the run's activations and output gradients: freed, as autograd would
            for v in stage.outputs:
                made.pop(v, None)
            for v in stage.inputs:
                src = self.cut.made_in[v]
                leaf = leaves[(k, v)]
                if src >= 0 and self.run_rank[src] != self.rank and leaf.requires_grad:
                    g = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
                    sends.append(
                        dist.isend(g.contiguous(), self.run_rank[src], tag=offset + self.tags[(v, k)])
                    )
                    del leaves[(k, v)]  # the send holds its gradient until it is waited for
        for work in sends:
            work.wait()
        return None if loss is None else loss.detach()
