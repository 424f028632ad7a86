"""Module paths of PyTorch exports and the module map of a placement.

The pure functions and a helper-built model whose node names are what the
legacy exporter writes run everywhere; the real torch exports are skipped
without torch (and the dynamo one without onnxscript).
"""

from __future__ import annotations

import copy
import itertools
import json
import random

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from baechi_cli.io.onnx import read_onnx
from baechi_cli.io.torch_modules import (
    NAME_SCOPES_KEY,
    ModuleMap,
    UnmappedOp,
    module_map,
    module_path,
    module_paths,
)

# ----------------------------------------------------------------- module_path


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("/layer1/layer1.0/conv1/Conv", "layer1.0.conv1"),
        ("/fc/Gemm", "fc"),
        ("/Flatten", ""),
        ("/Add_1", ""),  # a deduplicated node name: the op part is dropped
        ("/layer1/layer1.0/Add", "layer1.0"),
        ("/heads.0/Gemm", "heads.0"),  # a ModuleList element called from the root
        ("/layer2/layer2.0/downsample/downsample.0/Conv", "layer2.0.downsample.0"),
        ("/model/layers.0/self_attn/q_proj/MatMul", "model.layers.0.self_attn.q_proj"),
        ("/features/features.0/features.0.1/Conv", "features.0.1"),  # Sequential in Sequential
        ("/0/Conv", "0"),  # the model itself a Sequential
        ("/0/0.1/Relu", "0.1"),
        ("/layer1/layer1.0/relu_1/Relu", "layer1.0.relu_1"),  # ambiguous alone: kept
        ("/layer2/layer2.0/downsample/downsample.0_1/Conv", "layer2.0.downsample.0"),  # 0_1: a call
        ("/layer1/layer1.0/relu_1_2/Relu", "layer1.0.relu_1_2"),
    ],
)
def test_module_path_of_legacy_names(name, path):
    assert module_path(name) == path


@pytest.mark.parametrize(
    "name",
    ["Identity_0", "node_Conv_3", "a/b/MatMul", "", "/", "//Conv", "/a b/Conv", "/layer1/", "/1x/Conv"],
)
def test_names_of_another_shape_have_no_path(name):
    assert module_path(name) is None


def test_module_path_from_dynamo_metadata_wins_over_the_name():
    """name_scopes' second-to-last entry is the path; unparsable or short metadata falls back to the name."""
    scopes = {NAME_SCOPES_KEY: "['', 'layer1', 'layer1.0', 'layer1.0.relu', 'relu_1']"}
    assert module_path("/x/Relu", scopes) == "layer1.0.relu"
    assert module_path("node_mean", {NAME_SCOPES_KEY: "['', 'mean']"}) == ""
    assert module_path("/x/Relu", {NAME_SCOPES_KEY: "['relu_1']"}) == "x"
    assert module_path("/x/Relu", {NAME_SCOPES_KEY: "not a list ["}) == "x"
    assert module_path("/x/Relu", {NAME_SCOPES_KEY: "[1, 2]"}) == "x"
    assert module_path("node_relu", {"namespace": "whatever"}) is None


# ----------------------------------------------------------------- module_paths


def test_module_paths_resolve_repeated_calls_model_wide():
    """relu_1 beside relu: the second call of relu. conv_1 alone: an attribute. 0_1: always a call."""
    names = [
        "/layer1/layer1.0/relu/Relu",
        "/layer1/layer1.0/relu_1/Relu",
        "/layer1/layer1.0/relu_2/Relu",
        "/conv_1/Conv",
        "/conv_1_1/Conv",
        "/seq/seq.0_1/Conv",
        "Identity_0",
    ]
    assert module_paths(names) == [
        "layer1.0.relu",
        "layer1.0.relu",
        "layer1.0.relu",
        "conv_1",
        "conv_1",
        "seq.0",
        None,
    ]


def test_module_paths_initializers_prove_a_suffixed_attribute():
    """conv and conv_1 both attributes: conv_1.weight proves conv_1 exists. Without parameters
    they are indistinguishable from two calls of conv (the documented limit)."""
    names = ["/block/conv/Conv", "/block/conv_1/Conv"]
    assert module_paths(names, initializers=["block.conv.weight", "block.conv_1.weight"]) == [
        "block.conv",
        "block.conv_1",
    ]
    assert module_paths(names, initializers=["block.conv.weight"]) == ["block.conv", "block.conv"]


def test_module_paths_take_metadata_per_node():
    scopes = {NAME_SCOPES_KEY: "['', 'fc', 'linear']"}
    assert module_paths(["node_linear", "/relu/Relu", "/relu_1/Relu"], [scopes, None, {}]) == [
        "fc",
        "relu",
        "relu",
    ]


# ----------------------------------------------------------------- module_map


def test_whole_model_on_one_device_is_the_root():
    """Every op with a path on one device: {"": device}; ops without a path are still listed."""
    got = module_map(["layer1.0.conv1", "layer1.0", "fc", None], ["d0"] * 4, ["c", "add", "fc", "x"])
    assert got == ModuleMap({"": "d0"}, (UnmappedOp("x", None, "d0"),))


def test_split_modules_descend_and_functional_ops_are_unmapped():
    """layer1.0 split (conv1 d0, conv2 d1, Add d1 directly in it): its children get entries, the Add is
    unmapped; layer2 whole on d1 is one entry; the root's own Flatten is unmapped; tree order."""
    ops = [
        ("x", None, "d0"),
        ("stem", "conv1", "d0"),
        ("l1c1", "layer1.0.conv1", "d0"),
        ("l1bn", "layer1.0.bn1", "d0"),
        ("l1c2", "layer1.0.conv2", "d1"),
        ("l1add", "layer1.0", "d1"),
        ("l2c1", "layer2.0.conv1", "d1"),
        ("l2ds", "layer2.0.downsample.0", "d1"),
        ("l2add", "layer2.0", "d1"),
        ("flat", "", "d1"),
        ("fc", "fc", "d0"),
    ]
    names, paths, devices = (list(c) for c in zip(*ops))
    got = module_map(paths, devices, names)
    assert list(got.modules.items()) == [
        ("conv1", "d0"),
        ("layer1.0.conv1", "d0"),
        ("layer1.0.bn1", "d0"),
        ("layer1.0.conv2", "d1"),
        ("layer2", "d1"),
        ("fc", "d0"),
    ]
    assert got.unmapped_ops == (
        UnmappedOp("x", None, "d0"),
        UnmappedOp("l1add", "layer1.0", "d1"),
        UnmappedOp("flat", "", "d1"),
    )


def test_children_in_first_op_order_and_a_leaf_split_across_devices():
    """Siblings come in the order of their first op, not alphabetically; a module called twice on two
    devices (relu) has no children: its ops are unmapped."""
    paths = ["b.relu", "b.z", "b.a", "b.relu"]
    got = module_map(paths, ["d0", "d0", "d1", "d1"])
    assert list(got.modules) == ["b.z", "b.a"]
    assert got.unmapped_ops == (UnmappedOp("0", "b.relu", "d0"), UnmappedOp("3", "b.relu", "d1"))


def test_module_map_edges():
    """No ops, no paths, lengths that differ."""
    assert module_map([], []) == ModuleMap({}, ())
    assert module_map([None, None], ["d0", "d1"]).modules == {}
    with pytest.raises(ValueError, match="2 paths but 1 devices"):
        module_map(["a", "b"], ["d0"])
    with pytest.raises(ValueError):
        module_map(["a"], ["d0"], ["n", "m"])


def test_to_json_is_the_documented_shape():
    got = module_map(["a.b", "a", "c", None], ["d0", "d1", "d1", "d0"], ["ab", "a", "c", "x"]).to_json()
    assert got == {
        "modules": {"a.b": "d0", "c": "d1"},
        "unmapped_ops": [
            {"op": "a", "module": "a", "device": "d1"},
            {"op": "x", "module": None, "device": "d0"},
        ],
    }
    assert json.loads(json.dumps(got)) == got


# ----------------------------------------------------------------- through the ONNX reader, no torch


def _legacy_named_model() -> onnx.ModelProto:
    """A helper-built model with a legacy export's node names (ResNet-like block, relu called twice)."""
    F = TensorProto.FLOAT
    w = helper.make_tensor("layer1.0.conv1.weight", F, [2, 2], [1.0, 0.0, 0.0, 1.0])
    nodes = [
        helper.make_node(
            "MatMul", ["x", "layer1.0.conv1.weight"], ["c"], name="/layer1/layer1.0/conv1/MatMul"
        ),
        helper.make_node("Relu", ["c"], ["r"], name="/layer1/layer1.0/relu/Relu"),
        helper.make_node("Add", ["r", "x"], ["a"], name="/layer1/layer1.0/Add"),
        helper.make_node("Relu", ["a"], ["r2"], name="/layer1/layer1.0/relu_1/Relu"),
        helper.make_node("Neg", ["r2"], ["n"], name="Identity_0"),
        helper.make_node("Relu", ["n"], ["y"], name="relu_dyn"),
    ]
    helper.set_metadata_props(nodes[5], {NAME_SCOPES_KEY: "['', 'head', 'head.act', 'relu']"})
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F, [1, 2])],
        [helper.make_tensor_value_info("y", F, [1, 2])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_reader_records_module_paths_and_the_pipeline_can_map_them(tmp_path):
    """read_onnx puts _module on node ops that have one; module_map over all ops, as the pipeline calls it."""
    path = str(tmp_path / "m.onnx")
    onnx.save(_legacy_named_model(), path)
    g = read_onnx(path)
    paths = [g.attrs[v].get("_module") for v in range(g.num_ops)]
    assert paths == [None, "layer1.0.conv1", "layer1.0.relu", "layer1.0", "layer1.0.relu", None, "head.act"]
    devices = ["d0", "d0", "d0", "d1", "d1", "d1", "d1"]
    got = module_map(paths, devices, g.names).to_json()
    assert got == {
        "modules": {"layer1.0.conv1": "d0", "head": "d1"},
        "unmapped_ops": [
            {"op": "x", "module": None, "device": "d0"},
            {"op": "/layer1/layer1.0/relu/Relu", "module": "layer1.0.relu", "device": "d0"},
            {"op": "/layer1/layer1.0/Add", "module": "layer1.0", "device": "d1"},
            {"op": "/layer1/layer1.0/relu_1/Relu", "module": "layer1.0.relu", "device": "d1"},
            {"op": "Identity_0", "module": None, "device": "d1"},
        ],
    }


# ----------------------------------------------------------------- real torch models


def _resnet_like():
    """Stem (conv, BN, ReLU), layer1 (one block), layer2 (one block with a downsample), a ModuleList
    of two heads called from the root, and a linear classifier."""
    torch = pytest.importorskip("torch")
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
            self.layer1 = nn.Sequential(Block(8, 8, 1))
            self.layer2 = nn.Sequential(Block(8, 16, 2))
            self.heads = nn.ModuleList([nn.Linear(16, 4), nn.Linear(16, 4)])
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            x = self.layer2(self.layer1(self.relu(self.bn1(self.conv1(x)))))
            x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
            return self.fc(x) + torch.cat([h(x) for h in self.heads], 1).sum(1, keepdim=True)

    torch.manual_seed(0)
    return torch, Net().eval()


def _export(tmp_path, torch, model, **kwargs) -> str:
    path = str(tmp_path / "model.onnx")
    torch.onnx.export(model, (torch.randn(2, 3, 16, 16),), path, input_names=["x"], **kwargs)
    return path


def _covering(path: str, keys) -> list[str]:
    """The map keys that are ``path`` or one of its ancestors."""
    return [k for k in keys if k == "" or path == k or path.startswith(k + ".")]


def _placements(paths: list[str | None]) -> dict[str, list[str]]:
    """Made-up placements over gpu0/gpu1: cuts at several points of the ops that have a module path
    (the others on gpu0), alternating ops, seeded random ops, and everything on gpu1."""
    rank = [0, *itertools.accumulate(p is not None for p in paths)]  # ops with a path before op i
    n = rank[-1]
    out = {
        f"cut{c}": ["gpu0" if p is None or rank[i] < c * n // 8 else "gpu1" for i, p in enumerate(paths)]
        for c in range(1, 8)
    }
    out["alternate"] = ["gpu0" if i % 2 == 0 else "gpu1" for i in range(len(paths))]
    rng = random.Random(0)
    out["random"] = [rng.choice(["gpu0", "gpu1"]) for _ in paths]
    out["one"] = ["gpu1"] * len(paths)
    return out


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_module_map_applies_to_the_real_model(tmp_path):
    """Legacy export (BatchNorm kept): for each made-up placement every key is a submodule, every
    parameter and buffer is covered by exactly one key, on the device of its module's ops, and
    applying the map with gpu1 -> meta (gpu0 -> cpu) moves exactly those tensors."""
    torch, model = _resnet_like()
    path = _export(
        tmp_path,
        torch,
        model,
        dynamo=False,
        training=torch.onnx.TrainingMode.PRESERVE,
        do_constant_folding=False,
    )
    g = read_onnx(path)
    paths = [g.attrs[v].get("_module") for v in range(g.num_ops)]
    assert "layer1.0.relu" in paths and "layer2.0.downsample.0" in paths and "heads.1" in paths
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    for label, devices in _placements(paths).items():
        plan = module_map(paths, devices, g.names)
        keys = list(plan.to_json()["modules"])
        for key in keys:
            model.get_submodule(key)  # raises when the path does not exist
        expected: dict[str, str] = {}
        for name in tensors:
            owner = name.rpartition(".")[0]
            covering = _covering(owner, keys)
            assert len(covering) == 1, (label, name, covering)
            own = {d for p, d in zip(paths, devices) if p == owner}
            assert own <= {plan.modules[covering[0]]}, (label, name)
            expected[name] = "meta" if plan.modules[covering[0]] == "gpu1" else "cpu"
        moved = copy.deepcopy(model)
        for key, device in plan.to_json()["modules"].items():
            moved.get_submodule(key).to({"gpu0": "cpu", "gpu1": "meta"}[device])
        got = {
            n: t.device.type
            for n, t in (dict(moved.named_parameters()) | dict(moved.named_buffers())).items()
        }
        assert got == expected, label
    assert module_map(paths, _placements(paths)["one"]).modules == {"": "gpu1"}
    split = module_map(paths, _placements(paths)["cut3"])
    assert "layer1.0" not in split.modules and len(split.modules) > 3


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_module_map_of_an_eval_export_misses_folded_batchnorm(tmp_path):
    """The documented limit: the default eval export folds BatchNorm into Conv, so when a block is split
    its BatchNorms have no key; every key still names a real submodule."""
    torch, model = _resnet_like()
    path = _export(tmp_path, torch, model, dynamo=False)
    g = read_onnx(path)
    paths = [g.attrs[v].get("_module") for v in range(g.num_ops)]
    assert not any(p and ".bn" in p for p in paths)
    devices = ["gpu0" if p is None or not p.startswith("layer1.0.conv2") else "gpu1" for p in paths]
    plan = module_map(paths, devices, g.names)
    for key in plan.modules:
        model.get_submodule(key)
    assert "layer1.0.conv2" in plan.modules and not _covering("layer1.0.bn1", plan.modules)


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
def test_dynamo_export_paths_are_real_submodules(tmp_path):
    """The dynamo exporter's name_scopes metadata gives module paths; each is a submodule of the model."""
    torch, model = _resnet_like()
    pytest.importorskip("onnxscript")
    path = _export(tmp_path, torch, model, dynamo=True, verbose=False)
    g = read_onnx(path)
    paths = [g.attrs[v].get("_module") for v in range(g.num_ops)]
    found = {p for p in paths if p is not None}
    assert {"layer1.0.relu", "layer2.0", "heads.0", "fc", ""} <= found
    for p in found:
        model.get_submodule(p)
    devices = ["gpu0" if p is None or p < "layer2" else "gpu1" for p in paths]
    plan = module_map(paths, devices, g.names)
    assert plan.modules["layer2"] == "gpu1"


def test_parameters_read_by_a_fused_node_place_their_module():
    """The dynamo exporter folds BatchNorm into the Conv before it and scopes the fused node to
    the batch norm; the conv module has no node left, only its weight, read by that node."""
    paths = ["bn1", "relu", "layer1.conv", "layer1.relu"]
    owners = [["conv1"], [], ["layer1.conv"], []]
    devices = ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    plan = module_map(paths, devices, parameter_modules=owners)
    assert plan.modules == {"bn1": "cuda:0", "conv1": "cuda:0", "relu": "cuda:0", "layer1": "cuda:1"}
    # without the weights' owners conv1 would stay behind
    assert "conv1" not in module_map(paths, devices).modules
    # an op of no module still places the module of the parameters it reads
    assert module_map([None, "a"], ["cuda:1", "cuda:0"], ["w_reader", "x"], [["b"], []]).modules == {
        "b": "cuda:1",
        "a": "cuda:0",
    }
    with pytest.raises(ValueError, match="parameter module lists"):
        module_map(paths, devices, parameter_modules=owners[:2])


def test_dynamo_style_export_maps_the_folded_modules(tmp_path):
    """A model shaped like the dynamo exporter's output (node metadata scopes, initializers named
    after parameters), through the pipeline: the conv whose batch norm absorbed it is mapped."""
    from baechi_cli.app.place import PlaceOptions, prepare
    from baechi_cli.core.devices import parse_devices
    from baechi_cli.io.onnx import module_map_of

    def scoped(node, *scopes):
        entry = node.metadata_props.add()
        entry.key, entry.value = NAME_SCOPES_KEY, repr(["", *scopes, node.name])
        return node

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    inits = [
        numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "conv1.weight"),
        numpy_helper.from_array(np.ones(4, np.float32), "bn1.bias"),
        numpy_helper.from_array(np.ones((4, 4), np.float32), "fc.weight"),
    ]
    nodes = [
        scoped(
            helper.make_node(
                "Conv", ["x", "conv1.weight", "bn1.bias"], ["c"], name="node_Conv_0", pads=[1] * 4
            ),
            "bn1",
        ),
        scoped(helper.make_node("Relu", ["c"], ["r"], name="node_relu"), "relu"),
        scoped(helper.make_node("GlobalAveragePool", ["r"], ["p"], name="node_pool"), "pool"),
        scoped(helper.make_node("Flatten", ["p"], ["f"], name="node_flatten")),
        scoped(helper.make_node("MatMul", ["f", "fc.weight"], ["y"], name="node_fc"), "fc"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", 20)]
    )
    path = tmp_path / "dynamo_like.onnx"
    onnx.save(model, str(path))
    prepared = prepare(str(path), parse_devices("2x8GB"), PlaceOptions(), lambda _: None)
    names = prepared.graph.names
    # a made-up split: the fused conv and relu on one device, the rest on the other
    device_name = ["gpu1" if n in ("x", "node_Conv_0", "node_relu") else "gpu0" for n in names]
    plan = module_map_of(prepared.graph, prepared.model_ops, device_name)
    assert plan.modules == {"bn1": "gpu1", "conv1": "gpu1", "relu": "gpu1", "pool": "gpu0", "fc": "gpu0"}
    assert [u.op for u in plan.unmapped_ops] == ["node_flatten"]
