import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baechi_cli.devices import parse_devices
from baechi_cli.errors import InfeasibleError
from baechi_cli.graph import GraphBuilder
from baechi_cli.placers import get_placer
from baechi_cli.placers.memory import MemoryLedger
from baechi_cli.sim import simulate


def chain(n, out_bytes=100, compute=10.0, persistent=0):
    b = GraphBuilder()
    ids = [
        b.add_op(f"op{i}", "X", [out_bytes], compute_us=compute, persistent_bytes=persistent)
        for i in range(n)
    ]
    for s, d in zip(ids, ids[1:]):
        b.add_edge(s, d)
    return b


def test_topo_fills_devices_in_turn_up_to_equal_share():
    g = chain(8).build()
    p = get_placer("topo")(g, parse_devices("4x1MB"), {})
    assert p.device_of == [0, 0, 1, 1, 2, 2, 3, 3]


def test_topo_places_whole_colocation_groups():
    b = chain(6)
    g = b.build()
    # ops 0 and 5 must share a device: the group goes where op 0 goes
    g = g.replace(group=[0, 1, 2, 3, 4, 0])
    p = get_placer("topo")(g, parse_devices("3x1MB"), {})
    assert p.device_of[5] == p.device_of[0]


def test_topo_skips_a_device_without_room():
    b = GraphBuilder()
    big = b.add_op("big", "X", [10], compute_us=1, persistent_bytes=900)
    small = b.add_op("small", "X", [10], compute_us=1)
    b.add_edge(small, big)
    # device 0 has 500 bytes, device 1 has 2000: big cannot go to device 0
    spec = parse_devices("500B,2000B")
    p = get_placer("topo")(b.build(), spec, {})
    assert p.device_of[big] == 1
    assert simulate(b.build(), spec, p.device_of).feasible


def test_infeasible_says_what_is_needed_and_given():
    g = chain(2, persistent=600).build().replace(group=[0, 0])
    with pytest.raises(InfeasibleError) as info:
        get_placer("topo")(g, parse_devices("2x1KB"), {})
    msg = str(info.value)
    assert "1.20 KB (1200 bytes) on one device" in msg and "2.00 KB" in msg
    assert info.value.exit_code == 3


def test_ledger_counts_one_copy_per_tensor_and_device():
    b = GraphBuilder()
    a = b.add_op("a", "A", [100])
    c1 = b.add_op("c1", "C", [0])
    c2 = b.add_op("c2", "C", [0])
    b.add_edge(a, c1)
    b.add_edge(a, c2)
    led = MemoryLedger(b.build(), parse_devices("2x1KB"))
    led.commit([c1], 1, led.extra([c1], 1))
    led.commit([c2], 1, led.extra([c2], 1))
    # the consumers reserved one copy of a's output on device 1, before a was placed
    assert led.used == [0, 100]
    # a on device 0 adds its output there; on device 1 the reserved copy comes back
    assert led.extra([a], 0) == {0: 100}
    assert led.extra([a], 1) == {1: 0}
    led.commit([a], 1, led.extra([a], 1))
    assert led.used == [0, 100]


@st.composite
def random_dags(draw):
    n = draw(st.integers(2, 25))
    rng = random.Random(draw(st.integers(0, 10**6)))
    b = GraphBuilder()
    for i in range(n):
        b.add_op(
            f"v{i}",
            "X",
            [rng.randint(0, 400) for _ in range(rng.randint(1, 2))],
            compute_us=rng.choice([0.0, 1.0, 5.0, 20.0]),
            persistent_bytes=rng.choice([0, 0, 100, 300]),
            temporary_bytes=rng.choice([0, 50]),
        )
    g0 = b.build()
    for v in range(1, n):
        for u in rng.sample(range(v), k=min(v, rng.randint(0, 3))):
            b.add_edge(u, v, rng.randrange(len(g0.output_bytes[u])))
    g = b.build()
    group = list(range(n))
    for v in range(n):
        if rng.random() < 0.2:
            group[v] = group[rng.randrange(v + 1)]
    ndev = draw(st.integers(1, 4))
    mem = draw(st.sampled_from([800, 1500, 4000, 100000]))
    mode = draw(st.sampled_from(["parallel", "sequential"]))
    return g.replace(group=group), parse_devices(f"{ndev}x{mem}B").with_comm_mode(mode)


@settings(max_examples=150, deadline=None)
@given(random_dags())
def test_topo_never_exceeds_memory_and_keeps_groups(case):
    g, spec = case
    try:
        p = get_placer("topo")(g, spec, {})
    except InfeasibleError:
        return
    for v in range(g.num_ops):
        assert p.device_of[v] == p.device_of[g.group[v]]
    assert simulate(g, spec, p.device_of).feasible


@pytest.mark.parametrize("algo", ["etf", "topo"])
def test_placers_do_not_strand_a_big_group(algo):
    # Four 20-byte ops that m-ETF would spread over both devices (they run in
    # parallel), then one 90-byte op: spread 40/40, nothing has room for it.
    b = GraphBuilder()
    for i in range(4):
        b.add_op(f"small{i}", "X", [0], compute_us=10, persistent_bytes=20)
    b.add_op("big", "X", [0], compute_us=10, persistent_bytes=90)
    g = b.build()
    spec = parse_devices("2x100B")
    p = get_placer(algo)(g, spec, {})
    assert simulate(g, spec, p.device_of).feasible
