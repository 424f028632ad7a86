"""The ``baechi`` command line: argument parsing and rich rendering only.

Heavy modules (the pipeline, protobuf, numpy) are imported inside commands so
``baechi --help`` starts fast; TensorFlow is never imported by ``place``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click

from baechi_cli import __version__
from baechi_cli.errors import EXIT_REGRESSION, BaechiError, InputError
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


def _parse_dims(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, int] | None:
    """``--dim seq=128 --dim batch=8`` -> ``{"seq": 128, "batch": 8}``."""
    dims: dict[str, int] = {}
    for text in values:
        name, eq, value = text.partition("=")
        name = name.strip()
        if not eq or not name or not value.strip().isdigit() or int(value) < 1:
            raise click.BadParameter(f"'{text}' is not NAME=VALUE with a positive integer VALUE", ctx, param)
        dims[name] = int(value)
    return dims or None


_DIM_OPTION = click.option(
    "--dim",
    "dims",
    multiple=True,
    metavar="NAME=VALUE",
    callback=_parse_dims,
    help="Bind an ONNX symbolic dim (repeatable), e.g. --dim seq=128.",
)


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
        _DIM_OPTION,
        click.option(
            "--training",
            is_flag=True,
            help="Place a training step of a forward-only model (ONNX): backward ops and optimizer "
            "are synthesized for the plan; the placed model stays the original.",
        ),
        click.option(
            "--optimizer",
            type=click.Choice(["sgd", "momentum", "adam"]),
            default="sgd",
            show_default=True,
            help="With --training: the optimizer whose update ops and state are added.",
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
            "--profile",
            "profile_path",
            type=click.Path(dir_okay=False),
            metavar="COSTS.json",
            help="Use this cost profile (`baechi profile MODEL -o COSTS.json`, analytic or --measure) "
            "instead of the analytic model.",
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
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    help="Write the placed model here: a GraphDef (.pb, .pbtxt) or ONNX model (.onnx), as the input.",
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
    dims: dict[str, int] | None,
    training: bool,
    optimizer: str,
    comm: str | None,
    solver_time_limit: float,
    sct_threshold: float,
    forward_only: bool | None,
    coplace: bool,
    fusion: bool,
    profile_path: str | None,
    trace_path: str | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Place MODEL on the devices.

    MODEL is a TensorFlow GraphDef (.pb, .pbtxt), an ONNX model (.onnx) or a
    cost-annotated workload JSON. Prints a summary: the predicted step time against the lower bound
    and a single device, and each device's ops, compute and peak memory.
    """
    try:
        from baechi_cli.devices import parse_devices
        from baechi_cli.pipeline import PlaceOptions, build_report, place_model

        devices = parse_devices(device_spec)
        options = PlaceOptions(
            algo,
            batch_size,
            comm,
            solver_time_limit,
            sct_threshold,
            coplace,
            fusion,
            forward_only,
            profile_path,
            dims,
            training,
            optimizer,
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
    dims: dict[str, int] | None,
    training: bool,
    optimizer: str,
    comm: str | None,
    solver_time_limit: float,
    sct_threshold: float,
    forward_only: bool | None,
    coplace: bool,
    fusion: bool,
    profile_path: str | None,
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
            "auto",
            batch_size,
            comm,
            solver_time_limit,
            sct_threshold,
            coplace,
            fusion,
            forward_only,
            profile_path,
            dims,
            training,
            optimizer,
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
    help="The unplaced model, of PLACED's format: PLACED must equal it, placement annotations aside; "
    "--run compares with it.",
)
@click.option(
    "--run",
    is_flag=True,
    help="Also run PLACED: train a GraphDef in TensorFlow (the tf extra), infer an ONNX model in "
    "onnxruntime (the onnx extra).",
)
@click.option(
    "--sidecar",
    type=click.Path(dir_okay=False),
    help="GraphDef, with --run: inputs, loss, train and init ops (default: <stem>.json beside MODEL, "
    "else PLACED).",
)
@click.option(
    "--devices",
    "-d",
    "num_devices",
    type=click.IntRange(min=1),
    metavar="N",
    help="GraphDef, with --run: devices to emulate (default: as many as PLACED uses).",
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    metavar="K",
    help="GraphDef, with --run: training steps to run [default: 1].",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    metavar="SIZE",
    help="ONNX, with --run: value for symbolic axis-0 dims of the inputs (default 1).",
)
@_DIM_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (baechi.verify/v1).")
def verify(
    placed: str,
    legacy_sidecar: str | None,
    original: str | None,
    run: bool,
    sidecar: str | None,
    num_devices: int | None,
    steps: int | None,
    batch_size: int | None,
    dims: dict[str, int] | None,
    as_json: bool,
) -> None:
    """Check that PLACED is a correct placement: exit 0 when it is, 1 when not.

    \b
    A GraphDef (.pb, .pbtxt), without TensorFlow: with --original, PLACED
    equals MODEL device fields aside; every op has a device; every
    colocation constraint holds (_class pairs, resource/ref consumers and
    their producers, TF1 while-loop frames). With --run: TensorFlow trains
    PLACED on N logical CPU devices standing in for /device:GPU:0..N-1
    (strict placement, devices re-applied after import), compares each op's
    actual device with the request and the loss with MODEL's (else the
    unplaced PLACED's).

    \b
    An ONNX model (.onnx): it passes onnx.checker; every node has a device
    whose device_configurations and baechi.device metadata agree, on a
    device of the "baechi" configuration; with --original, PLACED equals
    MODEL but for baechi's annotations. With --run: onnxruntime runs PLACED
    and MODEL (else PLACED without its annotations) on the CPU with the
    same seeded random inputs (symbolic dims from --dim, --batch-size, else
    1) and every output must be identical.

    \b
    Examples:
      baechi verify placed.pb --original testdata/cnn.pb --run
      baechi verify placed.onnx --original testdata/torch_resnet.onnx --run

    A second argument SIDECAR is the older spelling of --run --sidecar SIDECAR.
    """
    try:
        from baechi_cli.pipeline import detect_format

        onnx = detect_format(placed) == "onnx"
        if original is not None and (detect_format(original) == "onnx") != onnx:
            kind = "an ONNX model (.onnx)" if onnx else "a GraphDef (.pb, .pbtxt)"
            raise InputError(f"--original must be {kind}, as PLACED is", path=original)
        if legacy_sidecar is not None:
            if sidecar is not None:
                raise InputError("give the sidecar either as SIDECAR or as --sidecar, not both")
            sidecar, run = legacy_sidecar, True
        if onnx and (sidecar is not None or num_devices is not None or steps is not None):
            raise InputError(
                "--sidecar, --devices and --steps apply to GraphDefs only; an ONNX model runs in "
                "onnxruntime on the CPU (see --dim, --batch-size)"
            )
        if not onnx and (batch_size is not None or dims is not None):
            raise InputError("--batch-size and --dim apply to ONNX models only")
        if not run and (sidecar is not None or num_devices is not None or steps is not None):
            raise InputError("--sidecar, --devices and --steps apply only with --run")
        if not run and (batch_size is not None or dims is not None):
            raise InputError("--batch-size and --dim apply only with --run")
        if onnx:
            from baechi_cli.verify_onnx import render_onnx_report, verify_onnx

            report: Any = verify_onnx(placed, original=original, run=run, batch_size=batch_size, dims=dims)
            render: Callable[[Any, Any], None] = render_onnx_report
        else:
            from baechi_cli.verify import render_report, verify_graph

            report = verify_graph(
                placed, original=original, run=run, sidecar=sidecar, num_devices=num_devices, steps=steps or 1
            )
            render = render_report
        if as_json:
            import json

            click.echo(json.dumps(report.to_json(), indent=2))
        else:
            render(_console(), report)
        if not report.ok:
            sys.exit(EXIT_REGRESSION)
    except (BaechiError, Exception) as err:  # noqa: BLE001 - every error becomes one line
        _fail(err)


@main.command()
@click.argument("model", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--devices",
    "-d",
    "device_spec",
    metavar="SPEC",
    help="Devices (as for place). Analytic times are for the first device; with --comm, the devices "
    "the written YAML lists. Default: one RTX 2080-class 8 GB device.",
)
@click.option("--batch-size", type=click.IntRange(min=1), help="Value for unknown (batch) dimensions.")
@_DIM_OPTION
@click.option(
    "--measure", is_flag=True, help="Run MODEL in TensorFlow and measure every op (needs the tf extra)."
)
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    metavar="K",
    help="With --measure: steps run before measuring.",
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    metavar="N",
    help="With --measure: measured steps; each op's time is its median.",
)
@click.option(
    "--init-op",
    metavar="NAME",
    help="With --measure: the op that initialises variables (default: the sidecar's, else 'init').",
)
@click.option(
    "--comm",
    "calibrate",
    is_flag=True,
    help="Instead of a model, time transfers between two local devices and fit latency + "
    "bytes / bandwidth; -o writes a device YAML with the fitted interconnect.",
)
@click.option(
    "--between",
    metavar="A,B",
    help="With --comm: the two TensorFlow devices (default: two GPUs, else GPU and CPU, "
    "else two logical CPUs).",
)
@click.option(
    "--max-bytes",
    "max_exp",
    type=click.IntRange(min=20, max=30),
    default=28,
    show_default=True,
    metavar="EXP",
    help="With --comm: largest transfer, 2^EXP bytes (at least 2^20: smaller copies all take the latency).",
)
@click.option("--top", type=click.IntRange(min=0), default=10, show_default=True, help="Ops listed by time.")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    help="Write the profile JSON here (with --comm: the device YAML).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the profile (or the fit) as JSON and nothing else."
)
@click.option("--quiet", "-q", is_flag=True, help="No progress and no summary.")
def profile(
    model: str | None,
    device_spec: str | None,
    batch_size: int | None,
    dims: dict[str, int] | None,
    measure: bool,
    warmup: int,
    steps: int,
    init_op: str | None,
    calibrate: bool,
    between: str | None,
    max_exp: int,
    top: int,
    output: str | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Show what every op of MODEL costs, analytic or measured.

    -o writes the profile that `baechi place --profile` and `baechi compare
    --profile` take instead of the analytic model.

    \b
    Analytic by default: FLOPs and bytes per op from the graph's shapes, timed
    on the first device of --devices. --measure runs the graph in TensorFlow
    and keeps each op's median time, output and temporary bytes. Prints the
    totals (compute, FLOPs, persistent and peak activation memory of a
    one-device run), the top ops by time, a breakdown by op type and the
    analytic rules' coverage.

    \b
    Examples:
      baechi profile testdata/cnn.pb
      baechi profile testdata/cnn.pb --measure -o costs.json
      baechi place testdata/cnn.pb -d 4x8GB --profile costs.json
      baechi profile --comm -d 4x8GB -o devices.yaml
    """
    try:
        from baechi_cli.devices import parse_devices

        devices = parse_devices(device_spec) if device_spec else None
        if calibrate:
            if model is not None or measure:
                raise click.UsageError("--comm times the local devices; give no MODEL and no --measure")
            _calibrate(devices, between, max_exp, output, as_json, quiet)
            return
        if model is None:
            raise click.UsageError("missing MODEL (or --comm to calibrate communication)")
        if init_op is not None and not measure:
            raise click.UsageError("--init-op needs --measure")
        if between is not None:
            raise click.UsageError("--between needs --comm")
        from baechi_cli.pipeline import PROFILE_STAGES, profile_model

        with (
            _tensorflow_logs_hidden(measure),
            _Progress(enabled=not quiet, stages=PROFILE_STAGES) as progress,
        ):
            outcome = profile_model(
                model,
                devices or parse_devices("1x8GB"),
                batch_size=batch_size,
                dims=dims,
                measure=measure,
                warmup=warmup,
                steps=steps,
                init_op=init_op,
                output=output,
                progress=progress.stage,
                measure_progress=progress.steps,
            )
        if as_json:
            from baechi_cli.costs.profile import dumps

            click.echo(dumps(outcome.profile), nl=False)
        elif not quiet:
            _render_profile(outcome, top, output)
    except click.UsageError:
        raise
    except (BaechiError, Exception) as err:  # noqa: BLE001 - every error becomes one line
        _fail(err)


@contextlib.contextmanager
def _tensorflow_logs_hidden(enabled: bool) -> Iterator[None]:
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


def _calibrate(
    devices: Any, between: str | None, max_exp: int, output: str | None, as_json: bool, quiet: bool
) -> None:
    """``baechi profile --comm``: time transfers, fit, print and write the interconnect."""
    from baechi_cli.costs.comm import interconnect_yaml, measure_transfers

    src = dst = None
    if between:
        parts = [x.strip() for x in between.split(",")]
        if len(parts) != 2 or not all(parts):
            raise InputError(f"--between '{between}' must name two devices: A,B (e.g. CPU:0,GPU:0)")
        src, dst = parts
    if output is not None:
        from baechi_cli.pipeline import check_writable

        check_writable(output)
    with _tensorflow_logs_hidden(True), _Progress(enabled=not quiet, stages=("transfers",)) as progress:
        progress.stage("transfers")
        fit = measure_transfers(src, dst, max_exp=max_exp, progress=progress.steps)
    text = interconnect_yaml(fit, devices)
    if output is not None:
        from baechi_cli.io.files import write_atomic

        write_atomic(output, text.encode())
    if as_json:
        import json

        click.echo(json.dumps(fit.to_json(), indent=2))
        return
    if quiet:
        return
    console = _console()
    console.print(f"[bold]{fit.src} -> {fit.dst}[/]: {len(fit.samples)} sizes, 2^0 .. 2^{max_exp} bytes")
    table = _table(console, [("bytes", "right"), ("", "right"), ("median", "right"), ("fit", "right")])
    for sample in fit.samples:
        table.add_row(
            f"2^{sample.nbytes.bit_length() - 1}",
            _fmt_bytes(sample.nbytes),
            _fmt_us(sample.median_us),
            _fmt_us(fit.transfer_time_us(sample.nbytes)),
        )
    console.print(table)
    console.print(f"fit: {fit.summary()}")
    if fit.note:
        console.print(f"note: {fit.note}")
    if output is None:
        console.print(text, end="", markup=False, highlight=False)
    else:
        console.print(f"wrote {output}")


def _render_profile(outcome: Any, top: int, output: str | None) -> None:
    """The human summary of ``baechi profile``."""
    console = _console()
    p, g = outcome.profile, outcome.graph
    t = p.totals
    console.print(
        f"[bold]{outcome.path}[/]: {g.num_ops} ops, {g.num_edges} edges; {p.source} costs for {p.device}"
    )
    flops = f"{t.flops / 1e9:.2f} GFLOP" if t.flops else "FLOPs not counted"
    console.print(
        f"totals: compute {_fmt_us(t.compute_us)}, {flops}, persistent {_fmt_bytes(t.persistent_bytes)}, "
        f"peak activations {_fmt_bytes(t.peak_activation_bytes)} "
        f"(one device: step {_fmt_us(t.single_device_step_us)})"
    )
    total_us = t.compute_us or 1.0
    if top:
        table = _table(
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
                _fmt_us(op.compute_us),
                f"{op.compute_us / total_us:.1%}",
                f"{op.flops / 1e9:.3f}",
                _fmt_bytes(sum(op.output_bytes)),
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
    table = _table(
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
            _fmt_us(us),
            f"{us / total_us:.1%}",
            f"{fl / 1e9:.3f}",
            rule.get(op_type, ""),
        )
    rest = rows[len(shown) :]
    if rest:
        table.add_row(
            f"({len(rest)} more types)",
            str(int(sum(r[1][0] for r in rest))),
            _fmt_us(sum(r[1][1] for r in rest)),
            f"{sum(r[1][1] for r in rest) / total_us:.1%}",
            f"{sum(r[1][2] for r in rest) / 1e9:.3f}",
            "",
        )
    console.print("by op type")
    console.print(table)
    _render_coverage(console, p)
    if p.HasField("measurement"):
        m = p.measurement
        console.print(
            f"measured: {t.measured_ops} of {g.num_ops} ops ran ({m.warmup} warm-up + {m.steps} steps, "
            f"TensorFlow {m.tensorflow}); {m.not_run_count} kept analytic costs"
            + (f", e.g. {', '.join(m.not_run[:3])}" if m.not_run else "")
        )
    for note in outcome.notes:
        console.print(f"note: {note}")
    if output:
        console.print(f"wrote {output}")


def _render_coverage(console: Any, p: Any) -> None:
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
    """A rich progress bar over a command's stages, on stderr, only on a terminal.

    ``stage(name)`` moves the bar to a stage; ``steps(done, total)`` fills the
    current stage in proportion (measured profiling's warm-up and steps).
    """

    def __init__(self, enabled: bool, stages: tuple[str, ...] | None = None) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self._stages = stages
        self._bar: Any = None
        self._at = 0

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            if self._stages is None:
                from baechi_cli.pipeline import STAGES

                self._stages = STAGES
            self._bar = Progress(
                TextColumn("{task.description:<10}"),
                BarColumn(),
                TimeElapsedColumn(),
                console=_console(stderr=True),
                transient=True,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self._stages[0], total=len(self._stages))
        return self

    def stage(self, name: str) -> None:
        if self._bar is not None:
            self._at = self._stages.index(name)  # type: ignore[union-attr]
            self._bar.update(self._task, description=name, completed=self._at)

    def steps(self, done: int, total: int) -> None:
        if self._bar is not None and total > 0:
            label = f"{self._stages[self._at]} {done}/{total}"  # type: ignore[index]
            self._bar.update(self._task, description=label, completed=self._at + done / total)

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
    from baechi_cli.pipeline import ProfileCosts

    costs = prepared.cost_report
    if isinstance(costs, ProfileCosts):
        article = "an" if costs.source[:1] in "aeiou" else "a"
        console.print(f"costs: {costs.path}, {article} {costs.source} profile for {costs.device}")
    t = prepared.training
    if t is not None:
        console.print(
            f"training: {prepared.model_ops} forward ops + {t.backward_ops} backward + {t.update_ops} "
            f"{t.optimizer} updates ({_fmt_bytes(t.optimizer_state_bytes)} optimizer state) synthesized"
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
    _render_module_map(console, outcome)
    for note in outcome.notes:
        console.print(f"note: {note}")
    if written:
        console.print("wrote " + ", ".join(written))
    else:
        placed = "placed.onnx" if outcome.prepared.input_format == "onnx" else "placed.pb"
        console.print(f"nothing written: add -o {placed}, --report report.json or --trace timeline.json")


# The summary lists at most this many modules of the module map (the report has all).
MODULE_MAP_SHOWN = 12


def _render_module_map(console: Any, outcome: Any) -> None:
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
    for note in prepared.notes:
        console.print(f"note: {note}")
    if trace_path:
        console.print(f"wrote {trace_path}")
