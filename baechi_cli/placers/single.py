"""Single device: every op on the device with the most memory (the lowest index on ties).

The baseline every split must beat. Whether the model actually fits is judged
by the simulator's peak, like every other placement.
"""

from __future__ import annotations

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.graph import OpGraph
from baechi_cli.evaluator.placement import Placement
from baechi_cli.placers import NoOptions


def largest_device(devices: DeviceSpec) -> int:
    memory = [d.memory_bytes for d in devices.devices]
    return memory.index(max(memory))


def place(graph: OpGraph, devices: DeviceSpec, options: NoOptions) -> Placement:
    return Placement([largest_device(devices)] * graph.num_ops)
