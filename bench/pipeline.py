"""--objective throughput against Tarnawski et al.'s DP (dp.cpp), on their published workloads.

For each throughput workload (testdata/workloads, and with ``--extra DIR`` a
checkout of msr-fiddle/dnn-partitioning's ``throughput-inputs``), with the
file's devices (maxFPGAs accelerators of maxSizePerFPGA, maxCPUs CPU cores),
it runs :func:`baechi_cli.pipeline.throughput.solve` at its default effort and
records the max-load, whether it is proven optimal (the search completed:
no contiguous split has a lower max-load), and the time (median of 3). The
DP's figures (``DP``, below) were measured by building their public
``throughput-dp/dp.cpp`` with ``g++ -O3`` outside this repository and
running it on the same files on this 2-core machine, which others shared:
the least wall time of three runs (the DP's most favourable); on the two
Inception graphs it was stopped after 300 s. Its code is not part of baechi.

Usage: python bench/pipeline.py [--extra DIR] > bench/pipeline.md
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import time

from benchlib import WORKLOADS, row, table

# One BLAS thread: dp.exe runs on one core, so both get one (and the machine's other core is
# often busy: threads contending for it made baechi's times noisy).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from baechi_cli.core.devices import parse_devices  # noqa: E402
from baechi_cli.io.workload_json import read_workload_json, stated_devices  # noqa: E402
from baechi_cli.pipeline.maxload import load_model  # noqa: E402
from baechi_cli.pipeline.throughput import solve  # noqa: E402

# dp.exe on the same file: (max-load ms, least wall s of 3 runs); None: did not finish in 300 s.
DP = {
    "LayerGraphs/bert24_inference": (17.789906, 0.00921),
    "LayerGraphs/bert24_training": (41.745812, 0.00920),
    "LayerGraphs/gnmt_inference": (32.910658, 12.3),
    "LayerGraphs/gnmt_training": (107.004414, 22.6),
    "LayerGraphs/inceptionv3_inference": None,
    "LayerGraphs/inceptionv3_training": None,
    "LayerGraphs/resnet50_inference": (33.774666, 0.0949),
    "LayerGraphs/resnet50_training": (78.631813, 0.137),
    "OperatorGraphs/bert_L-12_training": (437.997638, 25.6),
    "OperatorGraphs/bert_l-12_inference": (147.477984, 11.3),
    "OperatorGraphs/bert_l-3_inference": (27.918568, 0.685),
    "OperatorGraphs/bert_l-3_training": (65.303149, 4.54),
    "OperatorGraphs/bert_l-6_inference": (29.579506, 2.49),
    "OperatorGraphs/bert_l-6_training": (72.864966, 15.0),
    "OperatorGraphs/resnet50_inference": (124.348850, 0.107),
    "OperatorGraphs/resnet50_training": (255.194416, 0.249),
}
# dp.exe -expert on the human-experts/ splits (max-load ms).
EXPERT = {
    "LayerGraphs/bert24_inference": 20.084,
    "LayerGraphs/bert24_training": 49.4049,
    "LayerGraphs/gnmt_inference": 46.2085,
    "LayerGraphs/gnmt_training": 137.154,
    "LayerGraphs/inceptionv3_inference": 102.482,
    "LayerGraphs/inceptionv3_training": 213.654,
    "LayerGraphs/resnet50_inference": 43.9183,
    "LayerGraphs/resnet50_training": 112.108,
}


def key_of(path: str) -> str:
    base = os.path.basename(path)[: -len(".json")]
    if base.startswith("throughput_"):
        kind, _, rest = base[len("throughput_") :].partition("_")
        return f"{kind}/{rest}"
    return f"{os.path.basename(os.path.dirname(path))}/{base}"


def run(path: str, repeat: int) -> tuple[float, bool, float]:
    spec, cpus = stated_devices(path)
    model = load_model(read_workload_json(path), parse_devices(spec), cpus=cpus, follow_forward=False)
    times, split = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        split = solve(model)
        times.append(time.perf_counter() - t0)
    assert split is not None
    return split.max_load_us / 1000, split.proven, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--extra", help="a dnn-partitioning checkout's throughput-inputs folder")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    paths = sorted(glob.glob(os.path.join(WORKLOADS, "throughput_*.json")))
    if args.extra:
        paths += sorted(glob.glob(os.path.join(args.extra, "*", "*.json")))
    seen = set()
    print("# --objective throughput vs Tarnawski et al.'s DP\n")
    print(__doc__.split("Usage:")[0].strip().replace("\n", " "), "\n")
    header = ["workload", "baechi max-load (ms)", "proven", "baechi s", "DP max-load (ms)", "DP s", "ratio"]
    print("\n".join(table([*header, "expert (ms)"], [])))
    for path in paths:
        key = key_of(path)
        if key in seen:
            continue
        seen.add(key)
        ours, proven, seconds = run(path, args.repeat)
        dp = DP.get(key)
        dp_load = f"{dp[0]:.6f}" if dp else "did not finish (300 s)"
        dp_s = f"{dp[1]:.3g}" if dp else "> 300"
        ratio = f"{ours / dp[0]:.6f}" if dp else ""
        expert = EXPERT.get(key)
        cells = [key, f"{ours:.6f}", "yes" if proven else "no", f"{seconds:.2f}", dp_load, dp_s, ratio]
        print(row([*cells, f"{expert if expert else ''}"]), flush=True)


if __name__ == "__main__":
    main()
