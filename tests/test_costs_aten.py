"""aten cost rules (op set ``aten``): real modules traced by ``torch.export`` (its graph, and the
core-aten graph after ``run_decompositions``) and by ``make_fx`` of forward + backward, each node
read into the reader's convention (``_input_shapes``, ``_input_dtypes``, ``_args``; see
:mod:`baechi_cli.costs.rules_aten`) and counted by its rule, against
``torch.utils.flop_counter.FlopCounterMode`` on the same node: exact for every op it counts, per op
and in total.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import pytest

from baechi_cli.core.devices import CONV, DEPTHWISE, GEMM
from baechi_cli.costs.registry import (
    ATEN,
    ATEN_RULES,
    NO_RULE,
    OP_SETS,
    UNCOVERED,
    ZERO,
    OpCount,
    bytes_only,
    count_view,
    name_table,
    op_compute_class,
    rule_for,
)
from baechi_cli.costs.rules_aten import ARGS_READ, VIEW_OPS, aten_view
from baechi_cli.io.pt2_joint import load_op_library

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.export's own deprecations
nn = torch.nn
F = torch.nn.functional
flop_counter = pytest.importorskip("torch.utils.flop_counter")
proxy_tensor = pytest.importorskip("torch.fx.experimental.proxy_tensor")


# --- the reader's convention, from an fx node ------------------------------------------


def _dtype(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def _plain(value: Any) -> Any:
    """A non-tensor argument as plain Python (lists, ints, floats, bools, strings)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return str(value)  # dtypes, devices, layouts, memory formats


def convention(node, absent: str = "none") -> tuple[str, dict, list, list, list]:
    """``(op type, attrs, output shapes, output dtypes, output bytes)`` of an aten node.

    Tensor arguments in schema order (a list's tensors in order); an absent optional tensor or
    a number in a Tensor slot is ``None`` (``absent="none"``) or left out (``"omit"``).
    """
    schema = node.target._schema
    shapes: list = []
    dtypes: list = []
    args: dict = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args) and not arg.kwarg_only:
            value = node.args[i]
        elif arg.name in node.kwargs:
            value = node.kwargs[arg.name]
        else:
            value = arg.default_value if arg.has_default_value() else None
        if "Tensor" not in str(arg.type):
            args[arg.name] = _plain(value)
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            val = item.meta.get("val") if isinstance(item, torch.fx.Node) else None
            if isinstance(val, torch.Tensor):
                shapes.append(tuple(val.shape))
                dtypes.append(_dtype(val))
            elif absent == "none":
                shapes.append(None)
                dtypes.append("")
    out = node.meta["val"]
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    tensors = [v if isinstance(v, torch.Tensor) else None for v in outs]
    attrs = {"_input_shapes": shapes, "_input_dtypes": dtypes, "_args": args}
    return (
        f"aten.{schema.name.removeprefix('aten::')}",
        attrs,
        [tuple(t.shape) if t is not None else None for t in tensors],
        [_dtype(t) if t is not None else "" for t in tensors],
        [t.numel() * t.element_size() if t is not None else 0 for t in tensors],
    )


def ours(node, absent: str = "none") -> tuple[Any, OpCount, bool]:
    """The node's rule, its count and whether the rule fell back to bytes only."""
    op_type, attrs, shapes, dtypes, nbytes = convention(node, absent)
    entry = rule_for(op_type, ATEN)
    count, fell_back = count_view(entry, aten_view(op_type, attrs, shapes, dtypes, nbytes))
    return entry, count, fell_back


def aten_nodes(gm) -> list:
    return [
        n
        for n in gm.graph.nodes
        if n.op == "call_function"
        and isinstance(n.target, torch._ops.OpOverload)
        and n.target.namespace == "aten"
    ]


# --- the reference: FlopCounterMode, node by node, on the graph's fake tensors -----------


class _PerNode(torch.fx.Interpreter):
    def __init__(self, gm):
        super().__init__(gm)
        self.flops: dict[str, int] = {}

    def run_node(self, n):
        if n.op != "call_function":
            return super().run_node(n)
        with flop_counter.FlopCounterMode(display=False) as counter:
            result = super().run_node(n)
        self.flops[n.name] = counter.get_total_flops()
        return result


def reference(gm) -> tuple[dict[str, int], int]:
    """FlopCounterMode's count per node, and of the whole graph run at once."""
    from torch._guards import detect_fake_mode

    vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    fake_mode = detect_fake_mode(vals)
    per_node = _PerNode(gm)
    with fake_mode:
        per_node.run(*vals)
        with flop_counter.FlopCounterMode(display=False) as whole:
            torch.fx.Interpreter(gm).run(*vals)
    return per_node.flops, whole.get_total_flops()


# --- the modules ------------------------------------------------------------------------


class Attention(nn.Module):
    """Self-attention twice: spelled out (einsum, matmul, softmax) and fused (SDPA, causal)."""

    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d, bias=False)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(d // self.heads)
        manual = torch.softmax(scores, dim=-1) @ v
        fused = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = (manual + fused).transpose(1, 2).reshape(b, s, d)
        return x + F.gelu(self.out(y))


class Embedder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.norm = nn.LayerNorm(16, elementwise_affine=False)
        self.head = nn.Linear(16, 50)

    def forward(self, tokens):
        return self.head(F.silu(self.norm(self.emb(tokens))))


def _convs() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8),  # depthwise, strided
        nn.Conv2d(8, 16, 1),
        nn.Conv2d(16, 16, 3, groups=4, dilation=2, bias=False),  # grouped, dilated
        nn.BatchNorm2d(16),
        nn.SiLU(),
        nn.MaxPool2d(2),
        nn.ConvTranspose2d(16, 8, 3, stride=2, groups=2),  # transposed, grouped
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], tuple]]] = {
    "mlp": (
        lambda: nn.Sequential(nn.Linear(16, 32), nn.GELU(approximate="tanh"), nn.Linear(32, 8)),
        lambda: (torch.randn(2, 5, 16),),
    ),
    "convs": (_convs, lambda: (torch.randn(2, 3, 16, 16),)),
    "attention": (Attention, lambda: (torch.randn(2, 6, 32),)),
    "embedding": (Embedder, lambda: (torch.randint(0, 50, (3, 7)),)),
}
GRAPHS = ("export", "core", "joint")


def _loss(out, inputs) -> Any:
    if out.shape[-1] == 50:  # the embedder: next-token cross-entropy
        return F.cross_entropy(out.reshape(-1, 50), inputs[0].reshape(-1))
    return out.pow(2).mean()


@functools.cache
def traced(model: str, kind: str):
    """The model's graph: torch.export's, its core-aten decomposition, or forward + backward."""
    torch.manual_seed(0)
    make, inputs = MODELS[model]
    module, args = make(), inputs()
    if kind in ("export", "core"):
        program = torch.export.export(module, args)
        return (program.run_decompositions() if kind == "core" else program).graph_module
    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    trainable = [name for name, p in module.named_parameters() if p.requires_grad]

    def step(state, *args):
        loss = _loss(torch.func.functional_call(module, state, args), args)
        return torch.autograd.grad(loss, [state[name] for name in trainable])

    return proxy_tensor.make_fx(step, tracing_mode="fake")(state, *args)


@functools.cache
def traced_reference(model: str, kind: str):
    return reference(traced(model, kind))


CASES = [(m, k) for m in MODELS for k in GRAPHS]


def _is_counted(entry, op_type: str) -> bool:
    """Ops FlopCounterMode counts (or counts what they decompose into)."""
    return entry.compute_class in (GEMM, CONV) or "scaled_dot_product" in op_type


def _sdpa_formula(node) -> int:
    """FlopCounterMode's formula for an attention op it has no entry for (the CPU kernels)."""
    shapes = [s for s in convention(node)[1]["_input_shapes"]]
    if node.target._schema.name.endswith("_backward"):
        return flop_counter.sdpa_backward_flop_count(*shapes[:4])
    return flop_counter.sdpa_flop_count(*shapes[:3])


def _counter_weight_gradient(node) -> int:
    """What FlopCounterMode counts for a convolution_backward's weight gradient alone."""
    dy, x, w = (a.meta["val"].shape for a in node.args[:3])
    _, stride, padding, dilation, transposed, output_padding, groups, _ = node.args[3:11]
    out = node.meta["val"]
    return flop_counter.conv_backward_flop(
        dy, x, w, None, stride, padding, dilation, transposed, output_padding, groups,
        [False, True, False], out_val=(None, out[1], None),
    )  # fmt: skip


def expected_flops(node, theirs: int) -> int:
    """FlopCounterMode's count of ``node``, except where it is wrong or has no formula (see rules_aten)."""
    name = node.target._schema.name
    if theirs == 0 and "scaled_dot_product" in name:
        return _sdpa_formula(node)
    if name == "aten::convolution_backward" and node.args[9] > 1 and node.args[10][1]:
        weight = _counter_weight_gradient(node)
        return theirs - weight + weight // node.args[9]  # the counter counts it `groups` times
    return theirs


# --- tests ------------------------------------------------------------------------------


def test_aten_is_an_op_set_with_its_own_table():
    assert ATEN in OP_SETS
    assert name_table(ATEN) is ATEN_RULES
    assert rule_for("mm", ATEN) is NO_RULE and rule_for("MatMul", ATEN) is NO_RULE
    assert rule_for("aten.mm", "onnx") is NO_RULE  # the names live in the aten table only


@pytest.mark.parametrize("model,kind", CASES)
def test_every_op_has_a_rule_that_counts_it(model, kind):
    gm = traced(model, kind)
    for node in aten_nodes(gm):
        entry, count, fell_back = ours(node)
        assert entry.kind != UNCOVERED, node.target
        assert not fell_back, node.target
        # Absent optional tensors given as None or left out count the same.
        assert ours(node, absent="omit")[1] == count, node.target


@pytest.mark.parametrize("model,kind", CASES)
def test_flops_equal_flop_counter_per_op_and_in_total(model, kind):
    gm = traced(model, kind)
    theirs, whole = traced_reference(model, kind)
    assert sum(theirs.values()) == whole  # the per-node reference adds up to the whole graph's
    counted_ours = differences = 0
    counted_types = set()
    for node in aten_nodes(gm):
        entry, count, _ = ours(node)
        op_type = convention(node)[0]
        if _is_counted(entry, op_type):
            expected = expected_flops(node, theirs[node.name])
            assert count.flops == expected, (node.name, node.target)
            counted_ours += count.flops
            differences += expected - theirs[node.name]
            counted_types.add(op_type)
        else:
            assert theirs[node.name] == 0, node.target  # the counter counts nothing else
    # In total: the counter's, but for the grouped weight gradients and the CPU attention kernels.
    assert counted_ours == whole + differences > 0
    if model in ("mlp", "embedding") or (model, kind) == ("attention", "core"):
        assert differences == 0
    if kind == "joint":
        assert counted_types & {"aten.mm", "aten.bmm", "aten.convolution_backward", "aten.addmm"}


def test_the_graphs_hold_the_ops_the_rules_are_for():
    types = {convention(n)[0] for m, k in CASES for n in aten_nodes(traced(m, k))}
    for op_type in (
        "aten.linear aten.addmm aten.mm aten.bmm aten.matmul aten.einsum aten.conv2d aten.convolution "
        "aten.conv_transpose2d aten.convolution_backward aten.scaled_dot_product_attention "
        "aten._scaled_dot_product_flash_attention_for_cpu aten._scaled_dot_product_flash_attention_for_cpu_backward "
        "aten.native_layer_norm aten.native_layer_norm_backward aten.embedding aten.embedding_dense_backward "
        "aten.gelu aten.gelu_backward aten.silu aten.silu_backward aten._softmax aten._softmax_backward_data "
        "aten.native_batch_norm_backward aten.max_pool2d_with_indices aten.max_pool2d_with_indices_backward "
        "aten.nll_loss_forward aten.nll_loss_backward aten._log_softmax aten.view aten.permute aten.t"
    ).split():
        assert op_type in types, op_type


def test_grouped_convolution_weight_gradient_is_the_forwards_flops():
    """FlopCounterMode counts a grouped convolution's weight gradient `groups` times; we count it once."""
    conv = nn.Conv2d(8, 8, 3, padding=1, groups=8)  # depthwise
    x = torch.randn(2, 8, 10, 10)

    def step(w, x):
        return torch.autograd.grad(F.conv2d(x, w, padding=1, groups=8).sum(), [w])

    gm = proxy_tensor.make_fx(step, tracing_mode="fake")(conv.weight, x)
    (backward,) = [n for n in aten_nodes(gm) if n.target._schema.name == "aten::convolution_backward"]
    forward = 2 * 2 * 10 * 10 * 8 * 1 * 9  # 2 * N * H * W * C_out * C_in/groups * kernel
    assert ours(backward)[1].flops == forward  # grad_weight only: output_mask [False, True, False]
    assert reference(gm)[0][backward.name] == 8 * forward


@pytest.mark.parametrize("groups,expected", [(1, CONV), (2, DEPTHWISE), (8, DEPTHWISE)])
def test_grouped_convolutions_run_at_the_depthwise_rate(groups, expected):
    for op_type in ("aten.convolution", "aten.conv2d", "aten.convolution_backward"):
        entry = rule_for(op_type, ATEN)
        assert op_compute_class(entry, {"_args": {"groups": groups}}) == expected
    assert op_compute_class(rule_for("aten.conv2d", ATEN), {"_args": {}}) == CONV
    assert op_compute_class(rule_for("aten.mm", ATEN), {}) == GEMM
    assert op_compute_class(rule_for("aten.add", ATEN), {}) == ""


def test_views_are_free_and_listed_for_the_reader():
    for name in (
        "view _unsafe_view reshape permute t transpose expand slice select unsqueeze squeeze alias detach "
        "split split_with_sizes chunk unbind as_strided narrow view_as_real"
    ).split():
        assert f"aten.{name}" in VIEW_OPS
    for op_type in VIEW_OPS:
        assert ATEN_RULES[op_type].kind == ZERO
    for model, kind in CASES:
        for node in aten_nodes(traced(model, kind)):
            if convention(node)[0] in VIEW_OPS:
                assert ours(node)[1] == OpCount()
    for copy in ("aten.clone", "aten._to_copy", "aten.cat", "aten.index", "aten.gather", "aten.scatter"):
        assert copy not in VIEW_OPS and ATEN_RULES[copy].kind != ZERO


def test_every_rule_names_an_aten_op():
    reader_ops = {"Input", "OptimizerStep"}  # the pt2 reader's own ops, not torch's

    def exists(op_type: str) -> bool:
        namespace, _, name = op_type.partition(".")
        if namespace != "aten":  # a custom op: its package is one the tracer knows to import
            return load_op_library(namespace) and hasattr(getattr(torch.ops, namespace), name)
        return hasattr(torch.ops.aten, name)

    missing = [t for t in ATEN_RULES if t not in reader_ops and not exists(t)]
    assert missing == []
    assert all(t in ATEN_RULES for t in ARGS_READ)


def test_a_grouped_product_counts_each_groups_product():
    """Rows cut by offsets into groups, each through its group's matrix (a mixture of experts):
    2 S K N forward; the fallback's backward computes both gradients, 4 S K N."""
    for op in ("aten._grouped_mm", "transformers.grouped_mm_fallback"):
        assert _count(op, [(12, 16), (4, 16, 8), (4,)], [(12, 8)]).flops == 2 * 12 * 16 * 8
    backward = _count(
        "transformers.grouped_mm_fallback_backward",
        [(12, 16), (4, 16, 8), (4,), (12, 8)],
        [(12, 16), (4, 16, 8)],
    )
    assert backward.flops == 4 * 12 * 16 * 8
    assert _count("aten._grouped_mm", [(3, 5, 16), (3, 16, 8)], [(3, 5, 8)]).flops == 2 * 3 * 5 * 16 * 8
    assert _count("aten._grouped_mm", [(5, 16), (16, 8), (3,)], [(3, 5, 8)]).flops == 2 * 5 * 16 * 8


def _view(op_type, inputs, outputs, args=None, dtype="float32"):
    shapes = [s if s is None else tuple(s) for s in inputs]
    attrs = {
        "_input_shapes": shapes,
        "_input_dtypes": [dtype if s else "" for s in shapes],
        "_args": args or {},
    }
    size = 2 if dtype == "bfloat16" else 4
    return aten_view(op_type, attrs, outputs, [dtype] * len(outputs), [math.prod(s) * size for s in outputs])


def _count(op_type, inputs, outputs, args=None, dtype="float32"):
    count, fell_back = count_view(rule_for(op_type, ATEN), _view(op_type, inputs, outputs, args, dtype))
    assert not fell_back
    return count


def test_bytes_are_the_tensor_arguments_and_outputs():
    mm = _count("aten.mm", [(8, 16), (16, 4)], [(8, 4)], dtype="bfloat16")
    assert mm == OpCount(2 * 8 * 16 * 4, (8 * 16 + 16 * 4) * 2, 8 * 4 * 2)
    add = _count("aten.add", [(4, 5), None], [(4, 5)], {"alpha": 1})  # x + 1: the number is no tensor
    assert add == OpCount(20, 80, 80)
    # A gather reads the indices and the rows it picks, not the table.
    emb = aten_view("aten.embedding", {"_input_shapes": [(1000, 8), (3,)], "_input_dtypes": ["float32", "int64"]},
                    [(3, 8)], ["float32"], [96])  # fmt: skip
    assert rule_for("aten.embedding", ATEN).fn(emb) == OpCount(0.0, 24 + 96, 96)


def test_memory_bound_ops_count_a_few_flops_per_element():
    n = 6 * 10
    assert _count("aten.gelu", [(6, 10)], [(6, 10)]).flops == 5 * n
    assert _count("aten.gelu", [(6, 10)], [(6, 10)], {"approximate": "tanh"}).flops == 8 * n
    assert _count("aten.gelu_backward", [(6, 10), (6, 10)], [(6, 10)]).flops == 11 * n
    assert _count("aten.silu", [(6, 10)], [(6, 10)]).flops == 2 * n
    assert _count("aten.relu_", [(6, 10)], [(6, 10)]).flops == n  # in place: as relu
    assert _count("aten._softmax", [(6, 10)], [(6, 10)], {"dim": -1}).flops == 5 * n
    assert _count("aten.sum", [(6, 10)], [(6,)], {"dim": [1]}).flops == n - 6
    assert _count("aten.mean", [(6, 10)], [(6,)], {"dim": [1]}).flops == n
    assert _count("aten.max", [(6, 10), (6, 10)], [(6, 10)]).flops == n  # max.other: elementwise
    # layer norm: 5/element + 1 per affine tensor given + 5/row, with or without them
    for weights, per_element in (([], 5), ([(10,)], 6), ([(10,), (10,)], 7), ([None, None], 5)):
        count = _count("aten.native_layer_norm", [(6, 10), *weights], [(6, 10), (6, 1), (6, 1)],
                       {"normalized_shape": [10]})  # fmt: skip
        assert count.flops == per_element * n + 5 * 6


def test_an_op_without_a_rule_costs_its_bytes_and_is_uncovered():
    entry = rule_for("aten.frobnicate", ATEN)
    assert entry is NO_RULE and entry.kind == UNCOVERED
    view = _view("aten.frobnicate", [(4, 4)], [(4, 4)])
    assert count_view(entry, view) == (bytes_only(view), False) == (OpCount(0.0, 64, 64), False)


def test_a_rule_without_its_shapes_falls_back_to_bytes():
    view = _view("aten.mm", [None, (16, 4)], [(8, 4)])
    assert count_view(rule_for("aten.mm", ATEN), view) == (OpCount(0.0, 256, 128), True)
