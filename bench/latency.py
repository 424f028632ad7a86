"""--objective latency against Tarnawski et al.'s latency baselines, on their published workloads.

For each latency workload (testdata/workloads, and with ``--extra DIR`` a
checkout of msr-fiddle/dnn-partitioning's ``latency-inputs``), with the
file's devices (maxFPGAs accelerators of maxSizePerFPGA, maxCPUs CPU cores),
it runs :func:`baechi_cli.pipeline.latency.solve_latency` at its default effort and
records the latency of one sample, whether it is proven optimal, the lower
bound, and the time (median of 3). Their figures (``GREEDY`` and ``EXPERT``
below) were measured by building their public ``latency-greedy/greedy.cpp``
with ``g++ -O3`` outside this repository: its greedy baseline's latency, and
``greedy.exe -computeLatency`` on their human-expert splits (some of which
exceed the accelerators' memory); ``greedy.exe -computeLatency`` on baechi's
split gave baechi's latency on every file, and baechi's ``evaluate_latency``
on the expert splits gave their figures, to the 3 decimals it prints. Its
code is not part of baechi; their IP (``lip.py``) needs Gurobi and was not run.

Usage: python bench/latency.py [--extra DIR] > bench/latency.md
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import time

from benchlib import WORKLOADS, row, table

from baechi_cli.core.devices import parse_devices
from baechi_cli.io.workload_json import read_workload_json, stated_devices
from baechi_cli.pipeline.latency import solve_latency
from baechi_cli.pipeline.maxload import load_model

# greedy.exe on the same file: (latency ms, wall s).
GREEDY = {
    "LayerGraphs/bert24_inference": (100.2185, 0.008),
    "LayerGraphs/gnmt_inference": (268.5005, 0.008),
    "LayerGraphs/inceptionv3_inference": (2485.2396, 0.049),
    "LayerGraphs/resnet50_inference": (4197.0555, 0.019),
    "OperatorGraphs/bert_l-12_inference": (867.8395, 0.145),
    "OperatorGraphs/bert_l-3_inference": (416.2044, 0.014),
    "OperatorGraphs/bert_l-6_inference": (494.1352, 0.050),
    "OperatorGraphs/resnet50_inference": (839.5363, 0.022),
}
# greedy.exe -computeLatency on human-experts/*_expert.json: (latency ms, accelerators over memory).
EXPERT = {
    "LayerGraphs/bert24_inference": (111.937, 0),
    "LayerGraphs/gnmt_inference": (293.403, 1),
    "LayerGraphs/inceptionv3_inference": (865.519, 3),
    "LayerGraphs/resnet50_inference": (1014.927, 3),
}


def key_of(path: str) -> str:
    base = os.path.basename(path)[: -len(".json")]
    if base.startswith("latency_"):
        kind, _, rest = base[len("latency_") :].partition("_")
        return f"{kind}/{rest}"
    return f"{os.path.basename(os.path.dirname(path))}/{base}"


def run(path: str, repeat: int) -> tuple[float, bool, float, float]:
    spec, cpus = stated_devices(path)
    model = load_model(read_workload_json(path), parse_devices(spec), cpus=cpus, follow_forward=False)
    times, split = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        split = solve_latency(model)
        times.append(time.perf_counter() - t0)
    assert split is not None
    return split.latency_us / 1000, split.proven, split.lower_bound_us / 1000, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--extra", help="a dnn-partitioning checkout's latency-inputs folder")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    paths = sorted(glob.glob(os.path.join(WORKLOADS, "latency_*.json")))
    if args.extra:
        paths += sorted(glob.glob(os.path.join(args.extra, "*", "*.json")))
    seen = set()
    print("# --objective latency vs Tarnawski et al.'s latency baselines\n")
    print(__doc__.split("Usage:")[0].strip().replace("\n", " "), "\n")
    header = ["workload", "baechi latency (ms)", "proven", "lower bound (ms)", "gap", "baechi s"]
    print("\n".join(table([*header, "their greedy (ms)", "greedy / baechi", "expert (ms)"], [])))
    for path in paths:
        key = key_of(path)
        if key in seen:
            continue
        seen.add(key)
        ours, proven, lower, seconds = run(path, args.repeat)
        greedy = GREEDY.get(key)
        expert = EXPERT.get(key)
        expert_text = ""
        if expert:
            expert_text = f"{expert[0]}" + (f" ({expert[1]} over memory)" if expert[1] else "")
        cells = [key, f"{ours:.4f}", "yes" if proven else "no", f"{lower:.4f}", f"{ours / lower - 1:.1%}"]
        cells += [
            f"{seconds:.2f}",
            f"{greedy[0]:.4f}" if greedy else "",
            f"{greedy[0] / ours:.3f}" if greedy else "",
        ]
        print(row([*cells, expert_text]), flush=True)
    print(FOOTER)


FOOTER = """
"proven: no": the search stopped at its default effort (40,000 enumerated calls); the latency
is the best split it found and the lower bound a proof that no contiguous split is faster.
"over memory": the expert split puts more than maxSizePerFPGA bytes on that many accelerators
(and bert24's uses 6 accelerators where the file has 5), so it is not a valid split of the
file; its latency is priced all the same. Times are on the 2-core machine, with other work
running beside it in the committed table."""


if __name__ == "__main__":
    main()
