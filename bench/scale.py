"""Scale: `baechi place` on synthetic workloads of 100k to 1M ops, with wall time and peak RSS.

`make bench` runs this script. It writes every graph as a cost-annotated
workload JSON file (bench/synthetic.py's layered DAG, seed 0, the same graph
``layered_dag`` builds) into a temporary folder, places each one through the
CLI in a fresh process (``baechi place FILE --devices ... --algo ALGO
--report R.json``), and writes bench/scale.md: per graph and algorithm, wall
seconds, peak resident memory (the child's own ``VmHWM``, read as it exits;
``ru_maxrss`` from ``os.wait4`` if it is killed), the predicted step time,
whether it stayed within the 8 GB target, and the seconds per stage from the
report. The graphs are not kept (195 MB for 1M ops).

Two device settings per size:

* ``ample``: 4 devices of 2 TB, so every device could hold the whole graph
  (``placers/memory.ample``) and the placers count no memory;
* ``counted``: 4 devices of 200 KB per op (20 GB at 100k ops), roomy enough
  to place but not ample, so m-TOPO and m-ETF count memory by liveness
  (``placers/liveness.py``) and the evaluator checks their placement.

``--algo auto`` runs too (counted devices, sizes up to ``AUTO_MAX_OPS``):
its search budget grows with the graph (docs/DESIGN.md, "auto").

Many devices (the section "Many devices" of bench/scale.md): the 200-op
chain of tests/test_extremes.py (0.5 ms ops, 1 KB weights, 4 KB tensors,
each op feeding the next three) with every algorithm, and the layered DAG at
5,000 ops with m-TOPO and m-ETF, each on 4, 10,000 and 65,536 devices of
8 GB (``MANY_DEVICES``): placers look at one idle device per class of
interchangeable ones, so the device count should cost little.
``--many-devices`` runs this section alone and replaces it in bench/scale.md,
leaving the table above it as it is; a full run measures both.

Options: ``--sizes 100000,300000`` and ``--algos topo,etf`` pick cases,
``--quick`` is a smoke run on 10k and 30k ops written to a temporary folder,
``--baechi-root DIR`` places with the ``baechi_cli`` package of another
checkout (``PYTHONPATH=DIR`` for the child, which runs ``python -m baechi_cli``; to compare
before and after a change under the same load),
``--output FILE`` writes the tables elsewhere. Times on a shared machine
vary from run to run; the tables state the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from benchlib import BENCH, load_averages, log, table
from synthetic import write_workload_json

SIZES = (100_000, 300_000, 1_000_000)
QUICK_SIZES = (10_000, 30_000)
ALGOS = ("topo", "etf", "auto")
AUTO_MAX_OPS = 300_000  # auto's budget grows with size: at 1M ops it would search for minutes
TARGET_OPS = 1_000_000
RSS_TARGET_BYTES = 8 * 10**9
CASE_TIMEOUT_S = 1800
AMPLE = "4x2TB"
COUNTED_BYTES_PER_OP = 200_000
STAGES = ("load", "passes", "simulate", "place")
MANY_DEVICES = (4, 10_000, 65_536)
CHAIN_ALGOS = ("topo", "etf", "sct", "auto", "single")
LAYERED_OPS = 5_000
LAYERED_ALGOS = ("topo", "etf")
MANY_HEADING = "## Many devices"


@dataclass
class Case:
    ops: int
    setting: str  # "ample" or "counted"
    devices: str
    algo: str


def cases(sizes: list[int], algos: list[str]) -> list[Case]:
    out = []
    for n in sizes:
        memory = COUNTED_BYTES_PER_OP * n
        counted = f"4x{memory // 10**9}GB" if memory % 10**9 == 0 else f"4x{memory}"
        for algo in algos:
            if algo == "auto":
                if n <= AUTO_MAX_OPS:
                    out.append(Case(n, "counted", counted, algo))
                continue
            out.append(Case(n, "ample", AMPLE, algo))
            out.append(Case(n, "counted", counted, algo))
    return out


def run_case(case: Case, path: str, workdir: str, baechi_root: str | None) -> dict[str, Any]:
    """Place ``path`` in a child process (``python -m baechi_cli``, the installed package's, or with
    ``baechi_root`` that checkout's); wall seconds, the child's peak RSS and the report's numbers."""
    report = os.path.join(workdir, "report.json")
    peak_file = os.path.join(workdir, "vmhwm")
    for path_ in (report, peak_file):
        if os.path.exists(path_):
            os.unlink(path_)
    # The child's own peak: VmHWM as it exits. ru_maxrss starts from the parent's peak at exec,
    # which exceeds a small child's (tests/test_scale_rss.py).
    code = (
        "import atexit, runpy\n"
        "def peak():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmHWM:'):\n"
        f"            open({peak_file!r}, 'w').write(line.split()[1])\n"
        "atexit.register(peak)\n"
        "runpy.run_module('baechi_cli', run_name='__main__', alter_sys=True)"  # python -m baechi_cli
    )
    argv = [sys.executable, "-c", code, "place", path, "--devices", case.devices, "--algo", case.algo]
    argv += ["--report", report, "--quiet"]
    env = None if baechi_root is None else {**os.environ, "PYTHONPATH": baechi_root}
    errors = os.path.join(workdir, "stderr.txt")
    t0 = time.perf_counter()
    with open(errors, "w") as err:
        # wait4, not wait: it gives this child's own rusage (RUSAGE_CHILDREN is the largest child's).
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, cwd=workdir, env=env)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > CASE_TIMEOUT_S:
                proc.kill()
                _, status, usage = os.wait4(proc.pid, 0)
                proc.returncode = os.waitstatus_to_exitcode(status)
                return {
                    "error": f"no result within {CASE_TIMEOUT_S} s",
                    "peak_rss_bytes": usage.ru_maxrss * 1024,
                }
            time.sleep(0.05)
    wall = time.perf_counter() - t0
    exit_code = proc.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait again
    record: dict[str, Any] = {
        "exit": exit_code,
        "wall_s": wall,
        "peak_rss_bytes": usage.ru_maxrss * 1024,  # Linux reports KiB
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }
    if os.path.exists(peak_file):
        with open(peak_file) as f:
            record["peak_rss_bytes"] = int(f.read()) * 1024
    if exit_code != 0:
        with open(errors) as f:
            record["error"] = f"exit {exit_code}: " + " ".join(f.read().split())[:200]
        return record
    with open(report) as f:
        doc = json.load(f)
    record["step_time_us"] = doc["result"]["step_time_us"]
    record["lower_bound_us"] = doc["result"]["lower_bound_us"]
    record["timings_s"] = doc["timings_s"]
    record["chosen"] = doc["algorithm"]
    record["candidates"] = len(doc["candidates"])
    record["devices_used"] = sum(1 for d in doc["per_device"] if d["ops"])
    return record


def write_chain_json(path: str, num_ops: int = 200) -> int:
    """tests/test_extremes.py's ``chain(200, latency_ms=0.5, size=1000, edge_size=4096, fanout=3)``
    as a workload JSON file; returns its edge count."""
    nodes = [{"id": i, "name": f"n{i}", "fpgaLatency": 0.5, "size": 1000} for i in range(num_ops)]
    edges = [
        {"sourceId": i, "destId": j, "size": 4096}
        for i in range(num_ops)
        for j in range(i + 1, min(num_ops, i + 4))
    ]
    with open(path, "w") as f:
        json.dump({"nodes": nodes, "edges": edges}, f)
    return len(edges)


def many_devices(workdir: str, baechi_root: str | None) -> list[str]:
    """Run the many-device cases; the section's lines for bench/scale.md."""
    graphs = []
    chain = os.path.join(workdir, "chain_200.json")
    graphs.append(("200-op chain", chain, write_chain_json(chain), 200, CHAIN_ALGOS))
    layered = os.path.join(workdir, f"layered_{LAYERED_OPS}.json")
    edges = write_workload_json(layered, LAYERED_OPS)
    graphs.append(("layered DAG", layered, edges, LAYERED_OPS, LAYERED_ALGOS))
    header = [
        "graph",
        "ops",
        "edges",
        "devices",
        "algorithm",
        "wall (s)",
        "peak RSS (MB)",
        "devices used",
        "note",
    ]
    rows = []
    for name, path, edges, ops, algos in graphs:
        for count in MANY_DEVICES:
            for algo in algos:
                case = Case(ops, "many", f"{count}x8GB", algo)
                r = run_case(case, path, workdir, baechi_root)
                rss = r.get("peak_rss_bytes", 0)
                log(
                    f"  {name} {count:6d} {algo:6s} {r.get('wall_s', 0):6.2f} s  {rss / 1e6:5.0f} MB  {r.get('error', '')}"
                )
                note = r.get("error", "")
                if algo == "auto" and "chosen" in r:
                    note = f"chose {r['chosen']}"
                rows.append(
                    [
                        name,
                        f"{ops:,}",
                        f"{edges:,}",
                        f"{count:,}",
                        algo,
                        f"{r['wall_s']:.2f}" if "wall_s" in r else "-",
                        f"{rss / 1e6:.0f}" if rss else "-",
                        f"{r['devices_used']:,}" if "devices_used" in r else "-",
                        note.replace("|", "/"),
                    ]
                )
    return [
        MANY_HEADING,
        "",
        "`bench/scale.py --many-devices`. Each row is one `baechi place FILE.json --devices N x 8GB",
        "--algo A --report R.json` in a fresh process, as above; peak RSS: the process's own (`VmHWM`",
        "as it exits); devices used: those the placement puts an op on. The report lists every",
        "device (`devices`, `per_device`), which is most of the time at 65,536 devices. Placers look",
        "at one idle device per class of interchangeable ones (`DeviceSpec.classes`), so they cost",
        "O(ops x (devices used + classes)), not O(ops x devices). Before that (same machine, one run",
        "each), the chain on 4,096 devices took 0.42 / 1.46 / 1.96 / 2.99 s with m-TOPO / m-ETF / m-SCT",
        "/ auto, 10,000 devices were refused (with the cap lifted: 0.41 / 2.90 / 7.11 / 9.51 s), and",
        "m-ETF took 106 s for the layered DAG on 10,000 devices.",
        "",
        f"Machine: {machine()}.",
        "",
        *table(header, rows),
        "",
    ]


def merge_many(path: str, section: list[str]) -> None:
    """Put ``section`` into the file at ``path`` in place of its many-devices section (or at its end)."""
    text = open(path).read() if os.path.exists(path) else ""
    head = text.split(MANY_HEADING)[0].rstrip("\n")
    with open(path, "w") as f:
        f.write((head + "\n\n" if head else "") + "\n".join(section))


def machine() -> str:
    model = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor() or "unknown CPU",
    )
    mem_kb = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    load = load_averages()
    return (
        f"{model}, {os.cpu_count()} cores, {mem_kb * 1024 / 2**30:.0f} GiB RAM; {platform.system()} "
        f"{platform.release()}; Python {platform.python_version()}; load average at start {load} "
        "(a shared machine: other jobs ran beside this one)"
    )


def fmt_step(us: float | None) -> str:
    return "-" if us is None else f"{us / 1e6:,.1f} s"


def scale_table(records: list[tuple[Case, int, dict[str, Any]]]) -> list[str]:
    header = [
        "ops",
        "edges",
        "devices",
        "algorithm",
        "wall (s)",
        "CPU (s)",
        "peak RSS (GB)",
        "within 8 GB",
        "predicted step",
        *(f"{s} (s)" for s in STAGES),
        "rest (s)",
        "note",
    ]
    rows = []
    for case, edges, r in records:
        rss = r.get("peak_rss_bytes")
        timings = r.get("timings_s", {})
        note = r.get("error", "")
        if case.algo == "auto" and "chosen" in r:
            note = f"chose {r['chosen']} of {r['candidates']} candidates"
        rows.append(
            [
                f"{case.ops:,}",
                f"{edges:,}",
                f"{case.devices} ({case.setting})",
                case.algo,
                f"{r['wall_s']:.1f}" if "wall_s" in r else "-",
                f"{r['cpu_s']:.1f}" if "cpu_s" in r else "-",
                f"{rss / 1e9:.2f}" if rss else "-",
                "-" if not rss else ("yes" if rss <= RSS_TARGET_BYTES else "no"),
                fmt_step(r.get("step_time_us")),
                *(f"{timings[s]:.1f}" if s in timings else "-" for s in STAGES),
                f"{r['wall_s'] - sum(timings[s] for s in STAGES):.1f}" if timings else "-",
                note.replace("|", "/"),
            ]
        )
    return table(header, rows)


def write_markdown(
    path: str, records: list[tuple[Case, int, dict[str, Any]]], quick: bool, many: list[str]
) -> None:
    target = [r for c, _, r in records if c.ops == TARGET_OPS and c.algo in ("topo", "etf")]
    met = target and all(r.get("exit") == 0 and r["peak_rss_bytes"] <= RSS_TARGET_BYTES for r in target)
    lines = [
        "# Scale: 100k to 1M ops through `baechi place`",
        "",
        "Written by `bench/scale.py` (`make bench`); see its docstring for the method. Each row is one",
        "`baechi place FILE.json --devices D --algo A --report R.json` in a fresh process on a",
        "synthetic layered DAG (bench/synthetic.py, seed 0, 16 ops per layer, 1-3 inputs per op,",
        "10-500 µs ops, 4 KB-4 MB tensors, a quarter of the ops holding 1 MB of weights) written as",
        "workload JSON. Wall and CPU: the whole process (start-up, reading the file, report written);",
        "peak RSS: the process's own (`VmHWM` as it exits). Stage seconds come from the report's",
        "`timings_s` (`place` includes judging the placement; `simulate` is the one-device run and bounds);",
        "rest: the wall time outside them (start-up, building and writing the report, exit; for auto",
        "also its search beyond the placers' runs: the passes under other settings, refinement).",
        "ample: every device could hold the whole graph, so no memory is counted; counted: 200 KB",
        "per op per device, where m-TOPO and m-ETF count memory by liveness.",
        "",
        f"Target: 1M ops with m-TOPO and m-ETF within {RSS_TARGET_BYTES / 1e9:.0f} GB peak RSS: "
        + ("**met**." if met else "not measured in this run." if not target else "**missed**."),
        "",
        f"Machine: {machine()}.",
        "",
        *scale_table(records),
        "",
        *many,
    ]
    if quick:
        lines.insert(2, "**Quick run (`--quick`): small graphs only.**\n")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", help="comma-separated op counts (default: 100000,300000,1000000)")
    parser.add_argument("--algos", default=",".join(ALGOS), help="comma-separated: topo, etf, auto")
    parser.add_argument("--quick", action="store_true", help="10k and 30k ops; output in a temporary folder")
    parser.add_argument(
        "--baechi-root", help="another checkout whose baechi_cli places (default: the installed package)"
    )
    parser.add_argument("--output", help="where to write the tables (default bench/scale.md)")
    parser.add_argument(
        "--many-devices", action="store_true", help="only the many-devices section, replaced in the output"
    )
    args = parser.parse_args()
    sizes = (
        [int(s) for s in args.sizes.split(",")] if args.sizes else list(QUICK_SIZES if args.quick else SIZES)
    )
    algos = args.algos.split(",")
    with tempfile.TemporaryDirectory(prefix="baechi-scale-") as workdir:
        output = args.output or (
            os.path.join(workdir, "scale.md") if args.quick else os.path.join(BENCH, "scale.md")
        )
        root = os.path.abspath(args.baechi_root) if args.baechi_root else None
        if args.many_devices:
            merge_many(output, many_devices(workdir, root))
            log(f"wrote {output}")
            return
        records: list[tuple[Case, int, dict[str, Any]]] = []
        for n in sizes:
            path = os.path.join(workdir, f"layered_{n}.json")
            t0 = time.perf_counter()
            edges = write_workload_json(path, n)
            log(
                f"{n:,} ops, {edges:,} edges: {os.path.getsize(path) / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s"
            )
            for case in cases([n], algos):
                record = run_case(case, path, workdir, root)
                rss = record.get("peak_rss_bytes", 0) / 1e9
                log(
                    f"  {case.algo:5s} {case.setting:8s} {record.get('wall_s', 0):7.1f} s  {rss:5.2f} GB  "
                    f"{fmt_step(record.get('step_time_us'))}  {record.get('error', '')}"
                )
                records.append((case, edges, record))
            os.unlink(path)
        write_markdown(output, records, args.quick, [] if args.quick else many_devices(workdir, root))
        if args.quick:
            with open(output) as f:
                print(f.read())
    log(f"wrote {output}")


if __name__ == "__main__":
    main()
