"""Time m-SCT's favorite-child LP on each OR-Tools backend; writes bench/lp_backends.md.

Every case (backend, synthetic layered DAG size) runs in its own process,
under the LP's own time limit (``--limit``, default 120 s) and a hard kill a
minute later, so a backend that ignores its limit cannot stall the table. A
backend that times out at one size is not tried at larger ones. All backends
solve the same LP (``sct_lp.solve_favorite_lp``), so their objectives must
agree; the table shows them to check.

Usage: ``python bench/lp_backends.py [--limit S] [--out PATH]``;
``--one BACKEND OPS WIDTH LIMIT`` runs a single case and prints its JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import ortools
from benchlib import BENCH, log, rel, table, write_text
from synthetic import layered_dag

from baechi_cli.core.devices import parse_devices
from baechi_cli.core.errors import SolverError
from baechi_cli.placers import sct_lp

# Variants measured besides sct_lp.BACKENDS, to justify the parameters chosen there.
EXTRA = {
    "glop-primal": ("GLOP", ""),  # GLOP's default (primal simplex)
    "highs-ipm": ("HIGHS_LP", "output_flag=false\nsolver=ipm"),  # interior point + crossover
}
BACKENDS = ["highs", "glop", "glop-primal", "clp", "highs-ipm", "pdlp"]
SIZES = [(1000, 16), (5000, 16), (20000, 16)]
# Larger or wider graphs, HiGHS only: how build and solve times grow.
HIGHS_EXTRA_SIZES = [(20000, 64), (100000, 16)]


def run_one(backend: str, num_ops: int, width: int, limit: float) -> dict:
    sct_lp.BACKENDS.update(EXTRA)
    graph = layered_dag(num_ops, width=width)
    row = {"backend": backend, "ops": num_ops, "width": width, "edges": graph.num_edges}
    lp = sct_lp.FavoriteLP(graph, parse_devices("4x8GB"), backend)
    row |= {"build_s": lp.build_seconds}
    t0 = time.perf_counter()
    try:
        res = lp.solve(limit)
    except SolverError as err:
        return row | {"error": str(err), "solve_s": time.perf_counter() - t0}
    fav = sct_lp.favorite_children(res)
    return row | {
        "lp_edges": len(res.src),
        "variables": res.num_variables,
        "constraints": res.num_constraints,
        "solve_s": res.seconds,
        "objective_us": res.objective_us,
        "favorites": sum(v >= 0 for v in fav),
    }


def run_case(backend: str, num_ops: int, width: int, limit: float) -> dict:
    cmd = [sys.executable, __file__, "--one", backend, str(num_ops), str(width), str(limit)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit + 60)
    except subprocess.TimeoutExpired:
        return {"backend": backend, "ops": num_ops, "width": width, "error": "killed: ignored its time limit"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"backend": backend, "ops": num_ops, "width": width, "error": f"crashed: {tail}"}
    return json.loads(lines[-1])  # the last line: a backend may print before it


def cell(row: dict) -> str:
    if "error" in row:
        if row["error"] == "skipped":
            return "skipped"
        if "ran out of time" in row["error"] or "time limit with" in row["error"]:
            return f"{row['build_s']:.2f} + timed out"
        return "failed (see below)"
    return f"{row['build_s']:.2f} + {row['solve_s']:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--one", nargs=4, metavar=("BACKEND", "OPS", "WIDTH", "LIMIT"))
    ap.add_argument("--limit", type=float, default=120.0)
    ap.add_argument("--out", default=os.path.join(BENCH, "lp_backends.md"))
    args = ap.parse_args()
    if args.one:
        backend, ops, width, limit = args.one
        print(json.dumps(run_one(backend, int(ops), int(width), float(limit))))
        return

    rows: list[dict] = []
    for backend in BACKENDS:
        gave_up = False
        for ops, width in SIZES:
            if gave_up:
                rows.append({"backend": backend, "ops": ops, "width": width, "error": "skipped"})
                continue
            row = run_case(backend, ops, width, args.limit)
            log(json.dumps(row))
            rows.append(row)
            gave_up = "error" in row
    for ops, width in HIGHS_EXTRA_SIZES:
        row = run_case("highs", ops, width, args.limit)
        log(json.dumps(row))
        rows.append(row)

    def find(backend: str, ops: int, width: int) -> dict:
        return next(r for r in rows if (r["backend"], r["ops"], r["width"]) == (backend, ops, width))

    lines = [
        "# Favorite-child LP backends (m-SCT)",
        "",
        f"Made by `python bench/lp_backends.py` on {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, OR-Tools {ortools.__version__}. One run per case; "
        f"LP time limit {args.limit:g} s. Synthetic layered DAGs (`bench/synthetic.py`, seed 0), "
        "4x8GB devices (Baechi's PCIe comm model). The machine is shared with other work, so "
        "differences under ~20% are noise.",
        "",
        'Cells: build + solve seconds. "timed out": hit the time limit; "skipped": timed out '
        "at a smaller size.",
        "",
        *table(["backend", "solver id, parameters", *(f"{o // 1000}k ops" for o, _ in SIZES)], []),
    ]
    for backend in BACKENDS:
        sid, params = sct_lp.BACKENDS.get(backend) or EXTRA[backend]
        cells = " | ".join(cell(find(backend, o, w)) for o, w in SIZES)
        lines.append(f"| {backend} | `{sid}` {params.replace(chr(10), ', ') or '(defaults)'} | {cells} |")
    fastest = []
    for ops, width in SIZES:
        done = [r for r in rows if (r["ops"], r["width"]) == (ops, width) and "error" not in r]
        best = min(done, key=lambda r: r["build_s"] + r["solve_s"], default=None)
        fastest.append(best["backend"] if best else "none")
    lines.append("| **fastest** | | " + " | ".join(f"**{b}**" for b in fastest) + " |")
    failures = [r for r in rows if "error" in r and r["error"] != "skipped" and cell(r).startswith("failed")]
    if failures:
        lines += ["", "Failures:", ""]
        lines += [f"- {r['backend']}, {r['ops']} ops, width {r['width']}: {r['error']}" for r in failures]
    lines += [
        "",
        "## LP sizes and objectives (all backends that finished must agree)",
        "",
        *table(
            [
                "ops",
                "width",
                "graph edges",
                "LP edges",
                "variables",
                "constraints",
                "objective (µs), per backend",
            ],
            [],
        ),
    ]
    for ops, width in SIZES + HIGHS_EXTRA_SIZES:
        done = [r for r in rows if (r["ops"], r["width"]) == (ops, width) and "error" not in r]
        if not done:
            any_row = next(r for r in rows if (r["ops"], r["width"]) == (ops, width))
            lines.append(f"| {ops} | {width} | {any_row.get('edges', '')} | | | | none finished |")
            continue
        r0 = done[0]
        objs = ", ".join(f"{r['backend']} {r['objective_us']:.3f}" for r in done)
        lines.append(
            f"| {ops} | {width} | {r0['edges']} | {r0['lp_edges']} | {r0['variables']} | "
            f"{r0['constraints']} | {objs} |"
        )
    lines += [
        "",
        "## HiGHS on larger or wider graphs",
        "",
        *table(["ops", "width", "build (s)", "solve (s)", "favorite edges"], []),
    ]
    for ops, width in [(o, w) for o, w in SIZES] + HIGHS_EXTRA_SIZES:
        r = find("highs", ops, width)
        if "error" in r:
            lines.append(f"| {ops} | {width} | {r.get('build_s', 0):.2f} | {cell(r).split(' + ')[-1]} | |")
        else:
            lines.append(f"| {ops} | {width} | {r['build_s']:.2f} | {r['solve_s']:.2f} | {r['favorites']} |")
    write_text(args.out, "\n".join(lines) + "\n")
    log(f"wrote {rel(args.out)}")


if __name__ == "__main__":
    main()
