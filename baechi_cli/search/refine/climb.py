"""The climb: local search from a placement, move by move, within a budget of fast evaluations.

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

:class:`Climb` holds the search state and composes the units (:mod:`.units`), their clusters
(:mod:`.clusters`), the move finder (:mod:`.moves`) and the judge (:mod:`.judge`). Passes go
coarse to fine (:data:`LEVELS`) and take the first improvement once its memory is checked; the
next move comes from the family that promises most per evaluation (:meth:`Climb._promise`); a
seeded kick leaves a local optimum; the best placement seen wins.

Complexity: setup O(V + E) per scope depth; each evaluation O((V + E) log V)
(:func:`evaluation_cost` predicts its seconds); ranking a pass linear in its candidates.

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

import random
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.graph import OpGraph
from baechi_cli.evaluator.evaluate import Evaluation
from baechi_cli.evaluator.placement import Placement
from baechi_cli.evaluator.sim import StepTimer
from baechi_cli.search.refine.clusters import Clusters
from baechi_cli.search.refine.judge import Judge
from baechi_cli.search.refine.moves import FAMILIES, Move, MoveFinder
from baechi_cli.search.refine.units import Units

# Seconds per fast evaluation per op and edge, the search's own work (ranking, memory checks,
# building candidates) included: calibrated on the four reference graphs (bench/history/placement.md).
SECONDS_PER_ELEMENT = 1.5e-6
# What setting the search up costs, in evaluations: each unit's compute and transfers, the
# clusters, and the first pass's ranking (each big cluster's boundary is found on first
# use). Calibrated on the reference graphs (bench/history/placement.md).
SETUP_EVALUATIONS = 5
# Coarse to fine: the pass of level i ranks the clusters holding at least LEVELS[i] of
# the compute (the last, 0, takes every unit); a pass that does not improve hands over
# to the next level, cyclically.
LEVELS = (1 / 32, 1 / 256, 1 / 2048, 0.0)
# A pass times at most max(MIN_PASS, budget / PASS_SHARE) moves before the next level's turn.
MIN_PASS = 16
PASS_SHARE = 8
# A family's estimates are trusted as far as they came true, starting from this share
# of the step time saved for free (so one failure does not condemn a family).
TRUST_PRIOR = 0.002
# A move is timed with its trace kept (StepTimer.timing, a little dearer than step_time) while
# more than this share of the moves tried so far (plus one taken, of two, as a prior) were
# taken: a move taken then needs no second run for its memory check and critical path.
TRACE_WHEN_TAKEN = 0.15
# Random kicks at a local optimum are drawn among this many least-bad moves.
KICK_CHOICES = 4


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
    search = Climb(graph, devices, start, seed, start_evaluation, timer)
    stalled = search.run(max_evaluations, kick=not stop_at_local_optimum)
    placement, evaluation = search.result()
    return Refined(
        placement=placement,
        evaluation=evaluation,
        start_value_us=search.start_value,
        evaluations=search.judge.evaluations,
        moves_tried=search.tried,
        moves_accepted=search.accepted,
        seconds=time.perf_counter() - t0,
        kicks=search.kicks,
        full_evaluations=search.judge.full_evaluations,
        memory_checks=search.judge.memory_checks,
        kept_sequence=search.sequence is not None,
        stalled=stalled,
        history=search.history,
    )


class Climb:
    """The state of one refinement: where the units are, the best seen, and what was tried.

    A pass ranks the critical moves of the current run and the structural moves of the clusters
    holding at least a share :data:`LEVELS` of the compute, times at most max(:data:`MIN_PASS`,
    budget / :data:`PASS_SHARE`) of them, and hands over to the next level unless it improved.
    The next move comes from the family that promises most per evaluation (µs saved plus its next
    estimate, discounted by how far its estimates came true, over moves tried plus one): on a
    recurrent network the budget goes to scope moves, on a CNN to critical moves. The first
    improvement is taken once its memory is checked. When every level was swept without
    improving, a seeded kick takes one of the :data:`KICK_CHOICES` least-bad moves.
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
        self.ndev = devices.count
        self.rng = random.Random(seed)
        if timer is not None:
            timer.check_serves(graph, devices)
        timer = timer or StepTimer(graph, devices)
        self.units = units = Units(graph, devices)
        # Each unit's device, and each op's (kept in step; both replaced, never edited).
        self.dev = [start.device_of[ops[0]] for ops in units.unit_ops]
        if any(start.device_of[v] != self.dev[units.unit_of[v]] for v in range(n)):
            raise ValueError("the start placement splits a colocation group")
        self.device_of = list(start.device_of)
        self.judge = judge = Judge(graph, devices, timer)
        self.tried = 0
        self.accepted = 0
        self.kicks = 0
        self.history: list[tuple[int, float, str]] = []

        self.start_placement = start
        if start_evaluation is None:
            start_evaluation = judge.evaluate(start)
        self.start_eval = start_evaluation
        self.start_value = self.start_eval.value_us
        self.value = self.start_value
        # Keep the start's order or drop it, whichever runs faster (and fits).
        self.sequence: list[int] | None = None if start.sequence is None else list(start.sequence)
        dropped = False
        if start.sequence is not None:
            free = judge.time(self.device_of, None, keep=True)
            if free < self.start_value and judge.fits(self.device_of, None):
                self.sequence, self.value, dropped = None, free, True
        # The first pass walks the critical path of the start's run: the free order's, kept
        # by the judge, or else the evaluator's, when StepTimer made it.
        judges = self.start_eval.timeline.trace
        if not dropped and judges is not None:
            judge.keep(self.device_of, self.sequence, judges)
        self.best_dev = list(self.dev)
        self.best_value = self.value
        self.seen: dict[bytes, float] = {}  # unit devices timed -> step time
        self._remember(self.dev, self.value)
        self.clusters = Clusters(graph, units, timer.rank)
        self.finder = MoveFinder(graph, units, self.clusters)
        self.failed: set[tuple] = set()  # moves that did not improve on some state
        # family -> (moves tried, µs they saved, µs their estimates claimed)
        self.family_stats: dict[str, tuple[int, float, float]] = {}
        self.trust_prior = max(TRUST_PRIOR * self.value, 1.0)  # µs; a 0 µs graph still divides
        self.cap = MIN_PASS

    def _remember(self, dev: list[int], value: float) -> None:
        if self.ndev < 256:
            self.seen[bytes(dev)] = value

    def _known(self, dev: list[int]) -> bool:
        return self.ndev < 256 and bytes(dev) in self.seen

    def _after(self, move: Move) -> list[int] | None:
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

    def _ops(self, dev: list[int], move: Move) -> list[int]:
        device_of = list(self.device_of)
        for u in move.units:
            d = dev[u]
            for v in self.units.unit_ops[u]:
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
        self.history.append((self.judge.evaluations, value, f"kick, {kind}" if kick else kind))
        if value < self.best_value:
            self.best_value = value
            self.best_dev = list(dev)

    def _try(self, move: Move) -> float | None:
        """Time ``move`` from the current state and accept it when faster and within memory.

        Returns its step time (None: not timed, nothing to change or seen before).
        """
        dev = self._after(move)
        if dev is None:
            return None
        self.tried += 1
        device_of = self._ops(dev, move)
        likely = (self.accepted + 1) / (self.tried + 1) > TRACE_WHEN_TAKEN  # tried counts this one
        value = self.judge.time(device_of, self.sequence, keep=likely)
        self._remember(dev, value)
        if value < self.value and self.judge.fits(device_of, self.sequence):
            self._commit(dev, device_of, value, f"{move.kind}: {move.label}")
        else:
            self.failed.add(move.key)
        return value

    def _ranked(self, moves: list[Move]) -> Iterator[Move]:
        """The moves in the order to try them.

        Each family of moves (:data:`FAMILIES`) is ranked on its own: moves never
        tried before first (one that failed may succeed on a changed placement, but
        less likely), then by estimate. The next move comes from the family that
        promises most per evaluation (:meth:`_promise`), so the budget goes where
        moves pay on this graph. Ties go in a fixed order.
        """
        arms: dict[str, deque[Move]] = {}
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

    def _promise(self, family: str, move: Move) -> float:
        """µs per evaluation ``family`` promises: what its moves saved so far plus ``move``'s
        estimate, discounted by how much of its estimates came true, over its moves tried
        plus one. A family whose estimates keep failing (splits of a recurrent network)
        fades fast; one that keeps saving (moving initializers) stays up."""
        tried, saved, claimed = self.family_stats.get(family, (0, 0.0, 0.0))
        prior = self.trust_prior
        trust = (saved + prior) / (claimed + prior)
        return (saved + trust * max(0.0, move.score)) / (tried + 1)

    def _pass(self, budget: int, level: int, worse: list[tuple[float, Move]]) -> tuple[bool, bool]:
        """One ranked sweep over the candidates of ``level``, of at most ``self.cap`` timings.

        Returns (improved, complete: every candidate was timed or known). The moves
        timed without improving are added to ``worse`` with their step times.
        """
        judge, finder = self.judge, self.finder
        moves = finder.critical(judge.trace(self.device_of, self.sequence), self.dev, self.device_of)
        least = LEVELS[level] * self.units.total_compute
        moves += finder.structural(self.dev, self.units.loads(self.dev), least)
        timed = 0
        for m in self._ranked(moves):
            if judge.evaluations >= budget or timed >= self.cap:
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
        worse: list[tuple[float, Move]] = []
        while self.judge.evaluations < budget:
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
            if self.judge.evaluations >= budget:
                break
            if not kick or not worse:
                return True
            # A local optimum: kick (take one of the least-bad moves) and climb again.
            least = sorted(range(len(worse)), key=lambda i: (worse[i][0], i))[:KICK_CHOICES]
            value, move = worse[least[self.rng.randrange(len(least))]]
            targets = dict(zip(move.units, (move.device(i) for i in range(len(move.units)))))
            dev = [targets.get(u, d) for u, d in enumerate(self.dev)]
            device_of = self._ops(dev, move)
            if not self.judge.fits(device_of, self.sequence):
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
        device_of = self.units.op_devices(self.best_dev)
        placement = Placement(device_of, self.sequence)
        # The best placement may be the last one whose memory was checked.
        evaluation = self.judge.last_checked(device_of, self.sequence)
        if evaluation is None:
            evaluation = self.judge.evaluate(placement)
        if evaluation.value_us > self.best_value or not evaluation.feasible:  # StepTimer is exact
            raise AssertionError("the fast evaluator disagrees with the evaluator")
        return placement, evaluation
