"""The liveness ledger behind m-TOPO, m-ETF and m-SCT: an upper bound of the evaluator's memory
that is tight enough to place models the whole-step ledger refuses."""

import pytest
from hypothesis import HealthCheck, given, settings
from strategies import dags, device_specs

from baechi_cli import placers
from baechi_cli.core.devices import Device, DeviceSpec, Interconnect, parse_devices
from baechi_cli.core.errors import InfeasibleError
from baechi_cli.core.graph import GraphBuilder
from baechi_cli.evaluator.evaluate import evaluate
from baechi_cli.placers.listsched import list_schedule
from baechi_cli.placers.memory import MemoryLedger, ample, own_bytes

TB = 10**12


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    g=dags(1, 14, view_p=0.3, held_p=0.15, scope_hold_p=0.3, repeat_p=0.1, measured_us=(3.0, 40.0)),
    spec=device_specs(min_devices=1, max_devices=3, modes=("parallel",)),
)
def test_the_ledger_never_counts_less_than_the_evaluator_running_the_plan(g, spec):
    # In parallel mode the evaluator runs the planned schedule exactly, so the ledger's
    # count along it must be at least the evaluator's peak on every device.
    p = list_schedule(g, spec, "test", budget=[TB] * spec.count)
    peaks = evaluate(g, spec, p).timeline.peak_bytes
    assert all(e >= s for e, s in zip(p.info["estimated_peak_bytes"], peaks)), (
        p.info["estimated_peak_bytes"],
        peaks,
    )


def chain(n, out_bytes=100, persistent=0):
    b = GraphBuilder()
    ids = [b.add_op(f"op{i}", "X", [out_bytes], compute_us=10, persistent_bytes=persistent) for i in range(n)]
    for s, d in zip(ids, ids[1:]):
        b.add_edge(s, d)
    return b.build()


@pytest.mark.parametrize("name", ["topo", "etf", "sct"])
def test_a_chain_fits_in_what_its_live_tensors_need(name):
    # 10 ops each reading the previous one's 100-byte output and holding 100 bytes of
    # weights: at any moment a device holds its weights and two outputs. The whole-step
    # ledger counts every output for the whole step (2 KB) and refuses 2 x 800 B.
    g = chain(10, persistent=100)
    spec = parse_devices("2x800B")
    ledger = MemoryLedger(g, spec)
    assert sum(own_bytes(g)) > spec.total_memory and not ample(g, spec)
    p = placers.get(name).place(g, spec)
    ev = evaluate(g, spec, p)
    assert ev.feasible
    assert max(ev.timeline.peak_bytes) <= 800
    assert ledger.used == [0, 0]


def test_the_estimate_is_close_to_the_evaluator_on_a_chain():
    g = chain(10)
    spec = parse_devices("1x1KB")
    p = placers.get("etf").place(g, spec)
    (estimate,) = p.info["estimated_peak_bytes"]
    (peak,) = evaluate(g, spec, p).timeline.peak_bytes
    assert estimate == peak == 200


def test_no_placement_that_fits_is_an_error_naming_the_device_and_excess():
    # Four ops of 450 B weights on two 1000 B devices: one device runs two of them, and
    # while the second runs it also holds an input and an output of 100 B.
    g = chain(4, persistent=450)
    with pytest.raises(InfeasibleError) as err:
        placers.get("etf").place(g, parse_devices("2x1000B"))
    message = str(err.value)
    assert message.startswith("m-ETF found no placement that fits: /device:GPU:")
    assert "peaks at 1.10 KB (1100 bytes)" in message and "100 bytes over its 1.00 KB" in message


def test_an_op_that_fits_no_device_by_itself_is_named():
    g = chain(4, out_bytes=600)
    with pytest.raises(InfeasibleError) as err:
        placers.get("topo").place(g, parse_devices("2x1000B"))
    assert str(err.value).startswith(
        "the model does not fit: 'op1' needs at least 1.20 KB (1200 bytes) on one device while it runs: "
        "its colocation group's weights 0 bytes, its outputs and temporaries 600 bytes, its largest input 600 bytes"
    )


@pytest.mark.parametrize("memory", ["4x2MB", "2x6MB", "4x4MB", "2x12MB"])
def test_every_placement_the_pipeline_returns_fits_the_ops(memory):
    # A real export trained with Adam, on devices from tight to roomy: whatever the passes
    # contracted (fusion, and forward-only placement where every device holds the model),
    # what the pipeline hands back fits every device as the evaluator counts the ops.
    import os

    from baechi_cli.app.place import PlaceOptions, prepare, run_candidate

    model = os.path.join(os.path.dirname(os.path.dirname(__file__)), "testdata", "torch_resnet.onnx")
    options = PlaceOptions(training=True, optimizer="adam")
    prepared = prepare(model, parse_devices(memory), options, lambda step: None)
    for name in ("topo", "etf", "sct"):
        candidate = run_candidate(prepared, placers.get(name), options)
        if candidate.ok:
            assert candidate.evaluation.feasible
        else:
            assert isinstance(candidate.error, InfeasibleError)
            assert "found no placement that fits" in str(candidate.error) or "does not fit" in str(
                candidate.error
            )


def test_a_scope_hold_whose_keeper_was_committed_first_still_waits_for_its_end():
    # v4 (device 0, 200-250 µs) keeps v6's first output, which v6 makes on device 1 at
    # 200 µs: v4 was committed before v6 but is still running, so the tensor lives until
    # 250 µs (the evaluator's rule). The ledger let it go with v6's last read and counted
    # device 1 at 500 bytes where the evaluator counts 600. A case Hypothesis drew in CI.
    b = GraphBuilder()
    two_ports = {0, 2, 3, 4, 5, 6, 7, 9, 12}
    for i, us in enumerate([200, 10, 200, 10, 50, 10, 10, 10, 10, 10, 10, 10, 10]):
        b.add_op(f"v{i}", "X", [100, 100] if i in two_ports else [100], compute_us=us)
    for src, dst in [
        (0, 1),
        (0, 3),
        (1, 3),
        (2, 3),
        (0, 4),
        (0, 5),
        (0, 8),
        (6, 8),
        (0, 11),
        (0, 12),
        (1, 12),
    ]:
        b.add_edge(src, dst)
    b.set_group(2, 1)
    b.hold_until(6, 0, 4)
    g = b.build()
    spec = DeviceSpec((Device("/d:0", TB), Device("/d:1", TB)), Interconnect("parallel", 10.0, 100.0))
    p = list_schedule(g, spec, "test", budget=[TB] * 2)
    assert p.device_of[4] != p.device_of[6] and p.sequence.index(4) < p.sequence.index(6)
    peaks = evaluate(g, spec, p).timeline.peak_bytes
    assert all(e >= s for e, s in zip(p.info["estimated_peak_bytes"], peaks)), (p.info, peaks)
