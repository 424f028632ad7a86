"""What every command's rendering shares: the console, number formats, tables, the progress bar.

Also :func:`tensorflow_logs_hidden`, which keeps TensorFlow's C++ log lines
from tearing the progress bar. rich is imported inside the functions, never
at import time, so ``baechi --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID
    from rich.table import Table


def make_console(stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr) that wraps at 160 columns when not a terminal."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # rich honours NO_COLOR and drops styling when the stream is not a terminal;
    # there, lines are not wrapped at rich's default 80 columns either.
    width = None if stream.isatty() else 160
    return Console(stderr=stderr, highlight=False, width=width)


def fmt_bytes(n: float) -> str:
    """Bytes in decimal units.

    >>> fmt_bytes(24_040_000), fmt_bytes(512)
    ('24.04 MB', '512 B')
    """
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def fmt_us(us: float) -> str:
    """Microseconds as µs, ms or s.

    >>> fmt_us(539.5), fmt_us(1131.0), fmt_us(2.5e6)
    ('539.5 µs', '1.131 ms', '2.500 s')
    """
    if us >= 1e6:
        return f"{us / 1e6:.3f} s"
    if us >= 1e3:
        return f"{us / 1e3:.3f} ms"
    return f"{us:.1f} µs"


def memory_bar(peak: int, memory: int, fancy: bool, width: int = 20) -> str:
    """``peak`` of ``memory`` bytes as a bar of ``width`` cells (block characters when ``fancy``).

    >>> memory_bar(1, 4, fancy=False, width=8)
    '##......'
    """
    full, empty = ("█", "░") if fancy else ("#", ".")
    filled = round(min(peak / memory, 1.0) * width) if memory else 0
    return full * filled + empty * (width - filled)


def make_table(console: Console, columns: list[tuple[str, str]]) -> Table:
    """A table of ``(header, justify)`` columns: light lines on a terminal, ASCII elsewhere."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD if console.is_terminal else box.ASCII2, show_edge=False, pad_edge=False)
    for col, justify in columns:
        table.add_column(col, justify=justify)
    return table


class StageProgress:
    """A rich progress bar over a command's stages, on stderr, only on a terminal.

    ``stage(name)`` moves the bar to a stage; ``steps(done, total)`` fills the
    current stage in proportion (measured profiling's warm-up and steps).
    Disabled (``--quiet``, or stderr not a terminal) both do nothing.
    """

    def __init__(self, enabled: bool, stages: tuple[str, ...] | None = None) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self._stages = stages
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._at = 0

    def __enter__(self) -> StageProgress:
        if self.enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            if self._stages is None:
                from baechi_cli.app.place import STAGES

                self._stages = STAGES
            self._bar = Progress(
                TextColumn("{task.description:<10}"),
                BarColumn(),
                TimeElapsedColumn(),
                console=make_console(stderr=True),
                transient=True,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self._stages[0], total=len(self._stages))
        return self

    def stage(self, name: str) -> None:
        """Move the bar to stage ``name``."""
        if self._bar is not None and self._task is not None and self._stages is not None:
            self._at = self._stages.index(name)
            self._bar.update(self._task, description=name, completed=self._at)

    def steps(self, done: int, total: int) -> None:
        """Fill the current stage to ``done`` of ``total``."""
        if self._bar is not None and self._task is not None and self._stages is not None and total > 0:
            label = f"{self._stages[self._at]} {done}/{total}"
            self._bar.update(self._task, description=label, completed=self._at + done / total)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)  # type: ignore[arg-type]


@contextlib.contextmanager
def tensorflow_logs_hidden(enabled: bool) -> Iterator[None]:
    """Keep TensorFlow's C++ log lines off the terminal while it runs.

    TensorFlow logs from C++ straight to file descriptor 2 (oneDNN and CUDA
    notices at import, optimizer notes per session), ignoring
    TF_CPP_MIN_LOG_LEVEL for its first lines; they would tear the progress
    bar and bury the summary. Descriptor 2 goes to a scratch file meanwhile,
    while Python's ``sys.stderr`` (the progress bar, warnings) stays on the
    original stream. Off with BAECHI_DEBUG=1, and wherever ``sys.stderr`` is
    not descriptor 2 (a test runner capturing it).
    """
    try:
        attached = sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):
        attached = False
    if not enabled or not attached or os.environ.get("BAECHI_DEBUG"):
        yield
        return
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    python_stderr = sys.stderr
    with tempfile.TemporaryFile() as scratch:
        os.dup2(scratch.fileno(), 2)
        sys.stderr = os.fdopen(
            os.dup(saved), "w", buffering=1, encoding=python_stderr.encoding, errors="replace"
        )
        try:
            yield
        finally:
            sys.stderr.flush()
            sys.stderr.close()
            sys.stderr = python_stderr
            os.dup2(saved, 2)
            os.close(saved)
