"""A PyTorch program's training step as autograd runs it: the joint forward-backward-update graph.

:func:`joint_program` takes a program's JSON (:mod:`baechi_cli.io.pt2`), runs it once under
``make_fx`` on fake tensors (no weights, no data: only sizes) and returns the traced step as a
program of the same schema, which :func:`~baechi_cli.io.pt2.read_program` reads like any other:

1. **forward**: the program's own nodes, interpreted op for op (each target looked up among
   torch's registered operators; nothing from the file runs);
2. **loss**: the model's own output when it is one floating-point scalar, else
   ``out.float().pow(2).mean()`` summed over its floating-point outputs (the benches' loss);
3. **backward**: ``torch.autograd.grad`` of the loss with respect to every parameter: the ops,
   the tensors they keep and their order are autograd's own;
4. **update**: the optimizer as ``torch.optim`` runs it on one tensor at a time (SGD:
   ``p.add_(g, alpha=-lr)``; momentum: its buffer; Adam: ``lerp_``, ``mul_``/``addcmul_``, ``sqrt``,
   ``div``, ``add_``, ``addcdiv_``), its state as buffers of the program.

Every traced node carries ``metadata["baechi_phase"]`` (forward, loss, backward, update) and
``metadata["seq_nr"]``, autograd's sequence number: a backward node's is its forward node's.
Needs torch (``MissingDependencyError`` without it). O(nodes) traced ops.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from baechi_cli.core.errors import InputError, MissingDependencyError, one_line

#: torch dtype name -> the export schema's ScalarType value (the inverse of pt2.DTYPES).
_SCALAR_TYPES = {
    "uint8": 1,
    "int8": 2,
    "int16": 3,
    "int32": 4,
    "int64": 5,
    "float16": 6,
    "float32": 7,
    "float64": 8,
    "complex32": 9,
    "complex64": 10,
    "complex128": 11,
    "bool": 12,
    "bfloat16": 13,
    "uint16": 28,
    "uint32": 34,
    "uint64": 35,
}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SGD_LR, MOMENTUM, ADAM_BETAS, ADAM_EPS, ADAM_LR = 0.01, 0.9, (0.9, 0.999), 1e-8, 1e-3


def joint_program(
    program: Mapping[str, Any], sizes: Mapping[str, tuple[int, ...]], optimizer: str
) -> dict[str, Any]:
    """The training step of ``program`` (module docstring), as a program; ``sizes`` gives every
    placeholder's concrete shape (the reader's bound sizes)."""
    try:
        import torch
        from torch.fx import traceback as fx_traceback
        from torch.fx.experimental.proxy_tensor import make_fx
    except ImportError:
        raise MissingDependencyError(
            "--training on a PyTorch program traces it with torch: pip install torch"
        ) from None
    graph = program["graph_module"]["graph"]
    values = graph["tensor_values"]
    specs = _specs(program)
    placeholders = [name for name, _ in specs]
    params = [name for name, kind in specs if kind == "parameter"]
    state_names = _state_names(params, optimizer)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # sizes only: nothing is allocated
        examples = [
            _empty(torch, sizes[name], values[name]["dtype"], name in params) for name in placeholders
        ]
        examples += [_empty(torch, sizes[p], values[p]["dtype"], False) for _, p in state_names]
    marks: dict[str, int] = {}
    sources: list[tuple[int, Mapping[str, Any]]] = []  # (traced nodes so far, the program node run)

    def step(*flat: Any) -> Any:
        env = dict(zip(placeholders, flat[: len(placeholders)], strict=True))
        state = dict(zip((s for s, _ in state_names), flat[len(placeholders) :], strict=True))
        marks["start"] = _count()
        outputs = _run(torch, graph, env, lambda node: sources.append((_count(), node)))
        marks["forward"] = _count()
        loss = _loss(torch, outputs)
        marks["loss"] = _count()
        _label_backward(loss)
        grads = torch.autograd.grad(loss, [env[p] for p in params], allow_unused=True)
        marks["backward"] = _count()
        with torch.no_grad():
            _update(torch, optimizer, [env[p] for p in params], grads, state, state_names)
        return loss

    try:
        with fx_traceback.preserve_node_meta():
            traced = make_fx(step, tracing_mode="fake")(*examples)
    except Exception as err:  # an op torch cannot run on these sizes, or a missing operator
        raise InputError(f"--training: tracing the step with torch failed: {one_line(err, 300)}") from None
    return _as_program(torch, traced, placeholders, params, state_names, marks, specs, sources)


def _label_backward(loss: Any) -> None:
    """Give each backward node traced from here its forward node's sequence number, as
    AOTAutograd does (without it every backward node gets the last forward one's)."""
    try:
        from torch._functorch._aot_autograd.logging_utils import setup_stacktrace_preservation_hooks
    except ImportError:  # another torch: backward ops then have no forward op; the step is the same
        return
    setup_stacktrace_preservation_hooks([loss.grad_fn])


def _count() -> int:
    """How many nodes the graph being traced has so far."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    mode = get_proxy_mode()
    return len(mode.tracer.graph.nodes) if mode is not None else 0


def _specs(program: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(placeholder name, kind) in the program's input order."""
    out: list[tuple[str, str]] = []
    for spec in program["graph_module"].get("signature", {}).get("input_specs") or []:
        ((kind, body),) = spec.items()
        arg = body.get("arg") or {}
        name = arg.get("name") or (arg.get("as_tensor") or {}).get("name")
        if name:
            out.append((str(name), kind))
    return out


def _state_names(params: Sequence[str], optimizer: str) -> list[tuple[str, str]]:
    """(state placeholder name, its parameter): momentum's buffer, Adam's two moments."""
    kinds = {"sgd": (), "momentum": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq")}[optimizer]
    return [(f"{kind}__{p}", p) for p in params for kind in kinds]


def _empty(torch: Any, shape: Sequence[int], code: int, grad: bool) -> Any:
    dtype = _torch_dtype(torch, code)
    return torch.empty(tuple(shape), dtype=dtype, requires_grad=grad and dtype.is_floating_point)


_DTYPE_NAMES = {code: name for name, code in _SCALAR_TYPES.items()}


def _torch_dtype(torch: Any, code: int) -> Any:
    name = _DTYPE_NAMES.get(code)
    if name is None:
        raise InputError(f"--training: dtype {code} cannot be traced")
    return getattr(torch, name)


def _resolve(torch: Any, target: str) -> Any:
    """``torch.ops.aten.mm.default`` -> that registered operator; nothing else is looked up."""
    parts = target.split(".")
    if (
        len(parts) != 5
        or parts[:2] != ["torch", "ops"]
        or not all(_IDENTIFIER.fullmatch(p) for p in parts[2:])
    ):
        raise InputError(f"--training: cannot trace a node whose target is {target!r}")
    try:
        return getattr(getattr(getattr(torch.ops, parts[2]), parts[3]), parts[4])
    except (AttributeError, RuntimeError):
        raise InputError(f"--training: torch has no operator {target} (a custom op not loaded?)") from None


def _run(torch: Any, graph: Mapping[str, Any], env: dict[str, Any], ran: Any = None) -> list[Any]:
    """Interpret the program's nodes on ``env``; the user outputs. ``ran(node)`` is called after
    each node runs."""
    for node in graph["nodes"]:
        op = _resolve(torch, str(node["target"]))
        args, kwargs = [], {}
        for item in node.get("inputs") or []:
            value = _argument(torch, item.get("arg") or {}, env)
            if item.get("kind", 1) == 2:
                kwargs[str(item["name"])] = value
            else:
                args.append(value)
        result = op(*args, **kwargs)
        if ran is not None:
            ran(node)
        outs = node.get("outputs") or []
        if not outs or result is None:
            continue  # an assertion: nothing to bind
        if len(outs) == 1 and "as_tensors" in outs[0]:
            names, results = [t["name"] for t in outs[0]["as_tensors"]], list(result)
        elif len(outs) == 1:
            names, results = [_output_name(outs[0])], [result]
        else:
            names, results = [_output_name(o) for o in outs], list(result)
        for name, value in zip(names, results, strict=False):
            if name:
                env[name] = value
    return [env[n] for out in graph.get("outputs") or [] for n in _names(out)]


def _output_name(out: Mapping[str, Any]) -> str:
    """The name an output binds ('' for none): a tensor's ``name``, a size's ``as_name``."""
    for value in out.values():
        if isinstance(value, dict):
            return str(value.get("name") or value.get("as_name") or "")
    return ""


def _names(out: Mapping[str, Any]) -> list[str]:
    if "as_tensor" in out:
        return [out["as_tensor"]["name"]]
    if "as_tensors" in out:
        return [t["name"] for t in out["as_tensors"]]
    return []


def _argument(torch: Any, arg: Mapping[str, Any], env: Mapping[str, Any]) -> Any:
    ((kind, value),) = arg.items()
    if kind == "as_tensor":
        return env[value["name"]]
    if kind == "as_tensors":
        return [env[t["name"]] for t in value]
    if kind == "as_optional_tensor":
        return env[value["as_tensor"]["name"]] if "as_tensor" in value else None
    if kind == "as_optional_tensors":
        return [env[t["as_tensor"]["name"]] if "as_tensor" in t else None for t in value]
    if kind == "as_none":
        return None
    if kind in (
        "as_int",
        "as_float",
        "as_bool",
        "as_string",
        "as_ints",
        "as_floats",
        "as_bools",
        "as_strings",
    ):
        return value
    if kind == "as_scalar_type":
        return _torch_dtype(torch, value)
    if kind == "as_memory_format":
        return {1: torch.contiguous_format, 2: torch.channels_last, 3: torch.channels_last_3d}.get(
            value, torch.preserve_format
        )
    if kind == "as_layout":
        return torch.strided
    if kind == "as_device":
        return torch.device("cpu")
    if kind in ("as_sym_int", "as_sym_float", "as_sym_bool"):
        return env[value["as_name"]] if "as_name" in value else value.get("as_int", value)
    if kind in ("as_sym_ints",):
        return [env[v["as_name"]] if "as_name" in v else v.get("as_int") for v in value]
    raise InputError(f"--training: an argument of kind {kind} cannot be traced")


def _loss(torch: Any, outputs: Sequence[Any]) -> Any:
    floats = [o for o in outputs if isinstance(o, torch.Tensor) and o.dtype.is_floating_point]
    if not floats:
        raise InputError("--training: the program has no floating-point output to take a loss of")
    if len(floats) == 1 and floats[0].dim() == 0:
        return floats[0]
    total = None
    for out in floats:
        term = out.float().pow(2).mean()
        total = term if total is None else total + term
    return total


def _update(
    torch: Any,
    optimizer: str,
    params: Sequence[Any],
    grads: Sequence[Any],
    state: Mapping[str, Any],
    state_names: Sequence[tuple[str, str]],
) -> None:
    """One ``opt.step()`` as torch.optim's single-tensor kernels run it."""
    by_param: dict[int, list[Any]] = {}
    for (name, _), index in zip(state_names, _param_index(state_names), strict=True):
        by_param.setdefault(index, []).append(state[name])
    for i, (p, g) in enumerate(zip(params, grads, strict=True)):
        if g is None:
            continue
        if optimizer == "sgd":
            p.add_(g, alpha=-SGD_LR)
        elif optimizer == "momentum":
            (buf,) = by_param[i]
            buf.mul_(MOMENTUM).add_(g)
            p.add_(buf, alpha=-SGD_LR)
        else:
            exp_avg, exp_avg_sq = by_param[i]
            beta1, beta2 = ADAM_BETAS
            exp_avg.lerp_(g, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (exp_avg_sq.sqrt() / (1 - beta2) ** 0.5).add_(ADAM_EPS)
            p.addcdiv_(exp_avg, denom, value=-ADAM_LR / (1 - beta1))


def _param_index(state_names: Sequence[tuple[str, str]]) -> list[int]:
    order: dict[str, int] = {}
    return [order.setdefault(p, len(order)) for _, p in state_names]


def _as_program(
    torch: Any,
    traced: Any,
    placeholders: Sequence[str],
    params: Sequence[str],
    state_names: Sequence[tuple[str, str]],
    marks: Mapping[str, int],
    specs: Sequence[tuple[str, str]],
    sources: Sequence[tuple[int, Mapping[str, Any]]] = (),
) -> dict[str, Any]:
    """The traced GraphModule as a program of the export schema (the module docstring's metadata).

    ``sources``: (traced nodes counted after it ran, program node) in program order; a forward
    node's ``baechi_source`` is the program node it was traced from, and it keeps that node's
    ``nn_module_stack``; the first forward node's ``baechi_untraced`` lists the program nodes that
    traced no op."""
    import bisect
    import operator

    nodes = list(traced.graph.nodes)
    inputs = [*placeholders, *(s for s, _ in state_names)]
    rename: dict[str, str] = {}
    values: dict[str, Any] = {}
    out_nodes: list[dict[str, Any]] = []
    multi: dict[str, list[str]] = {}  # a multi-output node -> its outputs' names, by getitem index
    kinds = dict(specs)
    phase_edges = [marks.get("forward", 0), marks.get("loss", 0), marks.get("backward", 0)]
    counts = [count for count, _ in sources]
    # Program nodes that traced no op (a dtype cast to the same dtype, dropout with p=0): named on
    # the first forward op, so a plan accounts for every node of the program.
    before = [marks.get("start", 0), *counts[:-1]]
    untraced = [str(node.get("name", "")) for (count, node), b in zip(sources, before) if count == b]
    placeholder_nodes = [n for n in nodes if n.op == "placeholder"]
    for node, name in zip(placeholder_nodes, inputs, strict=True):
        rename[node.name] = name
        values[name] = _tensor_value(torch, node.meta.get("val"))
    for index, node in enumerate(nodes):
        if node.op != "call_function":
            continue
        phase = ("forward", "loss", "backward", "update")[sum(index >= m for m in phase_edges)]
        if node.target is operator.getitem:
            source, position = node.args
            names = multi.setdefault(source.name, [])
            names.extend([""] * (position + 1 - len(names)))
            if isinstance(node.meta.get("val"), torch.Tensor):  # else an output not computed
                names[position] = node.name
                rename[node.name] = node.name
                values[node.name] = _tensor_value(torch, node.meta["val"])
            continue
        if not hasattr(node.target, "_schema"):
            continue
        val = node.meta.get("val")
        record = {
            "name": node.name,
            "target": f"torch.ops.{node.target}",
            "inputs": _inputs(node, rename),
            "outputs": [],
            "metadata": {"baechi_phase": phase, "seq_nr": str(node.meta.get("seq_nr", -1))},
        }
        at = bisect.bisect_right(counts, index)
        if phase == "forward" and at < len(sources):
            program_node = sources[at][1]
            record["metadata"]["baechi_source"] = str(program_node.get("name", ""))
            stack = (program_node.get("metadata") or {}).get("nn_module_stack")
            if stack:
                record["metadata"]["nn_module_stack"] = stack

        if isinstance(val, torch.Tensor):
            record["outputs"] = [{"as_tensor": {"name": node.name}}]
            values[node.name] = _tensor_value(torch, val)
        elif isinstance(val, list | tuple):
            record["outputs"] = None  # filled from its getitems below
        else:
            continue  # a size or scalar result: nothing to place
        rename[node.name] = node.name
        out_nodes.append(record)
    first_forward = next((r for r in out_nodes if r["metadata"]["baechi_phase"] == "forward"), None)
    if untraced and first_forward is not None:
        first_forward["metadata"]["baechi_untraced"] = ",".join(untraced)
    for record in out_nodes:
        if record["outputs"] is None:
            names = multi.get(record["name"], [])
            record["outputs"] = [{"as_tensor": {"name": n}} if n else {"as_none": True} for n in names]
    input_specs = []
    for name in inputs:
        kind = kinds.get(name, "buffer")
        body_key = "parameter_name" if kind == "parameter" else "buffer_name"
        if kind == "user_input":
            input_specs.append({"user_input": {"arg": {"as_tensor": {"name": name}}}})
        else:
            input_specs.append(
                {
                    kind if kind in ("parameter", "buffer") else "buffer": {
                        "arg": {"name": name},
                        body_key: name,
                    }
                }
            )
    return {
        "graph_module": {
            "graph": {
                "inputs": [{"as_tensor": {"name": n}} for n in inputs],
                "outputs": [],
                "nodes": out_nodes,
                "tensor_values": values,
            },
            "signature": {"input_specs": input_specs},
        }
    }


def _inputs(node: Any, rename: Mapping[str, str]) -> list[dict[str, Any]]:
    """A traced node's arguments in the export schema's form, by the schema's argument names."""
    import torch.fx

    schema = node.target._schema
    out = []
    for position, argument in enumerate(schema.arguments):
        if position < len(node.args):
            value, kind = node.args[position], 1
        elif argument.name in node.kwargs:
            value, kind = node.kwargs[argument.name], 2
        else:
            continue
        out.append({"name": argument.name, "arg": _encode(value, rename, torch.fx.Node), "kind": kind})
    return out


def _encode(value: Any, rename: Mapping[str, str], node_type: type) -> dict[str, Any]:
    if isinstance(value, node_type):
        return {"as_tensor": {"name": rename.get(value.name, value.name)}}
    if isinstance(value, list | tuple) and value and all(isinstance(v, node_type) for v in value):
        return {"as_tensors": [{"name": rename.get(v.name, v.name)} for v in value]}
    if isinstance(value, list | tuple) and any(isinstance(v, node_type) for v in value):
        return {
            "as_optional_tensors": [
                {"as_tensor": {"name": rename.get(v.name, v.name)}}
                if isinstance(v, node_type)
                else {"as_none": True}
                for v in value
            ]
        }
    if value is None:
        return {"as_none": True}
    if isinstance(value, bool):
        return {"as_bool": value}
    if isinstance(value, int):
        return {"as_int": value}
    if isinstance(value, float):
        return {"as_float": value}
    if isinstance(value, list | tuple) and all(isinstance(v, bool) for v in value):
        return {"as_bools": list(value)}
    if isinstance(value, list | tuple) and all(isinstance(v, int) for v in value):
        return {"as_ints": list(value)}
    if isinstance(value, list | tuple) and all(isinstance(v, int | float) for v in value):
        return {"as_floats": [float(v) for v in value]}
    return {"as_string": str(value)}


def _tensor_value(torch: Any, val: Any) -> dict[str, Any]:
    if not isinstance(val, torch.Tensor):
        return {"dtype": 0, "sizes": []}
    name = str(val.dtype).removeprefix("torch.")
    return {"dtype": _SCALAR_TYPES.get(name, 0), "sizes": [{"as_int": int(d)} for d in val.shape]}
