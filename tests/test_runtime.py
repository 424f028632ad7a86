"""baechi's PyTorch runtime: programs cut into stages that compute the model, and plans that train.

In one process (fast): any monotone assignment of a real model's ``torch.export`` nodes to stages,
cut by :func:`cut_program` and run stage after stage, gives the model's loss and, with a tied
weight's copies summed, every parameter's gradient; values read past the next stage are threaded;
a batch norm's running statistics are updated; a plan naming another model's nodes is refused.
On gloo ranks: a plan baechi makes for a ``.pt2`` trains under torch's schedules with gradients
equal to one process (1F1B here; every schedule and an ONNX export's module plan in the slow tier),
and ``baechi verify --torch`` says so with exit 0, and refuses bad input with exit 2.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baechi_cli.cli.commands import main
from baechi_cli.core.errors import InputError
from baechi_cli.runtime.plan import read_plan, stages_from_modules

torch = pytest.importorskip("torch")

from baechi_cli.runtime.cut import cut_program  # noqa: E402

# ------------------------------------------------------------------ models (module level: ranks import them)


class Block(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 2 * d)
        self.fc2 = torch.nn.Linear(2 * d, d)

    def forward(self, x, mask):
        return x + self.fc2(torch.relu(self.fc1(self.ln(x)))) * mask


class TiedDecoder(torch.nn.Module):
    """A mask and positions made from the input and read by every layer, a tied embedding and
    head, and the input ids read again by the last op (as an encoder-decoder's labels are)."""

    def __init__(self, vocab: int = 64, d: int = 32, layers: int = 3, seq: int = 8) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(seq, d)
        self.layers = torch.nn.ModuleList(Block(d) for _ in range(layers))
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        mask = (ids > 0).float().unsqueeze(-1)
        x = self.emb(ids) + self.pos(torch.arange(ids.shape[1]))
        for layer in self.layers:
            x = layer(x, mask)
        logits = self.head(x)
        return logits.pow(2).mean() + logits.gather(-1, ids.unsqueeze(-1)).mean()


class ConvNet(torch.nn.Module):
    """Batch norm in training mode (buffers the program mutates) and a residual."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        h = torch.relu(self.bn2(self.conv2(h)) + h)
        return self.fc(h.mean((2, 3))).pow(2).mean()


class SharedLayers(torch.nn.Module):
    """ALBERT's pattern: one layer's weights applied at every depth."""

    def __init__(self, d: int = 32, depth: int = 6) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(64, d)
        self.layer = Block(d)
        self.depth = depth

    def forward(self, ids):
        mask = (ids > 0).float().unsqueeze(-1)
        x = self.emb(ids)
        for _ in range(self.depth):
            x = self.layer(x, mask)
        return x.pow(2).mean()


class RelativeBias(torch.nn.Module):
    """BEiT's relative position bias: an index made by writing through views of one tensor
    (``rel[:, :, 0] += w - 1`` is ``select`` then ``add_``) and read after the writes, gathering
    rows of a table."""

    def __init__(self, w: int = 3, heads: int = 2) -> None:
        super().__init__()
        self.w = w
        self.table = torch.nn.Parameter(torch.randn((2 * w - 1) ** 2, heads))
        self.fc = torch.nn.Linear(w * w, w * w)

    def forward(self, x):
        w = self.w
        coords = torch.stack(torch.meshgrid(torch.arange(w), torch.arange(w), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
        rel[:, :, 0] += w - 1
        rel[:, :, 1] += w - 1
        rel[:, :, 0] *= 2 * w - 1
        bias = self.table[rel.sum(-1).view(-1)].view(w * w, w * w, -1).permute(2, 0, 1)
        return (self.fc(x) + bias).pow(2).mean()


class ChannelsLast(torch.nn.Module):
    """ConvNeXt's block: a linear over channels (NHWC), permuted back to NCHW, which leaves the
    activation channels-last for the convolution that reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.conv = torch.nn.Conv2d(8, 8, 7, padding=3, groups=8)

    def forward(self, x):
        h = self.fc(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.conv(torch.relu(h)).pow(2).mean()


def make_channels_last():
    torch.manual_seed(0)
    return ChannelsLast(), (torch.randn(4, 8, 6, 6),)


def make_relative_bias():
    torch.manual_seed(0)
    return RelativeBias(), (torch.randn(4, 2, 9, 9),)


def make_shared():
    torch.manual_seed(0)
    return SharedLayers(), (torch.randint(0, 64, (8, 8)),)


def make_decoder():
    torch.manual_seed(0)
    return TiedDecoder(), (torch.randint(0, 64, (8, 8)),)


def make_convnet():
    torch.manual_seed(0)
    return ConvNet(), (torch.randn(4, 3, 8, 8),)


def call_nodes(program) -> list[str]:
    return [n.name for n in program.graph.nodes if n.op == "call_function"]


def run_stages(cut, args):
    values = tuple(args)
    for stage in cut.stages:
        values = stage.module(*values)
    (loss,) = values
    return loss


def stage_gradients(cut) -> dict[str, torch.Tensor]:
    """Each parameter's gradient by FQN, a tied weight's copies summed."""
    grads: dict[str, torch.Tensor] = {}
    for stage in cut.stages:
        for attr, fqn in stage.parameters.items():
            g = getattr(stage.module, attr).grad
            grads[fqn] = g.clone() if fqn not in grads else grads[fqn] + g
    return grads


# ------------------------------------------------------------------ cut, in one process


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_monotone_cut_computes_the_model_and_its_gradients(data):
    model, args = make_decoder()
    program = torch.export.export(model, args)
    nodes = call_nodes(program)
    stages = data.draw(st.integers(1, 5))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(nodes)), min_size=stages - 1, max_size=stages - 1)))
    stage_of = {n: sum(i >= c for c in cuts) for i, n in enumerate(nodes)}
    cut = cut_program(program, stage_of, stages)
    assert len(cut.stages) == stages

    loss = run_stages(cut, args)
    loss.backward()
    expected = model(*args)
    expected.backward()
    assert torch.allclose(loss, expected, rtol=1e-6)
    grads = stage_gradients(cut)
    for name, p in model.named_parameters():
        if name == "emb.weight":  # the tied weight: torch.export keeps one name, head.weight
            name = "head.weight"
        assert torch.allclose(grads[name], p.grad, rtol=1e-5, atol=1e-7), name
    # every value a stage reads comes from the stage before it: stage s's inputs are stage s-1's outputs
    for before, after in zip(cut.stages, cut.stages[1:]):
        assert before.outputs == after.inputs


def test_values_read_past_the_next_stage_are_threaded_and_tied_weights_copied():
    model, args = make_decoder()
    program = torch.export.export(model, args)
    nodes = call_nodes(program)
    stage_of = {n: min(4 * i // len(nodes), 3) for i, n in enumerate(nodes)}
    cut = cut_program(program, stage_of, 4)
    threaded = {t["value"]: (t["from_stage"], t["to_stage"]) for t in cut.threaded()}
    assert "ids" in threaded and threaded["ids"][1] == 3  # the input ids, read by the last op
    assert any(v.startswith("unsqueeze") for v in threaded)  # the mask, read by every layer
    assert cut.tied == {"head.weight": [0, 3]}
    assert all("ids" in s.inputs for s in cut.stages)


def test_batch_norm_running_statistics_are_updated_by_the_stage_computing_them():
    model, args = make_convnet()
    program = torch.export.export(model, args)
    nodes = call_nodes(program)
    cut = cut_program(program, {n: int(i >= len(nodes) // 2) for i, n in enumerate(nodes)}, 2)
    run_stages(cut, args)
    model(*args)
    for stage in cut.stages:
        for name, buf in stage.module.named_buffers():
            fqn = name.replace("bn1_", "bn1.").replace("bn2_", "bn2.")
            assert torch.allclose(buf.float(), model.get_buffer(fqn).float()), fqn


def test_a_plan_for_another_model_is_refused_naming_its_nodes():
    model, args = make_convnet()
    program = torch.export.export(model, args)
    with pytest.raises(InputError, match="does not have .*another model"):
        cut_program(program, {"embedding": 0, "layer_norm_7": 1})
    with pytest.raises(InputError, match="stage 5, but there are 2 stages"):
        cut_program(program, {call_nodes(program)[0]: 5}, 2)


def test_a_node_planned_before_its_input_is_moved_and_counted():
    model, args = make_convnet()
    program = torch.export.export(model, args)
    nodes = call_nodes(program)
    stage_of = {n: 1 for n in nodes}
    stage_of[nodes[-1]] = 0  # the loss before what it reads
    cut = cut_program(program, stage_of, 2)
    assert cut.moved == [nodes[-1]]
    assert torch.allclose(run_stages(cut, args), model(*args))


def test_a_tensor_written_through_views_and_read_around_the_writes_is_cut_into_one_stage():
    """Each node its own stage: the writes through views of the relative coordinates would each
    change a copy the next stage received, and the index read after them would gather the wrong
    rows (BEiT's makespan plan). They run in one stage, with the reads between them, moved."""
    model, args = make_relative_bias()
    program = torch.export.export(model, args)
    nodes = call_nodes(program)
    cut = cut_program(program, {n: i for i, n in enumerate(nodes)}, len(nodes))
    loss = run_stages(cut, args)
    loss.backward()
    expected = model(*args)
    expected.backward()
    assert torch.allclose(loss, expected, rtol=1e-6)
    grads = stage_gradients(cut)
    for name, p in model.named_parameters():
        assert torch.allclose(grads[name], p.grad, rtol=1e-5, atol=1e-7), name
    writes = [s for s in cut.stages if any(n.startswith(("add_", "mul_", "copy_")) for n in s.nodes)]
    assert len(writes) == 1 and {"contiguous", "select", "add_", "mul_", "copy_"} <= set(writes[0].nodes)
    assert "contiguous" in cut.moved and "sum_1" not in writes[0].nodes  # read after the last write


# ------------------------------------------------------------------ plans read from reports


def _report(**pipeline):
    return {"schema": "baechi.report/v1", "pipeline": {"objective": "throughput", **pipeline}}


@pytest.mark.parametrize(
    ("report", "problem"),
    [
        ({"schema": "other"}, "not a baechi report"),
        ({"schema": "baechi.report/v1"}, "no plan the runtime builds"),
        (_report(stages=[{"device": 0}]), "no schedule"),
        (_report(stages=[{"device": 0}], schedule={"name": "1f1b", "microbatches": 2}), "names neither"),
        (
            _report(
                stages=[{"device": d} for d in (0, 1, 0, 1)],
                graph_stages={},
                schedule={"name": "zbv", "microbatches": 2},
            ),
            "not where zbv runs them",
        ),
    ],
)
def test_a_report_without_a_runnable_plan_is_refused(report, problem):
    with pytest.raises(InputError, match=problem):
        read_plan(report)


def test_stages_from_modules_begin_at_each_split_modules_first_node():
    paths = ["", "emb", "layers.0.fc", "layers.0", "layers.1.fc", "layers.1.ln", "head", ""]
    assert stages_from_modules(paths, ["layers.1", "head"]) == [0, 0, 0, 0, 1, 1, 2, 2]
    with pytest.raises(InputError, match="module 'layers.7'"):
        stages_from_modules(paths, ["layers.7"])


# ------------------------------------------------------------------ plans baechi makes, trained on gloo ranks


MODEL_FILE = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from test_runtime import make_decoder, make_convnet, make_shared, make_relative_bias, make_channels_last
    """
)


@pytest.fixture(scope="module")
def decoder_pt2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runtime")
    model, args = make_decoder()
    path = folder / "decoder.pt2"
    torch.export.save(torch.export.export(model, args), str(path))
    (folder / "models.py").write_text(MODEL_FILE.format(tests=os.path.dirname(__file__)))
    return folder


# Slow devices on a fast interconnect: splitting pays, so the plans have several stages.
DEVICES = """devices: {{count: {count}, memory: 1GiB, flops: 100M, memory_bandwidth: 100MB/s}}
interconnect: {{mode: parallel, latency: 1us, bandwidth: 100GB/s}}
"""


def _place(
    folder, schedule: str, count: int = 4, model: str = "decoder", flags: list[str] | None = None
) -> dict:
    """``baechi place MODEL.pt2 --training`` on ``count`` slow devices, into ``SCHEDULE.json``
    (``MODEL_SCHEDULE.json`` for another model than the decoder): a pipeline under ``schedule``
    with 4 microbatches, or what ``flags`` say instead."""
    report = folder / (f"{schedule}.json" if model == "decoder" else f"{model}_{schedule}.json")
    devices = folder / f"devices{count}.yaml"
    devices.write_text(DEVICES.format(count=count))
    if flags is None:
        flags = ["--objective", "throughput", "--microbatches", "4", "--schedule", schedule]
    result = CliRunner().invoke(
        main,
        ["place", str(folder / f"{model}.pt2"), "--devices", str(devices), "--training", *flags]
        + ["--report", str(report), "-q"],
    )
    assert result.exit_code == 0, result.output
    return json.loads(report.read_text())


def test_a_pt2_plan_names_the_program_nodes_it_cuts(decoder_pt2):
    report = _place(decoder_pt2, "1f1b")
    program = torch.export.load(str(decoder_pt2 / "decoder.pt2"))
    stages = report["pipeline"]["graph_stages"]
    assert set(stages) <= set(call_nodes(program))
    assert len(report["pipeline"]["stages"]) > 1, "the devices are meant to make a split pay"
    assert sorted(set(stages.values())) == list(range(len(report["pipeline"]["stages"])))


def _verify(folder, report_name: str, func: str = "make_decoder") -> tuple[int, dict]:
    out = folder / f"{report_name}.verify.json"
    out.unlink(missing_ok=True)
    result = CliRunner().invoke(
        main,
        [
            "verify",
            str(folder / f"{report_name}.json"),
            "--torch",
            f"{folder / 'models.py'}:{func}",
            "--steps",
            "2",
            "--json",
            str(out),
        ],
    )
    return result.exit_code, (json.loads(out.read_text()) if out.exists() else {"output": result.output})


def test_verify_torch_trains_a_1f1b_plan_with_gradients_equal_to_one_process(decoder_pt2):
    _place(decoder_pt2, "1f1b", 2)
    code, doc = _verify(decoder_pt2, "1f1b")
    assert code == 0, doc
    assert doc["ran"] and doc["gradients_match"] and not doc["parameters_missing"]
    assert doc["worst"]["relative_l2"] <= 1e-5
    assert doc["parameters_compared"] == sum(1 for _ in make_decoder()[0].parameters())
    assert doc["cut_by"] == "program nodes"
    assert all(r["peak_bytes"] > 0 for r in doc["per_rank"])
    _assert_peaks_near_predicted(doc)


def _assert_peaks_near_predicted(doc: dict, tolerance: float = 0.2) -> None:
    """Each rank's measured peak within ``tolerance`` of the report's (the microbatches in flight,
    their tensors' liveness, the gradients torch's schedule holds while sending them)."""
    for rank in doc["per_rank"]:
        ratio = rank["peak_bytes"] / rank["predicted_peak_bytes"]
        assert abs(ratio - 1) <= tolerance, (doc["schedule"], rank)


@pytest.mark.slow
@pytest.mark.parametrize(("schedule", "count"), [("gpipe", 4), ("1f1b", 4), ("interleaved", 2), ("zbv", 2)])
def test_verify_torch_trains_every_schedule(decoder_pt2, schedule, count):
    report = _place(decoder_pt2, schedule, count)
    assert report["pipeline"]["schedule"]["name"] == schedule
    code, doc = _verify(decoder_pt2, schedule)
    assert code == 0, doc
    assert doc["schedule"] == schedule and doc["gradients_match"]
    _assert_peaks_near_predicted(doc)


def test_the_stages_of_one_rank_share_one_copy_of_a_tied_weight(decoder_pt2):
    """zbv puts the first and the last stage on rank 0: the embedding and its tied head. The plan
    holds the weight once per device, so the rank's two stages get one Parameter (autograd sums
    both gradients into its ``.grad``), not a copy each with a gradient each."""
    from baechi_cli.runtime.stages import attribute_of, prepare, share_tied

    plan = read_plan(_place(decoder_pt2, "zbv", 2))
    model, args = make_decoder()
    cut = prepare(model, args, plan).cut
    rank0 = [s for s in range(plan.num_stages) if plan.stage_rank[s] == 0]
    ((fqn, held),) = [(f, h) for f, h in cut.tied.items() if len(set(h) & set(rank0)) > 1]

    def copies() -> set[int]:
        return {
            id(getattr(cut.stages[s].module, attribute_of(cut.stages[s].parameters, fqn)))
            for s in held
            if s in rank0
        }

    assert len(copies()) == 2
    assert share_tied(cut, rank0) and len(copies()) == 1


def test_verify_torch_refuses_a_report_for_another_model(decoder_pt2):
    _place(decoder_pt2, "1f1b")
    code, doc = _verify(decoder_pt2, "1f1b", func="make_convnet")
    assert code == 2, doc
    assert "another model" in doc["output"] and doc["output"].count("\n") == 1
    assert "misses" in doc["output"] and "lacks" in doc["output"]


def test_verify_torch_bad_function_is_one_line_exit_2(decoder_pt2, tmp_path):
    report = _place(decoder_pt2, "1f1b")
    assert report
    for spec, problem in [
        ("nofile.py:make", "no such file"),
        (f"{decoder_pt2 / 'models.py'}:nothing", "no function"),
    ]:
        result = CliRunner().invoke(main, ["verify", str(decoder_pt2 / "1f1b.json"), "--torch", spec])
        assert result.exit_code == 2 and problem in result.output and result.output.count("\n") == 1


def test_the_plan_in_other_tools_formats_lies_beside_the_report(decoder_pt2):
    """torch's schedule CSV beside the report, torchtitan's module lists and Megatron's layout in it:
    every layer in exactly one stage, in order."""
    report = _place(decoder_pt2, "zbv", 2)
    formats = report["pipeline"]["formats"]
    csv = (decoder_pt2 / "zbv.schedule.csv").read_text()
    assert (
        csv == formats["schedule_csv"] and len(csv.splitlines()) == report["pipeline"]["schedule"]["devices"]
    )
    lists = formats["torchtitan_module_fqns"]
    flat = [m for stage in lists for m in stage]
    assert len(flat) == len(set(flat)) and len(lists) == len(report["pipeline"]["stages"])
    layers = [int(m.split(".")[1]) for m in flat if m.startswith("layers.")]
    assert layers == sorted(layers) and set(layers) == {0, 1, 2}
    model = make_decoder()[0]
    for name, _ in model.named_parameters():  # every weight in a listed module (the tied one: head)
        assert name == "emb.weight" or any(name.startswith(m + ".") for m in flat), name
    layout = formats["megatron_layout"]
    assert layout is None or layout.count("|") == len(lists) - 1  # None: a stage cut inside a layer


def test_verify_torch_fails_a_plan_whose_ranks_peak_is_over_its_devices_memory(decoder_pt2):
    """The report says which devices the plan was made for; a rank whose measured peak is over
    its device's memory fails the check (exit 1), though it trained. The same plan on its own
    devices (1 GiB each) fits."""
    report = _place(decoder_pt2, "1f1b")
    code, doc = _verify(decoder_pt2, "1f1b")
    assert code == 0 and doc["within_memory"] is True
    assert all(r["fits"] and r["device"] == f"/device:GPU:{r['rank']}" for r in doc["per_rank"])
    small = min(r["peak_bytes"] for r in doc["per_rank"]) - 1
    for device in report["devices"]:
        device["memory_bytes"] = small
    (decoder_pt2 / "1f1b_small.json").write_text(json.dumps(report))
    code, doc = _verify(decoder_pt2, "1f1b_small")
    assert code == 1 and doc["ran"] and doc["gradients_match"] and doc["within_memory"] is False
    assert not any(r["fits"] for r in doc["per_rank"]) and not doc["ok"]


def test_verify_torch_runs_a_makespan_plan_op_for_op(decoder_pt2):
    """A makespan plan on the program (every node on its device) runs as runs of consecutive ops,
    each value sent straight to the runs that read it, with gradients equal to one process."""
    placed = _place(decoder_pt2, "makespan", 4, flags=["--algo", "etf"])
    assert "pipeline" not in placed and len(set(placed["graph_devices"].values())) > 1
    code, doc = _verify(decoder_pt2, "makespan")
    assert code == 0, doc
    assert doc["schedule"] == "makespan" and doc["gradients_match"] and doc["ranks"] > 1


def test_a_makespan_plan_keeps_each_nodes_backward_where_autograd_runs_it(decoder_pt2):
    """Even with forward-only placement off, every traced op of a program node (its forward ops,
    their backward and update ops) is planned on the node's device: autograd runs a node's backward
    where its forward ran, so a plan that moved it would predict a step that does not run."""
    placed = _place(decoder_pt2, "makespan_free", 4, flags=["--algo", "etf", "--no-forward-only"])
    assert placed["graph_split"] == [] and len(set(placed["graph_devices"].values())) > 1
    # the plan placed the traced step's backward and update ops too, not the forward alone
    assert len(placed["placement"]) > 2 * len(placed["graph_devices"])


def test_verify_torch_refuses_a_plan_that_splits_a_node_from_its_backward(decoder_pt2):
    """A report whose plan put some node's backward ops elsewhere (``graph_split``) ran, but not as
    placed: verify says which nodes and fails, gradients equal or not."""
    report = _place(decoder_pt2, "makespan", 4, flags=["--algo", "etf"])
    node = sorted(report["graph_devices"])[0]
    report["graph_split"] = [node]
    (decoder_pt2 / "makespan_split.json").write_text(json.dumps(report))
    code, doc = _verify(decoder_pt2, "makespan_split")
    assert code != 0 and doc["ran"] and doc["gradients_match"]
    assert doc["as_placed"] is False and doc["split_nodes"] == [node] and not doc["ok"]


def test_a_makespan_plan_that_splits_writes_through_views_across_devices_trains_but_not_as_placed(
    decoder_pt2,
):
    """BEiT's relative position index, its nodes dealt to two devices in turn: the writes through
    views of one tensor run on one rank, so the index gathers the rows one process does; the nodes
    moved off their device are named and the plan fails as not run as placed."""
    model, args = make_relative_bias()
    nodes = call_nodes(torch.export.export(model, args))
    report = {"schema": "baechi.report/v1", "graph_devices": {n: i % 2 for i, n in enumerate(nodes)}}
    (decoder_pt2 / "relative_makespan.json").write_text(json.dumps(report))
    code, doc = _verify(decoder_pt2, "relative_makespan", func="make_relative_bias")
    assert doc["schedule"] == "makespan" and doc["ranks"] == 2 and doc["ran"] and doc["gradients_match"]
    assert "select" in doc["displaced_nodes"] and set(doc["displaced_nodes"]) <= set(doc["moved_nodes"])
    assert code == 1 and doc["as_placed"] is False


def test_a_makespan_run_receives_a_value_with_the_strides_one_process_gives_it():
    """What a run sends keeps its strides (:func:`dense`), and gloo moves it as its view in
    :func:`dense_order`, which shares the receiving buffer's storage: the reader gets the tensor
    its kernels get in one process (a CPU convolution's path and scratch depend on the strides,
    even of a 1 x 1 map's size-1 dimensions)."""
    from baechi_cli.runtime.cut import dense, dense_order
    from baechi_cli.runtime.makespan import _wire

    model, (x,) = make_channels_last()
    h = model.fc(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).detach()
    pooled = h.mean((2, 3), keepdim=True)  # (4, 8, 1, 1), strides of a channels-last map
    for value in (h, pooled):
        assert dense(value) is value and dense_order(value.stride(), value.shape) is not None
        buffer = torch.empty_strided(value.shape, value.stride())
        wire = _wire(buffer)
        assert wire.is_contiguous() and wire.data_ptr() == buffer.data_ptr()
        wire.copy_(_wire(dense(value)))
        assert torch.equal(buffer, value) and buffer.stride() == value.stride()
    assert h.is_contiguous(memory_format=torch.channels_last) and not h.is_contiguous()
    gappy = torch.randn(4, 6)[:, ::2]
    assert dense_order(gappy.stride(), gappy.shape) is None and dense(gappy).is_contiguous()


def test_a_makespan_plan_sending_channels_last_values_trains(decoder_pt2):
    """Each node on the other device than the last: the channels-last activation and its gradient
    cross devices as NHWC views, and the gradients equal one process's."""
    model, args = make_channels_last()
    nodes = call_nodes(torch.export.export(model, args))
    report = {"schema": "baechi.report/v1", "graph_devices": {n: i % 2 for i, n in enumerate(nodes)}}
    (decoder_pt2 / "channels_last_makespan.json").write_text(json.dumps(report))
    code, doc = _verify(decoder_pt2, "channels_last_makespan", func="make_channels_last")
    assert code == 0, doc
    assert doc["ranks"] == 2 and doc["gradients_match"] and doc["as_placed"]


@pytest.fixture(scope="module")
def relative_pt2(decoder_pt2):
    model, args = make_relative_bias()
    torch.export.save(torch.export.export(model, args), str(decoder_pt2 / "relative.pt2"))
    return decoder_pt2


def test_the_reader_groups_a_tensor_written_in_place_with_the_nodes_reading_around_the_writes():
    """The traced step puts every op of the nodes that make, write and read the relative index
    before its last write in one colocation group, as the runtime cuts them: a planner that split
    them would predict stages the runtime does not run."""
    from baechi_cli.io.aliasing import write_groups
    from baechi_cli.io.pt2 import program_json, read_program
    from baechi_cli.runtime.cut import _shared_writes

    model, args = make_relative_bias()
    program = torch.export.export(model, args)
    (group,) = _shared_writes([n for n in program.graph.nodes if n.op == "call_function"])
    assert {"contiguous", "add_", "mul_"} <= set(group) and write_groups([]) == []
    graph = read_program(program_json(program), training="sgd").graph
    ops = [v for v in range(graph.num_ops) if graph.attrs[v].get("_source") in group]
    assert {graph.attrs[v]["_source"] for v in ops} == set(group) - {"getitem"}
    assert len({graph.group[v] for v in ops}) == 1


@pytest.mark.parametrize("schedule", ["1f1b", "makespan"])
def test_a_plan_baechi_makes_runs_a_tensor_written_in_place_as_placed(relative_pt2, schedule):
    """BEiT's relative index planned by baechi: its writes and the reads around them sit in one
    stage (one device), so the runtime moves nothing and verify passes as placed."""
    flags = ["--algo", "etf"] if schedule == "makespan" else None
    _place(relative_pt2, schedule, 2, model="relative", flags=flags)
    code, doc = _verify(relative_pt2, f"relative_{schedule}", func="make_relative_bias")
    assert code == 0, doc
    assert doc["as_placed"] and doc["displaced_nodes"] == [] and doc["gradients_match"]


def test_a_zbv_stage_whose_inputs_carry_no_gradient_runs_its_backward_whole(decoder_pt2):
    """The zoo ResNet's default plan: stage 0 holds only batch norm's step counters, so the stem
    convolution's stage receives the image, which carries no gradient. torch's split backward finds
    a weight's gradient only where its path meets a received gradient's, so it would leave the
    convolution's weight none; baechi compares the split with the whole backward on microbatch 0 and
    runs that stage's backward whole."""
    model, args = make_convnet()
    nodes = call_nodes(torch.export.export(model, args))
    stage_of = {n: 0 if n.startswith("add_") else 1 for n in nodes}
    stage_of.update({n: 2 for n in nodes[nodes.index("conv2d_1") :]})
    stage_of.update({n: 3 for n in nodes[nodes.index("mean") :]})
    report = _report(
        stages=[{"device": d} for d in (0, 1, 1, 0)],
        graph_stages=stage_of,
        schedule={"name": "zbv", "microbatches": 4},
    )
    (decoder_pt2 / "stem_zbv.json").write_text(json.dumps(report))
    code, doc = _verify(decoder_pt2, "stem_zbv", func="make_convnet")
    assert code == 0, doc
    assert doc["schedule"] == "zbv" and doc["gradients_match"] and doc["whole_backward"] == [1]


def test_a_model_torch_export_refuses_is_one_line_exit_2(decoder_pt2):
    """Data-dependent control flow: torch.export's reason, one line, exit 2, nothing written."""
    _place(decoder_pt2, "1f1b", 2)
    (decoder_pt2 / "branchy.py").write_text(
        textwrap.dedent(
            """
            import torch

            class Branchy(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = torch.nn.Linear(8, 8)

                def forward(self, ids):
                    x = self.fc(ids.float())
                    if x.sum() > 0:  # data-dependent: torch.export cannot trace it
                        x = x * 2
                    return x.pow(2).mean()

            def make():
                return Branchy(), (torch.ones(8, 8, dtype=torch.long),)
            """
        )
    )
    out = decoder_pt2 / "branchy.verify.json"
    result = CliRunner().invoke(
        main,
        [
            "verify",
            str(decoder_pt2 / "1f1b.json"),
            "--torch",
            f"{decoder_pt2 / 'branchy.py'}:make",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 2, result.output
    assert "torch.export cannot export the model" in result.output and result.output.count("\n") == 1
    assert not out.exists()


@pytest.mark.slow
def test_a_zbv_stage_whose_backward_torch_cannot_split_runs_it_whole(decoder_pt2):
    """One layer's weights read at every depth: torch's split of a zero-bubble stage's backward
    fails on it, so baechi finds that out on microbatch 0 and runs that stage's backward whole."""
    model, args = make_shared()
    torch.export.save(torch.export.export(model, args), str(decoder_pt2 / "shared.pt2"))
    _place(decoder_pt2, "zbv", 2, model="shared")
    code, doc = _verify(decoder_pt2, "shared_zbv", func="make_shared")
    assert code == 0, doc
    assert doc["schedule"] == "zbv" and doc["gradients_match"] and doc["whole_backward"]


# ------------------------------------------------------------------ in process (app.inprocess)


def _in_process_options(schedule: str = "1f1b"):
    from baechi_cli.search.candidates import PlaceOptions

    return PlaceOptions(training=True, objective="throughput", microbatches=4, schedule=schedule)


def test_a_module_placed_in_process_gets_the_plan_of_its_saved_program(decoder_pt2):
    """place_module exports the model itself: the plan is the one `baechi place` makes of the
    saved .pt2 (the same program nodes on the same stages, the same predictions)."""
    from baechi_cli.app.inprocess import place_module
    from baechi_cli.core.devices import parse_devices

    saved = _place(decoder_pt2, "1f1b", 2)
    model, args = make_decoder()
    devices = parse_devices(str(decoder_pt2 / "devices2.yaml"))
    report = place_module(model, args, devices, _in_process_options())
    assert report["input"]["format"] == "pt2" and report["input"]["path"] == "<TiedDecoder>"
    assert report["pipeline"]["graph_stages"] == saved["pipeline"]["graph_stages"]
    assert report["pipeline"]["schedule"]["minibatch_us"] == saved["pipeline"]["schedule"]["minibatch_us"]
    assert report["pipeline"]["schedule"]["peak_bytes"] == saved["pipeline"]["schedule"]["peak_bytes"]
    # what the runtime reads of it: the in-process plan trains
    from baechi_cli.runtime.launch import verify_torch

    result = verify_torch(model, args, report, steps=1)
    assert result["ran"] and result["gradients_match"], result["error"]


def test_a_module_torch_cannot_export_is_refused_in_process_in_one_line():
    from baechi_cli.app.inprocess import place_module
    from baechi_cli.core.devices import parse_devices

    class Branchy(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: torch.export cannot trace it
                x = x * 2
            return x.pow(2).mean()

    with pytest.raises(InputError) as err:
        place_module(Branchy(), (torch.randn(8),), parse_devices("2x1GB"), _in_process_options())
    assert "torch.export cannot export the model" in str(err.value) and "\n" not in str(err.value)


class DoubledConvNet(ConvNet):
    """ConvNet's loss times two: from the same weights, every gradient exactly twice ConvNet's."""

    def forward(self, x):
        return 2 * super().forward(x)


def test_a_run_following_the_reference_takes_each_step_from_its_weights():
    """With ``follow``, a run updates by the followed run's gradients, so each step's gradients
    are computed from the same weights (here: exactly twice the reference's, at every step);
    updating by its own would put step 2 on other weights."""
    from baechi_cli.runtime.launch import _reference

    model, (x,) = make_convnet()
    microbatches = [(x[:2],), (x[2:],)]
    reference = _reference(model, microbatches, 3)
    doubled = DoubledConvNet()
    doubled.load_state_dict(model.state_dict())
    followed = _reference(doubled, microbatches, 3, follow=reference)
    own = _reference(doubled, microbatches, 3)
    for step in range(3):
        for name, g in reference["grads"][step].items():
            assert torch.equal(followed["grads"][step][name], 2 * g)
    assert not torch.equal(own["grads"][1]["fc.weight"], 2 * reference["grads"][1]["fc.weight"])


def test_fp32_noise_is_measured_against_float64():
    """Each gradient's rounding in float32, against the same steps in float64: small, not zero,
    for every parameter; a model in other floats gets none (its float64 run would not be it)."""
    from baechi_cli.runtime.launch import RTOL, _float64_run, _noise, _reference

    model, (x,) = make_convnet()
    microbatches = [(x[:2],), (x[2:],)]
    reference = _reference(model, microbatches, 2)
    noise = _noise(_float64_run(model, microbatches, 2, reference), reference)
    assert set(noise) == set(reference["grads"][0])
    assert all(0 < v < RTOL for v in noise.values()), noise
    assert model.conv1.weight.dtype == torch.float32  # the caller's model is left as it was
    assert _float64_run(make_convnet()[0].half(), microbatches, 1, reference) == {"grads": []}


class Scaled(torch.nn.Module):
    """A linear layer whose loss is ``scale`` times its output's mean square: large gradients."""

    def __init__(self, scale: float):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 8)
        self.scale = scale

    def forward(self, x):
        return self.scale * self.fc(x).pow(2).mean()


def test_a_step_is_clipped_to_a_global_gradient_norm_and_a_non_finite_loss_is_refused():
    """Unclipped, SGD at 0.01 on gradients of norm ~1e6 blows the loss up (2.5e6 to 1.8e16 in one
    step, here); each step's rate
    is cut so the update's norm is at most LR * CLIP_NORM, the losses stay finite, and a rank
    updates at the reference's rate. A reference whose loss or gradient is not finite is refused:
    inf - inf would match any run."""
    import math

    import baechi_cli.runtime.launch as launch

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 100
    microbatches = [(x[:2],), (x[2:],)]
    run = launch._reference(Scaled(1e3), microbatches, 3)
    assert all(math.isfinite(v) for v in run["losses"]) and run["losses"][2] < run["losses"][0]
    for grads, lr in zip(run["grads"], run["lr"]):
        norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))
        assert norm > launch.CLIP_NORM and lr * norm == pytest.approx(launch.LR * launch.CLIP_NORM)
    launch._check_finite(run)
    followed = launch._reference(Scaled(1e3), microbatches, 3, follow=run)
    assert followed["lr"] == run["lr"] and followed["losses"] == run["losses"]

    bad = {"losses": [1.0, math.inf], "grads": run["grads"][:2]}
    with pytest.raises(InputError, match="the loss is not finite at step 2"):
        launch._check_finite(bad)
    nan = {"losses": [1.0], "grads": [{"fc.weight": torch.full((2,), math.nan)}]}
    with pytest.raises(InputError, match="the gradient of fc.weight is not finite at step 1"):
        launch._check_finite(nan)
    inf = torch.full((2,), math.inf)
    assert launch._relative_l2(inf, inf) == math.inf  # no difference is computed: none agrees
