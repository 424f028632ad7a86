"""The JSON documents CI jobs parse: the report (``baechi.report/v1``) and ``baechi.compare/v1``.

Keys are documented in docs/report.md. They are only ever
added, never renamed. Same input and options give the same document apart
from ``timings_s`` and ``candidates[].place_seconds``. This module assembles
them from what the pipeline returns and writes them; it imports the
pipeline's types only for type checking.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from baechi_cli import __version__
from baechi_cli.core.devices import DeviceSpec
from baechi_cli.io.files import write_atomic

if TYPE_CHECKING:
    from baechi_cli.app.outcome import PlaceOutcome
    from baechi_cli.core.graph import OpGraph
    from baechi_cli.evaluator.sim import SimResult
    from baechi_cli.search.candidates import Candidate, PlaceOptions, Prepared

REPORT_SCHEMA = "baechi.report/v1"


def dumps(report: dict[str, Any]) -> str:
    """Stable text form: insertion-ordered keys, two-space indent, trailing newline."""
    return json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def write_report(path: str, report: dict[str, Any]) -> None:
    """The report, and beside a pipeline plan's its schedule as torch's CSV (``<stem>.schedule.csv``:
    ``_PipelineScheduleRuntime._load_csv`` reads it)."""
    write_atomic(path, dumps(report).encode("utf-8"))
    csv = ((report.get("pipeline") or {}).get("formats") or {}).get("schedule_csv")
    if csv is not None:
        write_atomic(schedule_csv_path(path), csv.encode("utf-8"))


def schedule_csv_path(report_path: str) -> str:
    """Where :func:`write_report` writes a plan's schedule CSV: ``r.json`` -> ``r.schedule.csv``."""
    import os

    return os.path.splitext(report_path)[0] + ".schedule.csv"


def input_json(prepared: Prepared) -> dict[str, Any]:
    g = prepared.graph
    return {
        "path": prepared.path,
        "sha256": prepared.sha256,
        "format": prepared.input_format,
        "ops": g.num_ops,
        "edges": g.num_edges,
    }


def devices_json(spec: DeviceSpec) -> list[dict[str, Any]]:
    return [
        {
            "name": d.name,
            "memory_bytes": d.memory_bytes,
            "flops": d.flops,
            "memory_bandwidth_bytes_per_s": d.memory_bandwidth,
            "launch_overhead_us": d.launch_overhead_us,
        }
        for d in spec.devices
    ]


def comm_json(spec: DeviceSpec) -> dict[str, Any]:
    ic = spec.interconnect
    return {
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
    }


def result_json(prepared: Prepared, sim: SimResult) -> dict[str, Any]:
    """The ``result`` fields (docs/report.md) for one simulated placement."""
    return {
        "step_time_us": sim.step_time_us,
        "lower_bound_us": prepared.lower_bound_us,
        "single_device_us": prepared.single_device.step_time_us if prepared.single_device else None,
        "comm_bytes": sim.comm_bytes,
        "transfers": len(sim.transfers),
        "feasible": sim.feasible,
    }


def candidate_json(c: Candidate, prepared: Prepared) -> dict[str, Any]:
    step = c.sim.step_time_us if c.sim else None
    out: dict[str, Any] = {
        "algorithm": c.algorithm,
        "label": c.label,
        "stage": c.stage,
        "options": None if c.variant is None else c.variant.to_json(),
        "step_time_us": step,
        "gap": None if step is None else prepared.bounds.gap(step),
        "place_seconds": round(c.place_seconds, 6),
        "feasible": c.ok,
        "error": c.problem,
    }
    if c.placement is not None and c.placement.info:
        out["info"] = c.placement.info
    return out


def build_report(outcome: PlaceOutcome, options: PlaceOptions) -> dict[str, Any]:
    """The ``baechi.report/v1`` document (docs/report.md has every key)."""
    prepared, sim = outcome.prepared, outcome.sim
    g, spec = prepared.graph, prepared.devices
    step = sim.step_time_us
    cost = prepared.cost_report
    n = prepared.model_ops
    device_name = [spec.devices[d].name for d in sim.device_of]
    report: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "tool": {"name": "baechi", "version": __version__},
        "input": input_json(prepared),
        "devices": devices_json(spec),
        "comm": comm_json(spec),
        "algorithm": outcome.algorithm,
        "options": {**options.to_json(), "comm": spec.interconnect.mode},
        "timings_s": {k: round(seconds, 6) for k, seconds in outcome.timings.items()},
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
            for p in prepared.passes
        ],
        "costs": cost.to_json() if cost is not None else {"source": prepared.input_format},
        "result": result_json(prepared, sim),
        "per_device": [
            {
                "name": spec.devices[d].name,
                "ops": len(sim.order[d]),
                "compute_us": sim.compute_us[d],
                "peak_bytes": sim.peak_bytes[d],
                "persistent_bytes": sim.persistent_bytes[d],
                "memory_bytes": spec.devices[d].memory_bytes,
                "utilization": sim.compute_us[d] / step if step > 0 else 0.0,
            }
            for d in range(spec.count)
        ],
        "bounds": prepared.bounds.to_json(),
        "search": None if outcome.search is None else outcome.search.to_json(),
        "candidates": [
            {**candidate_json(c, prepared), "chosen": c is outcome.chosen} for c in outcome.candidates
        ],
        "notes": outcome.notes,
        "placement": {g.names[v]: device_name[v] for v in range(n)},
    }
    if prepared.training is not None:
        report["training"] = {
            **prepared.training.to_json(),
            "placement": {g.names[v]: device_name[v] for v in range(n, g.num_ops)},
        }
    chosen = outcome.chosen.placement
    pipeline = None if chosen is None else chosen.info.get("pipeline")
    if pipeline is not None:
        report["pipeline"] = {k: v for k, v in pipeline.items() if k not in ("split_points", "stage_of")}
        graph_stages = program_stages(g, pipeline.get("stage_of"))
        if graph_stages is not None:
            report["pipeline"]["graph_stages"] = graph_stages
            report["pipeline"]["graph_split"] = split_nodes(g, pipeline["stage_of"], graph_stages)
            untraced = [name for attrs in g.attrs for name in attrs.get("_untraced", ())]
            report["pipeline"]["graph_untraced"] = untraced
        formats = plan_formats(g, n, pipeline, graph_stages)
        if formats:
            report["pipeline"]["formats"] = formats
    if pipeline is None:  # a makespan plan of a PyTorch program: each node's device, for the runtime
        graph_devices = program_stages(g, list(sim.device_of))
        if graph_devices is not None:
            report["graph_devices"] = graph_devices
            report["graph_split"] = split_nodes(g, list(sim.device_of), graph_devices)
            report["graph_untraced"] = [name for attrs in g.attrs for name in attrs.get("_untraced", ())]
    modules = outcome.module_map
    if modules is not None:
        from baechi_cli.io.torch_modules import torch_device

        report["module_map"] = {
            **modules.to_json(),
            "torch_devices": {d.name: torch_device(d.name) for d in spec.devices},
        }
        if pipeline is not None and pipeline.get("split_points") is not None:
            report["module_map"]["pipeline"] = {"split_points": pipeline["split_points"]}
    return report


def program_stages(graph: OpGraph, stage_of: list[int] | None) -> dict[str, int] | None:
    """``{program node: pipeline stage}`` for a PyTorch program's forward nodes (ops with a
    ``_source``), which :mod:`baechi_cli.runtime` cuts; None for other graphs. A node traced into
    several ops (``linear`` into ``t`` and ``addmm``) takes the stage of its last. O(ops)."""
    if stage_of is None or len(stage_of) < graph.num_ops:
        return None
    stages: dict[str, int] = {}
    for v, attrs in enumerate(graph.attrs):
        source = attrs.get("_source")
        if source is not None and not graph.is_backward[v]:
            stages[source] = stage_of[v]
    return stages or None


def split_nodes(graph: OpGraph, stage_of: list[int], stages: dict[str, int]) -> list[str]:
    """The program nodes (of :func:`program_stages`' ``stages``) some of whose traced ops the plan
    puts in another stage (or on another device) than the node: a forward op of the node, or a
    backward or update op of one (``forward_op``). The runtime runs a node whole and autograd
    runs its backward where its forward ran, so those ops would not run where they were planned.
    Sorted; empty for a plan that runs as placed. O(ops)."""
    split: set[str] = set()
    for v in range(graph.num_ops):
        forward = graph.forward_op[v] if graph.is_backward[v] else v
        source = graph.attrs[forward].get("_source") if forward >= 0 else None
        if source in stages and stage_of[v] != stages[source]:
            split.add(source)
    return sorted(split)


def plan_formats(
    graph: OpGraph, model_ops: int, pipeline: dict[str, Any], program: dict[str, int] | None
) -> dict[str, Any]:
    """A PyTorch pipeline plan in the formats other tools read (:mod:`baechi_cli.pipeline.exports`):
    ``schedule_csv`` (torch's), and for a plan whose stages follow program order
    ``torchtitan_module_fqns`` (torchtitan's ``module_fqns_per_model_part``) and
    ``megatron_layout`` (None when the model is no stack of identical layers); ``program``: the
    plan's :func:`program_stages` (None: not a PyTorch program). Empty for a graph with no module
    paths or a plan with no schedule."""
    from baechi_cli.core.errors import InputError
    from baechi_cli.pipeline import exports

    schedule, stage_of = pipeline.get("schedule"), pipeline.get("stage_of")
    if not schedule or stage_of is None or not any("_module" in a for a in graph.attrs):
        return {}
    stages = len(pipeline["stages"])
    devices = schedule.get("devices") or stages
    out: dict[str, Any] = {
        "schedule_csv": exports.schedule_csv(schedule["name"], stages, devices, schedule["microbatches"])
    }
    onnx = [v for v in range(model_ops) if "_onnx_node" in graph.attrs[v]]
    order = sorted(onnx, key=lambda v: graph.attrs[v]["_onnx_node"]) if onnx else range(model_ops)
    ops = [v for v in order if not graph.is_backward[v]]
    # A program node traced into several ops (linear: t, addmm) is in the stage of its last.
    path_of: dict[str, str | None] = {}
    if program is not None:
        for v in ops:
            path_of.setdefault(graph.attrs[v].get("_source", graph.names[v]), graph.attrs[v].get("_module"))
        paths, stages = list(path_of.values()), [program.get(k, 0) for k in path_of]
    else:
        paths, stages = [graph.attrs[v].get("_module") for v in ops], [stage_of[v] for v in ops]
    try:
        out["torchtitan_module_fqns"] = exports.torchtitan_module_lists(paths, stages)
        out["megatron_layout"] = exports.megatron_layout(paths, stages)
    except InputError:  # stages that do not follow program order: no module lists
        out["torchtitan_module_fqns"] = out["megatron_layout"] = None
    return out
