"""Run a placed GraphDef in TensorFlow, in a subprocess, and check it ran where placed.

The run check (:func:`verify_placed_graph`) runs in a fresh Python subprocess
(``python -m baechi_cli.verify PLACED SIDECAR --devices N [--original MODEL]
--steps K --json``) because the number of devices must be fixed before
TensorFlow initialises, and returns a :class:`VerifyResult`. Importing this
module never imports TensorFlow; only the subprocess does (:func:`check`).

The subprocess (:func:`check`):

1. creates a TF1 session with ``N`` CPU devices, GPUs hidden and oneDNN's rewrites off
   (they fuse ops within a device, so a fused op would go unchecked);
2. maps ``/device:GPU:i`` to ``/device:CPU:i``, imports the graph and re-applies each
   op's requested device (``import_graph_def`` moves ``_class`` members to the node they
   name, which would hide a placement that splits a colocation group);
3. runs it as written (:func:`baechi_cli.io.tfsupport.as_written_config`: no soft
   placement, no grappler, whose remapper fuses ops across devices, no constant folding);
4. runs the sidecar's ``init_op``, then ``loss`` + ``train_op`` for ``steps`` steps with
   ``FULL_TRACE``, and compares every node that ran with its requested device
   (``ops_checked`` counts them; nodes TensorFlow adds are ignored);
5. runs the reference (the original, else the placed graph with devices cleared) on the
   same feeds and compares losses, unless ``reference_loss`` is given;
6. trains the placed graph again and requires the two runs to agree bit for bit (losses,
   one more forward pass, every variable), rerunning the reference when they do not;
7. compares every variable with the reference's.

Before any of it, :func:`find_races` looks for variable accesses the step leaves unordered
(:mod:`baechi_cli.verify.races`); any fails the check. Feeds are synthetic and
deterministic (:func:`_make_feeds`). Losses are equal when bitwise equal or within 1e-6
relative; variables within 1e-6 relative L2 distance. Placement moves whole ops and never
splits one, so the kernels and reductions are the same; the intra-op thread count is not
(Eigen splits reductions by it), so reference and placed runs share one process and one
session configuration.

Failures are results (``ok=False``, TF's message on one line in ``error``); only bad
arguments raise :class:`~baechi_cli.core.errors.InputError`, and a missing TensorFlow
:class:`~baechi_cli.core.errors.MissingDependencyError`. The subprocess's exit status
(:func:`main`): 0 pass, 1 fail, 2 bad input, 5 no TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from baechi_cli.core.errors import EXIT_OK, BaechiError, InputError, one_line
from baechi_cli.io.sidecar import load_sidecar, numpy_dtype, range_values
from baechi_cli.io.tfsupport import (
    MESSAGE_LIMIT,
    as_written_config,
    map_device,
    require_tensorflow,
    shorten_tf_message,
)
from baechi_cli.verify.races import Race, variable_races

EXIT_VERIFY_FAILED = 1
RELATIVE_TOLERANCE = 1e-6
#: Races, and differing variables, the result lists by name (it counts them all).
KEEP_RACES = 10
#: What MissingDependencyError says when the run check cannot import TensorFlow.
NEEDS_TENSORFLOW = "verify --run needs TensorFlow: pip install 'baechi[tf]' (the static checks do not)"

_TF_LOG_RE = re.compile(r"^(?:[IWEF]\d{4} |WARNING: All log messages)")


# --- the parent side ------------------------------------------------------------


@dataclass
class VerifyResult:
    """Outcome of one TensorFlow run check; ``ok`` is the verdict.

    ``misplaced`` holds ``(op, requested, actual)``: the device as written in
    the placed graph and the CPU device TensorFlow ran the op on (requested
    ``/device:GPU:i`` corresponds to ``/device:CPU:i``). ``devices_used``
    counts the graph's ops by the device they actually ran on.
    ``loss_reference`` comes from the original graph when one was given,
    else from the placed graph with its devices cleared.
    """

    ok: bool
    loss_placed: list[float] = field(default_factory=list)
    loss_reference: list[float] = field(default_factory=list)
    losses_equal: bool = False
    losses_bitwise_equal: bool = False
    devices_used: dict[str, int] = field(default_factory=dict)
    misplaced: list[tuple[str, str, str]] = field(default_factory=list)
    ops_total: int = 0
    ops_checked: int = 0
    ops_unconstrained: int = 0  # ops of the placed graph without a device
    error: str | None = None
    num_devices: int = 0
    steps: int = 0
    sidecar: str | None = None
    reference: str | None = None  # the file the reference loss came from
    # Reproducibility: the placed graph trains twice; both runs must agree bit for bit.
    loss_placed_again: list[float] = field(default_factory=list)
    deterministic: bool = False
    nondeterministic_variables: int = 0  # variables whose two placed runs differ
    reference_deterministic: bool | None = None  # run again only when the placed runs differ
    # After the steps: one more forward pass (no update) and every variable's value.
    eval_loss_placed: float | None = None
    eval_loss_reference: float | None = None
    variables_compared: int = 0  # 0 when the reference came as known losses
    variables_differing: int = 0  # not bitwise equal to the reference's
    variable_differences: list[tuple[str, float]] = field(default_factory=list)  # largest first
    max_variable_difference: float = 0.0  # relative L2 distance to the reference's value
    # Unordered accesses of one variable in a step (:mod:`baechi_cli.verify.races`).
    races: list[str] = field(default_factory=list)
    races_count: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VerifyResult:
        data = dict(data)
        data["misplaced"] = [tuple(m) for m in data.get("misplaced", [])]
        data["variable_differences"] = [tuple(d) for d in data.get("variable_differences", [])]
        return cls(**data)

    def problems(self) -> list[str]:
        """One line per problem the run found."""
        lines = []
        if self.error:
            lines.append(f"TensorFlow run: {self.error}")
        if self.loss_placed and self.loss_reference and not self.losses_equal:
            lines.append(f"the loss differs: {self.loss_placed} placed, {self.loss_reference} reference")
        if self.loss_placed and self.loss_placed_again and not self.deterministic:
            culprit = (
                "TensorFlow runs the original so too"
                if self.reference_deterministic is False
                else "the original runs reproducibly"
                if self.reference_deterministic
                else "the original was not rerun"
            )
            lines.append(
                f"two runs of the placed graph differ ({self.loss_placed} and {self.loss_placed_again}, "
                f"{self.nondeterministic_variables} variable(s)); {culprit}"
            )
        if self.variables_compared and self.max_variable_difference > RELATIVE_TOLERANCE:
            name, worst = self.variable_differences[0]
            lines.append(
                f"{self.variables_differing} of {self.variables_compared} variables differ from the "
                f"reference's after {self.steps} step(s), '{name}' most ({worst:.3g} relative)"
            )
        if not _close(self.eval_loss_placed, self.eval_loss_reference):
            lines.append(
                f"the loss after training differs: {self.eval_loss_placed} placed, "
                f"{self.eval_loss_reference} reference"
            )
        lines += [f"race: {race}" for race in self.races]
        if self.races_count > len(self.races):
            lines.append(f"... and {self.races_count - len(self.races)} more races")
        for op, requested, actual in self.misplaced:
            lines.append(f"'{op}' is placed on {requested} but ran on {actual}")
        if not lines and not self.ok:
            lines.append("TensorFlow run failed")
        return lines


def verify_placed_graph(
    placed_path: str,
    sidecar_path: str,
    num_devices: int,
    *,
    steps: int = 1,
    original_path: str | None = None,
    reference_loss: list[float] | None = None,
    timeout_s: float | None = 600.0,
) -> VerifyResult:
    """Run ``placed_path`` on ``num_devices`` CPU devices in a fresh subprocess.

    The reference loss comes from ``original_path`` when given (its devices
    cleared), else from the placed graph with its devices cleared; a known
    ``reference_loss`` (one value per step, e.g. from an earlier result with
    the same sidecar and steps) skips that run. Returns a
    failed result (never raises) for anything TensorFlow rejects, a crashed
    subprocess, or one that runs longer than ``timeout_s`` seconds.
    """
    if num_devices < 1:
        raise InputError(f"--devices must be at least 1, got {num_devices}")
    if steps < 1:
        raise InputError(f"--steps must be at least 1, got {steps}")
    for path in (placed_path, original_path):
        if path is not None and not Path(path).is_file():
            raise InputError("no such file", path=path)
    sidecar = load_sidecar(sidecar_path)
    require_tensorflow(NEEDS_TENSORFLOW)
    races = find_races(placed_path, [sidecar["loss"], sidecar["train_op"]])

    # The child must import this package even when it is not installed.
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    cmd = [
        sys.executable, "-m", "baechi_cli.verify", str(placed_path), str(sidecar_path),
        "--devices", str(num_devices), "--steps", str(steps), "--json",
    ]  # fmt: skip
    if original_path is not None:
        cmd += ["--original", str(original_path)]
    if reference_loss is not None:
        if len(reference_loss) != steps:
            raise InputError(f"reference_loss has {len(reference_loss)} values for {steps} steps")
        cmd += ["--reference-loss", json.dumps([float(x) for x in reference_loss])]
    context = {
        "num_devices": num_devices,
        "steps": steps,
        "sidecar": str(sidecar_path),
        "reference": str(original_path or placed_path),
    }
    result = _run_child(cmd, env, timeout_s, context)
    result.races = [race.message() for race in races[:KEEP_RACES]]
    result.races_count = len(races)
    result.ok = result.ok and not races
    return result


def find_races(placed_path: str, fetches: list[str]) -> list[Race]:
    """The unordered variable accesses of a step of ``placed_path`` fetching ``fetches``.

    Pure Python (no TensorFlow); :func:`baechi_cli.verify.races.variable_races`
    on the file's structure. InputError names the file when a fetch names no node.
    """
    from baechi_cli.io.graphdef import parse_graphdef_file
    from baechi_cli.verify.static import structure_graph

    try:
        return variable_races(structure_graph(parse_graphdef_file(placed_path)), fetches)
    except InputError as err:
        raise err.with_path(placed_path) from None


def _run_child(cmd: list[str], env: dict[str, str], timeout_s: float | None, context: dict) -> VerifyResult:
    """The subprocess's result; a failed one (never an exception) when it crashes or times out."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return VerifyResult(ok=False, error=f"verification timed out after {timeout_s:g} s", **context)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if lines:
        try:
            return VerifyResult.from_json(json.loads(lines[-1]))
        except (ValueError, TypeError):
            pass  # not our JSON line: report the child's stderr below
    # The last line that is not TensorFlow's C++ logging: usually the exception.
    stderr = [line for line in proc.stderr.splitlines() if line.strip() and not _TF_LOG_RE.match(line)]
    reason = stderr[-1] if stderr else "no output"
    return VerifyResult(
        ok=False,
        error=one_line(f"verification subprocess failed (exit {proc.returncode}): {reason}", MESSAGE_LIMIT),
        **context,
    )


# --- the subprocess side ------------------------------------------------------


def _close(a: float | None, b: float | None) -> bool:
    """Bitwise equal, within the tolerance, both NaN, or either unknown."""
    if a is None or b is None or a == b or (math.isnan(a) and math.isnan(b)):
        return True
    return math.isclose(a, b, rel_tol=RELATIVE_TOLERANCE, abs_tol=0.0)


def _losses_equal(a: list[float], b: list[float]) -> tuple[bool, bool]:
    """(equal within tolerance, bitwise equal); NaN equals NaN."""
    if len(a) != len(b) or not a:
        return False, False
    bitwise = all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True))
    close = bitwise or all(
        math.isclose(x, y, rel_tol=RELATIVE_TOLERANCE, abs_tol=0.0) for x, y in zip(a, b, strict=True)
    )
    return close, bitwise


def _make_feeds(sidecar: dict[str, Any], steps: int) -> list[dict[str, Any]]:
    """One batch per step for a validated sidecar; InputError when an input is too large to allocate.

    ``numpy.random.RandomState(seed)`` draws, input by input: values uniform
    in the input's ``range`` [low, high) when it has one (integers or floats,
    :func:`~baechi_cli.io.sidecar.range_values`); else integers uniform
    in [0, 2), bools uniform, floats and complex numbers standard normal,
    strings empty.
    """
    import numpy as np

    rng = np.random.RandomState(int(sidecar.get("seed") or 0))
    feeds = []
    for _ in range(steps):
        batch = {}
        for entry in sidecar["inputs"]:
            name, dtype = entry["name"], numpy_dtype(entry["dtype"])
            shape = [int(d) for d in entry["shape"]]
            try:
                if entry.get("range") is not None:
                    batch[name] = range_values(rng, name, entry["dtype"], shape, entry["range"])
                elif dtype.kind in "iu":
                    batch[name] = rng.randint(0, 2, size=shape).astype(dtype)
                elif dtype.kind == "b":
                    batch[name] = rng.rand(*shape) < 0.5
                elif dtype.kind == "O":  # strings
                    batch[name] = np.full(shape, b"", dtype=object)
                else:
                    batch[name] = rng.standard_normal(shape).astype(dtype)
            except (MemoryError, ValueError):  # numpy: "array is too big", or no memory for it
                raise InputError(
                    f"input '{name}' of shape {shape} is too large to make up a value for"
                ) from None
        feeds.append(batch)
    return feeds


class _Trained(NamedTuple):
    """One training run: the step losses, the loss after them, the variables, where ops ran."""

    losses: list[float]
    eval_loss: float
    variables: dict[str, Any]  # variable op name -> numpy value after the steps
    ran_on: dict[str, set[str]]


#: Op types whose first output is a variable whose value the run reads back.
_VARIABLE_OPS = ("VarHandleOp", "VariableV2", "Variable")


def _run(
    tf: Any,
    graph_def: Any,
    devices: dict[str, str],
    sidecar: dict[str, Any],
    feeds: list[dict[str, Any]],
    config: Any,
) -> _Trained:
    """Run init, ``len(feeds) - 1`` training steps and a last forward pass (the last feed).

    Each variable's value is read afterwards by an op added on its device (a
    ref variable's tensor is fetched as it is).
    """
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
        for op in graph.get_operations():
            # import_graph_def moved every _class member to its target's device.
            op._set_device(devices.get(op.name, ""))
        reads = {}
        for op in graph.get_operations():
            if op.type not in _VARIABLE_OPS:
                continue
            if op.type == "VarHandleOp":
                with tf.device(devices.get(op.name, "")):
                    reads[op.name] = tf.raw_ops.ReadVariableOp(
                        resource=op.outputs[0], dtype=op.get_attr("dtype"), name=f"{op.name}/verify_read"
                    )
            else:
                reads[op.name] = op.outputs[0]
    ran_on: dict[str, set[str]] = {}
    losses: list[float] = []
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        for step in range(len(feeds)):
            metadata = tf.compat.v1.RunMetadata()
            if step == 0:
                session.run(sidecar["init_op"], options=options, run_metadata=metadata)
            else:
                loss, _ = session.run(
                    [sidecar["loss"], sidecar["train_op"]],
                    feed_dict=feeds[step - 1],
                    options=options,
                    run_metadata=metadata,
                )
                losses.append(float(loss))
            for dev_stats in metadata.step_stats.dev_stats:
                device = map_device(dev_stats.device)
                for node in dev_stats.node_stats:
                    ran_on.setdefault(node.node_name, set()).add(device)
        eval_loss = float(session.run(sidecar["loss"], feed_dict=feeds[-1]))
        variables = _read_variables(tf, session, reads)
    return _Trained(losses, eval_loss, variables, ran_on)


def _read_variables(tf: Any, session: Any, reads: dict[str, Any]) -> dict[str, Any]:
    """Every variable's value; the ones that cannot be read (never initialised) are left out."""
    try:
        return session.run(reads)
    except tf.errors.OpError:
        values = {}
        for name, tensor in reads.items():
            try:
                values[name] = session.run(tensor)
            except tf.errors.OpError:
                continue
        return values


def _relative_distance(a: Any, b: Any) -> float:
    """||a - b|| / ||b|| in float64: 0 when bitwise equal, inf for another shape, NaNs or b = 0."""
    import numpy as np

    if a.shape != b.shape or a.dtype != b.dtype:
        return math.inf
    if a.tobytes() == b.tobytes():
        return 0.0
    if a.dtype.kind not in "fciu":
        return math.inf
    diff = float(np.linalg.norm((a.astype(np.float64) - b.astype(np.float64)).ravel()))
    scale = float(np.linalg.norm(b.astype(np.float64).ravel()))
    return diff / scale if math.isfinite(diff) and scale > 0 else math.inf


def _same_run(a: _Trained, b: _Trained) -> tuple[bool, int]:
    """(bit-for-bit the same losses and variables, how many variables differ)."""
    import numpy as np

    differing = sum(
        1
        for name in a.variables.keys() | b.variables.keys()
        if name not in a.variables
        or name not in b.variables
        or a.variables[name].tobytes() != b.variables[name].tobytes()
    )
    losses = np.array(a.losses + [a.eval_loss]).tobytes() == np.array(b.losses + [b.eval_loss]).tobytes()
    return losses and differing == 0, differing


def _tf_error(exc: BaseException) -> str:
    message = getattr(exc, "message", None) or str(exc) or ""
    return f"{type(exc).__name__}: {shorten_tf_message(message)}"


def _load_graph_def(graph_pb2: Any, path: str) -> Any:
    """TensorFlow's GraphDef from a binary or text file; InputError when it is neither."""
    from google.protobuf import message, text_format

    data = Path(path).read_bytes()
    graph_def = graph_pb2.GraphDef()
    text_first = path.lower().endswith((".pbtxt", ".txt"))
    for as_text in (text_first, not text_first):
        try:
            if as_text:
                text_format.Parse(data.decode("utf-8"), graph_def)
            else:
                graph_def.ParseFromString(data)
            return graph_def
        except (message.DecodeError, text_format.ParseError, UnicodeDecodeError):
            graph_def.Clear()
    raise InputError("not a GraphDef (neither binary nor text protobuf)", path=path)


def check(
    placed_path: str,
    sidecar_path: str,
    num_devices: int,
    steps: int = 1,
    original_path: str | None = None,
    reference_loss: list[float] | None = None,
) -> VerifyResult:
    """The run check itself, in this process.

    Meant for a fresh process: the environment settings below take effect only
    if TensorFlow has not been imported yet.
    """
    sidecar = load_sidecar(sidecar_path)
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"  # GPU:i is emulated by CPU:i
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    placed = _load_graph_def(graph_pb2, placed_path)
    requested = {node.name: map_device(node.device) for node in placed.node}
    result = VerifyResult(
        ok=False,
        ops_total=len(placed.node),
        ops_unconstrained=sum(1 for d in requested.values() if not d),
        num_devices=num_devices,
        steps=steps,
        sidecar=sidecar_path,
        reference=original_path or placed_path,
    )
    mapped = graph_pb2.GraphDef()
    mapped.CopyFrom(placed)
    for node in mapped.node:
        node.device = requested[node.name]

    # One batch per step, then one for the forward pass after them.
    feeds = _make_feeds(sidecar, steps + 1)
    config = as_written_config(tf, cpus=num_devices)
    # Any exception here is TF rejecting or failing the graph; it becomes the
    # result's one-line error, never a traceback.
    reference_def = None
    reference: _Trained | None = None
    if reference_loss is not None:
        result.loss_reference = list(reference_loss)
    else:
        reference_def = graph_pb2.GraphDef()
        reference_def.CopyFrom(_load_graph_def(graph_pb2, original_path) if original_path else placed)
        for node in reference_def.node:
            node.device = ""
        try:
            reference = _run(tf, reference_def, {}, sidecar, feeds, config)
        except Exception as exc:
            which = "the original graph" if original_path else "the unplaced graph"
            result.error = f"{which} does not run: {_tf_error(exc)}"
            return result
        result.loss_reference, result.eval_loss_reference = reference.losses, reference.eval_loss
    try:
        first = _run(tf, mapped, requested, sidecar, feeds, config)
        again = _run(tf, mapped, requested, sidecar, feeds, config)
    except Exception as exc:
        result.error = _tf_error(exc)
        return result
    result.loss_placed, result.eval_loss_placed, result.loss_placed_again = (
        first.losses, first.eval_loss, again.losses
    )  # fmt: skip
    result.deterministic, result.nondeterministic_variables = _same_run(first, again)
    if not result.deterministic and reference_def is not None and reference is not None:
        # Is it the placement, or TensorFlow on this graph whatever the placement?
        try:
            result.reference_deterministic = _same_run(
                reference, _run(tf, reference_def, {}, sidecar, feeds, config)
            )[0]
        except Exception as exc:
            result.error = f"the reference's second run failed: {_tf_error(exc)}"
    if reference is not None:
        _compare_variables(result, first.variables, reference.variables)

    ran_on = first.ran_on
    by_name = {node.name: node.device for node in placed.node}
    for name in sorted(ran_on.keys() & requested.keys()):
        actual = ran_on[name]
        for device in actual:
            result.devices_used[device] = result.devices_used.get(device, 0) + 1
        if requested[name]:
            result.ops_checked += 1
            if actual != {requested[name]}:
                result.misplaced.append((name, by_name[name], ",".join(sorted(actual))))
    result.devices_used = dict(sorted(result.devices_used.items()))
    result.losses_equal, result.losses_bitwise_equal = _losses_equal(
        result.loss_placed, result.loss_reference
    )
    result.ok = (
        result.losses_equal
        and result.deterministic
        and _close(result.eval_loss_placed, result.eval_loss_reference)
        and result.max_variable_difference <= RELATIVE_TOLERANCE
        and not result.misplaced
        and result.ops_checked > 0
    )
    if result.ops_checked == 0:
        result.error = "no op with a requested device ran, so nothing was checked"
    return result


def _compare_variables(result: VerifyResult, placed: dict[str, Any], reference: dict[str, Any]) -> None:
    """Fill ``result``'s variable fields: how many differ from the reference's, and by how much."""
    distances = sorted(
        ((_relative_distance(placed[name], reference[name]) if name in placed else math.inf), name)
        for name in reference
    )
    differing = [(name, d) for d, name in reversed(distances) if d > 0]
    result.variables_compared = len(reference)
    result.variables_differing = len(differing)
    result.variable_differences = differing[:KEEP_RACES]
    result.max_variable_difference = differing[0][1] if differing else 0.0


def main(argv: list[str] | None = None) -> int:
    """The subprocess's command line (see the module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m baechi_cli.verify",
        description="Check that a placed GraphDef trains in TensorFlow exactly as placed.",
    )
    parser.add_argument("placed", help="placed GraphDef (.pb)")
    parser.add_argument("sidecar", help="sidecar JSON: inputs, loss, train_op, init_op, seed")
    parser.add_argument("--devices", type=int, required=True, help="number of devices to emulate")
    parser.add_argument("--steps", type=int, default=1, help="training steps to run (default 1)")
    parser.add_argument("--original", help="the unplaced GraphDef the reference loss comes from")
    parser.add_argument(
        "--reference-loss", type=json.loads, help="JSON list of known reference losses: skip that run"
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = parser.parse_args(argv)
    try:
        if args.devices < 1 or args.steps < 1:
            raise InputError("--devices and --steps must be at least 1")
        for path in (args.placed, args.original):
            if path is not None and not Path(path).is_file():
                raise InputError("no such file", path=path)
        require_tensorflow(NEEDS_TENSORFLOW)
        result = check(
            args.placed, args.sidecar, args.devices, args.steps, args.original, args.reference_loss
        )
    except BaechiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print(run_text(result))
    return EXIT_OK if result.ok else EXIT_VERIFY_FAILED


def run_text(result: VerifyResult) -> str:
    """A run check's result as plain lines: the verdict, the error, devices, losses, misplaced ops."""
    lines = [
        f"{'OK' if result.ok else 'FAILED'}: {result.ops_checked}/{result.ops_total} ops checked"
        + (f", {result.ops_unconstrained} without a device" if result.ops_unconstrained else "")
    ]
    if result.error:
        lines.append(f"error: {result.error}")
    if result.devices_used:
        lines.append("devices used: " + ", ".join(f"{d} {n}" for d, n in result.devices_used.items()))
    if result.loss_placed or result.loss_reference:
        kind = (
            "bitwise equal" if result.losses_bitwise_equal else "equal" if result.losses_equal else "DIFFER"
        )
        lines.append(f"loss placed {result.loss_placed} reference {result.loss_reference} ({kind})")
    if result.loss_placed_again:
        again = "bit-identical" if result.deterministic else f"DIFFERENT ({result.loss_placed_again})"
        lines.append(f"second placed run: {again}")
    if result.variables_compared:
        lines.append(
            f"variables: {result.variables_differing} of {result.variables_compared} differ from the "
            f"reference's (largest relative distance {result.max_variable_difference:.3g})"
        )
    lines += [f"race: {race}" for race in result.races]
    for op, requested, actual in result.misplaced[:20]:
        lines.append(f"misplaced: {op}: requested {requested}, ran on {actual}")
    if len(result.misplaced) > 20:
        lines.append(f"... and {len(result.misplaced) - 20} more misplaced ops")
    return "\n".join(lines)
