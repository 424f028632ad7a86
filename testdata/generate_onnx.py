"""Generate the ONNX test models (real architectures from PyTorch and Keras).

Usage: ``python testdata/generate_onnx.py [--out testdata] [--only NAME ...]``
(``make testdata`` runs it after generate.py). Every model is checked after
it is written (``onnx.checker``, onnxruntime against the framework's own
outputs, ``baechi_cli.io.onnx.read_onnx``); a failed check exits non-zero.

Exported from PyTorch with the TorchScript exporter (``torch.onnx.export(...,
dynamo=False)``, opset 17), models defined below, weights inline, committed:

``torch_resnet.onnx``
    A ResNet-18-style CNN (7x7 stem conv, bn1, relu, maxpool; ``layer1`` ..
    ``layer4`` of two BasicBlocks each, 8-16-32-64 channels, a ``downsample``
    1x1 conv + batch norm where the shape changes; adaptive average pool,
    ``fc`` to 100 classes), eval mode, FIXED input ``images`` [32, 3, 64, 64].
    Exported with ``training=TrainingMode.PRESERVE`` so the 20
    BatchNormalization nodes are kept (the default, ``EVAL``, folds them into
    the Conv weights).
``torch_transformer.onnx``
    A 4-layer pre-LN Transformer encoder LM (token + learned position
    embedding, 4-head self-attention written with nn.Linear / matmul /
    softmax, LayerNorm, GELU MLP, LM head over 1,000 tokens; hidden 64, MLP
    256). Input ``tokens`` int64 [batch, seq] with SYMBOLIC dims ``batch`` and
    ``seq`` (place it with ``--batch-size 8 --dim seq=128``).

Node names are the exporter's module paths (``/layer1/layer1.0/conv1/Conv``,
``/layers.0/attn/query/MatMul``). torch is not a dependency of the project:
without it these two are skipped, the committed files kept (install it with
``pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu``).

Converted from tf_keras (Keras 2) with ``tf2onnx.convert.from_keras``
(opset 17; tf2onnx folds every batch norm that follows a Conv into it):

``keras_cnn.onnx`` (weights inline, committed)
    A small Sequential CNN (three Conv2D + BatchNormalization + ReLU +
    MaxPool blocks, 16-32-64 channels, two Dense layers), input ``images``
    [32, 32, 32, 3] (NHWC).
``keras_resnet50.onnx``, ``keras_inception_v3.onnx`` (graph committed, weights not)
    ``tf_keras.applications.ResNet50`` / ``InceptionV3`` (weights=None, 1000
    classes, no softmax), input ``images`` [32, 224, 224, 3] / [32, 299, 299,
    3]. Their weights (~100 MB each) are saved as external data in
    ``<name>.onnx.data`` next to the graph, which is git-ignored: a fresh
    clone has the graph without its weights (what ``read_onnx`` supports:
    placement needs shapes, not values).

Weights are random but look trained: after the seeded initialisation, every
batch-norm / layer-norm scale, shift and moving statistic and every bias is
redrawn from a seeded generator (initialised to exact 0 and 1 they would be
deduplicated by the torch exporter into Identity nodes, and tf2onnx would drop
the zero-bias Adds).

Contract: with the same versions (torch, tensorflow, tf_keras, tf2onnx, onnx;
see ``VERSIONS``) the output is byte-identical: fixed seeds, tf2onnx's name
counter and the Keras session reset before each model, files written
atomically (the external data file is written fresh, never appended to).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import math
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

HERE = Path(__file__).resolve().parent

SEED = 20200101
OPSET = 17
TORCH_INSTALL = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"

#: The versions the committed files were made with; others give other bytes.
VERSIONS = {
    "torch": "2.13.0",
    "tensorflow": "2.21.0",
    "tf_keras": "2.21.0",
    "tf2onnx": "1.17.0",
    "onnx": "1.23.2",
    "onnxruntime": "1.31.1",
}

RESNET_BATCH = 32
RESNET_IMAGE = (3, 64, 64)
RESNET_WIDTHS = (8, 16, 32, 64)
RESNET_CLASSES = 100

LM_VOCAB = 1000
LM_HIDDEN = 64
LM_HEADS = 4
LM_MLP = 256
LM_LAYERS = 4
LM_MAX_LEN = 512
LM_EXPORT_SHAPE = (2, 16)  # example input of the export; the dims stay symbolic
LM_CHECK_SHAPE = (8, 128)  # what the check runs (and what placing it binds)

KERAS_BATCH = 32
KERAS_CNN_IMAGE = (32, 32, 3)
KERAS_CNN_CHANNELS = (16, 32, 64)
KERAS_CNN_DENSE = 64
KERAS_CNN_CLASSES = 10
KERAS_CLASSES = 1000

TOLERANCE = 1e-4  # onnxruntime vs the framework: max |diff| <= TOLERANCE * max(1, max |expected|)


class Built(NamedTuple):
    """What a builder returns: the model and a check of it."""

    model: Any  # onnx.ModelProto
    feeds: dict[str, np.ndarray]  # inputs for the onnxruntime check
    expected: list[np.ndarray]  # the framework's outputs for ``feeds``


class Spec(NamedTuple):  # (not a dataclass: loadable with importlib without sys.modules)
    builder: Callable[[], Built]
    modules: tuple[str, ...]  # what the builder imports
    external: bool  # weights in <name>.onnx.data (git-ignored), else inline
    batch_size: int | None = None  # read_onnx / --batch-size for a symbolic batch dim
    dims: dict[str, int] | None = None  # read_onnx / --dim for other symbolic dims


# --------------------------------------------------------------------------- torch


def _torch_norms_like_trained(torch: Any, model: Any, generator: Any) -> None:
    """Redraw norm affine parameters, running statistics and biases (see the module doc)."""
    nn = torch.nn
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d | nn.LayerNorm):
                shape = module.weight.shape
                module.weight.copy_(1 + 0.1 * torch.randn(shape, generator=generator))
                module.bias.copy_(0.1 * torch.randn(shape, generator=generator))
                if isinstance(module, nn.BatchNorm2d):
                    module.running_mean.copy_(0.1 * torch.randn(shape, generator=generator))
                    module.running_var.copy_(1 + 0.2 * torch.rand(shape, generator=generator))
            elif isinstance(module, nn.Linear | nn.Conv2d) and module.bias is not None:
                module.bias.copy_(0.02 * torch.randn(module.bias.shape, generator=generator))


def _torch_export(torch: Any, model: Any, example: Any, **kwargs: Any) -> Any:
    """``torch.onnx.export`` (TorchScript exporter, opset 17) to bytes, loaded back as a ModelProto."""
    import onnx

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        # The legacy exporter's deprecation notice, and PRESERVE's advice to turn
        # constant folding off (meant for models in training mode; ours is in eval).
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message="It is recommended that constant folding be turned off")
        path = os.path.join(tmp, "model.onnx")
        torch.onnx.export(model, (example,), path, dynamo=False, opset_version=OPSET, **kwargs)
        return onnx.load_model(path)


def torch_resnet() -> Any:
    """The ResNet-18-style ``nn.Module`` of ``torch_resnet.onnx`` (seeded, untrained weights)."""
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, inplanes: int, planes: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = None
            if stride != 1 or inplanes != planes:
                self.downsample = nn.Sequential(
                    nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
                )

        def forward(self, x: Any) -> Any:
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    class ResNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            width = RESNET_WIDTHS[0]
            self.conv1 = nn.Conv2d(RESNET_IMAGE[0], width, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            inplanes = width
            for i, planes in enumerate(RESNET_WIDTHS):
                stride = 1 if i == 0 else 2
                blocks = nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes, 1))
                setattr(self, f"layer{i + 1}", blocks)
                inplanes = planes
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(inplanes, RESNET_CLASSES)

        def forward(self, x: Any) -> Any:
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    torch.manual_seed(SEED)
    return ResNet()


def build_torch_resnet() -> Built:
    """ResNet-18-style CNN, 8-16-32-64 channels, fixed input [32, 3, 64, 64], BN kept."""
    import torch

    model = torch_resnet()
    _torch_norms_like_trained(torch, model, torch.Generator().manual_seed(SEED))
    model.eval()
    images = torch.from_numpy(
        np.random.RandomState(SEED).standard_normal((RESNET_BATCH, *RESNET_IMAGE)).astype(np.float32)
    )
    proto = _torch_export(
        torch,
        model,
        images,
        input_names=["images"],
        output_names=["logits"],
        # Keeps BatchNormalization nodes: EVAL (the default) folds them into Conv.
        training=torch.onnx.TrainingMode.PRESERVE,
    )
    with torch.no_grad():
        expected = model(images).numpy()
    return Built(proto, {"images": images.numpy()}, [expected])


def build_torch_transformer() -> Built:
    """4-layer pre-LN Transformer encoder LM, symbolic [batch, seq] tokens."""
    import torch
    from torch import nn

    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = LM_HEADS
            self.head_size = LM_HIDDEN // LM_HEADS
            self.query = nn.Linear(LM_HIDDEN, LM_HIDDEN)
            self.key = nn.Linear(LM_HIDDEN, LM_HIDDEN)
            self.value = nn.Linear(LM_HIDDEN, LM_HIDDEN)
            self.out = nn.Linear(LM_HIDDEN, LM_HIDDEN)

        def forward(self, x: Any) -> Any:
            batch, length, hidden = x.shape

            def split_heads(t: Any) -> Any:
                return t.view(batch, length, self.heads, self.head_size).transpose(1, 2)

            q, k, v = split_heads(self.query(x)), split_heads(self.key(x)), split_heads(self.value(x))
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_size)
            context = torch.matmul(torch.softmax(scores, dim=-1), v)
            return self.out(context.transpose(1, 2).reshape(batch, length, hidden))

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(LM_HIDDEN, LM_MLP)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(LM_MLP, LM_HIDDEN)

        def forward(self, x: Any) -> Any:
            return self.fc2(self.act(self.fc1(x)))

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(LM_HIDDEN)
            self.attn = SelfAttention()
            self.ln2 = nn.LayerNorm(LM_HIDDEN)
            self.mlp = Mlp()

        def forward(self, x: Any) -> Any:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class TransformerLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok_embed = nn.Embedding(LM_VOCAB, LM_HIDDEN)
            self.pos_embed = nn.Embedding(LM_MAX_LEN, LM_HIDDEN)
            self.layers = nn.ModuleList(Layer() for _ in range(LM_LAYERS))
            self.ln_f = nn.LayerNorm(LM_HIDDEN)
            self.lm_head = nn.Linear(LM_HIDDEN, LM_VOCAB)

        def forward(self, tokens: Any) -> Any:
            # Positions 0..seq-1 as a cumulative sum over the tokens' shape (as
            # RoBERTa does), not torch.arange: ONNX shape inference cannot size a
            # Range from a symbolic dim, it can size a CumSum.
            positions = torch.cumsum(torch.ones_like(tokens), dim=1) - 1
            x = self.tok_embed(tokens) + self.pos_embed(positions)
            for layer in self.layers:
                x = layer(x)
            return self.lm_head(self.ln_f(x))

    torch.manual_seed(SEED)
    model = TransformerLM()
    _torch_norms_like_trained(torch, model, torch.Generator().manual_seed(SEED))
    model.eval()
    rng = np.random.RandomState(SEED)
    example = torch.from_numpy(rng.randint(0, LM_VOCAB, LM_EXPORT_SHAPE).astype(np.int64))
    axes = {0: "batch", 1: "seq"}
    proto = _torch_export(
        torch,
        model,
        example,
        input_names=["tokens"],
        output_names=["logits"],
        dynamic_axes={"tokens": axes, "logits": axes},
    )
    tokens = torch.from_numpy(rng.randint(0, LM_VOCAB, LM_CHECK_SHAPE).astype(np.int64))
    with torch.no_grad():
        expected = model(tokens).numpy()
    return Built(proto, {"tokens": tokens.numpy()}, [expected])


# --------------------------------------------------------------------------- keras


def _keras_session(tf_keras: Any) -> None:
    """A fresh Keras session and seeds, and tf2onnx's name counter reset: a
    model's bytes do not depend on what was built before it in this process."""
    import tf2onnx.convert
    import tf2onnx.rewriter.loop_rewriter_base  # noqa: F401  (calls make_name when first imported)
    import tf2onnx.utils

    tf_keras.backend.clear_session()
    tf_keras.utils.set_random_seed(SEED)
    tf2onnx.utils.INTERNAL_NAME = 1


def _keras_norms_like_trained(model: Any) -> None:
    """Redraw batch-norm parameters and statistics and biases (see the module doc)."""
    rng = np.random.RandomState(SEED)
    for weight in model.weights:
        name = weight.name.split("/")[-1].split(":")[0]
        shape = tuple(weight.shape)
        if name in ("gamma",):
            value = 1 + 0.1 * rng.standard_normal(shape)
        elif name in ("beta", "moving_mean"):
            value = 0.1 * rng.standard_normal(shape)
        elif name == "moving_variance":
            value = 1 + 0.2 * rng.random_sample(shape)
        elif name == "bias":
            value = 0.02 * rng.standard_normal(shape)
        else:
            continue
        weight.assign(value.astype(np.float32))


def _keras_convert(model: Any, image: tuple[int, int, int]) -> Built:
    import tensorflow as tf
    import tf2onnx

    spec = (tf.TensorSpec((KERAS_BATCH, *image), tf.float32, name="images"),)
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=OPSET)
    images = np.random.RandomState(SEED).standard_normal((KERAS_BATCH, *image)).astype(np.float32)
    expected = model(images, training=False).numpy()
    return Built(proto, {"images": images}, [expected])


def build_keras_cnn() -> Built:
    """Small Sequential CNN, 3 x (Conv2D, BatchNormalization, ReLU, MaxPool) + 2 Dense."""
    import tf_keras

    _keras_session(tf_keras)
    layers = tf_keras.layers
    stack: list[Any] = [tf_keras.Input(KERAS_CNN_IMAGE, batch_size=KERAS_BATCH, name="images")]
    for i, channels in enumerate(KERAS_CNN_CHANNELS, start=1):
        stack += [
            layers.Conv2D(channels, 3, padding="same", use_bias=False, name=f"conv{i}"),
            layers.BatchNormalization(name=f"bn{i}"),
            layers.ReLU(name=f"relu{i}"),
            layers.MaxPooling2D(name=f"pool{i}"),
        ]
    stack += [
        layers.Flatten(name="flatten"),
        layers.Dense(KERAS_CNN_DENSE, activation="relu", name="fc1"),
        layers.Dense(KERAS_CNN_CLASSES, name="logits"),
    ]
    model = tf_keras.Sequential(stack, name="keras_cnn")
    _keras_norms_like_trained(model)
    return _keras_convert(model, KERAS_CNN_IMAGE)


def _keras_application(application: str, image: tuple[int, int, int]) -> Built:
    import tf_keras

    _keras_session(tf_keras)
    model = getattr(tf_keras.applications, application)(
        weights=None, input_shape=image, classes=KERAS_CLASSES, classifier_activation=None
    )
    _keras_norms_like_trained(model)
    return _keras_convert(model, image)


def build_keras_resnet50() -> Built:
    """tf_keras ResNet50 (weights=None), batch 32, 224x224x3, 1000 classes."""
    return _keras_application("ResNet50", (224, 224, 3))


def build_keras_inception_v3() -> Built:
    """tf_keras InceptionV3 (weights=None), batch 32, 299x299x3, 1000 classes."""
    return _keras_application("InceptionV3", (299, 299, 3))


_TORCH = ("torch",)
_KERAS = ("tensorflow", "tf_keras", "tf2onnx")

MODELS: dict[str, Spec] = {
    "torch_resnet": Spec(build_torch_resnet, _TORCH, external=False),
    "torch_transformer": Spec(
        build_torch_transformer, _TORCH, external=False, batch_size=8, dims={"seq": LM_CHECK_SHAPE[1]}
    ),
    "keras_cnn": Spec(build_keras_cnn, _KERAS, external=False),
    "keras_resnet50": Spec(build_keras_resnet50, _KERAS, external=True),
    "keras_inception_v3": Spec(build_keras_inception_v3, _KERAS, external=True),
}


# --------------------------------------------------------------------------- writing and checking


def data_name(name: str) -> str:
    """The external data file of ``<name>.onnx`` (in the same directory)."""
    return f"{name}.onnx.data"


def save(model: Any, out: Path, name: str, external: bool) -> Path:
    """Write ``<name>.onnx`` (and its external data) into ``out`` atomically."""
    import onnx

    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.onnx"
    # A fresh directory: onnx appends to an existing external data file.
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=out))
    try:
        if external:
            onnx.save_model(
                model,
                str(tmp / path.name),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=data_name(name),
                size_threshold=1024,
            )
            os.chmod(tmp / data_name(name), 0o644)  # onnx creates it 0600
            os.replace(tmp / data_name(name), out / data_name(name))
        else:
            (tmp / path.name).write_bytes(model.SerializeToString(deterministic=True))
        os.chmod(tmp / path.name, 0o644)
        os.replace(tmp / path.name, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def check(path: Path, spec: Spec, built: Built) -> dict[str, Any]:
    """onnx.checker, onnxruntime against the framework, read_onnx; returns facts for the log."""
    import onnx
    import onnxruntime as ort

    from baechi_cli.io.onnx import read_onnx

    onnx.checker.check_model(str(path), full_check=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, built.feeds)
    worst = 0.0
    for out, (value, want) in enumerate(zip(got, built.expected, strict=True)):
        if value.shape != want.shape:
            raise AssertionError(f"{path.name}: output {out} has shape {value.shape}, expected {want.shape}")
        scale = max(1.0, float(np.abs(want).max()))
        diff = float(np.abs(value - want).max())
        if not diff <= TOLERANCE * scale:
            raise AssertionError(f"{path.name}: output {out} differs by {diff:.3g} (scale {scale:.3g})")
        worst = max(worst, diff / scale)
    graph = read_onnx(str(path), batch_size=spec.batch_size, dims=spec.dims)
    model = onnx.load_model(str(path), load_external_data=False)
    return {
        "nodes": len(model.graph.node),
        "ops": graph.num_ops,
        "op_types": Counter(n.op_type for n in model.graph.node),
        "max_rel_diff": worst,
    }


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _missing(spec: Spec) -> list[str]:
    return [m for m in spec.modules if importlib.util.find_spec(m) is None]


def _install_hint(missing: list[str]) -> str:
    if "torch" in missing:
        return f"torch is not a dependency of baechi; install it with: {TORCH_INSTALL}"
    return "install the dev extra: pip install -e '.[dev]'"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(HERE), help="output directory (testdata/)")
    parser.add_argument(
        "--only",
        action="append",
        choices=list(MODELS),
        metavar="NAME",
        help=f"build only NAME (repeatable): {', '.join(MODELS)}",
    )
    args = parser.parse_args(argv)
    names = [name for name in MODELS if not args.only or name in args.only]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out = Path(args.out)

    skipped = []
    for name in names:
        missing = _missing(MODELS[name])
        if missing:
            skipped.append(name)
            print(
                f"{name}: skipped (the committed file is kept), needs {', '.join(missing)}; "
                + _install_hint(missing),
                file=sys.stderr,
            )
    if skipped and args.only:
        return 2  # asked for by name: not building it is a failure
    for dist, want in VERSIONS.items():
        have = _version(dist)
        if have is not None and have.split("+")[0] != want:
            print(
                f"note: {dist} {have} is installed, the committed models were made with {want}: "
                "expect different bytes",
                file=sys.stderr,
            )

    for name in names:
        if name in skipped:
            continue
        spec = MODELS[name]
        start = time.perf_counter()
        built = spec.builder()
        path = save(built.model, out, name, spec.external)
        facts = check(path, spec, built)
        seconds = time.perf_counter() - start
        size = path.stat().st_size
        data = out / data_name(name)
        weights = f" + {data.stat().st_size:,} bytes external ({data.name})" if spec.external else ""
        types = ", ".join(f"{t} {n}" for t, n in facts["op_types"].most_common())
        print(
            f"{name}: {facts['nodes']} nodes, {size:,} bytes{weights}, {seconds:.1f} s, "
            f"onnxruntime max rel diff {facts['max_rel_diff']:.2g} -> {path}\n  {types}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
