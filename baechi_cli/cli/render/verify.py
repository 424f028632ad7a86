"""Terminal rendering of ``baechi verify``: the summary of a GraphDef or ONNX report.

:func:`render_report` (GraphDef, :class:`~baechi_cli.verify.report.VerifyReport`)
and :func:`render_onnx_report` (:class:`~baechi_cli.verify.onnx.OnnxVerifyReport`)
print one line per check, then the first :data:`SHOWN` problems, then the
verdict, through one :class:`SummaryPrinter`. Text is rich markup: names from
the models are escaped. Importing this module imports neither rich nor the
verifiers' dependencies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from baechi_cli.io.onnx import CONFIGURATION, DEVICE_KEY
from baechi_cli.verify.run import RELATIVE_TOLERANCE

if TYPE_CHECKING:
    from baechi_cli.verify.onnx import OnnxRunResult, OnnxVerifyReport
    from baechi_cli.verify.report import VerifyReport
    from baechi_cli.verify.run import VerifyResult

#: How many problem lines the command prints before "... and N more".
SHOWN = 10


def render_report(console: Any, report: VerifyReport, shown: int = SHOWN) -> None:
    """Print ``report`` on a rich console: one line per check, then the problems.

    On a terminal the verdicts are coloured marks; elsewhere plain ``ok`` /
    ``FAIL`` words, so logs stay greppable.
    """
    from rich.markup import escape

    printer = SummaryPrinter(console)
    say, verdict = printer.say, printer.verdict
    static, run = report.static, report.run

    devices = ", ".join(f"{escape(d)} {n}" for d, n in static.devices.items()) or "none"
    say(
        f"[bold]{escape(static.placed)}[/]: {static.ops_total} ops on {len(static.devices)} "
        f"device{'s' if len(static.devices) != 1 else ''} ({devices})"
    )
    if static.original is not None:
        original = escape(static.original)
        if static.differences_count:
            verdict(False, f"{static.differences_count} difference(s) from {original}")
        else:
            verdict(True, f"same graph as {original}, device fields aside")
    if static.without_device_count:
        verdict(False, f"{static.without_device_count} of {static.ops_total} ops have no device")
    else:
        verdict(True, "every op has a device")
    total = sum(static.constraints.values())
    kinds = ", ".join(f"{n} {kind}" for kind, n in static.constraints.items() if n)
    if static.violations_count:
        verdict(False, f"{static.violations_count} of {total} colocation constraints broken ({kinds})")
    elif total:
        verdict(True, f"all {total} colocation constraints hold ({kinds})")
    elif not static.without_device_count:
        verdict(True, "no colocation constraints")
    if run is not None:
        verdict(run.ok, _run_summary(run, static.original is not None))
    printer.outcome(report, shown)


class SummaryPrinter:
    """The lines of a ``baechi verify`` summary (GraphDef or ONNX) on a rich console.

    On a terminal verdicts are coloured marks; elsewhere plain ``ok`` / ``FAIL``
    words, so logs stay greppable. Text is rich markup: callers escape names.
    """

    def __init__(self, console: Any) -> None:
        self.console = console
        self.fancy = console.is_terminal

    def say(self, text: str) -> None:
        self.console.print(text, soft_wrap=True)  # long op names stay on one line

    def verdict(self, ok: bool, text: str) -> None:
        if self.fancy:
            mark = "[green]✓[/]" if ok else "[bold red]✗[/]"
        else:
            mark = "ok  " if ok else "FAIL"
        self.say(f"{mark} {text}")

    def outcome(self, report: VerifyReport, shown: int) -> None:
        """The end of a summary: the first ``shown`` problems, then verified or FAILED."""
        from rich.markup import escape

        say, fancy = self.say, self.fancy
        problems = report.problems()
        if problems:
            say("problems:")
            for line in problems[:shown]:
                say(f"  {escape(line)}")
            more = report.problems_count() - min(len(problems), shown)
            if more > 0:
                say(f"  ... and {more} more")
        if report.ok:
            say("[bold green]verified[/]" if fancy else "verified")
        else:
            count = report.problems_count()
            text = f"FAILED: {count} problem{'s' if count != 1 else ''}"
            say(f"[bold red]{text}[/]" if fancy else text)


def _run_summary(run: VerifyResult, has_original: bool) -> str:
    from rich.markup import escape

    where = f"{run.steps} step{'s' if run.steps != 1 else ''} on {run.num_devices} CPU devices"
    if run.error and not run.loss_placed:
        return f"TensorFlow run ({where}) failed"
    reference = "original's" if has_original else "unplaced graph's"
    losses = ", ".join(f"{x:.6g}" for x in run.loss_placed)
    if run.losses_bitwise_equal:
        loss = f"loss {losses} equal to the {reference} (bitwise)"
    elif run.losses_equal:
        loss = f"loss {losses} equal to the {reference} (within {RELATIVE_TOLERANCE:g})"
    else:
        loss = f"loss {losses} DIFFERS from the {reference}"
    placed_ok = run.ops_checked - len(run.misplaced)
    repeat = "two runs bit-identical" if run.deterministic else "two runs DIFFER"
    if run.variables_compared:
        same = run.variables_compared - run.variables_differing
        repeat += f"; {same} of {run.variables_compared} variables bitwise equal to the {reference}"
    races = f"; {run.races_count} RACE(S) on variables" if run.races_count else "; no variable races"
    return escape(
        f"TensorFlow ({where}): {loss}; {repeat}{races}; "
        f"{placed_ok} of {run.ops_checked} ops that ran did so where placed"
    )


def render_onnx_report(console: Any, report: OnnxVerifyReport, shown: int = SHOWN) -> None:
    """Print ``report`` on a rich console as :func:`render_report` prints a GraphDef's:
    one line per check, then the problems (the first ``shown``), then the verdict."""
    from rich.markup import escape

    printer = SummaryPrinter(console)
    say = printer.say
    static, run = report.static, report.run

    def verdict(ok: bool, text: str) -> None:
        printer.verdict(ok, escape(text))

    devices = ", ".join(f"{d} {n}" for d, n in static.devices.items()) or "none"
    plural = "s" if len(static.devices) != 1 else ""
    say(
        f"[bold]{escape(static.placed)}[/]: "
        + escape(f"{static.ops_total} nodes on {len(static.devices)} device{plural} ({devices})")
    )
    note = f" ({static.checker_note})" if static.checker_note else ""
    verdict(static.checker is None, f"{'passes' if static.checker is None else 'fails'} onnx.checker{note}")
    if static.original is not None:
        if static.differences_count:
            verdict(False, f"{static.differences_count} difference(s) from {static.original}")
        else:
            verdict(True, f"same model as {static.original}, baechi's annotations aside")
    if static.without_device_count:
        verdict(False, f"{static.without_device_count} of {static.ops_total} nodes have no device")
    else:
        verdict(True, "every node has a device")
    where = f"configuration '{CONFIGURATION}' ({static.num_devices} devices)"
    if static.annotation_problems_count:
        verdict(False, f"{static.annotation_problems_count} node or configuration annotation problem(s)")
    else:
        verdict(True, f"device_configurations and {DEVICE_KEY} agree on every node, devices of {where}")
    if run is not None:
        verdict(run.ok, _onnx_run_summary(run, static.original is not None))
    printer.outcome(report, shown)


def _onnx_run_summary(run: OnnxRunResult, has_original: bool) -> str:
    defaulted = f"; symbolic dims bound to 1: {', '.join(run.dims_defaulted)}" if run.dims_defaulted else ""
    where = f"onnxruntime (CPU, seed {run.seed}{defaulted})"
    if run.error:
        return f"{where} failed"
    same = sum(o.identical for o in run.outputs)
    reference = f"{run.reference}'s" if has_original else "the unannotated model's"
    return f"{where}: {same} of {len(run.outputs)} outputs identical to {reference}"


def render_torch_result(console: Any, doc: dict[str, Any]) -> None:
    """Print ``baechi verify --torch``'s result: the plan as built, the run, the gradients, then each
    rank's peak and each stage's compute beside the report's predictions."""
    from rich.markup import escape

    from baechi_cli.cli.render.common import fmt_bytes

    printer = SummaryPrinter(console)
    say, verdict = printer.say, printer.verdict
    tied = ", ".join(escape(t["parameter"]) for t in doc["tied"]) or "none"
    if doc["schedule"] == "makespan":
        say(
            f"plan: makespan, op for op: {doc['stages']} runs of consecutive ops on {doc['ranks']} gloo "
            "ranks, each value sent straight to the runs that read it"
        )
        say(f"tied weights: {tied}")
    else:
        say(
            f"plan: {doc['schedule']} ({doc['torch_schedule']}), {doc['stages']} stages on {doc['ranks']} "
            f"gloo ranks, {doc['microbatches']} microbatches, cut by {doc['cut_by']}"
        )
        say(
            f"threaded: {len(doc['threaded'])} value(s) passed through the stages between; tied weights: {tied}"
        )
    if doc.get("whole_backward"):
        say(
            f"stages {', '.join(map(str, doc['whole_backward']))} compute their weight gradients with their "
            "input gradients: torch cannot split their backward (a weight or intermediate read twice)"
        )
    displaced = doc.get("displaced_nodes") or []
    if displaced:
        shown = ", ".join(map(escape, displaced[:5]))
        where = "on another device" if doc.get("schedule") == "makespan" else "in another stage"
        verdict(
            False,
            f"not as placed: {len(displaced)} node(s) ({shown}) ran {where} than planned, with the "
            "nodes they must run with (an input, a tensor written in place)",
        )
    elif doc.get("moved_nodes"):
        say(f"moved: {len(doc['moved_nodes'])} node(s) to a later run on their own device")
    if doc.get("split_nodes"):
        shown = ", ".join(map(escape, doc["split_nodes"][:5]))
        verdict(
            False,
            f"not as placed: the plan splits {len(doc['split_nodes'])} node(s) ({shown}) from their own "
            "ops or backward, which run with them",
        )
    verdict(
        bool(doc["ran"]),
        f"ran {doc['steps']} step(s)" if doc["ran"] else f"did not run: {escape(str(doc['error']))}",
    )
    loss = doc["loss"]
    if loss["pipeline"]:
        rel = loss["relative"]
        say(
            f"loss: {loss['pipeline'][-1]:.6g} (one process {loss['one_process'][-1]:.6g}"
            + (f", relative {rel:.1e})" if rel is not None else ")")
        )
    worst = doc["worst"]
    if doc["parameters_missing"]:
        verdict(False, f"parameters in no stage: {', '.join(map(escape, doc['parameters_missing'][:5]))}")
    if worst["parameter"] is not None:
        value = worst["relative_l2"]
        shown = "inf" if value is None else f"{value:.1e}"
        verdict(
            bool(doc["gradients_match"]),
            f"gradients: {doc['parameters_compared']} parameters, worst {escape(worst['parameter'])} "
            f"{shown} relative L2 (within {doc['rtol']:g})",
        )
    makespan = doc["schedule"] == "makespan"
    # A makespan plan's runs (tens to hundreds of them, a few ops each): per rank here, each in --json.
    run_us: dict[int, float] = {}
    for s in doc["per_stage"]:
        if s["compute_us"] is not None:
            run_us[s["rank"]] = run_us.get(s["rank"], 0.0) + s["compute_us"]
    for r in doc["per_rank"]:
        measured, predicted = r.get("peak_bytes"), r.get("predicted_peak_bytes")
        if measured is None:
            continue
        ratio = f" ({measured / predicted:.2f}x)" if predicted else ""
        held = (
            f"{len(r['stages'])} runs"
            if makespan and len(r["stages"]) > 1
            else f"{'run' if makespan else 'stage'}{'s' if len(r['stages']) > 1 else ''} "
            + ", ".join(map(str, r["stages"]))
        )
        say(
            f"rank {r['rank']} ({held}): peak {fmt_bytes(measured)}, "
            f"predicted {fmt_bytes(predicted) if predicted else '-'}{ratio}"
            + (
                f"; forward+backward of its runs {run_us[r['rank']] / 1e3:.3f} ms"
                if makespan and r["rank"] in run_us
                else ""
            )
        )
    over = [r for r in doc["per_rank"] if r.get("fits") is False]
    for r in over:
        verdict(
            False,
            f"rank {r['rank']}'s peak {fmt_bytes(r['peak_bytes'])} is over {escape(str(r['device']))}'s "
            f"{fmt_bytes(r['memory_bytes'])}: the plan does not fit the devices it was made for",
        )
    for s in doc["per_stage"]:
        if s["compute_us"] is None or makespan:
            continue
        predicted = s["predicted_compute_us"]
        say(
            f"stage {s['stage']} (rank {s['rank']}): "
            f"forward+backward {s['compute_us'] / 1e3:.3f} ms a microbatch"
            + (f", predicted {predicted / 1e3:.3f} ms" if predicted else "")
        )
    minibatch = doc.get("minibatch_us") or {}
    if minibatch.get("measured") is not None:
        predicted = minibatch.get("predicted")
        say(
            f"{'step' if doc['schedule'] == 'makespan' else 'minibatch'}: {minibatch['measured'] / 1e3:.3f} ms "
            f"measured ({minibatch['threads_per_rank']} thread(s) a rank)"
            + (
                f", predicted {predicted / 1e3:.3f} ms ({minibatch['measured'] / predicted:.2f}x)"
                if predicted
                else ""
            )
        )
    imbalance = doc.get("compute_imbalance") or {}
    if imbalance.get("measured") is not None and not makespan:  # a makespan plan's runs are not balanced
        say(
            f"slowest stage / mean: measured {imbalance['measured']:.2f}, predicted "
            + (f"{imbalance['predicted']:.2f}" if imbalance.get("predicted") is not None else "-")
        )
    say("[bold green]verified[/]" if doc["ok"] and printer.fancy else "verified" if doc["ok"] else "FAILED")
