"""The ``baechi`` command line: argument parsing and rich rendering only.

Heavy modules (the pipeline, protobuf, numpy) are imported inside commands so
``baechi --help`` starts fast; TensorFlow is never imported by ``place``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import click

from baechi_cli import __version__
from baechi_cli.errors import EXIT_REGRESSION, BaechiError
from baechi_cli.placers import PLACER_NAMES

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


ALGOS = ("auto", *PLACER_NAMES)


def _common_options(fn: Callable) -> Callable:
    """Options shared by `place` and `compare`."""
    options = [
        click.option(
            "--devices",
            "-d",
            "device_spec",
            required=True,
            metavar="SPEC",
            help="Devices: 4x8GB, 2x16GB,2x8GB, a preset (rtx2080x4, v100x4, t4x4, a100x8) or a YAML file.",
        ),
        click.option(
            "--batch-size", type=click.IntRange(min=1), help="Value for unknown (batch) dimensions."
        ),
        click.option(
            "--comm",
            type=click.Choice(["parallel", "sequential"]),
            help="Communication model; default: the device spec's (parallel for NxSIZE specs).",
        ),
        click.option(
            "--solver-time-limit",
            type=click.FloatRange(min=0, min_open=True),
            default=60.0,
            show_default=True,
            metavar="SECONDS",
            help="Time limit for m-SCT's LP; running out is an error, never a silent fallback.",
        ),
        click.option(
            "--sct-threshold",
            type=click.FloatRange(min=0, max=1, min_open=True),
            default=0.5,
            show_default=True,
            help="m-SCT rounding: an edge whose LP value is below this makes a favorite child.",
        ),
        click.option(
            "--forward-only/--no-forward-only",
            default=None,
            help="Place forward ops only; backward ops follow them. Default: on when every device "
            "can hold the whole model.",
        ),
        click.option(
            "--coplace/--no-coplace",
            default=True,
            show_default=True,
            help="Co-placement: single-consumer chains and forward/backward pairs share a device.",
        ),
        click.option(
            "--fusion/--no-fusion",
            default=True,
            show_default=True,
            help="Fuse connected ops of one group into one node before placing.",
        ),
        click.option(
            "--trace",
            "trace_path",
            type=click.Path(dir_okay=False),
            help="Write a Chrome/Perfetto timeline here.",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print JSON to stdout and nothing else there."),
        click.option("--quiet", "-q", is_flag=True, help="No progress and no summary."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option(
    "--algo",
    default="auto",
    show_default=True,
    type=click.Choice(ALGOS),
    help="Placement algorithm; auto runs them all (and one device when the model fits) and keeps the fastest.",
)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), help="Write the placed GraphDef here (.pb or .pbtxt)."
)
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Write the JSON report here.")
@_common_options
def place(
    model: str,
    device_spec: str,
    algo: str,
    output: str | None,
    report_path: str | None,
    batch_size: int | None,
    comm: str | None,
    solver_time_limit: float,
    sct_threshold: float,
    forward_only: bool | None,
    coplace: bool,
    fusion: bool,
    trace_path: str | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Place MODEL on the devices.

    MODEL is a TensorFlow GraphDef (.pb, .pbtxt) or a cost-annotated workload
    JSON. Prints a summary: the predicted step time against the lower bound
    and a single device, and each device's ops, compute and peak memory.
    """
    try:
        from baechi_cli.devices import parse_devices
        from baechi_cli.pipeline import PlaceOptions, build_report, place_model

        devices = parse_devices(device_spec)
        options = PlaceOptions(
            algo, batch_size, comm, solver_time_limit, sct_threshold, coplace, fusion, forward_only
        )
        with _Progress(enabled=not quiet) as progress:
            outcome = place_model(
                model,
                devices,
                options,
                output=output,
                report_path=report_path,
                trace_path=trace_path,
                progress=progress.stage,
            )
        if as_json:
            from baechi_cli.io.report import dumps

            click.echo(dumps(build_report(outcome, options)), nl=False)
        elif not quiet:
            _render_summary(outcome, [p for p in (output, report_path, trace_path) if p])
    except (BaechiError, Exception) as err:  # noqa: BLE001 - every error becomes one line
        _fail(err)


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option(
    "--algos",
    default="topo,etf,sct",
    show_default=True,
    help=f"Comma-separated algorithms to compare ({', '.join(PLACER_NAMES)}).",
)
@click.option(
    "--baseline",
    type=click.Path(dir_okay=False),
    help="A previous `baechi compare --json` output to gate against.",
)
@click.option(
    "--max-regression",
    default="5%",
    show_default=True,
    metavar="PCT",
    help="With --baseline: exit 1 when an algorithm's step or placement time grew by more than this.",
)
@_common_options
def compare(
    model: str,
    algos: str,
    baseline: str | None,
    max_regression: str,
    device_spec: str,
    batch_size: int | None,
    comm: str | None,
    solver_time_limit: float,
    sct_threshold: float,
    forward_only: bool | None,
    coplace: bool,
    fusion: bool,
    trace_path: str | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Run several algorithms on MODEL and compare them side by side.

    The table shows placement seconds, predicted step time, speed-up over one
    device, gap to the lower bound, peak memory per device and bytes
    communicated; --json prints the same as `baechi.compare/v1`.
    """
    try:
        from baechi_cli.devices import parse_devices
        from baechi_cli.pipeline import PlaceOptions, compare_json, compare_model, load_baseline, parse_algos

        names = parse_algos(algos)
        threshold = _parse_percent(max_regression)
        previous = load_baseline(baseline) if baseline else None
        devices = parse_devices(device_spec)
        options = PlaceOptions(
            "auto", batch_size, comm, solver_time_limit, sct_threshold, coplace, fusion, forward_only
        )
        with _Progress(enabled=not quiet) as progress:
            outcome = compare_model(
                model, devices, names, options, trace_path=trace_path, progress=progress.stage
            )
        doc = compare_json(outcome)
        if as_json:
            from baechi_cli.io.report import dumps

            click.echo(dumps(doc), nl=False)
        elif not quiet:
            _render_compare(outcome, trace_path)
        if previous is not None:
            from baechi_cli.pipeline import regressions

            found = regressions(doc, previous, threshold)
            for line in found:
                click.echo(f"regression: {line}", err=True)
            if found:
                sys.exit(EXIT_REGRESSION)
    except (BaechiError, Exception) as err:  # noqa: BLE001 - every error becomes one line
        _fail(err)


@main.command()
@click.argument("placed", type=click.Path(dir_okay=False))
@click.argument("legacy_sidecar", metavar="[SIDECAR]", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--original",
    type=click.Path(dir_okay=False),
    metavar="MODEL",
    help="The unplaced GraphDef: PLACED must equal it, device fields aside; --run takes the reference "
    "loss from it.",
)
@click.option("--run", is_flag=True, help="Also train PLACED in TensorFlow (needs the tf extra).")
@click.option(
    "--sidecar",
    type=click.Path(dir_okay=False),
    help="With --run: inputs, loss, train and init ops (default: <stem>.json beside MODEL, else PLACED).",
)
@click.option(
    "--devices",
    "-d",
    "num_devices",
    type=click.IntRange(min=1),
    metavar="N",
    help="With --run: devices to emulate (default: as many as PLACED uses).",
)
@click.option(
    "--steps", type=click.IntRange(min=1), metavar="K", help="With --run: training steps to run [default: 1]."
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (baechi.verify/v1).")
def verify(
    placed: str,
    legacy_sidecar: str | None,
    original: str | None,
    run: bool,
    sidecar: str | None,
    num_devices: int | None,
    steps: int | None,
    as_json: bool,
) -> None:
    """Check that PLACED is a correct placement: exit 0 when it is, 1 when not.

    \b
    Without TensorFlow: with --original, PLACED equals MODEL device fields
    aside; every op has a device; every colocation constraint holds (_class
    pairs, resource/ref consumers and their producers, TF1 while-loop frames).
    With --run: TensorFlow trains PLACED on N logical CPU devices standing in
    for /device:GPU:0..N-1 (strict placement, devices re-applied after
    import), compares each op's actual device with the request and the loss
    with MODEL's (else the unplaced PLACED's).

    \b
    Example:
      baechi verify placed.pb --original testdata/cnn.pb --run

    A second argument SIDECAR is the older spelling of --run --sidecar SIDECAR.
    """
    try:
        from baechi_cli.errors import InputError
        from baechi_cli.verify import render_report, verify_graph

        if legacy_sidecar is not None:
            if sidecar is not None:
                raise InputError("give the sidecar either as SIDECAR or as --sidecar, not both")
            sidecar, run = legacy_sidecar, True
        if not run and (sidecar is not None or num_devices is not None or steps is not None):
            raise InputError("--sidecar, --devices and --steps apply only with --run")
        report = verify_graph(
            placed, original=original, run=run, sidecar=sidecar, num_devices=num_devices, steps=steps or 1
        )
        if as_json:
            import json

            click.echo(json.dumps(report.to_json(), indent=2))
        else:
            render_report(_console(), report)
        if not report.ok:
            sys.exit(EXIT_REGRESSION)
    except (BaechiError, Exception) as err:  # noqa: BLE001 - every error becomes one line
        _fail(err)


def _parse_percent(text: str) -> float:
    """``5%`` or ``0.05`` -> 0.05."""
    from baechi_cli.errors import InputError

    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise InputError(f"--max-regression '{text}' is not a percentage (e.g. 5%)") from None
    if not 0 <= value < 100:
        raise InputError(f"--max-regression '{text}' must be between 0% and 10000%")
    return value


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


def _memory_bar(peak: int, memory: int, fancy: bool, width: int = 20) -> str:
    full, empty = ("█", "░") if fancy else ("#", ".")
    filled = round(min(peak / memory, 1.0) * width) if memory else 0
    return full * filled + empty * (width - filled)


def _table(console: Any, columns: list[tuple[str, str]]) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD if console.is_terminal else box.ASCII2, show_edge=False, pad_edge=False)
    for col, justify in columns:
        table.add_column(col, justify=justify)
    return table


def _header(console: Any, prepared: Any) -> None:
    spec, g = prepared.devices, prepared.graph
    ic = spec.interconnect
    console.print(
        f"[bold]{prepared.path}[/]: {g.num_ops} ops, {g.num_edges} edges -> {spec.count} devices "
        f"({ic.mode} comm, {ic.latency_us:g} µs + {ic.bandwidth_bytes_per_us / 1e3:.2f} GB/s)"
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


def _render_summary(outcome: Any, written: list[str]) -> None:
    from baechi_cli.pipeline import ALGORITHM_TITLES

    console = _console()
    spec, sim = outcome.devices, outcome.sim
    step = sim.step_time_us
    _header(console, outcome.prepared)
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
    if len(outcome.candidates) > 1:
        tried = ", ".join(
            f"{ALGORITHM_TITLES[c.algorithm]} "
            + (_fmt_us(c.sim.step_time_us) if c.ok else "skipped" if "skipped" in str(c.error) else "failed")
            for c in outcome.candidates
        )
        console.print(f"auto tried: {tried}")
    console.print(f"communication: {len(sim.transfers)} transfers, {_fmt_bytes(sim.comm_bytes)}")
    table = _table(
        console,
        [
            ("device", "left"),
            ("ops", "right"),
            ("compute", "right"),
            ("busy", "right"),
            ("peak memory", "left"),
        ],
    )
    for d, dev in enumerate(spec.devices):
        table.add_row(
            dev.name,
            str(len(sim.order[d])),
            _fmt_us(sim.compute_us[d]),
            f"{sim.compute_us[d] / step:.0%}" if step > 0 else "-",
            f"{_memory_bar(sim.peak_bytes[d], dev.memory_bytes, console.is_terminal)} "
            f"{_fmt_bytes(sim.peak_bytes[d])} / {_fmt_bytes(dev.memory_bytes)}",
        )
    console.print(table)
    for note in outcome.notes:
        console.print(f"note: {note}")
    if written:
        console.print("wrote " + ", ".join(written))
    else:
        console.print("nothing written: add -o placed.pb, --report report.json or --trace timeline.json")


def _render_compare(outcome: Any, trace_path: str | None) -> None:
    from baechi_cli.pipeline import ALGORITHM_TITLES

    console = _console()
    prepared = outcome.prepared
    _header(console, prepared)
    single = prepared.single_device
    console.print(
        f"lower bound {_fmt_us(prepared.lower_bound_us)}; one device "
        + (_fmt_us(single.step_time_us) if single else "does not fit")
    )
    table = _table(
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
    for c in outcome.candidates:
        title = ALGORITHM_TITLES[c.algorithm]
        if c.sim is None:
            table.add_row(title, f"{c.place_seconds:.3f}", "failed", "-", "-", "-", str(c.error))
            continue
        step = c.sim.step_time_us
        speedup = f"{single.step_time_us / step:.2f}x" if single else "does not fit"
        gap = f"+{step / prepared.lower_bound_us - 1:.1%}" if prepared.lower_bound_us > 0 else "-"
        peaks = " ".join(_fmt_bytes(p) for p in c.sim.peak_bytes)
        step_text = _fmt_us(step)
        if step == best and console.is_terminal:
            step_text = f"[bold green]{step_text}[/]"
        table.add_row(
            title, f"{c.place_seconds:.3f}", step_text, speedup, gap, _fmt_bytes(c.sim.comm_bytes), peaks
        )
    console.print(table)
    if trace_path:
        console.print(f"wrote {trace_path}")
