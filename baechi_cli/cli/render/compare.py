"""``baechi compare``'s table: every algorithm's placement time, step time and memory side by side."""

from __future__ import annotations

from typing import TYPE_CHECKING

from baechi_cli.cli.render.common import fmt_bytes, fmt_us, make_console, make_table
from baechi_cli.cli.render.place import header

if TYPE_CHECKING:
    from baechi_cli.app.compare import CompareOutcome


def render_compare(outcome: CompareOutcome, trace_path: str | None) -> None:
    """The human summary of ``baechi compare`` on stdout; the fastest step is bold on a terminal."""
    console = make_console()
    prepared = outcome.prepared
    header(console, prepared)
    single = prepared.single_device
    console.print(
        f"lower bound {fmt_us(prepared.lower_bound_us)}; one device "
        + (fmt_us(single.step_time_us) if single else "does not fit")
    )
    table = make_table(
        console,
        [
            ("algorithm", "left"),
            ("place (s)", "right"),
            ("step", "right"),
            ("vs one device", "right"),
            ("vs bound", "right"),
            ("comm", "right"),
            ("peak memory per device", "left"),
        ],
    )
    best = min((c.sim.step_time_us for c in outcome.candidates if c.sim is not None), default=None)
    for title, c in zip(outcome.titles(), outcome.candidates):
        if c.sim is None:
            table.add_row(title, f"{c.place_seconds:.3f}", "failed", "-", "-", "-", c.problem or "")
            continue
        step = c.sim.step_time_us
        speedup = f"{single.step_time_us / step:.2f}x" if single else "does not fit"
        gap = prepared.bounds.gap(step)
        gap_text = "-" if gap is None else f"+{gap:.1%}"
        peaks = " ".join(fmt_bytes(p) for p in c.sim.peak_bytes)
        step_text = fmt_us(step)
        if step == best and console.is_terminal:
            step_text = f"[bold green]{step_text}[/]"
        table.add_row(
            title, f"{c.place_seconds:.3f}", step_text, speedup, gap_text, fmt_bytes(c.sim.comm_bytes), peaks
        )
    console.print(table)
    for note in prepared.notes:
        console.print(f"note: {note}")
    if trace_path:
        console.print(f"wrote {trace_path}")
