"""Placers: ``place(graph, devices, options) -> Placement``, found by name in :data:`PLACERS`.

Every placer honours colocation groups (``graph.group``): the whole group
goes where its first op goes, on a device where the group's memory fits
(co-adjusted placement). Every placer never exceeds device memory as counted
by :class:`~baechi_cli.placers.memory.MemoryLedger`, an upper bound of the
simulator's peak, and raises :class:`~baechi_cli.errors.InfeasibleError`
saying how much memory is needed and how much the devices give when it
cannot place the graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from baechi_cli.devices import DeviceSpec
from baechi_cli.graph import OpGraph
from baechi_cli.sim import ListSchedule, SimResult


@dataclass
class Placement:
    """Which device each op runs on, and optionally the order the placer planned."""

    device_of: list[int]
    # The placer's list schedule (every op, in commit order), replayed by
    # simulate(..., sequence=...); None: the simulator decides the order.
    sequence: list[int] | None = None
    # The placer's own schedule (placers that schedule): ``predicted`` turns it
    # into a timeline on demand, outside the timed placement.
    schedule: ListSchedule | None = field(default=None, repr=False)

    @property
    def predicted(self) -> SimResult | None:
        """The timeline the placer itself predicts; the pipeline checks it against the simulator."""
        return None if self.schedule is None else self.schedule.result()

    info: dict[str, Any] = field(default_factory=dict)  # placer-specific facts for the report


PlacerFn = Callable[[OpGraph, DeviceSpec, dict[str, Any]], Placement]


# name -> (module whose ``place`` implements it, one-line description). Modules
# are imported on first use so `baechi --help` stays fast.
PLACERS: dict[str, tuple[str, str]] = {
    "topo": (
        "baechi_cli.placers.topo",
        "m-TOPO: topological order, devices filled in turn up to an equal share of compute",
    ),
    "etf": (
        "baechi_cli.placers.etf",
        "m-ETF: earliest task first with memory filter and co-adjusted colocation",
    ),
    "sct": (
        "baechi_cli.placers.sct",
        "m-SCT: favorite-child LP (OR-Tools) rounded, then list scheduling that keeps favorites together",
    ),
    "single": ("baechi_cli.placers.single", "everything on one device (the largest)"),
}
PLACER_NAMES = tuple(PLACERS)


def get_placer(name: str) -> PlacerFn:
    """The placer called ``name``; KeyError for an unknown name."""
    import importlib

    return importlib.import_module(PLACERS[name][0]).place
