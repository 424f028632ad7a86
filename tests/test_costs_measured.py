"""Measured profiles: baechi_cli.costs.measured runs GraphDefs in TensorFlow and times every op.

TensorFlow reads TF_ENABLE_ONEDNN_OPTS once, at import. measure_graphdef
turns oneDNN off when it imports TensorFlow first, but another test in the
same worker may have imported it with oneDNN on, which fuses each Conv2D into
its BiasAdd; the assertions below hold either way (see ``_measured``).
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from baechi_cli.core.errors import InputError, MissingDependencyError
from baechi_cli.costs.measured import FeedSpec, MeasuredRun, measure_graphdef, synthetic_feeds
from baechi_cli.proto_gen.tf_graph_pb2 import GraphDef

TESTDATA = Path(__file__).resolve().parent.parent / "testdata"
CNN = str(TESTDATA / "cnn.pb")
MLP = str(TESTDATA / "mlp.pb")

HAVE_TF = importlib.util.find_spec("tensorflow") is not None


def _graph_def(path: str) -> GraphDef:
    return GraphDef.FromString(Path(path).read_bytes())


def _ancestors(graph_def: GraphDef, roots: list[str]) -> set[str]:
    inputs = {n.name: [i.lstrip("^").split(":")[0] for i in n.input] for n in graph_def.node}
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(inputs[name])
    return seen


def _measured(run: MeasuredRun, name: str):
    """The measurement covering ``name``: its own, or that of the fused kernel that absorbed it."""
    return run.ops[run.fused.get(name, name)]


@pytest.fixture(scope="module")
def cnn_run() -> tuple[MeasuredRun, list[tuple[int, int]]]:
    calls: list[tuple[int, int]] = []
    run = measure_graphdef(CNN, warmup=1, steps=3, progress=lambda done, total: calls.append((done, total)))
    return run, calls


def tf_test(func):
    """Mark ``func`` as needing TensorFlow; skipped where it is not installed."""
    return pytest.mark.tf(pytest.mark.skipif(not HAVE_TF, reason="needs TensorFlow")(func))


# ------------------------------------------------------------ with TensorFlow


@tf_test
def test_every_op_of_the_train_step_is_measured(cnn_run):
    run, calls = cnn_run
    graph_def = _graph_def(CNN)
    assert (run.warmup, run.steps, run.batch_size, run.init_op) == (1, 3, 32, "init")
    assert run.fetches == ["train", "loss:0"]
    assert run.sidecar == str(TESTDATA / "cnn.json")
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]
    # What ran is exactly what train and loss need, the fed placeholders aside.
    expected = _ancestors(graph_def, ["train", "loss"]) - {"images", "labels"}
    assert set(run.ops) | set(run.fused) == expected
    assert set(run.fused) <= set(run.not_run)
    assert list(run.not_run) == [n.name for n in graph_def.node if n.name not in run.ops]
    # Fed placeholders and what only initialisation needs: init, the initializers, VarIsInitializedOp.
    init_only = {"init", "images", "labels"} | {
        n.name for n in graph_def.node if n.op == "VarIsInitializedOp" or n.name.endswith("/Assign")
    }
    assert init_only <= set(run.not_run)
    assert all(m.device in ("/device:CPU:0", "/device:GPU:0") for m in run.ops.values())
    assert all(m.runs_per_step == 1 and m.compute_us >= 0 for m in run.ops.values())
    assert run.device.startswith(("/device:CPU:0 (", "/device:GPU:0 (")) and "TensorFlow 2." in run.device
    assert run.step_time_us > 0


@tf_test
def test_known_tensors_and_times(cnn_run):
    run, _ = cnn_run
    # The first conv's output: batch 32, 32x32 pixels, 32 channels of float32.
    assert _measured(run, "conv0/Conv2D").output_bytes == (32 * 32 * 32 * 32 * 4,)
    assert run.ops["conv0/Relu"].output_bytes == (32 * 32 * 32 * 32 * 4,)
    assert _measured(run, "conv0/Conv2D").compute_us > 0
    if "conv0/Conv2D" in run.ops:
        assert run.ops["conv0/Conv2D"].kernel == "Conv2D" and not run.onednn
    else:  # oneDNN fused it into the BiasAdd
        assert run.ops["conv0/BiasAdd"].fused == ("conv0/Conv2D",) and run.onednn
    grad = run.ops["gradients/conv1/Conv2D_grad/Conv2DBackpropFilter"]
    assert grad.compute_us > 0 and grad.output_bytes == (3 * 3 * 32 * 64 * 4,)
    assert grad.temporary_bytes is not None and grad.persistent_bytes == 0
    # Two output ports: per-example losses [32] and backprop [32, 10].
    xent = run.ops["SparseSoftmaxCrossEntropyWithLogits/SparseSoftmaxCrossEntropyWithLogits"]
    assert xent.output_bytes == (32 * 4, 32 * 10 * 4)
    # A Const holds its tensor persistently; a resource handle's variable is allocated at init.
    assert run.ops["train/learning_rate"].persistent_bytes == 4
    assert run.ops["dense0/kernel"].persistent_bytes == 0
    assert run.feeds == (
        FeedSpec("images:0", "float32", (32, 32, 32, 3)),
        FeedSpec("labels:0", "int64", (32,), (0, 10)),
    )
    # Ops run one at a time (one inter-op thread), as the simulator runs a
    # device: their times add up to no more than the step's wall time.
    assert 0 < sum(m.compute_us for m in run.ops.values()) <= 1.05 * run.step_time_us


@tf_test
def test_text_graphdef_and_ref_variables():
    run = measure_graphdef(str(TESTDATA / "mlp.pbtxt"), warmup=0, steps=1)
    assert run.sidecar == str(TESTDATA / "mlp.json") and run.fetches == ["train", "loss:0"]
    assert run.ops["dense0/MatMul"].output_bytes == (64 * 256 * 4,)
    # A ref variable (VariableV2) reports its buffer as persistent memory every step.
    assert run.ops["dense0/kernel"].persistent_bytes == 784 * 256 * 4
    assert run.ops["dense0/kernel"].output_bytes == (784 * 256 * 4,)


@tf_test
def test_feeds_are_deterministic():
    specs = [
        FeedSpec("x:0", "float32", (4, 3)),
        FeedSpec("labels:0", "int64", (16,), (3, 7)),
        FeedSpec("indices:0", "int32", (5,)),
        FeedSpec("mask:0", "bool", (2,)),
        FeedSpec("half:0", "bfloat16", (2, 2)),
    ]
    first, second = synthetic_feeds(specs, 7), synthetic_feeds(specs, 7)
    assert list(first) == [s.name for s in specs]
    for name in first:
        assert first[name].tobytes() == second[name].tobytes()
        assert first[name].shape == dict((s.name, s.shape) for s in specs)[name]
    assert first["x:0"].dtype.name == "float32" and first["x:0"].std() > 0.1
    assert first["labels:0"].min() >= 3 and first["labels:0"].max() < 7
    assert not first["indices:0"].any() and not first["mask:0"].any()
    assert synthetic_feeds(specs, 8)["x:0"].tobytes() != first["x:0"].tobytes()


@tf_test
def test_tf2_function_graph_cannot_run_standalone():
    with pytest.raises(InputError) as info:
        measure_graphdef(str(TESTDATA / "tf2_function.pb"), warmup=0, steps=1)
    message = str(info.value)
    assert info.value.op.endswith("/ReadVariableOp/resource")
    assert "tf.function" in message and "cannot run standalone" in message
    assert "without --measure" in message and info.value.exit_code == 2


def _without_batch_dim(source: str, target: Path) -> str:
    """``source`` with the placeholders' batch dimension unknown, no sidecar beside it."""
    graph_def = _graph_def(source)
    for node in graph_def.node:
        if node.op == "Placeholder":
            node.attr["shape"].shape.dim[0].size = -1
    target.write_bytes(graph_def.SerializeToString())
    return str(target)


@tf_test
def test_graph_without_sidecar_uses_the_conventions(tmp_path):
    path = _without_batch_dim(CNN, tmp_path / "cnn.pb")
    with pytest.raises(InputError) as info:
        measure_graphdef(path, warmup=0, steps=1)
    assert info.value.op == "images" and "--batch-size" in str(info.value)

    run = measure_graphdef(path, batch_size=32, warmup=0, steps=1)
    assert run.sidecar is None and run.init_op == "init" and run.batch_size == 32
    assert "train" in run.fetches and "loss" in run.fetches and "init" not in run.fetches
    assert run.feeds == (
        FeedSpec("images:0", "float32", (32, 32, 32, 3)),
        FeedSpec("labels:0", "int64", (32,)),
    )
    assert run.ops["conv0/Relu"].output_bytes == (32 * 32 * 32 * 32 * 4,)
    assert "init" in run.not_run


@tf_test
def test_variable_initializers_without_an_init_op(tmp_path):
    graph_def = _graph_def(MLP)
    kept = [n for n in graph_def.node if n.name != "init"]
    del graph_def.node[:]
    graph_def.node.extend(kept)
    path = tmp_path / "mlp.pb"
    path.write_bytes(graph_def.SerializeToString())
    run = measure_graphdef(str(path), warmup=0, steps=1)
    assert run.init_op == "dense0/kernel/Assign and 11 more variable initializers"
    assert "dense0/MatMul" in run.ops and "dense0/kernel/Assign" in run.not_run


@tf_test
def test_init_op_errors(tmp_path):
    import tensorflow as tf

    with pytest.raises(InputError, match="did you mean 'init'"):
        measure_graphdef(CNN, init_op="initt")
    graph = tf.Graph()
    with graph.as_default():
        handle = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[2], name="v")
        tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32, name="read")
    path = tmp_path / "uninitialised.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    with pytest.raises(InputError) as info:
        measure_graphdef(str(path))
    assert "variable 'v'" in str(info.value) and "--init-op" in str(info.value)


def _save_graph(graph, path: Path, sidecar: str | None = None) -> str:
    path.write_bytes(graph.as_graph_def().SerializeToString())
    if sidecar is not None:
        path.with_suffix(".json").write_text(sidecar)
    return str(path)


@tf_test
def test_failing_op_names_the_op(tmp_path):
    import numpy as np
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.debugging.check_numerics(tf.constant([np.nan, 1.0]), "boom", name="check")
    with pytest.raises(InputError) as info:
        measure_graphdef(_save_graph(graph, tmp_path / "nan.pb"), warmup=0, steps=1)
    assert info.value.op == "check" and "NaN" in str(info.value)
    assert "\n" not in str(info.value) and len(info.value.problem) < 300

    graph = tf.Graph()
    with graph.as_default():
        indices = tf.compat.v1.placeholder(tf.int32, [3], name="indices")
        tf.gather(tf.constant([1.0, 2.0]), indices, name="gather")
    # Sidecar range [5, 6): every index is out of bounds.
    sidecar = '{"inputs": [{"name": "indices:0", "dtype": "int32", "shape": [3], "range": [5, 6]}]}'
    with pytest.raises(InputError) as info:
        measure_graphdef(_save_graph(graph, tmp_path / "gather.pb", sidecar), warmup=0, steps=1)
    assert info.value.op == "gather" and "not in [0, 2)" in str(info.value)


@tf_test
def test_loop_body_time_is_per_step(tmp_path):
    import numpy as np
    import tensorflow as tf

    was_v2 = tf.compat.v1.control_flow_v2_enabled()
    tf.compat.v1.disable_control_flow_v2()
    try:
        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [8, 8], name="x")
            w = tf.constant(np.eye(8, dtype=np.float32) / 2, name="w")
            _, h = tf.compat.v1.while_loop(
                lambda i, h: i < 5,
                lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w, name="step"))),
                [tf.constant(0), x],
                name="loop",
            )
            tf.identity(h, name="out")
    finally:
        if was_v2:
            tf.compat.v1.enable_control_flow_v2()
    run = measure_graphdef(_save_graph(graph, tmp_path / "loop.pb"), warmup=0, steps=2)
    assert run.fetches == ["loop/Exit", "out"] and run.init_op is None  # the sinks: counter, result
    assert run.ops["loop/step"].runs_per_step == 5
    assert run.ops["loop/Merge"].runs_per_step == 6  # five iterations and the exit test
    assert run.ops["loop/step"].output_bytes == (8 * 8 * 4,)
    assert run.ops["out"].runs_per_step == 1


@pytest.mark.slow
@tf_test
def test_resnet50_convolutions_are_measured():
    run = measure_graphdef(str(TESTDATA / "resnet50.pb"), warmup=0, steps=1)
    graph_def = _graph_def(str(TESTDATA / "resnet50.pb"))
    convs = [
        n.name for n in graph_def.node if n.op in ("Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput")
    ]
    assert len(convs) == 3 * 53
    assert all(_measured(run, name).compute_us > 0 for name in convs)
    assert _measured(run, "conv1_conv/Conv2D").output_bytes == (32 * 112 * 112 * 64 * 4,)


@tf_test
def test_sidecar_errors_name_the_sidecar(tmp_path):
    shutil.copy(MLP, tmp_path / "mlp.pb")
    (tmp_path / "mlp.json").write_text('{"inputs": [{"name": "x:0"}]}')
    with pytest.raises(InputError) as info:
        measure_graphdef(str(tmp_path / "mlp.pb"))
    assert info.value.path == str(tmp_path / "mlp.json") and "dtype" in str(info.value)


# ------------------------------------------------------------ without TensorFlow


def test_missing_tensorflow(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # makes `import tensorflow` raise ImportError
    with pytest.raises(MissingDependencyError) as info:
        measure_graphdef(CNN)
    assert info.value.exit_code == 5 and info.value.path == CNN
    assert "pip install 'baechi[tf]'" in str(info.value)


@pytest.mark.parametrize(
    "kwargs, text",
    [({"steps": 0}, "--steps"), ({"warmup": -1}, "--warmup"), ({"batch_size": 0}, "batch size")],
)
def test_bad_arguments(kwargs, text):
    with pytest.raises(InputError, match=text):
        measure_graphdef(CNN, **kwargs)
