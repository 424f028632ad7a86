"""Measure one placement case in a fresh process and print its numbers as one JSON line.

bench/run.py starts this script once per (graph, devices, comm mode,
algorithm), so that ``ru_maxrss`` is that case's peak resident memory and
nothing else's. It goes through the library's own pipeline (``prepare`` and
``run_candidate``), so step times are the ones ``baechi compare`` prints.

Usage: ``python bench/run_one.py SOURCE DEVICES COMM ALGO [--repeat N]``.
SOURCE is a model file (a workload .json or a GraphDef) or ``synthetic:N``
(``synthetic.layered_dag(N)``, already costed, so it skips the cost model and
the passes); DEVICES is a ``--devices`` spec. The placer runs ``N`` times on
the same prepared graph (placement time: the median); a run that fails is not
repeated. An exception that is not a :class:`BaechiError` is reported as a
crash, never raised.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from benchlib import peak_rss_bytes
from synthetic import layered_dag

from baechi_cli import placers
from baechi_cli.app.place import prepare, prepare_graph
from baechi_cli.core.devices import DeviceSpec, parse_devices
from baechi_cli.core.errors import BaechiError
from baechi_cli.search.candidates import PlaceOptions, Prepared, run_candidate

SYNTHETIC = "synthetic:"


def prepare_synthetic(num_ops: int, devices: DeviceSpec) -> Prepared:
    """What ``prepare`` gives for a file, for an in-memory layered DAG: the graph and its bounds (no passes)."""
    t0 = time.perf_counter()
    graph = layered_dag(num_ops)
    load_seconds = time.perf_counter() - t0
    options = PlaceOptions(coplace=False, fusion=False, forward_only=False)
    prepared = prepare_graph(graph, devices, options, name=f"{SYNTHETIC}{num_ops}")
    prepared.timings["load"] = load_seconds
    return prepared


def measure(source: str, spec: str, comm: str, algo: str, repeat: int) -> dict[str, Any]:
    """Prepare the graph once, run ``algo`` up to ``repeat`` times, return the numbers."""
    options = PlaceOptions(algo=algo, comm=comm)
    t0 = time.perf_counter()
    if source.startswith(SYNTHETIC):
        prepared = prepare_synthetic(int(source[len(SYNTHETIC) :]), parse_devices(spec).with_comm_mode(comm))
    else:
        prepared = prepare(source, parse_devices(spec), options, lambda stage: None)
    prepare_seconds = time.perf_counter() - t0
    rss_before = peak_rss_bytes()

    seconds: list[float] = []
    steps: list[float] = []
    first = None
    for _ in range(repeat):
        candidate = run_candidate(prepared, placers.get(algo), options)
        first = first if first is not None else candidate
        seconds.append(candidate.place_seconds)
        if candidate.sim is None:
            break
        steps.append(candidate.sim.step_time_us)
    assert first is not None
    return {
        "ops": prepared.graph.num_ops,
        "edges": prepared.graph.num_edges,
        "prepare_seconds": prepare_seconds,
        "place_seconds": seconds,
        "place_seconds_median": statistics.median(seconds),
        "step_time_us": first.sim.step_time_us if first.sim else None,
        "lower_bound_us": prepared.lower_bound_us,
        "single_device_us": prepared.single_device.step_time_us if prepared.single_device else None,
        "comm_bytes": first.sim.comm_bytes if first.sim else None,
        "deterministic": len(set(steps)) <= 1,
        "error": first.problem,
        "error_kind": type(first.error).__name__ if first.error else None,
        "info": first.placement.info if first.placement else {},
        "rss_before_place_bytes": rss_before,
        "peak_rss_bytes": peak_rss_bytes(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("devices")
    parser.add_argument("comm", choices=("parallel", "sequential"))
    parser.add_argument("algo")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    try:
        out = measure(args.source, args.devices, args.comm, args.algo, args.repeat)
    except BaechiError as err:  # the placer refuses the graph (exact's size guard): a one-line error
        out = {
            "error": f"{type(err).__name__}: {err}",
            "error_kind": type(err).__name__,
            "peak_rss_bytes": peak_rss_bytes(),
        }
    except Exception as err:  # a crash is a result to report, not a reason to stop the benchmark
        out = {
            "error": f"{type(err).__name__}: {err}",
            "error_kind": "crash",
            "peak_rss_bytes": peak_rss_bytes(),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
