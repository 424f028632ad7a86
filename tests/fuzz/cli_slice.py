"""The end-to-end slice: mutated inputs through the real ``baechi`` commands, in-process.

Each CLI case (:func:`make_cli_case`) takes a reader case (:func:`fuzz.oracle.make_case`,
so the same mutations) and runs the command that reads that kind of file:

* a model (graphdef, pbtxt, onnx, workload): ``baechi place MODEL -d 2x8GB
  --algo topo -o placed --report report.json -q`` (no ``-o`` for a workload),
  or, every other case, ``baechi profile MODEL -o costs.json -q``;
* a profile: ``baechi place <its model> --profile costs.json -o placed ...``;
* a device YAML or spec string: ``baechi place mlp.pb -d <it> -o placed ...``;
* a sidecar: ``baechi verify placed.pb --original mlp.pb --run --sidecar
  model.json`` -- only for sidecars the validator refuses, since a valid one
  would start a TensorFlow training run (:func:`fuzz.targets` covers those).

:func:`check_cli` is the oracle: the exit code is 0, 2, 3, 4 or 5 (never 70,
an internal error, nor an exception escaping the command); nothing prints a
traceback; a failure prints exactly one line, ``error: ...``, on stderr; and
a failed command leaves no output file behind, not even a partial or
temporary one (``write_atomic``'s ``.baechi-*.tmp``), while a successful
one writes every file it was asked for.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
from dataclasses import dataclass
from pathlib import Path

from fuzz.oracle import TIME_LIMIT_S, Case, CaseTimeout, make_case, time_limit
from fuzz.targets import TARGETS, TESTDATA

#: Seconds one command may take (placing runs more than a reader).
CLI_TIME_LIMIT_S = 4 * TIME_LIMIT_S
ALLOWED_EXIT_CODES = frozenset({0, 2, 3, 4, 5})
_MODEL_OUTPUT = {"graphdef": "placed.pb", "pbtxt": "placed.pbtxt", "onnx": "placed.onnx"}
#: The reader targets the slice draws from, in turn.
CLI_KINDS = ("graphdef", "pbtxt", "onnx", "workload", "profile", "devices", "devspec", "sidecar")


@dataclass(frozen=True)
class CliCase:
    """A reader case and the command line that reads it (paths relative to the work directory)."""

    case: Case
    args: list[str]
    outputs: list[str]  # files the command is asked to write


def make_cli_case(run_seed: int, index: int) -> CliCase:
    """CLI case ``index``: reader case ``index`` of the kind :data:`CLI_KINDS` gives it, and its command."""
    kind = CLI_KINDS[index % len(CLI_KINDS)]
    case = make_case(kind, run_seed + 1_000_003, index // len(CLI_KINDS))  # other cases than the readers'
    name = TARGETS[kind].filename
    options = case.options
    args: list[str] = []
    if options.get("batch_size") is not None:
        args += ["--batch-size", str(options["batch_size"])]
    for dim, value in (options.get("dims") or {}).items():
        args += ["--dim", f"{dim}={value}"]
    place = ["--algo", "topo", "-q", "--report", "report.json"]
    if kind in _MODEL_OUTPUT or kind == "workload":
        if index // len(CLI_KINDS) % 2:
            return CliCase(case, ["profile", name, "-q", "-o", "costs.json", *args], ["costs.json"])
        output = ["-o", _MODEL_OUTPUT[kind]] if kind in _MODEL_OUTPUT else []
        outputs = [*output[1:], "report.json"]
        return CliCase(case, ["place", name, "-d", "2x8GB", *place, *output, *args], outputs)
    if kind == "profile":
        model = Path(options["model"])
        output = _MODEL_OUTPUT.get({".pb": "graphdef", ".onnx": "onnx"}.get(model.suffix, ""))
        command = ["place", str(model), "-d", "2x8GB", *place, "--profile", name, *args]
        return CliCase(
            case, command + (["-o", output] if output else []), ["report.json"] + ([output] if output else [])
        )
    if kind in ("devices", "devspec"):
        spec = name if kind == "devices" else case.data.decode("utf-8", "surrogateescape")
        command = ["place", str(TESTDATA / "mlp.pb"), "-d", spec, *place, "-o", "placed.pb"]
        return CliCase(case, command, ["report.json", "placed.pb"])
    return CliCase(case, ["verify", "placed.pb", "--original", "mlp.pb", "--run", "--sidecar", name], [])


@functools.cache
def _placed_mlp() -> bytes:
    """testdata/mlp.pb with every op on /device:GPU:0: a placement ``verify`` accepts."""
    import tempfile

    from baechi_cli.io.graphdef import parse_graphdef_file, write_placed_graphdef

    source = str(TESTDATA / "mlp.pb")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "placed.pb"
        write_placed_graphdef(
            source, {n.name: "/device:GPU:0" for n in parse_graphdef_file(source).node}, str(out)
        )
        return out.read_bytes()


def _refused_sidecar(path: Path) -> bool:
    from baechi_cli.core.errors import BaechiError
    from baechi_cli.io.sidecar import load_sidecar

    try:
        load_sidecar(str(path))
    except BaechiError:
        return True
    return False


def check_cli(cli: CliCase, workdir: Path) -> str | None:
    """Run ``cli`` in ``workdir`` (emptied first): None when it behaved (module docstring), else the
    failure on one line. A sidecar the validator accepts is skipped (None)."""
    from click.testing import CliRunner

    from baechi_cli.cli.commands import main

    for entry in workdir.iterdir():
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    target = TARGETS[cli.case.target]
    (workdir / target.filename).write_bytes(cli.case.data)
    if cli.case.target == "sidecar":
        shutil.copy(TESTDATA / "mlp.pb", workdir / "mlp.pb")
        (workdir / "placed.pb").write_bytes(_placed_mlp())
        if not _refused_sidecar(workdir / target.filename):
            return None
    try:
        # The command line names its files relative to the work directory.
        with contextlib.chdir(workdir), time_limit(CLI_TIME_LIMIT_S):
            result = CliRunner().invoke(main, cli.args, catch_exceptions=True)
    except CaseTimeout:
        return f"hang: `baechi {cli.args[0]}` ran past {CLI_TIME_LIMIT_S:g} s"
    stderr = result.stderr.strip()
    where = f"`baechi {cli.args[0]}` exited {result.exit_code}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return f"{where} with an uncaught {type(result.exception).__name__}: {' '.join(str(result.exception).split())[:200]}"
    if result.exit_code not in ALLOWED_EXIT_CODES:
        return f"{where}: {stderr[:300]}"
    if "Traceback" in result.stdout + result.stderr:
        return f"{where} printing a traceback"
    leftovers = sorted(p.name for p in workdir.iterdir() if p.name.startswith(".baechi-"))
    if leftovers:
        return f"{where} leaving temporary files {leftovers}"
    if result.exit_code == 0:
        missing = [o for o in cli.outputs if not (workdir / o).exists()]
        return f"{where} without writing {missing}" if missing else None
    if "\n" in stderr or not stderr.startswith("error: "):
        return f"{where} with stderr not one 'error: ...' line: {stderr[:300]!r}"
    written = [o for o in cli.outputs if (workdir / o).exists()]
    if written:
        return f"{where} leaving output files {written}"
    return None
