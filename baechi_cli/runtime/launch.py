"""Run a pipeline plan in PyTorch on gloo ranks and hold it to one process: ``baechi verify --torch``.

Contract. :func:`verify_torch` takes a model, its example inputs (one minibatch) and a report.
It prepares the stages (:mod:`~baechi_cli.runtime.stages`), trains ``steps`` SGD steps in one
process (the reference: the same microbatches, gradients averaged, as torch's schedules do), then
spawns one process per rank (gloo on CPU, one ``PipelineStage`` per stage the plan puts on the
rank, the plan's torch schedule) and trains the same steps. It returns a JSON-able dict:

* ``ran``: every rank finished every step; ``error``: the first rank's failure in one line;
* ``gradients_match``: every parameter's gradient, at every step, within ``RTOL`` relative L2 of
  the reference's (tied copies summed first; the norm divided by is at least ``FLOOR`` times the
  largest gradient's, as a gradient zero in exact arithmetic is noise), the losses likewise;
  every step from the reference's weights: after comparing, a rank updates by the reference's
  gradients, so rounding does not compound over the steps;
* ``threaded``: values passed through stages between their maker and reader; ``tied``: weights
  copied into several stages, their gradients all-reduced; ``cut_by``: program nodes or modules;
* ``as_placed``: the report splits no program node from its own traced ops (``split_nodes``:
  those it does; the runtime runs a node whole, its backward where its forward ran), and the
  runtime ran every node in the stage the plan put it in (a makespan plan: on its device;
  ``displaced_nodes``: those it did not, as a tensor written in place runs with its readers);
* per rank: the stages it ran, its measured peak (bytes held at once during the first step: its
  stages' weights and buffers plus what the step allocates, torch's receive buffers included,
  from torch's profiler) beside the report's
  ``pipeline.schedule.peak_bytes``, and per stage the measured forward-and-backward time of one
  microbatch beside ``pipeline.schedule.stage_compute_us``.

Nothing read from the report runs; the model is the caller's. Needs torch. A rank that has not
finished after ``timeout_s`` is stopped and named.
"""

from __future__ import annotations

import copy
import math
import os
import socket
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from baechi_cli.core.errors import InputError, one_line
from baechi_cli.io.pt2_joint import op_namespaces
from baechi_cli.runtime.plan import Plan, read_plan
from baechi_cli.runtime.stages import Prepared, attribute_of, each_once, loss_of, prepare, reload, share_tied

RTOL = 1e-5  # relative L2 of a gradient against one process's
# A gradient's norm is held to at least this share of the model's largest: one that is zero in exact
# arithmetic (a bias before a batch norm, a key's bias in attention) is float noise in both runs.
FLOOR = 1e-2
# A gradient may differ from one process's by this times the float noise between two one-process
# runs (eager and the exported program; eager in float32 and in float64), when that is more than
# RTOL: a sum that nearly cancels (a bias's gradient) is computed by a stage from a received tensor
# of another layout, and so by other kernels, with that much rounding.
NOISE_FACTOR = 10.0
LR = 0.01
# Each step's gradients are scaled to at most this global L2 norm before the update (as
# torch.nn.utils.clip_grad_norm_ does): a randomly initialised deep network's first gradients can
# be large enough that one unclipped step makes the next loss overflow.
CLIP_NORM = 1.0


def verify_torch(
    model: Any,
    example_args: Sequence[Any],
    report: Mapping[str, Any],
    steps: int = 1,
    timeout_s: float = 600.0,
    measure: bool = True,
    threads: int | None = None,
) -> dict[str, Any]:
    """Run ``report``'s plan for ``model`` on ranks and compare with one process (module docstring)."""
    import torch

    if steps < 1:
        raise InputError(f"--steps must be at least 1, got {steps}")
    plan = read_plan(report)
    prepared = prepare(model, tuple(example_args), plan)
    plan = prepared.plan  # a makespan plan knows its runs once cut
    threads = threads or max(1, (os.cpu_count() or 1) // plan.ranks)
    # One process, with the threads a rank has (a kernel's summation order follows its threads):
    # the reference, and fp32's own noise: the same steps by the exported program (other kernels;
    # a deep network with batch norm on small batches amplifies rounding past RTOL) and in float64.
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        microbatches = prepared.microbatches
        reference = _reference(model, microbatches, steps)
        _check_finite(reference)
        exported = _reference(prepared.program.module(), microbatches, steps, follow=reference)
        reference["noise"] = _noise(exported, reference)
        for fqn, value in _noise(_float64_run(model, microbatches, steps, reference), reference).items():
            reference["noise"][fqn] = max(reference["noise"].get(fqn, 0.0), value)
    finally:
        torch.set_num_threads(before)
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="baechi-verify-") as tmp:
        jobs = []
        payload_path = os.path.join(tmp, "payload.pt")
        program_path = os.path.join(tmp, "program.pt2")
        torch.save(
            {
                "reference": reference,
                "microbatches": prepared.microbatches,
                "metas": prepared.metas,
                "inputs": prepared.inputs,
                "whole_backward": prepared.whole_backward,
                "namespaces": op_namespaces(prepared.program.graph),
            },
            payload_path,
        )
        torch.export.save(prepared.program, program_path)
        for rank in range(plan.ranks):
            job = ctx.Process(
                target=_rank_main,
                args=(
                    rank,
                    port,
                    plan,
                    program_path,
                    prepared.stage_of,
                    payload_path,
                    steps,
                    threads,
                    measure,
                    queue,
                ),
                daemon=True,
            )
            job.start()
            jobs.append(job)
        results, error = _collect(queue, jobs, plan.ranks, timeout_s)
    return _summary(prepared, reference, results, error, steps, report, threads)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reference(
    model: Any,
    microbatches: Sequence[Sequence[Any]],
    steps: int,
    follow: Mapping[str, Any] | None = None,
    dtype: Any = None,
) -> dict[str, Any]:
    """One process: ``steps`` SGD steps over the microbatches on a copy of ``model`` (in ``dtype``
    if given), each at learning rate ``lr`` (:data:`LR`, less where the gradients' global norm is
    over :data:`CLIP_NORM`); losses, gradients by FQN and each step's ``lr``. With ``follow``
    (another run's result), each step updates by its gradients and rate, not this run's own, so
    every step starts from its weights."""
    import torch

    with warnings.catch_warnings():  # torch's own deprecation, copying an exported module's specs
        warnings.simplefilter("ignore", FutureWarning)
        ref = copy.deepcopy(model)
    if dtype is not None:
        ref = ref.to(dtype)
    names: dict[int, list[str]] = {}
    for name, p in ref.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    params = [p for p in ref.parameters()]
    m = len(microbatches)
    losses, grads, rates = [], [], []
    for step in range(steps):
        for p in params:
            p.grad = None
        total = 0.0
        for mb in microbatches:
            loss = loss_of(ref(*mb))
            (loss / m).backward()
            total += float(loss.detach())
        losses.append(total / m)
        step_grads: dict[str, Any] = {}
        for p in params:
            if p.grad is not None:
                for name in names[id(p)]:
                    step_grads[name] = p.grad.detach().clone()
        grads.append(step_grads)
        if follow is None:
            norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params if p.grad is not None))
            rates.append(LR * min(1.0, CLIP_NORM / norm) if norm > 0 else LR)
        update = follow["grads"][step] if follow is not None else step_grads
        lr = follow["lr"][step] if follow is not None else rates[-1]
        with torch.no_grad():
            for p in params:  # by any of its names; one the followed run lacks: by its own
                g = next((update[n] for n in names[id(p)] if n in update), p.grad)
                if g is not None:
                    p.add_(g, alpha=-lr)
    return {
        "losses": losses,
        "grads": grads,
        "lr": rates if follow is None else list(follow["lr"]),
        "aliases": [v for v in names.values() if len(v) > 1],
    }


def _check_finite(reference: Mapping[str, Any]) -> None:
    """InputError when one process's loss or a gradient is not finite at some step: a plan's run
    compared with it could match without meaning anything (inf - inf is no difference)."""
    import torch

    for step, (loss, grads) in enumerate(zip(reference["losses"], reference["grads"], strict=True)):
        bad = "the loss" if not math.isfinite(loss) else None
        if bad is None:
            bad = next(
                (f"the gradient of {n}" for n, g in grads.items() if not bool(torch.isfinite(g).all())), None
            )
        if bad is not None:
            raise InputError(
                f"in one process {bad} is not finite at step {step + 1} (loss {loss:.4g}): there is "
                "nothing to compare a plan's run with; make the model's forward give a finite loss"
            )


def _float64_run(
    model: Any, microbatches: Sequence[Sequence[Any]], steps: int, reference: Mapping[str, Any]
) -> dict[str, Any]:
    """:func:`_reference` on a float64 copy of a float32 model, following ``reference``; no
    gradients where the model holds other floats or an op has no float64 kernel."""
    import torch

    if any(p.dtype != torch.float32 for p in model.parameters()):
        return {"grads": []}

    def wide(x: Any) -> Any:
        return x.double() if isinstance(x, torch.Tensor) and x.dtype == torch.float32 else x

    try:
        return _reference(
            model, [tuple(map(wide, mb)) for mb in microbatches], steps, reference, dtype=torch.float64
        )
    except Exception:  # noqa: BLE001 - an op without a float64 kernel: the other noise run stands
        return {"grads": []}


def _noise(other: Mapping[str, Any], reference: Mapping[str, Any]) -> dict[str, float]:
    """Per parameter, the largest relative L2 between two one-process runs over the steps."""
    noise: dict[str, float] = {}
    for a, b in zip(other["grads"], reference["grads"]):
        scale = FLOOR * max((float(g.double().norm()) for g in b.values()), default=0.0)
        for fqn, expected in b.items():
            got = a.get(fqn)
            if got is not None:
                noise[fqn] = max(noise.get(fqn, 0.0), _relative_l2(got, expected, scale))
    return noise


def _collect(queue: Any, jobs: list[Any], ranks: int, timeout_s: float) -> tuple[dict[int, Any], str | None]:
    import queue as queues

    results: dict[int, Any] = {}
    error = None
    deadline = time.monotonic() + timeout_s
    while len(results) < ranks:
        try:
            rank, result = queue.get(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
        except queues.Empty:
            dead = [r for r, j in enumerate(jobs) if not j.is_alive() and r not in results]
            if dead:
                error = error or f"rank {dead[0]} exited with code {jobs[dead[0]].exitcode} and said nothing"
                break
            if time.monotonic() >= deadline:
                waiting = [r for r in range(ranks) if r not in results]
                error = error or f"ranks {waiting} did not finish within {timeout_s:.0f} s"
                break
            continue
        results[rank] = result
        if result.get("error") and error is None:
            error = f"rank {rank}: {result['error']}"
            # the other ranks wait on this one: stop them
            break
    for job in jobs:
        job.join(timeout=5 if error is None else 0.5)
        if job.is_alive():
            job.kill()
            job.join()
    return results, error


def _rank_main(
    rank: int,
    port: int,
    plan: Plan,
    program_path: str,
    stage_of: dict[str, int],
    payload_path: str,
    steps: int,
    threads: int,
    measure: bool,
    queue: Any,
) -> None:
    """One rank: its stages under the plan's schedule, ``steps`` steps, gradients compared."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's own, on loading a program
    try:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=plan.ranks
        )
        payload = torch.load(payload_path, weights_only=True)
        prepared = reload(
            program_path,
            payload["microbatches"],
            plan,
            stage_of,
            payload["metas"],
            payload["inputs"],
            rank,
            payload["whole_backward"],
            payload["namespaces"],
        )
        result = _run_rank(rank, prepared, payload["reference"], steps, measure)
    except Exception as err:  # a stage or torch failing: said in one line, and the run stops
        if os.environ.get("BAECHI_DEBUG"):
            import traceback

            traceback.print_exc()
        cause = err.__cause__
        said = one_line(err, 300) if cause is None else f"{one_line(cause, 300)} ({one_line(err, 120)})"
        result = {"error": said}
    queue.put((rank, result))
    try:
        if "error" not in result:
            dist.barrier()
        dist.destroy_process_group()
    except Exception:  # noqa: S110 - the group may be gone already
        pass


def _run_rank(
    rank: int, prepared: Prepared, reference: Mapping[str, Any], steps: int, measure: bool
) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    plan, cut = prepared.plan, prepared.cut
    device = torch.device("cpu")
    run_step = _stepper(prepared, rank, device)
    local = [s for s in range(plan.num_stages) if plan.stage_rank[s] == rank]
    modules = {s: cut.stages[s].module for s in local}
    if plan.kind == "makespan":  # a pipeline's stages share them as they are built
        share_tied(cut, local)
    # Tied weights: one gloo group per weight held on several ranks, made in one order everywhere.
    syncs = []
    for fqn, held in sorted(cut.tied.items()):
        ranks = sorted({plan.stage_rank[s] for s in held})
        group = dist.new_group(ranks) if len(ranks) > 1 else None
        if rank in ranks:
            copies = [
                getattr(modules[s], attribute_of(cut.stages[s].parameters, fqn)) for s in held if s in modules
            ]
            syncs.append((fqn, each_once(copies), group))
    losses: list[float] = []
    worst: dict[str, float] = {}
    step_s: list[float] = []
    peak = 0
    parameters = each_once(p for m in modules.values() for p in m.parameters())
    resident = sum(  # before the first step: weights and buffers (no gradients yet), each once
        t.numel() * t.element_size()
        for t in [*parameters, *each_once(b for m in modules.values() for b in m.buffers())]
    )
    for step in range(steps):
        for p in parameters:
            p.grad = None
        dist.barrier()  # every rank starts the step together: its time is the minibatch's
        t0 = time.perf_counter()
        if measure and step == 0:  # the first step allocates torch's receive buffers too
            peak, step_losses = _profiled_peak(run_step)
        else:
            step_losses = run_step()
        step_s.append(time.perf_counter() - t0)
        if step_losses:
            losses.append(sum(float(x.detach()) for x in step_losses) / len(step_losses))
        _sync_tied(syncs)
        grads = reference["grads"][step]
        scale = FLOOR * max((float(g.double().norm()) for g in grads.values()), default=0.0)
        # Each gradient compared, then the reference's update, not this rank's own: every step's
        # gradients are computed from the reference's weights, and rounding (a kernel picking
        # another algorithm for a received tensor's layout) does not compound over the steps.
        updated: set[int] = set()  # a weight two runs of this rank share: updated once
        with torch.no_grad():
            for s, module in modules.items():
                for attr, fqn in cut.stages[s].parameters.items():
                    p = getattr(module, attr)
                    expected = grads.get(fqn)
                    if expected is None and p.grad is None:
                        continue
                    worst[fqn] = max(worst.get(fqn, 0.0), _relative_l2(p.grad, expected, scale))
                    if expected is not None and id(p) not in updated:
                        updated.add(id(p))
                        p.add_(expected, alpha=-reference["lr"][step])
    out: dict[str, Any] = {"stages": local, "losses": losses, "worst": worst, "step_s": step_s}
    if measure:
        # One rank at a time: ranks sharing cores (4 on 2) would time each other's work.
        times: dict[int, float] = {}
        for turn in range(dist.get_world_size()):
            dist.barrier()
            if turn == rank:
                times = _stage_times(prepared, modules)
        dist.barrier()
        out.update(peak_bytes=resident + peak, resident_bytes=resident, stage_compute_us=times)
    return out


def _stepper(prepared: Prepared, rank: int, device: Any) -> Any:
    """A function running one training step of ``rank``'s part of the plan, returning the losses
    of its microbatches where this rank computes them (else an empty list)."""
    import torch

    plan = prepared.plan
    batch = tuple(
        torch.cat([mb[i] for mb in prepared.microbatches]) for i in range(len(prepared.microbatches[0]))
    )
    if plan.kind == "makespan":
        from baechi_cli.runtime.makespan import MakespanStep

        assert prepared.metas is not None
        runner = MakespanStep(
            prepared.cut, plan.stage_rank, rank, prepared.metas, prepared.program.graph_signature.user_inputs
        )

        def makespan_step() -> list[Any]:
            loss = runner.step(batch)
            return [] if loss is None else [loss]

        return makespan_step
    from baechi_cli.runtime.stages import build

    stages, schedule = build(prepared, rank, device)
    local = [s.stage_index for s in stages]
    first, last = 0 in local, plan.num_stages - 1 in local
    target = torch.zeros(plan.microbatches)

    def pipeline_step() -> list[Any]:
        losses: list[Any] = []
        args = batch if first else ()
        if last:
            schedule.step(*args, target=target, losses=losses, return_outputs=False)
        else:
            schedule.step(*args)
        return losses

    return pipeline_step


def _sync_tied(syncs: list[tuple[str, list[Any], Any]]) -> None:
    """Sum a tied weight's gradient over its copies (local ones, then across ranks)."""
    import torch
    import torch.distributed as dist

    for _fqn, copies, group in syncs:
        grads = [p.grad for p in copies if p.grad is not None]
        total = torch.stack(grads).sum(0) if grads else torch.zeros_like(copies[0])
        if group is not None:
            dist.all_reduce(total, group=group)
        for p in copies:
            p.grad = total.clone()


def _relative_l2(got: Any, expected: Any, floor: float = 0.0) -> float:
    """``|got - expected| / max(|expected|, floor)`` (L2 norms); inf for a missing gradient."""
    if got is None or expected is None:
        return math.inf
    if got.shape != expected.shape:
        return math.inf
    ref = float(expected.double().norm())
    diff = float((got.double() - expected.double()).norm())
    if not math.isfinite(diff):  # a non-finite value on either side: nothing agrees with it
        return math.inf
    return 0.0 if diff == 0.0 else diff / max(ref, floor, 1e-30)


def _profiled_peak(run_step: Any) -> tuple[int, Any]:
    """(the most bytes the step held at once above what it started with, its result), from torch's
    profiler's allocation records (every CPU allocation and free while ``profile_memory`` is on)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = run_step()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")
    )
    level = peak = 0
    for _, nbytes in events:
        level += nbytes
        peak = max(peak, level)
    return peak, result


def _stage_times(
    prepared: Prepared, modules: Mapping[int, Any], reps: int = 7, warmup: int = 2
) -> dict[int, float]:
    """Median forward-and-backward time of one microbatch through each local stage (µs), after
    ``warmup`` untimed runs (the first ones allocate and pick kernels).

    On one thread the time is the process's CPU time, not the wall clock's: ranks and other work
    sharing the cores would otherwise be timed too. With more threads CPU time sums them, so the
    wall clock is used."""
    import torch

    assert prepared.inputs is not None and prepared.metas is not None
    clock = time.process_time if torch.get_num_threads() == 1 else time.perf_counter
    times = {}
    for s, module in modules.items():
        samples = []
        for _ in range(warmup + reps):
            args = [
                a.detach().requires_grad_(grad)
                for a, (_, _, grad, _) in zip(prepared.inputs[s], prepared.metas[s][0], strict=True)
            ]
            t0 = clock()
            outs = [o for o in module(*args) if isinstance(o, torch.Tensor) and o.requires_grad]
            if outs:
                torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
            samples.append((clock() - t0) * 1e6)
            for p in module.parameters():
                p.grad = None
        samples = sorted(samples[warmup:])
        times[s] = samples[len(samples) // 2]
    return times


def _displaced(plan: Plan, cut: Any) -> list[str]:
    """The nodes the cut moved from the stage the plan put them in (a makespan plan: those it
    moved to another device, not just to a later run of their own)."""
    if plan.kind != "makespan":
        return list(cut.moved)
    planned = plan.graph_stages or {}
    return [n for n in cut.moved if plan.stage_rank[cut.made_in[n]] != plan.stage_rank[planned[n]]]


def _summary(
    prepared: Prepared,
    reference: Mapping[str, Any],
    results: Mapping[int, Any],
    error: str | None,
    steps: int,
    report: Mapping[str, Any],
    threads: int,
) -> dict[str, Any]:
    plan, cut = prepared.plan, prepared.cut
    used = _rank_devices(report, plan)
    displaced = _displaced(plan, cut)
    predicted_peak, predicted_compute = _predictions(report, plan)
    measured: dict[int, float] = {}
    for result in results.values():
        for s, us in (result.get("stage_compute_us") or {}).items():
            measured[int(s)] = round(us, 3)
    held = {fqn for stage in cut.stages for fqn in stage.parameters.values()}
    aliases = {name: group for group in reference["aliases"] for name in group}
    missing = [
        fqn
        for fqn in sorted(reference["grads"][0])
        if fqn not in held and not any(a in held for a in aliases.get(fqn, ()))
    ]
    worst: dict[str, float] = {}
    losses: list[float] = []
    for result in results.values():
        for fqn, value in (result.get("worst") or {}).items():
            worst[fqn] = max(worst.get(fqn, 0.0), value)
        losses = result.get("losses") or losses
    ran = error is None and len(results) == plan.ranks and len(losses) == steps
    loss_error = max(
        (abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, reference["losses"])), default=math.inf
    )
    noise = reference.get("noise") or {}
    tolerance = {fqn: max(RTOL, NOISE_FACTOR * noise.get(fqn, 0.0)) for fqn in worst}
    worst_param = max(worst, key=lambda f: worst[f] / tolerance[f], default=None)
    within = all(worst[f] <= tolerance[f] for f in worst) and loss_error <= RTOL
    matches = ran and not missing and bool(worst) and within
    out: dict[str, Any] = {
        "ran": ran,
        "error": error,
        "gradients_match": matches,
        "rtol": RTOL,
        "worst": {
            "parameter": worst_param,
            "relative_l2": _finite(worst.get(worst_param, math.inf)) if worst_param else None,
            "tolerance": tolerance.get(worst_param) if worst_param else None,
        },
        "loss": {"pipeline": losses, "one_process": reference["losses"], "relative": _finite(loss_error)},
        "parameters_compared": len(worst),
        "parameters_missing": missing,
        "schedule": plan.schedule,
        "torch_schedule": plan.torch_schedule,
        "stages": plan.num_stages,
        "ranks": plan.ranks,
        "microbatches": plan.microbatches,
        "steps": steps,
        "cut_by": plan.cut_by,
        "threaded": cut.threaded(),
        "tied": [{"parameter": fqn, "stages": stages} for fqn, stages in sorted(cut.tied.items())],
        "moved_nodes": cut.moved,
        # nodes the runtime ran in another stage (a makespan plan: on another device) than planned
        "displaced_nodes": displaced,
        # zbv stages whose weight gradients are computed with their input gradients (no split)
        "whole_backward": prepared.whole_backward,
        "unplanned_nodes": len(cut.unplanned),
        # nodes the plan split over stages or devices: the runtime runs each whole, so the plan
        # did not run as placed (a plan of this version's reader never has any)
        "split_nodes": list(plan.graph_split),
        "as_placed": not plan.graph_split and not displaced,
        "per_rank": [
            {
                "rank": r,
                "stages": results[r].get("stages"),
                "peak_bytes": results[r].get("peak_bytes"),
                "predicted_peak_bytes": predicted_peak[r] if r < len(predicted_peak) else None,
                **_device_memory(report, used, r, results[r].get("peak_bytes")),
            }
            for r in sorted(results)
        ],
        "per_stage": [
            {
                "stage": s,
                "rank": plan.stage_rank[s],
                "compute_us": measured.get(s),
                "predicted_compute_us": predicted_compute[s] if s < len(predicted_compute) else None,
            }
            for s in range(plan.num_stages)
        ],
    }
    # A step's time is its slowest rank's (they start together); the first step warms up.
    per_step = [max(r.get("step_s", [0])[i] for r in results.values()) for i in range(steps)] if ran else []
    timed = sorted(per_step[1:] or per_step)
    predicted_step = ((report.get("pipeline") or {}).get("schedule") or {}).get("minibatch_us")
    if predicted_step is None and plan.kind == "makespan":
        predicted_step = (report.get("result") or {}).get("step_time_us")
    out["minibatch_us"] = {
        "measured": round(timed[len(timed) // 2] * 1e6, 3) if timed else None,
        "predicted": predicted_step,
        "threads_per_rank": threads,
    }
    # Whether the plan ran within the memory it was made for: every rank's measured peak (None:
    # none measured) within its device's.
    fits = [r["fits"] for r in out["per_rank"] if r["fits"] is not None]
    out["within_memory"] = all(fits) if fits else None
    out["compute_imbalance"] = {
        "measured": _imbalance(measured.values()),
        "predicted": _imbalance(predicted_compute),
    }
    return out


def _predictions(report: Mapping[str, Any], plan: Any) -> tuple[list[Any], list[float]]:
    """The report's peak bytes per rank and compute per stage (one microbatch, µs)."""
    from baechi_cli.pipeline.schedules import REGISTRY

    if plan.kind == "makespan":  # the devices used, in device order: the ranks
        used = sorted(set(plan.graph_devices.values())) if plan.graph_devices else []
        per_device = report.get("per_device") or []
        return [per_device[d]["peak_bytes"] if d < len(per_device) else None for d in used], []
    schedule = (report.get("pipeline") or {}).get("schedule") or {}
    peaks = list(schedule.get("peak_bytes") or [])
    if REGISTRY.find(plan.schedule).stages_per_device == 1 and len(peaks) == plan.num_stages:
        by_rank = [0] * plan.ranks  # one entry per stage: put each on its rank
        for s, b in enumerate(peaks):
            by_rank[plan.stage_rank[s]] = b
        peaks = by_rank
    return peaks, [float(x) for x in schedule.get("stage_compute_us") or []]


def _rank_devices(report: Mapping[str, Any], plan: Plan) -> list[int]:
    """The report's device index each rank stands for: the devices the plan uses, in index order."""
    if plan.kind == "makespan":
        return sorted(set((plan.graph_devices or plan.module_devices or {}).values()))
    return sorted({int(s["device"]) for s in (report.get("pipeline") or {}).get("stages") or ()})


def _device_memory(
    report: Mapping[str, Any], used: Sequence[int], rank: int, peak: int | None
) -> dict[str, Any]:
    """The device ``rank`` stands for (``used[rank]``: :func:`_rank_devices`), its memory, and
    whether the rank's measured ``peak`` fits it (None when either is unknown):
    ``{device, memory_bytes, fits}``."""
    devices = report.get("devices") or []
    if rank >= len(used) or used[rank] >= len(devices):
        return {"device": None, "memory_bytes": None, "fits": None}
    device = devices[used[rank]]
    memory = device.get("memory_bytes")
    return {
        "device": device.get("name"),
        "memory_bytes": memory,
        "fits": None if peak is None or memory is None else bool(peak <= memory),
    }


def _imbalance(values: Any) -> float | None:
    """The slowest stage's time over the mean stage's."""
    xs = [float(x) for x in values if x is not None]
    return round(max(xs) / (sum(xs) / len(xs)), 4) if xs and sum(xs) > 0 else None


def load_model_function(spec: str) -> tuple[Any, tuple[Any, ...]]:
    """``FILE.py:FUNC``: run the user's FILE.py (their own code, on purpose) and call FUNC(), which
    returns ``(model, example_args)``. One-line InputErrors for a missing file or function."""
    import runpy

    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name.isidentifier():
        raise InputError(f"--torch takes FILE.py:FUNC, got {spec!r}")
    if not os.path.isfile(path):
        raise InputError("no such file", path=path)
    namespace = runpy.run_path(path, run_name="__baechi_model__")
    func = namespace.get(name)
    if not callable(func):
        raise InputError(f"defines no function {name!r}", path=path)
    made = func()
    if not isinstance(made, tuple) or len(made) != 2:
        raise InputError(f"{name}() must return (model, example_args)", path=path)
    model, args = made
    return model, tuple(args) if isinstance(args, tuple | list) else (args,)


def _finite(x: float) -> float | None:
    return None if math.isinf(x) or math.isnan(x) else x
