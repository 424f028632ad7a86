"""The placement pipeline: load -> cost -> passes -> place -> expand -> simulate -> write.

Every stage is a function of OpGraph (plus options) to OpGraph or to a
Placement; this module strings them together, times them and assembles the
report. It never prints: ``progress(stage)`` is called as each stage starts
so the CLI can draw a progress bar.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from baechi_cli import __version__
from baechi_cli.devices import DeviceSpec
from baechi_cli.errors import BaechiError, InfeasibleError, InputError, SolverError
from baechi_cli.graph import OpGraph
from baechi_cli.io.report import REPORT_SCHEMA
from baechi_cli.placers import PLACER_NAMES, Placement, get_placer
from baechi_cli.placers.single import largest_device
from baechi_cli.sim import SimResult, lower_bound, same_timeline, simulate

STAGES = ("load", "profile", "passes", "place", "simulate", "write")

ALGORITHM_TITLES = {"topo": "m-TOPO", "etf": "m-ETF", "sct": "m-SCT", "single": "single device"}
# What --algo auto tries, in order of preference when step times tie.
AUTO_CANDIDATES = ("single", "etf", "sct", "topo")
# Above this many ops auto leaves m-SCT out: its LP alone takes seconds at 5k
# ops and tens of seconds at 20k (bench/lp_backends.md), against a promise of
# placement in about a second. `--algo sct` and `compare` still run it.
AUTO_SCT_MAX_OPS = 5000
ALGO_CHOICES = ("auto", *PLACER_NAMES)


@dataclass
class PlaceOptions:
    algo: str = "auto"
    batch_size: int | None = None
    comm: str | None = None  # overrides the device spec's interconnect mode
    solver_time_limit: float | None = 60.0  # seconds, for m-SCT's LP
    sct_threshold: float = 0.5
    coplace: bool = True
    fusion: bool = True
    forward_only: bool | None = None  # None: on exactly when every device holds the whole model
    profile: str | None = None  # a baechi.profile/v1 file whose costs replace the analytic model's
    dims: dict[str, int] | None = None  # ONNX symbolic dims bound by --dim NAME=VALUE
    training: bool = False  # synthesize the backward pass and optimizer of a forward-only model
    optimizer: str = "sgd"  # with training: sgd | momentum | adam

    def placer_options(self) -> dict[str, Any]:
        return {"solver_time_limit": self.solver_time_limit, "sct_threshold": self.sct_threshold}

    def to_json(self) -> dict[str, Any]:
        return {
            "algo": self.algo,
            "batch_size": self.batch_size,
            "solver_time_limit": self.solver_time_limit,
            "sct_threshold": self.sct_threshold,
            "coplace": self.coplace,
            "fusion": self.fusion,
            "forward_only": "auto" if self.forward_only is None else self.forward_only,
            "profile": self.profile,
            "dims": dict(sorted(self.dims.items())) if self.dims else None,
            "training": self.training,
            "optimizer": self.optimizer if self.training else None,
        }


# Co-placement grows a group up to this fraction of the model's memory per
# device (the placers' memory measure): chains and pairs merge, but no group
# grows big enough to commit a placer, at its first op, to a large part of
# the model (m-ETF on Inception-V3: 579 ms with 1/8 of a device, 188 ms here).
COPLACE_GROUPS_PER_DEVICE = 256


@dataclass
class PassRecord:
    name: str
    ops_before: int
    ops_after: int
    edges_before: int
    edges_after: int
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProfileCosts:
    """Where the costs came from when ``place --profile`` gave them (the report's ``costs``)."""

    path: str
    source: str  # the profile's: analytic | measured | mixed
    device: str
    same_model: bool  # the profile's model sha256 equals the input's

    def to_json(self) -> dict[str, Any]:
        return {
            "model": "profile",
            "profile": self.path,
            "source": self.source,
            "device": self.device,
            "same_model_sha256": self.same_model,
        }


@dataclass
class Prepared:
    """A model loaded, costed and through the passes: what every placer starts from."""

    path: str
    input_format: str
    sha256: str
    graph: OpGraph
    devices: DeviceSpec
    passes: list[PassRecord]
    timings: dict[str, float]
    cost_report: Any
    lower_bound_us: float
    single_device: SimResult | None  # None when the model does not fit one device
    # What the placers see: ``graph`` after forward-only placement and fusion
    # (``members`` maps its nodes back onto ``graph``'s ops), or ``graph`` itself.
    placement_graph: OpGraph
    # True when placement_graph only contracts graph (no edge dropped), so a
    # placer's node sequence expands into a valid op sequence.
    expands_sequence: bool = True
    # Ops 0..model_ops-1 are the input's; with --training the synthesized
    # backward and optimizer ops follow them.
    model_ops: int = 0
    training: TrainingInfo | None = None
    notes: list[str] = field(default_factory=list)  # the reader's and the cost model's


@dataclass(frozen=True)
class TrainingInfo:
    """What ``--training`` added to a forward-only model (the report's ``training``)."""

    optimizer: str
    backward_ops: int
    update_ops: int
    optimizer_state_bytes: int

    def to_json(self) -> dict[str, Any]:
        from baechi_cli.passes.training import BACKWARD_MULTIPLIER, OPTIMIZER_SLOTS

        return {
            "optimizer": self.optimizer,
            "backward_ops": self.backward_ops,
            "update_ops": self.update_ops,
            "optimizer_slots": OPTIMIZER_SLOTS[self.optimizer],
            "optimizer_state_bytes": self.optimizer_state_bytes,
            "backward_multipliers": BACKWARD_MULTIPLIER,
        }


@dataclass
class Candidate:
    """One placer's attempt: a placement and its simulated step, or the error it met."""

    algorithm: str
    place_seconds: float
    placement: Placement | None = None
    sim: SimResult | None = None
    error: BaechiError | None = None

    @property
    def ok(self) -> bool:
        return self.sim is not None


@dataclass
class PlaceOutcome:
    prepared: Prepared
    chosen: Candidate
    candidates: list[Candidate]
    timings: dict[str, float]
    notes: list[str]

    # Shortcuts used by the CLI and the report.
    @property
    def path(self) -> str:
        return self.prepared.path

    @property
    def graph(self) -> OpGraph:
        return self.prepared.graph

    @property
    def devices(self) -> DeviceSpec:
        return self.prepared.devices

    @property
    def algorithm(self) -> str:
        return self.chosen.algorithm

    @property
    def placement(self) -> Placement:
        assert self.chosen.placement is not None
        return self.chosen.placement

    @property
    def sim(self) -> SimResult:
        assert self.chosen.sim is not None
        return self.chosen.sim

    @property
    def lower_bound_us(self) -> float:
        return self.prepared.lower_bound_us

    @functools.cached_property
    def module_map(self) -> Any:
        """The PyTorch module map of the chosen placement (None unless an ONNX model has module paths)."""
        names = self.devices.names
        return module_map_of(self.prepared, [names[d] for d in self.sim.device_of])

    @property
    def single_device(self) -> SimResult | None:
        return self.prepared.single_device


# A serialized ONNX ModelProto starts with its ir_version: field 1, varint (tag 0x08).
# A binary GraphDef never does: its field 1 is `node`, a message (tag 0x0a).
_ONNX_FIRST_BYTE = b"\x08"


def detect_format(path: str) -> str:
    """'workload' for .json, 'onnx' for .onnx, 'graphdef' for .pb/.pbtxt and anything else,
    unless the file's first byte says it is an ONNX model (``model.pb`` saved by onnx)."""
    ext = os.path.splitext(path)[1].lower()
    if ext == ".json":
        return "workload"
    if ext == ".onnx":
        return "onnx"
    if ext != ".pbtxt":
        try:
            with open(path, "rb") as f:
                if f.read(1) == _ONNX_FIRST_BYTE:
                    return "onnx"
        except OSError:
            pass  # reading it fails again, with its error, in the reader
    return "graphdef"


# The cost-rule name table each format's op types are looked up in.
OP_SETS = {"graphdef": "tensorflow", "onnx": "onnx", "workload": "tensorflow"}


class LoadedModel(NamedTuple):
    graph: OpGraph
    format: str  # graphdef | onnx | workload
    notes: list[str]  # what the reader wants the user to know (ONNX: external data not loaded, ...)


def load_model(path: str, batch_size: int | None, dims: dict[str, int] | None = None) -> LoadedModel:
    """Read ``path`` into an OpGraph, with its format name and the reader's notes.

    ``dims`` binds ONNX symbolic dims by name; another format given ``dims``
    is an InputError (TensorFlow graphs have only the batch dim to fill).
    """
    if not os.path.exists(path):
        raise InputError("no such file", path=path)
    fmt = detect_format(path)
    if dims and fmt != "onnx":
        raise InputError(f"--dim binds ONNX symbolic dims; this input is {fmt} (use --batch-size)", path=path)
    try:
        if fmt == "workload":
            from baechi_cli.io.workload_json import read_workload_json

            return LoadedModel(read_workload_json(path), fmt, [])
        if fmt == "onnx":
            from baechi_cli.io.onnx import read_onnx_with_notes

            read = read_onnx_with_notes(path, batch_size=batch_size, dims=dims)
            return LoadedModel(read.graph, fmt, list(read.notes))
        from baechi_cli.io.graphdef import read_graphdef

        return LoadedModel(read_graphdef(path, batch_size=batch_size), fmt, [])
    except InputError as err:
        raise err.with_path(path) from None


def run_pass(name: str, fn: Callable[[OpGraph], OpGraph], graph: OpGraph) -> tuple[OpGraph, PassRecord]:
    """Apply one pass and record what it did (ops, edges and groups before and after)."""
    t0 = time.perf_counter()
    out = fn(graph)
    seconds = time.perf_counter() - t0
    record = PassRecord(name, graph.num_ops, out.num_ops, graph.num_edges, out.num_edges, seconds)
    record.details = {
        "enabled": True,
        "groups_before": _count_groups(graph),
        "groups_after": _count_groups(out),
    }
    return out, record


def _count_groups(graph: OpGraph) -> int:
    return len(set(graph.group))


def skipped_pass(name: str, graph: OpGraph, reason: str) -> PassRecord:
    """The record of a pass that did not run, with the reason."""
    groups = _count_groups(graph)
    record = PassRecord(name, graph.num_ops, graph.num_ops, graph.num_edges, graph.num_edges, 0.0)
    record.details = {"enabled": False, "reason": reason, "groups_before": groups, "groups_after": groups}
    return record


def constraint_passes(graph: OpGraph, fmt: str) -> tuple[OpGraph, list[PassRecord]]:
    """Colocation and control flow (GraphDef): what TensorFlow imposes, so always run."""
    records: list[PassRecord] = []
    if fmt == "graphdef":
        from baechi_cli.passes.colocation import colocate
        from baechi_cli.passes.control_flow import control_flow

        for name, fn in (("colocation", colocate), ("control_flow", control_flow)):
            graph, record = run_pass(name, fn, graph)
            records.append(record)
    graph.topo_order()  # every later stage needs the order; a cycle fails here, once
    return graph, records


def optimization_passes(
    graph: OpGraph, devices: DeviceSpec, options: PlaceOptions, model_peak_bytes: int | None
) -> tuple[OpGraph, OpGraph, list[PassRecord]]:
    """Forward-only placement, co-placement and fusion; returns (op graph, placement graph, records).

    ``model_peak_bytes`` is the peak of a one-device run (None when the model
    fits no device): forward-only placement is on by default exactly when
    every device could hold that. The op graph comes back with every group
    the passes formed; the placement graph is what the placers see (nodes
    with ``members`` when a pass contracted ops).
    """
    from baechi_cli.passes.contract import groups_of
    from baechi_cli.passes.coplace import coplace
    from baechi_cli.passes.forward_only import forward_only
    from baechi_cli.placers.memory import own_bytes

    records: list[PassRecord] = []
    current = graph
    smallest = min(d.memory_bytes for d in devices.devices)
    if not any(graph.is_backward):
        records.append(skipped_pass("forward_only", graph, "the graph has no backward ops"))
    elif options.forward_only is False:
        records.append(skipped_pass("forward_only", graph, "--no-forward-only"))
    elif options.forward_only is None and (model_peak_bytes is None or model_peak_bytes > smallest):
        records.append(
            skipped_pass(
                "forward_only", graph, "some device cannot hold the whole model (the paper's condition)"
            )
        )
    else:
        current, record = run_pass("forward_only", forward_only, current)
        record.details["reason"] = (
            "--forward-only" if options.forward_only else "every device can hold the whole model"
        )
        records.append(record)
    if options.coplace:
        cap = sum(own_bytes(graph)) // (COPLACE_GROUPS_PER_DEVICE * devices.count)
        current, record = run_pass("coplace", lambda g: coplace(g, max_group_bytes=cap), current)
        record.details["max_group_bytes"] = cap
        records.append(record)
    else:
        records.append(skipped_pass("coplace", current, "--no-coplace"))
    if options.fusion:
        from baechi_cli.passes.fusion import fuse

        current, record = run_pass("fusion", fuse, current)
        records.append(record)
    else:
        records.append(skipped_pass("fusion", current, "--no-fusion"))
    if current.members is None:  # not contracted: only groups changed
        return current, current, records
    return graph.replace(group=groups_of(current, graph)), current, records


def bounds(graph: OpGraph, devices: DeviceSpec) -> tuple[float, SimResult | None]:
    """The lower bound, and the one-device run (None when the model does not fit one device)."""
    single = simulate(graph, devices, [largest_device(devices)] * graph.num_ops)
    return lower_bound(graph, devices), single if single.feasible else None


def prepare(path: str, devices: DeviceSpec, options: PlaceOptions, step: Callable[[str], None]) -> Prepared:
    """load -> cost -> passes, plus the bounds every placement is compared with."""
    if options.comm is not None:
        devices = devices.with_comm_mode(options.comm)
    timings: dict[str, float] = {}

    step("load")
    t0 = time.perf_counter()
    graph, fmt, notes = load_model(path, options.batch_size, options.dims)
    sha256 = _sha256(path)
    model_ops = graph.num_ops
    timings["load"] = time.perf_counter() - t0

    step("profile")
    t0 = time.perf_counter()
    cost_report: Any = None
    if options.profile is not None:
        from baechi_cli.costs.profile import apply_profile, load_profile

        profile = load_profile(options.profile)
        graph = apply_profile(graph, profile, options.profile, path)
        cost_report = ProfileCosts(
            options.profile, profile.source, profile.device, profile.model.sha256 == sha256
        )
    elif fmt != "workload":  # a workload file carries its own measured costs
        from baechi_cli.costs.analytic import estimate_costs

        graph, cost_report = estimate_costs(graph, devices, op_set=OP_SETS[fmt])
        if cost_report.uncovered:
            notes.append(uncovered_note(cost_report.coverage["uncovered"]))
    timings["profile"] = time.perf_counter() - t0

    step("passes")
    t0 = time.perf_counter()
    try:
        graph, passes = constraint_passes(graph, fmt)
    except InputError as err:
        raise err.with_path(path) from None
    timings["passes"] = time.perf_counter() - t0

    training = None
    if options.training:
        t0 = time.perf_counter()
        graph, training, record = training_pass(graph, devices, fmt, options.optimizer, path)
        passes.append(record)
        timings["profile"] += time.perf_counter() - t0

    t0 = time.perf_counter()
    bound, single = bounds(graph, devices)
    timings["simulate"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    peak = max(single.peak_bytes) if single is not None else None
    graph, placement_graph, more = optimization_passes(graph, devices, options, peak)
    passes += more
    timings["passes"] += time.perf_counter() - t0
    return Prepared(
        path,
        fmt,
        sha256,
        graph,
        devices,
        passes,
        timings,
        cost_report,
        bound,
        single,
        placement_graph,
        expands_sequence=not any(p.name == "forward_only" and p.details["enabled"] for p in passes),
        model_ops=model_ops,
        training=training,
        notes=notes,
    )


def uncovered_note(uncovered: dict[str, int]) -> str:
    """The warning for op types without a cost rule: which, how many, what they were costed as."""
    listed = ", ".join(f"{t} ({n})" for t, n in sorted(uncovered.items(), key=lambda kv: (-kv[1], kv[0])))
    ops = sum(uncovered.values())
    return (
        f"{ops} op{'s' if ops != 1 else ''} of {len(uncovered)} type{'s' if len(uncovered) != 1 else ''} "
        f"without a cost rule, costed by the bytes they move: {listed}"
    )


def training_pass(
    graph: OpGraph, devices: DeviceSpec, fmt: str, optimizer: str, path: str
) -> tuple[OpGraph, TrainingInfo, PassRecord]:
    """``--training``: synthesize the backward pass and optimizer (:mod:`baechi_cli.passes.training`)."""
    from baechi_cli.costs.rules import rule_for
    from baechi_cli.passes.training import UPDATE_OP, synthesize_training

    op_set = OP_SETS[fmt]
    kinds = [rule_for(t, op_set).kind for t in graph.op_types]
    try:
        out, record = run_pass("training", lambda g: synthesize_training(g, devices, kinds, optimizer), graph)
    except InputError as err:
        raise err.with_path(path) from None
    n = graph.num_ops
    update_ops = sum(1 for v in range(n, out.num_ops) if out.op_types[v] == UPDATE_OP[optimizer])
    info = TrainingInfo(
        optimizer,
        backward_ops=out.num_ops - n - update_ops,
        update_ops=update_ops,
        optimizer_state_bytes=sum(out.persistent_bytes[n:]),
    )
    record.details["optimizer"] = optimizer
    return out, info, record


def run_candidate(prepared: Prepared, algo: str, options: PlaceOptions) -> Candidate:
    """Run one placer and judge its placement with the simulator.

    Infeasible placements and solver failures become the candidate's error;
    a placer whose own prediction disagrees with the simulator is a bug.
    """
    graph, devices = prepared.graph, prepared.devices
    if algo == "single":
        t0 = time.perf_counter()
        placement = get_placer("single")(graph, devices, {})
        seconds = time.perf_counter() - t0
        if prepared.single_device is None:
            d = placement.device_of[0] if placement.device_of else 0
            return Candidate(
                algo,
                seconds,
                error=InfeasibleError(
                    f"the model does not fit one device: {devices.devices[d].name} has "
                    f"{devices.devices[d].memory_bytes} bytes",
                    path=prepared.path,
                ),
            )
        return Candidate(algo, seconds, placement, prepared.single_device)
    pgraph = prepared.placement_graph
    t0 = time.perf_counter()
    try:
        placement = get_placer(algo)(pgraph, devices, options.placer_options())
    except (InfeasibleError, SolverError) as err:
        return Candidate(algo, time.perf_counter() - t0, error=err.with_path(prepared.path))
    if pgraph is not graph:
        placement = expand(placement, pgraph, graph, prepared.expands_sequence)
    seconds = time.perf_counter() - t0
    sim = simulate(graph, devices, placement.device_of, sequence=placement.sequence)
    if placement.schedule is not None:
        planned = sim
        if pgraph is not graph:
            schedule = placement.schedule
            planned = simulate(pgraph, devices, schedule.device_of, sequence=schedule.sequence)
        if not same_timeline(placement.predicted, planned):
            raise RuntimeError(f"{algo} predicted a timeline the simulator does not reproduce")
    if not sim.feasible:  # the ledger bounds the peak, so this is a placer bug
        raise RuntimeError(f"{algo} exceeded device memory")
    return Candidate(algo, seconds, placement, sim)


def expand(placement: Placement, pgraph: OpGraph, graph: OpGraph, with_sequence: bool) -> Placement:
    """A placement of ``pgraph``'s nodes as a placement of ``graph``'s ops.

    The node sequence expands too when ``with_sequence`` (a pure contraction);
    otherwise the simulator orders the ops. The placer's own schedule stays,
    for checking its prediction on ``pgraph``.
    """
    from baechi_cli.passes.contract import placement_of, sequence_of

    sequence = None
    if with_sequence and placement.sequence is not None:
        sequence = sequence_of(pgraph, placement.sequence, graph)
    return Placement(
        placement_of(pgraph, placement.device_of, graph.num_ops),
        sequence,
        schedule=placement.schedule,
        info=placement.info,
    )


def choose(candidates: list[Candidate]) -> Candidate:
    """The feasible candidate with the best step time (earlier in the list on ties)."""
    feasible = [c for c in candidates if c.ok]
    if not feasible:
        # An infeasible model says so (a placer's message says what it needs;
        # "does not fit one device" says less); otherwise the first failure speaks.
        errors = [c.error for c in candidates if c.error is not None and c.algorithm != "single"]
        errors += [c.error for c in candidates if c.error is not None and c.algorithm == "single"]
        raise next((e for e in errors if isinstance(e, InfeasibleError)), errors[0])
    return min(feasible, key=lambda c: c.sim.step_time_us)


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
    if options.algo not in ALGO_CHOICES:
        raise InputError(f"unknown algorithm '{options.algo}' (choose from {', '.join(ALGO_CHOICES)})")
    for target in (output, report_path, trace_path):
        if target is not None:
            check_writable(target)
    t_start = time.perf_counter()
    if output is not None:
        check_output_format(path, output)
    prepared = prepare(path, devices, options, step)
    timings = dict(prepared.timings)

    step("place")
    algos = AUTO_CANDIDATES if options.algo == "auto" else (options.algo,)
    candidates = []
    for algo in algos:
        if options.algo == "auto" and algo == "sct" and prepared.placement_graph.num_ops > AUTO_SCT_MAX_OPS:
            skipped = SolverError(
                f"skipped by auto: m-SCT's LP over {prepared.placement_graph.num_ops} ops would take "
                f"tens of seconds (auto runs it up to {AUTO_SCT_MAX_OPS} ops); use --algo sct"
            )
            candidates.append(Candidate(algo, 0.0, error=skipped))
            continue
        candidates.append(run_candidate(prepared, algo, options))
    timings["place"] = sum(c.place_seconds for c in candidates)
    chosen = choose(candidates)

    outcome = PlaceOutcome(
        prepared,
        chosen,
        candidates,
        timings,
        [
            *prepared.notes,
            *placement_notes(
                prepared.graph,
                prepared.devices,
                chosen.algorithm,
                chosen.sim,
                prepared.single_device,
                candidates,
            ),
        ],
    )
    if isinstance(prepared.cost_report, ProfileCosts) and not prepared.cost_report.same_model:
        outcome.notes.append(
            f"the profile {prepared.cost_report.path} was taken from a file with another sha256; "
            "its ops match this model's by name, so its costs were used"
        )

    step("write")
    t0 = time.perf_counter()
    if output is not None:
        outcome.notes += write_placed_model(prepared, chosen.sim.device_of, output)
    if trace_path is not None:
        from baechi_cli.io.trace import build_trace, write_trace

        write_trace(
            trace_path, build_trace(prepared.graph, prepared.devices, chosen.sim, title=chosen.algorithm)
        )
    timings["write"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start
    if report_path is not None:
        from baechi_cli.io.report import write_report

        write_report(report_path, build_report(outcome, options))
    return outcome


def check_output_format(path: str, output: str) -> None:
    """``-o`` writes the input's own format: a placed GraphDef or a placed ONNX model."""
    fmt = detect_format(path)
    if fmt == "workload":
        raise InputError(
            "-o writes a placed model, but the input is a workload JSON; use --report", path=path
        )
    if fmt == "onnx" and detect_format(output) != "onnx":
        raise InputError("-o must name an .onnx file for an ONNX input (the placed model)", path=output)
    if fmt == "graphdef" and detect_format(output) != "graphdef":
        raise InputError("-o must name a .pb or .pbtxt file for a GraphDef input", path=output)


def write_placed_model(prepared: Prepared, device_of: list[int], output: str) -> list[str]:
    """Write the input model with every op's device; returns the writer's notes.

    Only the input's ops are written: with ``--training`` the backward and
    optimizer ops exist only in the plan.
    """
    graph, names = prepared.graph, prepared.devices.names
    if prepared.input_format == "onnx":
        from baechi_cli.io.onnx import write_placed_onnx

        nodes = [v for v in range(prepared.model_ops) if "_onnx_node" in graph.attrs[v]]
        node_device: list[str | None] = [None] * len(nodes)
        for v in nodes:
            node_device[graph.attrs[v]["_onnx_node"]] = names[device_of[v]]
        return write_placed_onnx(prepared.path, node_device, names, output)
    from baechi_cli.io.graphdef import write_placed_graphdef

    write_placed_graphdef(
        prepared.path, {graph.names[v]: names[device_of[v]] for v in range(prepared.model_ops)}, output
    )
    return []


def placement_notes(
    graph: OpGraph,
    devices: DeviceSpec,
    algo: str,
    sim: SimResult,
    single: SimResult | None,
    candidates: list[Candidate] | None = None,
) -> list[str]:
    """Explain what users would read as a bug: a split slower than one device, an idle device."""
    notes = []
    if candidates and len(candidates) > 1 and algo == "single":
        splits = [c for c in candidates if c.ok and c.algorithm != "single"]
        best = min(splits, key=lambda c: c.sim.step_time_us, default=None)
        why = "the model fits one device and no split beats it"
        if best is not None:
            why += (
                f" (the best, {ALGORITHM_TITLES[best.algorithm]}, takes {_ms(best.sim.step_time_us)}: "
                "communication costs more than the parallelism gains)"
            )
        idle = ", ".join(d.name for i, d in enumerate(devices.devices) if not sim.order[i])
        return [f"auto kept one device: {why}; {idle} stay idle."]
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
    elif algo == "topo":
        why = (
            "m-TOPO fills devices in topological order up to an equal share of compute, "
            "and the earlier devices took all of it"
        )
    else:
        why = (
            f"{ALGORITHM_TITLES.get(algo, algo)} never found an op that could start earlier there, "
            "once the transfer of its inputs is counted, than on a device that already held them"
        )
    return [*notes, f"{which} {verb} no ops: {why}."]


def _ms(us: float) -> str:
    return f"{us / 1000:.3f} ms"


def check_writable(path: str) -> None:
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
    """The ``result`` fields of DESIGN.md for one simulated placement."""
    return {
        "step_time_us": sim.step_time_us,
        "lower_bound_us": prepared.lower_bound_us,
        "single_device_us": prepared.single_device.step_time_us if prepared.single_device else None,
        "comm_bytes": sim.comm_bytes,
        "transfers": len(sim.transfers),
        "feasible": sim.feasible,
    }


def candidate_json(c: Candidate) -> dict[str, Any]:
    out: dict[str, Any] = {
        "algorithm": c.algorithm,
        "step_time_us": c.sim.step_time_us if c.sim else None,
        "place_seconds": round(c.place_seconds, 6),
        "feasible": c.ok,
        "error": str(c.error) if c.error else None,
    }
    if c.placement is not None and c.placement.info:
        out["info"] = c.placement.info
    return out


def build_report(outcome: PlaceOutcome, options: PlaceOptions) -> dict[str, Any]:
    """The ``baechi.report/v1`` document (see the README for every key)."""
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
        "candidates": [candidate_json(c) for c in outcome.candidates],
        "notes": outcome.notes,
        "placement": {g.names[v]: device_name[v] for v in range(n)},
    }
    if prepared.training is not None:
        report["training"] = {
            **prepared.training.to_json(),
            "placement": {g.names[v]: device_name[v] for v in range(n, g.num_ops)},
        }
    modules = outcome.module_map
    if modules is not None:
        from baechi_cli.io.torch_modules import torch_device

        report["module_map"] = {
            **modules.to_json(),
            "torch_devices": {d.name: torch_device(d.name) for d in spec.devices},
        }
    return report


def module_map_of(prepared: Prepared, device_name: list[str]) -> Any:
    """The PyTorch module map of an ONNX export (None when no op has a module path)."""
    if prepared.input_format != "onnx":
        return None
    from baechi_cli.io.torch_modules import module_map, parameter_module

    g = prepared.graph
    ops = [v for v in range(prepared.model_ops) if "_onnx_node" in g.attrs[v]]
    paths = [g.attrs[v].get("_module") for v in ops]
    if all(p is None for p in paths):
        return None
    owners = [
        [m for m in map(parameter_module, g.attrs[v].get("_initializers", ())) if m is not None] for v in ops
    ]
    return module_map(paths, [device_name[v] for v in ops], [g.names[v] for v in ops], owners)


COMPARE_SCHEMA = "baechi.compare/v1"
# Placement-time regressions smaller than this are timer noise, not regressions.
PLACE_TIME_NOISE_S = 0.05


@dataclass
class CompareOutcome:
    prepared: Prepared
    candidates: list[Candidate]
    timings: dict[str, float]


def parse_algos(text: str) -> list[str]:
    """``topo,etf,sct`` -> names; an unknown name is an InputError listing the valid ones."""
    algos = [a.strip() for a in text.split(",") if a.strip()]
    if not algos:
        raise InputError(f"--algos is empty (choose from {', '.join(PLACER_NAMES)})")
    for a in algos:
        if a not in PLACER_NAMES:
            raise InputError(f"unknown algorithm '{a}' in --algos (choose from {', '.join(PLACER_NAMES)})")
    return list(dict.fromkeys(algos))


def compare_model(
    path: str,
    devices: DeviceSpec,
    algos: list[str],
    options: PlaceOptions,
    *,
    trace_path: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> CompareOutcome:
    """Run every algorithm of ``algos`` on one prepared model."""
    step = progress or (lambda stage: None)
    if trace_path is not None:
        check_writable(trace_path)
    t_start = time.perf_counter()
    prepared = prepare(path, devices, options, step)
    timings = dict(prepared.timings)
    step("place")
    candidates = [run_candidate(prepared, algo, options) for algo in algos]
    timings["place"] = sum(c.place_seconds for c in candidates)
    step("write")
    if trace_path is not None:
        from baechi_cli.io.trace import build_trace, merge_traces, write_trace

        traces = [
            build_trace(prepared.graph, prepared.devices, c.sim, title=c.algorithm)
            for c in candidates
            if c.sim is not None
        ]
        write_trace(trace_path, merge_traces(traces))
    timings["total"] = time.perf_counter() - t_start
    return CompareOutcome(prepared, candidates, timings)


def compare_json(outcome: CompareOutcome) -> dict[str, Any]:
    """``baechi.compare/v1``: one entry per algorithm with the ``result`` fields."""
    prepared = outcome.prepared
    results = []
    for c in outcome.candidates:
        entry: dict[str, Any] = {"algorithm": c.algorithm, "place_seconds": round(c.place_seconds, 6)}
        if c.sim is not None:
            entry.update(result_json(prepared, c.sim))
            entry["peak_bytes"] = c.sim.peak_bytes
        else:
            entry.update(
                {
                    "step_time_us": None,
                    "lower_bound_us": prepared.lower_bound_us,
                    "single_device_us": (
                        prepared.single_device.step_time_us if prepared.single_device else None
                    ),
                    "comm_bytes": None,
                    "transfers": None,
                    "feasible": False,
                    "peak_bytes": None,
                }
            )
        entry["error"] = str(c.error) if c.error else None
        if c.placement is not None and c.placement.info:
            entry["info"] = c.placement.info
        results.append(entry)
    return {
        "schema": COMPARE_SCHEMA,
        "tool": {"name": "baechi", "version": __version__},
        "input": input_json(prepared),
        "devices": devices_json(prepared.devices),
        "comm": comm_json(prepared.devices),
        "lower_bound_us": prepared.lower_bound_us,
        "single_device_us": prepared.single_device.step_time_us if prepared.single_device else None,
        "results": results,
    }


def load_baseline(path: str) -> dict[str, Any]:
    """A previous ``baechi compare --json`` output; another schema is an InputError."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise InputError("baseline file not found", path=path) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"baseline is not JSON: {err}", path=path) from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema != COMPARE_SCHEMA:
        raise InputError(
            f"baseline has schema {schema!r}, expected '{COMPARE_SCHEMA}' (make it with baechi compare --json)",
            path=path,
        )
    if not isinstance(doc.get("results"), list):
        raise InputError("baseline has no 'results' list", path=path)
    return doc


def regressions(current: dict[str, Any], baseline: dict[str, Any], max_regression: float) -> list[str]:
    """Each algorithm whose step or placement time got worse than the baseline by more than the threshold.

    Algorithms missing on either side are not compared; an algorithm that
    placed in the baseline and fails now is a regression. Placement-time
    differences under ``PLACE_TIME_NOISE_S`` are ignored as timer noise.
    """
    before = {r.get("algorithm"): r for r in baseline["results"] if isinstance(r, dict)}
    found = []
    for r in current["results"]:
        old = before.get(r["algorithm"])
        if old is None:
            continue
        name = r["algorithm"]
        old_step, new_step = old.get("step_time_us"), r.get("step_time_us")
        if old_step is not None and new_step is None:
            found.append(f"{name}: placed in the baseline, fails now ({r.get('error')})")
            continue
        if old_step and new_step is not None and new_step > old_step * (1 + max_regression):
            found.append(
                f"{name}: step time {new_step:.1f} us vs {old_step:.1f} us "
                f"(+{new_step / old_step - 1:.1%} > {max_regression:.1%})"
            )
        old_t, new_t = old.get("place_seconds"), r.get("place_seconds")
        if (
            isinstance(old_t, (int, float))
            and new_t is not None
            and new_t > old_t * (1 + max_regression)
            and new_t - old_t > PLACE_TIME_NOISE_S
        ):
            found.append(
                f"{name}: placement time {new_t:.3f} s vs {old_t:.3f} s "
                f"(+{(new_t / old_t - 1) if old_t else float('inf'):.1%} > {max_regression:.1%})"
            )
    return found


# --- baechi profile --------------------------------------------------------------------

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
    :mod:`baechi_cli.costs.measured`) and measured costs replace analytic
    ones for every op that ran. The totals' peak activation memory and step
    time come from simulating all ops on one device of unbounded memory.
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
    graph, fmt, notes = load_model(path, batch_size, dims)
    if measure and fmt != "graphdef":
        raise InputError(f"--measure runs TensorFlow GraphDefs; this input is {fmt}", path=path)
    sha256 = _sha256(path)
    timings["load"] = time.perf_counter() - t_start

    step("profile")
    t0 = time.perf_counter()
    n = graph.num_ops
    report = None
    device_of = None
    if fmt == "workload":
        source_of, rule_of, flops = [MEASURED] * n, [GIVEN] * n, [0.0] * n
        device = f"the device the workload was profiled on (costs given in {os.path.basename(path)})"
    else:
        graph, report = estimate_costs(graph, devices, op_set=OP_SETS[fmt])
        source_of, rule_of, flops = [ANALYTIC] * n, rule_kinds(graph, report, OP_SETS[fmt]), report.flops
        device = analytic_device(devices)
    timings["profile"] = time.perf_counter() - t0

    run = None
    if measure:
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
        graph, source_of, device_of = merge_measurements(graph, run)
        device = run.device
        timings["measure"] = time.perf_counter() - t0

    step("simulate")
    t0 = time.perf_counter()
    try:
        constrained, _ = constraint_passes(graph, fmt)
    except InputError as err:
        raise err.with_path(path) from None
    unbounded = replace(devices.devices[0], memory_bytes=2**62)
    single = simulate(constrained, DeviceSpec((unbounded,), devices.interconnect), [0] * n)
    timings["simulate"] = time.perf_counter() - t0

    profile = build_profile(
        graph,
        source_of=source_of,
        rule_of=rule_of,
        flops=flops,
        device=device,
        device_of=device_of,
        model={"path": path, "sha256": sha256, "format": fmt, "batch_size": batch_size},
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
