"""Tests for `baechi verify PLACED.onnx` and baechi_cli.verify.onnx.

Placed models are made by the CLI (`baechi place MODEL.onnx -o placed.onnx`)
from the committed test models; tampered copies are edited with the onnx
package. Tests that run models need onnxruntime (importorskip).
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnxmodels import ONNX_MODELS, OnnxModel, onnx_model

from baechi_cli.cli.commands import main
from baechi_cli.io.onnx import CONFIGURATION, DEVICE_KEY
from baechi_cli.verify.onnx import _compare_output, static_check_onnx

TESTDATA = pathlib.Path(__file__).resolve().parent.parent / "testdata"
RESNET = onnx_model("torch_resnet")  # inline weights: always runnable
TRANSFORMER = onnx_model("torch_transformer")  # symbolic dims batch, seq


def invoke(*args: Any) -> Any:
    return CliRunner().invoke(main, [str(a) for a in args])


def load(path: pathlib.Path) -> onnx.ModelProto:
    return onnx.load(str(path), load_external_data=False)


def place(model: OnnxModel, out: pathlib.Path, source: pathlib.Path | None = None) -> pathlib.Path:
    """`baechi place` ``model`` (from ``source``, default its path) with --training into ``out``."""
    devices = "4x8MB" if model is RESNET else "4x8GB"
    result = invoke(
        "place", source or model.path, "-d", devices, "--training", "-o", out, "-q", *model.cli_args
    )
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def placed_resnet(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """torch_resnet placed on several devices; tests copy it before editing."""
    path = place(RESNET, tmp_path_factory.mktemp("resnet") / "placed.onnx")
    devices = {p.value for n in load(path).graph.node for p in n.metadata_props}
    assert len(devices) > 1, devices
    return path


def tampered(source: pathlib.Path, tmp_path: pathlib.Path, edit: Callable[[onnx.ModelProto], str]) -> tuple:
    """A copy of ``source`` with ``edit`` applied: (its path, what ``edit`` returned)."""
    model = load(source)
    what = edit(model)
    path = tmp_path / "tampered.onnx"
    path.write_bytes(model.SerializeToString())
    return path, what


def problems(output: str) -> list[str]:
    lines = output.splitlines()
    return [line.strip() for line in lines[lines.index("problems:") + 1 :] if line.startswith("  ")]


def baechi_entry(node: onnx.NodeProto) -> onnx.NodeDeviceConfigurationProto:
    (entry,) = [c for c in node.device_configurations if c.configuration_id == CONFIGURATION]
    return entry


def set_device_meta(node: onnx.NodeProto, value: str) -> None:
    (entry,) = [p for p in node.metadata_props if p.key == DEVICE_KEY]
    entry.value = value


# --- passing placements -------------------------------------------------------


@pytest.mark.parametrize("model", ONNX_MODELS, ids=str)
def test_placed_models_verify_statically_against_their_original(model: OnnxModel, tmp_path):
    # Placed from testdata into tmp_path: external weights, where the model has them, are not beside it.
    placed = place(model, tmp_path / "placed.onnx")
    result = invoke("verify", placed, "--original", model.path)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"{placed}: {len(load(placed).graph.node)} nodes on ")
    assert f"ok   same model as {model.path}, baechi's annotations aside" in lines
    assert "ok   every node has a device" in lines
    checker = next(line for line in lines if "onnx.checker" in line)
    if model.external:
        assert checker == (
            f"ok   passes onnx.checker (external weights absent ({model.name}.onnx.data): "
            "structure checked without them)"
        )
    else:
        assert checker == "ok   passes onnx.checker"
    assert lines[-1] == "verified"


def test_json_keeps_the_verify_schema(placed_resnet):
    result = invoke("verify", placed_resnet, "--original", RESNET.path, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["schema"] == "baechi.verify/v1" and data["format"] == "onnx"
    assert data["ok"] is True and data["run"] is None
    assert data["placed"] == str(placed_resnet) and data["original"] == str(RESNET.path)
    static = data["static"]
    model = load(placed_resnet)
    assert static["ops_total"] == len(model.graph.node) == sum(static["devices"].values())
    assert static["configuration"] == list(model.configuration[0].device)
    assert static["num_devices"] == 4 and len(static["devices"]) > 1
    for key in ("differences", "without_device", "annotation_problems"):
        assert static[key] == [] and static[f"{key}_count"] == 0
    assert static["checker"] is None and static["checker_note"] is None


@pytest.mark.parametrize("with_original", [True, False], ids=["original", "unannotated"])
def test_run_gives_identical_outputs(placed_resnet, with_original):
    pytest.importorskip("onnxruntime")
    original = ["--original", RESNET.path] if with_original else []
    result = invoke("verify", placed_resnet, *original, "--run")
    assert result.exit_code == 0, result.output
    reference = f"{RESNET.path}'s" if with_original else "the unannotated model's"
    assert f"ok   onnxruntime (CPU, seed 0): 1 of 1 outputs identical to {reference}" in result.output
    data = json.loads(invoke("verify", placed_resnet, *original, "--run", "--json").output)
    run = data["run"]
    assert run["ok"] and run["error"] is None and run["seed"] == 0 and run["dims_defaulted"] == []
    assert run["inputs"] == {"images": {"dtype": "float32", "shape": [32, 3, 64, 64]}}
    assert run["outputs"] == [{"name": "logits", "identical": True, "max_abs_diff": None, "detail": None}]
    assert run["reference"] == (
        str(RESNET.path) if with_original else f"{placed_resnet} without baechi's annotations"
    )


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(m, marks=[pytest.mark.slow] if m.external else [])  # 10+ s each
        for m in ONNX_MODELS
        if m.weights_present and m is not RESNET
    ],
    ids=str,
)
def test_run_on_every_model_with_its_weights(model: OnnxModel, tmp_path):
    pytest.importorskip("onnxruntime")
    source = model.path
    if model.data_path is not None:  # the placed model reads its weights beside it
        source = tmp_path / model.path.name
        shutil.copy(model.path, source)
        shutil.copy(model.data_path, tmp_path / model.data_path.name)
    placed = place(model, tmp_path / "placed.onnx", source)
    result = invoke("verify", placed, "--original", source, "--run", *model.cli_args)
    assert result.exit_code == 0, result.output
    assert "outputs identical to" in result.output and "symbolic dims bound" not in result.output


def test_symbolic_dims_default_to_1_and_say_so(tmp_path):
    pytest.importorskip("onnxruntime")
    placed = place(TRANSFORMER, tmp_path / "placed.onnx")
    result = invoke("verify", placed, "--run")
    assert result.exit_code == 0, result.output
    assert "(CPU, seed 0; symbolic dims bound to 1: batch, seq): 1 of 1 outputs identical" in result.output
    result = invoke(
        "verify",
        placed,
        "--original",
        TRANSFORMER.path,
        "--run",
        "--json",
        "--dim",
        "seq=16",
        "--batch-size",
        "3",
    )
    assert result.exit_code == 0, result.output
    run = json.loads(result.output)["run"]
    assert run["inputs"] == {"tokens": {"dtype": "int64", "shape": [3, 16]}} and run["dims_defaulted"] == []


# --- tampered placements --------------------------------------------------------


def test_a_node_without_its_device_metadata_fails_naming_it(placed_resnet, tmp_path):
    def edit(model: onnx.ModelProto) -> str:
        node = model.graph.node[5]
        del node.metadata_props[:]
        return node.name

    path, name = tampered(placed_resnet, tmp_path, edit)
    result = invoke("verify", path)
    assert result.exit_code == 1, result.output
    assert "FAIL 1 node or configuration annotation problem(s)" in result.output
    (line,) = problems(result.output)
    assert line.startswith(f"node '{name}': device_configurations say /device:GPU:") and line.endswith(
        "but it has no 'baechi.device'"
    )
    assert result.output.splitlines()[-1] == "FAILED: 1 problem"


def test_a_node_without_any_device_fails_naming_it(placed_resnet, tmp_path):
    def edit(model: onnx.ModelProto) -> str:
        node = model.graph.node[3]
        del node.metadata_props[:]
        del node.device_configurations[:]
        return node.name

    path, name = tampered(placed_resnet, tmp_path, edit)
    result = invoke("verify", path, "--original", RESNET.path)
    assert result.exit_code == 1, result.output
    assert "FAIL 1 of 69 nodes have no device" in result.output
    assert "ok   same model as" in result.output  # the annotations are all that changed
    assert problems(result.output) == [f"1 node(s) have no device: '{name}'"]


def test_metadata_disagreeing_with_device_configurations_names_both(placed_resnet, tmp_path):
    def edit(model: onnx.ModelProto) -> str:
        node = model.graph.node[7]
        config = list(model.configuration[0].device)
        (k,) = {d for s in baechi_entry(node).sharding_spec for d in s.device}
        other = config[(k + 1) % len(config)]
        set_device_meta(node, other)
        return f"node '{node.name}': device_configurations say {config[k]} (index {k}) but 'baechi.device' says {other}"

    path, expected = tampered(placed_resnet, tmp_path, edit)
    result = invoke("verify", path, "--original", RESNET.path)
    assert result.exit_code == 1, result.output
    assert problems(result.output) == [expected]


def _relu(model: onnx.ModelProto) -> tuple[onnx.NodeProto, str]:
    """The node the edits below tamper with, and its device."""
    node = model.graph.node[2]
    (meta,) = [p.value for p in node.metadata_props if p.key == DEVICE_KEY]
    return node, meta


def _index_out_of_range(model: onnx.ModelProto) -> str:
    node, _ = _relu(model)
    for spec in baechi_entry(node).sharding_spec:
        spec.device[:] = [9]
    return f"node '{node.name}': its device_configurations name device index 9, but configuration 'baechi' lists 4 devices"


def _several_devices(model: onnx.ModelProto) -> str:
    node, device = _relu(model)
    k = list(model.configuration[0].device).index(device)
    baechi_entry(node).sharding_spec[0].device[:] = [(k + 1) % 4]
    indices = sorted([k, (k + 1) % 4])
    return f"node '{node.name}': its device_configurations name several devices (indices {indices})"


def _stray_tensor(model: onnx.ModelProto) -> str:
    node, _ = _relu(model)
    baechi_entry(node).sharding_spec[0].tensor_name = "nope"
    return f"node '{node.name}': a sharding spec names tensor 'nope', which the node neither reads nor writes"


def _no_entry(model: onnx.ModelProto) -> str:
    node, device = _relu(model)
    del node.device_configurations[:]
    return f"node '{node.name}': 'baechi.device' says {device} but it has no device_configurations entry"


def _num_devices(model: onnx.ModelProto) -> str:
    model.configuration[0].num_devices = 5
    return "configuration 'baechi' says num_devices 5 but lists 4 devices"


def _two_metadata_entries(model: onnx.ModelProto) -> str:
    node, device = _relu(model)
    node.metadata_props.add(key=DEVICE_KEY, value=device)
    return f"node '{node.name}': 2 'baechi.device' metadata entries"


@pytest.mark.parametrize(
    "edit",
    [_index_out_of_range, _several_devices, _stray_tensor, _no_entry, _num_devices, _two_metadata_entries],
    ids=lambda f: f.__name__.strip("_"),
)
def test_inconsistent_annotations_fail_naming_the_node(placed_resnet, tmp_path, edit):
    path, expected = tampered(placed_resnet, tmp_path, edit)
    result = invoke("verify", path)
    assert result.exit_code == 1, result.output
    assert problems(result.output) == [expected]


def test_without_the_configuration_every_node_is_a_problem(placed_resnet, tmp_path):
    path, _ = tampered(placed_resnet, tmp_path, lambda m: m.configuration.pop())
    data = json.loads(invoke("verify", path, "--json").output)
    static = data["static"]
    assert not data["ok"] and static["configuration"] == [] and static["num_devices"] == 0
    assert static["annotation_problems"][0] == "the model has no device configuration named 'baechi'"
    assert static["annotation_problems_count"] == 1 + static["ops_total"]
    assert static["annotation_problems"][1] == (
        "node '/conv1/Conv': its device_configurations name device index 0 of no configuration"
    )


def test_a_changed_attribute_fails_naming_the_node_and_changes_the_outputs(placed_resnet, tmp_path):
    def edit(model: onnx.ModelProto) -> str:
        node = model.graph.node[1]
        (epsilon,) = [a for a in node.attribute if a.name == "epsilon"]
        epsilon.f = 0.5
        return node.name

    path, name = tampered(placed_resnet, tmp_path, edit)
    result = invoke("verify", path, "--original", RESNET.path)
    assert result.exit_code == 1, result.output
    assert "FAIL 1 difference(s) from" in result.output
    (line,) = problems(result.output)
    assert line.startswith(f"node '{name}': attribute epsilon = 0.5 instead of epsilon = 9.99")
    if importlib.util.find_spec("onnxruntime") is None:
        return
    result = invoke("verify", path, "--original", RESNET.path, "--run", "--json")
    assert result.exit_code == 1, result.output
    run = json.loads(result.output)["run"]
    (out,) = run["outputs"]
    assert not run["ok"] and not out["identical"] and out["max_abs_diff"] > 0
    text = invoke("verify", path, "--original", RESNET.path, "--run").output
    assert (
        f"output 'logits' differs from the reference's: max abs difference {out['max_abs_diff']:.6g}" in text
    )
    assert "FAIL onnxruntime (CPU, seed 0): 0 of 1 outputs identical" in text


def test_a_removed_node_fails_naming_it(placed_resnet, tmp_path):
    def edit(model: onnx.ModelProto) -> str:
        node = model.graph.node[10]
        model.graph.node.remove(node)
        return node.name

    path, name = tampered(placed_resnet, tmp_path, edit)
    result = invoke("verify", path, "--original", RESNET.path)
    assert result.exit_code == 1, result.output
    lines = problems(result.output)
    assert f"node '{name}' of the original is missing" in lines
    assert lines[0].startswith("fails the ONNX checker: ")  # its output is read but no longer made


def test_other_differences_name_the_field(placed_resnet, tmp_path):
    def edit(model: onnx.ModelProto) -> str:
        model.producer_name = "someone"
        model.ir_version = 12
        model.graph.initializer[0].float_data.append(1.0)
        model.graph.node[4].input[0] = model.graph.node[2].output[0]
        return model.graph.initializer[0].name

    path, init = tampered(placed_resnet, tmp_path, edit)
    result = invoke("verify", path, "--original", RESNET.path, "--json")
    assert result.exit_code == 1
    assert json.loads(result.output)["static"]["differences"] == [
        "ir_version is 12; placing the original's 8 gives 11",
        "model field 'producer_name' differs from the original's: someone",
        f"graph initializer '{init}' differs from the original's",
        "node '/layer1/layer1.0/conv1/Conv': input #0 is '/relu/Relu_output_0' instead of '/maxpool/MaxPool_output_0'",
    ]


def test_a_checker_failure_is_a_failed_check_with_its_message(placed_resnet, tmp_path):
    path, _ = tampered(
        placed_resnet, tmp_path, lambda m: m.graph.node[2].__setattr__("op_type", "Frobnicate")
    )
    result = invoke("verify", path)
    assert result.exit_code == 1, result.output
    assert "FAIL fails onnx.checker" in result.output
    assert problems(result.output)[0].startswith("fails the ONNX checker: No Op registered for Frobnicate")


def test_without_the_weights_the_checker_still_checks_the_structure(tmp_path):
    placed = place(onnx_model("keras_resnet50"), tmp_path / "placed.onnx")  # beside no weights
    path, _ = tampered(placed, tmp_path, lambda m: m.graph.node[2].__setattr__("op_type", "Frobnicate"))
    data = json.loads(invoke("verify", path, "--json").output)
    static = data["static"]
    assert not data["ok"] and static["checker"].startswith("No Op registered for Frobnicate")
    assert static["checker_note"] == (
        "external weights absent (keras_resnet50.onnx.data): structure checked without them"
    )


# --- bad input and options ----------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--original", TESTDATA / "cnn.pb"],
            "error: {cnn}: --original must be an ONNX model (.onnx), as PLACED is",
        ),
        (
            ["--run", "--devices", "2"],
            "error: --sidecar, --devices and --steps apply to GraphDefs only; an ONNX model runs in "
            "onnxruntime on the CPU (see --dim, --batch-size)",
        ),
        (["--run", "--steps", "2"], "error: --sidecar, --devices and --steps apply to GraphDefs only;"),
        (
            ["--sidecar", TESTDATA / "cnn.json"],
            "error: --sidecar, --devices and --steps apply to GraphDefs only;",
        ),
        ([TESTDATA / "cnn.json"], "error: --sidecar, --devices and --steps apply to GraphDefs only;"),
        (["--batch-size", "2"], "error: --batch-size and --dim apply only with --run"),
        (
            ["--run", "--dim", "nope=2"],
            "error: --dim nope: no graph input has a symbolic dim of that name (theirs: none)",
        ),
    ],
    ids=[
        "graphdef-original",
        "devices",
        "steps",
        "sidecar",
        "legacy-sidecar",
        "batch-without-run",
        "unknown-dim",
    ],
)
def test_bad_options_are_one_line_exit_2(placed_resnet, args, message):
    if "--run" in args:
        pytest.importorskip("onnxruntime")
    result = invoke("verify", placed_resnet, *args)
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1
    assert result.output.startswith(message.format(cnn=TESTDATA / "cnn.pb"))


def test_graphdef_only_accepts_graphdef_options(tmp_path):
    result = invoke("verify", TESTDATA / "cnn.pb", "--original", RESNET.path)
    assert (
        result.exit_code == 2
        and result.output
        == f"error: {RESNET.path}: --original must be a GraphDef (.pb, .pbtxt), as PLACED is\n"
    )
    result = invoke("verify", TESTDATA / "cnn.pb", "--run", "--dim", "seq=2")
    assert (
        result.exit_code == 2 and result.output == "error: --batch-size and --dim apply to ONNX models only\n"
    )


def test_not_an_onnx_model_is_bad_input(placed_resnet, tmp_path):
    fake = tmp_path / "fake.onnx"
    shutil.copy(TESTDATA / "cnn.pb", fake)
    for args in ([fake], [placed_resnet, "--original", fake]):
        result = invoke("verify", *args)
        assert result.exit_code == 2, result.output
        assert result.output.startswith(f"error: {fake}: not an ONNX model: ")
    result = invoke("verify", tmp_path / "absent.onnx")
    assert (result.exit_code, result.output) == (2, f"error: {tmp_path / 'absent.onnx'}: no such file\n")


def test_run_needs_the_external_weights(tmp_path):
    pytest.importorskip("onnxruntime")
    model = onnx_model("keras_resnet50")
    placed = place(model, tmp_path / "placed.onnx")  # beside no weights, present in testdata or not
    assert invoke("verify", placed).exit_code == 0
    result = invoke("verify", placed, "--run")
    assert result.exit_code == 2
    assert result.output == (
        f"error: {placed}: --run needs the external weights beside the model: keras_resnet50.onnx.data absent\n"
    )


def test_run_without_onnxruntime_exits_5(placed_resnet, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a)
    )
    result = invoke("verify", placed_resnet, "--run")
    assert result.exit_code == 5
    assert result.output == (
        "error: verify --run on an ONNX model needs onnxruntime: pip install 'baechi[onnx]' "
        "(the static checks do not)\n"
    )
    assert invoke("verify", placed_resnet).exit_code == 0  # the static checks do not


# --- output comparison ----------------------------------------------------------


def test_outputs_compare_bitwise_with_nan_equal_to_nan():
    a = np.array([1.0, np.nan, np.inf], dtype=np.float32)
    assert _compare_output("y", a, a.copy()).identical
    b = np.array([1.5, np.nan, np.inf], dtype=np.float32)
    assert _compare_output("y", a, b).max_abs_diff == 0.5
    c = np.array([1.0, 2.0, np.inf], dtype=np.float32)
    assert _compare_output("y", a, c).max_abs_diff == np.inf  # NaN on one side only
    d = _compare_output("y", a, a.astype(np.float64))
    assert not d.identical and d.detail == "float32[3] instead of float64[3]"
    assert _compare_output("y", np.array([1, 2]), np.array([1, 4])).max_abs_diff == 2.0


def test_static_check_is_a_function_too(placed_resnet):
    result = static_check_onnx(str(placed_resnet), str(RESNET.path))
    assert result.ok and result.problems() == [] and result.problems_count() == 0
