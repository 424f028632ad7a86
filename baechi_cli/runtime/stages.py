"""torch's pipeline objects for a plan: the model exported, cut, and wrapped as ``PipelineStage``\\ s.

Contract. :func:`prepare` exports ``model`` on one microbatch of ``example_args`` (the args split
along dim 0 as torch's schedules split them), finds each node's stage from the plan
(:mod:`~baechi_cli.runtime.plan`) and cuts the program (:mod:`~baechi_cli.runtime.cut`).
:func:`build` then makes, on one rank, the ``PipelineStage`` of each stage that rank runs and the
schedule the plan chose (``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``,
``ScheduleZBVZeroBubble``), ready for ``schedule.step(...)``. The loss is the model's own output,
one floating-point scalar per microbatch; torch's schedules average the microbatches' gradients.

A model torch.export cannot export is an InputError with torch's reason in one line. Needs torch.
O(nodes) plus torch's export.

Example (one process, stages run in turn; launch.py runs them on ranks)::

    prepared = prepare(model, (x,), plan)
    h = prepared.microbatches[0]
    for stage in prepared.cut.stages:
        h = stage.module(*h)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from baechi_cli.core.errors import InputError
from baechi_cli.io.pt2 import export
from baechi_cli.io.pt2_joint import load_op_library
from baechi_cli.runtime.cut import CutProgram, cut_program
from baechi_cli.runtime.plan import Plan, stages_from_modules


@dataclass
class Prepared:
    """A model ready to build on ranks: its program, its microbatches and its stages."""

    program: Any  # torch.export.ExportedProgram
    microbatches: list[tuple[Any, ...]]
    cut: CutProgram
    plan: Plan
    stage_of: dict[str, int]  # what the program was cut by
    # per stage, (inputs, outputs) as (shape, dtype name, requires_grad, strides): one microbatch's
    # values
    metas: list[tuple[list[Meta], list[Meta]]] | None = None
    inputs: list[tuple[Any, ...]] | None = None  # each stage's inputs on microbatch 0 (detached)
    # zbv: the stages whose backward torch cannot split into input and weight gradients (tried)
    whole_backward: list[int] = field(default_factory=list)


Meta = tuple[tuple[int, ...], str, bool, tuple[int, ...]]


def stage_metas(prepared: Prepared) -> list[tuple[list[Meta], list[Meta]]]:
    """Each stage's inputs and outputs on microbatch 0, run stage after stage as the pipeline runs
    them (a received float value that carries a gradient is a leaf that requires one); the inputs
    themselves go to ``prepared.inputs``."""
    import torch

    def meta(t: Any) -> Meta:
        return tuple(t.shape), str(t.dtype).removeprefix("torch."), bool(t.requires_grad), tuple(t.stride())

    user = prepared.program.graph_signature.user_inputs
    env = dict(zip(user, prepared.microbatches[0], strict=True))
    out = []
    prepared.inputs = []
    with torch.enable_grad():
        for stage in prepared.cut.stages:
            values = tuple(env[v] for v in stage.inputs)
            prepared.inputs.append(tuple(v.detach() for v in values))
            outputs = stage.module(*values)
            out.append(([meta(v) for v in values], [meta(v) for v in outputs]))
            for v, t in zip(stage.outputs, outputs, strict=True):
                env[v] = t.detach().requires_grad_(t.requires_grad)
    return out


def reload(
    program_path: str,
    microbatches: list[tuple[Any, ...]],
    plan: Plan,
    stage_of: dict[str, int],
    metas: list[tuple[list[Meta], list[Meta]]],
    inputs: list[tuple[Any, ...]],
    rank: int,
    whole_backward: Sequence[int],
    namespaces: Sequence[str] = (),
) -> Prepared:
    """Rank ``rank``'s stages in another process, from the program ``torch.export.save`` wrote
    (fx modules cannot be pickled without being traced again, which loses calls like ``owned``);
    the packages registering its custom ops' ``namespaces`` imported first."""
    import torch

    for namespace in namespaces:
        load_op_library(namespace)
    program = torch.export.load(program_path)
    local = {s for s in range(plan.num_stages) if plan.stage_rank[s] == rank}
    cut = cut_program(
        program,
        stage_of,
        plan.num_stages,
        copy_outputs=plan.schedule == "zbv",
        only=local,
        thread=plan.kind == "pipeline",
    )
    return Prepared(program, microbatches, cut, plan, stage_of, metas, inputs, list(whole_backward))


def _with_runs(program: Any, plan: Plan) -> Plan:
    """A makespan plan with its runs as stages: (nodes of one device in a row), each on the rank of
    its device (the devices used, in device order)."""
    import dataclasses

    from baechi_cli.runtime.makespan import segments

    nodes = [n for n in program.graph.nodes if n.op == "call_function"]
    order = [n.name for n in nodes]
    if plan.graph_devices is not None:
        _check_names(program, set(plan.graph_devices), plan.graph_untraced)
        device_of = plan.graph_devices
    else:  # an ONNX export's plan: each node on the device of the innermost module placed
        device_of = _module_devices(nodes, plan.module_devices or {})
    stage_of, run_device = segments(order, device_of)
    rank = {d: r for r, d in enumerate(sorted(set(run_device)))}
    return dataclasses.replace(
        plan,
        num_stages=len(run_device),
        stage_rank=[rank[d] for d in run_device],
        graph_stages=stage_of,
        graph_devices=dict(device_of),
    )


def _module_devices(nodes: list[Any], modules: dict[str, int]) -> dict[str, int]:
    """Each node's device: that of the innermost module holding it the plan names (the model
    wrapped after the plan was made: under the wrapper's prefix); a node in none follows the node
    before it."""
    prefix = ""
    paths = [_module_path(n) for n in nodes]
    if modules and not any(p in modules for p in paths):
        known = {p for path in paths for p in _enclosing(path)}
        first = next(iter(modules))
        prefix = next((k[: -len(first)] for k in sorted(known, key=len) if k.endswith("." + first)), "")
    out: dict[str, int] = {}
    last = None
    for node, path in zip(nodes, paths, strict=True):
        found = next(
            (
                modules[p[len(prefix) :]]
                for p in _enclosing(path)
                if p.startswith(prefix) and p[len(prefix) :] in modules
            ),
            None,
        )
        last = found if found is not None else last
        if last is not None:
            out[node.name] = last
    return out


def _enclosing(path: str) -> list[str]:
    """``a.b.c`` -> ``["a.b.c", "a.b", "a"]``: the modules holding a node, innermost first."""
    parts = path.split(".") if path else []
    return [".".join(parts[:k]) for k in range(len(parts), 0, -1)]


def split_microbatches(args: Sequence[Any], count: int) -> list[tuple[Any, ...]]:
    """``args`` as ``count`` microbatches, split along dim 0 as torch's schedules split them."""
    import torch
    from torch.distributed.pipelining.microbatch import split_args_kwargs_into_chunks

    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and (a.dim() == 0 or a.shape[0] % count):
            raise InputError(
                f"input {i} of shape {tuple(a.shape)} does not split into {count} equal microbatches "
                "along dim 0"
            )
    chunks, _ = split_args_kwargs_into_chunks(tuple(args), {}, count)
    return [tuple(c) for c in chunks]


def prepare(model: Any, example_args: Sequence[Any], plan: Plan) -> Prepared:
    """Export, find each node's stage and cut (module docstring)."""
    microbatches = split_microbatches(example_args, plan.microbatches)
    program = export(model, microbatches[0])
    if plan.kind == "makespan":
        plan = _with_runs(program, plan)
    stage_of = node_stages(program, plan)
    cut = cut_program(
        program,
        stage_of,
        plan.num_stages,
        copy_outputs=plan.schedule == "zbv",
        thread=plan.kind == "pipeline",
    )
    prepared = Prepared(program, microbatches, cut, plan, stage_of)
    prepared.metas = stage_metas(prepared)
    if plan.schedule == "zbv":
        prepared.whole_backward = [s for s in range(plan.num_stages) if not _splits_backward(prepared, s)]
    return prepared


def _splits_backward(prepared: Prepared, s: int) -> bool:
    """Whether torch's zero-bubble split of stage ``s``'s backward (input gradients, then weight
    gradients: ``stage_backward_input``, ``stage_backward_weight``) gives, on microbatch 0, the
    weight gradients of the whole backward. It walks a weight's graph once, which fails where
    several of the stage's nodes read one weight (ALBERT's shared layers) or share intermediates
    with the weights' (T5's shared position bias); and it finds a weight's gradient only where the
    weight's path meets an input's that carries a gradient, so a stage whose inputs carry none (the
    stem convolution after a stage 0 of buffer updates alone) or a weight reaching an output by a
    path of its own gets none, or part of it, without an error."""
    import copy

    import torch
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    assert prepared.inputs is not None and prepared.metas is not None
    if s == 0:  # torch never splits the first stage's: its weight step runs the whole backward
        return True
    last = s == prepared.plan.num_stages - 1

    def run(split: bool) -> list[Any]:
        module = copy.deepcopy(prepared.cut.stages[s].module)
        values = [
            v.detach().requires_grad_(g) for v, (_, _, g, _) in zip(prepared.inputs[s], prepared.metas[s][0])
        ]
        outputs = list(module(*values))
        grads = None if last else [torch.ones_like(o) if o.requires_grad else None for o in outputs]
        if split:
            _, groups = stage_backward_input(outputs, grads, values, module.parameters())
            stage_backward_weight(module.parameters(), groups)
        else:
            wanted = [o for o in outputs if o.requires_grad]
            torch.autograd.backward(wanted, [torch.ones_like(o) for o in wanted])
        return [p.grad for p in module.parameters()]

    try:
        split = run(split=True)
    except RuntimeError:
        return False
    for got, whole in zip(split, run(split=False), strict=True):
        if whole is None:
            continue
        if got is None or not torch.allclose(got, whole, rtol=1e-4, atol=1e-6 * float(whole.abs().max())):
            return False
    return True


def node_stages(program: Any, plan: Plan) -> dict[str, int]:
    """``{node: stage}`` for the program's call_function nodes under ``plan``."""
    nodes = [n for n in program.graph.nodes if n.op == "call_function"]
    if plan.graph_stages is not None:
        if plan.kind == "pipeline":
            _check_names(program, set(plan.graph_stages), plan.graph_untraced)
        return {n.name: plan.graph_stages[n.name] for n in nodes if n.name in plan.graph_stages}
    paths = [_module_path(n) for n in nodes]
    stages = stages_from_modules(paths, plan.split_points or [])
    return {n.name: s for n, s in zip(nodes, stages)}


def _check_names(program: Any, planned: set[str], untraced: Sequence[str]) -> None:
    """InputError unless the plan names this program's nodes: none it lacks, all it places."""
    import operator

    import torch

    nodes = [n for n in program.graph.nodes if n.op == "call_function"]
    names = {n.name for n in nodes}
    placed = [
        n.name
        for n in nodes
        if n.target is not operator.getitem and isinstance(n.meta.get("val"), torch.Tensor)
    ]
    strangers = sorted((planned | set(untraced)) - names)
    missing = [n for n in placed if n not in planned and n not in set(untraced)]
    if strangers or missing:
        said = []
        if strangers:
            said.append(f"names {len(strangers)} node(s) this program lacks ({_few(strangers)})")
        if missing:
            said.append(f"misses {len(missing)} of its nodes ({_few(missing)})")
        raise InputError(f"the plan was made for another model: it {' and '.join(said)}")


def whole_backward(prepared: Prepared, stage: int) -> bool:
    """Whether a zero-bubble stage computes its weight gradients with its input gradients (its
    backward does not split: :func:`_splits_backward`)."""
    return stage in prepared.whole_backward


def _together() -> Any:
    """torch's ``dw_builder`` for :func:`whole_backward`: the I step ran the whole backward, so W
    has nothing left to do."""
    return lambda: None


def _few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def _module_path(node: Any) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    paths = [path for path, _ in stack.values()]
    return max(paths, key=len, default="")


def loss_of(output: Any, _target: Any = None) -> Any:
    """The schedule's loss: the last stage's output, one floating-point scalar."""
    value = output[0] if isinstance(output, tuple | list) and len(output) == 1 else output
    if not hasattr(value, "dim") or value.dim() != 0 or not value.is_floating_point():
        raise InputError(
            "the model's forward must return one floating-point scalar (its loss, e.g. out.pow(2).mean())"
        )
    return value


def build(
    prepared: Prepared, rank: int, device: Any, group: Any = None, loss_fn: Callable[..., Any] = loss_of
) -> tuple[list[Any], Any]:
    """The ``PipelineStage``\\ s rank ``rank`` runs and the plan's torch schedule over them. Its
    stages that read one tied weight share one copy of it (:func:`share_tied`), as the plan
    counts it; the schedule's ``step`` averages gradients over microbatches as torch's does."""
    from torch.distributed.pipelining import PipelineStage, schedules

    plan = prepared.plan
    local = [s for s in range(plan.num_stages) if plan.stage_rank[s] == rank]
    shared = share_tied(prepared.cut, local)
    import torch

    def examples(metas: list[Meta]) -> tuple[Any, ...]:  # what the stage receives or sends: sizes only
        return tuple(
            torch.empty_strided(shape, strides, dtype=getattr(torch, dtype), device=device).requires_grad_(
                grad
            )
            for shape, dtype, grad, strides in metas
        )

    # Given the sizes, torch does not run a stage on uninitialised inputs to find them (which
    # fails on indices: embedding, gather).
    assert prepared.metas is not None
    stages = [
        PipelineStage(
            prepared.cut.stages[s].module.to(device),
            s,
            plan.num_stages,
            device,
            input_args=examples(prepared.metas[s][0]),
            output_args=examples(prepared.metas[s][1]),
            group=group,
            dw_builder=_together if whole_backward(prepared, s) else None,
        )
        for s in local
    ]
    cls = getattr(schedules, plan.torch_schedule)
    if len(stages) == 1 and plan.schedule in ("gpipe", "1f1b"):
        return stages, cls(stages[0], plan.microbatches, loss_fn=loss_fn)
    if not shared:
        return stages, cls(stages, plan.microbatches, loss_fn=loss_fn)
    # torch would divide each stage's gradients by the microbatch count, so a weight two stages
    # share twice: the schedule sums them, and its step averages each weight once.
    schedule = cls(stages, plan.microbatches, loss_fn=loss_fn, scale_grads=False)
    schedule.step = _averaging(
        schedule.step, [p for s in stages for p in s.submod.parameters()], plan.microbatches
    )
    return stages, schedule


def share_tied(cut: CutProgram, local: Sequence[int]) -> bool:
    """Give the stages of one rank (``local``) that read one weight one copy of it (the first's):
    a plan holds a weight once per device, and autograd sums its gradients into one ``.grad``.
    Whether any was shared."""
    shared = False
    for fqn, held in cut.tied.items():
        mine = [s for s in held if s in local]
        if len(mine) < 2:
            continue
        first = cut.stages[mine[0]]
        weight = getattr(first.module, attribute_of(first.parameters, fqn))
        for s in mine[1:]:
            stage = cut.stages[s]
            setattr(stage.module, attribute_of(stage.parameters, fqn), weight)
        shared = True
    return shared


def attribute_of(parameters: Mapping[str, str], fqn: str) -> str:
    """The stage module's attribute holding the model's parameter ``fqn``."""
    return next(attr for attr, f in parameters.items() if f == fqn)


def each_once(tensors: Iterable[Any]) -> list[Any]:
    """``tensors`` without repeats (by identity: stages of one rank share a tied weight), in order."""
    return list({id(t): t for t in tensors}.values())


def _averaging(step: Callable[..., Any], parameters: list[Any], count: int) -> Callable[..., Any]:
    """``step``, then each of ``parameters``' gradients (each once) divided by ``count``."""
    import torch

    once = each_once(parameters)

    def step_then_average(*args: Any, **kwargs: Any) -> Any:
        out = step(*args, **kwargs)
        with torch.no_grad():
            for p in once:
                if p.grad is not None:
                    p.grad.div_(count)
        return out

    return step_then_average
