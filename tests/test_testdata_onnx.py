"""The committed ONNX test models (testdata/*.onnx, tests/onnxmodels.py): present,
valid for onnx.checker, read by read_onnx, and runnable in onnxruntime when their
weights are present (inline, or the git-ignored external file after make testdata)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import external_data_helper
from onnxmodels import ONNX_MODEL_NAMES, ONNX_MODELS, OnnxModel, onnx_model, zero_weights_beside

from baechi_cli.core.errors import InputError
from baechi_cli.io.onnx import read_onnx, read_onnx_with_notes

MAX_GRAPH_BYTES = 3_000_000  # inline weights; an external-weight graph is far smaller


def _load(model: OnnxModel) -> onnx.ModelProto:
    return onnx.load_model(str(model.path), load_external_data=False)


def _feed_shape(info: onnx.ValueInfoProto, model: OnnxModel) -> list[int]:
    shape = []
    for axis, dim in enumerate(info.type.tensor_type.shape.dim):
        if dim.HasField("dim_value"):
            shape.append(dim.dim_value)
        elif dim.dim_param in model.dims:
            shape.append(model.dims[dim.dim_param])
        else:
            assert axis == 0 and model.batch_size is not None, (info.name, axis)
            shape.append(model.batch_size)
    return shape


def test_registry():
    assert ONNX_MODEL_NAMES == (
        "torch_resnet",
        "torch_transformer",
        "keras_cnn",
        "keras_resnet50",
        "keras_inception_v3",
    )
    transformer = onnx_model("torch_transformer")
    assert transformer.read_options == {"batch_size": 8, "dims": {"seq": 128}}
    assert transformer.cli_args == ["--batch-size", "8", "--dim", "seq=128"]
    assert onnx_model("torch_resnet").read_options == {} and onnx_model("torch_resnet").cli_args == []
    assert [m.name for m in ONNX_MODELS if m.external] == ["keras_resnet50", "keras_inception_v3"]
    with pytest.raises(KeyError, match="unknown ONNX test model"):
        onnx_model("nope")


@pytest.mark.parametrize("model", ONNX_MODELS, ids=str)
def test_committed(model):
    assert model.path.is_file(), f"{model.path} is committed: git checkout it or run make testdata"
    assert model.path.stat().st_size < MAX_GRAPH_BYTES
    proto = _load(model)
    assert [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] == [17]
    external = [t for t in proto.graph.initializer if external_data_helper.uses_external_data(t)]
    if model.external:
        # The weights are in the one git-ignored file; only tensors under 1 KiB are inline.
        locations = {e.value for t in external for e in t.external_data if e.key == "location"}
        assert locations == {model.data_path.name}
        assert max(len(t.raw_data) for t in proto.graph.initializer) < 1024
    else:
        assert not external


@pytest.mark.parametrize("model", ONNX_MODELS, ids=str)
def test_checker(model, tmp_path):
    path = model.path
    if not model.weights_present:
        # The checker wants the external file to exist.
        path = tmp_path / model.path.name
        path.write_bytes(model.path.read_bytes())
        zero_weights_beside(_load(model), tmp_path)
    onnx.checker.check_model(str(path), full_check=True)


@pytest.mark.parametrize("model", ONNX_MODELS, ids=str)
def test_read_onnx(model):
    proto = _load(model)
    inits = {t.name: t for t in proto.graph.initializer}
    feeds = [i for i in proto.graph.input if i.name not in inits]
    read = read_onnx_with_notes(str(model.path), **model.read_options)
    graph = read.graph
    assert read.opset == 17
    assert graph.num_ops == len(feeds) + len(proto.graph.node)
    assert graph.op_types[: len(feeds)] == ["Input"] * len(feeds)
    assert graph.op_types[len(feeds) :] == [n.op_type for n in proto.graph.node]
    # Shape inference sized every tensor (no guessed dims) ...
    assert not [graph.names[v] for v in range(graph.num_ops) if "_size_unknown" in graph.attrs[v]]
    assert all(shape is not None for shapes in graph.output_shapes for shape in shapes)
    # ... and every weight counts once, whether or not its bytes are on disk.
    used = {name for node in proto.graph.node for name in node.input} & set(inits)
    weight_bytes = sum(
        int(np.prod(inits[name].dims, dtype=np.int64))
        * onnx.helper.tensor_dtype_to_np_dtype(inits[name].data_type).itemsize
        for name in used
    )
    assert sum(graph.persistent_bytes) == weight_bytes
    external = [note for note in read.notes if "external data not loaded" in note]
    assert bool(external) == model.external  # never loaded, present or not


@pytest.mark.parametrize("model", [m for m in ONNX_MODELS if m.read_options], ids=str)
def test_symbolic_dims_need_options(model):
    with pytest.raises(InputError, match="--dim|--batch-size"):
        read_onnx(str(model.path))


def test_torch_names_are_module_paths():
    resnet = read_onnx(str(onnx_model("torch_resnet").path))
    for name in (
        "/conv1/Conv",
        "/bn1/BatchNormalization",
        "/layer1/layer1.0/conv1/Conv",
        "/layer2/layer2.0/downsample/downsample.0/Conv",
        "/layer4/layer4.1/bn2/BatchNormalization",
        "/fc/Gemm",
    ):
        assert name in resnet.names
    # Batch norms are kept (not folded into the convolutions).
    assert resnet.op_types.count("BatchNormalization") == resnet.op_types.count("Conv") == 20
    lm = read_onnx(str(onnx_model("torch_transformer").path), batch_size=8, dims={"seq": 128})
    for name in (
        "/tok_embed/Gather",
        "/layers.0/attn/query/MatMul",
        "/layers.3/mlp/fc2/Add",
        "/lm_head/MatMul",
    ):
        assert name in lm.names
    assert lm.output_shapes[lm.names.index("/lm_head/Add")] == [(8, 128, 1000)]


@pytest.mark.parametrize("model", ONNX_MODELS, ids=str)
def test_onnxruntime(model):
    ort = pytest.importorskip("onnxruntime")
    if not model.weights_present:
        pytest.skip(f"{model.data_path.name} is absent (git-ignored; make testdata writes it)")
    proto = _load(model)
    inits = {t.name for t in proto.graph.initializer}
    rng = np.random.default_rng(0)
    feeds = {}
    for info in proto.graph.input:
        if info.name in inits:
            continue
        shape = _feed_shape(info, model)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)
        if np.issubdtype(dtype, np.integer):
            feeds[info.name] = rng.integers(0, 10, shape).astype(dtype)  # token ids
        else:
            feeds[info.name] = rng.standard_normal(shape).astype(dtype)
    session = ort.InferenceSession(str(model.path), providers=["CPUExecutionProvider"])
    outputs = session.run(None, feeds)
    # The shapes read_onnx inferred are the ones onnxruntime produces.
    graph = read_onnx(str(model.path), **model.read_options)
    producer = {
        out: (len(feeds) + i, port)
        for i, n in enumerate(proto.graph.node)
        for port, out in enumerate(n.output)
    }
    for info, value in zip(proto.graph.output, outputs, strict=True):
        assert np.isfinite(value).all()
        op, port = producer[info.name]
        assert graph.output_shapes[op][port] == value.shape
