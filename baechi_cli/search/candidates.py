"""A placement problem and its candidates: what every placer starts from, and how one is judged.

:class:`Prepared` is a model loaded, costed and through the passes, with its
bounds and the evaluator's engine; :func:`run_candidate` runs one placer on one
setting of the passes, expands its placement onto the ops and has the
evaluator judge it (a :class:`Candidate`); :func:`choose` keeps the best, or
raises the error that explains why there is none. :class:`PlaceOptions` holds
everything ``place`` and ``compare`` take besides the model and the devices.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from baechi_cli import placers
from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.errors import BaechiError, InfeasibleError, InputError, SolverError
from baechi_cli.core.gcpause import cyclic_gc_paused
from baechi_cli.core.graph import OpGraph
from baechi_cli.evaluator.bounds import LowerBounds
from baechi_cli.evaluator.evaluate import Evaluation, evaluate
from baechi_cli.evaluator.placement import Placement
from baechi_cli.evaluator.sim import SimResult, StepTimer
from baechi_cli.passes.manager import (
    COPLACE_GROUPS_PER_DEVICE,
    PassOptions,
    PassRecord,
    Variant,
    optimization_passes,
)
from baechi_cli.placers import PlacerSpec

if TYPE_CHECKING:
    from baechi_cli.placers.memory import NoFit


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
    infer_shapes: str = "onnx"  # io.formats.INFER_SHAPES: onnx | run (one onnxruntime run)
    unknown_sizes: bool = False  # place even when tensor sizes stay unknown (--allow-unknown-sizes)
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
            "infer_shapes": self.infer_shapes,
            "allow_unknown_sizes": self.unknown_sizes,
            "training": self.training,
            "optimizer": self.optimizer if self.training else None,
            "objective": self.objective,
            "microbatches": self.microbatches,
            "schedule": self.schedule if self.microbatches is not None else None,
        }


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
    # Why the model fits no placement, made by the first placer that finds none (no_fit_error).
    no_fit: NoFit | None = field(default=None, repr=False)

    @property
    def lower_bound_us(self) -> float:
        """The best lower bound known on any plan's step time (:mod:`baechi_cli.evaluator.bounds`)."""
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
            found = self.variants[options] = optimization_passes(
                self.graph, self.devices, options, {"forward_only": reason}
            )
        return found

    def judge(self, placement: Placement, known: Evaluation | None = None) -> Evaluation:
        """``evaluate()`` of a placement of ``graph``'s ops, remembered.

        ``known``: that evaluation, when the caller already ran it (refinement does).
        """
        key = placement_key(placement)
        found = self.judged.get(key)
        if found is None:
            found = self.judged[key] = known or evaluate(
                self.graph, self.devices, placement, timer=self.timer
            )
        return found

    def no_fit_error(self, failed: InfeasibleError) -> InfeasibleError:
        """The model's error when a placer that respects memory found no placement (``failed``).

        :class:`~baechi_cli.placers.memory.NoFit`: the group, op or pair that
        fits no device, what it needs and what would fit it; else ``failed``
        with the op that needs the most and the model's one-device peak
        against the devices' total memory. Worked out once per problem.
        """
        from baechi_cli.placers.memory import NoFit
        from baechi_cli.placers.single import largest_device

        if self.no_fit is None:
            single = Placement([largest_device(self.devices)] * self.graph.num_ops)
            self.no_fit = NoFit.of(
                self.graph, self.devices, lambda: max(self.judge(single).timeline.peak_bytes)
            )
        return self.no_fit.error(failed)


def placement_key(placement: Placement) -> tuple:
    return (tuple(placement.device_of), None if placement.sequence is None else tuple(placement.sequence))


@dataclass(frozen=True)
class TrainingInfo:
    """What ``--training`` added to a forward-only model (the report's ``training``)."""

    optimizer: str
    backward_ops: int
    loss_ops: int
    update_ops: int
    optimizer_state_bytes: int
    traced: bool = False  # the step is the framework's own trace (a .pt2's autograd), not synthesized

    def to_json(self) -> dict[str, Any]:
        from baechi_cli.passes.training import BACKWARD_MULTIPLIER, OPTIMIZER_SLOTS

        out: dict[str, Any] = {
            "optimizer": self.optimizer,
            "source": "traced by autograd" if self.traced else "synthesized",
            "backward_ops": self.backward_ops,
            "loss_ops": self.loss_ops,
            "update_ops": self.update_ops,
            "optimizer_slots": OPTIMIZER_SLOTS[self.optimizer],
            "optimizer_state_bytes": self.optimizer_state_bytes,
        }
        if not self.traced:  # a traced step's backward ops are costed by their own rules
            out["backward_multipliers"] = BACKWARD_MULTIPLIER
        return out


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


# What a placer is told each device holds when memory need not be counted.
AMPLE_MEMORY = 2**62


@dataclass(frozen=True)
class _Attempt:
    """What a placer is given on one try of :func:`run_candidate`: the graph and each device's memory.

    ``premise`` is forward-only placement's: every device holds the whole model, so the placer is
    told memory is ample (:data:`AMPLE_MEMORY`); otherwise it is told ``budget``.
    """

    graph: OpGraph
    expands_sequence: bool
    premise: bool
    budget: list[int]

    @staticmethod
    def first(variant: Variant, spec: PlacerSpec, capacity: list[int]) -> _Attempt:
        """The variant's placement graph; without forward-only placement for a placer that needs every edge."""
        premise = variant.without_forward_only is not None and spec.respects_memory
        if premise and spec.needs_every_edge:
            assert variant.without_forward_only is not None
            return _Attempt(variant.without_forward_only(), True, False, capacity)
        return _Attempt(variant.placement_graph, variant.expands_sequence, premise, capacity)

    def told(self, devices: DeviceSpec) -> DeviceSpec:
        """The devices as the placer is told them on this attempt."""
        return devices.with_memory([AMPLE_MEMORY] * devices.count if self.premise else self.budget)

    def after_over_memory(
        self, variant: Variant, spec: PlacerSpec, peak_bytes: list[int], capacity: list[int]
    ) -> _Attempt | None:
        """The next attempt after the evaluator found this one's placement over memory; None: give up.

        A placer that makes no memory promise (and no budget retries) gives up: over memory is the
        model's infeasibility. Under forward-only's premise, the premise was wrong: place the graph
        without forward-only placement. Otherwise cut the budget by the excess (``cut_budget``).
        """
        from baechi_cli.placers.memory import cut_budget

        if not (spec.respects_memory or spec.budget_retries):
            return None
        if self.premise:
            assert variant.without_forward_only is not None
            return _Attempt(variant.without_forward_only(), True, False, self.budget)
        cut = cut_budget(self.budget, peak_bytes, capacity)
        return None if cut is None else replace(self, budget=cut)


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
    (one device), over memory is the model's infeasibility. When a placer that
    respects memory finds no placement, its error becomes the model's
    (:meth:`Prepared.no_fit_error`), so every such placer names what does not fit.
    """
    from baechi_cli.placers.memory import MEMORY_ATTEMPTS

    graph, devices = prepared.graph, prepared.devices
    variant = variant or prepared.variant
    capacity = [d.memory_bytes for d in devices.devices]
    attempt = _Attempt.first(variant, spec, capacity)
    t0 = time.perf_counter()
    for _ in range(MEMORY_ATTEMPTS):
        try:
            placement = spec.place(
                attempt.graph, attempt.told(devices), placer_options or options.placer_options(spec)
            )
        except (InfeasibleError, SolverError) as err:
            seconds = time.perf_counter() - t0
            error = err.with_path(prepared.path)
            if isinstance(error, InfeasibleError) and spec.respects_memory:
                error = prepared.no_fit_error(error)
            return Candidate(spec.name, seconds, error=error, variant=variant.options)
        except InputError as err:  # a graph the placer refuses (exact's size guard): the user's to fix
            if attempt.graph is not variant.placement_graph:  # the passes line counted another graph
                err.problem += (
                    f" without forward-only placement, which {spec.name} turns off to see every edge "
                    f"(the other placers see {variant.placement_graph.num_ops:,})"
                )
            raise err.with_path(prepared.path) from None
        if attempt.graph is not graph:
            placement = expand(placement, attempt.graph, graph, attempt.expands_sequence)
        evaluation = scheduled_memory(prepared.judge(placement), placement)
        if evaluation.feasible:
            break
        next_attempt = attempt.after_over_memory(variant, spec, evaluation.timeline.peak_bytes, capacity)
        if next_attempt is None:
            break
        attempt = next_attempt
    seconds = time.perf_counter() - t0
    if not evaluation.feasible:
        error = over_memory(evaluation.timeline, graph, devices, prepared.path)
        if spec.respects_memory:
            error = prepared.no_fit_error(error)
        return Candidate(spec.name, seconds, error=error, variant=variant.options)
    # Judged now: the placer's own list schedule (every planned transfer and time,
    # hundreds of MB at 1M ops) is dropped, since auto keeps every candidate.
    placement.schedule = None
    return Candidate(spec.name, seconds, placement, evaluation, variant=variant.options)


def schedule_devices(pipeline: dict[str, Any]) -> list[int]:
    """The device of each entry of a pipeline section's per-device schedule lists (``peak_bytes``,
    ``bubble_fraction``): the devices in order under a schedule of several stages per device, else
    each stage's device. O(stages).

    >>> schedule_devices({"stages": [{"device": 1}, {"device": 0}], "schedule": {"devices": None}})
    [1, 0]
    >>> schedule_devices({"stages": [{"device": 0}, {"device": 1}, {"device": 1}, {"device": 0}], "schedule": {"devices": 2}})
    [0, 1]
    """
    devices = pipeline["schedule"].get("devices")
    return list(range(devices)) if devices else [stage["device"] for stage in pipeline["stages"]]


def scheduled_memory(evaluation: Evaluation, placement: Placement) -> Evaluation:
    """``evaluation`` with a pipeline plan's peak per device as its schedule holds it.

    The evaluator runs the minibatch as one unpipelined step, with every microbatch's activations
    alive at once; a pipeline schedule holds only those in flight (1F1B: at most one per later
    stage), which is what runs and what ``baechi verify --torch`` measures. So a pipeline plan's
    peaks, and whether it fits, are its simulated schedule's (``pipeline.schedule.peak_bytes``:
    per device under a schedule of several stages per device, else per stage); any other
    evaluation is returned as it is. O(devices).

    >>> from baechi_cli.evaluator.sim import SimResult
    >>> sim = SimResult([0, 1], [0.0] * 2, [1.0] * 2, [[0], [1]], [], 1.0, [1.0, 1.0], [900, 700], [0, 0], [[], []], [800, 800])
    >>> info = {"pipeline": {"stages": [{"device": 1}, {"device": 0}], "schedule": {"peak_bytes": [300, 750]}}}
    >>> judged = scheduled_memory(Evaluation("makespan", 1.0, sim), Placement([0, 1], info=info))
    >>> judged.timeline.peak_bytes, judged.feasible
    ([750, 300], True)
    """
    pipeline = (placement.info or {}).get("pipeline") or {}
    schedule = pipeline.get("schedule")
    if not schedule or not schedule.get("peak_bytes"):
        return evaluation
    peaks = list(evaluation.timeline.peak_bytes)
    for d, nbytes in zip(schedule_devices(pipeline), schedule["peak_bytes"], strict=True):
        peaks[d] = nbytes
    return replace(evaluation, timeline=replace(evaluation.timeline, peak_bytes=peaks))


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
    info = placement.info
    pipeline = info.get("pipeline") if info else None
    if pipeline is not None and "stage_of" in pipeline:  # a pipeline stage per node: per op
        stage_of = placement_of(pgraph, pipeline["stage_of"], graph.num_ops)
        info = {**info, "pipeline": {**pipeline, "stage_of": stage_of}}
    return Placement(
        placement_of(pgraph, placement.device_of, graph.num_ops),
        sequence,
        schedule=placement.schedule,
        info=info,
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
