"""ONNX end to end: `baechi place model.onnx --training -o placed.onnx --report r.json`, compare, profile."""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper
from onnxmodels import ONNX_MODELS, OnnxModel, onnx_model, zero_weights_beside

from baechi_cli.cli.commands import main
from baechi_cli.io.onnx import CONFIGURATION, DEVICE_KEY, read_onnx


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def staged(model: OnnxModel, tmp_path: pathlib.Path) -> pathlib.Path:
    """``model`` copied into ``tmp_path`` with its external weight file, when it has one here.

    A placed model keeps its external-data references, relative to its own
    directory (onnx and onnxruntime refuse paths that leave it), so a placed
    model checked or run with its weights must sit beside them.
    """
    if model.data_path is None or not model.data_path.exists():
        return model.path
    shutil.copy(model.path, tmp_path / model.path.name)
    shutil.copy(model.data_path, tmp_path / model.data_path.name)
    return tmp_path / model.path.name


def place(model: OnnxModel, tmp_path: pathlib.Path, *extra: str, devices: str = "4x8GB"):
    """Run the issue's command on ``model``; returns (result, placed path, report)."""
    placed, report = tmp_path / "placed.onnx", tmp_path / "r.json"
    out = invoke(
        "place",
        staged(model, tmp_path),
        "--devices",
        devices,
        "--training",
        "-o",
        placed,
        "--report",
        report,
        "-q",
        *model.cli_args,
        *extra,
    )
    assert out.exit_code == 0, out.stderr
    return out, placed, json.loads(report.read_text())


def node_devices(path: pathlib.Path) -> list[str]:
    model = onnx.load(str(path), load_external_data=False)
    return [next(p.value for p in n.metadata_props if p.key == DEVICE_KEY) for n in model.graph.node]


@pytest.mark.parametrize("model", ONNX_MODELS, ids=str)
def test_place_training_writes_a_placed_model_the_checker_accepts(model: OnnxModel, tmp_path):
    _, placed, report = place(model, tmp_path)
    original = onnx.load(str(model.path), load_external_data=False)
    out = onnx.load(str(placed), load_external_data=False)
    assert out.ir_version >= 11
    (config,) = [c for c in out.configuration if c.name == CONFIGURATION]
    assert list(config.device) == [d["name"] for d in report["devices"]]
    # the placed model is the original model: with --training the backward ops live only in the plan
    assert [n.name for n in out.graph.node] == [n.name for n in original.graph.node]
    assert len(out.graph.initializer) == len(original.graph.initializer)
    # every node carries its device, the same in both encodings and in the report
    devices = node_devices(placed)
    for node, device in zip(out.graph.node, devices, strict=True):
        (dc,) = node.device_configurations
        assert dc.configuration_id == CONFIGURATION
        assert {config.device[k] for spec in dc.sharding_spec for k in spec.device} == {device}
    nodes = {
        n.name or f"{n.op_type}_{i}": d for i, (n, d) in enumerate(zip(out.graph.node, devices, strict=True))
    }
    assert {k: report["placement"][k] for k in nodes} == nodes
    # the report: the input's ops in `placement`, the synthesized ones under `training`
    training = report["training"]
    assert training["loss_ops"] > 0 and training["backward_ops"] > 0 and training["update_ops"] > 0
    assert set(training["placement"]).isdisjoint(report["placement"])
    assert all(name.startswith(("loss/", "gradients/", "optimizer/")) for name in training["placement"])
    assert report["input"]["format"] == "onnx"
    assert report["passes"][0]["name"] == "training"
    if model.external:
        assert any("external" in n for n in report["notes"]), report["notes"]
    if not model.weights_present:
        # the references are kept as they were, to a file this checkout does not have
        locations = {e.value for t in out.graph.initializer for e in t.external_data if e.key == "location"}
        assert locations == {model.data_path.name}
        zero_weights_beside(out, tmp_path)
    onnx.checker.check_model(str(placed), full_check=True)


@pytest.mark.parametrize("model", [m for m in ONNX_MODELS if m.weights_present], ids=str)
def test_placed_model_gives_identical_onnxruntime_outputs(model: OnnxModel, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    _, placed, _ = place(model, tmp_path, devices="4x8MB" if model.name == "torch_resnet" else "4x8GB")
    rng = np.random.default_rng(0)
    original = ort.InferenceSession(str(staged(model, tmp_path)), providers=["CPUExecutionProvider"])
    feeds = {}
    for i in original.get_inputs():
        shape = [d if isinstance(d, int) else (model.dims.get(d) or model.batch_size) for d in i.shape]
        if "int64" in i.type:
            feeds[i.name] = rng.integers(0, 100, size=shape, dtype=np.int64)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    expected = original.run(None, feeds)
    got = ort.InferenceSession(str(placed), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert np.array_equal(a, b)


def test_module_map_names_the_pytorch_modules(tmp_path):
    model = onnx_model("torch_resnet")
    # 10 MB devices: adam's state and the activations of a training step do not fit one
    _, _, report = place(model, tmp_path, "--optimizer", "adam", devices="4x10MB")
    assert report["algorithm"] != "single"
    modules = report["module_map"]["modules"]
    assert len(set(modules.values())) > 1
    # keys are disjoint subtrees, and every parameter (the export names them <module>.<param>)
    # falls under exactly one of them
    params = [i.name for i in onnx.load(str(model.path)).graph.initializer]
    for p in params:
        owners = [m for m in modules if p.startswith(f"{m}.")]
        assert len(owners) == 1, (p, owners)
    # the map agrees with the placement: every op inside a mapped module runs on its device
    graph = read_onnx(str(model.path))
    checked = 0
    for v, name in enumerate(graph.names):
        path = graph.attrs[v].get("_module")
        owner = [m for m in modules if path is not None and (path == m or path.startswith(f"{m}."))]
        if owner:
            assert report["placement"][name] == modules[owner[0]], name
            checked += 1
    assert checked > graph.num_ops // 2
    unmapped = report["module_map"]["unmapped_ops"]
    assert all(u["device"] == report["placement"][u["op"]] for u in unmapped)
    # the summary shows the map
    text = invoke("place", model.path, "--devices", "4x10MB", "--training", "--optimizer", "adam").stdout
    assert "modules: conv1 -> /device:GPU:0" in text


def test_module_map_applies_to_the_torch_model(tmp_path):
    """`model.get_submodule(path).to(device)` for every entry moves every parameter."""
    torch = pytest.importorskip("torch")
    from onnxmodels import _generator

    _, _, report = place(onnx_model("torch_resnet"), tmp_path, "--optimizer", "adam", devices="4x10MB")
    net = _generator().torch_resnet()
    names = [d["name"] for d in report["devices"]]
    # stand-ins for the GPUs this machine lacks: meta for one device, cpu for the rest
    target = {name: torch.device("meta" if i == 1 else "cpu") for i, name in enumerate(names)}
    for path, device in report["module_map"]["modules"].items():
        net.get_submodule(path).to(target[device])
    on_meta = {n for n, p in net.named_parameters() if p.device.type == "meta"}
    expected = {
        n
        for n, _ in net.named_parameters()
        for path, device in report["module_map"]["modules"].items()
        if target[device].type == "meta" and n.startswith(f"{path}.")
    }
    assert on_meta == expected and on_meta
    assert set(report["module_map"]["torch_devices"].values()) == {"cuda:0", "cuda:1", "cuda:2", "cuda:3"}


def test_readme_recipe_runs_the_planned_model(tmp_path):
    """The recipe of docs/onnx.md: each planned module moved, its inputs following it (here all on cpu)."""
    torch = pytest.importorskip("torch")
    from onnxmodels import _generator

    _, _, report = place(onnx_model("torch_resnet"), tmp_path, "--optimizer", "adam", devices="4x10MB")
    reference = _generator().torch_resnet().eval()
    net = _generator().torch_resnet().eval()
    to_torch = {name: "cpu" for name in report["module_map"]["torch_devices"]}  # no GPUs here
    for path, device in report["module_map"]["modules"].items():
        module = net.get_submodule(path).to(to_torch[device])
        module.register_forward_pre_hook(
            lambda m, args, d=to_torch[device]: tuple(a.to(d) if torch.is_tensor(a) else a for a in args)
        )
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(net(x), reference(x))


def test_symbolic_dims_need_binding(tmp_path):
    model = onnx_model("torch_transformer")
    out = invoke("place", model.path, "--devices", "4x8GB", "--batch-size", "8")
    assert out.exit_code == 2
    assert "tokens" in out.stderr and "seq" in out.stderr and "--dim" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = invoke("place", model.path, "--devices", "4x8GB", "--batch-size", "8", "--dim", "seq")
    assert out.exit_code == 2 and "NAME=VALUE" in out.stderr
    out = invoke("place", model.path, "--devices", "4x8GB", "--batch-size", "8", "--dim", "sequence=128")
    assert out.exit_code == 2 and "sequence" in out.stderr


def test_bad_onnx_files_are_one_line_errors_and_write_nothing(tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07this is not a model")
    # a node whose input nobody produces: the checker's message is the error
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    broken = helper.make_model(
        helper.make_graph([helper.make_node("Add", ["x", "nowhere"], ["y"])], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(broken.SerializeToString())
    for path, message in ((garbage, "not an ONNX model"), (bad, "nowhere")):
        placed, report = tmp_path / "p.onnx", tmp_path / "r.json"
        out = invoke("place", path, "--devices", "2x8GB", "-o", placed, "--report", report)
        assert out.exit_code == 2, out.stderr
        assert str(path) in out.stderr and message in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
        assert not placed.exists() and not report.exists()


def test_op_type_without_a_rule_is_listed(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])
    w = helper.make_tensor("w", TensorProto.FLOAT, [64, 64], np.zeros(64 * 64, np.float32))
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
        helper.make_node("Frobnicate", ["h"], ["y"], name="custom", domain="com.example"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], [w]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
    )
    path = tmp_path / "custom.onnx"
    path.write_bytes(model.SerializeToString())
    out = invoke("place", path, "--devices", "2x8GB", "--training", "--report", tmp_path / "r.json")
    assert out.exit_code == 0, out.stderr
    assert "without a cost rule" in out.stdout and "com.example.Frobnicate (1)" in out.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert any("com.example.Frobnicate (1)" in n for n in report["notes"])
    assert report["costs"]["uncovered"] == ["com.example.Frobnicate"]


def test_wrong_output_and_options_are_refused(tmp_path):
    model = onnx_model("keras_cnn")
    out = invoke("place", model.path, "--devices", "2x8GB", "-o", tmp_path / "placed.pb")
    assert out.exit_code == 2 and ".onnx" in out.stderr
    assert not (tmp_path / "placed.pb").exists()
    cnn = pathlib.Path(__file__).resolve().parent.parent / "testdata" / "cnn.pb"
    out = invoke("place", cnn, "--devices", "2x8GB", "--dim", "seq=4")
    assert out.exit_code == 2 and "--dim binds ONNX symbolic dims" in out.stderr
    out = invoke("place", cnn, "--devices", "2x8GB", "--training")
    assert out.exit_code == 2 and "already has" in out.stderr and "drop --training" in out.stderr


def test_same_input_gives_the_same_placed_bytes(tmp_path):
    model = onnx_model("torch_transformer")
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    _, a, ra = place(model, first, "--optimizer", "momentum")
    _, b, rb = place(model, second, "--optimizer", "momentum")
    assert a.read_bytes() == b.read_bytes()
    for r in (ra, rb):
        r.pop("timings_s")
        for c in r["candidates"]:
            c.pop("place_seconds")
            info = c.get("info", {})
            for timing in ("schedule_seconds", "solver"):
                info.pop(timing, None)
        for p in r["passes"]:
            p.pop("seconds")
    ra["input"].pop("path"), rb["input"].pop("path")
    assert json.dumps(ra, sort_keys=True) == json.dumps(rb, sort_keys=True)


def test_compare_and_profile_take_onnx(tmp_path):
    model = onnx_model("torch_transformer")
    out = invoke("compare", model.path, "--devices", "4x8GB", "--training", "--json", *model.cli_args)
    assert out.exit_code == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["input"]["format"] == "onnx"
    assert [r["algorithm"] for r in doc["results"]] == ["topo", "etf", "sct"]
    assert all(r["feasible"] for r in doc["results"])
    out = invoke("profile", model.path, "--json", *model.cli_args)
    assert out.exit_code == 0, out.stderr
    profile = json.loads(out.stdout)
    assert profile["model"]["format"] == "onnx"
    kinds = {op["type"]: op["rule"] for op in profile["ops"]}
    assert kinds["MatMul"] == "flops" and kinds["Reshape"] == "zero"
    assert {c["rule"] for c in profile["coverage"]} <= {"flops", "bytes", "zero"}
    # a profile of the ONNX model drives place like the analytic model does
    costs = tmp_path / "costs.json"
    assert invoke("profile", model.path, "-o", costs, "-q", *model.cli_args).exit_code == 0
    out = invoke("place", model.path, "--devices", "4x8GB", "--profile", costs, "--json", *model.cli_args)
    assert out.exit_code == 0, out.stderr
    assert json.loads(out.stdout)["costs"]["model"] == "profile"


def test_format_is_read_from_the_bytes_when_the_name_misleads(tmp_path):
    """An ONNX model saved as model.pb places as ONNX; a GraphDef named .onnx gets a hint."""
    onnx_as_pb = tmp_path / "model.pb"
    onnx_as_pb.write_bytes(onnx_model("keras_cnn").path.read_bytes())
    out = invoke("place", onnx_as_pb, "--devices", "2x8GB", "--json")
    assert out.exit_code == 0, out.stderr
    assert json.loads(out.stdout)["input"]["format"] == "onnx"
    graphdef_as_onnx = tmp_path / "cnn.onnx"
    graphdef_as_onnx.write_bytes(
        (pathlib.Path(__file__).resolve().parent.parent / "testdata" / "cnn.pb").read_bytes()
    )
    out = invoke("place", graphdef_as_onnx, "--devices", "2x8GB")
    assert out.exit_code == 2 and "looks like a TensorFlow GraphDef" in out.stderr


def test_dynamo_export_module_map_covers_every_parameter(tmp_path):
    """torch.onnx.export's default exporter (dynamo) folds BatchNorm into Conv: every parameter and
    buffer of the model must still fall under exactly one module of the plan."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    from onnxmodels import _generator

    net = _generator().torch_resnet().eval()
    path = tmp_path / "dynamo_resnet.onnx"
    torch.onnx.export(net, (torch.randn(32, 3, 64, 64),), str(path), dynamo=True, verbose=False)
    report_path = tmp_path / "r.json"
    out = invoke("place", path, "--devices", "4x6MB", "--training", "--report", report_path, "-q")
    assert out.exit_code == 0, out.stderr
    report = json.loads(report_path.read_text())
    modules = report["module_map"]["modules"]
    assert len(set(modules.values())) > 1
    for name, _ in [*net.named_parameters(), *net.named_buffers()]:
        owners = [m for m in modules if m == "" or name.startswith(f"{m}.")]
        assert len(owners) == 1, (name, owners)
    for m in modules:
        net.get_submodule(m)
