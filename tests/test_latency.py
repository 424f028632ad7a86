"""--objective latency: Tarnawski et al.'s single-sample latency model, its evaluator and exact solver."""

from __future__ import annotations

import itertools
import json
import math
import os
import random

import pytest
from click.testing import CliRunner

from baechi_cli.cli.commands import main
from baechi_cli.core.errors import InfeasibleError
from baechi_cli.pipeline.latency import evaluate_latency, solve_latency
from baechi_cli.pipeline.maxload import LoadModel

TESTDATA = os.path.join(os.path.dirname(__file__), "..", "testdata", "workloads")
BERT3 = os.path.join(TESTDATA, "latency_OperatorGraphs_bert_l-3_inference.json")


def random_model(rng: random.Random, n: int, k: int, *, cpus: int, memory: float, groups: bool) -> LoadModel:
    """A random DAG of n ops (edges forward in id order), one tensor per op, optional colocation pairs."""
    edges = sorted({(a, b) for b in range(1, n) for a in rng.sample(range(b), rng.randint(1, min(2, b)))})
    consumers: dict[int, list[int]] = {}
    for a, b in edges:
        consumers.setdefault(a, []).append(b)
    unit = list(range(n))
    if groups:
        a, b = rng.sample(range(n), 2)
        unit[b] = unit[a]
    producers = sorted(consumers)
    return LoadModel(
        accel_us=[float(rng.randint(1, 9)) for _ in range(n)],
        cpu_us=[float(rng.randint(5, 40)) for _ in range(n)],
        accel_ok=[True] * n,
        size=[rng.randint(1, 5) for _ in range(n)],
        is_backward=[False] * n,
        unit_of_op=unit,
        edges=edges,
        tensor_src=producers,
        tensor_us=[float(rng.randint(0, 6)) for _ in producers],
        tensor_dst=[consumers[a] for a in producers],
        accelerators=k,
        memory=memory,
        cpus=cpus,
        names=[str(v) for v in range(n)],
    )


def brute_force(model: LoadModel) -> float:
    """The least latency over every valid split: each accelerator's ops convex, within memory, groups kept."""
    n, k = model.num_ops, model.accelerators
    reach = [[False] * n for _ in range(n)]
    for a, b in model.edges:
        reach[a][b] = True
    for m in range(n):
        for a in range(n):
            if reach[a][m]:
                for b in range(n):
                    reach[a][b] = reach[a][b] or reach[m][b]
    best = math.inf
    choices = range(k + (1 if model.cpus else 0))
    for assign in itertools.product(choices, repeat=n):
        if any(
            assign[v] != assign[w]
            for v in range(n)
            for w in range(n)
            if model.unit_of_op[v] == model.unit_of_op[w]
        ):
            continue
        ok = True
        for d in range(k):
            ops = [v for v in range(n) if assign[v] == d]
            if sum(model.size[v] for v in ops) > model.memory:
                ok = False
                break
            inside = set(ops)
            if any(
                reach[a][c] and reach[c][b] for a in ops for b in ops for c in range(n) if c not in inside
            ):
                ok = False
                break
        if ok:
            try:
                best = min(best, evaluate_latency(model, list(assign)).latency_us)
            except InfeasibleError:  # calls that feed each other
                continue
    return best


@pytest.mark.parametrize("seed", range(40))
def test_exact_search_equals_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(4, 7)
    k = rng.randint(1, 3)
    cpus = rng.choice((0, 1))
    memory = rng.choice((math.inf, float(rng.randint(6, 14))))
    model = random_model(rng, n, k, cpus=cpus, memory=memory, groups=not cpus and rng.random() < 0.5)
    expected = brute_force(model)
    if math.isinf(expected):
        with pytest.raises(Exception, match="no contiguous split"):
            solve_latency(model, max_sets=10**7)
        return
    split = solve_latency(model, max_sets=10**7)
    assert split.proven
    assert split.latency_us == pytest.approx(expected, rel=1e-12, abs=1e-9)
    assert split.lower_bound_us == split.latency_us
    # The split it returns is valid and priced as claimed.
    judged = evaluate_latency(model, split.device_of_op)
    assert judged.within_memory and judged.latency_us == split.latency_us


def test_a_stopped_search_keeps_a_valid_bound_and_a_valid_split():
    rng = random.Random(7)
    model = random_model(rng, 7, 3, cpus=1, memory=9.0, groups=False)
    full = solve_latency(model, max_sets=10**7)
    cut = solve_latency(model, max_sets=3)
    assert not cut.proven
    assert cut.lower_bound_us <= full.latency_us <= cut.latency_us
    # Its split (improved by local search) is valid: within memory, one contiguous call per accelerator.
    judged = evaluate_latency(model, cut.device_of_op)
    calls = [d for d in judged.call_device if d < model.accelerators]
    assert judged.within_memory and len(calls) == len(set(calls)) and judged.latency_us == cut.latency_us


def test_evaluator_cuts_a_non_contiguous_device_into_calls():
    # 0 -> 1 -> 2, device 0 holds 0 and 2: two calls there, one each side of device 1's.
    m = LoadModel.chain([1.0, 2.0, 3.0], send_us=[0.5, 0.25], accelerators=2)
    e = evaluate_latency(m, [0, 1, 0])
    assert e.call_device == [0, 0, 1]
    assert e.start_us == [0.0, 4.25, 1.5] and e.finish_us == [1.5, 7.5, 4.25]
    # A CPU op pays no transfers itself; the accelerator call after it receives its output.
    cpu = LoadModel(**{**m.__dict__, "cpus": 1, "cpu_us": [10.0, 20.0, 30.0]})
    assert evaluate_latency(cpu, [2, 0, 0]).latency_us == 10.0 + 0.5 + 2.0 + 3.0


def test_parallel_calls_overlap():
    # 0 feeds 1 and 2 side by side, both feed 3: splitting the branches beats one device.
    model = LoadModel(
        accel_us=[1.0, 10.0, 10.0, 1.0],
        cpu_us=[1.0, 10.0, 10.0, 1.0],
        accel_ok=[True] * 4,
        size=[0] * 4,
        is_backward=[False] * 4,
        unit_of_op=[0, 1, 2, 3],
        edges=[(0, 1), (0, 2), (1, 3), (2, 3)],
        tensor_src=[0, 1, 2],
        tensor_us=[0.5, 0.5, 0.5],
        tensor_dst=[[1, 2], [3], [3]],
        accelerators=4,
        memory=math.inf,
    )
    split = solve_latency(model)
    # 0 (1.5), then 1 and 2 at once (1.5 + 0.5 + 10 + 0.5), then 3 (12.5 + 1.0 + 1): one device takes 22.
    assert split.proven and split.latency_us == brute_force(model) == 14.5
    assert len(split.stage_device) == 4 and split.stage_start_us[1] == split.stage_start_us[2] == 1.5


def test_published_workload_agrees_with_their_evaluator():
    # baechi's own evaluator counts activations too: the split is made again on less memory.
    r = CliRunner().invoke(main, ["place", BERT3, "--objective", "latency", "--json", "-q"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    pipeline = doc["pipeline"]
    assert pipeline["objective"] == "latency"
    assert pipeline["latency_us"] >= pipeline["lower_bound_us"] > 0
    calls = pipeline["stages"]
    assert all(c["start_us"] <= c["finish_us"] <= pipeline["latency_us"] for c in calls)
    assert max(c["finish_us"] for c in calls) == pipeline["latency_us"]


def test_solver_on_the_published_file_with_its_own_devices():
    from baechi_cli.core.devices import parse_devices
    from baechi_cli.io.workload_json import read_workload_json, stated_devices
    from baechi_cli.pipeline.maxload import load_model

    spec, cpus = stated_devices(BERT3)
    assert (spec, cpus) == ("4x629145600,8x1000000000000000", 8)
    model = load_model(read_workload_json(BERT3), parse_devices(spec), cpus=cpus, follow_forward=False)
    split = solve_latency(model)
    # Their model (persistent bytes only): 408.4744 ms; greedy.exe -computeLatency prices this split
    # at 408.474 ms (bench/latency.md).
    assert split.latency_us == pytest.approx(408_474.4, abs=0.1)
    assert split.lower_bound_us > 0.95 * split.latency_us  # the bound counts the transfers memory forces
    assert split.latency_us < 416_204.4  # their greedy baseline


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--microbatches", "2"], "--microbatches needs --objective throughput"),
        (["--algo", "etf"], "places with the pipeline splitter, not --algo etf"),
    ],
)
def test_bad_combinations_are_one_line_errors(tmp_path, extra, message):
    report = tmp_path / "r.json"
    r = CliRunner().invoke(main, ["place", BERT3, "--objective", "latency", "--report", str(report), *extra])
    assert r.exit_code == 2
    assert message in r.output
    assert not report.exists()
