"""Benchmarks: start-up, placement of the committed graphs, and scaling on synthetic DAGs.

Writes bench/results.md (committed). Run with `make bench`; numbers are the
median of several runs on the machine that ran it, which the table names.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from synthetic import layered_dag  # noqa: E402

from baechi_cli.costs.analytic import estimate_costs  # noqa: E402
from baechi_cli.devices import parse_devices  # noqa: E402
from baechi_cli.pipeline import PlaceOptions, place_model  # noqa: E402
from baechi_cli.placers import get_placer  # noqa: E402
from baechi_cli.sim import simulate  # noqa: E402


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def startup() -> list[str]:
    baechi = os.path.join(os.path.dirname(sys.executable), "baechi")
    wall = median_time(lambda: subprocess.run([baechi, "--help"], check=True, capture_output=True), 7)
    imports = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import baechi_cli.cli"],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    tf = "yes" if "tensorflow" in imports else "no"
    return [
        "## Start-up",
        "",
        "| command | median wall (s) | imports tensorflow |",
        "|---|---|---|",
        f"| `baechi --help` | {wall:.3f} | {tf} |",
        "",
    ]


def committed_graphs() -> list[str]:
    rows = [
        "## `baechi place` on the committed graphs (m-TOPO, 4x8GB)",
        "",
        "| graph | ops | total (s) | load | profile | passes | place | simulate | step (ms) | lower bound (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in ("mlp.pb", "cnn.pb"):
        path = os.path.join(ROOT, "testdata", name)
        if not os.path.exists(path):
            continue
        spec = parse_devices("4x8GB")
        runs = [place_model(path, spec, PlaceOptions()) for _ in range(5)]
        t = {k: statistics.median(r.timings[k] for r in runs) for k in runs[0].timings}
        o = runs[0]
        rows.append(
            f"| {name} | {o.graph.num_ops} | {t['total']:.3f} | {t['load']:.3f} | {t['profile']:.3f} | "
            f"{t['passes']:.3f} | {t['place']:.3f} | {t['simulate']:.3f} | {o.sim.step_time_us / 1e3:.3f} | "
            f"{o.lower_bound_us / 1e3:.3f} |"
        )
    return rows + [""]


def scaling() -> list[str]:
    rows = [
        "## Scaling on synthetic layered DAGs (4 devices, 1 TB each: timing only)",
        "",
        "| ops | edges | analytic costs (s) | m-TOPO place (s) | simulate, parallel (s) | simulate, sequential (s) |",
        "|---|---|---|---|---|---|",
    ]
    spec = parse_devices("4x1TB")
    seq = spec.with_comm_mode("sequential")
    for n in (1_000, 10_000, 100_000):
        rows.append(_scaling_row(n, spec, seq))
    return rows + [""]


def _scaling_row(n: int, spec, seq) -> str:
    g = layered_dag(n)
    repeat = 3 if n <= 10_000 else 1
    t_cost = median_time(lambda: estimate_costs(g, spec), repeat)
    placement = get_placer("topo")(g, spec, {})
    t_place = median_time(lambda: get_placer("topo")(g, spec, {}), repeat)
    t_par = median_time(lambda: simulate(g, spec, placement.device_of), repeat)
    t_seq = median_time(lambda: simulate(g, seq, placement.device_of), repeat)
    return f"| {n:,} | {g.num_edges:,} | {t_cost:.3f} | {t_place:.3f} | {t_par:.3f} | {t_seq:.3f} |"


def main() -> None:
    lines = [
        "# Benchmarks",
        "",
        f"Made by `make bench` on {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}. Medians of repeated runs.",
        "",
    ]
    lines += startup()
    lines += committed_graphs()
    lines += scaling()
    out = os.path.join(HERE, "results.md")
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
