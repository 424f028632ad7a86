"""Measured costs of a PyTorch program: run it in torch on this machine and time every op.

Contract
--------
:func:`measure_program` reads a ``torch.export`` program (a ``.pt2`` archive's, as
:mod:`baechi_cli.io.pt2` reads it; with ``training``, the training step autograd traces of it,
:func:`~baechi_cli.io.pt2_joint.joint_program`, from the same cache ``baechi place`` uses) and
runs its nodes op for op on the CPU with real tensors: ``warmup`` untimed steps, then ``steps``
timed ones. It returns a :class:`~baechi_cli.costs.measured.MeasuredRun` whose ``ops`` maps each
node's name, the name the reader gives its op, to an
:class:`~baechi_cli.costs.measured.OpMeasurement`: the median over the timed steps of the node's
time (the call of its operator, the output's allocation included, as eager PyTorch pays it),
and its scratch: the bytes its kernel held while it ran beyond its inputs and outputs (a CPU
convolution reorders its weight and input into blocked layouts each call), from one more step
under torch's profiler. Output and persistent bytes are left to the analytic model, which sizes
them exactly from the graph's shapes.

What runs is what the plan is made of, in its order: every node's target is looked up among
torch's registered operators (:func:`~baechi_cli.io.pt2_joint.interpret`; nothing from the file
runs, and its weights are never loaded). A tensor is freed after the last node that reads it,
so the allocator sees a step's pattern of allocations, as eager training does. The inputs are
synthetic: floating-point parameters ``randn * 0.02``, floating-point user inputs ``randn``,
buffers and the optimizer's state zeros, integer and boolean inputs ones (a valid index into
any table; a mask that keeps everything). ``threads`` sets torch's CPU threads for the run (a pipeline rank on one thread is measured
with ``threads=1``). Needs torch (``MissingDependencyError``, exit 5); an operator failing on
these inputs is an :class:`~baechi_cli.core.errors.InputError` naming the node.

Complexity: O(nodes) Python per step, plus torch's time for ``warmup + steps`` steps; memory:
one step's live tensors.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

from baechi_cli.core.errors import InputError, MissingDependencyError, one_line
from baechi_cli.costs.measured import MeasuredRun, OpMeasurement, cpu_model
from baechi_cli.io.pt2 import tensor_names

INSTALL_HINT = "pip install 'baechi[torch]'"
#: Seeds the synthetic inputs.
SEED = 0
#: The scale of the synthetic parameters (as a transformer's initialiser draws them).
PARAMETER_SCALE = 0.02


def measure_program(
    program: Mapping[str, Any],
    *,
    training: str | None = None,
    batch_size: int | None = None,
    dims: Mapping[str, int] | None = None,
    threads: int | None = None,
    warmup: int = 2,
    steps: int = 10,
    progress: Callable[[int, int], None] | None = None,
    inputs: Mapping[str, Any] | None = None,
) -> MeasuredRun:
    """Run ``program`` (a parsed program JSON, :func:`baechi_cli.io.pt2.program_json`) in torch
    on the CPU and time every node (module docstring). ``training`` names the optimizer of the
    training step to run; without it the forward runs under ``torch.no_grad``. ``progress(done,
    total)`` is called after every step (``total = warmup + steps``). ``inputs`` gives graph
    inputs' tensors by name (real weights; data that routes an expert), the rest are synthetic;
    the step updates the parameters given in place."""
    try:
        import torch
    except ImportError:
        raise MissingDependencyError(
            f"--measure on a PyTorch program runs it in torch: {INSTALL_HINT}"
        ) from None
    from baechi_cli.io.pt2 import step_program

    if warmup < 0 or steps < 1:
        raise InputError(f"--measure needs steps >= 1 and warmup >= 0, not {steps} and {warmup}")
    graph, kinds, sizes = step_program(program, batch_size=batch_size, dims=dims, training=training)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        unknown = sorted(set(inputs or {}) - set(sizes))
        if unknown:
            raise InputError(f"--measure: {unknown[0]!r} is not an input of the program")
        made = _inputs(
            torch, graph, kinds, {n: shape for n, shape in sizes.items() if n not in (inputs or {})}
        )
        made.update(inputs or {})
        last_use = _last_use(graph)
        times: dict[str, list[float]] = {}
        walls: list[float] = []
        total = warmup + steps
        for step in range(total):
            timed = step >= warmup
            t0 = time.perf_counter()
            took = _step(torch, graph, dict(made), last_use)
            wall = time.perf_counter() - t0
            if timed:
                walls.append(wall * 1e6)
                for name, us in took.items():
                    times.setdefault(name, []).append(us)
            if progress is not None:
                progress(step + 1, total)
        # on copies: the step updates the parameters and the optimizer's state in place
        scratch = _scratch(torch, graph, {name: t.clone() for name, t in made.items()}, last_use)
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    ops = {
        name: OpMeasurement(
            compute_us=statistics.median(us),
            output_bytes=(),
            temporary_bytes=scratch.get(name, 0),
            persistent_bytes=None,
            device="cpu",
            kernel=kernel,
        )
        for (name, kernel), us in ((key, times[key[0]]) for key in _kernels(graph))
        if us
    }
    return MeasuredRun(
        device=f"cpu ({cpu_model()}, {os.cpu_count()} CPUs, {used} thread{'s' if used != 1 else ''}; "
        f"torch {torch.__version__})",
        tensorflow="",
        warmup=warmup,
        steps=steps,
        batch_size=batch_size,
        init_op=None,
        fetches=[f"the {training} training step" if training else "the forward pass"],
        ops=ops,
        step_time_us=statistics.median(walls),
        torch=str(torch.__version__),
        threads=used,
    )


def _kernels(graph: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(node name, its target's ``aten`` name) per node, in program order."""
    return [(str(n["name"]), str(n["target"]).removeprefix("torch.ops.")) for n in graph["nodes"]]


def _inputs(
    torch: Any, graph: Mapping[str, Any], kinds: Mapping[str, str], sizes: Mapping[str, tuple[int, ...]]
) -> dict[str, Any]:
    """Every graph input's synthetic tensor (module docstring), by name, made from one seed."""
    from baechi_cli.io.pt2_joint import torch_dtype

    generator = torch.Generator().manual_seed(SEED)
    values = graph["tensor_values"]
    out: dict[str, Any] = {}
    for name, shape in sizes.items():
        dtype = torch_dtype(torch, values[name]["dtype"])
        kind = kinds.get(name, "user_input")
        if dtype.is_floating_point and kind in ("parameter", "user_input"):
            x = torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype)
            out[name] = x * PARAMETER_SCALE if kind == "parameter" else x
        elif dtype.is_floating_point or dtype.is_complex:  # buffers, the optimizer's state
            out[name] = torch.zeros(shape, dtype=dtype)
        else:  # indices, masks, flags
            out[name] = torch.ones(shape, dtype=dtype)
    return out


def _last_use(graph: Mapping[str, Any]) -> dict[int, list[str]]:
    """Node index -> the tensors (not graph inputs) no later node reads: freed once it has run."""
    inputs = {n for t in graph.get("inputs") or [] for n in tensor_names(t)}
    last: dict[str, int] = {}
    for index, node in enumerate(graph["nodes"]):
        for name in _made(node):
            last[name] = index
        for item in node.get("inputs") or []:
            for name in tensor_names(item.get("arg") or {}):
                last[name] = index
    kept = inputs | {n for out in graph.get("outputs") or [] for n in tensor_names(out)}
    out: dict[int, list[str]] = {}
    for name, index in last.items():
        if name not in kept:
            out.setdefault(index, []).append(name)
    return out


def _made(node: Mapping[str, Any]) -> list[str]:
    return [n for out in node.get("outputs") or [] for n in tensor_names(out)]


def _scratch(
    torch: Any, graph: Mapping[str, Any], env: dict[str, Any], last_use: Mapping[int, list[str]]
) -> dict[str, int]:
    """Per node, the scratch its kernel allocated while it ran (bytes, by name): one more step
    under torch's profiler, each node marked; the most bytes held during the node above both the
    level it started at and the level it left (its outputs), as a CPU convolution's reordered
    weight and input are."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        _step(torch, graph, env, last_use, marked=True)
    names = {str(n["name"]) for n in graph["nodes"]}
    events = prof.profiler.kineto_results.events()
    spans = sorted((e.start_ns(), e.end_ns(), e.name()) for e in events if e.name() in names)
    changes = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    out: dict[str, int] = {}
    level, i = 0, 0
    for start, end, name in spans:
        while i < len(changes) and changes[i][0] < start:
            level += changes[i][1]
            i += 1
        before = top = level
        while i < len(changes) and changes[i][0] <= end:
            level += changes[i][1]
            top = max(top, level)
            i += 1
        out[name] = max(0, top - max(before, level))
    return out


def _step(
    torch: Any,
    graph: Mapping[str, Any],
    env: dict[str, Any],
    last_use: Mapping[int, list[str]],
    marked: bool = False,
) -> dict[str, float]:
    """One step: every node run and timed (µs, by name), each tensor freed once the node after its
    last reader has run; ``marked``: each node's call in a profiler range named as the node."""
    import contextlib

    from baechi_cli.io.pt2_joint import interpret

    took: dict[str, float] = {}
    clock = time.perf_counter_ns
    index = 0
    mark = torch.profiler.record_function if marked else lambda _: contextlib.nullcontext()

    def call(node: Mapping[str, Any], op: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        t0 = clock()
        try:
            with mark(str(node["name"])):
                result = op(*args, **kwargs)
        except Exception as err:  # the operator's own refusal, on these inputs
            raise InputError(
                f"--measure: {node.get('target')} failed in torch: {one_line(err, 200)}", op=str(node["name"])
            ) from None
        took[str(node["name"])] = (clock() - t0) / 1e3
        return result

    def ran(node: Mapping[str, Any]) -> None:  # before its outputs are bound: free the last node's
        nonlocal index
        for name in last_use.get(index - 1, ()):
            env.pop(name, None)
        index += 1

    with torch.no_grad():
        interpret(torch, graph, env, ran, torch.device("cpu"), call)
    return took
