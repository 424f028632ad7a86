"""Generate the committed TensorFlow test graphs (needs TensorFlow).

Usage: ``python testdata/generate.py [--out testdata]`` (``make testdata``).

Writes, into ``--out``:

``mlp.pb`` / ``mlp.pbtxt``
    TF1-style training graph of an MLP (batch 64, 784 -> 256 -> 128 -> 10,
    softmax cross-entropy) with REF variables (VariableV2) and Momentum
    (ApplyMomentum ops take the variable and its slot as ref inputs).
``cnn.pb``
    TF1-style training graph of a small CNN (batch 32, 32x32x3, three
    Conv2D+ReLU+MaxPool blocks, a 256-unit dense layer, softmax
    cross-entropy) with RESOURCE variables (VarHandleOp / ReadVariableOp /
    ResourceApplyAdam) and Adam, so optimizer slot variables exist.
``tf2_function.pb``
    The graph of a ``tf.function`` training step of a tiny model, taken from
    its concrete function: variables are captured as DT_RESOURCE Placeholders,
    so it loads but cannot run standalone (no sidecar).
``<name>.json``
    A sidecar per runnable graph: feed tensors, loss tensor, train and init
    ops, batch size and seed — what ``baechi_cli.verify`` needs to run it.

Contract: the output is a pure function of this script and the TensorFlow
version. Graphs are built with fixed graph- and op-level seeds, gradients are
colocated with their forward ops (``colocate_gradients_with_ops=True``) so
every gradient op carries ``_class``, ``as_graph_def(add_shapes=True)`` puts
``_output_shapes`` on every node, and protobufs are written with
deterministic serialization, so running the script twice gives identical
bytes. Weights come from in-graph initializer ops, not constants, which keeps
the files small.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

SEED = 20200101

MLP_BATCH = 64
MLP_LAYERS = (784, 256, 128, 10)

CNN_BATCH = 32
CNN_IMAGE = (32, 32, 3)
CNN_CHANNELS = (32, 64, 128)
CNN_DENSE = 256
CNN_CLASSES = 10


def _input_entry(tensor: Any, *, label_classes: int | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": tensor.name,
        "dtype": tensor.dtype.name,
        "shape": [int(d) for d in tensor.shape],
    }
    if label_classes is not None:
        # Integer feeds are class labels: verify draws them from [low, high).
        entry["range"] = [0, label_classes]
    return entry


def build_mlp(tf: Any) -> tuple[Any, dict[str, Any]]:
    """MLP with ref variables and Momentum; returns (GraphDef, sidecar)."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(SEED)
        x = tf.compat.v1.placeholder(tf.float32, [MLP_BATCH, MLP_LAYERS[0]], name="x")
        labels = tf.compat.v1.placeholder(tf.int64, [MLP_BATCH], name="labels")
        h = x
        last = len(MLP_LAYERS) - 2
        for i, (fan_in, fan_out) in enumerate(zip(MLP_LAYERS, MLP_LAYERS[1:], strict=False)):
            with tf.compat.v1.variable_scope(f"dense{i}"):
                # use_resource=False: TF2 defaults to resource variables even in
                # graph mode; the MLP is the ref-variable (VariableV2) case.
                w = tf.compat.v1.get_variable(
                    "kernel",
                    [fan_in, fan_out],
                    initializer=tf.compat.v1.glorot_uniform_initializer(),
                    use_resource=False,
                )
                b = tf.compat.v1.get_variable(
                    "bias", [fan_out], initializer=tf.compat.v1.zeros_initializer(), use_resource=False
                )
                h = tf.nn.bias_add(tf.matmul(h, w), b)
                if i != last:
                    h = tf.nn.relu(h)
        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=h)
        loss = tf.reduce_mean(xent, name="loss")
        opt = tf.compat.v1.train.MomentumOptimizer(learning_rate=0.05, momentum=0.9)
        train = opt.minimize(loss, colocate_gradients_with_ops=True, name="train")
        init = tf.compat.v1.global_variables_initializer()
    sidecar = {
        "inputs": [_input_entry(x), _input_entry(labels, label_classes=MLP_LAYERS[-1])],
        "loss": loss.name,
        "train_op": train.name,
        "init_op": init.name,
        "batch_size": MLP_BATCH,
    }
    return graph.as_graph_def(add_shapes=True), sidecar


def build_cnn(tf: Any) -> tuple[Any, dict[str, Any]]:
    """CNN with resource variables and Adam; returns (GraphDef, sidecar)."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(SEED)
        images = tf.compat.v1.placeholder(tf.float32, [CNN_BATCH, *CNN_IMAGE], name="images")
        labels = tf.compat.v1.placeholder(tf.int64, [CNN_BATCH], name="labels")
        h = images
        in_channels = CNN_IMAGE[2]
        for i, channels in enumerate(CNN_CHANNELS):
            with tf.compat.v1.variable_scope(f"conv{i}"):
                w = tf.compat.v1.get_variable(
                    "kernel",
                    [3, 3, in_channels, channels],
                    initializer=tf.compat.v1.glorot_uniform_initializer(),
                    use_resource=True,
                )
                b = tf.compat.v1.get_variable(
                    "bias", [channels], initializer=tf.compat.v1.zeros_initializer(), use_resource=True
                )
                h = tf.nn.conv2d(h, w, strides=1, padding="SAME")
                h = tf.nn.relu(tf.nn.bias_add(h, b))
                h = tf.nn.max_pool2d(h, ksize=2, strides=2, padding="VALID")
            in_channels = channels
        flat_size = int(h.shape[1]) * int(h.shape[2]) * int(h.shape[3])
        h = tf.reshape(h, [CNN_BATCH, flat_size])
        for i, (fan_in, fan_out) in enumerate(((flat_size, CNN_DENSE), (CNN_DENSE, CNN_CLASSES))):
            with tf.compat.v1.variable_scope(f"dense{i}"):
                w = tf.compat.v1.get_variable(
                    "kernel",
                    [fan_in, fan_out],
                    initializer=tf.compat.v1.glorot_uniform_initializer(),
                    use_resource=True,
                )
                b = tf.compat.v1.get_variable(
                    "bias", [fan_out], initializer=tf.compat.v1.zeros_initializer(), use_resource=True
                )
                h = tf.nn.bias_add(tf.matmul(h, w), b)
                if i == 0:
                    h = tf.nn.relu(h)
        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=h)
        loss = tf.reduce_mean(xent, name="loss")
        opt = tf.compat.v1.train.AdamOptimizer(learning_rate=1e-3)
        train = opt.minimize(loss, colocate_gradients_with_ops=True, name="train")
        init = tf.compat.v1.global_variables_initializer()
    sidecar = {
        "inputs": [_input_entry(images), _input_entry(labels, label_classes=CNN_CLASSES)],
        "loss": loss.name,
        "train_op": train.name,
        "init_op": init.name,
        "batch_size": CNN_BATCH,
    }
    return graph.as_graph_def(add_shapes=True), sidecar


def build_tf2_function(tf: Any) -> Any:
    """GraphDef of a tf.function SGD step of a 2-layer model (eager mode required)."""
    rng = tf.random.Generator.from_seed(SEED)
    w1 = tf.Variable(rng.normal([8, 16]), name="w1")
    b1 = tf.Variable(tf.zeros([16]), name="b1")
    w2 = tf.Variable(rng.normal([16, 4]), name="w2")
    b2 = tf.Variable(tf.zeros([4]), name="b2")
    params = (w1, b1, w2, b2)

    @tf.function(
        input_signature=(
            tf.TensorSpec([16, 8], tf.float32, name="x"),
            tf.TensorSpec([16], tf.int64, name="labels"),
        )
    )
    def train_step(x: Any, labels: Any) -> Any:
        with tf.GradientTape() as tape:
            logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
            )
        for var, grad in zip(params, tape.gradient(loss, params), strict=True):
            var.assign_sub(0.1 * grad)
        return loss

    return train_step.get_concrete_function().graph.as_graph_def(add_shapes=True)


def _write(path: Path, data: bytes) -> None:
    # Temporary file + rename: an interrupted run never leaves a partial graph.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent), help="output directory")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from google.protobuf import text_format

    for name, builder in (("mlp", build_mlp), ("cnn", build_cnn)):
        graph_def, sidecar = builder(tf)
        sidecar.update(seed=SEED, generator="testdata/generate.py", tensorflow=tf.__version__)
        _write(out / f"{name}.pb", graph_def.SerializeToString(deterministic=True))
        _write(out / f"{name}.json", (json.dumps(sidecar, indent=2) + "\n").encode())
        if name == "mlp":
            _write(out / "mlp.pbtxt", text_format.MessageToString(graph_def).encode())
        print(f"{name}: {len(graph_def.node)} ops")
    graph_def = build_tf2_function(tf)
    _write(out / "tf2_function.pb", graph_def.SerializeToString(deterministic=True))
    print(f"tf2_function: {len(graph_def.node)} ops")


if __name__ == "__main__":
    main()
