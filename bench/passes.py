"""Benchmark of the graph passes: what they save in placement time and cost in step time.

`make bench` runs this after bench/run.py. It writes bench/passes.md (tables,
committed) and bench/passes.json (raw numbers).

For every real TensorFlow training graph (testdata/generate.py; generated
into testdata/cache/ when not committed), the committed small graphs and the
committed workloads, on 4 devices (8 GB each for TensorFlow graphs, the
file's ``maxSizePerFPGA`` for workloads), parallel communication:

* ops before and after the passes, and nodes the placers see;
* for m-TOPO, m-ETF and m-SCT: placement seconds and predicted step time
  with the default passes and with every optional pass off
  (``--no-forward-only --no-coplace --no-fusion``);
* m-SCT end to end as a user runs it: ``baechi place --algo sct -o`` in a
  fresh process; the report's ``timings_s.total`` (read, profile, passes,
  place, simulate, write) and the process's wall time.

Targets (issue "Real training graphs and the paper's graph optimizations"):
at least 95% fewer nodes on Inception-V3 and GNMT; m-SCT end to end under
2 s for Inception-V3 and 5 s for the statically unrolled GNMT; step time
with the passes no worse than without. Reported, not enforced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

from benchlib import BENCH, ROOT, TESTDATA, WORKLOADS, log, rel, scrub, tests_module, write_json, write_text

from baechi_cli import placers
from baechi_cli.app.place import prepare
from baechi_cli.core.devices import parse_devices
from baechi_cli.io.graphdef import read_graphdef
from baechi_cli.io.workload_json import read_workload_meta
from baechi_cli.search.candidates import PlaceOptions, run_candidate

ALGOS = ("topo", "etf", "sct")
DEVICES = 4
TF_MEMORY = "8GB"
# No optional pass: the graph the placers saw before the passes existed.
NO_PASSES = {"forward_only": False, "coplace": False, "fusion": False}
SCT_TIME_LIMIT_S = 120.0
REDUCTION_TARGETS = {"inception_v3": 0.95, "gnmt_static": 0.95, "gnmt_dynamic": 0.95}
END_TO_END_TARGETS_S = {"inception_v3": 2.0, "gnmt_static": 5.0}


def sources() -> list[tuple[str, str, str]]:
    """(name, path, one device's memory) for every graph of the benchmark."""
    realgraphs = tests_module("realgraphs")
    out = [(name, str(realgraphs.real_graph(name)), TF_MEMORY) for name in realgraphs.REAL_GRAPHS]
    out += [(name, os.path.join(TESTDATA, f"{name}.pb"), TF_MEMORY) for name in ("mlp", "cnn")]
    for file in sorted(os.listdir(WORKLOADS)):
        if file.endswith(".json"):
            path = os.path.join(WORKLOADS, file)
            out.append((file[:-5], path, f"{read_workload_meta(path).max_size_per_fpga}B"))
    return out


def measure(path: str, memory: str, flags: dict[str, bool]) -> dict[str, Any]:
    """Prepare once with ``flags``, then place with each algorithm."""
    options = PlaceOptions(solver_time_limit=SCT_TIME_LIMIT_S, **flags)
    devices = parse_devices(f"{DEVICES}x{memory}")
    t0 = time.perf_counter()
    prepared = prepare(path, devices, options, lambda stage: None)
    out: dict[str, Any] = {
        "prepare_seconds": time.perf_counter() - t0,
        "passes_seconds": prepared.timings["passes"],
        "ops": prepared.graph.num_ops,
        "nodes": prepared.placement_graph.num_ops,
        "passes": [
            {"name": p.name, "ops_after": p.ops_after, "enabled": p.details.get("enabled")}
            for p in prepared.passes
        ],
        "single_device_us": prepared.single_device.step_time_us if prepared.single_device else None,
        "algos": {},
    }
    for algo in ALGOS:
        c = run_candidate(prepared, placers.get(algo), options)
        out["algos"][algo] = {
            "place_seconds": c.place_seconds,
            "step_time_us": c.sim.step_time_us if c.sim else None,
            "error": c.problem and scrub(c.problem),
        }
    return out


def end_to_end(path: str, memory: str) -> dict[str, Any]:
    """``baechi place --algo sct -o`` in a fresh process, as a user runs it."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "placed.pb" if not path.endswith(".json") else "unused")
        report = os.path.join(tmp, "report.json")
        argv = [sys.executable, "-m", "baechi_cli", "place", rel(path), "-d", f"{DEVICES}x{memory}"]
        argv += ["--algo", "sct", "--report", report, "-q"]
        if not path.endswith(".json"):
            argv += ["-o", out]
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            return {"error": scrub(proc.stderr.strip().splitlines()[-1]), "wall_seconds": wall}
        with open(report, encoding="utf-8") as f:
            doc = json.load(f)
        return {
            "total_seconds": doc["timings_s"]["total"],
            "timings_s": doc["timings_s"],
            "wall_seconds": wall,
        }


def coverage(path: str) -> dict[str, Any]:
    """How the forward/backward matching rules of io/graphdef.mark_backward cover a TensorFlow graph."""
    g = read_graphdef(path)
    backward = [v for v in range(g.num_ops) if g.is_backward[v]]
    by_scope = by_class = 0
    unmatched: Counter[str] = Counter()
    for v in backward:
        f = g.forward_op[v]
        if f < 0:
            unmatched[g.op_types[v]] += 1
        elif f"{g.names[f]}_grad/" in g.names[v]:
            by_scope += 1
        else:
            by_class += 1
    return {
        "ops": g.num_ops,
        "backward": len(backward),
        "by_scope": by_scope,
        "by_class": by_class,
        "unmatched": len(backward) - by_scope - by_class,
        "unmatched_types": dict(unmatched.most_common(5)),
    }


def fmt_ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1000:.1f}"


def fmt_s(s: float | None) -> str:
    return "-" if s is None else f"{s:.3f}"


def cell(run: dict[str, Any]) -> str:
    return fmt_ms(run["step_time_us"]) if run["step_time_us"] is not None else "error"


def render(results: list[dict[str, Any]]) -> str:
    lines = [
        "# Graph passes: node reduction, placement time, step time",
        "",
        "Generated by `make bench` (bench/passes.py); raw numbers in bench/passes.json.",
        f"{DEVICES} devices ({TF_MEMORY} each for TensorFlow graphs, `maxSizePerFPGA` for workloads), "
        "parallel communication. *with* = default options; *without* = "
        "`--no-forward-only --no-coplace --no-fusion` (colocation and control flow always run).",
        "",
        "## Nodes",
        "",
        "| graph | ops | nodes with passes | reduction | passes (ops after each) | passes s |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for r in results:
        w = r["with"]
        chain = ", ".join(f"{p['name']} {p['ops_after']}" for p in w["passes"] if p["enabled"])
        lines.append(
            f"| {r['graph']} | {w['ops']} | {w['nodes']} | {1 - w['nodes'] / w['ops']:.1%} | {chain} "
            f"| {fmt_s(w['passes_seconds'])} |"
        )
    lines += [
        "",
        "## Placement seconds and predicted step time (ms), with / without the passes",
        "",
        "| graph | single device | "
        + " | ".join(f"{a} place s | {a} step" for a in ALGOS)
        + " | best with | best without |",
        "|---|---:|" + "---:|---:|" * len(ALGOS) + "---:|---:|",
    ]
    for r in results:
        w, wo = r["with"], r["without"]
        cells = []
        for a in ALGOS:
            cells.append(
                f"{fmt_s(w['algos'][a]['place_seconds'])} / {fmt_s(wo['algos'][a]['place_seconds'])}"
            )
            cells.append(f"{cell(w['algos'][a])} / {cell(wo['algos'][a])}")
        lines.append(
            f"| {r['graph']} | {fmt_ms(w['single_device_us'])} | "
            + " | ".join(cells)
            + f" | {fmt_ms(best(w))} | {fmt_ms(best(wo))} |"
        )
    lines += [
        "",
        "## Forward/backward matching (TensorFlow graphs)",
        "",
        "Rules in baechi_cli/io/graphdef.py `mark_backward`: backward = the `gradients*` scope and all it "
        "feeds; a backward op's forward op comes from its `<op>_grad` scope, else from its `_class`.",
        "",
        "| graph | ops | backward | by `_grad` scope | by `_class` | unmatched | unmatched op types |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        c = r.get("coverage")
        if c:
            types = ", ".join(f"{t} {n}" for t, n in c["unmatched_types"].items())
            lines.append(
                f"| {r['graph']} | {c['ops']} | {c['backward']} | {c['by_scope']} | {c['by_class']} "
                f"| {c['unmatched']} | {types} |"
            )
    lines += ["", "## Targets", "", "| target | measured | result |", "|---|---|---|"]
    by_name = {r["graph"]: r for r in results}
    for name, want in REDUCTION_TARGETS.items():
        if name in by_name:
            w = by_name[name]["with"]
            got = 1 - w["nodes"] / w["ops"]
            lines.append(
                f"| {name}: node reduction >= {want:.0%} | {got:.1%} ({w['ops']} -> {w['nodes']}) "
                f"| {'PASS' if got >= want else 'MISS'} |"
            )
    for name, limit in END_TO_END_TARGETS_S.items():
        if name in by_name:
            e2e = by_name[name]["end_to_end"]
            if "error" in e2e:
                lines.append(f"| {name}: m-SCT end to end < {limit:g} s | {e2e['error']} | MISS |")
                continue
            got = e2e["total_seconds"]
            lines.append(
                f"| {name}: m-SCT end to end < {limit:g} s | {got:.2f} s (process wall {e2e['wall_seconds']:.2f} s) "
                f"| {'PASS' if got < limit else 'MISS'} |"
            )
    for r in results:
        w, wo = best(r["with"]), best(r["without"])
        if w is None or wo is None:
            continue
        ok = w <= wo * 1.0005
        lines.append(
            f"| {r['graph']}: best step with passes <= without | {fmt_ms(w)} vs {fmt_ms(wo)} ms "
            f"| {'PASS' if ok else 'MISS'} |"
        )
    lines += ["", *LIMITS]
    return "\n".join(lines) + "\n"


# What limits the targets this code misses (measured; see the closing note of the issue).
LIMITS = [
    "## What limits the misses",
    "",
    "- **Node reduction** (61-83% on the TensorFlow graphs, against 95%): fusion contracts only "
    "edges where nothing has to wait (a chain link, a source into its only consumer, a sink into "
    "its only producer), and co-placement caps a group at 1/256 of the model's memory per device. "
    "Looser settings (groups up to 1/8 of a device, fusion by the bare degree test) made m-ETF's "
    "step time 3x worse on Inception-V3 (579 ms against 192 ms without the passes): a fused node "
    "waits for all its inputs, so fusing a branch into its join serialises the branches, and a "
    "big group commits m-ETF at its first op.",
    "- **gnmt_static on 4 x 8 GB**: the placers' memory bound counts every tensor live for the "
    "whole step and every received copy kept (43 GB here, while one 8 GB device runs the whole "
    "model in the simulator: 234.1 ms), so no placer finds room; it places on 4 x 16 GB (about "
    "2 s end to end with m-SCT).",
    "- **GNMT layer graph (workload)**: forward-only placement (on by default, as the paper's "
    "condition holds) loses the overlap m-ETF finds between backward and forward work: 519.9 ms "
    "against 356.7 ms; `--no-forward-only` gives 356.7 ms.",
    "- **Transformer**: with temporaries counted once per device in the placers' memory bound, "
    "m-ETF without any pass splits it to 68.8 ms, while with the passes auto keeps one device "
    "(78.2 ms; m-ETF 80.7 ms). Co-placement is what costs it (m-ETF with co-placement alone: "
    "321 ms): chains and forward/backward pairs grouped across the attention blocks commit m-ETF "
    "to a device at a group's first op. Not yet fixed.",
]


def best(run: dict[str, Any]) -> float | None:
    """The best step time over the algorithms and one device: what ``--algo auto`` would keep."""
    steps = [a["step_time_us"] for a in run["algos"].values() if a["step_time_us"] is not None]
    if run["single_device_us"] is not None:
        steps.append(run["single_device_us"])
    return min(steps, default=None)


def main() -> None:
    results = []
    for name, path, memory in sources():
        log(f"{name}: with passes")
        entry: dict[str, Any] = {"graph": name, "path": rel(path), "memory": memory}
        if path.endswith(".pb"):
            entry["coverage"] = coverage(path)
        entry["with"] = measure(path, memory, {})
        log(f"{name}: without")
        entry["without"] = measure(path, memory, NO_PASSES)
        log(f"{name}: end to end")
        entry["end_to_end"] = end_to_end(path, memory)
        results.append(entry)
    write_json(os.path.join(BENCH, "passes.json"), results)
    write_text(os.path.join(BENCH, "passes.md"), render(results))


if __name__ == "__main__":
    main()
