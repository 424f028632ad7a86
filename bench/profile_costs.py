"""Benchmark of `baechi profile`: analytic and measured cost profiles, and what measuring changes.

`make bench` runs this after bench/passes.py. It writes bench/profile.md
(tables, committed) and bench/profile.json (raw numbers), and prints a
progress line per step on stderr. Four sections:

1. **Analytic profiles** of every real TensorFlow training graph
   (tests/realgraphs.py) and of testdata/cnn.pb and mlp.pb, as
   ``baechi profile MODEL -o costs.json`` builds them (``profile_model`` on
   ``1x8GB``, the CLI's default device, batch size from the sidecar): ops,
   seconds (median of ``ANALYTIC_REPEAT`` calls in this process, plus one
   ``baechi profile`` process end to end), GFLOP, rule coverage, persistent
   and peak activation bytes. Target: every real graph under 2 s.
2. **Measured profiles** (``profile_model(measure=True)``), each graph in a
   fresh process (its peak RSS is its own, and an out-of-memory kill costs
   one row, not the run), on a device spec for this CPU (:func:`cpu_spec`):
   seconds, ops measured and not run, the measured compute against the
   analytic model's for the same ops, and Spearman's rank correlation of
   the per-op times.
3. **Does a measured profile change the placement?** On ``4x8GB``, m-ETF and
   auto place with three profiles (analytic for ``4x8GB``, analytic for the
   CPU spec, measured); every placement is then judged by the simulator
   under the measured costs (the measured-cost graph, in the simulator's own
   op order, as TensorFlow's executor ignores a placer's plan).
4. **Communication calibration**: ``measure_transfers()``'s default sweep
   (two logical CPU devices here), ``COMM_RUNS`` times.

Options: ``--quick`` (cnn and mlp only, fewer steps, one comm run, written
to a temporary folder unless ``--out`` is given), ``--skip NAME``
(repeatable: leaves a graph out of every section), ``--no-measure``,
``--no-place``, ``--no-comm``, ``--budget-s`` (no measured graph starts
after that many seconds). Targets are reported, not enforced: the script
exits 0 either way.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
from benchlib import (
    BENCH,
    ROOT,
    TESTDATA,
    Run,
    log,
    peak_rss_bytes,
    rel,
    scrub,
    table,
    tests_module,
    write_json,
    write_text,
)

from baechi_cli.app.place import place_model
from baechi_cli.app.profile import profile_model
from baechi_cli.core.devices import load_devices_yaml, parse_devices
from baechi_cli.search.candidates import PlaceOptions

ANALYTIC_DEVICES = "1x8GB"  # `baechi profile`'s default
ANALYTIC_REPEAT = 3
ANALYTIC_TARGET_S = 2.0
# (graph, warmup, steps), cheapest first among the ones section 3 needs.
MEASURED = (
    ("mlp", 2, 10),
    ("cnn", 2, 10),
    ("resnet50", 1, 3),
    ("inception_v3", 1, 3),
    ("transformer", 1, 3),
    ("gnmt_dynamic", 1, 3),
)
MEASURE_TIMEOUT_S = 300
BUDGET_S = 480.0  # no measured graph starts later than this into the run
PLACE_GRAPHS = ("cnn", "resnet50", "inception_v3")
PLACE_DEVICES = "4x8GB"
PLACE_ALGOS = ("etf", "auto")
COMM_RUNS = 3

# The CPU spec (section 2). Peak: every core issues two AVX-512 FMAs per cycle
# (two FMA units x 16 FP32 lanes x 2 FLOPs = 64 FLOP/cycle) at the clock
# /proc/cpuinfo reports; a VM does not show turbo, and TensorFlow's Eigen
# kernels may not use AVX-512 at all, so this is an upper bound.
FLOP_PER_CYCLE = 64
DEFAULT_CLOCK_GHZ = 2.3
# Measured kernel times exclude the executor's dispatch, so the per-kernel
# overhead is small; it shifts every timed op alike and so cannot change a
# rank correlation.
CPU_LAUNCH_OVERHEAD = "1us"
CPU_MEMORY = "16GB"
COPY_BYTES = 256 * 2**20


# ---------------------------------------------------------------- inputs


def graph_path(name: str) -> str:
    realgraphs = tests_module("realgraphs")
    if name in realgraphs.REAL_GRAPHS:
        return str(realgraphs.real_graph(name))
    return os.path.join(TESTDATA, f"{name}.pb")


def batch_size(path: str) -> int | None:
    """The sidecar's batch size (``<model>.json`` beside the model), if any."""
    sidecar = os.path.splitext(path)[0] + ".json"
    if not os.path.exists(sidecar):
        return None
    with open(sidecar, encoding="utf-8") as f:
        return json.load(f).get("batch_size")


def cpuinfo() -> dict[str, Any]:
    info: dict[str, Any] = {"model": platform.processor() or platform.machine(), "clock_ghz": None}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            text = f.read()
        for line in text.splitlines():
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "model name":
                info["model"] = value
            elif key == "cpu MHz" and info["clock_ghz"] is None:
                info["clock_ghz"] = float(value) / 1000
            elif key == "flags":
                info["avx512f"] = "avx512f" in value.split()
        with open("/proc/meminfo", encoding="utf-8") as f:
            info["memory_bytes"] = int(f.readline().split()[1]) * 1024
    except OSError:
        pass
    return info


def copy_bandwidth() -> float:
    """Bytes/s of one core copying 256 MiB (read + write), median of 5."""
    a = np.ones(COPY_BYTES // 4, dtype=np.float32)
    b = np.empty_like(a)
    np.copyto(b, a)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - t0)
    return 2 * a.nbytes / statistics.median(times)


def cpu_spec(folder: str, cpu: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Write the CPU's device YAML (see FLOP_PER_CYCLE); returns its path and what went into it."""
    cores = os.cpu_count() or 1
    clock = cpu.get("clock_ghz") or DEFAULT_CLOCK_GHZ
    flops = cores * clock * 1e9 * FLOP_PER_CYCLE
    bandwidth = copy_bandwidth()
    text = (
        "devices:\n"
        "  name: /device:CPU:0\n"
        f"  memory: {CPU_MEMORY}\n"
        f"  flops: {flops / 1e9:.1f}G           # {cores} cores x {clock:g} GHz x {FLOP_PER_CYCLE} FLOP/cycle\n"
        f"  memory_bandwidth: {bandwidth / 1e9:.1f}GB/s  # numpy copy of 256 MiB, read + write\n"
        f"  launch_overhead: {CPU_LAUNCH_OVERHEAD}\n"
    )
    path = os.path.join(folder, "cpu.yaml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    load_devices_yaml(path)  # fail here, not in a child, if it does not parse
    return path, {
        "cores": cores,
        "clock_ghz": clock,
        "flop_per_cycle": FLOP_PER_CYCLE,
        "flops": flops,
        "memory_bandwidth": bandwidth,
        "launch_overhead": CPU_LAUNCH_OVERHEAD,
        "yaml": text,
    }


# ---------------------------------------------------------------- statistics


def ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties getting their average rank."""
    order = np.argsort(values, kind="mergesort")
    _, inverse, counts = np.unique(values[order], return_inverse=True, return_counts=True)
    average = np.cumsum(counts) - (counts - 1) / 2
    out = np.empty(len(values))
    out[order] = average[inverse]
    return out


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rank correlation (Pearson's on average ranks); None below 3 points or without spread."""
    if len(x) < 3:
        return None
    rx, ry = ranks(np.asarray(x, dtype=float)), ranks(np.asarray(y, dtype=float))
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


# ---------------------------------------------------------------- 1. analytic


def analytic(name: str, folder: str, repeat: int) -> dict[str, Any]:
    path = graph_path(name)
    bs = batch_size(path)
    devices = parse_devices(ANALYTIC_DEVICES)
    out = os.path.join(folder, f"{name}.analytic.json")
    runs, outcome = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        outcome = profile_model(path, devices, batch_size=bs, output=out)
        runs.append({"wall_seconds": time.perf_counter() - t0, "timings_s": outcome.timings})
    assert outcome is not None
    report, totals = outcome.cost_report, outcome.profile.totals
    n = outcome.graph.num_ops
    kinds = {kind: sum(types.values()) for kind, types in sorted(report.coverage.items())}
    uncovered = kinds.get("uncovered", 0)
    walls = [r["wall_seconds"] for r in runs]
    return {
        "graph": name,
        "path": rel(path),
        "batch_size": bs,
        "ops": n,
        "runs": runs,
        "wall_seconds_median": statistics.median(walls),
        "wall_seconds_max": max(walls),
        "stage_seconds_median": {
            k: statistics.median(r["timings_s"][k] for r in runs) for k in runs[0]["timings_s"]
        },
        "cli": cli_profile(path, bs, folder),
        "gflop": totals.flops / 1e9,
        "compute_ms": totals.compute_us / 1000,
        "coverage_kinds": kinds,
        "covered_fraction": (n - uncovered - len(report.fallback_ops)) / n,
        "uncovered_types": report.uncovered,
        "fallback_ops": len(report.fallback_ops),
        "persistent_bytes": totals.persistent_bytes,
        "peak_activation_bytes": totals.peak_activation_bytes,
        "profile_file_bytes": os.path.getsize(out),
    }


def cli_profile(path: str, bs: int | None, folder: str) -> dict[str, Any]:
    """``baechi profile MODEL -o costs.json -q`` in a fresh process: wall seconds, start-up included."""
    out = os.path.join(folder, "cli.json")
    argv = [os.path.join(os.path.dirname(sys.executable), "baechi"), "profile", path, "-o", out, "-q"]
    if bs is not None:
        argv += ["--batch-size", str(bs)]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"wall_seconds": wall, "error": scrub((proc.stderr.strip().splitlines() or ["?"])[-1])}
    return {"wall_seconds": wall}


# ---------------------------------------------------------------- 2. measured


def measure_one(name: str, spec: str, warmup: int, steps: int, out: str) -> None:
    """The child of :func:`measured`: measure one graph, write its profile, print one JSON line."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    path = graph_path(name)
    t0 = time.perf_counter()
    outcome = profile_model(
        path,
        load_devices_yaml(spec),
        batch_size=batch_size(path),
        measure=True,
        warmup=warmup,
        steps=steps,
        output=out,
    )
    wall = time.perf_counter() - t0
    p = outcome.profile
    print(
        json.dumps(
            {
                "wall_seconds": wall,
                "timings_s": outcome.timings,
                "device": p.device,
                "tensorflow": p.measurement.tensorflow,
                "measured_ops": p.totals.measured_ops,
                "not_run": p.measurement.not_run_count,
                "peak_rss_bytes": peak_rss_bytes(),
            }
        )
    )


def measured(name: str, warmup: int, steps: int, spec: str, folder: str) -> dict[str, Any]:
    """Measure ``name`` in a fresh process, then compare its per-op times with the CPU spec's analytic ones."""
    path = graph_path(name)
    out = os.path.join(folder, f"{name}.measured.json")
    record: dict[str, Any] = {"graph": name, "warmup": warmup, "steps": steps}
    argv = [sys.executable, os.path.abspath(__file__), "--measure-one", name, "--spec", spec]
    argv += ["--warmup", str(warmup), "--steps", str(steps), "--profile-out", out]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=MEASURE_TIMEOUT_S, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {**record, "error": f"no result within {MEASURE_TIMEOUT_S} s"}
    record["process_wall_seconds"] = time.perf_counter() - t0
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = " | ".join(proc.stderr.strip().splitlines()[-2:])
        return {**record, "error": scrub(f"exit status {proc.returncode}: {tail}")}
    record.update(json.loads(lines[-1]))
    record["profile"] = out

    from baechi_cli.costs.profile import load_profile

    record["analytic_profile"] = os.path.join(folder, f"{name}.analytic-cpu.json")
    cpu = profile_model(
        path, load_devices_yaml(spec), batch_size=batch_size(path), output=record["analytic_profile"]
    )
    record.update(compare(load_profile(out), cpu.profile))
    return record


def compare(measured_profile: Any, analytic_profile: Any) -> dict[str, Any]:
    """Measured per-op times against the analytic model's, over the ops that ran."""
    model = {op.name: op for op in analytic_profile.ops}
    ran = [op for op in measured_profile.ops if op.source == "measured"]
    pairs = [(op.compute_us, model[op.name].compute_us, op.rule, op.type) for op in ran]
    timed = [p for p in pairs if p[0] > 0]
    kernels = [p for p in timed if p[1] > 0]
    flops = [p for p in timed if p[2] == "flops"]
    flop_names = [op.name for op in ran if op.compute_us > 0 and op.rule == "flops"]
    by_type: dict[str, list[float]] = {}
    for m, a, _, t in pairs:
        acc = by_type.setdefault(t, [0.0, 0.0])
        acc[0] += m
        acc[1] += a
    top = sorted(by_type.items(), key=lambda kv: -kv[1][0])[:3]
    ratios = [m / a for m, a, _, _ in flops if a > 0]
    # A TF1 while loop's body runs once per iteration and its measured time is
    # the sum per step; the analytic rules cost one execution.
    in_loop = [m / a for (m, a, _, _), name in zip(flops, flop_names) if a > 0 and "while/" in name]
    return {
        "measured_compute_ms": sum(p[0] for p in pairs) / 1000,
        "analytic_compute_ms_same_ops": sum(p[1] for p in pairs) / 1000,
        "analytic_compute_ms_all_ops": analytic_profile.totals.compute_us / 1000,
        "spearman_all": spearman([p[0] for p in timed], [p[1] for p in timed]),
        "n_all": len(timed),
        "spearman_kernels": spearman([p[0] for p in kernels], [p[1] for p in kernels]),
        "n_kernels": len(kernels),
        "spearman_flops": spearman([p[0] for p in flops], [p[1] for p in flops]),
        "n_flops": len(flops),
        "median_ratio_flops_ops": statistics.median(ratios) if ratios else None,
        "flops_ops_in_while_loops": len(in_loop),
        "median_ratio_flops_ops_in_while_loops": statistics.median(in_loop) if in_loop else None,
        "top_types": [{"type": t, "measured_ms": m / 1000, "analytic_ms": a / 1000} for t, (m, a) in top],
    }


# ---------------------------------------------------------------- 3. placement


def placement(name: str, profiles: dict[str, str], measured_path: str) -> dict[str, Any]:
    """Place with every profile; judge every placement under the measured costs."""
    from baechi_cli.costs.profile import apply_profile, load_profile
    from baechi_cli.evaluator.sim import simulate
    from baechi_cli.io.formats import load_model
    from baechi_cli.passes.manager import constraint_passes

    path = graph_path(name)
    bs = batch_size(path)
    devices = parse_devices(PLACE_DEVICES)
    graph, fmt, _ = load_model(path, bs)
    graph = apply_profile(graph, load_profile(measured_path), measured_path, path)
    graph, _ = constraint_passes(graph, fmt, path)
    single = simulate(graph, devices, [0] * graph.num_ops)
    record: dict[str, Any] = {
        "graph": name,
        "devices": PLACE_DEVICES,
        "single_device_measured_us": single.step_time_us,
        "runs": [],
    }
    for algo in PLACE_ALGOS:
        for label, profile in profiles.items():
            t0 = time.perf_counter()
            outcome = place_model(path, devices, PlaceOptions(algo=algo, profile=profile, batch_size=bs))
            seconds = time.perf_counter() - t0
            judged = simulate(graph, devices, outcome.sim.device_of)
            record["runs"].append(
                {
                    "algo": algo,
                    "profile": label,
                    "chosen": outcome.algorithm,
                    "seconds": seconds,
                    "planned_us": outcome.sim.step_time_us,
                    "measured_us": judged.step_time_us,
                    "feasible": judged.feasible,
                    "devices_used": len(set(outcome.sim.device_of)),
                    "device_of": outcome.sim.device_of,
                }
            )
    return record


# ---------------------------------------------------------------- 4. communication


def comm(runs: int, max_exp: int) -> dict[str, Any]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from baechi_cli.costs.comm import measure_transfers

    out = []
    for i in range(runs):
        t0 = time.perf_counter()
        fit = measure_transfers(max_exp=max_exp)
        out.append(
            {
                "latency_us": fit.latency_us,
                "bandwidth_gb_per_s": fit.bandwidth_gb_per_s,
                "r2": fit.r2,
                "fit_wall_seconds": fit.wall_s,
                "wall_seconds": time.perf_counter() - t0,
                "src": fit.src,
                "dst": fit.dst,
                "method": fit.method,
                "note": fit.note,
                "smallest_median_us": statistics.median(fit.samples[0].times_us),
            }
        )
        log(f"comm run {i + 1}: {fit.summary()}")
    keys = (
        "latency_us",
        "bandwidth_gb_per_s",
        "r2",
        "fit_wall_seconds",
        "wall_seconds",
        "smallest_median_us",
    )
    return {
        "max_exp": max_exp,
        "runs": out,
        "median": {k: statistics.median(r[k] for r in out) for k in keys},
    }


# ---------------------------------------------------------------- formatting


def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_r(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}"


def fmt_ms(us: float) -> str:
    return f"{us / 1000:.1f}"


def analytic_section(rows: list[dict[str, Any]]) -> list[str]:
    body = []
    for r in rows:
        kinds = ", ".join(f"{k} {v}" for k, v in r["coverage_kinds"].items())
        cli = r["cli"]
        body.append(
            [
                r["graph"],
                f"{r['ops']:,}",
                f"{r['wall_seconds_median']:.3f}",
                f"{r['wall_seconds_max']:.3f}",
                " / ".join(
                    f"{r['stage_seconds_median'][k]:.2f}" for k in ("load", "profile", "simulate", "write")
                ),
                f"{cli['wall_seconds']:.2f}" + (f" ({cli['error']})" if "error" in cli else ""),
                f"{r['gflop']:.1f}",
                f"{r['covered_fraction']:.1%}",
                kinds,
                ", ".join(r["uncovered_types"]) or "none",
                fmt_bytes(r["persistent_bytes"]),
                fmt_bytes(r["peak_activation_bytes"]),
            ]
        )
    return [
        "## 1. Analytic profiles",
        "",
        f"`profile_model(path, {ANALYTIC_DEVICES})` with the sidecar's batch size and `-o` to a temporary file, "
        f"as `baechi profile MODEL -o costs.json` runs it: seconds are the median and the slowest of "
        f"{ANALYTIC_REPEAT} calls in this process, then the medians of its stages (read the GraphDef, cost the "
        "ops, simulate one device for the peak memory, write the profile JSON); *CLI* is one "
        "`baechi profile` process end to end (Python start-up and imports included). Coverage: ops a rule "
        "costed (any kind but `uncovered`, and no fallback to bytes for want of a shape); rule kinds: "
        "`flops` (FLOPs and bytes), `bytes` (memory-bound), `zero` (no kernel), `variable` (storage). "
        "Peak activations: everything but persistent bytes at the peak of a one-device run.",
        "",
        *table(
            [
                "graph",
                "ops",
                "median s",
                "max s",
                "read / cost / simulate / write s",
                "CLI s",
                "GFLOP",
                "coverage",
                "ops by rule kind",
                "uncovered types",
                "persistent",
                "peak activations",
            ],
            body,
        ),
        "",
    ]


def measured_section(rows: list[dict[str, Any]], spec: dict[str, Any]) -> list[str]:
    body = []
    for r in rows:
        if "error" in r or "skipped" in r:
            body.append([r["graph"], r.get("skipped") or r["error"], *["-"] * 9])
            continue
        top = ", ".join(f"{t['type']} {t['measured_ms']:.3g}/{t['analytic_ms']:.3g}" for t in r["top_types"])
        ratio = r["measured_compute_ms"] / r["analytic_compute_ms_same_ops"]
        body.append(
            [
                r["graph"],
                f"{r['warmup']} + {r['steps']}",
                f"{r['wall_seconds']:.1f} ({r['process_wall_seconds']:.1f})",
                f"{fmt_bytes(r['peak_rss_bytes'])}",
                f"{r['measured_ops']:,} / {r['not_run']:,}",
                f"{r['measured_compute_ms']:,.1f}",
                f"{r['analytic_compute_ms_same_ops']:,.1f} ({r['analytic_compute_ms_all_ops']:,.1f})",
                f"{ratio:.2f}",
                f"{fmt_r(r['spearman_all'])} ({r['n_all']}) / {fmt_r(r['spearman_kernels'])} "
                f"({r['n_kernels']}) / {fmt_r(r['spearman_flops'])} ({r['n_flops']})",
                ("-" if r["median_ratio_flops_ops"] is None else f"{r['median_ratio_flops_ops']:.2f}")
                + (
                    f" (in while loops: {r['median_ratio_flops_ops_in_while_loops']:.1f}, "
                    f"{r['flops_ops_in_while_loops']} ops)"
                    if r["flops_ops_in_while_loops"]
                    else ""
                ),
                top,
            ]
        )
    device = next((r["device"] for r in rows if "device" in r), "-")
    return [
        "## 2. Measured profiles",
        "",
        f"`profile_model(path, cpu.yaml, measure=True)`, one fresh process per graph, on {device}. "
        "The analytic model for this CPU (`cpu.yaml`, written by the script; the peak assumes "
        f"{spec['flop_per_cycle']} FP32 FLOP per cycle and core: two AVX-512 FMA units x 16 lanes x 2, at "
        f"the {spec['clock_ghz']:g} GHz /proc/cpuinfo reports -- an upper bound, as a VM hides turbo and "
        "TensorFlow's Eigen kernels need not use AVX-512; the bandwidth is one core's numpy copy):",
        "",
        "```yaml",
        *spec["yaml"].rstrip().splitlines(),
        "```",
        "",
        "*seconds*: `profile_model` (the process, TensorFlow's import included); *measured / not run*: ops "
        "that ran in the measured steps / ops that kept analytic costs (initialisers, fed placeholders); "
        "*measured ms*: the sum of the measured ops' median times per step (TensorFlow runs them one at a "
        "time, each with both cores, so this is about the step's wall time); *analytic ms*: the CPU model's time for the same "
        "ops (all ops); *x*: measured / analytic; *Spearman*: rank correlation of measured and analytic "
        "per-op times over the measured ops with time > 0 / those the model gives a kernel time "
        "(`zero`-kind ops get 0) / `flops`-rule ops only, with how many ops; *median x flops ops*: median "
        "per-op measured / analytic over `flops`-rule ops (and over those in a TF1 while loop, by name: a "
        "loop-body op runs once per iteration and is measured per step, while the analytic rules cost one "
        "execution); *top types*: the three op types with the most "
        "measured time, measured / analytic ms.",
        "",
        *table(
            [
                "graph",
                "warm-up + steps",
                "seconds",
                "peak RSS",
                "measured / not run",
                "measured ms",
                "analytic ms",
                "x",
                "Spearman all / kernels / flops",
                "median x flops ops",
                "top types",
            ],
            body,
        ),
        "",
    ]


def placement_section(rows: list[dict[str, Any]]) -> list[str]:
    body = []
    for r in rows:
        if "skipped" in r:
            body.append([r["graph"], "-", r["skipped"], *["-"] * 5])
            continue
        best = {
            algo: next(x for x in r["runs"] if x["algo"] == algo and x["profile"] == "measured")
            for algo in PLACE_ALGOS
        }
        for x in r["runs"]:
            base = best[x["algo"]]["measured_us"]
            body.append(
                [
                    r["graph"],
                    x["algo"] + (f" (chose {x['chosen']})" if x["algo"] == "auto" else ""),
                    x["profile"],
                    f"{x['devices_used']}",
                    fmt_ms(x["planned_us"]),
                    fmt_ms(x["measured_us"]) + ("" if x["feasible"] else " (over memory)"),
                    f"{x['measured_us'] / base:.3f}",
                    fmt_ms(r["single_device_measured_us"]),
                ]
            )
    return [
        "## 3. Does a measured profile change the placement?",
        "",
        f"`place_model(path, {PLACE_DEVICES}, PlaceOptions(algo, profile=...))` with three profiles: "
        "analytic for `4x8GB` (the RTX 2080 model, what `baechi place -d 4x8GB` uses without `--profile`), "
        "analytic for `cpu.yaml`, and the measured one of section 2. *planned*: the step the placer's "
        "placement takes under the costs it was placed with; *under measured*: the same placement simulated "
        "with the measured costs (`apply_profile` of the measured profile onto the model, the constraint "
        "passes, `simulate` in the simulator's own op order); *x measured-chosen*: that step / the step "
        "of the placement made with the measured profile (same algorithm). All three share the `4x8GB` "
        "interconnect (134 us + 5.7 GB/s).",
        "",
        *table(
            [
                "graph",
                "algorithm",
                "profile",
                "devices used",
                "planned ms",
                "under measured ms",
                "x measured-chosen",
                "one device, measured ms",
            ],
            body,
        ),
        "",
    ]


def comm_section(result: dict[str, Any] | None) -> list[str]:
    if result is None:
        return []
    body = [
        [
            str(i + 1),
            f"{r['latency_us']:.1f}",
            f"{r['bandwidth_gb_per_s']:.2f}",
            f"{r['r2']:.4f}",
            f"{r['smallest_median_us']:.0f}",
            f"{r['fit_wall_seconds']:.2f}",
            f"{r['wall_seconds']:.2f}",
        ]
        for i, r in enumerate(result["runs"])
    ]
    m = result["median"]
    body.append(
        [
            "median",
            f"{m['latency_us']:.1f}",
            f"{m['bandwidth_gb_per_s']:.2f}",
            f"{m['r2']:.4f}",
            f"{m['smallest_median_us']:.0f}",
            f"{m['fit_wall_seconds']:.2f}",
            f"{m['wall_seconds']:.2f}",
        ]
    )
    first = result["runs"][0]
    return [
        "## 4. Communication calibration",
        "",
        f"`measure_transfers(max_exp={result['max_exp']})`: 2^0 .. 2^{result['max_exp']} bytes from "
        f"{first['src']} to {first['dst']} ({first['method']}), least-squares fit of latency + bytes / "
        "bandwidth. *1-byte us*: the median time of the smallest transfer, for comparison with the fitted "
        "latency; *fit s*: the measurement's own wall time; *wall s*: the call's (TensorFlow's session "
        "set-up included; the first run also imports TensorFlow).",
        "",
        *table(["run", "latency us", "bandwidth GB/s", "R^2", "1-byte us", "fit s", "wall s"], body),
        "",
    ]


def targets(analytic_rows: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    out = []
    for r in analytic_rows:
        if r["graph"] in tests_module("realgraphs").REAL_GRAPHS:
            got = r["wall_seconds_median"]
            out.append(
                {
                    "target": f"analytic profile < {ANALYTIC_TARGET_S:g} s",
                    "setting": f"{r['graph']} ({r['ops']:,} ops)",
                    "measured": f"{got:.3f} s (median of {len(r['runs'])}; slowest {r['wall_seconds_max']:.3f} s; "
                    f"{got - r['stage_seconds_median']['write']:.3f} s without writing the JSON)",
                    "result": "PASS" if got < ANALYTIC_TARGET_S else "MISS",
                }
            )
    passed = sum(t["result"] == "PASS" for t in out)
    lines = [
        "## Targets",
        "",
        f"{passed} PASS, {len(out) - passed} MISS. Checked by this benchmark, not by the tests.",
        "",
        *table(
            ["target", "setting", "measured", "result"],
            [[t["target"], t["setting"], t["measured"], t["result"]] for t in out],
        ),
        "",
    ]
    return lines, out


HOW_TO_READ = [
    "## How to read this",
    "",
    "- An **analytic** profile costs every op from the graph's shapes (FLOPs and bytes through the "
    "rules of `baechi_cli/costs/rules_tf.py` and `rules_onnx.py`, then `max(FLOPs / peak, bytes / bandwidth) + launch` on the "
    "device spec); it needs no TensorFlow and no hardware. Section 1 says how fast and how complete it is.",
    "- A **measured** profile runs the graph in TensorFlow and keeps each op's median time; ops that do "
    "not run in a training step keep analytic costs. Section 2 says how far the analytic model's per-op "
    "times agree with the measured ones on this CPU: a Spearman correlation near 1 means the model orders "
    "the ops as the hardware does (what a placer needs), whatever the absolute scale (the *x* column).",
    "- Section 3 asks the question that matters for placement: placed with analytic costs, how much "
    "slower is the placement *when the measured costs are the truth* than one placed with the measured "
    "costs themselves? A ratio of 1.000 means measuring bought nothing.",
    "- Section 4 is the interconnect fit `baechi profile --comm` writes into a device YAML.",
    "- The machine is shared and small: times are medians where stated and vary from run to run; the "
    "measured section runs few steps on big graphs to stay within the run's time budget.",
    "",
]


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="cnn and mlp only, few steps: a smoke run")
    parser.add_argument("--skip", action="append", default=[], metavar="NAME", help="leave a graph out")
    parser.add_argument("--no-measure", action="store_true")
    parser.add_argument("--no-place", action="store_true")
    parser.add_argument("--no-comm", action="store_true")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S)
    parser.add_argument("--out", help="folder for profile.md and profile.json (default: bench/)")
    # The child process of section 2.
    parser.add_argument("--measure-one", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_one:
        measure_one(args.measure_one, args.spec, args.warmup, args.steps, args.profile_out)
        return

    run = Run()
    out_dir = args.out or (tempfile.mkdtemp(prefix="baechi-profile-quick-") if args.quick else BENCH)
    os.makedirs(out_dir, exist_ok=True)
    skip = set(args.skip)
    real = tests_module("realgraphs").REAL_GRAPHS
    graphs = [g for g in (("cnn", "mlp") if args.quick else (*real, "cnn", "mlp")) if g not in skip]
    measured_plan = [
        (g, 1, 2) if args.quick else (g, w, s) for g, w, s in MEASURED if g in graphs and not args.no_measure
    ]
    place_graphs = [
        g for g in (("cnn",) if args.quick else PLACE_GRAPHS) if g in graphs and not args.no_place
    ]
    cpu = cpuinfo()

    with tempfile.TemporaryDirectory() as work:
        analytic_rows = []
        for g in graphs:
            log(f"[{run.elapsed():5.0f} s] analytic {g}")
            analytic_rows.append(analytic(g, work, 1 if args.quick else ANALYTIC_REPEAT))

        spec_path, spec = cpu_spec(work, cpu)
        log(f"cpu spec: {spec['flops'] / 1e9:.0f} GFLOP/s, {spec['memory_bandwidth'] / 1e9:.1f} GB/s")
        measured_rows = []
        for g, warmup, steps in measured_plan:
            elapsed = run.elapsed()
            if elapsed > args.budget_s:
                measured_rows.append(
                    {"graph": g, "skipped": f"not run: past the {args.budget_s:.0f} s budget"}
                )
                continue
            log(f"[{elapsed:5.0f} s] measured {g} ({warmup} + {steps} steps)")
            measured_rows.append(measured(g, warmup, steps, spec_path, work))
            r = measured_rows[-1]
            done = r.get("error") or f"{r['wall_seconds']:.1f} s, Spearman {fmt_r(r['spearman_all'])}"
            log(f"    {done}")

        place_rows = []
        by_name = {r["graph"]: r for r in measured_rows}
        for g in place_graphs:
            m = by_name.get(g)
            if m is None or "profile" not in m:
                place_rows.append({"graph": g, "skipped": "no measured profile"})
                continue
            log(f"[{run.elapsed():5.0f} s] placement {g}")
            gpu = os.path.join(work, f"{g}.analytic-4x8GB.json")
            path = graph_path(g)
            profile_model(path, parse_devices(PLACE_DEVICES), batch_size=batch_size(path), output=gpu)
            profiles = {
                "analytic 4x8GB": gpu,
                "analytic cpu.yaml": m["analytic_profile"],
                "measured": m["profile"],
            }
            place_rows.append(placement(g, profiles, m["profile"]))

        comm_result = None
        if not args.no_comm:
            log(f"[{run.elapsed():5.0f} s] communication")
            comm_result = comm(1 if args.quick else COMM_RUNS, 20 if args.quick else 28)

    run.stop()
    try:
        tf_version = importlib.metadata.version("tensorflow")
    except importlib.metadata.PackageNotFoundError:
        tf_version = None
    machine = {
        **run.facts(),
        "cpu": cpu.get("model"),
        "avx512f": cpu.get("avx512f"),
        "memory_bytes": cpu.get("memory_bytes"),
        "tensorflow": tf_version,
        "quick": args.quick,
        "skipped": sorted(skip),
    }
    target_lines, target_rows = targets(analytic_rows)
    lines = [
        "# `baechi profile`: analytic and measured cost profiles",
        "",
        f"Made by `make bench` (bench/profile_costs.py{' --quick' if args.quick else ''}) on {machine['machine']}, "
        f"{machine['cpu']}, {machine['cores']} cores{' with AVX-512' if machine['avx512f'] else ''}, "
        f"{fmt_bytes(machine['memory_bytes'] or 0)} of memory, Python {machine['python']}, TensorFlow "
        f"{tf_version} (CPU), in {run.seconds / 60:.1f} minutes ({run.load_text()}: the machine is shared, "
        "and other work inflates the times). "
        "Raw numbers: [profile.json](profile.json).",
        "",
        *HOW_TO_READ,
        *target_lines,
        *analytic_section(analytic_rows),
        *(measured_section(measured_rows, spec) if measured_rows else []),
        *(placement_section(place_rows) if place_rows else []),
        *comm_section(comm_result),
    ]
    for r in place_rows:
        for x in r.get("runs", []):
            x.pop("device_of")
    for r in measured_rows:
        for key in ("profile", "analytic_profile"):
            r.pop(key, None)
    write_text(os.path.join(out_dir, "profile.md"), "\n".join(lines).rstrip() + "\n")
    write_json(
        os.path.join(out_dir, "profile.json"),
        {
            "machine": machine,
            "cpu_spec": spec,
            "targets": target_rows,
            "analytic": analytic_rows,
            "measured": measured_rows,
            "placement": place_rows,
            "comm": comm_result,
        },
    )
    print("\n".join(target_lines))
    log(f"done in {run.seconds:.0f} s: {os.path.join(out_dir, 'profile.md')}, profile.json")


if __name__ == "__main__":
    main()
