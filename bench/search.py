"""Benchmark of ``--algo auto``: does it ever lose, how far is it from the bound, how long does it take.

`make bench` runs this. It writes bench/search.md (tables, committed) and
bench/search.json (raw numbers). Every case is ``baechi place MODEL --devices
SPEC`` with default options (``place_model``, ``--algo auto``) in this
process, on:

* the committed workloads (testdata/workloads, 4 devices of the file's
  ``maxSizePerFPGA``, parallel communication: REFERENCE.md's setting);
* the committed TensorFlow training graphs on ``rtx2080x4`` (Baechi's
  testbed: PCIe) and ``4x8GB`` (NVLink-like default links), static GNMT
  included (generated into testdata/cache on first use, with TensorFlow);
* the committed ONNX models as training steps (``--training``) on 4x8GB;
* the memory issue's harness models (bench/framework.py: ResNet-50,
  ConvNeXt-T, MobileNetV2, ViT-B/16, BERT-base, ALBERT-base, GPT-2, exported to ONNX
  with their batch fixed) as training steps on 4x8GB, when bench/cache
  has their exports (``make bench`` runs framework.py first). They came
  after the geomean's baseline was taken, so they count for "never loses"
  and time, and their gaps are listed, outside that geomean;
* synthetic layered DAGs (bench/synthetic.py) of 5,000 and 20,000 ops on
  4x8GB, so that each time target has a case at its size (counted for
  "never loses" and time, not in the geomean of real cases).

Per case: auto's step, one device's, the original Baechi's best
(REFERENCE.md; workloads only), the best lower bound and auto's gap to it,
how many settings of the passes auto tried, which plan won, and auto's
placement seconds (the median of three runs, which must give the same plan)
against the cost model's estimate. Targets (reported, not
enforced; the script exits 0):

* auto <= min(the original's best, one device) on every case;
* the geomean of step / lower bound over the real cases loses a third of
  its distance to 1: from 1.710 before auto searched (the first run of
  this bench, d10a067: the options given only, critical-path and work
  bounds) to 1.473 or less. The issue's "1.13 or so" is the same third
  from the 1.2 its own cases started at;
* static GNMT on rtx2080x4 at least 15% faster than one device;
* auto's placement time <= 2 s up to 5k placement nodes, <= 10 s from
  there up to 20k.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import tempfile
import time
from typing import Any

from benchlib import BENCH, TESTDATA, WORKLOADS, Run, log, ms, scrub, tests_module, write_json, write_text
from framework import CASE_BY_NAME
from run import ORIGINAL_STEP_MS, original_best
from synthetic import layered_dag, write_workload_json

from baechi_cli.app.place import place_model, prepare
from baechi_cli.core.devices import parse_devices
from baechi_cli.core.errors import BaechiError
from baechi_cli.evaluator.evaluate import evaluate
from baechi_cli.io.workload_json import read_workload_meta
from baechi_cli.placers import ExactOptions, get
from baechi_cli.placers.exact import DEFAULT_MAX_NODES, gap, solve
from baechi_cli.search.candidates import PlaceOptions

TF_GRAPHS = ("mlp.pb", "cnn.pb", "inception_v3.pb", "resnet50.pb", "transformer.pb")
TF_DEVICES = ("rtx2080x4", "4x8GB")
ONNX_MODELS = ("keras_cnn.onnx", "keras_resnet50.onnx", "torch_resnet.onnx", "torch_transformer.onnx")
ONNX_DEVICES = "4x8GB"
ONNX_DIMS = {"torch_transformer.onnx": {"seq": 128}}  # as tests/onnxmodels.py places it, with --batch-size 8
HARNESS_MODELS = tuple(CASE_BY_NAME)  # framework.py's models, in its order
HARNESS_CACHE = os.path.join(BENCH, "cache")
BEFORE_SEARCH_GEOMEAN = 1.710  # step / lower bound before auto searched (module docstring)
GAP_TARGET = round(1 + (BEFORE_SEARCH_GEOMEAN - 1) * 2 / 3, 3)
EXACT_NODES = 40
GNMT_SPEEDUP_TARGET = 0.85  # step / one device
TIME_TARGETS = ((5000, 2.0), (20000, 10.0))  # (placement nodes up to, seconds), each from the one before
SYNTHETIC_OPS = (5000, 20000)
# auto places each case this many times: its seconds are the median (the machine's speed
# drifts by a fifth from minute to minute), and every run must give the same plan.
TIME_RUNS = 3
SYNTHETIC_DEVICES = "4x8GB"


def cases(workdir: str) -> list[tuple[str, str, str, PlaceOptions]]:
    """(name, path, devices, options) for every case, in table order; synthetic models go in ``workdir``."""
    out = []
    for name in ORIGINAL_STEP_MS:
        path = os.path.join(WORKLOADS, f"{name}.json")
        out.append((name, path, f"4x{read_workload_meta(path).max_size_per_fpga}", PlaceOptions()))
    # Static GNMT is generated into testdata/cache on first use (TensorFlow; about a minute).
    gnmt = tests_module("realgraphs").real_graph("gnmt_static")
    graphs = [os.path.join(TESTDATA, g) for g in TF_GRAPHS] + [str(gnmt)]
    for path in graphs:
        for devices in TF_DEVICES:
            out.append((os.path.basename(path), path, devices, PlaceOptions()))
    for model in ONNX_MODELS:
        path = os.path.join(TESTDATA, model)
        dims = ONNX_DIMS.get(model)
        options = PlaceOptions(training=True, batch_size=dims and 8, dims=dims)
        out.append((f"{model} --training", path, ONNX_DEVICES, options))
    for model in HARNESS_MODELS:
        path = os.path.join(HARNESS_CACHE, f"{model}.onnx")
        if os.path.exists(path):
            out.append((f"{model} (harness) --training", path, ONNX_DEVICES, PlaceOptions(training=True)))
    for n in SYNTHETIC_OPS:
        path = os.path.join(workdir, f"layered_dag_{n}.json")
        write_workload_json(path, n)
        out.append((f"layered_dag({n:,})", path, SYNTHETIC_DEVICES, PlaceOptions()))
    return out


def run_case(name: str, path: str, devices: str, options: PlaceOptions) -> dict[str, Any]:
    record: dict[str, Any] = {
        "name": name,
        "devices": devices,
        "synthetic": name.startswith("layered_dag"),
        "after_baseline": "(harness)" in name,  # not among the cases the geomean's baseline was taken on
    }
    try:
        runs = [place_model(path, parse_devices(devices), options) for _ in range(TIME_RUNS)]
    except BaechiError as err:
        return record | {"error": scrub(f"{type(err).__name__}: {err}")}
    outcome = runs[0]
    for again in runs[1:]:  # the plan is a function of the input: only the seconds may differ
        assert again.placement.device_of == outcome.placement.device_of, name
        assert again.sim.step_time_us == outcome.sim.step_time_us, name
    prepared, search = outcome.prepared, outcome.search
    assert search is not None
    single = prepared.single_device
    original = original_best(name) if name in ORIGINAL_STEP_MS else None
    return record | {
        "ops": prepared.graph.num_ops,
        "nodes": prepared.placement_graph.num_ops,
        "step_us": outcome.sim.step_time_us,
        "single_us": single.step_time_us if single else None,
        "original": None if original is None else {"column": original[0], "step_us": original[1] * 1000},
        "bounds": prepared.bounds.to_json(),
        "gap": prepared.bounds.gap(outcome.sim.step_time_us),
        "chosen": outcome.chosen.label,
        "candidates": len(outcome.candidates),
        "settings_tried": search.settings_tried,
        "budget_s": search.budget_s,
        "estimated_s": search.spent_s,
        "place_s": statistics.median(r.timings["place"] for r in runs),
        "first_setting_step_us": min(
            (
                c.evaluation.value_us
                for c in outcome.candidates
                if c.ok and c.differences == "" and c.stage == "place"
            ),
            default=None,
        ),
    }


def loses(r: dict[str, Any]) -> bool:
    """auto's step above min(original's best, one device) (beyond float noise)."""
    refs = [x for x in (r.get("single_us"), (r.get("original") or {}).get("step_us")) if x is not None]
    return bool(refs) and r["step_us"] > min(refs) * (1 + 1e-9)


def render(records: list[dict[str, Any]], run: Run) -> str:
    ok = [r for r in records if "error" not in r]
    real = [r for r in ok if not r.get("synthetic") and not r.get("after_baseline")]
    later = [r["step_us"] / r["bounds"]["best_us"] for r in ok if r.get("after_baseline")]
    ratios = [r["step_us"] / r["bounds"]["best_us"] for r in real if r["bounds"]["best_us"] > 0]
    first = [r["first_setting_step_us"] / r["bounds"]["best_us"] for r in real if r["first_setting_step_us"]]
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan")
    geomean_first = math.exp(sum(map(math.log, first)) / len(first)) if first else float("nan")
    lost = [r["name"] + " " + r["devices"] for r in ok if loses(r)]
    lines = [
        "# auto: search, refinement and bounds",
        "",
        f"Made by `python bench/search.py` (part of `make bench`) on {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, in {run.seconds / 60:.1f} minutes "
        f"({run.load_text()}: the machine is shared, and other work inflates the seconds). "
        "Raw numbers: [search.json](search.json).",
        "",
        "## Targets",
        "",
        "| target | measured | result |",
        "|---|---|---|",
        f"| auto <= min(original's best, one device), every case | {len(ok) - len(lost)} of {len(ok)} cases"
        + (f"; loses on {', '.join(lost)}" if lost else "")
        + f" | {'PASS' if not lost else 'MISS'} |",
        f"| geomean step / lower bound loses a third of its distance to 1: from {BEFORE_SEARCH_GEOMEAN:.3f} "
        f"before auto searched to <= {GAP_TARGET} | {geomean:.3f} (the options given only, no search, "
        f"against today's bounds: {geomean_first:.3f})"
        + (
            f"; the harness models, not in it: {math.exp(sum(map(math.log, later)) / len(later)):.3f}"
            if later
            else ""
        )
        + f" | {'PASS' if geomean <= GAP_TARGET else 'MISS'} |",
    ]
    gnmt = next((r for r in ok if r["name"] == "gnmt_static.pb" and r["devices"] == "rtx2080x4"), None)
    if gnmt is not None:
        ratio = gnmt["step_us"] / gnmt["single_us"]
        lines.append(
            f"| static GNMT on rtx2080x4 >= 15% faster than one device | {ms(gnmt['step_us'])} ms vs "
            f"{ms(gnmt['single_us'])} ms ({1 - ratio:+.1%} faster; bound {ms(gnmt['bounds']['best_us'])} ms) | "
            f"{'PASS' if ratio <= GNMT_SPEEDUP_TARGET else 'MISS'} |"
        )
    low = 0
    for limit, target in TIME_TARGETS:
        within = [r for r in ok if low < r["nodes"] <= limit]
        worst = max(within, key=lambda r: r["place_s"], default=None)
        if worst is not None:
            lines.append(
                f"| auto's placement <= {target:g} s from {low:,} to {limit:,} nodes | slowest "
                f"{worst['place_s']:.2f} s, median of {TIME_RUNS} runs ({worst['name']} {worst['devices']}, {worst['nodes']:,} nodes; "
                f"{len(within)} case{'s' if len(within) > 1 else ''}) | "
                f"{'PASS' if worst['place_s'] <= target else 'MISS'} |"
            )
        low = limit
    lines += [
        "",
        "## Every case",
        "",
        "Step times in ms. gap: step / best lower bound - 1 (the bound's kind in brackets). "
        "settings: distinct settings of the passes auto placed under. place: auto's real seconds "
        f"(the median of {TIME_RUNS} runs, each giving the same plan); "
        "estimate: what its cost model charged the budget (beyond the first setting).",
        "",
        "| model | devices | ops | nodes | auto | chosen | one device | original's best | lower bound | gap "
        "| settings | place (s) | estimate (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['devices']} | | | {r['error'][:120]} | | | | | | | | |")
            continue
        b = r["bounds"]
        original = r["original"]
        lines.append(
            f"| {r['name']} | {r['devices']} | {r['ops']:,} | {r['nodes']:,} | {ms(r['step_us'])} | {r['chosen']} "
            f"| {ms(r['single_us'])} | "
            + ("-" if original is None else f"{original['step_us'] / 1000:.1f} ({original['column']})")
            + f" | {ms(b['best_us'])} ({b['best']}) | {r['gap']:+.1%} "
            f"| {r['settings_tried']} | {r['place_s']:.2f} | {r['estimated_s']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def exact_records() -> list[dict[str, Any]]:
    """exact as ``--algo exact`` runs it (10 s of CP-SAT's deterministic time, hinted by m-ETF) on
    synthetic 40-op DAGs (bench/synthetic.py, width 8) on 2-4 devices, beside CP-SAT alone (``solve``
    without a hint), and on the committed workloads' placement graphs when they are small enough."""
    out = []
    for seed in range(3):
        graph = layered_dag(EXACT_NODES, width=8, seed=seed)
        for count in (2, 3, 4):
            devices = parse_devices(f"{count}x1TB")
            row = {"graph": f"layered_dag({EXACT_NODES}, seed {seed})", "devices": count}
            alone = solve(graph, devices, time_limit=10.0)
            out.append(
                row
                | exact_mode(graph, devices)
                | {"alone": {"status": alone.status, "seconds": alone.seconds}}
            )
    for name in ORIGINAL_STEP_MS:
        path = os.path.join(WORKLOADS, f"{name}.json")
        devices = parse_devices(f"4x{read_workload_meta(path).max_size_per_fpga}")
        options = PlaceOptions(forward_only=False)
        graph = prepare(path, devices, options, lambda stage: None).placement_graph
        if graph.num_ops > DEFAULT_MAX_NODES:
            out.append({"graph": name, "devices": 4, "nodes": graph.num_ops, "status": "over the size guard"})
            continue
        try:
            out.append({"graph": name, "devices": 4} | exact_mode(graph, devices))
        except BaechiError as err:
            out.append({"graph": name, "devices": 4, "nodes": graph.num_ops, "status": type(err).__name__})
    return out


def exact_mode(graph: Any, devices: Any) -> dict[str, Any]:
    """exact's placer (``--algo exact``: m-ETF's hint, then CP-SAT) on ``graph``, judged by the evaluator."""
    t0 = time.perf_counter()
    placement = get("exact").place(graph, devices, ExactOptions(time_limit=10.0))
    seconds = time.perf_counter() - t0
    info = placement.info
    evaluated = evaluate(graph, devices, placement).value_us
    bound = info["exact_lower_bound_us"]
    return {
        "nodes": info["exact_nodes"],
        "status": info["exact_status"],
        "evaluated_us": evaluated,
        "lower_bound_us": bound,
        "gap": gap(evaluated, bound),
        "seconds": seconds,
        "counted_seconds": info["exact_counted_seconds"],
    }


def exact_lines(rows: list[dict[str, Any]]) -> list[str]:
    proven = [r for r in rows if r["graph"].startswith("layered_dag")]
    ok = all(r["status"] == "optimal" and r["seconds"] <= 10 for r in proven)
    slowest = max(proven, key=lambda r: r["seconds"])
    alone = [r["alone"] for r in proven]
    lines = [
        "",
        "## exact (CP-SAT)",
        "",
        f"Target: proves optimality on graphs of up to {EXACT_NODES} nodes on 2 to 4 devices within 10 s: "
        f"**{'PASS' if ok else 'MISS'}** ({sum(r['status'] == 'optimal' for r in proven)} of {len(proven)} "
        f"proven, slowest {slowest['seconds']:.2f} s, {slowest['counted_seconds']:.2f} of them counted by CP-SAT), "
        "as `--algo exact` runs: m-ETF's plan "
        "as the hint, then CP-SAT. CP-SAT alone, without the hint: "
        f"{sum(a['status'] == 'optimal' for a in alone)} of {len(alone)} proven, slowest "
        f"{max(a['seconds'] for a in alone):.2f} s. Seconds are wall-clock; CP-SAT's limit is deterministic "
        "(10 counted seconds), and how many it counts per second depends on the machine: the counted "
        "column is what every machine spends (with one worker CP-SAT's search is the same everywhere), "
        "the wall-clock one what this machine took. The workloads' "
        "placement graphs (without forward-only placement, fused) get a plan and a gap to the bound proven "
        "on that graph (gap: (plan - bound) / plan).",
        "",
        "| graph | devices | nodes | status | plan (ms) | bound (ms) | gap | seconds | counted (s) "
        "| CP-SAT alone (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "evaluated_us" not in r:
            lines.append(f"| {r['graph']} | {r['devices']} | {r['nodes']} | {r['status']} | | | | | | |")
            continue
        a = r.get("alone")
        alone_cell = (
            ""
            if a is None
            else f"{a['seconds']:.2f}" + ("" if a["status"] == "optimal" else f" ({a['status']})")
        )
        lines.append(
            f"| {r['graph']} | {r['devices']} | {r['nodes']} | {r['status']} | {ms(r['evaluated_us'])} "
            f"| {ms(r['lower_bound_us'])} | {r['gap']:.2%} | {r['seconds']:.2f} | {r['counted_seconds']:.2f} "
            f"| {alone_cell} |"
        )
    return lines


def main() -> None:
    run = Run()
    records = []
    with tempfile.TemporaryDirectory(prefix="baechi-search-") as workdir:
        for name, path, devices, options in cases(workdir):
            t = time.perf_counter()
            records.append(run_case(name, path, devices, options))
            log(f"[{run.elapsed():6.0f} s] {name} {devices}: {time.perf_counter() - t:.1f} s")
    exact = exact_records()
    run.stop()
    write_json(os.path.join(BENCH, "search.json"), {"auto": records, "exact": exact})
    write_text(os.path.join(BENCH, "search.md"), render(records, run) + "\n".join(exact_lines(exact)) + "\n")


if __name__ == "__main__":
    main()
