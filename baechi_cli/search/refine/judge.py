"""How a refinement judges placements: fast evaluations, memory checks, and what they cost.

:class:`Judge` times a placement of the ops by :meth:`baechi_cli.evaluator.sim.StepTimer.step_time`
(the evaluator's engine without memory), or by :meth:`~baechi_cli.evaluator.sim.StepTimer.timing`
when the run is worth keeping (``keep``): the run of a move likely taken serves its memory check
and the next pass's critical path without a second run. Memory is checked only for a placement
about to be taken: surely within by the ledger's O(V + E) upper bound, else by the evaluator
(its timeline and memory from the run kept).

It counts what the budget is spent on: :attr:`Judge.evaluations` (fast evaluations; a critical
path asked for counts one even when its run was kept, so the budget never reads which; a memory
check by the evaluator counts :data:`MEMORY_CHECK_COST`), and the evaluator's full runs.

Complexity: each timing O((V + E) log V); the memory bound O(V + E).
"""

from __future__ import annotations

import math

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.graph import OpGraph
from baechi_cli.evaluator.evaluate import Evaluation, device_order, evaluate, judged
from baechi_cli.evaluator.placement import Placement
from baechi_cli.evaluator.sim import StepTimer, Timing
from baechi_cli.placers.memory import ample, safe_peaks

# What a memory check (a full evaluation) is charged, in evaluations.
MEMORY_CHECK_COST = 3


class Judge:
    """Times and checks placements of ``graph`` on ``devices`` with ``timer``, counting the cost.

    A placement is ``device_of`` (per op) and ``sequence`` (a global order, or None for the
    evaluator's dispatch rule); runs are kept by the identity of these two objects, which
    the caller replaces rather than edits.
    """

    def __init__(self, graph: OpGraph, devices: DeviceSpec, timer: StepTimer) -> None:
        self.graph = graph
        self.devices = devices
        self.ndev = devices.count
        self.timer = timer
        self.evaluations = 0
        self.full_evaluations = 0
        self.memory_checks = 0
        self.memory_free = ample(graph, devices)
        self.limits = [d.memory_bytes for d in devices.devices]
        # The last memory check: the order it ran under and the evaluator's judgement, and
        # (placement, order, timing) of the last run kept.
        self.checked: tuple[list[int] | None, Evaluation] | None = None
        self.traced: tuple[list[int], list[int] | None, Timing] | None = None

    def evaluate(self, placement: Placement) -> Evaluation:
        """The evaluator's full judgement of ``placement`` (a full evaluation)."""
        self.full_evaluations += 1
        return evaluate(self.graph, self.devices, placement, timer=self.timer)

    def last_checked(self, device_of: list[int], sequence: list[int] | None) -> Evaluation | None:
        """The evaluator's judgement of this placement when it was the last one whose memory was
        checked (``sequence`` the very object), else None."""
        checked = self.checked
        if checked is not None and checked[0] is sequence and checked[1].timeline.device_of == device_of:
            return checked[1]
        return None

    def keep(self, device_of: list[int], sequence: list[int] | None, timing: Timing) -> None:
        """Keep ``timing`` as the run of this placement (these very objects)."""
        self.traced = (device_of, sequence, timing)

    def time(self, device_of: list[int], sequence: list[int] | None, keep: bool) -> float:
        """One fast evaluation's step time (inf when ``sequence`` deadlocks); ``keep``: its run
        is kept for the memory check and the critical path of the placement, should it be taken."""
        self.evaluations += 1
        order = None if sequence is None else device_order(sequence, device_of, self.ndev)
        try:
            if not keep:
                return self.timer.step_time(device_of, order)
            trace = self.timer.timing(device_of, order)
        except ValueError:  # a start sequence that is not topological deadlocks on some placements
            return math.inf
        self.traced = (device_of, sequence, trace)
        return trace.step_time_us

    def _run_of(self, device_of: list[int], sequence: list[int] | None) -> Timing:
        """The run of this placement (these very objects): the one kept, else a new one."""
        traced = self.traced
        if traced is not None and traced[0] is device_of and traced[1] is sequence:
            return traced[2]
        order = None if sequence is None else device_order(sequence, device_of, self.ndev)
        trace = self.timer.timing(device_of, order)
        self.traced = (device_of, sequence, trace)
        return trace

    def trace(self, device_of: list[int], sequence: list[int] | None) -> Timing:
        """The run of this placement, for its critical path: one evaluation, kept or not."""
        self.evaluations += 1  # counted even when kept, so that the budget never reads which
        return self._run_of(device_of, sequence)

    def fits(self, device_of: list[int], sequence: list[int] | None) -> bool:
        """Within memory: surely by an O(V + E) upper bound, else as the simulator counts it."""
        if self.memory_free or self._bound_fits(device_of):
            return True
        self.memory_checks += 1
        # The evaluator's run, timeline and memory (what evaluate() does); the run is the
        # one that timed the move, when it did.
        self.evaluations += MEMORY_CHECK_COST
        self.full_evaluations += 1
        timeline = self.timer.result(device_of, self._run_of(device_of, sequence))
        self.checked = (sequence, judged(timeline))
        return timeline.feasible

    def _bound_fits(self, device_of: list[int]) -> bool:
        """Within memory by the ledger's count, which bounds the simulator's peak whatever the schedule."""
        return all(p <= m for p, m in zip(safe_peaks(self.graph, device_of, self.ndev), self.limits))
