"""Tests for baechi_cli.pipeline.schedules: closed forms, hand-computed timelines, and a brute-force checker.

The checker re-derives every constraint of the model from the returned events
and transfers alone (dependencies, one op at a time per stage, one send at a
time per link, every op and send as early as its fixed order allows), so it
does not trust the simulator's bookkeeping. Durations are small integers or
halves, so every expected time is exact.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from baechi_cli.core.errors import InputError
from baechi_cli.pipeline.schedules import (
    SCHEDULES,
    PipelineTiming,
    StageCosts,
    get,
    op_order,
    simulate_pipeline,
)
from baechi_cli.pipeline.timeline import render_timeline


def uniform(stages: int, f: float, b: float, **kwargs) -> StageCosts:
    return StageCosts([f] * stages, [b] * stages, **kwargs)


# --------------------------------------------------------------------------- closed forms


SHAPES = [(stages, microbatches) for stages in (1, 2, 3, 5) for microbatches in (1, 2, 3, 4, 8)]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(("f", "b"), [(1.0, 2.0), (3.0, 1.0), (2.0, 2.0)])
def test_equal_stages_take_m_plus_s_minus_1_slots(schedule, f, b):
    for stages, microbatches in SHAPES:
        timing = simulate_pipeline(uniform(stages, f, b), microbatches, schedule)
        slots = microbatches + stages - 1
        assert timing.minibatch_us == slots * (f + b), (stages, microbatches)
        assert timing.busy_us == (microbatches * (f + b),) * stages
        for bubble in timing.bubble_fraction:
            assert bubble == pytest.approx((stages - 1) / slots)
        assert timing.throughput_per_s == pytest.approx(microbatches / (slots * (f + b)) * 1e6)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_inference_takes_m_plus_s_minus_1_forwards(schedule):
    for stages, microbatches in SHAPES:
        costs = uniform(stages, 2.0, 0.0, activation_bytes=[7] * stages)
        timing = simulate_pipeline(costs, microbatches, schedule)
        assert timing.minibatch_us == (microbatches + stages - 1) * 2.0, (stages, microbatches)
        assert {e.kind for e in timing.events} == {"F"}
        assert timing.peak_in_flight == (1,) * stages
        assert timing.peak_bytes == (7,) * stages


def test_1f1b_keeps_min_s_minus_s_m_in_flight_gpipe_keeps_m():
    for stages, microbatches in SHAPES + [(4, 3), (6, 9)]:
        costs = uniform(
            stages, 1.0, 2.0, persistent_bytes=list(range(100, 100 + stages)), activation_bytes=[10] * stages
        )
        one_f_one_b = simulate_pipeline(costs, microbatches, "1f1b")
        gpipe = simulate_pipeline(costs, microbatches, "gpipe")
        in_flight = tuple(min(stages - s, microbatches) for s in range(stages))
        assert one_f_one_b.peak_in_flight == in_flight, (stages, microbatches)
        assert gpipe.peak_in_flight == (microbatches,) * stages
        assert one_f_one_b.peak_bytes == tuple(100 + s + 10 * in_flight[s] for s in range(stages))
        assert gpipe.peak_bytes == tuple(100 + s + 10 * microbatches for s in range(stages))
        assert all(a <= g for a, g in zip(one_f_one_b.peak_bytes, gpipe.peak_bytes))


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_one_stage_runs_every_microbatch_then_the_optimizer(schedule):
    timing = simulate_pipeline(StageCosts([3.0], [5.0], optimizer_us=[4.0]), 6, schedule)
    assert timing.minibatch_us == 6 * (3 + 5) + 4
    assert timing.events[-1] == (0, "O", None, 48.0, 52.0)
    assert timing.bubble_fraction == (0.0,)
    assert timing.transfers == ()


def test_1f1b_order_is_megatrons_warmup_steady_cooldown():
    stages, microbatches = 4, 6
    for stage, order in enumerate(op_order("1f1b", stages, microbatches)):
        warmup = stages - stage - 1
        assert order[:warmup] == [("F", m) for m in range(warmup)]
        steady = order[warmup : warmup + 2 * (microbatches - warmup)]
        assert steady[0::2] == [("F", m) for m in range(warmup, microbatches)]
        assert steady[1::2] == [("B", m) for m in range(microbatches - warmup)]
        assert order[warmup + len(steady) :] == [("B", m) for m in range(microbatches - warmup, microbatches)]
    # Fewer microbatches than stages: all forwards are warm-up, all backwards cool-down.
    assert op_order("1f1b", 4, 2)[0] == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


# --------------------------------------------------------------------------- transfers, by hand


def two_stage_costs(**kwargs) -> StageCosts:
    return StageCosts([1, 1], [2, 2], send_forward_us=[10], send_backward_us=[3], **kwargs)


def test_1f1b_two_stages_with_slow_links():
    # Stage 0 runs F0 F1 B0 B1; stage 1 runs F0 B0 F1 B1.
    # The forward link sends m0 over [1, 11] and, busy till then, m1 over [11, 21] (not [2, 12]).
    # Stage 1: F0 [11, 12], B0 [12, 14] -> gradient over [14, 17]; F1 [21, 22], B1 [22, 24] -> [24, 27].
    # Stage 0: B0 [17, 19], B1 [27, 29], then its optimizer [29, 30]; stage 1's optimizer [24, 24.5].
    timing = simulate_pipeline(two_stage_costs(optimizer_us=[1, 0.5]), 2, "1f1b")
    assert timing.events == (
        (0, "F", 0, 0.0, 1.0),
        (0, "F", 1, 1.0, 2.0),
        (0, "B", 0, 17.0, 19.0),
        (0, "B", 1, 27.0, 29.0),
        (0, "O", None, 29.0, 30.0),
        (1, "F", 0, 11.0, 12.0),
        (1, "B", 0, 12.0, 14.0),
        (1, "F", 1, 21.0, 22.0),
        (1, "B", 1, 22.0, 24.0),
        (1, "O", None, 24.0, 24.5),
    )
    assert timing.transfers == (
        (0, 1, 0, 1.0, 11.0),
        (0, 1, 1, 11.0, 21.0),
        (1, 0, 0, 14.0, 17.0),
        (1, 0, 1, 24.0, 27.0),
    )
    assert timing.minibatch_us == 30.0
    assert timing.busy_us == (7.0, 6.5)


def test_gpipe_two_stages_with_slow_links():
    # Stage 1 runs F0 [11, 12], F1 [21, 22], B0 [22, 24], B1 [24, 26]; gradients arrive at 27 and
    # (the link busy till 27) 30; stage 0 runs B0 [27, 29], B1 [30, 32].
    timing = simulate_pipeline(two_stage_costs(), 2, "gpipe")
    assert timing.minibatch_us == 32.0
    assert [e for e in timing.events if e.kind == "B"] == [
        (0, "B", 0, 27.0, 29.0),
        (0, "B", 1, 30.0, 32.0),
        (1, "B", 0, 22.0, 24.0),
        (1, "B", 1, 24.0, 26.0),
    ]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_one_microbatch_pays_every_send_once(schedule):
    costs = StageCosts([1, 2, 3], [4, 5, 6], send_forward_us=[0, 50], send_backward_us=[0.5, 70])
    assert simulate_pipeline(costs, 1, schedule).minibatch_us == (1 + 2 + 3) + (4 + 5 + 6) + 50 + 70.5


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_slow_boundary_only_ever_slows_the_pipeline(schedule):
    rng = random.Random(schedule)
    for _ in range(50):
        stages, microbatches = rng.randint(2, 4), rng.randint(1, 5)
        costs = random_costs(rng, stages, training=True)
        boundary = rng.randrange(stages - 1)
        send_forward = list(costs.send_forward_us)
        send_forward[boundary] += 100  # far above any compute: every microbatch waits for it
        slow = dataclasses.replace(costs, send_forward_us=send_forward)
        base_us = simulate_pipeline(costs, microbatches, schedule).minibatch_us
        slow_us = simulate_pipeline(slow, microbatches, schedule).minibatch_us
        assert slow_us >= base_us
        assert slow_us >= 100 * microbatches  # the link sends one microbatch at a time


# --------------------------------------------------------------------------- brute force


def check_timing(costs: StageCosts, microbatches: int, schedule: str, timing: PipelineTiming) -> None:
    """Every constraint of the model, re-derived from the events and transfers."""
    stages = costs.num_stages
    orders = op_order(schedule, stages, microbatches, training=costs.training)
    by_stage = [[e for e in timing.events if e.stage == s] for s in range(stages)]
    op = {(e.stage, e.kind, e.microbatch): e for e in timing.events}
    sent = {(t.src_stage, t.dst_stage, t.microbatch): t for t in timing.transfers}
    assert len(op) == len(timing.events) and len(sent) == len(timing.transfers)

    for s, events in enumerate(by_stage):
        optimizer = [("O", None)] if costs.optimizer_us[s] > 0 else []
        assert [(e.kind, e.microbatch) for e in events] == orders[s] + optimizer
        previous_end = 0.0
        for e in events:
            duration = {"F": costs.forward_us, "B": costs.backward_us, "O": costs.optimizer_us}[e.kind][s]
            assert e.end_us == pytest.approx(e.start_us + duration)
            if e.kind == "F":
                ready = 0.0 if s == 0 else sent[(s - 1, s, e.microbatch)].end_us
            elif e.kind == "B":
                ready = (
                    op[(s, "F", e.microbatch)].end_us
                    if s == stages - 1
                    else sent[(s + 1, s, e.microbatch)].end_us
                )
            else:
                ready = previous_end
            assert e.start_us >= previous_end - 1e-9  # one op at a time
            assert e.start_us == pytest.approx(max(previous_end, ready))  # as early as allowed
            previous_end = e.end_us

    links = {(t.src_stage, t.dst_stage) for t in timing.transfers}
    expected_links = {(s, s + 1) for s in range(stages - 1)}
    if costs.training:
        expected_links |= {(s + 1, s) for s in range(stages - 1)}
    assert links == expected_links
    for src, dst in links:
        sends = [t for t in timing.transfers if (t.src_stage, t.dst_stage) == (src, dst)]
        kind = "F" if src < dst else "B"
        produced = [m for k, m in orders[src] if k == kind]
        assert [t.microbatch for t in sends] == produced  # sent in the order the sender produced them
        link_free = 0.0
        for t in sends:
            send_us = costs.send_forward_us[src] if src < dst else costs.send_backward_us[dst]
            assert t.end_us == pytest.approx(t.start_us + send_us)
            assert t.start_us >= link_free - 1e-9  # one send at a time
            assert t.start_us == pytest.approx(max(op[(src, kind, t.microbatch)].end_us, link_free))
            link_free = t.end_us

    assert timing.minibatch_us == max(e.end_us for e in timing.events)
    for s, events in enumerate(by_stage):
        busy = sum(e.end_us - e.start_us for e in events)
        assert timing.busy_us[s] == pytest.approx(busy)
        bubble = 1 - busy / timing.minibatch_us if timing.minibatch_us > 0 else 0.0
        assert timing.bubble_fraction[s] == pytest.approx(bubble)
        assert timing.peak_in_flight[s] == brute_force_in_flight(events, costs.training)
        assert timing.peak_bytes[s] == costs.persistent_bytes[s] + brute_force_held(
            events, costs, s, get(schedule).holds_sent_gradients
        )


def brute_force_held(events, costs: StageCosts, s: int, holds: bool) -> int:
    """Most bytes a stage's microbatches hold as any of its ops runs (each op's peak its
    microbatch's activations, as ``activation_bytes`` alone gives): the activations of the
    microbatches alive then, and the gradients sent back by the backwards before it (all of them
    where the schedule holds them, else the last)."""
    position = {(e.kind, e.microbatch): i for i, e in enumerate(events)}
    frees = "B" if costs.training else "F"
    microbatches = [m for k, m in position if k == "F"]
    held = 0
    for now, e in enumerate(events):
        if e.kind not in ("F", "B"):
            continue
        alive = sum(position["F", m] <= now <= position[frees, m] for m in microbatches)
        sent = sum(k == "B" and i < now for (k, _), i in position.items())
        sends = sent if holds else min(sent, 1)
        held = max(held, alive * costs.activation_bytes[s] + sends * costs.sent_gradient_bytes[s])
    return held


def brute_force_in_flight(events, training: bool) -> int:
    """Most microbatches alive as any forward starts: from its forward's start to its backward's end.

    Positions in the stage's run order stand for times (the checker has shown
    the ops run one at a time in that order), so ops of 0 µs count too. In
    inference a microbatch is alive only during its forward.
    """
    position = {(e.kind, e.microbatch): i for i, e in enumerate(events)}
    frees = "B" if training else "F"
    forwards = [i for i, e in enumerate(events) if e.kind == "F"]
    microbatches = [m for k, m in position if k == "F"]
    return max(sum(position["F", m] <= now <= position[frees, m] for m in microbatches) for now in forwards)


def random_costs(rng: random.Random, stages: int, training: bool) -> StageCosts:
    def times(n: int) -> list[float]:
        return [rng.choice([0, 0.5, 1, 2, 3, 7]) for _ in range(n)]

    backward = [rng.choice([0.5, 1, 2, 4]) for _ in range(stages)] if training else [0] * stages
    return StageCosts(
        forward_us=times(stages),
        backward_us=backward,
        send_forward_us=times(stages - 1),
        send_backward_us=times(stages - 1),
        persistent_bytes=[rng.randrange(1000) for _ in range(stages)],
        activation_bytes=[rng.randrange(100) for _ in range(stages)],
        sent_gradient_bytes=[0] + [rng.randrange(50) for _ in range(stages - 1)] if training else None,
        optimizer_us=times(stages) if training else None,
    )


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("training", [True, False])
def test_random_cases_respect_every_constraint(schedule, training):
    rng = random.Random(f"{schedule}-{training}")
    for _ in range(150):
        stages, microbatches = rng.randint(1, 4), rng.randint(1, 5)
        costs = random_costs(rng, stages, training)
        timing = simulate_pipeline(costs, microbatches, schedule)
        check_timing(costs, microbatches, schedule, timing)
        assert timing.events == tuple(sorted(timing.events, key=lambda e: e.stage))  # grouped by stage


def test_sent_gradients_are_held_as_torchs_schedules_hold_them():
    """The input gradient each backward sends back: GPipe waits for its sends when the step ends,
    so they pile up as the microbatches' activations are freed (torch's ScheduleGPipe); 1F1B
    waits for each before the next, so one is held. Stage 1 of 2, 4 microbatches: its backward
    peaks 5 bytes above nothing kept, and sends 3."""
    costs = StageCosts(
        [1.0, 1.0],
        [1.0, 1.0],
        activation_bytes=[0, 0],
        backward_peak_bytes=[0, 5],
        sent_gradient_bytes=[0, 3],
    )
    assert simulate_pipeline(costs, 4, "gpipe").peak_bytes[1] == 3 * 3 + 5  # three held at the last
    assert simulate_pipeline(costs, 4, "1f1b").peak_bytes[1] == 3 + 5
    # Held beside the activations still kept: at GPipe's first backward nothing was sent yet.
    kept = dataclasses.replace(costs, activation_bytes=[0, 10], backward_peak_bytes=[0, 12])
    assert simulate_pipeline(kept, 4, "gpipe").peak_bytes[1] == 40 - 10 + 12


@pytest.mark.parametrize("schedule", ["interleaved", "zbv"])
def test_torchs_runtime_schedules_hold_the_values_they_sent_until_the_step_ends(schedule):
    """torch's interleaved and zero-bubble schedules wait for every send when the step ends: a
    value a stage sent on stays held after its backward freed it, while later ops run; GPipe
    waits for its forward sends before its backwards, so it does not."""
    base = StageCosts([1.0] * 4, [2.0] * 4, activation_bytes=[10] * 4, weight_us=[1.0] * 4)
    held = dataclasses.replace(base, sent_activation_bytes=[5, 5, 5, 0])
    plain, sending = (simulate_pipeline(c, 4, schedule, devices=2) for c in (base, held))
    assert all(s >= p for s, p in zip(sending.device_peak_bytes, plain.device_peak_bytes))
    assert sending.device_peak_bytes != plain.device_peak_bytes
    one_per_device = [dataclasses.replace(c, weight_us=None) for c in (base, held)]
    gpipe = [simulate_pipeline(c, 4, "gpipe").peak_bytes for c in one_per_device]
    assert gpipe[0] == gpipe[1]


def test_1f1b_never_needs_more_memory_than_gpipe_on_random_costs():
    rng = random.Random(7)
    for _ in range(100):
        stages, microbatches = rng.randint(1, 4), rng.randint(1, 5)
        costs = random_costs(rng, stages, training=True)
        one_f_one_b = simulate_pipeline(costs, microbatches, "1f1b")
        gpipe = simulate_pipeline(costs, microbatches, "gpipe")
        assert all(a <= g for a, g in zip(one_f_one_b.peak_bytes, gpipe.peak_bytes))


# --------------------------------------------------------------------------- outputs


def test_samples_per_second_and_zero_cost_pipelines():
    timing = simulate_pipeline(uniform(2, 1.0, 1.0), 4, "1f1b", microbatch_size=16)
    assert timing.samples_per_s == pytest.approx(timing.throughput_per_s * 16)
    assert simulate_pipeline(uniform(2, 1.0, 1.0), 4).samples_per_s is None
    free = simulate_pipeline(uniform(3, 0.0, 0.0), 2, "gpipe")
    assert free.minibatch_us == 0.0 and free.throughput_per_s == math.inf
    assert free.bubble_fraction == (0.0, 0.0, 0.0)


def test_timeline_has_one_line_per_stage_of_the_requested_width():
    timing = simulate_pipeline(uniform(4, 1.0, 2.0, optimizer_us=[1, 1, 1, 1]), 3, "1f1b")
    lines = render_timeline(timing, width=40).splitlines()
    assert len(lines) == 4
    assert [line[:4] for line in lines] == ["s0 |", "s1 |", "s2 |", "s3 |"]
    assert all(len(line) == 4 + 40 + 1 and line.endswith("|") for line in lines)
    assert lines[0][4] == "F" and lines[3][4] == "."  # stage 3 waits for the pipeline to fill
    assert lines[0][-2] == "O"  # stage 0 ends with its optimizer step, last of all
    assert render_timeline(timing, width=40) == render_timeline(timing, width=40)


def test_timeline_labels_line_up_past_ten_stages():
    lines = render_timeline(simulate_pipeline(uniform(11, 1.0, 0.0), 1), width=11).splitlines()
    assert len(lines) == 11 and lines[0] == " s0 |F..........|" and lines[10] == "s10 |..........F|"


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: simulate_pipeline(uniform(2, 1, 1), 0), "microbatches must be at least 1, got 0"),
        (lambda: simulate_pipeline(uniform(2, 1, 1), 2.5), "microbatches must be an integer, got 2.5"),
        (lambda: simulate_pipeline(uniform(2, 1, 1), True), "microbatches must be an integer, got True"),
        (lambda: simulate_pipeline(uniform(2, 1, 1), 2, "zb-h1"), "unknown schedule 'zb-h1'"),
        (lambda: simulate_pipeline(uniform(2, 1, 1), 2, microbatch_size=0), "microbatch_size must be"),
        (lambda: StageCosts([1, -1], [1, 1]), "forward_us[1] must be a non-negative finite number, got -1"),
        (
            lambda: StageCosts([1, math.nan], [1, 1]),
            "forward_us[1] must be a non-negative finite number, got nan",
        ),
        (
            lambda: StageCosts([1, 1], [math.inf, 1]),
            "backward_us[0] must be a non-negative finite number, got inf",
        ),
        (
            lambda: StageCosts([1, 1], [1, "2"]),
            "backward_us[1] must be a non-negative finite number, got '2'",
        ),
        (lambda: StageCosts([1, 1], [1]), "backward_us has 1 entries, expected 2"),
        (
            lambda: StageCosts([1, 1], [1, 1], send_forward_us=[1, 1]),
            "send_forward_us has 2 entries, expected 1",
        ),
        (
            lambda: StageCosts([1, 1], [1, 1], send_backward_us=[]),
            "send_backward_us has 0 entries, expected 1",
        ),
        (
            lambda: StageCosts([1], [1], activation_bytes=[1.5]),
            "activation_bytes[0] must be a non-negative integer",
        ),
        (
            lambda: StageCosts([1], [1], persistent_bytes=[-1]),
            "persistent_bytes[0] must be a non-negative integer",
        ),
        (lambda: StageCosts([1], [1], optimizer_us=[1, 2]), "optimizer_us has 2 entries, expected 1"),
        (lambda: StageCosts([1], [0], optimizer_us=[1]), "inference has no optimizer step"),
        (lambda: StageCosts([], []), "forward_us must list one time per stage"),
        (lambda: StageCosts(3.0, [1]), "forward_us must list one time per stage"),
        (lambda: StageCosts([1], 1.0), "backward_us must be a sequence of numbers"),
        (
            lambda: render_timeline(simulate_pipeline(uniform(1, 1, 1), 1), width=0),
            "width must be a positive",
        ),
    ],
)
def test_bad_input_raises_input_error_naming_the_problem(build, message):
    with pytest.raises(InputError) as caught:
        build()
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


# ---------------------------------------------------------------- interleaved (several stages per device)


@pytest.mark.parametrize(
    "devices, chunks, microbatches", [(2, 2, 4), (4, 2, 8), (3, 3, 6), (4, 2, 4), (2, 3, 8)]
)
def test_interleaved_closed_form(devices, chunks, microbatches):
    # Megatron-LM's: equal chunks of one device's f and b, free transfers, M a multiple of the devices:
    # M (f + b) plus a bubble of (D - 1)(f + b) / v, v times smaller than 1F1B's.
    f, b = 2.0, 4.0
    stages = devices * chunks
    timing = simulate_pipeline(
        uniform(stages, f / chunks, b / chunks), microbatches, "interleaved", devices=devices
    )
    assert timing.minibatch_us == pytest.approx(microbatches * (f + b) + (devices - 1) * (f + b) / chunks)
    one_stage_each = simulate_pipeline(uniform(devices, f, b), microbatches, "1f1b")
    assert timing.minibatch_us < one_stage_each.minibatch_us
    assert timing.stage_device == tuple(s % devices for s in range(stages))
    assert len(timing.device_bubble_fraction) == len(timing.device_peak_bytes) == devices


@pytest.mark.parametrize("seed", range(60))
def test_interleaved_timelines_keep_every_dependency(seed):
    rng = random.Random(seed)
    devices, chunks = rng.randint(1, 4), rng.randint(1, 3)
    stages = devices * chunks
    microbatches = rng.choice([m for m in range(1, 10) if m % max(1, m // devices) == 0])
    training = rng.random() < 0.8
    costs = StageCosts(
        [rng.randint(1, 4) / 2 for _ in range(stages)],
        [rng.randint(1, 4) / 2 if training else 0 for _ in range(stages)],
        send_forward_us=[rng.randint(0, 3) / 2 for _ in range(stages - 1)],
        send_backward_us=[rng.randint(0, 3) / 2 for _ in range(stages - 1)],
        activation_bytes=[rng.randint(1, 5) for _ in range(stages)],
    )
    timing = simulate_pipeline(costs, microbatches, "interleaved", devices=devices)
    ops = {(e.kind, e.stage, e.microbatch): e for e in timing.events}
    kinds = ("F", "B") if training else ("F",)
    assert len(ops) == len(timing.events) == len(kinds) * stages * microbatches
    sends = {(t.src_stage, t.dst_stage, t.microbatch): t for t in timing.transfers}
    for (kind, s, m), e in ops.items():
        assert e.end_us - e.start_us == (costs.forward_us[s] if kind == "F" else costs.backward_us[s])
        if kind == "F" and s > 0:
            t = sends[(s - 1, s, m)]
            assert t.start_us >= ops[("F", s - 1, m)].end_us and e.start_us >= t.end_us
        if kind == "B" and s < stages - 1:
            t = sends[(s + 1, s, m)]
            assert t.start_us >= ops[("B", s + 1, m)].end_us and e.start_us >= t.end_us
        if kind == "B" and s == stages - 1:
            assert e.start_us >= ops[("F", s, m)].end_us
    for d in range(devices):  # one op at a time per device
        mine = sorted((e for e in timing.events if e.stage % devices == d), key=lambda e: e.start_us)
        assert all(a.end_us <= b.start_us for a, b in zip(mine, mine[1:]))
    assert timing.minibatch_us == max(e.end_us for e in timing.events)


@pytest.mark.parametrize(
    "devices, chunks, microbatches", [(2, 2, 2), (2, 2, 4), (4, 2, 8), (3, 2, 6), (4, 3, 4), (4, 2, 10)]
)
def test_interleaved_order_is_torchs(devices, chunks, microbatches):
    pytest.importorskip("torch")
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B

    from baechi_cli.pipeline.schedules import device_orders

    class Stage:  # what the schedule reads of a stage to compute its order
        def __init__(self, index: int, rank: int) -> None:
            self.group_size, self.group_rank, self.stage_index = devices, rank, index
            self.num_stages = devices * chunks
            self.is_first, self.is_last = index == 0, index == devices * chunks - 1

    ours = device_orders("interleaved", devices * chunks, devices, microbatches)
    for rank in range(devices):
        stages = [Stage(c * devices + rank, rank) for c in range(chunks)]
        theirs = ScheduleInterleaved1F1B(stages, microbatches).pipeline_order[rank]
        # torch writes an action as stage, kind, microbatch ("2F0"); None pads lock-step slots.
        assert [f"{s}{k}{m}" for k, s, m in ours[rank]] == [str(a) for a in theirs if a is not None]


def test_interleaved_refuses_what_torch_refuses():
    with pytest.raises(InputError, match="whole number of stages per device"):
        simulate_pipeline(uniform(5, 1, 1), 4, "interleaved", devices=2)
    with pytest.raises(InputError, match="multiple of its rounds"):
        simulate_pipeline(uniform(4, 1, 1), 7, "interleaved", devices=2)  # 3 rounds of 7
    with pytest.raises(InputError, match="one stage per device"):
        simulate_pipeline(uniform(4, 1, 1), 4, "1f1b", devices=2)


# --------------------------------------------------------------------------- zbv


@pytest.mark.parametrize(
    "devices, microbatches", [(1, 4), (2, 2), (2, 4), (3, 1), (3, 6), (4, 3), (4, 8), (4, 10)]
)
def test_zbv_order_and_stage_devices_are_torchs(devices, microbatches):
    """Per device, the ops torch's ScheduleZBVZeroBubble lists (fewer microbatches than 2D - 1
    included: torch lays the order out for 2D - 1 and drops the rest), and its V of stages."""
    pytest.importorskip("torch")
    from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble

    from baechi_cli.pipeline.schedules import device_orders, stage_devices

    stages_count = 2 * devices

    class Stage:  # what the schedule reads of a stage to compute its order
        def __init__(self, index: int, rank: int) -> None:
            self.group_size, self.group_rank, self.stage_index = devices, rank, index
            self.num_stages = stages_count
            self.is_first, self.is_last = index == 0, index == stages_count - 1
            self.submod = None

    ours = device_orders("zbv", stages_count, devices, microbatches)
    for rank in range(devices):
        schedule = ScheduleZBVZeroBubble(
            [Stage(rank, rank), Stage(stages_count - 1 - rank, rank)], microbatches
        )
        theirs = schedule.pipeline_order[rank]
        assert [f"{s}{k}{m}" for k, s, m in ours[rank]] == [str(a) for a in theirs if a is not None]
        mapping = schedule.stage_index_to_group_rank
        assert [mapping[s] for s in range(stages_count)] == stage_devices("zbv", stages_count, devices)


def test_zbv_fills_the_bubbles_with_weight_gradients():
    """Equal F = I = W = 1 on 4 devices, 8 microbatches: 1F1B's (M + S - 1)(f + b) = 66 against
    interleaved's 57 and zbv's 51 (the ideal, every device busy, is 48); a W never holds up the
    stage below, so moving the backward's time into W shortens the minibatch."""
    four = uniform(4, 2, 4)
    assert simulate_pipeline(four, 8, "1f1b").minibatch_us == 66
    eight = uniform(8, 1, 2, weight_us=[1] * 8)
    assert simulate_pipeline(eight, 8, "interleaved", devices=4).minibatch_us == 57
    timing = simulate_pipeline(eight, 8, "zbv", devices=4)
    assert timing.minibatch_us == 51
    assert timing.stage_device == (0, 1, 2, 3, 3, 2, 1, 0)
    no_split = simulate_pipeline(uniform(8, 1, 2), 8, "zbv", devices=4)
    assert no_split.minibatch_us > timing.minibatch_us
    assert {e.kind for e in timing.events} == {"F", "I", "W"}


@pytest.mark.parametrize("seed", range(40))
def test_zbv_timelines_keep_every_dependency(seed):
    """Random costs: an F after its activation arrives, an I after its gradient (the last stage's
    after its own F), a W after its I; transfers between the two stages of one device (the V's
    turn) take no time; a device runs one op at a time; its peak counts a microbatch from F to W."""
    rng = random.Random(seed)
    devices = rng.randint(1, 4)
    stages = 2 * devices
    microbatches = rng.randint(1, 9)
    backward = [rng.randint(1, 4) / 2 for _ in range(stages)]
    costs = StageCosts(
        [rng.randint(1, 4) / 2 for _ in range(stages)],
        backward,
        send_forward_us=[rng.randint(0, 3) / 2 for _ in range(stages - 1)],
        send_backward_us=[rng.randint(0, 3) / 2 for _ in range(stages - 1)],
        activation_bytes=[rng.randint(1, 5) for _ in range(stages)],
        weight_us=[b * rng.choice([0, 0.25, 0.5, 1]) for b in backward],
    )
    timing = simulate_pipeline(costs, microbatches, "zbv", devices=devices)
    ops = {(e.kind, e.stage, e.microbatch): e for e in timing.events}
    assert len(ops) == len(timing.events) == 3 * stages * microbatches
    sends = {(t.src_stage, t.dst_stage, t.microbatch): t for t in timing.transfers}
    device_of = timing.stage_device
    for (kind, s, m), e in ops.items():
        length = {"F": costs.forward_us[s], "I": backward[s] - costs.weight_us[s], "W": costs.weight_us[s]}[
            kind
        ]
        assert e.end_us - e.start_us == pytest.approx(length)
        if kind == "F" and s > 0:
            t = sends[(s - 1, s, m)]
            assert t.start_us >= ops[("F", s - 1, m)].end_us and e.start_us >= t.end_us
            assert (t.end_us - t.start_us == 0) == (
                device_of[s - 1] == device_of[s] or costs.send_forward_us[s - 1] == 0
            )
        if kind == "I" and s < stages - 1:
            t = sends[(s + 1, s, m)]
            assert t.start_us >= ops[("I", s + 1, m)].end_us and e.start_us >= t.end_us
        if kind == "I" and s == stages - 1:
            assert e.start_us >= ops[("F", s, m)].end_us
        if kind == "W":
            assert e.start_us >= ops[("I", s, m)].end_us
    for d in range(devices):
        mine = sorted(
            (e for e in timing.events if device_of[e.stage] == d), key=lambda e: (e.start_us, e.end_us)
        )
        assert all(a.end_us <= b.start_us + 1e-9 for a, b in zip(mine, mine[1:]))
        # Activations live from a microbatch's F to its W on each stage.
        live = peak = 0
        for e in sorted(mine, key=lambda e: (e.start_us, e.kind != "W")):
            if e.kind == "F":
                live += costs.activation_bytes[e.stage]
                peak = max(peak, live)
            elif e.kind == "W":
                live -= costs.activation_bytes[e.stage]
        assert timing.device_peak_bytes[d] == peak


def test_zbv_refuses_what_torch_refuses():
    with pytest.raises(InputError, match="two stages per device"):
        simulate_pipeline(uniform(6, 1, 1), 4, "zbv", devices=2)
    with pytest.raises(InputError, match="needs a training step"):
        simulate_pipeline(uniform(4, 1, 0), 4, "zbv", devices=2)
    with pytest.raises(InputError, match="weight_us"):
        StageCosts([1, 1], [1, 1], weight_us=[1, 2])
