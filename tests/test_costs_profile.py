"""The baechi.profile/v1 format: building, JSON round trips, validation, matching a graph,
and `baechi profile` / `baechi place --profile` through the CLI."""

from __future__ import annotations

import json
import math
import os

import pytest
from click.testing import CliRunner

from baechi_cli.app.place import PlaceOptions, place_model
from baechi_cli.app.profile import profile_model
from baechi_cli.cli.commands import main
from baechi_cli.core.devices import parse_devices
from baechi_cli.core.errors import InputError
from baechi_cli.costs.profile import SCHEMA, apply_profile, dumps, load_profile, parse
from baechi_cli.io.formats import load_model

TESTDATA = os.path.join(os.path.dirname(__file__), "..", "testdata")
CNN = os.path.join(TESTDATA, "cnn.pb")
MLP = os.path.join(TESTDATA, "mlp.pb")
GNMT_DYNAMIC = os.path.join(TESTDATA, "gnmt_dynamic.pb")
WORKLOAD = os.path.join(TESTDATA, "workloads", "throughput_LayerGraphs_gnmt_training.json")
SPEC = parse_devices("4x8GB")


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def cnn_profile():
    return profile_model(CNN, SPEC)


def test_analytic_profile_has_every_op_and_consistent_totals(cnn_profile):
    p, g = cnn_profile.profile, cnn_profile.graph
    assert p.schema == SCHEMA and p.source == "analytic" and "10.07 TFLOP/s" in p.device
    assert [op.name for op in p.ops] == g.names
    assert p.model.ops == g.num_ops and p.model.format == "graphdef" and len(p.model.sha256) == 64
    assert p.totals.compute_us == pytest.approx(sum(op.compute_us for op in p.ops))
    assert p.totals.flops == pytest.approx(cnn_profile.cost_report.total_flops)
    assert p.totals.persistent_bytes == sum(op.persistent_bytes for op in p.ops) > 0
    assert p.totals.analytic_ops == g.num_ops and p.totals.measured_ops == 0
    # One device runs the ops back to back: the step is the compute sum.
    assert p.totals.single_device_step_us == pytest.approx(p.totals.compute_us)
    # Activations of a 32-image CNN: more than the first conv's output, less than every output at once.
    first_conv = next(op for op in p.ops if op.type == "Conv2D")
    all_outputs = sum(sum(op.output_bytes) for op in p.ops)
    assert sum(first_conv.output_bytes) < p.totals.peak_activation_bytes < all_outputs
    conv = first_conv
    assert conv.flops > 0 and conv.rule == "flops" and conv.source == "analytic"
    assert sum(c.ops for c in p.coverage) == g.num_ops
    assert not p.HasField("measurement")


def test_json_keys_are_the_documented_contract(cnn_profile):
    doc = json.loads(dumps(cnn_profile.profile))
    assert {"schema", "source", "device", "totals", "ops"} <= set(doc)
    assert {"compute_us", "flops", "persistent_bytes", "peak_activation_bytes"} <= set(doc["totals"])
    op_keys = {
        "name",
        "type",
        "compute_us",
        "flops",
        "output_bytes",
        "temporary_bytes",
        "persistent_bytes",
        "source",
    }
    assert all(op_keys <= set(op) for op in doc["ops"])
    # Numbers, not the JSON mapping's int64 strings.
    assert isinstance(doc["model"]["ops"], int) and isinstance(doc["ops"][0]["output_bytes"][0], int)


def test_same_input_same_bytes_and_round_trip(cnn_profile, tmp_path):
    again = profile_model(CNN, SPEC)
    assert dumps(again.profile) == dumps(cnn_profile.profile)
    path = tmp_path / "costs.json"
    path.write_text(dumps(cnn_profile.profile))
    loaded = load_profile(str(path))
    assert loaded == cnn_profile.profile
    # One op per line, so two profiles diff op by op.
    lines = path.read_text().splitlines()
    assert sum(1 for line in lines if line.strip().startswith('{"name"')) == cnn_profile.graph.num_ops


def test_applying_a_profile_reproduces_its_costs(cnn_profile):
    graph = load_model(CNN, None).graph
    applied = apply_profile(graph, cnn_profile.profile, "costs.json")
    costed = cnn_profile.graph
    assert applied.compute_us == costed.compute_us
    assert applied.output_bytes == costed.output_bytes
    assert applied.persistent_bytes == costed.persistent_bytes
    assert applied.edge_bytes == costed.edge_bytes


def test_place_with_the_analytic_profile_equals_place_without(cnn_profile, tmp_path):
    path = tmp_path / "costs.json"
    path.write_text(dumps(cnn_profile.profile))
    plain = place_model(CNN, SPEC, PlaceOptions(algo="etf"))
    profiled = place_model(CNN, SPEC, PlaceOptions(algo="etf", profile=str(path)))
    assert profiled.sim.step_time_us == pytest.approx(plain.sim.step_time_us)
    assert profiled.sim.device_of == plain.sim.device_of


def test_place_uses_the_profile_costs(cnn_profile, tmp_path):
    """Costs edited in the profile are the costs placed with: 10x slower convolutions, 10x the step."""
    doc = json.loads(dumps(cnn_profile.profile))
    for op in doc["ops"]:
        op["compute_us"] *= 10
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(doc))
    plain = place_model(CNN, SPEC, PlaceOptions(algo="single"))
    slow = place_model(CNN, SPEC, PlaceOptions(algo="single", profile=str(path)))
    assert slow.sim.step_time_us == pytest.approx(10 * plain.sim.step_time_us)
    assert slow.prepared.cost_report.to_json()["model"] == "profile"


def _edited(profile, edit) -> str:
    doc = json.loads(dumps(profile))
    edit(doc)
    return json.dumps(doc)


def _set(index, key, value):
    def edit(doc):
        doc["ops"][index][key] = value

    return edit


@pytest.mark.parametrize(
    "edit, message, names_op",
    [
        (_set(5, "compute_us", "NaN"), "compute_us is NaN", True),
        (_set(5, "compute_us", -1.0), "compute_us is negative", True),
        (_set(5, "temporary_bytes", "Infinity"), "temporary_bytes is infinite", True),
        (_set(5, "output_bytes", [12.5]), "output_bytes[0] is not a whole number", True),
        (_set(5, "persistent_bytes", -8), "persistent_bytes is negative", True),
        (lambda doc: doc.update(schema="baechi.profile/v9"), "is not 'baechi.profile/v1'", False),
        (lambda doc: doc.pop("schema"), 'no "schema" key', False),
        (lambda doc: doc["ops"].append(dict(doc["ops"][0])), "occurs twice", False),
        (_set(5, "compute_us", "fast"), "malformed profile", False),
    ],
)
def test_bad_profiles_are_one_line_errors_naming_file_and_op(cnn_profile, edit, message, names_op):
    text = _edited(cnn_profile.profile, edit)
    with pytest.raises(InputError) as err:
        parse(text, "costs.json")
    line = str(err.value)
    assert message in line and line.startswith("costs.json") and "\n" not in line
    if names_op:
        assert f"op '{cnn_profile.profile.ops[5].name}'" in line


def test_not_json_is_an_input_error():
    with pytest.raises(InputError, match="invalid JSON"):
        parse("{not json", "costs.json")


def test_profile_of_another_model_lists_the_first_mismatches(cnn_profile):
    mlp = load_model(MLP, None).graph
    with pytest.raises(InputError) as err:
        apply_profile(mlp, cnn_profile.profile, "costs.json", MLP)
    line = str(err.value)
    assert "does not match" in line and "missing from the profile: 'x'" in line and "not in the model" in line
    assert "more" in line  # only the first names are listed


def test_port_count_and_missing_op_mismatches(cnn_profile):
    graph = load_model(CNN, None).graph

    def drop_port(doc):
        doc["ops"][0]["output_bytes"] = []

    with pytest.raises(
        InputError, match=r"1 output port count\(s\) differ: 'images' has 0 in the profile, 1"
    ):
        apply_profile(graph, parse(_edited(cnn_profile.profile, drop_port), "c.json"), "c.json")
    with pytest.raises(InputError, match=r"1 op\(s\) of the model missing from the profile: 'labels'"):
        apply_profile(
            graph, parse(_edited(cnn_profile.profile, lambda d: d["ops"].pop(1)), "c.json"), "c.json"
        )


def test_workload_profile_keeps_given_costs_and_edge_transfers(tmp_path):
    outcome = profile_model(WORKLOAD, SPEC)
    p = outcome.profile
    assert p.source == "measured" and {c.rule for c in p.coverage} == {"given"}
    assert len(p.edges) > 0 and all(e.transfer_us >= 0 for e in p.edges)
    path = tmp_path / "w.json"
    path.write_text(dumps(p))
    plain = place_model(WORKLOAD, SPEC, PlaceOptions(algo="topo"))
    profiled = place_model(WORKLOAD, SPEC, PlaceOptions(algo="topo", profile=str(path)))
    assert profiled.sim.step_time_us == pytest.approx(plain.sim.step_time_us)


def test_loops_are_simulated_through_the_constraint_passes():
    """gnmt_dynamic has TF1 while loops: the one-device run needs the back edges removed."""
    p = profile_model(GNMT_DYNAMIC, SPEC).profile
    assert p.totals.single_device_step_us > 0 and p.totals.peak_activation_bytes > 0


# --- CLI ------------------------------------------------------------------------------


def test_cli_profile_prints_totals_top_ops_types_and_coverage():
    r = run("profile", CNN)
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert (
        "analytic costs" in out and "totals: compute" in out and "GFLOP" in out and "peak activations" in out
    )
    assert "top 10 ops by time" in out and "by op type" in out and "Conv2D" in out
    assert "coverage: 355/355 ops (100.0%)" in out


def test_cli_profile_json_and_output_file(tmp_path):
    out = tmp_path / "costs.json"
    r = run("profile", CNN, "--json", "-o", str(out))
    assert r.exit_code == 0
    printed = json.loads(r.stdout)
    assert printed["schema"] == SCHEMA and printed == json.loads(out.read_text())


def test_cli_place_with_profile_and_bad_profiles_write_nothing(tmp_path):
    costs = tmp_path / "costs.json"
    assert run("profile", CNN, "-q", "-o", str(costs)).exit_code == 0
    report = tmp_path / "r.json"
    r = run("place", CNN, "-d", "4x8GB", "--profile", str(costs), "--report", str(report), "-q")
    assert r.exit_code == 0
    assert json.loads(report.read_text())["costs"]["profile"] == str(costs)

    placed = tmp_path / "placed.pb"
    r = run("place", MLP, "-d", "4x8GB", "--profile", str(costs), "-o", str(placed))
    assert r.exit_code == 2 and "does not match" in r.stderr and not placed.exists()
    nan = tmp_path / "nan.json"
    nan.write_text(costs.read_text().replace('"compute_us": 0,', '"compute_us": NaN,', 1))
    r = run("place", CNN, "-d", "4x8GB", "--profile", str(nan), "-o", str(placed))
    assert r.exit_code == 2 and "is NaN" in r.stderr and not placed.exists()
    r = run("place", CNN, "-d", "4x8GB", "--profile", str(tmp_path / "none.json"))
    assert r.exit_code == 2 and "no such file" in r.stderr


def test_cli_profile_usage_errors(tmp_path):
    r = run("profile")
    assert r.exit_code == 2 and "missing MODEL" in r.output
    r = run("profile", WORKLOAD, "--measure", "-o", str(tmp_path / "c.json"))
    assert r.exit_code == 2 and "--measure runs TensorFlow GraphDefs" in r.stderr
    assert not (tmp_path / "c.json").exists()
    r = run("profile", CNN, "--init-op", "init")
    assert r.exit_code == 2 and "--init-op needs --measure" in r.output
    r = run("profile", str(tmp_path / "missing.pb"))
    assert r.exit_code == 2 and "no such file" in r.stderr


def test_profile_totals_are_finite_for_every_committed_graph():
    for name in ("mlp", "cnn", "transformer"):
        t = profile_model(os.path.join(TESTDATA, f"{name}.pb"), SPEC).profile.totals
        assert all(math.isfinite(x) and x > 0 for x in (t.compute_us, t.flops, t.peak_activation_bytes)), name


@pytest.mark.tf
def test_cli_comm_calibration_writes_a_device_yaml(tmp_path):
    pytest.importorskip("tensorflow")
    from baechi_cli.core.devices import load_devices_yaml

    out = tmp_path / "devices.yaml"
    r = run("profile", "--comm", "--max-bytes", "20", "-d", "2x8GB", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert "/device:CPU:0 -> /device:CPU:1" in r.stdout and "R^2" in r.stdout and "2^20" in r.stdout
    spec = load_devices_yaml(str(out))
    assert spec.count == 2 and spec.interconnect.bandwidth_bytes_per_us > 0
    r = run("profile", "--comm", "--json", "--max-bytes", "20", "-q")
    doc = json.loads(r.stdout)
    assert doc["bandwidth_bytes_per_us"] > 0 and len(doc["samples"]) == 21
    r = run("profile", "--comm", "--between", "CPU:0")
    assert r.exit_code == 2 and "must name two devices" in r.stderr
    r = run("profile", CNN, "--comm")
    assert r.exit_code == 2 and "give no MODEL" in r.output


@pytest.mark.tf
def test_measured_profile_places_end_to_end(tmp_path):
    """`profile --measure -o` then `place --profile`: measured times drive the placement."""
    pytest.importorskip("tensorflow")
    costs = tmp_path / "measured.json"
    r = run("profile", CNN, "--measure", "--warmup", "1", "--steps", "3", "-o", str(costs))
    assert r.exit_code == 0, r.output
    p = load_profile(str(costs))
    measured = [op for op in p.ops if op.source == "measured"]
    assert (
        "mixed costs for /device:CPU:0" in r.stdout
        and f"measured: {len(measured)} of 355 ops ran" in r.stdout
    )
    assert p.source == "mixed" and p.measurement.steps == 3
    # The train step's ops (173; fewer when oneDNN fuses some, as when TensorFlow
    # was imported with it on before this test) ran; init-only ops did not.
    assert 150 <= len(measured) == p.totals.measured_ops <= 173
    assert p.measurement.not_run_count == 355 - len(measured)
    assert all(op.device.endswith("CPU:0") for op in measured)
    # (A forward conv may be fused into its BiasAdd by oneDNN; its gradient never is.)
    grad = next(op for op in measured if op.name == "gradients/conv1/Conv2D_grad/Conv2DBackpropInput")
    assert grad.compute_us > 0 and list(grad.output_bytes) == [32 * 16 * 16 * 32 * 4]
    # Ops that did not run (initialisers, fed placeholders) keep analytic costs.
    assert {op.name for op in p.ops if op.source == "analytic"} >= {"images", "labels"}
    report = tmp_path / "r.json"
    r = run("place", CNN, "-d", "4x8GB", "--profile", str(costs), "--report", str(report), "-q")
    assert r.exit_code == 0, r.output
    doc = json.loads(report.read_text())
    assert doc["costs"]["source"] == "mixed" and doc["result"]["feasible"]
    # The one-device step is the measured compute sum, not the analytic model's.
    assert doc["result"]["single_device_us"] == pytest.approx(p.totals.single_device_step_us)


def test_fast_json_mapping_equals_protobufs(cnn_profile):
    """to_json maps the per-op lists itself; it must give what protobuf's MessageToDict gives."""
    from google.protobuf import json_format

    from baechi_cli.costs.profile import to_json

    workload = profile_model(WORKLOAD, SPEC).profile
    odd = cnn_profile.profile.__class__()
    odd.CopyFrom(cnn_profile.profile)
    odd.ops[0].compute_us = math.nan  # non-finite doubles are strings in the JSON mapping
    odd.ops[1].output_bytes.append(math.inf)
    for p in (cnn_profile.profile, workload, odd):
        theirs = json_format.MessageToDict(
            p, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
        assert to_json(p) == theirs
