"""Pipeline stage boundaries of PyTorch exports and the ``split_spec`` that cuts there.

The pure functions (against a brute-force reading of the definition too) and
a helper-built model whose node names are what the legacy exporter writes run
everywhere; the real ones export small models with torch, build the pipeline
with ``torch.distributed.pipelining.pipeline`` on CPU (no process group) and
check that torch cuts where baechi said: the stage count, each stage's
parameters and buffers against the initializers its ops read, and the
stages run in turn give the model's output. Skipped without torch.
"""

from __future__ import annotations

import copy
import json
import warnings

import onnx
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from baechi_cli.cli.commands import main
from baechi_cli.core.devices import parse_devices
from baechi_cli.core.errors import InputError
from baechi_cli.io.onnx import onnx_node_ops, read_onnx
from baechi_cli.pipeline.torch_split import (
    BEGINNING,
    Boundary,
    graph_boundaries,
    graph_split_points,
    split_points,
    stage_boundaries,
)

# ----------------------------------------------------------------- stage_boundaries


def test_nested_modules_begin_at_their_first_op_outermost_first():
    """layer1 is a bare Sequential (no op of its own): its first block is the key; conv1 at op 0
    begins nothing (the earlier stage would be empty)."""
    paths = [
        "conv1",
        "layer1.0.conv1",
        "layer1.0.bn1",
        "layer1.0",
        "layer1.1.conv1",
        "layer1.1",
        "layer2.0.downsample.0",
        "layer2.0.conv1",
        "layer2.0",
        "fc",
    ]
    assert stage_boundaries(paths) == [
        Boundary(1, "layer1.0"),
        Boundary(2, "layer1.0.bn1"),
        Boundary(4, "layer1.1"),
        Boundary(6, "layer2.0"),
        Boundary(7, "layer2.0.conv1"),
        Boundary(9, "fc"),
    ]


def test_a_module_whose_first_op_is_a_descendants_begins_there():
    assert stage_boundaries(["stem", "blk.conv", "blk.conv", "blk", "head"]) == [
        Boundary(1, "blk"),
        Boundary(4, "head"),
    ]


def test_root_functional_ops_begin_nothing_and_stay_in_the_earlier_stage():
    """/Flatten and /Add between two modules: the next stage begins at the module after them."""
    paths = ["features.0", "features.1", "", "", "fc"]
    assert stage_boundaries(paths) == [Boundary(1, "features.1"), Boundary(4, "fc")]
    assert split_points(paths, [0, 0, 0, 0, 1]) == {"fc": BEGINNING}
    with pytest.raises(InputError, match="op '2': stage 1 cannot begin here: it is a root-level op"):
        split_points(paths, [0, 0, 1, 1, 1])


def test_a_parents_functional_op_before_a_child_stays_in_the_earlier_stage():
    paths = ["stem", "blk", "blk.mlp", "blk.mlp", "blk"]
    assert stage_boundaries(paths) == [Boundary(1, "blk"), Boundary(2, "blk.mlp")]
    assert split_points(paths, [0, 0, 1, 1, 1]) == {"blk.mlp": BEGINNING}


def test_a_module_called_twice_is_no_boundary():
    """ResNet's relu runs twice per block; torch would cut before both calls. The block qualifies."""
    paths = ["stem", "blk.conv1", "blk.relu", "blk.conv2", "blk", "blk.relu", "head"]
    assert stage_boundaries(paths) == [
        Boundary(1, "blk"),
        Boundary(3, "blk.conv2"),
        Boundary(6, "head"),
    ]
    with pytest.raises(InputError, match=r"op '2': stage 1 .*'blk.relu' begins here but is called more"):
        split_points(paths, [0, 0, 1, 1, 1, 1, 1])


def test_a_repeated_outer_module_excludes_its_inner_ones():
    """shared runs twice (with y between), and so does everything in it."""
    assert stage_boundaries(["x", "shared.a", "shared", "y", "shared.a", "shared", "z"]) == [
        Boundary(3, "y"),
        Boundary(6, "z"),
    ]


def test_modules_known_repeated_are_no_boundaries():
    """Called twice in a row: one unbroken run, so only ``repeated`` tells it (inner modules too)."""
    paths = ["x", "block.lin", "block", "block.lin", "block", "post"]
    assert stage_boundaries(paths) == [Boundary(1, "block"), Boundary(5, "post")]
    assert stage_boundaries(paths, repeated={"block"}) == [Boundary(5, "post")]
    assert stage_boundaries(paths, repeated={"block.lin"}) == [Boundary(1, "block"), Boundary(5, "post")]
    with pytest.raises(InputError, match="'block' is called more than once"):
        split_points(paths, [0, 1, 1, 1, 1, 1], repeated={"block"})


def test_an_inner_repeated_module_leaves_its_parent_a_boundary():
    paths = ["x", "blk.act", "blk.conv", "blk.act", "blk", "y"]
    assert stage_boundaries(paths) == [Boundary(1, "blk"), Boundary(2, "blk.conv"), Boundary(5, "y")]


def test_containers_with_no_op_of_their_own_are_skipped_for_an_inner_module():
    """An nn.ModuleList (blocks) is never called, so torch would not cut at it; blocks.0 is."""
    paths = ["embed", "", "blocks.0.ln", "blocks.0.attn", "blocks.0", "blocks.1.ln", "blocks.1", "head"]
    got = stage_boundaries(paths)
    assert [b.module for b in got] == ["blocks.0", "blocks.0.attn", "blocks.1", "head"]
    assert all(b.module != "blocks" for b in got)


def test_ops_with_no_path_begin_nothing_and_do_not_break_a_run():
    paths = [None, None, "a", None, "b.x", None, "b", None]
    assert stage_boundaries(paths) == [Boundary(4, "b")]  # a is the first op with a path


def test_edges():
    assert stage_boundaries([]) == []
    assert stage_boundaries([None, None]) == []
    assert stage_boundaries(["", ""]) == []
    assert stage_boundaries(["a"]) == []
    assert stage_boundaries(["a", "b"]) == [Boundary(1, "b")]
    assert stage_boundaries(["a", "a", "a"]) == []


# ----------------------------------------------------------------- split_points


def test_split_points_names_each_stage_start():
    paths = ["a", "b", "b", "c.x", "c", "d"]
    assert split_points(paths, [0, 0, 0, 0, 0, 0]) == {}
    assert split_points(paths, [0, 1, 1, 2, 2, 3]) == {"b": BEGINNING, "c": BEGINNING, "d": BEGINNING}
    assert list(split_points(paths, [0, 0, 0, 1, 1, 2])) == ["c", "d"]  # program order


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ([1, 1, 1, 1], r"op 'A': in stage 1 but must be in stage 0"),
        ([0, 2, 2, 2], r"op 'B': in stage 2 but must be in stage 0 or 1"),
        ([0, 1, 0, 0], r"op 'C': in stage 0 but must be in stage 1 or 2"),
        ([0, 1, 1, -1], r"op 'D': in stage -1 but must be in stage 1 or 2"),
        ([0, 0, 1, 1], r"op 'C': stage 1 cannot begin here: no module begins at it \(it runs in module 'b'"),
    ],
)
def test_bad_stage_lists_are_input_errors_naming_the_op(stages, message):
    with pytest.raises(InputError, match=message) as err:
        split_points(["a", "b", "b", "c"], stages, names=["A", "B", "C", "D"])
    assert err.value.op in {"A", "B", "C", "D"}


def test_stages_of_ops_with_no_path_are_ignored_within_the_stages():
    paths = [None, "a", None, "b", None]
    assert split_points(paths, [1, 0, 1, 1, 0]) == {"b": BEGINNING}  # None ops: any stage 0..1
    with pytest.raises(
        InputError, match=r"op '4': in stage 2, but the ops with a module path are in stages 0 to 1"
    ):
        split_points(paths, [0, 0, 0, 1, 2])
    with pytest.raises(InputError, match=r"op '1': in stage 1 but must be in stage 0"):
        split_points([None, "a", "b"], [0, 1, 1])  # the first op with a path is in stage 0
    with pytest.raises(InputError, match=r"op '0': in stage 1, but .* stages 0 to 0"):
        split_points([None], [1])


def test_split_points_length_mismatch_is_a_value_error():
    with pytest.raises(ValueError):
        split_points(["a", "b"], [0])
    with pytest.raises(ValueError):
        split_points(["a", "b"], [0, 0], names=["a"])


# ----------------------------------------------------------------- against the definition

_PATHS = st.lists(
    st.sampled_from([None, "", "a", "a.x", "a.y", "a.x.0", "b", "b.x", "c"]), min_size=0, max_size=12
)


def _modules(path: str) -> list[str]:
    atoms = path.split(".") if path else []
    return [".".join(atoms[:k]) for k in range(1, len(atoms) + 1)]


def _reference(paths: list[str | None], repeated: set[str]) -> list[Boundary]:
    """The module docstring's definition, read literally (quadratic)."""

    def covers(module: str, path: str | None) -> bool:
        return path is not None and (path == module or path.startswith(module + "."))

    out = []
    for i, path in enumerate(paths):
        if path is None or all(p is None for p in paths[:i]):
            continue
        for module in _modules(path):
            if any(covers(r, module) for r in repeated):
                break
            covered = [j for j, p in enumerate(paths) if covers(module, p)]
            once = all(p is None or covers(module, p) for p in paths[covered[0] : covered[-1] + 1])
            if covered[0] == i and once and module in paths:
                out.append(Boundary(i, module))
                break
    return out


@settings(max_examples=300, deadline=None)
@given(paths=_PATHS, repeated=st.sets(st.sampled_from(["a", "a.x", "b"])), data=st.data())
def test_boundaries_match_the_definition_and_split_points_accept_exactly_them(paths, repeated, data):
    got = stage_boundaries(paths, repeated)
    assert got == _reference(paths, repeated)
    # any subset of boundaries is a valid split, its modules in order
    chosen = data.draw(st.lists(st.sampled_from(got), unique=True).map(sorted) if got else st.just([]))
    stages = [sum(b.index <= i for b in chosen) for i in range(len(paths))]
    assert list(split_points(paths, stages, repeated=repeated)) == [b.module for b in chosen]
    # a stage beginning at any other op with a path is refused
    starts = {b.index for b in got}
    for i, path in enumerate(paths):
        if path is not None and i not in starts:
            with pytest.raises(InputError):
                split_points(paths, [0] * i + [1] * (len(paths) - i), repeated=repeated)


# ----------------------------------------------------------------- through the ONNX reader, no torch


def _legacy_named_model() -> onnx.ModelProto:
    """Legacy export names: a stem, blocks.0 starting with shape arithmetic (Constant, Shape, Gather),
    an act module called twice in a row (act, act_1), an exporter-made node and a head."""
    F = TensorProto.FLOAT
    inits = [
        helper.make_tensor(name, F, [2, 2], [1.0, 0.0, 0.0, 1.0])
        for name in ("stem.weight", "blocks.0.fc.weight", "head.weight")
    ]
    one = helper.make_tensor("one", TensorProto.INT64, [], [1])
    nodes = [
        helper.make_node("MatMul", ["x", "stem.weight"], ["s"], name="/stem/MatMul"),
        helper.make_node("Constant", [], ["k"], name="/blocks.0/Constant", value=one),
        helper.make_node("Shape", ["s"], ["sh"], name="/blocks.0/Shape"),
        helper.make_node("Gather", ["sh", "k"], ["n"], name="/blocks.0/Gather"),
        helper.make_node("MatMul", ["s", "blocks.0.fc.weight"], ["f"], name="/blocks.0/fc/MatMul"),
        helper.make_node("Add", ["f", "s"], ["a"], name="/blocks.0/Add"),
        helper.make_node("Relu", ["a"], ["r1"], name="/act/Relu"),
        helper.make_node("Relu", ["r1"], ["r2"], name="/act_1/Relu"),
        helper.make_node("Identity", ["r2"], ["i"], name="Identity_0"),
        helper.make_node("MatMul", ["i", "head.weight"], ["y"], name="/head/MatMul"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F, [1, 2])],
        [
            helper.make_tensor_value_info("y", F, [1, 2]),
            helper.make_tensor_value_info("n", TensorProto.INT64, []),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_graph_boundaries_skip_shape_arithmetic_and_repeated_calls(tmp_path):
    path = str(tmp_path / "m.onnx")
    onnx.save(_legacy_named_model(), path)
    g = read_onnx(path)
    op = g.index()
    # blocks.0 begins at its first traced op (its Constant/Shape/Gather fold away in torch.export);
    # act (act, act_1: called twice) is no boundary; Identity_0 has no path
    assert graph_boundaries(g) == {op["/blocks.0/fc/MatMul"]: "blocks.0", op["/head/MatMul"]: "head"}
    assert graph_boundaries(g, num_ops=op["/head/MatMul"]) == {op["/blocks.0/fc/MatMul"]: "blocks.0"}

    stage = [0] * g.num_ops
    for v in range(op["/blocks.0/fc/MatMul"], g.num_ops):
        stage[v] = 1
    stage[op["x"]] = 7  # graph inputs are no nodes: ignored
    assert graph_split_points(g, None, stage) == {"blocks.0": BEGINNING}
    stage[op["/head/MatMul"]] = 2
    assert graph_split_points(g, None, stage) == {"blocks.0": BEGINNING, "head": BEGINNING}
    stage[op["/act/Relu"]] = stage[op["/act_1/Relu"]] = stage[op["Identity_0"]] = 2
    with pytest.raises(InputError, match=r"op '/act/Relu': stage 2 .*'act' is called more than once"):
        graph_split_points(g, None, stage)
    add = op["/blocks.0/Add"]
    with pytest.raises(
        InputError, match=r"op '/blocks.0/Add': .*it runs in module 'blocks.0', which began earlier"
    ):
        graph_split_points(g, None, [int(v >= add) for v in range(g.num_ops)])


def test_a_graph_with_no_module_paths_has_no_boundaries(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    path = str(tmp_path / "relu.onnx")
    onnx.save(model, path)
    g = read_onnx(path, batch_size=2)
    assert graph_boundaries(g) == {}
    assert graph_split_points(g, None, [0] * g.num_ops) == {}


# ----------------------------------------------------------------- real torch models


def _randomized(torch, model):
    """Random parameters and buffers (positive running variances): the legacy exporter would otherwise
    merge equal initializers (fresh LayerNorm/BatchNorm ones and zeros) into Identity copies."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name.endswith("running_var"):
                t.uniform_(0.5, 1.5)
            elif t.is_floating_point():
                t.normal_(0.0, 0.5)
    return model.eval()


def _cnn(torch):
    """A tiny ResNet: stem, layer1 (two blocks, residual Adds inside), layer2 (a block with a downsample),
    pooling and a flatten at the root, a linear classifier."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU()
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout
                else None
            )

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            y = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(y)) + identity)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.relu = nn.ReLU()
            self.layer1 = nn.Sequential(Block(8, 8, 1), Block(8, 8, 1))
            self.layer2 = nn.Sequential(Block(8, 16, 2))
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            x = self.layer2(self.layer1(self.relu(self.bn1(self.conv1(x)))))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return _randomized(torch, Net()), torch.randn(2, 3, 16, 16)


def _transformer(torch):
    """A tiny transformer: embedding plus a position parameter at the root, a ModuleList of three pre-norm
    blocks (attention hand-written in even blocks, nn.MultiheadAttention in the odd one; an MLP
    Sequential), a final LayerNorm and a head."""
    nn = torch.nn

    class Attention(nn.Module):
        def __init__(self, d: int, heads: int):
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            a = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
            return self.proj((a @ v).transpose(1, 2).reshape(b, t, d))

    class Block(nn.Module):
        def __init__(self, d: int, heads: int, mha: bool):
            super().__init__()
            self.mha = mha
            self.ln1 = nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, heads, batch_first=True) if mha else Attention(d, heads)
            self.ln2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            y = self.ln1(x)
            x = x + (self.attn(y, y, y, need_weights=False)[0] if self.mha else self.attn(y))
            return x + self.mlp(self.ln2(x))

    class Net(nn.Module):
        def __init__(self, vocab: int = 50, d: int = 16, heads: int = 2, layers: int = 3, t: int = 8):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.zeros(1, t, d))
            self.blocks = nn.ModuleList([Block(d, heads, i % 2 == 1) for i in range(layers)])
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab)

        def forward(self, ids):
            x = self.embed(ids) + self.pos
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    return _randomized(torch, Net()), torch.randint(0, 50, (2, 8))


_MODELS = {"cnn": _cnn, "transformer": _transformer}


@pytest.fixture(scope="module", params=sorted(_MODELS))
def exported(request, tmp_path_factory):
    """(torch, model, example input, graph): the model exported as docs/pipeline.md says and read back."""
    torch = pytest.importorskip("torch")
    model, x = _MODELS[request.param](torch)
    path = str(tmp_path_factory.mktemp(request.param) / "model.onnx")
    _export(torch, model, x, path)
    return torch, model, x, read_onnx(path)


def _export(torch, model, x, path: str) -> None:
    """The legacy export docs/pipeline.md describes (its deprecation warnings silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (x,),
            path,
            dynamo=False,
            opset_version=17,
            training=torch.onnx.TrainingMode.PRESERVE,
            do_constant_folding=False,
        )


def _pipe(torch, model, x, points):
    from torch.distributed.pipelining import SplitPoint, pipeline

    # pipeline() wraps the named modules' forwards in place: split a copy
    return pipeline(copy.deepcopy(model), mb_args=(x,), split_spec={m: SplitPoint.BEGINNING for m in points})


def _run_stages(torch, pipe, x):
    """Run the stage modules one by one, feeding each the values the split graph routes to it (a stage
    may read an earlier stage's output, a residual across stages, not just the previous one's).
    Returns the output and each stage's inputs."""
    env = {}
    inputs: dict[int, list] = {}
    out = None
    for node in pipe.split_gm.graph.nodes:
        args = torch.fx.node.map_arg(node.args, env.__getitem__)
        kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
        if node.op == "placeholder":
            env[node] = x
        elif node.op == "call_module":
            stage = int(node.target.rsplit("_", 1)[1])  # submod_pp_<stage>
            inputs[stage] = list(args)
            env[node] = pipe.get_stage_module(stage)(*args, **kwargs)
        elif node.op == "call_function":  # operator.getitem of a stage's tuple output
            env[node] = node.target(*args, **kwargs)
        elif node.op == "output":
            out = args[0]
        else:
            raise AssertionError(f"unexpected node {node.op} in the split graph")
    assert sorted(inputs) == list(range(pipe.num_stages))
    return out[0] if isinstance(out, tuple) and len(out) == 1 else out, inputs


def _stages_at(graph, cuts) -> list[int]:
    """Stage of each op id: a new stage at each op of ``cuts``, in program order."""
    stage = [0] * graph.num_ops
    s = 0
    for v in onnx_node_ops(graph):
        s += v in cuts
        stage[v] = s
    return stage


def _even_cuts(graph, boundaries: dict[int, str], stages: int) -> set[int]:
    """For each stage after the first, the first boundary at or after its share of the nodes."""
    order = {v: k for k, v in enumerate(onnx_node_ops(graph))}
    n = len(order)
    cuts = set()
    for k in range(1, stages):
        cuts.add(next(v for v in boundaries if order[v] >= k * n // stages and v not in cuts))
    return cuts


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning")
@pytest.mark.parametrize("stages", [2, 3, "every boundary"])
def test_torch_cuts_where_the_split_points_say(exported, stages):
    """Two and three stages spread over the ops, and a stage at every boundary at once: torch makes that
    many stages, each holding exactly the parameters and buffers its ops read in the export, and
    running them in turn gives the model's output. The CNN's root-level pooling and flatten, between
    layer2 and fc, run in the stage before fc's."""
    torch, model, x, graph = exported
    boundaries = graph_boundaries(graph)
    assert len(boundaries) >= 5
    cuts = set(boundaries) if stages == "every boundary" else _even_cuts(graph, boundaries, stages)
    stage = _stages_at(graph, cuts)
    points = graph_split_points(graph, None, stage)
    ops = onnx_node_ops(graph)
    assert list(points) == [boundaries[v] for v in ops if v in cuts]

    pipe = _pipe(torch, model, x, points)
    assert pipe.num_stages == len(cuts) + 1
    for s in range(pipe.num_stages):
        read = {i for v in ops if stage[v] == s for i in graph.attrs[v].get("_initializers", ())}
        assert set(pipe.get_stage_module(s).state_dict()) == read, f"stage {s}"
    with torch.no_grad():
        got, inputs = _run_stages(torch, pipe, x)
        torch.testing.assert_close(got, model(x))
    if list(points)[-1] == "fc":
        assert [tuple(t.shape) for t in inputs[pipe.num_stages - 1]] == [(2, 16)]  # pooled and flattened


def _torch_skips(pipe) -> dict[int, int]:
    """Per stage whose value a stage more than one later reads, in torch's split graph: the furthest."""
    source: dict = {}
    furthest: dict[int, int] = {}
    for node in pipe.split_gm.graph.nodes:
        if node.op == "placeholder":
            source[node] = 0
        elif node.op == "call_function":  # getitem of a stage's outputs
            source[node] = source[node.all_input_nodes[0]]
        elif node.op == "call_module":
            k = source[node] = int(node.target.rsplit("_", 1)[1])
            for j in (source[a] for a in node.all_input_nodes):
                if k > j + 1:
                    furthest[j] = max(furthest.get(j, k), k)
    return furthest


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning")
@pytest.mark.parametrize("stages", [2, 3, 4, "every boundary"])
def test_skips_are_the_values_torch_sends_past_a_stage(exported, stages):
    """graph_skips against torch's own split graph: the stages whose values skip one, and how far
    (cutting a block's attention from its MLP twice sends the residual past a stage)."""
    from baechi_cli.pipeline.torch_split import graph_skips

    torch, model, x, graph = exported
    boundaries = graph_boundaries(graph)
    cuts = set(boundaries) if stages == "every boundary" else _even_cuts(graph, boundaries, stages)
    stage = _stages_at(graph, cuts)
    ours: dict[int, int] = {}
    for skip in graph_skips(graph, None, stage):
        ours[skip.from_stage] = max(ours.get(skip.from_stage, 0), skip.to_stage)
    assert ours == _torch_skips(_pipe(torch, model, x, graph_split_points(graph, None, stage)))


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning")
def test_a_skipped_activation_needs_a_gradient(tmp_path):
    """In the training step, the residual that four stages send past two (the transformer cut
    inside block 1 three times) has a backward op: a skip torch cannot run under any schedule."""
    from baechi_cli.app.place import PlaceOptions, prepare
    from baechi_cli.pipeline.torch_split import graph_skips

    torch = pytest.importorskip("torch")
    model, x = _transformer(torch)
    path = str(tmp_path / "model.onnx")
    _export(torch, model, x, path)
    graph = read_onnx(path)
    stage = _stages_at(graph, _even_cuts(graph, graph_boundaries(graph), 4))
    (inference,) = graph_skips(graph, None, stage)
    training = prepare(path, parse_devices("2x16GB"), PlaceOptions(training=True), lambda s: None).graph
    stage += [0] * (training.num_ops - graph.num_ops)  # the step's own ops read no skip
    (skip,) = graph_skips(training, None, stage)
    assert not inference.needs_gradient and skip.needs_gradient
    assert (skip.op, skip.from_stage, skip.to_stage) == (inference.op, 0, 3)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning")
def test_what_torch_does_that_the_contract_rules_out(exported):
    """The rules, against torch: a module called twice (each block's relu) is cut before every call; a
    bare ModuleList (blocks) is never called and cuts nothing; a split marker right after another
    (attn's first ops are shape constants, then qkv) merges with it."""
    torch, model, x, graph = exported
    boundaries = graph_boundaries(graph)
    names = {graph.names[v]: v for v in onnx_node_ops(graph)}
    if "/fc/Gemm" in names:  # the CNN
        relu = names["/layer1/layer1.0/relu/Relu"]
        assert relu not in boundaries and "layer1.0.relu" not in boundaries.values()
        stage = _stages_at(graph, {relu})
        with pytest.raises(InputError, match="module 'layer1.0.relu' is called more than once"):
            graph_split_points(graph, None, stage)
        assert _pipe(torch, model, x, ["layer1.0.relu"]).num_stages == 3  # not 2
    else:  # the transformer
        assert "blocks" not in boundaries.values()
        assert _pipe(torch, model, x, ["blocks"]).num_stages == 1
        first = min(
            v for v in names.values() if graph.attrs[v].get("_module", "").startswith("blocks.0.attn")
        )
        assert graph.op_types[first] == "Constant"  # b, t, d = x.shape and friends
        attn = next(v for v, m in boundaries.items() if m == "blocks.0.attn")
        assert graph.attrs[attn].get("_module") == "blocks.0.attn.qkv" and attn != first
        assert _pipe(torch, model, x, ["blocks.0.attn", "blocks.0.attn.qkv"]).num_stages == 2  # not 3


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning")
def test_a_module_called_twice_in_a_row_is_told_by_its_call_suffix(tmp_path):
    """self.block(self.block(x)): one unbroken run of block's ops; the legacy names' block_1 and lin_1
    mark the second call, and torch would indeed cut twice."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(self.lin(x)) + 1

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.pre = nn.Linear(4, 4)
            self.block = Block()
            self.post = nn.Linear(4, 4)

        def forward(self, x):
            return self.post(self.block(self.block(self.pre(x))))

    model, x = _randomized(torch, Net()), torch.randn(2, 4)
    path = str(tmp_path / "m.onnx")
    _export(torch, model, x, path)
    graph = read_onnx(path)
    modules = [graph.attrs[v].get("_module") for v in onnx_node_ops(graph)]
    assert stage_boundaries(modules)[0] == Boundary(1, "block")  # the paths alone cannot tell
    assert list(graph_boundaries(graph).values()) == ["post"]
    assert _pipe(torch, model, x, ["block"]).num_stages == 3


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning")
@pytest.mark.parametrize("name", ["interleaved", "zbv"])
def test_two_stages_per_device_plans_build_in_torch(exported, tmp_path, name):
    """`place --objective throughput --microbatches 4 --schedule interleaved|zbv`: the report's split
    points make torch build the same number of stages on every device used (interleaved: up to
    two, stage s on device s % devices as ScheduleInterleaved1F1B assigns them; zbv: two, in the V
    ScheduleZBVZeroBubble assigns), the placement puts each stage's ops on that device, and the
    stages in turn compute the model's output."""
    from baechi_cli.pipeline.schedules import stage_devices

    torch, model, x, graph = exported
    onnx_path = str(tmp_path / "model.onnx")
    _export(torch, model, x, onnx_path)
    report = tmp_path / "r.json"
    args = ["place", onnx_path, "--training", "--objective", "throughput", "--microbatches", "4"]
    # Slow devices on a fast link: the tiny models split (zbv needs every stage it lays out).
    devices = tmp_path / "devices.yaml"
    devices.write_text(
        "devices: {count: 2, memory: 16GiB, flops: 1G, memory_bandwidth: 1GB/s}\n"
        "interconnect: {mode: parallel, latency: 0.1us, bandwidth: 1000GB/s}\n"
    )
    args += ["--schedule", name, "--devices", str(devices), "--report", str(report), "-q"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(report.read_text())
    schedule = doc["pipeline"]["schedule"]
    assert schedule["name"] == name and schedule["chunks_per_device"] in (
        (1, 2) if name == "interleaved" else (2,)
    )
    stages = schedule["chunks_per_device"] * schedule["devices"]
    device_of_stage = stage_devices(name, stages, schedule["devices"])
    assert [s["device"] for s in doc["pipeline"]["stages"]] == device_of_stage
    points = doc["module_map"]["pipeline"]["split_points"]
    pipe = _pipe(torch, model, x, points)
    assert pipe.num_stages == stages == len(points) + 1
    with torch.no_grad():
        got, _ = _run_stages(torch, pipe, x)
        torch.testing.assert_close(got, model(x))


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning")
def test_torch_copies_a_tied_weight_to_each_stage_that_reads_it(tmp_path):
    """GPT-2's tie (the head's weight is the embedding's): the export reads one initializer from the
    embedding and the head, which baechi lists as a weight to copy (``replicate_tied``); cut between
    them, torch's pipeline() gives both stages the weight, equal, and the stages compute the model."""
    torch = pytest.importorskip("torch")
    from baechi_cli.pipeline.maxload import load_model

    model, x = _transformer(torch)
    model.head.weight = model.embed.weight
    model = _randomized(torch, model)
    path = str(tmp_path / "tied.onnx")
    _export(torch, model, x, path)
    graph = read_onnx(path)
    (weight,) = load_model(graph, parse_devices("2x16GB"), replicate_tied=True).tied
    assert graph.attrs[weight.owner]["_module"] == "embed"
    assert [graph.attrs[r]["_module"] for r in weight.readers] == ["head"]
    assert weight.nbytes == model.embed.weight.numel() * 4

    boundaries = graph_boundaries(graph)
    stage = _stages_at(graph, _even_cuts(graph, boundaries, 2))
    assert stage[weight.owner] == 0 and stage[weight.readers[0]] == 1
    pipe = _pipe(torch, model, x, graph_split_points(graph, None, stage))
    assert pipe.num_stages == 2
    for s in range(2):  # each stage holds it (stage 0 under both names)
        state = pipe.get_stage_module(s).state_dict()
        copies = [t for t in state.values() if t.shape == model.embed.weight.shape]
        assert copies and "head.weight" in state, f"stage {s}"
        for t in copies:
            torch.testing.assert_close(t, model.embed.weight)
    with torch.no_grad():
        got, _ = _run_stages(torch, pipe, x)
        torch.testing.assert_close(got, model(x))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning")
@pytest.mark.parametrize("name", ["1f1b", "gpipe", "interleaved", "zbv"])
def test_onnx_plans_train_at_their_module_boundaries(exported, tmp_path, name):
    """A plan made on the ONNX export, run by baechi's runtime: two gloo ranks build the stages
    where the report's split points say (the model wrapped in its loss afterwards), train one step
    of four microbatches under the torch schedule the plan names (zbv included: torch passes values
    between a rank's two stages itself) and gather gradients equal to one process's."""
    from baechi_cli.runtime.launch import verify_torch

    torch, model, x, graph = exported
    onnx_path = str(tmp_path / "model.onnx")
    _export(torch, model, x, onnx_path)
    devices = tmp_path / "devices.yaml"
    devices.write_text(
        "devices: {count: 2, memory: 16GiB, flops: 1G, memory_bandwidth: 1GB/s}\n"
        "interconnect: {mode: parallel, latency: 0.1us, bandwidth: 1000GB/s}\n"
    )
    report = tmp_path / "r.json"
    args = ["place", onnx_path, "--training", "--objective", "throughput", "--microbatches", "4"]
    args += ["--schedule", name, "--devices", str(devices), "--report", str(report), "-q"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(report.read_text())
    assert len(doc["pipeline"]["stages"]) >= 2

    class WithLoss(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, batch):
            return self.inner(batch).pow(2).mean()

    batch = torch.cat([x] * 4)  # four microbatches of the exported input's size
    if batch.is_floating_point():
        batch = batch + 0.1 * torch.randn(batch.shape, generator=torch.Generator().manual_seed(3))
    outcome = verify_torch(WithLoss(copy.deepcopy(model)), (batch,), doc, steps=1)
    assert outcome["ran"], outcome["error"]
    assert outcome["gradients_match"], outcome["worst"]
    assert outcome["cut_by"] == "module boundaries" and outcome["schedule"] == name


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning")
def test_onnx_makespan_plans_run_at_their_module_boundaries(exported, tmp_path):
    """A makespan plan made on the ONNX export names modules' devices (module_map.modules): each
    node of the torch.export graph runs on its innermost placed module's device, and the step's
    gradients equal one process's."""
    from baechi_cli.runtime.launch import verify_torch

    torch, model, x, graph = exported
    onnx_path = str(tmp_path / "model.onnx")
    _export(torch, model, x, onnx_path)
    devices = tmp_path / "devices.yaml"
    devices.write_text(
        "devices: {count: 2, memory: 16GiB, flops: 1G, memory_bandwidth: 1GB/s}\n"
        "interconnect: {mode: parallel, latency: 0.1us, bandwidth: 1000GB/s}\n"
    )
    report = tmp_path / "r.json"
    args = [
        "place",
        onnx_path,
        "--training",
        "--algo",
        "etf",
        "--devices",
        str(devices),
        "--report",
        str(report),
    ]
    result = CliRunner().invoke(main, [*args, "-q"])
    assert result.exit_code == 0, result.output
    doc = json.loads(report.read_text())
    used = len(set(doc["module_map"]["modules"].values()))
    if batch_is_image := x.is_floating_point():  # the CNN's plan splits its modules over both devices
        assert used == 2

    class WithLoss(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, batch):
            return self.inner(batch).pow(2).mean()

    outcome = verify_torch(WithLoss(copy.deepcopy(model)), (x,), doc, steps=1)
    assert outcome["ran"], outcome["error"]
    assert outcome["gradients_match"], outcome["worst"]
    assert outcome["cut_by"] == "module boundaries" and outcome["schedule"] == "makespan"
    assert outcome["ranks"] == used and (outcome["ranks"] == 2 or not batch_is_image)
