"""pipeline: a pipeline-parallel split for throughput or latency (``--objective throughput|latency``).

Contract: ``place(graph, devices, options)`` splits the op graph into pipeline stages over the
devices by :mod:`baechi_cli.pipeline.throughput` (Tarnawski et al.'s max-load model, solved
exactly or with a stated bound), and returns the placement with the split in ``info["pipeline"]``:

* without ``options.microbatches`` the objective is theirs: the least max-load, i.e. the
  steady-state throughput of an endless stream of samples;
* with ``microbatches = M`` the graph is one minibatch of M microbatches, each costing 1/M of its
  compute and transfers but a whole launch per op (:func:`_microbatched`), run by ``options.schedule`` (:mod:`baechi_cli.pipeline.schedules`, which
  flushes the pipeline every minibatch). The best split for every stage count from 1 to the
  devices is simulated, and the fastest whose stages fit their memory (persistent bytes plus the
  activations in flight) is kept: more stages spread the work but add bubbles
  ``(S - 1) / (M + S - 1)`` and hold more activations. On a PyTorch export each stage count's
  best split is first tuned for the schedule (:func:`_tune`: boundaries moved between torch's cut
  points while the simulated minibatch gets faster within memory).

A weight several ops read (a tied embedding and head) keeps its readers in one unit in Tarnawski
et al.'s model; with microbatches the split is also solved with each reader free to sit in
another stage (``replicate_tied`` of :func:`baechi_cli.pipeline.maxload.load_model`), as the
runtime (:mod:`baechi_cli.runtime.cut`) copies such a parameter to every stage using it: the copies count in memory and
the schedule all-reduces their gradient per minibatch (``info["tied_weights"]``). The fastest
of both within memory is kept.

An ONNX export with PyTorch module paths is split only where ``torch.distributed.pipelining`` can
cut (:mod:`baechi_cli.pipeline.torch_split`): stages are ranges of the program order starting at a
module's first op, and ``info["pipeline"]["split_points"]`` names those modules (the runtime
cuts there). ``info["pipeline"]["stage_of"]`` is each op's stage (the report maps it to a PyTorch
program's nodes).

With ``options.objective == "latency"`` the split is Tarnawski et al.'s inference-latency one
(:mod:`baechi_cli.pipeline.latency`): one contiguous call per accelerator, ordered by every edge
of the graph, least time for one sample; ``info["pipeline"]`` then has ``latency_us`` and the
calls' start and finish.

Complexity: that of :func:`baechi_cli.pipeline.throughput.solve`, once per stage count with
microbatches, plus O(S M) per schedule simulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.errors import BaechiError, InfeasibleError, InputError
from baechi_cli.core.graph import CONTROL_PORT, OpGraph
from baechi_cli.evaluator.placement import Placement
from baechi_cli.passes.training import STEP_OP
from baechi_cli.pipeline import schedules
from baechi_cli.pipeline.maxload import LoadModel, TiedWeight, evaluate_loads, load_model
from baechi_cli.pipeline.memory import MicrobatchMemory
from baechi_cli.pipeline.schedules import (
    StageCosts,
    simulate_pipeline,
    stage_devices,
)
from baechi_cli.pipeline.throughput import ProgramOrder, Split, solve
from baechi_cli.pipeline.timeline import render_timeline
from baechi_cli.placers import PipelineOptions

if TYPE_CHECKING:
    from baechi_cli.pipeline.torch_split import SkipFinder

# The boundary search after the max-load split (_tune): simulated splits, and move lengths in
# cut points, longest first.
TUNE_EVALUATIONS = 200
TUNE_STEPS = (8, 4, 2, 1)


def place(graph: OpGraph, devices: DeviceSpec, options: PipelineOptions) -> Placement:
    """Split ``graph`` into pipeline stages over ``devices`` (module docstring)."""
    if options.microbatches is not None and options.microbatches < 1:
        raise InputError(f"--microbatches must be at least 1, got {options.microbatches}")
    solver = SOLVERS.get(options.objective)
    if solver is None:
        raise InputError(
            f"the pipeline splitter places for {' or '.join(SOLVERS)}, not {options.objective!r}"
        )
    return solver(graph, devices, options)


def _place_for_throughput(graph: OpGraph, devices: DeviceSpec, options: PipelineOptions) -> Placement:
    """Stages for the most minibatches per second (:mod:`baechi_cli.pipeline.throughput`)."""
    # Tarnawski's files tie a backward node to its forward node by colorClass only.
    from_workload = graph.num_ops > 0 and "cpu_us" in graph.attrs[0]
    model = load_model(graph, devices, cpus=options.cpus, follow_forward=not from_workload)
    program, cuts = _program_cuts(graph)
    if options.microbatches is None:
        split = solve(model, max_sets=options.max_sets, orders=[program] if program else (), cuts=cuts)
        info = _info(model, split, None, options)
    else:
        one_device_us = sum(model.accel_us)  # the minibatch in one go, on one device
        model = _microbatched(model, devices, options.microbatches)
        # --schedule left out: the registry's default ones, the simplest first (it wins ties).
        tried = schedules.compared_by_default() if options.schedule == "auto" else (options.schedule,)
        best = None
        first_error = None
        minibatch_us: dict[str, float | None] = {}
        # A weight several ops read (tied embeddings) holds its readers on one device in
        # Tarnawski's model; torch's pipeline() copies it to each stage that reads it instead,
        # at the price of an all-reduce per minibatch: both are tried.
        models = [model]
        if not from_workload:
            untied = load_model(graph, devices, cpus=options.cpus, replicate_tied=True)
            if untied.tied:
                models.append(_microbatched(untied, devices, options.microbatches))
        solved: dict[tuple[int, int, float], Split | BaechiError] = {}  # interleaved's are zbv's
        for schedule in tried:
            found = _best_for_schedule(
                graph, models, program, cuts, replace(options, schedule=schedule), solved, devices
            )
            if isinstance(found, InfeasibleError):
                first_error = first_error or found
                minibatch_us[schedule] = None
                continue
            minibatch_us[schedule] = found[1]["schedule"]["minibatch_us"]
            if best is None or found[1]["schedule"]["minibatches_per_s"] > best[1]["schedule"][
                "minibatches_per_s"
            ] * (1 + 1e-9):
                best = found  # on a tie the first: the simpler schedule
        if best is None:
            assert first_error is not None
            if len(tried) > 1:  # the default compared several: none fits under any of them
                first_error.problem = first_error.problem.replace(
                    f"under {tried[0]}", f"under any of {', '.join(tried)}", 1
                )
            raise first_error
        split, info = best
        minibatch = info["schedule"]["minibatch_us"]
        info["schedule"]["speedup_vs_one_device"] = (
            round(one_device_us / minibatch, 6) if minibatch > 0 else None
        )
        if len(tried) > 1:  # what the default compared (None: no split fit under it)
            info["schedule"]["compared_minibatch_us"] = minibatch_us
    if cuts is not None:
        info["split_points"] = _split_points(graph, split)
    info["stage_of"] = _stage_of(split)  # per node of this graph; the report maps it to the program
    devices_used = info.get("schedule", {}).get("devices")
    if devices_used is None:
        return Placement(split.device_of_op, info={"pipeline": info})
    # Several stages per device: stage s runs on the device the schedule gives it.
    device_of_stage = stage_devices(info["schedule"]["name"], len(split.stage_device), devices_used)
    return Placement([device_of_stage[s] for s in _stage_of(split)], info={"pipeline": info})


def _microbatched(model: LoadModel, devices: DeviceSpec, microbatches: int) -> LoadModel:
    """``model`` with each op's time as ``microbatches`` (M) microbatches take it in all: its work
    split M ways but its launch, the first ``launch_overhead`` µs of its time (the least of the
    devices'), paid by each: ``us + (M - 1) * min(us, launch)``. The solver balances these loads
    and the schedules divide them by M, so one microbatch of an op costs ``launch + work / M``; an
    op of less than a launch (a view) costs the same at any batch. O(ops).

    >>> from baechi_cli.core.devices import parse_devices
    >>> m = _microbatched(LoadModel.chain([2.0, 105.0], send_us=[0, 0], accelerators=1), parse_devices("1x1GB"), 4)
    >>> m.accel_us  # a 2 µs op: 2 per microbatch; 5 µs launch + 100 µs work: 5 + 25 per microbatch
    [8.0, 120.0]
    """
    launch = min(d.launch_overhead_us for d in devices.devices)
    if microbatches <= 1 or launch <= 0:
        return model
    extra = microbatches - 1
    return LoadModel(
        **{
            **model.__dict__,
            "accel_us": [us + extra * min(us, launch) for us in model.accel_us],
            "cpu_us": [us + extra * min(us, launch) for us in model.cpu_us],
        }
    )


def _place_for_latency(graph: OpGraph, devices: DeviceSpec, options: PipelineOptions) -> Placement:
    """One sample's calls through the devices, least latency (:mod:`baechi_cli.pipeline.latency`)."""
    if options.microbatches is not None:
        raise InputError("--microbatches needs --objective throughput (latency is one sample's time)")
    from baechi_cli.pipeline.latency import solve_latency

    model = load_model(graph, devices, cpus=options.cpus, follow_forward=False)
    # A call is contiguous in the whole graph: a training step's backward edges order it too.
    model = LoadModel(**{**model.__dict__, "is_backward": [False] * model.num_ops})
    split = solve_latency(model)
    return Placement(split.device_of_op, info={"pipeline": {"objective": "latency", **split.to_json()}})


# What the pipeline splitter solves for each objective (core.objectives names the ones it
# optimises). Under makespan (--algo pipeline chosen by hand) it gives the throughput split, which
# the evaluator then judges by its step time.
SOLVERS = {
    "throughput": _place_for_throughput,
    "latency": _place_for_latency,
    "makespan": _place_for_throughput,
}


def _program_cuts(graph: OpGraph) -> tuple[list[int] | None, dict[int, str] | None]:
    """An ONNX PyTorch export's program order and the ops a stage may start at (None, None
    otherwise: a PyTorch program's stages are cut by baechi_cli.runtime, anywhere)."""
    if not any("_module" in a and "_onnx_node" in a for a in graph.attrs):
        return None, None
    from baechi_cli.io.onnx import onnx_node_ops
    from baechi_cli.pipeline.torch_split import graph_boundaries

    return onnx_node_ops(graph, graph.num_ops), graph_boundaries(graph)


def _split_points(graph: OpGraph, split: Split) -> dict[str, str] | None:
    """The split as ``{module: "beginning"}``, or None when it is not one torch can cut."""
    from baechi_cli.pipeline.torch_split import graph_split_points

    try:
        return graph_split_points(graph, graph.num_ops, _stage_of(split))
    except InputError:
        return None


def _best_for_schedule(
    graph: OpGraph,
    models: list[LoadModel],
    program: list[int] | None,
    cuts: dict[int, str] | None,
    options: PipelineOptions,
    solved: dict[tuple[int, int, float], Split | BaechiError],
    devices: DeviceSpec,
) -> tuple[Split, dict[str, Any]] | InfeasibleError:
    """The split of highest scheduled throughput within memory, over every stage count and model
    (tied weights kept whole, then copied: :func:`baechi_cli.pipeline.maxload.load_model`).
    ``solved``: the max-load splits already found, by (model, accelerators, memory), kept for
    the next schedule (the solver is deterministic).

    Returns (not raises) the InfeasibleError when none fits, so that another
    schedule can be tried.

    Interleaved and zbv (``CHUNKS`` stages per device): on ``D`` devices the
    graph is split into ``D * chunks`` stages by the max-load model with that
    many virtual devices of ``1 / chunks`` of the memory each (so a device's
    weights fit), stage ``s`` on the device
    :func:`~baechi_cli.pipeline.schedules.stage_devices` gives it. On a PyTorch export
    a max-load split with fewer stages (more would not lower its max-load)
    gets the rest by halving its longest stages (:func:`_every_stage`), and
    the best split per device count is tuned (:func:`_tune`).
    """
    assert options.microbatches is not None
    from baechi_cli.pipeline.torch_split import SkipFinder

    gradient_bytes = _weight_gradient_bytes(graph)
    steps = {v for v in range(graph.num_ops) if graph.op_types[v] == STEP_OP}
    per_op = _PerOp(
        MicrobatchMemory(graph, _updates(graph) | steps),
        _weight_gradient_us(graph, models[0]),
        SkipFinder(graph, graph.num_ops) if cuts is not None else None,
        gradient_bytes,
        _accumulate_us(gradient_bytes, devices, models[0].accelerators),
    )
    best: _Found | None = None
    problems: list[str] = []
    chunks = schedules.get(options.schedule).stages_per_device
    model = models[0]
    for devices in range(1, model.accelerators + 1):
        best_here: _Found | None = None  # the best on this many devices, tuned before it competes
        for candidate in models:
            if candidate.tied and devices * chunks == 1:
                continue  # one stage: nothing to copy
            narrowed = LoadModel(
                **{
                    **candidate.__dict__,
                    "accelerators": devices * chunks,
                    "memory": model.memory / chunks,
                    "cpus": model.cpus if chunks == 1 else 0,
                }
            )
            space = ProgramOrder(narrowed, program, cuts) if cuts is not None and program else None
            key = (models.index(candidate), narrowed.accelerators, narrowed.memory)
            try:
                split = _solve_once(solved, key, narrowed, program, cuts, options.max_sets)
                if space is not None and chunks > 1:
                    split = _every_stage(space, split, devices * chunks)
                found = _Found(candidate, devices if chunks > 1 else None, space, split, per_op, options)
            except (InfeasibleError, InputError) as err:  # no split, or microbatches the schedule refuses
                problems.append(str(err))
                continue
            if found.within_memory and (best_here is None or found.beats(best_here)):
                best_here = found
        if best_here is None:
            continue
        if best_here.space is not None:
            best_here = _tune(best_here)
        if best is None or best_here.rate > best.rate * (1 + 1e-9):
            best = best_here  # more stages may need a skip (a mask every layer reads): rate decides
    if best is None:
        return InfeasibleError(
            f"no pipeline split over 1 to {model.accelerators} device(s) fits memory with "
            f"{options.microbatches} microbatch(es) in flight under {options.schedule}"
            + (f" ({problems[-1]})" if problems else "")
            + (
                f"; {options.schedule} runs {chunks} stages on each device, each in 1/{chunks} of its memory"
                if chunks > 1
                else ""
            )
        )
    return best.split, best.info


def _solve_once(
    solved: dict[tuple[int, int, float], Split | BaechiError],
    key: tuple[int, int, float],
    model: LoadModel,
    program: list[int] | None,
    cuts: dict[int, str] | None,
    max_sets: int,
) -> Split:
    """:func:`~baechi_cli.pipeline.throughput.solve` of ``model``, once per ``key``: a later schedule gets the
    split, or raises the error, that an earlier one got (the solver is deterministic)."""
    if key not in solved:
        try:
            solved[key] = solve(model, max_sets=max_sets, orders=[program] if program else (), cuts=cuts)
        except (InfeasibleError, InputError) as err:
            solved[key] = err
    result = solved[key]
    if isinstance(result, BaechiError):
        raise result
    return result


class _Found:
    """A split judged by the schedule: the report's section and the rate it competes on."""

    def __init__(
        self,
        model: LoadModel,
        devices: int | None,
        space: ProgramOrder | None,
        split: Split,
        per_op: _PerOp,
        options: PipelineOptions,
    ) -> None:
        self.model, self.devices, self.space, self.split = model, devices, space, split
        self.per_op, self.options = per_op, options
        self.info = _info(model, split, per_op, options, devices)
        self.rate: float = self.info["schedule"]["minibatches_per_s"]
        self.within_memory: bool = self.info["schedule"]["within_memory"]
        finder = per_op.skip_finder
        skips = finder.skips(_stage_of(split)) if finder is not None else []
        if skips:
            # Values read past the next stage: baechi's runtime passes them through the stages
            # between (what the cost model charges), so they run under every schedule.
            self.info["skips"] = [
                {
                    "value": skip.op,
                    "from_stage": skip.from_stage,
                    "to_stage": skip.to_stage,
                    "needs_gradient": skip.needs_gradient,
                }
                for skip in skips
            ]

    def beats(self, other: _Found) -> bool:
        """Faster (on a tie the first)."""
        return self.rate > other.rate * (1 + 1e-9)

    def moved(self, split: Split) -> _Found:
        """Another split of the same model on as many devices."""
        return _Found(self.model, self.devices, self.space, split, self.per_op, self.options)


def _every_stage(space: ProgramOrder, split: Split, stages: int) -> Split:
    """``split`` with ``stages`` stages: while it has fewer, its stage spanning the most cut points
    is halved at its middle one (a schedule with several stages per device needs them all)."""
    bounds = space.boundaries(split)
    if bounds is None:
        return split
    while len(bounds) + 1 < stages:
        edges = [-1, *bounds, len(space.starts)]
        widest = max(range(len(edges) - 1), key=lambda i: (edges[i + 1] - edges[i], -i))
        if edges[widest + 1] - edges[widest] < 2:
            return split  # too few cut points: the schedule refuses it
        bounds.insert(widest, (edges[widest] + edges[widest + 1]) // 2)
    return space.split(bounds)


def _tune(start: _Found) -> _Found:
    """Move the stage boundaries of a program-order split to where the schedule runs fastest.

    The max-load split balances each stage's compute and transfers; the
    schedule also pays for bubbles, for the stages one device runs together
    (interleaved, zbv) and for activations in flight. A hill climb over the
    boundaries, judged by the simulated throughput within memory: each
    boundary, and each stage's two together, moves to the cut point ``step``
    places earlier or later (steps of ``TUNE_STEPS``), the first improvement
    taken, until no move improves or ``TUNE_EVALUATIONS`` splits were
    simulated. Deterministic.
    """
    space = start.space
    assert space is not None
    bounds = space.boundaries(start.split)
    if not bounds:
        return start
    best, evaluations = start, 0
    for step in TUNE_STEPS:
        improved = True
        while improved and evaluations < TUNE_EVALUATIONS:
            improved = False
            # One boundary, or a stage (its two boundaries) moved by ``step`` cut points.
            moves = [(i, j, d) for j in (1, 2) for i in range(len(bounds) - j + 1) for d in (-step, step)]
            for i, j, delta in moves:
                trial = [*bounds[:i], *(b + delta for b in bounds[i : i + j]), *bounds[i + j :]]
                if (
                    trial[0] < 0
                    or trial[-1] >= len(space.starts)
                    or any(a >= b for a, b in zip(trial, trial[1:]))
                ):
                    continue
                if evaluations >= TUNE_EVALUATIONS:
                    break
                evaluations += 1
                found = best.moved(space.split(trial))
                if found.within_memory and found.beats(best):
                    best, bounds, improved = found, trial, True
                    break
    best.info["tuned"] = {
        "evaluations": evaluations,
        "max_load_split_minibatch_us": start.info["schedule"]["minibatch_us"],
    }
    return best


@dataclass(frozen=True)
class _PerOp:
    """What the schedule needs of each op beyond the max-load model."""

    memory: MicrobatchMemory | None  # what a microbatch holds per stage (None: nothing)
    weight_us: list[float]  # of a backward op's time, the weight gradient's
    skip_finder: SkipFinder | None = None  # a PyTorch export's values that skip a stage
    gradient_bytes: list[int] | None = None  # per update op, the weight gradients it reads
    # per update op, adding one microbatch's gradients into .grad (every microbatch but the first)
    accumulate_us: list[float] | None = None


def _accumulate_us(gradient_bytes: list[int], devices: DeviceSpec, accelerators: int) -> list[float]:
    """Per op, the time of ``grad += g`` over the weight gradients it reads
    (:func:`_weight_gradient_bytes`; 0 if none) on the slowest of the first ``accelerators``
    devices: torch's ``AccumulateGrad`` after every microbatch but the first, reading two tensors
    of those bytes and writing one, one kernel each. O(V).

    >>> from baechi_cli.core.devices import devices_from_yaml
    >>> spec = devices_from_yaml("devices: {count: 1, memory: 1GB, memory_bandwidth: 1GB/s, launch_overhead: 5us}", "d")
    >>> _accumulate_us([0, 3000], spec, 1)
    [0.0, 14.0]
    """
    slowest = min(devices.devices[:accelerators], key=lambda d: d.memory_bandwidth)
    return [
        3 * b / slowest.memory_bandwidth * 1e6 + slowest.launch_overhead_us if b else 0.0
        for b in gradient_bytes
    ]


def _weight_gradient_bytes(graph: OpGraph) -> list[int]:
    """Per op, the bytes of the weight gradients it reads if it is an optimizer update (an op the
    ``optimizer/step`` barrier releases, :mod:`baechi_cli.passes.training`'s and the PyTorch
    reader's alike), else 0. A pipeline stage holds them from its first microbatch's backward to
    the step: torch accumulates each microbatch's into ``.grad``. O(V + E).

    >>> from baechi_cli.core.graph import CONTROL_PORT, GraphBuilder
    >>> b = GraphBuilder()
    >>> grad = b.add_op("grad", "MatMulGrad", [400], is_backward=True)
    >>> step = b.add_op("step", STEP_OP, [], is_backward=True)
    >>> update = b.add_op("update", "ApplyGradientDescent", [], is_backward=True)
    >>> _ = b.add_edge(grad, update), b.add_edge(grad, step, CONTROL_PORT), b.add_edge(step, update, CONTROL_PORT)
    >>> _weight_gradient_bytes(b.build())
    [0, 0, 400]
    """
    updates = _updates(graph)
    out = [0] * graph.num_ops
    seen: set[tuple[int, int, int]] = set()
    for e in range(graph.num_edges):
        src, port, dst = graph.edge_src[e], graph.edge_port[e], graph.edge_dst[e]
        if (
            dst in updates
            and port != CONTROL_PORT
            and graph.is_backward[src]
            and (src, port, dst) not in seen
        ):
            seen.add((src, port, dst))
            out[dst] += graph.edge_bytes[e]
    return out


def _updates(graph: OpGraph) -> set[int]:
    """The optimizer updates: the ops the ``optimizer/step`` barrier releases. O(V + E)."""
    steps = {v for v in range(graph.num_ops) if graph.op_types[v] == STEP_OP}
    return {
        graph.edge_dst[e]
        for e in range(graph.num_edges)
        if graph.edge_src[e] in steps and graph.edge_port[e] == CONTROL_PORT
    }


def _weight_gradient_us(graph: OpGraph, model: LoadModel) -> list[float]:
    """Per op, the part of its time that computes a weight gradient (what zbv runs as ``W``).

    A synthesized backward op (:mod:`baechi_cli.passes.training`) of an op owning
    parameters produces one gradient per output port, the parameters' among
    them; each is taken to cost an equal share (a Gemm's dX and dW are one
    forward's FLOPs each; a first layer has only dW). Other ops have none.
    O(V).
    """
    weight = [0.0] * graph.num_ops
    for b in range(graph.num_ops):
        v = graph.forward_op[b]
        if graph.is_backward[b] and v >= 0 and not graph.is_backward[v] and graph.persistent_bytes[v] > 0:
            weight[b] = model.accel_us[b] / max(1, len(graph.output_bytes[b]))
    return weight


def _info(
    model: LoadModel,
    split: Split,
    per_op: _PerOp | None,
    options: PipelineOptions,
    devices: int | None = None,
) -> dict[str, Any]:
    """The report's ``pipeline`` section; ``devices``: the devices of a schedule with several
    stages on each (None: one per stage)."""
    info: dict[str, Any] = {"objective": "throughput", **split.to_json()}
    device_of_stage = None
    if devices is not None:
        # The stages' loads are per stage; max-load is per device, each running several.
        device_of_stage = stage_devices(options.schedule, len(split.stage_device), devices)
        judged = evaluate_loads(model, [device_of_stage[s] for s in _stage_of(split)])
        info["max_load_us"] = round(judged.max_load_us, 6)
        info["throughput_per_s"] = round(1e6 / judged.max_load_us, 6) if judged.max_load_us > 0 else None
        info["stages"] = [{**stage, "device": d} for stage, d in zip(info["stages"], device_of_stage)]
    if per_op is None or options.microbatches is None:
        return info
    m = options.microbatches
    costs = _stage_costs(model, split, per_op, m, device_of_stage)
    if costs.gradient_syncs:
        info["tied_weights"] = [
            {
                "weight": model.names[weight.owner],
                "stages": list(stages),
                "bytes": weight.nbytes,
                "allreduce_us": round(us, 6),
            }
            for weight, (stages, us) in zip(_split_ties(model, split), costs.gradient_syncs)
        ]
    timing = simulate_pipeline(costs, m, options.schedule, devices=devices)
    memory = model.memory
    if devices is None:
        within = all(
            b <= memory for s, b in enumerate(timing.peak_bytes) if split.stage_device[s] < model.accelerators
        )
    else:
        within = all(b <= memory for b in timing.device_peak_bytes)
    info["schedule"] = {
        "name": options.schedule,
        "microbatches": m,
        "devices": devices,
        "chunks_per_device": len(split.stage_device) // devices if devices else 1,
        "minibatch_us": round(timing.minibatch_us, 6),
        "minibatches_per_s": round(1e6 / timing.minibatch_us, 9) if timing.minibatch_us > 0 else math.inf,
        # One device runs the minibatch's ops back to back, no transfers.
        "speedup_vs_one_device": round(sum(model.accel_us) / timing.minibatch_us, 6)
        if timing.minibatch_us > 0
        else None,
        "bubble_fraction": [round(b, 6) for b in timing.device_bubble_fraction],
        "peak_in_flight": list(timing.peak_in_flight),
        "peak_bytes": list(timing.device_peak_bytes),
        # One microbatch's forward and backward compute, per stage (µs): what a stage's measured
        # compute is compared with (baechi verify --torch).
        "stage_compute_us": [round(f + b, 6) for f, b in zip(costs.forward_us, costs.backward_us)],
        "within_memory": within,
        "timeline": render_timeline(timing).splitlines(),
    }
    return info


def _stage_of(split: Split) -> list[int]:
    """Each op's stage, in pipeline order."""
    rank = {d: i for i, d in enumerate(split.stage_device)}
    return [rank[d] for d in split.device_of_op]


def _split_ties(model: LoadModel, split: Split) -> list[TiedWeight]:
    """The tied weights ``split`` puts in several stages (their copies are all-reduced)."""
    stage_of = _stage_of(split)
    return [weight for weight in model.tied if len(weight.stages(stage_of)) > 1]


def _stage_costs(
    model: LoadModel,
    split: Split,
    per_op: _PerOp,
    microbatches: int,
    device_of_stage: list[int] | None = None,
) -> StageCosts:
    """Per stage and microbatch: forward and backward compute (and the weight gradients' part),
    boundary transfers, bytes (the input gradients a stage sends back apart: the schedule says how
    long they are held); per minibatch, the all-reduce of each tied weight split across devices
    (``device_of_stage``; None: one stage per device), whose copies on other devices count in
    memory."""
    stages = len(split.stage_device)
    stage_of = _stage_of(split)
    k = model.accelerators
    forward = [0.0] * stages
    backward = [0.0] * stages
    weight_us = [0.0] * stages
    persistent = [0] * stages
    for v, s in enumerate(stage_of):
        on_accelerator = split.stage_device[s] < k
        us = model.accel_us[v] if on_accelerator else model.cpu_us[v]
        if model.is_backward[v]:
            backward[s] += us / microbatches
            # The weight gradient's share of the op, at the speed the op runs.
            share = per_op.weight_us[v] / model.accel_us[v] if model.accel_us[v] > 0 else 0.0
            weight_us[s] += share * us / microbatches
        else:
            forward[s] += us / microbatches
        persistent[s] += model.size[v] + (per_op.gradient_bytes[v] if per_op.gradient_bytes else 0)
        if per_op.accumulate_us and microbatches > 1:  # part of the weight gradient's step
            accumulate = per_op.accumulate_us[v] * (microbatches - 1) / microbatches
            backward[s] += accumulate
            weight_us[s] += accumulate
    sent_gradient = [0] * stages
    sent_activation = [0] * stages

    def device(s: int) -> int:
        return device_of_stage[s] if device_of_stage else s

    send_forward = [0.0] * max(0, stages - 1)
    send_backward = [0.0] * max(0, stages - 1)
    training = any(model.is_backward)
    for t, src in enumerate(model.tensor_src):
        a = stage_of[src]
        readers = {stage_of[w] for w in model.tensor_dst[t]}
        if model.tensor_bytes and not model.is_backward[src] and readers and max(readers) > a:
            # A value crossing boundaries a..b-1 (threaded through the stages between), as torch's
            # stages hold it: each receiver a buffer per microbatch all step (and in training the
            # gradient it sends back: ``sent_gradient``, until the schedule waits for the send);
            # each sender the value per microbatch in flight (until its backward: the sweep of
            # ``per_op.memory``) and a buffer per microbatch for the gradient it receives.
            nbytes = model.tensor_bytes[t]
            one = math.ceil(nbytes / microbatches)
            for s in range(a + 1, max(readers) + 1):
                persistent[s] += nbytes
                if training and device(s - 1) != device(s):  # torch hands it over on one device
                    sent_gradient[s] += one
            for s in range(a, max(readers)):
                if training:
                    persistent[s] += nbytes
                    if device(s) != device(s + 1):
                        sent_activation[s] += one
        for b in readers:
            if a < b:  # an activation: it crosses every boundary between a and b
                for s in range(a, b):
                    send_forward[s] += model.tensor_us[t] / microbatches
            elif a > b:  # a gradient going back
                for s in range(b, a):
                    send_backward[s] += model.tensor_us[t] / microbatches
    syncs = []
    for weight in _split_ties(model, split):
        held = weight.stages(stage_of)
        device_of = {s: device_of_stage[s] if device_of_stage else s for s in held}
        # The owner's device holds the weight already; one copy per other device.
        first_on_device = {device_of[s]: s for s in reversed(held)}
        first_on_device.pop(device_of[stage_of[weight.owner]], None)
        for s in first_on_device.values():
            persistent[s] += weight.replica_bytes
        syncs.append((held, weight.allreduce_us(len(set(device_of.values())))))
    activation = forward_peak = backward_peak = pending = None
    if per_op.memory is not None:
        kept = per_op.memory.per_stage(stage_of, stages, microbatches)
        activation = [one.retained for one in kept]
        forward_peak = [one.forward_peak for one in kept]
        backward_peak = [one.backward_peak for one in kept]
        # torch never splits the first stage's backward (its inputs need no gradient): W runs it whole.
        pending = [0] + [one.weight_pending for one in kept[1:]]
    return StageCosts(
        forward_us=forward,
        backward_us=backward,
        send_forward_us=send_forward,
        send_backward_us=send_backward,
        persistent_bytes=persistent,
        activation_bytes=activation,
        forward_peak_bytes=forward_peak,
        backward_peak_bytes=backward_peak,
        weight_pending_bytes=pending,
        sent_gradient_bytes=sent_gradient,
        sent_activation_bytes=sent_activation,
        weight_us=[min(w, b) for w, b in zip(weight_us, backward)],  # float sums may overshoot
        gradient_syncs=syncs,
    )
