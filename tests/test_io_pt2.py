"""The torch.export reader: real programs saved by torch, their training step traced by autograd,
and bad input (one line, exit 2, nothing written; nothing in the file runs)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import zipfile

import pytest
from click.testing import CliRunner

from baechi_cli.cli.commands import main
from baechi_cli.io.pt2 import read_program, read_pt2_with_notes

torch = pytest.importorskip("torch")
nn = torch.nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.out = nn.Linear(32, 16)

    def forward(self, x):
        return self.out(nn.functional.silu(self.norm(self.fc(x))))


def save(tmp_path, model=None, x=None, dynamic=False, name="block.pt2") -> str:
    model = model or Block()
    x = torch.randn(4, 16) if x is None else x
    shapes = {"x": {0: torch.export.Dim("batch", min=2)}} if dynamic else None
    program = torch.export.export(model, (x,), dynamic_shapes=shapes)
    path = str(tmp_path / name)
    torch.export.save(program, path)
    return path


def place(*args: str):
    return CliRunner().invoke(main, ["place", *args], catch_exceptions=False)


def test_a_saved_program_reads_with_its_shapes_and_parameters(tmp_path):
    g = read_pt2_with_notes(save(tmp_path)).graph
    index = g.index()
    assert g.op_types[index["x"]] == "Input" and g.output_shapes[index["x"]] == [(4, 16)]
    assert g.op_types[index["linear"]] == "aten.linear"
    assert g.output_shapes[index["linear"]] == [(4, 32)] and g.output_dtypes[index["linear"]] == ["float32"]
    params = sum(p.numel() * 4 for p in Block().parameters())
    assert sum(g.persistent_bytes) == params
    assert g.attrs[index["linear"]]["_module"] == "fc"
    assert (index["x"], 0) in g.held_outputs


def test_the_in_process_program_is_the_files(tmp_path):
    from baechi_cli.io.pt2 import program_json

    program = torch.export.export(Block(), (torch.randn(4, 16),))
    in_process = read_program(program_json(program)).graph
    torch.export.save(program, str(tmp_path / "b.pt2"))
    from_file = read_pt2_with_notes(str(tmp_path / "b.pt2")).graph
    assert in_process.names == from_file.names and in_process.output_bytes == from_file.output_bytes


def test_symbolic_sizes_need_a_value(tmp_path):
    path = save(tmp_path, dynamic=True)
    result = place(path, "-d", "1x1GB")
    assert result.exit_code == 2
    assert "has symbolic size s" in result.output and "--batch-size" in result.output
    symbol = result.output.split("has symbolic size ")[1].split()[0]
    g = read_pt2_with_notes(path, batch_size=8).graph
    assert g.output_shapes[g.index()["x"]] == [(8, 16)]
    assert read_pt2_with_notes(path, dims={symbol: 3}).graph.output_shapes[0] == [(3, 16)]
    result = place(path, "-d", "1x1GB", "--dim", "nosuch=3", "--batch-size", "2")
    assert result.exit_code == 2 and "no symbolic size of that name" in result.output


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"not a zip", "not a zip file"),
        ({"other.txt": "x"}, "no models/model.json"),
        ({"m/models/model.json": "{not json"}, "is not JSON"),
        ({"m/models/model.json": json.dumps({"graph_module": {}})}, "graph is missing"),
    ],
)
def test_bad_archives_are_one_line_exit_2_and_nothing_written(tmp_path, content, problem):
    path = tmp_path / "bad.pt2"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        with zipfile.ZipFile(path, "w") as z:
            for name, text in content.items():
                z.writestr(name, text)
    report = tmp_path / "r.json"
    result = place(str(path), "-d", "1x1GB", "--report", str(report))
    assert result.exit_code == 2
    assert result.output.startswith(f"error: {path}: ") and problem in result.output
    assert len(result.output.strip().splitlines()) == 1 and not report.exists()


class _Trap:
    """Unpickling this would create a file: proof that nothing in the archive is unpickled."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def __reduce__(self):
        return (open, (self.flag, "w"))


def test_nothing_in_the_archive_is_unpickled_or_run(tmp_path):
    path = save(tmp_path)
    flag = str(tmp_path / "executed")
    trap = pickle.dumps(_Trap(flag))
    with zipfile.ZipFile(path) as z:
        entries = {i.filename: z.read(i) for i in z.infolist()}
    for name in entries:
        if name.endswith((".pt", "/weight_0")):
            entries[name] = trap
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    result = place(path, "-d", "1x1GB", "--training")
    assert result.exit_code == 0, result.output
    assert not os.path.exists(flag)


def test_a_target_outside_torch_ops_is_refused_not_called(tmp_path):
    path = save(tmp_path)
    with zipfile.ZipFile(path) as z:
        entries = {i.filename: z.read(i) for i in z.infolist()}
    name = next(n for n in entries if n.endswith("models/model.json"))
    program = json.loads(entries[name])
    program["graph_module"]["graph"]["nodes"][0]["target"] = "builtins.eval"
    entries[name] = json.dumps(program).encode()
    with zipfile.ZipFile(path, "w") as z:
        for n, data in entries.items():
            z.writestr(n, data)
    result = place(path, "-d", "1x1GB", "--training")
    assert result.exit_code == 2 and "cannot trace a node whose target is 'builtins.eval'" in result.output


def test_training_is_autograds_own_step(tmp_path):
    """The traced step: its backward ops are autograd's (silu_backward, native_layer_norm_backward),
    each tied to its forward op, and the update waits for the whole backward pass."""
    r = read_pt2_with_notes(save(tmp_path), training="adam")
    g = r.graph
    index = g.index()
    assert "aten.silu_backward" in g.op_types and "aten.native_layer_norm_backward" in g.op_types
    assert g.forward_op[index["silu_backward"]] == index["silu"]
    step = index["optimizer/step"]
    updates = [v for v in range(g.num_ops) if g.attrs[v].get("_phase") == "update"]
    assert updates and all(any(g.edge_src[e] == step for e in g.in_edges[v]) for v in updates)
    assert "training step traced by autograd" in r.notes[-1]


class TiedResidual(nn.Module):
    """An embedding tied to its head, with residual blocks: autograd sums the gradients of each
    block's input (read twice) and of the tied weight (read by two nodes)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))

    def forward(self, ids):
        h = self.embed(ids)
        for block in self.blocks:
            h = h + torch.tanh(block(h))
        return h @ self.embed.weight.t()


def test_every_op_of_the_step_is_of_a_forward_op_and_only_a_shared_weight_is_tied(tmp_path):
    """Each backward op, gradient sum and update is of a forward op (updates: their parameter's
    first reader; the optimizer barrier: the model's end), so the only weight a pipeline copies is
    the one two program nodes read, and the blocks stay apart for the pipeline to split."""
    from baechi_cli.core.devices import parse_devices
    from baechi_cli.pipeline.maxload import build_units, load_model

    path = save(tmp_path, TiedResidual(), torch.randint(0, 50, (4, 8)), name="tied.pt2")
    g = read_pt2_with_notes(path, training="sgd").graph
    backward = [v for v in range(g.num_ops) if g.is_backward[v]]
    assert backward and all(g.forward_op[v] >= 0 and not g.is_backward[g.forward_op[v]] for v in backward)
    updates = {v for v in backward if g.attrs[v].get("_phase") == "update"}
    assert len(updates) == 1 + 2 * 4  # the embedding, each block's weight and bias
    blocks = ["linear", "linear_1", "linear_2", "linear_3"]
    assert {g.attrs[g.forward_op[v]]["_source"] for v in updates} == {"embedding", *blocks}
    model = load_model(g, parse_devices("2x1GB"), replicate_tied=True)
    assert [(g.names[t.owner], [g.names[r] for r in t.readers]) for t in model.tied] == [
        ("embedding", ["t_4"])
    ]
    of = build_units(model).of_op
    sources = [g.attrs[v].get("_source") for v in range(g.num_ops)]
    assert len({of[v] for v in range(g.num_ops) if sources[v] in blocks and not g.is_backward[v]}) == 4


class TransposedWeights(nn.Module):
    """Falcon's linear layers: ``x @ self.weight.T``, the weight's view a program node of its own;
    and Gemma's norm, ``x * (1 + weight)``, a node computing on its weight alone."""

    def __init__(self) -> None:
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.randn(16, 16)) for _ in range(3))
        self.scale = nn.Parameter(torch.zeros(16))

    def forward(self, x):
        for w in self.weights:
            x = torch.tanh(x @ w.T)
        return x * (1 + self.scale)


def test_a_node_reading_weights_alone_is_grouped_with_the_node_reading_it(tmp_path):
    """Cut apart, the whole weight (or ``1 + weight``) would cross to its reader every microbatch
    and its gradient back, which the plan would count as a fraction of an activation: the reader
    keeps the node that reads weights alone in its reader's group, and the blocks stay apart."""
    path = save(tmp_path, TransposedWeights(), torch.randn(4, 16), name="transposed.pt2")
    g = read_pt2_with_notes(path, training="sgd").graph
    forward = [v for v in range(g.num_ops) if not g.is_backward[v] and "_source" in g.attrs[v]]
    group_of = {g.attrs[v]["_source"]: g.group[v] for v in forward}
    views = sorted(n for n in group_of if n.startswith("numpy_t"))
    readers = sorted(n for n in group_of if n.startswith("matmul"))
    assert len(views) == len(readers) == 3
    assert [group_of[v] for v in views] == [group_of[r] for r in readers]
    assert len({group_of[r] for r in readers}) == 3
    assert group_of["add"] == group_of["mul"] != group_of[readers[-1]]


class ConvNorm(nn.Module):
    """A convolution, a batch norm in training mode (its buffers mutated) and a pooled head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.conv(x))).mean((2, 3)))


class MaskedAttention(nn.Module):
    """Scaled-dot-product attention under a causal mask made from the input's size."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
        return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum(-1)


class DepthwiseTokens(nn.Module):
    """Tokens through a depthwise convolution and back (SegFormer's Mix-FFN): CPU's convolution
    keeps its channels-last-strided input's layout, which decides how the linear after the
    transpose back is traced."""

    def __init__(self, kernel: int = 3, rows: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 16, kernel, padding=kernel // 2, groups=16)
        self.head = nn.Linear(16, 8)
        self.rows = rows

    def forward(self, x):
        b, n, c = x.shape
        image = x.transpose(1, 2).view(b, c, self.rows, n // self.rows)
        return self.head(self.conv(image).flatten(2).transpose(1, 2))


@pytest.mark.parametrize(
    "model, x, optimizer",
    [
        (Block(), torch.randn(4, 16), "adam"),
        (DepthwiseTokens(), torch.randn(2, 64, 16), "sgd"),
        (DepthwiseTokens(7), torch.randn(2, 64, 16), "momentum"),
        (TiedResidual(), torch.randint(0, 50, (4, 8)), "sgd"),
        (ConvNorm(), torch.randn(2, 3, 8, 8), "momentum"),
        (MaskedAttention(), torch.randn(2, 6, 16), "sgd"),
    ],
    ids=[
        "block-adam",
        "depthwise-sgd",
        "depthwise7-momentum",
        "tied-sgd",
        "convnorm-momentum",
        "attention-sgd",
    ],
)
def test_the_recorded_step_is_the_one_make_fx_traces(tmp_path, model, x, optimizer):
    """The recorder (pt2_joint's fast path) traces the step make_fx traces: the same nodes, in
    order, with the same targets, arguments' producers and sizes; autograd's sequence numbers
    equal up to renumbering."""
    from torch.fx import traceback as fx_traceback

    from baechi_cli.io import pt2_joint as joint
    from baechi_cli.io.pt2 import _load_program, _Reader

    program = _load_program(save(tmp_path, model, x))
    sizes = _Reader(program, None, {}).placeholder_sizes()
    specs = joint._specs(program)
    params = [name for name, kind in specs if kind == "parameter"]

    placeholders = [name for name, _ in specs]
    state_names = joint._state_names(params, optimizer)

    def traced(tracer):
        trace = joint._Trace(
            torch, program["graph_module"]["graph"], placeholders, params, state_names, optimizer
        )
        with fx_traceback.preserve_node_meta():
            out = tracer(torch, trace, sizes)
        assert out is not None, "the recorder left this step to make_fx"
        return joint._as_program(
            torch, out, placeholders, params, state_names, trace.marks, specs, trace.sources
        )

    def summary(step):
        numbers: dict[object, int] = {}
        rows = []
        for node in step["graph_module"]["graph"]["nodes"]:
            meta = dict(node.get("metadata") or {})
            seq = meta.pop("seq_nr", None)
            rows.append(
                (
                    json.dumps({**node, "metadata": meta}, sort_keys=True),
                    numbers.setdefault(seq, len(numbers)),
                )
            )
        values = step["graph_module"]["graph"]["tensor_values"]
        return rows, json.dumps(values, sort_keys=True)

    recorded, recorded_values = summary(traced(joint._trace_recorded))
    made, made_values = summary(traced(joint._trace_with_make_fx))
    assert len(recorded) == len(made) > 20
    assert recorded == made and recorded_values == made_values


def _conv_backward_scratch(model, x) -> int:
    """Bytes torch's CPU convolution_backward allocates beyond its outputs, measured by
    torch.profiler's allocation records over one backward of ``model(x)``'s sum."""
    from torch.profiler import ProfilerActivity, profile

    y = model(x).sum()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        y.backward()
    events = list(prof.profiler.kineto_results.events())
    (conv,) = [e for e in events if e.name() == "aten::convolution_backward"]
    start, end = conv.start_ns(), conv.start_ns() + conv.duration_ns()
    level = peak = 0
    for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"):
        level += nbytes if start <= _ <= end else 0
        peak = max(peak, level)
    return peak - sum(p.grad.numel() * 4 for p in model.conv.parameters())  # x needs no gradient


@pytest.mark.parametrize(("kernel", "rows"), [(3, 8), (7, 8), (3, 2)])
def test_a_depthwise_convolutions_cpu_workspace_is_the_one_torch_allocates(tmp_path, kernel, rows):
    """A 7 x 7 depthwise convolution over a channels-last input (ConvNeXt's), or a 3 x 3 one over a
    map of fewer rows than the kernel (SegFormer's last stage at a small image): its backward's
    scratch, as the traced step charges it, is what torch's CPU kernel allocates (within 2%); a
    3 x 3 one over 8 rows allocates almost none and is charged none."""
    model = DepthwiseTokens(kernel, rows)
    x = torch.randn(4, 64, 16)
    g = read_pt2_with_notes(save(tmp_path, model, x, name=f"dw{kernel}_{rows}.pt2"), training="sgd").graph
    (backward,) = [v for v in range(g.num_ops) if g.op_types[v] == "aten.convolution_backward"]
    charged = g.attrs[backward].get("_workspace_bytes", 0)
    measured = _conv_backward_scratch(model, x)
    if (kernel, rows) == (3, 8):
        assert charged == 0 and measured < 4096
    else:
        assert charged > 0 and abs(measured - charged) <= 0.02 * charged


class TypeAs(nn.Module):
    """DeBERTa's ``type_as``: a mask cast to the dtype of a later layer's output, which the traced
    step reads for its dtype alone."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        h = self.b(torch.tanh(self.a(x)))
        return h * (x > 0).type_as(h)


def test_a_node_taking_a_tensor_for_its_dtype_alone_is_ordered_after_it(tmp_path):
    """The runtime runs ``type_as`` with the tensor it takes, so a plan must not put it before
    that tensor's node: the reader adds the edge the traced ops (a cast of the mask) lack."""
    from baechi_cli.core.graph import CONTROL_PORT

    g = read_pt2_with_notes(
        save(tmp_path, TypeAs(), torch.randn(4, 16), name="type_as.pt2"), training="sgd"
    ).graph
    forward = [v for v in range(g.num_ops) if not g.is_backward[v] and "_source" in g.attrs[v]]
    ops_of: dict[str, list[int]] = {}
    for v in forward:
        ops_of.setdefault(g.attrs[v]["_source"], []).append(v)
    (cast,) = [n for n in ops_of if n.startswith("type_as")]
    made = ops_of["linear_1"]
    into = {(s, d) for s, d, port in zip(g.edge_src, g.edge_dst, g.edge_port) if d in ops_of[cast]}
    assert any(s in made for s, _ in into)
    assert (made[-1], ops_of[cast][0]) in into and CONTROL_PORT in g.edge_port


class DepthwiseOnePixel(nn.Module):
    """ConvNeXt's last stage at a small input: a 1 x 1 map, channels-last from a permute, through a
    7 x 7 depthwise convolution. Its size-1 dimensions make it plainly contiguous too; its strides
    (and torch's choice of kernel from them) say channels-last."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(64, 64, 7, padding=3, groups=64)

    def forward(self, x):
        return self.conv(x[:, None, None, :].permute(0, 3, 1, 2)).flatten(1)


def test_a_depthwise_convolution_over_a_one_pixel_map_is_charged_the_workspace_torch_allocates(tmp_path):
    model, x = DepthwiseOnePixel(), torch.randn(4, 64)
    g = read_pt2_with_notes(save(tmp_path, model, x, name="pixel.pt2"), training="sgd").graph
    (backward,) = [v for v in range(g.num_ops) if g.op_types[v] == "aten.convolution_backward"]
    charged = g.attrs[backward].get("_workspace_bytes", 0)
    measured = _conv_backward_scratch(model, x)
    assert charged > 0 and abs(measured - charged) <= 0.02 * charged


class GatherHeld(nn.Module):
    """A linear layer's output gathered along its last axis (DeBERTa's relative positions):
    autograd's gather node saves its whole input, though its backward reads only the sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 64)

    def forward(self, x):
        index = torch.arange(8).view(1, 1, 8).expand(x.shape[0], x.shape[1], 8)
        return torch.gather(self.proj(x), -1, index)


def test_what_autograd_saves_lives_until_its_backward_runs(tmp_path):
    """The gather's input, which autograd saves though the gather's backward reads only its sizes,
    gets an edge to that backward's last op; without it the simulated peak is lower by about
    its size."""
    from baechi_cli.app.place import load
    from baechi_cli.core.devices import parse_devices
    from baechi_cli.costs.analytic import estimate_costs
    from baechi_cli.evaluator.sim import simulate
    from baechi_cli.io.formats import FORMATS
    from baechi_cli.search.candidates import PlaceOptions

    path = save(tmp_path, GatherHeld(), torch.randn(4, 32, 16))
    devices = parse_devices("1x1TB")
    g, fmt, _ = load(path, PlaceOptions(training=True, optimizer="sgd"))  # views marked
    g, _ = estimate_costs(g, devices, op_set=FORMATS[fmt].op_set)
    (gather,) = [v for v in range(g.num_ops) if g.op_types[v].endswith("gather") and not g.is_backward[v]]
    (read,) = [
        g.edge_src[e] for e in g.in_edges[gather] if g.output_bytes[g.edge_src[e]][0] == 4 * 32 * 64 * 4
    ]
    held = [e for e in g.out_edges[read] if g.is_backward[g.edge_dst[e]]]
    assert held and all(g.forward_op[g.edge_dst[e]] == gather for e in held)
    without = g.without_edges(set(held))
    peak = max(simulate(g, devices, [0] * g.num_ops).peak_bytes)
    lower = max(simulate(without, devices, [0] * g.num_ops).peak_bytes)
    assert peak - lower >= 4 * 32 * 64 * 4 * 0.9


def _read_training_in_a_fresh_process(path: str, cache: str, before: str = "", after: str = "") -> dict:
    """Read ``path``'s training step in a new interpreter with the cache in ``cache``, running
    the code ``before`` ahead of it and ``after`` it: its graph's op names and sizes, whether torch
    and torch._dynamo were imported by the end of the read, and what ``after`` printed."""
    code = (
        "import json, sys\n"
        f"{before}\n"
        "from baechi_cli.io.pt2 import read_pt2_with_notes\n"
        f"g = read_pt2_with_notes({path!r}, training='sgd').graph\n"
        "out = {'names': g.names, 'bytes': g.output_bytes, 'backward': g.is_backward,"
        " 'torch': 'torch' in sys.modules, 'dynamo': 'torch._dynamo' in sys.modules}\n"
        f"{after}\n"
        "print(json.dumps(out))\n"
    )
    env = {**os.environ, "BAECHI_CACHE_DIR": cache}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_the_step_is_traced_without_importing_dynamo_and_leaves_torch_as_it_was(tmp_path):
    """Tracing the step stands in for torch._dynamo (pt2_joint._DynamoStub): the same graph as
    with torch._dynamo imported first, and afterwards torch imports its own at the first use and
    torch.compile runs."""
    path = save(tmp_path, MaskedAttention(), torch.randn(2, 6, 16))
    after = (
        "import torch\n"
        "x = torch.randn(3, 4)\n"
        "out['compiled'] = torch.compile(lambda t: (t.sin() @ t.T).sum(), backend='eager')(x).item()\n"
        "out['eager'] = (x.sin() @ x.T).sum().item()\n"
        "out['real_disable'] = torch._dynamo.disable.__module__\n"
    )
    stubbed = _read_training_in_a_fresh_process(path, "", after=after)
    imported = _read_training_in_a_fresh_process(path, "", before="import torch._dynamo")
    assert stubbed["torch"] and not stubbed["dynamo"] and imported["dynamo"]
    assert {k: stubbed[k] for k in ("names", "bytes", "backward")} == {
        k: imported[k] for k in ("names", "bytes", "backward")
    }
    assert stubbed["real_disable"] == "torch._dynamo.decorators"
    assert stubbed["compiled"] == pytest.approx(stubbed["eager"], rel=1e-6)


def test_the_dynamo_stand_in_leaves_no_wrapper_behind():
    code = (
        "import sys, torch\n"
        "from baechi_cli.io.pt2_joint import _DynamoStub\n"
        "def f(x):\n    return x + 1\n"
        "g = torch._disable_dynamo(f)\n"
        "with _DynamoStub(torch):\n    inside = g(1)\n"
        "left = [hasattr(f, '__dynamo_disable'), 'torch._dynamo' in sys.modules]\n"
        "outside = g(1)\n"
        "print(inside, outside, *left, 'torch._dynamo' in sys.modules, f.__dynamo_disable is not f)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["2", "2", "False", "False", "True", "True"]


def test_a_training_step_read_again_comes_from_the_cache_without_torch(tmp_path):
    path, cache = save(tmp_path), str(tmp_path / "cache")
    first = _read_training_in_a_fresh_process(path, cache)
    again = _read_training_in_a_fresh_process(path, cache)
    assert first["torch"] and not again["torch"]
    assert {k: v for k, v in again.items() if k != "torch"} == {
        k: v for k, v in first.items() if k != "torch"
    }
    (entry,) = os.listdir(os.path.join(cache, "pt2-steps"))
    with open(os.path.join(cache, "pt2-steps", entry), "w") as f:
        f.write("{not json")  # a broken entry is traced anew
    assert _read_training_in_a_fresh_process(path, cache)["torch"]


def test_the_cache_keys_the_sizes_and_the_optimizer(tmp_path, monkeypatch):
    from baechi_cli.io.pt2_cache import cached_joint

    monkeypatch.setenv("BAECHI_CACHE_DIR", str(tmp_path))
    calls = []

    def trace(program, sizes, optimizer):
        calls.append((dict(sizes), optimizer))
        return {"graph_module": {"calls": len(calls)}}

    program = {"graph_module": {"graph": {}}}
    for sizes, optimizer in [({"x": (4, 16)}, "sgd"), ({"x": (8, 16)}, "sgd"), ({"x": (4, 16)}, "adam")]:
        cached_joint(program, sizes, optimizer, trace)
        cached_joint(program, sizes, optimizer, trace)
    assert len(calls) == 3
    monkeypatch.setenv("BAECHI_CACHE_DIR", "")  # empty: no cache
    cached_joint(program, {"x": (4, 16)}, "sgd", trace)
    assert len(calls) == 4
