"""The placement pipeline: load -> cost -> passes -> place -> expand -> simulate -> write.

Every stage is a function of OpGraph (plus options) to OpGraph or to a
Placement; this module strings them together, times them and assembles the
report. It never prints: ``progress(stage)`` is called as each stage starts
so the CLI can draw a progress bar.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from baechi_cli import __version__
from baechi_cli.devices import DeviceSpec
from baechi_cli.errors import InfeasibleError, InputError
from baechi_cli.graph import OpGraph
from baechi_cli.io.report import REPORT_SCHEMA
from baechi_cli.placers import PLACER_NAMES, Placement, get_placer
from baechi_cli.placers.single import largest_device
from baechi_cli.sim import SimResult, lower_bound, same_timeline, simulate

STAGES = ("load", "profile", "passes", "place", "simulate", "write")

ALGORITHM_TITLES = {"topo": "m-TOPO", "etf": "m-ETF", "sct": "m-SCT", "single": "single device"}


@dataclass
class PlaceOptions:
    algo: str = "topo"
    batch_size: int | None = None
    comm: str | None = None  # overrides the device spec's interconnect mode


@dataclass
class PassRecord:
    name: str
    ops_before: int
    ops_after: int
    edges_before: int
    edges_after: int
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class PlaceOutcome:
    path: str
    input_format: str
    graph: OpGraph  # costed, after passes
    devices: DeviceSpec
    algorithm: str
    placement: Placement
    sim: SimResult
    lower_bound_us: float
    single_device: SimResult | None  # None when the model does not fit one device
    passes: list[PassRecord]
    timings: dict[str, float]
    cost_report: Any
    notes: list[str]
    sha256: str


def detect_format(path: str) -> str:
    """'graphdef' for .pb/.pbtxt (and anything else that parses as one)."""
    ext = os.path.splitext(path)[1].lower()
    if ext == ".onnx":
        raise InputError("ONNX input is not supported yet; export a TensorFlow GraphDef (.pb)", path=path)
    if ext == ".json":
        raise InputError(
            "workload JSON input is not supported yet; give a TensorFlow GraphDef (.pb)", path=path
        )
    return "graphdef"


def load_model(path: str, batch_size: int | None) -> tuple[OpGraph, str]:
    """Read ``path`` into an OpGraph; returns the graph and its format name."""
    fmt = detect_format(path)
    from baechi_cli.io.graphdef import read_graphdef

    try:
        return read_graphdef(path, batch_size=batch_size), fmt
    except InputError as err:
        raise err.with_path(path) from None


def run_pass(name: str, fn: Callable[[OpGraph], OpGraph], graph: OpGraph) -> tuple[OpGraph, PassRecord]:
    """Apply one pass and record what it did."""
    t0 = time.perf_counter()
    out = fn(graph)
    record = PassRecord(
        name, graph.num_ops, out.num_ops, graph.num_edges, out.num_edges, time.perf_counter() - t0
    )
    if name == "colocation":
        sizes = [len(ops) for ops in out.group_members().values()]
        record.details = {"groups": len(sizes), "largest_group": max(sizes, default=0)}
    return out, record


def place_model(
    path: str,
    devices: DeviceSpec,
    options: PlaceOptions,
    *,
    output: str | None = None,
    report_path: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> PlaceOutcome:
    """Run the whole pipeline on ``path``; write ``output`` and ``report_path`` when given."""
    step = progress or (lambda stage: None)
    if options.algo not in PLACER_NAMES:
        raise InputError(f"unknown algorithm '{options.algo}' (choose from {', '.join(PLACER_NAMES)})")
    if options.comm is not None:
        devices = devices.with_comm_mode(options.comm)
    for target in (output, report_path):
        if target is not None:
            _check_writable(target)
    timings: dict[str, float] = {}
    t_start = time.perf_counter()

    step("load")
    t0 = time.perf_counter()
    if not os.path.exists(path):
        raise InputError("no such file", path=path)
    graph, fmt = load_model(path, options.batch_size)
    sha256 = _sha256(path)
    if output is not None and fmt != "graphdef":
        raise InputError(f"-o writes a placed GraphDef, but the input is {fmt}", path=path)
    timings["load"] = time.perf_counter() - t0

    step("profile")
    t0 = time.perf_counter()
    from baechi_cli.costs.analytic import estimate_costs

    graph, cost_report = estimate_costs(graph, devices)
    timings["profile"] = time.perf_counter() - t0

    step("passes")
    t0 = time.perf_counter()
    from baechi_cli.passes.colocation import colocate

    passes: list[PassRecord] = []
    try:
        graph, record = run_pass("colocation", colocate, graph)
    except InputError as err:
        raise err.with_path(path) from None
    passes.append(record)
    timings["passes"] = time.perf_counter() - t0

    step("place")
    t0 = time.perf_counter()
    try:
        placement = get_placer(options.algo)(graph, devices, {})
    except InfeasibleError as err:
        raise err.with_path(path) from None
    timings["place"] = time.perf_counter() - t0

    step("simulate")
    t0 = time.perf_counter()
    sim = simulate(graph, devices, placement.device_of, sequence=placement.sequence)
    if placement.predicted is not None and not same_timeline(placement.predicted, sim):
        raise RuntimeError(f"{options.algo} predicted a timeline the simulator does not reproduce")
    if not sim.feasible:
        d = sim.over_memory()[0]
        raise InfeasibleError(
            f"{ALGORITHM_TITLES[options.algo]} placement needs {sim.peak_bytes[d]} bytes at peak on "
            f"{devices.devices[d].name}, which has {devices.devices[d].memory_bytes}",
            path=path,
        )
    bound = lower_bound(graph, devices)
    single = _single_device(graph, devices, sim if options.algo == "single" else None)
    timings["simulate"] = time.perf_counter() - t0

    outcome = PlaceOutcome(
        path=path,
        input_format=fmt,
        graph=graph,
        devices=devices,
        algorithm=options.algo,
        placement=placement,
        sim=sim,
        lower_bound_us=bound,
        single_device=single,
        passes=passes,
        timings=timings,
        cost_report=cost_report,
        notes=placement_notes(graph, devices, options.algo, sim, single),
        sha256=sha256,
    )

    step("write")
    t0 = time.perf_counter()
    if output is not None:
        from baechi_cli.io.graphdef import write_placed_graphdef

        names = devices.names
        write_placed_graphdef(
            path, {graph.names[v]: names[d] for v, d in enumerate(placement.device_of)}, output
        )
    timings["write"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start
    if report_path is not None:
        from baechi_cli.io.report import write_report

        write_report(report_path, build_report(outcome, options))
    return outcome


def _single_device(graph: OpGraph, devices: DeviceSpec, known: SimResult | None) -> SimResult | None:
    """Everything on the largest device, when it fits there."""
    if known is None:
        d = largest_device(devices)
        known = simulate(graph, devices, [d] * graph.num_ops)
    return known if known.feasible else None


def placement_notes(
    graph: OpGraph, devices: DeviceSpec, algo: str, sim: SimResult, single: SimResult | None
) -> list[str]:
    """Explain what users would read as a bug: a split slower than one device, an idle device."""
    notes = []
    if single is not None and algo != "single" and single.step_time_us < sim.step_time_us:
        notes.append(
            f"the model fits one device, where it runs in {_ms(single.step_time_us)}: "
            f"{sim.step_time_us / single.step_time_us:.2f}x faster than this split "
            "(--algo single places it there)"
        )
    idle = [devices.devices[d].name for d in range(devices.count) if not sim.order[d]]
    if not idle:
        return notes
    which = ", ".join(idle)
    verb = "runs" if len(idle) == 1 else "run"
    if algo == "single":
        why = "--algo single puts every op on one device"
        if single is not None:
            why += f" ({_ms(single.step_time_us)} step)"
        return [*notes, f"{which} {verb} no ops: {why}."]
    groups = graph.group_members()
    total = sum(graph.compute_us) or 1.0
    share = max(sum(graph.compute_us[v] for v in ops) for ops in groups.values()) / total
    if len(groups) < devices.count:
        why = f"the graph has only {len(groups)} colocation groups, and each group must stay on one device"
    elif share > 1 / devices.count:
        why = (
            f"one colocation group holds {share:.0%} of the compute and cannot be split, "
            "so the rest fits on fewer devices"
        )
    else:
        why = (
            f"{ALGORITHM_TITLES.get(algo, algo)} fills devices in topological order up to an equal "
            "share of compute, and the earlier devices took all of it"
        )
    return [*notes, f"{which} {verb} no ops: {why}."]


def _ms(us: float) -> str:
    return f"{us / 1000:.3f} ms"


def _check_writable(path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise InputError("output directory does not exist", path=path)
    if os.path.isdir(path):
        raise InputError("output path is a directory", path=path)
    if not os.access(directory, os.W_OK):
        raise InputError("output directory is not writable", path=path)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_report(outcome: PlaceOutcome, options: PlaceOptions) -> dict[str, Any]:
    """The ``baechi.report/v1`` document (see the README for every key)."""
    g, spec, sim = outcome.graph, outcome.devices, outcome.sim
    ic = spec.interconnect
    step = sim.step_time_us
    ops_per_device = [len(seq) for seq in sim.order]
    return {
        "schema": REPORT_SCHEMA,
        "tool": {"name": "baechi", "version": __version__},
        "input": {
            "path": outcome.path,
            "sha256": outcome.sha256,
            "format": outcome.input_format,
            "ops": g.num_ops,
            "edges": g.num_edges,
        },
        "devices": [
            {
                "name": d.name,
                "memory_bytes": d.memory_bytes,
                "flops": d.flops,
                "memory_bandwidth_bytes_per_s": d.memory_bandwidth,
                "launch_overhead_us": d.launch_overhead_us,
            }
            for d in spec.devices
        ],
        "comm": {
            "mode": ic.mode,
            "latency_us": ic.latency_us,
            "bandwidth_bytes_per_us": ic.bandwidth_bytes_per_us,
            "links": [
                {
                    "a": spec.devices[a].name,
                    "b": spec.devices[b].name,
                    "latency_us": lat,
                    "bandwidth_bytes_per_us": bw,
                }
                for (a, b), (lat, bw) in sorted(ic.links.items())
            ],
        },
        "algorithm": outcome.algorithm,
        "options": {"algo": options.algo, "batch_size": options.batch_size, "comm": ic.mode},
        "timings_s": {k: round(outcome.timings.get(k, 0.0), 6) for k in (*STAGES, "total")},
        "passes": [
            {
                "name": p.name,
                "ops_before": p.ops_before,
                "ops_after": p.ops_after,
                "edges_before": p.edges_before,
                "edges_after": p.edges_after,
                "seconds": round(p.seconds, 6),
                **p.details,
            }
            for p in outcome.passes
        ],
        "costs": outcome.cost_report.to_json() if hasattr(outcome.cost_report, "to_json") else {},
        "result": {
            "step_time_us": step,
            "lower_bound_us": outcome.lower_bound_us,
            "single_device_us": outcome.single_device.step_time_us if outcome.single_device else None,
            "comm_bytes": sim.comm_bytes,
            "transfers": len(sim.transfers),
            "feasible": sim.feasible,
        },
        "per_device": [
            {
                "name": spec.devices[d].name,
                "ops": ops_per_device[d],
                "compute_us": sim.compute_us[d],
                "peak_bytes": sim.peak_bytes[d],
                "persistent_bytes": sim.persistent_bytes[d],
                "memory_bytes": spec.devices[d].memory_bytes,
                "utilization": sim.compute_us[d] / step if step > 0 else 0.0,
            }
            for d in range(spec.count)
        ],
        "candidates": [
            {
                "algorithm": outcome.algorithm,
                "step_time_us": step,
                "place_seconds": round(outcome.timings.get("place", 0.0), 6),
                "feasible": sim.feasible,
                "error": None,
            }
        ],
        "notes": outcome.notes,
        "placement": {g.names[v]: spec.devices[d].name for v, d in enumerate(sim.device_of)},
    }
