"""The pass manager: run the graph passes, record what each did, and make the placement graph.

:func:`constraint_passes` applies what the input format imposes (a GraphDef's
colocation and control flow); :func:`optimization_passes` makes the graph the
placers see under one :class:`PassOptions` (forward-only placement,
co-placement, fusion), as a :class:`Variant`. Every pass leaves a
:class:`PassRecord` (ops, edges and groups before and after, seconds) for the
report.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.errors import InputError
from baechi_cli.core.graph import OpGraph

# Co-placement grows a group up to this fraction of the model's memory per
# device (the placers' memory measure): chains and pairs merge, but no group
# grows big enough to commit a placer, at its first op, to a large part of
# the model (m-ETF on Inception-V3: 579 ms with 1/8 of a device, 188 ms here).
COPLACE_GROUPS_PER_DEVICE = 256


@dataclass
class PassRecord:
    name: str
    ops_before: int
    ops_after: int
    edges_before: int
    edges_after: int
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)


def run_pass(name: str, fn: Callable[[OpGraph], OpGraph], graph: OpGraph) -> tuple[OpGraph, PassRecord]:
    """Apply one pass and record what it did (ops, edges and groups before and after)."""
    t0 = time.perf_counter()
    out = fn(graph)
    seconds = time.perf_counter() - t0
    record = PassRecord(name, graph.num_ops, out.num_ops, graph.num_edges, out.num_edges, seconds)
    record.details = {
        "enabled": True,
        "groups_before": _count_groups(graph),
        "groups_after": _count_groups(out),
    }
    return out, record


def _count_groups(graph: OpGraph) -> int:
    return len(set(graph.group))


def skipped_pass(name: str, graph: OpGraph, reason: str) -> PassRecord:
    """The record of a pass that did not run, with the reason."""
    groups = _count_groups(graph)
    record = PassRecord(name, graph.num_ops, graph.num_ops, graph.num_edges, graph.num_edges, 0.0)
    record.details = {"enabled": False, "reason": reason, "groups_before": groups, "groups_after": groups}
    return record


def constraint_passes(graph: OpGraph, fmt: str, path: str) -> tuple[OpGraph, list[PassRecord]]:
    """Colocation and control flow (GraphDef): what TensorFlow imposes, so always run.

    A bad graph (a cycle, a colocation conflict) is an InputError naming ``path``.
    """
    records: list[PassRecord] = []
    try:
        if fmt == "graphdef":
            from baechi_cli.passes.colocation import colocate
            from baechi_cli.passes.control_flow import control_flow

            for name, fn in (("colocation", colocate), ("control_flow", control_flow)):
                graph, record = run_pass(name, fn, graph)
                records.append(record)
        graph.topo_order()  # every later stage needs the order; a cycle fails here, once
    except InputError as err:
        raise err.with_path(path) from None
    return graph, records


class PassOptions(NamedTuple):
    """One setting of the optimization passes: a point of ``--algo auto``'s search space."""

    forward_only: bool
    coplace: int | None  # co-placement's bound, in groups per device of the model's memory; None: off
    fusion: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "forward_only": self.forward_only,
            "coplace": self.coplace is not None,
            "coplace_groups_per_device": self.coplace,
            "fusion": self.fusion,
        }

    def differences(self, base: PassOptions) -> str:
        """How this setting differs from ``base``, for labels: ``no forward-only, co-placement/32``."""
        out = []
        if self.forward_only != base.forward_only:
            out.append("forward-only" if self.forward_only else "no forward-only")
        if self.coplace != base.coplace:
            out.append("no co-placement" if self.coplace is None else f"co-placement/{self.coplace}")
        if self.fusion != base.fusion:
            out.append("fusion" if self.fusion else "no fusion")
        return ", ".join(out)


@dataclass
class Variant:
    """The placement graph of one :class:`PassOptions`: what the placers see under that setting."""

    options: PassOptions
    placement_graph: OpGraph  # nodes with ``members`` when ops were contracted
    records: list[PassRecord]
    # True when placement_graph only contracts the op graph (no edge dropped), so a
    # placer's node sequence expands into a valid op sequence; forward-only
    # placement drops the backward ops' edges, and then the evaluator orders ops.
    expands_sequence: bool = True
    # Set when forward-only placement contracted the graph: the placement graph
    # without it (same other options), for when a placement made under
    # forward-only's premise (every device holds the whole model) does not fit.
    without_forward_only: Callable[[], OpGraph] | None = field(default=None, repr=False)

    @functools.cached_property
    def fingerprint(self) -> int:
        """Equal for variants whose placers would see the same graph (auto runs one of them)."""
        g = self.placement_graph
        members = None if g.members is None else tuple(tuple(m) for m in g.members)
        return hash((members, tuple(g.group), g.num_edges, self.expands_sequence))


def optimization_passes(
    graph: OpGraph, devices: DeviceSpec, options: PassOptions, forward_only_reason: str
) -> Variant:
    """Forward-only placement, co-placement and fusion as ``options`` say (see :class:`Variant`).

    ``forward_only_reason`` is what the forward-only pass's record says about
    why it ran or not. The placement graph's nodes carry ``members`` when a
    pass contracted ops.
    """
    from baechi_cli.core.graph import own_bytes
    from baechi_cli.passes.coplace import coplace
    from baechi_cli.passes.forward_only import forward_only

    records: list[PassRecord] = []
    current = graph
    if options.forward_only:
        current, record = run_pass("forward_only", forward_only, current)
        record.details["reason"] = forward_only_reason
        records.append(record)
    else:
        records.append(skipped_pass("forward_only", graph, forward_only_reason))
    if options.coplace is not None:
        cap = sum(own_bytes(graph)) // (options.coplace * devices.count)
        current, record = run_pass("coplace", lambda g: coplace(g, max_group_bytes=cap), current)
        record.details["max_group_bytes"] = cap
        records.append(record)
    else:
        records.append(skipped_pass("coplace", current, "--no-coplace"))
    if options.fusion:
        from baechi_cli.passes.fusion import fuse

        current, record = run_pass("fusion", fuse, current)
        records.append(record)
    else:
        records.append(skipped_pass("fusion", current, "--no-fusion"))
    variant = Variant(options, current, records, expands_sequence=not options.forward_only)
    if options.forward_only:
        fine = options._replace(forward_only=False)

        @functools.cache
        def without_forward_only() -> OpGraph:
            return optimization_passes(graph, devices, fine, "").placement_graph

        variant.without_forward_only = without_forward_only
    return variant
