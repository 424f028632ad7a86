"""Tarnawski et al.'s max-load model and its solver (baechi_cli.throughput), and --objective throughput.

The solver is checked against brute force: on small random DAGs every
assignment of units to stages that is monotone along the edges (a
contiguous split) is evaluated, and a split the solver calls proven must
equal the least of them. The real workloads' figures are those of the
authors' own DP (dp.cpp, built from their public repository; bench/ has the
table): the model must reproduce them.
"""

from __future__ import annotations

import itertools
import json
import random

import pytest
from click.testing import CliRunner

from baechi_cli.cli import main
from baechi_cli.devices import parse_devices
from baechi_cli.io.workload_json import read_workload_json, read_workload_meta
from baechi_cli.throughput import LoadModel, evaluate, solve, units

WORKLOADS = "testdata/workloads"


def random_model(n: int, seed: int, accelerators: int, memory: float = float("inf")) -> LoadModel:
    rng = random.Random(seed)
    edges = sorted({(a, b) for b in range(1, n) for a in rng.sample(range(b), min(b, rng.randint(1, 2)))})
    dst: dict[int, list[int]] = {}
    for a, b in edges:
        dst.setdefault(a, []).append(b)
    srcs = sorted(dst)
    return LoadModel(
        accel_us=[float(rng.randint(1, 20)) for _ in range(n)],
        cpu_us=[float(rng.randint(10, 60)) for _ in range(n)],
        accel_ok=[True] * n,
        size=[rng.randint(1, 10) for _ in range(n)],
        is_backward=[False] * n,
        unit_of_op=list(range(n)),
        edges=edges,
        tensor_src=srcs,
        tensor_us=[float(rng.randint(0, 8)) for _ in srcs],
        tensor_dst=[dst[a] for a in srcs],
        accelerators=accelerators,
        memory=memory,
    )


def brute_force(model: LoadModel) -> float:
    """The least max-load over every contiguous split on accelerators (monotone stage labels)."""
    n, k = model.num_ops, model.accelerators
    best = float("inf")
    for stage in itertools.product(range(k), repeat=n):
        if any(stage[a] > stage[b] for a, b in model.edges):
            continue
        judged = evaluate(model, list(stage))
        if judged.within_memory:
            best = min(best, judged.max_load_us)
    return best


@pytest.mark.parametrize("seed", range(12))
def test_proven_split_equals_brute_force(seed):
    model = random_model(7, seed, accelerators=3, memory=30 if seed % 3 == 0 else float("inf"))
    split = solve(model)
    assert split.proven
    assert split.max_load_us == pytest.approx(brute_force(model))
    assert evaluate(model, split.device_of_op).max_load_us == pytest.approx(split.max_load_us)


def test_evaluation_counts_a_tensor_once_per_receiving_device():
    # op 0 feeds 1 and 2; on three devices 0 sends once (cost 5) and each receiver pays 5.
    model = LoadModel(
        accel_us=[1.0, 2.0, 3.0],
        cpu_us=[1.0, 2.0, 3.0],
        accel_ok=[True] * 3,
        size=[0] * 3,
        is_backward=[False] * 3,
        unit_of_op=[0, 1, 2],
        edges=[(0, 1), (0, 2)],
        tensor_src=[0],
        tensor_us=[5.0],
        tensor_dst=[[1, 2]],
        accelerators=3,
        memory=float("inf"),
    )
    assert evaluate(model, [0, 1, 2]).loads_us == [6.0, 7.0, 8.0]
    assert evaluate(model, [0, 1, 1]).loads_us == [6.0, 10.0, 0.0]


def workload_model(name: str):
    from baechi_cli.throughput import load_model

    path = f"{WORKLOADS}/{name}"
    graph, meta = read_workload_json(path), read_workload_meta(path)
    devices = parse_devices(f"{meta.max_fpgas}x{meta.max_size_per_fpga},{meta.max_cpus}x1000000000000000")
    return load_model(graph, devices, cpus=meta.max_cpus, follow_forward=False)


@pytest.mark.parametrize(
    ("name", "dp_max_load_ms", "proven"),
    [
        # the authors' DP on the same files (dp.exe, bench/pipeline.md)
        ("throughput_OperatorGraphs_resnet50_training.json", 255.19441645217384, True),
        ("throughput_LayerGraphs_gnmt_training.json", 107.0044140625, False),
        ("throughput_OperatorGraphs_bert_l-3_training.json", 65.30314912208605, False),
    ],
)
def test_workloads_reach_the_authors_dp_optimum(name, dp_max_load_ms, proven):
    model = workload_model(name)
    split = solve(model, max_sets=20_000)
    assert split.max_load_us <= dp_max_load_ms * 1000 * 1.001
    assert split.proven or not proven
    # Tie-breaking aside, nothing can beat the DP's optimum of the same model.
    assert split.max_load_us >= dp_max_load_ms * 1000 * (1 - 1e-6)


def test_backward_units_follow_their_colour_class():
    model = workload_model("throughput_LayerGraphs_gnmt_training.json")
    assert len(set(units(model))) == 96  # 192 ops: each forward layer with its gradient


def test_mixed_accelerators_count_at_the_slowest_and_smallest():
    from baechi_cli.throughput import load_model

    graph = read_workload_json(f"{WORKLOADS}/throughput_LayerGraphs_gnmt_training.json")
    model = load_model(graph, parse_devices("1x16GB,1x8GB"))
    assert model.memory == 8 * 10**9 and model.accelerators == 2


def test_cli_takes_the_devices_from_the_workload(tmp_path):
    report = tmp_path / "r.json"
    result = CliRunner().invoke(
        main,
        [
            "place",
            f"{WORKLOADS}/throughput_OperatorGraphs_resnet50_training.json",
            "--objective",
            "throughput",
            "--report",
            str(report),
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(report.read_text())
    pipeline = doc["pipeline"]
    assert pipeline["proven_optimal"]
    assert pipeline["max_load_us"] == pytest.approx(255194.416, rel=1e-6)
    assert len(doc["devices"]) == 7  # maxFPGAs 6 plus maxCPUs 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--objective", "throughput", "--microbatches", "0"], "0 is not in the range"),
        (["--microbatches", "4", "-d", "4x16GB"], "--microbatches needs --objective throughput"),
        (["--objective", "throughput", "--schedule", "gpipe"], "--schedule needs --microbatches"),
        (["--objective", "throughput", "--algo", "etf", "-d", "4x16GB"], "pipeline splitter"),
    ],
)
def test_bad_options_are_one_line_errors(tmp_path, args, message):
    report = tmp_path / "r.json"
    result = CliRunner().invoke(
        main,
        ["place", f"{WORKLOADS}/throughput_LayerGraphs_gnmt_training.json", "--report", str(report), *args],
    )
    assert result.exit_code == 2
    assert message in result.output
    assert not report.exists()


def test_a_workload_without_max_fpgas_needs_devices(tmp_path):
    doc = json.loads(open(f"{WORKLOADS}/throughput_LayerGraphs_gnmt_training.json").read())
    del doc["maxFPGAs"]
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    result = CliRunner().invoke(main, ["place", str(path), "--objective", "throughput"])
    assert result.exit_code == 2
    assert "maxFPGAs" in result.output and str(path) in result.output


def test_registry_default_matches_the_solver():
    from baechi_cli import placers, throughput

    assert placers.PipelineOptions().max_sets == throughput.DEFAULT_MAX_SETS


def test_summary_shows_the_stages_and_the_schedule():
    result = CliRunner().invoke(
        main,
        [
            "place",
            f"{WORKLOADS}/throughput_LayerGraphs_gnmt_training.json",
            "--objective",
            "throughput",
            "--microbatches",
            "4",
            "--schedule",
            "gpipe",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "pipeline: max-load" in result.output and "stages: " in result.output
    assert "gpipe, 4 microbatches" in result.output
    assert sum(line.startswith("s") and "|" in line for line in result.output.splitlines()) >= 1
