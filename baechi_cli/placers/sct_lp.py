"""The favorite-child LP of m-SCT (Hanen & Munier's small-communication-time relaxation).

Every op ``v`` has a processing time ``p_v`` (``graph.compute_us``). The LP has one edge per
distinct ``(u, v)`` op pair joined by a graph edge (multi-edges and control edges merged); its
communication time ``c_uv`` sums the transfer time between two devices of the distinct tensors
``(u, port)`` it carries (charged one after another, as sequential communication does): the
measured ``edge_transfer_us`` when set (the largest, if its edges disagree), else
``interconnect.transfer_time(bytes, 0, 1)``; per-link overrides are ignored, as the LP does not
know the devices yet; a control dependency is the 0-byte tensor ``(u, CONTROL_PORT)``. With
``x_e`` in [0, 1] per LP edge (1: ``v`` is not ``u``'s favorite child and pays ``c_e``)::

    minimise   w
    subject to s_u + p_u + c_e x_e <= s_v        for every LP edge e = (u, v)
               sum_{e out of u} x_e >= outdeg(u) - 1   for outdeg(u) >= 2
               sum_{e into v}   x_e >= indeg(v) - 1    for indeg(v) >= 2
               s_v + p_v <= w                    for every sink v

The LP is always feasible (all ``x_e = 1``) and bounded, so any answer but "optimal" is a
:class:`~baechi_cli.core.errors.SolverError`, never a silent fallback. Backends (OR-Tools
``pywraplp``): HiGHS's dual simplex by default (measured: bench/lp_backends.md); GLOP, CLP, PDLP.

Complexity: O(V + E log E) to build V + E' + 1 variables and at most 2V + E' rows for E' LP
edges. The solve dominates: simplex time grows roughly quadratically with the LP and depends
strongly on the graph's shape, which is why callers pass a time limit (bench/lp_backends.md).
:func:`favorite_children` is O(E' log E').

Example: ``a`` feeds ``l`` over 5 µs and ``r`` over 8 µs; at most one child can skip its
transfer, and the LP splits the difference, ``5 x_l = 8 x_r``, leaving ``r`` below 1/2:

    >>> from baechi_cli.core.graph import GraphBuilder
    >>> from baechi_cli.core.devices import parse_devices
    >>> b = GraphBuilder()
    >>> a, l, r = (b.add_op(name, "X", [0], compute_us=10) for name in "alr")
    >>> _ = b.add_edge(a, l, transfer_us=5.0)
    >>> _ = b.add_edge(a, r, transfer_us=8.0)
    >>> res = solve_favorite_lp(b.build(), parse_devices("2x1GB"))
    >>> [round(x * 13, 6) for x in res.x], round(res.objective_us * 13, 6)
    ([8.0, 5.0], 300.0)
    >>> favorite_children(res)
    [2, -1, -1]
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.errors import InputError, SolverError
from baechi_cli.core.graph import OpGraph

# User-facing name -> (pywraplp solver id, solver-specific parameters).
# HiGHS is asked for as "HIGHS_LP" (its "HIGHS" id is the MIP flavour) and
# silenced: even with OR-Tools' output suppressed it prints a banner to stdout,
# which would corrupt the CLI's --json output. GLOP runs its dual simplex,
# several times faster here than its default primal one (bench/lp_backends.md).
BACKENDS: dict[str, tuple[str, str]] = {
    "highs": ("HIGHS_LP", "output_flag=false"),
    "glop": ("GLOP", "use_dual_simplex: true"),
    "clp": ("CLP", ""),
    "pdlp": ("PDLP", ""),
}
# HiGHS' deterministic iteration limit, as a line of its parameters.
HIGHS_ITERATION_LIMIT = "\nsimplex_iteration_limit={}"
# Seconds per simplex iteration per row and column of the LP: the cost model that turns a
# work limit in seconds into iterations (:func:`iteration_limit`), fitted to HiGHS' dual
# simplex on the 2-core CI machine (bench/history/placement.md).
SECONDS_PER_ITERATION_ELEMENT = 5e-9
DEFAULT_BACKEND = "highs"  # fastest in bench/lp_backends.md
DEFAULT_THRESHOLD = 0.5

# Statuses from pywraplp.Solver.Solve() (its enum's values, kept here so that
# importing this module does not import OR-Tools). OR-Tools' HiGHS interface also
# passes through raw MPSolverResponseStatus codes the enum does not list: 99
# (MPSOLVER_UNKNOWN_STATUS) when HiGHS stops at the time limit, 85
# (MPSOLVER_MODEL_INVALID_SOLVER_PARAMETERS) for a parameter it rejects.
_STATUS_TEXT = {
    2: "reported the LP infeasible (it never is: a numerical failure)",
    3: "reported the LP unbounded (it never is: a numerical failure)",
    4: "failed (abnormal status)",
    5: "rejected the model as invalid",
    6: "did not solve the LP",
    85: "rejected its solver parameters",
    99: "stopped with an unknown status",
}
_OPTIMAL, _FEASIBLE = 0, 1


@dataclass(frozen=True)
class LPResult:
    """An optimal solution of the favorite-child LP.

    LP edge ``i`` joins ``src[i] -> dst[i]`` (sorted by ``(src, dst)``) with
    communication time ``comm_us[i]`` and LP value ``x[i]``.
    """

    num_ops: int
    src: list[int]
    dst: list[int]
    comm_us: list[float]
    x: list[float]
    start_us: list[float]  # s_v, the LP's start time of each op
    objective_us: float  # w, the LP's makespan (Hanen & Munier's relaxed bound)
    status: str  # always "OPTIMAL": anything else raises SolverError
    backend: str
    seconds: float  # wall time of the solve
    build_seconds: float  # wall time to build the LP in OR-Tools
    num_variables: int
    num_constraints: int


def lp_edges(graph: OpGraph, devices: DeviceSpec) -> tuple[list[int], list[int], list[float]]:
    """The LP edges ``(src, dst, comm_us)``: one per distinct op pair, sorted."""
    ic = devices.interconnect
    latency, bandwidth = ic.latency_us, ic.bandwidth_bytes_per_us
    out_edges, edge_dst, edge_port = graph.out_edges, graph.edge_dst, graph.edge_port
    edge_bytes, edge_xfer = graph.edge_bytes, graph.edge_transfer_us
    src: list[int] = []
    dst: list[int] = []
    comm: list[float] = []
    for u in range(graph.num_ops):
        outs = out_edges[u]
        if len(outs) == 1:  # the common case: no merging needed
            e = outs[0]
            t = edge_xfer[e]
            src.append(u)
            dst.append(edge_dst[e])
            comm.append(t if t is not None else latency + edge_bytes[e] / bandwidth)
            continue
        # (v, port) -> [largest bytes, largest measured time or None], as the
        # simulator sizes one transfer serving several edges of one tensor.
        tensors: dict[tuple[int, int], list] = {}
        for e in outs:
            key = (edge_dst[e], edge_port[e])
            t = edge_xfer[e]
            entry = tensors.get(key)
            if entry is None:
                tensors[key] = [edge_bytes[e], t]
            else:
                entry[0] = max(entry[0], edge_bytes[e])
                if t is not None:
                    entry[1] = t if entry[1] is None else max(entry[1], t)
        pair_comm: dict[int, float] = {}
        for (v, _), (nbytes, t) in tensors.items():
            pair_comm[v] = pair_comm.get(v, 0.0) + (t if t is not None else latency + nbytes / bandwidth)
        for v in sorted(pair_comm):
            src.append(u)
            dst.append(v)
            comm.append(pair_comm[v])
    return src, dst, comm


def solve_favorite_lp(
    graph: OpGraph,
    devices: DeviceSpec,
    *,
    time_limit_s: float | None = None,
    work_limit_s: float | None = None,
    backend: str | None = None,
) -> LPResult:
    """Build and solve the favorite-child LP of ``graph`` (see the module docstring).

    ``backend`` names one of :data:`BACKENDS` (case-insensitive; default
    :data:`DEFAULT_BACKEND`). ``time_limit_s`` caps the solve's wall time;
    ``work_limit_s`` its simplex iterations, as many as that many seconds buy
    by the cost model (:func:`iteration_limit`, fitted to HiGHS): unlike the
    clock, the same LP then stops at the same point on any machine and at
    any load. Only highs takes it: the other backends, whose iterations the
    model does not fit (and GLOP, the default in a process that imported
    TensorFlow first, where solver parameters crash), solve without it.
    Raises :class:`InputError` for an unknown backend or a non-positive
    limit, and :class:`SolverError` when the backend is missing from this
    OR-Tools build, or the solve does not end optimal: infeasible,
    unbounded, abnormal, or stopped by a limit (even with a feasible
    solution in hand: a non-optimal LP would make the rounding arbitrary).

    Bounds are variable bounds, not rows; degree rows with degree 1 would read ``x_e >= 0``
    and are left out; makespan rows are needed only for sinks. O(V + E log E) to build
    (grouping and sorting each op's out-edges).
    """
    _check_limit(time_limit_s)
    _check_limit(work_limit_s, "work limit")
    return FavoriteLP(graph, devices, backend).solve(time_limit_s, work_limit_s)


def iteration_limit(work_limit_s: float, variables: int, constraints: int) -> int:
    """The simplex iterations ``work_limit_s`` seconds buy on an LP of this size (at least 1).

    >>> iteration_limit(1.0, 11884, 11240)  # static GNMT's LP; it needs 5,704
    8649
    """
    return max(1, int(work_limit_s / (SECONDS_PER_ITERATION_ELEMENT * (variables + constraints))))


def _check_limit(limit_s: float | None, what: str = "time limit") -> None:
    if limit_s is not None and not (limit_s > 0 and math.isfinite(limit_s)):
        raise InputError(f"the solver {what} must be a positive number of seconds, got {limit_s}")


def _highs_safe() -> bool:
    """False when TensorFlow was imported before OR-Tools in this process.

    Observed with TensorFlow 2.21 and OR-Tools 9.15: HiGHS then dies with
    SIGSEGV inside Solve(), and so does parsing solver parameters; the other
    import order works, and so does GLOP with its default parameters.
    `baechi` never imports TensorFlow when placing, so this only matters to
    programs that use both.
    """
    global _HIGHS_SAFE
    if _HIGHS_SAFE is None:  # decided once, before this module first imports OR-Tools
        _HIGHS_SAFE = "ortools.linear_solver.pywraplp" in sys.modules or "tensorflow" not in sys.modules
    return _HIGHS_SAFE


_HIGHS_SAFE: bool | None = None


class FavoriteLP:
    """The LP built in an OR-Tools solver; :meth:`solve` solves it (once).

    Building and solving are separate so benchmarks can time them apart.
    """

    def __init__(self, graph: OpGraph, devices: DeviceSpec, backend: str | None = None) -> None:
        highs_safe = _highs_safe()
        from ortools.linear_solver import linear_solver_pb2, pywraplp

        name = (backend or (DEFAULT_BACKEND if highs_safe else "glop")).lower()
        if name not in BACKENDS:
            raise InputError(f"unknown LP backend '{backend}' (use one of: {', '.join(BACKENDS)})")
        if name == "highs" and not highs_safe:
            raise SolverError(
                "LP backend 'highs' crashes in a process that imported TensorFlow before OR-Tools; "
                "import ortools.linear_solver.pywraplp first, or use backend 'glop'"
            )
        t0 = time.perf_counter()
        n = graph.num_ops
        p = graph.compute_us
        src, dst, comm = lp_edges(graph, devices)
        m = len(src)
        solver_id, parameters = BACKENDS[name]
        solver = pywraplp.Solver.CreateSolver(solver_id)
        if solver is None:
            raise SolverError(f"LP backend '{name}' is not available in this OR-Tools build")
        if parameters and highs_safe:  # (after TensorFlow, parsing them crashes too)
            # The return value is useless: False even when HiGHS applies the
            # parameters; a rejected one shows up as the solve's status instead.
            solver.SetSolverSpecificParametersAsString(parameters)
        # Built as one MPModelProto and loaded at once: a third of the time of a call into
        # the solver per variable and coefficient. Columns: s_0..s_{n-1}, w, then x_e.
        model = linear_solver_pb2.MPModelProto()
        inf = math.inf
        columns = model.variable
        for _ in range(n):
            columns.add(lower_bound=0.0, upper_bound=inf)
        columns.add(lower_bound=0.0, upper_bound=inf, objective_coefficient=1.0)  # w, minimised
        for _ in range(m):
            columns.add(lower_bound=0.0, upper_bound=1.0)
        rows = model.constraint
        w = n
        out_x: list[list[int]] = [[] for _ in range(n)]
        in_x: list[list[int]] = [[] for _ in range(n)]
        for e in range(m):
            u, v = src[e], dst[e]
            out_x[u].append(e)
            in_x[v].append(e)
            # s_u - s_v + c_e x_e <= -p_u
            if comm[e]:
                rows.add(
                    upper_bound=-p[u],
                    lower_bound=-inf,
                    var_index=(u, v, w + 1 + e),
                    coefficient=(1.0, -1.0, comm[e]),
                )
            else:
                rows.add(upper_bound=-p[u], lower_bound=-inf, var_index=(u, v), coefficient=(1.0, -1.0))
        for v in range(n):
            for incident in (out_x[v], in_x[v]):
                if len(incident) >= 2:
                    rows.add(
                        lower_bound=len(incident) - 1.0,
                        upper_bound=inf,
                        var_index=[w + 1 + e for e in incident],
                        coefficient=[1.0] * len(incident),
                    )
            if not out_x[v]:  # only sinks bound w: any other op ends before its successors start
                rows.add(upper_bound=-p[v], lower_bound=-inf, var_index=(v, w), coefficient=(1.0, -1.0))
        problem = solver.LoadModelFromProto(model)
        if problem:
            raise SolverError(f"LP backend '{name}' rejected the favorite-child LP: {problem}")
        self.backend = name
        self._parameters = parameters
        self.num_ops = n
        self.src, self.dst, self.comm_us = src, dst, comm
        self._solver = solver
        self.build_seconds = time.perf_counter() - t0

    def solve(self, time_limit_s: float | None = None, work_limit_s: float | None = None) -> LPResult:
        """Solve to optimality or raise :class:`SolverError` (see :func:`solve_favorite_lp`)."""
        _check_limit(time_limit_s)
        _check_limit(work_limit_s, "work limit")
        solver = self._solver
        if time_limit_s is not None:
            # Milliseconds, at least 1 so that a tiny limit never rounds to 0.
            solver.SetTimeLimit(max(1, round(time_limit_s * 1000)))
        iterations = None
        if work_limit_s is not None and self.backend == "highs":
            iterations = iteration_limit(work_limit_s, solver.NumVariables(), solver.NumConstraints())
            solver.SetSolverSpecificParametersAsString(
                self._parameters + HIGHS_ITERATION_LIMIT.format(iterations)
            )
        t0 = time.perf_counter()
        status = solver.Solve()
        seconds = time.perf_counter() - t0
        if status != _OPTIMAL:
            size = (
                f"{self.num_ops} ops, {len(self.src)} LP edges: {solver.NumVariables()} variables, "
                f"{solver.NumConstraints()} constraints"
            )
            if iterations is not None:
                raise SolverError(
                    f"m-SCT's favorite-child LP: backend '{self.backend}' did not solve it within "
                    f"{iterations:,} simplex iterations, the work {work_limit_s:g} s buys by the cost model "
                    f"(status {status}; {size}); --budget buys auto more, --algo sct has no such limit"
                )
            raise _failure(status, self.backend, time_limit_s, seconds, size)
        # Every value in one response, not one call per variable.
        from ortools.linear_solver import linear_solver_pb2

        response = linear_solver_pb2.MPSolutionResponse()
        solver.FillSolutionResponseProto(response)
        values = list(response.variable_value)
        n = self.num_ops
        return LPResult(
            num_ops=n,
            src=self.src,
            dst=self.dst,
            comm_us=self.comm_us,
            x=values[n + 1 :],
            start_us=values[:n],
            objective_us=solver.Objective().Value(),
            status="OPTIMAL",
            backend=self.backend,
            seconds=seconds,
            build_seconds=self.build_seconds,
            num_variables=solver.NumVariables(),
            num_constraints=solver.NumConstraints(),
        )


def _failure(
    status: int,
    backend: str,
    time_limit_s: float | None,
    seconds: float,
    size: str,
) -> SolverError:
    """The error for a solve that did not end optimal: backend, limit and LP size."""
    # Backends report a time-out differently (HiGHS 99, GLOP and PDLP
    # NOT_SOLVED, CLP FEASIBLE), so the wall clock tells whether the limit
    # was the cause.
    timed_out = time_limit_s is not None and seconds >= 0.95 * time_limit_s
    if status == _FEASIBLE:
        what = "stopped at the time limit with a feasible but not optimal solution"
    elif timed_out:
        what = "ran out of time before finding a solution"
    else:
        what = _STATUS_TEXT.get(status, "returned an unknown status")
    limit = f"{time_limit_s:g} s" if time_limit_s is not None else "none"
    hint = "; raise --solver-time-limit" if timed_out or status == _FEASIBLE else ""
    return SolverError(
        f"m-SCT's favorite-child LP: backend '{backend}' {what} (status {status}) after "
        f"{seconds:.2f} s (time limit {limit}; {size}){hint}"
    )


def favorite_children(result: LPResult, threshold: float = DEFAULT_THRESHOLD) -> list[int]:
    """Round the LP: ``fav[u]`` is u's favorite child, or -1 when it has none.

    An LP edge is a favorite when ``x_e < threshold``. Candidates are taken in
    order of increasing ``x_e`` (ties: lower ``src``, then lower ``dst``) and
    kept unless their parent already has a favorite child or their child a
    favorite parent, so no op ever gets two favorite children or two favorite
    parents, and the answer depends only on the LP values.

    The default threshold 1/2 is Hanen & Munier's rounding, the one their
    approximation bound is proved for. With ``threshold <= 1/2`` the degree
    rows make the conflict rule idle: if two out-edges e1, e2 of u had
    x < 1/2, then since every other out-edge has x <= 1,
    ``sum_{out of u} x < 1/2 + 1/2 + (outdeg(u) - 2) = outdeg(u) - 1``,
    violating u's out-degree row; the same holds for in-edges. (This holds
    exactly; a solver satisfies rows only to ~1e-9, so two values just under
    1/2 could slip through, and the rule then keeps the smaller one.) With
    ``threshold > 1/2`` conflicts do occur and the order above settles them.
    """
    if not 0.0 <= threshold <= 1.0:
        raise InputError(f"the favorite-child threshold must be in [0, 1], got {threshold}")
    x, src, dst = result.x, result.src, result.dst
    candidates = sorted((x[e], src[e], dst[e]) for e in range(len(x)) if x[e] < threshold)
    fav_child = [-1] * result.num_ops
    has_parent = [False] * result.num_ops
    for _, u, v in candidates:
        if fav_child[u] < 0 and not has_parent[v]:
            fav_child[u] = v
            has_parent[v] = True
    return fav_child
