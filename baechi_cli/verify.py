"""Check a placed GraphDef: statically against its original, and by training it in TensorFlow.

Two levels, both reached through ``baechi verify`` (see the README):

Static check (:func:`static_check`, never imports TensorFlow)
-------------------------------------------------------------
Parses the placed GraphDef (and the original, when given) with the project's
own schema and reports, as a :class:`StaticResult`:

* with an original: the same node names in the same order, every NodeDef
  equal to the original's once both device fields are cleared, and every
  other GraphDef field (``versions``, ``library``, ...) equal. Each
  difference is one line naming the op and what changed.
* every node has a device;
* every colocation constraint holds: each ``_class: loc:@name`` entry, each
  consumer of a resource or reference input and its producer (the pairs of
  :func:`baechi_cli.passes.colocation.colocation_pairs`, the same rules the
  placer groups by), and every op of a TF1 while loop with the loop's
  outermost ``Enter`` (:func:`baechi_cli.passes.control_flow.loop_frames`)
  are on one device. Devices are compared after :func:`normalize_device`:
  ``/device:GPU:1``, ``/GPU:1``, ``/gpu:1`` and
  ``/job:localhost/replica:0/task:0/device:GPU:1`` are one device.

Run check (:func:`verify_placed_graph`, needs TensorFlow)
--------------------------------------------------------
Runs in a fresh Python subprocess (``python -m baechi_cli.verify PLACED
SIDECAR --devices N [--original MODEL] --steps K --json``) because the
number of devices must be fixed before TensorFlow initialises, and returns a
:class:`VerifyResult`. Importing this module never imports TensorFlow; only
the subprocess does.

The subprocess:

1. Creates a TF1 ``Session`` with ``N`` CPU devices (``ConfigProto.device_count``;
   ``tf.config.set_logical_device_configuration`` configures the eager context
   only and a ``tf.compat.v1.Session`` does not see it), hides GPUs, and
   turns oneDNN graph rewrites off (``TF_ENABLE_ONEDNN_OPTS=0``: they fuse
   e.g. Conv2D into its BiasAdd within a device, so the Conv2D would vanish
   from the step stats and go unchecked).
2. Maps ``/device:GPU:i`` (also ``/GPU:i``, ``/gpu:i``, with or without a
   job/replica/task prefix) to ``/device:CPU:i`` and imports the graph.
   ``import_graph_def`` rewrites the device of every node carrying ``_class``
   to that of the node it names, which would hide a placement that splits a
   colocation group, so the requested device is re-applied to every op.
3. Runs with ``allow_soft_placement=False`` (TF reports an impossible
   placement as an error instead of moving ops), with all of grappler off
   (``disable_meta_optimizer``: its remapper fuses MatMul+BiasAdd(+Relu) and
   Conv2D+BiasAdd+Relu across devices and runs the fused kernel on the first
   op's device; its constant folding and other rewrites replace nodes) and
   with the classic graph optimizer at ``L0`` (no constant folding or CSE, so
   Const nodes run too and get checked). The graph thus runs as written.
4. Runs the sidecar's ``init_op``, then ``loss`` + ``train_op`` for ``steps``
   steps with ``FULL_TRACE``, and reads from the step stats the device each
   node actually ran on. Every node of the graph that ran and has a requested
   device is compared with that device; nodes TensorFlow adds (``_SOURCE``,
   ``_Send``/``_Recv``, ``_arg_*``/``_retval_*`` for feeds and fetches) are
   ignored. Nodes that never run in these steps (e.g. ``VarIsInitializedOp``,
   fed Placeholders, which become ``_arg`` nodes) are not checked;
   ``ops_checked`` says how many were.
5. Runs the reference graph -- the original file when one is given, else the
   placed graph -- with every device cleared, the same feeds, in a fresh
   ``tf.Graph``, and compares the losses. Given known reference losses
   (``reference_loss``, e.g. cached by a test), it skips this run.

Feeds are synthetic and deterministic: ``numpy.random.RandomState(seed)``
from the sidecar, one batch per step, floats from a standard normal, integers
uniformly from the input's ``range`` ``[low, high)`` (default ``[0, 2)``),
bools uniformly. The graph's own random ops must be seeded (the generator in
``testdata/`` seeds them) or the two runs start from different weights.

Losses are "equal" when bitwise equal or within 1e-6 relative difference.
With TF 2.21 on CPU they have been bitwise equal for every placement tried:
the kernels are the same and no cross-device reduction is reordered, because
placement moves whole ops and never splits one. ``losses_bitwise_equal``
says which case held.

Failures are results, not exceptions: a placement TF rejects (e.g. "Cannot
colocate nodes ...") comes back with ``ok=False`` and TF's message shortened
to one line in ``error``. Only bad arguments (missing files, a malformed
sidecar) raise :class:`~baechi_cli.errors.InputError`, and a missing
TensorFlow raises :class:`~baechi_cli.errors.MissingDependencyError`.

Sidecar (written by ``testdata/generate.py``; ``baechi verify --run`` looks
for ``<stem>.json`` beside the original, or beside the placed file without
``--original``)::

    {"inputs": [{"name": "x:0", "dtype": "float32", "shape": [64, 784]},
                {"name": "labels:0", "dtype": "int64", "shape": [64], "range": [0, 10]}],
     "loss": "loss:0", "train_op": "train", "init_op": "init", "seed": 20200101, ...}

Both together: :func:`verify_graph` returns a :class:`VerifyReport`
(``baechi.verify/v1`` as JSON); :func:`render_report` prints it.

Command line of the subprocess: ``python -m baechi_cli.verify PLACED SIDECAR
--devices N [--original MODEL] [--reference-loss JSON] [--steps K]
[--json]``; exit status 0 when
the check passes, 1 when it fails, 2 for bad input, 5 when TensorFlow is
missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from baechi_cli.errors import EXIT_OK, BaechiError, InputError, MissingDependencyError

if TYPE_CHECKING:
    from baechi_cli.graph import OpGraph
    from baechi_cli.proto_gen.tf_graph_pb2 import GraphDef, NodeDef

EXIT_VERIFY_FAILED = 1
RELATIVE_TOLERANCE = 1e-6
REPORT_SCHEMA = "baechi.verify/v1"
#: How many problems of each kind a result keeps (their counts are exact).
KEEP = 100
#: How many problem lines the command prints before "... and N more".
SHOWN = 10
_MESSAGE_LIMIT = 400

_TF_LOG_RE = re.compile(r"^(?:[IWEF]\d{4} |WARNING: All log messages)")
# "/device:GPU:1", "/GPU:1", "/gpu:1", "/job:localhost/replica:0/task:0/device:GPU:1", "CPU:0".
_DEVICE_RE = re.compile(
    r"^(?:/job:(?P<job>[^/]+))?(?:/replica:(?P<replica>\d+))?(?:/task:(?P<task>\d+))?"
    r"/?(?:device:)?(?P<type>[A-Za-z_]+):(?P<index>\d+)$"
)
_LOCAL = ("localhost", 0, 0)


# --- devices ------------------------------------------------------------------


def normalize_device(device: str) -> str:
    """One spelling per device: ``/device:TYPE:i``, with ``/job:.../replica:.../task:...``
    in front only when it is not the local ``localhost/0/0``; "" for none.

    Strings that do not name one device (``/job:ps``, ``/device:GPU:*``) come
    back stripped but otherwise unchanged.

    >>> normalize_device("/gpu:1"), normalize_device("/job:localhost/replica:0/task:0/device:GPU:1")
    ('/device:GPU:1', '/device:GPU:1')
    >>> normalize_device("/job:worker/task:1/GPU:0")
    '/job:worker/replica:0/task:1/device:GPU:0'
    """
    device = device.strip()
    match = _DEVICE_RE.match(device)
    if match is None:
        return device
    where = (match["job"] or "localhost", int(match["replica"] or 0), int(match["task"] or 0))
    prefix = "" if where == _LOCAL else f"/job:{where[0]}/replica:{where[1]}/task:{where[2]}"
    return f"{prefix}/device:{match['type'].upper()}:{int(match['index'])}"


def device_index(device: str) -> int | None:
    """The index ``i`` of a local ``GPU:i`` or ``CPU:i`` (the run emulates both as ``CPU:i``)."""
    match = _DEVICE_RE.match(device.strip())
    if match is None or match["type"].upper() not in ("GPU", "CPU"):
        return None
    where = (match["job"] or "localhost", int(match["replica"] or 0), int(match["task"] or 0))
    return int(match["index"]) if where == _LOCAL else None


def map_device(device: str) -> str:
    """The CPU device that stands in for ``device``; "" when unconstrained.

    ``/device:GPU:i`` and ``/device:CPU:i`` both become ``/device:CPU:i`` (in
    any spelling TensorFlow accepts); other strings are returned unchanged so
    that TensorFlow reports them.
    """
    if not device:
        return ""
    match = _DEVICE_RE.match(device.strip())
    if match is None or match["type"].upper() not in ("GPU", "CPU"):
        return device
    return f"/device:CPU:{int(match['index'])}"


# --- static check -------------------------------------------------------------

#: Kinds of colocation constraint, as counted in ``StaticResult.constraints``.
CONSTRAINT_KINDS = ("_class", "resource/ref", "loop frame")


@dataclass
class ColocationViolation:
    """Two ops that must share a device but do not; ``reason`` is a phrase about ``op``."""

    op: str
    other: str
    kind: str  # one of CONSTRAINT_KINDS
    reason: str  # e.g. "reads resource 'dense0/kernel'"
    device: str  # op's device, normalised (normalize_device)
    other_device: str

    def message(self) -> str:
        return f"'{self.op}' {self.reason} but is on {self.device} and it on {self.other_device}"


@dataclass
class StaticResult:
    """Outcome of :func:`static_check`; ``ok`` is the verdict.

    Lists keep the first :data:`KEEP` entries; the ``*_count`` fields count
    them all. ``devices`` counts ops by normalised device; ``num_devices`` is
    one more than the largest ``GPU:i``/``CPU:i`` index used (0 when none).
    ``constraints`` counts the colocation constraints checked (both ops
    have a device), by kind.
    """

    ok: bool
    placed: str
    original: str | None = None
    ops_total: int = 0
    devices: dict[str, int] = field(default_factory=dict)
    num_devices: int = 0
    differences: list[str] = field(default_factory=list)
    differences_count: int = 0
    without_device: list[str] = field(default_factory=list)
    without_device_count: int = 0
    violations: list[ColocationViolation] = field(default_factory=list)
    violations_count: int = 0
    constraints: dict[str, int] = field(default_factory=dict)

    def problems(self) -> list[str]:
        """One line per problem kept, differences first; see the counts for the rest."""
        lines = list(self.differences)
        if self.without_device:
            shown = ", ".join(f"'{n}'" for n in self.without_device[:5])
            more = f" and {self.without_device_count - 5} more" if self.without_device_count > 5 else ""
            lines.append(f"{self.without_device_count} op(s) have no device: {shown}{more}")
        lines.extend(v.message() for v in self.violations)
        return lines

    def problems_count(self) -> int:
        return self.differences_count + (1 if self.without_device_count else 0) + self.violations_count

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for entry, violation in zip(data["violations"], self.violations, strict=True):
            entry["message"] = violation.message()
        return data


def static_check(placed: str, original: str | None = None) -> StaticResult:
    """Check ``placed`` without TensorFlow (see the module docstring).

    Raises :class:`InputError` when either file is not a readable GraphDef or
    the placed graph is malformed (duplicate names, inputs naming no node,
    ``_class`` naming no node). Differences, missing devices and broken
    colocation constraints are results (``ok=False``), never exceptions.
    O(V + E) plus the proto comparison.
    """
    from baechi_cli.io.graphdef import parse_graphdef_file
    from baechi_cli.passes.colocation import CLASS_ATTR, colocation_pairs, describe_pair
    from baechi_cli.passes.control_flow import ROOT_FRAME, loop_frames

    placed_def = parse_graphdef_file(placed)
    original_def = parse_graphdef_file(original) if original is not None else None
    result = StaticResult(ok=False, placed=placed, original=original)
    devices = [normalize_device(node.device) for node in placed_def.node]
    try:
        graph = _structure_graph(placed_def)
    except InputError as err:
        raise err.with_path(placed) from None
    result.ops_total = graph.num_ops

    if original_def is not None:
        count, first = _compare_graphs(placed_def, original_def)
        result.differences_count, result.differences = count, first

    for name, device in zip(graph.names, devices, strict=True):
        if device:
            result.devices[device] = result.devices.get(device, 0) + 1
        else:
            result.without_device_count += 1
            if len(result.without_device) < KEEP:
                result.without_device.append(name)
    result.devices = dict(sorted(result.devices.items()))
    indices = [i for i in map(device_index, result.devices) if i is not None]
    result.num_devices = max(indices) + 1 if indices else 0

    constraints = dict.fromkeys(CONSTRAINT_KINDS, 0)
    seen: set[tuple[int, int]] = set()

    def check(v: int, u: int, kind: str, reason: Any) -> None:
        if v == u or (v, u) in seen:
            return
        seen.add((v, u))
        if not (devices[v] and devices[u]):
            return  # an op without a device is reported as such
        constraints[kind] += 1
        if devices[v] != devices[u]:
            result.violations_count += 1
            if len(result.violations) < KEEP:
                violation = ColocationViolation(
                    graph.names[v], graph.names[u], kind, reason(), devices[v], devices[u]
                )
                result.violations.append(violation)

    try:
        for v, u, kind in colocation_pairs(graph):
            group = "_class" if kind == CLASS_ATTR else "resource/ref"
            check(v, u, group, lambda v=v, u=u, kind=kind: describe_pair(graph, v, u, kind))
    except InputError as err:
        raise err.with_path(placed) from None
    for v, frame in enumerate(loop_frames(graph)):
        if frame != ROOT_FRAME:
            check(v, frame, "loop frame", lambda frame=frame: _loop_reason(graph, frame))
    result.constraints = constraints
    result.ok = result.problems_count() == 0
    return result


def _loop_reason(graph: OpGraph, enter: int) -> str:
    frame = graph.attrs[enter].get("frame_name", "")
    return f"is in the while loop that '{graph.names[enter]}' enters (frame '{frame}')"


def _structure_graph(graph_def: GraphDef) -> OpGraph:
    """The OpGraph the checks need -- names, op types, attrs, ``_class``, declared
    types, edges -- without shapes or bytes, so TensorFlow is never needed.

    Decoded as :func:`baechi_cli.io.graphdef.read_graphdef` decodes it (the
    same op registry and attr decoding), but lenient about types: a node whose
    types cannot be worked out gets none (its resource inputs then go unchecked).
    """
    from baechi_cli.graph import GraphBuilder
    from baechi_cli.io.graphdef import decode_nodes

    decoded = decode_nodes(graph_def, lenient_types=True)
    builder = GraphBuilder()
    for i, info in enumerate(decoded.infos):
        attrs = info.public
        if decoded.in_types[i] is not None:
            attrs["_input_types"] = decoded.in_types[i]
        out_types = decoded.out_types[i]
        builder.add_op(
            decoded.names[i], decoded.ops[i], [0] * len(out_types), output_dtypes=out_types, attrs=attrs,
            colocate_with=info.colocate_with(),
        )  # fmt: skip
    for dst, node_inputs in enumerate(decoded.inputs):
        for src, port in node_inputs:
            builder.add_edge(src, dst, port, nbytes=0)
    return builder.build()


class Differences:
    """Counts differences and keeps the first :data:`KEEP` of them as lines."""

    def __init__(self) -> None:
        self.count = 0
        self.found: list[str] = []

    def note(self, line: str) -> None:
        self.count += 1
        if len(self.found) < KEEP:
            self.found.append(line)


def name_differences(placed: list[str], original: list[str], noun: str) -> list[str]:
    """What tells two name lists (ops or nodes, in order) apart: missing, added, reordered.

    O(n). ``noun`` names an entry in the lines ("op 'x' of the original is missing").
    """
    if placed == original:
        return []
    placed_set, original_set = set(placed), set(original)
    lines = [f"{noun} '{name}' of the original is missing" for name in original if name not in placed_set]
    lines += [f"{noun} '{name}' is not in the original" for name in placed if name not in original_set]
    if placed_set == original_set:
        i = next((i for i, (a, b) in enumerate(zip(placed, original)) if a != b), None)
        if i is None:  # one list is the other plus repeats of its names
            lines.append(f"the original has {len(original)} entries with these names, this one {len(placed)}")
        else:
            lines.append(
                f"the node order changed: node #{i} is '{placed[i]}', in the original '{original[i]}'"
            )
    return lines


def _compare_graphs(placed: GraphDef, original: GraphDef) -> tuple[int, list[str]]:
    """(number of differences, the first :data:`KEEP` as lines) between two GraphDefs,
    NodeDef device fields aside. Clears the device fields of both."""
    differences = Differences()
    note = differences.note

    for descriptor in type(placed).DESCRIPTOR.fields:
        name = descriptor.name
        if name != "node" and getattr(placed, name) != getattr(original, name):
            note(_field_difference(placed, original, name))

    placed_names = [node.name for node in placed.node]
    original_names = [node.name for node in original.node]
    for line in name_differences(placed_names, original_names, "op"):
        note(line)
    by_name = {node.name: node for node in original.node}
    for node in placed.node:
        other = by_name.get(node.name)
        if other is None:
            continue
        node.device = ""
        other.device = ""
        if node != other:
            note(f"op '{node.name}': {_node_difference(node, other)}")
    return differences.count, differences.found


def _field_difference(placed: GraphDef, original: GraphDef, name: str) -> str:
    if name == "library":
        mine = {f.signature.name: f for f in placed.library.function}
        theirs = {f.signature.name: f for f in original.library.function}
        for fname in sorted(mine.keys() | theirs.keys()):
            if fname not in mine:
                return f"the function library lacks the original's function '{fname}'"
            if fname not in theirs:
                return f"the function library has a function the original lacks: '{fname}'"
            if mine[fname] != theirs[fname]:
                return f"function '{fname}' of the library differs from the original's"
        return "the function library (gradients) differs from the original's"
    return f"GraphDef field '{name}' differs from the original's: {_show(getattr(placed, name))} " + (
        f"instead of {_show(getattr(original, name))}"
    )


def _node_difference(node: NodeDef, other: NodeDef) -> str:
    """What differs between two NodeDefs of one name, in a few words."""
    if node.op != other.op:
        return f"op type {node.op} instead of {other.op}"
    if list(node.input) != list(other.input):
        mine, theirs = list(node.input), list(other.input)
        for i, (a, b) in enumerate(zip(mine, theirs)):
            if a != b:
                return f"input #{i} is '{a}' instead of '{b}'"
        return f"{len(mine)} inputs instead of {len(theirs)}"
    if node.attr != other.attr:
        for key in sorted(node.attr.keys() | other.attr.keys()):
            if key not in node.attr:
                return f"attr '{key}' is missing"
            if key not in other.attr:
                return f"attr '{key}' is not in the original ({_show(node.attr[key])})"
            if node.attr[key] != other.attr[key]:
                return f"attr '{key}' is {_show(node.attr[key])} instead of {_show(other.attr[key])}"
    for descriptor in type(node).DESCRIPTOR.fields:
        name = descriptor.name
        if name not in ("name", "op", "input", "attr", "device") and getattr(node, name) != getattr(
            other, name
        ):
            return f"field '{name}' differs"
    return "differs (in fields unknown to baechi's schema)"


def _show(value: Any, limit: int = 80) -> str:
    """A protobuf message or scalar on one short line."""
    from google.protobuf import message, text_format

    if isinstance(value, message.Message):
        text = text_format.MessageToString(value, as_one_line=True) or "{}"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- run check ----------------------------------------------------------------


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VerifyResult:
        data = dict(data)
        data["misplaced"] = [tuple(m) for m in data.get("misplaced", [])]
        return cls(**data)

    def problems(self) -> list[str]:
        """One line per problem the run found."""
        lines = []
        if self.error:
            lines.append(f"TensorFlow run: {self.error}")
        if self.loss_placed and self.loss_reference and not self.losses_equal:
            lines.append(f"the loss differs: {self.loss_placed} placed, {self.loss_reference} reference")
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
    load_sidecar(sidecar_path)
    require_tensorflow()

    # The child must import this package even when it is not installed.
    package_root = str(Path(__file__).resolve().parent.parent)
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
        error=_shorten(f"verification subprocess failed (exit {proc.returncode}): {reason}"),
        **context,
    )


def require_tensorflow() -> None:
    """Raise MissingDependencyError (exit 5) unless TensorFlow can be imported; never imports it."""
    if importlib.util.find_spec("tensorflow") is None:
        raise MissingDependencyError(
            "verify --run needs TensorFlow: pip install 'baechi[tf]' (the static checks do not)"
        )


def load_sidecar(path: str) -> dict[str, Any]:
    """Read and validate a sidecar JSON; raises InputError naming the file."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError("no such file", path=path) from None
    except (OSError, ValueError) as exc:
        raise InputError(f"not a readable JSON sidecar: {exc}", path=path) from None
    if not isinstance(data, dict):
        raise InputError("sidecar must be a JSON object", path=path)
    for key in ("inputs", "loss", "train_op", "init_op"):
        if key not in data:
            raise InputError(f"sidecar lacks '{key}'", path=path)
    if not isinstance(data["inputs"], list):
        raise InputError("sidecar 'inputs' must be a list", path=path)
    for entry in data["inputs"]:
        if not isinstance(entry, dict) or not {"name", "dtype", "shape"} <= entry.keys():
            raise InputError(f"sidecar input {entry!r} needs name, dtype and shape", path=path)
    return data


def default_sidecar(placed: str, original: str | None = None) -> str:
    """``<stem>.json`` beside the original (beside ``placed`` without one); InputError when absent."""
    model = original if original is not None else placed
    candidate = Path(model).with_suffix(".json")
    if not candidate.is_file():
        raise InputError(
            f"--run needs a sidecar JSON (inputs, loss, train_op, init_op) and there is no {candidate} "
            "beside it; pass --sidecar",
            path=model,
        )
    return str(candidate)


def shorten_tf_message(message: str) -> str:
    """The informative line of a TensorFlow error message, at most a few hundred chars."""
    for line in message.splitlines():
        line = line.strip()
        if not line or line.startswith(("[[", "Detected at node", "Node:", "Graph execution error")):
            continue
        # Drop the trailing "[[{{node x}}]]" TF appends, and unwrap {{node x}}.
        line = re.sub(r"\s*\[\[.*\]\]\s*$", "", line)
        return _shorten(re.sub(r"\{\{(?:node|colocation_node) ([^}]*)\}\}", r"\1", line))
    return _shorten(message)


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 3] + "..."


# --- both ---------------------------------------------------------------------


@dataclass
class VerifyReport:
    """What ``baechi verify`` found: the static check and, with ``--run``, the run."""

    static: StaticResult
    run: VerifyResult | None = None

    @property
    def ok(self) -> bool:
        return self.static.ok and (self.run is None or self.run.ok)

    def problems(self) -> list[str]:
        return self.static.problems() + (self.run.problems() if self.run is not None else [])

    def problems_count(self) -> int:
        run = len(self.run.problems()) if self.run is not None else 0
        return self.static.problems_count() + run

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "ok": self.ok,
            "placed": self.static.placed,
            "original": self.static.original,
            "static": self.static.to_json(),
            "run": self.run.to_json() if self.run is not None else None,
        }


def verify_graph(
    placed: str,
    *,
    original: str | None = None,
    run: bool = False,
    sidecar: str | None = None,
    num_devices: int | None = None,
    steps: int = 1,
    reference_loss: list[float] | None = None,
) -> VerifyReport:
    """The static check, then with ``run`` the TensorFlow run (``baechi verify``).

    Run defaults: the sidecar from :func:`default_sidecar`, as many devices as
    the placed graph uses; ``reference_loss`` as in :func:`verify_placed_graph`. Raises InputError for bad input (including fewer
    ``num_devices`` than the placement uses) and MissingDependencyError when
    ``run`` needs TensorFlow and it is not installed.
    """
    if run:
        require_tensorflow()  # before the static check: fail fast
    static = static_check(placed, original)
    if not run:
        return VerifyReport(static)
    sidecar = sidecar if sidecar is not None else default_sidecar(placed, original)
    needed = max(static.num_devices, 1)
    if num_devices is None:
        num_devices = needed
    elif num_devices < needed:
        raise InputError(
            f"the placement uses {needed} devices (up to index {needed - 1}) but --devices is {num_devices}",
            path=placed,
        )
    result = verify_placed_graph(
        placed, sidecar, num_devices, steps=steps, original_path=original, reference_loss=reference_loss
    )
    return VerifyReport(static, result)


# --- rendering ----------------------------------------------------------------


def render_report(console: Any, report: VerifyReport, shown: int = SHOWN) -> None:
    """Print ``report`` on a rich console: one line per check, then the problems.

    On a terminal the verdicts are coloured marks; elsewhere plain ``ok`` /
    ``FAIL`` words, so logs stay greppable.
    """
    from rich.markup import escape

    printer = SummaryPrinter(console)
    say, verdict = printer.say, printer.verdict
    static, run = report.static, report.run

    devices = ", ".join(f"{escape(d)} {n}" for d, n in static.devices.items()) or "none"
    say(
        f"[bold]{escape(static.placed)}[/]: {static.ops_total} ops on {len(static.devices)} "
        f"device{'s' if len(static.devices) != 1 else ''} ({devices})"
    )
    if static.original is not None:
        original = escape(static.original)
        if static.differences_count:
            verdict(False, f"{static.differences_count} difference(s) from {original}")
        else:
            verdict(True, f"same graph as {original}, device fields aside")
    if static.without_device_count:
        verdict(False, f"{static.without_device_count} of {static.ops_total} ops have no device")
    else:
        verdict(True, "every op has a device")
    total = sum(static.constraints.values())
    kinds = ", ".join(f"{n} {kind}" for kind, n in static.constraints.items() if n)
    if static.violations_count:
        verdict(False, f"{static.violations_count} of {total} colocation constraints broken ({kinds})")
    elif total:
        verdict(True, f"all {total} colocation constraints hold ({kinds})")
    elif not static.without_device_count:
        verdict(True, "no colocation constraints")
    if run is not None:
        verdict(run.ok, _run_summary(run, static.original is not None))
    printer.outcome(report, shown)


class SummaryPrinter:
    """The lines of a ``baechi verify`` summary (GraphDef or ONNX) on a rich console.

    On a terminal verdicts are coloured marks; elsewhere plain ``ok`` / ``FAIL``
    words, so logs stay greppable. Text is rich markup: callers escape names.
    """

    def __init__(self, console: Any) -> None:
        self.console = console
        self.fancy = console.is_terminal

    def say(self, text: str) -> None:
        self.console.print(text, soft_wrap=True)  # long op names stay on one line

    def verdict(self, ok: bool, text: str) -> None:
        if self.fancy:
            mark = "[green]✓[/]" if ok else "[bold red]✗[/]"
        else:
            mark = "ok  " if ok else "FAIL"
        self.say(f"{mark} {text}")

    def outcome(self, report: VerifyReport, shown: int) -> None:
        """The end of a summary: the first ``shown`` problems, then verified or FAILED."""
        from rich.markup import escape

        say, fancy = self.say, self.fancy
        problems = report.problems()
        if problems:
            say("problems:")
            for line in problems[:shown]:
                say(f"  {escape(line)}")
            more = report.problems_count() - min(len(problems), shown)
            if more > 0:
                say(f"  ... and {more} more")
        if report.ok:
            say("[bold green]verified[/]" if fancy else "verified")
        else:
            count = report.problems_count()
            text = f"FAILED: {count} problem{'s' if count != 1 else ''}"
            say(f"[bold red]{text}[/]" if fancy else text)


def _run_summary(run: VerifyResult, has_original: bool) -> str:
    from rich.markup import escape

    where = f"{run.steps} step{'s' if run.steps != 1 else ''} on {run.num_devices} CPU devices"
    if run.error and not run.loss_placed:
        return f"TensorFlow run ({where}) failed"
    reference = "original's" if has_original else "unplaced graph's"
    losses = ", ".join(f"{x:.6g}" for x in run.loss_placed)
    if run.losses_bitwise_equal:
        loss = f"loss {losses} equal to the {reference} (bitwise)"
    elif run.losses_equal:
        loss = f"loss {losses} equal to the {reference} (within {RELATIVE_TOLERANCE:g})"
    else:
        loss = f"loss {losses} DIFFERS from the {reference}"
    placed_ok = run.ops_checked - len(run.misplaced)
    return escape(
        f"TensorFlow ({where}): {loss}; {placed_ok} of {run.ops_checked} ops that ran did so where placed"
    )


# --- the subprocess side ------------------------------------------------------


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
    import numpy as np

    rng = np.random.RandomState(int(sidecar.get("seed", 0)))
    feeds = []
    for _ in range(steps):
        batch = {}
        for entry in sidecar["inputs"]:
            dtype = np.dtype(entry["dtype"])
            shape = [int(d) for d in entry["shape"]]
            if dtype.kind in "iu":
                low, high = entry.get("range", [0, 2])
                batch[entry["name"]] = rng.randint(low, high, size=shape).astype(dtype)
            elif dtype.kind == "b":
                batch[entry["name"]] = rng.rand(*shape) < 0.5
            else:
                batch[entry["name"]] = rng.standard_normal(shape).astype(dtype)
        feeds.append(batch)
    return feeds


def _session_config(tf: Any, num_devices: int) -> Any:
    config = tf.compat.v1.ConfigProto(
        allow_soft_placement=False, log_device_placement=False, device_count={"CPU": num_devices}
    )
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
    return config


def _run(
    tf: Any,
    graph_def: Any,
    devices: dict[str, str],
    sidecar: dict[str, Any],
    feeds: list[dict[str, Any]],
    config: Any,
) -> tuple[list[float], dict[str, set[str]]]:
    """Run init + len(feeds) training steps; (losses, node name -> devices it ran on)."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
        for op in graph.get_operations():
            # import_graph_def moved every _class member to its target's device.
            op._set_device(devices.get(op.name, ""))
    ran_on: dict[str, set[str]] = {}
    losses: list[float] = []
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        for step in range(len(feeds) + 1):
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
    return losses, ran_on


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

    feeds = _make_feeds(sidecar, steps)
    config = _session_config(tf, num_devices)
    # Any exception here is TF rejecting or failing the graph; it becomes the
    # result's one-line error, never a traceback.
    if reference_loss is not None:
        result.loss_reference = list(reference_loss)
    else:
        reference = graph_pb2.GraphDef()
        reference.CopyFrom(_load_graph_def(graph_pb2, original_path) if original_path else placed)
        for node in reference.node:
            node.device = ""
        try:
            result.loss_reference, _ = _run(tf, reference, {}, sidecar, feeds, config)
        except Exception as exc:
            which = "the original graph" if original_path else "the unplaced graph"
            result.error = f"{which} does not run: {_tf_error(exc)}"
            return result
        del reference
    try:
        result.loss_placed, ran_on = _run(tf, mapped, requested, sidecar, feeds, config)
    except Exception as exc:
        result.error = _tf_error(exc)
        return result

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
    result.ok = result.losses_equal and not result.misplaced and result.ops_checked > 0
    if result.ops_checked == 0:
        result.error = "no op with a requested device ran, so nothing was checked"
    return result


def render(result: VerifyResult) -> str:
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
    for op, requested, actual in result.misplaced[:20]:
        lines.append(f"misplaced: {op}: requested {requested}, ran on {actual}")
    if len(result.misplaced) > 20:
        lines.append(f"... and {len(result.misplaced) - 20} more misplaced ops")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
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
        require_tensorflow()
        result = check(
            args.placed, args.sidecar, args.devices, args.steps, args.original, args.reference_loss
        )
    except BaechiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(result.to_json()) if args.json else render(result))
    return EXIT_OK if result.ok else EXIT_VERIFY_FAILED


if __name__ == "__main__":
    sys.exit(main())
