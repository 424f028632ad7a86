"""A pipeline's timeline drawn as text, apart from the schedules that make it.

:func:`render_timeline` draws a :class:`~baechi_cli.pipeline.schedules.PipelineTiming` as one
line per stage (or per device when a device runs several stages); the report keeps those lines.

Example:
    >>> from baechi_cli.pipeline.schedules import StageCosts, simulate_pipeline
    >>> timing = simulate_pipeline(StageCosts(forward_us=[1, 1], backward_us=[2, 2]), 2, "1f1b")
    >>> print(render_timeline(timing, width=9))
    s0 |FF..BB.BB|
    s1 |.FBBFBB..|
"""

from __future__ import annotations

import numbers

from baechi_cli.core.errors import InputError
from baechi_cli.pipeline.schedules import PipelineEvent, PipelineTiming


def render_timeline(timing: PipelineTiming, width: int = 72) -> str:
    """The timeline as text: one line per stage (per device ``d0, d1, ...`` when a device runs
    several), ``width`` columns spanning the minibatch.

    Each column shows what its stage runs at the column's midpoint: ``F``
    (forward), ``B`` (backward), ``O`` (optimizer step), ``S`` (a tied weight's
    gradient all-reduce) or ``.`` (idle, a bubble). Ops shorter than a column may not show. O(S·M + S·width).

    >>> from baechi_cli.pipeline.schedules import StageCosts, simulate_pipeline
    >>> timing = simulate_pipeline(StageCosts([1, 1, 1], [0, 0, 0]), 3, "gpipe")
    >>> print(render_timeline(timing, width=10))
    s0 |FFFFFF....|
    s1 |..FFFFFF..|
    s2 |....FFFFFF|
    """
    if isinstance(width, bool) or not isinstance(width, numbers.Integral) or width < 1:
        raise InputError(f"the timeline width must be a positive integer, got {width!r}")
    device_of = timing.stage_device or tuple(range(timing.num_stages))
    rows = max(device_of) + 1
    prefix = "s" if rows == timing.num_stages else "d"
    by_row: list[list[PipelineEvent]] = [[] for _ in range(rows)]
    for event in timing.events:
        by_row[device_of[event.stage]].append(event)
    label_width = len(f"{prefix}{rows - 1}")
    lines = []
    for row, events in enumerate(by_row):
        events.sort(key=lambda e: e.start_us)
        cells = []
        current = 0  # events before it ended at or before the current column's midpoint
        for column in range(width):
            midpoint = (column + 0.5) * timing.minibatch_us / width
            while current < len(events) and events[current].end_us <= midpoint:
                current += 1
            running = current < len(events) and events[current].start_us <= midpoint
            cells.append(events[current].kind if running else ".")
        lines.append(f"{f'{prefix}{row}':>{label_width}} |{''.join(cells)}|")
    return "\n".join(lines)
