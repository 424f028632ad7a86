"""A placement: which device each op runs on, and the order its placer planned.

The evaluator judges a :class:`Placement`; every placer returns one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from baechi_cli.evaluator.sim import ListSchedule, SimResult


@dataclass
class Placement:
    """Which device each node runs on, and the order the placer planned (if it planned one)."""

    device_of: list[int]
    # Every node in the order the placer committed it (a topological order); the
    # evaluator runs each device's nodes in this order. None: the evaluator's
    # dispatch rule orders them (earliest ready first).
    sequence: list[int] | None = None
    # The placer's own list schedule, for tests that compare its prediction with
    # the evaluator's judgement; never used to judge the placement.
    schedule: ListSchedule | None = field(default=None, repr=False)
    info: dict[str, Any] = field(default_factory=dict)  # placer-specific facts for the report

    @property
    def predicted(self) -> SimResult | None:
        """The timeline the placer itself planned (None when it planned none)."""
        return None if self.schedule is None else self.schedule.result()
