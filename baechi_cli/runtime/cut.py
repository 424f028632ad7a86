"""Cut a ``torch.export`` program into pipeline stages that run: one ``GraphModule`` per stage.

Contract. :func:`cut_program` takes an ``ExportedProgram`` (training IR, ``torch.export.export``)
and each node's stage, and returns one :class:`StageModule` per stage. Stage ``s`` is a
``torch.fx.GraphModule`` holding copies of the parameters, buffers and constants its nodes read,
whose ``forward(*inputs)`` takes the previous stage's outputs (stage 0: the program's user
inputs) and returns a tuple. Every value a stage after ``s + 1`` reads is **threaded**: it is an
output of each stage from the one that makes it up to the one before its last reader, so no value
skips a stage and ``torch.distributed.pipelining.PipelineStage`` runs every backward (a value
crossing several boundaries is sent across each, as the cost model charges it). The last stage
returns the program's user outputs.

Nodes not named in the plan take the stage of their latest input (``getitem``: its source's); a
node planned before one of its inputs moves to that input's stage (counted in ``CutProgram.moved``).
A tensor written in place through a view (``x[:, 0] += 1``) and read on both sides of the write
runs in one stage with its maker, views, writes and early readers (moved too): a stage receives
copies, which another stage's write would not reach. A parameter read by several stages (a tied
embedding and head) is copied into each and named in ``CutProgram.tied``: their gradients must be
summed before the step. Buffers the program mutates (batch norm's running statistics) are updated
in place by the stage that computes the new value.

Needs torch. Deterministic; O(nodes + edges + stages x values) plus the copies of the tensors.

Example:
    >>> import torch
    >>> class Two(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    ...     def forward(self, x):
    ...         h = self.a(x).relu()
    ...         return (self.b(h) + x).pow(2).mean()
    >>> model, x = Two(), torch.randn(2, 4)
    >>> program = torch.export.export(model, (x,))
    >>> cut = cut_program(program, {"linear_1": 1, "add": 1, "pow_1": 1, "mean": 1})
    >>> [s.inputs for s in cut.stages], [s.outputs for s in cut.stages]
    ([['x'], ['x', 'relu']], [['x', 'relu'], ['mean']])
    >>> out = cut.stages[1].module(*cut.stages[0].module(x))[0]
    >>> torch.allclose(out, model(x))
    True
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from baechi_cli.core.errors import InputError
from baechi_cli.io.aliasing import Access, schema_aliasing, write_groups


@dataclass
class StageModule:
    """One stage: its module and the values it receives and sends, by program node name."""

    index: int
    module: Any  # torch.fx.GraphModule
    inputs: list[str]
    outputs: list[str]
    nodes: list[str]  # the program's call_function nodes it runs, in program order
    parameters: dict[str, str] = field(default_factory=dict)  # attribute -> the model's FQN


@dataclass
class CutProgram:
    """The stages of a program and what spans them."""

    stages: list[StageModule]
    tied: dict[str, list[int]]  # parameter FQN -> the stages holding a copy (two or more)
    moved: list[str]  # nodes planned before an input they read, moved to its stage
    unplanned: list[str]  # call_function nodes the plan did not name
    made_in: dict[str, int] = field(default_factory=dict)  # value -> its stage (-1: a user input)

    def threaded(self) -> list[dict[str, Any]]:
        """The values sent across more than one boundary: ``{value, from_stage, to_stage}``."""
        made: dict[str, int] = {}
        last: dict[str, int] = {}
        for stage in self.stages:
            for v in stage.outputs:
                made.setdefault(v, stage.index)
                last[v] = stage.index + 1
        return [
            {"value": v, "from_stage": made[v], "to_stage": last[v]}
            for v in made
            if last[v] - made[v] > 1 and last[v] < len(self.stages)
        ]


def cut_program(
    program: Any,
    stage_of: Mapping[str, int],
    num_stages: int | None = None,
    copy_outputs: bool = False,
    only: Collection[int] | None = None,
    thread: bool = True,
) -> CutProgram:
    """The stages of ``program`` with node ``n`` in stage ``stage_of[n]`` (module docstring).

    ``copy_outputs``: every stage sends copies of its values (:func:`owned`), which a schedule
    that splits the backward (zbv) needs: it detaches a stage's outputs in place after the input
    gradient, while the weight gradient may still read them. ``only``: build the modules of these
    stages alone (a rank's); the others get ``module`` None. ``thread`` False: a stage receives
    just what its nodes read, from the stage that made it (user inputs: from the caller), and
    sends what later stages read (a makespan plan's parts, :mod:`~baechi_cli.runtime.makespan`)."""

    graph = program.graph
    sig = program.graph_signature
    state = {**program.state_dict, **dict(program.constants)}
    params = dict(sig.inputs_to_parameters)
    buffers = dict(sig.inputs_to_buffers)
    constants = dict(sig.inputs_to_lifted_tensor_constants)
    for kind in ("inputs_to_lifted_custom_objs",):
        if getattr(sig, kind, None):
            raise InputError("the program holds custom objects (torchbind): a stage cannot copy them")
    if getattr(sig, "user_inputs_to_mutate", None):
        raise InputError(
            f"the program mutates its input {next(iter(sig.user_inputs_to_mutate.values()))!r} "
            "in place: a pipeline stage receives a copy, so the change would be lost"
        )
    mutated = dict(sig.buffers_to_mutate)  # output value -> buffer FQN
    user_inputs = list(sig.user_inputs)
    user_outputs = list(sig.user_outputs)
    S = num_stages if num_stages is not None else max(stage_of.values(), default=0) + 1
    if S < 1:
        raise InputError("a pipeline needs at least one stage")

    nodes = [n for n in graph.nodes if n.op == "call_function"]
    names = {n.name for n in nodes}
    stranger = sorted(set(stage_of) - names - set(user_inputs))
    if stranger:
        raise InputError(
            f"the plan names {len(stranger)} node(s) this program does not have ({', '.join(stranger[:3])}"
            f"{', ...' if len(stranger) > 3 else ''}): a plan made for another model"
        )
    bad = sorted({s for s in stage_of.values() if not 0 <= s < S})
    if bad:
        raise InputError(f"the plan puts nodes in stage {bad[0]}, but there are {S} stages")

    # -- each node's stage: planned, else its latest input's; never before an input; the nodes of a
    # tensor written in place while read around the write, in one stage (_shared_writes)
    groups = _shared_writes(nodes)
    forced: dict[str, int] = {}
    while True:
        stage = _node_stages(nodes, user_inputs, stage_of, forced)
        raised = False
        for group in groups:
            top = max(stage[n] for n in group)
            for n in group:
                if stage[n] != top:
                    forced[n], raised = top, True
        if not raised:
            break
    moved = [
        n.name
        for n in nodes
        if n.target is not operator.getitem and n.name in stage_of and stage[n.name] != stage_of[n.name]
    ]
    unplanned = [n.name for n in nodes if n.target is not operator.getitem and n.name not in stage_of]

    # -- where each value is last needed
    last: dict[str, int] = {}
    for node in nodes:
        for a in node.all_input_nodes:
            if a.name in stage:
                last[a.name] = max(last.get(a.name, -1), stage[node.name])
    for name in user_outputs:
        if name in stage:
            last[name] = S  # the last stage returns it
        elif name is not None:
            raise InputError(f"the program's output {name!r} is not a node's: cannot place it")
    order = {name: i for i, name in enumerate(user_inputs + [n.name for n in nodes])}

    def crossing(s: int) -> list[str]:  # values made at or before stage s, read after it
        values = [v for v, made in stage.items() if made <= s and last.get(v, -1) > s]
        return sorted(values, key=order.__getitem__)

    readers: dict[str, set[int]] = {}
    for node in nodes:
        for a in node.all_input_nodes:
            if a.op == "placeholder" and a.name not in stage:
                readers.setdefault(a.name, set()).add(stage[node.name])

    lifted = _Lifted(params, buffers, constants, state)
    out: list[StageModule] = []
    by_stage: list[list[Any]] = [[] for _ in range(S)]
    for node in nodes:
        by_stage[stage[node.name]].append(node)
    for s in range(S):
        mine = by_stage[s]
        if thread:
            inputs = list(user_inputs) if s == 0 else crossing(s - 1)
            outputs = [v for v in user_outputs if v is not None] if s == S - 1 else crossing(s)
        else:
            read = {a.name for n in mine for a in n.all_input_nodes if a.name in stage}
            inputs = sorted((v for v in read if v in user_inputs or stage[v] < s), key=order.__getitem__)
            outputs = [n.name for n in mine if last.get(n.name, -1) > s]
        if only is not None and s not in only:
            out.append(
                StageModule(s, None, inputs, outputs, [n.name for n in mine], _params_read(mine, params))
            )
            continue
        out.append(_stage(s, graph, mine, inputs, outputs, lifted, mutated, copy_outputs, thread))

    tied: dict[str, list[int]] = {}
    for placeholder, held in readers.items():
        if placeholder in params and len(held) > 1:
            tied[params[placeholder]] = sorted(held)
    made = {v: (-1 if v in user_inputs else m) for v, m in stage.items()}
    return CutProgram(out, tied, moved, unplanned, made)


def _node_stages(
    nodes: list[Any], user_inputs: list[str], stage_of: Mapping[str, int], forced: Mapping[str, int]
) -> dict[str, int]:
    """Each node's stage: ``forced``, else planned, else its latest input's; never before an input
    (``getitem``: always its source's)."""
    stage: dict[str, int] = {name: 0 for name in user_inputs}
    for node in nodes:
        earliest = max((stage[a.name] for a in node.all_input_nodes if a.name in stage), default=0)
        if node.target is operator.getitem:
            stage[node.name] = earliest
            continue
        planned = forced.get(node.name, stage_of.get(node.name, earliest))
        stage[node.name] = max(planned, earliest)
    return stage


def _shared_writes(nodes: list[Any]) -> list[list[str]]:
    """The groups of nodes that must run in one stage (:func:`~baechi_cli.io.aliasing.write_groups`):
    a tensor that an op writes in place (itself or through a view: ``x[:, 0] += 1`` is ``select``
    then ``add_``) and that a node reads, by any of its names, on both sides of a write. The
    planner reads the same groups from the program (``baechi_write_groups``), so it keeps them on
    one device."""
    accesses = []
    for node in nodes:
        views, writes = _aliasing(node)
        reads = tuple(a.name for a in node.all_input_nodes)
        accesses.append(Access(node.name, (node.name,), reads, frozenset(views), frozenset(writes)))
    return write_groups(accesses)


def _aliasing(node: Any) -> tuple[set[str], set[str]]:
    """(the arguments ``node``'s output may be a view of, those it writes in place), by name; a
    ``getitem`` of an op returning views is a view of that op's output."""
    if node.target is operator.getitem:
        source = node.args[0]
        schema = getattr(getattr(source, "target", None), "_schema", None)
        views = schema is not None and any(r.alias_info is not None for r in schema.returns)
        return ({source.name} if views else set()), set()
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return set(), set()

    def names_of(i: int, arg: Any) -> set[str]:
        value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
        return {v.name for v in (value if isinstance(value, list | tuple) else [value]) if hasattr(v, "name")}

    return schema_aliasing(schema, names_of)


@dataclass
class _Lifted:
    """The program's parameters, buffers and constants: placeholder -> FQN, and FQN -> tensor."""

    params: dict[str, str]
    buffers: dict[str, str]
    constants: dict[str, str]
    state: dict[str, Any]


def _stage(
    s: int,
    graph: Any,
    mine: list[Any],
    inputs: list[str],
    outputs: list[str],
    lifted: _Lifted,
    mutated: Mapping[str, str],
    copy_outputs: bool,
    threaded: bool = True,
) -> StageModule:
    """Stage ``s``: a GraphModule running ``mine`` on ``inputs``, returning ``outputs``."""
    import torch
    import torch.fx

    g = torch.fx.Graph()
    root = torch.nn.Module()
    env: dict[str, Any] = {}
    mutated_here = _mutated_in_place(mine)
    for v in inputs:  # a received value's gradient goes back to the stage before: contiguous
        if s == 0:
            env[v] = g.placeholder(v)
        else:  # a value an op here changes in place is copied first (a view of it cannot be)
            wrap = grad_contiguous_copy if v in mutated_here else grad_contiguous
            env[v] = g.call_function(wrap, (g.placeholder(v),))
    attrs: dict[str, str] = {}

    def value(node: Any) -> Any:
        if node.name in env:
            return env[node.name]
        name = node.name
        fqn = lifted.params.get(name) or lifted.buffers.get(name) or lifted.constants.get(name)
        if fqn is None:
            raise InputError(f"node {name!r} is read by stage {s} but made by no stage before it")
        attr = _attr_name(fqn, attrs)
        tensor = lifted.state[fqn]
        if name in lifted.params:
            root.register_parameter(attr, torch.nn.Parameter(tensor.detach().clone(), tensor.requires_grad))
        elif name in lifted.buffers:
            root.register_buffer(attr, tensor.detach().clone())
        else:
            setattr(root, attr, tensor.detach().clone() if isinstance(tensor, torch.Tensor) else tensor)
        attrs[attr] = fqn
        env[name] = g.get_attr(attr)
        return env[name]

    for node in mine:
        for a in node.all_input_nodes:
            value(a)
        env[node.name] = g.node_copy(node, lambda a: env[a.name])
        if node.name in mutated:  # write the new running statistics into the buffer
            fqn = mutated[node.name]
            target = next((n for n, f in lifted.buffers.items() if f == fqn), None)
            if target is None:
                raise InputError(f"node {node.name!r} mutates {fqn!r}, which is no buffer")
            new = g.call_function(torch.ops.aten.detach.default, (env[node.name],))
            g.call_function(torch.ops.aten.copy_.default, (value(_placeholder(graph, target)), new))
    send = owned if copy_outputs else contiguous if threaded else dense
    g.output(tuple(g.call_function(send, (env[v],)) for v in outputs))
    module = torch.fx.GraphModule(root, g)
    parameters = {a: f for a, f in attrs.items() if isinstance(getattr(module, a, None), torch.nn.Parameter)}
    return StageModule(s, module, inputs, outputs, [n.name for n in mine], parameters)


def _params_read(nodes: list[Any], params: Mapping[str, str]) -> dict[str, str]:
    taken: dict[str, str] = {}
    for node in nodes:
        for a in node.all_input_nodes:
            if a.name in params and params[a.name] not in taken.values():
                taken[_attr_name(params[a.name], taken)] = params[a.name]
    return taken


def owned(value: Any) -> Any:
    """A contiguous copy of ``value`` (a tensor), for a stage to send (``copy_outputs``)."""
    import torch

    return value.clone(memory_format=torch.contiguous_format)


def _mutated_in_place(nodes: list[Any]) -> set[str]:
    """The values ``nodes`` change in place (an argument their schema writes to)."""
    out: set[str] = set()
    for node in nodes:
        schema = getattr(node.target, "_schema", None)
        if schema is None:
            continue
        for arg, value in zip(schema.arguments, node.args):
            if arg.alias_info is not None and arg.alias_info.is_write and hasattr(value, "name"):
                out.add(value.name)
    return out


def grad_contiguous_copy(value: Any) -> Any:
    """A copy of ``value`` whose gradient is made contiguous (:func:`grad_contiguous`)."""
    if not getattr(value, "requires_grad", False):
        return value.clone()
    return _grad_contiguous_class(copy=True).apply(value)


def grad_contiguous(value: Any) -> Any:
    """``value`` (a view of it), whose gradient is made contiguous: gloo sends only those."""
    if not getattr(value, "requires_grad", False):
        return value
    return _grad_contiguous_class().apply(value)


@functools.cache
def _grad_contiguous_class(copy: bool = False) -> Any:
    """The identity (``copy``: a copy) as an autograd Function whose backward makes the gradient
    contiguous."""
    import torch

    class GradContiguous(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            ctx.layout = _memory_format(x)
            return x.clone() if copy else x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad.contiguous(memory_format=ctx.layout)

    return GradContiguous


def _memory_format(value: Any) -> Any:
    """``value``'s memory format: channels-last (3-d) when it is laid out so and not also plainly
    contiguous, else contiguous."""
    import torch

    for rank, layout in ((4, torch.channels_last), (5, torch.channels_last_3d)):
        if value.dim() == rank and not value.is_contiguous() and value.is_contiguous(memory_format=layout):
            return layout
    return torch.contiguous_format


def dense_order(strides: Sequence[int], shape: Sequence[int]) -> list[int] | None:
    """The order of dimensions in which a tensor of ``shape`` and ``strides`` is plainly
    contiguous (its permutation by it is), or None when its elements do not fill their storage
    without gaps. Dimensions by stride, largest first, ties in index order.

    >>> dense_order((256, 1, 256, 256), (8, 256, 1, 1))  # a channels-last 1 x 1 map
    [0, 2, 3, 1]
    >>> dense_order((1, 4), (4, 1)), dense_order((4, 1), (2, 2)) is None  # dense; every other column
    ([1, 0], True)
    """
    order = sorted(range(len(shape)), key=lambda d: (-strides[d], d))
    expected = 1
    for d in reversed(order):
        if shape[d] != 1 and strides[d] != expected:
            return None
        expected *= shape[d]
    return order


def contiguous(value: Any) -> Any:
    """``value`` in contiguous memory (itself when it is): what torch's pipeline stages send."""
    return value.contiguous()


def dense(value: Any) -> Any:
    """``value`` itself when its elements fill their storage without gaps, in whatever order of
    dimensions (its strides kept: a channels-last activation, a 1 x 1 map's), else a contiguous
    copy: what a makespan plan's run sends (:mod:`~baechi_cli.runtime.makespan` sends it as its
    :func:`dense_order` view), so its reader runs the kernels, and holds the scratch, it runs in
    one process."""
    return value if dense_order(value.stride(), value.shape) is not None else value.contiguous()


def _placeholder(graph: Any, name: str) -> Any:
    return next(n for n in graph.nodes if n.op == "placeholder" and n.name == name)


def _attr_name(fqn: str, taken: Mapping[str, str]) -> str:
    """A flat attribute name for ``fqn`` (``layers.0.fc.weight`` -> ``layers_0_fc_weight``)."""
    base = "".join(c if c.isalnum() or c == "_" else "_" for c in fqn) or "t"
    if base[0].isdigit():
        base = "_" + base
    name, k = base, 1
    while name in taken and taken[name] != fqn:
        name, k = f"{base}_{k}", k + 1
    return name
