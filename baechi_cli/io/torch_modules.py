"""PyTorch module paths of ONNX ops, and the module map of a placement.

A PyTorch model exported to ONNX keeps, in its node names or node metadata,
the module each op came from. :func:`module_path` / :func:`module_paths` turn
that into the module's qualified name as ``model.get_submodule`` takes it
(``"layer1.0.conv1"``; ``""`` is the root module); :func:`module_map` turns a
placement (one device per op) into the coarsest set of modules that
``module.to(device)`` can place, plus the ops it cannot.

Paths come from the dynamo exporter's ``pkg.torch.onnx.name_scopes`` node metadata,
else from the legacy TorchScript exporter's node names (``/layer1/layer1.0/conv1/Conv``),
whose scopes are qualified names cut short and whose repeated calls carry a suffix:
:func:`module_paths` decides those model-wide, from the initializer names. A name of any
other shape has no path (None). The names lose some information (a fused module has no
node of its own), so a module also goes with the ops that read its parameters.

:func:`module_map` walks the module tree top-down: a module whose ops all share one device
is one entry ``{path: device}``; a split module descends into its children. Ops directly
inside a split module and ops with no path are unmapped ops (``.to()`` does not place
them). :meth:`ModuleMap.to_json` is the report's ``module_map``. The derivation rules, their
known limits, the JSON and how to apply a plan: docs/formats.md, "PyTorch module paths".

Deterministic. Complexity: O(N x D) for N ops and module depth D (path lengths, for the
name parsing).

Example:
    >>> names = ["x", "/layer1/layer1.0/conv1/Conv", "/layer1/layer1.0/Add",
    ...          "/layer1/layer1.1/conv1/Conv", "/fc/Gemm"]
    >>> paths = module_paths(names)
    >>> paths
    [None, 'layer1.0.conv1', 'layer1.0', 'layer1.1.conv1', 'fc']
    >>> plan = module_map(paths, ["cuda:0", "cuda:0", "cuda:0", "cuda:1", "cuda:1"], names)
    >>> plan.modules
    {'layer1.0': 'cuda:0', 'layer1.1': 'cuda:1', 'fc': 'cuda:1'}
    >>> plan.unmapped_ops
    (UnmappedOp(op='x', module=None, device='cuda:0'),)
    >>> module_map(paths, ["cuda:0"] * 5).modules
    {'': 'cuda:0'}
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

#: Node metadata key of the dynamo exporter's module scopes.
NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"

_ATOM = r"(?:[A-Za-z_]\w*|\d+)"
_SCOPE = re.compile(rf"{_ATOM}(?:\.{_ATOM})*")
_NUMERIC_TAIL = re.compile(r"(?:\.\d+)+")
_OP = re.compile(r"[A-Za-z_]\w*")
# A legacy exporter scope of a repeated module call: "<scope>_<call index>".
CALL_SUFFIX = re.compile(r"(.*)_(\d+)")


class UnmappedOp(NamedTuple):
    """An op that ``.to()`` on the mapped modules does not place."""

    op: str  # the op's name
    module: str | None  # the module it sits directly in; None: no module path
    device: str


@dataclass(frozen=True)
class ModuleMap:
    """A placement as modules to move (see the module docstring)."""

    modules: dict[str, str]  # module path -> device, module-tree order
    unmapped_ops: tuple[UnmappedOp, ...]  # op order

    def to_json(self) -> dict[str, Any]:
        """The JSON object documented in the module docstring."""
        return {
            "modules": dict(self.modules),
            "unmapped_ops": [{"op": u.op, "module": u.module, "device": u.device} for u in self.unmapped_ops],
        }


class _Legacy(NamedTuple):
    path: str | None  # the scopes as written; None when the last one cannot be an attribute name
    first_call: str | None  # the path if the last scope's _N suffix marks a repeated call


_TF_DEVICE = re.compile(r"/device:(GPU|CPU):(\d+)")


def torch_device(name: str) -> str:
    """The torch device a device name stands for: ``/device:GPU:k`` is ``cuda:k``, any CPU ``cpu``.

    Other names (``cuda:1``, ``mps``, a YAML file's own names) are kept as they are.

    >>> torch_device("/device:GPU:1"), torch_device("/device:CPU:0"), torch_device("cuda:2")
    ('cuda:1', 'cpu', 'cuda:2')
    """
    match = _TF_DEVICE.fullmatch(name)
    if match is None:
        return name
    return f"cuda:{match.group(2)}" if match.group(1) == "GPU" else "cpu"


def module_path(node_name: str, metadata: Mapping[str, str] | None = None) -> str | None:
    """The module path of one node's op, or None when neither source gives one.

    A legacy scope ``name_N`` is kept as written unless it cannot be an
    attribute name (see the module docstring; :func:`module_paths` resolves
    it model-wide). O(length of the name or metadata).

    >>> module_path("/layer1/layer1.0/conv1/Conv"), module_path("/fc/Gemm"), module_path("/Flatten")
    ('layer1.0.conv1', 'fc', '')
    >>> module_path("/layer2/layer2.0/downsample/downsample.0/Conv"), module_path("/model/layers.0/mlp/MatMul")
    ('layer2.0.downsample.0', 'model.layers.0.mlp')
    >>> module_path("/layer1/layer1.0/relu_1/Relu"), module_path("Identity_0")
    ('layer1.0.relu_1', None)
    >>> module_path("node_relu_1", {NAME_SCOPES_KEY: "['', 'layer1', 'layer1.0', 'layer1.0.relu', 'relu_1']"})
    'layer1.0.relu'
    """
    scoped = _dynamo_path(metadata)
    if scoped is not None:
        return scoped
    legacy = _legacy_path(node_name)
    if legacy is None:
        return None
    return legacy.path if legacy.path is not None else legacy.first_call


def module_paths(
    node_names: Sequence[str],
    metadata: Sequence[Mapping[str, str] | None] | None = None,
    initializers: Collection[str] = (),
) -> list[str | None]:
    """The module path of every node's op, legacy repeated calls resolved model-wide.

    ``metadata[i]`` is node i's ``metadata_props`` as a mapping (None or
    absent: none); ``initializers`` the model's initializer names, the
    evidence that a module with a ``_N`` name exists (see the module
    docstring). O(total length of the names).

    >>> module_paths(["/layer1/layer1.0/relu/Relu", "/layer1/layer1.0/relu_1/Relu", "/conv_1/Conv"])
    ['layer1.0.relu', 'layer1.0.relu', 'conv_1']
    >>> module_paths(["/conv/Conv", "/conv_1/Conv"], initializers=["conv.weight", "conv_1.weight"])
    ['conv', 'conv_1']
    """
    dynamo = [_dynamo_path(metadata[i] if metadata is not None else None) for i in range(len(node_names))]
    legacy = [_legacy_path(name) if dynamo[i] is None else None for i, name in enumerate(node_names)]
    written = {entry.path for entry in legacy if entry is not None}
    proven: set[str] = set()  # dot-prefixes of initializer names: modules that exist
    for name in initializers:
        parts = name.split(".")
        proven.update(".".join(parts[:k]) for k in range(1, len(parts)))
    out: list[str | None] = []
    for scoped, entry in zip(dynamo, legacy):
        if scoped is not None or entry is None:
            out.append(scoped)
        elif entry.path is None or (
            entry.first_call is not None and entry.path not in proven and entry.first_call in written
        ):
            out.append(entry.first_call)
        else:
            out.append(entry.path)
    return out


def parameter_module(initializer: str) -> str | None:
    """The module owning a parameter or buffer, from its initializer's name (None: not a module path).

    Exporters name initializers after the parameters they hold
    (``layer1.0.conv1.weight``); generated names (``onnx::MatMul_12``,
    TensorFlow-style ``a/b:0``) and root-level parameters give None.

    >>> parameter_module("layer1.0.conv1.weight"), parameter_module("bn1.running_mean")
    ('layer1.0.conv1', 'bn1')
    >>> parameter_module("onnx::Conv_12"), parameter_module("pos_embedding")
    (None, None)
    """
    if not _SCOPE.fullmatch(initializer):
        return None
    module, dot, _ = initializer.rpartition(".")
    return module if dot else None


def module_map(
    paths: Sequence[str | None],
    devices: Sequence[str],
    names: Sequence[str] | None = None,
    parameter_modules: Sequence[Collection[str]] | None = None,
) -> ModuleMap:
    """The coarsest modules ``.to(device)`` can place, and the ops it cannot.

    ``paths[i]`` is op i's module path (None: none), ``devices[i]`` its
    device, ``names[i]`` its name for :class:`UnmappedOp` (default: the
    index as a string). ``parameter_modules[i]`` are the modules whose
    parameters op i reads (:func:`parameter_module` of its initializers):
    the op's device counts for them too. That matters where an exporter
    fused two modules' ops into one node: the dynamo exporter's Conv with a
    folded BatchNorm is scoped to the batch norm but reads the conv's
    weight, and without this the conv module would have no entry and its
    weight would not move. See the module docstring. O(N x D). Raises
    ValueError when the sequences differ in length.
    """
    if (
        len(devices) != len(paths)
        or (names is not None and len(names) != len(paths))
        or (parameter_modules is not None and len(parameter_modules) != len(paths))
    ):
        raise ValueError(
            f"module_map: {len(paths)} paths but {len(devices)} devices, {len(names or ())} names "
            f"or {len(parameter_modules or ())} parameter module lists"
        )
    mixed = object()  # a subtree holding several devices
    device_of: dict[str, Any] = {}  # module -> its subtree's one device, or mixed
    children: dict[str, list[str]] = {}  # module -> children, in first-op order
    direct: dict[str, list[int]] = {}  # module -> ops directly in it
    unmapped: list[int] = []
    for i, path in enumerate(paths):
        claimed = list(parameter_modules[i]) if parameter_modules is not None else []
        if path is None:
            unmapped.append(i)
        else:
            direct.setdefault(path, []).append(i)
            claimed.insert(0, path)
        for module in dict.fromkeys(claimed):
            _claim(module, devices[i], device_of, children, mixed)

    modules: dict[str, str] = {}
    if device_of:
        stack = [""]
        while stack:
            module = stack.pop()
            device = device_of[module]
            if device is not mixed:
                modules[module] = device
                continue
            unmapped.extend(direct.get(module, ()))
            stack.extend(reversed(children.get(module, ())))
    label = names if names is not None else [str(i) for i in range(len(paths))]
    return ModuleMap(modules, tuple(UnmappedOp(label[i], paths[i], devices[i]) for i in sorted(unmapped)))


def _claim(
    module: str, device: str, device_of: dict[str, Any], children: dict[str, list[str]], mixed: object
) -> None:
    """Record that ``module`` (and so each ancestor) holds an op on ``device``. O(depth)."""
    while True:  # up the ancestors, until one that this op changes nothing for
        seen = device_of.get(module)
        if seen is None:
            device_of[module] = device
            if module:
                children.setdefault(module.rpartition(".")[0], []).append(module)
        elif seen is not mixed and seen != device:
            device_of[module] = mixed
        else:
            return
        if not module:
            return
        module = module.rpartition(".")[0]


# ----------------------------------------------------------------- parsing


def _dynamo_path(metadata: Mapping[str, str] | None) -> str | None:
    """The second-to-last entry of ``pkg.torch.onnx.name_scopes``, or None."""
    text = metadata.get(NAME_SCOPES_KEY) if metadata else None
    if not text:
        return None
    try:
        scopes = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(scopes, list) and len(scopes) >= 2 and all(isinstance(s, str) for s in scopes):
        return scopes[-2]
    return None


def _legacy_path(node_name: str) -> _Legacy | None:
    """The path(s) of a ``/<scope>/.../<OpType>`` name, or None when the name has another shape."""
    if not node_name.startswith("/"):
        return None
    *scopes, op = node_name[1:].split("/")
    if not _OP.fullmatch(op):
        return None
    if not scopes:
        return _Legacy("", None)
    last = scopes[-1]
    called = CALL_SUFFIX.fullmatch(last)
    base = called.group(1) if called else None
    if base is not None and not _SCOPE.fullmatch(base):
        base = None
    if not all(_SCOPE.fullmatch(s) for s in scopes[:-1]) or (not _SCOPE.fullmatch(last) and base is None):
        return None
    first_call = _qualify([*scopes[:-1], base]) if base is not None else None
    return _Legacy(_qualify(scopes) if _SCOPE.fullmatch(last) else None, first_call)


def _qualify(scopes: list[str]) -> str:
    """Join legacy scopes into a qualified module name (see the module docstring)."""
    path = previous = ""
    for scope in scopes:
        if previous and scope.startswith(previous) and _NUMERIC_TAIL.fullmatch(scope[len(previous) :]):
            path += scope[len(previous) :]
        else:
            path = f"{path}.{scope}" if path else scope
        previous = scope
    return path
