"""The evaluator: one judge for every placement, whichever placer made it.

``evaluate(graph, devices, placement, objective)`` runs the simulator
(:func:`baechi_cli.evaluator.sim.simulate`, one engine with one semantics, docs/DESIGN.md
"The evaluator") on the placement and scores it by the objective.
Placers may plan with the simulator's list-schedule API
(:class:`baechi_cli.evaluator.sim.ListSchedule`), but their plan is only a proposal:
the device of every op and, when the placer planned one, the order of the ops
on each device. Start times, transfers, channel contention and memory peaks
are always the evaluator's, so candidates of different placers (and of
different options) are ranked by the same rules. This is the split between
XLA auto-sharding's solver and its ``Evaluate``.

Objectives: ``makespan`` (one training step's time, the end of the last op
or transfer). The objective is a parameter so that others (pipelined
throughput) score the same timeline their own way.

Complexity: that of :func:`~baechi_cli.evaluator.sim.simulate`, O((V + E) log V).

Example:
    >>> from baechi_cli.core.graph import GraphBuilder
    >>> from baechi_cli.core.devices import parse_devices
    >>> from baechi_cli.evaluator.placement import Placement
    >>> b = GraphBuilder()
    >>> a = b.add_op("a", "A", [1000], compute_us=10)
    >>> c = b.add_op("c", "C", [], compute_us=5)
    >>> _ = b.add_edge(a, c)
    >>> e = evaluate(b.build(), parse_devices("2x1GB"), Placement([0, 1]))
    >>> e.objective, round(e.value_us, 3), e.feasible
    ('makespan', 149.175, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from baechi_cli.core import objectives
from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.graph import OpGraph
from baechi_cli.evaluator.placement import Placement
from baechi_cli.evaluator.sim import SimResult, StepTimer, check_placement, simulate


@dataclass
class Evaluation:
    """A placement judged: its objective value and the timeline it came from."""

    objective: str
    value_us: float  # what the objective minimises, in µs (makespan: the step time)
    timeline: SimResult

    @property
    def feasible(self) -> bool:
        """Every device's simulated peak fits its memory."""
        return self.timeline.feasible


def device_order(sequence: Sequence[int], device_of: Sequence[int], ndev: int) -> list[list[int]]:
    """Split a global op sequence into each device's order. O(V)."""
    order: list[list[int]] = [[] for _ in range(ndev)]
    for v in sequence:
        order[device_of[v]].append(v)
    return order


def evaluate(
    graph: OpGraph,
    devices: DeviceSpec,
    placement: Placement,
    objective: str = "makespan",
    timer: StepTimer | None = None,
) -> Evaluation:
    """Judge ``placement`` of ``graph``'s ops (module docstring); ValueError for a malformed one.

    The placement must cover every op of ``graph``; its ``sequence``, when
    given, must list every op once in an order that respects the graph's
    dependencies. ``timer``: a :class:`~baechi_cli.evaluator.sim.StepTimer` of this
    graph and these devices, for a caller judging many placements (it saves
    building one per call: a twentieth of a second at 27k ops).
    """
    if timer is not None:
        timer.check_serves(graph, devices)
    known = objectives.REGISTRY.get(objective)
    if known is None or known.placer is not None:  # the others are scored by their placer's own model
        scored = [o.name for o in objectives.REGISTRY.values() if o.placer is None]
        raise ValueError(f"the evaluator scores {', '.join(scored)}, not {objective!r}")
    order = None
    if placement.sequence is not None:
        if len(placement.sequence) != graph.num_ops:
            raise ValueError(f"sequence lists {len(placement.sequence)} ops, graph has {graph.num_ops}")
        # device_order indexes by device: a bad device_of is a ValueError here, not an IndexError
        check_placement(graph, devices, placement.device_of)
        order = device_order(placement.sequence, placement.device_of, devices.count)
    if timer is None:
        timeline = simulate(graph, devices, placement.device_of, order)
    else:
        timeline = timer.simulate(placement.device_of, order)
    return judged(timeline, objective)


def judged(timeline: SimResult, objective: str = "makespan") -> Evaluation:
    """A timeline the evaluator ran, scored by ``objective`` (for callers that ran it themselves)."""
    return Evaluation(objective, timeline.step_time_us, timeline)
