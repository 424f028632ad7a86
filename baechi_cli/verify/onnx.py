"""Check a placed ONNX model: statically against its original, and by running it in onnxruntime.

``baechi verify PLACED.onnx [--original MODEL.onnx] [--run]`` reaches :func:`verify_onnx`,
which returns an :class:`OnnxVerifyReport` (``baechi.verify/v1`` as JSON, with
``"format": "onnx"``); :func:`baechi_cli.cli.render.verify.render_onnx_report` prints it.
What a placed model is: :func:`baechi_cli.io.onnx.write_placed_onnx`. Differences are
counted and kept as :mod:`baechi_cli.verify.diff` does for GraphDefs.

Static check (:func:`static_check_onnx`, never imports onnxruntime):

* PLACED (and the original) parse as a ``ModelProto`` with at least one node, else
  :class:`~baechi_cli.core.errors.InputError`; ``onnx.checker`` passes (absent external
  weights checked as graph inputs of their type, as ``baechi place`` does: ``checker_note``);
* every top-level node carries a device (a ``"baechi"`` ``device_configurations`` entry or
  ``baechi.device`` metadata), and the annotations agree: one ``"baechi"`` configuration
  of distinct devices, each node's sharding specs naming one of its devices, the same as
  its metadata, and only tensors the node reads or writes (one problem per node);
* with an original: once what the writer adds is removed from both, the models are
  equal, and ``ir_version`` is the original's raised to at least 11. Nodes are matched by
  label (name, else ``<op_type>_<index>``); each difference is one line.

Run check (:func:`run_check_onnx`, needs onnxruntime): PLACED and a reference (the
original, else PLACED with the annotations removed, which shows that they change nothing
onnxruntime computes) run on the CPU (``use_deterministic_compute``) with the same
synthetic feeds from ``numpy.random.default_rng(SEED)``: floats standard normal, integers
in ``[0, 2)`` (valid indices into any table of two or more rows), bools uniform; other
element types, and absent external weights, are an InputError. Symbolic dims take
``dims[name]``, else (axis 0) ``batch_size``, else 1 (listed in ``dims_defaulted``). Every
output must be identical (``numpy.array_equal``, NaN equal to NaN; else
``max_abs_diff``). Failures are results: a model onnxruntime cannot load or run comes back
with ``ok=False`` and ``error``.

Complexity: the static check is O(model size) (parsing, the checker, and
one comparison of each field); the run is two onnxruntime sessions and one
inference each.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from baechi_cli.core.errors import InputError, MissingDependencyError, one_line, truncate
from baechi_cli.io.onnx import (
    CONFIGURATION,
    DEVICE_KEY,
    MESSAGE_LIMIT,
    MULTI_DEVICE_IR_VERSION,
    check_model,
    parse_model,
)
from baechi_cli.verify.diff import KEEP, Differences, name_differences
from baechi_cli.verify.report import VerifyReport

if TYPE_CHECKING:
    import numpy as np
    from onnx import ModelProto, NodeProto

#: Seed of the feeds of ``--run``.
SEED = 0
#: Integer feeds are drawn uniformly from ``[low, high)``.
INT_RANGE = (0, 2)
PROVIDER = "CPUExecutionProvider"
_UNANNOTATED = " without baechi's annotations"
_INSTALL_HINT = (
    "verify --run on an ONNX model needs onnxruntime: pip install 'baechi[onnx]' (the static checks do not)"
)


# --- results ------------------------------------------------------------------


@dataclass
class OnnxStaticResult:
    """Outcome of :func:`static_check_onnx`; ``ok`` is the verdict.

    Lists keep the first :data:`~baechi_cli.verify.diff.KEEP` entries; the
    ``*_count`` fields count them all. ``ops_total`` counts the top-level
    nodes, ``devices`` them by device name; ``configuration`` is the
    ``"baechi"`` configuration's device list and ``num_devices`` its length.
    ``checker`` is the checker's message when it fails, else None.
    """

    ok: bool
    placed: str
    original: str | None = None
    ops_total: int = 0
    devices: dict[str, int] = field(default_factory=dict)
    num_devices: int = 0
    configuration: list[str] = field(default_factory=list)
    checker: str | None = None
    checker_note: str | None = None
    differences: list[str] = field(default_factory=list)
    differences_count: int = 0
    without_device: list[str] = field(default_factory=list)
    without_device_count: int = 0
    annotation_problems: list[str] = field(default_factory=list)
    annotation_problems_count: int = 0

    def problems(self) -> list[str]:
        """One line per problem kept: the checker, differences, nodes without a device, annotations."""
        lines = [f"fails the ONNX checker: {self.checker}"] if self.checker is not None else []
        lines.extend(self.differences)
        if self.without_device:
            shown = ", ".join(f"'{n}'" for n in self.without_device[:5])
            more = f" and {self.without_device_count - 5} more" if self.without_device_count > 5 else ""
            lines.append(f"{self.without_device_count} node(s) have no device: {shown}{more}")
        lines.extend(self.annotation_problems)
        return lines

    def problems_count(self) -> int:
        return (
            (self.checker is not None)
            + self.differences_count
            + (1 if self.without_device_count else 0)
            + self.annotation_problems_count
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class OutputComparison:
    """One output of PLACED against the reference's output at the same position."""

    name: str
    identical: bool
    max_abs_diff: float | None = None  # None when identical or not comparable (shape, dtype)
    detail: str | None = None  # what differs when not comparable


@dataclass
class OnnxRunResult:
    """Outcome of :func:`run_check_onnx`; ``ok``: every output identical and no error.

    ``reference`` is the original's path, or ``"<PLACED> without baechi's
    annotations"``. ``inputs`` maps each fed input to its dtype and shape.
    """

    ok: bool
    reference: str
    seed: int = SEED
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    dims_defaulted: list[str] = field(default_factory=list)
    outputs: list[OutputComparison] = field(default_factory=list)
    error: str | None = None

    def problems(self) -> list[str]:
        """One line per problem the run found."""
        if self.error:
            return [f"onnxruntime: {self.error}"]
        lines = []
        for out in self.outputs:
            if out.identical:
                continue
            how = out.detail or f"max abs difference {out.max_abs_diff:.6g}"
            lines.append(f"output '{out.name}' differs from the reference's: {how}")
        return lines

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class OnnxVerifyReport(VerifyReport):
    """What ``baechi verify`` found on an ONNX model: the static check and, with ``--run``, the run."""

    static: OnnxStaticResult
    run: OnnxRunResult | None = None

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "format": "onnx"}


# --- entry points -------------------------------------------------------------


def verify_onnx(
    placed: str,
    *,
    original: str | None = None,
    run: bool = False,
    batch_size: int | None = None,
    dims: Mapping[str, int] | None = None,
) -> OnnxVerifyReport:
    """The static check, then with ``run`` the onnxruntime run (``baechi verify PLACED.onnx``).

    Raises InputError for bad input (unreadable or non-ONNX files, feeds that
    cannot be made, absent weights with ``run``) and MissingDependencyError
    when ``run`` needs onnxruntime and it is not installed.
    """
    if run:
        require_onnxruntime()  # before the static check: fail fast
    static = static_check_onnx(placed, original)
    if not run:
        return OnnxVerifyReport(static)
    return OnnxVerifyReport(static, run_check_onnx(placed, original, batch_size=batch_size, dims=dims))


def require_onnxruntime() -> None:
    """Raise MissingDependencyError (exit 5) unless onnxruntime can be imported; never imports it."""
    if importlib.util.find_spec("onnxruntime") is None:
        raise MissingDependencyError(_INSTALL_HINT)


def load_model(path: str) -> ModelProto:
    """``path`` parsed as an ONNX model, external data not loaded; InputError naming it otherwise. O(size)."""
    from baechi_cli.io.files import read_input

    data = read_input(path, "ONNX")
    try:
        return parse_model(data)
    except InputError as err:
        raise err.with_path(path) from None


# --- static check -------------------------------------------------------------


def static_check_onnx(placed: str, original: str | None = None) -> OnnxStaticResult:
    """Check ``placed`` without onnxruntime (see the module docstring). O(model size)."""
    placed_model = load_model(placed)
    original_model = load_model(original) if original is not None else None
    result = OnnxStaticResult(
        ok=False, placed=placed, original=original, ops_total=len(placed_model.graph.node)
    )
    result.checker, result.checker_note = _run_checker(placed_model, placed)
    _check_annotations(placed_model, result)
    if original_model is not None:
        result.differences_count, result.differences = _compare_models(placed_model, original_model)
    result.ok = result.problems_count() == 0
    return result


def _external_tensors(model: ModelProto, base_dir: str) -> tuple[set[str], list[str]]:
    """(top-level initializers stored externally, the external files absent from ``base_dir``)."""
    from onnx import TensorProto
    from onnx.external_data_helper import _get_all_tensors

    locations = {
        e.value
        for t in _get_all_tensors(model)
        if t.data_location == TensorProto.EXTERNAL
        for e in t.external_data
        if e.key == "location"
    }
    missing = sorted(loc for loc in locations if not os.path.isfile(os.path.join(base_dir, loc)))
    external = {t.name for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    return external, missing


def _run_checker(model: ModelProto, path: str) -> tuple[str | None, str | None]:
    """(the checker's message or None, a note when external weights are absent)."""
    import onnx

    external, missing = _external_tensors(model, os.path.dirname(os.path.abspath(path)))
    if missing:
        note = f"external weights absent ({', '.join(missing)}): structure checked without them"
        try:
            check_model(model, external)
        except InputError as err:
            return err.problem.removeprefix("fails the ONNX checker: "), note
        return None, note
    try:
        onnx.checker.check_model(path, full_check=False)
    except Exception as err:  # ValidationError, or ValueError for a model over 2 GB
        return one_line(err, MESSAGE_LIMIT), None
    return None, None


def _label(node: NodeProto, index: int) -> str:
    """The node's name, else ``<op_type>_<index>`` (the op name ``baechi place`` gives it)."""
    return node.name or f"{node.op_type}_{index}"


def _check_annotations(model: ModelProto, result: OnnxStaticResult) -> None:
    """Fill ``devices``, ``configuration``, ``without_device`` and ``annotation_problems``. O(model)."""
    problems: list[str] = []
    configs = [c for c in model.configuration if c.name == CONFIGURATION]
    devices = list(configs[0].device) if configs else []
    if not configs:
        problems.append(f"the model has no device configuration named '{CONFIGURATION}'")
    elif len(configs) > 1:
        problems.append(f"{len(configs)} device configurations are named '{CONFIGURATION}'")
    elif configs[0].num_devices != len(devices):
        problems.append(
            f"configuration '{CONFIGURATION}' says num_devices {configs[0].num_devices} "
            f"but lists {len(devices)} devices"
        )
    elif len(set(devices)) != len(devices):
        twice = next(d for d in devices if devices.count(d) > 1)
        problems.append(f"configuration '{CONFIGURATION}' lists device {twice} twice")
    result.configuration, result.num_devices = devices, len(devices)

    used: dict[str, int] = {}
    for index, node in enumerate(model.graph.node):
        label = _label(node, index)
        device, problem = _node_device(node, devices, bool(configs))
        if device is None and problem is None:
            result.without_device_count += 1
            if len(result.without_device) < KEEP:
                result.without_device.append(label)
        if device is not None:
            used[device] = used.get(device, 0) + 1
        if problem is not None:
            problems.append(f"node '{label}': {problem}")
    result.devices = dict(sorted(used.items()))
    result.annotation_problems_count = len(problems)
    result.annotation_problems = problems[:KEEP]


def _node_device(node: NodeProto, devices: list[str], configured: bool) -> tuple[str | None, str | None]:
    """(the node's device, the first problem with its annotations); (None, None): it has none."""
    meta = [p.value for p in node.metadata_props if p.key == DEVICE_KEY]
    entries = [c for c in node.device_configurations if c.configuration_id == CONFIGURATION]
    device = meta[0] if meta else None
    if len(meta) > 1:
        return device, f"{len(meta)} '{DEVICE_KEY}' metadata entries"
    if len(entries) > 1:
        return device, f"{len(entries)} device_configurations entries for '{CONFIGURATION}'"
    if not entries:
        if device is None:
            return None, None
        return device, f"'{DEVICE_KEY}' says {device} but it has no device_configurations entry"
    indices = sorted({k for spec in entries[0].sharding_spec for k in spec.device})
    if not indices:
        return device, "its device_configurations entry names no device"
    if len(indices) > 1:
        return device, f"its device_configurations name several devices (indices {indices})"
    k = indices[0]
    if not configured:
        return device, f"its device_configurations name device index {k} of no configuration"
    if not 0 <= k < len(devices):
        return device, (
            f"its device_configurations name device index {k}, but configuration "
            f"'{CONFIGURATION}' lists {len(devices)} devices"
        )
    if device is None:
        return devices[k], f"device_configurations say {devices[k]} (index {k}) but it has no '{DEVICE_KEY}'"
    if devices[k] != device:
        return device, f"device_configurations say {devices[k]} (index {k}) but '{DEVICE_KEY}' says {device}"
    tensors = {t for t in (*node.input, *node.output) if t}
    stray = next((s.tensor_name for s in entries[0].sharding_spec if s.tensor_name not in tensors), None)
    if stray is not None:
        return device, f"a sharding spec names tensor '{stray}', which the node neither reads nor writes"
    return device, None


# --- comparison with the original ---------------------------------------------


def strip_annotations(model: ModelProto) -> None:
    """Remove, in place, what :func:`~baechi_cli.io.onnx.write_placed_onnx` adds (``ir_version`` aside):
    the ``"baechi"`` configuration and each top-level node's ``"baechi"`` entry and
    ``baechi.device`` metadata. O(nodes)."""
    _drop(model.configuration, lambda c: c.name == CONFIGURATION)
    for node in model.graph.node:
        _drop(node.device_configurations, lambda c: c.configuration_id == CONFIGURATION)
        _drop(node.metadata_props, lambda e: e.key == DEVICE_KEY)


def _drop(entries: Any, match: Callable[[Any], bool]) -> None:
    """Delete the entries of a repeated protobuf field that ``match``. O(len(entries))."""
    for i in reversed([i for i, e in enumerate(entries) if match(e)]):
        del entries[i]


def _compare_models(placed: ModelProto, original: ModelProto) -> tuple[int, list[str]]:
    """(number of differences, the first :data:`KEEP` as lines), baechi's annotations aside.

    Strips both models' annotations and sets placed's ``ir_version`` to the
    original's, in place. O(model size).
    """
    differences = Differences()
    note = differences.note

    expected_ir = max(original.ir_version, MULTI_DEVICE_IR_VERSION)
    if placed.ir_version != expected_ir:
        note(
            f"ir_version is {placed.ir_version}; placing the original's {original.ir_version} "
            f"gives {expected_ir}"
        )
    placed.ir_version = original.ir_version
    strip_annotations(placed)
    strip_annotations(original)
    for descriptor in type(placed).DESCRIPTOR.fields:
        name = descriptor.name
        if name != "graph" and getattr(placed, name) != getattr(original, name):
            note(f"model field '{name}' differs from the original's: {_show(getattr(placed, name))}")
    mine, theirs = placed.graph, original.graph
    for descriptor in type(mine).DESCRIPTOR.fields:
        name = descriptor.name
        if name != "node" and getattr(mine, name) != getattr(theirs, name):
            note(_graph_field_difference(getattr(mine, name), getattr(theirs, name), name))

    placed_labels = [_label(n, i) for i, n in enumerate(mine.node)]
    original_labels = [_label(n, i) for i, n in enumerate(theirs.node)]
    for line in name_differences(placed_labels, original_labels, "node"):
        note(line)
    by_label: dict[str, NodeProto] = {}
    for label, node in zip(original_labels, theirs.node, strict=True):
        by_label.setdefault(label, node)
    for label, node in zip(placed_labels, mine.node, strict=True):
        other = by_label.pop(label, None)
        if other is not None and node != other:
            note(f"node '{label}': {_node_difference(node, other)}")
    return differences.count, differences.found


def _graph_field_difference(mine: Any, theirs: Any, name: str) -> str:
    """A line about GraphProto field ``name``; entries of named lists (initializers, ...) are named."""
    if name in ("initializer", "input", "output", "value_info", "sparse_initializer"):

        def key(entry: Any) -> str:
            return entry.values.name if name == "sparse_initializer" else entry.name

        what = name.replace("_", " ")
        ours, others = {key(e): e for e in mine}, {key(e): e for e in theirs}
        for entry_name in [key(e) for e in theirs]:
            if entry_name not in ours:
                return f"graph {what} '{entry_name}' of the original is missing"
        for entry_name in [key(e) for e in mine]:
            if entry_name not in others:
                return f"graph {what} '{entry_name}' is not in the original"
            if ours[entry_name] != others[entry_name]:
                return f"graph {what} '{entry_name}' differs from the original's"
        return f"the graph's {what} entries are in another order than the original's"
    return f"graph field '{name}' differs from the original's: {_show(mine)}"


def _node_difference(node: NodeProto, other: NodeProto) -> str:
    """What differs between two nodes of one label, in a few words."""
    from onnx.helper import printable_attribute

    if (node.domain, node.op_type) != (other.domain, other.op_type):
        return f"op type {_op_type(node)} instead of {_op_type(other)}"
    for what in ("input", "output"):
        mine, theirs = list(getattr(node, what)), list(getattr(other, what))
        for i, (a, b) in enumerate(zip(mine, theirs, strict=False)):
            if a != b:
                return f"{what} #{i} is '{a}' instead of '{b}'"
        if len(mine) != len(theirs):
            return f"{len(mine)} {what}s instead of {len(theirs)}"
    ours, others = {a.name: a for a in node.attribute}, {a.name: a for a in other.attribute}
    for key in sorted(ours.keys() | others.keys()):
        if key not in ours:
            return f"attribute '{key}' is missing"
        if key not in others:
            return f"attribute '{key}' is not in the original ({printable_attribute(ours[key])})"
        if ours[key] != others[key]:
            mine_text, theirs_text = printable_attribute(ours[key]), printable_attribute(others[key])
            if mine_text == theirs_text:
                return f"attribute '{key}' differs from the original's ({_show(mine_text)})"
            return f"attribute {_show(mine_text)} instead of {_show(theirs_text)}"
    for descriptor in type(node).DESCRIPTOR.fields:
        name = descriptor.name
        if getattr(node, name) != getattr(other, name):
            return f"field '{name}' differs from the original's: {_show(getattr(node, name))}"
    return "differs from the original's"  # unknown fields, or attributes in another order


def _op_type(node: NodeProto) -> str:
    return f"{node.domain}.{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type


def _show(value: Any, limit: int = 80) -> str:
    """A protobuf message, repeated field or scalar on one short line."""
    from google.protobuf import message, text_format

    if isinstance(value, message.Message):
        text = text_format.MessageToString(value, as_one_line=True) or "{}"
    elif hasattr(value, "__len__") and not isinstance(value, str | bytes):
        text = "[" + ", ".join(_show(v, limit) for v in value) + "]"
    else:
        text = str(value)
    return truncate(text, limit)


# --- run check ----------------------------------------------------------------


def run_check_onnx(
    placed: str,
    original: str | None = None,
    *,
    batch_size: int | None = None,
    dims: Mapping[str, int] | None = None,
) -> OnnxRunResult:
    """Run PLACED and the reference in onnxruntime; compare the outputs (see the module docstring).

    Raises InputError for unreadable models, absent external weights, a
    ``dims`` name no graph input has, or an input no feed can be made for;
    MissingDependencyError without onnxruntime. Everything onnxruntime
    rejects is a failed result. O(two sessions and one inference each).
    """
    require_onnxruntime()
    import numpy as np

    models = [(placed, load_model(placed))]
    if original is not None:
        models.append((original, load_model(original)))
    for path, model in models:
        _, missing = _external_tensors(model, os.path.dirname(os.path.abspath(path)))
        if missing:
            raise InputError(
                f"--run needs the external weights beside the model: {', '.join(missing)} absent", path=path
            )
    shapes, defaulted = _feed_shapes(models[0][1], batch_size, dict(dims or {}))
    rng = np.random.default_rng(SEED)
    feeds = {name: _random(rng, dtype, shape) for name, (dtype, shape) in shapes.items()}
    result = OnnxRunResult(
        ok=False,
        reference=original if original is not None else placed + _UNANNOTATED,
        inputs={name: {"dtype": str(a.dtype), "shape": list(a.shape)} for name, a in feeds.items()},
        dims_defaulted=defaulted,
    )
    if original is not None:
        reference_model: str | bytes = original
        reference_dir = os.path.dirname(os.path.abspath(original))
    else:
        stripped = models[0][1]
        strip_annotations(stripped)
        reference_model = stripped.SerializeToString()
        reference_dir = os.path.dirname(os.path.abspath(placed))
    try:
        expected, _ = _infer(reference_model, reference_dir, feeds)
    except Exception as err:  # onnxruntime's Fail, InvalidArgument, ...
        which = "the original" if original is not None else "the model without baechi's annotations"
        result.error = f"{which} does not run: {one_line(err, MESSAGE_LIMIT)}"
        return result
    try:
        got, names = _infer(placed, os.path.dirname(os.path.abspath(placed)), feeds)
    except Exception as err:
        result.error = f"the placed model does not run: {one_line(err, MESSAGE_LIMIT)}"
        return result
    if len(got) != len(expected):
        result.error = f"the placed model has {len(got)} outputs, the reference {len(expected)}"
        return result
    result.outputs = [_compare_output(n, a, b) for n, a, b in zip(names, got, expected, strict=True)]
    result.ok = all(o.identical for o in result.outputs)
    return result


def _infer(model: str | bytes, base_dir: str, feeds: dict[str, Any]) -> tuple[list[Any], list[str]]:
    """The outputs of one onnxruntime CPU inference of ``model`` (a path, or bytes whose external
    data lies in ``base_dir``), and their names."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.use_deterministic_compute = True
    options.log_severity_level = 3  # errors only: they come back as exceptions anyway
    if isinstance(model, bytes):  # external data resolves against the working directory otherwise
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", base_dir)
    session = ort.InferenceSession(model, options, providers=[PROVIDER])
    outputs = session.run(None, feeds)
    return outputs, [o.name for o in session.get_outputs()]


def _feed_shapes(
    model: ModelProto, batch_size: int | None, dims: dict[str, int]
) -> tuple[dict[str, tuple[np.dtype, tuple[int, ...]]], list[str]]:
    """(input name -> (numpy dtype, shape), the dims bound to 1 by default) for each fed graph input."""
    import numpy as np
    from onnx.helper import tensor_dtype_to_np_dtype

    graph = model.graph
    inits = {t.name for t in graph.initializer} | {s.values.name for s in graph.sparse_initializer}
    fed = [info for info in graph.input if info.name not in inits]
    named = {d.dim_param for info in fed for d in info.type.tensor_type.shape.dim if d.dim_param}
    unknown = sorted(set(dims) - named)
    if unknown:
        raise InputError(
            f"--dim {unknown[0]}: no graph input has a symbolic dim of that name "
            f"(theirs: {', '.join(sorted(named)) or 'none'})"
        )
    shapes: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
    defaulted: list[str] = []
    for info in fed:
        kind = info.type.WhichOneof("value")
        tensor = info.type.tensor_type
        if kind != "tensor_type" or not tensor.HasField("shape"):
            what = "unknown rank" if kind == "tensor_type" else f"a {kind or 'missing'} type"
            raise InputError(f"--run cannot make a feed for graph input '{info.name}': it has {what}")
        try:
            dtype = np.dtype(tensor_dtype_to_np_dtype(tensor.elem_type))
        except (KeyError, TypeError):
            dtype = np.dtype(object)
        if dtype.kind not in "biufc":
            raise InputError(
                f"--run cannot make a feed for graph input '{info.name}' of ONNX type {tensor.elem_type}: "
                "it makes numpy numbers and bools only"
            )
        shape = []
        for axis, dim in enumerate(tensor.shape.dim):
            if dim.HasField("dim_value"):
                shape.append(dim.dim_value)
            elif dim.dim_param in dims:
                shape.append(dims[dim.dim_param])
            elif axis == 0 and batch_size is not None:
                shape.append(batch_size)
            else:
                shape.append(1)
                what = dim.dim_param or f"{info.name}[{axis}]"
                if what not in defaulted:
                    defaulted.append(what)
        shapes[info.name] = (dtype, tuple(shape))
    return shapes, defaulted


def _random(rng: Any, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
    """A deterministic feed: bools uniform, integers in :data:`INT_RANGE`, anything else standard normal."""
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(*INT_RANGE, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _compare_output(name: str, got: Any, expected: Any) -> OutputComparison:
    """Identical (NaN equal to NaN), else how far apart."""
    import numpy as np

    a, b = np.asarray(got), np.asarray(expected)
    if a.dtype != b.dtype or a.shape != b.shape:
        return OutputComparison(
            name, False, detail=f"{a.dtype}{list(a.shape)} instead of {b.dtype}{list(b.shape)}"
        )
    if np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
        return OutputComparison(name, True)
    if a.dtype.kind not in "biufc":
        return OutputComparison(name, False, detail="the values differ")
    wide = np.complex128 if a.dtype.kind == "c" else np.float64
    x, y = a.astype(wide), b.astype(wide)
    with np.errstate(invalid="ignore"):  # inf - inf
        diff = np.abs(x - y)
    same = (x == y) | (np.isnan(x) & np.isnan(y))
    diff = np.where(same, 0.0, np.where(np.isnan(diff), np.inf, diff))  # NaN on one side: inf
    return OutputComparison(name, False, max_abs_diff=float(diff.max()))
