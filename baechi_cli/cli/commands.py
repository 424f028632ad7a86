"""The ``baechi`` command line: argument parsing, option checks, the calls and the exit codes.

Each command parses its options, calls :mod:`baechi_cli.app.place`,
:mod:`baechi_cli.app.compare`, :mod:`baechi_cli.app.profile` or
:mod:`baechi_cli.verify` and hands what they return to :mod:`baechi_cli.cli.render`
(the only modules that print with rich). Heavy modules (the pipeline,
protobuf, numpy, rich) are imported inside commands so ``baechi --help``
starts fast; TensorFlow is never imported by ``place``.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from baechi_cli import __version__, placers
from baechi_cli.cli.render.common import StageProgress, make_console, tensorflow_logs_hidden
from baechi_cli.core import objectives
from baechi_cli.core.devices import PRESETS
from baechi_cli.core.errors import EXIT_REGRESSION, BaechiError, InputError, one_line
from baechi_cli.io.formats import detect_format
from baechi_cli.pipeline import schedules

if TYPE_CHECKING:
    from baechi_cli.core.devices import DeviceSpec
    from baechi_cli.search.candidates import PlaceOptions

EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug in baechi, not in the input


def _fail(err: BaseException) -> None:
    """Print a one-line error to stderr and exit with the error's code."""
    if isinstance(err, BaechiError):
        click.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
    if os.environ.get("BAECHI_DEBUG"):
        raise err
    click.echo(
        f"internal error: {type(err).__name__}: {one_line(err)} (a bug in baechi; rerun with BAECHI_DEBUG=1 "
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
    dependency, 6 a calibration measured noise, 70 internal error.
    """


ALGOS = ("auto", *placers.names())
# --optimizer of place, compare and profile: the update a training step runs.
OPTIMIZERS = ("sgd", "momentum", "adam")


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


# The options of `place` and `compare` that are PlaceOptions fields, by the field's name.
_PLACE_OPTION_FIELDS = (
    "batch_size",
    "dims",
    "infer_shapes",
    "unknown_sizes",
    "training",
    "optimizer",
    "comm",
    "solver_time_limit",
    "sct_threshold",
    "forward_only",
    "coplace",
    "fusion",
    "profile",
    "budget",
    "seed",
)


def _place_options(algo: str, placing: dict[str, Any]) -> PlaceOptions:
    """The PlaceOptions of `place` and `compare`: ``algo`` and the fields ``_common_options`` collected."""
    from baechi_cli.search.candidates import PlaceOptions

    return PlaceOptions(algo=algo, **placing)


def _check_budget(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not value > 0:  # also catches nan
        raise click.BadParameter(f"{value:g} is not a positive number of seconds")
    if value is not None and value == float("inf"):
        raise click.BadParameter("inf is not a number of seconds")
    return value


def _common_options(fn: Callable) -> Callable:
    """Options shared by `place` and `compare`.

    The command gets those of :data:`_PLACE_OPTION_FIELDS` as one dict, ``placing``,
    for :func:`_place_options`; the others as parameters of their own.
    """

    @functools.wraps(fn)
    def command(**params: Any) -> None:
        fn(placing={name: params.pop(name) for name in _PLACE_OPTION_FIELDS}, **params)

    options = [
        click.option(
            "--devices",
            "-d",
            "device_spec",
            metavar="SPEC",
            help=f"Devices: 4x8GB, 2x16GB,2x8GB, a preset ({', '.join(PRESETS)}) or a YAML file. "
            "Required, except for `place` of a workload JSON with --objective throughput or latency "
            "(its maxFPGAs and maxCPUs).",
        ),
        click.option(
            "--batch-size", type=click.IntRange(min=1), help="Value for unknown (batch) dimensions."
        ),
        _DIM_OPTION,
        click.option(
            "--infer-shapes",
            type=click.Choice(["onnx", "run"]),
            default="onnx",
            show_default=True,
            help="ONNX: how tensor sizes are found. onnx: ONNX's shape inference, then baechi's "
            "propagation (no model is run); run: also one onnxruntime run on zero inputs for the rest.",
        ),
        click.option(
            "--allow-unknown-sizes",
            "unknown_sizes",
            is_flag=True,
            help="Place even when some tensor sizes stay unknown, counting each unknown dim as 1 "
            "(by default such a model is refused: whether it fits cannot be judged).",
        ),
        click.option(
            "--training",
            is_flag=True,
            help="Place a training step of a forward-only model (ONNX): backward ops and optimizer "
            "are synthesized for the plan; the placed model stays the original.",
        ),
        click.option(
            "--optimizer",
            type=click.Choice(OPTIMIZERS),
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
            default=None,
            help="Co-placement: single-consumer chains and forward/backward pairs share a device. "
            "Default: on, and auto also tries it off.",
        ),
        click.option(
            "--fusion/--no-fusion",
            default=None,
            help="Fuse connected ops of one group into one node before placing. Default: on, and "
            "auto also tries it off.",
        ),
        click.option(
            "--budget",
            type=float,
            callback=_check_budget,
            metavar="SECONDS",
            help="How long auto searches beyond its first candidates (other pass options, "
            "refinement, exact); counted by a fixed cost model, so the result does not depend on "
            "the machine. Default: 1 s, more above 5,000 nodes. With --algo exact: CP-SAT's limit "
            "in its deterministic seconds (default 10), which a machine may run slower than the clock.",
        ),
        click.option(
            "--seed",
            type=click.IntRange(min=0),
            default=0,
            show_default=True,
            help="Seed of auto's refinement (the same seed gives the same plan).",
        ),
        click.option(
            "--profile",
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
        command = option(command)
    return command


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
@click.option(
    "--objective",
    type=click.Choice(objectives.names()),
    default=objectives.names()[0],
    show_default=True,
    help=" ".join(f"{o.name}: {o.minimises}." for o in objectives.REGISTRY.values()),
)
@click.option(
    "--microbatches",
    type=click.IntRange(min=1),
    metavar="M",
    help="With --objective throughput: the minibatch runs as M microbatches under --schedule; "
    "the split is chosen for that schedule's throughput and memory.",
)
@click.option(
    "--schedule",
    type=click.Choice(schedules.names()),
    default=None,
    help="With --microbatches: the pipeline schedule (default: the fastest of "
    + ", ".join(schedules.compared_by_default())
    + "). "
    + "; ".join(
        s.name
        + (f": torch's {s.torch_class}" if s.torch_class else "")
        + (f", {s.stages_per_device} stages per device" if s.stages_per_device > 1 else "")
        for s in schedules.REGISTRY.values()
    )
    + ".",
)
@_common_options
def place(
    model: str,
    algo: str,
    output: str | None,
    report_path: str | None,
    objective: str,
    microbatches: int | None,
    schedule: str | None,
    device_spec: str | None,
    trace_path: str | None,
    as_json: bool,
    quiet: bool,
    placing: dict[str, Any],
) -> None:
    """Place MODEL on the devices.

    MODEL is a TensorFlow GraphDef (.pb, .pbtxt), an ONNX model (.onnx) or a
    cost-annotated workload JSON. Prints a summary: the predicted step time against the lower bound
    and a single device, and each device's ops, compute and peak memory.
    """
    if schedule is not None and microbatches is None:
        raise click.UsageError("--schedule needs --microbatches (a schedule runs microbatches)")
    chosen = objectives.get(objective)
    if not chosen.microbatches and microbatches is not None:
        takes = " or ".join(o.name for o in objectives.REGISTRY.values() if o.microbatches)
        raise click.UsageError(f"--microbatches needs --objective {takes}")
    if device_spec is None and not (chosen.devices_from_workload and detect_format(model) == "workload"):
        raise click.UsageError("Missing option '--devices' / '-d'.")
    try:
        from baechi_cli.app.place import place_model
        from baechi_cli.core.devices import parse_devices

        cpus = 0
        if device_spec is None:
            from baechi_cli.io.workload_json import stated_devices

            device_spec, cpus = stated_devices(model)
        devices = parse_devices(device_spec)
        options = replace(
            _place_options(algo, placing),
            objective=objective,
            microbatches=microbatches,
            schedule=schedule or "auto",
            cpus=cpus,
        )
        with StageProgress(enabled=not quiet) as progress:
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
            from baechi_cli.app.report import build_report, dumps

            click.echo(dumps(build_report(outcome, options)), nl=False)
        elif not quiet:
            from baechi_cli.cli.render.place import render_summary

            render_summary(outcome, [p for p in (output, report_path, trace_path) if p])
    except (BaechiError, Exception) as err:  # noqa: BLE001 - every error becomes one line
        _fail(err)


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option(
    "--algos",
    default="topo,etf,sct",
    show_default=True,
    help=f"Comma-separated algorithms to compare (auto, {', '.join(placers.names())}); auto: the search "
    "`baechi place` runs by default, its row named by the plan it chose.",
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
    trace_path: str | None,
    as_json: bool,
    quiet: bool,
    placing: dict[str, Any],
) -> None:
    """Run several algorithms on MODEL and compare them side by side.

    The table shows placement seconds, predicted step time, speed-up over one
    device, gap to the lower bound, peak memory per device and bytes
    communicated; --json prints the same as `baechi.compare/v1`.
    """
    if device_spec is None:
        raise click.UsageError("Missing option '--devices' / '-d'.")
    try:
        from baechi_cli.app.compare import (
            compare_json,
            compare_model,
            load_baseline,
            parse_algos,
            regressions,
        )
        from baechi_cli.app.report import dumps
        from baechi_cli.core.devices import parse_devices

        names = parse_algos(algos)
        threshold = _parse_percent(max_regression)
        previous = load_baseline(baseline) if baseline else None
        devices = parse_devices(device_spec)
        options = _place_options("auto", placing)
        with StageProgress(enabled=not quiet) as progress:
            outcome = compare_model(
                model, devices, names, options, trace_path=trace_path, progress=progress.stage
            )
        doc = compare_json(outcome)
        if as_json:
            click.echo(dumps(doc), nl=False)
        elif not quiet:
            from baechi_cli.cli.render.compare import render_compare

            render_compare(outcome, trace_path)
        if previous is not None:
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
@click.option(
    "--torch",
    "torch_model",
    metavar="FILE.py:FUNC",
    help="PLACED is a report: build its pipeline plan in PyTorch for the model FUNC() returns "
    "(model, example_args), train --steps steps on one gloo rank per device, compare every "
    "gradient with one process (needs torch).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=False,
    flag_value="-",
    default=None,
    metavar="[OUT]",
    help="Print the result as JSON (baechi.verify/v1), or with --torch write it to OUT.",
)
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
    torch_model: str | None,
    as_json: str | None,
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
    A report (.json) with --torch: its pipeline plan is built in PyTorch
    (the program torch.export gives, cut where the plan says) and trained
    on one gloo process per device; exit 0 only when it ran and every
    gradient matches one process's within 1e-5 (relative L2). Prints each
    rank's peak memory and each stage's compute beside the predictions.

    \b
    Examples:
      baechi verify placed.pb --original testdata/cnn.pb --run
      baechi verify placed.onnx --original testdata/torch_resnet.onnx --run
      baechi verify report.json --torch model.py:make --steps 2

    A second argument SIDECAR is the older spelling of --run --sidecar SIDECAR.
    """
    try:
        if torch_model is not None:
            if original or run or sidecar or legacy_sidecar or num_devices or batch_size or dims:
                raise InputError("--torch takes a report and --steps, --json only")
            _verify_torch(placed, torch_model, steps or 1, as_json)
            return
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
            from baechi_cli.cli.render.verify import render_onnx_report
            from baechi_cli.verify.onnx import verify_onnx

            report: Any = verify_onnx(placed, original=original, run=run, batch_size=batch_size, dims=dims)
            render: Callable[[Any, Any], None] = render_onnx_report
        else:
            from baechi_cli.cli.render.verify import render_report
            from baechi_cli.verify.report import verify_graph

            report = verify_graph(
                placed, original=original, run=run, sidecar=sidecar, num_devices=num_devices, steps=steps or 1
            )
            render = render_report
        if as_json is not None and as_json != "-":
            raise InputError("--json OUT is for --torch; without it --json prints to stdout")
        if as_json:
            import json

            click.echo(json.dumps(report.to_json(), indent=2))
        else:
            render(make_console(), report)
        if not report.ok:
            sys.exit(EXIT_REGRESSION)
    except (BaechiError, Exception) as err:  # noqa: BLE001 - every error becomes one line
        _fail(err)


def _verify_torch(report_path: str, spec: str, steps: int, as_json: str | None) -> None:
    """``baechi verify REPORT --torch FILE.py:FUNC``: run the plan in PyTorch (exit 1 when it does
    not train or a gradient differs)."""
    import json

    try:
        import torch  # noqa: F401
    except ImportError:
        from baechi_cli.core.errors import MissingDependencyError

        raise MissingDependencyError("--torch runs the plan in PyTorch: pip install torch") from None
    from baechi_cli.cli.render.verify import render_torch_result
    from baechi_cli.io.files import write_atomic
    from baechi_cli.runtime.launch import load_model_function, verify_torch

    try:
        with open(report_path, encoding="utf-8") as f:
            report = json.load(f)
    except (OSError, ValueError) as err:
        raise InputError(f"cannot read the report: {one_line(err, 120)}", path=report_path) from None
    model, args = load_model_function(spec)
    try:
        result = verify_torch(model, args, report, steps=steps)
    except InputError as err:
        raise err.with_path(report_path) from None
    doc = {
        "schema": "baechi.verify/v1",
        "kind": "torch",
        "report": report_path,
        "ok": bool(
            result["gradients_match"] and result["as_placed"] and result["within_memory"] is not False
        ),
        **result,
    }
    if as_json == "-":
        click.echo(json.dumps(doc, indent=2))
    else:
        if as_json is not None:
            write_atomic(as_json, (json.dumps(doc, indent=2) + "\n").encode())
        render_torch_result(make_console(), doc)
    if not doc["ok"]:
        sys.exit(EXIT_REGRESSION)


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
    "--measure",
    is_flag=True,
    help="Run MODEL and measure every op: a GraphDef in TensorFlow (the tf extra), a .pt2 in torch "
    "on this CPU (the torch extra).",
)
@click.option(
    "--training",
    is_flag=True,
    help="A .pt2: profile its training step as `baechi place --training` places it (traced by autograd).",
)
@click.option(
    "--optimizer",
    type=click.Choice(OPTIMIZERS),
    default="sgd",
    show_default=True,
    help="With --training: the optimizer whose update the step runs.",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    metavar="N",
    help="With --measure on a .pt2: torch's CPU threads (a pipeline rank on one thread: 1; default: torch's).",
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
    training: bool,
    optimizer: str,
    threads: int | None,
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
    and keeps each op's median time, output and temporary bytes; a .pt2 runs
    in torch op for op (its training step with --training) and keeps each
    op's median time. Prints the
    totals (compute, FLOPs, persistent and peak activation memory of a
    one-device run), the top ops by time, a breakdown by op type and the
    analytic rules' coverage.

    \b
    Examples:
      baechi profile testdata/cnn.pb
      baechi profile testdata/cnn.pb --measure -o costs.json
      baechi place testdata/cnn.pb -d 4x8GB --profile costs.json
      baechi profile model.pt2 --training --measure --threads 1 -o step.json
      baechi profile --comm -d 4x8GB -o devices.yaml
    """
    try:
        from baechi_cli.core.devices import parse_devices

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
        if threads is not None and not measure:
            raise click.UsageError("--threads needs --measure")
        if between is not None:
            raise click.UsageError("--between needs --comm")
        from baechi_cli.app.profile import PROFILE_STAGES, profile_model

        with (
            tensorflow_logs_hidden(measure),
            StageProgress(enabled=not quiet, stages=PROFILE_STAGES) as progress,
        ):
            outcome = profile_model(
                model,
                devices or parse_devices("1x8GB"),
                batch_size=batch_size,
                dims=dims,
                measure=measure,
                training=optimizer if training else None,
                threads=threads,
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
            from baechi_cli.cli.render.profile import render_profile

            render_profile(outcome, top, output)
    except click.UsageError:
        raise
    except (BaechiError, Exception) as err:  # noqa: BLE001 - every error becomes one line
        _fail(err)


def _calibrate(
    devices: DeviceSpec | None,
    between: str | None,
    max_exp: int,
    output: str | None,
    as_json: bool,
    quiet: bool,
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
        from baechi_cli.io.formats import check_writable

        check_writable(output)
    with tensorflow_logs_hidden(True), StageProgress(enabled=not quiet, stages=("transfers",)) as progress:
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
    if not quiet:
        from baechi_cli.cli.render.profile import render_comm_fit

        render_comm_fit(fit, max_exp, text, output)


@main.group("devices")
def devices_group() -> None:
    """Device specs: make one from the local hardware."""


@devices_group.command("calibrate")
@click.option(
    "--torch",
    "torch_devices",
    required=True,
    metavar="DEVICE",
    help="The device to measure with PyTorch: cpu or cuda:K; several CUDA devices with commas "
    "(cuda:0,cuda:1) also time the transfers between them.",
)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), help="Write the device YAML here (default: print it)."
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    metavar="N",
    help="Write N devices like the one measured.",
)
@click.option(
    "--quick", is_flag=True, help="Small sizes and three runs each: about a second, rougher numbers."
)
@click.option(
    "--allow-noisy",
    is_flag=True,
    help="Write the numbers even when the machine was busy or the repeats spread wide (by default "
    "such a calibration is refused, exit 6); the warning and the YAML header say so.",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    metavar="N",
    help="CPU: measure with N threads, as a process given N threads runs (default: torch's).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress and no summary.")
def devices_calibrate(
    torch_devices: str,
    output: str | None,
    count: int,
    quick: bool,
    allow_noisy: bool,
    threads: int | None,
    quiet: bool,
) -> None:
    """Measure a device with PyTorch and write a device spec for --devices.

    Measures GEMM, convolution and depthwise convolution FLOP/s, elementwise memory bandwidth and the
    per-op launch overhead (float32, medians after warm-up); with several CUDA
    devices, the latency and bandwidth of copies between them. The YAML says
    what was measured, with which torch, and when. It also measures how busy
    other processes kept the CPU and how far each kernel's runs spread, and
    refuses numbers that are noise (exit 6) unless --allow-noisy.

    \b
    Examples:
      baechi devices calibrate --torch cpu -o cpu.yaml
      baechi devices calibrate --torch cuda:0,cuda:1 -o gpus.yaml
      baechi place model.onnx --devices cpu.yaml
    """
    try:
        from baechi_cli.app.calibrate import CALIBRATE_STAGES, calibrate_torch

        if output is not None:
            from baechi_cli.io.formats import check_writable

            check_writable(output)
        command = " ".join(
            ["baechi devices calibrate --torch", torch_devices]
            + (["-o", output] if output else [])
            + ([f"--count {count}"] if count > 1 else [])
            + (["--quick"] if quick else [])
            + (["--allow-noisy"] if allow_noisy else [])
            + ([f"--threads {threads}"] if threads else [])
        )
        with StageProgress(enabled=not quiet, stages=CALIBRATE_STAGES) as progress:
            result = calibrate_torch(
                torch_devices,
                count=count,
                quick=quick,
                allow_noisy=allow_noisy,
                threads=threads,
                command=command,
                progress=progress.stage,
                steps=progress.steps,
            )
        if result.noise.noisy:
            click.echo(f"warning: the calibration measured noise: {result.noise.summary()}", err=True)
        if output is None:
            click.echo(result.yaml, nl=False)
            return
        from baechi_cli.io.files import write_atomic

        write_atomic(output, result.yaml.encode())
        if not quiet:
            from baechi_cli.cli.render.calibrate import render_calibration

            render_calibration(result, output)
    except (BaechiError, Exception) as err:  # noqa: BLE001 - every error becomes one line
        _fail(err)


def _parse_percent(text: str) -> float:
    """``5%`` or ``0.05`` -> 0.05."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise InputError(f"--max-regression '{text}' is not a percentage (e.g. 5%)") from None
    if not 0 <= value < 100:
        raise InputError(f"--max-regression '{text}' must be between 0% and 10000%")
    return value
