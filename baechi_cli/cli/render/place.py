"""``baechi place``'s summary: the model and passes, the chosen placement, each device's load."""

from __future__ import annotations

from typing import TYPE_CHECKING

from baechi_cli.cli.render.common import fmt_bytes, fmt_us, make_console, make_table, memory_bar
from baechi_cli.io.formats import FORMATS
from baechi_cli.search.candidates import schedule_devices

if TYPE_CHECKING:
    from rich.console import Console

    from baechi_cli.app.outcome import PlaceOutcome
    from baechi_cli.core.devices import DeviceSpec
    from baechi_cli.evaluator.sim import SimResult
    from baechi_cli.search.candidates import Prepared

# The summary lists at most this many modules of the module map (the report has all).
MODULE_MAP_SHOWN = 12
# Idle devices in a row the summary table lists one by one; a longer run is one row.
IDLE_ROWS = 3


def header(console: Console, prepared: Prepared) -> None:
    """The lines ``place`` and ``compare`` start with: model, devices, costs, training and passes."""
    spec, g = prepared.devices, prepared.graph
    ic = spec.interconnect
    console.print(
        f"[bold]{prepared.path}[/]: {g.num_ops} ops, {g.num_edges} edges -> {spec.count} devices "
        f"({ic.mode} comm, {ic.latency_us:g} µs + {ic.bandwidth_bytes_per_us / 1e3:.2f} GB/s)"
    )
    from baechi_cli.search.candidates import ProfileCosts

    costs = prepared.cost_report
    if isinstance(costs, ProfileCosts):
        article = "an" if costs.source[:1] in "aeiou" else "a"
        console.print(f"costs: {costs.path}, {article} {costs.source} profile for {costs.device}")
    t = prepared.training
    if t is not None:
        # A traced step's ops are all in the model read; a synthesized one's are added to them.
        forward = prepared.model_ops - (t.loss_ops + t.backward_ops + t.update_ops if t.traced else 0)
        console.print(
            f"training: {forward} forward ops + {t.loss_ops} loss + {t.backward_ops} backward + "
            f"{t.update_ops} {t.optimizer} updates ({fmt_bytes(t.optimizer_state_bytes)} optimizer state) "
            + ("traced by autograd" if t.traced else "synthesized")
        )
    pg = prepared.placement_graph
    ran = [
        p
        for p in prepared.passes
        if p.ops_before != p.ops_after or p.details.get("groups_before") != p.details.get("groups_after")
    ]
    if ran:
        steps = ", ".join(
            f"{p.name.replace('_', '-')} {p.ops_before}->{p.ops_after} ops"
            if p.ops_before != p.ops_after
            else f"{p.name.replace('_', '-')} {p.details['groups_before']}->{p.details['groups_after']} groups"
            for p in ran
        )
        seconds = sum(p.seconds for p in prepared.passes)
        console.print(f"passes: {steps}; placers see {pg.num_ops} nodes ({seconds:.3f} s)")


# The ``auto tried`` line names at most this many plans, the fastest first (the report has all).
TRIED_SHOWN = 5


def tried(outcome: PlaceOutcome) -> str:
    """The ``auto tried`` line: how many plans under how many settings, the fastest ones, the rest counted."""
    candidates = outcome.candidates
    ok = sorted((c for c in candidates if c.ok), key=lambda c: c.evaluation.value_us)  # type: ignore[union-attr]
    shown = ", ".join(f"{c.label} {fmt_us(c.evaluation.value_us)}" for c in ok[:TRIED_SHOWN])  # type: ignore[union-attr]
    rest = []
    if len(ok) > TRIED_SHOWN:
        rest.append(f"{len(ok) - TRIED_SHOWN} slower")
    skipped = sum(c.skipped is not None for c in candidates)
    failed = sum(c.error is not None for c in candidates)
    for count, what in ((skipped, "skipped"), (failed, "failed")):
        if count:
            rest.append(f"{count} {what}")
    text = f"auto tried {len(candidates)} plans"
    search = outcome.search
    if search is not None:
        settings = search.settings_tried
        text += f" under {settings} setting{'s' if settings != 1 else ''} of the passes"
    text += f": {shown}" if shown else ""
    return text + (f" ({', '.join(rest)}; all in --report)" if rest else "")


def render_pipeline(console: Console, pipeline: dict, device_names: list[str]) -> None:
    """The throughput or latency objective's lines: the value, the stages in order, the schedule's timeline."""
    proof = (
        f"proven optimal among {pipeline['optimal_among']} splits"
        if pipeline["proven_optimal"]
        else f"not proven (lower bound {fmt_us(pipeline['lower_bound_us'])})"
    )
    tuned = pipeline.get("tuned")
    if tuned and tuned["max_load_split_minibatch_us"] > pipeline["schedule"]["minibatch_us"]:
        # The boundaries were moved for the schedule: max-load is no longer what was minimised.
        proof = (
            f"the split tuned for the schedule (the least max-load split's minibatch: "
            f"{fmt_us(tuned['max_load_split_minibatch_us'])})"
        )
    if pipeline["objective"] == "latency":
        console.print(f"latency: one sample [bold]{fmt_us(pipeline['latency_us'])}[/], {proof}")
        calls = ", ".join(
            f"{device_names[s['device']]} {fmt_us(s['start_us'])}-{fmt_us(s['finish_us'])}"
            for s in pipeline["stages"]
        )
        console.print(f"calls: {calls}")
        return
    console.print(
        f"pipeline: max-load [bold]{fmt_us(pipeline['max_load_us'])}[/] (the bottleneck's time per "
        f"input: {pipeline['throughput_per_s']:.4g} inputs/s streamed), {proof}"
    )
    stages = " -> ".join(f"{device_names[s['device']]} {fmt_us(s['load_us'])}" for s in pipeline["stages"])
    console.print(f"stages: {stages}")
    schedule = pipeline.get("schedule")
    if schedule is not None:
        compared = {
            n: us for n, us in schedule.get("compared_minibatch_us", {}).items() if n != schedule["name"]
        }
        faster = [f"{name} {fmt_us(us)}" for name, us in compared.items() if us is not None]
        unfit = [name for name, us in compared.items() if us is None]
        others = [f"faster than {', '.join(faster)}"] if faster else []
        if unfit:
            others.append(f"{' and '.join(unfit)} {'does' if len(unfit) == 1 else 'do'} not fit")
        layout = (
            f", {len(pipeline['stages'])} stages on {schedule['devices']} devices"
            if schedule.get("devices")
            else ""
        )
        console.print(
            f"{schedule['name']}{layout}, {schedule['microbatches']} microbatches: minibatch "
            f"{fmt_us(schedule['minibatch_us'])}, {schedule['speedup_vs_one_device']:.2f}x one device"
            + (f" ({'; '.join(others)})" if others else "")
        )
        for line in schedule["timeline"]:
            console.print(line, markup=False, highlight=False)


def render_summary(outcome: PlaceOutcome, written: list[str]) -> None:
    """The human summary of ``baechi place`` on stdout; ``written`` are the files it wrote."""
    console = make_console()
    spec, sim = outcome.devices, outcome.sim
    step = sim.step_time_us
    header(console, outcome.prepared)
    bounds = outcome.prepared.bounds
    gap = bounds.gap(step) or 0.0
    single = outcome.single_device
    if single is None:
        single_text = "does not fit one device"
    else:
        speedup = single.step_time_us / step if step > 0 else 1.0
        single_text = f"one device {fmt_us(single.step_time_us)} ({speedup:.2f}x)"
    info = outcome.placement.info
    if "schedule" in info.get("pipeline", {}):
        # A pipeline's speed is its schedule's (the lines below); one unpipelined step is not it.
        console.print(
            f"{outcome.chosen.label}: placed in {outcome.timings['place']:.3f} s (the minibatch run "
            f"as one step, unpipelined: {fmt_us(step)}; one device {fmt_us(single.step_time_us) if single else '-'})"
        )
    else:
        console.print(
            f"{outcome.chosen.label}: step [bold]{fmt_us(step)}[/], lower bound "
            f"{fmt_us(bounds.best_us)} ({bounds.best_source}; +{gap:.1%}), {single_text}; placed in "
            f"{outcome.timings['place']:.3f} s"
        )
    if len(outcome.candidates) > 1:
        console.print(tried(outcome))
    if "exact_status" in info:
        # exact proves things about every edge's transfer, so it places the graph without
        # forward-only placement's contraction: not the node count the passes line gives.
        unfolded = (
            ", forward-only placement off so that it sees every edge"
            if info["exact_nodes"] != outcome.prepared.placement_graph.num_ops
            else ""
        )
        console.print(
            f"exact: {info['exact_status']} on the {info['exact_nodes']}-node placement graph{unfolded} "
            f"(bound {fmt_us(info['exact_lower_bound_us'])} there, for plans keeping its nodes whole)"
        )
    if "pipeline" in info:
        render_pipeline(console, info["pipeline"], [d.name for d in spec.devices])
    console.print(f"communication: {len(sim.transfers)} transfers, {fmt_bytes(sim.comm_bytes)}")
    table = make_table(
        console,
        [
            ("device", "left"),
            ("ops", "right"),
            ("compute", "right"),
            ("busy", "right"),
            ("peak memory", "left"),
        ],
    )
    compute = list(sim.compute_us)
    busy = [us / step if step > 0 else None for us in compute]
    schedule = info.get("pipeline", {}).get("schedule")
    if schedule:  # a pipeline's devices: their work and busy share over the scheduled minibatch
        for d, bubble in zip(schedule_devices(info["pipeline"]), schedule["bubble_fraction"], strict=True):
            busy[d] = 1 - bubble
            compute[d] = busy[d] * schedule["minibatch_us"]
    for first, last in device_rows(spec, sim):
        dev = spec.devices[first]
        name = (
            dev.name
            if first == last
            else f"{dev.name} ... {spec.devices[last].name} ({last - first + 1:,} idle)"
        )
        table.add_row(
            name,
            str(len(sim.order[first])),
            fmt_us(compute[first]),
            "-" if busy[first] is None else f"{busy[first]:.0%}",
            f"{memory_bar(sim.peak_bytes[first], dev.memory_bytes, console.is_terminal)} "
            f"{fmt_bytes(sim.peak_bytes[first])} / {fmt_bytes(dev.memory_bytes)}",
        )
    console.print(table)
    render_module_map(console, outcome)
    for note in outcome.notes:
        console.print(f"note: {note}")
    if written:
        console.print("wrote " + ", ".join(written))
    else:
        fmt = FORMATS[outcome.prepared.input_format]
        placed = f"-o placed{fmt.extension}, " if fmt.write is not None else ""
        console.print(f"nothing written: add {placed}--report report.json or --trace timeline.json")


def device_rows(spec: DeviceSpec, sim: SimResult) -> list[tuple[int, int]]:
    """The summary table's rows as (first, last) device: one per device, except that a run of
    more than :data:`IDLE_ROWS` idle devices of the same memory is one row (their numbers are the
    same; on 10,000 devices most are idle). O(D).

    >>> from types import SimpleNamespace as N
    >>> spec = N(devices=[N(memory_bytes=8)] * 8)
    >>> device_rows(spec, N(order=[[1], [], [], [], [], [2], [], []], peak_bytes=[0] * 8))
    [(0, 0), (1, 4), (5, 5), (6, 6), (7, 7)]
    """
    rows: list[tuple[int, int]] = []
    d, count = 0, len(spec.devices)
    while d < count:
        end = d + 1
        if not sim.order[d]:
            memory = spec.devices[d].memory_bytes
            while (
                end < count
                and not sim.order[end]
                and spec.devices[end].memory_bytes == memory
                and sim.peak_bytes[end] == sim.peak_bytes[d]
            ):
                end += 1
        if end - d > IDLE_ROWS:
            rows.append((d, end - 1))
        else:
            rows.extend((x, x) for x in range(d, end))
        d = end
    return rows


def render_module_map(console: Console, outcome: PlaceOutcome) -> None:
    """A PyTorch export's plan as ``module -> device`` lines (the report's ``module_map``)."""
    modules = outcome.module_map
    if modules is None:
        return
    entries = list(modules.to_json()["modules"].items())
    shown = ", ".join(f"{path or '(root)'} -> {device}" for path, device in entries[:MODULE_MAP_SHOWN])
    more = (
        f", ... ({len(entries) - MODULE_MAP_SHOWN} more in --report)"
        if len(entries) > MODULE_MAP_SHOWN
        else ""
    )
    console.print(f"modules: {shown}{more}")
