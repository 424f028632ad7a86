"""When no placement fits, the one-line error (exit 3) names what does not fit and what would fit it:
the op (or group, or pair) that needs more than any device, its bytes and the smallest device that
holds it, fewer tokens for a loss over a vocabulary; else the model's one-device peak against the
devices' total. Every placer that respects memory, and auto, say the same. Run through the CLI on
committed graphs and on small ONNX models written here."""

from __future__ import annotations

import pathlib
import random
import re

import pytest
from click.testing import CliRunner

from baechi_cli.app.place import PlaceOptions, prepare, prepare_graph, run_candidate
from baechi_cli.cli.commands import main
from baechi_cli.core.devices import parse_devices
from baechi_cli.core.errors import EXIT_INFEASIBLE, InfeasibleError
from baechi_cli.core.graph import GraphBuilder
from baechi_cli.evaluator.evaluate import evaluate
from baechi_cli.evaluator.placement import Placement
from baechi_cli.placers import get as get_placer
from baechi_cli.placers.memory import VOCABULARY_DIM, op_need, size_at_least
from baechi_cli.search.candidates import choose

TESTDATA = pathlib.Path(__file__).parents[1] / "testdata"
CNN = str(TESTDATA / "cnn.pb")
ALGOS = ["auto", "etf", "topo", "sct"]
# cnn.pb's first ReLU gradient reads the 4,194,304-byte gradient and the ReLU's output of the same
# size and writes a third: 3 x 4194304 bytes while it runs, more than the sum of any other op's.
RELU_GRAD = "gradients/conv0/Relu_grad/ReluGrad"
RELU_GRAD_BYTES = 3 * 4194304


def place(args: list[str]) -> tuple[int, str]:
    """Exit code and stderr of ``baechi place ARGS``."""
    result = CliRunner().invoke(main, ["place", *args])
    return result.exit_code, result.stderr


def lm_head_model(path: pathlib.Path, vocab: int, hidden: int = 8) -> str:
    """An ONNX model ``x[tokens, hidden] -> MatMul -> MatMul to [tokens, vocab] -> Softmax``: a language
    model's head, its token count a symbolic dim (``--batch-size`` binds it)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper, save

    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="layer"),
        helper.make_node("MatMul", ["h", "wo"], ["logits"], name="lm_head"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "lm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["tokens", hidden])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["tokens", vocab])],
        [
            numpy_helper.from_array(np.zeros((hidden, hidden), np.float32), "w1"),
            numpy_helper.from_array(np.zeros((hidden, vocab), np.float32), "wo"),
        ],
    )
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


# --- one op too big for any device ------------------------------------------------------------


def test_every_placer_names_the_op_that_fits_no_device_and_the_size_that_would():
    messages = set()
    for algo in ALGOS:
        code, stderr = place([CNN, "-d", "2x10MB", "--algo", algo])
        assert code == EXIT_INFEASIBLE, (algo, stderr)
        assert stderr.count("\n") == 1 and stderr.startswith("error: ")
        assert f"'{RELU_GRAD}' needs at least 12.58 MB ({RELU_GRAD_BYTES} bytes) on one device" in stderr
        assert "its 2 inputs 8.39 MB" in stderr
        assert "devices give 10.00 MB (10000000 bytes) on the largest one" in stderr
        assert stderr.rstrip().endswith("to fit, use devices of at least 12.6MB (one device must hold it)")
        assert "found no placement" not in stderr and "tokens" not in stderr  # a convolution's gradient
        messages.add(stderr)
    assert len(messages) == 1  # auto and each placer say the same


def test_the_suggested_size_holds_the_op():
    # At the size the error suggests the op fits its device; what is left is the whole model.
    code, stderr = place([CNN, "-d", "2x12.6MB", "--algo", "etf"])
    assert code == EXIT_INFEASIBLE and "the model does not fit: '" not in stderr
    assert (
        f"no op alone needs more than the largest device ('{RELU_GRAD}' needs the most, 12.58 MB)" in stderr
    )


@pytest.mark.parametrize("algo", ALGOS)
def test_a_loss_over_a_vocabulary_suggests_fewer_tokens(tmp_path, algo):
    model = lm_head_model(tmp_path / "lm.onnx", vocab=32000)
    code, stderr = place([model, "--training", "--batch-size", "16", "-d", "2x8MB", "--algo", algo])
    assert code == EXIT_INFEASIBLE and stderr.count("\n") == 1
    # the loss holds the 16 x 32,000 float32 logits (2,048,000 bytes), its output and 3 temporaries alike
    assert "'loss/softmax' needs at least 10.24 MB (10240000 bytes) on one device while it runs" in stderr
    assert "its outputs and temporaries 8.19 MB, its largest input 2.05 MB" in stderr
    assert stderr.rstrip().endswith(
        "to fit, use devices of at least 10.3MB (one device must hold it); or fewer tokens per "
        "microbatch (--batch-size / --microbatches): it is a loss over a last dim of 32,000"
    )


def test_either_suggestion_makes_the_loss_fit(tmp_path):
    model = lm_head_model(tmp_path / "lm.onnx", vocab=32000)
    assert place([model, "--training", "--batch-size", "4", "-d", "2x8MB"])[0] == 0
    assert place([model, "--training", "--batch-size", "16", "-d", "2x10.3MB"])[0] == 0


def test_a_softmax_over_a_narrow_last_dim_gets_no_token_advice(tmp_path):
    # 1,000 classes is an image classifier's softmax, not a vocabulary: more tokens are not the cause.
    model = lm_head_model(tmp_path / "classes.onnx", vocab=1000)
    code, stderr = place([model, "--training", "--batch-size", "512", "-d", "2x8MB"])
    assert code == EXIT_INFEASIBLE and "'loss/softmax' needs at least" in stderr
    assert "tokens" not in stderr and "devices of at least" in stderr
    assert VOCABULARY_DIM > 1000


def test_weights_that_fit_no_device_name_the_group_and_the_sizes():
    code, stderr = place([CNN, "-d", "4x1MB"])
    assert code == EXIT_INFEASIBLE
    assert "(colocation group of 'dense0/kernel')" in stderr and "for weights alone" in stderr
    assert stderr.rstrip().endswith("to fit, use devices of at least 6.3MB each, 7.45MB in all")
    # the largest group fits one 6.5 MB device, all the weights do not
    code, stderr = place([CNN, "-d", "1x6.5MB"])
    assert code == EXIT_INFEASIBLE
    assert stderr.rstrip().endswith("to fit, use more or larger devices, 7.45MB in all")


# --- no op too big, the model is ------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["etf", "topo", "sct"])
def test_when_no_op_is_too_big_the_error_gives_the_total(algo):
    code, stderr = place([CNN, "-d", "2x13MB", "--algo", algo])
    assert code == EXIT_INFEASIBLE and stderr.count("\n") == 1
    assert re.search(r"found no placement that fits: /device:GPU:\d peaks at ", stderr), stderr
    assert (
        f"no op alone needs more than the largest device ('{RELU_GRAD}' needs the most, 12.58 MB)" in stderr
    )
    peak = re.search(
        r"the whole model peaks at [\d.]+ MB \((\d+) bytes\) on one device, against 26.00 MB", stderr
    )
    assert peak is not None, stderr
    single = prepare(CNN, parse_devices("1x1TB"), PlaceOptions(algo="single"), lambda s: None).single_device
    assert single is not None and int(peak.group(1)) == max(single.peak_bytes)
    assert stderr.rstrip().endswith("on the 2 devices together: to fit, use more or larger devices")


def forward_backward(layers: int, nbytes: int) -> GraphBuilder:
    """``layers`` forward ops, each output kept until its backward op reads it: every output is live
    at once at the turn, while each op reads one or two tensors."""
    b = GraphBuilder()
    forward = [b.add_op(f"f{i}", "F", [nbytes], compute_us=10) for i in range(layers)]
    for u, v in zip(forward, forward[1:]):
        b.add_edge(u, v)
    grad = forward[-1]
    for i in reversed(range(layers)):
        g = b.add_op(f"b{i}", "B", [nbytes], compute_us=10, is_backward=True, forward_op=forward[i])
        b.add_edge(grad, g)
        if forward[i] != grad:
            b.add_edge(forward[i], g)
        grad = g
    return b


def test_a_model_bigger_than_all_devices_together_says_so():
    graph = forward_backward(10, 1000).build()
    devices = parse_devices("2x3500B")  # every op fits one device (at most 3,000 B), the model 10 KB does not
    assert op_need(graph).total <= 3000
    prepared = prepare_graph(graph, devices, PlaceOptions(algo="etf"))
    candidates = [
        run_candidate(prepared, get_placer(name), PlaceOptions(algo=name)) for name in ("topo", "etf", "sct")
    ]
    with pytest.raises(InfeasibleError) as info:
        choose(candidates)
    message = str(info.value)
    assert "found no placement that fits" in message
    assert re.search(
        r"peaks at [\d.]+ KB \(\d+ bytes\) on one device, more than 7.00 KB \(7000 bytes\) on the 2 devices",
        message,
    )
    assert all("more than 7.00 KB" in str(c.error) for c in candidates)


def test_a_one_device_run_keeps_its_own_message():
    code, stderr = place([CNN, "-d", "2x10MB", "--algo", "single"])
    assert code == EXIT_INFEASIBLE and "the model does not fit one device: /device:GPU:0 peaks at" in stderr
    assert "to fit" not in stderr


# --- the per-op need is a lower bound of the evaluator's peak -----------------------------------------


def test_an_op_of_positive_time_counts_every_input_and_a_0_us_one_the_largest():
    for compute_us, counted in ((5.0, 300 + 200), (0.0, 300)):
        b = GraphBuilder()
        x, y = b.add_op("x", "X", [300], compute_us=1), b.add_op("y", "Y", [200], compute_us=1)
        z = b.add_op("z", "Add", [50], compute_us=compute_us, temporary_bytes=7)
        b.add_edge(x, z)
        b.add_edge(y, z)
        b.add_edge(x, z)  # the same tensor twice counts once
        need = op_need(b.build())
        assert (need.op, need.own, need.inputs, need.total) == (z, 57, counted, 57 + counted)


@pytest.mark.parametrize(
    "model, options",
    [
        (CNN, PlaceOptions()),
        (str(TESTDATA / "torch_resnet.onnx"), PlaceOptions(training=True, optimizer="adam")),
        (str(TESTDATA / "workloads" / "throughput_OperatorGraphs_bert_l-3_training.json"), PlaceOptions()),
    ],
)
def test_no_placement_holds_the_neediest_op_in_less(model, options):
    prepared = prepare(model, parse_devices("3x1TB"), options, lambda s: None)
    graph, need = prepared.graph, op_need(prepared.graph)
    rng = random.Random(0)
    for trial in range(8):
        side = {g: rng.randrange(3) for g in set(graph.group)}
        placement = Placement([side[g] if trial else 0 for g in graph.group])
        peaks = evaluate(graph, prepared.devices, placement).timeline.peak_bytes
        assert peaks[placement.device_of[need.op]] >= need.total


def test_sizes_round_up_to_three_digits():
    assert size_at_least(12_582_912) == "12.6MB" and size_at_least(10_240_000) == "10.3MB"
    assert size_at_least(10_000_000) == "10MB" and size_at_least(999_999_999_999) == "1TB"
    assert parse_devices(f"1x{size_at_least(12_582_912)}").devices[0].memory_bytes >= 12_582_912
