"""DeviceSpec: what the ops are placed on, and how tensors move between them.

``--devices`` accepts:

* counts and sizes: ``4x8GB``, ``2x16GB,2x8GB``, ``8GiB`` (one device);
* a preset name (see :data:`PRESETS`, e.g. ``rtx2080x4``);
* a YAML file (schema in docs/devices.md).

Sizes follow SI/IEC: ``8GB`` = 8e9 bytes, ``8GiB`` = 8 * 2**30 bytes. A
spec holds at most :data:`MAX_DEVICES` devices. Every problem is an
:class:`~baechi_cli.core.errors.InputError` on one line, naming the file or the
``--devices`` value and the key; a value it quotes is cut to
:data:`QUOTED` characters.

A device may carry an *efficiency* table: per compute class
(:data:`COMPUTE_CLASSES`: ``conv``, ``gemm``, ``depthwise``) a factor on its
``flops`` for the ops of that class (:meth:`Device.flops_for`; ``depthwise``
left out takes ``conv``'s); ops of no class run at ``flops``. ``baechi devices calibrate`` measures one
(:mod:`baechi_cli.app.calibrate`); :func:`dump_devices_yaml` writes any spec
back as YAML.

*Overlap*: whether an op's compute and its memory traffic overlap (``True``, the
default: the roofline's max of the two times) or add up (``False``: their sum, what a
calibrated CPU measures for the matmuls of a model's step; :func:`~baechi_cli.costs.analytic.op_time_us`).

Communication: moving ``b`` bytes between two different devices takes
``latency + b / bandwidth`` µs (a per-pair ``links`` entry overrides the
defaults); the same device costs nothing. The default is the fit Baechi
measured on its PCIe testbed: 134 µs + 0.0001754 µs/byte (5.70 GB/s).

Example:
    >>> spec = parse_devices("2x16GB,2x8GB")
    >>> [d.memory_bytes for d in spec.devices]
    [16000000000, 16000000000, 8000000000, 8000000000]
    >>> round(spec.interconnect.transfer_time(1_000_000, 0, 1), 1)
    309.4
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from baechi_cli.core.errors import InputError, truncate

# Baechi's fitted PCIe model (SoCC'20): 0.0001754 µs/byte + 134 µs.
DEFAULT_LATENCY_US = 134.0
DEFAULT_BANDWIDTH_BYTES_PER_US = 1.0 / 0.0001754
# A device given only by its memory is modelled as an RTX 2080 (Baechi's GPU):
# 10.07 TFLOP/s FP32 peak, 448 GB/s memory bandwidth (datasheet numbers).
DEFAULT_FLOPS = 10.07e12
DEFAULT_MEMORY_BANDWIDTH = 448e9
# Fixed cost of launching one op (kernel launch + framework dispatch).
DEFAULT_LAUNCH_OVERHEAD_US = 5.0

COMM_MODES = ("parallel", "sequential")

# Far more devices than a placement uses (placers cost O(ops x (devices used + kinds)) whatever the
# count, see DeviceSpec.classes); the bound keeps a spec like 10000000000x8GB from allocating.
MAX_DEVICES = 65536
# Characters of a user's value an error message quotes.
QUOTED = 60

# Compute classes: kinds of kernel that reach a FLOP rate of their own. The
# cost rules tag their op types with one (costs/registry.py); a device's
# efficiency table scales its flops per class.
CONV = "conv"
GEMM = "gemm"
# Depthwise (grouped) convolutions: a few FLOPs per byte, and kernels far below the dense
# ones' rate (on 2 CPU cores, 3-15 GFLOP/s against 110 for ResNet's 3x3 convs).
DEPTHWISE = "depthwise"
NORM = "norm"  # a batch norm in training mode (batch statistics), forward and gradient
COMPUTE_CLASSES = (CONV, GEMM, DEPTHWISE, NORM)
# A class a device's table leaves out runs at the factor of the class it refines, if any:
# a spec calibrated before depthwise was measured keeps timing depthwise ops as convolutions.
_REFINES = {DEPTHWISE: CONV}


@dataclass(frozen=True)
class Device:
    name: str  # written into NodeDef.device
    memory_bytes: int
    flops: float = DEFAULT_FLOPS  # peak FLOP/s
    memory_bandwidth: float = DEFAULT_MEMORY_BANDWIDTH  # bytes/s
    launch_overhead_us: float = DEFAULT_LAUNCH_OVERHEAD_US
    # (compute class, factor on flops) pairs, sorted by class; a class not listed runs at flops.
    # A tuple, not a dict, so that the dataclass stays hashable.
    efficiency: tuple[tuple[str, float], ...] = ()
    # Whether an op's compute and memory traffic overlap (the roofline's max) or add up (False).
    overlap: bool = True
    # Devices with the same compute characteristics share a kind (see _kind). Set from the
    # fields above; a plain attribute, as placers and the simulator ask it of every device.
    kind: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "kind",
            _kind(self.flops, self.memory_bandwidth, self.launch_overhead_us, self.efficiency, self.overlap),
        )

    def flops_for(self, compute_class: str) -> float:
        """FLOP/s for an op of ``compute_class`` ("" for none): ``flops`` times its efficiency, if
        any, else the efficiency of the class it refines (``depthwise``: ``conv``'s). A grouped
        convolution of N input channels per group (``grouped/N``) runs between ``depthwise``'s
        rate (N = 1) and ``conv``'s (N = :data:`GROUPED_AS_DENSE`, the calibration's dense convs'
        channels), geometrically in log N.

        >>> d = Device("d", 1, flops=1e12, efficiency=(("conv", 0.5),))
        >>> d.flops_for("conv"), d.flops_for("gemm"), d.flops_for(""), d.flops_for("depthwise")
        (500000000000.0, 1000000000000.0, 1000000000000.0, 500000000000.0)
        >>> g = Device("g", 1, flops=1e12, efficiency=(("conv", 1.0), ("depthwise", 0.01)))
        >>> round(g.flops_for("grouped/8") / 1e9)  # 8 of 64 channels: halfway in log, 10% of conv's
        100
        """
        base, _, per_group = compute_class.partition("/")
        if base == "grouped" and per_group.isdigit():  # between depthwise (1 per group) and conv
            low, high = self.flops_for("depthwise"), self.flops_for("conv")
            share = min(math.log(int(per_group)) / math.log(GROUPED_AS_DENSE), 1.0)
            return low * (high / low) ** share
        while compute_class:
            for name, factor in self.efficiency:
                if name == compute_class:
                    return self.flops * factor
            compute_class = _REFINES.get(compute_class, "")
        return self.flops


#: Input channels per group from which a grouped convolution runs as a dense one (the calibrated
#: conv shapes' 64 channels; Device.flops_for).
GROUPED_AS_DENSE = 64


@functools.cache  # a spec has few kinds, and thousands of devices of each
def _kind(
    flops: float, memory_bandwidth: float, launch_overhead_us: float, efficiency: tuple, overlap: bool = True
) -> str:
    """A device's :attr:`Device.kind`: its compute characteristics as text.

    >>> Device("d", 1, 1e12, 1e11, 2.0, (("conv", 0.5),)).kind
    '1e+12F/1e+11B/2us/conv0.5'
    >>> Device("d", 1, 1e12, 1e11, 2.0, overlap=False).kind
    '1e+12F/1e+11B/2us/sum'
    """
    classes = "".join(f"/{name}{factor:g}" for name, factor in efficiency)
    return f"{flops:g}F/{memory_bandwidth:g}B/{launch_overhead_us:g}us{classes}{'' if overlap else '/sum'}"


@dataclass(frozen=True)
class Interconnect:
    mode: str = "parallel"  # or "sequential": one channel per device
    latency_us: float = DEFAULT_LATENCY_US
    bandwidth_bytes_per_us: float = DEFAULT_BANDWIDTH_BYTES_PER_US
    # (a, b) device indices with a < b -> (latency µs, bandwidth bytes/µs)
    links: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)

    def transfer_time(self, nbytes: int, src: int, dst: int) -> float:
        """µs to move ``nbytes`` from device ``src`` to device ``dst``."""
        if src == dst:
            return 0.0
        link = self.links.get((src, dst) if src < dst else (dst, src))
        if link is None:
            return self.latency_us + nbytes / self.bandwidth_bytes_per_us
        return link[0] + nbytes / link[1]


@dataclass(frozen=True)
class DeviceSpec:
    devices: tuple[Device, ...]
    interconnect: Interconnect = Interconnect()
    source: str = ""  # what the user wrote

    @property
    def count(self) -> int:
        return len(self.devices)

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.devices]

    @property
    def total_memory(self) -> int:
        return sum(d.memory_bytes for d in self.devices)

    @property
    def homogeneous(self) -> bool:
        return len({d.kind for d in self.devices}) == 1

    def classes(self, memory_bytes: Sequence[int] | None = None) -> list[int]:
        """A class number per device: devices of one class are interchangeable for a placer.

        Two devices are interchangeable when they have the same kind (so every
        op takes as long on either), the same ``memory_bytes[d]`` (a placer's
        budget; the devices' memory when None) and no per-pair ``links``
        entry (so every transfer to or from either takes as long); a device a
        link names is a class of its own. Classes are numbered in order of
        their lowest device. A placer may then, while several devices of a
        class hold nothing, look at the lowest of them only: the others would
        offer the same times and lose the tie on the device index.
        O(devices + links).

        >>> parse_devices("2x16GB,2x8GB").classes()
        [0, 0, 1, 1]
        >>> parse_devices("4x8GB").classes([8, 8, 6, 8])
        [0, 0, 1, 0]
        """
        memory = tuple(d.memory_bytes for d in self.devices) if memory_bytes is None else tuple(memory_bytes)
        out = self._classes.get(memory)
        if out is None:  # every list schedule asks, with one of a few budgets
            linked = {d for pair in self.interconnect.links for d in pair}
            number: dict[tuple, int] = {}
            out = self._classes[memory] = []
            for d, (device, nbytes) in enumerate(zip(self.devices, memory)):
                key = (d,) if d in linked else (device.kind, nbytes)  # (d,) matches no other device
                out.append(number.setdefault(key, len(number)))
        return list(out)

    @functools.cached_property
    def _classes(self) -> dict[tuple[int, ...], list[int]]:
        return {}

    def with_memory(self, memory_bytes: Sequence[int]) -> DeviceSpec:
        """The same devices holding ``memory_bytes[i]`` each (a placer's budget); ``self`` when unchanged.

        Remembered per ``memory_bytes``: every candidate of a search asks for the same few. O(D).
        """
        key = tuple(memory_bytes)
        if key == tuple(d.memory_bytes for d in self.devices):
            return self
        spec = self._with_memory.get(key)
        if spec is None:
            devices = tuple(
                d if d.memory_bytes == b else replace(d, memory_bytes=b) for d, b in zip(self.devices, key)
            )
            spec = self._with_memory[key] = replace(self, devices=devices)
        return spec

    @functools.cached_property
    def _with_memory(self) -> dict[tuple[int, ...], DeviceSpec]:
        return {}

    def with_comm_mode(self, mode: str) -> DeviceSpec:
        if mode not in COMM_MODES:
            raise InputError(f"unknown communication mode '{mode}' (use parallel or sequential)")
        return replace(self, interconnect=replace(self.interconnect, mode=mode))


# --- units ------------------------------------------------------------------

_SIZE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SI = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_TIME_UNITS = {"us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6, "ns": 1e-3}
_NUMBER = r"(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)"


def _quote(value: Any) -> str:
    """A user's value for an error message: its text, cut to :data:`QUOTED` characters."""
    return truncate(str(value), QUOTED)


def _as_float(value: int | float) -> float:
    """``float(value)``; an integer beyond the float range is infinite (float() raises)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def parse_size(text: Any, what: str = "size") -> int:
    """``8GB`` -> 8_000_000_000, ``8GiB`` -> 8 * 2**30, ``123`` -> 123 (bytes); at least 1 byte."""
    if isinstance(text, bool):
        raise InputError(f"{what} {text!r} is not a size (use e.g. 8GB, 8GiB or a byte count)")
    if isinstance(text, int):
        value = _as_float(text)
    else:
        m = re.fullmatch(_NUMBER + r"\s*([A-Za-z]*)", str(text).strip())
        if not m or m.group(2).upper() not in _SIZE_UNITS:
            raise InputError(f"{what} '{_quote(text)}' is not a size (use e.g. 8GB, 8GiB or a byte count)")
        value = float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()]
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{what} '{_quote(text)}' must be positive and finite")
    if round(value) < 1:
        raise InputError(f"{what} '{_quote(text)}' is less than one byte")
    return int(round(value))


def parse_rate(text: Any, what: str, per_second_suffix: str) -> float:
    """``13.4T`` -> 1.34e13; ``448GB/s`` -> 4.48e11 (units per second)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = _as_float(text)
    else:
        s = str(text).strip()
        if s.endswith("/s"):
            s = s[:-2]
        s = s.removesuffix(per_second_suffix).removesuffix(per_second_suffix.upper())
        if per_second_suffix == "B" and re.search(r"[iI]$", s):
            raise InputError(f"{what} '{_quote(text)}': use SI prefixes (GB/s), not IEC")
        m = re.fullmatch(_NUMBER + r"\s*([KMGTP]?)", s, flags=re.IGNORECASE)
        if not m:
            raise InputError(f"{what} '{_quote(text)}' is not a rate (e.g. 13.4T or 448GB/s)")
        value = float(m.group(1)) * _SI[m.group(2).upper()]
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{what} '{_quote(text)}' must be positive and finite")
    return value


def parse_time_us(text: Any, what: str) -> float:
    """``134us`` / ``0.134ms`` / ``134`` (µs) -> 134.0."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = _as_float(text)
    else:
        m = re.fullmatch(_NUMBER + r"\s*(us|µs|ms|s|ns)?", str(text).strip())
        if not m:
            raise InputError(f"{what} '{_quote(text)}' is not a time (e.g. 134us or 0.2ms)")
        value = float(m.group(1)) * _TIME_UNITS[m.group(2) or "us"]
    if not math.isfinite(value) or value < 0:
        raise InputError(f"{what} '{_quote(text)}' must be a non-negative, finite time")
    return value


# --- presets ----------------------------------------------------------------


def _preset(
    count: int, memory: int, flops: float, bw: float, mode: str, lat: float, link_bw: float, doc: str
):
    devices = tuple(Device(f"/device:GPU:{i}", memory, flops, bw) for i in range(count))
    return DeviceSpec(devices, Interconnect(mode, lat, link_bw)), doc


# Datasheet peak FP32 numbers; interconnects are effective point-to-point rates.
PRESETS: dict[str, tuple[DeviceSpec, str]] = {
    "rtx2080x4": _preset(
        4,
        8 * 2**30,
        10.07e12,
        448e9,
        "sequential",
        DEFAULT_LATENCY_US,
        DEFAULT_BANDWIDTH_BYTES_PER_US,
        "Baechi's testbed: 4x RTX 2080 8 GiB, shared PCIe without NVLink (134 us + 5.70 GB/s, sequential)",
    ),
    "v100x4": _preset(
        4,
        16 * 2**30,
        15.7e12,
        900e9,
        "parallel",
        10.0,
        25e3,
        "4x V100 16 GiB over NVLink (10 us + 25 GB/s per pair, parallel)",
    ),
    "t4x4": _preset(
        4,
        16 * 2**30,
        8.1e12,
        320e9,
        "sequential",
        20.0,
        12e3,
        "4x T4 16 GiB over PCIe 3.0 (20 us + 12 GB/s, sequential)",
    ),
    "a100x8": _preset(
        8,
        80 * 2**30,
        19.5e12,
        2039e9,
        "parallel",
        8.0,
        300e3,
        "8x A100 80 GiB over NVSwitch (8 us + 300 GB/s, parallel)",
    ),
    "h100x8": _preset(
        8,
        80 * 2**30,
        67e12,
        3.35e12,
        "parallel",
        8.0,
        450e3,
        "8x H100 SXM 80 GiB over NVSwitch (8 us + 450 GB/s, parallel)",
    ),
}


# --- parsing ------------------------------------------------------------------


def parse_devices(spec: str) -> DeviceSpec:
    """Parse a ``--devices`` value: counts x sizes, a preset, or a YAML file."""
    text = spec.strip()
    if not text:
        raise InputError("--devices is empty (use e.g. 4x8GB, a preset or a YAML file)")
    if text in PRESETS:
        return replace(PRESETS[text][0], source=text)
    if text.endswith((".yaml", ".yml")) or os.path.isfile(text):
        return load_devices_yaml(text)
    devices: list[Device] = []
    for term in text.split(","):
        term = term.strip()
        m = re.fullmatch(r"(?:(\d+)\s*[xX*]\s*)?(.+)", term)
        digits = (m.group(1) if m and m.group(1) else "1").lstrip("0") or "0"
        # Compare lengths first: int() refuses strings of thousands of digits.
        count = int(digits) if len(digits) <= len(str(MAX_DEVICES)) else MAX_DEVICES + 1
        if count < 1:
            raise InputError(
                f"--devices '{_quote(spec)}': device count in '{_quote(term)}' must be at least 1"
            )
        if len(devices) + count > MAX_DEVICES:
            raise InputError(f"--devices '{_quote(spec)}': more than {MAX_DEVICES} devices")
        try:
            memory = parse_size(m.group(2) if m else term, "memory")
        except InputError as err:
            presets = ", ".join(PRESETS)
            raise InputError(
                f"--devices '{_quote(spec)}': {err.problem}; or name a preset ({presets}) or a YAML file"
            ) from None
        for _ in range(count):
            devices.append(Device(f"/device:GPU:{len(devices)}", memory))
    return DeviceSpec(tuple(devices), Interconnect(), source=text)


_DEVICE_KEYS = {
    "name",
    "memory",
    "flops",
    "memory_bandwidth",
    "launch_overhead",
    "efficiency",
    "overlap",
    "count",
}
_INTERCONNECT_KEYS = {"mode", "latency", "bandwidth", "links"}
_LINK_KEYS = {"a", "b", "latency", "bandwidth"}


def load_devices_yaml(path: str) -> DeviceSpec:
    """Read the YAML device schema of docs/DESIGN.md; every error names the file and key."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise InputError("device file not found", path=path) from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read device file: {err}", path=path) from None
    return devices_from_yaml(text, path)


def devices_from_yaml(text: str, source: str) -> DeviceSpec:
    """The DeviceSpec of YAML ``text`` (the schema of docs/DESIGN.md); errors name ``source`` and the key.

    >>> devices_from_yaml("devices: {count: 2, memory: 1GB, efficiency: {conv: 0.5}}", "d.yaml").count
    2
    >>> devices_from_yaml("devices: [{memory: 1GB, launch_overhead: 0us}]", "d.yaml")
    Traceback (most recent call last):
    ...
    baechi_cli.core.errors.InputError: d.yaml: devices[0].launch_overhead '0us' must be positive
    """
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise InputError(f"not valid YAML{where}", path=source) from None
    except (ValueError, RecursionError):  # an integer of thousands of digits; absurdly deep nesting
        raise InputError("not valid YAML (a number too long or nesting too deep)", path=source) from None
    try:
        return _spec_from_doc(doc, source)
    except InputError as err:
        raise err.with_path(source) from None


def _check_keys(obj: Any, allowed: set[str], where: str) -> dict:
    if not isinstance(obj, dict):
        raise InputError(f"{where} must be a mapping")
    # YAML keys may be numbers, dates or null as well as strings: report the first in file order.
    unknown = [key for key in obj if key not in allowed]
    if unknown:
        raise InputError(
            f"{where}: unknown key '{_quote(unknown[0])}' (allowed: {', '.join(sorted(allowed))})"
        )
    return obj


def _device_from_doc(d: dict, index: int, where: str) -> Device:
    if "memory" not in d:
        raise InputError(f"{where}: 'memory' is required")
    return Device(
        name=str(d.get("name", f"/device:GPU:{index}")),
        memory_bytes=parse_size(d["memory"], f"{where}.memory"),
        flops=parse_rate(d.get("flops", DEFAULT_FLOPS), f"{where}.flops", "FLOPS"),
        memory_bandwidth=parse_rate(
            d.get("memory_bandwidth", DEFAULT_MEMORY_BANDWIDTH), f"{where}.memory_bandwidth", "B"
        ),
        launch_overhead_us=_positive_time_us(
            d.get("launch_overhead", DEFAULT_LAUNCH_OVERHEAD_US), f"{where}.launch_overhead"
        ),
        efficiency=_efficiency(d.get("efficiency"), f"{where}.efficiency"),
        overlap=_flag(d.get("overlap", True), f"{where}.overlap"),
    )


def _flag(value: Any, what: str) -> bool:
    """A YAML boolean (``true``/``false``); InputError for anything else (``"no"`` quoted, ``0``)."""
    if not isinstance(value, bool):
        raise InputError(f"{what} '{_quote(value)}' must be true or false")
    return value


def _positive_time_us(text: Any, what: str) -> float:
    """:func:`parse_time_us`, zero refused: every kernel launch costs something."""
    value = parse_time_us(text, what)
    if value == 0:
        raise InputError(f"{what} '{_quote(text)}' must be positive")
    return value


def _efficiency(table: Any, where: str) -> tuple[tuple[str, float], ...]:
    """``{conv: 0.6}`` -> ``(("conv", 0.6),)``: known classes, positive finite factors, sorted."""
    if table is None:  # absent, or an empty ``efficiency:``
        return ()
    _check_keys(table, set(COMPUTE_CLASSES), where)
    pairs = []
    for name, factor in sorted(table.items()):
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            raise InputError(
                f"{where}.{name} '{_quote(factor)}' is not a number (a factor on flops, e.g. 0.6)"
            )
        if not math.isfinite(_as_float(factor)) or factor <= 0:
            raise InputError(f"{where}.{name} '{_quote(factor)}' must be positive and finite")
        pairs.append((name, float(factor)))
    return tuple(pairs)


def _spec_from_doc(doc: Any, source: str) -> DeviceSpec:
    top = _check_keys(doc, {"devices", "interconnect"}, "the top level")
    if "devices" not in top:
        raise InputError("'devices' is required")
    raw = top["devices"]
    devices: list[Device] = []
    if isinstance(raw, dict):  # one template with a count
        _check_keys(raw, _DEVICE_KEYS, "devices")
        count = raw.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_DEVICES:
            raise InputError(
                f"devices.count must be an integer from 1 to {MAX_DEVICES}, got {_quote(repr(count))}"
            )
        if "name" in raw and count > 1:
            raise InputError("devices.name cannot be used with count > 1 (names must be unique)")
        devices = [_device_from_doc(raw, i, "devices") for i in range(count)]
    elif isinstance(raw, list) and raw:
        if len(raw) > MAX_DEVICES:
            raise InputError(f"'devices' lists {len(raw)} devices, more than {MAX_DEVICES}")
        for i, d in enumerate(raw):
            _check_keys(d, _DEVICE_KEYS - {"count"}, f"devices[{i}]")
            devices.append(_device_from_doc(d, i, f"devices[{i}]"))
    else:
        raise InputError("'devices' must be a non-empty list or a mapping with a count")
    names = [d.name for d in devices]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InputError(f"device name '{_quote(name)}' is used twice")
        seen.add(name)

    ic = _check_keys(top.get("interconnect") or {}, _INTERCONNECT_KEYS, "interconnect")
    mode = str(ic.get("mode", "parallel"))
    if mode not in COMM_MODES:
        raise InputError(f"interconnect.mode '{_quote(mode)}' must be parallel or sequential")
    latency = parse_time_us(ic.get("latency", DEFAULT_LATENCY_US), "interconnect.latency")
    bandwidth = (
        parse_rate(ic["bandwidth"], "interconnect.bandwidth", "B") / 1e6
        if "bandwidth" in ic
        else DEFAULT_BANDWIDTH_BYTES_PER_US
    )
    links: dict[tuple[int, int], tuple[float, float]] = {}
    raw_links = ic.get("links") or []
    if not isinstance(raw_links, list):
        raise InputError("interconnect.links must be a list")
    for i, link in enumerate(raw_links):
        where = f"interconnect.links[{i}]"
        _check_keys(link, _LINK_KEYS, where)
        a, b = (_device_ref(link.get(k), names, f"{where}.{k}") for k in ("a", "b"))
        if a == b:
            raise InputError(f"{where}: a link needs two different devices")
        links[(min(a, b), max(a, b))] = (
            parse_time_us(link.get("latency", latency), f"{where}.latency"),
            parse_rate(link["bandwidth"], f"{where}.bandwidth", "B") / 1e6
            if "bandwidth" in link
            else bandwidth,
        )
    return DeviceSpec(tuple(devices), Interconnect(mode, latency, bandwidth, links), source=source)


def _device_ref(ref: Any, names: list[str], where: str) -> int:
    if isinstance(ref, int) and not isinstance(ref, bool) and 0 <= ref < len(names):
        return ref
    if isinstance(ref, str) and ref in names:
        return names.index(ref)
    raise InputError(f"{where}: '{_quote(ref)}' is not a device name or index")


# --- writing --------------------------------------------------------------------

_PREFIXES = (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3))


def format_si(value: float, unit: str, digits: int = 4, sep: str = "") -> str:
    """``value`` with an SI prefix and ``unit`` to ``digits`` significant digits (``sep`` between
    the number and the prefix).

    >>> format_si(8.531e10, ""), format_si(1.02e10, "B/s"), format_si(512.0, "B/s")
    ('85.31G', '10.2GB/s', '512B/s')
    >>> format_si(85312345678.9, "FLOP/s", sep=" ")
    '85.31 GFLOP/s'
    """
    prefix, scale = _prefix(value)
    return f"{value / scale:.{digits}g}{sep}{prefix}{unit}"


def _prefix(value: float) -> tuple[str, float]:
    return next(((p, s) for p, s in _PREFIXES if abs(value) >= s), ("", 1.0))


def _exact_rate(stored: float, unit: str, per: float = 1.0) -> str | float:
    """The shortest SI form of ``stored * per`` that reads back (:func:`parse_rate`, then ``/ per``)
    as ``stored`` exactly; the bare number where none does.

    >>> _exact_rate(2.5e12, "B/s"), _exact_rate(2039e9, "B/s"), _exact_rate(1 / 0.0001754, "B/s", per=1e6)
    ('2.5TB/s', '2039GB/s', '5.701254275940707GB/s')
    """
    value = stored * per
    prefixes = [(p, s) for p, s in (*_PREFIXES, ("", 1.0)) if abs(value) >= s or not p]
    for digits in range(1, 18):  # the fewest digits, then the largest prefix
        for prefix, scale in prefixes:
            mantissa = f"{value / scale:.{digits}g}"
            if float(mantissa) * scale / per == stored:
                return f"{mantissa}{prefix}{unit}"
    return value


def _exact_time(us: float) -> str:
    """The shortest form of ``us`` that :func:`parse_time_us` reads back exactly: ``134us``."""
    return next(t for t in (f"{us:.{d}g}" for d in range(1, 18)) if float(t) == us) + "us"


def dump_devices_yaml(spec: DeviceSpec, comments: Sequence[str] = ()) -> str:
    """``spec`` as a device YAML that :func:`devices_from_yaml` reads back, after ``comments`` as ``#`` lines.

    Every device is listed with every key (``overlap`` only when false), each number in the shortest form
    that reads back as the same float, so the text reads back as ``spec``
    and writing that again gives the same text. The interconnect's latency
    and bandwidth are left out where they are the defaults (Baechi's PCIe
    fit).

    >>> print(dump_devices_yaml(parse_devices("1x8GB"), ["one device"]), end="")
    # one device
    devices:
    - name: /device:GPU:0
      memory: 8000000000
      flops: 10.07T
      memory_bandwidth: 448GB/s
      launch_overhead: 5us
    interconnect:
      mode: parallel
    """
    import yaml

    devices: list[dict[str, Any]] = []
    for d in spec.devices:
        entry: dict[str, Any] = {
            "name": d.name,
            "memory": d.memory_bytes,
            "flops": _exact_rate(d.flops, ""),
            "memory_bandwidth": _exact_rate(d.memory_bandwidth, "B/s"),
            "launch_overhead": _exact_time(d.launch_overhead_us),
        }
        if d.efficiency:
            entry["efficiency"] = dict(d.efficiency)
        if not d.overlap:
            entry["overlap"] = False
        devices.append(entry)
    ic = spec.interconnect
    interconnect: dict[str, Any] = {"mode": ic.mode}
    if ic.latency_us != DEFAULT_LATENCY_US:
        interconnect["latency"] = _exact_time(ic.latency_us)
    if ic.bandwidth_bytes_per_us != DEFAULT_BANDWIDTH_BYTES_PER_US:
        interconnect["bandwidth"] = _exact_rate(ic.bandwidth_bytes_per_us, "B/s", per=1e6)
    if ic.links:
        interconnect["links"] = [
            {
                "a": spec.devices[a].name,
                "b": spec.devices[b].name,
                "latency": _exact_time(latency),
                "bandwidth": _exact_rate(bandwidth, "B/s", per=1e6),
            }
            for (a, b), (latency, bandwidth) in sorted(ic.links.items())
        ]
    body = yaml.safe_dump(
        {"devices": devices, "interconnect": interconnect},
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
    )
    return "".join(f"# {line}\n" if line else "#\n" for line in comments) + body
