"""``baechi profile``: cost every op of a model and build its ``baechi.profile/v1`` message.

Analytic costs first (a workload JSON's given costs instead); with
``measure``, the GraphDef runs in TensorFlow (:mod:`baechi_cli.costs.measured`), a ``.pt2``
in torch (:mod:`baechi_cli.costs.measured_torch`; with ``training``, its traced training
step), and measured costs replace analytic ones for every op that ran. Like the
placement pipeline it never prints: ``progress(stage)`` is called as each
stage starts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from baechi_cli import __version__
from baechi_cli.app.place import with_views
from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.errors import InputError
from baechi_cli.core.graph import OpGraph
from baechi_cli.evaluator.evaluate import evaluate
from baechi_cli.evaluator.placement import Placement
from baechi_cli.io.formats import FORMATS, check_writable, format_of, load_model, op_set_of, sha256_of
from baechi_cli.passes.manager import constraint_passes

PROFILE_STAGES = ("load", "profile", "measure", "simulate", "write")


@dataclass
class ProfileOutcome:
    """A model costed (analytic, measured or given) and its ``baechi.profile/v1`` message."""

    path: str
    input_format: str
    graph: OpGraph  # with the profile's costs
    profile: Any  # CostProfile
    cost_report: Any  # the analytic CostReport; None for workload JSON
    timings: dict[str, float]
    notes: list[str] = field(default_factory=list)  # the reader's


def analytic_device(devices: DeviceSpec) -> str:
    """How the analytic model describes the device it timed ops for."""
    d = devices.devices[0]
    return (
        f"{d.name} (analytic: {d.flops / 1e12:.4g} TFLOP/s, {d.memory_bandwidth / 1e9:.4g} GB/s, "
        f"{d.launch_overhead_us:g} us launch)"
    )


def profile_model(
    path: str,
    devices: DeviceSpec,
    *,
    batch_size: int | None = None,
    dims: dict[str, int] | None = None,
    measure: bool = False,
    training: str | None = None,
    threads: int | None = None,
    warmup: int = 2,
    steps: int = 10,
    init_op: str | None = None,
    output: str | None = None,
    progress: Callable[[str], None] | None = None,
    measure_progress: Callable[[int, int], None] | None = None,
) -> ProfileOutcome:
    """Cost every op of ``path`` and build its profile; write it to ``output`` if given.

    Analytic costs first (a workload JSON's given costs instead); with
    ``measure``, the GraphDef runs in TensorFlow (see
    :mod:`baechi_cli.costs.measured`), a ``.pt2`` in torch on ``threads`` CPU
    threads (:mod:`baechi_cli.costs.measured_torch`), and measured costs
    replace analytic ones for every op that ran. ``training`` (an optimizer)
    profiles a ``.pt2``'s traced training step, the graph ``baechi place
    --training`` places. The totals' peak activation memory and step time come
    from simulating all ops on one device of unbounded memory.
    """
    from baechi_cli.costs.analytic import estimate_costs
    from baechi_cli.costs.profile import (
        ANALYTIC,
        GIVEN,
        MEASURED,
        build_profile,
        merge_measurements,
        rule_kinds,
        write_profile,
    )

    step = progress or (lambda stage: None)
    if output is not None:
        check_writable(output)
    timings: dict[str, float] = {}
    t_start = time.perf_counter()
    step("load")
    if not os.path.exists(path):
        raise InputError("no such file", path=path)
    fmt = format_of(path).name
    if training is not None and not FORMATS[fmt].traces_training:
        raise InputError(f"--training profiles a .pt2's traced training step; this input is {fmt}", path=path)
    if measure and not (FORMATS[fmt].runs_in_tensorflow or FORMATS[fmt].traces_training):
        raise InputError(
            f"--measure runs TensorFlow GraphDefs and PyTorch programs (.pt2); this input is {fmt}", path=path
        )
    if threads is not None and not FORMATS[fmt].traces_training:
        raise InputError("--threads sets torch's threads for a .pt2; TensorFlow picks its own", path=path)
    graph, fmt, notes = load_model(path, batch_size, dims, training=training)
    graph = with_views(graph, fmt)
    sha256 = sha256_of(path)
    timings["load"] = time.perf_counter() - t_start

    step("profile")
    t0 = time.perf_counter()
    n = graph.num_ops
    report = None
    device_of = None
    if FORMATS[fmt].op_set is None:
        source_of, rule_of, flops = [MEASURED] * n, [GIVEN] * n, [0.0] * n
        device = f"the device the workload was profiled on (costs given in {os.path.basename(path)})"
    else:
        graph, report = estimate_costs(graph, devices, op_set=op_set_of(fmt))
        source_of, rule_of, flops = [ANALYTIC] * n, rule_kinds(graph, report, op_set_of(fmt)), report.flops
        device = analytic_device(devices)
    timings["profile"] = time.perf_counter() - t0

    run = None
    if measure and FORMATS[fmt].traces_training:
        from baechi_cli.costs.measured_torch import measure_program
        from baechi_cli.io.pt2 import load_program

        step("measure")
        t0 = time.perf_counter()
        try:
            run = measure_program(
                load_program(path),
                training=training,
                batch_size=batch_size,
                dims=dims,
                threads=threads,
                warmup=warmup,
                steps=steps,
                progress=measure_progress,
            )
        except InputError as err:
            raise err.with_path(path) from None
    elif measure:
        from baechi_cli.costs.measured import measure_graphdef

        step("measure")
        t0 = time.perf_counter()
        run = measure_graphdef(
            path,
            batch_size=batch_size,
            init_op=init_op,
            warmup=warmup,
            steps=steps,
            progress=measure_progress,
        )
    if run is not None:
        graph, source_of, device_of = merge_measurements(graph, run)
        device = run.device
        timings["measure"] = time.perf_counter() - t0

    step("simulate")
    t0 = time.perf_counter()
    constrained, _ = constraint_passes(graph, fmt, path)
    unbounded = replace(devices.devices[0], memory_bytes=2**62)
    single = evaluate(
        constrained, DeviceSpec((unbounded,), devices.interconnect), Placement([0] * n)
    ).timeline
    timings["simulate"] = time.perf_counter() - t0

    profile = build_profile(
        graph,
        source_of=source_of,
        rule_of=rule_of,
        flops=flops,
        device=device,
        device_of=device_of,
        model={"path": path, "sha256": sha256, "format": fmt, "batch_size": batch_size, "training": training},
        single=single,
        run=run,
        generator=f"baechi {__version__}",
    )
    step("write")
    t0 = time.perf_counter()
    if output is not None:
        write_profile(profile, output)
    timings["write"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start
    return ProfileOutcome(path, fmt, graph, profile, report, timings, notes)
