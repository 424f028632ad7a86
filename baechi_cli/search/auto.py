"""``--algo auto``: search the placers and the passes' options, then refine the best plan.

auto never trusts one setting. It runs, cheapest first:

1. every placer auto uses (:func:`baechi_cli.placers.auto_candidates`) under
   the options given: one device, m-ETF, m-SCT (up to its node limit),
   m-TOPO. These always run, whatever the budget, but m-SCT's LP gets no
   more simplex iterations than the budget buys by its cost model
   (:func:`baechi_cli.placers.sct_lp.iteration_limit`): on a graph whose
   LP needs more, m-SCT is listed as stopped, and the budget is not
   overrun by seconds. m-SCT runs in a second thread beside the others
   (:func:`run_candidates`), so its LP solves while they place;
2. the same placers under the other settings of the passes
   (:data:`SEARCH_SPACE`): forward-only placement flipped, co-placement off
   or with bigger groups, fusion off, and their combinations. A setting
   whose placement graph equals one already tried is listed, not rerun. An
   option the user pinned (``--no-fusion``, ``--forward-only``, ...) is
   not varied;
3. on a placement graph small enough, CP-SAT (:mod:`baechi_cli.placers.exact`),
   which returns an optimal plan or the best it found with a proven bound;
4. local search (:func:`baechi_cli.search.refine.refine`), judged move by move by
   the simulator, with what is left of the budget after its setup
   (:data:`baechi_cli.search.refine.SETUP_EVALUATIONS`): from the best plan, and,
   each time a climb reaches a local optimum with budget left, from the next
   distinct plan instead of kicking (:data:`REFINE_STARTS` plans at most;
   the last kicks on), so a bigger budget goes to other starts rather
   than only to kicks around the first. A bigger budget can still give a
   slower plan, where another setting of the passes gives a better start
   whose climb reaches no local optimum within the budget.

Every plan is expanded onto the ops and judged by the one evaluator, and the
fastest one that fits wins (the earlier one on ties). Stages 2-4 run within
``--budget`` seconds. The budget is spent by a fixed cost model of each step
(seconds per node and edge, :func:`estimate_seconds`), not by the clock, so
the same input and budget give the same plan on any machine and at any load;
the report gives the real seconds.

Complexity: that of the placers and the evaluator, times the settings tried.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from baechi_cli import placers
from baechi_cli.core.errors import InfeasibleError, SolverError
from baechi_cli.core.graph import OpGraph
from baechi_cli.evaluator.placement import Placement
from baechi_cli.passes.manager import COPLACE_GROUPS_PER_DEVICE, PassOptions, Variant
from baechi_cli.placers import PlacerSpec
from baechi_cli.search.candidates import (
    Candidate,
    PlaceOptions,
    Prepared,
    expand,
    fastest,
    run_candidate,
)

# Co-placement's bound as auto varies it: the default, off, and groups 8x bigger
# (chains merge further, so a placer sees fewer, larger groups).
COPLACE_SETTINGS = (COPLACE_GROUPS_PER_DEVICE, None, COPLACE_GROUPS_PER_DEVICE // 8)

# Seconds per unit of work, fitted on the 2-core CI machine (bench/search.md
# lists estimate and real time side by side). Evaluating a plan: per op and
# edge of the op graph. A list-scheduling placer: per node and edge it sees.
# The passes: per op and edge. m-SCT's LP grows faster than linearly.
EVALUATE_S_PER_ELEMENT = 3.5e-6
LIST_SCHEDULE_S_PER_ELEMENT = 1.5e-5
PASSES_S_PER_ELEMENT = 8e-6
SCT_LP_S_PER_NODE_POWER = (1.6e-7, 1.8)  # seconds = a * nodes ** b

# Share of the budget other settings of the passes may take; refinement gets the rest.
SETTINGS_SHARE = 0.5
# Distinct plans refinement may start from, in turn, each after the one before stopped at a local
# optimum with budget left (refine_stage).
REFINE_STARTS = 3
# auto runs the exact solver on a graph of at most this many nodes (the op graph
# itself, else the chosen plan's placement graph), for at most EXACT_SECONDS of
# CP-SAT's deterministic time: small graphs are where it proves optima quickly.
EXACT_AUTO_NODES = 40
EXACT_SECONDS = 10.0

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

    # sorted() is stable: among settings as far from the given one, the order above holds.
    return sorted(space, key=lambda s: sum(a != b for a, b in zip(s, given)))


def auto_search(prepared: Prepared, options: PlaceOptions) -> Search:
    """``--algo auto`` on a prepared model (module docstring); every candidate, in the order made."""
    nodes = prepared.placement_graph.num_ops
    budget = options.budget if options.budget is not None else default_budget(nodes)
    candidates: list[Candidate] = []
    spent = 0.0
    seen: set[int] = set()  # fingerprints of the placement graphs placed on
    tried = skipped_settings = 0
    for i, setting in enumerate(settings(prepared, options)):
        first = i == 0
        if not first:
            if spent + passes_seconds(prepared) > budget * SETTINGS_SHARE:
                break
            spent += passes_seconds(prepared)
        variant = prepared.variant_for(setting)
        if variant.fingerprint in seen:
            skipped_settings += 1
            continue
        seen.add(variant.fingerprint)
        tried += 1
        runs: list[Candidate | tuple[PlacerSpec, Any]] = []  # a skipped candidate, or what to run
        for spec, too_big in placers.auto_candidates(variant.placement_graph.num_ops):
            if not first and spec.name == "single":
                continue  # one device's plan does not depend on the passes
            if too_big:
                if first:
                    runs.append(Candidate(spec.name, 0.0, skipped=skip_reason(spec, nodes)))
                continue
            if not first:  # the options given always run: only the search is charged to the budget
                cost = estimate_seconds(spec, prepared, variant)
                if spent + cost > budget * SETTINGS_SHARE:
                    continue
                spent += cost
            placer_options = options.placer_options(spec)
            if spec.name == "sct":  # its LP may take the budget's worth of work, counted, not timed
                placer_options = replace(placer_options, lp_work_limit=budget)
            runs.append((spec, placer_options))
        for candidate in run_candidates(prepared, options, variant, runs):
            if candidate.skipped is None:
                if candidate.algorithm == "single":
                    candidate.variant = None
                else:
                    candidate.differences = setting.differences(prepared.variant.options)
            candidates.append(candidate)
    search = Search(candidates, budget, spent, tried, skipped_settings)
    exact_stage(prepared, search)
    refine_stage(prepared, options, search)
    return search


def run_candidates(
    prepared: Prepared,
    options: PlaceOptions,
    variant: Variant,
    runs: list[Candidate | tuple[PlacerSpec, Any]],
) -> list[Candidate]:
    """:func:`~baechi_cli.app.place.run_candidate` of each (spec, placer options) in ``runs``, in order
    (a Candidate there is passed through).

    A placer with :attr:`~baechi_cli.placers.PlacerSpec.native_solver` runs in a second
    thread while the main thread runs the others: its solver lets go of the GIL, so on
    two cores it solves beside them, off the critical path. Each candidate is a function
    of its inputs alone, so the candidates, and auto's plan, do not depend on how the
    threads interleave; only the seconds each candidate reports include its waits for the
    other thread.
    """
    native = [i for i, run in enumerate(runs) if isinstance(run, tuple) and run[0].native_solver]
    out: list[Candidate | None] = [run if isinstance(run, Candidate) else None for run in runs]
    with ThreadPoolExecutor(max_workers=1) as pool:
        futures = {}
        for i in native:
            spec, placer_options = runs[i]  # type: ignore[misc]
            futures[i] = pool.submit(run_candidate, prepared, spec, options, variant, placer_options)
        for i, run in enumerate(runs):
            if out[i] is None and i not in futures:
                spec, placer_options = run  # type: ignore[misc]
                out[i] = run_candidate(prepared, spec, options, variant, placer_options)
        for i, future in futures.items():
            out[i] = future.result()
    return out  # type: ignore[return-value]


def refine_stage(prepared: Prepared, options: PlaceOptions, search: Search) -> None:
    """Local search with what is left of the budget: from the best plan so far, then, each time
    the climb stops at a local optimum with budget left, from the next distinct plan
    (:data:`REFINE_STARTS` at most; the last one kicks on at its local optima). Each refined plan
    that beats its start is a candidate.
    """
    from baechi_cli.search.refine import SETUP_EVALUATIONS, evaluation_cost, refine

    starts = refine_starts(search.candidates)
    per_evaluation = evaluation_cost(prepared.graph)
    for k, start in enumerate(starts):
        best = fastest(search.candidates)
        if best is None or prepared.bounds.gap(best.evaluation.value_us) == 0:  # type: ignore[union-attr]
            return
        # Its setup is charged too, so that the budget bounds what refinement takes in all.
        evaluations = int(max(0.0, search.budget_s - search.spent_s) / per_evaluation) - SETUP_EVALUATIONS
        if evaluations < 1:
            return
        refined = refine(
            prepared.graph,
            prepared.devices,
            start.placement,  # type: ignore[arg-type]
            max_evaluations=evaluations,
            seed=options.seed,
            start_evaluation=start.evaluation,
            timer=prepared.timer,
            stop_at_local_optimum=k + 1 < len(starts),
        )
        search.spent_s += (SETUP_EVALUATIONS + refined.evaluations) * per_evaluation
        if refined.evaluation.value_us < start.evaluation.value_us:  # type: ignore[union-attr]
            placement = refined.placement
            placement.info = {
                "refinement": {
                    "start": start.label,
                    "start_step_time_us": refined.start_value_us,
                    "evaluations": refined.evaluations,
                    "moves_tried": refined.moves_tried,
                    "moves_accepted": refined.moves_accepted,
                    "seed": options.seed,
                }
            }
            search.candidates.append(
                Candidate(
                    start.algorithm,
                    refined.seconds,
                    placement,
                    prepared.judge(placement, refined.evaluation),
                    variant=start.variant,
                    stage="refine",
                    start=start.label,
                )
            )
        if not refined.stalled:
            return  # the budget is spent


def refine_starts(candidates: list[Candidate]) -> list[Candidate]:
    """The plans refinement may start from: the feasible candidates, fastest first (the earlier
    on ties), one per distinct placement, :data:`REFINE_STARTS` at most."""
    feasible = sorted(
        (c for c in candidates if c.ok),
        key=lambda c: c.evaluation.value_us,  # type: ignore[union-attr]
    )
    starts: list[Candidate] = []
    seen: set[tuple[int, ...]] = set()
    for c in feasible:
        key = tuple(c.placement.device_of)  # type: ignore[union-attr]
        if key not in seen:
            seen.add(key)
            starts.append(c)
            if len(starts) == REFINE_STARTS:
                break
    return starts


def exact_stage(prepared: Prepared, search: Search) -> None:
    """CP-SAT on a small graph, hinted with the best plan so far; its bound joins the report's bounds.

    On the op graph itself (hard colocation groups only) its bound bounds every
    plan; on a placement graph only those keeping its nodes whole.
    """
    from baechi_cli.placers.exact import solve

    start = fastest(search.candidates)
    if start is None or start.placement is None:
        return
    graph = prepared.graph
    on_ops = graph.num_ops <= EXACT_AUTO_NODES
    if not on_ops:
        variant = prepared.variant_for(start.variant) if start.variant is not None else prepared.variant
        if variant.placement_graph.num_ops > EXACT_AUTO_NODES or not variant.expands_sequence:
            return
        graph = variant.placement_graph
    hint = node_devices(graph, start.placement.device_of)
    seconds = min(EXACT_SECONDS, max(0.1, search.budget_s - search.spent_s))
    t0 = time.perf_counter()
    # Charged its limit (CP-SAT's deterministic seconds), not the clock: refinement's
    # share, and so the plan, must not depend on the machine's load.
    search.spent_s += seconds
    try:
        result = solve(graph, prepared.devices, time_limit=seconds, hint=hint)
    except (InfeasibleError, SolverError) as err:
        # Its memory model counts more than the evaluator's: a plan auto already has
        # fits, so exact's failure is one more candidate's, listed, never auto's.
        variant = start.variant if not on_ops else None
        error = err.with_path(prepared.path)
        search.candidates.append(
            Candidate("exact", time.perf_counter() - t0, error=error, variant=variant, stage="exact")
        )
        return
    bounds = prepared.bounds
    if on_ops:
        bounds.exact_us = result.lower_bound_us
        bounds.exact_scope = f"the op graph ({graph.num_ops} ops)"
    else:
        bounds.exact_restricted_us = result.lower_bound_us
        bounds.exact_scope = f"a placement graph of {graph.num_ops} nodes (plans keeping its nodes whole)"
    placement = Placement(list(result.device_of), list(result.sequence))
    if not on_ops:
        placement = expand(placement, graph, prepared.graph, True)
    placement.info = {
        "exact": {
            "status": result.status,
            "lower_bound_us": result.lower_bound_us,
            "objective_us": result.objective_us,
            "nodes": result.nodes,
            "scope": bounds.exact_scope,
        }
    }
    evaluation = prepared.judge(placement)
    if evaluation.feasible:  # exact's second memory model always fits; a fused graph may count less
        variant = start.variant if not on_ops else None
        seconds = time.perf_counter() - t0
        search.candidates.append(
            Candidate("exact", seconds, placement, evaluation, variant=variant, stage="exact")
        )


def node_devices(graph: OpGraph, op_device: list[int]) -> list[int]:
    """A placement of ``graph``'s nodes from one of its ops (``members``), each group on one device.

    A node goes where most of its members run (its first member's device on
    ties); a group where its first node goes. O(V).
    """
    if graph.members is None:
        node = list(op_device)
    else:
        node = []
        for members in graph.members:
            count: dict[int, int] = {}  # in order of first appearance: max() keeps the first on ties
            for v in members:
                count[op_device[v]] = count.get(op_device[v], 0) + 1
            node.append(max(count, key=count.__getitem__))
    first: dict[int, int] = {}
    for v, g in enumerate(graph.group):
        first.setdefault(g, node[v])
    return [first[g] for g in graph.group]


def skip_reason(spec: PlacerSpec, nodes: int) -> str:
    """Why auto did not run ``spec`` on a graph of ``nodes`` nodes."""
    return (
        f"skipped by auto: {spec.title} over {nodes} nodes: {spec.auto_skip_reason} "
        f"(auto runs it up to {spec.auto_max_nodes} nodes); use --algo {spec.name}"
    )
