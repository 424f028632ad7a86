"""docs/EXTENDING.md's examples, taken from the document and run end to end.

Every code block after an ``<!-- example-... -->`` marker is executed as the
document says it would sit in the code: a new module is loaded under its
documented name, a statement block runs in (a copy of) its target module's
namespace, and a dict-entry or keyword block is evaluated there and added to
the table it belongs to. Each test then runs the real tool with the new
pass, cost rule, reader, objective or schedule and checks what it changed;
the ``registries`` fixture puts every table back as it was. The objective and
the schedule are checked through the CLI in a subprocess, since the CLI's
``--objective`` and ``--schedule`` choices are built when it is imported.
The placer section is ADDING_A_PLACER.md's, run by test_placer_registry.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import types

import pytest
from click.testing import CliRunner

from baechi_cli.app.place import place_model
from baechi_cli.cli.commands import main
from baechi_cli.core import objectives
from baechi_cli.core.devices import parse_devices
from baechi_cli.core.errors import InputError
from baechi_cli.costs import registry, rules_onnx
from baechi_cli.costs.registry import OpView, count_view, rule_for
from baechi_cli.io import formats
from baechi_cli.io.formats import FORMATS, detect_format, load_model
from baechi_cli.passes import manager
from baechi_cli.pipeline import placer, schedules
from baechi_cli.pipeline.schedules import StageCosts, simulate_pipeline
from baechi_cli.search.candidates import PlaceOptions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "EXTENDING.md")
CNN = os.path.join(ROOT, "testdata", "cnn.pb")
INCEPTION = os.path.join(ROOT, "testdata", "workloads", "throughput_LayerGraphs_inceptionv3_inference.json")
TRANSFORMER = os.path.join(ROOT, "testdata", "torch_transformer.onnx")
TRANSFORMER_ARGS = ["--batch-size", "8", "--dim", "seq=128", "--training"]
LAYERS = ("conv0", "conv1", "conv2", "dense0", "dense1")  # cnn.pb's scopes that hold variables


def doc_block(marker: str, language: str = "python") -> str:
    """The fenced block right after ``<!-- marker -->`` in the document."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    found = re.search(rf"<!-- {marker} -->\s*```{language}\n(.*?)```", text, re.S)
    assert found, f"{marker} block missing from {DOC}"
    return found.group(1)


def _compiled(marker: str, mode: str = "exec", around: tuple[str, str] = ("", "")) -> types.CodeType:
    """The block compiled (between ``around``), its file name the document's and the marker."""
    return compile(around[0] + doc_block(marker) + around[1], f"{DOC}:{marker}", mode)


def new_module(monkeypatch: pytest.MonkeyPatch, name: str, marker: str) -> types.ModuleType:
    """The block loaded as module ``name`` (in sys.modules while the test runs)."""
    module = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, module)
    exec(_compiled(marker), vars(module))
    return module


def statements(marker: str, module: types.ModuleType) -> dict:
    """Run the block as if at the end of ``module``; returns the namespace (a copy of the module's)."""
    namespace = dict(vars(module))
    exec(_compiled(marker), namespace)
    return namespace


def entries(marker: str, namespace: dict) -> dict:
    """The block, entries of a dict literal, evaluated in ``namespace``."""
    return eval(_compiled(marker, "eval", ("{", "}")), namespace)


def keywords(marker: str, namespace: dict) -> dict:
    """The block, keyword arguments, evaluated in ``namespace``."""
    return eval(_compiled(marker, "eval", ("dict(", ")")), namespace)


@pytest.fixture
def registries():
    """Every registry the examples add to, put back as it was (in place: other modules hold them)."""
    registry.name_table(registry.ONNX)  # load the rule tables first, or the snapshot would be empty
    tables = [
        manager.REGISTRY,
        FORMATS,
        registry.RULES,
        registry.ONNX_RULES,
        objectives.REGISTRY,
        placer.SOLVERS,
        schedules.REGISTRY,
    ]
    saved = [dict(table) for table in tables]
    try:
        yield
    finally:
        for table, contents in zip(tables, saved):
            table.clear()
            table.update(contents)


def cli(*args: str):
    result = CliRunner().invoke(main, list(args), prog_name="baechi")
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


# ------------------------------------------------------------------ the document


def test_every_extension_point_has_a_section_and_the_placer_one_points_to_its_example():
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings == [
        "Placers",
        "Graph passes",
        "Cost rules",
        "Readers (input formats)",
        "Objectives",
        "Pipeline schedules",
    ]
    placers_section = text.split("## Placers", 1)[1].split("\n## ", 1)[0]
    assert "(ADDING_A_PLACER.md)" in placers_section and "tests/test_placer_registry.py" in placers_section
    assert os.path.exists(os.path.join(ROOT, "docs", "ADDING_A_PLACER.md"))


# ------------------------------------------------------------------ a pass


def layer_devices(report: dict) -> dict[str, set[str]]:
    """The devices each of cnn.pb's layers runs on: its scope's ops and its gradients'."""
    found: dict[str, set[str]] = {layer: set() for layer in LAYERS}
    for name, device in report["placement"].items():
        for layer in LAYERS:
            if name.startswith((f"{layer}/", f"gradients/{layer}/")):
                found[layer].add(device)
    return found


def test_pass_example_keeps_each_layer_on_one_device(registries, monkeypatch, tmp_path):
    args = ["place", CNN, "-d", "4x8GB", "--algo", "etf"]
    before = tmp_path / "before.json"
    assert cli(*args, "-q", "--report", str(before)).exit_code == 0
    # m-ETF alone splits four of the layers; the pass must keep them whole.
    devices_before = layer_devices(json.loads(before.read_text()))
    assert sum(len(devices) > 1 for devices in devices_before.values()) == 4

    module = new_module(monkeypatch, "baechi_cli.passes.layer_scopes", "example-pass-module")
    statements("example-pass-entry", manager)
    change = keywords("example-pass-format", vars(formats))
    FORMATS["graphdef"] = dataclasses.replace(FORMATS["graphdef"], **change)
    assert [spec.name for spec in manager.ordered("constraint")] == [
        "colocation",
        "control_flow",
        "layer_scopes",
    ]
    assert module.layer_of("gradients/conv0/Conv2D_grad/ShapeN") == "conv0"

    after = tmp_path / "after.json"
    result = cli(*args, "--report", str(after))
    assert result.exit_code == 0, result.output
    assert "layer-scopes 51->18 groups" in result.output
    report = json.loads(after.read_text())
    records = [p for p in report["passes"] if p["name"] in ("colocation", "control_flow", "layer_scopes")]
    assert [p["name"] for p in records] == ["colocation", "control_flow", "layer_scopes"]
    record = records[-1]
    assert record["enabled"] and (record["groups_before"], record["groups_after"]) == (51, 18)
    # A constraint pass keeps every op.
    assert record["ops_before"] == record["ops_after"] == report["input"]["ops"]
    assert all(len(devices) == 1 for devices in layer_devices(report).values())
    assert report["result"]["feasible"]

    with pytest.raises(ValueError, match="taken"):
        statements("example-pass-entry", manager)


# ------------------------------------------------------------------ a cost rule


def det_model(path) -> str:
    """An ONNX model: x [4, 512, 512] -> Det -> y [4]."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Det", ["x"], ["y"], name="det")],
        "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 512, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


def profiled_det(path: str) -> dict:
    result = cli("profile", path, "--json")
    assert result.exit_code == 0, result.output
    (op,) = [op for op in json.loads(result.output)["ops"] if op["name"] == "det"]
    return op


def placed_costs(path: str, report) -> dict:
    assert cli("place", path, "-d", "2x1GB", "-q", "--report", str(report)).exit_code == 0
    return json.loads(report.read_text())["costs"]


def test_cost_rule_example_counts_det(registries, tmp_path):
    path = det_model(tmp_path / "det.onnx")
    assert rule_for("Det", "onnx").kind == "uncovered"
    before = profiled_det(path)
    assert (before["rule"], before["flops"]) == ("uncovered", 0)
    assert placed_costs(path, tmp_path / "before.json")["uncovered"] == ["Det"]

    statements("example-cost-rule", rules_onnx)
    entry = rule_for("Det", "onnx")
    assert entry.kind == "flops" and entry.note == "LU factorisation: 2n^3/3 FLOPs per n x n matrix"
    after = profiled_det(path)
    assert after["rule"] == "flops"
    assert after["flops"] == pytest.approx(4 * 2 * 512**3 / 3)
    assert after["compute_us"] > 2 * before["compute_us"]  # compute-bound now, not bytes only
    costs = placed_costs(path, tmp_path / "after.json")
    assert costs["uncovered"] == [] and costs["coverage"]["flops"] == {"Det": 1}

    unknown = OpView("Det", {}, [None], ["float32"], [0], [None], ["float32"], [0])
    count, fell_back = count_view(entry, unknown)
    assert fell_back and count.flops == 0


# ------------------------------------------------------------------ a reader


@pytest.fixture
def op_list(registries, monkeypatch):
    """The op-list format registered as the document says."""
    new_module(monkeypatch, "baechi_cli.io.op_list", "example-reader-module")
    namespace = statements("example-reader-wrapper", formats)
    FORMATS.update(entries("example-reader-entry", namespace))


def test_reader_example_reads_and_places_an_op_list(op_list, tmp_path):
    model = tmp_path / "model.ops.txt"
    model.write_text(doc_block("example-reader-file", "text"))
    assert detect_format(str(model)) == "op_list"
    graph = load_model(str(model), None).graph
    assert graph.names == ["x", "a", "b", "c", "d"] and graph.num_edges == 5
    assert graph.compute_us == [0.0, 300.0, 300.0, 10.0, 300.0]

    report_path = tmp_path / "r.json"
    result = cli("place", str(model), "-d", "2x1GB", "--report", str(report_path))
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    assert report["input"]["format"] == "op_list" and report["input"]["ops"] == 5
    assert report["result"]["feasible"]
    assert len(set(report["placement"].values())) == 2  # three 400 MB weights: one 1 GB device holds two

    profile = cli("profile", str(model), "--json")
    assert profile.exit_code == 0, profile.output
    assert json.loads(profile.output)["totals"]["compute_us"] == 910  # the file's own costs

    refused = cli("place", str(model), "-d", "2x1GB", "-o", str(tmp_path / "placed.ops.txt"))
    assert refused.exit_code == 2 and "input is an op list; use --report" in refused.output


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "x Input 0 4 0\ny Relu fast 4 0 x\n",
            "line 2: compute_us, output_bytes and weight_bytes must be numbers",
        ),
        ("x Input 0 4 0\n\ny Relu 1 4 0 z\n", "line 3: input 'z' is not on an earlier line"),
        ("x Input 0 4\n", "line 1: expected 5 or 6 fields, got 4"),
        ("x Input 0 4 0\nx Relu 1 4 0\n", "line 2: op 'x' is defined twice"),
        ("x Input nan 4 0\n", "line 1: costs must be finite and at least 0"),
        ("# only a comment\n", "no ops: every line is blank or a comment"),
    ],
)
def test_reader_example_names_the_file_and_line_of_bad_input(op_list, tmp_path, text, problem):
    model = tmp_path / "bad.ops.txt"
    model.write_text(text)
    with pytest.raises(InputError) as error:
        load_model(str(model), None)
    assert str(error.value) == f"{model}: {problem}"
    result = cli("place", str(model), "-d", "2x1GB")
    assert result.exit_code == 2 and result.output.strip() == f"error: {model}: {problem}"


# ------------------------------------------------------------------ an objective and a schedule

RUNNER = """
import json, sys
from baechi_cli.core import objectives
from baechi_cli.pipeline import placer, schedules
blocks = json.load(open(sys.argv[1]))
exec(compile(blocks["objective-entry"], "objective-entry", "exec"), vars(objectives))
exec(compile(blocks["objective-solver"], "objective-solver", "exec"), vars(placer))
placer.SOLVERS.update(eval("{" + blocks["objective-solvers"] + "}", vars(placer)))
exec(compile(blocks["schedule"], "schedule", "exec"), vars(schedules))
from baechi_cli.cli.commands import main
main(sys.argv[2:], prog_name="baechi")
"""


@pytest.fixture(scope="module")
def registered_cli(tmp_path_factory):
    """Run the CLI in a subprocess with the document's objective and schedule registered first."""
    tmp = tmp_path_factory.mktemp("cli")
    blocks = tmp / "blocks.json"
    markers = ("objective-entry", "objective-solver", "objective-solvers", "schedule")
    blocks.write_text(json.dumps({m: doc_block(f"example-{m}") for m in markers}))
    runner = tmp / "runner.py"
    runner.write_text(RUNNER)

    def run(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, str(runner), str(blocks), *args]
        return subprocess.run(command, capture_output=True, text=True, cwd=ROOT)

    return run


def is_ranges(graph, device_of: list[int], stages: list[dict]) -> bool:
    """Whether each stage's ops are a range of ``graph``'s topological order, stages in pipeline order."""
    stage_of_device = {stage["device"]: i for i, stage in enumerate(stages)}
    stage = [stage_of_device[d] for d in device_of]
    order = graph.topo_order()
    return all(stage[a] <= stage[b] for a, b in zip(order, order[1:]))


def test_objective_example_places_in_ranges_through_the_cli(registered_cli, tmp_path):
    graph = load_model(INCEPTION, None).graph
    assert len(set(graph.group)) == graph.num_ops  # one op per unit: ranges of ops are ranges of units
    report_path = tmp_path / "r.json"
    result = registered_cli(
        "place", INCEPTION, "-d", "4x16GB", "--objective", "ranges", "--report", str(report_path)
    )
    assert result.returncode == 0, result.stderr
    assert "pipeline: max-load" in result.stdout
    report = json.loads(report_path.read_text())
    assert report["options"]["objective"] == "ranges" and report["algorithm"] == "pipeline"
    pipeline = report["pipeline"]
    assert pipeline["objective"] == "ranges"
    assert pipeline["proven_optimal"] and pipeline["optimal_among"] == "program order"
    device_index = {d["name"]: i for i, d in enumerate(report["devices"])}
    device_of = [device_index[report["placement"][name]] for name in graph.names]
    assert is_ranges(graph, device_of, pipeline["stages"])
    assert pipeline["max_load_us"] == pytest.approx(79621.314087)

    # The unrestricted objective finds a lower max-load with a split that is not made of ranges.
    free = place_model(INCEPTION, parse_devices("4x16GB"), PlaceOptions(objective="throughput"))
    split = free.chosen.placement
    assert not is_ranges(graph, split.device_of, split.info["pipeline"]["stages"])
    assert split.info["pipeline"]["max_load_us"] < pipeline["max_load_us"]

    refused = registered_cli("place", INCEPTION, "-d", "4x16GB", "--objective", "ranges", "--algo", "etf")
    assert refused.returncode == 2 and "places with the pipeline splitter" in refused.stderr


def test_objective_is_refused_by_name_when_not_registered():
    assert "ranges" not in objectives.names() and "ranges" not in placer.SOLVERS
    with pytest.raises(InputError, match="unknown objective 'ranges'"):
        objectives.get("ranges")


def in_flight(stages: int, microbatches: int) -> list[int]:
    """Eager 1F1B's microbatches in flight per stage, as the document states."""
    return [min(2 * (stages - s - 1) + 1, microbatches) for s in range(stages)]


def test_schedule_example_simulates(registries):
    statements("example-schedule", schedules)
    assert schedules.get("eager-1f1b").stages_per_device == 1
    assert "eager-1f1b" not in schedules.compared_by_default()
    for stages, microbatches in [(1, 3), (2, 1), (3, 4), (4, 8), (5, 2)]:
        equal = StageCosts([1.0] * stages, [2.0] * stages)
        timing = simulate_pipeline(equal, microbatches, "eager-1f1b")
        assert timing.minibatch_us == (microbatches + stages - 1) * 3.0
        assert list(timing.peak_in_flight) == in_flight(stages, microbatches)
        inference = simulate_pipeline(StageCosts([1.0] * stages, [0.0] * stages), microbatches, "eager-1f1b")
        assert inference.minibatch_us == microbatches + stages - 1
    slow = StageCosts([1.0] * 4, [2.0] * 4, send_forward_us=[1.0] * 3, send_backward_us=[1.0] * 3)
    assert simulate_pipeline(slow, 8, "1f1b").minibatch_us == 49.0
    eager = simulate_pipeline(slow, 8, "eager-1f1b")
    assert eager.minibatch_us == 39.0 and eager.peak_in_flight == (7, 5, 3, 1)


def test_schedule_example_places_through_the_cli(registered_cli, tmp_path):
    report_path = tmp_path / "r.json"
    args = [*TRANSFORMER_ARGS, "--objective", "throughput", "--microbatches", "8"]
    result = registered_cli(
        "place", TRANSFORMER, "-d", "4x8GB", *args, "--schedule", "eager-1f1b", "--report", str(report_path)
    )
    assert result.returncode == 0, result.stderr
    assert "eager-1f1b, 8 microbatches: minibatch" in result.stdout
    schedule = json.loads(report_path.read_text())["pipeline"]["schedule"]
    assert schedule["name"] == "eager-1f1b" and schedule["within_memory"]
    stages = len(schedule["peak_in_flight"])
    assert stages > 1 and schedule["peak_in_flight"] == in_flight(stages, 8)

    one_f_one_b = place_model(
        TRANSFORMER,
        parse_devices("4x8GB"),
        PlaceOptions(
            objective="throughput",
            microbatches=8,
            schedule="1f1b",
            batch_size=8,
            dims={"seq": 128},
            training=True,
        ),
    )
    baseline = one_f_one_b.chosen.placement.info["pipeline"]["schedule"]
    assert baseline["name"] == "1f1b"
    assert schedule["minibatch_us"] < baseline["minibatch_us"]
