"""The optimal pipeline split for throughput: an exact solver for Tarnawski et al.'s max-load model.

The model (:mod:`~baechi_cli.pipeline.maxload`) gives every device a load, its time per sample;
the split's max-load is the bottleneck's. :func:`solve` is exact within the model: an interval DP
over a few topological orders gives an upper bound, then a search over the lattice of ideals (or
over sets, where the lattice is too big) improves it or proves it optimal; past ``max_sets`` it
returns its best with ``proven=False``. ``dp.cpp`` prices every pair of ideals from scratch; here
only the pairs within the bounds are priced, in numpy blocks.

Example:
    >>> m = LoadModel.chain([4.0, 1.0, 3.0, 2.0], send_us=[0.5, 0.5, 0.5, 0.0], accelerators=2)
    >>> split = solve(m)
    >>> split.max_load_us, split.stage_units, split.proven
    (5.5, [[0, 1], [2, 3]], True)
    >>> evaluate_loads(m, split.device_of_op).loads_us
    [5.5, 5.5]
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from baechi_cli.core.devices import format_si
from baechi_cli.core.errors import InfeasibleError, InputError
from baechi_cli.pipeline.maxload import (
    Growing,
    LoadModel,
    Units,
    build_units,
    evaluate_loads,
    fixed_costs,
    other_orders,
    unit_order,
)

# Floating-point slack when comparing loads summed in different orders.
_EPS = 1e-9
# Effort of the exact search in sets (the lattice prices _PAIRS_PER_SET pairs per set): it stops
# within seconds (bench/history/placement.md).
DEFAULT_MAX_SETS = 150_000


@dataclass(frozen=True)
class Split:
    """A pipeline split: stages in pipeline order, each on one device."""

    max_load_us: float
    stage_units: list[list[int]]  # per stage, the units (ids of :func:`units`) in it
    stage_device: list[int]  # per stage, its device (accelerators first, then CPUs)
    stage_loads_us: list[float]
    device_of_op: list[int]
    proven: bool  # the exact search completed: no valid split (within ``scope``) has a lower max-load
    scope: str  # "contiguous" (the model's splits) or "program order" (ranges torch can cut)
    lower_bound_us: float
    seconds: float
    sets_enumerated: int
    units: int  # units after fusion (the search's nodes)

    def to_json(self) -> dict[str, object]:
        return {
            "max_load_us": round(self.max_load_us, 6),
            "throughput_per_s": round(1e6 / self.max_load_us, 6) if self.max_load_us > 0 else None,
            "stages": [
                {"device": d, "load_us": round(load, 6)}
                for d, load in zip(self.stage_device, self.stage_loads_us)
            ],
            "proven_optimal": self.proven,
            "optimal_among": self.scope,
            "lower_bound_us": round(self.lower_bound_us, 6),
            "solver": {
                "seconds": round(self.seconds, 6),
                "sets_enumerated": self.sets_enumerated,
                "units": self.units,
            },
        }


# ------------------------------------------------------------------ units


# ------------------------------------------------------------------ loads of growing sets


# ------------------------------------------------------------------ solver


@dataclass
class _Best:
    value: float
    stages: list[tuple[list[int], bool]]  # (units, on an accelerator)
    lower: float = 0.0  # no split has a lower max-load (shown by a completed pass)


def solve(
    model: LoadModel,
    *,
    max_sets: int = DEFAULT_MAX_SETS,
    orders: Sequence[Sequence[int]] = (),
    cuts: Collection[int] | None = None,
) -> Split:
    """The split of least max-load (module docstring), proven optimal unless ``max_sets`` ran out.

    ``orders``: extra topological orders of the ops to seed the upper bound
    with (a program order, say). ``cuts``: when given, the stages are ranges
    of ``orders[0]`` (as units) that start at one of these ops or at the
    first; the interval DP over that order is then exact and the search over
    ideals is skipped (``Split.scope`` says which space the result is
    optimal in). Raises InfeasibleError when no valid split fits the
    accelerators' memory, InputError on a model with no devices.
    Deterministic: the same model gives the same split.

    Algorithm, exact within the model:

    1. *Upper bound.* An interval DP over a few topological orders of the units (each device a
       contiguous range of the order, priced in numpy as the lattice prices stages, O(k n^2) per
       order); the best is ``U``.
    2. *Search over the lattice* (when the unit DAG has at most ``max_sets / 2`` ideals, few
       enough for ``_LATTICE_CELLS``). The ideals are enumerated once, as rows of bits sorted by
       compute. A stage ``J - I`` costs ``accel[J] - accel[I] + bnd[J] +`` a correction for the
       tensors crossing ``I``'s boundary, so blocks of (I, J) pairs are priced by a few numpy
       products. A pass decides exactly whether a split with every load below a limit exists:
       breadth first by (accelerators, CPU cores) used, each ideal kept in the first cell that
       reaches it, and only where it and its complement fit within the devices left at the limit
       each (CPU cores taking at most what a fractional knapsack lets them). A pass that finds a
       split improves ``U``; one that finds none below ``U`` proves it optimal (:func:`_prove_lattice`).
    3. *Search over sets* otherwise, or when the lattice's passes use up ``max_sets``: from each
       reachable ideal ``I`` of value ``v`` (the max-load so far) every ideal ``J`` above it is
       enumerated once and reached with ``max(v, load(J - I))``, loads kept incrementally
       (O(degree) per unit). Exact pruning: a set whose compute or memory exceeds ``U`` or the
       device's memory stops growing; a state above ``U``, or whose remaining work cannot fit the
       remaining devices at ``U`` each, is dropped; ``U`` tightens as splits are found.
    4. A search that completes *proves* the result optimal. Beyond ``max_sets`` (the lattice's
       pairs count ``1 / _PAIRS_PER_SET`` set each) the best split so far (never worse than
       step 1's) is returned with ``proven=False`` and the best lower bound.
    """
    if model.accelerators < 0 or model.cpus < 0 or model.num_devices == 0:
        raise InputError("a pipeline needs at least one device")
    t0 = time.perf_counter()
    u = build_units(model)
    k, cpus = model.accelerators, model.cpus
    best = _Best(math.inf, [])
    unit_orders = [list(range(u.n)), *other_orders(u)]
    if cuts is not None:
        order = unit_order(u, orders[0])
        position = {w: i for i, w in enumerate(order)}
        starts = {0} | {position[u.of_op[v]] for v in cuts}
        _interval_dp(u, order, k, cpus, model.memory, best, starts)
        sets, proven, scope = 0, bool(best.stages), "program order"
    else:
        for order in orders:
            unit_orders.append(unit_order(u, order))
        for order in unit_orders:
            _interval_dp(u, order, k, cpus, model.memory, best)
        sets, proven = _prove(u, k, cpus, model.memory, best, max_sets)
        scope = "contiguous"
    if not best.stages:
        raise InfeasibleError(
            f"no split of the model into {k} contiguous stage(s) of at most "
            f"{format_si(model.memory, 'B', 4, ' ')} ({model.memory:.0f} bytes) each fits"
            + (f", with {cpus} CPU core(s) besides" if cpus else "")
        )
    return _split(model, u, best, proven, scope, sets, time.perf_counter() - t0)


class ProgramOrder:
    """Splits into ranges of a program order, as :func:`solve` makes with ``cuts``, named by where
    their stages start: for a search that judges splits by something else than max-load (a
    pipeline schedule's simulated time).

    ``starts`` are the positions (in the order of units) a stage other than the first may start
    at, ascending; a split is the increasing list of indices into them where its stages 2, 3, ...
    start. Building the units costs what :func:`solve` does; each :meth:`split` O(V + E).
    """

    def __init__(self, model: LoadModel, program: Sequence[int], cuts: Collection[int]) -> None:
        self.model = model
        self._units = build_units(model)
        self._order = unit_order(self._units, program)
        self._position = {w: i for i, w in enumerate(self._order)}
        self.starts = sorted({self._position[self._units.of_op[v]] for v in cuts} - {0})
        self._index = {p: i for i, p in enumerate(self.starts)}

    def boundaries(self, split: Split) -> list[int] | None:
        """``split``'s stage starts (indices into :attr:`starts`); None when it is no such split."""
        firsts = sorted(min(self._position[w] for w in units) for units in split.stage_units)
        if not firsts or firsts[0] != 0 or any(p not in self._index for p in firsts[1:]):
            return None
        return [self._index[p] for p in firsts[1:]]

    def split(self, boundaries: Sequence[int]) -> Split:
        """The split whose stages start at ``starts[b]`` for ``b`` in ``boundaries`` (and at 0), one
        accelerator each (the model needs as many), judged by the max-load model (not proven)."""
        at = [0, *(self.starts[b] for b in boundaries), self._units.n]
        stages = [(self._order[a:b], True) for a, b in zip(at, at[1:])]
        return _split(self.model, self._units, _Best(math.inf, stages), False, "program order", 0, 0.0)


def _lower_bound(u: Units, k: int, cpus: int) -> float:
    cheapest = [
        min(a if ok and k else math.inf, c if cpus else math.inf)
        for a, c, ok in zip(u.accel_us, u.cpu_us, u.accel_ok)
    ]
    return max(max(cheapest, default=0.0), sum(cheapest) / max(1, k + cpus))


def _split(
    model: LoadModel, u: Units, best: _Best, proven: bool, scope: str, sets: int, seconds: float
) -> Split:
    k = model.accelerators
    device_of_unit = [0] * u.n
    stage_device: list[int] = []
    next_accel, next_cpu = 0, k
    for members, on_accel in best.stages:
        if on_accel:
            d, next_accel = next_accel, next_accel + 1
        else:
            d, next_cpu = next_cpu, next_cpu + 1
        stage_device.append(d)
        for w in members:
            device_of_unit[w] = d
    device_of_op = [device_of_unit[w] for w in u.of_op]
    judged = evaluate_loads(model, device_of_op)
    loads = [judged.loads_us[d] for d in stage_device]
    value = judged.max_load_us
    lower = value if proven else min(value, max(best.lower, _lower_bound(u, k, model.cpus)))
    return Split(
        max_load_us=value,
        stage_units=[sorted(m) for m, _ in best.stages],
        stage_device=stage_device,
        stage_loads_us=loads,
        device_of_op=device_of_op,
        proven=proven,
        scope=scope,
        lower_bound_us=lower,
        seconds=seconds,
        sets_enumerated=sets,
        units=u.n,
    )


def _interval_dp(
    u: Units,
    order: list[int],
    k: int,
    cpus: int,
    memory: float,
    best: _Best,
    starts: Collection[int] | None = None,
) -> None:
    """Best split into contiguous ranges of ``order`` (an upper bound); improves ``best`` in place.

    The load of every range ``order[a:b]`` on an accelerator and on a CPU
    (:func:`_range_loads`), then a DP per device count takes
    ``min over a of max(value[a], load[a, b])`` as one numpy step per
    device. O(n^2 features) to price, O((k + cpus) n^2) for the DP.
    ``starts``: the only positions a range may start at (None: any).
    """
    n = u.n
    accel, cpu = _range_loads(u, order, k, cpus, memory)
    if starts is not None:
        ends = sorted(set(starts) | {n})
        barred = np.ones(n + 1, dtype=bool)
        barred[ends] = False
        for matrix in (accel, cpu):
            matrix[barred, :] = np.inf
            matrix[:, barred] = np.inf
    # value[(c, f)][i]: least max-load covering order[:i] with c CPU ranges and f accelerator ranges
    start = np.full(n + 1, np.inf)
    start[0] = 0.0
    value = {(0, 0): start}
    back: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    for used in range(1, k + cpus + 1):
        for c in range(min(cpus, used) + 1):
            f = used - c
            if f > k:
                continue
            options = []
            if f > 0 and (c, f - 1) in value:
                options.append((value[(c, f - 1)], accel, True))
            if c > 0 and (c - 1, f) in value:
                options.append((value[(c - 1, f)], cpu, False))
            best_row = np.full(n + 1, np.inf)
            best_from = np.zeros(n + 1, dtype=np.int64)
            best_accel = np.zeros(n + 1, dtype=bool)
            for before, load, on_accel in options:
                candidates = np.maximum(before[:, None], load)
                origin = candidates.argmin(axis=0)
                row = candidates[origin, np.arange(n + 1)]
                better = row < best_row
                best_row[better] = row[better]
                best_from[better] = origin[better]
                best_accel[better] = on_accel
            value[(c, f)] = best_row
            back[(c, f)] = (best_from, best_accel)
    finish = min(((row[n], key) for key, row in value.items()), default=(math.inf, (0, 0)))
    if not finish[0] < best.value * (1 - _EPS):
        return
    stages: list[tuple[list[int], bool]] = []
    (c, f), i = finish[1], n
    while i > 0:
        origin, on_accel_row = back[(c, f)]
        a, on_accel = int(origin[i]), bool(on_accel_row[i])
        stages.append((order[a:i], on_accel))
        c, f, i = (c, f - 1, a) if on_accel else (c - 1, f, a)
    stages.reverse()
    best.value, best.stages = float(finish[0]), stages


# ------------------------------------------------------------------ the lattice of ideals


def _enumerate_ideals(u: Units, cap: int) -> list[int] | None:
    """Every ideal of the unit DAG as a bit mask (the empty one first), or None past ``cap`` of them.

    Each ideal is generated once: from the available units in order, a unit
    joins and the earlier siblings stay out of that branch. O(ideals · width).
    """
    succs = u.succs
    missing = [len(p) for p in u.preds]
    masks = [0]
    stack: list[tuple[list[int], int]] = [([w for w in range(u.n) if missing[w] == 0], 0)]
    chosen: list[int] = []
    mask = 0
    while stack:
        avail, i = stack[-1]
        if i >= len(avail):
            stack.pop()
            if chosen:
                w = chosen.pop()
                mask ^= 1 << w
                for s in succs[w]:
                    missing[s] += 1
            continue
        stack[-1] = (avail, i + 1)
        w = avail[i]
        chosen.append(w)
        mask |= 1 << w
        masks.append(mask)
        if len(masks) > cap:
            return None
        opened = []
        for s in succs[w]:
            missing[s] -= 1
            if missing[s] == 0:
                opened.append(s)
        stack.append((avail[i + 1 :] + opened, 0))
    return masks


class _Lattice:
    """Ideals of the unit DAG as rows (sorted by accelerator compute, unless not ``by_compute``)
    and what prices a stage between two of them.

    A stage is ``J - I`` for ideals ``I ⊂ J``; on an accelerator its load is
    ``accel[J] - accel[I] + bnd[J] + Σ_{t crossing I} us[t] · φ_t(J)``:
    ``bnd[J]`` is the transfer time of the tensors crossing ``J``'s boundary
    and ``φ`` (:meth:`_corrections`) corrects those crossing ``I``'s, a
    sparse row per ``I`` times a dense row per ``J``. So a block of stage
    pairs is priced by a few numpy products. O(ideals · (units + tensors)) to build.
    """

    def __init__(self, u: Units, masks: list[int], *, by_compute: bool = True) -> None:
        n, count = u.n, len(masks)
        width = 8 * max(1, (n + 63) // 64)
        raw = np.frombuffer(b"".join(m.to_bytes(width, "little") for m in masks), dtype=np.uint8)
        member = np.unpackbits(raw.reshape(count, width), axis=1, bitorder="little")[:, :n].astype(bool)
        accel = member @ np.array(u.accel_us)
        # Sorted by compute, the ideals a stage from I can reach lie in a window (load >= compute).
        order = np.argsort(accel, kind="stable") if by_compute else np.arange(count)
        self.member = member[order]
        self.words = raw.view("<u8").reshape(count, width // 8)[order]
        self.accel = accel[order]
        self.cpu = self.member @ np.array(u.cpu_us)
        self.size = self.member @ np.array(u.size, dtype=np.float64)
        self.bad = self.member @ np.array([not ok for ok in u.accel_ok], dtype=np.float64)
        self.cpu_order = np.argsort(self.cpu, kind="stable")
        self.cpu_sorted = self.cpu[self.cpu_order]
        self.empty = int(np.flatnonzero(~self.member.any(axis=1))[0])
        self.full = int(np.flatnonzero(self.member.all(axis=1))[0])
        self._corrections(u)

    @property
    def count(self) -> int:
        return len(self.accel)

    def _corrections(self, u: Units) -> None:
        """``bnd``, and ``φ`` per (tensor, side, v) that crosses some ideal: ``p_*`` (CSR, a row per I), ``phi``.

        A tensor t with m consumers crosses I with v of them in I; J ⊇ I
        holds c of them, ``g_v(J) = [c > v]``. If its producer is in I, the
        stage J - I pays for it iff c > v, where J alone pays iff c < m:
        φ = g_v + g_{m-1} - 1. If it is outside I (then v >= 1), J - I pays
        always when the producer is in J (J alone iff c < m): φ = g_{m-1};
        else iff c > v (J alone always): φ = g_v - 1.
        """
        member_t = self.member.T
        count = self.count
        src = np.array(u.t_src, dtype=np.int64)
        us = np.array(u.t_us)
        m = np.array([len(d) for d in u.t_dst], dtype=np.int64)
        held = np.zeros((len(src), count), dtype=np.int16)  # consumers of tensor t in ideal J
        for t, dst in enumerate(u.t_dst):
            for w in dst:
                held[t] += member_t[w]
        src_in = member_t[src]
        cross = np.where(src_in, held < m[:, None], held > 0)
        self.bnd = us @ cross
        # Feature ids: per tensor, m for a producer in I (v = 0..m-1), then m outside (v = 1..m).
        base = np.concatenate(([0], np.cumsum(2 * m)))[:-1].astype(np.int64)
        t_of, i_of = np.nonzero(cross)
        v = held[t_of, i_of]
        fid = base[t_of] + np.where(src_in[t_of, i_of], v, m[t_of] + v - 1)
        used, compact = np.unique(fid, return_inverse=True)
        by_row = np.lexsort((compact, i_of))
        self.p_ptr = np.searchsorted(i_of[by_row], np.arange(count + 1))
        self.p_col = compact[by_row]
        self.p_val = us[t_of[by_row]]
        phi = np.zeros((len(used), count), dtype=np.int8)
        owner = np.searchsorted(base, used, side="right") - 1
        for f, (feature, t) in enumerate(zip(used.tolist(), owner.tolist())):
            mt, c = int(m[t]), held[t]
            last = (c > mt - 1).astype(np.int8)
            rank = feature - int(base[t])
            if rank < mt:
                phi[f] = (c > rank).astype(np.int8) + last - 1
            else:
                phi[f] = np.where(src_in[t], last, (c > rank - mt + 1).astype(np.int8) - 1)
        self.phi = phi

    def knapsack(self, u: Units) -> None:
        """``gain[J, l] = Σ_{w in J} max(0, accel_w - λ_l cpu_w)`` for a few prices λ (ideals · units · prices).

        By LP duality, for any λ >= 0 the accelerator compute that CPU time
        ``cap`` can take off a set is at most ``λ cap + Σ max(0, accel_w -
        λ cpu_w)`` over its units. The prices tried are 0 and the units'
        ratios of compute to CPU time, 31 of them spread over the range when
        there are more (with all of them the least is the fractional
        knapsack's optimum; with some, a valid bound a little above it).
        """
        accel, cpu = np.array(u.accel_us), np.array(u.cpu_us)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = np.unique(accel[cpu > 0] / cpu[cpu > 0])
        if len(ratios) > 31:
            ratios = ratios[np.linspace(0, len(ratios) - 1, 31).round().astype(np.int64)]
        self.prices = np.concatenate(([0.0], ratios))
        weights = np.maximum(0.0, accel[:, None] - self.prices[None, :] * cpu[:, None])
        self.gain = np.empty((self.count, len(self.prices)))
        for lo in range(0, self.count, 4096):
            self.gain[lo : lo + 4096] = self.member[lo : lo + 4096] @ weights
        self.gain_total = weights.sum(axis=0)

    def saved(self, outside: bool, cap: float) -> np.ndarray:
        """Per ideal (``outside``: its complement), at least the accelerator compute that CPU cores
        with ``cap`` time in all could take off it (:meth:`knapsack` first). O(ideals · prices)."""
        gain = self.gain_total[None, :] - self.gain if outside else self.gain
        return (self.prices[None, :] * cap + gain).min(axis=1)

    def delta(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """``Σ_{t crossing I} us[t] · φ_t(J)`` for I in ``rows``, J in ``cols``: O(|rows| · |cols| · features)."""
        starts, ends = self.p_ptr[rows], self.p_ptr[rows + 1]
        lengths = ends - starts
        flat = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
        features, where = np.unique(self.p_col[flat], return_inverse=True)
        dense = np.zeros((len(rows), len(features)))
        dense[np.repeat(np.arange(len(rows)), lengths), where] = self.p_val[flat]
        return dense @ self.phi[features][:, cols].astype(np.float64)


# Pairs of ideals the lattice search prices per set the search over sets would enumerate (the
# same time here): the two searches share the ``max_sets`` effort.
_PAIRS_PER_SET = 200
# Rows of stage pairs priced at once (bounds the temporaries to a few MB).
_BLOCK = 128
# Ideals times (units + tensors) the lattice may hold: its columns take a few bytes per cell.
_LATTICE_CELLS = 60_000_000


def _range_loads(
    u: Units, order: list[int], k: int, cpus: int, memory: float
) -> tuple[np.ndarray, np.ndarray]:
    """``(accel, cpu)``: the load of ``order[a:b]`` at ``[a, b]`` (a < b) on an accelerator and on a
    CPU core; inf where it cannot run there (or no such device). The prefixes of a topological order
    are ideals, so the ranges are priced as the lattice prices stages, in blocks of rows:
    O(n^2 features) time, O(n^2) memory."""
    n = u.n
    masks, mask = [0], 0
    for w in order:
        mask |= 1 << w
        masks.append(mask)
    prefixes = _Lattice(u, masks, by_compute=False)
    rows = np.arange(n + 1)
    upper = rows[:, None] < rows[None, :]
    accel = np.full((n + 1, n + 1), np.inf)
    if k:
        fits = upper & (prefixes.size[None, :] - prefixes.size[:, None] <= memory)
        fits &= prefixes.bad[None, :] == prefixes.bad[:, None]
        for lo in range(0, n + 1, 256):
            block = rows[lo : lo + 256]
            load = prefixes.accel[None, :] - prefixes.accel[block][:, None] + prefixes.bnd[None, :]
            load += prefixes.delta(block, rows)
            accel[block] = np.where(fits[block], load, np.inf)
    cpu = (
        np.where(upper, prefixes.cpu[None, :] - prefixes.cpu[:, None], np.inf)
        if cpus
        else np.full_like(accel, np.inf)
    )
    return accel, cpu


def _prove_lattice(
    u: Units, k: int, cpus: int, memory: float, best: _Best, max_sets: int
) -> tuple[int, bool | None]:
    """Improve ``best`` until no better split exists, over the explicit lattice of ideals.

    Returns (effort spent in sets, proven); proven is None when the unit DAG
    has more than ``max_sets / 2`` ideals, or more than ``_LATTICE_CELLS /
    (units + tensors)`` (the lattice is not built). Each
    pass decides exactly whether a split with every load below a limit
    exists (:func:`_lattice_below`), just below ``best``; a split found
    becomes ``best``. The passes pick a split of least max-load among those
    they reach, so one or two usually end at the optimum; after two
    successes in a row a pass tries halfway to the lower bound instead,
    which a failed pass raises to its limit, so the passes are
    O(log(gap / ε)) at worst.
    """
    cap = min(max_sets // 2, _LATTICE_CELLS // (u.n + len(u.t_src) + 1))
    masks = _enumerate_ideals(u, cap)
    if masks is None:
        return cap, None
    lattice = _Lattice(u, masks)
    lattice.knapsack(u)
    best.lower = max(best.lower, _lower_bound(u, k, cpus))
    spent = len(masks) * _PAIRS_PER_SET
    budget = max_sets * _PAIRS_PER_SET
    streak = 0  # passes in a row that found a better split
    while True:
        limit = best.value * (1 - _EPS)
        if streak >= 2 and best.lower < limit:
            limit = (best.lower + best.value) / 2
        pairs, stages, completed = _lattice_below(lattice, u, k, cpus, memory, limit, budget - spent)
        spent += pairs
        if stages is None:
            if not completed:
                return spent // _PAIRS_PER_SET, False
            streak = 0
            best.lower = max(best.lower, limit)
            if limit >= best.value * (1 - _EPS):
                return spent // _PAIRS_PER_SET, True
            continue
        value = _max_load(u, stages)
        if not value < best.value:  # priced below the bound but not: never claim a proof on it
            return spent // _PAIRS_PER_SET, False
        best.stages, best.value, streak = stages, value, streak + 1


def _lattice_below(
    lattice: _Lattice, u: Units, k: int, cpus: int, memory: float, limit: float, budget: int
) -> tuple[int, list[tuple[list[int], bool]] | None, bool]:
    """A split with every load below ``limit``, or None: none exists (or ``budget`` pairs ran out).

    Breadth first by devices used: ``value[(a, c)]`` is finite on the
    ideals that a accelerator and c CPU stages cover, each below ``limit``,
    and that fewer of either do not (it is the least max-load found so, to
    return a good split). An ideal is kept only when it and its complement
    can hold their compute within their devices at ``limit`` each, the CPU
    cores taking what :meth:`_Lattice.saved` allows (a stage's load is at
    least its compute). A block of states and the ideals in its compute
    window are priced at once (:func:`_advance`). Exact: it misses no split
    below ``limit``. O(passes' pairs · (words + features)).
    Returns (pairs priced, stages or None, whether the search completed).
    """
    ok = _bounds(lattice, u, k, cpus, limit)
    # value[cell][J]: the least max-load of the stages found to J in cell (inf: not reached)
    value: dict[tuple[int, int], np.ndarray] = {(0, 0): np.full(lattice.count, np.inf)}
    value[(0, 0)][lattice.empty] = 0.0
    parent: dict[tuple[int, int], np.ndarray] = {}
    pairs = 0
    for used in range(k + cpus):
        for a in range(max(0, used - cpus), min(k, used) + 1):
            cell = (a, used - a)
            if cell not in value:
                continue
            rows = np.flatnonzero(value[cell] < np.inf)
            for on_accel in (True, False):
                target = (a + 1, cell[1]) if on_accel else (a, cell[1] + 1)
                if target[0] > k or target[1] > cpus:
                    continue
                if target not in value:
                    value[target] = np.full(lattice.count, np.inf)
                    parent[target] = np.full(lattice.count, -1, dtype=np.int64)
                # Ideals reached with no more of either kind are not worth reaching again.
                allowed = ok[target].copy()
                for (fa, fc), seen in value.items():
                    if fa <= target[0] and fc <= target[1] and (fa, fc) != target:
                        allowed &= seen == np.inf
                pairs += _advance(
                    lattice,
                    rows,
                    value[cell],
                    on_accel,
                    limit,
                    memory,
                    allowed,
                    value[target],
                    parent[target],
                )
                if pairs > budget:
                    return pairs, None, False
        done = [c for c in value if sum(c) == used + 1 and value[c][lattice.full] < np.inf]
        if done:
            return (
                pairs,
                _unwind_lattice(lattice, parent, min(done, key=lambda c: value[c][lattice.full])),
                True,
            )
    return pairs, None, True


def _bounds(
    lattice: _Lattice, u: Units, k: int, cpus: int, limit: float
) -> dict[tuple[int, int], np.ndarray]:
    """Per (accelerators, CPU cores) used, the ideals that may be covered so and leave a coverable rest."""
    count = lattice.count
    if math.isinf(limit):
        return {(a, c): np.ones(count, dtype=bool) for a in range(k + 1) for c in range(cpus + 1)}
    total = float(np.sum(u.accel_us))
    slack = 1e-9 * (total + limit)  # sums in other orders: prune only what is clearly out
    inside = {c: lattice.saved(False, c * limit) if c else np.zeros(count) for c in range(cpus + 1)}
    rest = {c: lattice.saved(True, c * limit) if c else np.zeros(count) for c in range(cpus + 1)}
    return {
        (a, c): (lattice.accel - inside[c] <= a * limit + slack)
        & (total - lattice.accel - rest[cpus - c] <= (k - a) * limit + slack)
        for a in range(k + 1)
        for c in range(cpus + 1)
    }


def _advance(
    lattice: _Lattice,
    rows: np.ndarray,
    before: np.ndarray,
    on_accel: bool,
    limit: float,
    memory: float,
    allowed: np.ndarray,
    after: np.ndarray,
    parent: np.ndarray,
) -> int:
    """Lower ``after[J]`` for each allowed J that one stage below ``limit`` takes some I in ``rows`` to.

    ``after[J]`` becomes the least ``max(before[I], load(J - I))`` and
    ``parent[J]`` is ``2 I + (0 accelerator, 1 CPU)`` for its I (the first
    of equals). Blocks of ``_BLOCK`` rows against the ideals in their
    window: by compute (an accelerator) or CPU time (a CPU core).
    O(pairs · (words + features)); returns the pairs priced.
    """
    tol = 1e-9 * (abs(limit) + 1.0)
    pairs = 0
    for lo in range(0, len(rows), _BLOCK):
        block = rows[lo : lo + _BLOCK]
        if on_accel:
            first = np.searchsorted(lattice.accel, lattice.accel[block[0]] - tol)
            last = np.searchsorted(lattice.accel, lattice.accel[block[-1]] + limit + tol, side="right")
            cols = first + np.flatnonzero(allowed[first:last])
        else:
            low, high = lattice.cpu[block].min(), lattice.cpu[block].max()
            first = np.searchsorted(lattice.cpu_sorted, low - tol)
            last = np.searchsorted(lattice.cpu_sorted, high + limit + tol, side="right")
            window = np.sort(lattice.cpu_order[first:last])
            cols = window[allowed[window]]
        if not len(cols):
            continue
        pairs += len(block) * len(cols)
        above = np.ones((len(block), len(cols)), dtype=bool)
        mine, theirs = lattice.words[block], lattice.words[cols]
        for w in range(mine.shape[1]):
            above &= (theirs[None, :, w] & mine[:, None, w]) == mine[:, None, w]
        if on_accel:
            above &= lattice.size[cols][None, :] - lattice.size[block][:, None] <= memory
            above &= lattice.bad[cols][None, :] == lattice.bad[block][:, None]
            load = lattice.accel[cols][None, :] - lattice.accel[block][:, None]
            above &= load < limit
            # Price the transfers only where some pair can still fit (the products dominate).
            some = np.flatnonzero(above.any(axis=0))
            above, load, cols = above[:, some], load[:, some], cols[some]
            load += lattice.bnd[cols][None, :] + lattice.delta(block, cols)
        else:
            load = lattice.cpu[cols][None, :] - lattice.cpu[block][:, None]
        above &= load < limit
        cost = np.where(above, np.maximum(load, before[block][:, None]), np.inf)
        origin = cost.argmin(axis=0)
        reached = cost[origin, np.arange(len(cols))]
        better = reached < after[cols]
        after[cols[better]] = reached[better]
        parent[cols[better]] = 2 * block[origin[better]] + (not on_accel)
    return pairs


def _unwind_lattice(
    lattice: _Lattice, parent: dict[tuple[int, int], np.ndarray], cell: tuple[int, int]
) -> list[tuple[list[int], bool]]:
    """The stages that take the empty ideal to the full one in ``cell``, first stage first."""
    stages = []
    j = lattice.full
    while cell != (0, 0):
        code = int(parent[cell][j])
        i, on_accel = code >> 1, not code & 1
        stages.append((np.flatnonzero(lattice.member[j] & ~lattice.member[i]).tolist(), on_accel))
        cell = (cell[0] - 1, cell[1]) if on_accel else (cell[0], cell[1] - 1)
        j = i
    stages.reverse()
    return stages


def _prove(u: Units, k: int, cpus: int, memory: float, best: _Best, max_sets: int) -> tuple[int, bool]:
    """Improve ``best`` until no better split exists; (effort in sets, proven optimal).

    Over the lattice of ideals when it has at most ``max_sets / 2`` of them (and fits)
    (:func:`_prove_lattice`); when it has more, or its passes run out of
    effort, the search over sets (:func:`_search_below`) goes on from the
    best split found, with ``max_sets`` of its own.
    """
    spent, proven = _prove_lattice(u, k, cpus, memory, best, max_sets)
    if proven:
        return spent, True
    total = 0
    while True:
        sets, done = _search_below(u, k, cpus, memory, best, max_sets - total)
        total += sets
        if done is not None:
            return spent + total, done


def _search_below(
    u: Units, k: int, cpus: int, memory: float, best: _Best, max_sets: int
) -> tuple[int, bool | None]:
    """Search for a split strictly better than ``best``; (sets enumerated, completed; None: found one).

    Breadth first over (ideal, CPUs used) by devices used, each state
    expanded once (the first time is with the fewest devices); from a state,
    every set ``S`` making ``base | S`` an ideal is enumerated once (module
    docstring) while its compute and bytes stay within the bound. A split
    found below the bound replaces ``best`` (returning None); a search that
    ends without one proves ``best`` optimal.
    """
    n = u.n
    full = (1 << n) - 1
    cheapest = [
        min(a if ok and k else math.inf, c if cpus else math.inf)
        for a, c, ok in zip(u.accel_us, u.cpu_us, u.accel_ok)
    ]
    total = sum(cheapest)
    grow = Growing(u)
    succs, preds = u.succs, u.preds
    accel_us, cpu_us, size_of, ok_of = u.accel_us, u.cpu_us, u.size, u.accel_ok
    # (CPUs used, ideal) -> (accelerators used, parent state, the set's units, on an accelerator)
    seen: dict[tuple[int, int], tuple[int, tuple[int, int] | None, list[int], bool]] = {
        (0, 0): (0, None, [], True)
    }
    frontier = [(0, 0)]
    sets = 0
    while frontier:
        following: list[tuple[int, int]] = []
        for state in frontier:
            c, base = state
            f = seen[state][0]
            limit = best.value * (1 - _EPS)
            work = total - sum(cheapest[w] for w in range(n) if not base >> w & 1)
            left_after = k + cpus - c - f - 1
            if total - work > (left_after + 1) * limit:
                continue
            missing = [0] * n
            for w in range(n):
                if not base >> w & 1:
                    missing[w] = sum(1 for p in preds[w] if not base >> p & 1)
            available = [w for w in range(n) if not base >> w & 1 and missing[w] == 0]
            accel_room, cpu_room = f < k, c < cpus
            # Communication no growth of the set can undo: a tensor between the set and the
            # ideal below it (``fixed``), kept as units join; a lower bound of the set's comm.
            fixed_of = fixed_costs(u, base)
            fixed = 0.0
            stack: list[tuple[list[int], int]] = [(available, 0)]
            chosen: list[int] = []
            mask = base
            set_work = 0.0
            while stack:
                avail, i = stack[-1]
                if i >= len(avail):
                    stack.pop()
                    if chosen:
                        w = chosen.pop()
                        grow.remove(w)
                        fixed -= fixed_of[w]
                        mask ^= 1 << w
                        set_work -= cheapest[w]
                        for s in succs[w]:
                            missing[s] += 1
                    continue
                stack[-1] = (avail, i + 1)
                w = avail[i]
                limit = best.value * (1 - _EPS)
                can_accel = (
                    accel_room
                    and ok_of[w]
                    and not grow.bad
                    and grow.accel + accel_us[w] + fixed + fixed_of[w] <= limit
                    and grow.size + size_of[w] <= memory
                )
                can_cpu = cpu_room and grow.cpu + cpu_us[w] <= limit
                if not (can_accel or can_cpu):
                    continue  # every set in this branch holds w: too much compute or bytes
                sets += 1
                if sets > max_sets:
                    while chosen:
                        grow.remove(chosen.pop())
                    return sets, False
                grow.add(w)
                fixed += fixed_of[w]
                chosen.append(w)
                mask |= 1 << w
                set_work += cheapest[w]
                opened = []
                for s in succs[w]:
                    missing[s] -= 1
                    if missing[s] == 0:
                        opened.append(s)
                stack.append((avail[i + 1 :] + opened, 0))
                if total - work - set_work > left_after * limit:
                    continue  # the rest cannot fit the devices left
                for on_accel in (True, False):
                    if on_accel:
                        if not can_accel or grow.accel + grow.comm > limit:
                            continue
                        target = (c, mask)
                        devices = f + 1
                    else:
                        if not can_cpu or grow.cpu > limit:
                            continue
                        target = (c + 1, mask)
                        devices = f
                    if target in seen:
                        continue
                    seen[target] = (devices, state, list(chosen), on_accel)
                    if mask == full:
                        # A better split: search again below it (states seen under the
                        # looser bound could hide paths that meet the tighter one).
                        best.stages = _unwind(seen, target)
                        best.value = _max_load(u, best.stages)
                        while chosen:
                            w = chosen.pop()
                            grow.remove(w)
                        return sets, None
                    following.append(target)
        frontier = following
    return sets, True


def _max_load(u: Units, stages: list[tuple[list[int], bool]]) -> float:
    grow = Growing(u)
    worst = 0.0
    for members, on_accel in stages:
        for w in members:
            grow.add(w)
        worst = max(worst, grow.accel + grow.comm if on_accel else grow.cpu)
        for w in members:
            grow.remove(w)
    return worst


def _unwind(seen, state) -> list[tuple[list[int], bool]]:
    """The stages that reach ``state`` in the breadth-first search, first stage first."""
    stages = []
    while True:
        _, parent, members, on_accel = seen[state]
        if parent is None:
            break
        stages.append((sorted(members), on_accel))
        state = parent
    stages.reverse()
    return stages


# ------------------------------------------------------------------ from an op graph
