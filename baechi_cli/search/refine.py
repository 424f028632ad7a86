"""Local-search refinement of a placement, judged by the simulator.

Placeto's idea (move ops, ask a simulator whether the step got faster) as a deterministic hill
climb that takes seconds, not hours of reinforcement learning. The search moves *units*, the
colocation groups, in families (:class:`_RefineSearch`): name-scope clusters, pipeline splits, moves
off the critical path of the current schedule, single units. Passes go coarse to fine and take
the first improvement, a seeded kick leaves a local optimum, and the best placement seen wins.
Candidates are timed by :meth:`baechi_cli.evaluator.sim.StepTimer.step_time` (the evaluator's
engine without memory); an improvement's memory is checked before it is taken.

Contract of :func:`refine` (``graph`` as the evaluator sees it, ``graph.group`` its hard
colocation groups; ``start`` a placement of it that keeps every group whole):

* the result keeps every group whole; its evaluation (:func:`baechi_cli.evaluator.evaluate.evaluate`)
  is within memory whenever the start's is, and its value is at most the start's evaluated
  value: the start itself (the same object) when nothing better was found;
* it is a function of (graph, devices, start, max_evaluations, seed): the budget counts fast
  evaluations (a memory check counts as three; the last improvement's check may overrun the
  budget by three), no decision reads a clock, and ``seed`` only draws the kicks;
* a start with a ``sequence`` keeps it as one global order or drops it for the evaluator's
  dispatch rule, whichever runs the start faster.

Complexity: O(V + E) per scope depth to build the clusters; each evaluation O((V + E) log V)
(:func:`evaluation_cost` predicts its seconds); ranking a pass is linear in the candidate
clusters and their boundaries (each computed once, on first use).

Example: two independent chains on one device; the search splits them.

    >>> from baechi_cli.core.graph import GraphBuilder
    >>> from baechi_cli.core.devices import parse_devices
    >>> from baechi_cli.evaluator.placement import Placement
    >>> b = GraphBuilder()
    >>> for chain in "ab":
    ...     x = b.add_op(f"{chain}/x", "MatMul", [100], compute_us=100)
    ...     y = b.add_op(f"{chain}/y", "MatMul", [100], compute_us=100)
    ...     _ = b.add_edge(x, y)
    >>> r = refine(b.build(), parse_devices("2x1GB"), Placement([0] * 4), max_evaluations=50)
    >>> r.start_value_us, r.evaluation.value_us, r.placement.device_of
    (400.0, 200.0, [1, 1, 0, 0])
"""

from __future__ import annotations

import functools
import math
import random
import re
import time
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.graph import OpGraph
from baechi_cli.evaluator.evaluate import Evaluation, device_order, evaluate, judged
from baechi_cli.evaluator.placement import Placement
from baechi_cli.evaluator.sim import StepTimer, Timing
from baechi_cli.placers.memory import ample, safe_peaks

# Seconds per fast evaluation per op and edge, the search's own work (ranking, memory checks,
# building candidates) included: calibrated on the four reference graphs (bench/history/placement.md).
SECONDS_PER_ELEMENT = 1.5e-6
# What setting the search up costs, in evaluations: each unit's compute and transfers, the
# clusters, and the first pass's ranking (each big cluster's boundary is found on first
# use). Calibrated on the reference graphs (bench/history/placement.md).
SETUP_EVALUATIONS = 5
# Pipeline splits: ranges of 1/2, 1/4, ... of the compute down to 1/MAX_SPLIT,
# and suffixes from multiples of 1/CUT_STEPS on.
MAX_SPLIT = 16
CUT_STEPS = 16
# Critical-path moves per pass: the longest waits and the transfers on the chain.
CRITICAL_WAITS = 8
CRITICAL_TRANSFERS = 8
# Ranking: the transfer time a move adds counts at this weight against the compute it
# balances; most of it overlaps compute (a pipeline crosses its cut once per step,
# but its critical path only at the ends).
COMM_WEIGHT = 0.25
# Coarse to fine: the pass of level i ranks the clusters holding at least LEVELS[i] of
# the compute (the last, 0, takes every unit); a pass that does not improve hands over
# to the next level, cyclically.
LEVELS = (1 / 32, 1 / 256, 1 / 2048, 0.0)
# A pass times at most max(MIN_PASS, budget / PASS_SHARE) moves before the next level's turn.
MIN_PASS = 16
PASS_SHARE = 8
# Families of moves, in the order that breaks ties between them.
FAMILIES = {
    "critical transfer": "critical",
    "critical wait": "critical",
    "swap": "critical",
    "scope+": "scope",
    "scope": "scope",
    "split": "split",
    "unit": "unit",
}
# A family's estimates are trusted as far as they came true, starting from this share
# of the step time saved for free (so one failure does not condemn a family).
TRUST_PRIOR = 0.002
# What a memory check (a full evaluation) is charged, in evaluations.
MEMORY_CHECK_COST = 3
# A move is timed with its trace kept (StepTimer.timing, a little dearer than step_time) while
# more than this share of the moves tried so far (plus one taken, of two, as a prior) were
# taken: a move taken then needs no second run for its memory check and critical path.
TRACE_WHEN_TAKEN = 0.15
# A cluster's boundary is found in numpy, straight into the flat form its transfers are summed
# from, when its units' tensors (made and used) number more than this: below it a Python loop
# is cheaper than the numpy steps' fixed cost.
VECTOR_BOUNDARY = 1000
# Where a cluster is (:meth:`_RefineSearch._where`) is found in numpy when it has more units than
# this, its transfers when its boundary has more tensors (where numpy's fixed cost pays).
# Both ways add the same floats in the same order, so they give the
# same estimates to the last bit.
VECTOR_MIN = 250
# Random kicks at a local optimum are drawn among this many least-bad moves.
KICK_CHOICES = 4

_GRADIENT_SCOPE = re.compile(r"gradients(_\d+)?")
_DIGITS = re.compile(r"\d+")


@dataclass
class Refined:
    """A refined placement, its evaluation, and what the search spent."""

    placement: Placement  # device_of over the graph's ops (+ sequence when the start's order is kept)
    evaluation: Evaluation  # evaluate(graph, devices, placement): the real evaluator's judgement
    start_value_us: float  # the start placement's evaluated value
    evaluations: int  # fast evaluations spent (StepTimer runs; a memory check counts as three)
    moves_tried: int
    moves_accepted: int  # improving moves taken (a kick is not one)
    seconds: float
    kicks: int = 0  # non-improving moves taken at local optima
    full_evaluations: int = 0  # full evaluator runs: the start's (unless given), memory checks, the result's
    memory_checks: int = 0  # improvements whose memory was counted (a full evaluation)
    kept_sequence: bool = False  # whether the start's order was kept
    # It stopped at a local optimum with budget left (``stop_at_local_optimum``, or no kick fits).
    stalled: bool = False
    history: list[tuple[int, float, str]] = field(default_factory=list)  # (evaluations, value, move kind)

    @property
    def improvement(self) -> float:
        """Fraction of the start's step time saved."""
        return 1.0 - self.evaluation.value_us / self.start_value_us if self.start_value_us else 0.0


def evaluation_cost(graph: OpGraph) -> float:
    """Predicted seconds per fast evaluation of ``graph``: a constant times (V + E).

    Depends on the graph's size alone, so a caller turns a budget in seconds
    into a deterministic ``max_evaluations``.
    """
    return SECONDS_PER_ELEMENT * (graph.num_ops + graph.num_edges)


def refine(
    graph: OpGraph,
    devices: DeviceSpec,
    start: Placement,
    *,
    max_evaluations: int,
    seed: int = 0,
    start_evaluation: Evaluation | None = None,
    timer: StepTimer | None = None,
    stop_at_local_optimum: bool = False,
) -> Refined:
    """Improve ``start`` by local search within ``max_evaluations`` fast evaluations (module docstring).

    ``start_evaluation``, when the caller has it, is ``evaluate(graph, devices,
    start)`` (a full evaluation saved); ``timer`` a StepTimer of ``graph`` on
    ``devices`` (one built saved). ``stop_at_local_optimum``: where the climb
    would kick, stop instead (``Refined.stalled``), so that a caller can spend
    the rest on another start. ValueError when ``start`` does not cover the
    graph or splits a group.
    """
    t0 = time.perf_counter()
    search = _RefineSearch(graph, devices, start, seed, start_evaluation, timer)
    stalled = search.run(max_evaluations, kick=not stop_at_local_optimum)
    placement, evaluation = search.result()
    return Refined(
        placement=placement,
        evaluation=evaluation,
        start_value_us=search.start_value,
        evaluations=search.evaluations,
        moves_tried=search.tried,
        moves_accepted=search.accepted,
        seconds=time.perf_counter() - t0,
        kicks=search.kicks,
        full_evaluations=search.full_evaluations,
        memory_checks=search.memory_checks,
        kept_sequence=search.sequence is not None,
        stalled=stalled,
        history=search.history,
    )


@dataclass
class _Cluster:
    """Units that move together, with what ranking their moves needs (fixed for the whole search)."""

    kind: str  # unit | scope | scope+ | split
    label: str  # the scope, the range of the order, the unit's first op
    units: tuple[int, ...]
    comp: list[float]  # per device kind (_RefineSearch.kind_of): the units' compute on it
    # Tensors crossing the cluster's edge: (tensor, made inside?, outside units: the
    # consumers, after the producer when it is made outside). A big cluster's is only flat.
    boundary: list[tuple[int, bool, list[int]]] | None = None
    # For big clusters, in numpy (made on first use): the units, and the boundary flat (per
    # outside unit: its tensor's index in the boundary) with each tensor's µs and made-inside flag.
    units_array: np.ndarray | None = None
    flat: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None


@dataclass
class _Where:
    """Where a cluster is: for ranking its moves (:meth:`_RefineSearch._where`)."""

    devices: set[int]
    share: dict[int, float]  # its compute on each of those devices
    main: int  # the device holding most of it
    # Transfer µs across its edge were it all on device d: ``total - there_too.get(d, 0.0)``,
    # kept so because only the devices its outside neighbours are on differ from ``total``.
    total: float
    there_too: dict[int, float]

    def transfers(self, d: int) -> float:
        return self.total - self.there_too.get(d, 0.0)


@dataclass
class _Move:
    """Units to put on a device (or each on its own: ``targets``); ``score`` estimates the µs saved."""

    kind: str
    label: str
    units: tuple[int, ...]
    target: int
    targets: tuple[int, ...] | None = None  # per unit, for swaps
    key: tuple = ()  # identifies the move across passes
    score: float = 0.0

    def device(self, i: int) -> int:
        return self.target if self.targets is None else self.targets[i]


def scope_keys(name: str, levels: dict[tuple[str, ...], list[str]] | None = None) -> list[str]:
    """The scopes an op's name lies under, with one numbered level wildcarded in turn.

    ``gradients/`` (TensorFlow's backward scope) is stripped, so a gradient op
    shares its forward op's scopes. ``a/step3/b/MatMul`` gives ``a``,
    ``a/step3``, ``a/step*``, ``a/step3/b``, ``a/step*/b`` and ``a/step3/b``
    with ``b`` unchanged (it has no digits).

        >>> scope_keys("gradients/dec/step3/softmax/MatMul_grad/MatMul")
        ['dec', 'dec/step3', 'dec/step*', 'dec/step3/softmax', 'dec/step*/softmax', 'dec/step3/softmax/MatMul_grad', 'dec/step*/softmax/MatMul_grad']
        >>> scope_keys("/encoder/layer.0/attention/MatMul")
        ['encoder', 'encoder/layer.0', 'encoder/layer.*', 'encoder/layer.0/attention', 'encoder/layer.*/attention']

    ``levels``, when given, remembers each depth's keys by the scope down to it:
    names that share a scope's prefix (every op of a layer, every layer of a
    network) build its keys once.
    """
    parts = [p for p in name.split("/") if p]
    while parts and _GRADIENT_SCOPE.fullmatch(parts[0]):
        parts = parts[1:]
    scope = tuple(parts[:-1])
    if levels is None:
        levels = {}
    keys: list[str] = []
    level: list[str] = []  # the keys of the scope one level up
    for depth in range(1, len(scope) + 1):
        prefix = scope[:depth]
        known = levels.get(prefix)
        if known is None:
            # The parent's keys, each extended by this part, then the parent with this
            # part wildcarded: O(keys) per new scope, not O(depth^2).
            part = prefix[-1]
            wild = _wildcard(part)
            known = [f"{key}/{part}" for key in level] if level else [part]
            if wild != part:
                known.append(f"{level[0]}/{wild}" if level else wild)
            levels[prefix] = known
        level = known
        keys.extend(level)
    return keys


@functools.lru_cache(maxsize=1 << 16)
def _wildcard(part: str) -> str:
    """A name part with each run of digits replaced by ``*`` (``layer.12`` -> ``layer.*``)."""
    return _DIGITS.sub("*", part)


class _RefineSearch:
    """The state of one refinement: units, their devices, the candidate moves and the budget.

    A move puts a set of units on a device. Families:

    * ``scope``: name-scope clusters, the units with an op under a scope prefix, at every depth
      (``gradients/`` stripped, so a layer's backward ops go with it), and the same with one
      numbered level wildcarded (``decoder/step*/softmax``: one module across all time steps),
      each also *closed*: joined, repeatedly, by every outside unit that exchanges more transfer
      time with it than with the rest (a layer's weights, its gradient sum, its optimizer update).
      A scope is closed when a pass first ranks clusters of its size, not all up front;
    * ``split``: pipeline splits, ranges of 1/2 to 1/:data:`MAX_SPLIT` of the compute along a
      topological order of the units, plain and with each backward op at its forward op's
      position, and every suffix from a multiple of 1/:data:`CUT_STEPS` on;
    * ``critical``: from the chain of ops and transfers that ends last: for a transfer on it, the
      producer's unit joins the consumer's device and vice versa; an op that waited for its busy
      device, and the op that kept it busy, go to the device idle longest then, or swap;
    * ``unit``: one unit to another device.

    Ranking: a move's estimate is the compute it balances less :data:`COMM_WEIGHT` of the transfer
    time it adds (most of it overlaps compute); a critical move's is at least what it could take
    off the chain. A pass ranks the clusters holding at least a share :data:`LEVELS` of the
    compute, times at most max(:data:`MIN_PASS`, budget / :data:`PASS_SHARE`) moves, and hands over
    to the next level unless it improved. The next move comes from the family that promises most
    per evaluation (µs saved plus its next estimate, discounted by how far its estimates came
    true, over moves tried plus one): on a recurrent network the budget goes to scope moves, on a
    CNN to critical moves. The first improvement is taken once its memory is checked (an upper
    bound, else the evaluator). When every level was swept without improving, a seeded kick takes
    one of the :data:`KICK_CHOICES` least-bad moves. On alike devices without per-link overrides,
    empty devices are interchangeable: a move targets only the first empty one.
    """

    def __init__(
        self,
        graph: OpGraph,
        devices: DeviceSpec,
        start: Placement,
        seed: int,
        start_evaluation: Evaluation | None,
        timer: StepTimer | None = None,
    ) -> None:
        n = graph.num_ops
        if len(start.device_of) != n:
            raise ValueError(f"placement covers {len(start.device_of)} ops, graph has {n}")
        self.graph = graph
        self.devices = devices
        self.ndev = devices.count
        self.rng = random.Random(seed)
        if timer is not None:
            timer.check_serves(graph, devices)
        self.timer = timer or StepTimer(graph, devices)
        # One unit per colocation group, in order of the group's first op.
        self.unit_ops: list[list[int]] = list(graph.group_members().values())
        self.unit_of = [0] * n
        for u, ops in enumerate(self.unit_ops):
            for v in ops:
                self.unit_of[v] = u
        self.dev = [start.device_of[ops[0]] for ops in self.unit_ops]
        if any(start.device_of[v] != self.dev[self.unit_of[v]] for v in range(n)):
            raise ValueError("the start placement splits a colocation group")
        self.device_of = list(start.device_of)
        self.evaluations = 0
        self.full_evaluations = 0
        self.tried = 0
        self.accepted = 0
        self.kicks = 0
        self.memory_checks = 0
        self.history: list[tuple[int, float, str]] = []
        self.memory_free = ample(graph, devices)
        self.limits = [d.memory_bytes for d in devices.devices]
        # The last memory check: the order it ran under and the evaluator's judgement, and
        # (placement, order, timing) of its run.
        self.checked: tuple[list[int] | None, Evaluation] | None = None
        self.traced: tuple[list[int], list[int] | None, Timing] | None = None

        self.start_placement = start
        if start_evaluation is None:
            start_evaluation = evaluate(graph, devices, start, timer=self.timer)
            self.full_evaluations += 1
        self.start_eval = start_evaluation
        self.start_value = self.start_eval.value_us
        self.value = self.start_value
        # Keep the start's order or drop it, whichever runs faster (and fits).
        self.sequence: list[int] | None = None if start.sequence is None else list(start.sequence)
        dropped = False
        if start.sequence is not None:
            free = self._time(self.device_of, None, keep=True)
            if free < self.start_value and self._fits(self.device_of, None):
                self.sequence, self.value, dropped = None, free, True
        # The first pass walks the critical path of the start's run: the free order's, kept
        # by _time, or else the judge's, when StepTimer made it.
        judges = self.start_eval.timeline.trace
        if not dropped and judges is not None:
            self.traced = (self.device_of, self.sequence, judges)
        self.best_dev = list(self.dev)
        self.best_value = self.value
        self.seen: dict[bytes, float] = {}
        self._remember(self.dev, self.value)
        self._build_costs()
        self.clusters: list[_Cluster] = []
        self.found: dict[tuple[int, ...], None] = {}  # the units of every cluster in it
        self.unclosed: list[tuple[str, tuple[int, ...], float]] = []  # scopes: (label, units, compute)
        self.closed_down_to = math.inf  # every scope holding at least this much compute is closed
        self._clusters()
        self.failed: set[tuple] = set()  # moves that did not improve on some state
        # family -> (moves tried, µs they saved, µs their estimates claimed)
        self.family_stats: dict[str, tuple[int, float, float]] = {}
        self.trust_prior = max(TRUST_PRIOR * self.value, 1.0)  # µs; a 0 µs graph still divides

    # ------------------------------------------------------------------ judging

    def _time(self, device_of: list[int], sequence: list[int] | None, keep: bool) -> float:
        """One fast evaluation's step time (inf when ``sequence`` deadlocks); ``keep``: its run
        is kept (as ``traced``) for the memory check and the critical path of the placement,
        should it be taken."""
        self.evaluations += 1
        order = None if sequence is None else device_order(sequence, device_of, self.ndev)
        try:
            if not keep:
                return self.timer.step_time(device_of, order)
            trace = self.timer.timing(device_of, order)
        except ValueError:  # a start sequence that is not topological deadlocks on some placements
            return math.inf
        self.traced = (device_of, sequence, trace)
        return trace.step_time_us

    def _run_of(self, device_of: list[int], sequence: list[int] | None) -> Timing:
        """The run of this placement (these very objects): the one kept, else a new one."""
        traced = self.traced
        if traced is not None and traced[0] is device_of and traced[1] is sequence:
            return traced[2]
        order = None if sequence is None else device_order(sequence, device_of, self.ndev)
        trace = self.timer.timing(device_of, order)
        self.traced = (device_of, sequence, trace)
        return trace

    def _trace(self) -> Timing:
        self.evaluations += 1  # counted even when kept, so that the budget never reads which
        return self._run_of(self.device_of, self.sequence)

    def _fits(self, device_of: list[int], sequence: list[int] | None) -> bool:
        """Within memory: surely by an O(V + E) upper bound, else as the simulator counts it."""
        if self.memory_free or self._bound_fits(device_of):
            return True
        self.memory_checks += 1
        # The evaluator's run, timeline and memory (what evaluate() does); the run is the
        # one that timed the move, when it did.
        self.evaluations += MEMORY_CHECK_COST
        self.full_evaluations += 1
        timeline = self.timer.result(device_of, self._run_of(device_of, sequence))
        self.checked = (sequence, judged(timeline))
        return timeline.feasible

    def _bound_fits(self, device_of: list[int]) -> bool:
        """Within memory by the ledger's count, which bounds the simulator's peak whatever the schedule."""
        return all(p <= m for p, m in zip(safe_peaks(self.graph, device_of, self.ndev), self.limits))

    def _remember(self, dev: list[int], value: float) -> None:
        if self.ndev < 256:
            self.seen[bytes(dev)] = value

    def _known(self, dev: list[int]) -> bool:
        return self.ndev < 256 and bytes(dev) in self.seen

    # ------------------------------------------------------------------ costs for ranking

    def _build_costs(self) -> None:
        """Per-unit compute on each device; the transfer µs between each pair of units that talk."""
        g, devices = self.graph, self.devices
        nunits = len(self.unit_ops)
        kind_index: dict[str, int] = {}
        self.kind_columns: list[list[float]] = []  # per kind, in order of first device: each unit's compute
        self.kind_of: list[int] = []  # per device: its kind's index
        self.comp: list[list[float]] = []  # per device: its kind's column
        for d in devices.devices:
            k = kind_index.get(d.kind)
            if k is None:
                k = kind_index[d.kind] = len(kind_index)
                dur = g.durations(d.kind)
                self.kind_columns.append([sum(map(dur.__getitem__, ops)) for ops in self.unit_ops])
            self.kind_of.append(k)
            self.comp.append(self.kind_columns[k])
        # Empty devices are interchangeable when every device is alike.
        self.homogeneous = len(kind_index) == 1 and not devices.interconnect.links
        ic = devices.interconnect
        t = g.tensors
        unit_of = self.unit_of
        consumers: list[dict[int, None]] = [{} for _ in range(len(t.src))]
        for tid, w in zip(t.edge_tensor, g.edge_dst):
            consumers[tid][unit_of[w]] = None
        # Per tensor: producer unit, the other units consuming it, its transfer µs.
        self.t_prod: list[int] = []
        self.t_cons: list[list[int]] = []
        self.t_len: list[float] = []
        self.made: list[list[int]] = [[] for _ in range(nunits)]  # tensors a unit sends to others
        self.used: list[list[int]] = [[] for _ in range(nunits)]  # tensors a unit gets from others
        # For closing clusters: a tensor counts once per consuming unit, what it costs if that
        # unit is elsewhere (it overcounts a tensor that several units there share).
        adj: list[dict[int, float]] = [{} for _ in range(nunits)]
        made, used, latency, bandwidth = self.made, self.used, ic.latency_us, ic.bandwidth_bytes_per_us
        for tid, (src, m, nbytes, reading) in enumerate(zip(t.src, t.measured_us, t.nbytes, consumers)):
            p = unit_of[src]
            length = m if m is not None else latency + nbytes / bandwidth
            cons = [c for c in reading if c != p]
            self.t_prod.append(p)
            self.t_cons.append(cons)
            self.t_len.append(length)
            if cons:
                made[p].append(tid)
                out = adj[p]
                for c in cons:
                    used[c].append(tid)
                    out[c] = out.get(c, 0.0) + length
                    adj[c][p] = adj[c].get(p, 0.0) + length
        self.adj = adj
        self.degree = [len(m) + len(u) for m, u in zip(self.made, self.used)]
        # For big clusters in numpy: each kind's column, each device's kind, the placement.
        self.kind_array = np.array(self.kind_columns, dtype=np.float64)
        self.kind_of_array = np.array(self.kind_of, dtype=np.int64)
        self.dev_array = np.zeros(0, dtype=np.int64)
        self.dev_array_of: list[int] | None = None
        self.pairs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # for _boundary_flat
        self.total_compute = sum(self.comp[0])
        self.adj_total = [sum(a.values()) for a in adj]

    # ------------------------------------------------------------------ structural clusters

    def _add(self, kind: str, label: str, key: tuple[int, ...], comp: list[float] | None = None) -> None:
        """Append a cluster of more than one unit and fewer than all, unless one holds those units
        (``comp``: its compute per kind, when the caller summed it)."""
        if 1 < len(key) < len(self.unit_ops) and key not in self.found:
            self.found[key] = None
            if comp is None:
                comp = [sum(map(c.__getitem__, key)) for c in self.kind_columns]
            self.clusters.append(_Cluster(kind, label, key, comp))

    def _close_scopes(self, level: int) -> None:
        """Close the scopes that hold at least ``LEVELS[level]`` of the compute, not closed yet.

        Closing every scope up front takes most of the search's setup, while a coarse pass
        ranks only the big ones (bench/history/placement.md).
        """
        least = LEVELS[level] * self.total_compute
        if least >= self.closed_down_to:
            return  # every scope this big is closed already
        self.closed_down_to = least
        waiting = []
        for label, units, comp in self.unclosed:
            if comp < least:
                waiting.append((label, units, comp))
                continue
            members = self._close(units)
            if len(members) > len(units):
                self._add("scope+", label + " (closed)", tuple(sorted(members)))
        self.unclosed = waiting

    def _clusters(self) -> None:
        """Units, name-scope clusters and pipeline splits, deduplicated; each scope closed later,
        when a pass first ranks clusters of its size (:meth:`_close_scopes`)."""
        g = self.graph
        nunits = len(self.unit_ops)
        add = self._add

        for u, ops in enumerate(self.unit_ops):
            comp = [c[u] for c in self.kind_columns]
            self.clusters.append(_Cluster("unit", g.names[ops[0]], (u,), comp))

        # The units under each scope head (a name less its last part), heads in order of first op:
        # the ops of one head share their scopes, so each head's keys are computed once.
        heads: dict[str, tuple[str, dict[int, None]]] = {}  # head -> (its first op's name, units)
        for name, u in zip(g.names, self.unit_of):
            head = name.rpartition("/")[0]
            under = heads.get(head)
            if under is None:
                heads[head] = (name, {u: None})
            else:
                under[1][u] = None
        scopes: dict[str, dict[int, None]] = {}  # in order of first op, as the keys of each first appear
        levels: dict[tuple[str, ...], list[str]] = {}
        for name, units in heads.values():
            for key in scope_keys(name, levels):
                into = scopes.get(key)
                if into is None:
                    scopes[key] = dict(units)
                else:
                    into.update(units)
        distinct: dict[tuple[int, ...], str] = {}  # many scopes hold the same units: the first names them
        for key, units in scopes.items():
            distinct.setdefault(tuple(sorted(units)), key)
        first_kind = self.kind_of[0]  # device 0's, whose column weighs the scopes
        for units, label in distinct.items():
            comp = [sum(map(c.__getitem__, units)) for c in self.kind_columns]
            add("scope", label, units, comp)
            self.unclosed.append((label, units, comp[first_kind]))

        # Pipeline splits over a topological order of the units; a backward op counts at
        # its forward op's position, so a split takes a layer's backward pass along.
        rank = self.timer.rank
        pos_plain = [g.num_ops] * nunits
        pos_fwd = [g.num_ops] * nunits
        for v in range(g.num_ops):
            u = self.unit_of[v]
            pos_plain[u] = min(pos_plain[u], rank[v])
            f = g.forward_op[v]
            pos_fwd[u] = min(pos_fwd[u], rank[f] if f >= 0 else rank[v])
        weight = self.comp[0]
        total = sum(weight) or 1.0
        for name, pos in (("forward order", pos_fwd), ("topological order", pos_plain)):
            order = sorted(range(nunits), key=lambda u: (pos[u], u))
            cum: list[float] = []  # the share of compute before each unit of the order
            acc = 0.0
            for u in order:
                cum.append(acc / total)
                acc += weight[u]

            def span(
                lo: float, hi: float, order: list[int] = order, cum: list[float] = cum
            ) -> tuple[int, ...]:
                return tuple(sorted(order[bisect_left(cum, lo) : bisect_left(cum, hi)]))

            k = 2
            while k <= MAX_SPLIT and k <= nunits:
                for i in range(k):
                    add("split", f"{name} {i + 1}/{k}", span(i / k, (i + 1) / k if i + 1 < k else 2.0))
                k *= 2
            if pos is pos_fwd:  # pipeline cuts: everything after it goes elsewhere
                for j in range(1, CUT_STEPS):
                    add("split", f"{name} after {j}/{CUT_STEPS}", span(j / CUT_STEPS, 2.0))

    def _close(self, units: Sequence[int]) -> list[int]:
        """``units`` joined by every outside unit that exchanges more with them than with the rest,
        repeatedly. O(sum of the degrees of the units visited)."""
        adj, total = self.adj, self.adj_total
        inside = set(units)
        w_in: dict[int, float] = {}
        for x in units:
            for y, w in adj[x].items():
                if y not in inside:
                    w_in[y] = w_in.get(y, 0.0) + w
        members = list(units)
        queue = deque(sorted(w_in))
        while queue:
            y = queue.popleft()
            if y in inside or 2 * w_in[y] <= total[y]:
                continue
            inside.add(y)
            members.append(y)
            for z, w in adj[y].items():
                if z not in inside:
                    w_in[z] = w_in.get(z, 0.0) + w
                    queue.append(z)
        return members

    def _boundary(self, units: Sequence[int]) -> list[tuple[int, bool, list[int]]]:
        """The tensors crossing the edge of ``units`` (:attr:`_Cluster.boundary`)."""
        t_prod, t_cons = self.t_prod, self.t_cons
        if len(units) == 1:
            (u,) = units
            return [(tid, True, t_cons[tid]) for tid in self.made[u]] + [
                (tid, False, [t_prod[tid], *(c for c in t_cons[tid] if c != u)]) for tid in self.used[u]
            ]
        inside = set(units)
        out: list[tuple[int, bool, list[int]]] = []
        seen: set[int] = set()
        for u in units:
            for tid in self.made[u]:
                others = [c for c in t_cons[tid] if c not in inside]
                if others:
                    out.append((tid, True, others))
            for tid in self.used[u]:
                p = t_prod[tid]
                if p not in inside and tid not in seen:
                    seen.add(tid)
                    out.append((tid, False, [p, *(c for c in t_cons[tid] if c not in inside)]))
        return out

    def _boundary_flat(self, units: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_boundary` of a big cluster as :attr:`_Cluster.flat` holds it, built in numpy:
        O(P) steps over the P (tensor, consuming unit) pairs of the graph, no list in between.

        The tensors come in the loop's order: it visits the units in order, each one's
        tensors made (by id) before its tensors used, so a tensor made inside sorts by (its
        producer, 0, id), one made outside by (its first consumer inside, 1, id). Each
        tensor's outside units (its consumers there, and its producer when that is outside)
        are a set to :meth:`_transfers_vectorized`, so their order is left as it falls.
        """
        if self.pairs is None:
            t_cons = self.t_cons
            tensor = np.fromiter((t for t, cons in enumerate(t_cons) for _ in cons), dtype=np.int64)
            consumer = np.fromiter((c for cons in t_cons for c in cons), dtype=np.int64)
            self.t_prod_array = np.array(self.t_prod, dtype=np.int64)
            self.t_len_array = np.array(self.t_len, dtype=np.float64)
            self.pairs = tensor, consumer, self.t_prod_array[tensor]
        tensor, consumer, producer = self.pairs
        inside = np.zeros(len(self.unit_ops), dtype=bool)
        inside[np.fromiter(units, dtype=np.int64, count=len(units))] = True
        made_in, used_in = inside[producer], inside[consumer]
        made = made_in & ~used_in  # a tensor made inside, read outside
        used = used_in & ~made_in  # one made outside, read inside
        unit = np.concatenate((producer[made], consumer[used]))
        flag = np.concatenate(
            (np.zeros(np.count_nonzero(made), np.int8), np.ones(np.count_nonzero(used), np.int8))
        )
        tid = np.concatenate((tensor[made], tensor[used]))
        ranked = np.lexsort((tid, flag, unit))
        # Each tensor once, at its first (least) key; then back in key order.
        _, first = np.unique(tid[ranked], return_index=True)
        ranked = ranked[np.sort(first)]
        tids, made_outside = tid[ranked], flag[ranked] == 1
        position = np.full(len(self.t_cons), -1, dtype=np.int64)
        position[tids] = np.arange(len(tids), dtype=np.int64)
        # The units outside reading each boundary tensor, and the producers outside.
        outside = ~used_in & (position[tensor] >= 0)
        index = np.concatenate((position[tensor[outside]], np.flatnonzero(made_outside)))
        units_outside = np.concatenate((consumer[outside], self.t_prod_array[tids[made_outside]]))
        return index, units_outside, self.t_len_array[tids], ~made_outside

    # ------------------------------------------------------------------ candidates

    def _structural(self, loads: list[float], level: int) -> list[_Move]:
        """Every cluster holding at least ``LEVELS[level]`` of the compute to every device worth
        trying, scored (class docstring)."""
        dev, ndev = self.dev, self.ndev
        used = [False] * ndev
        for d in dev:
            used[d] = True
        first_empty = next((d for d in range(ndev) if not used[d]), -1)
        # When every device is alike the first empty one stands for all: the others would
        # score the same (and thousands of idle devices cost nothing per cluster).
        targets = sorted({*dev, first_empty} - {-1}) if self.homogeneous else range(ndev)
        least = LEVELS[level] * self.total_compute
        moves: list[_Move] = []
        self._close_scopes(level)
        for i, cl in enumerate(self.clusters):
            if cl.comp[0] < least:  # on device 0's kind, the first
                continue
            where: _Where | None = None
            for b in targets:
                if where is None:
                    where = self._where(cl)
                if len(where.devices) == 1 and b in where.devices:
                    continue
                score = self._estimate(cl, b, loads, where)
                moves.append(_Move(cl.kind, cl.label, cl.units, b, key=(i, b), score=score))
        return moves

    def _where(self, cl: _Cluster) -> _Where:
        """Where ``cl`` is now: its devices, its compute on each, its main device, its transfers."""
        dev, comp = self.dev, self.comp
        devices = {dev[u] for u in cl.units}
        share: dict[int, float] = {}
        if len(devices) == 1:
            a = next(iter(devices))
            share[a] = cl.comp[self.kind_of[a]]
        else:
            if len(cl.units) > VECTOR_MIN:
                # The same sums: bincount adds each device's shares in the units' order.
                if cl.units_array is None:
                    cl.units_array = np.array(cl.units, dtype=np.int64)
                on = self._dev_array()[cl.units_array]
                sums = np.bincount(
                    on, weights=self.kind_array[self.kind_of_array[on], cl.units_array]
                ).tolist()
                share = {d: sums[d] for d in devices}
            else:
                for u in cl.units:
                    share[dev[u]] = share.get(dev[u], 0.0) + comp[dev[u]][u]
            a = max(devices, key=lambda d: (share[d], -d))
            if share[a] <= 0.0:  # no compute anywhere: every device ties at 0, the first wins
                a = 0
        return _Where(devices, share, a, *self._transfers(cl))

    def _estimate(self, cl: _Cluster, b: int, loads: list[float], where: _Where | None = None) -> float:
        """µs that moving ``cl`` to device ``b`` might save: the compute it balances between the
        devices it touches, less :data:`COMM_WEIGHT` times the transfer time it adds."""
        if where is None:
            where = self._where(cl)
        share = where.share
        after = {d: loads[d] - share[d] for d in where.devices}  # the loads that change
        after[b] = after.get(b, loads[b]) + cl.comp[self.kind_of[b]]
        touched = [*where.devices, b]
        gain = max(loads[d] for d in touched) - max(after[d] for d in touched)
        return gain - COMM_WEIGHT * (where.transfers(b) - where.transfers(where.main))

    def _transfers(self, cl: _Cluster) -> tuple[float, dict[int, float]]:
        """µs of transfers across the cluster's edge were it all on device d, as (total, there_too):
        ``total - there_too.get(d, 0.0)``.

        Each tensor counts once per receiving device, as the simulator sends it.
        O(the boundary's size); the boundary is computed on first use.
        """
        if cl.flat is None and cl.boundary is None:
            if len(cl.units) > 1 and sum(map(self.degree.__getitem__, cl.units)) > VECTOR_BOUNDARY:
                cl.flat = self._boundary_flat(cl.units)
            else:
                cl.boundary = self._boundary(cl.units)
        if cl.flat is not None or len(cl.boundary) > VECTOR_MIN:  # type: ignore[arg-type]
            return self._transfers_vectorized(cl)
        dev, t_len = self.dev, self.t_len
        # Its tensors reach every device of their outside consumers but d, and outside
        # tensors come to d unless already there (made or read there).
        total = 0.0
        there_too: dict[int, float] = {}
        for tid, made_inside, others in cl.boundary:
            length = t_len[tid]
            if len(others) == 1:
                total += length
                d = dev[others[0]]
                there_too[d] = there_too.get(d, 0.0) + length
                continue
            there = {dev[c] for c in others}
            total += length * len(there) if made_inside else length
            for d in there:
                there_too[d] = there_too.get(d, 0.0) + length
        return total, there_too

    def _transfers_vectorized(self, cl: _Cluster) -> tuple[float, dict[int, float]]:
        """:meth:`_transfers` of a big boundary, in numpy: the same sums in the same order (the
        total by a running sum over the tensors, each device's by bincount in tensor order)."""
        if cl.flat is None:
            assert cl.boundary is not None
            sizes = [len(others) for _, _, others in cl.boundary]
            index = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
            outside = np.fromiter(
                (c for _, _, others in cl.boundary for c in others), dtype=np.int64, count=len(index)
            )
            length = np.array([self.t_len[tid] for tid, _, _ in cl.boundary], dtype=np.float64)
            made = np.array([made for _, made, _ in cl.boundary], dtype=bool)
            cl.flat = index, outside, length, made
        index, outside, length, made = cl.flat
        ndev = self.ndev
        # Each (tensor, device it reaches) once, in tensor order.
        pairs = np.unique(index * ndev + self._dev_array()[outside])
        tensor, device = np.divmod(pairs, ndev)
        reached = np.bincount(tensor, minlength=len(length))
        sums = np.cumsum(np.where(made, length * reached, length))
        total = float(sums[-1]) if len(sums) else 0.0  # a cluster nothing crosses the edge of
        there = np.bincount(device, weights=length[tensor]).tolist()
        return total, {d: there[d] for d in np.unique(device).tolist()}

    def _dev_array(self) -> np.ndarray:
        """``self.dev`` in numpy, remade when the placement changed (it is replaced, never edited)."""
        if self.dev_array_of is not self.dev:
            self.dev_array = np.array(self.dev, dtype=np.int64)
            self.dev_array_of = self.dev
        return self.dev_array

    def _critical(self, timing: Timing) -> list[_Move]:
        """Moves along the chain of ops and transfers that ends last (class docstring)."""
        g, ndev = self.graph, self.ndev
        device_of, unit_of, dev = self.device_of, self.unit_of, self.dev
        start, end, ready, copies = timing.start, timing.end, timing.ready, timing.copies
        edge_tensor = g.tensors.edge_tensor
        prev_on_device = [-1] * g.num_ops
        for ops in timing.order:
            for a, b in zip(ops, ops[1:]):
                prev_on_device[b] = a
        v = end.index(max(end)) if g.num_ops else -1  # the first op to end last
        waits: list[tuple[float, int, int]] = []  # (wait, op, the op before it on its device)
        transfers: list[tuple[int, int]] = []  # (producer, consumer) on different devices
        while v >= 0 and start[v] > 0.0:
            s = start[v]
            if not g.in_edges[v] or s > ready[v]:  # it waited for its device
                p = prev_on_device[v]
                if p >= 0 and g.in_edges[v]:
                    waits.append((s - ready[v], v, p))
                v = p
                continue
            dv, nxt = device_of[v], -1
            for e in g.in_edges[v]:  # the input that arrived last
                u = g.edge_src[e]
                t = end[u] if device_of[u] == dv else copies[edge_tensor[e] * ndev + dv][2]
                if t == ready[v]:
                    nxt = u
                    if device_of[u] != dv:
                        transfers.append((u, v))
                    break
            v = nxt
        moves: list[_Move] = []

        loads = self._loads()

        def move(kind: str, units: tuple[int, ...], targets: tuple[int, ...], on_path: float) -> None:
            """A move, scored by the general estimate or, when larger, by what it could take
            off the critical path (``on_path`` µs), which the general estimate cannot see."""
            label = " + ".join(g.names[self.unit_ops[u][0]] for u in units)
            # Units are the first clusters; a swap counts as its two moves.
            score = sum(self._estimate(self.clusters[u], d, loads) for u, d in zip(units, targets))
            score = max(score, on_path)
            moves.append(_Move(kind, label, units, targets[0], targets, key=(units, targets), score=score))

        for u, w in transfers[:CRITICAL_TRANSFERS]:
            a, b = unit_of[u], unit_of[w]
            length = max(
                (self.t_len[edge_tensor[e]] for e in g.in_edges[w] if g.edge_src[e] == u), default=0.0
            )
            move("critical transfer", (a,), (dev[b],), length)
            move("critical transfer", (b,), (dev[a],), length)
        waits.sort(key=lambda x: (-x[0], x[1]))
        busy = _Busy(timing)
        comp = self.comp
        # An idle device computes 0 µs in any window, the least there is: of the idle ones only
        # the first can win (ties go to the lower index), so the others need no look.
        candidates = [d for d in range(ndev) if timing.order[d]]
        idle = next((d for d in range(ndev) if not timing.order[d]), -1)
        if idle >= 0:
            candidates.append(idle)
        for wait, w, p in waits[:CRITICAL_WAITS]:
            lo, hi = ready[w], start[w]
            others = [d for d in candidates if d != device_of[w]]
            if not others:
                continue
            d = min(others, key=lambda d: (busy.within(d, lo, hi), d))
            a, b = unit_of[w], unit_of[p]
            move("critical wait", (a,), (d,), min(wait, comp[d][a]))
            if b != a:
                move("critical wait", (b,), (d,), min(wait, comp[d][b]))
            other = busy.running(d, lo)
            if other >= 0 and unit_of[other] != a:
                c = unit_of[other]
                move("swap", (a, c), (dev[c], dev[a]), min(wait, comp[d][a]))
        return moves

    # ------------------------------------------------------------------ the search

    def _after(self, move: _Move) -> list[int] | None:
        """Unit devices after ``move``; None when it changes nothing or that placement was timed."""
        dev = list(self.dev)
        changed = False
        for i, u in enumerate(move.units):
            d = move.device(i)
            if dev[u] != d:
                dev[u] = d
                changed = True
        if not changed or self._known(dev):
            return None
        return dev

    def _ops(self, dev: list[int], move: _Move) -> list[int]:
        device_of = list(self.device_of)
        for u in move.units:
            d = dev[u]
            for v in self.unit_ops[u]:
                device_of[v] = d
        return device_of

    def _commit(
        self, dev: list[int], device_of: list[int], value: float, kind: str, kick: bool = False
    ) -> None:
        self.dev = dev
        self.device_of = device_of
        self.value = value
        if kick:
            self.kicks += 1
        else:
            self.accepted += 1
        self.history.append((self.evaluations, value, f"kick, {kind}" if kick else kind))
        if value < self.best_value:
            self.best_value = value
            self.best_dev = list(dev)

    def _try(self, move: _Move) -> float | None:
        """Time ``move`` from the current state and accept it when faster and within memory.

        Returns its step time (None: not timed, nothing to change or seen before).
        """
        dev = self._after(move)
        if dev is None:
            return None
        self.tried += 1
        device_of = self._ops(dev, move)
        likely = (self.accepted + 1) / (self.tried + 1) > TRACE_WHEN_TAKEN  # tried counts this one
        value = self._time(device_of, self.sequence, keep=likely)
        self._remember(dev, value)
        if value < self.value and self._fits(device_of, self.sequence):
            self._commit(dev, device_of, value, f"{move.kind}: {move.label}")
        else:
            self.failed.add(move.key)
        return value

    def _loads(self) -> list[float]:
        loads = [0.0] * self.ndev
        for u, d in enumerate(self.dev):
            loads[d] += self.comp[d][u]
        return loads

    def _ranked(self, moves: list[_Move]) -> Iterator[_Move]:
        """The moves in the order to try them.

        Each family of moves (:data:`FAMILIES`) is ranked on its own: moves never
        tried before first (one that failed may succeed on a changed placement, but
        less likely), then by estimate. The next move comes from the family that
        promises most per evaluation (:meth:`_promise`), so the budget goes where
        moves pay on this graph. Ties go in a fixed order.
        """
        arms: dict[str, deque[_Move]] = {}
        for family in FAMILIES.values():
            arms.setdefault(family, deque())
        for m in sorted(moves, key=lambda m: (m.key in self.failed, -m.score)):
            arms[FAMILIES[m.kind]].append(m)
        rank = {f: i for i, f in enumerate(arms)}
        while True:
            live = [f for f, arm in arms.items() if arm]
            if not live:
                return
            family = max(live, key=lambda f: (self._promise(f, arms[f][0]), -rank[f]))
            yield arms[family].popleft()

    def _promise(self, family: str, move: _Move) -> float:
        """µs per evaluation ``family`` promises: what its moves saved so far plus ``move``'s
        estimate, discounted by how much of its estimates came true, over its moves tried
        plus one. A family whose estimates keep failing (splits of a recurrent network)
        fades fast; one that keeps saving (moving initializers) stays up."""
        tried, saved, claimed = self.family_stats.get(family, (0, 0.0, 0.0))
        prior = self.trust_prior
        trust = (saved + prior) / (claimed + prior)
        return (saved + trust * max(0.0, move.score)) / (tried + 1)

    def _pass(self, budget: int, level: int, worse: list[tuple[float, _Move]]) -> tuple[bool, bool]:
        """One ranked sweep over the candidates of ``level``, of at most ``self.cap`` timings.

        Returns (improved, complete: every candidate was timed or known). The moves
        timed without improving are added to ``worse`` with their step times.
        """
        moves = self._critical(self._trace()) + self._structural(self._loads(), level)
        timed = 0
        for m in self._ranked(moves):
            if self.evaluations >= budget or timed >= self.cap:
                return False, False
            before = self.value
            value = self._try(m)
            if value is None:
                continue
            timed += 1
            family = FAMILIES[m.kind]
            tried, saved, claimed = self.family_stats.get(family, (0, 0.0, 0.0))
            self.family_stats[family] = (tried + 1, saved + before - self.value, claimed + max(0.0, m.score))
            if self.value < before:
                return True, False  # first improvement: rank again from the new placement
            if value < float("inf"):
                worse.append((value, m))
        return False, True

    def run(self, max_evaluations: int, kick: bool = True) -> bool:
        """Climb until the budget is spent (class docstring): passes cycle through the levels,
        staying at one while it improves; when every level was swept in full without
        improving, kick, or, without ``kick``, stop there. True when it stopped at a local
        optimum with budget left."""
        budget = max(0, int(max_evaluations))
        # A pass may not take more than this, so a long sweep of one level cannot
        # starve the others.
        self.cap = max(MIN_PASS, budget // PASS_SHARE)
        level = 0
        swept: set[int] = set()  # levels swept in full since the placement last changed
        worse: list[tuple[float, _Move]] = []
        while self.evaluations < budget:
            improved, complete = self._pass(budget, level, worse)
            if improved:
                swept.clear()
                worse = []
                continue
            if complete:
                swept.add(level)
            if len(swept) < len(LEVELS):
                level = (level + 1) % len(LEVELS)
                continue
            if self.evaluations >= budget:
                break
            if not kick or not worse:
                return True
            # A local optimum: kick (take one of the least-bad moves) and climb again.
            least = sorted(range(len(worse)), key=lambda i: (worse[i][0], i))[:KICK_CHOICES]
            value, move = worse[least[self.rng.randrange(len(least))]]
            targets = dict(zip(move.units, (move.device(i) for i in range(len(move.units)))))
            dev = [targets.get(u, d) for u, d in enumerate(self.dev)]
            device_of = self._ops(dev, move)
            if not self._fits(device_of, self.sequence):
                return True
            self._commit(dev, device_of, value, f"{move.kind}: {move.label}", kick=True)
            self.failed.clear()
            swept.clear()
            worse = []
            level = 0
        return False

    def result(self) -> tuple[Placement, Evaluation]:
        """The best placement seen (the start's when none beat it) and its full evaluation."""
        if self.best_value >= self.start_value:
            return self.start_placement, self.start_eval
        device_of = [0] * self.graph.num_ops
        for u, ops in enumerate(self.unit_ops):
            for v in ops:
                device_of[v] = self.best_dev[u]
        placement = Placement(device_of, self.sequence)
        checked = self.checked
        if checked is not None and checked[0] is self.sequence and checked[1].timeline.device_of == device_of:
            evaluation = checked[1]  # the best placement was the last one whose memory was checked
        else:
            evaluation = evaluate(self.graph, self.devices, placement, timer=self.timer)
            self.full_evaluations += 1
        if evaluation.value_us > self.best_value or not evaluation.feasible:  # StepTimer is exact
            raise AssertionError("the fast evaluator disagrees with the evaluator")
        return placement, evaluation


class _Busy:
    """When each device computes in a timeline: µs within a window, the op running at an instant.

    O(V + D) to build, the lists kept for the devices that run ops only; each question
    O(log V) by bisection (a device's ops do not overlap, so their starts and ends are
    both sorted).
    """

    def __init__(self, timing: Timing) -> None:
        self.ops = timing.order
        used = [d for d, ops in enumerate(timing.order) if ops]
        self.starts = {d: [timing.start[v] for v in timing.order[d]] for d in used}
        self.ends = {d: [timing.end[v] for v in timing.order[d]] for d in used}
        self.before: dict[int, list[float]] = {}  # busy µs before each op starts
        for d in used:
            acc, cum = 0.0, [0.0]
            for s, e in zip(self.starts[d], self.ends[d]):
                acc += e - s
                cum.append(acc)
            self.before[d] = cum

    def within(self, d: int, lo: float, hi: float) -> float:
        """µs device ``d`` computes within [lo, hi)."""
        if d not in self.before:
            return 0.0
        starts, ends, cum = self.starts[d], self.ends[d], self.before[d]
        i = bisect_right(ends, lo)  # the first op ending after lo
        j = bisect_left(starts, hi)  # the first op starting at or after hi
        if i >= j:
            return 0.0
        total = cum[j] - cum[i]
        total -= max(0.0, lo - starts[i])  # clip the first op at lo
        total -= max(0.0, ends[j - 1] - hi)  # and the last at hi
        return max(0.0, total)

    def running(self, d: int, t: float) -> int:
        """The op device ``d`` runs at time ``t`` (-1: idle)."""
        if d not in self.starts:
            return -1
        i = bisect_right(self.starts[d], t) - 1
        return self.ops[d][i] if i >= 0 and self.ends[d][i] > t else -1
