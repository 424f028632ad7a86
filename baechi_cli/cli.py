"""The ``baechi`` command line: argument parsing and rich rendering only.

Heavy modules (the pipeline, protobuf, numpy) are imported inside commands so
``baechi --help`` starts fast; TensorFlow is never imported by ``place``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from baechi_cli import __version__
from baechi_cli.errors import BaechiError

EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug in baechi, not in the input


def _console(stderr: bool = False):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # rich honours NO_COLOR and drops styling when the stream is not a terminal;
    # there, lines are not wrapped at rich's default 80 columns either.
    width = None if stream.isatty() else 160
    return Console(stderr=stderr, highlight=False, width=width)


def _fail(err: BaseException) -> None:
    """Print a one-line error to stderr and exit with the error's code."""
    if isinstance(err, BaechiError):
        click.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
    if os.environ.get("BAECHI_DEBUG"):
        raise err
    text = " ".join(str(err).split()) or type(err).__name__
    click.echo(
        f"internal error: {type(err).__name__}: {text} (a bug in baechi; rerun with BAECHI_DEBUG=1 "
        "for the traceback and report it)",
        err=True,
    )
    sys.exit(EXIT_INTERNAL)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="baechi", message="%(prog)s %(version)s")
def main() -> None:
    """baechi: place a machine-learning graph on memory-constrained devices in about a second.

    \b
    Example:
      baechi place testdata/cnn.pb --devices 4x8GB -o placed.pb --report report.json

    Exit codes: 0 ok, 1 regression gate failed, 2 usage error or bad input,
    3 model does not fit the devices, 4 solver failed, 5 missing optional
    dependency, 70 internal error.
    """


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option(
    "--devices",
    "-d",
    "device_spec",
    required=True,
    metavar="SPEC",
    help="Devices: 4x8GB, 2x16GB,2x8GB, a preset (rtx2080x4, v100x4, t4x4, a100x8) or a YAML file.",
)
@click.option(
    "--algo",
    default="topo",
    show_default=True,
    type=click.Choice(["topo", "etf", "single"]),
    help="Placement algorithm.",
)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), help="Write the placed GraphDef here (.pb or .pbtxt)."
)
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Write the JSON report here.")
@click.option("--batch-size", type=click.IntRange(min=1), help="Value for unknown (batch) dimensions.")
@click.option(
    "--comm",
    type=click.Choice(["parallel", "sequential"]),
    help="Communication model; default: the device spec's (parallel for NxSIZE specs).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report to stdout and nothing else there.")
@click.option("--quiet", "-q", is_flag=True, help="No progress and no summary.")
def place(
    model: str,
    device_spec: str,
    algo: str,
    output: str | None,
    report_path: str | None,
    batch_size: int | None,
    comm: str | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Place MODEL (a TensorFlow GraphDef, .pb or .pbtxt) on the devices.

    Prints a summary: the predicted step time against the lower bound and a
    single device, and each device's ops, compute and peak memory.
    """
    try:
        from baechi_cli.devices import parse_devices
        from baechi_cli.pipeline import PlaceOptions, build_report, place_model

        devices = parse_devices(device_spec)
        options = PlaceOptions(algo=algo, batch_size=batch_size, comm=comm)
        with _Progress(enabled=not quiet) as progress:
            outcome = place_model(
                model, devices, options, output=output, report_path=report_path, progress=progress.stage
            )
        if as_json:
            from baechi_cli.io.report import dumps

            click.echo(dumps(build_report(outcome, options)), nl=False)
        elif not quiet:
            _render_summary(outcome, output, report_path)
    except (BaechiError, Exception) as err:  # noqa: BLE001 - every error becomes one line
        _fail(err)


class _Progress:
    """A rich progress bar over the pipeline's stages, on stderr, only on a terminal."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self._bar: Any = None

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            from baechi_cli.pipeline import STAGES

            self._bar = Progress(
                TextColumn("{task.description:<10}"),
                BarColumn(),
                TimeElapsedColumn(),
                console=_console(stderr=True),
                transient=True,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task("load", total=len(STAGES))
        return self

    def stage(self, name: str) -> None:
        if self._bar is not None:
            from baechi_cli.pipeline import STAGES

            self._bar.update(self._task, description=name, completed=STAGES.index(name))

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


def _fmt_bytes(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _fmt_us(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3f} s"
    if us >= 1e3:
        return f"{us / 1e3:.3f} ms"
    return f"{us:.1f} µs"


def _render_summary(outcome: Any, output: str | None, report_path: str | None) -> None:
    from rich import box
    from rich.table import Table

    from baechi_cli.pipeline import ALGORITHM_TITLES

    console = _console()
    fancy = console.is_terminal
    spec, sim, g = outcome.devices, outcome.sim, outcome.graph
    ic = spec.interconnect
    step = sim.step_time_us
    console.print(
        f"[bold]{outcome.path}[/]: {g.num_ops} ops, {g.num_edges} edges -> {spec.count} devices "
        f"({ic.mode} comm, {ic.latency_us:g} µs + {ic.bandwidth_bytes_per_us / 1e3:.2f} GB/s)"
    )
    gap = (step / outcome.lower_bound_us - 1) if outcome.lower_bound_us > 0 else 0.0
    single = outcome.single_device
    if single is None:
        single_text = "does not fit one device"
    else:
        speedup = single.step_time_us / step if step > 0 else 1.0
        single_text = f"one device {_fmt_us(single.step_time_us)} ({speedup:.2f}x)"
    console.print(
        f"{ALGORITHM_TITLES[outcome.algorithm]}: step [bold]{_fmt_us(step)}[/], lower bound "
        f"{_fmt_us(outcome.lower_bound_us)} (+{gap:.1%}), {single_text}; placed in "
        f"{outcome.timings['place']:.3f} s"
    )
    console.print(f"communication: {len(sim.transfers)} transfers, {_fmt_bytes(sim.comm_bytes)}")
    table = Table(box=box.SIMPLE_HEAD if fancy else box.ASCII2, show_edge=False, pad_edge=False)
    for col, justify in (
        ("device", "left"),
        ("ops", "right"),
        ("compute", "right"),
        ("busy", "right"),
        ("peak memory", "left"),
    ):
        table.add_column(col, justify=justify)
    width = 20
    full, empty = ("█", "░") if fancy else ("#", ".")
    for d, dev in enumerate(spec.devices):
        frac = min(sim.peak_bytes[d] / dev.memory_bytes, 1.0) if dev.memory_bytes else 0.0
        filled = round(frac * width)
        bar = full * filled + empty * (width - filled)
        table.add_row(
            dev.name,
            str(len(sim.order[d])),
            _fmt_us(sim.compute_us[d]),
            f"{sim.compute_us[d] / step:.0%}" if step > 0 else "-",
            f"{bar} {_fmt_bytes(sim.peak_bytes[d])} / {_fmt_bytes(dev.memory_bytes)}",
        )
    console.print(table)
    for note in outcome.notes:
        console.print(f"note: {note}")
    written = [p for p in (output, report_path) if p]
    if written:
        console.print("wrote " + ", ".join(written))
    else:
        console.print("nothing written: add -o placed.pb and/or --report report.json")
