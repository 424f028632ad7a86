"""A PyTorch program's training step as autograd runs it: the joint forward-backward-update graph.

:func:`joint_program` takes a program's JSON (:mod:`baechi_cli.io.pt2`), runs it once on meta
tensors (no weights, no data: only sizes), recording each op torch dispatches as ``make_fx`` would
trace it (a dispatch mode that keeps no proxies; ``make_fx`` on fake tensors traces what it
leaves), and returns
the traced step as a program of the same schema, which :func:`~baechi_cli.io.pt2.read_program`
reads like any other:

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
``metadata["seq_nr"]``, autograd's sequence number: a backward node's is its forward node's; a
node whose CPU kernel allocates scratch beyond its outputs, ``metadata["baechi_workspace_bytes"]``
(:func:`_cpu_workspace_bytes`). The graph's ``baechi_saved`` lists [tensor, sequence number] per
tensor an autograd node saved (the recorder's trace only); its ``baechi_write_groups``, the
program nodes that must run in one process (a tensor written in place and read around the write,
:func:`~baechi_cli.io.aliasing.write_groups`); its ``baechi_program_inputs``, per program node the
nodes whose tensors it takes (:func:`_program_inputs`).
Needs torch (``MissingDependencyError`` without it). O(nodes) traced ops.
"""

from __future__ import annotations

import functools
import gc
import re
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from baechi_cli.core.errors import InputError, MissingDependencyError, one_line
from baechi_cli.io.aliasing import Access, program_accesses, write_groups

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
    except ImportError:
        raise MissingDependencyError(
            "--training on a PyTorch program traces it with torch: pip install torch"
        ) from None
    _freeze_torch()
    graph = program["graph_module"]["graph"]
    specs = _specs(program)
    placeholders = [name for name, _ in specs]
    params = [name for name, kind in specs if kind == "parameter"]
    state_names = _state_names(params, optimizer)

    traces: list[_Trace] = []

    def run(tracer: Callable[..., Any]) -> Any:
        traces.append(_Trace(torch, graph, placeholders, params, state_names, optimizer))
        with fx_traceback.preserve_node_meta():  # the sequence numbers _label_backward sets
            return tracer(torch, traces[-1], sizes)

    traced, stub = None, _DynamoStub(torch)
    if not stub.imported:
        with stub:
            traced = run(_trace_recorded)
    if traced is None and (stub.imported or stub.asked):  # the recorder with torch._dynamo
        traced = run(_trace_recorded)
    if traced is None:  # anew: what the recorder left half done must not reach make_fx
        traced = run(_trace_with_make_fx)
    trace = traces[-1]
    step = _as_program(
        torch, traced, placeholders, params, state_names, trace.marks, specs, trace.sources, trace.saved
    )
    accesses = program_accesses(graph["nodes"], functools.partial(_schema, torch))
    step["graph_module"]["graph"]["baechi_write_groups"] = write_groups(accesses)
    step["graph_module"]["graph"]["baechi_program_inputs"] = _program_inputs(accesses)
    return step


def _program_inputs(accesses: Sequence[Access]) -> dict[str, list[str]]:
    """Per program node, the program nodes whose tensors it takes (``type_as``'s ``other``,
    ``zeros_like``'s input: read for their dtype or size alone, so the traced ops may not read
    them), in program order."""
    made_by: dict[str, str] = {}
    out: dict[str, list[str]] = {}
    for access in accesses:
        takes = []
        for tensor in access.reads:
            maker = made_by.get(tensor)
            if maker is not None and maker != access.node and maker not in takes:
                takes.append(maker)
        if takes:
            out[access.node] = takes
        for tensor in access.makes:
            made_by[tensor] = access.node
    return out


def _schema(torch: Any, target: str) -> Any:
    """The schema of the operator ``target`` names (None: not one of torch's registered ops)."""
    try:
        return getattr(_resolve(torch, target), "_schema", None)
    except InputError:
        return None


@functools.cache
def _freeze_torch() -> None:
    """Move the objects alive once torch is imported, torch's own for the most part, out of the
    cyclic garbage collector's sight (``gc.freeze``): they live as long as the process, and every
    full collection after, the interpreter's last ones at exit included, would walk them all.
    Reference counting still frees any of them that is let go; only a reference cycle alive at
    this moment stays uncollected. Once per process."""
    gc.freeze()


class _DynamoStub:
    """``with _DynamoStub(torch):`` runs torch's Python meta kernels without importing
    ``torch._dynamo``, which takes longer than the trace itself (bench/pt2_speed.md).

    Torch wraps those kernels, and every dispatch mode's ``__torch_dispatch__``, in
    ``torch._disable_dynamo``, which imports ``torch._dynamo`` at the first call only to wrap the
    function so that ``torch.compile`` does not trace into it; outside ``torch.compile`` the
    wrapped function runs as the function itself. Inside the block ``torch._dynamo`` is a module
    whose ``disable(fn)`` is ``fn``; anything else asked of it raises and sets ``asked`` (the
    caller then traces again with torch's own). On leaving, the stub and the wrappers torch
    cached on the functions it wrapped are removed, so a later call imports ``torch._dynamo`` and
    wraps them as usual. ``imported``: ``torch._dynamo`` was imported already (nothing to save:
    the block changes nothing)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.imported = "torch._dynamo" in sys.modules
        self.asked = False
        self.wrapped: list[Any] = []

    def __enter__(self) -> _DynamoStub:
        if self.imported:
            return self
        stub = types.ModuleType("torch._dynamo")

        def disable(fn: Any = None, recursive: bool = True, **_: Any) -> Any:
            self.wrapped.append(fn)
            return fn

        def missing(name: str) -> Any:
            self.asked = True
            raise AttributeError(f"torch._dynamo.{name} (baechi's stand-in has only disable)")

        stub.disable = disable  # type: ignore[attr-defined]
        stub.__getattr__ = missing  # type: ignore[method-assign]
        sys.modules["torch._dynamo"] = stub
        return self

    def __exit__(self, *exc: object) -> None:
        if self.imported:
            return
        del sys.modules["torch._dynamo"]
        self.torch.__dict__.pop("_dynamo", None)
        for fn in self.wrapped:
            fn.__dict__.pop("__dynamo_disable", None)


class _Trace:
    """The step a tracer runs (module docstring), and what it notes as it runs: ``marks`` (the
    traced graph's node count as each phase starts and ends) and ``sources`` (the node count after
    each program node ran, and that node). ``count()`` is the traced graph's node count."""

    def __init__(
        self,
        torch: Any,
        graph: Mapping[str, Any],
        placeholders: Sequence[str],
        params: Sequence[str],
        state_names: Sequence[tuple[str, str]],
        optimizer: str,
    ) -> None:
        self.torch, self.graph, self.optimizer = torch, graph, optimizer
        self.placeholders, self.params, self.state_names = placeholders, params, state_names
        self.marks: dict[str, int] = {}
        self.sources: list[tuple[int, Mapping[str, Any]]] = []
        self.saved: list[tuple[str, int]] = []  # (node name, sequence number): _saved_tensors
        self.node_name: Callable[[Any], str | None] | None = None  # the recorder's; None: not read
        self.count: Callable[[], int] = _count
        self.device: Any = None  # where the program's tensors are made: "cpu" (fake) or "meta"

    def examples(self, sizes: Mapping[str, tuple[int, ...]], device: str) -> list[Any]:
        """Every placeholder's tensor, then the optimizer state's, on ``device``: ``"cpu"`` for
        fake tensors (the caller's FakeTensorMode active), ``"meta"`` for meta tensors. Neither
        allocates: only sizes."""
        torch, values, params = self.torch, self.graph["tensor_values"], set(self.params)
        self.device = torch.device(device)
        out = [_empty(torch, sizes[n], values[n]["dtype"], n in params, device) for n in self.placeholders]
        return out + [_empty(torch, sizes[p], values[p]["dtype"], False, device) for _, p in self.state_names]

    def step(self, *flat: Any) -> Any:
        torch, placeholders, params, count = self.torch, self.placeholders, self.params, self.count
        env = dict(zip(placeholders, flat[: len(placeholders)], strict=True))
        state = dict(zip((s for s, _ in self.state_names), flat[len(placeholders) :], strict=True))
        self.marks["start"] = count()
        outputs = interpret(
            torch, self.graph, env, lambda node: self.sources.append((count(), node)), self.device
        )
        self.marks["forward"] = count()
        loss = _loss(torch, outputs)
        if self.node_name is not None:  # unrecorded: unpacking a saved output dispatches a detach
            with torch._C._DisableTorchDispatch():
                self.saved = _saved_tensors(torch, loss, self.node_name)
        self.marks["loss"] = count()
        _label_backward(loss)
        grads = torch.autograd.grad(loss, [env[p] for p in params], allow_unused=True)
        self.marks["backward"] = count()
        with torch.no_grad():
            _update(torch, self.optimizer, [env[p] for p in params], grads, state, self.state_names)
        return loss


def _trace_with_make_fx(torch: Any, trace: _Trace, sizes: Mapping[str, tuple[int, ...]]) -> Any:
    """The step traced by torch's ``make_fx`` on fake tensors: the traced ``GraphModule``."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode():  # make_fx finds the examples' mode and traces on it
        examples = trace.examples(sizes, "cpu")
    try:
        return make_fx(trace.step, tracing_mode="fake")(*examples)
    except Exception as err:  # an op torch cannot run on these sizes, or a missing operator
        raise InputError(f"--training: tracing the step with torch failed: {one_line(err, 300)}") from None


def _trace_recorded(torch: Any, trace: _Trace, sizes: Mapping[str, tuple[int, ...]]) -> Any:
    """The step traced as ``make_fx`` traces it, by the recorder of :func:`_recorder_class`, on
    meta tensors: the same nodes, names, sizes and sequence numbers without ``make_fx``'s proxies
    (per op: a proxy per argument and result, pytree walks, constant tracking) or its fake
    tensors (a cache key per op). None when the step does what the recorder leaves to ``make_fx``
    (``_Unsupported``) or fails otherwise: the caller then traces it with
    :func:`_trace_with_make_fx`, which raises what it raises. A target the step refuses is
    refused here as that path refuses it."""
    recorder = _recorder_class()()
    trace.count, trace.node_name = recorder.count, recorder.node_name
    try:
        examples = trace.examples(sizes, "meta")
        recorder.placeholders(examples)
        with recorder:
            trace.step(*examples)
    except InputError as err:
        raise InputError(f"--training: tracing the step with torch failed: {one_line(err, 300)}") from None
    except Exception:  # whatever the recorder does not follow, make_fx traces
        return None
    finally:
        trace.count = _count
    return recorder


def _label_backward(loss: Any) -> None:
    """Give each backward node traced from here its forward node's sequence number, as
    AOTAutograd's ``setup_stacktrace_preservation_hooks`` does (without it every backward node
    gets the last forward one's): a hook before each autograd node runs pushes its sequence
    number, one after it pops it. The stack traces that function also keeps are not needed."""
    from torch.fx import traceback as fx_traceback

    def before(seq_nr: int) -> Callable[[Any], None]:
        return lambda grad_outputs: fx_traceback.set_grad_fn_seq_nr(seq_nr)

    def after(grad_inputs: Any, grad_outputs: Any) -> None:
        fx_traceback.reset_grad_fn_seq_nr()

    if loss.grad_fn is None:
        return
    seen = {loss.grad_fn}
    queue = [loss.grad_fn]
    for node in queue:  # breadth first, as that function walks the graph
        for fn, _ in node.next_functions:
            if fn is not None and fn not in seen:
                seen.add(fn)
                queue.append(fn)
        node.register_prehook(before(node._sequence_nr()))
        node.register_hook(after)


class _Unsupported(Exception):
    """What the recorder (:func:`_recorder_class`) leaves to ``make_fx``."""


class _Val:
    """A traced tensor's dtype, shape and strides, as its node's ``meta["val"]`` (``make_fx`` keeps
    a fake tensor there; this is what :func:`_as_program` reads of it)."""

    __slots__ = ("dtype", "shape", "strides")

    def __init__(self, tensor: Any) -> None:
        self.dtype, self.shape, self.strides = tensor.dtype, tuple(tensor.shape), tuple(tensor.stride())

    def stride(self) -> tuple[int, ...]:
        return self.strides


def _is_tensor(torch: Any, val: Any) -> bool:
    return isinstance(val, torch.Tensor | _Val)


@functools.cache
def _recorder_class() -> Any:
    """The recorder's class, made once torch is imported (this module does not import torch)."""
    import operator

    import torch
    from torch.fx import traceback as fx_traceback
    from torch.utils._python_dispatch import TorchDispatchMode, autograd_would_have_decomposed
    from torch.utils.weak import WeakTensorKeyDictionary

    aten = torch.ops.aten
    kept = {aten.size.default, aten.stride.default, aten.storage_offset.default}  # never decomposed
    refused = {aten.is_nonzero.default, aten.lift_fresh.default}  # make_fx rewrites them
    passed = torch.ops.prim.device.default  # a fake tensor's device: answered, not recorded
    data_dependent = torch.Tag.data_dependent_output
    tensor_type = torch.Tensor
    primitive = (bool, int, float, complex, str)
    device_type, cpu = torch.device, torch.device("cpu")
    convolutions = {aten.convolution.default, aten.convolution_backward.default}

    class Recorder(TorchDispatchMode):
        """Records every op dispatched on its watch into ``graph`` (a ``torch.fx.Graph``) as
        ``make_fx`` (``proxy_call``) does: a node per op, named by its overload packet, its
        tensor arguments the nodes that made them, one ``getitem`` per element of a tuple result,
        ``meta["seq_nr"]`` as ``torch.fx.proxy`` numbers it, ``meta["val"]`` a :class:`_Val`; an
        op autograd would have decomposed is decomposed. Raises :class:`_Unsupported` where
        make_fx does more: a tensor no op made (a constant), a data-dependent op (make_fx may
        answer it from a constant), ``lift_fresh``, a result other than tensors and numbers."""

        def __init__(self) -> None:
            super().__init__()
            self.graph = torch.fx.Graph()
            # weakly, as make_fx's tracker: a tensor held here would be copied where torch
            # reuses a tensor no one else holds (make_variable), a detach make_fx does not see
            self.node_of = WeakTensorKeyDictionary()
            self.decomposes: dict[tuple[Any, bool], bool] = {}

        @classmethod
        def _should_skip_dynamo(cls) -> bool:  # nothing here is compiled: no dynamo wrapper per op
            return False

        def count(self) -> int:
            return len(self.graph.nodes)

        def placeholders(self, examples: Sequence[Any]) -> None:
            for i, example in enumerate(examples):
                node = self.graph.create_node("placeholder", f"arg{i}", name=f"arg{i}_1")
                self._track(example, node)

        def _track(self, tensor: Any, node: Any) -> None:
            node.meta["val"] = _Val(tensor)
            self.node_of[tensor] = node

        def node_name(self, tensor: Any) -> str | None:
            """The traced node that made ``tensor``; None for a placeholder's or one no traced node
            made (a saved output, unpacked anew: its backward reads it through a traced
            ``detach``)."""
            node = self.node_of.get(tensor)
            return None if node is None or node.op == "placeholder" else node.name

        def _arg(self, value: Any) -> Any:
            if isinstance(value, tensor_type):
                node = self.node_of.get(value)
                if node is None:
                    raise _Unsupported("a tensor constant")
                return node
            if isinstance(value, list):
                return [self._arg(v) for v in value]
            if isinstance(value, tuple):
                return tuple(self._arg(v) for v in value)
            if isinstance(value, device_type) and value.type == "meta":  # the program runs on CPU
                return cpu
            return value

        def _seq_nr(self) -> int:
            current = fx_traceback.get_current_meta()
            if current.get("in_grad_fn", 0) > 0:
                return current["grad_fn_seq_nr"][-1]
            return torch.autograd._get_sequence_nr() - 1

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is passed:
                return func(*args, **kwargs)
            if func in refused or data_dependent in func.tags:
                raise _Unsupported(str(func))
            if func not in kept:
                first = _first_tensor((args, kwargs), tensor_type)
                key = (func, first is not None)
                decomposes = self.decomposes.get(key)
                if decomposes is None:
                    decomposes = self.decomposes[key] = autograd_would_have_decomposed(
                        func, [] if first is None else [first]
                    )
                if decomposes:
                    with self:
                        out = func.decompose(*args, **kwargs)
                    if out is not NotImplemented:
                        return out
            node = self.graph.create_node(
                "call_function",
                func,
                self._arg(args),
                {k: self._arg(v) for k, v in kwargs.items()},
                name=self.graph._target_to_str(func.overloadpacket.__name__),
            )
            node.meta["seq_nr"] = self._seq_nr()
            out = func(*args, **kwargs)
            if func in convolutions:
                out = _cpu_conv_layout(torch, func, args, kwargs, out)
            if isinstance(out, tensor_type):
                self._track(out, node)
            elif isinstance(out, list | tuple):
                node.meta["val"] = [_Val(o) if isinstance(o, tensor_type) else o for o in out]
                for index, element in enumerate(out):
                    item = self.graph.create_node("call_function", operator.getitem, (node, index), {})
                    item.meta["seq_nr"] = self._seq_nr()
                    if isinstance(element, tensor_type):
                        self._track(element, item)
                    elif element is not None and not isinstance(element, primitive):
                        raise _Unsupported(f"{func} returned a {type(element).__name__} in a tuple")
            elif out is not None and not isinstance(out, primitive):
                raise _Unsupported(f"{func} returned a {type(out).__name__}")
            return out

    return Recorder


def _cpu_conv_layout(torch: Any, func: Any, args: Any, kwargs: Any, out: Any) -> Any:
    """A convolution's (or its backward's) meta result in the memory format CPU's kernel gives
    it, as a fake CPU tensor has it (torch's ``fake_impls.conv``): the backend CPU selects for
    these sizes and strides decides (:func:`_cpu_conv_format`). What a later op decomposes into
    can depend on it (a transpose of a channels-last output is contiguous)."""
    layout = _cpu_conv_format(torch, _named_args(func, args, kwargs))

    def convert(t: Any) -> Any:
        if t is None:
            return t
        if t.dim() == 3 and layout == torch.channels_last:
            return t.unsqueeze(2).to(memory_format=layout).squeeze(2)
        return t.to(memory_format=layout)

    if func is torch.ops.aten.convolution.default:
        return convert(out)
    return (convert(out[0]), convert(out[1]), out[2])


def _cpu_conv_format(torch: Any, named: Mapping[str, Any]) -> Any:
    """The memory format CPU's convolution kernel runs a call in (``named``: its arguments by schema
    name; fake or meta tensors), asked of CPU tensors of the same sizes and strides that are
    never written (so never touched): torch's own choice of backend and layout."""
    source, weight = named["input"], named["weight"]

    def on_cpu(t: Any) -> Any:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")

    source, weight = on_cpu(source), on_cpu(weight)
    bias = named.get("bias")
    select = {
        "stride": named["stride"],
        "padding": named["padding"],
        "dilation": named["dilation"],
        "transposed": named["transposed"],
        "output_padding": named["output_padding"],
        "groups": named["groups"],
        "bias": None if bias is None else on_cpu(bias),
    }
    if bias is None:
        select["bias_sizes"] = named.get("bias_sizes")
    backend = torch._C._select_conv_backend(source, weight, **select)
    if weight.ndim == 3:  # 1-d: as 2-d, as the backend sees it
        source, weight = source.contiguous().unsqueeze(2), weight.unsqueeze(2)
    return torch._C._conv_determine_backend_memory_format(source, weight, backend)


def _named_args(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """An operator call's arguments by their schema names."""
    named = dict(zip((a.name for a in op._schema.arguments), args, strict=False))
    named.update(kwargs)
    return named


def _saved_tensors(torch: Any, loss: Any, node_name: Callable[[Any], str | None]) -> list[tuple[str, int]]:
    """(``node_name(tensor)``, sequence number) per tensor an autograd node behind ``loss`` saves
    (those ``node_name`` names): the engine keeps it until the node's backward has run, whether
    its formula reads the data or only the sizes (``gather`` saves its input). O(autograd
    nodes)."""
    out: list[tuple[str, int]] = []
    seen = set()
    queue = [loss.grad_fn]
    for node in queue:
        if node is None or node in seen:
            continue
        seen.add(node)
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            try:
                value = getattr(node, attr)
            except RuntimeError:  # freed or not a value
                continue
            for t in value if isinstance(value, list | tuple) else (value,):
                made_by = node_name(t) if isinstance(t, torch.Tensor) else None
                if made_by is not None:
                    out.append((made_by, node._sequence_nr()))
        queue.extend(n for n, _ in node.next_functions)
    return out


# Bytes per weight element that CPU's oneDNN (torch 2.13) allocates while computing a depthwise
# convolution's weight gradient from a channels-last input with a kernel of 5 x 5 or more, or with
# an input fewer rows high than the kernel: measured with torch.profiler's allocations (k = 3, 5,
# 7, 9; C = 16 to 640; batch, image size, stride and threads changed nothing). A 3 x 3 kernel on
# an input of 3 rows or more takes another path that allocates almost nothing.
DEPTHWISE_WEIGHT_GRAD_WORKSPACE = 1028


def _cpu_workspace_bytes(torch: Any, node: Any) -> int:
    """Scratch that CPU's kernel for a traced node allocates while it runs, beyond its outputs: so
    far a depthwise ``convolution_backward``'s weight gradient when CPU's kernel runs it
    channels-last (:func:`_cpu_conv_format`; :data:`DEPTHWISE_WEIGHT_GRAD_WORKSPACE` per weight
    element, kernels of 5 x 5 or more or inputs fewer rows high than the kernel); 0 for anything
    else. It is per call: a microbatch's is the minibatch's."""
    if node.target is not torch.ops.aten.convolution_backward.default:
        return 0
    named = _named_args(node.target, node.args, node.kwargs)
    source = getattr(named.get("input"), "meta", {}).get("val")
    weight = getattr(named.get("weight"), "meta", {}).get("val")
    mask = named.get("output_mask") or (True, True, True)
    if source is None or weight is None or named.get("transposed") or not mask[1] or len(source.shape) != 4:
        return 0
    channels, kh, kw = source.shape[1], weight.shape[2], weight.shape[3]
    depthwise = named.get("groups") == channels > 1 and weight.shape[0] == channels and weight.shape[1] == 1
    if not depthwise or (min(kh, kw) < 5 and source.shape[2] >= kh):
        return 0
    layout = _cpu_conv_format(torch, {**named, "input": source, "weight": weight})
    return channels * kh * kw * DEPTHWISE_WEIGHT_GRAD_WORKSPACE if layout == torch.channels_last else 0


def _first_tensor(value: Any, tensor_type: type) -> Any:
    """The first tensor in nested lists, tuples and dicts (None: none)."""
    if isinstance(value, tensor_type):
        return value
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else ()
    for item in items:
        found = _first_tensor(item, tensor_type)
        if found is not None:
            return found
    return None


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


def _empty(torch: Any, shape: Sequence[int], code: int, grad: bool, device: str) -> Any:
    dtype = torch_dtype(torch, code)
    return torch.empty(
        tuple(shape), dtype=dtype, device=device, requires_grad=grad and dtype.is_floating_point
    )


_DTYPE_NAMES = {code: name for name, code in _SCALAR_TYPES.items()}


def torch_dtype(torch: Any, code: int) -> Any:
    """The torch dtype of an export schema ScalarType code; InputError for one it has no name for."""
    name = _DTYPE_NAMES.get(code)
    if name is None:
        raise InputError(f"--training: dtype {code} cannot be traced")
    return getattr(torch, name)


# The installed package that registers a namespace's custom ops, by namespace: imported when a
# program needs one of them (that package's own code, never anything from the file). transformers
# exports its mixture-of-experts layers (the default ``grouped_mm`` experts, in float32 or on CPU)
# through ``transformers::grouped_mm_fallback``.
OP_LIBRARIES: dict[str, str] = {"transformers": "transformers.integrations.moe"}


def load_op_library(namespace: str) -> bool:
    """Import the package :data:`OP_LIBRARIES` names for ``namespace``; whether one was imported
    (False: no entry, or the package is not installed)."""
    import importlib

    module = OP_LIBRARIES.get(namespace)
    if module is None:
        return False
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def op_namespaces(graph: Any) -> list[str]:
    """The namespaces of an fx graph's custom operators (not ``aten``/``prims``), sorted."""
    return sorted(
        {
            getattr(node.target, "namespace", "")
            for node in graph.nodes
            if node.op == "call_function"
            and getattr(node.target, "namespace", "aten") not in ("aten", "prims")
        }
        - {""}
    )


def _resolve(torch: Any, target: str) -> Any:
    """``torch.ops.aten.mm.default`` -> that registered operator; nothing else is looked up. A
    custom op not yet registered is looked up again after :func:`load_op_library`."""
    parts = target.split(".")
    if (
        len(parts) != 5
        or parts[:2] != ["torch", "ops"]
        or not all(_IDENTIFIER.fullmatch(p) for p in parts[2:])
    ):
        raise InputError(f"--training: cannot trace a node whose target is {target!r}")
    for attempt in range(2):
        try:
            return getattr(getattr(getattr(torch.ops, parts[2]), parts[3]), parts[4])
        except (AttributeError, RuntimeError):
            if attempt or not load_op_library(parts[2]):
                break
    package = OP_LIBRARIES.get(parts[2])
    needs = f"install {package.split('.')[0]}, which registers it" if package else "a custom op not loaded?"
    raise InputError(f"--training: torch has no operator {target} ({needs})") from None


def interpret(
    torch: Any,
    graph: Mapping[str, Any],
    env: dict[str, Any],
    ran: Callable[[Mapping[str, Any]], None] | None,
    device: Any,
    call: Callable[[Mapping[str, Any], Any, list[Any], dict[str, Any]], Any] | None = None,
) -> list[Any]:
    """Interpret a program graph's nodes on ``env`` (tensor name -> value, the inputs' bound
    before); the user outputs. Each node's target is looked up among torch's registered
    operators (nothing from the program runs) and called, or handed with its arguments to
    ``call(node, op, args, kwargs)``, which returns what the op returns (a timer); ``ran(node)``
    is called after each node runs; a node's device argument is ``device`` (the program was
    exported on CPU). Needs torch. O(nodes)."""
    for node in graph["nodes"]:
        op = _resolve(torch, str(node["target"]))
        args, kwargs = [], {}
        for item in node.get("inputs") or []:
            value = _argument(torch, item.get("arg") or {}, env, device)
            if item.get("kind", 1) == 2:
                kwargs[str(item["name"])] = value
            else:
                args.append(value)
        result = op(*args, **kwargs) if call is None else call(node, op, args, kwargs)
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


def _argument(torch: Any, arg: Mapping[str, Any], env: Mapping[str, Any], device: Any) -> Any:
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
        return torch_dtype(torch, value)
    if kind == "as_memory_format":
        return {1: torch.contiguous_format, 2: torch.channels_last, 3: torch.channels_last_3d}.get(
            value, torch.preserve_format
        )
    if kind == "as_layout":
        return torch.strided
    if kind == "as_device":
        return device
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
    saved: Sequence[tuple[str, int]] = (),
) -> dict[str, Any]:
    """The traced GraphModule as a program of the export schema (the module docstring's metadata).

    ``sources``: (traced nodes counted after it ran, program node) in program order; a forward
    node's ``baechi_source`` is the program node it was traced from, and it keeps that node's
    ``nn_module_stack``; the first forward node's ``baechi_untraced`` lists the program nodes that
    traced no op; ``saved``: (traced node, sequence number) per tensor an autograd node saves,
    as the graph's ``baechi_saved`` ([tensor name, sequence number], sorted)."""
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
            if _is_tensor(torch, node.meta.get("val")):  # else an output not computed
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
        workspace = _cpu_workspace_bytes(torch, node)
        if workspace:
            record["metadata"]["baechi_workspace_bytes"] = str(workspace)

        if _is_tensor(torch, val):
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
                "baechi_saved": [
                    list(pair)
                    for pair in sorted({(rename[n], str(seq)) for n, seq in saved if rename.get(n) in values})
                ],
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


def _encode_torch_value(value: Any) -> dict[str, Any] | None:
    """A dtype, device, memory format or layout argument in the export schema's form (as
    ``torch.export`` writes them, so that :func:`interpret` gives the operator the same value);
    None for any other value."""
    import torch

    if isinstance(value, torch.dtype):
        return {"as_scalar_type": _SCALAR_TYPES[str(value).removeprefix("torch.")]}
    if isinstance(value, torch.device):
        return {"as_device": {"type": value.type, "index": value.index}}
    if isinstance(value, torch.memory_format):
        formats = {torch.contiguous_format: 1, torch.channels_last: 2, torch.channels_last_3d: 3}
        return {"as_memory_format": formats.get(value, 4)}
    if isinstance(value, torch.layout):
        return {"as_layout": 7 if value == torch.strided else 0}
    return None


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
    return _encode_torch_value(value) or {"as_string": str(value)}


def _tensor_value(torch: Any, val: Any) -> dict[str, Any]:
    if not _is_tensor(torch, val):
        return {"dtype": 0, "sizes": []}
    name = str(val.dtype).removeprefix("torch.")
    return {"dtype": _SCALAR_TYPES.get(name, 0), "sizes": [{"as_int": int(d)} for d in val.shape]}
