"""Pipeline-schedule simulator: one minibatch of pipeline-parallel training or inference, timed.

``simulate_pipeline(costs, num_microbatches, schedule)`` takes per-stage costs
(:class:`StageCosts`) and returns the minibatch time, throughput, per-stage busy time, bubble
fraction, activation-memory peak and the timeline of every op and transfer
(:class:`PipelineTiming`); :mod:`baechi_cli.pipeline.timeline` draws it as text.

Model. ``F(s, m)`` is the forward of microbatch ``m`` on stage ``s``, ``B(s, m)`` its backward
(under ``zbv`` an input gradient ``I``, which the stage below waits for, and a weight gradient
``W``, which nothing waits for), ``O(s)`` the stage's optimizer step after its last backward, and
``S(s)`` an all-reduce of a weight copied to several devices (``gradient_syncs``), run once every
holder has run its last forward or backward, before their optimizer steps. A schedule
(:data:`REGISTRY`: ``gpipe``, ``1f1b``, ``interleaved``, ``zbv``, each a :class:`Schedule`
matching a ``torch.distributed.pipelining`` class) fixes which device runs each stage and each
device's op order. Every op starts as early as its device and its input allow: ``F(s, m)`` once
the activation of ``m`` arrived from ``s - 1``, ``B(s, m)`` once its gradient arrived from
``s + 1``. Each stage pair has one link per direction, sending one microbatch at a time in the
order produced; data arrives ``send_forward_us[s]`` (``send_backward_us[s]``) after the send
starts, at once between stages on one device. The minibatch time is the end of the last op;
throughput is ``M / minibatch``. In flight on ``s``: microbatches whose forward started there and
whose backward (``W``) has not ended; ``peak_bytes[s]`` is ``persistent_bytes[s]`` plus, at
the worst op, the running microbatch's peak (``forward_peak_bytes``, ``backward_peak_bytes``)
and what each other microbatch in flight keeps (``activation_bytes``). With ``backward_us`` all 0 the costs describe inference: forwards only, and
an optimizer step is refused.

Closed forms (equal stages ``f``, ``b``, free transfers): gpipe and 1f1b take
``(M + S - 1)(f + b)``, bubble fraction ``(S - 1) / (M + S - 1)``; inference ``(M + S - 1) f``.
GPipe keeps ``M`` microbatches in flight on every stage, 1F1B ``min(S - s, M)`` on stage ``s``.

Complexity: O(S·M) time and memory: orders are fixed up front and a work list revisits a stage
only when an input arrives, so every op is resolved once. The orders are deadlock-free
(Megatron-LM's and torch's); the simulator asserts that every op was resolved.

Example:
    >>> costs = StageCosts(forward_us=[1, 1], backward_us=[2, 2])
    >>> timing = simulate_pipeline(costs, 2, "1f1b")
    >>> timing.minibatch_us, round(timing.throughput_per_s), timing.peak_in_flight
    (9.0, 222222, (2, 1))
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from baechi_cli.core.errors import InputError
from baechi_cli.core.registry import Registry

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
    # The most one microbatch holds at once while its forward (backward) runs on the stage, its
    # temporaries included (None: its activation_bytes).
    forward_peak_bytes: Sequence[int] | None = None
    backward_peak_bytes: Sequence[int] | None = None
    # One microbatch's input gradients the stage sends to another device, held from its backward
    # (``I``) until torch waits for the send: the step's end where the schedule
    # ``holds_sent_gradients``, else the stage's next send.
    sent_gradient_bytes: Sequence[int] | None = None
    # One microbatch's values the stage sends on to another device: where the schedule
    # ``holds_sent_activations``, still held after its backward frees them, until the step's end.
    sent_activation_bytes: Sequence[int] | None = None
    optimizer_us: Sequence[float] | None = None  # once per minibatch, after the last backward
    # The part of backward_us that computes the weight gradient (zbv runs it apart, as W).
    weight_us: Sequence[float] | None = None
    # What one microbatch holds beyond its activations from its input gradient (I) until its weight
    # gradient (W) where the schedule runs them apart: the gradients W reads.
    weight_pending_bytes: Sequence[int] | None = None
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
            "forward_peak_bytes": _as_tuple(
                "forward_peak_bytes", self.forward_peak_bytes, stages, integral=True
            ),
            "backward_peak_bytes": _as_tuple(
                "backward_peak_bytes", self.backward_peak_bytes, stages, integral=True
            ),
            "sent_gradient_bytes": _as_tuple(
                "sent_gradient_bytes", self.sent_gradient_bytes, stages, integral=True
            ),
            "sent_activation_bytes": _as_tuple(
                "sent_activation_bytes", self.sent_activation_bytes, stages, integral=True
            ),
            "optimizer_us": _as_tuple("optimizer_us", self.optimizer_us, stages, integral=False),
            "weight_us": _as_tuple("weight_us", self.weight_us, stages, integral=False),
            "weight_pending_bytes": _as_tuple(
                "weight_pending_bytes", self.weight_pending_bytes, stages, integral=True
            ),
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
        for name in ("forward_peak_bytes", "backward_peak_bytes"):
            if getattr(self, name) is None:  # a microbatch's peak: what it keeps, by default
                normalized[name] = normalized["activation_bytes"]
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


class Schedule:
    """One pipeline schedule: which device runs each stage, and the order each device runs its ops.

    A new schedule is one subclass plus one entry in :data:`REGISTRY` (:func:`register`): the
    placer, the simulator, ``--schedule``'s choices and the report read it from there.
    ``stages_per_device`` is how many stages the placer cuts per device (1: one stage per device;
    more: that many per device); ``compared_by_default`` says whether ``--schedule`` left out
    tries it; ``torch_class`` names the ``torch.distributed.pipelining`` schedule that runs it;
    ``needs_training`` refuses an inference step (:func:`device_orders`); ``holds_sent_gradients``
    says whether the torch class waits for its gradient sends only when the step ends (each
    stage then holds every microbatch's input gradient until then; else one), and
    ``holds_sent_activations`` whether it waits so for its forward sends too (each value a
    stage sent stays held after its backward until then). A schedule with one
    stage per device may instead subclass :class:`OneStagePerDevice` and give each stage's
    ``op_order``.
    """

    name: str = ""
    torch_class: str = ""
    stages_per_device: int = 1
    compared_by_default: bool = True
    needs_training: bool = False
    holds_sent_gradients: bool = True
    holds_sent_activations: bool = False

    def stage_devices(self, num_stages: int, num_devices: int) -> list[int]:
        """The device of each stage: ``s % num_devices`` unless the schedule says otherwise. O(S)."""
        return [s % num_devices for s in range(num_stages)]

    def device_orders(
        self, num_stages: int, num_devices: int, num_microbatches: int, training: bool
    ) -> list[list[tuple[OpKind, int, int]]]:
        """Each device's ops, as (kind, stage, microbatch), in the order the schedule runs them."""
        raise NotImplementedError

    def check_devices(self, num_stages: int, num_devices: int) -> None:
        """InputError unless ``num_stages`` stages can run on ``num_devices`` devices."""
        if self.stages_per_device == 1 and num_devices != num_stages:
            raise InputError(
                f"{self.name} runs one stage per device: {num_stages} stages on {num_devices} devices"
            )


class OneStagePerDevice(Schedule):
    """A schedule with one stage per device, defined by each stage's own op order."""

    def op_order(
        self, num_stages: int, num_microbatches: int, training: bool
    ) -> list[list[tuple[OpKind, int]]]:
        """Each stage's ops, as (kind, microbatch), in the order the schedule runs them. O(S·M)."""
        raise NotImplementedError

    def device_orders(
        self, num_stages: int, num_devices: int, num_microbatches: int, training: bool
    ) -> list[list[tuple[OpKind, int, int]]]:
        self.check_devices(num_stages, num_devices)
        return [
            [(kind, s, m) for kind, m in order]
            for s, order in enumerate(self.op_order(num_stages, num_microbatches, training))
        ]


class GPipe(OneStagePerDevice):
    """Every forward, then every backward (torch's ``ScheduleGPipe``).

    Fill-drain with backwards in microbatch order, as torch issues them (the order of the
    backwards does not change the minibatch time when stages are equal).
    """

    name = "gpipe"
    torch_class = "ScheduleGPipe"
    compared_by_default = False

    def op_order(
        self, num_stages: int, num_microbatches: int, training: bool
    ) -> list[list[tuple[OpKind, int]]]:
        forwards: list[tuple[OpKind, int]] = [("F", m) for m in range(num_microbatches)]
        backwards: list[tuple[OpKind, int]] = [("B", m) for m in range(num_microbatches)] if training else []
        return [forwards + backwards for _ in range(num_stages)]


class OneFOneB(OneStagePerDevice):
    """Warm-up forwards, then one forward and one backward in turn (torch's ``Schedule1F1B``).

    Non-interleaved 1F1B (PipeDream-flush), exactly Megatron-LM's
    ``forward_backward_pipelining_without_interleaving``: stage ``s`` runs ``w = min(S - s - 1, M)``
    warm-up forwards, then ``M - w`` pairs (a forward, then the backward of the oldest microbatch
    in flight), then ``w`` backwards. torch's ``Schedule1F1B`` counts the first steady forward as
    warm-up and issues the same per-stage order.
    """

    name = "1f1b"
    torch_class = "Schedule1F1B"
    holds_sent_gradients = False  # each microbatch's sends are waited for before the next

    def op_order(
        self, num_stages: int, num_microbatches: int, training: bool
    ) -> list[list[tuple[OpKind, int]]]:
        forwards: list[tuple[OpKind, int]] = [("F", m) for m in range(num_microbatches)]
        if not training:
            return [list(forwards) for _ in range(num_stages)]
        backwards: list[tuple[OpKind, int]] = [("B", m) for m in range(num_microbatches)]
        orders = []
        for stage in range(num_stages):
            warmup = min(num_stages - stage - 1, num_microbatches)
            order = forwards[:warmup]
            for steady in range(num_microbatches - warmup):
                order += [forwards[warmup + steady], backwards[steady]]
            order += backwards[num_microbatches - warmup :]
            orders.append(order)
        return orders


class Interleaved(Schedule):
    """Several stages per device, round robin (torch's ``ScheduleInterleaved1F1B``, Megatron-LM's).

    ``v = num_stages / num_devices`` stages per device: ``r = max(1, M // D)`` rounds of ``M / r``
    microbatches (M must be a multiple of ``r``); device ``d`` runs ``min((v - 1) M/r + 2 (D - 1 -
    d), v M)`` warm-up forwards, then pairs of a forward and a backward, then the remaining
    backwards, forward step ``i`` on its local stage ``(i // (M/r)) % v`` and backward step ``i``
    (counted from the end of the warm-up) on ``v - 1 - (i // (M/r)) % v``, each stage's
    microbatches in order.
    """

    name = "interleaved"
    torch_class = "ScheduleInterleaved1F1B"
    holds_sent_activations = True  # torch's runtime schedules wait for every send at the step's end
    stages_per_device = 2

    def check_devices(self, num_stages: int, num_devices: int) -> None:
        if num_devices < 1 or num_stages % num_devices:
            raise InputError(
                f"the interleaved schedule needs a whole number of stages per device: "
                f"{num_stages} stages on {num_devices} devices"
            )

    def device_orders(
        self, num_stages: int, num_devices: int, num_microbatches: int, training: bool
    ) -> list[list[tuple[OpKind, int, int]]]:
        self.check_devices(num_stages, num_devices)
        local = num_stages // num_devices
        rounds = max(1, num_microbatches // num_devices)
        if num_microbatches % rounds:
            raise InputError(
                f"the interleaved schedule needs the microbatches to be a multiple of its rounds "
                f"(max(1, M // devices) = {rounds}), got {num_microbatches}"
            )
        per_round = num_microbatches // rounds
        return [
            self._order(d, num_devices, local, num_microbatches, per_round, training)
            for d in range(num_devices)
        ]

    @staticmethod
    def _order(
        device: int, devices: int, local: int, microbatches: int, per_round: int, training: bool
    ) -> list[tuple[OpKind, int, int]]:
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


class ZeroBubbleV(Schedule):
    """Two stages per device in a V, each backward split into I and W (torch's ``ScheduleZBVZeroBubble``).

    Stages ``d`` and ``2 D - 1 - d`` run on device ``d`` (torch's
    ``generate_stage_to_rank_mapping(style="v")``). Each backward is an ``I`` (input gradient,
    sent on) and a ``W`` (weight gradient, free to wait). Device ``d`` of ``D`` runs ``2 (D - d) -
    1`` forwards of its first stage, ``d`` pairs of forwards of both, ``D - d`` rounds of F, I, W
    on its second stage, then F, I, W of the first stage and of the second in turn, and drains
    with the Is of both stages, then the Ws. The order is laid out for at least ``2 D - 1``
    microbatches, as torch lists it, and the ops of microbatches past the last are left out.
    Training only.
    """

    name = "zbv"
    torch_class = "ScheduleZBVZeroBubble"
    holds_sent_activations = True  # torch's runtime schedules wait for every send at the step's end
    stages_per_device = 2
    needs_training = True

    def stage_devices(self, num_stages: int, num_devices: int) -> list[int]:
        return [s if s < num_devices else 2 * num_devices - 1 - s for s in range(num_stages)]

    def check_devices(self, num_stages: int, num_devices: int) -> None:
        if num_stages != 2 * num_devices:
            raise InputError(
                f"the zbv schedule runs two stages per device: {num_stages} stages on {num_devices}"
            )

    def device_orders(
        self, num_stages: int, num_devices: int, num_microbatches: int, training: bool
    ) -> list[list[tuple[OpKind, int, int]]]:
        self.check_devices(num_stages, num_devices)
        return [self._order(d, num_devices, num_microbatches) for d in range(num_devices)]

    @staticmethod
    def _order(device: int, devices: int, microbatches: int) -> list[tuple[OpKind, int, int]]:
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


#: Every schedule by name, in the order ``--schedule``'s help lists them and the default compares them.
REGISTRY: Registry[Schedule] = Registry("schedule", reserved=("auto",))  # auto: --schedule left out


def register(schedule: Schedule) -> Schedule:
    """Add ``schedule`` to :data:`REGISTRY` (ValueError for a name taken)."""
    return REGISTRY.add(schedule.name, schedule)


for _schedule in (GPipe(), OneFOneB(), Interleaved(), ZeroBubbleV()):
    register(_schedule)


INTERLEAVED = Interleaved.name
ZBV = ZeroBubbleV.name
#: The schedules with one stage per device.
SCHEDULES = tuple(name for name, s in REGISTRY.items() if s.stages_per_device == 1)


def get(name: str) -> Schedule:
    """The schedule called ``name``; InputError naming the known ones otherwise."""
    return REGISTRY.find(name)


def names() -> tuple[str, ...]:
    """Every schedule's name, in registry order."""
    return tuple(REGISTRY)


def compared_by_default() -> tuple[str, ...]:
    """The schedules ``--schedule`` left out compares, in registry order (the first wins ties)."""
    return tuple(name for name, s in REGISTRY.items() if s.compared_by_default)


def op_order(
    schedule: str, num_stages: int, num_microbatches: int, *, training: bool = True
) -> list[list[tuple[OpKind, int]]]:
    """Each stage's ops, as (kind 'F' or 'B', microbatch), in the order ``schedule`` runs them.

    Only for schedules with one stage per device (see :func:`device_orders` for the others);
    optimizer steps are not listed. O(S·M).

    >>> op_order("1f1b", 3, 4)[0]
    [('F', 0), ('F', 1), ('F', 2), ('B', 0), ('F', 3), ('B', 1), ('B', 2), ('B', 3)]
    >>> op_order("gpipe", 2, 2)[1], op_order("1f1b", 2, 2, training=False)[1]
    ([('F', 0), ('F', 1), ('B', 0), ('B', 1)], [('F', 0), ('F', 1)])
    """
    found = get(schedule)
    if found.stages_per_device != 1:
        raise InputError(f"the {schedule} schedule runs several stages per device: see device_orders")
    _check_microbatches(num_microbatches)
    if isinstance(found, OneStagePerDevice):
        return found.op_order(num_stages, num_microbatches, training)
    orders = device_orders(schedule, num_stages, num_stages, num_microbatches, training=training)
    return [[(kind, m) for kind, _, m in order] for order in orders]


def stage_devices(schedule: str, num_stages: int, num_devices: int) -> list[int]:
    """The device of each stage under ``schedule``. O(S).

    >>> stage_devices("interleaved", 6, 3), stage_devices("zbv", 6, 3)
    ([0, 1, 2, 0, 1, 2], [0, 1, 2, 2, 1, 0])
    """
    return get(schedule).stage_devices(num_stages, num_devices)


def device_orders(
    schedule: str, num_stages: int, num_devices: int, num_microbatches: int, *, training: bool = True
) -> list[list[tuple[OpKind, int, int]]]:
    """Each device's ops, as (kind, stage, microbatch), in the order ``schedule`` runs them. O(S·M).

    Stage ``s`` runs on device ``stage_devices(...)[s]``; each schedule's class documents its order.

    >>> [f"{k}{s}.{m}" for k, s, m in device_orders("interleaved", 4, 2, 2)[1]]
    ['F1.0', 'F1.1', 'F3.0', 'B3.0', 'F3.1', 'B3.1', 'B1.0', 'B1.1']
    """
    _check_microbatches(num_microbatches)
    found = get(schedule)
    if found.needs_training and not training:
        raise InputError(f"the {found.name} schedule splits backwards: it needs a training step")
    return found.device_orders(num_stages, num_devices, num_microbatches, training)


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
    stage_orders: list[list[tuple[OpKind, int, int]]] = [[] for _ in range(stages)]
    for order in orders:
        for op in order:
            stage_orders[op[1]].append(op)
    peak_in_flight = tuple(_peak_in_flight(order, training) for order in stage_orders)
    holds = get(schedule)
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
            persistent + _peak_activation_bytes(order, costs, training, holds)
            for persistent, order in zip(costs.persistent_bytes, stage_orders)
        ),
        events=tuple(event for events in stage_events for event in events),
        transfers=tuple(t for sends in forward_sends + backward_sends for t in sends),
        stage_device=tuple(device_of),
        device_bubble_fraction=tuple(bubble(busy) for busy in device_busy),
        device_peak_bytes=tuple(
            persistent + _peak_activation_bytes(order, costs, training, holds)
            for persistent, order in zip(device_persistent, orders)
        ),
    )


def _peak_activation_bytes(
    order: list[tuple[OpKind, int, int]], costs: StageCosts, training: bool, holds: Schedule | None = None
) -> int:
    """Most microbatch bytes held at once on a device that runs ``order``: while an op of a stage
    runs, its microbatch's peak there (``forward_peak_bytes``, ``backward_peak_bytes``) beside what
    every other microbatch in flight keeps (``activation_bytes``; in flight as in
    :func:`_peak_in_flight`) and what was sent and not yet waited for, as the schedule ``holds``
    it (default: every gradient sent back, no value sent on once its backward ended); from a
    microbatch's ``I`` to its ``W``, the gradients its ``W`` reads (``weight_pending_bytes``)."""
    gradients = holds is None or holds.holds_sent_gradients
    values = holds is not None and holds.holds_sent_activations
    kept = peak = 0
    sent = [0] * len(costs.activation_bytes)
    for kind, stage, _ in order:
        keeps = costs.activation_bytes[stage]
        pending = costs.weight_pending_bytes[stage]
        if kind == "F":
            peak = max(peak, kept + sum(sent) + costs.forward_peak_bytes[stage])
            kept += keeps
        elif kind in ("B", "I"):
            peak = max(peak, kept + sum(sent) - keeps + costs.backward_peak_bytes[stage])
            gradient = costs.sent_gradient_bytes[stage]
            sent[stage] = sent[stage] + gradient if gradients else gradient
            if kind == "I":  # W reads what I made: held until W ends
                kept += pending
                peak = max(peak, kept + sum(sent))
        elif kind == "W":
            kept -= pending
        if kind in ("B", "W") or not training:  # a zbv microbatch's activations live until its W
            kept -= keeps
            if values and training:
                sent[stage] += costs.sent_activation_bytes[stage]
    return peak


def _peak_in_flight(order: list[tuple[OpKind, int, int]], training: bool) -> int:
    """Most microbatches in flight at once on a stage that runs ``order``.

    A stage runs one op at a time, so the count changes only at a forward's
    start (+1) and a backward's end (-1, or the forward's own end in inference).
    """
    in_flight = peak = 0
    for kind, _, _ in order:
        if kind == "F":
            in_flight += 1
            peak = max(peak, in_flight)
        if kind in ("B", "W") or not training:
            in_flight -= 1
    return peak
