"""--objective throughput on the memory harness's real models: pipeline speedup over one device.

For each model of bench/framework.py (torchvision-style and Hugging Face
models, exported to ONNX as README.md says, cached under ``--cache``), the
training step (``--training``, SGD) is split into pipeline stages with
``baechi place MODEL --training --objective throughput --microbatches M
--schedule S --devices SPEC``, as the library: ``place_model`` with those
options. Recorded: the stages chosen (the best stage count for the
schedule), the minibatch time and its speedup over one device running the
whole minibatch (``speedup_vs_one_device``), the largest bubble fraction
of a device, whether every device's peak (weights plus the activations in
flight) fits memory, and the steady-state bound: one device's time over
the split's max-load, what an endless stream without flushes would reach in
Tarnawski et al.'s model (which charges a device for the transfers it sends
and receives; the schedule simulator overlaps them with compute, so the
scheduled speedup can exceed it).
Without ``--schedule`` baechi takes the fastest of 1F1B, interleaved and
zbv (the ``default`` row of each model). "torch trains it": whether torch's
pipelining runtime (2.13) can train the plan as the model is written, found
by building the stages with torch's ``pipeline()`` from the split points: it
refuses a value that a stage sends past the next one (under interleaved
and zbv any such value; under 1F1B and GPipe one that needs a gradient).

With a flushing schedule (GPipe, 1F1B) and equal stages, ``S`` stages and
``M`` microbatches take ``(M + S - 1)`` stage-times for ``M`` microbatches,
so the speedup over one device is at most ``S M / (M + S - 1)``: 2.91x for
4 stages and 8 microbatches, before any transfer or imbalance. The
interleaved schedule (torch's ``ScheduleInterleaved1F1B``, two stages per
device) shrinks the bubble by the stages per device: at most ``D M v / (M v
+ D - 1)``, 3.37x for 4 devices, 2 stages each and 8 microbatches. zbv
(torch's ``ScheduleZBVZeroBubble``, two stages per device in a V) runs each
backward as its input gradient and, later, its weight gradient, which fills
the bubbles; the first and last stages share a device.

Usage: python bench/pipeline_models.py [--devices SPEC] [--microbatches M] [--models a,b] > bench/pipeline_models.md
(needs torch and transformers to export: pip install -e '.[bench]'; exports are cached).
"""

from __future__ import annotations

import argparse
import os
import time

import framework
from benchlib import BENCH, scrub

from baechi_cli.app.place import place_model
from baechi_cli.core.devices import parse_devices
from baechi_cli.core.errors import BaechiError
from baechi_cli.search.candidates import PlaceOptions


def export(name: str, cache: str) -> str:
    """The model's ONNX export in ``cache`` (made with bench/framework.py's build and export)."""
    path = os.path.join(cache, f"{name}.onnx")
    if not os.path.exists(path):
        model, x = framework.build(framework.CASE_BY_NAME[name], quick=False)
        os.makedirs(cache, exist_ok=True)
        framework.export_onnx(model, x, path)
    return path


def torch_verdict(name: str, points: dict[str, str] | None, schedule: str, microbatches: int) -> str:
    """Whether torch 2.13's pipelining runtime can train the plan as exported: torch's ``pipeline()``
    builds the stages from the split points, and they run in turn on one microbatch to see which
    values a stage sends past the next one. The multi-stage schedules (interleaved, zbv) refuse any
    such value; 1F1B and GPipe only one that needs a gradient."""
    import copy

    import torch
    from torch.distributed.pipelining import SplitPoint, pipeline

    if points is None:
        return "no split points"
    key = (name, tuple(points), microbatches)
    if key not in _SKIPS:
        model, x = framework.build(framework.CASE_BY_NAME[name], quick=False)
        x = x[: max(1, x.shape[0] // microbatches)]
        pipe = pipeline(
            copy.deepcopy(model), mb_args=(x,), split_spec=dict.fromkeys(points, SplitPoint.BEGINNING)
        )
        value: dict = {}
        stage_of: dict = {}
        skips = []  # (from stage, to stage, needs a gradient)
        for node in pipe.split_gm.graph.nodes:
            args = torch.fx.node.map_arg(node.args, value.__getitem__)
            if node.op == "placeholder":
                value[node], stage_of[node] = x, 0
            elif node.op == "call_function":  # getitem of a stage's outputs
                value[node], stage_of[node] = node.target(*args), stage_of[node.all_input_nodes[0]]
            elif node.op == "call_module":
                k = int(node.target.rsplit("_", 1)[1])
                for a in node.all_input_nodes:
                    if k > stage_of[a] + 1:
                        skips.append((stage_of[a], k, bool(getattr(value[a], "requires_grad", False))))
                value[node], stage_of[node] = pipe.get_stage_module(k)(*args), k
        _SKIPS[key] = skips
    skips = _SKIPS[key]
    blocking = skips if schedule in ("interleaved", "zbv") else [s for s in skips if s[2]]
    if not blocking:
        return "yes"
    first = blocking[0]
    return f"no: a value of stage {first[0]} read by stage {max(s[1] for s in blocking if s[0] == first[0])}"


_SKIPS: dict = {}


def row(name: str, path: str, devices: str, microbatches: int, schedule: str) -> str:
    spec = parse_devices(devices)
    options = PlaceOptions(
        algo="auto",
        training=True,
        optimizer="sgd",
        objective="throughput",
        microbatches=microbatches,
        schedule=schedule,
    )
    t0 = time.perf_counter()
    try:
        outcome = place_model(path, spec, options)
    except BaechiError as err:
        return f"| {name} | {schedule} | {scrub(str(err)).splitlines()[0][:120]} |  |  |  |  |  |  |  |"
    seconds = time.perf_counter() - t0
    pipeline = outcome.placement.info["pipeline"]
    plan = pipeline["schedule"]
    one_device_us = plan["speedup_vs_one_device"] * plan["minibatch_us"]
    steady = one_device_us / pipeline["max_load_us"] if pipeline["max_load_us"] > 0 else float("inf")
    stages = len(pipeline["stages"])
    label = f"default: {plan['name']}" if schedule == "auto" else schedule
    runs = torch_verdict(name, pipeline.get("split_points"), plan["name"], microbatches)
    return (
        f"| {name} | {label} | {stages} on {plan['devices'] or stages} | {one_device_us / 1000:.2f} | "
        f"{plan['minibatch_us'] / 1000:.2f} | **{plan['speedup_vs_one_device']:.2f}x** | "
        f"{max(plan['bubble_fraction']):.0%} | {'yes' if plan['within_memory'] else 'no'} | "
        f"{steady:.2f}x | {runs} | {seconds:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", default="v100x4", help="a --devices spec (default v100x4: NVLink)")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--models", help=f"comma-separated, of: {', '.join(framework.CASE_BY_NAME)}")
    parser.add_argument("--cache", default=os.path.join(BENCH, "cache"))
    args = parser.parse_args()
    names = args.models.split(",") if args.models else list(framework.CASE_BY_NAME)
    print(f"# Pipeline parallelism on real models ({args.devices}, {args.microbatches} microbatches)\n")
    print(__doc__.split("Usage:")[0].strip(), "\n")
    print(
        "| model | schedule | stages on devices | one device (ms) | minibatch (ms) | speedup | "
        "largest bubble | within memory | steady-state bound | torch trains it | place s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        path = export(name, args.cache)
        for schedule in ("auto", "1f1b", "gpipe", "interleaved", "zbv"):
            print(row(name, path, args.devices, args.microbatches, schedule), flush=True)


if __name__ == "__main__":
    main()
