"""exact: an optimal placement and order by constraint programming (OR-Tools CP-SAT).

Contract: :func:`solve` (and :func:`place`, hinted by m-ETF) take the placers' graph (after
fusion; colocation groups in ``graph.group``) and devices, and return a placement, an order and
``lower_bound_us``, a step time no placement within memory beats under the evaluator's semantics.
``status`` is ``optimal`` iff the evaluator's step time is at most ``lower_bound_us (1 + 1e-6) +
2n unit``, else ``feasible``. Graphs over ``max_nodes`` raise InputError before anything is built.

Model, in integer time of ``unit`` µs (a power of ten, about 1e-7 of the horizon): a boolean
``x[g, d]`` per group and device, exactly one per group; a start ``S[v]`` and, per device, an
optional interval of v's duration on d's kind, one ``NoOverlap`` per device; ``S[v] >= E[u] + c``
per producer/consumer pair in different groups, ``c`` the longest transfer between them when apart
(:func:`baechi_cli.evaluator.sim.transfer_length`; per device pair with per-link overrides); minimise
the makespan. This is the simulator's ``parallel`` rule; ``sequential`` channels only delay
transfers, so the bound stays valid for both. Redundant rows help propagation: per-device loads,
a cumulative of capacity D, heads and tails (:meth:`_Problem._heads`), the loads summing to every
duration on uniform devices (only where the load bound is the larger root bound: elsewhere they
slow the proof), and symmetry breaking over interchangeable devices.

Memory: none counted when every device holds the graph (:func:`baechi_cli.placers.memory.ample`).
Else a first model counts what every placement the evaluator accepts must meet (so its bound is
valid); if its answer is over memory, a second counts a safe upper bound of the evaluator's peak
(so its answer fits), judged against the first's bound.

Why the bound is valid: durations and transfers round *down* (a node shorter than a unit lasts
one, so intervals never nest); any schedule the evaluator could produce, step time ``T``, maps to
a model solution of makespan at most ``T (1 + 1e-9) / unit + Z`` (``Z`` lengthened nodes), so
CP-SAT's proven bound ``B`` gives ``T >= (B - Z) unit / (1 + 1e-9)``. Each later phase adds
``M >= B`` for the bound proven so far, which every solution meets.

Search, with one worker: phases under a deterministic time limit and a fixed seed, so the same
input gives the same answer on any machine (``workers > 1``: CP-SAT's portfolio on the clock, not
reproducible; ``ExactResult.reproducible``). First without the LP (``NO_LP_SHARE``): a load-bound
graph's optimum is its load bound, met by a balanced schedule that the LP's solves only delay.
Then CP-SAT's deterministic interleave of searches without and with the LP, from the best
solution so far. A hint is first probed without the LP (``PROBE_SHARE``; not on load-bound
graphs); if the probe improves without finishing, the no-LP phase restarts from scratch rather
than retrace it. :class:`_Watch` stops once the evaluator's step time meets the bound.

Complexity: ``V·D`` intervals, up to ``E·D`` conditional precedences; exponential search, cut at the limit.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.errors import InfeasibleError, InputError, SolverError
from baechi_cli.core.graph import CONTROL_PORT, OpGraph
from baechi_cli.evaluator.placement import Placement
from baechi_cli.evaluator.sim import lower_bound, transfer_length
from baechi_cli.placers import ExactOptions

# Integer time: the horizon spans about this many units.
HORIZON_UNITS = 1e7
# Relative slack for the last bit of a floating-point division when rounding down.
ROUNDING = 1e-9
# Relative tolerance of "the evaluator's step time meets the bound".
TOLERANCE = 1e-6
DEFAULT_MAX_NODES = 200  # ExactOptions.max_nodes (kept equal by a test)
SEED = 0
# The search's phases (module docstring, "Search"): shares of the deterministic time limit.
NO_LP_SHARE = 0.3  # the search without the LP
PROBE_SHARE = 0.1  # with a hint, first this much of it, to see whether it improves on the hint
UNLIMITED = 10.0  # what the shares are of when there is no limit


@dataclass(frozen=True)
class ExactResult:
    """What :func:`solve` found.

    ``device_of`` and ``sequence`` (every node by the model's start times,
    ties by topological rank: a topological order) are the answer, and
    ``evaluated_us`` the evaluator's step time for them. ``objective_us`` is
    the model's own makespan (durations rounded down, ``parallel``
    transfers), ``lower_bound_us`` a step time no placement within memory
    can beat under the evaluator's semantics (module docstring); ``status``
    is ``optimal`` when ``evaluated_us`` meets it. ``from_hint``: CP-SAT found
    nothing within its limit and the answer is the hint.
    """

    device_of: list[int]
    sequence: list[int]
    status: str  # "optimal" | "feasible"
    objective_us: float
    lower_bound_us: float
    seconds: float
    nodes: int
    evaluated_us: float
    cp_status: str  # CP-SAT's status for the model that gave the answer
    from_hint: bool = False
    # False with several workers, whose threads race (module docstring): then the same
    # input may give another answer.
    reproducible: bool = True
    # CP-SAT's deterministic time over every phase of both models: with one worker the same on
    # every machine, where ``seconds`` (wall-clock, with the model's set-up) is not.
    counted_seconds: float = 0.0

    @property
    def gap(self) -> float:
        """:func:`gap` of the answer's evaluated step time to the bound."""
        return gap(self.evaluated_us, self.lower_bound_us)


def gap(evaluated_us: float, lower_bound_us: float) -> float:
    """(evaluated - bound) / evaluated: 0 when optimal, up to rounding.

    >>> gap(110.0, 99.0), gap(0.0, 0.0)
    (0.1, 0.0)
    """
    if evaluated_us <= 0:
        return 0.0
    return max(0.0, (evaluated_us - lower_bound_us) / evaluated_us)


def too_big(nodes: int, max_nodes: int) -> InputError:
    """The error for a graph over the size guard: what exact takes, and what to use instead."""
    return InputError(
        f"exact solves graphs of up to {max_nodes:,} nodes after the passes (use --algo auto: m-TOPO, "
        "m-ETF and m-SCT, refined, and exact where the graph is small enough; or shrink the graph with "
        f"--coplace and --fusion where one is off); this one has {nodes:,}"
    )


def place(graph: OpGraph, devices: DeviceSpec, options: ExactOptions) -> Placement:
    """Place ``graph`` optimally when CP-SAT proves it within ``options.time_limit`` (module docstring).

    m-ETF's placement and order are the hint. The answer is the best the
    evaluator judges among the model's placement in the model's order, the
    same placement in the evaluator's own order, and the hint (the last two
    can win only when the model is not optimal, or in ``sequential`` mode).
    ``info`` gets ``exact_status``, ``exact_lower_bound_us``,
    ``exact_objective_us``, ``exact_seconds`` (wall-clock),
    ``exact_counted_seconds`` (CP-SAT's deterministic time), ``exact_nodes``,
    ``exact_source`` (which of the three it is) and ``exact_reproducible``.
    """
    from baechi_cli.evaluator.evaluate import evaluate
    from baechi_cli.placers import get
    from baechi_cli.placers.memory import hard_minimum

    if graph.num_ops > options.max_nodes:
        raise too_big(graph.num_ops, options.max_nodes)
    impossible = hard_minimum(graph, devices)
    if impossible is not None:  # no placement at all fits: nothing for CP-SAT to search
        raise impossible
    hint: Placement | None
    try:
        hint = get("etf").place(graph, devices)
    except InfeasibleError:
        hint = None
    result = solve(
        graph,
        devices,
        time_limit=options.time_limit,
        hint=hint.device_of if hint is not None else None,
        hint_sequence=hint.sequence if hint is not None else None,
        max_nodes=options.max_nodes,
        workers=options.workers,
    )
    source = "hint (m-ETF)" if result.from_hint else "exact"
    candidates = [
        (source, Placement(list(result.device_of), list(result.sequence))),
        (f"{source}, evaluator's order", Placement(list(result.device_of))),
    ]
    if hint is not None and not result.from_hint:
        candidates.append(("hint (m-ETF)", Placement(list(hint.device_of), hint.sequence)))
    judged = [evaluate(graph, devices, p) for _, p in candidates]
    best = min(range(len(candidates)), key=lambda i: (not judged[i].feasible, judged[i].value_us, i))
    if not judged[best].feasible:  # the second model's count is an upper bound: a bug
        from baechi_cli.placers.memory import over_memory_error

        raise over_memory_error(judged[best].timeline, graph, devices, "exact's placement does not fit")
    source, placement = candidates[best]
    placement.info |= {
        "exact_status": result.status,
        "exact_lower_bound_us": result.lower_bound_us,
        "exact_objective_us": result.objective_us,
        "exact_seconds": round(result.seconds, 6),
        "exact_counted_seconds": round(result.counted_seconds, 6),
        "exact_nodes": result.nodes,
        "exact_source": source,
        "exact_reproducible": result.reproducible,
    }
    return placement


def solve(
    graph: OpGraph,
    devices: DeviceSpec,
    *,
    time_limit: float | None,
    hint: Sequence[int] | None = None,
    hint_sequence: Sequence[int] | None = None,
    max_nodes: int = DEFAULT_MAX_NODES,
    workers: int = 1,
) -> ExactResult:
    """Place and order ``graph`` on ``devices`` by CP-SAT (module docstring).

    ``time_limit``: seconds per model, CP-SAT's deterministic time with one
    worker (the same answer on every machine; None: none), wall-clock time
    with several. At most two models are solved: the second only when
    memory is tight and the first's answer does not fit. ``hint``: a device
    per node (a heuristic's placement, colocation groups whole) to start
    from, in the order ``hint_sequence`` (a topological order; default the
    evaluator's): that schedule bounds the search, and it is the answer
    should CP-SAT find none. ``workers``: 1 for a reproducible answer, more
    for CP-SAT's parallel portfolio (module docstring).

    Raises InputError for a graph of more than ``max_nodes`` nodes or a bad
    time limit, ValueError for a malformed hint, InfeasibleError when no
    placement fits memory, SolverError when CP-SAT finds no placement within
    its limit and there is no hint.
    """
    n = graph.num_ops
    if n > max_nodes:
        raise too_big(n, max_nodes)
    if time_limit is not None and not (time_limit > 0 and math.isfinite(time_limit)):
        raise InputError(
            f"the exact solver's time limit must be a positive number of seconds, got {time_limit}"
        )
    t0 = time.perf_counter()
    keep = _devices_to_model(graph, devices, hint)
    at = {d: i for i, d in enumerate(keep)}
    if len(keep) == devices.count or (hint is not None and not all(d in at for d in hint)):
        # Every device, or a hint naming none of them, which _Problem reports.
        return _Problem(graph, devices, hint, hint_sequence).run(time_limit, workers, t0)
    ic = devices.interconnect
    links = {(at[a], at[b]): link for (a, b), link in ic.links.items() if a in at and b in at}
    kept = DeviceSpec(tuple(devices.devices[d] for d in keep), replace(ic, links=links), devices.source)
    problem = _Problem(graph, kept, None if hint is None else [at[d] for d in hint], hint_sequence, devices)
    result = problem.run(time_limit, workers, t0)
    return replace(result, device_of=[keep[d] for d in result.device_of])


def _devices_to_model(graph: OpGraph, devices: DeviceSpec, hint: Sequence[int] | None) -> list[int]:
    """The devices the model needs, in index order: of each class of interchangeable devices
    (:meth:`DeviceSpec.classes`) the first as many as the graph has colocation groups, and those
    the hint uses.

    A placement puts its groups on at most that many devices of a class, and relabelled onto
    the first ones of each class it runs the same (the same kinds, memory and links, the
    devices in the same order). So the optimum and the bound are those of all devices, while
    the model, with a transfer term per edge and device pair, stays small on thousands of
    devices. O(V + D).
    """
    groups = max(1, len(set(graph.group)))
    hinted = set(hint or ())
    seen: dict[int, int] = {}
    keep = []
    for d, c in enumerate(devices.classes()):
        seen[c] = seen.get(c, 0) + 1
        if seen[c] <= groups or d in hinted:
            keep.append(d)
    return keep


@dataclass
class _Solved:
    """One model's answer (device_of None when CP-SAT found none)."""

    cp_status: str
    device_of: list[int] | None
    start: list[int] | None
    objective: int | None
    bound: int  # proven lower bound of the model's optimum, in units
    clock: bool = False  # several workers raced: another run may answer differently
    counted: float = 0.0  # CP-SAT's deterministic time over the model's phases


class _Watch:
    """Stops CP-SAT once the evaluator's step time of its best solution meets the bound.

    The test is :meth:`_Problem.meets`, the one that makes an answer ``optimal``, against the
    first model's proven bound as CP-SAT raises it (or, for the second model, the first's
    final bound). Without it CP-SAT would go on until its own gap is below the relative
    tolerance alone, i.e. prove its rounded model's optimum to the unit, while the 2n units
    the answer may lie above the bound (module docstring) are already met. With one worker
    the callbacks run in CP-SAT's thread at points its deterministic search decides, so the
    stop, like everything else, depends on the input alone. O(V + E) per solution found.
    """

    def __init__(self, problem: _Problem, solver, x, start, bound_units: int | None) -> None:
        from ortools.sat.python import cp_model

        class Callback(cp_model.CpSolverSolutionCallback):
            def on_solution_callback(cb) -> None:  # noqa: N805 (the callback object)
                self.on_solution(cb)

        self.problem, self.solver, self.x, self.start = problem, solver, x, start
        self.fixed_bound = bound_units
        self.value_us: float | None = None  # the evaluator's step time of the last solution, if it fits
        self.stopped = False  # whether it stopped the search
        self.callback = Callback()

    def on_solution(self, cb) -> None:
        from baechi_cli.evaluator.evaluate import evaluate

        pr = self.problem
        device_of = [
            next(d for d in range(pr.ndev) if cb.BooleanValue(self.x[pr.group_of[v]][d])) for v in range(pr.n)
        ]
        starts = [cb.Value(s) for s in self.start]
        sequence = sorted(range(pr.n), key=lambda v: (starts[v], pr.rank[v]))
        judged = evaluate(pr.graph, pr.devices, Placement(device_of, sequence))
        self.value_us = judged.value_us if judged.feasible else None
        if self.done(cb.BestObjectiveBound()):
            self.stopped = True
            cb.StopSearch()

    def on_bound(self, bound: float) -> None:
        if self.done(bound):
            self.stopped = True
            self.solver.StopSearch()

    def done(self, bound: float) -> bool:
        if self.value_us is None:
            return False
        if self.fixed_bound is not None:
            units = self.fixed_bound
        elif math.isfinite(bound):
            units = math.ceil(bound - 1e-6)
        else:
            return False
        return self.problem.meets(self.value_us, self.problem.bound_us(units))


class _Problem:
    """What both models share, and the run of one or two of them."""

    def __init__(
        self,
        graph: OpGraph,
        devices: DeviceSpec,
        hint: Sequence[int] | None,
        hint_sequence: Sequence[int] | None,
        full: DeviceSpec | None = None,
    ) -> None:
        """The problem on ``devices``: all of ``full`` (default: ``devices``), or those of them
        :func:`_devices_to_model` keeps; bounds and messages are ``full``'s."""
        from baechi_cli.placers.memory import ample

        self.graph, self.devices = graph, devices
        self.full = full or devices
        n, ndev = graph.num_ops, devices.count
        self.n, self.ndev = n, ndev
        topo = graph.topo_order()
        self.rank = [0] * n
        for i, v in enumerate(topo):
            self.rank[v] = i
        # Groups, numbered in topological order of their first node.
        index: dict[int, int] = {}
        for v in topo:
            index.setdefault(graph.group[v], len(index))
        self.group_of = [index[graph.group[v]] for v in range(n)]
        self.ngroups = len(index)

        # Transfers: per pair (u, v) in different groups and per device pair, the longest tensor.
        tensors, ic = graph.tensors, devices.interconnect
        pair_tensors: dict[tuple[int, int], set[int]] = {}
        for e in range(graph.num_edges):
            pair_tensors.setdefault((graph.edge_src[e], graph.edge_dst[e]), set()).add(tensors.edge_tensor[e])
        self.pairs = sorted(pair_tensors)
        cost_us: dict[tuple[int, int], list[list[float]]] = {}
        for (u, v), carried in pair_tensors.items():
            if self.group_of[u] != self.group_of[v]:
                cost_us[(u, v)] = [
                    [
                        0.0 if a == b else max(transfer_length(tensors, ic, t, a, b) for t in carried)
                        for b in range(ndev)
                    ]
                    for a in range(ndev)
                ]
        dur_us = [graph.durations(d.kind) for d in devices.devices]
        horizon_us = sum(max(dur_us[d][v] for d in range(ndev)) for v in range(n))
        horizon_us += sum(max(max(row) for row in c) for c in cost_us.values())
        self.unit = 10.0 ** math.ceil(math.log10(horizon_us / HORIZON_UNITS)) if horizon_us > 0 else 1.0
        rounded = [[self._down(dur_us[d][v]) for d in range(ndev)] for v in range(n)]
        self.lengthened = sum(1 for row in rounded if min(row) == 0)
        self.p = [[max(1, x) for x in row] for row in rounded]
        self.cost = {k: [[self._down(x) for x in row] for row in c] for k, c in cost_us.items()}
        self.horizon = sum(max(row) for row in self.p) + sum(
            max(max(r) for r in c) for c in self.cost.values()
        )
        self.pmin = [min(row) for row in self.p]
        self.head = self._heads(topo, forward=True)
        self.tail = self._heads(topo[::-1], forward=False)

        # Classes of interchangeable devices (symmetry breaking); none with per-link overrides.
        self.classes: list[list[int]] = []
        if not ic.links:
            by_key: dict[tuple[str, int], list[int]] = {}
            for d, dev in enumerate(devices.devices):
                by_key.setdefault((dev.kind, dev.memory_bytes), []).append(d)
            self.classes = [c for c in by_key.values() if len(c) > 1]

        # Memory per group: persistent bytes, and those plus outputs (views allocate nothing).
        self.ample = ample(graph, devices)
        self.capacity = [d.memory_bytes for d in devices.devices]
        self.persistent = [0] * self.ngroups
        self.own = [0] * self.ngroups
        for v in range(n):
            g = self.group_of[v]
            self.persistent[g] += graph.persistent_bytes[v]
            self.own[g] += graph.persistent_bytes[v] + (
                0 if v in graph.view_of else sum(graph.output_bytes[v])
            )
        # While a node runs (for a positive time) its outputs and temporaries and each of its
        # inputs are allocated on its device, besides the weights: bytes, per device (0: not running).
        running = []
        for v in range(n):
            inputs = {
                tensors.edge_tensor[e]
                for e in graph.in_edges[v]
                if graph.edge_port[e] != CONTROL_PORT and graph.edge_src[e] not in graph.view_of
            }
            # An input is its producer's output (beside it) or a copy (apart): the smaller
            # counts. A workload JSON's ports hold 0 bytes, however big the copies.
            outputs = graph.output_bytes
            need = graph.temporary_bytes[v] + sum(
                min(tensors.nbytes[t], outputs[tensors.src[t]][tensors.port[t]]) for t in inputs
            )
            need += 0 if v in graph.view_of else sum(graph.output_bytes[v])
            running.append([need if dur_us[d][v] > 0 else 0 for d in range(ndev)])
        self.running = running
        # Copies a device may receive: (bytes, producer's group, the other groups reading it).
        readers: dict[int, set[int]] = {}
        for e in range(graph.num_edges):
            t = tensors.edge_tensor[e]
            gu, gv = self.group_of[graph.edge_src[e]], self.group_of[graph.edge_dst[e]]
            if graph.edge_port[e] != CONTROL_PORT and tensors.nbytes[t] > 0 and gu != gv:
                readers.setdefault(t, set()).add(gv)
        self.copies = [
            (tensors.nbytes[t], self.group_of[tensors.src[t]], sorted(readers[t])) for t in sorted(readers)
        ]
        self.floor_us: float | None = None  # the simulator's lower bound, when first asked
        self.hint = self._check_hint(hint)
        self.hint_sequence = list(hint_sequence) if hint is not None and hint_sequence is not None else None

    # ------------------------------------------------------------------ helpers

    def _down(self, us: float) -> int:
        """``us`` in units, rounded down (module docstring)."""
        return max(0, math.floor(us * (1 + ROUNDING) / self.unit))

    def _heads(self, order: list[int], forward: bool) -> list[int]:
        """Heads (``forward``; ``order`` topological) or tails (reversed) of every node, in units.

        A head bounds a node's start in every schedule of the model. The
        node's producers either share its device, where they run one at a
        time before it (no sooner than Jackson's schedule of them by their
        heads), or are elsewhere, and their tensors arrive no sooner than
        their head, duration and cheapest transfer. Whichever share it, the
        node starts no sooner than the least over those choices of the later
        of the two; the choices worth trying keep the producers whose tensors
        would arrive last. Tails bound the time from a node's end to the
        makespan, the same way backwards (consumers on its device served
        largest tail first). Both are at least the plain critical paths.
        O(sum over nodes of degree squared).
        """
        g, pmin = self.graph, self.pmin
        bound = [0] * self.n
        for v in order:
            if forward:
                nbrs = sorted({g.edge_src[e] for e in g.in_edges[v]})
            else:
                nbrs = sorted({g.edge_dst[e] for e in g.out_edges[v]})
            if not nbrs:
                continue
            arrival: dict[int, float] = {}
            for u in nbrs:
                c = self.cost.get((u, v) if forward else (v, u))
                if c is None or self.ndev == 1:
                    arrival[u] = math.inf  # same group: always on v's device
                else:
                    cheapest = min(c[a][b] for a in range(self.ndev) for b in range(self.ndev) if a != b)
                    arrival[u] = bound[u] + pmin[u] + cheapest
            nbrs.sort(key=lambda u: (-arrival[u], u))
            best = math.inf
            for k in range(len(nbrs) + 1):
                rest = arrival[nbrs[k]] if k < len(nbrs) else 0
                t = 0
                if forward:  # the first k run before v on its device, by release
                    for u in sorted(nbrs[:k], key=lambda u: (bound[u], u)):
                        t = max(t, bound[u]) + pmin[u]
                else:  # the first k run after v on its device, largest tail first
                    done = 0
                    for u in sorted(nbrs[:k], key=lambda u: (-bound[u], u)):
                        done += pmin[u]
                        t = max(t, done + bound[u])
                best = min(best, max(rest, t))
            bound[v] = int(best)
        return bound

    def load_bound(self) -> int:
        """A lower bound on the makespan in units: every node at its fastest kind, spread evenly.

        Each device runs its nodes one at a time within ``[0, M]``, each for at least its
        fastest duration, so ``D M`` is at least their sum. O(V).
        """
        return -(-sum(self.pmin) // self.ndev)

    def _check_hint(self, hint: Sequence[int] | None) -> list[int] | None:
        """The hint's device per group, relabelled to meet the symmetry breaking; ValueError if malformed."""
        if hint is None:
            return None
        if len(hint) != self.n or any(not 0 <= d < self.ndev for d in hint):
            raise ValueError(f"the hint must give each of the {self.n} nodes a device below {self.ndev}")
        per_group = [-1] * self.ngroups
        for v, d in enumerate(hint):
            g = self.group_of[v]
            if per_group[g] not in (-1, d):
                raise ValueError(f"the hint splits the colocation group of '{self.graph.names[v]}'")
            per_group[g] = d
        relabel = list(range(self.ndev))
        for cls in self.classes:  # within a class, devices in the order groups first use them
            used = list(dict.fromkeys(d for d in per_group if d in cls))
            for target, d in zip(cls, used + [d for d in cls if d not in used]):
                relabel[d] = target
        return [relabel[d] for d in per_group]

    def _hint_schedule(self, per_group: list[int]) -> tuple[list[int], int]:
        """The hint's schedule in the model (its order on each device, earliest starts) and makespan."""
        from baechi_cli.evaluator.evaluate import device_order, evaluate

        g, n = self.graph, self.n
        device_of = [per_group[self.group_of[v]] for v in range(n)]
        if self.hint_sequence is not None:
            order = device_order(self.hint_sequence, device_of, self.ndev)
        else:
            order = evaluate(g, self.devices, Placement(device_of)).timeline.order
        position = [0] * n
        for ops in order:
            for i, v in enumerate(ops):
                position[v] = i
        # Nodes whose producers and device predecessor are scheduled, in topological order.
        waiting = [len(g.in_edges[v]) + (position[v] > 0) for v in range(n)]
        ready = sorted((self.rank[v], v) for v in range(n) if waiting[v] == 0)
        start, end = [0] * n, [0] * n
        free = [0] * self.ndev
        done = 0
        heapq.heapify(ready)
        while ready:
            _, v = heapq.heappop(ready)
            d = device_of[v]
            s = max(free[d], self.head[v])
            for e in g.in_edges[v]:
                u = g.edge_src[e]
                c = self.cost.get((u, v))
                s = max(s, end[u] + (c[device_of[u]][d] if c is not None else 0))
            start[v], end[v], free[d] = s, s + self.p[v][d], s + self.p[v][d]
            done += 1
            following = [g.edge_dst[e] for e in g.out_edges[v]]
            if position[v] + 1 < len(order[d]):
                following.append(order[d][position[v] + 1])
            for w in following:
                waiting[w] -= 1
                if waiting[w] == 0:
                    heapq.heappush(ready, (self.rank[w], w))
        if done != n:
            raise ValueError("the hint's order contradicts the graph's dependencies")
        return start, max(end, default=0)

    def _memory_ok(self, per_group: list[int], safe: bool) -> bool:
        """Whether a placement meets the model's memory rows (``safe``: the second model's count)."""
        if self.ample:
            return True
        used = [0] * self.ndev
        for g, d in enumerate(per_group):
            used[d] += self.own[g] if safe else self.persistent[g]
        if not safe:
            for v in range(self.n):
                d = per_group[self.group_of[v]]
                if used[d] + self.running[v][d] > self.capacity[d]:
                    return False
        else:
            temporary = [0] * self.ndev
            for v in range(self.n):
                d = per_group[self.group_of[v]]
                temporary[d] = max(temporary[d], self.graph.temporary_bytes[v])
            for nbytes, gu, gvs in self.copies:
                for d in {per_group[gv] for gv in gvs} - {per_group[gu]}:
                    used[d] += nbytes
            used = [u + t for u, t in zip(used, temporary)]
        return all(u <= c for u, c in zip(used, self.capacity))

    # ------------------------------------------------------------------ the model

    def _solve(
        self, safe_memory: bool, time_limit: float | None, workers: int, bound_units: int | None = None
    ) -> _Solved:
        """Solve the first model (``safe_memory`` False) or the second; ``bound_units``: the first's
        proven bound, which the second's answer is judged against (module docstring)."""
        from ortools.sat.python import cp_model

        g, n, ndev, p, gof = self.graph, self.n, self.ndev, self.p, self.group_of
        m = cp_model.CpModel()
        upper = self.horizon
        hint_start: list[int] | None = None
        if self.hint is not None and self._memory_ok(self.hint, safe_memory):
            hint_start, makespan = self._hint_schedule(self.hint)
            upper = min(upper, makespan)  # the hint is a solution of this model
        x = [[m.NewBoolVar("") for _ in range(ndev)] for _ in range(self.ngroups)]
        for row in x:
            m.AddExactlyOne(row)
        start = [
            m.NewIntVar(self.head[v], max(self.head[v], upper - self.tail[v] - self.pmin[v]), "")
            for v in range(n)
        ]
        uniform = all(min(row) == max(row) for row in p)
        if uniform:
            end = [start[v] + p[v][0] for v in range(n)]
        else:  # an end variable per node keeps every precedence between two variables (fast to propagate)
            end = []
            for v in range(n):
                lo = self.head[v] + self.pmin[v]
                e = m.NewIntVar(lo, max(lo, upper - self.tail[v]), "")
                for d in range(ndev):
                    m.Add(e == start[v] + p[v][d]).OnlyEnforceIf(x[gof[v]][d])
                end.append(e)
        path = max((self.head[v] + self.pmin[v] + self.tail[v] for v in range(n)), default=0)
        load_bound = self.load_bound()
        lowest = max(path, load_bound)
        makespan_var = m.NewIntVar(lowest, max(lowest, upper), "")
        for d in range(ndev):
            m.AddNoOverlap(
                [m.NewOptionalFixedSizeIntervalVar(start[v], p[v][d], x[gof[v]][d], "") for v in range(n)]
            )
            m.Add(sum(p[v][d] * x[gof[v]][d] for v in range(n)) <= makespan_var)  # redundant: the load
        # Load-bound: on interchangeable kinds the sum of the durations over D bounds the makespan
        # at least as well as any path; the optimum is then mostly that bound, met by a balanced
        # schedule, which the search without the LP finds (module docstring, "Search").
        load_bound_graph = uniform and ndev > 1 and load_bound >= path
        if load_bound_graph:  # redundant: the loads add up to every node
            loads = []
            for d in range(ndev):
                load = m.NewIntVar(0, sum(row[d] for row in p), "")
                m.Add(load == sum(p[v][d] * x[gof[v]][d] for v in range(n)))
                # The load row above again, kept as benchmarked: CP-SAT's search shifts with any model change.
                m.Add(load <= makespan_var)
                loads.append(load)
            m.Add(sum(loads) == sum(row[0] for row in p))
        if ndev > 1:  # redundant: at most D nodes run at once
            m.AddCumulative(
                [m.NewFixedSizeIntervalVar(start[v], self.pmin[v], "") for v in range(n)], [1] * n, ndev
            )
        for v in range(n):
            if not g.out_edges[v]:
                m.Add(end[v] <= makespan_var)

        same_of: dict[tuple[int, int], cp_model.IntVar] = {}

        def same(g1: int, g2: int) -> cp_model.IntVar:
            """A literal: groups g1 and g2 share a device."""
            key = (min(g1, g2), max(g1, g2))
            if key not in same_of:
                lit = same_of[key] = m.NewBoolVar("")
                a, b = x[key[0]], x[key[1]]
                for d in range(ndev):
                    m.AddBoolOr([a[d].Not(), b[d].Not(), lit])
                    m.AddBoolOr([lit.Not(), a[d].Not(), b[d]])
            return same_of[key]

        for u, v in self.pairs:
            m.Add(start[v] >= end[u])
            c = self.cost.get((u, v))
            if c is None:
                continue
            costs = {c[a][b] for a in range(ndev) for b in range(ndev) if a != b}
            if costs == {0}:
                continue
            if len(costs) == 1:
                m.Add(start[v] >= end[u] + costs.pop()).OnlyEnforceIf(same(gof[u], gof[v]).Not())
                continue
            xu, xv = x[gof[u]], x[gof[v]]
            for b in range(ndev):
                comm = sum(c[a][b] * xu[a] for a in range(ndev) if a != b and c[a][b])
                m.Add(start[v] >= end[u] + comm).OnlyEnforceIf(xv[b])
        self._memory_rows(m, x, safe_memory)
        self._symmetry(m, x)

        def hint(per_group: list[int], starts: list[int] | None, makespan: int) -> None:
            """A solution for CP-SAT to start from: each group's device, and the starts if known."""
            for gi, d in enumerate(per_group):
                for dd in range(ndev):
                    m.AddHint(x[gi][dd], dd == d)
            for (g1, g2), lit in same_of.items():
                m.AddHint(lit, per_group[g1] == per_group[g2])
            if starts is not None:
                for v in range(n):
                    m.AddHint(start[v], starts[v])
                    if not uniform:
                        m.AddHint(end[v], starts[v] + p[v][per_group[gof[v]]])
                m.AddHint(makespan_var, makespan)

        if self.hint is not None:
            hint(self.hint, hint_start, upper)
        m.Minimize(makespan_var)

        def params(solver) -> None:
            prm = solver.parameters
            prm.random_seed = SEED
            prm.relative_gap_limit = TOLERANCE / 2
            prm.num_workers = max(1, workers)
            # Integer values from the LP leave nodes later than they could start, and the search
            # then improves the makespan one unit per solution, far slower to a proof.
            prm.exploit_integer_lp_solution = False
            prm.exploit_all_lp_solution = False

        def run(solver, limit: float | None, bound: int | None):
            prm = solver.parameters
            if limit is not None:
                if workers <= 1:
                    prm.max_deterministic_time = limit
                else:
                    prm.max_time_in_seconds = limit
            watch = _Watch(self, solver, x, start, bound)
            solver.best_bound_callback = watch.on_bound
            try:
                status = solver.Solve(m, watch.callback)
            except Exception as err:  # CP-SAT's own failure (an absl error raised through pybind)
                raise SolverError(f"exact: CP-SAT failed: {type(err).__name__}: {err}") from err
            if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                device_of = [
                    next(d for d in range(ndev) if solver.BooleanValue(x[gof[v]][d])) for v in range(n)
                ]
                found = (round(solver.ObjectiveValue()), device_of, [solver.Value(s) for s in start])
            else:
                found = None
            best = solver.BestObjectiveBound()
            proven = math.ceil(best - 1e-6) if math.isfinite(best) else 0
            return status, found, proven, watch.stopped

        def post(found, proven: int) -> None:
            """Start the next phase from the best solution so far, above the bound proven so far."""
            m.Add(makespan_var >= proven)  # proven: every solution of the model meets it
            if found is None:
                return
            m.ClearHints()
            objective, device_of, starts = found
            per_group = [0] * self.ngroups
            for v in range(n):
                per_group[gof[v]] = device_of[v]
            hint(per_group, starts, objective)

        solver = cp_model.CpSolver()
        params(solver)
        if workers > 1:  # CP-SAT's portfolio, its LNS and searches with and without the LP
            status, found, proven, _ = run(solver, time_limit, bound_units)
            spent = solver.response_proto.deterministic_time
        else:
            # Without the LP, then both in turn (module docstring, "Search").
            whole = time_limit if time_limit is not None else UNLIMITED
            phases: list[tuple[float | None, bool]] = [(NO_LP_SHARE * whole, False), (None, True)]
            if hint_start is not None and PROBE_SHARE < NO_LP_SHARE and not load_bound_graph:
                phases.insert(0, (PROBE_SHARE * whole, False))
            found, proven, status = None, 0, cp_model.UNKNOWN
            spent = 0.0
            for i, (limit, lp) in enumerate(phases):
                if limit is None and time_limit is not None:
                    limit = time_limit - spent
                if limit is not None and limit <= 0:
                    continue
                afresh = i == 1 and len(phases) == 3  # after the probe
                if afresh and (found is None or found[0] >= upper):
                    continue  # the probe did not improve on the hint: on to the LP
                if afresh:
                    m.ClearHints()  # away from the hint, where the probe searched
                elif found is not None or proven:
                    post(found, proven)
                solver = cp_model.CpSolver()
                params(solver)
                prm = solver.parameters
                if lp:
                    prm.interleave_search = True
                    prm.subsolvers.extend(["no_lp", "default_lp"])
                    prm.use_lns = False
                else:
                    prm.linearization_level = 0
                now, got, bound, stopped = run(solver, limit, bound_units)
                spent += solver.response_proto.deterministic_time
                proven = max(proven, bound)
                if got is not None and (found is None or got[0] <= found[0]):
                    found = got
                if now == cp_model.INFEASIBLE:
                    status = now if found is None else cp_model.OPTIMAL
                    break
                status = cp_model.FEASIBLE if found is not None else now
                if now == cp_model.OPTIMAL or stopped or (found is not None and proven >= found[0]):
                    status = cp_model.OPTIMAL if found is not None and proven >= found[0] else status
                    break
        name = solver.StatusName(status)
        clock = workers > 1  # the portfolio's threads race, even to a proof
        if found is not None:
            objective, device_of, starts = found
            return _Solved(name, device_of, starts, objective, min(proven, objective), clock, spent)
        return _Solved(name, None, None, None, 0 if status == cp_model.INFEASIBLE else proven, clock, spent)

    def _memory_rows(self, m, x, safe: bool) -> None:
        """Per device, the first model's persistent bytes or the second's safe count, within memory."""
        if self.ample:
            return
        graph, gof = self.graph, self.group_of
        largest_temporary = max(graph.temporary_bytes, default=0)
        for d in range(self.ndev):
            per_group = self.own if safe else self.persistent
            terms = [per_group[gi] * x[gi][d] for gi in range(self.ngroups) if per_group[gi]]
            if safe:
                if largest_temporary:
                    t = m.NewIntVar(0, largest_temporary, "")
                    for v in range(self.n):
                        if graph.temporary_bytes[v]:
                            m.Add(t >= graph.temporary_bytes[v]).OnlyEnforceIf(x[gof[v]][d])
                    terms.append(t)
                for nbytes, gu, gvs in self.copies:
                    r = m.NewBoolVar("")  # a copy lands on d: a reader is there and the producer is not
                    for gv in gvs:
                        m.AddBoolOr([r, x[gv][d].Not(), x[gu][d]])
                    terms.append(nbytes * r)
            if terms:
                m.Add(sum(terms) <= self.capacity[d])
            if not safe:  # while each node runs, weights and its working set
                for v in range(self.n):
                    room = self.capacity[d] - self.running[v][d]
                    if room < 0:
                        m.Add(x[gof[v]][d] == 0)
                    elif terms and self.running[v][d]:
                        m.Add(sum(terms) <= room).OnlyEnforceIf(x[gof[v]][d])

    def _symmetry(self, m, x) -> None:
        """Within each class of interchangeable devices, groups open devices in order."""
        for cls in self.classes:
            opened: list = [None] * len(cls)  # literal: an earlier group uses cls[k]
            for gi in range(self.ngroups):
                now = []
                for k, d in enumerate(cls):
                    if k > 0:
                        if opened[k - 1] is None:
                            m.Add(x[gi][d] == 0)
                        else:
                            m.AddImplication(x[gi][d], opened[k - 1])
                    lit = m.NewBoolVar("")
                    m.AddMaxEquality(lit, [x[gi][d]] + ([opened[k]] if opened[k] is not None else []))
                    now.append(lit)
                opened = now

    # ------------------------------------------------------------------ the run

    def run(self, time_limit: float | None, workers: int, t0: float) -> ExactResult:
        from baechi_cli.evaluator.evaluate import evaluate

        graph, devices, n = self.graph, self.devices, self.n
        if n == 0:
            return ExactResult([], [], "optimal", 0.0, 0.0, time.perf_counter() - t0, 0, 0.0, "OPTIMAL")
        first = self._solve(False, time_limit, workers)
        if first.cp_status == "INFEASIBLE":
            raise self._infeasible(
                "no placement fits: the colocation groups' weights, with the outputs, temporaries and "
                "inputs of a node while it runs, exceed the devices' memory"
            )
        chosen, answer = first, self._answer(first)
        if answer is not None and not evaluate(graph, devices, Placement(*answer)).feasible:
            chosen = self._solve(True, time_limit, workers, first.bound)
            answer = self._answer(chosen)
            if chosen.cp_status == "INFEASIBLE" and self.hint is None:
                raise self._infeasible(
                    "counting memory safely (every tensor live all step, a copy of every tensor a "
                    "device receives), no placement fits; m-ETF (--algo etf) counts memory by liveness and may find one"
                )
        from_hint = answer is None
        if answer is None:
            answer = self._hint_answer(time_limit, chosen.cp_status)
        judged = evaluate(graph, devices, Placement(*answer))
        if not judged.feasible:
            raise self._infeasible(
                "counting memory safely, no placement fits, and the hint does not fit either"
            )
        # The first model's bound holds for every placement within memory (module docstring).
        bound_us = self.bound_us(first.bound)
        optimal = self.meets(judged.value_us, bound_us)
        return ExactResult(
            device_of=answer[0],
            sequence=answer[1],
            status="optimal" if optimal else "feasible",
            objective_us=chosen.objective * self.unit if chosen.objective is not None else judged.value_us,
            lower_bound_us=bound_us,
            seconds=time.perf_counter() - t0,
            nodes=n,
            evaluated_us=judged.value_us,
            cp_status=chosen.cp_status,
            from_hint=from_hint,
            reproducible=not (first.clock or chosen.clock),
            counted_seconds=first.counted + (chosen.counted if chosen is not first else 0.0),
        )

    def bound_us(self, bound_units: int) -> float:
        """The step time no placement within memory beats, from the first model's proven bound."""
        if self.floor_us is None:
            self.floor_us = lower_bound(self.graph, self.full)
        return max(max(0, bound_units - self.lengthened) * self.unit / (1 + ROUNDING), self.floor_us)

    def meets(self, value_us: float, bound_us: float) -> bool:
        """Whether an evaluated step time is optimal against a bound (module docstring)."""
        return value_us <= bound_us * (1 + TOLERANCE) + 2 * self.n * self.unit

    def _answer(self, solved: _Solved) -> tuple[list[int], list[int]] | None:
        """(device_of, sequence by the model's start times) of a model's solution, if it has one."""
        if solved.device_of is None or solved.start is None:
            return None
        starts = solved.start
        return solved.device_of, sorted(range(self.n), key=lambda v: (starts[v], self.rank[v]))

    def _hint_answer(self, time_limit: float | None, cp_status: str) -> tuple[list[int], list[int]]:
        """The hint as the answer, when CP-SAT found nothing; SolverError without one."""
        if self.hint is None:
            limit = f"{time_limit:g} s" if time_limit is not None else "no limit"
            raise SolverError(
                f"exact: CP-SAT found no placement of {self.n} nodes within its time limit "
                f"({limit}, status {cp_status}); raise the time limit, or use --algo auto"
            )
        device_of = [self.hint[self.group_of[v]] for v in range(self.n)]
        start, _ = self._hint_schedule(self.hint)
        return device_of, sorted(range(self.n), key=lambda v: (start[v], self.rank[v]))

    def _infeasible(self, problem: str) -> InfeasibleError:
        from baechi_cli.placers.memory import hard_minimum

        return hard_minimum(self.graph, self.full) or InfeasibleError(f"exact: {problem}")
