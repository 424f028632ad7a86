"""Generate the TensorFlow test graphs (needs TensorFlow; tf_keras for two of them).

Usage: ``python testdata/generate.py [--out testdata] [--cache DIR] [--only NAME ...]``
(``make testdata`` builds them all). Committed graphs are written into ``--out``
(testdata/), the others into ``--cache`` (``testdata/cache/<TensorFlow
version>/``, git-ignored). ``ensure(name)`` returns the path of a graph,
generating a cached one on first use; tests/realgraphs.py wraps it.

Committed, small:

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

Real models, TF1-style training graphs with resource variables:

``inception_v3.pb``, ``resnet50.pb`` (committed)
    tf_keras ``InceptionV3`` / ``ResNet50`` (weights=None, 1000 classes, batch
    32, 299x299x3 / 224x224x3) built on a placeholder in a v1 graph with the
    learning phase fixed to training, sparse softmax cross-entropy, Momentum;
    the train op also runs the batch-norm moving-average updates.
``gnmt_static.pb`` (cached, ~6.5 MB) / ``gnmt_dynamic.pb`` (committed)
    A GNMT-like seq2seq model (batch 128, source and target length 40, vocab
    30,000, 512 units, 4-layer LSTM encoder and decoder with residual
    connections from layer 2, Luong attention over the encoder outputs,
    softmax over the vocab at every target step, Adam). The same model and
    variables twice: unrolled statically over the 40 steps, and with
    ``tf.compat.v1.nn.dynamic_rnn`` and v1 control flow (Enter/Merge/Switch/
    NextIteration/Exit/LoopCond, TensorArrays, gradient stacks).
``transformer.pb`` (committed)
    A 6-layer post-LN Transformer encoder (batch 16, sequence 128, hidden 512,
    8 heads, FFN 2048, vocab 30,000) with a token-level LM head, Adam.

``<name>.json``
    A sidecar per runnable graph: feed tensors, loss tensor, train and init
    ops, batch size and seed — what ``baechi_cli.verify`` needs to run it.

Contract: the output is a pure function of this script and the TensorFlow
version. Graphs are built with fixed graph- and op-level seeds, gradients are
colocated with their forward ops (``colocate_gradients_with_ops=True``) so
gradient ops carry ``_class`` (all but NoOps and some bookkeeping; see README), ``as_graph_def(add_shapes=True)`` puts
``_output_shapes`` on every node, and protobufs are written with
deterministic serialization, so running the script twice gives identical
bytes. Weights come from in-graph initializer ops, not constants, which keeps
the files small.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

try:
    import fcntl
except ImportError:  # not POSIX: no lock, concurrent ensure() calls may both generate
    fcntl = None  # type: ignore[assignment]

HERE = Path(__file__).resolve().parent
CACHE_ROOT = HERE / "cache"

SEED = 20200101

MLP_BATCH = 64
MLP_LAYERS = (784, 256, 128, 10)

CNN_BATCH = 32
CNN_IMAGE = (32, 32, 3)
CNN_CHANNELS = (32, 64, 128)
CNN_DENSE = 256
CNN_CLASSES = 10

KERAS_BATCH = 32
KERAS_CLASSES = 1000

GNMT_BATCH = 128
GNMT_LEN = 40  # source and target length
GNMT_VOCAB = 30000
GNMT_UNITS = 512  # embedding size and LSTM units
GNMT_LAYERS = 4
GNMT_RESIDUAL_FROM = 2  # layers 2 and 3 are residual, as in GNMT
GNMT_INIT = 0.1  # uniform(-0.1, 0.1) initialisation, as in GNMT

TRANSFORMER_BATCH = 16
TRANSFORMER_LEN = 128
TRANSFORMER_HIDDEN = 512
TRANSFORMER_HEADS = 8
TRANSFORMER_FFN = 2048
TRANSFORMER_LAYERS = 6
TRANSFORMER_VOCAB = 30000


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


def _keras_classifier(tf: Any, application: str, image: tuple[int, int, int]) -> tuple[Any, dict[str, Any]]:
    """A tf_keras.applications model (weights=None) trained with Momentum in a v1 graph."""
    import tf_keras

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(SEED)
        # Keras initializers draw their seeds from this generator (python random
        # otherwise): without it every run would give different graph bytes.
        tf_keras.utils.set_random_seed(SEED)
        # A constant learning phase: batch norms run in training mode instead of
        # becoming an If on the keras_learning_phase placeholder.
        tf_keras.backend.set_learning_phase(1)
        images = tf.compat.v1.placeholder(tf.float32, [KERAS_BATCH, *image], name="images")
        labels = tf.compat.v1.placeholder(tf.int64, [KERAS_BATCH], name="labels")
        model = getattr(tf_keras.applications, application)(
            weights=None, input_tensor=images, classes=KERAS_CLASSES, classifier_activation=None
        )
        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=model.output)
        loss = tf.reduce_mean(xent, name="loss")
        opt = tf.compat.v1.train.MomentumOptimizer(learning_rate=0.01, momentum=0.9)
        step = opt.minimize(
            loss, var_list=model.trainable_variables, colocate_gradients_with_ops=True, name="minimize"
        )
        # Batch-norm moving averages (AssignSubVariableOp), run with the step.
        train = tf.group(step, *model.updates, name="train")
        init = tf.compat.v1.global_variables_initializer()
    sidecar = {
        "inputs": [_input_entry(images), _input_entry(labels, label_classes=KERAS_CLASSES)],
        "loss": loss.name,
        "train_op": train.name,
        "init_op": init.name,
        "batch_size": KERAS_BATCH,
    }
    return graph.as_graph_def(add_shapes=True), sidecar


def build_inception_v3(tf: Any) -> tuple[Any, dict[str, Any]]:
    """Keras InceptionV3 (batch 32, 299x299x3, 1000 classes), Momentum."""
    return _keras_classifier(tf, "InceptionV3", (299, 299, 3))


def build_resnet50(tf: Any) -> tuple[Any, dict[str, Any]]:
    """Keras ResNet50 (batch 32, 224x224x3, 1000 classes), Momentum."""
    return _keras_classifier(tf, "ResNet50", (224, 224, 3))


class _LSTMStack:
    """A stack of hand-written LSTM layers (resource variables), one time step per call.

    Duck-typed as an RNNCell for ``tf.compat.v1.nn.dynamic_rnn`` (output_size,
    state_size, zero_state, __call__); the static graph calls it per step.
    The state is a tuple of ``(c, h)`` pairs, one per layer. Layers from
    ``GNMT_RESIDUAL_FROM`` on add their input to their output (GNMT).

    The weights are read once, here, outside any loop: every step uses the same
    ReadVariableOp output (as TF1 ref variables did through their snapshot).
    Read inside a v1 while loop instead, each kernel would be pushed on a
    gradient stack at every step (40 copies of an 8 MB kernel per layer).
    """

    def __init__(self, tf: Any, name: str, input_size: int) -> None:
        self._tf = tf
        self.layers = []
        init = tf.compat.v1.random_uniform_initializer(-GNMT_INIT, GNMT_INIT)
        with tf.compat.v1.variable_scope(name):
            for i in range(GNMT_LAYERS):
                fan_in = (input_size if i == 0 else GNMT_UNITS) + GNMT_UNITS
                with tf.compat.v1.variable_scope(f"layer{i}"):
                    kernel = tf.compat.v1.get_variable(
                        "kernel", [fan_in, 4 * GNMT_UNITS], initializer=init, use_resource=True
                    )
                    bias = tf.compat.v1.get_variable(
                        "bias",
                        [4 * GNMT_UNITS],
                        initializer=tf.compat.v1.zeros_initializer(),
                        use_resource=True,
                    )
                    self.layers.append((kernel.value(), bias.value()))

    @property
    def output_size(self) -> int:
        return GNMT_UNITS

    @property
    def state_size(self) -> tuple[tuple[int, int], ...]:
        return tuple((GNMT_UNITS, GNMT_UNITS) for _ in self.layers)

    def zero_state(self, batch_size: Any, dtype: Any) -> tuple[tuple[Any, Any], ...]:
        zeros = self._tf.zeros([batch_size, GNMT_UNITS], dtype=dtype)
        return tuple((zeros, zeros) for _ in self.layers)

    def __call__(self, inputs: Any, state: Any, scope: Any = None) -> tuple[Any, Any]:
        tf = self._tf
        x = inputs
        new_state = []
        for i, ((kernel, bias), (c, h)) in enumerate(zip(self.layers, state, strict=True)):
            with tf.name_scope(f"layer{i}"):
                gates = tf.nn.bias_add(tf.matmul(tf.concat([x, h], 1), kernel), bias)
                in_gate, candidate, forget_gate, out_gate = tf.split(gates, 4, axis=1)
                c = tf.sigmoid(forget_gate + 1.0) * c + tf.sigmoid(in_gate) * tf.tanh(candidate)
                h = tf.sigmoid(out_gate) * tf.tanh(c)
                x = x + h if i >= GNMT_RESIDUAL_FROM else h
                new_state.append((c, h))
        return x, tuple(new_state)


def _build_gnmt(tf: Any, *, dynamic: bool) -> tuple[Any, dict[str, Any]]:
    """GNMT-like seq2seq training graph; see the module docstring."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(SEED)
        shape = [GNMT_BATCH, GNMT_LEN]
        source = tf.compat.v1.placeholder(tf.int64, shape, name="source")
        target_in = tf.compat.v1.placeholder(tf.int64, shape, name="target_input")
        target_out = tf.compat.v1.placeholder(tf.int64, shape, name="target_output")
        init = tf.compat.v1.random_uniform_initializer(-GNMT_INIT, GNMT_INIT)

        def variable(name: str, var_shape: list[int]) -> Any:
            return tf.compat.v1.get_variable(name, var_shape, initializer=init, use_resource=True)

        def read(name: str, var_shape: list[int], initializer: Any = init) -> Any:
            # One ReadVariableOp shared by all steps (see _LSTMStack).
            var = tf.compat.v1.get_variable(name, var_shape, initializer=initializer, use_resource=True)
            return var.value()

        with tf.compat.v1.variable_scope("embeddings"):
            src_embedding = variable("encoder", [GNMT_VOCAB, GNMT_UNITS])
            tgt_embedding = variable("decoder", [GNMT_VOCAB, GNMT_UNITS])
        encoder = _LSTMStack(tf, "encoder", GNMT_UNITS)
        decoder = _LSTMStack(tf, "decoder", GNMT_UNITS)
        with tf.compat.v1.variable_scope("attention"):
            # Luong "general" score h_t^T W_a h_s, attention vector tanh(W_c [c_t; h_t]).
            score_kernel = read("score_kernel", [GNMT_UNITS, GNMT_UNITS])
            output_kernel = read("output_kernel", [2 * GNMT_UNITS, GNMT_UNITS])
        with tf.compat.v1.variable_scope("softmax"):
            softmax_kernel = read("kernel", [GNMT_UNITS, GNMT_VOCAB])
            softmax_bias = read("bias", [GNMT_VOCAB], tf.compat.v1.zeros_initializer())

        # Embedding lookups: ResourceGather, sparse (IndexedSlices) gradients.
        src_emb = tf.nn.embedding_lookup(src_embedding, source)
        tgt_emb = tf.nn.embedding_lookup(tgt_embedding, target_in)
        if dynamic:
            memory, enc_state = tf.compat.v1.nn.dynamic_rnn(
                encoder,
                src_emb,
                initial_state=encoder.zero_state(GNMT_BATCH, tf.float32),
                scope="encoder_rnn",
            )
            dec_out, _ = tf.compat.v1.nn.dynamic_rnn(
                decoder, tgt_emb, initial_state=enc_state, scope="decoder_rnn"
            )
            with tf.name_scope("attention"):
                keys = tf.reshape(
                    tf.matmul(tf.reshape(memory, [-1, GNMT_UNITS]), score_kernel),
                    [GNMT_BATCH, GNMT_LEN, GNMT_UNITS],
                )
                alignments = tf.nn.softmax(tf.matmul(dec_out, keys, transpose_b=True))
                context = tf.matmul(alignments, memory)
                attention = tf.tanh(
                    tf.matmul(
                        tf.reshape(tf.concat([context, dec_out], 2), [-1, 2 * GNMT_UNITS]), output_kernel
                    )
                )
            with tf.name_scope("softmax"):
                logits = tf.nn.bias_add(tf.matmul(attention, softmax_kernel), softmax_bias)
                xent = tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=tf.reshape(target_out, [-1]), logits=logits
                )
        else:
            src_steps = tf.unstack(src_emb, axis=1)
            tgt_steps = tf.unstack(tgt_emb, axis=1)
            labels = tf.unstack(target_out, axis=1)
            state = encoder.zero_state(GNMT_BATCH, tf.float32)
            outputs = []
            for t, x in enumerate(src_steps):
                with tf.name_scope(f"encoder/step{t}"):
                    out, state = encoder(x, state)
                outputs.append(out)
            memory = tf.stack(outputs, axis=1)
            with tf.name_scope("attention_keys"):
                keys = tf.reshape(
                    tf.matmul(tf.reshape(memory, [-1, GNMT_UNITS]), score_kernel),
                    [GNMT_BATCH, GNMT_LEN, GNMT_UNITS],
                )
            xents = []
            for t, x in enumerate(tgt_steps):
                with tf.name_scope(f"decoder/step{t}"):
                    out, state = decoder(x, state)
                    with tf.name_scope("attention"):
                        scores = tf.squeeze(tf.matmul(keys, tf.expand_dims(out, 2)), 2)
                        alignments = tf.nn.softmax(scores)
                        context = tf.squeeze(tf.matmul(tf.expand_dims(alignments, 1), memory), 1)
                        attention = tf.tanh(tf.matmul(tf.concat([context, out], 1), output_kernel))
                    with tf.name_scope("softmax"):
                        logits = tf.nn.bias_add(tf.matmul(attention, softmax_kernel), softmax_bias)
                        xents.append(
                            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels[t], logits=logits)
                        )
            xent = tf.stack(xents, axis=1)
        loss = tf.reduce_mean(xent, name="loss")
        opt = tf.compat.v1.train.AdamOptimizer(learning_rate=1e-3)
        train = opt.minimize(loss, colocate_gradients_with_ops=True, name="train")
        init_op = tf.compat.v1.global_variables_initializer()
    sidecar = {
        "inputs": [_input_entry(t, label_classes=GNMT_VOCAB) for t in (source, target_in, target_out)],
        "loss": loss.name,
        "train_op": train.name,
        "init_op": init_op.name,
        "batch_size": GNMT_BATCH,
    }
    return graph.as_graph_def(add_shapes=True), sidecar


def build_gnmt_static(tf: Any) -> tuple[Any, dict[str, Any]]:
    """GNMT-like model statically unrolled over 40 steps, Adam."""
    return _build_gnmt(tf, dynamic=False)


def build_gnmt_dynamic(tf: Any) -> tuple[Any, dict[str, Any]]:
    """The GNMT-like model with dynamic_rnn and TF1 (v1) while loops, Adam."""
    was_v2 = tf.compat.v1.control_flow_v2_enabled()
    # v1 control flow: Enter/Merge/Switch/NextIteration/Exit/LoopCond instead
    # of functional While ops. A process-wide switch, so restore it after.
    tf.compat.v1.disable_control_flow_v2()
    try:
        return _build_gnmt(tf, dynamic=True)
    finally:
        if was_v2:
            tf.compat.v1.enable_control_flow_v2()


def _layer_norm(tf: Any, x: Any, name: str) -> Any:
    with tf.compat.v1.variable_scope(name):
        gamma = tf.compat.v1.get_variable(
            "gamma", [TRANSFORMER_HIDDEN], initializer=tf.compat.v1.ones_initializer(), use_resource=True
        )
        beta = tf.compat.v1.get_variable(
            "beta", [TRANSFORMER_HIDDEN], initializer=tf.compat.v1.zeros_initializer(), use_resource=True
        )
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        variance = tf.reduce_mean(tf.square(x - mean), axis=-1, keepdims=True)
        return (x - mean) * tf.math.rsqrt(variance + 1e-6) * gamma + beta


def _dense(tf: Any, x: Any, fan_out: int, name: str) -> Any:
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.02)
    with tf.compat.v1.variable_scope(name):
        w = tf.compat.v1.get_variable(
            "kernel", [int(x.shape[-1]), fan_out], initializer=init, use_resource=True
        )
        b = tf.compat.v1.get_variable(
            "bias", [fan_out], initializer=tf.compat.v1.zeros_initializer(), use_resource=True
        )
        return tf.nn.bias_add(tf.matmul(x, w), b)


def build_transformer(tf: Any) -> tuple[Any, dict[str, Any]]:
    """6-layer post-LN Transformer encoder with a token-level LM head, Adam."""
    batch, length, hidden, heads = TRANSFORMER_BATCH, TRANSFORMER_LEN, TRANSFORMER_HIDDEN, TRANSFORMER_HEADS
    head_size = hidden // heads
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(SEED)
        tokens = tf.compat.v1.placeholder(tf.int64, [batch, length], name="tokens")
        labels = tf.compat.v1.placeholder(tf.int64, [batch, length], name="labels")
        init = tf.compat.v1.truncated_normal_initializer(stddev=0.02)
        with tf.compat.v1.variable_scope("embeddings"):
            token_table = tf.compat.v1.get_variable(
                "tokens", [TRANSFORMER_VOCAB, hidden], initializer=init, use_resource=True
            )
            position_table = tf.compat.v1.get_variable(
                "positions", [length, hidden], initializer=init, use_resource=True
            )
            x = tf.nn.embedding_lookup(token_table, tokens) + position_table
            # Rows of tokens: [batch * length, hidden] through the stack.
            x = _layer_norm(tf, tf.reshape(x, [batch * length, hidden]), "layer_norm")

        def split_heads(t: Any) -> Any:
            return tf.transpose(tf.reshape(t, [batch, length, heads, head_size]), [0, 2, 1, 3])

        for i in range(TRANSFORMER_LAYERS):
            with tf.compat.v1.variable_scope(f"layer{i}"):
                with tf.compat.v1.variable_scope("attention"):
                    q = split_heads(_dense(tf, x, hidden, "query"))
                    k = split_heads(_dense(tf, x, hidden, "key"))
                    v = split_heads(_dense(tf, x, hidden, "value"))
                    scores = tf.matmul(q, k, transpose_b=True) * (1.0 / head_size**0.5)
                    context = tf.matmul(tf.nn.softmax(scores), v)
                    context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [batch * length, hidden])
                    x = _layer_norm(tf, x + _dense(tf, context, hidden, "output"), "layer_norm")
                with tf.compat.v1.variable_scope("ffn"):
                    h = tf.nn.relu(_dense(tf, x, TRANSFORMER_FFN, "inner"))
                    x = _layer_norm(tf, x + _dense(tf, h, hidden, "output"), "layer_norm")
        logits = _dense(tf, x, TRANSFORMER_VOCAB, "lm_head")
        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.reshape(labels, [-1]), logits=logits)
        loss = tf.reduce_mean(xent, name="loss")
        opt = tf.compat.v1.train.AdamOptimizer(learning_rate=1e-4)
        train = opt.minimize(loss, colocate_gradients_with_ops=True, name="train")
        init_op = tf.compat.v1.global_variables_initializer()
    sidecar = {
        "inputs": [
            _input_entry(tokens, label_classes=TRANSFORMER_VOCAB),
            _input_entry(labels, label_classes=TRANSFORMER_VOCAB),
        ],
        "loss": loss.name,
        "train_op": train.name,
        "init_op": init_op.name,
        "batch_size": batch,
    }
    return graph.as_graph_def(add_shapes=True), sidecar


class _Spec(NamedTuple):  # (not a dataclass: loadable with importlib without sys.modules)
    builder: Callable[[Any], Any]
    committed: bool  # written to testdata/ (else to the cache)
    modules: tuple[str, ...] = ("tensorflow",)  # what the builder imports


# Build order matters for nothing but the log; each graph is its own tf.Graph.
GRAPHS: dict[str, _Spec] = {
    "mlp": _Spec(build_mlp, committed=True),
    "cnn": _Spec(build_cnn, committed=True),
    "tf2_function": _Spec(build_tf2_function, committed=True),
    "inception_v3": _Spec(build_inception_v3, committed=True, modules=("tensorflow", "tf_keras")),
    "resnet50": _Spec(build_resnet50, committed=True, modules=("tensorflow", "tf_keras")),
    "gnmt_static": _Spec(build_gnmt_static, committed=False),
    "gnmt_dynamic": _Spec(build_gnmt_dynamic, committed=True),
    "transformer": _Spec(build_transformer, committed=True),
}


def _tf_version() -> str:
    """The installed TensorFlow version, without importing TensorFlow if possible."""
    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tf-nightly"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    import tensorflow as tf

    return tf.__version__


def cache_dir(tf_version: str | None = None) -> Path:
    """Where non-committed graphs go: ``testdata/cache/<TensorFlow version>/``."""
    return CACHE_ROOT / (tf_version or _tf_version())


def _stamp() -> str:
    """Identifies the generator: a cached graph is stale once this file changes."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def ensure(name: str) -> Path:
    """Path of ``<name>.pb``: the committed file in testdata/ if there is one, else the
    cached one in ``testdata/cache/<TensorFlow version>/``, generated first (in a
    subprocess, under a file lock) when missing or made by another version of this
    script. The sidecar, if the graph has one, is the ``.json`` next to it.

    Raises KeyError for an unknown name, FileNotFoundError for a committed graph
    that is missing from the checkout, ModuleNotFoundError when generating needs
    TensorFlow (or tf_keras) and it is not installed, RuntimeError when generating
    fails.
    """
    if name not in GRAPHS:
        raise KeyError(f"unknown test graph {name!r}; known: {', '.join(GRAPHS)}")
    spec = GRAPHS[name]
    committed = HERE / f"{name}.pb"
    if committed.exists():
        return committed
    if spec.committed:
        raise FileNotFoundError(f"{committed} is committed: restore it (git checkout) or run make testdata")
    for module in spec.modules:
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"generating {name}.pb needs {module} (pip install -e '.[tf]')")
    out = cache_dir()
    pb, stamp = out / f"{name}.pb", out / f"{name}.stamp"
    expected = _stamp()

    def fresh() -> bool:
        return pb.exists() and stamp.exists() and stamp.read_text().strip() == expected

    if fresh():
        return pb
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{name}.lock", "w") as lock:
        if fcntl is not None:
            # Parallel test workers: one generates, the others wait and reuse it.
            fcntl.flock(lock, fcntl.LOCK_EX)
        if not fresh():
            env = dict(os.environ)
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            cmd = [sys.executable, str(Path(__file__).resolve()), "--only", name, "--cache", str(out)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0 or not fresh():
                raise RuntimeError(
                    f"generating {name}.pb failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
                )
    return pb


def _write(path: Path, data: bytes) -> None:
    # Temporary file + rename: an interrupted run never leaves a partial graph,
    # and concurrent writers (distinct temporary names) never mix their bytes.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(HERE), help="directory for the committed graphs (testdata/)")
    parser.add_argument(
        "--cache",
        default=None,
        help="directory for the other graphs (default testdata/cache/<TensorFlow version>/)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=list(GRAPHS),
        metavar="NAME",
        help=f"build only NAME (repeatable): {', '.join(GRAPHS)}",
    )
    args = parser.parse_args(argv)
    names = [name for name in GRAPHS if not args.only or name in args.only]

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from google.protobuf import text_format

    out = Path(args.out)
    cache = Path(args.cache) if args.cache else cache_dir(tf.__version__)
    for name in names:
        spec = GRAPHS[name]
        dest = out if spec.committed else cache
        dest.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        built = spec.builder(tf)
        graph_def, sidecar = built if isinstance(built, tuple) else (built, None)
        data = graph_def.SerializeToString(deterministic=True)
        if sidecar is not None:
            sidecar.update(seed=SEED, generator="testdata/generate.py", tensorflow=tf.__version__)
            _write(dest / f"{name}.json", (json.dumps(sidecar, indent=2) + "\n").encode())
        _write(dest / f"{name}.pb", data)
        if name == "mlp":
            _write(dest / "mlp.pbtxt", text_format.MessageToString(graph_def).encode())
        if not spec.committed:
            # Written last: ensure() trusts a cached graph only with a matching stamp.
            _write(dest / f"{name}.stamp", (_stamp() + "\n").encode())
        seconds = time.perf_counter() - start
        print(f"{name}: {len(graph_def.node)} ops, {len(data):,} bytes, {seconds:.1f} s -> {dest / name}.pb")


if __name__ == "__main__":
    main()
