"""``baechi devices calibrate``: a device spec measured on the local hardware with PyTorch.

Contract. :func:`calibrate` takes the devices to measure (``cpu``, or one or
more ``cuda:K``: :func:`parse_targets`), a :class:`Runner` that times kernels
on them (:class:`TorchRunner`, or a stand-in in tests) and a :class:`Plan`
(what to run: :func:`plan_for`), and returns a :class:`Calibration`: what was
measured per device and device pair, the device YAML made of it, and the
:class:`~baechi_cli.core.devices.DeviceSpec` that YAML reads back as (parsed from the
text: what a user loads is what was reported). It writes nothing; the command writes it, atomically.

Per device, in float32, each kernel the median of ``plan.repeats`` timed runs after
``plan.warmup`` untimed ones (CUDA synchronised around each), counted by baechi's rules
(:class:`Timed`): ``flops``, the best ``n x n`` matmul rate; ``efficiency.gemm``, a
transformer layer's matmuls at several widths, inputs cold (:class:`Matmul`), their
geometric-mean rate over ``flops``; ``efficiency.conv``/``depthwise``, conv2d forward and
backward at ResNet-50's/MobileNetV2's shapes; ``memory_bandwidth``, ``a + b`` into a
preallocated output; ``overlap``, whether max or sum of compute and memory time makes those
matmuls' rates more alike (:func:`best_rates`; under the sum each rate is its kernel's time
less the other term, :func:`derive`); ``launch_overhead``, an eager training step of tiny
layers over the ops baechi charges for it (:class:`Launch`); ``memory``, CUDA's total or the
machine's physical memory.

With two or more CUDA devices, each pair's ``dst.copy_(src)`` of ``2**e`` bytes is fitted
by :func:`baechi_cli.costs.comm.fit_samples`; the interconnect is the pairs' median (every
pair also a ``links`` entry), mode ``parallel``. With one device it is Baechi's default
fit, and ``count`` > 1 writes that many copies. Numbers have 4 significant digits
(efficiency 3), under a header saying what was measured, with which torch, threads and TF32
settings, and when. PyTorch's defaults are kept, as a step runs with them (CUDA: TF32 convs).

Noise: :func:`calibrate` measures the cores other processes kept busy (:func:`cpu_sample`,
Linux) and each kernel's :func:`spread` of repeats; past :data:`BUSY_CORES` or
:data:`WIDE_SPREAD` the result is noisy (:class:`Noise`, in the header).

Errors, each one line, raised before anything is written: a device that is not ``cpu`` or
``cuda:K``, listed twice or unseen by torch, ``count`` with several devices (InputError, exit
2); torch not installed (MissingDependencyError, exit 5); a timed run not positive and finite
(InputError naming device and kernel); noise unless allowed (NoisyMeasurementError, exit 6).

Complexity: per device, the plan's kernels times ``warmup + repeats``; per pair and size,
``warmup + runs`` copies. Memory: the cold matmuls' pool, ``plan.pool_bytes`` per device.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from baechi_cli.core.devices import (
    CONV,
    DEPTHWISE,
    GEMM,
    NORM,
    Device,
    DeviceSpec,
    Interconnect,
    devices_from_yaml,
    dump_devices_yaml,
    format_si,
)
from baechi_cli.core.errors import InputError, MissingDependencyError, NoisyMeasurementError
from baechi_cli.costs.registry import OpCount

if TYPE_CHECKING:
    from baechi_cli.costs.comm import CommFit

#: The stages :func:`calibrate` reports to its ``progress`` callback, in order (per device, then pairs).
CALIBRATE_STAGES = ("gemm", "conv", "depthwise", "norm", "bandwidth", "launch", "transfers")
_FLOAT32_BYTES = 4


# --- what is measured ---------------------------------------------------------------


@dataclass(frozen=True)
class ConvShape:
    """A conv2d: ``batch`` images of ``size`` x ``size`` pixels, ``cin`` -> ``cout`` channels,
    a ``kernel`` x ``kernel`` filter, stride 1, same padding; ``depthwise``: one filter per
    channel (``groups = cin = cout``).

    >>> s = ConvShape(8, 64, 64, 56, 3)
    >>> str(s), s.forward_flops() == 2 * (8 * 56 * 56 * 64) * (3 * 3 * 64), s.backward_flops() / s.forward_flops()
    ('3x3 64->64 @56x56, batch 8', True, 2.0)
    >>> d = ConvShape(8, 144, 144, 56, 3, depthwise=True)
    >>> str(d), d.forward_flops() == 2 * (8 * 56 * 56 * 144) * (3 * 3), d.backward_flops() / d.forward_flops()
    ('3x3 depthwise 144 @56x56, batch 8', True, 2.0)
    """

    batch: int
    cin: int
    cout: int
    size: int
    kernel: int
    depthwise: bool = False

    def __str__(self) -> str:
        k = self.kernel
        channels = f"depthwise {self.cin}" if self.depthwise else f"{self.cin}->{self.cout}"
        return f"{k}x{k} {channels} @{self.size}x{self.size}, batch {self.batch}"

    @property
    def groups(self) -> int:
        return self.cin if self.depthwise else 1

    def forward_count(self) -> OpCount:
        """The forward convolution as baechi's Conv2D (or DepthwiseConv2dNative) rule counts it."""
        return _rule_count(self._op("Conv2D"), [self._x(), self._filter()], self._y())

    def backward_count(self) -> OpCount:
        """The input and filter gradients as the Conv2DBackprop{Input,Filter}V2 rules (or the
        depthwise ones) count them, summed."""
        inputs = [self._x(), self._filter(), self._y()]
        dx = _rule_count(self._op("Conv2DBackpropInputV2"), inputs, self._x())
        dw = _rule_count(self._op("Conv2DBackpropFilterV2"), inputs, self._filter())
        return OpCount(
            flops=dx.flops + dw.flops,
            bytes_read=dx.bytes_read + dw.bytes_read,
            bytes_written=dx.bytes_written + dw.bytes_written,
        )

    def forward_flops(self) -> float:
        """FLOPs of the forward convolution (:meth:`forward_count`)."""
        return self.forward_count().flops

    def backward_flops(self) -> float:
        """FLOPs of the input and filter gradients (:meth:`backward_count`)."""
        return self.backward_count().flops

    def _op(self, dense: str) -> str:
        if not self.depthwise:
            return dense
        return {
            "Conv2D": "DepthwiseConv2dNative",
            "Conv2DBackpropInputV2": "DepthwiseConv2dNativeBackpropInput",
            "Conv2DBackpropFilterV2": "DepthwiseConv2dNativeBackpropFilter",
        }[dense]

    # TensorFlow's conventions, which the rules read: NHWC activations, HWIO filters.
    def _x(self) -> tuple[int, ...]:
        return (self.batch, self.size, self.size, self.cin)

    def _y(self) -> tuple[int, ...]:
        return (self.batch, self.size, self.size, self.cout)

    def _filter(self) -> tuple[int, ...]:
        # depthwise: TensorFlow's [kh, kw, in, multiplier] with a multiplier of 1
        return (self.kernel, self.kernel, self.cin, 1 if self.depthwise else self.cout)


def _rule_count(op_type: str, inputs: Sequence[tuple[int, ...]], output: tuple[int, ...]) -> OpCount:
    """A float32 ``op_type`` with these input and output shapes, as its TensorFlow cost rule counts it."""
    from baechi_cli.costs.registry import OpView, rule_for

    size = [math.prod(s) * _FLOAT32_BYTES for s in inputs]
    attrs = {"strides": [1, 1, 1, 1], "padding": "SAME"}
    view = OpView(
        op_type,
        attrs,
        list(inputs),
        ["float32"] * len(inputs),
        size,
        [output],
        ["float32"],
        [math.prod(output) * _FLOAT32_BYTES],
    )
    return rule_for(op_type).fn(view)


def matmul_count(m: int, k: int, n: int) -> OpCount:
    """An ``m x k`` by ``k x n`` float32 matmul as baechi's MatMul rule counts it (``2 m k n`` FLOPs;
    both inputs read, the output written).

    >>> c = matmul_count(512, 128, 64)
    >>> c.flops == 2 * 512 * 128 * 64, c.bytes_read == 4 * (512 * 128 + 128 * 64), c.bytes_written == 4 * 512 * 64
    (True, True, True)
    """
    return _rule_count("MatMul", [(m, k), (k, n)], (m, n))


def gemm_flops(n: int) -> float:
    """FLOPs of an ``n x n`` by ``n x n`` matmul, as baechi's MatMul rule counts them (``2 n^3``).

    >>> gemm_flops(1024) == 2 * 1024**3
    True
    """
    return matmul_count(n, n, n).flops


@dataclass(frozen=True)
class Gemm:
    """``torch.mm`` of two ``n x n`` float32 matrices."""

    n: int


@dataclass(frozen=True)
class Matmul:
    """``torch.mm`` of an ``m x k`` by a ``k x n`` float32 matrix whose inputs are cold: each run
    reads the next pair from a pool of ``pool_bytes`` (larger than the caches), as an op of a
    training step reads tensors written long before; the output is allocated, as in a step."""

    m: int
    k: int
    n: int
    pool_bytes: int


@dataclass(frozen=True)
class Conv:
    """conv2d of ``shape``: the forward, or both gradients (``backward``)."""

    shape: ConvShape
    backward: bool = False


@dataclass(frozen=True)
class Add:
    """``torch.add(a, b, out=c)`` of ``elements`` float32 elements."""

    elements: int


@dataclass(frozen=True)
class Norm:
    """A batch norm in training mode (batch statistics, running statistics updated) of an NCHW
    float32 tensor of ``shape``: the forward pass."""

    shape: tuple[int, int, int, int]


def norm_count(shape: tuple[int, int, int, int]) -> OpCount:
    """What baechi's rule counts for :class:`Norm`: an ONNX BatchNormalization in training mode.

    >>> norm_count((2, 4, 8, 8)).flops
    3072.0
    """
    from baechi_cli.costs.registry import ONNX, count_view, rule_for
    from baechi_cli.costs.rules_onnx import onnx_view

    channels = (shape[1],)
    view = onnx_view(
        "BatchNormalization",
        {"training_mode": 1, "_input_shapes": [shape, *[channels] * 4], "_input_dtypes": ["float32"] * 5},
        [shape],
        ["float32"],
        [math.prod(shape) * _FLOAT32_BYTES],
    )
    count, _ = count_view(rule_for("BatchNormalization", ONNX), view)
    return count


#: The width of :class:`Launch`'s layers: small enough that its kernels cost nothing.
LAUNCH_WIDTH = 8


@dataclass(frozen=True)
class Launch:
    """A training step of the smallest eager model: ``layers`` pairs of ``nn.Linear(8, 8)`` and
    ``nn.Tanh`` on one row, ``model.zero_grad(set_to_none=True); model(x).sum().backward()``."""

    layers: int

    def ops(self) -> int:
        """The ops baechi's ``--training`` step charges a launch for (passes/training.py): per layer
        the Gemm and the Tanh, the Gemm's two gradients (input and parameters; the first layer's
        one: its input needs none) and the Tanh's one; the loss (with its gradient, one op).

        >>> Launch(100).ops()
        500
        """
        return 5 * self.layers - 1 + 1


@dataclass(frozen=True)
class Copy:
    """``nbytes`` bytes copied from the runner's device to ``dst``."""

    dst: str
    nbytes: int


Kernel = Gemm | Matmul | Conv | Norm | Add | Launch | Copy


def describe_kernel(kernel: Kernel) -> str:
    """A kernel as error messages name it.

    >>> describe_kernel(Gemm(512)), describe_kernel(Matmul(512, 128, 64, 2**20))
    ('a 512x512 matmul', 'a 512x128 by 128x64 matmul, inputs cold')
    >>> describe_kernel(Launch(10)), describe_kernel(Copy("cuda:1", 1024))
    ('a training step of 10 tiny layers', 'a copy of 1024 bytes to cuda:1')
    """
    if isinstance(kernel, Gemm):
        return f"a {kernel.n}x{kernel.n} matmul"
    if isinstance(kernel, Matmul):
        return f"a {kernel.m}x{kernel.k} by {kernel.k}x{kernel.n} matmul, inputs cold"
    if isinstance(kernel, Conv):
        return f"a conv2d {'backward' if kernel.backward else 'forward'} ({kernel.shape})"
    if isinstance(kernel, Add):
        return f"a + b of {kernel.elements} elements"
    if isinstance(kernel, Norm):
        return f"a training batch norm of {'x'.join(map(str, kernel.shape))}"
    if isinstance(kernel, Launch):
        return f"a training step of {kernel.layers} tiny layers"
    return f"a copy of {kernel.nbytes} bytes to {kernel.dst}"


class Runner(Protocol):
    """What :func:`calibrate` needs from a framework: timed kernels on named devices."""

    def describe(self) -> str:
        """The framework and its settings, for the YAML header: ``torch 2.13.0+cpu, 2 threads``."""
        ...

    def label(self, target: str) -> str:
        """What device ``target`` is: ``NVIDIA H100 80GB HBM3``, ``AMD EPYC, 2 CPUs``."""
        ...

    def memory_bytes(self, target: str) -> int:
        """The memory of ``target`` in bytes."""
        ...

    def prepare(self, target: str, kernel: Kernel) -> Callable[[], float]:
        """Allocate ``kernel``'s tensors on ``target``; the callable runs it once and returns the seconds
        it took, the device finished. The tensors live as long as the callable."""
        ...


@dataclass(frozen=True)
class Plan:
    """What to run: square matmul sizes; model-shaped matmuls ``(m, k, n)`` and the bytes of the
    pool their cold inputs come from; conv shapes; elements of the bandwidth add; layers of the
    launch step; transfer sizes (exponents of 2); the warm-up and timed runs of each."""

    gemm: tuple[int, ...]
    matmuls: tuple[tuple[int, int, int], ...]
    pool_bytes: int
    conv: tuple[ConvShape, ...]
    depthwise: tuple[ConvShape, ...]
    norms: tuple[tuple[int, int, int, int], ...]
    elements: int
    layers: int
    transfer_exps: tuple[int, ...]
    warmup: int
    repeats: int


# ResNet-50's convolutions: (cin, cout, size, kernel) of its stages' 3x3 and 1x1 layers.
_RESNET_CONVS = (
    (64, 64, 56, 3),
    (128, 128, 28, 3),
    (256, 256, 14, 3),
    (512, 512, 7, 3),
    (256, 64, 56, 1),
    (64, 256, 56, 1),
    (1024, 256, 14, 1),
)
# ResNet-50's batch norms, one per stage: (channels, size).
_RESNET_NORMS = ((64, 56), (128, 28), (256, 14), (512, 7))
# MobileNetV2's depthwise 3x3 convolutions at stride 1: (channels, size).
_MOBILENET_DEPTHWISE = ((32, 112), (144, 56), (192, 28), (384, 14), (576, 14), (960, 7))


def transformer_matmuls(tokens: int, widths: Sequence[int]) -> tuple[tuple[int, int, int], ...]:
    """A transformer layer's matmuls ``(m, k, n)`` at each width ``h``: the attention projections
    ``[tokens, h] x [h, h]``, the MLP's ``[tokens, h] x [h, 4h]`` and ``[tokens, 4h] x [4h, h]``.

    >>> transformer_matmuls(512, (128,))
    ((512, 128, 128), (512, 128, 512), (512, 512, 128))
    """
    return tuple(shape for h in widths for shape in ((tokens, h, h), (tokens, h, 4 * h), (tokens, 4 * h, h)))


def plan_for(target: str, quick: bool = False) -> Plan:
    """The default plan for ``target`` (a CPU or a CUDA device), or the small ``quick`` one.

    The sizes make each kernel long enough to time (a GPU gets larger ones)
    and keep a full CPU calibration under a minute on two cores.

    >>> plan_for("cuda:0").gemm, plan_for("cpu").gemm, plan_for("cpu", quick=True).repeats
    ((1024, 2048, 4096, 8192), (256, 512, 1024, 2048), 3)
    >>> len(plan_for("cpu").matmuls), plan_for("cpu").matmuls[0], plan_for("cuda:0").matmuls[-1]
    (12, (512, 128, 128), (4096, 16384, 4096))
    """
    if quick:
        return Plan(
            gemm=(128, 256),
            matmuls=transformer_matmuls(128, (64, 128)),
            pool_bytes=2**24,
            conv=(ConvShape(1, 32, 32, 28, 3), ConvShape(1, 64, 32, 28, 1)),
            depthwise=(ConvShape(1, 32, 32, 28, 3, depthwise=True),),
            norms=((1, 32, 28, 28),),
            elements=2**22,
            layers=20,
            transfer_exps=tuple(range(0, 21, 4)),
            warmup=1,
            repeats=3,
        )
    cuda = target.startswith("cuda")
    batch = 32 if cuda else 8
    return Plan(
        gemm=(1024, 2048, 4096, 8192) if cuda else (256, 512, 1024, 2048),
        # widths from a small model's to a large one's; tokens: a batch of sequences
        matmuls=transformer_matmuls(4096, (512, 1024, 2048, 4096))
        if cuda
        else transformer_matmuls(512, (128, 256, 512, 1024)),
        pool_bytes=2**30 if cuda else 2**28,  # well past the last-level cache (an H100's L2: 50 MB)
        conv=tuple(ConvShape(batch, *shape) for shape in _RESNET_CONVS),
        depthwise=tuple(ConvShape(batch, c, c, size, 3, depthwise=True) for c, size in _MOBILENET_DEPTHWISE),
        norms=tuple((batch, c, size, size) for c, size in _RESNET_NORMS),
        elements=2**26,
        layers=200,
        transfer_exps=tuple(range(29)),
        warmup=2,
        repeats=7,
    )


def parse_targets(text: str) -> tuple[str, ...]:
    """``--torch`` -> device names: ``cpu``, or CUDA devices ``cuda:K`` separated by commas.

    ``cuda`` is ``cuda:0``. InputError for anything else, a device listed twice,
    or ``cpu`` together with other devices.

    >>> parse_targets("cuda:0, cuda:1"), parse_targets("cpu"), parse_targets("cuda")
    (('cuda:0', 'cuda:1'), ('cpu',), ('cuda:0',))
    >>> parse_targets("tpu")
    Traceback (most recent call last):
    ...
    baechi_cli.core.errors.InputError: --torch 'tpu': not a device calibration can measure (use cpu or cuda:K, \
several CUDA devices separated by commas)
    """
    targets: list[str] = []
    for raw in text.split(","):
        name = raw.strip().lower()
        m = re.fullmatch(r"cuda(?::(\d+))?", name)
        if name in ("cpu", "cpu:0"):
            name = "cpu"
        elif m:
            name = f"cuda:{int(m.group(1) or 0)}"
        else:
            raise InputError(
                f"--torch '{raw.strip()}': not a device calibration can measure (use cpu or cuda:K, "
                "several CUDA devices separated by commas)"
            )
        if name in targets:
            raise InputError(f"--torch '{text}': {name} is listed twice")
        targets.append(name)
    if "cpu" in targets and len(targets) > 1:
        raise InputError(
            f"--torch '{text}': cpu is measured alone (transfers are timed between CUDA devices)"
        )
    return tuple(targets)


# --- results ------------------------------------------------------------------------


@dataclass(frozen=True)
class Timed:
    """A kernel's FLOPs and bytes (read and written) as baechi's rules count them, and its seconds."""

    flops: float
    nbytes: float
    seconds: float

    @staticmethod
    def of(count: OpCount, seconds: float) -> Timed:
        return Timed(count.flops, count.bytes_read + count.bytes_written, seconds)


#: Under ``overlap: false`` a kernel's compute (or memory) time is its time less its other term, but
#: never less than this share of it: a kernel the other rate alone would over-explain is noise.
FLOOR_SHARE = 0.1


def compute_s(kernel: Timed, bandwidth: float, overlap: bool) -> float:
    """The seconds of ``kernel`` that are compute: all of them where compute and memory overlap (the
    roofline's max, the kernel compute-bound), else its time less its bytes at ``bandwidth``.

    >>> compute_s(Timed(1e9, 1e8, 1.0), 1e9, True), compute_s(Timed(1e9, 1e8, 1.0), 1e9, False)
    (1.0, 0.9)
    """
    if overlap:
        return kernel.seconds
    return max(kernel.seconds - kernel.nbytes / bandwidth, FLOOR_SHARE * kernel.seconds)


def memory_s(kernel: Timed, flops: float, overlap: bool) -> float:
    """The seconds of ``kernel`` that are memory traffic: :func:`compute_s`'s mirror."""
    if overlap:
        return kernel.seconds
    return max(kernel.seconds - kernel.flops / flops, FLOOR_SHARE * kernel.seconds)


@dataclass(frozen=True)
class Raw:
    """One device's timed kernels, in :class:`Plan` order: square matmuls (with their n), the
    model-shaped matmuls, conv forward and backward runs, depthwise ones, the bandwidth add."""

    squares: tuple[tuple[int, Timed], ...]
    matmuls: tuple[Timed, ...]
    conv_forward: tuple[Timed, ...]
    conv_backward: tuple[Timed, ...]
    depthwise: tuple[Timed, ...]
    add: Timed
    norm: tuple[Timed, ...] = ()


@dataclass(frozen=True)
class Rates:
    """What :func:`derive` makes of a :class:`Raw` under one overlap model; rates per second."""

    overlap: bool
    gemm_flops: float  # the best square matmul's compute rate
    gemm_n: int  # the size that reached it
    matmul_flops: float  # the geometric mean of the model-shaped matmuls' compute rates
    matmul_spread: float  # how far those rates spread: the standard deviation of their logs
    conv_flops: float  # forward and backward together
    conv_forward_flops: float
    conv_backward_flops: float
    depthwise_flops: float  # forward and backward together
    bandwidth: float  # bytes/s
    norm_flops: float = 0.0  # training batch norms' compute rate; 0: not measured


def _rate(kernels: Sequence[Timed], bandwidth: float, overlap: bool) -> float:
    """Total FLOPs over total compute seconds."""
    return sum(k.flops for k in kernels) / sum(compute_s(k, bandwidth, overlap) for k in kernels)


def derive(raw: Raw, overlap: bool) -> Rates:
    """The rates under which baechi's formula (:func:`~baechi_cli.costs.analytic.op_time_us`, max or sum
    of compute and memory time as ``overlap`` says) gives the kernels their measured times: the add's
    bytes over its memory seconds, each matmul's and conv's FLOPs over its compute seconds
    (:func:`compute_s`; the two depend on each other under the sum, so they are iterated)."""
    bandwidth = raw.add.nbytes / raw.add.seconds
    gemm_flops, gemm_n = 0.0, 0
    for _ in range(1 if overlap else 3):  # the sum's corrections are a few percent: converged by then
        gemm_flops, gemm_n = max((k.flops / compute_s(k, bandwidth, overlap), n) for n, k in raw.squares)
        bandwidth = raw.add.nbytes / memory_s(raw.add, gemm_flops, overlap)
    logs = [math.log(k.flops / compute_s(k, bandwidth, overlap)) for k in raw.matmuls]
    mean = statistics.fmean(logs)
    return Rates(
        overlap=overlap,
        gemm_flops=gemm_flops,
        gemm_n=gemm_n,
        matmul_flops=math.exp(mean),
        matmul_spread=math.sqrt(statistics.fmean([(x - mean) ** 2 for x in logs])),
        conv_flops=_rate(raw.conv_forward + raw.conv_backward, bandwidth, overlap),
        conv_forward_flops=_rate(raw.conv_forward, bandwidth, overlap),
        conv_backward_flops=_rate(raw.conv_backward, bandwidth, overlap),
        depthwise_flops=_rate(raw.depthwise, bandwidth, overlap),
        bandwidth=bandwidth,
        norm_flops=_rate(raw.norm, bandwidth, overlap) if raw.norm else 0.0,
    )


def best_rates(raw: Raw) -> tuple[Rates, Rates]:
    """The overlap model the model-shaped matmuls say, and the other: the one under which their
    compute rates spread less (:attr:`Rates.matmul_spread`); the max (the default) on a tie."""
    overlapping, adding = derive(raw, True), derive(raw, False)
    if adding.matmul_spread < overlapping.matmul_spread:
        return adding, overlapping
    return overlapping, adding


@dataclass(frozen=True)
class Measured:
    """One device's measurements (:class:`Raw`), the rates taken (:attr:`rates`: the better overlap
    model's) and the other model's (:attr:`other`), and the per-op cost of an eager training step."""

    target: str  # cpu, cuda:0
    label: str  # what the device is
    memory_bytes: int
    raw: Raw
    rates: Rates
    other: Rates
    launch_us: float

    @property
    def gemm_flops(self) -> float:
        return self.rates.gemm_flops

    @property
    def bandwidth(self) -> float:
        return self.rates.bandwidth

    @property
    def overlap(self) -> bool:
        return self.rates.overlap

    @property
    def gemm_efficiency(self) -> float:
        """Model-shaped matmuls' FLOP/s as a fraction of the best square's: ``efficiency.gemm``."""
        return self.rates.matmul_flops / self.rates.gemm_flops

    @property
    def conv_efficiency(self) -> float:
        """Conv FLOP/s as a fraction of GEMM FLOP/s: the ``efficiency.conv`` factor."""
        return self.rates.conv_flops / self.rates.gemm_flops

    @property
    def norm_efficiency(self) -> float:
        """Training batch norms' FLOP/s as a fraction of GEMM FLOP/s: the ``efficiency.norm`` factor."""
        return self.rates.norm_flops / self.rates.gemm_flops

    @property
    def depthwise_efficiency(self) -> float:
        """Depthwise conv FLOP/s as a fraction of GEMM FLOP/s: the ``efficiency.depthwise`` factor."""
        return self.rates.depthwise_flops / self.rates.gemm_flops


# --- noise ----------------------------------------------------------------------------

#: Other processes busy on more than this many of the cores the calibration runs on, on average
#: over the measurement: the machine is busy, and the kernels shared their cores (their rates come
#: out low). A CPU calibration runs on every core; a CUDA one on one (the rest are left to others).
BUSY_CORES = 0.25
#: A kernel whose median run is more than this fraction above its fastest (:func:`spread`) was
#: slowed in most of its runs: its median is noise, not the device.
WIDE_SPREAD = 0.3


def spread(times: Sequence[float]) -> float:
    """How far the median of ``times`` is above the fastest, as a fraction of the fastest.

    One slow run does not move it (the median ignores it); it grows when
    half the runs or more were slowed.

    >>> round(spread([1.0, 1.1, 5.0]), 3), spread([2.0, 2.0, 2.0])
    (0.1, 0.0)
    """
    fastest = min(times)
    return statistics.median(times) / fastest - 1


@dataclass(frozen=True)
class Spread:
    """One kernel's :func:`spread` on one device."""

    value: float
    target: str
    kernel: Kernel

    def __str__(self) -> str:
        return f"{describe_kernel(self.kernel)} on {self.target}, its median run {self.value:.0%} above its fastest"


@dataclass(frozen=True)
class CpuSample:
    """A reading of the CPU clocks: wall seconds, CPU seconds every process has used since boot,
    and those of this process (all its threads)."""

    wall_s: float
    busy_s: float
    own_s: float


def cpu_sample() -> CpuSample | None:
    """The CPU clocks now (``/proc/stat`` and :func:`time.process_time`); None where there is no
    ``/proc/stat`` (Linux only)."""
    try:
        with open("/proc/stat", encoding="utf-8") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]  # user .. steal; guest is inside user
    except (OSError, ValueError):
        return None
    busy = sum(ticks) - ticks[3] - ticks[4]  # less idle and iowait
    return CpuSample(time.perf_counter(), busy / os.sysconf("SC_CLK_TCK"), time.process_time())


def other_cores(start: CpuSample | None, end: CpuSample | None) -> float | None:
    """Cores other processes kept busy on average between two readings (never below 0); None
    without both readings or time between them.

    >>> other_cores(CpuSample(0.0, 100.0, 1.0), CpuSample(2.0, 104.0, 3.0))
    1.0
    """
    if start is None or end is None or end.wall_s <= start.wall_s:
        return None
    others = (end.busy_s - start.busy_s) - (end.own_s - start.own_s)
    return max(others, 0.0) / (end.wall_s - start.wall_s)


@dataclass(frozen=True)
class Noise:
    """What the machine did while :func:`calibrate` measured: other processes' load, and the
    widest :func:`spread` of any device's kernels (transfers aside: their fit weighs them)."""

    other_cores: float | None  # None: not measured (no /proc/stat)
    cores: int  # the machine's
    widest: Spread | None  # None: no kernel timed
    free_cores: int = 0  # cores the calibration leaves to other processes (CUDA: all but one)

    @property
    def busy_limit(self) -> float:
        """The cores other processes may keep busy before the calibration is noisy."""
        return self.free_cores + BUSY_CORES

    @property
    def busy(self) -> bool:
        return self.other_cores is not None and self.other_cores > self.busy_limit

    @property
    def wide(self) -> bool:
        return self.widest is not None and self.widest.value > WIDE_SPREAD

    @property
    def noisy(self) -> bool:
        """Whether the numbers are suspect: the machine was busy or some kernel's runs spread wide."""
        return self.busy or self.wide

    def load(self) -> str:
        """``other processes used 1.20 of 2 cores``, or that the load was not measured."""
        if self.other_cores is None:
            return "other processes' load not measured (no /proc/stat)"
        return f"other processes used {self.other_cores:.2f} of {self.cores} cores"

    def summary(self) -> str:
        """What was seen, on one line, with the limits it went over."""
        load = self.load() + (f" (over {self.busy_limit:g})" if self.busy else "")
        if self.widest is None:
            return load
        over = f" (over {WIDE_SPREAD:.0%})" if self.wide else ""
        return f"{load}; widest spread of repeats: {self.widest}{over}"


def measured_noise(
    start: CpuSample | None, end: CpuSample | None, spreads: Sequence[Spread], cuda: bool = False
) -> Noise:
    """The :class:`Noise` of a measurement between two CPU readings that timed ``spreads``;
    ``cuda``: its kernels ran on CUDA devices, from one core."""
    widest = max(spreads, key=lambda s: s.value, default=None)
    cores = os.cpu_count() or 1
    return Noise(other_cores(start, end), cores, widest, free_cores=cores - 1 if cuda else 0)


def refuse_noise(result: Calibration) -> None:
    """Raise NoisyMeasurementError when ``result``'s numbers are noise (:attr:`Noise.noisy`)."""
    if result.noise.noisy:
        raise NoisyMeasurementError(
            f"the machine was too noisy to calibrate: {result.noise.summary()}; nothing was written: "
            "rerun when the machine is idle, or pass --allow-noisy to write the numbers anyway"
        )


@dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate` returns."""

    measured: tuple[Measured, ...]
    fits: tuple[CommFit, ...]  # one per measured device pair; empty for one device
    spec: DeviceSpec  # as ``yaml`` reads back
    yaml: str  # the device YAML, comment header included
    wall_s: float
    noise: Noise


# --- measuring ----------------------------------------------------------------------


def _timed(runner: Runner, target: str, kernel: Kernel, warmup: int, runs: int) -> list[float]:
    """Seconds of ``runs`` runs of ``kernel`` after ``warmup`` untimed ones; InputError unless each
    is a positive, finite time."""
    run = runner.prepare(target, kernel)
    for _ in range(warmup):
        run()
    times = [run() for _ in range(runs)]
    bad = next((t for t in times if not (math.isfinite(t) and t > 0)), None)
    if bad is not None:
        raise InputError(
            f"{target}: timing {describe_kernel(kernel)} gave {bad!r} s, not a positive time: "
            "the timer is broken, so nothing was written"
        )
    return times


def _median_s(runner: Runner, target: str, kernel: Kernel, plan: Plan, spreads: list[Spread]) -> float:
    """The median of ``plan.repeats`` timed runs; the runs' :class:`Spread` goes to ``spreads``."""
    times = _timed(runner, target, kernel, plan.warmup, plan.repeats)
    spreads.append(Spread(spread(times), target, kernel))
    return statistics.median(times)


def _convs(
    runner: Runner,
    target: str,
    shapes: Sequence[ConvShape],
    plan: Plan,
    steps: Callable[[int, int], None],
    spreads: list[Spread],
) -> tuple[tuple[Timed, ...], tuple[Timed, ...]]:
    """The forward and the backward run of each of ``shapes``, timed and counted as the rules count them."""
    forward, backward = [], []
    for i, shape in enumerate(shapes, 1):
        forward.append(Timed.of(shape.forward_count(), _median_s(runner, target, Conv(shape), plan, spreads)))
        backward.append(
            Timed.of(
                shape.backward_count(), _median_s(runner, target, Conv(shape, backward=True), plan, spreads)
            )
        )
        steps(i, len(shapes))
    return tuple(forward), tuple(backward)


def measure_device(
    runner: Runner,
    target: str,
    plan: Plan,
    progress: Callable[[str], None] = lambda stage: None,
    steps: Callable[[int, int], None] = lambda done, total: None,
    spreads: list[Spread] | None = None,
) -> Measured:
    """Measure one device (see the module docstring); ``progress`` gets each stage's name, ``steps``
    the kernels done in it, ``spreads`` (when given) each kernel's :class:`Spread`. InputError for a
    broken timer or a memory size that is not positive."""
    spreads = [] if spreads is None else spreads
    progress("gemm")  # the squares, then the model-shaped matmuls
    total = len(plan.gemm) + len(plan.matmuls)
    squares = []
    for i, n in enumerate(plan.gemm, 1):
        squares.append(
            (n, Timed.of(matmul_count(n, n, n), _median_s(runner, target, Gemm(n), plan, spreads)))
        )
        steps(i, total)
    matmuls = []
    for i, (m, k, n) in enumerate(plan.matmuls, len(plan.gemm) + 1):
        kernel = Matmul(m, k, n, plan.pool_bytes)
        matmuls.append(Timed.of(matmul_count(m, k, n), _median_s(runner, target, kernel, plan, spreads)))
        steps(i, total)

    progress("conv")
    conv_forward, conv_backward = _convs(runner, target, plan.conv, plan, steps, spreads)
    progress("depthwise")
    depthwise = _convs(runner, target, plan.depthwise, plan, steps, spreads)

    progress("norm")
    norms = []
    for i, shape in enumerate(plan.norms, 1):
        norms.append(Timed.of(norm_count(shape), _median_s(runner, target, Norm(shape), plan, spreads)))
        steps(i, len(plan.norms))

    progress("bandwidth")
    add_count = OpCount(  # read a and b, write the sum: one FLOP an element
        flops=float(plan.elements),
        bytes_read=2 * plan.elements * _FLOAT32_BYTES,
        bytes_written=plan.elements * _FLOAT32_BYTES,
    )
    add = Timed.of(add_count, _median_s(runner, target, Add(plan.elements), plan, spreads))

    progress("launch")
    launch = Launch(plan.layers)
    launch_us = _median_s(runner, target, launch, plan, spreads) / launch.ops() * 1e6

    memory = runner.memory_bytes(target)
    if not memory > 0:
        raise InputError(f"{target}: the device reports {memory} bytes of memory")
    raw = Raw(
        tuple(squares),
        tuple(matmuls),
        conv_forward,
        conv_backward,
        depthwise[0] + depthwise[1],
        add,
        tuple(norms),
    )
    rates, other = best_rates(raw)
    return Measured(
        target=target,
        label=runner.label(target),
        memory_bytes=int(memory),
        raw=raw,
        rates=rates,
        other=other,
        launch_us=launch_us,
    )


def measure_transfers(
    runner: Runner,
    targets: Sequence[str],
    plan: Plan,
    steps: Callable[[int, int], None] = lambda done, total: None,
) -> tuple[CommFit, ...]:
    """Time copies of ``2**e`` bytes (``e`` in ``plan.transfer_exps``) between every pair of
    ``targets`` (first to second) and fit each pair; the fits in pair order."""
    from baechi_cli.costs.comm import TransferSample, fit_samples, runs_for_size

    pairs = list(itertools.combinations(targets, 2))
    total, done = len(pairs) * len(plan.transfer_exps), 0
    fits = []
    for src, dst in pairs:
        started = time.perf_counter()
        samples = []
        for e in plan.transfer_exps:
            runs = runs_for_size(2**e, plan.repeats)
            times = _timed(runner, src, Copy(dst, 2**e), plan.warmup, runs)
            samples.append(TransferSample(2**e, tuple(t * 1e6 for t in times)))
            done += 1
            steps(done, total)
        try:
            fits.append(
                fit_samples(
                    samples, src=src, dst=dst, method="torch-copy", wall_s=time.perf_counter() - started
                )
            )
        except InputError as err:
            raise InputError(f"{src} -> {dst}: {err.problem}") from None
    return tuple(fits)


def calibrate(
    targets: Sequence[str],
    runner: Runner,
    plan: Plan,
    *,
    count: int = 1,
    command: str = "",
    progress: Callable[[str], None] = lambda stage: None,
    steps: Callable[[int, int], None] = lambda done, total: None,
    when: datetime | None = None,
    clock: Callable[[], CpuSample | None] | None = None,
) -> Calibration:
    """Measure ``targets`` with ``runner`` following ``plan`` and make the device YAML.

    ``count`` > 1 writes that many copies of the one device measured (InputError
    with several targets). ``command`` heads the YAML's comment header; ``when``
    (default: now) is the time it gives. ``progress`` and ``steps`` as for
    :func:`measure_device` (the pairs' stage is ``transfers``). ``clock``
    (default :func:`cpu_sample`) is read before and after the measuring for
    the :class:`Noise` (the YAML header records it); a noisy calibration is
    returned all the same (:func:`refuse_noise` is the caller's).
    """
    _check_count(count, targets)
    clock = clock or cpu_sample
    started = time.perf_counter()
    before = clock()
    spreads: list[Spread] = []
    measured = tuple(measure_device(runner, t, plan, progress, steps, spreads) for t in targets)
    fits: tuple[CommFit, ...] = ()
    if len(targets) > 1:
        progress("transfers")
        fits = measure_transfers(runner, targets, plan, steps)
    noise = measured_noise(before, clock(), spreads, cuda=targets[0] != "cpu")
    spec = _spec(measured, fits, count)
    header = _header(command, runner.describe(), plan, measured, fits, count, when or datetime.now(UTC))
    text = dump_devices_yaml(spec, header + _noise_header(noise))
    return Calibration(
        measured=measured,
        fits=fits,
        spec=devices_from_yaml(text, "the calibrated device spec"),
        yaml=text,
        wall_s=time.perf_counter() - started,
        noise=noise,
    )


def _noise_header(noise: Noise) -> list[str]:
    """The header's lines on the machine's load and the repeats' spread; a warning when noisy."""
    lines = [f"noise: {noise.summary()}"]
    if noise.noisy:
        lines.append(
            "NOISY: written with --allow-noisy; the rates are likely low, recalibrate on an idle machine"
        )
    return lines


def _check_count(count: int, targets: Sequence[str]) -> None:
    if count < 1:
        raise InputError(f"--count {count}: must be at least 1")
    if count > 1 and len(targets) > 1:
        raise InputError("--count copies one measured device: give one device with --torch, or no --count")


# --- the spec and its YAML ------------------------------------------------------------


def _sig(value: float, digits: int = 4) -> float:
    """``value`` to ``digits`` significant digits: what the measurement's noise leaves of it."""
    return float(f"{value:.{digits}g}")


def device_name(target: str, index: int | None = None) -> str:
    """The name baechi writes into placed models for ``target``, or for copy ``index`` of it.

    >>> device_name("cpu"), device_name("cuda:3"), device_name("cuda:3", 1)
    ('/device:CPU:0', '/device:GPU:3', '/device:GPU:1')
    """
    kind = "CPU" if target == "cpu" else "GPU"
    if index is None:
        index = 0 if target == "cpu" else int(target.split(":")[1])
    return f"/device:{kind}:{index}"


def _spec(measured: Sequence[Measured], fits: Sequence[CommFit], count: int) -> DeviceSpec:
    def device(m: Measured, name: str) -> Device:
        return Device(
            name=name,
            memory_bytes=m.memory_bytes,
            flops=_sig(m.gemm_flops),
            memory_bandwidth=_sig(m.bandwidth),
            launch_overhead_us=_sig(m.launch_us),
            efficiency=(
                (CONV, _sig(m.conv_efficiency, 3)),
                (DEPTHWISE, _sig(m.depthwise_efficiency, 3)),
                (GEMM, _sig(m.gemm_efficiency, 3)),
                *([(NORM, _sig(m.norm_efficiency, 3))] if m.rates.norm_flops > 0 else []),
            ),
            overlap=m.overlap,
        )

    if count > 1:
        devices = tuple(device(measured[0], device_name(measured[0].target, i)) for i in range(count))
    else:
        devices = tuple(device(m, device_name(m.target)) for m in measured)
    if not fits:
        return DeviceSpec(devices, Interconnect())
    latency = _sig(statistics.median(f.latency_us for f in fits))
    bandwidth = _sig(statistics.median(f.bandwidth_bytes_per_us for f in fits))
    links = {}
    if len(fits) > 1:
        index = {m.target: i for i, m in enumerate(measured)}
        links = {
            (index[f.src], index[f.dst]): (_sig(f.latency_us), _sig(f.bandwidth_bytes_per_us)) for f in fits
        }
    return DeviceSpec(devices, Interconnect("parallel", latency, bandwidth, links))


def _power_of_2(n: int) -> str:
    """``2^22`` for 4194304; other numbers as they are."""
    return f"2^{n.bit_length() - 1}" if n > 0 and n & (n - 1) == 0 else str(n)


def _header(
    command: str,
    framework: str,
    plan: Plan,
    measured: Sequence[Measured],
    fits: Sequence[CommFit],
    count: int,
    when: datetime,
) -> list[str]:
    """The YAML's comment lines: how it was made and what each number is."""

    def rate(value: float, unit: str) -> str:
        return format_si(value, unit, sep=" ")

    sizes = ", ".join(str(n) for n in plan.gemm)
    widths = ", ".join(str(k) for m, k, n in plan.matmuls[::3])
    lines = [command] if command else []
    lines += [
        f"measured {when:%Y-%m-%d %H:%M} UTC with {framework}, float32; each time is the median of "
        f"{plan.repeats} runs after {plan.warmup} warm-up run{'' if plan.warmup == 1 else 's'}",
    ]
    for m in measured:
        memory = "physical memory" if m.target == "cpu" else "total memory"
        r, other = m.rates, m.other
        compute = "" if r.overlap else " (compute: each run's time less its bytes at memory_bandwidth)"
        lines += [
            f"{m.target}: {m.label}; memory: {memory}",
            f"  flops: best n x n matmul rate, n = {sizes}: {rate(r.gemm_flops, 'FLOP/s')} at n = {r.gemm_n}"
            + compute,
            f"  efficiency.gemm: {len(plan.matmuls)} matmuls of a transformer layer ([T, h] x [h, h], [h, 4h]; "
            f"[T, 4h] x [4h, h]; T = {plan.matmuls[0][0]}, h = {widths}), inputs cold (read from "
            f"{plan.pool_bytes / 2**20:g} MiB of distinct matrices): geometric mean rate "
            f"{rate(r.matmul_flops, 'FLOP/s')}",
            f"  efficiency.conv: conv2d forward + backward over {len(plan.conv)} ResNet-like shapes "
            f"({plan.conv[0]}, ...): {rate(r.conv_flops, 'FLOP/s')} (forward "
            f"{rate(r.conv_forward_flops, 'FLOP/s')}, backward {rate(r.conv_backward_flops, 'FLOP/s')})",
            f"  efficiency.depthwise: depthwise 3x3 conv2d forward + backward over {len(plan.depthwise)} "
            f"MobileNetV2 shapes ({plan.depthwise[0]}, ...): {rate(r.depthwise_flops, 'FLOP/s')}",
            *(
                [
                    f"  efficiency.norm: training-mode batch norm forward over {len(plan.norms)} ResNet-50 "
                    f"shapes ({'x'.join(map(str, plan.norms[0]))}, ...): {rate(r.norm_flops, 'FLOP/s')}"
                ]
                if r.norm_flops > 0
                else []
            ),
            f"  memory_bandwidth: a + b into a preallocated output, {_power_of_2(plan.elements)} float32 "
            "elements" + ("" if r.overlap else " (less its FLOPs at flops)"),
            f"  overlap: {str(r.overlap).lower()}: the matmuls' compute rates spread "
            f"{r.matmul_spread:.1%} with {'max' if r.overlap else 'the sum'} of compute and memory time, "
            f"{other.matmul_spread:.1%} with {'max' if other.overlap else 'the sum'}",
            f"  launch_overhead: a training step (forward, backward) of {plan.layers} nn.Linear({LAUNCH_WIDTH}, "
            f"{LAUNCH_WIDTH}) + nn.Tanh layers over the {Launch(plan.layers).ops()} ops baechi's --training "
            "charges for it",
        ]
    if count > 1:
        lines.append(f"{count} devices like {measured[0].target}")
    if not fits:
        default = Interconnect()
        lines.append(
            "interconnect: not measured (one device): baechi's default, Baechi's PCIe fit "
            f"({default.latency_us:g} us + {format_si(default.bandwidth_bytes_per_us * 1e6, 'B/s', 3, ' ')})"
        )
    else:
        exps = plan.transfer_exps
        lines.append(
            f"interconnect: dst.copy_(src) of 2^{exps[0]}..2^{exps[-1]} bytes, least-squares fit of "
            "latency + bytes / bandwidth per pair; defaults: the pairs' medians; parallel mode "
            "(contention not measured)"
        )
        lines += [f"  {f.src} -> {f.dst}: {f.summary()}" + (f" ({f.note})" if f.note else "") for f in fits]
    return lines


# --- PyTorch --------------------------------------------------------------------------


def physical_memory_bytes() -> int:
    """The machine's physical memory (``os.sysconf``); InputError where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        raise InputError("cannot read this machine's physical memory (os.sysconf)") from None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "CPU"


class TorchRunner:
    """:class:`Runner` on PyTorch; :meth:`open` imports torch and checks that it sees the devices."""

    def __init__(self, torch: Any, cuda: bool = False) -> None:
        self._torch = torch
        self._cuda = cuda  # whether the devices are CUDA devices
        self._pools: dict[tuple[str, int], Any] = {}  # (target, bytes) -> random float32 values

    def _pool(self, target: str, nbytes: int) -> Any:
        """``nbytes`` of random float32 values on ``target``, made once and shared by the cold matmuls."""
        key = (target, nbytes)
        if key not in self._pools:
            self._pools[key] = self._torch.randn(nbytes // _FLOAT32_BYTES, device=self._torch.device(target))
        return self._pools[key]

    @classmethod
    def open(cls, targets: Sequence[str]) -> TorchRunner:
        """A runner for ``targets`` (as :func:`parse_targets` gives them).

        MissingDependencyError without torch; InputError naming a CUDA device torch cannot see.
        """
        try:
            import torch
        except ImportError:
            raise MissingDependencyError(
                "calibration measures with PyTorch, which is not installed: pip install torch"
            ) from None
        for target in targets:
            if target == "cpu":
                continue
            if not torch.cuda.is_available():
                raise InputError(f"--torch {target}: torch {torch.__version__} sees no CUDA device here")
            visible = torch.cuda.device_count()
            if int(target.split(":")[1]) >= visible:
                raise InputError(
                    f"--torch {target}: torch sees {visible} CUDA device(s) here (cuda:0..cuda:{visible - 1})"
                )
        return cls(torch, cuda=targets[0] != "cpu")

    def describe(self) -> str:
        torch = self._torch
        if not self._cuda:
            return f"torch {torch.__version__}, {torch.get_num_threads()} threads"
        on = {True: "on", False: "off"}
        return (
            f"torch {torch.__version__} (CUDA {torch.version.cuda}; TF32: matmul "
            f"{on[bool(torch.backends.cuda.matmul.allow_tf32)]}, cuDNN {on[bool(torch.backends.cudnn.allow_tf32)]})"
        )

    def label(self, target: str) -> str:
        if target == "cpu":
            return f"{_cpu_model()}, {os.cpu_count()} CPUs"
        return str(self._torch.cuda.get_device_name(self._torch.device(target)))

    def memory_bytes(self, target: str) -> int:
        if target == "cpu":
            return physical_memory_bytes()
        return int(self._torch.cuda.get_device_properties(self._torch.device(target)).total_memory)

    def _sync(self, *targets: str) -> Callable[[], None]:
        """Wait for the CUDA devices among ``targets`` to finish their work (nothing for the CPU)."""
        torch = self._torch
        cuda = [torch.device(t) for t in targets if t != "cpu"]

        def sync() -> None:
            for device in cuda:
                torch.cuda.synchronize(device)

        return sync

    def prepare(self, target: str, kernel: Kernel) -> Callable[[], float]:
        torch = self._torch
        device = torch.device(target)
        sync = self._sync(target)

        def randn(*shape: int) -> Any:
            return torch.randn(*shape, device=device)

        work: Callable[[], Any]
        if isinstance(kernel, Gemm):
            a, b = randn(kernel.n, kernel.n), randn(kernel.n, kernel.n)

            def work() -> Any:
                return torch.mm(a, b)

        elif isinstance(kernel, Matmul):
            m, k, n = kernel.m, kernel.k, kernel.n
            pool, size = self._pool(target, kernel.pool_bytes), m * k + k * n
            if size > pool.numel():
                raise InputError(f"{describe_kernel(kernel)}: its inputs do not fit its pool")
            pairs = [
                (pool[o : o + m * k].view(m, k), pool[o + m * k : o + size].view(k, n))
                for o in range(0, pool.numel() - size + 1, size)
            ]
            turn = itertools.count()

            def work() -> Any:
                a, b = pairs[next(turn) % len(pairs)]
                return torch.mm(a, b)

        elif isinstance(kernel, Conv):
            s, pad = kernel.shape, kernel.shape.kernel // 2
            x, w = randn(s.batch, s.cin, s.size, s.size), randn(s.cout, s.cin // s.groups, s.kernel, s.kernel)
            if kernel.backward:
                dy = randn(s.batch, s.cout, s.size, s.size)

                def work() -> Any:
                    # dx and dw, no bias: what autograd runs for a conv2d's gradients.
                    return torch.ops.aten.convolution_backward(
                        dy,
                        x,
                        w,
                        None,
                        [1, 1],
                        [pad, pad],
                        [1, 1],
                        False,
                        [0, 0],
                        s.groups,
                        [True, True, False],
                    )

            else:

                def work() -> Any:
                    return torch.nn.functional.conv2d(x, w, padding=pad, groups=s.groups)

        elif isinstance(kernel, Norm):
            x = randn(*kernel.shape)
            channels = kernel.shape[1]
            weight, bias = torch.ones(channels, device=device), torch.zeros(channels, device=device)
            mean, var = torch.zeros(channels, device=device), torch.ones(channels, device=device)

            def work() -> Any:
                return torch.nn.functional.batch_norm(x, mean, var, weight, bias, training=True)

        elif isinstance(kernel, Add):
            a, b, out = randn(kernel.elements), randn(kernel.elements), randn(kernel.elements)

            def work() -> Any:
                return torch.add(a, b, out=out)

        elif isinstance(kernel, Launch):
            nn, layers = torch.nn, []
            for _ in range(kernel.layers):
                layers += [nn.Linear(LAUNCH_WIDTH, LAUNCH_WIDTH), nn.Tanh()]
            model, x = nn.Sequential(*layers).to(device), randn(1, LAUNCH_WIDTH)

            def work() -> Any:
                model.zero_grad(set_to_none=True)
                model(x).sum().backward()

        else:
            src = torch.ones(kernel.nbytes, dtype=torch.uint8, device=device)
            dst = torch.empty(kernel.nbytes, dtype=torch.uint8, device=torch.device(kernel.dst))
            sync = self._sync(target, kernel.dst)

            def work() -> Any:
                return dst.copy_(src)

        def run() -> float:
            sync()
            start = time.perf_counter()
            work()
            sync()
            return time.perf_counter() - start

        return run


def calibrate_torch(
    devices: str,
    *,
    count: int = 1,
    quick: bool = False,
    allow_noisy: bool = False,
    threads: int | None = None,
    command: str = "",
    progress: Callable[[str], None] = lambda stage: None,
    steps: Callable[[int, int], None] = lambda done, total: None,
) -> Calibration:
    """``baechi devices calibrate --torch DEVICES``: :func:`calibrate` with PyTorch and the default
    (or ``quick``) plan of the first device, on ``threads`` CPU threads (None: torch's); a noisy
    one refused unless ``allow_noisy`` (:func:`refuse_noise`). Errors as in the module docstring."""
    targets = parse_targets(devices)
    _check_count(count, targets)  # before torch's import, which takes seconds
    runner = TorchRunner.open(targets)
    if threads is not None:  # a rank of baechi verify --torch runs with its share of the cores
        import torch

        torch.set_num_threads(threads)
    result = calibrate(
        targets,
        runner,
        plan_for(targets[0], quick),
        count=count,
        command=command,
        progress=progress,
        steps=steps,
    )
    if not allow_noisy:
        refuse_noise(result)
    return result
