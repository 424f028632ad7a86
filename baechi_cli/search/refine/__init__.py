"""Local-search refinement of a placement, judged by the simulator.

Placeto's idea (move ops, ask a simulator whether the step got faster) as a deterministic hill
climb that takes seconds, not hours of reinforcement learning: :func:`refine` (contract in
:mod:`.climb`). The search moves *units*, the colocation groups (:mod:`.units`), alone or in
clusters: name-scope clusters and pipeline splits (:mod:`.clusters`); it finds moves from those
and from the critical path of the current schedule and estimates their gain (:mod:`.moves`);
candidates are timed by the evaluator's engine without memory, memory checked only before a move
is taken (:mod:`.judge`); the climb (:mod:`.climb`) ranks the moves, takes the first improvement,
kicks at local optima and keeps the best placement seen. Imports run units <- clusters <- moves
<- climb, and judge <- climb.
"""

from baechi_cli.search.refine.climb import (
    LEVELS,
    SETUP_EVALUATIONS,
    Climb,
    Refined,
    evaluation_cost,
    refine,
)
from baechi_cli.search.refine.clusters import scope_keys

__all__ = ["LEVELS", "SETUP_EVALUATIONS", "Climb", "Refined", "evaluation_cost", "refine", "scope_keys"]
