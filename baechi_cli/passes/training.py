"""Training synthesis: a training step made from a forward-only (inference) graph.

Most models reach us as inference exports (an ONNX file from PyTorch), but what is split over
devices is a training step. :func:`synthesize_training` appends what a step adds to the forward
ops, as PyTorch's autograd and torch.optim run it, so every later stage (passes, placers, the
simulator) sees a training graph like the ones TensorFlow writes:

* an op *needs a gradient* (:func:`needs_gradient`) when it owns parameters
  (``persistent_bytes > 0``), or reads a value that needs one and has a floating-point output;
  graph inputs never do, so integer shape arithmetic gets none, as in autograd;
* one backward op ``gradients/<name>`` per such op, in its forward op's colocation group
  (autograd runs a node's backward on the device its forward ran on), its compute a multiple
  of the forward's (:data:`BACKWARD_MULTIPLIER`); the data edges reversed, and an edge for each
  activation autograd saves for backward, which keeps it alive until the backward op ends;
* a ``loss/<name>`` op for the model's outputs (``out.pow(2).mean()``, :data:`LOSS_KERNELS`);
* an ``optimizer/step`` barrier, then per op owning parameters an update ``optimizer/<name>``
  timed as torch.optim's kernels (:data:`UPDATE_KERNELS`) and holding the optimizer state.

Op ids of the input graph are unchanged: new ops are appended (names made unique with a
``_<k>`` suffix), so ``graph.names[:n]`` is still the model. :func:`synthesize_training`
states each rule in full. Complexity: O(V + E).

Example:
    >>> from baechi_cli.core.graph import GraphBuilder
    >>> from baechi_cli.core.devices import parse_devices
    >>> b = GraphBuilder()
    >>> x = b.add_op("x", "Input", [400], output_dtypes=["float32"])
    >>> fc = b.add_op("fc", "Gemm", [40], compute_us=10.0, persistent_bytes=4000,
    ...               output_dtypes=["float32"])
    >>> relu = b.add_op("relu", "Relu", [40], compute_us=1.0, output_dtypes=["float32"])
    >>> _ = b.add_edge(x, fc); _ = b.add_edge(fc, relu)
    >>> g = synthesize_training(b.build(), parse_devices("2x8GB"), ["zero", "flops", "flops"], "adam")
    >>> g.names[3:], g.compute_us[4:6]
    (['loss/relu', 'gradients/relu', 'gradients/fc', 'optimizer/step', 'optimizer/fc'], [1.0, 10.0])
    >>> g.forward_op[3:], g.group[3:], g.persistent_bytes[7]
    ([2, 2, 1, 2, 1], [2, 2, 1, 2, 1], 8000)
    >>> g.output_bytes[3], g.temporary_bytes[3]  # relu's output is the model's
    ([40], 120)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.errors import InputError
from baechi_cli.core.graph import CONTROL_PORT, GraphBuilder, OpGraph
from baechi_cli.costs.analytic import op_time_us
from baechi_cli.costs.memory_rules import RESIDENT, Saved, composite_saved, saved_for_backward
from baechi_cli.costs.registry import OpCount

OPTIMIZERS = ("sgd", "momentum", "adam")
# The TensorFlow update op whose cost rule times each optimizer, and how many
# parameter-sized slots of state it keeps.
UPDATE_OP = {"sgd": "ApplyGradientDescent", "momentum": "ApplyMomentum", "adam": "ApplyAdam"}
OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2}
# The kernels PyTorch runs to update one parameter, as (what it computes, float32 elements read
# and written and FLOPs, per parameter element). torch.optim's single-tensor loop (the CPU's
# default) and its foreach path (CUDA's) run the same kernels, one tensor or a list at a time.
# An update is a few FLOPs an element, so its time is these passes over memory.
UPDATE_KERNELS: dict[str, tuple[tuple[str, int, int, int], ...]] = {
    "sgd": (("param.add_(grad, alpha=-lr)", 2, 1, 2),),
    "momentum": (
        ("buf.mul_(momentum)", 1, 1, 1),
        ("buf.add_(grad)", 2, 1, 1),
        ("param.add_(buf, alpha=-lr)", 2, 1, 2),
    ),
    "adam": (
        ("exp_avg.lerp_(grad, 1 - beta1)", 2, 1, 3),
        ("exp_avg_sq.mul_(beta2)", 1, 1, 1),
        ("exp_avg_sq.addcmul_(grad, grad, value=1 - beta2)", 2, 1, 3),  # grad read once
        ("exp_avg_sq.sqrt()", 1, 1, 1),
        ("... / bias_correction2_sqrt", 1, 1, 1),
        ("denom.add_(eps)", 1, 1, 1),
        ("param.addcdiv_(exp_avg, denom, value=-step_size)", 3, 1, 3),
    ),
}
# Parameter-sized scratch tensors one update allocates while it runs: PyTorch's single-tensor
# Adam computes the denominator sqrt(v) / bias correction + eps and the step size's quotient
# out of place (bench/framework.md: BERT's Adam peak lacked two word-embedding-sized
# temporaries); SGD and momentum update in place.
UPDATE_TEMPORARIES = {"sgd": 0, "momentum": 0, "adam": 2}
# The loss is not in the model: the step computes out.pow(2).mean() (the benches' and the H100
# reference's loss) and its backward, whose kernels as (what it computes, output-sized elements
# read and written and FLOPs, per output element): the forward's two, then mean's gradient
# (the scalar expanded and divided), pow's self.pow(1), its product with 2 and with the
# incoming gradient. Cross-entropy's log_softmax, its gradient and exp move about as much.
LOSS_KERNELS: tuple[tuple[str, int, int, int], ...] = (
    ("out.pow(2)", 1, 1, 1),
    ("(...).mean()", 1, 0, 1),
    ("grad.expand(out.shape) / numel", 0, 1, 1),
    ("out.pow(1)", 1, 1, 1),
    ("2 * out.pow(1)", 1, 1, 1),
    ("grad * (2 * out.pow(1))", 2, 1, 1),
)
# At the backward's peak the mean's gradient, pow(1) and its double are alive beside the
# result (the output's gradient) and the output itself, while the forward pass's activations
# still are: cross-entropy's log_softmax output, its gradient and exp's result alike
# (bench/h100.md: GPT-2's logits).
LOSS_TEMPORARIES = 3
LOSS_OP = "Loss"
# The barrier between the backward pass and the updates (a 0 µs op, no cost rule needed).
STEP_OP, STEP_OP_NAME = "OptimizerStep", "optimizer/step"

# Backward compute as a multiple of forward compute, by the forward op's rule
# kind; ``flops`` is refined per op (see synthesize_training).
BACKWARD_MULTIPLIER = {
    "flops": 2.0,
    "bytes": 1.0,
    "zero": 0.0,
    "variable": 0.0,
    "uncovered": 1.0,
    "fallback": 1.0,
}
_GRAPH_INPUTS = frozenset({"Input", "Placeholder", "PlaceholderV2", "_Arg"})
_FLOAT_PREFIXES = ("float", "bfloat", "half", "double")
_INTEGER_PREFIXES = ("int", "uint", "bool")
_PARAM_ITEMSIZE = 4  # float32 parameters, for the update's FLOP count


def _is_float(dtype: str) -> bool:
    # An unknown dtype ("": workload JSON, untyped ONNX values) may be a float: assume it is; so
    # may an ONNX sequence or optional (SplitToSequence's pieces carry gradients to SequenceAt).
    return dtype in ("", "sequence", "optional") or dtype.startswith(_FLOAT_PREFIXES)


def _all_integer(dtypes: Sequence[str]) -> bool:
    return bool(dtypes) and all(d.startswith(_INTEGER_PREFIXES) for d in dtypes)


def needs_gradient(graph: OpGraph) -> list[bool]:
    """Per op: whether autograd would compute a gradient for it (module docstring). O(V + E)."""
    need = [False] * graph.num_ops
    for v in graph.topo_order():
        if graph.op_types[v] in _GRAPH_INPUTS:
            continue
        # A parameter owner, or a reader of a shared one, does (a TensorFlow variable's
        # output is a handle, not a float) unless its outputs are all integers: what it owns
        # is then an integer buffer (token type ids), which autograd never differentiates.
        # Others do when a float output depends on one.
        owner = graph.persistent_bytes[v] > 0 or "_shared_parameter_bytes" in graph.attrs[v]
        need[v] = (owner and not _all_integer(graph.output_dtypes[v])) or (
            any(_is_float(t) for t in graph.output_dtypes[v])
            and any(need[graph.edge_src[e]] for e in graph.in_edges[v] if graph.edge_port[e] != CONTROL_PORT)
        )
    return need


def synthesize_training(
    graph: OpGraph, devices: DeviceSpec, kinds: Sequence[str], optimizer: str = "sgd"
) -> OpGraph:
    """``graph`` plus backward and optimizer ops (summary in the module docstring).

    ``graph`` must be costed and forward-only; ``kinds[v]`` is the cost-rule
    kind of op ``v`` (flops, bytes, zero, variable, uncovered, fallback).
    Raises :class:`InputError` when the graph already has backward ops, has
    nothing to train (no op owns parameters), or ``optimizer`` is unknown.

    Rules, as PyTorch runs a step:

    * **Which ops get a gradient.** An op *needs a gradient* when it owns
      parameters (``persistent_bytes > 0``: the ONNX reader puts initializer
      bytes on the op that reads them; in TensorFlow, the variable) and has an
      output that is not an integer (an integer buffer is not trained), or when it
      reads a value that needs one and has a floating-point output (or one of
      unknown type); graph inputs (``Input``/``Placeholder`` ops) never do.
      Integer shape arithmetic and ops upstream of every parameter get none,
      as in autograd.
    * **One backward op per such op** ``v``, named ``gradients/<name>`` (a
      leading ``/`` of the name dropped: ``gradients/fc/Gemm``; type
      ``<type>Grad``), ``is_backward`` with ``forward_op = v``, and in ``v``'s
      colocation group: the PyTorch autograd engine runs a node's backward on
      the device its forward ran on, so a plan applied with ``module.to()``
      cannot put it elsewhere. Its compute time is ``v``'s times a multiplier
      set by the forward op's cost-rule kind (:data:`BACKWARD_MULTIPLIER`):

      ============  ==========================================================
      flops         one forward's FLOPs per gradient it produces -- a
                    gradient per input that needs one, plus one for the
                    parameters -- between 1 and 2 (conv/matmul: dX and dW,
                    2x; the first layer: dW only, 1x; Relu: 1x)
      bytes         1x: the gradient of a copy, transpose, gather or concat is
                    the reverse data movement
      zero          0x: the gradient of a view (Reshape, Identity) is a view
      variable      0x
      uncovered     1x (bytes only, both ways); ``fallback`` likewise
      ============  ==========================================================

      Its temporary bytes are ``v``'s. Output ports: one gradient per input
      tensor of ``v`` that needs one (that tensor's bytes), then, when ``v``
      owns parameters, the parameter gradient buffer (``persistent_bytes[v]``).
    * **Edges.** The data edges reversed: for each consumer ``w`` of a tensor
      ``(u, p)`` that needs a gradient, ``gradients/w`` sends its gradient of
      ``(u, p)`` (same bytes) to ``gradients/u``; gradients of a tensor used
      several times are summed by ``gradients/u`` (the adds are not costed
      separately). Activations kept alive: exactly what PyTorch's autograd
      saves for ``v``'s op type (:data:`baechi_cli.costs.memory_rules.SAVED_FOR_BACKWARD`:
      Gemm/MatMul/Conv their data inputs, Relu and Softmax their output, Add
      nothing, MaxPool its input and int64 indices, Dropout a one-byte mask,
      ...; an op type not listed keeps every data input when it is a ``flops``
      or uncovered op) reaches ``gradients/v`` over an edge, so the simulator
      keeps it until the backward op ends, which is where a training step's
      activation memory comes from. A saved tensor that the forward op writes
      only for its backward (mask, indices) is an extra output port of ``v``.
      The gradient of a view (:attr:`OpGraph.view_of`) with one incoming
      gradient is a view of it. A control edge ``v -> gradients/v`` orders a
      backward op after its forward op (for the graph's outputs, the loss
      gradient starts there).
    * **The loss.** It is not in the model: the step takes it of the model's
      outputs, an op's float outputs that nothing reads. Per op with such
      outputs, a ``loss/<name>`` op (``Loss``, ``is_backward``, ``forward_op =
      v``, in ``v``'s group) reads them and sends their gradients (same bytes)
      to ``gradients/<name>``: ``out.pow(2).mean()`` and its backward, the
      benches' and the H100 reference's loss (:data:`LOSS_KERNELS`). While it
      runs it holds :data:`LOSS_TEMPORARIES` output-sized temporaries besides
      the outputs and their gradients, with the forward pass's activations
      still alive: with large logits, the peak of a training step. So the
      caller holds only the inputs it fed, not the outputs
      (``OpGraph.held_outputs``).
    * **Optimizer step.** ``opt.step()`` runs once ``backward()`` has
      returned: an ``optimizer/step`` op (``OptimizerStep``, 0 µs) waits for
      the last backward ops (control edges) and every update waits for it, so
      each parameter's gradient buffer is alive from its backward op until its
      update, all of them together at the end of the backward pass, as with
      ``zero_grad(set_to_none=True)``. It is in the group of the last forward
      op that needs a gradient.
    * **Optimizer.** Per op owning parameters, an update op
      ``optimizer/<name>`` (likewise) in ``v``'s group (``is_backward``,
      ``forward_op = v``), fed by the parameter gradient, of the TensorFlow type
      of the same update (``ApplyGradientDescent``, ``ApplyMomentum``,
      ``ApplyAdam``). It is timed as PyTorch runs it (:data:`UPDATE_KERNELS`:
      torch.optim's kernels, each a pass over the parameter-sized tensors it
      reads and writes; Adam's seven move 72 bytes a float32 element where
      TensorFlow's fused ApplyAdam moves 28) on each device kind, and holds the
      optimizer state as persistent bytes: 0 (sgd), 1x (momentum) or 2x (adam)
      the parameter bytes; while an Adam update runs it holds two
      parameter-sized temporaries (PyTorch's single-tensor Adam;
      :data:`UPDATE_TEMPORARIES`). Parameters are taken as float32.

    New ops are appended in topological order of their forward ops (backward
    ops reversed).
    """
    if optimizer not in OPTIMIZERS:
        raise InputError(f"unknown optimizer '{optimizer}' (choose from {', '.join(OPTIMIZERS)})")
    n_backward = sum(graph.is_backward)
    if n_backward:
        raise InputError(
            f"--training builds the backward pass of a forward-only model, but this graph already "
            f"has {n_backward} backward ops (it is a training graph); drop --training"
        )
    if not any(graph.persistent_bytes):
        raise InputError("--training: no op holds parameters (weights), so there is nothing to train")
    need = needs_gradient(graph)
    order = graph.topo_order()
    builder = GraphBuilder.from_graph(graph)
    taken = set(graph.names)
    by_kind = {kind: list(times) for kind, times in graph.compute_us_by_kind.items()}

    def add(name: str, op_type: str, *, v: int, us_by_kind: Mapping[str, float], **columns: Any) -> int:
        """Append a backward or update op of ``v``, in ``v``'s group, timed per device kind."""
        new = builder.add_op(_unique(name, taken), op_type, is_backward=True, forward_op=v, **columns)
        builder.set_group(new, graph.group[v])
        for kind, times in by_kind.items():
            times.append(us_by_kind[kind])
        return new

    device_of_kind = {kind: next(d for d in devices.devices if d.kind == kind) for kind in by_kind}

    def timed(count: OpCount) -> tuple[float, dict[str, float]]:
        """A synthesized op's time on the first device, and on each device kind."""
        return op_time_us(count, devices.devices[0]), {
            kind: op_time_us(count, device) for kind, device in device_of_kind.items()
        }

    # Gradient ports: backward op of v -> {input tensor (u, p): port}.
    grad_port: dict[int, dict[tuple[int, int], int]] = {}
    grad_op: dict[int, int] = {}
    feeds_backward: set[int] = set()  # backward ops that send a gradient to another one
    composite = composite_saved(graph)  # exported composites that autograd runs as one op
    # A shared weight's gradient buffer, by its owner's name: (the last reader's backward op, port).
    buffers: dict[str, list[tuple[int, int]]] = {}
    for v in reversed(order):
        if not need[v]:
            continue
        inputs = _data_inputs(graph, v)
        wanted = [t for t in dict.fromkeys(inputs) if need[t[0]]]
        owns = graph.persistent_bytes[v] > 0
        scale = _multiplier(kinds[v], len(wanted) + owns)
        attrs = graph.attrs[v]
        # An owner's gradient of a shared weight is the buffer its readers' gradients went into.
        accumulated = attrs.get("_accumulated_parameter_bytes", 0)
        out_bytes = [graph.output_bytes[u][p] for u, p in wanted] + (
            [graph.persistent_bytes[v] - accumulated] if owns else []
        )
        # v's float outputs nothing reads are the model's: the loss is taken of them.
        read = {graph.edge_port[e] for e in graph.out_edges[v]}
        unread = [
            port
            for port, (nbytes, dtype) in enumerate(zip(graph.output_bytes[v], graph.output_dtypes[v]))
            if nbytes and port not in read and _is_float(dtype)
        ]
        loss = None
        if unread:
            loss_bytes = [graph.output_bytes[v][port] for port in unread]
            reference_us, us_by_kind = timed(loss_count(sum(loss_bytes)))
            loss = add(
                f"loss/{graph.names[v].lstrip('/')}",
                LOSS_OP,
                v=v,
                compute_us=reference_us,
                us_by_kind=us_by_kind,
                output_bytes=loss_bytes,
                temporary_bytes=LOSS_TEMPORARIES * max(loss_bytes),
                output_shapes=[graph.output_shapes[v][port] for port in unread],
                output_dtypes=[graph.output_dtypes[v][port] for port in unread],
            )
            for port in unread:
                builder.add_edge(v, loss, port)
        b = add(
            f"gradients/{graph.names[v].lstrip('/')}",
            f"{graph.op_types[v]}Grad",
            v=v,
            compute_us=graph.compute_us[v] * scale,
            us_by_kind={kind: times[v] * scale for kind, times in by_kind.items()},
            output_bytes=out_bytes,
            temporary_bytes=graph.temporary_bytes[v],
            output_shapes=[graph.output_shapes[u][p] for u, p in wanted] + ([None] if owns else []),
            output_dtypes=[graph.output_dtypes[u][p] for u, p in wanted] + (["float32"] if owns else []),
        )
        grad_op[v] = b
        grad_port[b] = {t: k for k, t in enumerate(wanted)}
        # Tied weights: autograd adds each reader's gradient of the shared weight into one
        # buffer as it comes. The last reader's gradient, the first computed, is that buffer;
        # it lives until the owner's update, as the owner's .grad. Every other reader's, and
        # the owner's, lives while its backward op runs. The first add is counted as making a
        # new buffer, a third copy while the reader before the last runs: GPT-2's measured
        # peak (sgd) is there, one embedding above the in-place count. ALBERT's first add is
        # in place, so there it counts its largest shared tensor too many (bench/framework.md).
        held = attrs.get("_gradient_buffer_bytes", [])
        if held:
            buffer_port = builder.add_output(b, sum(held), None, "float32")
            for owner in attrs["_gradient_buffer_owners"]:
                buffers.setdefault(owner, []).append((b, buffer_port))
        builder.add_temporary(
            b,
            attrs.get("_shared_parameter_bytes", 0)
            - sum(held)
            + accumulated
            + attrs.get("_gradient_sum_bytes", 0),
        )
        for holder, port in buffers.get(graph.names[v], ()) if accumulated else ():
            builder.add_edge(holder, b, port)  # the owner adds its own gradient into the buffer
            feeds_backward.add(holder)
        builder.add_edge(v, b, CONTROL_PORT)
        # The gradients of v's outputs, from the loss and the backward ops of its consumers.
        incoming = []
        if loss is not None:
            for k in range(len(unread)):
                incoming.append((loss, k))
                builder.add_edge(loss, b, k)
        for e in graph.out_edges[v]:
            w, p = graph.edge_dst[e], graph.edge_port[e]
            if p != CONTROL_PORT and w in grad_op:
                gw = grad_op[w]
                incoming.append((gw, grad_port[gw][(v, p)]))
                builder.add_edge(gw, b, incoming[-1][1])
                feeds_backward.add(gw)
        if graph.view_of.get(v, RESIDENT) != RESIDENT and len(incoming) == 1 and not held:
            builder.set_view(b, *incoming[0])  # a view's gradient is the incoming one, viewed back
        saved = composite.get(v) or saved_for_backward(graph.op_types[v], kinds[v])
        _keep_saved(builder, graph, need, v, b, inputs, saved)
    # opt.step() runs once the whole backward pass has ended, so every parameter's gradient
    # is alive until then: a barrier after the backward ops' last ones, before every update.
    # It belongs with the last forward op that needs a gradient: the loss's end of the model.
    last = next((v for v in reversed(order) if need[v]), None)
    step = -1
    if last is not None:
        step = add(STEP_OP_NAME, STEP_OP, v=last, compute_us=0.0, us_by_kind=dict.fromkeys(by_kind, 0.0))
        for b in grad_op.values():
            if b not in feeds_backward:
                builder.add_edge(b, step, CONTROL_PORT)
    # Optimizer updates, after every backward op so that ids stay grouped.
    update_op, slots = UPDATE_OP[optimizer], OPTIMIZER_SLOTS[optimizer]
    # Update times depend only on the parameter bytes: many layers share a size.
    update_us: dict[int, tuple[float, dict[str, float]]] = {}
    for v in order:
        nbytes = graph.persistent_bytes[v]
        if v not in grad_op or nbytes == 0:
            continue
        if nbytes not in update_us:
            update_us[nbytes] = timed(update_count(optimizer, nbytes))
        reference_us, us_by_kind = update_us[nbytes]
        u = add(
            f"optimizer/{graph.names[v].lstrip('/')}",
            update_op,
            v=v,
            compute_us=reference_us,
            us_by_kind=us_by_kind,
            persistent_bytes=slots * nbytes,
            temporary_bytes=UPDATE_TEMPORARIES[optimizer] * nbytes,
        )
        b = grad_op[v]
        builder.add_edge(b, u, len(grad_port[b]))
        for holder, port in buffers.get(graph.names[v], ()):
            builder.add_edge(holder, u, port)  # the shared weight's .grad, until its update
        builder.add_edge(step, u, CONTROL_PORT)  # an update exists only where a gradient does
    # The outputs go to the loss, not to the caller, who holds only what it fed (ops without inputs).
    fed = frozenset((v, port) for v, port in graph.held_outputs if not graph.in_edges[v])
    return builder.build().replace(compute_us_by_kind=by_kind, held_outputs=fed)


def _keep_saved(
    builder: GraphBuilder,
    graph: OpGraph,
    need: list[bool],
    v: int,
    b: int,
    inputs: list[tuple[int, int]],
    saved: Saved,
) -> None:
    """Edges from what autograd saves for ``v`` to its backward op ``b``, so it lives until ``b`` ends."""
    positions = graph.attrs[v].get("_data_inputs")  # ONNX input position of each data edge
    if positions is None or len(positions) < len(inputs):
        positions = list(range(len(inputs)))
    # Which input positions need a gradient, by their producers. Parameters (the op's own
    # initializers) are never edges, so an op owning some has another input that needs one.
    wants = {p: need[u] for p, (u, _) in zip(positions, inputs)}
    owns_parameters = graph.persistent_bytes[v] > 0
    kept: set[tuple[int, int]] = set()
    for position, tensor in zip(positions, inputs):
        if position not in saved.inputs or tensor in kept or _python_scalar(graph, tensor):
            continue
        if saved.cross and not owns_parameters and not any(w for p, w in wants.items() if p != position):
            continue
        kept.add(tensor)
        builder.add_edge(tensor[0], b, tensor[1])
    outputs = graph.output_bytes[v]
    if saved.output and outputs:
        builder.add_edge(v, b, 0)
    if saved.extra_bytes_per_output_byte and outputs:
        port = builder.add_output(v, round(outputs[0] * saved.extra_bytes_per_output_byte))
        builder.add_edge(v, b, port)
    shape = graph.output_shapes[v][0] if graph.output_shapes[v] else None
    if saved.row_stats and shape:
        axis = graph.attrs[v].get("axis", -1)
        rows = math.prod(shape[: axis % len(shape)]) if shape else 1
        port = builder.add_output(v, rows * saved.row_stats * 4)
        builder.add_edge(v, b, port)


def _python_scalar(graph: OpGraph, tensor: tuple[int, int]) -> bool:
    """A one-element Constant: in eager PyTorch a Python number (``x / 8``), which autograd keeps
    as a scalar, not a tensor."""
    u, port = tensor
    shape = graph.output_shapes[u][port] if port < len(graph.output_shapes[u]) else None
    return graph.op_types[u] == "Constant" and shape is not None and math.prod(shape) == 1


def _multiplier(kind: str, gradients: int) -> float:
    if kind == "flops":
        return float(min(max(gradients, 1), 2))
    return BACKWARD_MULTIPLIER.get(kind, 1.0)


def _data_inputs(graph: OpGraph, v: int) -> list[tuple[int, int]]:
    return [
        (graph.edge_src[e], graph.edge_port[e])
        for e in graph.in_edges[v]
        if graph.edge_port[e] != CONTROL_PORT
    ]


def update_count(optimizer: str, param_bytes: int) -> OpCount:
    """What one update of ``param_bytes`` of float32 parameters computes and moves in PyTorch
    (:data:`UPDATE_KERNELS`: every kernel's elements read and written, summed).

    >>> update_count("adam", 4000)
    OpCount(flops=13000.0, bytes_read=44000, bytes_written=28000, temporary_bytes=0, persistent_bytes=0)
    """
    return _kernels_count(UPDATE_KERNELS[optimizer], param_bytes)


def loss_count(output_bytes: int) -> OpCount:
    """What the loss and its backward (:data:`LOSS_KERNELS`) compute and move on ``output_bytes``
    of model outputs, taken as float32.

    >>> loss_count(4000)
    OpCount(flops=6000.0, bytes_read=24000, bytes_written=20000, temporary_bytes=0, persistent_bytes=0)
    """
    return _kernels_count(LOSS_KERNELS, output_bytes)


def _kernels_count(kernels: tuple[tuple[str, int, int, int], ...], nbytes: int) -> OpCount:
    """``kernels`` (what, elements read, written, FLOPs per element) run over ``nbytes`` of float32."""
    elements = max(nbytes // _PARAM_ITEMSIZE, 1)
    return OpCount(
        flops=float(sum(k[3] for k in kernels) * elements),
        bytes_read=sum(k[1] for k in kernels) * elements * _PARAM_ITEMSIZE,
        bytes_written=sum(k[2] for k in kernels) * elements * _PARAM_ITEMSIZE,
    )


def _unique(name: str, taken: set[str]) -> str:
    candidate, k = name, 0
    while candidate in taken:
        k += 1
        candidate = f"{name}_{k}"
    taken.add(candidate)
    return candidate
