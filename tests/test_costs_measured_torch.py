"""Measured costs of a PyTorch program: its traced step run op for op in torch, every op timed.

Real programs saved by ``torch.export``; the step that runs is checked against eager PyTorch's
(loss, updated weights), and the profile against ``baechi place``'s graph (every op named)."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from baechi_cli.cli.commands import main
from baechi_cli.core.errors import InputError
from baechi_cli.io.pt2 import load_program, step_program

torch = pytest.importorskip("torch")
nn = torch.nn

from baechi_cli.costs.measured_torch import measure_program  # noqa: E402
from baechi_cli.io.pt2_joint import ADAM_BETAS, ADAM_EPS, ADAM_LR, SGD_LR  # noqa: E402


class Net(nn.Module):
    """A tied embedding and head, a residual, a norm and a tensor made in the forward
    (``aten.zeros`` with its dtype and device as arguments)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(40, 16)
        self.fc = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, ids):
        h = self.embed(ids)
        h = h + torch.zeros(ids.shape[-1], 16, dtype=torch.float32) + torch.tanh(self.fc(h))
        return self.norm(h) @ self.embed.weight.t()


def _saved(tmp_path, model, args, name="net.pt2") -> str:
    path = str(tmp_path / name)
    torch.export.save(torch.export.export(model, args), path)
    return path


def _real_inputs(program, model, ids):
    """The program's placeholders bound to the model's own weights and the input."""
    weights = dict(model.named_parameters())
    out = {}
    for spec in program["graph_module"]["signature"]["input_specs"]:
        ((kind, body),) = spec.items()
        if kind == "parameter":
            out[body["arg"]["name"]] = weights[body["parameter_name"]].detach().clone()
        elif kind == "user_input":
            out[body["arg"]["as_tensor"]["name"]] = ids
    return out


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_step_that_is_timed_is_eager_pytorchs_step(tmp_path, optimizer):
    """One measured step on the model's own weights updates them as torch.optim's step does after
    eager forward and backward: what is timed is the step that trains, not a stand-in."""
    torch.manual_seed(0)
    model, ids = Net(), torch.randint(0, 40, (3, 5))
    program = load_program(_saved(tmp_path, model, (ids,)))
    given = _real_inputs(program, model, ids)
    before = {name: t.clone() for name, t in given.items()}
    measure_program(program, training=optimizer, inputs=given, warmup=0, steps=1)

    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=SGD_LR)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=ADAM_LR, betas=ADAM_BETAS, eps=ADAM_EPS, foreach=False)
    model(ids).float().pow(2).mean().backward()
    opt.step()
    names = {
        body["arg"]["name"]: body["parameter_name"]
        for spec in program["graph_module"]["signature"]["input_specs"]
        for kind, body in spec.items()
        if kind == "parameter"
    }
    weights = dict(model.named_parameters())
    for placeholder, fqn in names.items():
        torch.testing.assert_close(given[placeholder], weights[fqn].detach(), rtol=1e-5, atol=1e-6)
        assert not torch.equal(given[placeholder], before[placeholder])  # the step updated it


def test_every_node_of_the_step_is_timed_by_the_name_place_gives_its_op(tmp_path):
    from baechi_cli.io.pt2 import read_program

    program = load_program(_saved(tmp_path, Net(), (torch.randint(0, 40, (3, 5)),)))
    run = measure_program(program, training="adam", warmup=1, steps=2, threads=1)
    graph, _, _ = step_program(program, training="adam")
    nodes = [n["name"] for n in graph["nodes"]]
    assert sorted(run.ops) == sorted(nodes)
    assert all(m.compute_us > 0 for m in run.ops.values())
    assert run.ops["zeros"].kernel == "aten.zeros.default"
    assert set(nodes) <= set(read_program(program, training="adam").graph.names)
    assert run.threads == 1 and run.torch == torch.__version__ and torch.get_num_threads() != 0


def test_an_unknown_input_is_refused(tmp_path):
    program = load_program(_saved(tmp_path, Net(), (torch.randint(0, 40, (3, 5)),)))
    with pytest.raises(InputError, match="'nope' is not an input"):
        measure_program(program, inputs={"nope": torch.zeros(1)}, steps=1)


def _cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_a_measured_training_profile_is_placed_and_another_step_is_refused(tmp_path):
    path = _saved(tmp_path, Net(), (torch.randint(0, 40, (3, 5)),))
    out = str(tmp_path / "step.json")
    r = _cli(
        "profile",
        path,
        "--training",
        "--optimizer",
        "adam",
        "--measure",
        "--threads",
        "1",
        "--steps",
        "2",
        "-o",
        out,
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(open(out).read())
    assert doc["model"]["training"] == "adam" and doc["model"]["format"] == "pt2"
    assert doc["measurement"]["torch"] == torch.__version__ and doc["measurement"]["threads"] == 1
    measured = [op for op in doc["ops"] if op["source"] == "measured"]
    assert len(measured) == doc["totals"]["measured_ops"] > 0
    assert "torch" in r.output and "1 thread" in r.output

    report = str(tmp_path / "report.json")
    r = _cli(
        "place",
        path,
        "--training",
        "--optimizer",
        "adam",
        "--profile",
        out,
        "-d",
        "2x1GB",
        "--report",
        report,
    )
    assert r.exit_code == 0, r.output
    counts = re.search(
        r"training: (\d+) forward ops \+ (\d+) loss \+ (\d+) backward \+ (\d+) adam updates", r.output
    )
    total = re.search(r": (\d+) ops, \d+ edges", r.output)
    assert counts and total and "traced by autograd" in r.output, r.output
    assert sum(int(c) for c in counts.groups()) == int(total.group(1))  # the step's ops, each counted once
    placed = json.loads(open(report).read())
    assert placed["costs"]["source"] == "mixed" and placed["costs"]["same_model_sha256"] is True

    again = str(tmp_path / "again.json")
    r = CliRunner().invoke(
        main, ["place", path, "--training", "--profile", out, "-d", "2x1GB", "--report", again]
    )
    assert r.exit_code == 2
    assert "the profile is of the adam training step" in r.output and "the sgd training step" in r.output
    assert not (tmp_path / "again.json").exists()


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--threads", "2"], "--threads needs --measure"),
        (["--training", "--measure", "ONNX"], "--training profiles a .pt2"),
    ],
)
def test_flags_a_profile_cannot_take_are_one_line_exit_2(tmp_path, args, problem):
    import onnx
    from onnx import TensorProto, helper

    model = str(tmp_path / "m.onnx")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])
    onnx.save(
        helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])), model
    )
    pt2 = _saved(tmp_path, Net(), (torch.randint(0, 40, (3, 5)),))
    target = model if "ONNX" in args else pt2
    r = CliRunner().invoke(main, ["profile", target, *[a for a in args if a != "ONNX"]])
    assert r.exit_code == 2, r.output
    said = [line for line in r.output.splitlines() if "rror" in line]
    assert len(said) == 1 and problem in said[0], r.output


@torch.library.custom_op("baechi_test::scratchy", mutates_args=())
def _scratchy(x: torch.Tensor) -> torch.Tensor:
    """Holds a 1 MiB buffer while it runs, as a kernel's workspace, and returns x + 1."""
    work = torch.ones(256, 1024)  # 1 MiB of float32
    return x + work.sum() * 0


@_scratchy.register_fake
def _(x):
    return torch.empty_like(x)


class Scratch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(32, 32, 3, padding=1)

    def forward(self, x):
        return torch.relu(torch.ops.baechi_test.scratchy(self.conv(x)))


def test_each_node_s_scratch_is_what_its_kernel_held_while_it_ran(tmp_path):
    """A kernel holding a 1 MiB buffer while it runs has 1 MiB of scratch, measured: beyond its
    inputs and outputs, freed before it returns. An op allocating only its output has none; a
    CPU convolution reorders its input into a blocked layout (oneDNN), which is scratch too."""
    model, x = Scratch(), torch.randn(2, 32, 16, 16)
    program = load_program(_saved(tmp_path, model, (x,), name="scratch.pt2"))
    run = measure_program(program, warmup=0, steps=1, threads=1)
    by_kernel = {m.kernel.split(".")[1]: m.temporary_bytes for m in run.ops.values()}
    assert 1 << 20 <= by_kernel["scratchy"] <= (1 << 20) + 64  # and the sum's scalar
    assert by_kernel["relu"] == 0
    if torch.backends.mkldnn.is_available():
        assert by_kernel["conv2d"] >= x.numel() * x.element_size()
