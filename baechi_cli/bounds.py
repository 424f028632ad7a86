"""Lower bounds on the step time any placement can reach: what every plan's gap is measured against.

Three bounds, each valid for every placement the evaluator can judge:

* the critical path: the longest chain of compute with communication free
  (each op at its fastest device kind);
* the work bound: total compute over the device count (each op at its
  fastest kind), since a device runs one op at a time;
* CP-SAT's proven bound (:mod:`baechi_cli.placers.exact`) when auto ran the
  exact solver on the op graph itself with no memory constraint (a bound on
  a fused graph, or one with memory constraints, only bounds the plans that
  keep its nodes whole or meet its constraints, so it is reported but not
  counted).

The best is the largest. A plan's gap is ``step / best - 1``; a gap of 0 is
a proven optimum.

Complexity: O(V + E) for the first two.

Example:
    >>> from baechi_cli.graph import GraphBuilder
    >>> from baechi_cli.devices import parse_devices
    >>> b = GraphBuilder()
    >>> a = b.add_op("a", "A", [8], compute_us=10)
    >>> c = b.add_op("c", "C", [], compute_us=30)
    >>> d = b.add_op("d", "D", [], compute_us=20)
    >>> _ = b.add_edge(a, c); _ = b.add_edge(a, d)
    >>> lb = lower_bounds(b.build(), parse_devices("2x1GB"))
    >>> lb.critical_path_us, lb.work_us, lb.best_us, lb.best_source
    (40.0, 30.0, 40.0, 'critical path')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baechi_cli.devices import DeviceSpec
from baechi_cli.graph import OpGraph


@dataclass
class LowerBounds:
    """The lower bounds known for one model on one device set (µs)."""

    critical_path_us: float
    work_us: float
    exact_us: float | None = None  # CP-SAT's bound, when it bounds every plan
    # CP-SAT's bound on a fused graph or under memory constraints: reported, not counted.
    exact_restricted_us: float | None = None
    exact_scope: str | None = None  # what the exact bound was proven on

    @property
    def best_us(self) -> float:
        return max(self.critical_path_us, self.work_us, self.exact_us or 0.0)

    @property
    def best_source(self) -> str:
        """Which bound is the best: ``critical path``, ``work / devices`` or ``exact``."""
        if self.exact_us is not None and self.exact_us > max(self.critical_path_us, self.work_us):
            return "exact"
        return "critical path" if self.critical_path_us >= self.work_us else "work / devices"

    def gap(self, step_us: float) -> float | None:
        """``step / best - 1`` (None when the bound is 0: an empty graph)."""
        best = self.best_us
        return step_us / best - 1 if best > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {
            "best_us": self.best_us,
            "best": self.best_source,
            "critical_path_us": self.critical_path_us,
            "work_per_device_us": self.work_us,
            "exact_us": self.exact_us,
            "exact_restricted_us": self.exact_restricted_us,
            "exact_scope": self.exact_scope,
        }


def fastest_durations(graph: OpGraph, devices: DeviceSpec) -> list[float]:
    """Each op's compute time on the fastest device kind of ``devices``. O(V x kinds)."""
    kinds = sorted({d.kind for d in devices.devices})
    columns = [graph.durations(k) for k in kinds]
    if len(columns) == 1:
        return columns[0]
    return [min(c[v] for c in columns) for v in range(graph.num_ops)]


def lower_bounds(graph: OpGraph, devices: DeviceSpec) -> LowerBounds:
    """The critical path and work bounds of ``graph`` on ``devices`` (module docstring). O(V + E)."""
    fastest = fastest_durations(graph, devices)
    finish = [0.0] * graph.num_ops
    src = graph.edge_src
    for v in graph.topo_order():
        ready = 0.0
        for e in graph.in_edges[v]:
            t = finish[src[e]]
            if t > ready:
                ready = t
        finish[v] = ready + fastest[v]
    return LowerBounds(max(finish, default=0.0), sum(fastest) / devices.count)
