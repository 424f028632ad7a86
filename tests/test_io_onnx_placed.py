"""The placed ONNX writer: multi-device annotations, nothing else changed, and onnxruntime runs it the same.

Models are built with onnx.helper (opset 17, IR version 8) into tmp_path; one
is a ResNet-like torch export (skipped without torch). onnxruntime tests are
skipped without onnxruntime.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from baechi_cli.core.errors import InputError
from baechi_cli.io.onnx import CONFIGURATION, DEVICE_KEY, read_onnx, write_placed_onnx

F = TensorProto.FLOAT
DEVICES = ["/device:GPU:0", "/device:GPU:1", "/device:GPU:2"]


def _model() -> onnx.ModelProto:
    """x[2,3,8,8] -> Conv -> Relu -> Split(2 outputs) -> Mul(a, a) + Add(b) -> Reshape -> MatMul -> y.

    Random weights; node and model metadata, doc strings and another
    configuration that placement must keep.
    """
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
        numpy_helper.from_array(np.array([2, -1], np.int64), "shape"),
        numpy_helper.from_array(rng.standard_normal((128, 5)).astype(np.float32), "W"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu", doc_string="keep me"),
        helper.make_node("Split", ["r"], ["s0", "s1"], name="split", axis=1, num_outputs=2),
        helper.make_node("Mul", ["s0", "s0"], ["m"], name="square"),
        helper.make_node("Add", ["m", "s1"], ["a"]),  # unnamed
        helper.make_node("Reshape", ["a", "shape"], ["f"], name="flat"),
        helper.make_node("MatMul", ["f", "W"], ["y"], name="fc"),
    ]
    x = helper.make_tensor_value_info("x", F, [2, 3, 8, 8])
    y = helper.make_tensor_value_info("y", F, [2, 5])
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], inits),
        opset_imports=[helper.make_opsetid("", 18)],
        ir_version=8,
        producer_name="test",
    )
    helper.set_model_props(model, {"author": "me"})
    helper.set_metadata_props(model.graph.node[1], {"origin": "torch", DEVICE_KEY: "stale"})
    return model


PLACEMENT = [DEVICES[0], DEVICES[0], DEVICES[1], DEVICES[1], DEVICES[2], None, DEVICES[0]]


def _save(tmp_path, model, name="m.onnx", **kwargs) -> str:
    path = str(tmp_path / name)
    onnx.save_model(model, path, **kwargs)
    return path


def _place(src, placement, out, devices=DEVICES) -> list[str]:
    return write_placed_onnx(src, placement, devices, out)


def _devices_from_configuration(model: onnx.ModelProto) -> list[str | None]:
    """Each node's device as a multi-device reader sees it: our configuration, then each spec's device."""
    (config,) = [c for c in model.configuration if c.name == CONFIGURATION]
    out: list[str | None] = []
    for node in model.graph.node:
        ours = [c for c in node.device_configurations if c.configuration_id == CONFIGURATION]
        if not ours:
            out.append(None)
            continue
        (entry,) = ours
        ks = {k for spec in entry.sharding_spec for k in spec.device}
        assert len(ks) == 1 and all(len(spec.device) == 1 for spec in entry.sharding_spec)
        out.append(config.device[ks.pop()])
    return out


def _devices_from_metadata(model: onnx.ModelProto) -> list[str | None]:
    """Each node's device as an IR-10 reader sees it: metadata_props."""
    out: list[str | None] = []
    for node in model.graph.node:
        values = [e.value for e in node.metadata_props if e.key == DEVICE_KEY]
        assert len(values) <= 1
        out.append(values[0] if values else None)
    return out


def _strip(model: onnx.ModelProto, ir_version: int) -> onnx.ModelProto:
    """A copy without our annotations, at ``ir_version``."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.ir_version = ir_version
    for i in reversed(range(len(copy.configuration))):
        if copy.configuration[i].name == CONFIGURATION:
            del copy.configuration[i]
    for node in copy.graph.node:
        for i in reversed(range(len(node.device_configurations))):
            if node.device_configurations[i].configuration_id == CONFIGURATION:
                del node.device_configurations[i]
        for i in reversed(range(len(node.metadata_props))):
            if node.metadata_props[i].key == DEVICE_KEY:
                del node.metadata_props[i]
    return copy


def test_placed_model_passes_the_checker_and_reads_back_both_ways(tmp_path):
    """IR 8 -> 11; the configuration lists the devices; per node one spec per distinct input/output on one device."""
    src = _save(tmp_path, _model())
    out = str(tmp_path / "placed.onnx")
    assert _place(src, PLACEMENT, out) == []
    placed = onnx.load(out)
    onnx.checker.check_model(placed, full_check=True)
    onnx.checker.check_model(out, full_check=True)
    assert placed.ir_version == 11
    (config,) = placed.configuration
    assert (config.name, config.num_devices, list(config.device)) == (CONFIGURATION, 3, DEVICES)
    assert _devices_from_configuration(placed) == PLACEMENT
    assert _devices_from_metadata(placed) == PLACEMENT
    square = placed.graph.node[3].device_configurations[0]
    assert [(s.tensor_name, list(s.device)) for s in square.sharding_spec] == [("s0", [1]), ("m", [1])]
    split = placed.graph.node[2].device_configurations[0]
    assert [s.tensor_name for s in split.sharding_spec] == ["r", "s0", "s1"]
    conv = placed.graph.node[0].device_configurations[0]
    assert [s.tensor_name for s in conv.sharding_spec] == ["x", "w", "b", "c"]  # initializers too
    assert all(not s.sharded_dim and not s.index_to_device_group_map for s in conv.sharding_spec)
    assert not conv.HasField("pipeline_stage")


def test_everything_else_is_unchanged(tmp_path):
    """Without the annotations and at its old IR version, the placed model equals the input message;
    other node metadata (and its order) kept, the stale baechi.device replaced where it stood."""
    model = _model()
    src = _save(tmp_path, model)
    out = str(tmp_path / "placed.onnx")
    _place(src, PLACEMENT, out)
    placed = onnx.load(out)
    expected = _strip(model, 8)
    assert _strip(placed, 8) == expected
    relu = placed.graph.node[1]
    assert [(e.key, e.value) for e in relu.metadata_props] == [("origin", "torch"), (DEVICE_KEY, DEVICES[0])]
    assert relu.doc_string == "keep me"
    assert [(e.key, e.value) for e in placed.metadata_props] == [("author", "me")]


def test_weights_are_copied_and_repeated_fields_read_as_protobuf_merges_them(tmp_path):
    """The writer copies every byte but the nodes and configurations: a graph split over two fields
    and a second ir_version (protobuf: merged, the last wins) read back as that merged model, placed."""
    from baechi_cli.io.protowire import fields, tag, varint

    data = _model().SerializeToString()
    top = fields(data)
    (graph,) = [f for f in top if f.number == 7]
    inner = fields(data, graph.payload, graph.end)
    half = inner[3].start  # the first three nodes in one graph field, the rest in another
    first, second = data[graph.payload : half], data[half : graph.end]
    split = tag(7, 2) + varint(len(first)) + first + tag(7, 2) + varint(len(second)) + second
    crafted = data[: graph.start] + split + data[graph.end :] + tag(1, 0) + varint(9)
    src = tmp_path / "m.onnx"
    src.write_bytes(crafted)
    merged = onnx.ModelProto.FromString(crafted)
    assert merged.ir_version == 9 and len(merged.graph.node) == 7
    out = str(tmp_path / "placed.onnx")
    _place(str(src), PLACEMENT, out)
    placed = onnx.load(out)
    assert placed.ir_version == 11
    assert _devices_from_configuration(placed) == _devices_from_metadata(placed) == PLACEMENT
    assert _strip(placed, 9) == _strip(merged, 9)
    assert [t.raw_data for t in placed.graph.initializer] == [t.raw_data for t in _model().graph.initializer]


def test_newer_ir_version_is_kept(tmp_path):
    """ir_version is raised to 11, never lowered."""
    model = _model()
    model.ir_version = 12
    src = _save(tmp_path, model)
    _place(src, PLACEMENT, str(tmp_path / "p.onnx"))
    assert onnx.load(str(tmp_path / "p.onnx")).ir_version == 12


def test_same_input_same_bytes_and_re_placement_is_idempotent(tmp_path):
    """Placing twice gives the same bytes; placing the placed model again gives them too; a new
    placement replaces ours in place, keeps another configuration and entries, and clears None nodes."""
    model = _model()
    other = model.configuration.add(name="tp", num_devices=2, device=["a", "b"])
    assert other.name == "tp"
    model.graph.node[0].device_configurations.add(configuration_id="tp").sharding_spec.add(
        tensor_name="c", device=[0]
    )
    src = _save(tmp_path, model)
    first, second, again = (str(tmp_path / f"{n}.onnx") for n in ("first", "second", "again"))
    _place(src, PLACEMENT, first)
    _place(src, PLACEMENT, second)
    _place(first, PLACEMENT, again)
    data = open(first, "rb").read()
    assert open(second, "rb").read() == data and open(again, "rb").read() == data

    moved = [DEVICES[2]] + [None] * 5 + [DEVICES[1]]
    _place(first, moved, again, devices=DEVICES[::-1])
    placed = onnx.load(again)
    assert [c.name for c in placed.configuration] == ["tp", CONFIGURATION]
    assert list(placed.configuration[1].device) == DEVICES[::-1]
    assert _devices_from_configuration(placed) == moved
    assert _devices_from_metadata(placed) == moved
    conv = placed.graph.node[0]
    assert [c.configuration_id for c in conv.device_configurations] == ["tp", CONFIGURATION]
    assert list(conv.device_configurations[1].sharding_spec[0].device) == [0]  # GPU:2 is index 0 now
    assert [(e.key, e.value) for e in placed.graph.node[1].metadata_props] == [("origin", "torch")]
    onnx.checker.check_model(placed, full_check=True)


def _save_external(tmp_path, size_threshold=0) -> str:
    """The test model with its initializers of at least ``size_threshold`` bytes in weights.bin beside it."""
    return _save(
        tmp_path,
        _model(),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=size_threshold,
    )


def _external(model: onnx.ModelProto) -> list[tuple[str, list[tuple[str, str]]]]:
    return [
        (t.name, [(e.key, e.value) for e in t.external_data])
        for t in model.graph.initializer
        if t.data_location == TensorProto.EXTERNAL
    ]


def test_external_data_absent_is_placed_with_references_intact(tmp_path):
    """weights.bin deleted: the model is still placed, each tensor's location/offset/length as before."""
    src = _save_external(tmp_path)
    before = _external(onnx.load(src, load_external_data=False))
    assert len(before) == 4
    os.remove(tmp_path / "weights.bin")
    out = str(tmp_path / "placed.onnx")
    assert _place(src, PLACEMENT, out) == []
    placed = onnx.load(out, load_external_data=False)
    assert _external(placed) == before
    assert all(not t.raw_data for t in placed.graph.initializer)
    assert _devices_from_configuration(placed) == PLACEMENT
    assert not os.path.exists(tmp_path / "weights.bin")


def test_external_data_into_another_directory_gives_a_note_and_copies_nothing(tmp_path):
    """Output elsewhere: the note names weights.bin and both directories; references unchanged."""
    src = _save_external(tmp_path)
    (tmp_path / "out").mkdir()
    out = str(tmp_path / "out" / "placed.onnx")
    notes = _place(src, PLACEMENT, out)
    assert notes == [
        "the placed model reads its external data from weights.bin beside it: "
        f"copy it from {tmp_path} to {tmp_path / 'out'} (onnx and onnxruntime refuse a symbolic link)"
    ]
    assert sorted(os.listdir(tmp_path / "out")) == ["placed.onnx"]
    assert _external(onnx.load(out, load_external_data=False)) == _external(
        onnx.load(src, load_external_data=False)
    )


def test_errors_name_the_file_and_leave_no_output(tmp_path):
    """Missing or non-ONNX input: InputError naming it; unwritable output: InputError naming it; bugs: ValueError."""
    out = tmp_path / "placed.onnx"
    with pytest.raises(InputError, match=r"missing\.onnx: no such file"):
        _place(str(tmp_path / "missing.onnx"), PLACEMENT, str(out))
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\xff\xff\xff\xff garbage")
    with pytest.raises(InputError) as err:
        _place(str(garbage), PLACEMENT, str(out))
    assert str(err.value).startswith(str(garbage)) and "not an ONNX model" in str(err.value)
    src = _save(tmp_path, _model())
    with pytest.raises(InputError) as err:
        _place(src, PLACEMENT, str(tmp_path / "nodir" / "placed.onnx"))
    assert str(err.value).startswith(str(tmp_path / "nodir" / "placed.onnx")) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="6 devices for the 7 nodes"):
        _place(src, PLACEMENT[:-1], str(out))
    with pytest.raises(ValueError, match="'/device:GPU:9' is not one of"):
        _place(src, ["/device:GPU:9"] * 7, str(out))
    with pytest.raises(ValueError, match="appears twice"):
        _place(src, PLACEMENT, str(out), devices=DEVICES + DEVICES[:1])
    assert sorted(os.listdir(tmp_path)) == ["garbage.onnx", "m.onnx"]


# ----------------------------------------------------------------- onnxruntime


def _run(path: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _assert_same_outputs(original: str, placed: str, feeds: dict[str, np.ndarray]) -> None:
    want = _run(original, feeds)
    got = _run(placed, feeds)
    assert len(got) == len(want)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_onnxruntime_gives_identical_outputs_for_a_helper_model(tmp_path):
    """onnxruntime accepts IR 11 with the configuration fields and computes bit-identical outputs."""
    src = _save(tmp_path, _model())
    out = str(tmp_path / "placed.onnx")
    _place(src, PLACEMENT, out)
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    _assert_same_outputs(src, out, {"x": x})


def test_onnxruntime_runs_the_placed_external_data_model(tmp_path):
    """Placed beside its weights.bin, the external-data model runs with identical outputs.

    (onnxruntime needs Reshape's shape operand inline, so only w and W are external.)
    """
    src = _save_external(tmp_path, size_threshold=64)
    assert [name for name, _ in _external(onnx.load(src, load_external_data=False))] == ["w", "W"]
    out = str(tmp_path / "placed.onnx")
    _place(src, PLACEMENT, out)
    x = np.random.default_rng(2).standard_normal((2, 3, 8, 8)).astype(np.float32)
    _assert_same_outputs(src, out, {"x": x})


def _torch_resnet_like(tmp_path) -> tuple[str, np.ndarray]:
    """testdata's ResNet-18-style model (testdata/generate_onnx.py), exported afresh in eval mode
    with the legacy exporter's defaults (BatchNorm folded into Conv), on a small input."""
    torch = pytest.importorskip("torch")
    from onnxmodels import _generator

    model = _generator().torch_resnet().eval()
    x = torch.randn(2, 3, 16, 16)
    path = str(tmp_path / "resnet.onnx")
    torch.onnx.export(model, (x,), path, dynamo=False, input_names=["x"])
    return path, x.numpy()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_onnxruntime_gives_identical_outputs_for_a_torch_resnet(tmp_path):
    """A torch export, read and placed as the pipeline would (per op id, via _onnx_node), then run."""
    src, x = _torch_resnet_like(tmp_path)
    graph = read_onnx(src)
    node_ops = [v for v in range(graph.num_ops) if "_onnx_node" in graph.attrs[v]]
    assert [graph.attrs[v]["_onnx_node"] for v in node_ops] == list(range(len(node_ops)))
    placement = [DEVICES[min(2, 3 * k // len(node_ops))] for k in range(len(node_ops))]
    out = str(tmp_path / "placed.onnx")
    _place(src, placement, out)
    placed = onnx.load(out)
    onnx.checker.check_model(placed, full_check=True)
    assert _devices_from_configuration(placed) == placement == _devices_from_metadata(placed)
    assert len(set(placement)) == 3
    _assert_same_outputs(src, out, {"x": x})
