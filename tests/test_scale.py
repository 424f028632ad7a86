"""Heavy cases (marker `slow`): large synthetic graphs through placer and simulator.

These check correctness at scale, not speed (speed is `make bench`'s job).
"""

import pytest
from benchmodules import bench_module

from baechi_cli import placers
from baechi_cli.core.devices import parse_devices
from baechi_cli.core.graph import CONTROL_PORT
from baechi_cli.evaluator.evaluate import evaluate
from baechi_cli.evaluator.sim import lower_bound, simulate

layered_dag = bench_module("synthetic").layered_dag

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_100k_ops_topo_placement_is_a_valid_schedule(mode):
    g = layered_dag(100_000, seed=7)
    spec = parse_devices("4x1TB").with_comm_mode(mode)
    p = placers.get("topo").place(g, spec)
    ev = evaluate(g, spec, p)
    r = ev.timeline
    assert ev.feasible
    assert ev.value_us == r.step_time_us >= lower_bound(g, spec) > 0
    # No two ops overlap on a device, in the order they ran.
    for seq in r.order:
        for a, b in zip(seq, seq[1:]):
            assert r.end[a] <= r.start[b]
    # Every input is present before its consumer starts.
    arrival = {(t.src_op, t.port, t.dst_device): t.end for t in r.transfers}
    for e in range(g.num_edges):
        u, v = g.edge_src[e], g.edge_dst[e]
        if p.device_of[u] == p.device_of[v]:
            assert r.end[u] <= r.start[v]
        else:
            port = g.edge_port[e]
            assert arrival[(u, port if port != CONTROL_PORT else CONTROL_PORT, p.device_of[v])] <= r.start[v]
    # Replaying the order reproduces the timeline exactly.
    again = simulate(g, spec, p.device_of, r.order)
    assert again.start == r.start and again.end == r.end
