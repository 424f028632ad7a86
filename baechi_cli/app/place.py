"""The placement pipeline: load -> cost -> passes -> place -> expand -> evaluate -> write.

Every stage is a function of OpGraph (plus options) to OpGraph or to a
Placement; this module strings them together and times them. Every
candidate placement, whichever placer made it, is expanded onto the ops and
judged by :func:`baechi_cli.evaluator.evaluate.evaluate`; ``--algo auto`` keeps the
best judged one. It never prints: ``progress(stage)`` is called as each
stage starts so the CLI can draw a progress bar. The report and the compare
document are assembled in :mod:`baechi_cli.app.report`, the notes in
:mod:`baechi_cli.app.notes`.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from baechi_cli import placers
from baechi_cli.app.notes import pipeline_notes, placement_notes, race_note, uncovered_note
from baechi_cli.app.outcome import PlaceOutcome
from baechi_cli.core import objectives
from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.errors import InfeasibleError, InputError
from baechi_cli.core.gcpause import cyclic_gc_paused
from baechi_cli.core.graph import OpGraph
from baechi_cli.evaluator.bounds import LowerBounds, lower_bounds
from baechi_cli.evaluator.evaluate import Evaluation, evaluate
from baechi_cli.evaluator.placement import Placement
from baechi_cli.evaluator.sim import StepTimer
from baechi_cli.io.formats import (
    FORMATS,
    check_output_format,
    check_writable,
    load_model,
    op_set_of,
    sha256_of,
    write_placed_model,
)
from baechi_cli.passes.manager import (
    PassOptions,
    PassRecord,
    constraint_passes,
    optimization_passes,
    run_pass,
)
from baechi_cli.placers.single import largest_device
from baechi_cli.search.candidates import (
    PlaceOptions,
    Prepared,
    ProfileCosts,
    TrainingInfo,
    choose,
    default_pass_options,
    placement_key,
    run_candidate,
)

if TYPE_CHECKING:
    pass

STAGES = ("load", "profile", "passes", "place", "simulate", "write")


def with_views(graph: OpGraph, fmt: str) -> OpGraph:
    """``graph`` with its views marked (their outputs take no memory); a workload's sizes are given."""
    op_set = FORMATS[fmt].op_set
    if op_set is None:
        return graph
    from baechi_cli.costs.memory_rules import mark_views

    return mark_views(graph, op_set)


def check_times_finite(graph: OpGraph, devices: DeviceSpec, path: str) -> None:
    """InputError unless every step time of ``graph`` on ``devices`` is a finite float. O(V + E).

    Each cost is finite (the readers check), but a sum of them can overflow, and
    a timeline with an infinite step time has no meaning (nor a JSON report).
    """
    from baechi_cli.evaluator.sim import step_time_ceiling

    ceiling, largest = step_time_ceiling(graph, devices)
    if not math.isfinite(ceiling):
        raise InputError(
            f"compute and transfer times add up past the largest float ({sys.float_info.max:.3g} µs), "
            f"so no step time can be computed; the largest is {largest}: check the costs",
            path=path,
        )


def bounds(
    graph: OpGraph, devices: DeviceSpec, timer: StepTimer
) -> tuple[LowerBounds, Placement, Evaluation]:
    """The lower bounds, and the one-device placement (on the largest device) with its evaluation."""
    single = Placement([largest_device(devices)] * graph.num_ops)
    return lower_bounds(graph, devices), single, evaluate(graph, devices, single, timer=timer)


class _Stopwatch:
    """Each stage's seconds, summed by stage name, and the progress callback called as one starts."""

    def __init__(self, step: Callable[[str], None]) -> None:
        self.step = step
        self.timings: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str, announce: bool = True) -> Iterator[None]:
        if announce:
            self.step(name)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0


def load(path: str, options: PlaceOptions) -> tuple[OpGraph, str, list[str]]:
    """Read the model; a TensorFlow step whose sidecar states it gets its races colocated.

    Returns the graph with its views marked, the format's name and the notes so far.
    """
    training = options.optimizer if options.training else None
    graph, fmt, notes = load_model(path, options.batch_size, options.dims, options.infer_shapes, training)
    return checked_read(graph, fmt, notes, path, options), fmt, notes


def checked_read(graph: OpGraph, fmt: str, notes: list[str], path: str, options: PlaceOptions) -> OpGraph:
    """A model just read (from ``path``, or in memory under that name): its sizes checked where
    its format refuses unknown ones, a TensorFlow step's races colocated, its views marked;
    appends to ``notes``."""
    if FORMATS[fmt].refuses_unknown_sizes:
        check_sizes_known(graph, path, options.unknown_sizes, notes)
    if FORMATS[fmt].runs_in_tensorflow:
        from baechi_cli.verify.races import colocate_races, step_races

        races, sidecar = step_races(graph, path)
        if races:
            graph = colocate_races(graph, races)
            notes.append(race_note(races, sidecar))
    return with_views(graph, fmt)


def check_sizes_known(graph: OpGraph, path: str, allow: bool, notes: list[str]) -> None:
    """Refuse a graph with outputs of unknown size (InfeasibleError naming the first such op), unless
    ``allow``: then say in ``notes`` that it was placed anyway.

    An unknown dim counts as 1, so such a graph's memory is under-counted by an unknown amount, and
    whether a placement fits cannot be judged. O(V).
    """
    unknown = [(v, ports) for v, attrs in enumerate(graph.attrs) if (ports := attrs.get("_size_unknown"))]
    if not unknown:
        return
    count = sum(len(ports) for _, ports in unknown)
    if allow:
        notes.append(
            f"placed with {count} output(s) of unknown size (--allow-unknown-sizes); memory is under-counted"
        )
        return
    v, ports = unknown[0]
    raise InfeasibleError(
        f"output {ports[0]} ({graph.op_types[v]}) is the first of {count} output(s) whose size no shape "
        "inference determined, so whether a placement fits cannot be judged; pass --infer-shapes run "
        "(onnxruntime) to measure them, bind symbolic dims with --dim or --batch-size, or pass "
        "--allow-unknown-sizes to count each unknown dim as 1",
        path=path,
        op=graph.names[v],
    )


def cost(
    graph: OpGraph,
    fmt: str,
    devices: DeviceSpec,
    options: PlaceOptions,
    path: str,
    sha256: str,
    notes: list[str],
) -> tuple[OpGraph, Any]:
    """Every op's costs: from ``--profile``, else the analytic model (a workload carries its own).

    Returns the costed graph and where its costs came from (the report's ``costs``); appends to
    ``notes`` the op types no rule covers.
    """
    cost_report: Any = None
    if options.profile is not None:
        from baechi_cli.costs.profile import apply_profile, load_profile

        profile = load_profile(options.profile)
        if FORMATS[fmt].traces_training and profile.model.format == fmt:
            _check_profiled_step(profile.model.training, options)
        graph = apply_profile(graph, profile, options.profile, path)
        cost_report = ProfileCosts(
            options.profile, profile.source, profile.device, profile.model.sha256 == sha256
        )
    elif FORMATS[fmt].op_set is not None:  # else the file carries its own measured costs
        from baechi_cli.costs.analytic import estimate_costs

        if options.training and FORMATS[fmt].op_set == "onnx":  # the step runs batch norms in train()
            from baechi_cli.costs.rules_onnx import in_training_mode

            graph = in_training_mode(graph)

        graph, cost_report = estimate_costs(graph, devices, op_set=FORMATS[fmt].op_set)
        if cost_report.uncovered:
            notes.append(uncovered_note(cost_report.coverage["uncovered"]))
    if FORMATS[
        fmt
    ].split_activations:  # costed op by op above; in memory an exported GELU or SiLU is one kernel
        from baechi_cli.costs.memory_rules import one_kernel_activations

        graph = one_kernel_activations(graph)
    return graph, cost_report


def _check_profiled_step(profiled: str, options: PlaceOptions) -> None:
    """A PyTorch program's profile is of one step (the forward, or the training step of one
    optimizer): InputError naming both when ``options`` place another."""
    wanted = options.optimizer if options.training else ""

    def step(optimizer: str) -> str:
        return (
            f"the {optimizer} training step (--training --optimizer {optimizer})"
            if optimizer
            else "the forward pass"
        )

    if profiled != wanted:
        raise InputError(
            f"the profile is of {step(profiled)}, this places {step(wanted)}: profile that step",
            path=options.profile,
        )


@cyclic_gc_paused()
def prepare(path: str, devices: DeviceSpec, options: PlaceOptions, step: Callable[[str], None]) -> Prepared:
    """load -> cost -> passes, plus the bounds every placement is compared with.

    ``step(stage)`` is called as each of load, profile and passes starts.
    """
    clock = _Stopwatch(step)
    with clock.stage("load"):
        graph, fmt, notes = load(path, options)
        sha256 = sha256_of(path)
    return prepare_loaded(graph, fmt, notes, devices, options, clock, path, sha256)


def prepare_loaded(
    graph: OpGraph,
    fmt: str,
    notes: list[str],
    devices: DeviceSpec,
    options: PlaceOptions,
    clock: _Stopwatch,
    path: str,
    sha256: str,
) -> Prepared:
    """:func:`prepare` once the model is read (``graph`` of format ``fmt``, views marked), from a
    file named ``path`` or in memory (``path`` then stands for it in messages and reports)."""
    if options.comm is not None:
        devices = devices.with_comm_mode(options.comm)
    model_ops = graph.num_ops
    with clock.stage("profile"):
        graph, cost_report = cost(graph, fmt, devices, options, path, sha256, notes)
    with clock.stage("passes"):
        graph, passes = constraint_passes(graph, fmt, path)
    return _problem(graph, fmt, devices, options, clock, path, sha256, model_ops, passes, notes, cost_report)


def prepare_program(
    program: Any, devices: DeviceSpec, options: PlaceOptions, step: Callable[[str], None], name: str
) -> Prepared:
    """:func:`prepare` of a PyTorch program in memory: a ``torch.export.ExportedProgram``, or its
    JSON (:func:`baechi_cli.io.pt2.program_json`), read as the ``.pt2`` reader reads a saved one.
    ``name`` stands for the path in messages and reports; the report's sha256 is the program
    JSON's (keys sorted). Needs torch for an ``ExportedProgram`` or ``--training``."""
    import json

    from baechi_cli.io.pt2 import program_json, read_program

    clock = _Stopwatch(step)
    with clock.stage("load"):
        doc = program if isinstance(program, Mapping) else program_json(program)
        training = options.optimizer if options.training else None
        try:
            read = read_program(doc, batch_size=options.batch_size, dims=options.dims, training=training)
        except InputError as err:
            raise err.with_path(name) from None
        notes = list(read.notes)
        graph = checked_read(read.graph, "pt2", notes, name, options)
        sha256 = hashlib.sha256(json.dumps(doc, sort_keys=True).encode("utf-8")).hexdigest()
    return prepare_loaded(graph, "pt2", notes, devices, options, clock, name, sha256)


def prepare_graph(
    graph: OpGraph, devices: DeviceSpec, options: PlaceOptions, name: str = "<graph>"
) -> Prepared:
    """A costed graph built in memory as a placement problem, as :func:`prepare` makes one of a file.

    ``graph`` carries its own costs (as a workload file's); the optimization passes run as
    ``options`` say, and ``name`` stands for the path in messages and reports.

    >>> from baechi_cli.core.devices import parse_devices
    >>> from baechi_cli.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x, y = b.add_op("x", "MatMul", [100], compute_us=5.0), b.add_op("y", "Relu", compute_us=1.0)
    >>> _ = b.add_edge(x, y, 0)
    >>> problem = prepare_graph(b.build(), parse_devices("2x1GB"), PlaceOptions(algo="topo"))
    >>> problem.single_device.step_time_us, problem.graph.num_ops
    (6.0, 2)
    """
    if options.comm is not None:
        devices = devices.with_comm_mode(options.comm)
    clock = _Stopwatch(lambda stage: None)
    with clock.stage("passes"):
        graph.topo_order()  # a cycle fails here, once
    fmt = "workload"  # costs given with the graph, no constraint passes: a workload's treatment
    return _problem(graph, fmt, devices, options, clock, name, "", graph.num_ops, [], [], None)


def _problem(
    graph: OpGraph,
    fmt: str,
    devices: DeviceSpec,
    options: PlaceOptions,
    clock: _Stopwatch,
    path: str,
    sha256: str,
    model_ops: int,
    passes: list[PassRecord],
    notes: list[str],
    cost_report: Any,
) -> Prepared:
    """The rest of :func:`prepare` once the graph is costed: training, bounds, optimization passes."""
    training = None
    if options.training and FORMATS.get(fmt) is not None and FORMATS[fmt].traces_training:
        training = traced_training(graph, options.optimizer)
    elif options.training:
        with clock.stage("profile", announce=False):
            graph, training, record = training_pass(graph, devices, fmt, options.optimizer, path)
            passes.append(record)
    with clock.stage("simulate", announce=False):
        check_times_finite(graph, devices, path)
        timer = StepTimer(graph, devices)
        bound, single_placement, single_evaluation = bounds(graph, devices, timer)
        single = single_evaluation.timeline if single_evaluation.feasible else None
    with clock.stage("passes", announce=False):
        peak = max(single.peak_bytes) if single is not None else None
        pass_options, forward_only_reason = default_pass_options(graph, devices, options, peak)
        variant = optimization_passes(graph, devices, pass_options, {"forward_only": forward_only_reason})
        passes += variant.records
    return Prepared(
        path=path,
        input_format=fmt,
        sha256=sha256,
        graph=graph,
        devices=devices,
        passes=passes,
        timings=clock.timings,
        cost_report=cost_report,
        bounds=bound,
        single_device=single,
        variant=variant,
        model_ops=model_ops,
        training=training,
        notes=notes,
        judged={placement_key(single_placement): single_evaluation},
        forward_only_reason=forward_only_reason,
        timer=timer,
    )


def traced_training(graph: OpGraph, optimizer: str) -> TrainingInfo:
    """The report's ``training`` of a step its framework traced (``attrs["_phase"]`` per op)."""
    phases = Counter(a.get("_phase") for a in graph.attrs)
    state = sum(
        graph.persistent_bytes[v] for v in range(graph.num_ops) if graph.attrs[v].get("_phase") == "update"
    )
    return TrainingInfo(
        optimizer,
        backward_ops=phases["backward"],
        loss_ops=phases["loss"],
        update_ops=phases["update"],
        optimizer_state_bytes=state,
        traced=True,
    )


def training_pass(
    graph: OpGraph, devices: DeviceSpec, fmt: str, optimizer: str, path: str
) -> tuple[OpGraph, TrainingInfo, PassRecord]:
    """``--training``: synthesize the backward pass and optimizer (:mod:`baechi_cli.passes.training`)."""
    from baechi_cli.costs.registry import rule_for
    from baechi_cli.passes.training import LOSS_OP, STEP_OP, UPDATE_OP, synthesize_training

    op_set = op_set_of(fmt)
    kinds = [rule_for(t, op_set).kind for t in graph.op_types]
    try:
        out, record = run_pass("training", lambda g: synthesize_training(g, devices, kinds, optimizer), graph)
    except InputError as err:
        raise err.with_path(path) from None
    n = graph.num_ops
    synthesized = Counter(out.op_types[n:])
    update_ops, steps, losses = (synthesized[t] for t in (UPDATE_OP[optimizer], STEP_OP, LOSS_OP))
    info = TrainingInfo(
        optimizer,
        backward_ops=out.num_ops - n - update_ops - steps - losses,
        loss_ops=losses,
        update_ops=update_ops,
        optimizer_state_bytes=sum(out.persistent_bytes[n:]),
    )
    record.details["optimizer"] = optimizer
    return out, info, record


@cyclic_gc_paused()
def place_model(
    path: str,
    devices: DeviceSpec,
    options: PlaceOptions,
    *,
    output: str | None = None,
    report_path: str | None = None,
    trace_path: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> PlaceOutcome:
    """Run the whole pipeline on ``path``; write the outputs that were asked for."""
    step = progress or (lambda stage: None)
    options = checked_options(options)
    for target in (output, report_path, trace_path):
        if target is not None:
            check_writable(target)
    t_start = time.perf_counter()
    if output is not None:
        check_output_format(path, output)
    outcome = place_prepared(prepare(path, devices, options, step), options, step)
    timings = outcome.timings

    step("write")
    t0 = time.perf_counter()
    if output is not None:
        outcome.notes += write_placed_model(
            path,
            outcome.prepared.input_format,
            outcome.prepared.graph,
            outcome.prepared.model_ops,
            outcome.sim.device_of,
            outcome.prepared.devices.names,
            output,
        )
    if trace_path is not None:
        from baechi_cli.io.trace import build_trace, write_trace

        write_trace(
            trace_path,
            build_trace(
                outcome.prepared.graph, outcome.prepared.devices, outcome.sim, title=outcome.chosen.algorithm
            ),
        )
    timings["write"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start
    if report_path is not None:
        from baechi_cli.app.report import build_report, write_report

        write_report(report_path, build_report(outcome, options))
    return outcome


def checked_options(options: PlaceOptions) -> PlaceOptions:
    """``options`` with ``algo`` set to the objective's own placer where it has one; InputError for
    a combination that cannot be placed (microbatches without a pipelined objective, another
    ``--algo`` for a pipelined one)."""
    objective = objectives.get(options.objective)
    if not objective.microbatches and options.microbatches is not None:
        takes = " or ".join(o.name for o in objectives.REGISTRY.values() if o.microbatches)
        raise InputError(
            f"--microbatches needs --objective {takes} (microbatches stream through pipeline stages)"
        )
    if objective.placer is not None:
        if options.algo not in ("auto", objective.placer):
            raise InputError(
                f"--objective {objective.name} places with the {objective.placer} splitter, "
                f"not --algo {options.algo} (leave --algo out)"
            )
        options = replace(options, algo=objective.placer)
    return options


def place_prepared(prepared: Prepared, options: PlaceOptions, step: Callable[[str], None]) -> PlaceOutcome:
    """Place a prepared problem (:func:`prepare`) with ``options`` (:func:`checked_options`):
    the candidates, the chosen one and the notes; nothing written."""
    spec = None if options.algo == "auto" else placers.get(options.algo)
    timings = dict.fromkeys(STAGES, 0.0) | prepared.timings

    step("place")
    t0 = time.perf_counter()
    search = None
    if spec is None:
        from baechi_cli.search.auto import auto_search

        search = auto_search(prepared, options)
        candidates = search.candidates
    elif spec.name == "pipeline":
        # Stages follow the op graph itself: no co-placement or fusion to coarsen its units.
        variant = prepared.variant_for(PassOptions(False, None, False))
        candidates = [run_candidate(prepared, spec, options, variant)]
    else:
        candidates = [run_candidate(prepared, spec, options)]
    # The stage's wall time: auto's refinement and exact stages take time even when they add
    # no candidate.
    timings["place"] = time.perf_counter() - t0
    chosen = choose(candidates)

    notes = [
        *prepared.notes,
        *placement_notes(
            prepared.graph,
            prepared.devices,
            chosen.algorithm if chosen.stage == "place" else chosen.stage,
            chosen.sim,
            prepared.single_device,
            candidates,
        ),
    ]
    if chosen.placement is not None and "pipeline" in chosen.placement.info:
        notes += pipeline_notes(chosen.placement.info["pipeline"])
    if isinstance(prepared.cost_report, ProfileCosts) and not prepared.cost_report.same_model:
        notes.append(
            f"the profile {prepared.cost_report.path} was taken from a file with another sha256; "
            "its ops match this model's by name, so its costs were used"
        )
    return PlaceOutcome(prepared, chosen, candidates, timings, notes, search)
