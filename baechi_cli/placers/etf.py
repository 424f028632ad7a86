"""m-ETF: earliest task first (Hwang et al. 1989) with Baechi's memory filter.

Repeatedly commits the (ready op, device) pair with the earliest possible
start, counting communication (and, in ``sequential`` mode, busy channels and
cached copies), among the devices where the op fits at that time, its memory
counted along the schedule (:mod:`baechi_cli.placers.liveness`); the first op
of a group places the whole group (co-adjusted colocation). Ties go
to the op's topological index, then the lower device index.

Complexity and data structures: see :mod:`baechi_cli.placers.listsched`.

Example:
    >>> from baechi_cli.core.graph import GraphBuilder
    >>> from baechi_cli.core.devices import parse_devices
    >>> b = GraphBuilder()
    >>> a = b.add_op("a", "A", [8], compute_us=100)
    >>> x = b.add_op("x", "X", [8], compute_us=100)
    >>> y = b.add_op("y", "Y", [8], compute_us=1000)
    >>> z = b.add_op("z", "Z", [8], compute_us=1000)
    >>> _ = [b.add_edge(a, v) for v in (x, y, z)]
    >>> place(b.build(), parse_devices("2x1GB"), NoOptions()).device_of   # z is worth the 134 µs transfer
    [0, 0, 0, 1]
"""

from __future__ import annotations

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.graph import OpGraph
from baechi_cli.evaluator.placement import Placement
from baechi_cli.placers import NoOptions
from baechi_cli.placers.listsched import list_schedule
from baechi_cli.placers.memory import place_in_memory


def place(graph: OpGraph, devices: DeviceSpec, options: NoOptions) -> Placement:
    """Place ``graph`` with m-ETF; raises InfeasibleError when no placement it finds fits memory."""
    return place_in_memory(
        graph, devices, "m-ETF", lambda budget: list_schedule(graph, devices, "m-ETF", budget=budget)
    )
