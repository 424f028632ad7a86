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


@dataclass
class Placement:
    """Which device each op runs on, and optionally the order the placer planned."""

    device_of: list[int]
    order: list[list[int]] | None = None  # per-device op order; None: the simulator decides
    info: dict[str, Any] = field(default_factory=dict)  # placer-specific facts for the report


PlacerFn = Callable[[OpGraph, DeviceSpec, dict[str, Any]], Placement]


def _registry() -> dict[str, tuple[PlacerFn, str]]:
    from baechi_cli.placers import single, topo

    return {
        "topo": (
            topo.place,
            "m-TOPO: topological order, devices filled in turn up to an equal share of compute",
        ),
        "single": (single.place, "everything on one device (the largest that fits)"),
    }


PLACER_NAMES = ("topo", "single")


def get_placer(name: str) -> PlacerFn:
    """The placer called ``name``; KeyError for an unknown name."""
    return _registry()[name][0]


def describe_placers() -> dict[str, str]:
    """Name -> one-line description, for help texts."""
    return {name: desc for name, (_, desc) in _registry().items()}
