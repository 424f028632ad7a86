"""m-SCT's favorite-child LP: hand-solved small LPs, rounding, failures, determinism."""

import math
import random

import pytest
from benchmodules import bench_module

from baechi_cli.core.devices import DEFAULT_BANDWIDTH_BYTES_PER_US, DEFAULT_LATENCY_US, parse_devices
from baechi_cli.core.errors import EXIT_SOLVER, InputError, SolverError
from baechi_cli.core.graph import CONTROL_PORT, GraphBuilder
from baechi_cli.placers import sct_lp
from baechi_cli.placers.sct_lp import LPResult, favorite_children, lp_edges, solve_favorite_lp

layered_dag = bench_module("synthetic").layered_dag

SPEC = parse_devices("4x8GB")


def build(ops, edges):
    """ops: [compute_us]; edges: (src, dst, transfer_us) with a measured transfer time."""
    b = GraphBuilder()
    for i, p in enumerate(ops):
        b.add_op(f"op{i}", "X", [1000], compute_us=p)
    for s, d, t in edges:
        b.add_edge(s, d, transfer_us=t)
    return b.build()


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-7, abs_tol=1e-7)


# --- hand-solved LPs ------------------------------------------------------------


def test_fork_the_child_with_the_larger_comm_is_favorite():
    # a -> l (c=5), a -> r (c=8), all p=10. x_l + x_r >= 1 and
    # w = 20 + max(5 x_l, 8 x_r): optimal at 5 x_l = 8 x_r, x_l = 8/13, x_r = 5/13.
    res = solve_favorite_lp(build([10, 10, 10], [(0, 1, 5.0), (0, 2, 8.0)]), SPEC)
    assert res.status == "OPTIMAL" and res.backend == "highs"
    assert (res.src, res.dst, res.comm_us) == ([0, 0], [1, 2], [5.0, 8.0])
    assert close(res.x[0], 8 / 13) and close(res.x[1], 5 / 13)
    assert close(res.objective_us, 20 + 40 / 13)
    assert favorite_children(res) == [2, -1, -1]
    # s_a, w, x_l, x_r; the two precedence rows, a's out-degree row, two sink rows.
    assert (res.num_variables, res.num_constraints) == (6, 5)


def test_fork_a_critical_child_beats_a_larger_comm():
    # l runs 30 µs: w = 10 + max(30 + 5 x_l, 10 + 8 x_r) = 40 only with x_l = 0.
    res = solve_favorite_lp(build([10, 30, 10], [(0, 1, 5.0), (0, 2, 8.0)]), SPEC)
    assert close(res.objective_us, 40.0)
    assert close(res.x[0], 0.0) and close(res.x[1], 1.0)
    assert favorite_children(res) == [1, -1, -1]


def test_join_the_parent_with_the_larger_comm_is_favorite():
    # l -> j (c=5), r -> j (c=8): the mirror image of the fork.
    res = solve_favorite_lp(build([10, 10, 10], [(0, 2, 5.0), (1, 2, 8.0)]), SPEC)
    assert close(res.x[0], 8 / 13) and close(res.x[1], 5 / 13)
    assert close(res.objective_us, 20 + 40 / 13)
    assert favorite_children(res) == [-1, 2, -1]
    assert (res.num_variables, res.num_constraints) == (6, 4)  # one sink row


def test_chain_all_edges_are_favorite():
    # No degree rows: every x_e = 0 and the LP is the plain critical path.
    res = solve_favorite_lp(build([10, 20, 30], [(0, 1, 100.0), (1, 2, 100.0)]), SPEC)
    assert res.x == pytest.approx([0.0, 0.0], abs=1e-9)
    assert close(res.objective_us, 60.0)
    assert res.start_us == pytest.approx([0.0, 10.0, 30.0], abs=1e-7)
    assert favorite_children(res) == [1, 2, -1]


def test_isolated_ops_and_empty_graph():
    res = solve_favorite_lp(build([10, 25], []), SPEC)
    assert close(res.objective_us, 25.0) and favorite_children(res) == [-1, -1]
    empty = solve_favorite_lp(build([], []), SPEC)
    assert empty.objective_us == 0.0 and favorite_children(empty) == []


# --- LP edges -----------------------------------------------------------------------


def test_multi_edges_and_control_edges_merge_into_one_lp_edge():
    b = GraphBuilder()
    a = b.add_op("a", "X", [1000, 2000], compute_us=10)
    c = b.add_op("c", "X", [], compute_us=10)
    b.add_edge(a, c, 0)
    b.add_edge(a, c, 0)  # the same tensor twice (e.g. Add(x, x)): sent once
    b.add_edge(a, c, 1)
    b.add_edge(a, c, CONTROL_PORT)  # a 0-byte tensor: costs the latency
    g = b.build()
    per_byte = 1 / DEFAULT_BANDWIDTH_BYTES_PER_US
    expected = 3 * DEFAULT_LATENCY_US + 3000 * per_byte
    src, dst, comm = lp_edges(g, SPEC)
    assert (src, dst) == ([0], [1]) and close(comm[0], expected)
    res = solve_favorite_lp(g, SPEC)
    assert len(res.x) == 1 and res.num_variables == 4 and res.num_constraints == 2
    assert favorite_children(res) == [1, -1]


def test_measured_transfer_times_override_the_comm_model():
    b = GraphBuilder()
    a = b.add_op("a", "X", [1000, 1000], compute_us=10)
    c = b.add_op("c", "X", [], compute_us=10)
    b.add_edge(a, c, 0, transfer_us=7.0)
    b.add_edge(a, c, 0, transfer_us=9.0)  # one tensor, two measurements: the larger
    b.add_edge(a, c, 1)  # unmeasured: the comm model
    _, _, comm = lp_edges(b.build(), SPEC)
    assert close(comm[0], 9.0 + SPEC.interconnect.transfer_time(1000, 0, 1))


def test_per_link_overrides_are_ignored(tmp_path):
    path = tmp_path / "devices.yaml"
    path.write_text(
        "devices: {count: 2, memory: 8GB}\n"
        "interconnect: {latency: 100us, links: [{a: 0, b: 1, latency: 1us}]}\n"
    )
    spec = parse_devices(str(path))
    assert spec.interconnect.transfer_time(0, 0, 1) == 1.0
    g = build([1, 1], [(0, 1, None)])
    assert close(lp_edges(g, spec)[2][0], 100.0 + 1000 / spec.interconnect.bandwidth_bytes_per_us)


def test_lp_edges_do_not_depend_on_edge_insertion_order():
    g = layered_dag(300, seed=3)
    order = list(range(g.num_edges))
    random.Random(1).shuffle(order)
    b = GraphBuilder()
    for v in range(g.num_ops):
        b.add_op(g.names[v], "X", g.output_bytes[v], compute_us=g.compute_us[v])
    for e in order:
        b.add_edge(g.edge_src[e], g.edge_dst[e], g.edge_port[e])
    assert lp_edges(b.build(), SPEC) == lp_edges(g, SPEC)


# --- rounding ----------------------------------------------------------------------


def fake_result(num_ops, edges):
    """An LPResult with chosen x values: edges are (src, dst, x)."""
    return LPResult(
        num_ops=num_ops,
        src=[s for s, _, _ in edges],
        dst=[d for _, d, _ in edges],
        comm_us=[1.0] * len(edges),
        x=[x for _, _, x in edges],
        start_us=[0.0] * num_ops,
        objective_us=0.0,
        status="OPTIMAL",
        backend="test",
        seconds=0.0,
        build_seconds=0.0,
        num_variables=0,
        num_constraints=0,
    )


def test_threshold_is_strict_and_defaults_to_one_half():
    res = fake_result(3, [(0, 1, 0.5), (0, 2, 0.4999)])
    assert favorite_children(res) == [2, -1, -1]
    assert favorite_children(res, 0.4) == [-1, -1, -1]
    assert favorite_children(res, 0.0) == [-1, -1, -1]
    assert sct_lp.DEFAULT_THRESHOLD == 0.5


def test_threshold_above_half_resolves_conflicts_smallest_x_first():
    # Both children of 0 are below 0.7: the smaller x wins.
    res = fake_result(3, [(0, 1, 0.6), (0, 2, 0.55)])
    assert favorite_children(res, 0.7) == [2, -1, -1]
    # Equal x: the lower child id wins.
    assert favorite_children(fake_result(3, [(0, 2, 0.6), (0, 1, 0.6)]), 0.7) == [1, -1, -1]
    # Two parents of 2 with equal x: the lower parent id wins; 1 then has none.
    assert favorite_children(fake_result(3, [(1, 2, 0.6), (0, 2, 0.6)]), 0.7) == [2, -1, -1]
    # A lost conflict does not block the loser's other edges.
    res = fake_result(4, [(0, 2, 0.51), (1, 2, 0.6), (1, 3, 0.65)])
    assert favorite_children(res, 0.7) == [2, 3, -1, -1]
    assert favorite_children(res, 1.0) == [2, 3, -1, -1]


def test_rounding_never_gives_two_favorite_parents():
    rng = random.Random(7)
    edges = sorted({(u, v) for u, v in (sorted(rng.sample(range(40), 2)) for _ in range(150))})
    res = fake_result(40, [(u, v, rng.random()) for u, v in edges])
    for threshold in (0.3, 0.5, 0.6, 0.9, 1.0):
        fav = favorite_children(res, threshold)
        children = [v for v in fav if v >= 0]
        assert len(children) == len(set(children))
        xs = dict(zip(zip(res.src, res.dst), res.x))
        assert all(xs[(u, v)] < threshold for u, v in enumerate(fav) if v >= 0)


def test_threshold_out_of_range_is_an_input_error():
    res = fake_result(2, [(0, 1, 0.1)])
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(InputError, match="threshold"):
            favorite_children(res, bad)


def test_at_one_half_the_degree_rows_leave_no_conflicts():
    # The docstring's proof, checked on a real LP: plain thresholding already
    # gives at most one favorite child per op and one favorite parent per op.
    res = solve_favorite_lp(layered_dag(400, seed=5), SPEC)
    below = [(u, v) for u, v, x in zip(res.src, res.dst, res.x) if x < 0.5]
    assert len({u for u, _ in below}) == len(below) == len({v for _, v in below})
    fav = favorite_children(res)
    assert sorted((u, v) for u, v in enumerate(fav) if v >= 0) == sorted(below)


# --- failures ----------------------------------------------------------------------


def test_a_tiny_time_limit_raises_a_solver_error():
    g = layered_dag(5000, seed=0)
    with pytest.raises(SolverError) as info:
        solve_favorite_lp(g, SPEC, time_limit_s=0.01)
    msg = str(info.value)
    assert "'highs'" in msg and "time limit 0.01 s" in msg and "5000 ops" in msg
    assert "--solver-time-limit" in msg
    assert info.value.exit_code == EXIT_SOLVER


def test_a_work_limit_stops_at_the_same_iteration_every_time():
    # layered_dag(1000)'s LP needs about 3,000 dual simplex iterations (bench/search.md):
    # 1 ms of work buys 1e-3 / (5e-9 * (rows + columns)) of them, about 30.
    g = layered_dag(1000, seed=0)
    messages = set()
    for _ in range(2):
        with pytest.raises(SolverError, match="simplex iterations, the work 0.001 s buys") as info:
            solve_favorite_lp(g, SPEC, work_limit_s=0.001)
        messages.add(str(info.value))
        assert info.value.exit_code == EXIT_SOLVER and "--budget" in str(info.value)
    assert len(messages) == 1
    # Enough work: the same answer as with no limit at all.
    free, limited = solve_favorite_lp(g, SPEC), solve_favorite_lp(g, SPEC, work_limit_s=10.0)
    assert (limited.x, limited.start_us, limited.objective_us) == (free.x, free.start_us, free.objective_us)
    with pytest.raises(InputError, match="work limit"):
        solve_favorite_lp(g, SPEC, work_limit_s=0.0)


def test_a_work_limit_buys_iterations_by_the_lps_size():
    assert sct_lp.iteration_limit(1.0, 11884, 11240) == 8649
    assert sct_lp.iteration_limit(2.0, 11884, 11240) == 17298  # floor(2 / (5e-9 * 23124))
    assert sct_lp.iteration_limit(1e-12, 10, 10) == 1  # never 0: HiGHS reads 0 as no iterations


@pytest.mark.parametrize(
    ("status", "limit", "words"),
    [
        (2, None, "infeasible"),
        (3, None, "unbounded"),
        (4, None, "abnormal"),
        (5, None, "invalid"),
        (6, None, "did not solve"),
        (85, None, "parameters"),
        (99, None, "unknown status"),
        (1, 30.0, "feasible but not optimal"),
    ],
)
def test_every_non_optimal_status_raises(monkeypatch, status, limit, words):
    from ortools.linear_solver import pywraplp

    monkeypatch.setattr(pywraplp.Solver, "Solve", lambda self, *args: status)
    g = build([10, 10, 10], [(0, 1, 5.0), (0, 2, 8.0)])
    with pytest.raises(SolverError, match=words) as info:
        solve_favorite_lp(g, SPEC, time_limit_s=limit)
    msg = str(info.value)
    assert f"(status {status})" in msg and "3 ops, 2 LP edges" in msg and "'highs'" in msg
    assert ("--solver-time-limit" in msg) == (status == 1)


def test_unknown_or_unavailable_backends_and_bad_limits(monkeypatch):
    g = build([10], [])
    with pytest.raises(InputError, match="unknown LP backend 'gurobi'"):
        solve_favorite_lp(g, SPEC, backend="gurobi")
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InputError, match="time limit"):
            solve_favorite_lp(g, SPEC, time_limit_s=bad)
    monkeypatch.setitem(sct_lp.BACKENDS, "glpk", ("GLPK_LP", ""))
    with pytest.raises(SolverError, match="not available"):
        solve_favorite_lp(g, SPEC, backend="glpk")


def test_highs_prints_nothing_to_stdout(capfd):
    solve_favorite_lp(build([10, 10], [(0, 1, 5.0)]), SPEC)
    assert capfd.readouterr().out == ""


# --- backends and determinism ----------------------------------------------------------


def test_same_input_same_favorites():
    g = layered_dag(500, seed=2)
    first = solve_favorite_lp(g, SPEC)
    second = solve_favorite_lp(g, SPEC)
    assert first.x == second.x and first.objective_us == second.objective_us
    assert favorite_children(first) == favorite_children(second)


@pytest.mark.parametrize("backend", ["glop", "CLP"])
def test_simplex_backends_agree_on_the_objective(backend):
    g = layered_dag(300, seed=4)
    ref = solve_favorite_lp(g, SPEC)
    res = solve_favorite_lp(g, SPEC, backend=backend)
    assert res.backend == backend.lower()
    assert math.isclose(res.objective_us, ref.objective_us, rel_tol=1e-6)


def test_pdlp_solves_a_small_lp():
    # PDLP is first-order: optimal only to its tolerances, hence the looser check.
    res = solve_favorite_lp(build([10, 10, 10], [(0, 1, 5.0), (0, 2, 8.0)]), SPEC, backend="pdlp")
    assert math.isclose(res.objective_us, 20 + 40 / 13, rel_tol=1e-4)
