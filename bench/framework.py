"""Real PyTorch training steps beside baechi's predictions of them: peak memory and step time.

`make bench` runs this last. For each model (random weights, built from a
config in code, fixed batch) and each optimizer (SGD, Adam) it

1. **measures** one training step in PyTorch,
   ``opt.zero_grad(set_to_none=True); model(x).float().pow(2).mean().backward(); opt.step()``,
   in ``train()`` mode with every dropout probability set to 0 (so the step
   computes what the exported graph shows; batch norm uses batch statistics):

   * after ``warmup`` steps (the first creates the optimizer state), the
     median wall time of ``steps`` steps, split at the forward/backward and
     backward/optimizer boundaries; ``torch.set_num_threads`` fixed;
   * with the gradients freed (``set_to_none``), *resident* = the bytes of
     the distinct storages of parameters, buffers and optimizer state; then
     one step under ``torch.profiler`` with ``profile_memory=True``: its
     allocation and free records, in time order, are the live-bytes curve
     relative to resident + input, so *peak* = resident + input + the
     curve's maximum, *boundary* = the same at the end of the forward pass
     (loss included), and the curve's final value must equal the gradients'
     bytes (checked per row). Frees of storages allocated before profiling
     began carry no size, hence the gradients are freed first;
   * what autograd saved for backward, by backward node (the ``_saved_*``
     tensors of the graph of one more forward pass, distinct storages, the
     resident ones left out): at the boundary the profiler's curve should
     exceed it by the loss only;
   * the forward pass alone (inference), once per model: in ``eval()`` mode
     under ``no_grad``, the median time of ``steps`` passes after ``warmup``,
     and the peak of one more (resident + input + the most live above them,
     from the same profiler records; the output is held until the call
     returns) (:func:`measure_inference`);
   * on CUDA (``--device cuda``, the default when a GPU is at hand):
     ``torch.cuda.max_memory_allocated`` after
     ``reset_peak_memory_stats`` for the peak, ``memory_allocated`` for
     resident and boundary, CUDA events for the times. This path has not
     been run on a GPU yet.

2. **exports** the model as README.md says (``torch.onnx.export(model.eval(),
   (x,), f, dynamo=False, opset_version=17,
   training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False)``)
   into ``--cache`` (git-ignored), and
3. **predicts** the step with the library, as ``baechi place MODEL
   --training --optimizer O --algo single --devices SPEC`` would:
   ``place_model(path, devices, PlaceOptions(algo="single", training=True,
   optimizer=O))``; predicted peak = ``max(outcome.sim.peak_bytes)``,
   step = ``outcome.sim.step_time_us``; the forward pass likewise without
   ``--training`` (:func:`predict_inference`); the same boundary (the live bytes
   just before the first backward op starts, and which ops keep them) and
   phases (forward, backward, optimizer ops' durations). SPEC is
   ``--devices``, else what ``baechi devices calibrate --torch cpu`` (or
   ``cuda:0``) measures on this machine just before; calibrated again after
   the measurements, the rates' drift is reported (beyond :data:`DRIFT`, the
   step verdicts are marked suspect).
4. **splits** it (issue 15's targets): with P the *measured* peak, for N = 2
   and 4, N devices with SPEC's first device's rates and ``int(r * P) // N``
   bytes each, written as device YAML into ``--cache``/splits/, for r = 1.3
   (``--algo auto`` must place the step, every device's simulated peak within
   its memory) and r = 1.6 (m-TOPO, m-ETF and m-SCT must each place it); the
   export is loaded and costed once per spec (``app.place.prepare``), each
   placer run through ``search.candidates.run_candidate``. Recorded: placed or the
   error's first line, auto's pick, step time, each device's simulated peak
   against its memory, and the placer's own estimate
   (``placement.info["estimated_peak_bytes"]``, where it gives one) against
   that peak.

It writes ``framework.md`` (tables, the targets: one-device peak within
+-15% of the measured peak, step within +-25%; for every miss the component
that differs most; the Splits section with its PASS/MISS counts) and
``framework.json`` (raw numbers) into ``--out`` (default bench/). ``--quick``
builds tiny versions of the models for a smoke run (written to a temporary
folder unless ``--out`` is given). ``--only splits`` re-runs step 4 alone from
the measured rows of ``--out``'s framework.json and the exports in the
cache, on the device spec stored there (so ``--devices`` is refused), and
rewrites framework.md and .json with the other sections as they were:
about 3 minutes here, no torch needed; ``--models`` picks the rows (the
section then holds only those). Without torch and transformers
(``pip install -e '.[bench]'``) a full run prints the install hint, notes it
at the top of an existing framework.md and exits 0. Targets are reported,
not enforced: the script exits 0 either way.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from benchlib import BENCH, ROOT, log, rel, table, write_json, write_text

from baechi_cli import placers
from baechi_cli.app.place import place_model, prepare
from baechi_cli.core.devices import (
    Device,
    DeviceSpec,
    devices_from_yaml,
    dump_devices_yaml,
    load_devices_yaml,
    parse_devices,
)
from baechi_cli.core.errors import EXIT_NOISY, BaechiError
from baechi_cli.core.graph import CONTROL_PORT, OpGraph
from baechi_cli.evaluator.sim import SimResult
from baechi_cli.search.auto import auto_search
from baechi_cli.search.candidates import Candidate, PlaceOptions, Prepared, choose, run_candidate

INSTALL_HINT = "pip install -e '.[bench]'  (torch==2.13.0 CPU build and transformers)"
OPTIMIZERS = ("sgd", "adam")
LR = {"sgd": 0.01, "adam": 0.001}
PEAK_TOLERANCE = 0.15
TIME_TOLERANCE = 0.25
WARMUP = 2
STEPS = 5
QUICK_STEPS = 2
TOP_TYPES = 6
BUSY_CORES = 0.2  # other processes using more than this many cores on average: the times are suspect
NOTE_PREFIX = "> **Not re-measured:**"
MD_NAME, JSON_NAME = "framework.md", "framework.json"


# ---------------------------------------------------------------- models


@dataclass(frozen=True)
class Case:
    """One model: how it is built (full size and ``--quick``) and what it is fed."""

    name: str
    config_class: str  # transformers' names
    model_class: str
    source: str  # for the table
    kind: str  # "image" or "text"
    full: dict[str, Any]  # config overrides, full size
    quick: dict[str, Any]  # config overrides, --quick
    full_input: tuple[int, ...]  # images: (batch, 3, H, W); text: (batch, tokens)
    quick_input: tuple[int, ...]
    output: str = "logits"  # the field of the model's output the loss is taken of


NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
SMALL_TRANSFORMER = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 128,
}

CASES = (
    Case(
        "resnet50",
        "ResNetConfig",
        "ResNetForImageClassification",
        "ResNetForImageClassification(ResNetConfig(num_labels=1000))",
        "image",
        {"num_labels": 1000},
        {"num_labels": 10, "embedding_size": 16, "hidden_sizes": [32, 64], "depths": [1, 1]},
        (8, 3, 224, 224),
        (2, 3, 64, 64),
    ),
    Case(
        "convnext_tiny",
        "ConvNextConfig",
        "ConvNextForImageClassification",
        "ConvNextForImageClassification(ConvNextConfig(num_labels=1000))",
        "image",
        {"num_labels": 1000, "drop_path_rate": 0.0},
        {"num_labels": 10, "num_stages": 2, "hidden_sizes": [16, 32], "depths": [1, 1]},
        (8, 3, 224, 224),
        (2, 3, 64, 64),
    ),
    Case(
        "mobilenet_v2",
        "MobileNetV2Config",
        "MobileNetV2ForImageClassification",
        "MobileNetV2ForImageClassification(MobileNetV2Config(num_labels=1000, tf_padding=False))",
        "image",
        {"num_labels": 1000, "classifier_dropout_prob": 0.0, "tf_padding": False},
        {"num_labels": 10, "classifier_dropout_prob": 0.0, "tf_padding": False, "depth_multiplier": 0.35},
        (8, 3, 224, 224),
        (2, 3, 64, 64),
    ),
    Case(
        "vit_b16",
        "ViTConfig",
        "ViTForImageClassification",
        "ViTForImageClassification(ViTConfig(num_labels=1000))",
        "image",
        {"num_labels": 1000, "attn_implementation": "eager", **NO_DROPOUT},
        {
            "num_labels": 10,
            "attn_implementation": "eager",
            "image_size": 32,
            "patch_size": 8,
            **SMALL_TRANSFORMER,
            **NO_DROPOUT,
        },
        (4, 3, 224, 224),
        (2, 3, 32, 32),
    ),
    Case(
        "bert_base",
        "BertConfig",
        "BertModel",
        "BertModel(BertConfig(), add_pooling_layer=False), last_hidden_state",
        "text",
        {"attn_implementation": "eager", **NO_DROPOUT},
        {"attn_implementation": "eager", "vocab_size": 1000, **SMALL_TRANSFORMER, **NO_DROPOUT},
        (4, 128),
        (2, 16),
        output="last_hidden_state",
    ),
    Case(
        "albert_base",
        "AlbertConfig",
        "AlbertModel",
        "AlbertModel(AlbertConfig(hidden_size=768, num_attention_heads=12, intermediate_size=3072), "
        "add_pooling_layer=False), last_hidden_state",
        "text",
        {
            "hidden_size": 768,
            "num_attention_heads": 12,
            "intermediate_size": 3072,
            "attn_implementation": "eager",
            **NO_DROPOUT,
        },
        {"attn_implementation": "eager", "vocab_size": 1000, **SMALL_TRANSFORMER, **NO_DROPOUT},
        (4, 32),
        (2, 16),
        output="last_hidden_state",
    ),
    Case(
        "gpt2",
        "GPT2Config",
        "GPT2LMHeadModel",
        "GPT2LMHeadModel(GPT2Config()), logits only",
        "text",
        {"attn_implementation": "eager", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
        {
            "attn_implementation": "eager",
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "vocab_size": 1000,
            "n_positions": 64,
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 2,
        },
        (2, 128),
        (2, 16),
    ),
)
CASE_BY_NAME = {c.name: c for c in CASES}


def build(case: Case, quick: bool) -> tuple[Any, Any]:
    """The model (returning one tensor) with seeded random weights, and its seeded input."""
    import torch
    import transformers

    class OneOutput(torch.nn.Module):
        """The model with its output object reduced to the one tensor the loss is taken of."""

        def __init__(self, model: torch.nn.Module, field: str) -> None:
            super().__init__()
            self.model = model
            self.field = field

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return getattr(self.model(x), self.field)

    config = getattr(transformers, case.config_class)(**(case.quick if quick else case.full))
    torch.manual_seed(0)
    extra = {"add_pooling_layer": False} if case.model_class in ("BertModel", "AlbertModel") else {}
    model = OneOutput(getattr(transformers, case.model_class)(config, **extra), case.output)
    distinct_values(model)
    shape = case.quick_input if quick else case.full_input
    generator = torch.Generator().manual_seed(1)
    if case.kind == "image":
        x = torch.randn(shape, generator=generator)
    else:
        x = torch.randint(0, config.vocab_size, shape, generator=generator)
    return model, x


def distinct_values(model: Any) -> None:
    """Perturb the parameters and batch-norm statistics so that no two are equal.

    Freshly initialized models have many identical tensors (norm weights of
    ones, biases and running means of zeros); the exporter deduplicates equal
    initializers into one plus Identity nodes, and baechi would then count
    their bytes once. Trained weights are never equal.
    """
    import torch

    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3 * torch.randn(p.shape, generator=generator))
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.running_mean.add_(0.01 * torch.randn(module.running_mean.shape, generator=generator))
                module.running_var.mul_(1 + 0.1 * torch.rand(module.running_var.shape, generator=generator))


def inputs_of(x: Any) -> tuple[Any, ...]:
    """The model's positional inputs: ``x`` itself when it is a tuple (a model of several inputs,
    such as bench/zoo.py's token ids and attention mask), else ``(x,)``."""
    return x if isinstance(x, tuple) else (x,)


def export_onnx(model: Any, x: Any, path: str, train_mode: bool = False) -> None:
    """README.md's export: inference graph, batch dims fixed, batch norm kept, dropout dropped.

    ``train_mode``: the model in ``train()`` mode instead (``TrainingMode.TRAINING``), its
    Dropout nodes kept with their masks, as a training step with dropout runs them. ``x``: one
    input, or a tuple of them (:func:`inputs_of`).
    """
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(
            model.train() if train_mode else model.eval(),
            inputs_of(x),
            path,
            dynamo=False,
            opset_version=17,
            training=torch.onnx.TrainingMode.TRAINING if train_mode else torch.onnx.TrainingMode.PRESERVE,
            do_constant_folding=False,
        )


# ---------------------------------------------------------------- measurement


def make_optimizer(model: Any, name: str) -> Any:
    import torch

    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=LR[name])
    return torch.optim.Adam(model.parameters(), lr=LR[name])


def storage_bytes(tensors: Iterable[Any], exclude: set[int] | None = None) -> tuple[int, set[int]]:
    """Bytes of the distinct storages of ``tensors`` not in ``exclude``, and their data pointers."""
    seen = set(exclude or ())
    total = 0
    for t in tensors:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in seen:
            seen.add(ptr)
            total += storage.nbytes()
    return total, seen - set(exclude or ())


def optimizer_state(opt: Any) -> list[Any]:
    import torch

    return [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


class Clock:
    """Time stamps on the host (CPU) or in the CUDA stream, and seconds between two of them."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.torch = torch
        self.cuda = cuda

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, a: Any, b: Any) -> float:
        if not self.cuda:
            return b - a
        self.torch.cuda.synchronize()
        return a.elapsed_time(b) / 1e3


def train_step(
    model: Any, x: Any, opt: Any, clock: Clock, on_boundary: Callable[[], None] | None = None
) -> list:
    """One training step; time stamps at its start, after forward + loss, after backward, at its end."""
    from torch.profiler import record_function

    marks = [clock.mark()]
    opt.zero_grad(set_to_none=True)
    with record_function("bench.forward"):
        loss = model(*inputs_of(x)).float().pow(2).mean()
    marks.append(clock.mark())
    if on_boundary is not None:
        on_boundary()
    loss.backward()
    marks.append(clock.mark())
    opt.step()
    marks.append(clock.mark())
    return marks


def saved_by_node(model: Any, x: Any, resident: set[int]) -> dict[str, int]:
    """Bytes autograd keeps for backward after one forward pass, by backward node type.

    The ``_saved_*`` tensors of every node reachable from the loss, distinct
    storages, each counted once (at the first node found holding it); storages
    in ``resident`` (parameters, the input, ...) are left out.
    """
    import torch

    loss = model(*inputs_of(x)).float().pow(2).mean()
    seen = set(resident)
    by_node: Counter[str] = Counter()
    stack, visited = [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            value = getattr(node, attr)
            for t in value if isinstance(value, tuple | list) else (value,):
                if isinstance(t, torch.Tensor):
                    nbytes, ptrs = storage_bytes([t], seen)
                    if nbytes:
                        seen |= ptrs
                        by_node[type(node).__name__] += nbytes
        stack.extend(n for n, _ in node.next_functions)
    return dict(by_node.most_common())


def profiled_curve(model: Any, x: Any, opt: Any, clock: Clock) -> tuple[int, int, int]:
    """(peak, boundary, end) of one step's live bytes on the CPU, relative to its start.

    From ``torch.profiler``'s memory records (the CPU allocator reports every
    allocation and free while ``profile_memory`` is on; frees of storages
    allocated before profiling began are reported without a size, hence the
    gradients are freed before).
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        train_step(model, x, opt, clock)
    events = list(prof.profiler.kineto_results.events())
    forward_end = max(e.start_ns() + e.duration_ns() for e in events if e.name() == "bench.forward")
    records = sorted(
        (
            (e.start_ns(), e.nbytes())
            for e in events
            if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")
        ),
        key=lambda r: r[0],
    )
    level = peak = boundary = 0
    for t, nbytes in records:
        level += nbytes
        peak = max(peak, level)
        if t <= forward_end:
            boundary = level
    return peak, boundary, level


def cuda_curve(model: Any, x: Any, opt: Any, clock: Clock) -> tuple[int, int, int]:
    """(peak, boundary, end) of one step's allocated bytes on the GPU, relative to its start."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    boundary: list[int] = []
    train_step(model, x, opt, clock, lambda: boundary.append(torch.cuda.memory_allocated()))
    torch.cuda.synchronize()
    return (
        torch.cuda.max_memory_allocated() - start,
        boundary[0] - start,
        torch.cuda.memory_allocated() - start,
    )


def measure(model: Any, x: Any, optimizer: str, device: str, warmup: int, steps: int) -> dict[str, Any]:
    """One model and optimizer in PyTorch: times by phase, resident, peak and boundary bytes."""
    clock = Clock(device == "cuda")
    opt = make_optimizer(model, optimizer)
    for _ in range(max(1, warmup)):
        train_step(model, x, opt, clock)
    phases = []
    for _ in range(steps):
        m = train_step(model, x, opt, clock)
        phases.append([clock.seconds(a, b) for a, b in zip(m, m[1:])])
    opt.zero_grad(set_to_none=True)
    # Live between steps once the gradients are freed: parameters, buffers, optimizer state; and the input.
    resident, ptrs = storage_bytes([*model.parameters(), *model.buffers(), *optimizer_state(opt)])
    input_bytes = storage_bytes(inputs_of(x), ptrs)[0]
    if device == "cuda":
        import torch

        # As torch.cuda.max_memory_allocated() counts: with the allocator's rounding and cuBLAS's workspace.
        resident = torch.cuda.memory_allocated() - input_bytes
        curve = cuda_curve
    else:
        curve = profiled_curve
    before = resident + input_bytes
    peak, boundary, end = curve(model, x, opt, clock)
    grads, _ = storage_bytes(p.grad for p in model.parameters() if p.grad is not None)
    totals = [sum(p) for p in phases]
    return {
        "step_s": statistics.median(totals),
        "step_s_all": totals,
        "forward_s": statistics.median(p[0] for p in phases),
        "backward_s": statistics.median(p[1] for p in phases),
        "optimizer_s": statistics.median(p[2] for p in phases),
        "resident_bytes": resident,
        "input_bytes": input_bytes,
        "peak_bytes": before + peak,
        "boundary_bytes": before + boundary,
        "grad_bytes": grads,
        "end_minus_grads_bytes": end - grads,
        "optimizer_state_bytes": storage_bytes(optimizer_state(opt))[0],
    }


def measure_inference(model: Any, x: Any, device: str, warmup: int, steps: int) -> dict[str, Any]:
    """The model's forward pass in ``eval()`` mode under ``no_grad``: its median time and its peak,
    resident (parameters and buffers) + input + the most live above them (``torch.profiler``'s
    records on the CPU, ``max_memory_allocated`` on CUDA). The caller holds the output until the
    call returns, as a framework's caller does."""
    import torch

    clock = Clock(device == "cuda")
    model.eval()
    resident, ptrs = storage_bytes([*model.parameters(), *model.buffers()])
    input_bytes = storage_bytes([x], ptrs)[0]
    with torch.no_grad():
        for _ in range(max(1, warmup)):
            model(x)
        times = []
        for _ in range(steps):
            a = clock.mark()
            model(x)
            times.append(clock.seconds(a, clock.mark()))
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start = torch.cuda.memory_allocated()
            out = model(x)
            torch.cuda.synchronize()
            above = torch.cuda.max_memory_allocated() - start
            del out
        else:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                out = model(x)
                del out
            records = sorted(
                (e.start_ns(), e.nbytes())
                for e in prof.profiler.kineto_results.events()
                if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")
            )
            level = above = 0
            for _, nbytes in records:
                level += nbytes
                above = max(above, level)
    model.train()
    return {
        "step_s": statistics.median(times),
        "step_s_all": times,
        "resident_bytes": resident,
        "input_bytes": input_bytes,
        "peak_bytes": resident + input_bytes + above,
    }


# ---------------------------------------------------------------- prediction


def live_at(graph: OpGraph, sim: SimResult, t: float) -> tuple[dict[str, int], dict[str, int]]:
    """Bytes of the tensors live just before ``t`` on a one-device timeline: by the type of the
    op that made them, and by the type of the op whose end frees them (``<type>Grad`` for a
    backward op: the tensor is kept for that op's backward).

    The simulator's rule (sim.py) restated for one device: an output lives from
    its op's start until its last consumer ends (its own end if none; the step's
    end if the caller holds it); a view
    allocates nothing and keeps its source alive as long as its own outputs.
    Temporaries count under ``(temporary)``.
    """
    start, end = sim.start, sim.end
    last: dict[tuple[int, int], tuple[float, int]] = {}  # tensor -> (free time, the op ending then)
    for e in range(graph.num_edges):
        if graph.edge_port[e] != CONTROL_PORT:
            key, v = (graph.edge_src[e], graph.edge_port[e]), graph.edge_dst[e]
            last[key] = max(last.get(key, (end[key[0]], key[0])), (end[v], v))
    for key in graph.held_outputs:  # the caller's until the step ends
        last[key] = (sim.step_time_us, key[0])
    for v in reversed(graph.topo_order()):
        source = graph.view_of.get(v)
        if source is not None and source[0] >= 0:
            kept = max(
                (last.get((v, p), (end[v], v)) for p in range(len(graph.output_bytes[v]))),
                default=(end[v], v),
            )
            last[source] = max(last.get(source, (end[source[0]], source[0])), kept)
    made: Counter[str] = Counter()
    freed: Counter[str] = Counter()
    for u in range(graph.num_ops):
        if start[u] >= t:
            continue
        if graph.temporary_bytes[u] and end[u] >= t:
            made["(temporary)"] += graph.temporary_bytes[u]
            freed["(temporary)"] += graph.temporary_bytes[u]
        if u in graph.view_of:
            continue
        for port, nbytes in enumerate(graph.output_bytes[u]):
            free, w = last.get((u, port), (end[u], u))
            if nbytes and free >= t:
                made[graph.op_types[u]] += nbytes
                freed[graph.op_types[w]] += nbytes
    return dict(made.most_common()), dict(freed.most_common())


def level_before(curve: list[tuple[float, int]], t: float) -> int:
    """The memory curve's level just before time ``t``."""
    level = curve[0][1]
    for time_, value in curve:
        if time_ >= t:
            break
        level = value
    return level


def predict_inference(path: str, devices: DeviceSpec) -> dict[str, Any]:
    """baechi's one-device forward pass of the ONNX model (``--algo single``, no ``--training``)."""
    try:
        outcome = place_model(path, devices, PlaceOptions(algo="single"))
    except BaechiError as err:
        return {"error": str(err)}
    sim = outcome.sim
    return {
        "peak_bytes": max(sim.peak_bytes),
        "resident_bytes": max(sim.persistent_bytes),
        "step_s": sim.step_time_us / 1e6,
    }


def predict(path: str, devices: DeviceSpec, optimizer: str) -> dict[str, Any]:
    """baechi's one-device training step of the ONNX model: peak, resident, boundary, times by phase."""
    t0 = time.perf_counter()
    try:
        outcome = place_model(path, devices, PlaceOptions(algo="single", training=True, optimizer=optimizer))
    except BaechiError as err:
        return {"error": str(err)}
    return prediction(outcome, t0)


def prediction(outcome: Any, t0: float) -> dict[str, Any]:
    """:func:`predict`'s record of a one-device training step's ``outcome`` (``place_model``'s),
    placed from ``t0`` (``time.perf_counter()``)."""
    sim, graph = outcome.sim, outcome.graph
    device = max(range(len(sim.peak_bytes)), key=sim.peak_bytes.__getitem__)
    backward = [v for v in range(graph.num_ops) if graph.is_backward[v]]
    boundary_t = min((sim.start[v] for v in backward), default=sim.step_time_us)
    duration = [sim.end[v] - sim.start[v] for v in range(graph.num_ops)]
    update = [  # the synthesized step's optimizer ops, or a traced step's update phase
        v
        for v in backward
        if graph.names[v].startswith("optimizer/") or graph.attrs[v].get("_phase") == "update"
    ]
    made, freed = live_at(graph, sim, boundary_t)
    boundary = level_before(sim.memory_curve[device], boundary_t)
    return {
        "seconds": time.perf_counter() - t0,
        "ops": graph.num_ops,
        "peak_bytes": max(sim.peak_bytes),
        "resident_bytes": sim.persistent_bytes[device],
        "boundary_bytes": boundary,
        "live_by_producer": made,
        "live_by_freeing_op": freed,
        "live_explained_bytes": sum(made.values()),
        "step_s": sim.step_time_us / 1e6,
        "forward_s": sum(duration[v] for v in range(graph.num_ops) if not graph.is_backward[v]) / 1e6,
        "backward_s": sum(duration[v] for v in backward) / 1e6 - sum(duration[v] for v in update) / 1e6,
        "optimizer_s": sum(duration[v] for v in update) / 1e6,
        "notes": outcome.notes,
    }


# ---------------------------------------------------------------- devices and machine


def calibrated_devices(
    folder: str, device: str, threads: int, quick: bool, suffix: str = "", flags: tuple[str, ...] = ()
) -> tuple[DeviceSpec, str]:
    """``baechi devices calibrate --torch cpu|cuda:0`` run now, on this machine: its spec and YAML
    (written to ``<folder>/<device><suffix>.yaml``); ``flags`` go on its command line."""
    path = rel(os.path.join(folder, f"{device}{suffix}.yaml"))  # the YAML's header names it
    command = ["devices", "calibrate", "--torch", device, "-o", path, "--quiet"] + (
        ["--quick"] if quick else []
    )
    command += list(flags)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}  # torch's intra-op threads, as measured
    subprocess.run([sys.executable, "-m", "baechi_cli", *command], check=True, cwd=ROOT, env=env)
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    return load_devices_yaml(os.path.join(ROOT, path)), text


CALIBRATION_TRIES = 3  # calibrations refused as noise (a busy machine) before one is taken anyway
CALIBRATION_WAIT_S = 30


def calibrated_until_quiet(
    folder: str, device: str, threads: int, quick: bool, suffix: str = ""
) -> tuple[DeviceSpec, str, bool]:
    """:func:`calibrated_devices`, tried :data:`CALIBRATION_TRIES` times :data:`CALIBRATION_WAIT_S`
    apart while ``baechi devices calibrate`` refuses to measure noise (exit 6: other processes
    busy, or repeats spread wide), then with ``--allow-noisy`` (its YAML header says so): the spec,
    the YAML and whether it was noisy."""
    for attempt in range(1, CALIBRATION_TRIES + 1):
        try:
            devices, text = calibrated_devices(folder, device, threads, quick, suffix)
            return devices, text, False
        except subprocess.CalledProcessError as err:
            if err.returncode != EXIT_NOISY:
                raise
            log(f"calibration refused as noise (try {attempt} of {CALIBRATION_TRIES})")
            if attempt < CALIBRATION_TRIES:
                time.sleep(CALIBRATION_WAIT_S)
    devices, text = calibrated_devices(folder, device, threads, quick, suffix, flags=("--allow-noisy",))
    return devices, text, True


def devices_from(arg: str) -> tuple[DeviceSpec, str]:
    """``--devices``: a YAML file, else a spec such as ``1x1TB``; the spec and its text for the report."""
    if os.path.exists(arg):
        with open(arg, encoding="utf-8") as f:
            return load_devices_yaml(arg), f.read()
    return parse_devices(arg), arg


# The calibrated rates the predictions scale with, by what the recheck calls them.
RATES: tuple[tuple[str, Callable[[Device], float]], ...] = (
    ("matmul", lambda d: d.flops),
    ("conv", lambda d: d.flops_for("conv")),
    ("memory bandwidth", lambda d: d.memory_bandwidth),
)
DRIFT = 0.15  # a rate calibrated again after the measurements off by more than this: times suspect


def drift(before: DeviceSpec, after: DeviceSpec) -> dict[str, float]:
    """Each calibrated rate after the measurements over the same rate before them: how far the
    machine's speed moved while the steps were measured (the predictions use the first)."""
    first, second = before.devices[0], after.devices[0]
    return {name: rate(second) / rate(first) for name, rate in RATES}


def machine(device: str, threads: int) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": importlib.metadata.version("transformers"),
        "onnx": importlib.metadata.version("onnx"),
        "device": device,
        "threads": threads,
        "cores": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
    }
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        info["cpu"] = names[0] if names else info["cpu"]
    except OSError:
        pass
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def cpu_clock() -> tuple[float, float, float] | None:
    """(wall seconds, CPU seconds every process has used since boot, those of this process and its
    children); None where there is no /proc/stat (Linux only)."""
    try:
        with open("/proc/stat", encoding="utf-8") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]  # user .. steal; guest is inside user
    except (OSError, ValueError):
        return None
    busy = sum(ticks) - ticks[3] - ticks[4]  # less idle and iowait
    own = sum(
        getattr(resource.getrusage(who), field)
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        for field in ("ru_utime", "ru_stime")
    )
    return time.perf_counter(), busy / os.sysconf("SC_CLK_TCK"), own


def other_cores(
    start: tuple[float, float, float] | None, end: tuple[float, float, float] | None
) -> float | None:
    """How many cores other processes kept busy on average between two :func:`cpu_clock` readings."""
    if start is None or end is None:
        return None
    return (end[1] - start[1] - (end[2] - start[2])) / (end[0] - start[0])


# ---------------------------------------------------------------- one row


def run_case(case: Case, args: argparse.Namespace, devices: DeviceSpec) -> list[dict[str, Any]]:
    """Export, measure and predict one model for every optimizer."""
    import torch

    model, x = build(case, args.quick)
    params = sum(p.numel() for p in model.parameters())
    path = os.path.join(args.cache, f"{case.name}{'-quick' if args.quick else ''}.onnx")
    t0 = time.perf_counter()
    export_onnx(model, x, path)
    export_s = time.perf_counter() - t0
    model.train()
    model.to(args.device)
    x = x.to(args.device)
    saved = saved_by_node(model, x, storage_bytes([*model.parameters(), *model.buffers(), x])[1])
    log(f"{case.name} inference: measuring")
    inference = {
        "measured": measure_inference(model, x, args.device, args.warmup, args.steps),
        "predicted": predict_inference(path, devices),
    }
    rows = []
    for optimizer in OPTIMIZERS:
        log(f"{case.name} {optimizer}: measuring")
        measured = measure(model, x, optimizer, args.device, args.warmup, args.steps)
        for p in model.parameters():
            p.grad = None
        log(f"{case.name} {optimizer}: predicting")
        rows.append(
            {
                "model": case.name,
                "source": case.source,
                "input": "x".join(map(str, tuple(x.shape))) + (" tokens" if case.kind == "text" else ""),
                "params": params,
                "optimizer": optimizer,
                "onnx": rel(path),
                "export_s": export_s,
                "measured": measured,
                "saved_by_node": saved,
                "predicted": predict(path, devices, optimizer),
                "inference": inference,
            }
        )
    del model, x
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------- splits

FIT_RATIO = 1.3  # auto must place the step on devices whose memories add up to this times the measured peak
ALGORITHMS_RATIO = 1.6  # and each of SPLIT_ALGORITHMS on this much
DEVICE_COUNTS = (2, 4)
SPLIT_ALGORITHMS = ("topo", "etf", "sct")
SPLITS_FOLDER = "splits"  # under --cache: the device YAMLs placed on


def split_devices(base: DeviceSpec, peak_bytes: int, ratio: float, count: int) -> DeviceSpec:
    """``count`` devices whose memories add up to ``ratio * peak_bytes``: each has
    ``int(ratio * peak_bytes) // count`` bytes (so the sum falls short by under ``count``
    bytes, never over), the rates of ``base``'s first device, and that device's name with
    ``0 .. count-1`` in place of its trailing digits; ``base``'s interconnect, less its
    per-pair links (they name ``base``'s devices).
    """
    template = base.devices[0]
    stem = template.name.rstrip("0123456789")
    memory = int(ratio * peak_bytes) // count
    devices = tuple(replace(template, name=f"{stem}{i}", memory_bytes=memory) for i in range(count))
    return DeviceSpec(devices, replace(base.interconnect, links={}))


def split_spec_file(row: dict[str, Any], base: DeviceSpec, ratio: float, count: int, folder: str) -> str:
    """Write the :func:`split_devices` spec of ``row``'s measured peak as device YAML into
    ``folder``; its path (``baechi place --devices`` takes it as is)."""
    peak = row["measured"]["peak_bytes"]
    stem = os.path.splitext(os.path.basename(row["onnx"]))[0]
    path = os.path.join(folder, f"{stem}-{row['optimizer']}-{count}dev-{ratio:g}P.yaml")
    comment = (
        f"bench/framework.py splits: {count} devices, memories adding up to {ratio:g} x P, P = {peak} "
        f"bytes, the measured one-device training peak of {row['model']} with {row['optimizer']}"
    )
    with open(path, "w", encoding="utf-8") as f:
        f.write(dump_devices_yaml(split_devices(base, peak, ratio, count), [comment]))
    return path


def problem_line(error: BaechiError) -> str:
    """The error's first line without the model's path (the row names the model)."""
    text = str(error).removeprefix(f"{error.path}: ") if error.path else str(error)
    return text.splitlines()[0] if text else type(error).__name__


def candidate_record(candidate: Candidate) -> dict[str, Any]:
    """What one placer did: ``placed``, and then ``step_s``, ``peak_bytes`` (the evaluator's
    simulated peak per device), ``peak_over_memory`` (max over devices),
    ``estimated_peak_bytes`` (``placement.info``'s per-device estimate, None where the placer
    gives none) and ``estimate_over_peak`` (max over the devices with a peak; None without an
    estimate); else ``error`` (:func:`problem_line`).
    """
    if candidate.sim is None or candidate.placement is None:
        assert candidate.error is not None  # run_candidate's candidates have a placement or an error
        return {"placed": False, "error": problem_line(candidate.error)}
    peaks = list(candidate.sim.peak_bytes)
    estimate = candidate.placement.info.get("estimated_peak_bytes")
    used = [d for d, peak in enumerate(peaks) if peak > 0]
    return {
        "placed": True,
        "step_s": candidate.sim.step_time_us / 1e6,
        "peak_bytes": peaks,
        "peak_over_memory": max(p / m for p, m in zip(peaks, candidate.sim.memory_limits)),
        "estimated_peak_bytes": None if estimate is None else [int(e) for e in estimate],
        "estimate_over_peak": (
            None if estimate is None or not used else max(estimate[d] / peaks[d] for d in used)
        ),
    }


def auto_record(prepared: Prepared, options: PlaceOptions) -> dict[str, Any]:
    """``--algo auto`` on ``prepared``: ``algorithm``, the placer it keeps, and that
    placer's :func:`candidate_record`; else ``algorithm`` None, ``placed`` False and the
    error ``baechi place`` reports (:func:`problem_line`)."""
    try:
        chosen = choose(auto_search(prepared, options).candidates)
    except BaechiError as err:
        return {"algorithm": None, "placed": False, "error": problem_line(err)}
    return {"algorithm": chosen.algorithm, **candidate_record(chosen)}


def split_row(row: dict[str, Any], count: int, base: DeviceSpec, folder: str) -> dict[str, Any]:
    """One model, optimizer and device count: ``auto``, placed by ``--algo auto`` on devices of
    ``FIT_RATIO`` x the measured peak P in all (:func:`auto_record`), and ``placers``, placed
    by each of ``SPLIT_ALGORITHMS`` on ``ALGORITHMS_RATIO`` x P (``by_algorithm``: a
    :func:`candidate_record` each); both with ``ratio``, ``spec`` (the YAML's path),
    ``memory_bytes`` (per device) and ``verdict``.

    ``auto`` passes when auto places the step and every device's simulated peak is within
    its memory; ``placers`` when every placer places it. The ONNX export is loaded and costed
    once per spec (``app.place.prepare``), as ``baechi place MODEL --training --optimizer O
    --devices SPEC [--algo A]`` would.
    """
    result: dict[str, Any] = {
        "model": row["model"],
        "optimizer": row["optimizer"],
        "devices": count,
        "measured_peak_bytes": row["measured"]["peak_bytes"],
    }
    for key, ratio in (("auto", FIT_RATIO), ("placers", ALGORITHMS_RATIO)):
        result[key] = split_attempt(row, count, base, folder, key, ratio)
    return result


def split_attempt(
    row: dict[str, Any], count: int, base: DeviceSpec, folder: str, key: str, ratio: float
) -> dict[str, Any]:
    """One half of :func:`split_row`: ``key`` "auto" (``--algo auto``, :func:`auto_record`) or
    "placers" (each of ``SPLIT_ALGORITHMS``) on ``count`` devices of ``ratio`` x ``row``'s
    measured peak in all; ``ratio``, ``spec``, ``memory_bytes``, ``verdict`` and the outcome."""
    options = PlaceOptions(training=True, optimizer=row["optimizer"])
    path = os.path.join(ROOT, row["onnx"])
    t0 = time.perf_counter()
    spec_path = split_spec_file(row, base, ratio, count, folder)
    devices = load_devices_yaml(spec_path)
    prepared = prepare(path, devices, options, lambda stage: None)
    if key == "auto":
        outcome = auto_record(prepared, options)
        passed = outcome["placed"] and outcome["peak_over_memory"] <= 1
    else:
        by_algorithm = {
            a: candidate_record(run_candidate(prepared, placers.get(a), options)) for a in SPLIT_ALGORITHMS
        }
        outcome = {"by_algorithm": by_algorithm}
        passed = all(r["placed"] for r in by_algorithm.values())
    attempt = {
        "ratio": ratio,
        "spec": rel(spec_path),
        "memory_bytes": devices.devices[0].memory_bytes,
        "verdict": "PASS" if passed else "MISS",
        **outcome,
    }
    log(
        f"{row['model']} {row['optimizer']}, {count} devices of {ratio:g} x P, {key}: "
        f"{attempt['verdict']} ({time.perf_counter() - t0:.1f} s)"
    )
    return attempt


def run_splits(rows: list[dict[str, Any]], base: DeviceSpec, cache: str) -> dict[str, Any]:
    """The Splits section of ``rows`` (framework.json's, measured): :func:`split_row` for each
    row and each of ``DEVICE_COUNTS``, the device rates those of ``base``'s first device."""
    folder = os.path.join(cache, SPLITS_FOLDER)
    os.makedirs(folder, exist_ok=True)
    t0 = time.perf_counter()
    split_rows = [split_row(row, count, base, folder) for row in rows for count in DEVICE_COUNTS]
    log(f"splits: {len(split_rows)} rows in {time.perf_counter() - t0:.0f} s")
    return {
        "fit_ratio": FIT_RATIO,
        "algorithms_ratio": ALGORITHMS_RATIO,
        "device_counts": list(DEVICE_COUNTS),
        "algorithms": list(SPLIT_ALGORITHMS),
        "rows": split_rows,
    }


# ---------------------------------------------------------------- report


def fmt_bytes(n: float) -> str:
    if abs(n) >= 1e9:
        return f"{n / 1e9:.3f} GB"
    if abs(n) >= 1e6:
        return f"{n / 1e6:.1f} MB"
    return f"{n / 1e3:.1f} kB"


def fmt_s(s: float) -> str:
    return f"{s * 1e3:,.1f} ms"


def pair(measured: str, predicted: str) -> str:
    return f"{measured} / {predicted}"


def verdict(ratio: float, tolerance: float) -> str:
    return f"{'PASS' if abs(ratio - 1) <= tolerance else 'MISS'} ({ratio:.2f})"


def top(by_type: dict[str, int], n: int = TOP_TYPES) -> str:
    return ", ".join(f"{k} {fmt_bytes(v)}" for k, v in list(by_type.items())[:n])


def per_model(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first row of each model (what does not depend on the optimizer)."""
    first: dict[str, dict[str, Any]] = {}
    for r in rows:
        first.setdefault(r["model"], r)
    return list(first.values())


def components(row: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(component, measured, predicted) bytes; the differences add up to the peaks' difference."""
    m, p = row["measured"], row["predicted"]
    return [
        ("resident (parameters, buffers, optimizer state)", m["resident_bytes"], p["resident_bytes"]),
        (
            "activations at the forward/backward boundary (input included)",
            m["boundary_bytes"] - m["resident_bytes"],
            p["boundary_bytes"] - p["resident_bytes"],
        ),
        (
            "above the boundary during backward and the update (gradients, temporaries)",
            m["peak_bytes"] - m["boundary_bytes"],
            p["peak_bytes"] - p["boundary_bytes"],
        ),
    ]


def peak_reason(row: dict[str, Any]) -> str:
    """The component whose difference is largest, with what the numbers say about it."""
    name, meas, pred = max(components(row), key=lambda c: abs(c[2] - c[1]))
    text = f"{name}: baechi {fmt_bytes(pred)}, PyTorch {fmt_bytes(meas)}"
    if name.startswith("activations"):
        text += (
            f". baechi keeps most for {top(row['predicted']['live_by_freeing_op'], 3)}; "
            f"autograd saves most for {top(row['saved_by_node'], 3)} (by backward op; last section)"
        )
    elif name.startswith("above"):
        text += (
            f". PyTorch's `opt.step()` runs after the whole backward pass, so all "
            f"{fmt_bytes(row['measured']['grad_bytes'])} of gradients are live together at its end"
        )
    return text


def time_reason(row: dict[str, Any]) -> str:
    m, p = row["measured"], row["predicted"]
    phases = [f"{ph} {p[f'{ph}_s'] / m[f'{ph}_s']:.2f}x" for ph in ("forward", "backward", "optimizer")]
    return "predicted / measured by phase: " + ", ".join(phases)


def method(results: dict[str, Any]) -> list[str]:
    info, rows = results["machine"], results["rows"]
    where = (
        f"{info.get('gpu')} (CUDA)"
        if info["device"] == "cuda"
        else f"the CPU ({info['cpu']}, {info['cores']} cores, `torch.set_num_threads({info['threads']})`)"
    )
    complete = all(r["measured"]["end_minus_grads_bytes"] == 0 for r in rows)
    others = results["other_cores"]
    return [
        f"Measured on {results['date']} with torch {info['torch']} and transformers {info['transformers']} on {where}: "
        f"{results['warmup']} warm-up steps, then the median of {results['steps']} steps"
        + (" (**--quick**: tiny models, a smoke run)" if results["quick"] else "")
        + (
            "."
            if others is None
            else f". Other processes used {others:.2f} of the {info['cores']} cores on average during the run"
            + (
                f" (over {BUSY_CORES}): **the times, measured and calibrated, are suspect**; memory does not "
                "depend on it."
                if others > BUSY_CORES
                else "."
            )
        ),
        "",
        "- **Models**: transformers classes built from configs in code, random weights (seed 0, then "
        "perturbed so that no two initializers are equal: the exporter would merge equal ones), fp32. "
        "torchvision 0.28 (the build for torch 2.13) does not import with the CPU build of torch (its "
        "C extension links the CUDA libraries), so the CNNs are transformers' own: ResNetConfig's "
        "defaults are ResNet-50 (25,557,032 parameters with 1000 classes, as torchvision's), "
        "ConvNextConfig's ConvNeXt-T, and MobileNetV2 with `tf_padding=False` (static padding, as "
        "torchvision's; TensorFlow-style padding is computed from the input's shape at run time, and "
        "baechi's shape inference cannot size the tensors after such a Pad).",
        "- **Dropout** probabilities are all 0 and the step runs in `train()` mode: the export drops "
        "Dropout nodes, so the step measured is the computation baechi is shown; batch norm uses batch "
        "statistics (the exported BatchNormalization op is costed alike). Attention is transformers' "
        "eager implementation (the softmax probabilities are a tensor, as in the ONNX graph).",
        "- **Step**: `opt.zero_grad(set_to_none=True); model(x).float().pow(2).mean().backward(); "
        "opt.step()`; SGD (lr 0.01, no momentum) and Adam (lr 0.001; on the CPU torch's single-tensor "
        "Adam, on CUDA its foreach Adam).",
        "- **Measured memory** (CPU): *resident* = the distinct storages of parameters, buffers and "
        "optimizer state (gradients freed); the input is live throughout; the step's allocations and "
        "frees come from `torch.profiler` memory records (`profile_memory=True`): *peak* = resident + "
        "input + the maximum of their running sum, *boundary* = the same at the end of the forward pass "
        "(loss included). tests/test_bench_framework.py checks this against bytes computed by hand for "
        "a Linear layer (SGD and Adam); every row checks that the running sum ends at the gradients' "
        f"bytes ({'it does in every row' if complete else '**not in every row**: see framework.json'}), "
        "and the boundary is checked against what autograd saved (last section). On CUDA: "
        "`torch.cuda.max_memory_allocated()` and `memory_allocated()`, CUDA events for the times "
        "(that path has not been run yet).",
        "- **Predicted**: the export (README.md's `torch.onnx.export(model.eval(), (x,), f, "
        "dynamo=False, opset_version=17, training=torch.onnx.TrainingMode.PRESERVE, "
        "do_constant_folding=False)`) placed as `baechi place MODEL --training --optimizer O --algo "
        "single --devices SPEC` would: `max(outcome.sim.peak_bytes)`, `outcome.sim.step_time_us`; its "
        "boundary is the live bytes just before the first backward op starts.",
        "",
        "The device spec (`--devices`; by default `baechi devices calibrate` run just before):",
        "",
        "```yaml",
        *results["devices"].rstrip().splitlines(),
        "```",
        *drift_lines(results.get("calibration_drift")),
    ]


def drift_lines(rates_drift: dict[str, float] | None) -> list[str]:
    """The recheck's sentence: each rate calibrated after the measurements over the one used."""
    if rates_drift is None:
        return []
    moved = [name for name, ratio in rates_drift.items() if abs(ratio - 1) > DRIFT]
    return [
        "",
        "Calibrated again after the measurements, over the rates above: "
        + ", ".join(f"{name} {ratio:.2f}x" for name, ratio in rates_drift.items())
        + (
            f". The {' and '.join(moved)} moved by more than {DRIFT:.0%} while the steps were measured: "
            "**the step verdicts are suspect** (the machine's speed changed; peaks do not depend on it)."
            if moved
            else f": within {DRIFT:.0%}, the machine held its speed."
        ),
    ]


def placer_cell(record: dict[str, Any]) -> str:
    """One placer's result in the Splits tables: step; max peak / memory; max estimate / peak."""
    if not record["placed"]:
        return "not placed"
    estimate = record["estimate_over_peak"]
    return f"{fmt_s(record['step_s'])}; {record['peak_over_memory']:.2f}" + (
        "" if estimate is None else f"; {estimate:.2f}"
    )


def auto_cells(record: dict[str, Any]) -> list[str]:
    """Auto's cells in the Splits tables: the placer it kept, step, each device's peak / memory,
    the largest estimate / peak (``-`` without an estimate); blank where it placed nothing."""
    if not record["placed"]:
        return ["none", "", "", ""]
    estimate = record["estimate_over_peak"]
    return [
        placers.title(record["algorithm"]),
        fmt_s(record["step_s"]),
        ", ".join(f"{peak / record['memory_bytes']:.2f}" for peak in record["peak_bytes"]),
        "-" if estimate is None else f"{estimate:.2f}",
    ]


def render_splits(splits: dict[str, Any]) -> list[str]:
    """The Splits section of framework.md from framework.json's ``splits``."""
    rows = splits["rows"]
    fit, each = f"{splits['fit_ratio']:g} x P", f"{splits['algorithms_ratio']:g} x P"
    titles = [placers.title(a) for a in splits["algorithms"]]
    auto_pass = sum(r["auto"]["verdict"] == "PASS" for r in rows)
    placers_pass = sum(r["placers"]["verdict"] == "PASS" for r in rows)
    placed = ", ".join(
        f"{title} {sum(r['placers']['by_algorithm'][a]['placed'] for r in rows)}"
        for a, title in zip(splits["algorithms"], titles)
    )
    lines = [
        "",
        "## Splits",
        "",
        "*P* is the one-device training peak measured in PyTorch (the Targets table's). For each model, "
        f"optimizer and N of {', '.join(map(str, splits['device_counts']))}: N devices with the rates of "
        f"the device spec above, each with 1/N of {fit} or of {each} (rounded down), written as device "
        "YAML under bench/cache/splits/ and placed as `baechi place MODEL --training --optimizer O "
        "--devices SPEC [--algo A]` would (the library: `app.place.prepare` once per spec, each placer "
        f"through `run_candidate`). **{fit} passes** when auto places the step and every device's "
        f"simulated peak is within its memory; **{each} passes** when {', '.join(titles)} each place it. "
        "*peak / memory*: the evaluator's simulated peak of a device over its memory; *estimate / peak*: "
        "the placer's own estimate of a device's peak (`placement.info['estimated_peak_bytes']`, where "
        "the placer gives one) over the simulated peak, the largest over the devices with a peak. "
        "`python bench/framework.py --only splits` re-runs this section from framework.json's measured "
        "peaks.",
        "",
        f"**Summary**: {fit}, auto: {auto_pass} PASS, {len(rows) - auto_pass} MISS; {each}, every placer: "
        f"{placers_pass} PASS, {len(rows) - placers_pass} MISS (placed at {each}: {placed} of {len(rows)}).",
        "",
        f"### {fit}, auto",
        "",
    ]
    lines += table(
        ["model", "optimizer", "devices", "P", "memory each", "auto", "placer", "step"]
        + ["peak / memory by device", "estimate / peak"],
        [
            [
                r["model"],
                r["optimizer"],
                str(r["devices"]),
                fmt_bytes(r["measured_peak_bytes"]),
                fmt_bytes(r["auto"]["memory_bytes"]),
                r["auto"]["verdict"],
                *auto_cells(r["auto"]),
            ]
            for r in rows
        ],
    )
    lines += [
        "",
        f"### {each}, {', '.join(titles)}",
        "",
        "Each placer's cell: step; largest peak / memory; largest estimate / peak (where the placer gives "
        "an estimate).",
        "",
    ]
    lines += table(
        ["model", "optimizer", "devices", "memory each", "all place", *titles],
        [
            [
                r["model"],
                r["optimizer"],
                str(r["devices"]),
                fmt_bytes(r["placers"]["memory_bytes"]),
                r["placers"]["verdict"],
                *(placer_cell(r["placers"]["by_algorithm"][a]) for a in splits["algorithms"]),
            ]
            for r in rows
        ],
    )
    why = [
        f"- {r['model']} {r['optimizer']}, {r['devices']} devices of {ratio:g} x P, {name}: {record['error']}"
        for r in rows
        for name, ratio, record in [
            ("auto", r["auto"]["ratio"], r["auto"]),
            *(
                (t, r["placers"]["ratio"], r["placers"]["by_algorithm"][a])
                for a, t in zip(splits["algorithms"], titles)
            ),
        ]
        if not record["placed"]
    ]
    if why:
        lines += ["", "### Why not placed", "", *why]
    return lines


def inference_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The inference table: each model's forward pass, measured and predicted, against the same tolerances."""
    models = [r for r in per_model(rows) if "inference" in r]
    if not models:
        return []
    lines = [
        "",
        "### Inference",
        "",
        "The forward pass alone, in `eval()` mode under `torch.no_grad()` (the median of the timed "
        "passes; the peak is resident + input + the most live above them, the output held until the call "
        "returns), against `baechi place MODEL --algo single` (no `--training`): the caller holds the "
        "input and the returned output for the whole pass. Each cell is measured / predicted.",
        "",
    ]
    body = []
    for r in models:
        m, p = r["inference"]["measured"], r["inference"]["predicted"]
        if "error" in p:
            body.append([r["model"], r["input"], f"baechi failed: {p['error']}", "", "", ""])
            continue
        body.append(
            [
                r["model"],
                r["input"],
                pair(fmt_bytes(m["peak_bytes"]), fmt_bytes(p["peak_bytes"])),
                verdict(p["peak_bytes"] / m["peak_bytes"], PEAK_TOLERANCE),
                pair(fmt_s(m["step_s"]), fmt_s(p["step_s"])),
                verdict(p["step_s"] / m["step_s"], TIME_TOLERANCE),
            ]
        )
    return lines + table(["model", "input", "peak", "", "forward", ""], body)


def render(results: dict[str, Any]) -> str:
    rows = results["rows"]
    ok = [r for r in rows if "error" not in r["predicted"]]
    lines = [
        "# PyTorch training steps beside baechi's predictions",
        "",
        "Written by `python bench/framework.py` (`make bench`; needs `pip install -e '.[bench]'`); its "
        "module docstring has the method. Do not edit by hand.",
        "",
        *method(results),
        "",
        "## Targets",
        "",
        f"One-device peak within ±{PEAK_TOLERANCE:.0%} of the measured peak, step within "
        f"±{TIME_TOLERANCE:.0%} of the measured step; in brackets predicted / measured.",
        "",
    ]
    lines += table(
        ["model", "input", "params", "optimizer", "peak", "step"],
        [
            [r["model"], r["input"], f"{r['params']:,}", r["optimizer"]]
            + (
                [f"baechi failed: {r['predicted']['error']}", ""]
                if "error" in r["predicted"]
                else [
                    verdict(r["predicted"]["peak_bytes"] / r["measured"]["peak_bytes"], PEAK_TOLERANCE),
                    verdict(r["predicted"]["step_s"] / r["measured"]["step_s"], TIME_TOLERANCE),
                ]
            )
            for r in rows
        ],
    )
    lines += ["", "Models: " + "; ".join(f"{r['model']}: `{r['source']}`" for r in per_model(rows)) + "."]
    lines += inference_lines(rows)
    lines += [
        "",
        "## Memory",
        "",
        "Each cell is measured / predicted. *activations*: the live bytes when the forward pass has ended "
        "and backward begins (the boundary), less resident; *above*: peak - boundary.",
        "",
    ]
    lines += table(
        ["model", "optimizer", "peak", "resident", "activations", "above", "gradients (measured)"],
        [
            [
                r["model"],
                r["optimizer"],
                pair(fmt_bytes(r["measured"]["peak_bytes"]), fmt_bytes(r["predicted"]["peak_bytes"])),
            ]
            + [pair(fmt_bytes(meas), fmt_bytes(pred)) for _, meas, pred in components(r)]
            + [fmt_bytes(r["measured"]["grad_bytes"])]
            for r in ok
        ],
    )
    lines += [
        "",
        "## Time",
        "",
        "Each cell is measured / predicted; the step's range is over the timed steps.",
        "",
    ]
    lines += table(
        ["model", "optimizer", "step", "measured range", "forward", "backward", "optimizer"],
        [
            [
                r["model"],
                r["optimizer"],
                pair(fmt_s(r["measured"]["step_s"]), fmt_s(r["predicted"]["step_s"])),
                f"{fmt_s(min(r['measured']['step_s_all']))} - {fmt_s(max(r['measured']['step_s_all']))}",
            ]
            + [
                pair(fmt_s(r["measured"][f"{ph}_s"]), fmt_s(r["predicted"][f"{ph}_s"]))
                for ph in ("forward", "backward", "optimizer")
            ]
            for r in ok
        ],
    )
    lines += [
        "",
        "## Why each miss misses",
        "",
        "And the passes whose components differ by more than the tolerance.",
        "",
    ]
    misses = []
    for r in ok:
        peak_ratio = r["predicted"]["peak_bytes"] / r["measured"]["peak_bytes"]
        time_ratio = r["predicted"]["step_s"] / r["measured"]["step_s"]
        if abs(peak_ratio - 1) > PEAK_TOLERANCE:
            misses.append(f"- **{r['model']} {r['optimizer']}, peak {peak_ratio:.2f}**: {peak_reason(r)}.")
        elif offsetting := [
            f"{name} {fmt_bytes(pred - meas)}"
            for name, meas, pred in components(r)
            if abs(pred - meas) > PEAK_TOLERANCE * r["measured"]["peak_bytes"]
        ]:
            misses.append(
                f"- **{r['model']} {r['optimizer']}, peak {peak_ratio:.2f}, a pass by offsetting errors**: "
                + "; ".join(offsetting)
                + "."
            )
        if abs(time_ratio - 1) > TIME_TOLERANCE:
            misses.append(f"- **{r['model']} {r['optimizer']}, step {time_ratio:.2f}**: {time_reason(r)}.")
    lines += misses or ["No misses."]
    lines += [
        "",
        "## Activations at the forward/backward boundary, by op type",
        "",
        "PyTorch: what autograd saved for backward (the `_saved_*` tensors of the graph after one forward "
        "pass; distinct storages, each counted at the first node found holding it; parameters, buffers "
        "and the input left out), by backward node; in brackets the profiler's boundary above resident "
        "and input, which should exceed it only by the loss. baechi: the tensors live just before its "
        "first backward op (the simulator's rule restated per tensor; *explained* is their sum against "
        "the simulated level above resident), by the op whose end frees them (`<type>Grad`: kept for "
        "that op's backward) and by the op that made them.",
        "",
    ]
    for r in per_model(ok):
        m, p = r["measured"], r["predicted"]
        above = m["boundary_bytes"] - m["resident_bytes"] - m["input_bytes"]
        lines += [
            f"- **{r['model']}**, PyTorch saved {fmt_bytes(sum(r['saved_by_node'].values()))} "
            f"({fmt_bytes(above)}): {top(r['saved_by_node'])}.",
            f"  baechi {fmt_bytes(p['boundary_bytes'] - p['resident_bytes'])} "
            f"({fmt_bytes(p['live_explained_bytes'])} explained), kept for: {top(p['live_by_freeing_op'])}; "
            f"made by: {top(p['live_by_producer'])}.",
        ]
    notes = sorted({(r["model"], n) for r in ok for n in r["predicted"]["notes"]})
    if notes:
        lines += ["", "## baechi's notes", ""] + [f"- {model}: {note}" for model, note in notes]
    if "splits" in results:
        lines += render_splits(results["splits"])
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main


def note_missing(out: str, missing: str) -> None:
    """Say at the top of an existing framework.md that this run measured nothing (the tables stay)."""
    path = os.path.join(out, MD_NAME)
    note = f"{NOTE_PREFIX} {missing} was not installed at the last run ({time.strftime('%Y-%m-%d')}); `{INSTALL_HINT}`."
    lines = ["# PyTorch training steps beside baechi's predictions", ""]
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        if len(lines) > 2 and lines[2].startswith(NOTE_PREFIX):
            del lines[2:4]  # the last run's note and its blank line
    os.makedirs(out, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join([*lines[:2], note, "", *lines[2:]]).rstrip("\n") + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help=f"comma-separated, of: {', '.join(CASE_BY_NAME)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="tiny models, few steps: a smoke run")
    parser.add_argument(
        "--devices",
        help="baechi device spec (e.g. 1x1TB) or YAML file (default: baechi devices calibrate, now)",
    )
    parser.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="where PyTorch runs"
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch.set_num_threads")
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument("--steps", type=int, help=f"timed steps (default {STEPS}, --quick {QUICK_STEPS})")
    parser.add_argument(
        "--out", help="folder for framework.md and .json (default bench/; --quick: a temp folder)"
    )
    parser.add_argument(
        "--cache", default=os.path.join(BENCH, "cache"), help="folder for the ONNX exports and split specs"
    )
    parser.add_argument(
        "--only",
        choices=("splits",),
        help="splits: re-run only the Splits section, from the measured rows of --out's framework.json",
    )
    args = parser.parse_args(argv)
    if args.only and args.devices:
        parser.error("--only splits takes the device spec framework.json's rows were predicted with")
    names = args.models.split(",") if args.models else list(CASE_BY_NAME)
    unknown = [n for n in names if n not in CASE_BY_NAME]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(CASE_BY_NAME)}")
    args.cases = [CASE_BY_NAME[n] for n in names]
    args.steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
    args.out = args.out or (tempfile.mkdtemp(prefix="baechi-framework-") if args.quick else BENCH)
    return args


def write_results(results: dict[str, Any], out: str) -> None:
    """framework.json (``results``) and framework.md (:func:`render` of it) into ``out``."""
    write_json(os.path.join(out, JSON_NAME), results)
    write_text(os.path.join(out, MD_NAME), render(results))
    log(f"wrote {os.path.join(out, MD_NAME)} and {JSON_NAME}")


def devices_of_text(text: str) -> DeviceSpec:
    """framework.json's ``devices``: a device YAML (calibrated), or a spec such as ``1x1TB``."""
    import yaml

    return (
        devices_from_yaml(text, JSON_NAME) if isinstance(yaml.safe_load(text), dict) else parse_devices(text)
    )


def rerun_splits(args: argparse.Namespace) -> int:
    """``--only splits``: the Splits section of the rows of ``--out``'s framework.json (the
    ``--models`` among them) on their device spec, written back with the other sections as
    they were; 2 when that file or an ONNX export it names is missing."""
    path = os.path.join(args.out, JSON_NAME)
    if not os.path.exists(path):
        log(f"bench/framework.py --only splits: no {path}; run bench/framework.py without --only first")
        return 2
    with open(path, encoding="utf-8") as f:
        results = json.load(f)
    names = {case.name for case in args.cases}
    rows = [r for r in results["rows"] if r["model"] in names]
    missing = sorted({r["onnx"] for r in rows if not os.path.exists(os.path.join(ROOT, r["onnx"]))})
    if missing:
        log(f"bench/framework.py --only splits: {', '.join(missing)} missing; run without --only to export")
        return 2
    results["splits"] = run_splits(rows, devices_of_text(results["devices"]), args.cache)
    write_results(results, args.out)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.only == "splits":
        return rerun_splits(args)
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        log(f"bench/framework.py: {' and '.join(missing)} not installed, nothing measured; {INSTALL_HINT}")
        note_missing(args.out, " and ".join(missing))
        return 0
    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(args.threads)
    os.makedirs(args.cache, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    start = cpu_clock()  # the calibration included
    target = "cuda:0" if args.device == "cuda" else "cpu"
    if args.devices:
        devices, devices_text = devices_from(args.devices)
    else:
        devices, devices_text, _ = calibrated_until_quiet(args.cache, target, args.threads, args.quick)
    rows = []
    for case in args.cases:
        rows += run_case(case, args, devices)
    rates_drift = None
    if not args.devices:
        # a VM's speed moves by tens of percent over minutes: calibrate again, to show how far
        again, _, _ = calibrated_until_quiet(args.cache, target, args.threads, args.quick, "-after")
        rates_drift = drift(devices, again)
    results = {
        "other_cores": other_cores(start, cpu_clock()),
        "calibration_drift": rates_drift,
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(args.device, args.threads),
        "quick": args.quick,
        "warmup": args.warmup,
        "steps": args.steps,
        "devices": devices_text,
        "peak_tolerance": PEAK_TOLERANCE,
        "time_tolerance": TIME_TOLERANCE,
        "rows": rows,
        "splits": run_splits(rows, devices, args.cache),
    }
    write_results(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
