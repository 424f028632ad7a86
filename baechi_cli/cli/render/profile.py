"""``baechi profile``'s summary: totals, top ops, op types and rule coverage; and ``--comm``'s fit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from baechi_cli.cli.render.common import fmt_bytes, fmt_us, make_console, make_table

if TYPE_CHECKING:
    from rich.console import Console

    from baechi_cli.app.profile import ProfileOutcome
    from baechi_cli.costs.comm import CommFit
    from baechi_cli.costs.profile import CostProfile


def render_profile(outcome: ProfileOutcome, top: int, output: str | None) -> None:
    """The human summary of ``baechi profile`` on stdout, listing the ``top`` ops by time."""
    console = make_console()
    p, g = outcome.profile, outcome.graph
    t = p.totals
    console.print(
        f"[bold]{outcome.path}[/]: {g.num_ops} ops, {g.num_edges} edges; {p.source} costs for {p.device}"
    )
    flops = f"{t.flops / 1e9:.2f} GFLOP" if t.flops else "FLOPs not counted"
    console.print(
        f"totals: compute {fmt_us(t.compute_us)}, {flops}, persistent {fmt_bytes(t.persistent_bytes)}, "
        f"peak activations {fmt_bytes(t.peak_activation_bytes)} "
        f"(one device: step {fmt_us(t.single_device_step_us)})"
    )
    total_us = t.compute_us or 1.0
    if top:
        table = make_table(
            console,
            [
                ("op", "left"),
                ("type", "left"),
                ("time", "right"),
                ("share", "right"),
                ("GFLOP", "right"),
                ("output", "right"),
                ("source", "left"),
            ],
        )
        ranked = sorted(range(len(p.ops)), key=lambda i: (-p.ops[i].compute_us, i))[:top]
        for i in ranked:
            op = p.ops[i]
            table.add_row(
                op.name,
                op.type,
                fmt_us(op.compute_us),
                f"{op.compute_us / total_us:.1%}",
                f"{op.flops / 1e9:.3f}",
                fmt_bytes(sum(op.output_bytes)),
                op.source,
            )
        # Op names are long scopes: on a narrow terminal fold them, never cut them.
        table.columns[0].overflow = "fold"
        console.print(f"top {len(ranked)} ops by time")
        console.print(table)
    by_type: dict[str, list[float]] = {}
    for op in p.ops:
        row = by_type.setdefault(op.type, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += op.compute_us
        row[2] += op.flops
    rule = {c.op_type: c.rule for c in p.coverage}
    table = make_table(
        console,
        [
            ("op type", "left"),
            ("ops", "right"),
            ("time", "right"),
            ("share", "right"),
            ("GFLOP", "right"),
            ("rule", "left"),
        ],
    )
    rows = sorted(by_type.items(), key=lambda kv: (-kv[1][1], kv[0]))
    shown = rows[: max(top, 10)] if top else rows[:10]
    for op_type, (count, us, fl) in shown:
        table.add_row(
            op_type,
            str(int(count)),
            fmt_us(us),
            f"{us / total_us:.1%}",
            f"{fl / 1e9:.3f}",
            rule.get(op_type, ""),
        )
    rest = rows[len(shown) :]
    if rest:
        table.add_row(
            f"({len(rest)} more types)",
            str(int(sum(r[1][0] for r in rest))),
            fmt_us(sum(r[1][1] for r in rest)),
            f"{sum(r[1][1] for r in rest) / total_us:.1%}",
            f"{sum(r[1][2] for r in rest) / 1e9:.3f}",
            "",
        )
    console.print("by op type")
    console.print(table)
    render_coverage(console, p)
    if p.HasField("measurement"):
        m = p.measurement
        console.print(
            f"measured: {t.measured_ops} of {g.num_ops} ops ran ({m.warmup} warm-up + {m.steps} steps, "
            f"{_framework(m)}); {m.not_run_count} kept analytic costs"
            + (f", e.g. {', '.join(m.not_run[:3])}" if m.not_run else "")
        )
    for note in outcome.notes:
        console.print(f"note: {note}")
    if output:
        console.print(f"wrote {output}")


def render_coverage(console: Console, p: CostProfile) -> None:
    """One line: how many ops each analytic rule kind costed, and the op types without a rule."""
    by_rule: dict[str, int] = {}
    uncovered: list[str] = []
    for c in p.coverage:
        by_rule[c.rule] = by_rule.get(c.rule, 0) + c.ops
        if c.rule in ("uncovered", "fallback"):
            uncovered.append(f"{c.op_type} ({c.ops})")
    if "given" in by_rule:
        console.print("coverage: costs as given in the workload file")
        return
    total = sum(by_rule.values()) or 1
    ruled = total - by_rule.get("uncovered", 0) - by_rule.get("fallback", 0)
    parts = ", ".join(f"{k} {v}" for k, v in sorted(by_rule.items(), key=lambda kv: -kv[1]))
    console.print(
        f"coverage: {ruled}/{total} ops ({ruled / total:.1%}) costed by a rule ({parts}); "
        + (f"bytes only: {', '.join(uncovered)}" if uncovered else "no op type without a rule")
    )


def render_comm_fit(fit: CommFit, max_exp: int, text: str, output: str | None) -> None:
    """``baechi profile --comm``: the timed transfers, the fit, and its YAML ``text`` unless written to ``output``."""
    console = make_console()
    console.print(f"[bold]{fit.src} -> {fit.dst}[/]: {len(fit.samples)} sizes, 2^0 .. 2^{max_exp} bytes")
    table = make_table(console, [("bytes", "right"), ("", "right"), ("median", "right"), ("fit", "right")])
    for sample in fit.samples:
        table.add_row(
            f"2^{sample.nbytes.bit_length() - 1}",
            fmt_bytes(sample.nbytes),
            fmt_us(sample.median_us),
            fmt_us(fit.transfer_time_us(sample.nbytes)),
        )
    console.print(table)
    console.print(f"fit: {fit.summary()}")
    if fit.note:
        console.print(f"note: {fit.note}")
    if output is None:
        console.print(text, end="", markup=False, highlight=False)
    else:
        console.print(f"wrote {output}")


def _framework(m: Any) -> str:
    """What ran a measurement: ``torch 2.13.0+cpu, 1 thread`` or ``TensorFlow 2.21.0``."""
    if m.torch:
        return f"torch {m.torch}, {m.threads} thread{'s' if m.threads != 1 else ''}"
    return f"TensorFlow {m.tensorflow}"
