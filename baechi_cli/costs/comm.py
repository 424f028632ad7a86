"""Communication calibration: fit ``latency + bytes / bandwidth`` to timed transfers.

Baechi modelled a transfer between two devices as ``latency + b / bandwidth``
and fitted the two numbers to a device-to-device benchmark. ``baechi profile --comm``
does the same on the local machine through this module:

* :func:`measure_transfers` times transfers of ``2**min_exp .. 2**max_exp``
  bytes between two local devices with TensorFlow and fits them;
* :func:`fit_transfer_model` / :func:`fit_samples` are the fit alone (pure);
* :func:`interconnect_yaml` writes the ``interconnect:`` block, or a complete
  device YAML that :func:`baechi_cli.core.devices.load_devices_yaml` reads back.

Only :func:`measure_transfers` and :func:`local_device_pair` import TensorFlow (when called).

The fit: least squares over one point per size, the median of its timed runs.
``weighting="ols"`` (the default, as Baechi) fits the large transfers that dominate a
step's communication (its intercept is the line's, not a 1-byte transfer's);
``"relative"`` minimises relative residuals and honours small transfers. ``r2`` is always
the ordinary one on the raw medians, so fits compare. A slope that is not positive
(nothing was copied), fewer than two distinct sizes, mismatched lengths and negative or
non-finite values raise :class:`~baechi_cli.core.errors.InputError`; a negative latency is
clamped to 0 and the slope refitted through the origin, and the fit's ``note`` says so.

What is timed: from the end of a ``ReadVariableOp`` on ``src`` to the end of its consumer
on ``dst``, from TensorFlow's step stats (session overhead is outside). CPU devices of one
process share the buffer, so the consumer copies: ``ResourceScatterUpdate`` into an
already-touched variable (a fresh allocation would time page faults, which a receiver's
pooled memory does not pay), on one inter-op thread (a parked thread's wake-up would swamp
small sizes). That is memcpy, a stand-in for testing: calibrate on the accelerators you
will place on. With a GPU on either side the copy is a DMA and the consumer an ``Identity``.

Complexity: a fit is O(k) for k sizes. A sweep runs ``sum over sizes of (2 + runs)``
session steps, moves ``O(repeats * 2**max_exp)`` bytes and holds one ``n``-byte buffer per
device at a time.

Example:
    >>> sizes = [2**e for e in range(0, 21, 4)]
    >>> fit = fit_transfer_model(sizes, [134 + 0.0001754 * b for b in sizes])
    >>> round(fit.latency_us, 3), round(fit.us_per_byte, 7), fit.r2
    (134.0, 0.0001754, 1.0)
"""

from __future__ import annotations

import os
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from baechi_cli.core.devices import COMM_MODES, DeviceSpec
from baechi_cli.core.errors import InputError
from baechi_cli.io import tfsupport

WEIGHTINGS = ("ols", "relative")
# Sizes up to this many bytes are timed at least SMALL_REPEATS times.
SMALL_BYTES = 2**20
SMALL_REPEATS = 15
MAX_EXP_LIMIT = 30  # the size is fed as an int32 element count

_PRODUCER = "baechi_comm_src"
_CONSUMER = "baechi_comm_dst"


@dataclass(frozen=True)
class TransferSample:
    """The timed runs of one transfer size (µs each, warm-up excluded).

    Example:
        >>> TransferSample(1024, (12.0, 9.0, 30.0)).median_us
        12.0
    """

    nbytes: int
    times_us: tuple[float, ...]

    @property
    def median_us(self) -> float:
        return float(statistics.median(self.times_us))

    def to_json(self) -> dict[str, Any]:
        return {"bytes": self.nbytes, "median_us": self.median_us, "times_us": list(self.times_us)}


@dataclass(frozen=True)
class CommFit:
    """A fitted transfer model ``latency_us + nbytes / bandwidth_bytes_per_us``.

    Example:
        >>> fit = CommFit(latency_us=134.0, bandwidth_bytes_per_us=5700.0, r2=0.99)
        >>> fit.bandwidth_gb_per_s, round(fit.transfer_time_us(1_000_000), 1)
        (5.7, 309.4)
        >>> fit.summary()
        'latency 134 us, bandwidth 5.7 GB/s, R^2 0.9900'
    """

    latency_us: float
    bandwidth_bytes_per_us: float
    r2: float
    samples: tuple[TransferSample, ...] = ()
    src: str = ""
    dst: str = ""
    method: str = "fit"  # how the samples were timed: cpu-memcpy, dma, or fit (given numbers)
    weighting: str = "ols"
    note: str = ""  # e.g. that a negative latency was clamped
    wall_s: float = 0.0  # wall time of the measurement (0 for a fit of given numbers)

    @property
    def us_per_byte(self) -> float:
        return 1.0 / self.bandwidth_bytes_per_us

    @property
    def bandwidth_gb_per_s(self) -> float:
        """Bandwidth in GB/s (SI: 1e9 bytes per second)."""
        return self.bandwidth_bytes_per_us * 1e6 / 1e9

    def transfer_time_us(self, nbytes: int) -> float:
        return self.latency_us + nbytes / self.bandwidth_bytes_per_us

    def summary(self) -> str:
        """One line: latency, bandwidth, R²."""
        return (
            f"latency {self.latency_us:.4g} us, bandwidth {self.bandwidth_gb_per_s:.4g} GB/s, "
            f"R^2 {self.r2:.4f}"
        )

    def to_json(self) -> dict[str, Any]:
        """Everything, JSON-serialisable (per-size medians with the model's predictions)."""
        return {
            "src": self.src,
            "dst": self.dst,
            "method": self.method,
            "weighting": self.weighting,
            "latency_us": self.latency_us,
            "bandwidth_bytes_per_us": self.bandwidth_bytes_per_us,
            "bandwidth_gb_per_s": self.bandwidth_gb_per_s,
            "us_per_byte": self.us_per_byte,
            "r2": self.r2,
            "note": self.note,
            "wall_s": self.wall_s,
            "samples": [
                {**s.to_json(), "predicted_us": self.transfer_time_us(s.nbytes)} for s in self.samples
            ],
        }


# --- the fit ------------------------------------------------------------------


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)


def fit_transfer_model(
    nbytes: Sequence[int],
    times_us: Sequence[float],
    *,
    weighting: str = "ols",
    samples: Sequence[TransferSample] = (),
    src: str = "",
    dst: str = "",
    method: str = "fit",
    wall_s: float = 0.0,
) -> CommFit:
    """Least-squares fit of ``t = latency + nbytes / bandwidth`` (see the module docstring).

    ``nbytes[i]`` bytes took ``times_us[i]`` µs. ``weighting`` is ``"ols"``
    (ordinary least squares) or ``"relative"`` (minimise ``(t - pred) / t``).
    The other keywords are carried into the :class:`CommFit`.

    Example:
        >>> fit = fit_transfer_model([0, 10**6, 10**7], [50.0, 150.0, 1050.0], weighting="ols")
        >>> round(fit.latency_us, 6), round(fit.bandwidth_gb_per_s, 6), fit.r2
        (50.0, 10.0, 1.0)
        >>> fit_transfer_model([1, 2**20], [90.0, 80.0])
        Traceback (most recent call last):
        ...
        baechi_cli.core.errors.InputError: the transfer time did not grow with size (fitted slope -9.537e-06 us/byte): nothing was copied, so there is no bandwidth to fit
    """
    if weighting not in WEIGHTINGS:
        raise InputError(f"unknown weighting '{weighting}' (use {' or '.join(WEIGHTINGS)})")
    if len(nbytes) != len(times_us):
        raise InputError(f"{len(nbytes)} sizes but {len(times_us)} times: they must pair up")
    x = np.asarray(nbytes, dtype=float)
    y = np.asarray(times_us, dtype=float)
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise InputError("transfer sizes and times must be finite numbers")
    if (x < 0).any() or (y < 0).any():
        raise InputError("transfer sizes and times must not be negative")
    if len(np.unique(x)) < 2:
        raise InputError("a transfer fit needs at least two different sizes")
    if weighting == "relative":
        if (y <= 0).any():
            raise InputError("relative weighting needs positive times (use weighting='ols')")
        w = 1.0 / y
    else:
        w = np.ones_like(y)

    scale = float(x.max())  # columns of similar magnitude keep lstsq well conditioned
    design = np.column_stack([np.ones_like(x), x / scale]) * w[:, None]
    (intercept, scaled_slope), *_ = np.linalg.lstsq(design, y * w, rcond=None)
    intercept, slope = float(intercept), float(scaled_slope) / scale
    no_growth = (
        "the transfer time did not grow with size (fitted slope {:.4g} us/byte): "
        "nothing was copied, so there is no bandwidth to fit"
    )
    # Growth over the measured range below 1e-9 of the largest time is rounding, not bandwidth.
    tiny = 1e-9 * float(np.abs(y).max()) / float(x.max() - x.min())
    if not slope > tiny:
        raise InputError(no_growth.format(slope))
    note = ""
    if intercept < 0:
        # Through the origin with the same weights: minimise sum (w (y - s x))^2.
        wx, wy = w * x, w * y
        slope = float((wx * wy).sum() / (wx * wx).sum())
        note = (
            f"fitted latency {intercept:.4g} us was negative; clamped to 0 and the slope "
            "refitted through the origin"
        )
        intercept = 0.0
        if not slope > tiny:
            raise InputError(no_growth.format(slope))
    latency, bandwidth = float(intercept), float(1.0 / slope)
    r2 = _r2(y, latency + x * slope)
    return CommFit(
        latency_us=latency,
        bandwidth_bytes_per_us=bandwidth,
        r2=r2,
        samples=tuple(samples),
        src=src,
        dst=dst,
        method=method,
        weighting=weighting,
        note=note,
        wall_s=wall_s,
    )


def fit_samples(samples: Sequence[TransferSample], **kwargs: Any) -> CommFit:
    """Fit the median of each sample; ``kwargs`` go to :func:`fit_transfer_model`.

    Example:
        >>> s = [TransferSample(0, (10.0, 11.0, 10.0)), TransferSample(10**6, (110.0, 109.0, 110.0))]
        >>> fit = fit_samples(s)
        >>> round(fit.latency_us, 9), round(fit.bandwidth_gb_per_s, 9), len(fit.samples)
        (10.0, 10.0, 2)
    """
    return fit_transfer_model(
        [s.nbytes for s in samples], [s.median_us for s in samples], samples=samples, **kwargs
    )


# --- YAML -----------------------------------------------------------------------


def _g(value: float, digits: int = 7) -> str:
    return f"{value:.{digits}g}"


def interconnect_yaml(fit: CommFit, devices: DeviceSpec | None = None, mode: str | None = None) -> str:
    """The YAML of the fit: the ``interconnect:`` block, or a whole device file.

    With ``devices``, a complete device YAML (their ``devices:`` list and
    ``links`` overrides, with the fit as the default latency and bandwidth)
    that :func:`baechi_cli.core.devices.load_devices_yaml` reads back; ``mode``
    defaults to theirs. Without, only the ``interconnect:`` block, to paste
    into a device file; ``mode`` defaults to ``sequential``. Numbers keep 7
    significant digits.

    Example:
        >>> print(interconnect_yaml(CommFit(134.0, 1 / 0.0001754, 0.998)), end="")
        # baechi profile --comm: t = latency + bytes / bandwidth, R^2 0.9980 (ols weighting)
        interconnect:
          mode: sequential
          latency: 134us
          bandwidth: 5.701254GB/s
    """
    import yaml

    if mode is None:
        mode = devices.interconnect.mode if devices is not None else "sequential"
    if mode not in COMM_MODES:
        raise InputError(f"unknown communication mode '{mode}' (use parallel or sequential)")
    header = [
        f"# baechi profile --comm: t = latency + bytes / bandwidth, R^2 {fit.r2:.4f} ({fit.weighting} weighting)"
    ]
    if fit.src or fit.dst:
        sizes = f", {len(fit.samples)} sizes" if fit.samples else ""
        header.append(f"# measured {fit.src} -> {fit.dst} ({fit.method}{sizes})")
    if fit.note:
        header.append(f"# note: {fit.note}")
    interconnect: dict[str, Any] = {
        "mode": mode,
        "latency": f"{_g(fit.latency_us)}us",
        "bandwidth": f"{_g(fit.bandwidth_gb_per_s)}GB/s",
    }
    doc: dict[str, Any] = {}
    if devices is not None:
        doc["devices"] = [
            {
                "name": d.name,
                "memory": d.memory_bytes,
                "flops": d.flops,
                "memory_bandwidth": d.memory_bandwidth,
                "launch_overhead": f"{d.launch_overhead_us!r}us",
            }
            for d in devices.devices
        ]
        links = []
        for (a, b), (lat, bw) in sorted(devices.interconnect.links.items()):
            links.append(
                {
                    "a": devices.devices[a].name,
                    "b": devices.devices[b].name,
                    "latency": f"{lat!r}us",
                    "bandwidth": f"{bw * 1e6!r}B/s",
                }
            )
        if links:
            interconnect["links"] = links
    doc["interconnect"] = interconnect
    body = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, default_flow_style=False)
    return "\n".join(header) + "\n" + body


# --- devices ---------------------------------------------------------------------


def choose_device_pair(num_gpus: int) -> tuple[str, str]:
    """The two local devices to time: two GPUs, else GPU and CPU, else two logical CPUs.

    Example:
        >>> choose_device_pair(4)
        ('/device:GPU:0', '/device:GPU:1')
        >>> choose_device_pair(1)
        ('/device:GPU:0', '/device:CPU:0')
        >>> choose_device_pair(0)
        ('/device:CPU:0', '/device:CPU:1')
    """
    if num_gpus >= 2:
        return "/device:GPU:0", "/device:GPU:1"
    if num_gpus == 1:
        return "/device:GPU:0", "/device:CPU:0"
    return "/device:CPU:0", "/device:CPU:1"


_LOCAL_DEVICE_RE = re.compile(r"/device:(CPU|GPU):(\d+)")


def normalize_device(name: str) -> tuple[str, int]:
    """``"gpu:1"``, ``"/GPU:1"``, ``"/job:localhost/.../device:GPU:1"`` -> ``("GPU", 1)``.

    Spellings are unified by :func:`baechi_cli.io.tfsupport.normalize_device`;
    anything but a local CPU or GPU is an InputError.

    Example:
        >>> normalize_device("/device:CPU:1"), normalize_device("gpu:0")
        (('CPU', 1), ('GPU', 0))
        >>> normalize_device("TPU:0")
        Traceback (most recent call last):
        ...
        baechi_cli.core.errors.InputError: device 'TPU:0' is not a local CPU or GPU (use e.g. /device:GPU:0 or CPU:1)
    """
    m = _LOCAL_DEVICE_RE.fullmatch(tfsupport.normalize_device(name))
    if not m:
        raise InputError(f"device '{name}' is not a local CPU or GPU (use e.g. /device:GPU:0 or CPU:1)")
    return m.group(1), int(m.group(2))


def _import_tensorflow() -> Any:
    tfsupport.require_tensorflow(
        "profile --comm needs TensorFlow to time transfers: install the tf extra: pip install 'baechi[tf]'"
    )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # only effective before TF's first import
    return tfsupport.import_tensorflow()


def local_device_pair() -> tuple[str, str]:
    """The device pair :func:`measure_transfers` times by default (imports TensorFlow)."""
    tf = _import_tensorflow()
    return choose_device_pair(len(tf.config.list_physical_devices("GPU")))


# --- measurement -----------------------------------------------------------------


def _session_config(tf: Any, num_cpus: int, single_inter_op_thread: bool) -> Any:
    config = tfsupport.as_written_config(tf, cpus=num_cpus)
    if single_inter_op_thread:
        # A session-owned pool: the process-wide one keeps the first session's size.
        config.use_per_session_threads = True
        config.inter_op_parallelism_threads = 1
    config.gpu_options.allow_growth = True  # do not grab all GPU memory up front
    config.graph_options.optimizer_options.do_constant_folding = False
    return config


def _node_ends(run_metadata: Any) -> dict[str, int]:
    """Node name -> absolute end time (µs) from step stats; the latest if a node shows twice."""
    ends: dict[str, int] = {}
    for dev in run_metadata.step_stats.dev_stats:
        for node in dev.node_stats:
            end = node.all_start_micros + node.all_end_rel_micros
            ends[node.node_name] = max(end, ends.get(node.node_name, end))
    return ends


def runs_for_size(nbytes: int, repeats: int) -> int:
    """Timed runs for one size: ``repeats``, at least SMALL_REPEATS up to SMALL_BYTES.

    Example:
        >>> runs_for_size(1024, 5), runs_for_size(2**28, 5), runs_for_size(1024, 40)
        (15, 5, 40)
    """
    return max(repeats, SMALL_REPEATS) if nbytes <= SMALL_BYTES else repeats


def _build_graph(tf: Any, src: str, dst: str, method: str) -> tuple[Any, list[Any], Any]:
    """(size placeholder, per-size set-up ops, the consumer op) for one device pair."""
    with tf.device("/device:CPU:0"):
        size = tf.compat.v1.placeholder(tf.int32, shape=[], name="baechi_comm_size")
        dims = tf.stack([1, size])
    with tf.device(src):
        src_var = tf.raw_ops.VarHandleOp(
            dtype=tf.uint8, shape=[1, None], shared_name="baechi_comm_src_buffer"
        )
        ones = tf.raw_ops.Fill(dims=dims, value=tf.constant(1, tf.uint8))
        setup = [tf.raw_ops.AssignVariableOp(resource=src_var, value=ones, validate_shape=False)]
        produced = tf.raw_ops.ReadVariableOp(resource=src_var, dtype=tf.uint8, name=_PRODUCER)
    with tf.device(dst):
        if method == "cpu-memcpy":
            dst_var = tf.raw_ops.VarHandleOp(
                dtype=tf.uint8, shape=[1, None], shared_name="baechi_comm_dst_buffer"
            )
            zeros = tf.raw_ops.Fill(dims=dims, value=tf.constant(0, tf.uint8))
            setup.append(tf.raw_ops.AssignVariableOp(resource=dst_var, value=zeros, validate_shape=False))
            consumer = tf.raw_ops.ResourceScatterUpdate(
                resource=dst_var, indices=tf.constant([0]), updates=produced, name=_CONSUMER
            )
        else:
            consumer = tf.raw_ops.Identity(input=produced, name=_CONSUMER).op
    return size, setup, consumer


def measure_transfers(
    src: str | None = None,
    dst: str | None = None,
    *,
    max_exp: int = 28,
    min_exp: int = 0,
    repeats: int = 5,
    weighting: str = "ols",
    progress: Callable[[int, int], None] | None = None,
) -> CommFit:
    """Time transfers of ``2**min_exp .. 2**max_exp`` bytes from ``src`` to ``dst`` and fit them.

    ``src``/``dst`` default to :func:`local_device_pair` (either one left
    ``None`` takes that pair's device). ``progress(done, total)`` is called
    after each size. Raises MissingDependencyError without TensorFlow and
    InputError for bad arguments, unknown devices, TensorFlow failures (e.g.
    out of memory) and unfittable timings. What is timed: see the module
    docstring.
    """
    if weighting not in WEIGHTINGS:
        raise InputError(f"unknown weighting '{weighting}' (use {' or '.join(WEIGHTINGS)})")
    if not (0 <= min_exp < max_exp <= MAX_EXP_LIMIT):
        raise InputError(f"transfer sizes 2^{min_exp}..2^{max_exp}: need 0 <= min < max <= {MAX_EXP_LIMIT}")
    if repeats < 1:
        raise InputError(f"repeats must be at least 1, got {repeats}")
    tf = _import_tensorflow()
    num_gpus = len(tf.config.list_physical_devices("GPU"))
    pair = choose_device_pair(num_gpus)
    (src_kind, src_index) = normalize_device(src if src is not None else pair[0])
    (dst_kind, dst_index) = normalize_device(dst if dst is not None else pair[1])
    src_name, dst_name = f"/device:{src_kind}:{src_index}", f"/device:{dst_kind}:{dst_index}"
    if src_name == dst_name:
        raise InputError(f"timing a transfer needs two different devices, got {src_name} twice")
    for kind, index, name in ((src_kind, src_index, src_name), (dst_kind, dst_index, dst_name)):
        if kind == "GPU" and index >= num_gpus:
            raise InputError(f"{name} does not exist here ({num_gpus} GPU(s) visible to TensorFlow)")
    cpu_indices = [i for k, i in ((src_kind, src_index), (dst_kind, dst_index)) if k == "CPU"]
    method = "cpu-memcpy" if src_kind == dst_kind == "CPU" else "dma"
    config = _session_config(
        tf, 1 + max(cpu_indices, default=0), single_inter_op_thread=method == "cpu-memcpy"
    )

    started = time.perf_counter()
    graph = tf.Graph()
    with graph.as_default():
        size, setup, consumer = _build_graph(tf, src_name, dst_name, method)
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.SOFTWARE_TRACE)
    sizes = [2**e for e in range(min_exp, max_exp + 1)]
    samples: list[TransferSample] = []
    try:
        with tf.compat.v1.Session(graph=graph, config=config) as session:

            def timed_run() -> float:
                meta = tf.compat.v1.RunMetadata()
                session.run(consumer, options=options, run_metadata=meta)
                ends = _node_ends(meta)
                if _PRODUCER not in ends or _CONSUMER not in ends:
                    raise InputError(
                        f"TensorFlow reported no step stats for the transfer {src_name} -> {dst_name}"
                    )
                return float(ends[_CONSUMER] - ends[_PRODUCER])

            for done, nbytes in enumerate(sizes, 1):
                session.run(setup, {size: nbytes})  # replaces (frees) the previous size's buffers
                timed_run()  # warm-up, not counted
                times = tuple(timed_run() for _ in range(runs_for_size(nbytes, repeats)))
                samples.append(TransferSample(nbytes, times))
                if progress is not None:
                    progress(done, len(sizes))
    except tf.errors.OpError as err:
        first = tfsupport.shorten_tf_message(err.message or "") or type(err).__name__
        raise InputError(f"TensorFlow failed timing {src_name} -> {dst_name}: {first}") from None
    return fit_samples(
        samples,
        weighting=weighting,
        src=src_name,
        dst=dst_name,
        method=method,
        wall_s=time.perf_counter() - started,
    )


__all__ = [
    "CommFit",
    "TransferSample",
    "choose_device_pair",
    "fit_samples",
    "fit_transfer_model",
    "interconnect_yaml",
    "local_device_pair",
    "measure_transfers",
    "normalize_device",
    "runs_for_size",
]
