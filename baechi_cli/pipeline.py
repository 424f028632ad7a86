"""The placement pipeline: load -> cost -> passes -> place -> expand -> evaluate -> write.

Every stage is a function of OpGraph (plus options) to OpGraph or to a
Placement; this module strings them together and times them. Every
candidate placement, whichever placer made it, is expanded onto the ops and
judged by :func:`baechi_cli.evaluate.evaluate`; ``--algo auto`` keeps the
best judged one. It never prints: ``progress(stage)`` is called as each
stage starts so the CLI can draw a progress bar. The report and the compare
document are assembled in :mod:`baechi_cli.io.report`, the notes in
:mod:`baechi_cli.notes`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from baechi_cli import placers
from baechi_cli.bounds import LowerBounds, lower_bounds
from baechi_cli.devices import DeviceSpec
from baechi_cli.errors import BaechiError, InfeasibleError, InputError, SolverError
from baechi_cli.evaluate import Evaluation, evaluate
from baechi_cli.graph import OpGraph
from baechi_cli.io.models import (
    OP_SETS,
    check_output_format,
    check_writable,
    load_model,
    sha256_of,
    write_placed_model,
)
from baechi_cli.notes import pipeline_notes, placement_notes, race_note, uncovered_note
from baechi_cli.placers import Placement, PlacerSpec
from baechi_cli.placers.single import largest_device
from baechi_cli.sim import SimResult, StepTimer

if TYPE_CHECKING:
    from baechi_cli.search import Search

STAGES = ("load", "profile", "passes", "place", "simulate", "write")


@dataclass
class PlaceOptions:
    """Everything ``place`` and ``compare`` take besides the model and the devices (build by keyword)."""

    algo: str = "auto"
    batch_size: int | None = None
    comm: str | None = None  # overrides the device spec's interconnect mode
    solver_time_limit: float | None = 60.0  # seconds, for m-SCT's LP
    sct_threshold: float = 0.5
    # The passes' options. None: the default (co-placement and fusion on,
    # forward-only placement when every device holds the whole model), and
    # --algo auto also tries the other setting; True/False pins it.
    coplace: bool | None = None
    fusion: bool | None = None
    forward_only: bool | None = None
    # Seconds auto may search beyond its first candidates (None: by size); exact's time limit.
    budget: float | None = None
    seed: int = 0  # refinement's tie-breaking and annealing
    profile: str | None = None  # a baechi.profile/v1 file whose costs replace the analytic model's
    dims: dict[str, int] | None = None  # ONNX symbolic dims bound by --dim NAME=VALUE
    training: bool = False  # synthesize the backward pass and optimizer of a forward-only model
    optimizer: str = "sgd"  # with training: sgd | momentum | adam
    objective: str = "makespan"  # makespan: one step's time; throughput: a pipeline's; latency: one sample's
    microbatches: int | None = None  # with throughput: per minibatch (None: an endless stream)
    schedule: str = "auto"  # with throughput and microbatches: 1f1b | gpipe | interleaved | auto (the faster)
    cpus: int = 0  # with throughput: CPU cores beside the devices (a workload file's maxCPUs)

    def placer_options(self, spec: PlacerSpec) -> Any:
        """The options dataclass of ``spec``'s placer, from the matching fields here.

        ``budget``, when given, is exact's time limit (CP-SAT's deterministic seconds per model).
        """
        values: dict[str, Any] = {
            "solver_time_limit": self.solver_time_limit,
            "sct_threshold": self.sct_threshold,
            "objective": self.objective,
            "microbatches": self.microbatches,
            "schedule": self.schedule,
            "cpus": self.cpus,
        }
        if self.budget is not None:
            values["time_limit"] = self.budget
        return spec.make_options(values)

    def to_json(self) -> dict[str, Any]:
        return {
            "algo": self.algo,
            "batch_size": self.batch_size,
            "solver_time_limit": self.solver_time_limit,
            "sct_threshold": self.sct_threshold,
            "coplace": "auto" if self.coplace is None else self.coplace,
            "fusion": "auto" if self.fusion is None else self.fusion,
            "forward_only": "auto" if self.forward_only is None else self.forward_only,
            "budget_s": self.budget,
            "seed": self.seed,
            "profile": self.profile,
            "dims": dict(sorted(self.dims.items())) if self.dims else None,
            "training": self.training,
            "optimizer": self.optimizer if self.training else None,
            "objective": self.objective,
            "microbatches": self.microbatches,
            "schedule": self.schedule if self.microbatches is not None else None,
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
    bounds: LowerBounds
    single_device: SimResult | None  # None when the model does not fit one device
    # What the placers see under the options given (None resolved to the default).
    variant: Variant
    # Ops 0..model_ops-1 are the input's; with --training the synthesized
    # backward and optimizer ops follow them.
    model_ops: int = 0
    training: TrainingInfo | None = None
    notes: list[str] = field(default_factory=list)  # the reader's and the cost model's
    # Evaluations by placement: one placement proposed several times (one device,
    # above all) is judged once.
    judged: dict[tuple, Evaluation] = field(default_factory=dict, repr=False)
    # Why forward-only placement is on or off by default (the pass record's reason).
    forward_only_reason: str = ""
    # The other settings of the passes auto tries, by PassOptions, made on first use.
    variants: dict[PassOptions, Variant] = field(default_factory=dict, repr=False)
    # The evaluator's engine for ``graph`` on ``devices``, built once for every judgement.
    timer: StepTimer | None = field(default=None, repr=False)

    @property
    def lower_bound_us(self) -> float:
        """The best lower bound known on any plan's step time (:mod:`baechi_cli.bounds`)."""
        return self.bounds.best_us

    @property
    def placement_graph(self) -> OpGraph:
        """What the placers see under the options given."""
        return self.variant.placement_graph

    def variant_for(self, options: PassOptions) -> Variant:
        """The placement graph under ``options`` (the passes run once per setting)."""
        if options == self.variant.options:
            return self.variant
        found = self.variants.get(options)
        if found is None:
            reason = self.forward_only_reason
            if options.forward_only != self.variant.options.forward_only:
                reason = "tried by auto"
            found = self.variants[options] = optimization_passes(self.graph, self.devices, options, reason)
        return found

    def judge(self, placement: Placement, known: Evaluation | None = None) -> Evaluation:
        """``evaluate()`` of a placement of ``graph``'s ops, remembered.

        ``known``: that evaluation, when the caller already ran it (refinement does).
        """
        key = _placement_key(placement)
        found = self.judged.get(key)
        if found is None:
            found = self.judged[key] = known or evaluate(
                self.graph, self.devices, placement, timer=self.timer
            )
        return found


def _placement_key(placement: Placement) -> tuple:
    return (tuple(placement.device_of), None if placement.sequence is None else tuple(placement.sequence))


@dataclass(frozen=True)
class TrainingInfo:
    """What ``--training`` added to a forward-only model (the report's ``training``)."""

    optimizer: str
    backward_ops: int
    loss_ops: int
    update_ops: int
    optimizer_state_bytes: int

    def to_json(self) -> dict[str, Any]:
        from baechi_cli.passes.training import BACKWARD_MULTIPLIER, OPTIMIZER_SLOTS

        return {
            "optimizer": self.optimizer,
            "backward_ops": self.backward_ops,
            "loss_ops": self.loss_ops,
            "update_ops": self.update_ops,
            "optimizer_slots": OPTIMIZER_SLOTS[self.optimizer],
            "optimizer_state_bytes": self.optimizer_state_bytes,
            "backward_multipliers": BACKWARD_MULTIPLIER,
        }


@dataclass
class Candidate:
    """One placer's attempt: its placement as the evaluator judged it, or why there is none."""

    algorithm: str
    place_seconds: float
    placement: Placement | None = None
    evaluation: Evaluation | None = None
    error: BaechiError | None = None
    skipped: str | None = None  # why auto did not run it
    variant: PassOptions | None = None  # the passes' setting it placed under
    # "refine": local search from the candidate ``start`` names; "exact": CP-SAT.
    stage: str = "place"
    start: str | None = None  # for a refined candidate: the label of the one it started from

    # How the passes' setting differs from the options given (set by auto's search).
    differences: str = ""

    @property
    def label(self) -> str:
        """What tables call it: the placer's title, with how auto changed the passes' options."""
        if self.stage == "refine":
            return f"{self.start}, refined"
        name = placers.title(self.algorithm)
        return f"{name} ({self.differences})" if self.differences else name

    @property
    def ok(self) -> bool:
        return self.evaluation is not None

    @property
    def sim(self) -> SimResult | None:
        """The evaluated timeline (None without a placement)."""
        return None if self.evaluation is None else self.evaluation.timeline

    @property
    def problem(self) -> str | None:
        """Why there is no placement, in one line (None when there is one)."""
        if self.skipped is not None:
            return self.skipped
        return None if self.error is None else str(self.error)


@dataclass
class PlaceOutcome:
    prepared: Prepared
    chosen: Candidate
    candidates: list[Candidate]
    timings: dict[str, float]
    notes: list[str]
    search: Search | None = None  # what --algo auto did

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
        if self.prepared.input_format != "onnx":
            return None
        from baechi_cli.io.onnx import module_map_of

        names = self.devices.names
        return module_map_of(self.graph, self.prepared.model_ops, [names[d] for d in self.sim.device_of])

    @property
    def single_device(self) -> SimResult | None:
        return self.prepared.single_device


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


def with_views(graph: OpGraph, fmt: str) -> OpGraph:
    """``graph`` with its views marked (their outputs take no memory); a workload's sizes are given."""
    if fmt == "workload":
        return graph
    from baechi_cli.costs.memory_rules import mark_views

    return mark_views(graph, OP_SETS[fmt])


def constraint_passes(graph: OpGraph, fmt: str, path: str) -> tuple[OpGraph, list[PassRecord]]:
    """Colocation and control flow (GraphDef): what TensorFlow imposes, so always run.

    A bad graph (a cycle, a colocation conflict) is an InputError naming ``path``.
    """
    records: list[PassRecord] = []
    try:
        if fmt == "graphdef":
            from baechi_cli.passes.colocation import colocate
            from baechi_cli.passes.control_flow import control_flow

            for name, fn in (("colocation", colocate), ("control_flow", control_flow)):
                graph, record = run_pass(name, fn, graph)
                records.append(record)
        graph.topo_order()  # every later stage needs the order; a cycle fails here, once
    except InputError as err:
        raise err.with_path(path) from None
    return graph, records


class PassOptions(NamedTuple):
    """One setting of the optimization passes: a point of ``--algo auto``'s search space."""

    forward_only: bool
    coplace: int | None  # co-placement's bound, in groups per device of the model's memory; None: off
    fusion: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "forward_only": self.forward_only,
            "coplace": self.coplace is not None,
            "coplace_groups_per_device": self.coplace,
            "fusion": self.fusion,
        }

    def differences(self, base: PassOptions) -> str:
        """How this setting differs from ``base``, for labels: ``no forward-only, co-placement/32``."""
        out = []
        if self.forward_only != base.forward_only:
            out.append("forward-only" if self.forward_only else "no forward-only")
        if self.coplace != base.coplace:
            out.append("no co-placement" if self.coplace is None else f"co-placement/{self.coplace}")
        if self.fusion != base.fusion:
            out.append("fusion" if self.fusion else "no fusion")
        return ", ".join(out)


@dataclass
class Variant:
    """The placement graph of one :class:`PassOptions`: what the placers see under that setting."""

    options: PassOptions
    placement_graph: OpGraph  # nodes with ``members`` when ops were contracted
    records: list[PassRecord]
    # True when placement_graph only contracts the op graph (no edge dropped), so a
    # placer's node sequence expands into a valid op sequence; forward-only
    # placement drops the backward ops' edges, and then the evaluator orders ops.
    expands_sequence: bool = True
    # Set when forward-only placement contracted the graph: the placement graph
    # without it (same other options), for when a placement made under
    # forward-only's premise (every device holds the whole model) does not fit.
    without_forward_only: Callable[[], OpGraph] | None = field(default=None, repr=False)

    @functools.cached_property
    def fingerprint(self) -> int:
        """Equal for variants whose placers would see the same graph (auto runs one of them)."""
        g = self.placement_graph
        members = None if g.members is None else tuple(tuple(m) for m in g.members)
        return hash((members, tuple(g.group), g.num_edges, self.expands_sequence))


def optimization_passes(
    graph: OpGraph, devices: DeviceSpec, options: PassOptions, forward_only_reason: str
) -> Variant:
    """Forward-only placement, co-placement and fusion as ``options`` say (see :class:`Variant`).

    ``forward_only_reason`` is what the forward-only pass's record says about
    why it ran or not. The placement graph's nodes carry ``members`` when a
    pass contracted ops.
    """
    from baechi_cli.passes.coplace import coplace
    from baechi_cli.passes.forward_only import forward_only
    from baechi_cli.placers.memory import own_bytes

    records: list[PassRecord] = []
    current = graph
    if options.forward_only:
        current, record = run_pass("forward_only", forward_only, current)
        record.details["reason"] = forward_only_reason
        records.append(record)
    else:
        records.append(skipped_pass("forward_only", graph, forward_only_reason))
    if options.coplace is not None:
        cap = sum(own_bytes(graph)) // (options.coplace * devices.count)
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
    variant = Variant(options, current, records, expands_sequence=not options.forward_only)
    if options.forward_only:
        fine = options._replace(forward_only=False)

        @functools.cache
        def without_forward_only() -> OpGraph:
            return optimization_passes(graph, devices, fine, "").placement_graph

        variant.without_forward_only = without_forward_only
    return variant


def default_pass_options(
    graph: OpGraph, devices: DeviceSpec, options: PlaceOptions, model_peak_bytes: int | None
) -> tuple[PassOptions, str]:
    """The passes' setting for ``options`` (None resolved to the default), and why forward-only is on or off.

    ``model_peak_bytes`` is the peak of a one-device run (None when the model
    fits no device): forward-only placement is on by default exactly when
    every device could hold that (the paper's condition).
    """
    smallest = min(d.memory_bytes for d in devices.devices)
    if not any(graph.is_backward):
        forward_only, reason = False, "the graph has no backward ops"
    elif options.forward_only is not None:
        forward_only = options.forward_only
        reason = "--forward-only" if forward_only else "--no-forward-only"
    elif model_peak_bytes is None or model_peak_bytes > smallest:
        forward_only, reason = False, "some device cannot hold the whole model (the paper's condition)"
    else:
        forward_only, reason = True, "every device can hold the whole model"
    coplace = None if options.coplace is False else COPLACE_GROUPS_PER_DEVICE
    return PassOptions(forward_only, coplace, options.fusion is not False), reason


def check_times_finite(graph: OpGraph, devices: DeviceSpec, path: str) -> None:
    """InputError unless every step time of ``graph`` on ``devices`` is a finite float. O(V + E).

    Each cost is finite (the readers check), but a sum of them can overflow, and
    a timeline with an infinite step time has no meaning (nor a JSON report).
    """
    from baechi_cli.sim import step_time_ceiling

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


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector meanwhile (a context manager and a decorator).

    Reference counting still frees every object; only reference cycles wait. The
    stages make millions of small lists, tuples and dicts on a large graph and no
    cycles worth collecting, while each full collection walks every live object:
    placing a 1M-op workload with m-TOPO, collections took 25 s of 120 (five full
    ones 18 s). The workload reader pauses it likewise.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@cyclic_gc_paused()
def prepare(path: str, devices: DeviceSpec, options: PlaceOptions, step: Callable[[str], None]) -> Prepared:
    """load -> cost -> passes, plus the bounds every placement is compared with."""
    if options.comm is not None:
        devices = devices.with_comm_mode(options.comm)
    timings: dict[str, float] = {}

    step("load")
    t0 = time.perf_counter()
    graph, fmt, notes = load_model(path, options.batch_size, options.dims)
    if fmt == "graphdef":
        from baechi_cli.verify.races import colocate_races, step_races

        races, sidecar = step_races(graph, path)
        if races:
            graph = colocate_races(graph, races)
            notes.append(race_note(races, sidecar))
    graph = with_views(graph, fmt)
    sha256 = sha256_of(path)
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
    if fmt == "onnx":  # costed op by op above; in memory an exported GELU is the one kernel it was
        from baechi_cli.costs.memory_rules import one_kernel_gelus

        graph = one_kernel_gelus(graph)
    timings["profile"] = time.perf_counter() - t0

    step("passes")
    t0 = time.perf_counter()
    graph, passes = constraint_passes(graph, fmt, path)
    timings["passes"] = time.perf_counter() - t0

    training = None
    if options.training:
        t0 = time.perf_counter()
        graph, training, record = training_pass(graph, devices, fmt, options.optimizer, path)
        passes.append(record)
        timings["profile"] += time.perf_counter() - t0

    t0 = time.perf_counter()
    check_times_finite(graph, devices, path)
    timer = StepTimer(graph, devices)
    bound, single_placement, single_evaluation = bounds(graph, devices, timer)
    single = single_evaluation.timeline if single_evaluation.feasible else None
    timings["simulate"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    peak = max(single.peak_bytes) if single is not None else None
    pass_options, forward_only_reason = default_pass_options(graph, devices, options, peak)
    variant = optimization_passes(graph, devices, pass_options, forward_only_reason)
    passes += variant.records
    timings["passes"] += time.perf_counter() - t0
    return Prepared(
        path=path,
        input_format=fmt,
        sha256=sha256,
        graph=graph,
        devices=devices,
        passes=passes,
        timings=timings,
        cost_report=cost_report,
        bounds=bound,
        single_device=single,
        variant=variant,
        model_ops=model_ops,
        training=training,
        notes=notes,
        judged={_placement_key(single_placement): single_evaluation},
        forward_only_reason=forward_only_reason,
        timer=timer,
    )


def training_pass(
    graph: OpGraph, devices: DeviceSpec, fmt: str, optimizer: str, path: str
) -> tuple[OpGraph, TrainingInfo, PassRecord]:
    """``--training``: synthesize the backward pass and optimizer (:mod:`baechi_cli.passes.training`)."""
    from baechi_cli.costs.registry import rule_for
    from baechi_cli.passes.training import LOSS_OP, STEP_OP, UPDATE_OP, synthesize_training

    op_set = OP_SETS[fmt]
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


# What a placer is told each device holds when memory need not be counted.
AMPLE_MEMORY = 2**62


@cyclic_gc_paused()
def run_candidate(
    prepared: Prepared,
    spec: PlacerSpec,
    options: PlaceOptions,
    variant: Variant | None = None,
    placer_options: Any = None,
) -> Candidate:
    """Run one placer on a placement graph and judge its expanded placement with the evaluator.

    ``variant`` is the setting of the passes to place under (default: the
    options given, ``prepared.variant``); ``placer_options`` the placer's
    options (default: from ``options``).

    Infeasible placements and solver failures become the candidate's error.
    A placer that promises to respect memory (``spec.respects_memory``):

    * after forward-only placement places as if memory were ample, the pass's
      premise (every device holds the whole model); should the evaluator find
      the expanded placement over memory after all, it places again on the
      graph without forward-only placement;
    * else it keeps its placement graph within memory. The ops it expands to
      may count a little differently (a fused node holds all its members'
      tensors while it runs, the ops only their own), so when the evaluator
      finds the expanded placement over memory the placer runs again on
      devices whose memory is cut by the excess
      (:func:`~baechi_cli.placers.memory.cut_budget`).

    A placer with ``spec.budget_retries`` (the pipeline splitter) also runs
    again on cut memory. For any other placer that does not respect memory
    (one device), over memory is the model's infeasibility.
    """
    from baechi_cli.placers.memory import MEMORY_ATTEMPTS, cut_budget

    graph, devices = prepared.graph, prepared.devices
    variant = variant or prepared.variant
    pgraph, expands_sequence = variant.placement_graph, variant.expands_sequence
    premise = variant.without_forward_only is not None and spec.respects_memory
    if premise and spec.needs_every_edge:
        assert variant.without_forward_only is not None
        pgraph, expands_sequence, premise = variant.without_forward_only(), True, False
    capacity = [d.memory_bytes for d in devices.devices]
    budget = capacity
    t0 = time.perf_counter()
    for _ in range(MEMORY_ATTEMPTS):
        given = devices.with_memory([AMPLE_MEMORY] * devices.count if premise else budget)
        try:
            placement = spec.place(pgraph, given, placer_options or options.placer_options(spec))
        except (InfeasibleError, SolverError) as err:
            seconds = time.perf_counter() - t0
            return Candidate(spec.name, seconds, error=err.with_path(prepared.path), variant=variant.options)
        except InputError as err:  # a graph the placer refuses (exact's size guard): the user's to fix
            if pgraph is not variant.placement_graph:  # the passes line counted another graph
                err.problem += (
                    f" without forward-only placement, which {spec.name} turns off to see every edge "
                    f"(the other placers see {variant.placement_graph.num_ops:,})"
                )
            raise err.with_path(prepared.path) from None
        if pgraph is not graph:
            placement = expand(placement, pgraph, graph, expands_sequence)
        evaluation = prepared.judge(placement)
        if evaluation.feasible or not (spec.respects_memory or spec.budget_retries):
            break
        if premise:
            assert variant.without_forward_only is not None
            pgraph, expands_sequence, premise = variant.without_forward_only(), True, False
            continue
        cut = cut_budget(budget, evaluation.timeline.peak_bytes, capacity)
        if cut is None:
            break
        budget = cut
    seconds = time.perf_counter() - t0
    if not evaluation.feasible:
        error = over_memory(evaluation.timeline, graph, devices, prepared.path)
        return Candidate(spec.name, seconds, error=error, variant=variant.options)
    # Judged now: the placer's own list schedule (every planned transfer and time,
    # hundreds of MB at 1M ops) is dropped, since auto keeps every candidate.
    placement.schedule = None
    return Candidate(spec.name, seconds, placement, evaluation, variant=variant.options)


def over_memory(sim: SimResult, graph: OpGraph, devices: DeviceSpec, path: str) -> InfeasibleError:
    """The error for a placement whose simulated peak exceeds a device's memory (names device, op, excess)."""
    from baechi_cli.placers.memory import over_memory_error

    one_device = len(set(sim.device_of)) == 1
    problem = "the model does not fit one device" if one_device else "the placement does not fit"
    return over_memory_error(sim, graph, devices, problem).with_path(path)


def expand(placement: Placement, pgraph: OpGraph, graph: OpGraph, with_sequence: bool) -> Placement:
    """A placement of ``pgraph``'s nodes as a placement of ``graph``'s ops.

    The node sequence expands too when ``with_sequence`` (a pure contraction);
    otherwise the evaluator orders the ops. The placer's own schedule stays,
    for comparing its plan with the evaluator's judgement.
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


def fastest(candidates: list[Candidate]) -> Candidate | None:
    """The feasible candidate with the best objective value (earlier in the list on ties); None without one."""
    feasible = [c for c in candidates if c.ok]
    return min(feasible, key=lambda c: c.evaluation.value_us) if feasible else None  # type: ignore[union-attr]


def choose(candidates: list[Candidate]) -> Candidate:
    """:func:`fastest`, or the error that explains why there is no placement.

    With none feasible, an infeasible model says so: the errors of placers that
    respect memory come first, since their message says what the model needs
    ("does not fit one device" says less); otherwise the first failure speaks.
    """
    best = fastest(candidates)
    if best is not None:
        return best
    failed = sorted(
        (c for c in candidates if c.error is not None),
        key=lambda c: not placers.get(c.algorithm).respects_memory,
    )
    if not failed:
        raise SolverError("; ".join(c.problem or c.algorithm for c in candidates))
    errors = [c.error for c in failed if c.error is not None]
    raise next((e for e in errors if isinstance(e, InfeasibleError)), errors[0])


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
    if options.objective != "throughput" and options.microbatches is not None:
        raise InputError(
            "--microbatches needs --objective throughput (microbatches stream through pipeline stages)"
        )
    if options.objective in ("throughput", "latency"):
        if options.algo not in ("auto", "pipeline"):
            raise InputError(
                f"--objective {options.objective} places with the pipeline splitter, not --algo {options.algo} "
                "(leave --algo out)"
            )
        options = replace(options, algo="pipeline")
    spec = None if options.algo == "auto" else placers.get(options.algo)
    for target in (output, report_path, trace_path):
        if target is not None:
            check_writable(target)
    t_start = time.perf_counter()
    if output is not None:
        check_output_format(path, output)
    prepared = prepare(path, devices, options, step)
    timings = dict.fromkeys(STAGES, 0.0) | prepared.timings

    step("place")
    t0 = time.perf_counter()
    search = None
    if spec is None:
        from baechi_cli.search import auto_search

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
    outcome = PlaceOutcome(prepared, chosen, candidates, timings, notes, search)

    step("write")
    t0 = time.perf_counter()
    if output is not None:
        outcome.notes += write_placed_model(
            path,
            prepared.input_format,
            prepared.graph,
            prepared.model_ops,
            outcome.sim.device_of,
            prepared.devices.names,
            output,
        )
    if trace_path is not None:
        from baechi_cli.io.trace import build_trace, write_trace

        write_trace(
            trace_path, build_trace(prepared.graph, prepared.devices, outcome.sim, title=chosen.algorithm)
        )
    timings["write"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start
    if report_path is not None:
        from baechi_cli.io.report import build_report, write_report

        write_report(report_path, build_report(outcome, options))
    return outcome
