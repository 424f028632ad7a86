"""m-SCT: small communication times (Hanen & Munier 2001) with Baechi's memory filter.

1. Solve the favorite-child LP (:mod:`baechi_cli.placers.sct_lp`) with
   OR-Tools and round it: edge ``u -> v`` is favorite when ``x_uv`` is below
   the threshold (``--sct-threshold``, default 0.5: below 1/2 the LP's degree
   constraints allow at most one favorite child per op and one favorite
   parent per op, which is what Hanen & Munier's rounding and its
   approximation bound use).
2. List-schedule like m-ETF (same engine, same memory by liveness and
   co-adjusted colocation) with the favorite-child rule, twice, keeping the
   schedule the evaluator judges faster (of those within memory):

   * favorites break ties: when a favorite child can start equally early on
     several devices, it goes to its favorite parent's device, so it runs
     there whenever that is where it can start first;
   * favorites first (Hanen & Munier's reading): among ops that can start at
     the same time on a device, a favorite child on its parent's device goes
     before the others.

   Neither wins everywhere (favorites-first can delay critical ops;
   bench/history/placement.md), so both run; the second costs one more list
   schedule, next to the LP's solve.

A failed or timed-out LP is a :class:`~baechi_cli.core.errors.SolverError`, never
a silent fallback to m-ETF. The report gets the solver's backend, status,
objective (the LP makespan, a relaxation of the schedule) and seconds.

Complexity: the LP solve (see bench/lp_backends.md) plus m-ETF's engine.
"""

from __future__ import annotations

import time

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.graph import OpGraph
from baechi_cli.evaluator.evaluate import evaluate
from baechi_cli.evaluator.placement import Placement
from baechi_cli.evaluator.sim import StepTimer
from baechi_cli.placers import SCTOptions
from baechi_cli.placers.listsched import list_schedule
from baechi_cli.placers.memory import place_in_memory
from baechi_cli.placers.sct_lp import favorite_children, solve_favorite_lp


def place(graph: OpGraph, devices: DeviceSpec, options: SCTOptions) -> Placement:
    """Place ``graph`` with m-SCT (``options``: the LP's time limit and the rounding threshold)."""
    threshold = options.sct_threshold
    lp = solve_favorite_lp(
        graph, devices, time_limit_s=options.solver_time_limit, work_limit_s=options.lp_work_limit
    )
    favorite = favorite_children(lp, threshold)
    favorite_parent = [-1] * graph.num_ops
    for u, child in enumerate(favorite):
        if child >= 0:
            favorite_parent[child] = u

    def preference(v: int, d: int, device_of: list[int]) -> int:
        parent = favorite_parent[v]
        return 0 if parent >= 0 and device_of[parent] == d else 1

    timer = StepTimer(graph, devices)  # one engine judges both readings, every try

    def better_reading(budget: list[int] | None) -> Placement:
        """Both readings of the rule from the same LP; the one the evaluator judges faster (fitting first)."""
        schedules = [
            list_schedule(graph, devices, "m-SCT", preference, preference_first=first, budget=budget)
            for first in (False, True)
        ]
        judged = [evaluate(graph, devices, p, timer=timer) for p in schedules]
        best = min(range(2), key=lambda i: (not judged[i].feasible, judged[i].value_us, i))
        schedules[best].info["rule"] = "favorites first" if best == 1 else "favorites break ties"
        return schedules[best]

    t0 = time.perf_counter()
    placement = place_in_memory(graph, devices, "m-SCT", better_reading)
    placement.info |= {
        "schedule_seconds": round(time.perf_counter() - t0, 6),
        "solver": {
            "backend": lp.backend,
            "status": lp.status,
            "objective_us": lp.objective_us,
            "seconds": round(lp.seconds, 6),
            "build_seconds": round(lp.build_seconds, 6),
            "variables": lp.num_variables,
            "constraints": lp.num_constraints,
        },
        "threshold": threshold,
        "favorite_edges": sum(1 for c in favorite if c >= 0),
    }
    return placement
