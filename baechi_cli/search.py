"""``--algo auto``: search the placers and the passes' options, then refine the best plan.

auto never trusts one setting. It runs, cheapest first:

1. every placer auto uses (:func:`baechi_cli.placers.auto_candidates`) under
   the options given: one device, m-ETF, m-SCT (up to its node limit),
   m-TOPO. These always run, whatever the budget;
2. the same placers under the other settings of the passes
   (:data:`SEARCH_SPACE`): forward-only placement flipped, co-placement off
   or with bigger groups, fusion off, and their combinations. A setting
   whose placement graph equals one already tried is listed, not rerun. An
   option the user pinned (``--no-fusion``, ``--forward-only``, ...) is
   not varied;
3. local search from the best plan (:func:`baechi_cli.refine.refine`),
   judged move by move by the simulator;
4. on a placement graph small enough, CP-SAT (:mod:`baechi_cli.placers.exact`),
   which returns an optimal plan or the best it found with a proven bound.

Every plan is expanded onto the ops and judged by the one evaluator, and the
fastest one that fits wins (the earlier one on ties). Stages 2-4 run within
``--budget`` seconds. The budget is spent by a fixed cost model of each step
(seconds per node and edge, :func:`estimate_seconds`), not by the clock, so
the same input and budget give the same plan on any machine and at any load;
the report gives the real seconds.

Complexity: that of the placers and the evaluator, times the settings tried.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from baechi_cli import placers
from baechi_cli.pipeline import (
    COPLACE_GROUPS_PER_DEVICE,
    Candidate,
    PassOptions,
    PlaceOptions,
    Prepared,
    Variant,
    run_candidate,
)
from baechi_cli.placers import PlacerSpec

# Co-placement's bound as auto varies it: the default, off, and groups 8x bigger
# (chains merge further, so a placer sees fewer, larger groups).
COPLACE_SETTINGS = (COPLACE_GROUPS_PER_DEVICE, None, COPLACE_GROUPS_PER_DEVICE // 8)

# Seconds per unit of work, fitted on the 2-core CI machine (bench/search.md
# lists estimate and real time side by side). Evaluating a plan: per op and
# edge of the op graph. A list-scheduling placer: per node and edge it sees.
# The passes: per op and edge. m-SCT's LP grows faster than linearly.
EVALUATE_S_PER_ELEMENT = 6e-6
LIST_SCHEDULE_S_PER_ELEMENT = 1.5e-5
PASSES_S_PER_ELEMENT = 1.2e-5
SCT_LP_S_PER_NODE_POWER = (4e-7, 1.8)  # seconds = a * nodes ** b

# The default budget: one second up to 5,000 placement nodes, then linear in size.
DEFAULT_BUDGET_S = 1.0
DEFAULT_BUDGET_NODES = 5000


def default_budget(nodes: int) -> float:
    """Seconds auto searches beyond its first candidates when ``--budget`` is not given."""
    return DEFAULT_BUDGET_S * max(1.0, nodes / DEFAULT_BUDGET_NODES)


def estimate_seconds(spec: PlacerSpec, prepared: Prepared, variant: Variant) -> float:
    """The cost model's seconds for one candidate: the placer on ``variant``'s graph plus one evaluation."""
    g, pg = prepared.graph, variant.placement_graph
    seconds = EVALUATE_S_PER_ELEMENT * (g.num_ops + g.num_edges)
    if spec.name == "single":
        return seconds
    seconds += LIST_SCHEDULE_S_PER_ELEMENT * (pg.num_ops + pg.num_edges)
    if spec.name == "sct":
        a, b = SCT_LP_S_PER_NODE_POWER
        seconds += a * pg.num_ops**b
    return seconds


def passes_seconds(prepared: Prepared) -> float:
    """The cost model's seconds for running the passes under one more setting."""
    g = prepared.graph
    return PASSES_S_PER_ELEMENT * (g.num_ops + g.num_edges)


@dataclass
class Search:
    """What auto did: its candidates in the order it made them, and its budget."""

    candidates: list[Candidate]
    budget_s: float
    spent_s: float  # by the cost model
    settings_tried: int
    settings_skipped: int
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "budget_s": self.budget_s,
            "estimated_s": round(self.spent_s, 6),
            "settings_tried": self.settings_tried,
            "settings_skipped": self.settings_skipped,
        }


def settings(prepared: Prepared, options: PlaceOptions) -> list[PassOptions]:
    """The passes' settings auto tries, the given one first, then by how many options differ.

    An option the user set (not None) stays as set; forward-only placement is
    only varied on a graph with backward ops.
    """
    given = prepared.variant.options
    forward = [given.forward_only]
    if options.forward_only is None and any(prepared.graph.is_backward):
        forward.append(not given.forward_only)
    coplace = [given.coplace] if options.coplace is not None else list(COPLACE_SETTINGS)
    fusion = [given.fusion] if options.fusion is not None else [given.fusion, not given.fusion]
    space = [PassOptions(f, c, u) for f in forward for c in coplace for u in fusion]

    def distance(s: PassOptions) -> tuple[int, int]:
        differs = (
            (s.forward_only != given.forward_only) + (s.coplace != given.coplace) + (s.fusion != given.fusion)
        )
        return differs, space.index(s)

    return sorted(space, key=distance)


def auto_search(prepared: Prepared, options: PlaceOptions) -> Search:
    """``--algo auto`` on a prepared model (module docstring); every candidate, in the order made."""
    nodes = prepared.placement_graph.num_ops
    budget = options.budget if options.budget is not None else default_budget(nodes)
    candidates: list[Candidate] = []
    spent = 0.0
    seen: dict[int, PassOptions] = {}
    tried = skipped_settings = 0
    for i, setting in enumerate(settings(prepared, options)):
        first = i == 0
        if not first:
            spent += passes_seconds(prepared)
            if spent > budget:
                break
        variant = prepared.variant_for(setting)
        same = seen.get(variant.fingerprint)
        if same is not None:
            skipped_settings += 1
            continue
        seen[variant.fingerprint] = setting
        tried += 1
        for spec, too_big in placers.auto_candidates(variant.placement_graph.num_ops):
            if not first and spec.name == "single":
                continue  # one device's plan does not depend on the passes
            if too_big:
                if first:
                    candidates.append(Candidate(spec.name, 0.0, skipped=skip_reason(spec, nodes)))
                continue
            cost = estimate_seconds(spec, prepared, variant)
            if not first and spent + cost > budget:
                continue
            spent += cost
            candidate = run_candidate(prepared, spec, options, variant)
            if spec.name == "single":
                candidate.variant = None
            else:
                candidate.differences = setting.differences(prepared.variant.options)
            candidates.append(candidate)
    return Search(candidates, budget, spent, tried, skipped_settings)


def skip_reason(spec: PlacerSpec, nodes: int) -> str:
    """Why auto did not run ``spec`` on a graph of ``nodes`` nodes."""
    return (
        f"skipped by auto: {spec.title} over {nodes} nodes: {spec.auto_skip_reason} "
        f"(auto runs it up to {spec.auto_max_nodes} nodes); use --algo {spec.name}"
    )
