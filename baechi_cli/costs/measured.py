"""Measured costs: run a TensorFlow GraphDef on the local device and time every op.

Contract
--------
:func:`measure_graphdef` imports a GraphDef (binary or text, read exactly as
:func:`baechi_cli.io.graphdef.read_graphdef` reads it) into a TF1 graph,
runs ``warmup`` untraced steps and then ``steps`` steps with
``RunOptions(trace_level=FULL_TRACE)``, and returns a :class:`MeasuredRun`
whose ``ops`` maps GraphDef node names to an :class:`OpMeasurement`. Nodes
that did not run in any measured step are absent from ``ops`` and listed in
``not_run`` (GraphDef order): the caller keeps analytic costs for them and
flags them. ``progress(done, total)`` is called after every warmup and
measured step (``total = warmup + steps``). TensorFlow is imported lazily;
without it the call raises :class:`~baechi_cli.core.errors.MissingDependencyError`
(exit 5). Everything else that stops a run -- a graph that cannot run
standalone, a missing init op or batch size, an op failing at run time -- is
an :class:`~baechi_cli.core.errors.InputError` (exit 2) naming the file, the op
where there is one, and the problem on one line.

What runs: the init op (the argument, the sidecar's ``init_op``, a node named ``init``,
else every variable's initializer) once; then, each step, the sidecar's ``train_op`` and
``loss``, else every sink but checkpoint I/O, with one batch of synthetic feeds
(:func:`synthetic_feeds`; :mod:`baechi_cli.io.sidecar` gives dtypes, shapes and ranges).
Devices are cleared and TensorFlow's placer picks one local device. The graph runs as
written (grappler off, no constant folding, no soft placement), so step-stats names are
the GraphDef's, and on one inter-op thread, so each op's time is its time alone on the
device, as the simulator runs a device. oneDNN's rewrite is defaulted off at import; when
it is on, fused kernels are reported on the node that ran them (:attr:`MeasuredRun.fused`).

What is taken from ``RunMetadata.step_stats``: per execution, the kernel's time, each
output's requested bytes, temporary and persistent bytes. A node that runs several times a
step (a while loop's body) gets the sum of its executions; ``compute_us`` is the median
over steps, bytes the maxima. The details, field by field: docs/formats.md, "Measured
profiles".

Complexity: O(V + E) to plan (one pass over the GraphDef, one traversal of
the fetches' ancestors), plus TensorFlow's time for ``warmup + steps``
steps and O(N) Python per traced step over its N step-stats entries;
memory O(V * steps) for the per-step times.
"""

from __future__ import annotations

import difflib
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from baechi_cli.core.errors import InputError, MissingDependencyError
from baechi_cli.io.tfsupport import as_written_config, import_tensorflow, normalize_device, shorten_tf_message

if TYPE_CHECKING:
    import numpy as np

INSTALL_HINT = "pip install 'baechi[tf]'"
#: Seeds the synthetic feeds when the sidecar gives no ``seed``.
DEFAULT_SEED = 0
#: The init op's name by convention (``tf.compat.v1.global_variables_initializer``'s default).
CONVENTIONAL_INIT_OP = "init"
#: TensorFlow messages are cut to this many characters.
MESSAGE_LIMIT = 200

VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable"})
_INITIALIZER_OPS = frozenset({"Assign", "AssignVariableOp"})
_FEED_OPS = frozenset({"Placeholder", "PlaceholderV2"})
_INPUT_OPS = _FEED_OPS | {"PlaceholderWithDefault"}
_CHECKPOINT_OPS = frozenset(
    {"SaveV2", "RestoreV2", "Save", "Restore", "SaveSlices", "RestoreSlice", "MergeV2Checkpoints"}
)
# DataType enum values (tensorflow/core/framework/types.proto) of handles a tf.function captures.
_DT_RESOURCE, _DT_VARIANT = 20, 21
# Set for the TensorFlow import only, unless the user set them (see the module docstring).
_IMPORT_ENV = {"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}
_NODE_IN_MESSAGE_RE = re.compile(r"\{\{node ([^}]+)\}\}|Node: '([^']+)'")


@dataclass(frozen=True)
class OpMeasurement:
    """What the measured steps say about one GraphDef node."""

    compute_us: float
    """Median over the measured steps of the node's time per step (µs); a node
    that runs several times per step (loop body) counts the sum."""
    output_bytes: tuple[int | None, ...]
    """Per output port (as many as the op has), the largest ``requested_bytes``
    TensorFlow recorded; ``None`` where it recorded nothing for that port."""
    temporary_bytes: int | None
    """``memory_stats.temp_memory_size`` (largest over executions); ``None``
    when TensorFlow gave no memory stats for the node."""
    persistent_bytes: int | None
    """``memory_stats.persistent_memory_size`` (largest over executions);
    ``None`` when TensorFlow gave no memory stats for the node."""
    device: str
    """The TensorFlow device it ran on, e.g. ``/device:CPU:0``."""
    runs_per_step: int = 1
    """Executions per step (more than 1 inside a TF1 while loop)."""
    kernel: str = ""
    """The op type TensorFlow ran: the node's own, or a oneDNN kernel (``_MklMatMul``)."""
    fused: tuple[str, ...] = ()
    """Nodes a oneDNN fused kernel absorbed into this one (their time is in ``compute_us``)."""


@dataclass(frozen=True)
class FeedSpec:
    """One synthetic feed: tensor name, TensorFlow dtype name, concrete shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    value_range: tuple[int, int] | tuple[float, float] | None = None
    """Values are drawn uniformly from ``[low, high)`` when given (integers or floats, as the dtype)."""

    def describe(self) -> str:
        """``float32[32,32,32,3]``, say.

        >>> FeedSpec("labels:0", "int64", (32,), (0, 10)).describe()
        'int64[32] in [0, 10)'
        """
        text = f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"
        if self.value_range is not None:
            text += f" in [{self.value_range[0]}, {self.value_range[1]})"
        return text


@dataclass(frozen=True)
class MeasuredRun:
    """The result of :func:`measure_graphdef`."""

    device: str
    """The device measured on, for humans: ``/device:CPU:0 (<CPU model>, 2 CPUs;
    TensorFlow 2.21.0, oneDNN off)`` or ``/device:GPU:0 (<GPU name>; TensorFlow 2.21.0)``."""
    tensorflow: str
    """TensorFlow's version ("" for a PyTorch program, measured in torch)."""
    warmup: int
    steps: int
    batch_size: int | None
    """The batch size in effect for unknown placeholder dims (the argument, else the
    sidecar's); a graph with fixed input shapes runs at its own batch whatever this says."""
    init_op: str | None
    """What initialised the variables: an op name, or ``"<first>/Assign and k more variable
    initializers"``; ``None`` when nothing needed it."""
    fetches: list[str]
    """What each step ran (op or tensor names)."""
    ops: dict[str, OpMeasurement]
    """By GraphDef node name; nodes that never ran in a measured step are absent."""
    not_run: tuple[str, ...] = ()
    """GraphDef nodes absent from ``ops``, in GraphDef order."""
    fused: dict[str, str] = field(default_factory=dict)
    """Absorbed node -> the node whose oneDNN fused kernel ran it (empty with oneDNN off)."""
    feeds: tuple[FeedSpec, ...] = ()
    seed: int = DEFAULT_SEED
    onednn: bool = False
    """Whether any op ran a oneDNN (``_Mkl*``) kernel."""
    step_time_us: float = 0.0
    """Median wall time of one measured ``Session.run`` (tracing included)."""
    sidecar: str | None = None
    """The sidecar JSON used, if any."""
    torch: str = ""
    """torch's version, for a PyTorch program (:mod:`baechi_cli.costs.measured_torch`)."""
    threads: int = 0
    """The CPU threads torch ran with (0: TensorFlow's own choice)."""


def measure_graphdef(
    path: str,
    *,
    batch_size: int | None = None,
    init_op: str | None = None,
    warmup: int = 2,
    steps: int = 10,
    progress: Callable[[int, int], None] | None = None,
) -> MeasuredRun:
    """Run the GraphDef at ``path`` ``warmup + steps`` times and measure every op.

    See the module docstring for what runs, what is measured and the errors.
    """
    if steps < 1:
        raise InputError(f"--steps must be at least 1, got {steps}")
    if warmup < 0:
        raise InputError(f"--warmup must be 0 or more, got {warmup}")
    if batch_size is not None and batch_size < 1:
        raise InputError(f"the batch size must be a positive integer, not {batch_size}")
    tf = _import_tensorflow(path)
    graph_def = _read_graphdef(tf, path)
    sidecar_path, sidecar = _read_sidecar(path)
    plan = _plan(tf, graph_def, path, sidecar_path, sidecar, batch_size=batch_size, init_op=init_op)
    feeds = synthetic_feeds(plan.feeds, plan.seed)
    graph = _import_graph(tf, graph_def, path)
    tallies, walls = _run(tf, graph, plan, feeds, warmup, steps, progress, path)

    node_ops = {node.name: node.op for node in graph_def.node}
    data_inputs = {
        node.name: [_node_name(i) for i in node.input if not i.startswith("^")] for node in graph_def.node
    }
    fed = {_node_name(spec.name) for spec in plan.feeds}
    fused = _absorbed_by_fused_kernels(tallies, node_ops, data_inputs, fed)
    absorbed: dict[str, list[str]] = {}
    for node, by in fused.items():
        absorbed.setdefault(by, []).append(node)
    ops: dict[str, OpMeasurement] = {}
    for name, t in tallies.items():
        ports = len(graph.get_operation_by_name(name).outputs)
        ops[name] = OpMeasurement(
            compute_us=statistics.median(t.step_us),
            output_bytes=tuple(t.outputs.get(port) for port in range(ports)),
            temporary_bytes=t.temporary,
            persistent_bytes=t.persistent,
            device=t.device,
            runs_per_step=t.runs,
            kernel=t.kernel,
            fused=tuple(sorted(absorbed.get(name, ()))),
        )
    onednn = any(t.kernel.startswith("_Mkl") for t in tallies.values())
    return MeasuredRun(
        device=_describe_device(tf, onednn),
        tensorflow=tf.version.VERSION,
        warmup=warmup,
        steps=steps,
        batch_size=plan.batch_size,
        init_op=plan.init_label,
        fetches=list(plan.fetches),
        ops=ops,
        not_run=tuple(node.name for node in graph_def.node if node.name not in ops),
        fused=fused,
        feeds=tuple(plan.feeds),
        seed=plan.seed,
        onednn=onednn,
        step_time_us=statistics.median(walls),
        sidecar=sidecar_path,
    )


def synthetic_feeds(specs: Sequence[FeedSpec], seed: int) -> dict[str, np.ndarray]:
    """Deterministic values for ``specs``: the same specs and seed give the same arrays.

    One ``numpy.random.RandomState(seed)`` draws, in ``specs`` order, ranged
    integers and floats (uniform in ``[low, high)``,
    :func:`~baechi_cli.io.sidecar.range_values`) and floats and complex
    numbers without a range (standard normal); integers without a range are
    zeros, bools false, strings empty. Other dtypes, a range the dtype
    cannot take and a tensor too large to allocate raise InputError.
    """
    import numpy as np

    from baechi_cli.io.sidecar import range_values

    tf = _import_tensorflow(None)
    rng = np.random.RandomState(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        dtype = tf.as_dtype(spec.dtype)
        numpy_dtype = dtype.as_numpy_dtype
        try:
            if spec.value_range is not None:
                value = range_values(rng, spec.name, spec.dtype, spec.shape, spec.value_range)
            elif dtype.is_floating or dtype.is_complex:
                value = np.asarray(rng.standard_normal(spec.shape)).astype(numpy_dtype)
            elif dtype.is_integer:
                value = np.zeros(spec.shape, dtype=numpy_dtype)
            elif dtype.is_bool:
                value = np.zeros(spec.shape, dtype=bool)
            elif dtype == tf.string:
                value = np.full(spec.shape, b"", dtype=object)
            else:
                raise InputError(f"cannot make up a value of type {spec.dtype} to feed '{spec.name}'")
        except (MemoryError, ValueError):  # numpy: "array is too big", or no memory for it
            shape = list(spec.shape)
            raise InputError(
                f"input '{spec.name}' of shape {shape} is too large to make up a value for"
            ) from None
        feeds[spec.name] = value
    return feeds


# ----------------------------------------------------------------- TensorFlow


def _import_tensorflow(path: str | None) -> Any:
    """``import tensorflow``, or MissingDependencyError (exit 5) naming ``path``."""
    first = "tensorflow" not in sys.modules
    saved = {key: os.environ.get(key) for key in _IMPORT_ENV}
    if first:
        for key, value in _IMPORT_ENV.items():
            os.environ.setdefault(key, value)
    try:
        tf = import_tensorflow()  # OR-Tools first: its solvers crash in the other order
    except ImportError as err:
        raise MissingDependencyError(
            f"measuring a profile needs TensorFlow, which cannot be imported ({err}): install the tf "
            f"extra, {INSTALL_HINT}, or profile without --measure for analytic costs",
            path=path,
        ) from None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return tf


def _read_graphdef(tf: Any, path: str) -> Any:
    """TensorFlow's GraphDef of ``path``, parsed as the GraphDef reader parses it."""
    # The reader's parser: the same binary/text detection and one-line errors
    # as `baechi profile` without --measure, so both see the same nodes.
    from baechi_cli.io.graphdef import parse_graphdef_file

    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(parse_graphdef_file(path).SerializeToString())
    return graph_def


def _read_sidecar(path: str) -> tuple[str | None, dict[str, Any] | None]:
    """(path, contents) of ``<model>.json`` beside the model, or (None, None) when there is none."""
    from baechi_cli.io.sidecar import load_sidecar

    candidate = Path(path).with_suffix(".json")
    if candidate == Path(path) or not candidate.is_file():
        return None, None
    where = str(candidate)
    # Every key is optional here, and a -1 dim is filled from the batch size.
    return where, load_sidecar(where, required=(), unknown_dims=True)


def _import_graph(tf: Any, graph_def: Any, path: str) -> Any:
    """A tf.Graph of ``graph_def`` (names unchanged) with every device cleared."""
    for node in graph_def.node:
        node.device = ""  # one local device; TensorFlow's placer picks it
    graph = tf.Graph()
    try:
        with graph.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
    except (ValueError, TypeError, tf.errors.OpError) as err:  # unknown op types, bad inputs, ...
        raise InputError(
            f"TensorFlow cannot import the graph: {shorten_tf_message(str(err), MESSAGE_LIMIT)}", path=path
        ) from None
    return graph


def _session_config(tf: Any) -> Any:
    """Run the graph as written: no grappler, no classic optimizations, no soft placement."""
    from tensorflow.core.protobuf import rewriter_config_pb2

    # One op at a time, as the simulator runs a device: with TensorFlow's
    # default inter-op pool, independent ops overlap and each one's wall time
    # absorbs the others' contention for the cores, so per-op times would sum
    # to more than the step. Each op keeps the intra-op pool.
    config = as_written_config(tf)
    config.inter_op_parallelism_threads = 1
    config.graph_options.rewrite_options.constant_folding = rewriter_config_pb2.RewriterConfig.OFF
    optimizer = config.graph_options.optimizer_options
    optimizer.do_constant_folding = False
    optimizer.do_common_subexpression_elimination = False
    return config


class _Tally:
    """What the measured steps reported for one node, accumulated."""

    __slots__ = ("device", "kernel", "step_us", "runs", "outputs", "temporary", "persistent")

    def __init__(self) -> None:
        self.device = ""
        self.kernel = ""
        self.step_us: list[float] = []
        self.runs = 0
        self.outputs: dict[int, int] = {}
        self.temporary: int | None = None
        self.persistent: int | None = None


def _run(
    tf: Any,
    graph: Any,
    plan: _Plan,
    feeds: dict[str, Any],
    warmup: int,
    steps: int,
    progress: Callable[[int, int], None] | None,
    path: str,
) -> tuple[dict[str, _Tally], list[float]]:
    """Init, warm up, run the traced steps; (node -> tally, wall µs per measured step)."""
    names = {op.name for op in graph.get_operations()}
    tallies: dict[str, _Tally] = {}
    walls: list[float] = []
    total = warmup + steps
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    with tf.compat.v1.Session(graph=graph, config=_session_config(tf)) as session:
        try:
            if plan.init:
                session.run(plan.init, feed_dict=feeds)
            for done in range(1, total + 1):
                if done <= warmup:
                    session.run(plan.fetches, feed_dict=feeds)
                else:
                    metadata = tf.compat.v1.RunMetadata()
                    start = time.perf_counter()
                    session.run(plan.fetches, feed_dict=feeds, options=options, run_metadata=metadata)
                    walls.append((time.perf_counter() - start) * 1e6)
                    _tally_step(metadata.step_stats, names, tallies)
                if progress is not None:
                    progress(done, total)
        except tf.errors.OpError as err:
            raise _run_error(err, path) from None
        except (ValueError, TypeError) as err:  # feeds or fetches TensorFlow rejects
            raise InputError(
                f"TensorFlow rejected the run: {shorten_tf_message(str(err), MESSAGE_LIMIT)}", path=path
            ) from None
    return tallies, walls


def _tally_step(step_stats: Any, names: set[str], tallies: dict[str, _Tally]) -> None:
    """Add one step's stats: per node the sum of its executions' times (see module docstring)."""
    host_ns: dict[str, int] = {}
    runs: dict[str, int] = {}
    kernel_us: dict[str, float] = {}
    for dev in step_stats.dev_stats:
        where = dev.device
        if "/stream:" in where or where.endswith(("/memcpy", "/sync")):
            if where.endswith("/stream:all"):  # GPU kernels; the per-stream lines repeat them
                for stats in dev.node_stats:
                    name = stats.node_name.split(":", 1)[0]  # "name:Type"
                    if name in names:
                        kernel_us[name] = kernel_us.get(name, 0.0) + _duration_ns(stats) / 1000
            continue
        device = normalize_device(where)
        for stats in dev.node_stats:
            name = stats.node_name
            if name not in names:  # _SOURCE, _arg_*, _retval_*, _Send/_Recv, ...
                continue
            tally = tallies.get(name)
            if tally is None:
                tally = tallies[name] = _Tally()
            tally.device = device
            tally.kernel = _kernel(stats.timeline_label) or tally.kernel
            host_ns[name] = host_ns.get(name, 0) + _duration_ns(stats)
            runs[name] = runs.get(name, 0) + 1
            for output in stats.output:
                description = output.tensor_description
                if description.HasField("allocation_description"):
                    nbytes = description.allocation_description.requested_bytes
                elif any(dim.size == 0 for dim in description.shape.dim):
                    nbytes = 0  # an empty tensor allocates nothing, so it has no record
                else:
                    continue
                tally.outputs[output.slot] = max(tally.outputs.get(output.slot, 0), nbytes)
            if stats.HasField("memory_stats"):
                memory = stats.memory_stats
                tally.temporary = max(tally.temporary or 0, memory.temp_memory_size)
                tally.persistent = max(tally.persistent or 0, memory.persistent_memory_size)
    for name, nanos in host_ns.items():
        tally = tallies[name]
        tally.step_us.append(kernel_us[name] if name in kernel_us else nanos / 1000)
        tally.runs = max(tally.runs, runs[name])


def _duration_ns(stats: Any) -> int:
    """An execution's op time: op end - op start, nanos when filled, else micros, else all_end."""
    if stats.op_end_rel_nanos:
        return stats.op_end_rel_nanos - stats.op_start_rel_nanos
    if stats.op_end_rel_micros:
        return (stats.op_end_rel_micros - stats.op_start_rel_micros) * 1000
    return stats.all_end_rel_nanos or stats.all_end_rel_micros * 1000


def _kernel(label: str) -> str:
    """The op type in a timeline label.

    >>> _kernel("conv0/BiasAdd = _MklNativeConv2DWithBias(images, conv0/kernel, conv0/bias)")
    '_MklNativeConv2DWithBias'
    """
    _, sep, rest = label.partition(" = ")
    return rest.split("(", 1)[0] if sep else ""


def _same_kernel(kernel: str, op: str) -> bool:
    """Whether ``kernel`` computes ``op`` alone (the op itself or oneDNN's version of it).

    >>> _same_kernel("_MklMatMul", "MatMul"), _same_kernel("_MklNativeConv2DWithBias", "BiasAdd")
    (True, False)
    """
    return kernel in (op, f"_Mkl{op}", f"_MklNative{op}")


def _absorbed_by_fused_kernels(
    tallies: dict[str, _Tally],
    node_ops: dict[str, str],
    data_inputs: dict[str, list[str]],
    fed: set[str],
) -> dict[str, str]:
    """Absorbed node -> fused node: the producers a fused kernel (oneDNN) replaced.

    A node that ran a kernel other than its own op computed some of its
    inputs' producers too; those that did not run themselves (and are not
    fed) are what it absorbed, followed back through their own inputs.
    """
    absorbed: dict[str, str] = {}
    for name, tally in tallies.items():
        if not tally.kernel or _same_kernel(tally.kernel, node_ops[name]):
            continue
        stack = list(data_inputs[name])
        while stack:
            producer = stack.pop()
            if producer in tallies or producer in absorbed or producer in fed:
                continue
            absorbed[producer] = name
            stack.extend(data_inputs[producer])
    return absorbed


def _run_error(err: Any, path: str) -> InputError:
    """One line for an op that failed at run time, naming the op."""
    message = getattr(err, "message", None) or str(err)
    op = getattr(getattr(err, "op", None), "name", None)
    if not op:
        match = _NODE_IN_MESSAGE_RE.search(message)
        op = (match.group(1) or match.group(2)) if match else None
    return InputError(
        f"TensorFlow failed running the graph ({type(err).__name__}): "
        f"{shorten_tf_message(message, MESSAGE_LIMIT)}",
        path=path,
        op=op,
    )


def _describe_device(tf: Any, onednn: bool) -> str:
    """The measured device for humans (see :attr:`MeasuredRun.device`)."""
    version = tf.version.VERSION
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
        return f"/device:GPU:0 ({name}; TensorFlow {version})"
    return (
        f"/device:CPU:0 ({cpu_model()}, {os.cpu_count()} CPUs; "
        f"TensorFlow {version}, oneDNN {'on' if onednn else 'off'})"
    )


def cpu_model() -> str:
    """The CPU's model name (Linux's ``/proc/cpuinfo``; else :mod:`platform`'s word for it)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux: platform's word for it
    return platform.processor() or platform.machine() or "CPU"


# ----------------------------------------------------------------- planning


@dataclass
class _Plan:
    """What a measurement runs, decided from the GraphDef and the sidecar."""

    init: list[str]
    init_label: str | None
    fetches: list[str]
    feeds: list[FeedSpec]
    seed: int
    batch_size: int | None


def _node_name(ref: str) -> str:
    """The node of an input or tensor reference: ``^x``, ``x:1``, ``x`` -> ``x``."""
    return ref.lstrip("^").split(":", 1)[0]


def _plan(
    tf: Any,
    graph_def: Any,
    path: str,
    sidecar_path: str | None,
    sidecar: dict[str, Any] | None,
    *,
    batch_size: int | None,
    init_op: str | None,
) -> _Plan:
    """Init op(s), fetches and feeds (the rules are in the module docstring)."""
    sidecar = sidecar or {}
    nodes = {node.name: node for node in graph_def.node}
    inputs = {node.name: [_node_name(i) for i in node.input] for node in graph_def.node}
    init, init_label = _init_ops(graph_def, nodes, path, sidecar_path, sidecar, init_op)
    fetches = _fetches(graph_def, nodes, inputs, path, sidecar_path, sidecar, set(init))
    needed = _ancestors([_node_name(f) for f in fetches] + init, inputs)
    for node in graph_def.node:
        if node.name in needed and node.op in _INPUT_OPS and _dtype_enum(node) in (_DT_RESOURCE, _DT_VARIANT):
            raise InputError(
                "is a resource-handle Placeholder: the graph captures variables (resource handles) from a "
                "tf.function, so it cannot run standalone; use the analytic profile instead "
                "(`baechi profile MODEL` without --measure)",
                path=path,
                op=node.name,
            )
    effective_batch = batch_size if batch_size is not None else sidecar.get("batch_size")
    feeds = _feed_specs(tf, graph_def, nodes, needed, path, sidecar_path, sidecar, batch_size)
    seed = sidecar.get("seed")
    return _Plan(
        init=init,
        init_label=init_label,
        fetches=fetches,
        feeds=feeds,
        seed=DEFAULT_SEED if seed is None else seed,
        batch_size=effective_batch,
    )


def _dtype_enum(node: Any) -> int:
    """The node's ``dtype`` attr (a DataType enum value), 0 when it has none."""
    return node.attr["dtype"].type if "dtype" in node.attr else 0


def _existing(name: str, nodes: dict[str, Any], where: str, what: str) -> str:
    """``name``'s node when the graph has it, else an InputError suggesting a close name."""
    node = _node_name(name)
    if node in nodes:
        return node
    close = difflib.get_close_matches(node, list(nodes), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    raise InputError(f"{what} '{name}' is not a node of the graph{hint}", path=where)


def _init_ops(
    graph_def: Any,
    nodes: dict[str, Any],
    path: str,
    sidecar_path: str | None,
    sidecar: dict[str, Any],
    init_op: str | None,
) -> tuple[list[str], str | None]:
    """(ops to run once before the steps, their description for MeasuredRun.init_op)."""
    if init_op is not None:
        name = _existing(init_op, nodes, path, "the init op")
        return [name], name
    if sidecar.get("init_op"):
        name = _existing(sidecar["init_op"], nodes, sidecar_path or path, "the sidecar's init_op")
        return [name], name
    if CONVENTIONAL_INIT_OP in nodes:
        return [CONVENTIONAL_INIT_OP], CONVENTIONAL_INIT_OP
    variables = [node.name for node in graph_def.node if node.op in VARIABLE_OPS]
    variable_set = set(variables)
    initializers = [
        node.name
        for node in graph_def.node
        if node.op in _INITIALIZER_OPS
        and node.name.endswith("/Assign")
        and node.name[: -len("/Assign")] in variable_set
        and node.input
        and _node_name(node.input[0]) == node.name[: -len("/Assign")]
    ]
    if initializers:
        more = len(initializers) - 1
        label = initializers[0] if not more else f"{initializers[0]} and {more} more variable initializers"
        return initializers, label
    if variables:
        raise InputError(
            f"variable '{variables[0]}' must be initialised, and the graph has no '{CONVENTIONAL_INIT_OP}' op "
            "and no '<variable>/Assign' initializers; name the op that initialises it with --init-op",
            path=path,
        )
    return [], None


def _fetches(
    graph_def: Any,
    nodes: dict[str, Any],
    inputs: dict[str, list[str]],
    path: str,
    sidecar_path: str | None,
    sidecar: dict[str, Any],
    init: set[str],
) -> list[str]:
    """The sidecar's train_op and loss, else the sinks (see the module docstring)."""
    given = [sidecar[key] for key in ("train_op", "loss") if sidecar.get(key)]
    if given:
        for name in given:
            _existing(name, nodes, sidecar_path or path, "the sidecar's fetch")
        return given
    consumed = {producer for producers in inputs.values() for producer in producers}
    consumers: dict[str, list[str]] = {}
    for name, producers in inputs.items():
        for producer in producers:
            consumers.setdefault(producer, []).append(name)
    checkpoint_io = [node.name for node in graph_def.node if node.op in _CHECKPOINT_OPS]
    checkpointing = _descendants(checkpoint_io, consumers)
    fetches = [
        node.name
        for node in graph_def.node
        if node.name not in consumed
        and node.name not in init
        and node.op not in _INPUT_OPS
        and node.name not in checkpointing
    ]
    if not fetches:
        raise InputError(
            "nothing to run: no sink node besides the init op; give a sidecar (<model>.json) naming the train_op",
            path=path,
        )
    return fetches


def _ancestors(roots: Iterable[str], inputs: dict[str, list[str]]) -> set[str]:
    """``roots`` and every node they depend on through data or control inputs."""
    seen: set[str] = set()
    stack = [root for root in roots if root in inputs]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack.extend(producer for producer in inputs[name] if producer not in seen and producer in inputs)
    return seen


def _descendants(roots: Iterable[str], consumers: dict[str, list[str]]) -> set[str]:
    """``roots`` and every node that depends on them."""
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack.extend(consumers.get(name, ()))
    return seen


def _feed_specs(
    tf: Any,
    graph_def: Any,
    nodes: dict[str, Any],
    needed: set[str],
    path: str,
    sidecar_path: str | None,
    sidecar: dict[str, Any],
    batch_size: int | None,
) -> list[FeedSpec]:
    """Needed placeholders (GraphDef order), then the sidecar's other inputs (its order)."""
    listed = {}
    for entry in sidecar.get("inputs", []):
        name = entry["name"] if ":" in entry["name"] else f"{entry['name']}:0"
        listed[name] = entry
    specs: list[FeedSpec] = []
    for node in graph_def.node:
        tensor = f"{node.name}:0"
        if node.op not in _FEED_OPS or (node.name not in needed and tensor not in listed):
            continue
        entry = listed.pop(tensor, None)
        shape = _placeholder_shape(node, entry, batch_size, sidecar.get("batch_size"), path)
        value_range = tuple(entry["range"]) if entry is not None and entry.get("range") else None
        if not _dtype_enum(node):
            raise InputError("the placeholder has no dtype attr", path=path, op=node.name)
        specs.append(FeedSpec(tensor, tf.as_dtype(_dtype_enum(node)).name, shape, value_range))
    for name, entry in listed.items():  # feeds of tensors that are not placeholders
        _existing(name, nodes, sidecar_path or path, "the sidecar's input")
        value_range = tuple(entry["range"]) if entry.get("range") else None
        fill = batch_size if batch_size is not None else sidecar.get("batch_size")
        if -1 in entry["shape"] and fill is None:
            raise InputError(
                f"sidecar input '{entry['name']}' has an unknown dim (-1); pass --batch-size to fill it in",
                path=sidecar_path,
            )
        shape = tuple(fill if d == -1 else d for d in entry["shape"])
        specs.append(FeedSpec(name, tf.as_dtype(entry["dtype"]).name, shape, value_range))
    return specs


def _placeholder_shape(
    node: Any,
    entry: dict[str, Any] | None,
    batch_size: int | None,
    sidecar_batch: int | None,
    path: str,
) -> tuple[int, ...]:
    """The placeholder's shape with unknown dims filled (see the module docstring)."""
    given = entry["shape"] if entry is not None else None
    # Test membership first: indexing a protobuf map inserts the key.
    if "shape" not in node.attr or node.attr["shape"].shape.unknown_rank:
        if given is not None and all(d >= 0 for d in given):
            return tuple(given)
        raise InputError(
            "placeholder of unknown rank: list it with its shape in a sidecar (<model>.json)",
            path=path,
            op=node.name,
        )
    dims = [d.size for d in node.attr["shape"].shape.dim]
    for i, dim in enumerate(dims):
        if dim >= 0:
            continue
        if batch_size is not None:
            dims[i] = batch_size
        elif given is not None and len(given) == len(dims) and given[i] >= 0:
            dims[i] = given[i]
        elif sidecar_batch is not None:
            dims[i] = sidecar_batch
        else:
            shape = ",".join("?" if d < 0 else str(d) for d in dims)
            raise InputError(
                f"the placeholder's dimension {i} is unknown (shape [{shape}]); pass --batch-size to fill it in",
                path=path,
                op=node.name,
            )
    return tuple(dims)
