"""What one microbatch holds on a pipeline stage (baechi_cli.pipeline.memory), and how the
schedule simulator adds up the microbatches in flight (forward and backward peaks)."""

from __future__ import annotations

import random

import pytest

from baechi_cli.core.graph import CONTROL_PORT, GraphBuilder
from baechi_cli.pipeline.memory import MicrobatchMemory, StageMemory
from baechi_cli.pipeline.schedules import REGISTRY, StageCosts, simulate_pipeline


def test_a_view_of_a_weight_counts_nothing_and_a_view_of_an_activation_keeps_its_source():
    """``t(W)`` read by the backward is the weight's storage; ``view(x)`` read by the backward
    keeps ``x`` (400 bytes) to the backward, counted once."""
    b = GraphBuilder()
    w_t = b.add_op("t", "aten.t", [800])
    x = b.add_op("x", "aten.relu", [400])
    x_view = b.add_op("x_view", "aten.view", [400])
    y = b.add_op("y", "aten.mm", [100])
    dx = b.add_op("dx", "aten.mm", [400], is_backward=True, forward_op=y)
    for src, dst in ((x, x_view), (x_view, y), (w_t, y), (w_t, dx), (x_view, dx)):
        b.add_edge(src, dst)
    b.set_view(w_t, -1, 0)
    b.set_view(x_view, x, 0)
    (held,) = MicrobatchMemory(b.build()).per_stage([0] * 5, 1, 1)
    assert held.retained == 400
    assert held.forward_peak == 500  # x and y while y runs
    assert held.backward_peak == 800  # x kept, dx made


def test_a_kernels_copy_of_its_weights_is_not_divided_by_the_microbatches():
    """A convolution (1000 weight bytes) whose kernel holds 1600 bytes beyond its output: its
    weights' copy (1000) per call, the rest (600) per sample; its backward's likewise, by the
    weights of its forward op. 4 microbatches of a 4000-byte output."""
    b = GraphBuilder()
    conv = b.add_op("conv", "aten.convolution", [4000], persistent_bytes=1000, temporary_bytes=1600)
    grad = b.add_op(
        "grad", "aten.convolution_backward", [400], is_backward=True, forward_op=conv, temporary_bytes=1400
    )
    b.add_edge(conv, grad)
    (held,) = MicrobatchMemory(b.build()).per_stage([0, 0], 1, 4)
    assert held.forward_peak == 1000 + (1600 - 1000) / 4 + 1000  # its output, a quarter of 4000
    assert held.backward_peak == 1000 + 1000 + (1400 - 1000) / 4 + 100


def test_a_workspace_sized_by_the_weights_is_held_whole_by_every_microbatch():
    """A depthwise convolution's backward whose CPU kernel takes a 25,700-byte workspace (the traced
    step's ``_workspace_bytes``: 1,028 per weight element, whatever the batch) over 100 weight
    bytes: a microbatch's backward holds all of it, not the weights' copy and a quarter of the rest."""
    b = GraphBuilder()
    conv = b.add_op("conv", "aten.convolution", [4000], persistent_bytes=100)
    grad = b.add_op(
        "grad",
        "aten.convolution_backward",
        [400],
        is_backward=True,
        forward_op=conv,
        temporary_bytes=25_700,
        attrs={"_workspace_bytes": 25_700},
    )
    b.add_edge(conv, grad)
    (held,) = MicrobatchMemory(b.build()).per_stage([0, 0], 1, 4)
    assert held.backward_peak == 1000 + 25_700 + 100


def _gradients(tied: bool):
    """A weight's gradient (400 bytes, the weight's size at any microbatch) read by its update;
    ``tied``: two readers' gradients summed first."""
    b = GraphBuilder()
    x = b.add_op("x", "aten.mm", [4000])
    dw = b.add_op("dw", "aten.mm", [400], is_backward=True, forward_op=x)
    b.add_edge(x, dw)
    last = dw
    if tied:
        dw2 = b.add_op("dw2", "aten.mm", [400], is_backward=True, forward_op=x)
        total = b.add_op("sum", "aten.add", [400], is_backward=True, forward_op=x)
        for src, dst in ((x, dw2), (dw, total), (dw2, total)):
            b.add_edge(src, dst)
        last = total
    step = b.add_op("optimizer/step", "OptimizerStep", [], is_backward=True)
    update = b.add_op("update", "aten.add_", [], is_backward=True)
    b.add_edge(last, update)
    b.add_edge(last, step, CONTROL_PORT)
    b.add_edge(step, update, CONTROL_PORT)
    graph = b.build()
    return MicrobatchMemory(graph, skip={step, update}).per_stage([0] * graph.num_ops, 1, 4)


def test_a_weight_gradient_is_not_divided_by_the_microbatches():
    (held,) = _gradients(tied=False)
    assert held == StageMemory(retained=1000, forward_peak=1000, backward_peak=1400)


def test_a_sum_of_a_tied_weights_gradients_allocates_nothing():
    """Both gradients at the weight's size; their sum adds into ``.grad``."""
    (held,) = _gradients(tied=True)
    assert held.backward_peak == 1000 + 800


def test_an_output_sent_on_is_kept_until_its_stages_last_backward_op():
    """x (stage 0) feeds y (stage 1): torch's stage 0 keeps x for its backward; stage 1 holds
    nothing of its own past its forward (its input is a receive buffer)."""
    b = GraphBuilder()
    x = b.add_op("x", "aten.relu", [800])
    y = b.add_op("y", "aten.relu", [80])
    dy = b.add_op("dy", "aten.relu_backward", [800], is_backward=True, forward_op=y)
    dx = b.add_op("dx", "aten.relu_backward", [8], is_backward=True, forward_op=x)
    for src, dst in ((x, y), (y, dy), (dy, dx)):
        b.add_edge(src, dst)
    first, second = MicrobatchMemory(b.build()).per_stage([0, 1, 1, 0], 2, 2)
    assert first == StageMemory(retained=400, forward_peak=400, backward_peak=404)
    assert second == StageMemory(retained=40, forward_peak=40, backward_peak=440)


def test_a_split_backward_holds_the_output_gradients_its_weight_pass_reads():
    """``y = x @ W``: the weight gradient ``dW = x^T dy`` reads ``dy`` (200 bytes a minibatch), made
    by the backward; the input gradient ``dx = dy W^T`` reads it too. Split (zbv), torch keeps
    ``dy`` from I to W: counted once, per microbatch. ``x`` is an activation (already retained)."""
    b = GraphBuilder()
    x = b.add_op("x", "aten.relu", [400])
    w = b.add_op("w", "Variable", [0], persistent_bytes=64)
    y = b.add_op("y", "aten.mm", [200])
    dy = b.add_op("dy", "aten.mul", [200], is_backward=True, forward_op=y)
    dw = b.add_op("dw", "aten.mm", [64], is_backward=True, forward_op=y)
    dx = b.add_op("dx", "aten.mm", [400], is_backward=True, forward_op=y)
    bias = b.add_op("db", "aten.sum", [8], is_backward=True, forward_op=y)
    update = b.add_op("update", "aten.add_", [0], is_backward=True)
    for src, dst in ((x, y), (w, y), (y, dy), (dy, dw), (x, dw), (dy, dx), (w, dx), (dy, bias), (dw, update)):
        b.add_edge(src, dst)
    (held,) = MicrobatchMemory(b.build(), skip={update}).per_stage([0] * 8, 1, 2)
    assert held.weight_pending == 100  # dy once, though dW and the bias's sum (no update) read it
    (unsplit,) = MicrobatchMemory(b.build(), skip=set()).per_stage([0] * 8, 1, 2)
    assert unsplit.weight_pending == 0  # no update: no weight gradient to wait for


def test_zbv_holds_a_microbatchs_pending_gradients_from_its_i_to_its_w():
    """Two stages on one device (zbv, D = 1, one microbatch: F0 F1 I1 W1 I0 W0). Stage 1's I and W
    are adjacent; stage 0's too, so the pending bytes add to the peak only at the I that makes
    them: 10 (stage 0's activations) + 20 (stage 1's) + 1000 (its pending) at I1's end."""
    costs = StageCosts(
        forward_us=[1, 1],
        backward_us=[2, 2],
        weight_us=[1, 1],
        activation_bytes=[10, 20],
        weight_pending_bytes=[0, 1000],
    )
    assert simulate_pipeline(costs, 1, "zbv", devices=1).device_peak_bytes == (1030,)
    none = StageCosts(forward_us=[1, 1], backward_us=[2, 2], weight_us=[1, 1], activation_bytes=[10, 20])
    assert simulate_pipeline(none, 1, "zbv", devices=1).device_peak_bytes == (30,)
    assert simulate_pipeline(costs, 1, "1f1b").peak_bytes == (10, 20)  # B runs I and W as one


def test_a_stage_map_of_another_length_is_refused():
    b = GraphBuilder()
    b.add_op("x", "aten.relu", [8])
    with pytest.raises(ValueError, match="1 ops"):
        MicrobatchMemory(b.build()).per_stage([0, 0], 1, 1)


def _brute_force_peak(costs: StageCosts, timing, stage: int) -> int:
    """The stage's most bytes: at each of its ops, the running microbatch's peak plus what every
    other microbatch alive (forward started, backward or W not ended) keeps."""
    events = [e for e in timing.events if e.stage == stage and e.kind in "FBIW"]
    ends = {}
    for i, e in enumerate(events):
        if e.kind in ("B", "W") or not costs.training:
            ends[e.microbatch] = i
    starts = {e.microbatch: i for i, e in enumerate(events) if e.kind == "F"}
    keeps, peak = costs.activation_bytes[stage], 0
    for i, e in enumerate(events):
        others = sum(1 for m in starts if m != e.microbatch and starts[m] < i <= ends[m])
        if e.kind == "F":
            peak = max(peak, others * keeps + costs.forward_peak_bytes[stage])
        elif e.kind in ("B", "I"):
            peak = max(peak, others * keeps + costs.backward_peak_bytes[stage])
    return costs.persistent_bytes[stage] + peak


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_stages_peak_is_its_worst_op_beside_the_microbatches_in_flight(schedule):
    rng = random.Random(schedule)
    for _ in range(100):
        stages, microbatches = rng.randint(1, 4), rng.randint(1, 6)
        keeps = [rng.randrange(100) for _ in range(stages)]
        costs = StageCosts(
            forward_us=[rng.choice([0.5, 1, 3]) for _ in range(stages)],
            backward_us=[rng.choice([0.5, 1, 2]) for _ in range(stages)],
            persistent_bytes=[rng.randrange(1000) for _ in range(stages)],
            activation_bytes=keeps,
            forward_peak_bytes=[k + rng.randrange(50) for k in keeps],
            backward_peak_bytes=[k + rng.randrange(300) for k in keeps],
        )
        timing = simulate_pipeline(costs, microbatches, schedule)
        for s in range(stages):
            assert timing.peak_bytes[s] == _brute_force_peak(costs, timing, s), (s, costs, microbatches)


def test_only_1f1b_waits_for_each_gradient_send_before_the_next_microbatch():
    """torch's Schedule1F1B waits for each backward send in the next step; GPipe and the
    multi-stage runtimes wait for all of them when the step ends."""
    assert [s.name for s in REGISTRY.values() if not s.holds_sent_gradients] == ["1f1b"]


def test_a_stages_gradients_of_one_weight_live_until_the_last_of_them():
    """Two readers of a tied weight on stage 0, the sum (with stage 1's reader's) on stage 1:
    autograd sums stage 0's two in its buffer, so both are held at once there."""
    b = GraphBuilder()
    x = b.add_op("x", "aten.embedding", [4000])
    y = b.add_op("y", "aten.embedding", [4000])
    z = b.add_op("z", "aten.mm", [40])
    dx = b.add_op("dx", "aten.embedding_dense_backward", [400], is_backward=True, forward_op=x)
    dy = b.add_op("dy", "aten.embedding_dense_backward", [400], is_backward=True, forward_op=y)
    dz = b.add_op("dz", "aten.mm", [400], is_backward=True, forward_op=z)
    first = b.add_op("sum", "aten.add", [400], is_backward=True, forward_op=z)
    total = b.add_op("sum2", "aten.add", [400], is_backward=True, forward_op=z)
    step = b.add_op("optimizer/step", "OptimizerStep", [], is_backward=True)
    update = b.add_op("update", "aten.add_", [], is_backward=True)
    for src, dst in (
        (x, z),
        (y, z),
        (z, dz),
        (dz, dx),
        (dz, dy),
        (dx, first),
        (dy, first),
        (first, total),
        (dz, total),
    ):
        b.add_edge(src, dst)
    b.add_edge(total, update)
    b.add_edge(total, step, CONTROL_PORT)
    b.add_edge(step, update, CONTROL_PORT)
    graph = b.build()
    stage_of = [0, 0, 1, 0, 0, 1, 1, 1, 1, 1]
    held = MicrobatchMemory(graph, skip={step, update}).per_stage(stage_of, 2, 4)
    assert held[0].backward_peak == 1000 + 1000 + 400 + 400  # x, y kept (sent on); dx, dy at once


def test_a_pipeline_plan_fits_by_its_schedules_peak_not_the_unpipelined_steps():
    """The evaluator's unpipelined step holds all 8 microbatches' activations at once (471 MB on
    the last device); 1F1B holds at most 4 (86 MB). On 100 MB devices the plan fits by its
    schedule, and the report's per-device peaks are the schedule's: before, the unpipelined peak
    judged it over memory and the placement failed."""
    from baechi_cli.app.place import place_model
    from baechi_cli.app.report import build_report
    from baechi_cli.core.devices import parse_devices
    from baechi_cli.evaluator.evaluate import evaluate
    from baechi_cli.search.candidates import PlaceOptions

    options = PlaceOptions(
        training=True,
        objective="throughput",
        microbatches=8,
        schedule="1f1b",
        batch_size=64,
        dims={"seq": 256},
    )
    model = "testdata/torch_transformer.onnx"
    ample = place_model(model, parse_devices("4x8GB"), options)
    unpipelined = evaluate(ample.prepared.graph, ample.prepared.devices, ample.chosen.placement).timeline
    scheduled = ample.chosen.placement.info["pipeline"]["schedule"]["peak_bytes"]
    assert ample.sim.peak_bytes == scheduled  # one stage per device, in device order
    assert max(scheduled) < 100e6 < max(unpipelined.peak_bytes)

    tight = build_report(place_model(model, parse_devices("4x100MB"), options), options)
    peaks = [d["peak_bytes"] for d in tight["per_device"]]
    assert tight["pipeline"]["schedule"]["within_memory"] and tight["result"]["feasible"]
    assert peaks == tight["pipeline"]["schedule"]["peak_bytes"]
    assert all(0 < b <= 100e6 for b in peaks)
