"""Pipeline-schedule simulator: one minibatch of pipeline-parallel training or inference, timed.

Numbers in, numbers out. ``simulate_pipeline(costs, num_microbatches, schedule)``
takes per-stage costs (:class:`StageCosts`) and returns the minibatch time,
throughput, per-stage busy time, bubble fraction and activation-memory peak,
and the timeline of every op and transfer (:class:`PipelineTiming`).
:func:`render_timeline` draws that timeline as text for a terminal.

Model:

* Stage ``s`` (0-based, in pipeline order) is one device running its ops one
  at a time in the fixed order :func:`op_order` gives. ``F(s, m)`` is the
  forward of microbatch ``m`` on stage ``s``, ``B(s, m)`` its backward,
  ``O(s)`` the stage's optimizer step (once per minibatch, after its last
  backward, when ``optimizer_us[s] > 0``). ``S(s)`` is an all-reduce of a
  weight that several stages hold a copy of (``gradient_syncs``: tied
  embeddings split across stages): it starts once every device holding a
  copy has run its last forward or backward, holds them all for its time,
  and precedes their optimizer steps. Copies on one device need none.
* Schedules (``S`` stages, ``M`` microbatches):

  - ``gpipe``: every stage runs ``F(s, 0..M-1)``, then ``B(s, 0..M-1)``:
    fill-drain with backwards in microbatch order, as
    torch.distributed.pipelining's ``ScheduleGPipe`` issues them (the order of
    the backwards does not change the minibatch time when stages are equal).
  - ``1f1b``: non-interleaved 1F1B (PipeDream-flush), exactly Megatron-LM's
    ``forward_backward_pipelining_without_interleaving``: stage ``s`` runs
    ``w = min(S - s - 1, M)`` warm-up forwards, then ``M - w`` steady pairs
    (one forward, then the backward of the oldest microbatch in flight), then
    ``w`` cool-down backwards. torch's ``Schedule1F1B`` counts the first
    steady forward as warm-up (``min(S - s, M)`` forwards) and issues the
    same per-stage order.
  - ``interleaved`` and ``zbv`` run several stages per device
    (:func:`device_orders`, :func:`stage_devices`): torch's
    ``ScheduleInterleaved1F1B`` and ``ScheduleZBVZeroBubble``. Under ``zbv``
    a backward is two ops: ``I(s, m)``, the input gradient (``backward_us -
    weight_us``), which the stage below waits for, and ``W(s, m)``, the
    weight gradient (``weight_us``), which nothing waits for, so the order
    slips it into what would be bubbles.

  With ``backward_us`` all 0 the costs describe inference: both schedules
  run only ``F(s, 0..M-1)``, and an optimizer step is refused.
* ``F(s, m)`` starts when stage ``s`` is free and the activation of ``m`` has
  arrived from ``s - 1``; ``B(s, m)`` when the stage is free and the gradient
  of ``m`` has arrived from ``s + 1`` (the last stage's backward only needs
  its own forward of ``m``, which its order puts earlier); ``I`` likewise,
  ``W`` when its device is free. Every op starts as
  early as that allows: ``start = max(end of the stage's previous op, input
  arrival)``.
* Transfers overlap compute: each stage pair has one link per direction. A
  link sends one microbatch at a time, in the order the sender produced them:
  a send starts at ``max(producer's end, the link's previous send's end)``
  and the data arrives ``send_forward_us[s]`` (``send_backward_us[s]``) later.
  Between two stages on one device nothing moves: the data is there at once.
* Minibatch time: the end of the last op (all-reduces and optimizer steps included).
  Throughput is ``M / minibatch`` per µs, reported per second.
* In flight on stage ``s``: microbatches whose forward has started on ``s``
  and whose backward (under ``zbv`` its ``W``) on ``s`` has not ended (a backward ending at the instant
  a forward starts frees first); in inference, a microbatch only while its
  forward runs. ``peak_bytes[s] = persistent_bytes[s] + peak_in_flight[s] *
  activation_bytes[s]``.

Closed forms (equal stages ``f``, ``b``, free transfers): both schedules take
``(M + S - 1)(f + b)`` with bubble fraction ``(S - 1) / (M + S - 1)``;
inference takes ``(M + S - 1) f``. GPipe keeps ``M`` microbatches in flight
on every stage, 1F1B ``min(S - s, M)`` on stage ``s``.

Complexity: O(S·M) time and memory. Each stage's order is fixed up front;
times are resolved by a work list of stages, each advanced while its next op's
input has arrived, and a stage is revisited only when one of its inputs
arrives, so every op is resolved once. Both orders are deadlock-free (they
are the orders Megatron-LM and torch run); the simulator asserts that every
op was resolved.

Example:
    >>> costs = StageCosts(forward_us=[1, 1], backward_us=[2, 2])
    >>> timing = simulate_pipeline(costs, 2, "1f1b")
    >>> timing.minibatch_us, round(timing.throughput_per_s), timing.peak_in_flight
    (9.0, 222222, (2, 1))
    >>> print(render_timeline(timing, width=9))
    s0 |FF..BB.BB|
    s1 |.FBBFBB..|
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from baechi_cli.core.errors import InputError

SCHEDULES = ("gpipe", "1f1b")  # one stage per device
# torch's ScheduleInterleaved1F1B (Megatron-LM's interleaved schedule): several stages per device.
INTERLEAVED = "interleaved"
# torch's ScheduleZBVZeroBubble: two stages per device in a V, the backward split into its
# input gradient (I) and its weight gradient (W), which fills the bubbles.
ZBV = "zbv"
ALL_SCHEDULES = (*SCHEDULES, INTERLEAVED, ZBV)

OpKind = Literal["F", "B", "I", "W", "O", "S"]


def _as_tuple(name: str, values: Sequence[float] | None, length: int, *, integral: bool) -> tuple:
    """``values`` as a checked tuple of ``length`` non-negative finite numbers (zeros when None)."""
    if values is None:
        return (0,) * length if integral else (0.0,) * length
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise InputError(f"{name} must be a sequence of numbers, got {values!r}")
    if len(values) != length:
        raise InputError(f"{name} has {len(values)} entries, expected {length}")
    kind = numbers.Integral if integral else numbers.Real
    what = "a non-negative integer" if integral else "a non-negative finite number"
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, kind) or value < 0 or not math.isfinite(value):
            raise InputError(f"{name}[{i}] must be {what}, got {value!r}")
    return tuple(int(v) for v in values) if integral else tuple(float(v) for v in values)


@dataclass(frozen=True)
class StageCosts:
    """Per-stage costs of one microbatch (µs) and per-stage memory (bytes), in pipeline order.

    Any sequence is accepted and stored as a tuple; an optional field left
    None is all zeros. Bad values raise :class:`InputError`.
    """

    forward_us: Sequence[float]
    backward_us: Sequence[float]  # all 0: inference (forwards only)
    send_forward_us: Sequence[float] | None = None  # [s]: activations s -> s+1, S-1 entries
    send_backward_us: Sequence[float] | None = None  # [s]: gradients s+1 -> s, S-1 entries
    persistent_bytes: Sequence[int] | None = None  # weights, optimizer state: always resident
    activation_bytes: Sequence[int] | None = None  # one microbatch's, while in flight
    optimizer_us: Sequence[float] | None = None  # once per minibatch, after the last backward
    # The part of backward_us that computes the weight gradient (zbv runs it apart, as W).
    weight_us: Sequence[float] | None = None
    # (stages, µs): an all-reduce of a weight those stages each hold a copy of, once per
    # minibatch, after their devices' last forward or backward and before their optimizer steps.
    gradient_syncs: Sequence[tuple[Sequence[int], float]] = ()

    def __post_init__(self) -> None:
        if (
            isinstance(self.forward_us, str)
            or not isinstance(self.forward_us, Sequence)
            or not self.forward_us
        ):
            raise InputError(
                f"forward_us must list one time per stage (at least one), got {self.forward_us!r}"
            )
        stages = len(self.forward_us)
        normalized = {
            "forward_us": _as_tuple("forward_us", self.forward_us, stages, integral=False),
            "backward_us": _as_tuple("backward_us", self.backward_us, stages, integral=False),
            "send_forward_us": _as_tuple("send_forward_us", self.send_forward_us, stages - 1, integral=False),
            "send_backward_us": _as_tuple(
                "send_backward_us", self.send_backward_us, stages - 1, integral=False
            ),
            "persistent_bytes": _as_tuple("persistent_bytes", self.persistent_bytes, stages, integral=True),
            "activation_bytes": _as_tuple("activation_bytes", self.activation_bytes, stages, integral=True),
            "optimizer_us": _as_tuple("optimizer_us", self.optimizer_us, stages, integral=False),
            "weight_us": _as_tuple("weight_us", self.weight_us, stages, integral=False),
        }
        for i, (w, b) in enumerate(zip(normalized["weight_us"], normalized["backward_us"])):
            if w > b:
                raise InputError(f"weight_us[{i}] must be at most backward_us[{i}] ({b!r}), got {w!r}")
        syncs = []
        for i, sync in enumerate(self.gradient_syncs):
            members, us = sync
            if (
                isinstance(us, bool)
                or not isinstance(us, numbers.Real)
                or us < 0
                or not math.isfinite(us)
                or not members
                or any(isinstance(s, bool) or not isinstance(s, numbers.Integral) for s in members)
                or not all(0 <= s < stages for s in members)
            ):
                raise InputError(
                    f"gradient_syncs[{i}] must be (stages in 0..{stages - 1}, µs >= 0), got {sync!r}"
                )
            syncs.append((tuple(sorted({int(s) for s in members})), float(us)))
        normalized["gradient_syncs"] = tuple(syncs)
        for name, value in normalized.items():
            object.__setattr__(self, name, value)  # frozen: the checked tuples replace the inputs
        if not self.training and any(self.optimizer_us):
            raise InputError("optimizer_us is set but backward_us is all 0 (inference has no optimizer step)")

    @property
    def num_stages(self) -> int:
        return len(self.forward_us)

    @property
    def training(self) -> bool:
        """Whether there is a backward pass: some ``backward_us`` is above 0."""
        return any(self.backward_us)


class PipelineEvent(NamedTuple):
    """One op on one stage; ``microbatch`` is None for an optimizer step ('O') and a gradient
    all-reduce ('S')."""

    stage: int
    kind: OpKind
    microbatch: int | None
    start_us: float
    end_us: float


class LinkTransfer(NamedTuple):
    """One microbatch's activations (``src < dst``) or gradients (``src > dst``) on a link."""

    src_stage: int
    dst_stage: int
    microbatch: int
    start_us: float
    end_us: float  # the data is present on dst_stage from here on


@dataclass(frozen=True)
class PipelineTiming:
    """One minibatch of a pipeline schedule; per-stage tuples are indexed by stage."""

    schedule: str
    num_microbatches: int
    minibatch_us: float
    throughput_per_s: float  # microbatches per second; inf when every cost is 0
    samples_per_s: float | None  # throughput_per_s * microbatch_size, when given
    busy_us: tuple[float, ...]
    bubble_fraction: tuple[float, ...]  # 1 - busy / minibatch (0 when the minibatch takes 0 µs)
    peak_in_flight: tuple[int, ...]
    peak_bytes: tuple[int, ...]
    # Grouped by stage; each stage's events in the order it runs them (starts never decrease).
    events: tuple[PipelineEvent, ...]
    # Grouped by link (forward links first, by sender), each in the order the link sends.
    transfers: tuple[LinkTransfer, ...]
    # Per stage, its device; per device, its busy share and peak (equal to the per-stage
    # tuples when every device runs one stage).
    stage_device: tuple[int, ...] = ()
    device_bubble_fraction: tuple[float, ...] = ()
    device_peak_bytes: tuple[int, ...] = ()

    @property
    def num_stages(self) -> int:
        return len(self.busy_us)

    @property
    def num_devices(self) -> int:
        return len(self.device_peak_bytes)


def _check_microbatches(num_microbatches: int) -> None:
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, numbers.Integral):
        raise InputError(f"the number of microbatches must be an integer, got {num_microbatches!r}")
    if num_microbatches < 1:
        raise InputError(f"the number of microbatches must be at least 1, got {num_microbatches}")


def op_order(
    schedule: str, num_stages: int, num_microbatches: int, *, training: bool = True
) -> list[list[tuple[OpKind, int]]]:
    """Each stage's ops, as (kind 'F' or 'B', microbatch), in the order ``schedule`` runs them.

    See the module docstring for the schedules; optimizer steps are not
    listed. O(S·M).

    >>> op_order("1f1b", 3, 4)[0]
    [('F', 0), ('F', 1), ('F', 2), ('B', 0), ('F', 3), ('B', 1), ('B', 2), ('B', 3)]
    >>> op_order("gpipe", 2, 2)[1], op_order("1f1b", 2, 2, training=False)[1]
    ([('F', 0), ('F', 1), ('B', 0), ('B', 1)], [('F', 0), ('F', 1)])
    """
    if schedule in (INTERLEAVED, ZBV):
        raise InputError(f"the {schedule} schedule runs several stages per device: see device_orders")
    if schedule not in SCHEDULES:
        raise InputError(f"unknown schedule {schedule!r}: expected one of {', '.join(ALL_SCHEDULES)}")
    _check_microbatches(num_microbatches)
    forwards: list[tuple[OpKind, int]] = [("F", m) for m in range(num_microbatches)]
    if not training:
        return [list(forwards) for _ in range(num_stages)]
    backwards: list[tuple[OpKind, int]] = [("B", m) for m in range(num_microbatches)]
    if schedule == "gpipe":
        return [forwards + backwards for _ in range(num_stages)]
    orders = []
    for stage in range(num_stages):
        warmup = min(num_stages - stage - 1, num_microbatches)
        order = forwards[:warmup]
        for steady in range(num_microbatches - warmup):
            order += [forwards[warmup + steady], backwards[steady]]
        order += backwards[num_microbatches - warmup :]
        orders.append(order)
    return orders


def stage_devices(schedule: str, num_stages: int, num_devices: int) -> list[int]:
    """The device of each stage: ``s % num_devices``, except under ``zbv``, whose stages go down
    the devices and back up (a V: stages ``d`` and ``2 D - 1 - d`` on device ``d``), as torch's
    ``generate_stage_to_rank_mapping(style="v")``. O(S).

    >>> stage_devices("interleaved", 6, 3), stage_devices("zbv", 6, 3)
    ([0, 1, 2, 0, 1, 2], [0, 1, 2, 2, 1, 0])
    """
    if schedule == ZBV:
        return [s if s < num_devices else 2 * num_devices - 1 - s for s in range(num_stages)]
    return [s % num_devices for s in range(num_stages)]


def device_orders(
    schedule: str, num_stages: int, num_devices: int, num_microbatches: int, *, training: bool = True
) -> list[list[tuple[OpKind, int, int]]]:
    """Each device's ops, as (kind, stage, microbatch), in the order ``schedule`` runs them.

    Stage ``s`` runs on device ``stage_devices(...)[s]``. GPipe and 1F1B need one
    stage per device (their :func:`op_order`). ``interleaved`` is torch's
    ``ScheduleInterleaved1F1B`` with ``v = num_stages / num_devices`` stages
    per device: ``r = max(1, M // D)`` rounds of ``M / r`` microbatches (M
    must be a multiple of ``r``); device ``d`` runs ``min((v - 1) M/r + 2 (D
    - 1 - d), v M)`` warm-up forwards, then pairs of a forward and a
    backward, then the remaining backwards, forward step ``i`` on its local
    stage ``(i // (M/r)) % v`` and backward step ``i`` (counted from the end
    of the warm-up) on ``v - 1 - (i // (M/r)) % v``, each stage's
    microbatches in order. ``zbv`` is torch's ``ScheduleZBVZeroBubble``
    (training only, two stages per device in a V): each backward is an ``I``
    (input gradient, sent on) and a ``W`` (weight gradient, free to wait);
    device ``d`` of ``D`` runs ``2 (D - d) - 1`` forwards of its first stage,
    ``d`` pairs of forwards of both, ``D - d`` rounds of F, I, W on its second
    stage, then F, I, W of the first stage and of the second in turn, and
    drains with the Is of both stages, then the Ws (:func:`_zbv_order`).
    O(S·M).

    >>> [f"{k}{s}.{m}" for k, s, m in device_orders("interleaved", 4, 2, 2)[1]]
    ['F1.0', 'F1.1', 'F3.0', 'B3.0', 'F3.1', 'B3.1', 'B1.0', 'B1.1']
    """
    _check_microbatches(num_microbatches)
    if schedule == ZBV:
        if num_stages != 2 * num_devices:
            raise InputError(
                f"the zbv schedule runs two stages per device: {num_stages} stages on {num_devices}"
            )
        if not training:
            raise InputError("the zbv schedule splits backwards: it needs a training step")
        return [_zbv_order(d, num_devices, num_microbatches) for d in range(num_devices)]
    if schedule != INTERLEAVED:
        if num_devices != num_stages:
            raise InputError(
                f"{schedule} runs one stage per device: {num_stages} stages on {num_devices} devices"
            )
        return [
            [(kind, s, m) for kind, m in order]
            for s, order in enumerate(op_order(schedule, num_stages, num_microbatches, training=training))
        ]
    if num_devices < 1 or num_stages % num_devices:
        raise InputError(
            f"the interleaved schedule needs a whole number of stages per device: "
            f"{num_stages} stages on {num_devices} devices"
        )
    local = num_stages // num_devices
    rounds = max(1, num_microbatches // num_devices)
    if num_microbatches % rounds:
        raise InputError(
            f"the interleaved schedule needs the microbatches to be a multiple of its rounds "
            f"(max(1, M // devices) = {rounds}), got {num_microbatches}"
        )
    per_round = num_microbatches // rounds
    return [
        _interleaved_order(d, num_devices, local, num_microbatches, per_round, training)
        for d in range(num_devices)
    ]


def _interleaved_order(
    device: int, devices: int, local: int, microbatches: int, per_round: int, training: bool
) -> list[tuple[OpKind, int, int]]:
    """One device's ops under the interleaved schedule (:func:`device_orders`)."""
    steps = local * microbatches
    warmup = steps if not training else min((local - 1) * per_round + 2 * (devices - 1 - device), steps)
    done = {"F": [0] * local, "B": [0] * local}
    order: list[tuple[OpKind, int, int]] = []
    for step in range(steps + (warmup if training else 0)):
        kinds: list[OpKind] = []
        if step < steps:
            kinds.append("F")
        if training and step >= warmup:
            kinds.append("B")
        for kind in kinds:
            if kind == "F":
                chunk = (step // per_round) % local
            else:
                chunk = local - 1 - ((step - warmup) // per_round) % local
            order.append((kind, chunk * devices + device, done[kind][chunk]))
            done[kind][chunk] += 1
    return order


def _zbv_order(device: int, devices: int, microbatches: int) -> list[tuple[OpKind, int, int]]:
    """One device's ops under ``zbv`` (:func:`device_orders`), as torch's ``ScheduleZBVZeroBubble``
    lists them: the order is laid out for at least ``2 D - 1`` microbatches, and the ops of
    microbatches past the last are left out."""
    first, second = device, 2 * devices - 1 - device  # the V's two stages on this device
    laid_out = max(2 * devices - 1, microbatches)
    order: list[tuple[OpKind, int, int]] = []
    count = {(kind, stage): 0 for kind in "FIW" for stage in (first, second)}

    def run(kind: OpKind, stage: int) -> None:
        order.append((kind, stage, count[kind, stage]))
        count[kind, stage] += 1

    def backward(stage: int) -> None:  # the input gradient, then at once the weight gradient
        run("I", stage)
        run("W", stage)

    for _ in range(2 * (devices - device) - 1):
        run("F", first)
    for _ in range(device):
        run("F", second)
        run("F", first)
    for _ in range(devices - device):
        run("F", second)
        backward(second)
    while count["F", second] < count["F", first] or count["F", first] < laid_out:
        if count["F", first] < laid_out:
            run("F", first)
        backward(first)
        run("F", second)
        backward(second)
    for _ in range(device):
        run("I", first)
        run("I", second)
    for _ in range(devices - device):
        backward(first)
    while count["W", second] < count["I", second]:
        run("W", second)
    while count["W", first] < count["I", first]:
        run("W", first)
    return [op for op in order if op[2] < microbatches]


def simulate_pipeline(
    costs: StageCosts,
    num_microbatches: int,
    schedule: str = "1f1b",
    *,
    microbatch_size: int | None = None,
    devices: int | None = None,
) -> PipelineTiming:
    """Time one minibatch of ``num_microbatches`` under ``schedule`` (see module docstring).

    ``devices``: how many devices run the stages, stage ``s`` on ``s %
    devices`` (default: one per stage; the interleaved schedule needs fewer).
    A device runs one op at a time in :func:`device_orders`'s order; a link
    is one direction between two devices, shared by every stage pair that
    uses it. ``microbatch_size`` (samples per microbatch), when given, fills
    ``samples_per_s``. Bad arguments raise :class:`InputError`. O(S·M).

    >>> costs = StageCosts([1, 1], [0, 0], send_forward_us=[1])
    >>> timing = simulate_pipeline(costs, 3, "gpipe", microbatch_size=8)
    >>> timing.minibatch_us, timing.bubble_fraction, timing.samples_per_s
    (5.0, (0.4, 0.4), 4800000.0)
    """
    if microbatch_size is not None and (
        isinstance(microbatch_size, bool)
        or not isinstance(microbatch_size, numbers.Integral)
        or microbatch_size < 1
    ):
        raise InputError(f"microbatch_size must be a positive integer, got {microbatch_size!r}")
    stages, training = costs.num_stages, costs.training
    num_devices = stages if devices is None else devices
    orders = device_orders(schedule, stages, num_devices, num_microbatches, training=training)
    device_of = stage_devices(schedule, stages, num_devices)
    weight = costs.weight_us
    duration = {
        "F": costs.forward_us,
        "B": costs.backward_us,
        "I": tuple(b - w for b, w in zip(costs.backward_us, weight)),
        "W": weight,
    }

    # Arrival times of each stage's inputs, None until the producer is resolved. Stage 0's
    # inputs are there from the start; the last stage's "gradient" is its own forward's end.
    activation_at: list[list[float | None]] = [[None] * num_microbatches for _ in range(stages)]
    activation_at[0] = [0.0] * num_microbatches
    gradient_at: list[list[float | None]] = [[None] * num_microbatches for _ in range(stages)]
    link_free: dict[tuple[int, int], float] = {}
    forward_sends: list[list[LinkTransfer]] = [[] for _ in range(stages - 1)]
    backward_sends: list[list[LinkTransfer]] = [[] for _ in range(stages - 1)]
    stage_events: list[list[PipelineEvent]] = [[] for _ in range(stages)]
    device_free = [0.0] * num_devices
    next_op = [0] * num_devices

    def send(src: int, dst: int, ready: float, us: float) -> tuple[float, float]:
        link = (device_of[src], device_of[dst])
        if link[0] == link[1]:
            return ready, ready  # two stages of one device: nothing moves
        start = max(ready, link_free.get(link, 0.0))
        link_free[link] = start + us
        return start, start + us

    to_visit = list(range(num_devices))
    while to_visit:
        device = to_visit.pop()
        order = orders[device]
        while next_op[device] < len(order):
            kind, stage, mb = order[next_op[device]]
            # A W follows its I on the same device, which the order puts earlier.
            arrival = (
                activation_at[stage][mb] if kind == "F" else 0.0 if kind == "W" else gradient_at[stage][mb]
            )
            if arrival is None:
                break  # revisited when the input arrives
            start = max(device_free[device], arrival)
            end = start + duration[kind][stage]
            stage_events[stage].append(PipelineEvent(stage, kind, mb, start, end))
            device_free[device] = end
            next_op[device] += 1
            if kind == "F" and stage + 1 < stages:
                began, arrived = send(stage, stage + 1, end, costs.send_forward_us[stage])
                activation_at[stage + 1][mb] = arrived
                forward_sends[stage].append(LinkTransfer(stage, stage + 1, mb, began, arrived))
                to_visit.append(device_of[stage + 1])
            elif kind == "F":
                gradient_at[stage][mb] = end
            elif kind != "W" and stage > 0:  # a backward (B or I) sends its gradient on; a W nothing
                began, arrived = send(stage, stage - 1, end, costs.send_backward_us[stage - 1])
                gradient_at[stage - 1][mb] = arrived
                backward_sends[stage - 1].append(LinkTransfer(stage, stage - 1, mb, began, arrived))
                to_visit.append(device_of[stage - 1])
    assert next_op == [len(order) for order in orders], "a schedule's fixed order deadlocked"

    for members, us in costs.gradient_syncs:
        # Copies on one device are one tensor: only copies on several devices all-reduce.
        by_device = {device_of[s]: s for s in reversed(members)}
        if len(by_device) < 2:
            continue
        start = max(device_free[d] for d in by_device)
        for device, stage in sorted(by_device.items()):
            device_free[device] = start + us
            stage_events[stage].append(PipelineEvent(stage, "S", None, start, start + us))
    for stage in range(stages):
        if costs.optimizer_us[stage] > 0:
            device = device_of[stage]
            start = device_free[device]
            device_free[device] = start + costs.optimizer_us[stage]
            stage_events[stage].append(PipelineEvent(stage, "O", None, start, device_free[device]))

    minibatch_us = max(device_free)
    # From the costs rather than the events' end - start: exact, not rounded per op.
    busy_us = tuple(
        num_microbatches * (costs.forward_us[s] + costs.backward_us[s]) + costs.optimizer_us[s]
        for s in range(stages)
    )
    stage_orders: list[list[tuple[OpKind, int]]] = [[] for _ in range(stages)]
    for order in orders:
        for kind, stage, mb in order:
            stage_orders[stage].append((kind, mb))
    peak_in_flight = tuple(_peak_in_flight(order, training) for order in stage_orders)
    device_busy = [0.0] * num_devices
    device_persistent = [0] * num_devices
    for s in range(stages):
        device_busy[device_of[s]] += busy_us[s]
        device_persistent[device_of[s]] += costs.persistent_bytes[s]
    throughput_per_s = num_microbatches / minibatch_us * 1e6 if minibatch_us > 0 else math.inf

    def bubble(busy: float) -> float:
        return 1 - busy / minibatch_us if minibatch_us > 0 else 0.0

    return PipelineTiming(
        schedule=schedule,
        num_microbatches=num_microbatches,
        minibatch_us=minibatch_us,
        throughput_per_s=throughput_per_s,
        samples_per_s=None if microbatch_size is None else throughput_per_s * microbatch_size,
        busy_us=busy_us,
        bubble_fraction=tuple(bubble(busy) for busy in busy_us),
        peak_in_flight=peak_in_flight,
        peak_bytes=tuple(
            persistent + peak * activation
            for persistent, peak, activation in zip(
                costs.persistent_bytes, peak_in_flight, costs.activation_bytes
            )
        ),
        events=tuple(event for events in stage_events for event in events),
        transfers=tuple(t for sends in forward_sends + backward_sends for t in sends),
        stage_device=tuple(device_of),
        device_bubble_fraction=tuple(bubble(busy) for busy in device_busy),
        device_peak_bytes=tuple(
            persistent + _peak_activation_bytes(order, costs.activation_bytes, training)
            for persistent, order in zip(device_persistent, orders)
        ),
    )


def _peak_activation_bytes(
    order: list[tuple[OpKind, int, int]], activation: Sequence[int], training: bool
) -> int:
    """Most activation bytes in flight at once on a device that runs ``order`` (as :func:`_peak_in_flight`)."""
    live = peak = 0
    for kind, stage, _ in order:
        if kind == "F":
            live += activation[stage]
            peak = max(peak, live)
        if kind in ("B", "W") or not training:  # a zbv microbatch's activations live until its W
            live -= activation[stage]
    return peak


def _peak_in_flight(order: list[tuple[OpKind, int]], training: bool) -> int:
    """Most microbatches in flight at once on a stage that runs ``order``.

    A stage runs one op at a time, so the count changes only at a forward's
    start (+1) and a backward's end (-1, or the forward's own end in inference).
    """
    in_flight = peak = 0
    for kind, _ in order:
        if kind == "F":
            in_flight += 1
            peak = max(peak, in_flight)
        if kind in ("B", "W") or not training:
            in_flight -= 1
    return peak


def render_timeline(timing: PipelineTiming, width: int = 72) -> str:
    """The timeline as text: one line per stage (per device ``d0, d1, ...`` when a device runs
    several), ``width`` columns spanning the minibatch.

    Each column shows what its stage runs at the column's midpoint: ``F``
    (forward), ``B`` (backward), ``O`` (optimizer step), ``S`` (a tied weight's
    gradient all-reduce) or ``.`` (idle, a bubble). Ops shorter than a column may not show. O(S·M + S·width).

    >>> timing = simulate_pipeline(StageCosts([1, 1, 1], [0, 0, 0]), 3, "gpipe")
    >>> print(render_timeline(timing, width=10))
    s0 |FFFFFF....|
    s1 |..FFFFFF..|
    s2 |....FFFFFF|
    """
    if isinstance(width, bool) or not isinstance(width, numbers.Integral) or width < 1:
        raise InputError(f"the timeline width must be a positive integer, got {width!r}")
    device_of = timing.stage_device or tuple(range(timing.num_stages))
    rows = max(device_of) + 1
    prefix = "s" if rows == timing.num_stages else "d"
    by_row: list[list[PipelineEvent]] = [[] for _ in range(rows)]
    for event in timing.events:
        by_row[device_of[event.stage]].append(event)
    label_width = len(f"{prefix}{rows - 1}")
    lines = []
    for row, events in enumerate(by_row):
        events.sort(key=lambda e: e.start_us)
        cells = []
        current = 0  # events before it ended at or before the current column's midpoint
        for column in range(width):
            midpoint = (column + 0.5) * timing.minibatch_us / width
            while current < len(events) and events[current].end_us <= midpoint:
                current += 1
            running = current < len(events) and events[current].start_us <= midpoint
            cells.append(events[current].kind if running else ".")
        lines.append(f"{f'{prefix}{row}':>{label_width}} |{''.join(cells)}|")
    return "\n".join(lines)
