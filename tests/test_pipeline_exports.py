"""A pipeline plan in torchtitan's, torch's and Megatron-Core's formats (baechi_cli/pipeline/exports.py).

The pure functions run everywhere (against a reference reading of each contract, and Megatron's
layout grammar as its documentation states it). With torch: the module lists split real models
into stages that hold every parameter once and, run in turn, compute the model; the schedule CSV
loads into torch's ``_PipelineScheduleRuntime`` as the order torch's own schedule classes run,
and (slow tier) trains on two gloo ranks. torchtitan's own splitter and Megatron-Core's
``PipelineParallelLayerLayout`` are used where they import; the tests that need them skip
otherwise.
"""

from __future__ import annotations

import copy
import itertools
import re
import warnings
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baechi_cli.core.errors import InputError
from baechi_cli.pipeline.exports import megatron_layout, schedule_csv, torchtitan_module_lists
from baechi_cli.pipeline.schedules import device_orders, stage_devices

# ----------------------------------------------------------------- torchtitan_module_lists

LLAMA = [
    None,  # a graph input
    "tok_embeddings",
    "layers.0.attention",
    "layers.0.feed_forward",
    "layers.0",
    "layers.1.attention",
    "layers.1.feed_forward",
    "layers.1",
    "layers.2.attention",
    "layers.2.feed_forward",
    "layers.2",
    "layers.3.attention",
    "layers.3.feed_forward",
    "layers.3",
    "norm",
    "output",
]


def _stages(paths, starts):
    """stage_of for ``paths`` cut before each op index in ``starts``."""
    return [sum(i >= s for s in starts) for i in range(len(paths))]


def test_module_lists_are_torchtitans_for_cuts_between_layers():
    assert torchtitan_module_lists(LLAMA, _stages(LLAMA, [8])) == [
        ["tok_embeddings", "layers.0", "layers.1"],
        ["layers.2", "layers.3", "norm", "output"],
    ]
    # One stage: each layer by name, never the ModuleList as a whole (torchtitan would empty it).
    assert torchtitan_module_lists(LLAMA, [0] * len(LLAMA)) == [
        ["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "output"]
    ]
    assert torchtitan_module_lists(LLAMA, _stages(LLAMA, [2, 14])) == [
        ["tok_embeddings"],
        ["layers.0", "layers.1", "layers.2", "layers.3"],
        ["norm", "output"],
    ]


def test_a_module_cut_through_is_listed_by_its_parts_and_its_own_ops_by_none():
    """layers.1 straddles: its attention goes to stage 0, its feed-forward and its own op to
    stage 1, where no listed module holds that op (as ops at the root)."""
    assert torchtitan_module_lists(LLAMA, _stages(LLAMA, [6])) == [
        ["tok_embeddings", "layers.0", "layers.1.attention"],
        ["layers.1.feed_forward", "layers.2", "layers.3", "norm", "output"],
    ]
    paths = ["", "stem", "", "blocks.0.conv", "blocks.0.bn", "blocks.1.conv", "head.fc", ""]
    assert torchtitan_module_lists(paths, [0, 0, 0, 0, 1, 1, 2, 2]) == [
        ["stem", "blocks.0.conv"],
        ["blocks.0.bn", "blocks.1"],
        ["head"],
    ]


def test_a_module_called_from_two_stages_with_no_submodule_is_in_both():
    """A shared activation: each stage's copy of the model must still have it to call."""
    paths = ["emb", "layers.0.fc", "act", "layers.0", "layers.1.fc", "act", "layers.1", "head"]
    assert torchtitan_module_lists(paths, [0, 0, 0, 0, 1, 1, 1, 1]) == [
        ["emb", "layers.0", "act"],
        ["layers.1", "act", "head"],
    ]
    assert torchtitan_module_lists(paths, [0] * 8) == [["emb", "layers.0", "act", "layers.1", "head"]]


def test_stages_without_a_listed_module_are_empty_lists():
    assert torchtitan_module_lists(["a", "", ""], [0, 1, 1]) == [["a"], []]
    assert torchtitan_module_lists(["a", "b"], [0, 2]) == [["a"], [], ["b"]]
    assert torchtitan_module_lists([None, ""], [0, 0]) == [[]]
    assert torchtitan_module_lists([None], [5]) == torchtitan_module_lists([], []) == []


@pytest.mark.parametrize("function", [torchtitan_module_lists, megatron_layout])
@pytest.mark.parametrize(
    "paths, stages, message",
    [
        (["a", "b"], [0], "2 module paths but 1 stages"),
        (["a", "b"], [1, 0], "op 1: in stage 0 after an op in stage 1"),
        (["a", "b"], [0, -1], "op 1: a stage must be a non-negative integer, got -1"),
        (["a", "b"], [0, True], "op 1: a stage must be a non-negative integer, got True"),
        (["a", 3], [0, 0], "op 1: a module path must be a string or None, got 3"),
        ("ab", [0, 0], "must be sequences"),
    ],
)
def test_bad_input_is_an_input_error_on_one_line(function, paths, stages, message):
    with pytest.raises(InputError, match=re.escape(message)) as error:
        function(paths, stages)
    assert "\n" not in str(error.value)


def _reference_lists(paths, stages):
    """The contract read op by op: an op belongs to the outermost module that covers it, lies in one
    stage and is not a stack, or else to its own module if that has no submodule; a stage lists the
    modules its ops belong to, by first op there."""
    ops = [(p, s) for p, s in zip(paths, stages) if p is not None]

    def covers(module, path):
        return path == module or path.startswith(module + ".")

    def enclosing(path):
        atoms = path.split(".") if path else []
        return [".".join(atoms[:k]) for k in range(1, len(atoms) + 1)]

    def stack(module):
        kids = {p[len(module) + 1 :].split(".")[0] for p, _ in ops if p.startswith(module + ".")}
        return module not in {p for p, _ in ops} and all(k.isdigit() for k in kids)

    lists = [[] for _ in range(max((s for _, s in ops), default=-1) + 1)]
    for path, stage in ops:
        for module in enclosing(path):
            if len({s for p, s in ops if covers(module, p)}) == 1 and not stack(module):
                break
        else:  # no module of the op's is whole: its own, when it has no submodule, in each stage
            module = path if path and not any(p.startswith(path + ".") for p, _ in ops) else None
        if module is not None and module not in lists[stage]:
            lists[stage].append(module)
    return lists


_TREE = st.lists(
    st.lists(st.sampled_from(["a", "b", "0", "1", "2"]), min_size=0, max_size=3).map(".".join),
    min_size=1,
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(paths=_TREE, data=st.data())
def test_module_lists_match_the_contract_op_by_op(paths, data):
    paths = [p if data.draw(st.booleans()) or p else None for p in paths]  # some ops have no path
    steps = data.draw(st.lists(st.integers(0, 1), min_size=len(paths), max_size=len(paths)))
    stages = [sum(steps[: i + 1]) for i in range(len(paths))]
    assert torchtitan_module_lists(paths, stages) == _reference_lists(paths, stages)


# ----------------------------------------------------------------- schedule_csv (pure)


def test_schedule_csv_lines_are_baechis_device_orders():
    text = schedule_csv("interleaved", 4, 2, 4)
    assert text.endswith("\n") and "\r" not in text and " " not in text
    rows = [line.split(",") for line in text.splitlines()]
    orders = device_orders("interleaved", 4, 2, 4)
    assert rows == [[f"{s}{k}{m}" for k, s, m in order] for order in orders]
    # device_orders' own example: device 1 of 2, stages 1 and 3, two microbatches
    assert schedule_csv("interleaved", 4, 2, 2).splitlines()[1] == "1F0,1F1,3F0,3B0,3F1,3B1,1B0,1B1"


@pytest.mark.parametrize(
    "args, message",
    [
        (("1f1b", 4, 2, 4), "1f1b runs one stage per device: 4 stages on 2 devices"),
        (("interleaved", 4, 0, 4), "num_devices must be a positive integer, got 0"),
        (("zbv", 0, 2, 4), "num_stages must be a positive integer, got 0"),
        (("zbv", 4, 2, 0), "the number of microbatches must be at least 1"),
        (("pipedream", 2, 2, 2), "pipedream"),
    ],
)
def test_schedule_csv_refuses_what_the_schedule_refuses(args, message):
    with pytest.raises(InputError, match=re.escape(message)):
        schedule_csv(*args)


# ----------------------------------------------------------------- megatron_layout (pure)


def _layer_paths(prefix, layers, pre=("embed",), post=("norm", "head")):
    """Paths of a stack model: the ``pre`` modules, ``layers`` layers of two submodules and an op of
    their own each, then ``post``."""
    body = [f"{prefix}.{k}{part}" for k in range(layers) for part in (".attn", ".mlp", "")]
    return [*pre, *body, *post]


def _parse_layout(layout):
    """Megatron's documented grammar (``--pipeline-model-parallel-layout``): ``|`` splits stages,
    ``(...)*n`` and ``x*n`` repeat, commas are cosmetic; E embedding, t decoder layer, m MTP layer,
    L loss. Per stage, its symbols."""
    text = layout.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    assert set(text) <= set("EtmL|"), layout
    return [list(stage) for stage in text.split("|")]


def _check_layout(layout, per_stage_layers, embedding_stage, loss_stage, devices=None):
    """``layout`` read back by the documented grammar, and by Megatron-Core where it imports: the
    stages hold these layers, E first and L last, each once."""
    stages = _parse_layout(layout)
    assert [s.count("t") for s in stages] == per_stage_layers
    assert [i for i, s in enumerate(stages) if "E" in s] == [embedding_stage]
    assert [i for i, s in enumerate(stages) if "L" in s] == [loss_stage]
    flat = [c for s in stages for c in s]
    assert flat[0] == "E" and flat[-1] == "L" and flat.count("E") == flat.count("L") == 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.transformer.enums import LayerType
            from megatron.core.transformer.pipeline_parallel_layer_layout import (
                PipelineParallelLayerLayout,
            )
    except ImportError:
        return
    devices = devices or len(stages)
    parsed = PipelineParallelLayerLayout(layout, devices)
    parsed.validate_layer_layout(num_layers=sum(per_stage_layers), mtp_num_layers=None)
    chunks = len(stages) // devices
    assert parsed.virtual_pipeline_model_parallel_size == chunks
    for s, count in enumerate(per_stage_layers):  # Megatron's stage v·D + r is rank r's chunk v
        held = parsed.layout[s % devices][s // devices]
        assert held.count(LayerType.decoder) == count
        assert (LayerType.embedding in held) == (s == embedding_stage)
        assert (LayerType.loss in held) == (s == loss_stage)


@pytest.mark.parametrize("prefix", ["layers", "transformer.h", "model.layers"])
def test_layouts_of_stacks(prefix):
    paths = _layer_paths(prefix, 4)
    first = {k: paths.index(f"{prefix}.{k}.attn") for k in range(4)}
    layout = megatron_layout(paths, _stages(paths, [first[2]]))
    assert layout == "E,t*2|t*2,L"
    _check_layout(layout, [2, 2], 0, 1)
    layout = megatron_layout(paths, _stages(paths, [first[0], first[1], len(paths) - 2]))
    assert layout == "E|t|t*3|L"
    _check_layout(layout, [0, 1, 3, 0], 0, 3, devices=2)
    assert megatron_layout(paths, [0] * len(paths)) == "E,t*4,L"


def test_a_stage_with_nothing_is_empty():
    paths = _layer_paths("layers", 2)
    stages = [0, 0, 0, 0, 2, 2, 2, 2, 2]
    assert megatron_layout(paths, stages) == "E,t||t,L"
    _check_layout("E,t||t,L", [1, 0, 1], 0, 2)


def test_without_embedding_or_head_e_and_l_go_with_the_first_and_last_layer():
    paths = _layer_paths("blocks", 3, pre=(), post=())
    assert megatron_layout(paths, _stages(paths, [3, 6])) == "E,t|t|t,L"


@pytest.mark.parametrize(
    "paths, stages",
    [
        # a cut inside layer 1
        (_layer_paths("layers", 3), [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1]),
        # the embedding's two modules in two stages, and the head's
        (_layer_paths("layers", 2, pre=("tok", "pos")), [0, 1, 1, 1, 1, 1, 1, 1, 1, 1]),
        (_layer_paths("layers", 2), [0, 0, 0, 0, 0, 0, 0, 0, 1]),
        # layers that differ
        (["emb", "layers.0.attn", "layers.1.mha", "head"], [0, 0, 1, 1]),
        # a module called between the layers, outside the stack
        (["emb", "layers.0", "rope", "layers.1", "head"], [0, 0, 0, 1, 1]),
        # a layer called twice, layers out of order, an item missing
        (["emb", "layers.0", "layers.1", "layers.0", "head"], [0, 0, 0, 1, 1]),
        (["emb", "layers.1", "layers.0", "head"], [0, 0, 1, 1]),
        (["emb", "layers.0", "layers.2", "head"], [0, 0, 1, 1]),
        # no stack; two stacks of one size; a stack with an op of its own
        (["conv", "fc"], [0, 1]),
        (["enc.0", "enc.1", "dec.0", "dec.1"], [0, 0, 1, 1]),
        (["emb", "layers", "layers.0", "layers.1", "head"], [0, 0, 0, 1, 1]),
    ],
)
def test_no_layout_where_megatron_has_none(paths, stages):
    assert megatron_layout(paths, stages) is None


def test_the_largest_stack_is_the_body():
    """A Sequential head of two Linear layers is a stack too; the body has more layers."""
    paths = ["emb", "layers.0", "layers.1", "layers.2", "head.0", "head.1"]
    assert megatron_layout(paths, [0, 0, 1, 1, 1, 1]) == "E,t|t*2,L"


@settings(max_examples=100, deadline=None)
@given(layers=st.integers(1, 12), data=st.data())
def test_layouts_read_back_as_the_split(layers, data):
    paths = _layer_paths("model.layers", layers, pre=("model.embed", "model.rotary"))
    starts = sorted(data.draw(st.sets(st.integers(1, layers + 1), max_size=6)))
    # a cut before layer k - 1 (k <= layers) or before the head (k = layers + 1)
    cuts = [2 + 3 * (k - 1) for k in starts]
    stages = _stages(paths, cuts)
    layout = megatron_layout(paths, stages)
    per_layer = [stages[2 + 3 * k] for k in range(layers)]
    count = stages[-1] + 1
    _check_layout(layout, [per_layer.count(s) for s in range(count)], 0, count - 1)


# ----------------------------------------------------------------- with torch


def _op_paths(torch, model, x):
    """The innermost module path of each torch function the model's forward calls, in order."""
    names = {m: n for n, m in model.named_modules()}
    stack: list[str] = []

    def enter(module, args):
        stack.append(names[module])

    def leave(module, args, output):
        stack.pop()  # returns None: the output stays

    hooks = [
        h
        for m in model.modules()
        for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))
    ]
    paths: list[str] = []

    class Record(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if stack:
                paths.append(stack[-1])
            return func(*args, **(kwargs or {}))

    try:
        with torch.no_grad(), Record():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return paths


def _llama(torch, layers=4, head="output"):
    """A torchtitan-style decoder: tok_embeddings, a ModuleList of layers (attention, feed-forward,
    two norms), norm and a head; its forward skips what a stage deleted (torchtitan's requirement)."""
    nn = torch.nn

    class Attention(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.wqkv, self.wo = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)

        def forward(self, x):
            q, k, v = self.wqkv(x).chunk(3, dim=-1)
            return self.wo(torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1) @ v)

    class FeedForward(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.w1, self.w2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

        def forward(self, x):
            return self.w2(nn.functional.silu(self.w1(x)))

    class Layer(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.attention_norm, self.attention = nn.LayerNorm(d), Attention(d)
            self.ffn_norm, self.feed_forward = nn.LayerNorm(d), FeedForward(d)

        def forward(self, x):
            x = x + self.attention(self.attention_norm(x))
            return x + self.feed_forward(self.ffn_norm(x))

    class Decoder(nn.Module):
        def __init__(self, vocab=32, d=8):
            super().__init__()
            self.tok_embeddings = nn.Embedding(vocab, d)
            self.layers = nn.ModuleList([Layer(d) for _ in range(layers)])
            self.norm = nn.LayerNorm(d)
            setattr(self, head, nn.Linear(d, vocab))
            self.head_name = head

        def forward(self, h):
            h = self.tok_embeddings(h) if self.tok_embeddings is not None else h
            for layer in self.layers:
                h = layer(h) if layer is not None else h
            h = self.norm(h) if self.norm is not None else h
            out = getattr(self, self.head_name)
            return out(h) if out is not None else h

    torch.manual_seed(0)
    return Decoder().eval(), torch.randint(0, 32, (2, 5))


def _resnet(torch):
    """Nested Sequentials of blocks with submodules, a root-level flatten between stem and head."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
            self.down = nn.Sequential(nn.Conv2d(c, c, 1), nn.BatchNorm2d(c))

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x)) + self.down(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 4, 3)
            self.layer1 = nn.Sequential(Block(4), Block(4))
            self.layer2 = nn.Sequential(Block(4))
            self.fc = nn.Linear(4, 10)

        def forward(self, x):
            x = self.layer2(self.layer1(self.stem(x)))
            return self.fc(torch.flatten(x.mean((2, 3)), 1))

    torch.manual_seed(0)
    return Net().eval(), torch.randn(1, 3, 8, 8)


def _keep_only(module, names, prefix=""):
    """Delete in place every submodule that neither is in ``names`` nor holds one, as torchtitan's
    ``_split_module`` does (a module None, a ModuleList or ModuleDict emptied), at any depth."""
    from torch import nn

    for name, child in list(module.named_children()):
        fqn = prefix + name
        if fqn in names:
            continue
        if any(n.startswith(fqn + ".") for n in names):
            _keep_only(child, names, fqn + ".")
        elif isinstance(child, nn.ModuleList | nn.ModuleDict):
            setattr(module, name, type(child)())
        else:
            setattr(module, name, None)


def _tagged(torch, model):
    """A copy of ``model`` whose i-th parameter is all i."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.fill_(i)
    return model


def _parameter_owners(torch, model, lists, split):
    """How many stages hold each parameter when ``split(copy, names)`` makes each stage."""
    tagged = _tagged(torch, model)
    held = Counter()
    for names in lists:
        stage = split(copy.deepcopy(tagged), names)
        held.update(int(p.flatten()[0]) for p in stage.parameters())
    return held


def _in_place(split):
    def run(model, names):
        split(model, set(names))
        return model

    return run


@pytest.mark.parametrize("kind", ["llama", "resnet"])
def test_module_lists_give_every_parameter_to_one_stage(kind):
    """Cuts wherever torch can cut (a module call's first op: inside layers and blocks too; every
    one and every two of them, and every third): the lists applied by deleting what a stage does not name leave each parameter in
    exactly one stage."""
    torch = pytest.importorskip("torch")
    from baechi_cli.pipeline.torch_split import stage_boundaries

    model, x = (_llama if kind == "llama" else _resnet)(torch)
    paths = _op_paths(torch, model, x)
    cuts = [b.index for b in stage_boundaries(paths)]
    assert len(cuts) > 10
    everything = Counter(range(len(list(model.parameters()))))
    for starts in [*itertools.combinations(cuts, 1), *itertools.combinations(cuts, 2), cuts[::3]]:
        lists = torchtitan_module_lists(paths, _stages(paths, starts))
        assert _parameter_owners(torch, model, lists, _in_place(_keep_only)) == everything


def _layer_boundary_stages(paths, cuts):
    """Stages for cuts before the layers (or the norm) numbered in ``cuts``."""
    starts = [
        paths.index(f"layers.{k}.attention_norm") if isinstance(k, int) else paths.index(k) for k in cuts
    ]
    return _stages(paths, starts)


@pytest.mark.parametrize("cuts", [[], [2], [1, 3], [0, 1, 2, 3], [1, "norm"], [3, "norm"]])
def test_module_lists_split_a_decoder_into_stages_that_compute_it(cuts):
    """Cuts between layers: each stage a copy that keeps only what it lists; run in turn they give the
    model's output. With torchtitan installed, its own splitter does the same."""
    torch = pytest.importorskip("torch")
    model, x = _llama(torch)
    paths = _op_paths(torch, model, x)
    lists = torchtitan_module_lists(paths, _layer_boundary_stages(paths, cuts))
    assert len(lists) == len(cuts) + 1
    splitters = [_in_place(_keep_only)]
    try:
        from torchtitan.distributed.pipeline_parallel import _split_module
    except ImportError:
        pass
    else:
        splitters.append(lambda m, names: _split_module(m, names))
    for split in splitters:
        stages = [split(copy.deepcopy(model), names) for names in lists]
        with torch.no_grad():
            h = x
            for stage in stages:
                h = stage(h)
            torch.testing.assert_close(h, model(x))
        everything = Counter(range(len(list(model.parameters()))))
        assert _parameter_owners(torch, model, lists, split) == everything


@pytest.mark.parametrize("stages, layers", [(1, 4), (2, 4), (3, 4), (4, 6), (8, 6)])
def test_module_lists_equal_torchtitans_own(stages, layers):
    """torchtitan's ``_generate_llm_fqn_per_model_part`` splits its decoder at layer boundaries;
    the split its lists make, handed to baechi, gives the same lists back."""
    pytest.importorskip("torch")
    pp = pytest.importorskip("torchtitan.distributed.pipeline_parallel")
    import torch

    theirs = pp._generate_llm_fqn_per_model_part(stages, layers, 1, 1)
    model, x = _llama(torch, layers, head=theirs[-1][-1])
    paths = _op_paths(torch, model, x)
    stage_of_top = {name: s for s, names in enumerate(theirs) for name in names}
    stage_of = [
        stage_of_top[".".join(p.split(".")[:2]) if p.startswith("layers.") else p.split(".")[0]]
        for p in paths
    ]
    assert torchtitan_module_lists(paths, stage_of) == theirs


# ----------------------------------------------------------------- schedule_csv in torch


class _Stage:
    """What torch's schedule classes read of a stage to lay out their order (no process group)."""

    def __init__(self, index, rank, devices, stages):
        self.group_size, self.group_rank, self.stage_index = devices, rank, index
        self.num_stages, self.is_first, self.is_last = stages, index == 0, index == stages - 1
        self.submod = None


class _RecordingStage(_Stage):
    """A stage that records what torch's single-stage schedules run, with no communication."""

    def __init__(self, index, stages):
        super().__init__(index, index, stages, stages)
        self.ran = []

    def forward_one_chunk(self, mb, *args, **kwargs):
        self.ran.append(f"{self.stage_index}F{mb}")

    def backward_one_chunk(self, mb, *args, **kwargs):
        self.ran.append(f"{self.stage_index}B{mb}")

    def __getattr__(self, name):  # get_*_ops: nothing to send or receive; the rest does nothing
        return (lambda *a, **k: []) if name.startswith("get_") else (lambda *a, **k: None)


def _torch_order(name, stages, devices, microbatches):
    """Per rank, the compute actions torch's own class for ``name`` runs."""
    from torch.distributed.pipelining import schedules as ts

    if name in ("gpipe", "1f1b"):  # run the single-stage schedules' own loop
        cls = ts.ScheduleGPipe if name == "gpipe" else ts.Schedule1F1B
        orders = []
        for s in range(stages):
            stage = _RecordingStage(s, stages)
            schedule = cls(stage, microbatches)
            schedule._initialize_stage = lambda *a, **k: None  # no model to trace shapes from
            schedule._step_microbatches()
            orders.append(stage.ran)
        return orders
    orders = []
    for rank in range(devices):
        local = [s for s, d in enumerate(stage_devices(name, stages, devices)) if d == rank]
        cls = ts.ScheduleInterleaved1F1B if name == "interleaved" else ts.ScheduleZBVZeroBubble
        schedule = cls([_Stage(s, rank, devices, stages) for s in local], microbatches)
        orders.append([str(a) for a in schedule.pipeline_order[rank] if a is not None])
    return orders


CASES = [
    ("gpipe", 1, 1, 3),
    ("gpipe", 3, 3, 2),
    ("gpipe", 4, 4, 8),
    ("1f1b", 2, 2, 2),
    ("1f1b", 3, 3, 5),
    ("1f1b", 4, 4, 8),
    ("interleaved", 4, 2, 2),
    ("interleaved", 4, 2, 4),
    ("interleaved", 6, 3, 6),
    ("interleaved", 8, 4, 8),
    ("interleaved", 12, 4, 4),
    ("zbv", 2, 1, 4),
    ("zbv", 4, 2, 2),
    ("zbv", 4, 2, 5),
    ("zbv", 6, 3, 6),
    ("zbv", 8, 4, 10),
]


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
@pytest.mark.parametrize("name, stages, devices, microbatches", CASES)
def test_schedule_csv_loads_into_torch_as_torchs_own_order(tmp_path, name, stages, devices, microbatches):
    """torch's _PipelineScheduleRuntime loads the CSV (checking every stage runs each microbatch's F
    before its B or I before its W, and lowering it to sends and receives, which fails on an order
    that would hang): rank by rank the order is what torch's own schedule class runs, and the
    stages sit on the ranks baechi put them."""
    pytest.importorskip("torch")
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    path = tmp_path / "schedule.csv"
    path.write_text(schedule_csv(name, stages, devices, microbatches))
    runtime = _PipelineScheduleRuntime([_Stage(0, 0, devices, stages)], microbatches)
    runtime._load_csv(str(path))
    loaded = [[str(a) for a in runtime.pipeline_order[rank]] for rank in range(devices)]
    assert loaded == _torch_order(name, stages, devices, microbatches)
    mapping = runtime.stage_index_to_group_rank
    assert [mapping[s] for s in range(stages)] == stage_devices(name, stages, devices)
    # the lowering added each rank's sends and receives around exactly these compute actions
    lowered = runtime.pipeline_order_with_comms
    assert [[str(a) for a in lowered[r] if a.is_compute_op] for r in range(devices)] == loaded


def _csv_train_worker(rank, world, name, stages, csv_path, out, port):
    """One gloo rank: the stages of a small MLP the CSV puts on this rank, one training step."""
    import os

    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        parts, x, target = _mlp_parts(torch, stages)
        mine = [s for s, d in enumerate(stage_devices(name, stages, world)) if d == rank]
        built = [PipelineStage(parts[s], s, stages, torch.device("cpu")) for s in mine]
        schedule = _PipelineScheduleRuntime(built, 4, loss_fn=torch.nn.functional.mse_loss)
        schedule._load_csv(csv_path)
        schedule.step(*((x,) if 0 in mine else ()), target=target if stages - 1 in mine else None)
        torch.save({s: [p.grad for p in parts[s].parameters()] for s in mine}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _mlp_parts(torch, stages):
    """One Linear+Tanh per stage, a batch of four microbatches and a target."""
    torch.manual_seed(0)
    parts = [torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()) for _ in range(stages)]
    return parts, torch.randn(8, 4), torch.randn(8, 4)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize("name, stages", [("gpipe", 2), ("1f1b", 2), ("interleaved", 4), ("zbv", 4)])
def test_schedule_csv_trains_in_torchs_runtime(tmp_path, name, stages):
    """The CSV run for real: two gloo ranks build the stages it puts on them, load it into
    _PipelineScheduleRuntime and take one step of four microbatches; the gradients equal one
    process's backward of the mean loss (zbv's two stages of one rank pass their data in place)."""
    torch = pytest.importorskip("torch")
    import random

    import torch.multiprocessing as mp

    csv_path = tmp_path / "schedule.csv"
    csv_path.write_text(schedule_csv(name, stages, 2, 4))
    port = random.Random(name).randint(20000, 40000)
    args = (2, name, stages, str(csv_path), str(tmp_path), port)
    mp.start_processes(_csv_train_worker, args=args, nprocs=2, start_method="spawn")
    got = {}
    for rank in range(2):
        got.update(torch.load(tmp_path / f"rank{rank}.pt"))
    parts, x, target = _mlp_parts(torch, stages)
    model = torch.nn.Sequential(*parts)
    loss = sum(
        torch.nn.functional.mse_loss(model(x[2 * m : 2 * m + 2]), target[2 * m : 2 * m + 2]) for m in range(4)
    )
    (loss / 4).backward()
    assert sorted(got) == list(range(stages))
    for s in range(stages):
        for mine, theirs in zip(got[s], parts[s].parameters()):
            torch.testing.assert_close(mine, theirs.grad)
