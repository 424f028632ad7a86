"""Per-op-type counting rules for the analytic cost model: the registry.

Contract. A rule is a small function keyed by an op type (tf2onnx-handler
style: ``@register("Conv2D", kind=FLOPS)``). It sees one op through an
:class:`OpView` -- op type, decoded attrs, and the shape, dtype and bytes of
each data input and each output -- and returns an :class:`OpCount`: FLOPs
(2 per multiply-add), bytes read, bytes written, temporary bytes and
persistent bytes. Rules count; they know nothing about devices (turning counts
into time is :mod:`baechi_cli.costs.analytic`'s job, as in XLA's
HloCostAnalysis). A rule that lacks the shapes or attrs it needs raises
:class:`CannotCount`; :func:`count_view` then counts :func:`bytes_only` and
says so, for the caller to report the op (it does the same for the
:data:`RULE_FAILURES`, so malformed attrs in an input graph never crash costing).
The rules themselves are in :data:`RULE_MODULES`; this module holds the rule types,
:func:`register`, the name tables, the lookups and the helpers the rule modules share.

Op sets. An op type means something only within its op set (TensorFlow's ``Sum`` is a
reduction, ONNX's a variadic add), so each name is registered in one table of
:data:`OP_SETS` and looked up with :func:`rule_for` ``(op_type, op_set)``: ``tensorflow``
(:data:`RULES`, :mod:`~baechi_cli.costs.rules_tf`), ``onnx`` (:data:`ONNX_RULES`,
:mod:`~baechi_cli.costs.rules_onnx`, reusing TensorFlow's rules through adapters,
:attr:`RuleEntry.shares`) and ``aten`` (:data:`ATEN_RULES`, :mod:`~baechi_cli.costs.rules_aten`:
PyTorch's ``aten.mm``, ...). Op types with no rule get :data:`NO_RULE` (:func:`bytes_only`).

Loading. Rule modules import this module to register, so this one imports them only
inside the first lookup (:func:`rule_for`, :func:`name_table`, ...): no import cycle. Read
:data:`RULES` / :data:`ONNX_RULES` directly only after a lookup; :func:`name_table` is the
loaded table of an op set.

Every rule has a *kind*, which the coverage report and the device model read: ``flops``
(counted from shapes), ``bytes`` (memory-bound), ``zero`` (bookkeeping that launches no
kernel: ``OpCount()`` by definition) or ``variable`` (persistent bytes only). Some rules
carry a *compute class* (``conv``, ``depthwise``, ``gemm``: :data:`COMPUTE_CLASS_OF` or
:func:`register`'s ``compute_class``, refined per op by :func:`op_compute_class`) that a
device's ``efficiency`` table scales its ``flops`` for. Temporary bytes are set only where
TensorFlow's kernel allocates scratch of a size known from shapes; COVERAGE.md lists them.

Shapes are tuples of ints; ``None`` (unknown rank) or a negative dimension
(unknown size) makes a shape unknown. Every rule is O(rank + inputs);
:func:`rule_for` is one dict lookup (after the one-time load).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from baechi_cli.core.devices import CONV, DEPTHWISE, GEMM, NORM

Shape = tuple[int, ...]

FLOPS = "flops"
BYTES = "bytes"
ZERO = "zero"
VARIABLE = "variable"
UNCOVERED = "uncovered"
KINDS = (FLOPS, BYTES, ZERO, VARIABLE)
# Kinds whose ops run no kernel: the device model charges them nothing.
NO_KERNEL_KINDS = frozenset({ZERO, VARIABLE})


# OpCount and OpView are NamedTuples, not frozen dataclasses: one of each is
# built per op, and a frozen dataclass's __init__ is several times slower.
class OpCount(NamedTuple):
    """What one op costs, device-independently. Memory in bytes."""

    flops: float = 0.0
    bytes_read: int = 0
    bytes_written: int = 0
    temporary_bytes: int = 0
    persistent_bytes: int = 0


class OpView(NamedTuple):
    """One op as a rule sees it: data inputs only (no control inputs), in NodeDef order."""

    op_type: str
    attrs: Mapping[str, Any]
    input_shapes: Sequence[Shape | None]
    input_dtypes: Sequence[str]
    input_bytes: Sequence[int]
    output_shapes: Sequence[Shape | None]
    output_dtypes: Sequence[str]
    output_bytes: Sequence[int]


class CannotCount(Exception):
    """A rule lacks a shape or attr it needs; the op falls back to :func:`bytes_only`."""


Rule = Callable[[OpView], OpCount]


@dataclass(frozen=True, slots=True)
class RuleEntry:
    op_type: str
    kind: str
    fn: Rule
    note: str  # one line for the coverage table
    # For an ONNX op counted by a TensorFlow op's rule: that TensorFlow op type.
    shares: str = ""
    # The compute class of its kernels (COMPUTE_CLASS_OF), "" for none.
    compute_class: str = ""


TENSORFLOW = "tensorflow"
ONNX = "onnx"
ATEN = "aten"
OP_SETS = (TENSORFLOW, ONNX, ATEN)

# The name tables, op type -> rule, one per op set, filled as RULE_MODULES load (see the module docstring).
RULES: dict[str, RuleEntry] = {}
ONNX_RULES: dict[str, RuleEntry] = {}
ATEN_RULES: dict[str, RuleEntry] = {}
_NAME_TABLES = {TENSORFLOW: RULES, ONNX: ONNX_RULES, ATEN: ATEN_RULES}

#: Compute class by TensorFlow op type (see the module docstring); :func:`register` tags the rules with it.
COMPUTE_CLASS_OF: dict[str, str] = {
    **dict.fromkeys(
        "Conv2D Conv3D "
        "Conv2DBackpropInput Conv2DBackpropInputV2 Conv3DBackpropInput Conv3DBackpropInputV2 "
        "Conv2DBackpropFilter Conv2DBackpropFilterV2 Conv3DBackpropFilter Conv3DBackpropFilterV2".split(),
        CONV,
    ),
    **dict.fromkeys(
        "DepthwiseConv2dNative DepthwiseConv2dNativeBackpropInput DepthwiseConv2dNativeBackpropFilter".split(),
        DEPTHWISE,
    ),
    **dict.fromkeys("MatMul SparseMatMul BatchMatMul BatchMatMulV2 BatchMatMulV3 Einsum".split(), GEMM),
}

#: The modules that register rules, in load order: the ONNX adapters reuse the TensorFlow rules.
RULE_MODULES = ("baechi_cli.costs.rules_tf", "baechi_cli.costs.rules_onnx", "baechi_cli.costs.rules_aten")
# Whether RULE_MODULES are imported: a flag, not a cached call, since rule_for checks it once per op.
_loaded = False


def _load_rules() -> None:
    """Import :data:`RULE_MODULES`, filling both name tables; the lookups call it once, on the first."""
    global _loaded
    for name in RULE_MODULES:
        importlib.import_module(name)
    _loaded = True


def _table(op_set: str) -> dict[str, RuleEntry]:
    """The name table of ``op_set``, as filled so far; ValueError for a name not in :data:`OP_SETS`."""
    table = _NAME_TABLES.get(op_set)
    if table is None:
        raise ValueError(f"unknown op set {op_set!r}; expected one of {', '.join(OP_SETS)}")
    return table


def register(
    *op_types: str,
    kind: str,
    note: str | None = None,
    op_set: str = TENSORFLOW,
    shares: str = "",
    compute_class: str = "",
) -> Callable[[Rule], Rule]:
    """Decorator: register ``fn`` as the rule for ``op_types`` of ``op_set``.

    ``note`` (default: the first line of ``fn``'s docstring) documents the rule
    in :func:`rule_table`; ``shares`` names the TensorFlow op type whose rule
    an ONNX entry adapts, and whose compute class (:data:`COMPUTE_CLASS_OF`)
    the entry takes; ``compute_class`` names one directly (as the ``aten`` rules
    do). Registering an op type twice in one op set is an error, so two modules
    cannot silently fight over one op type.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown rule kind {kind!r}")
    table = _table(op_set)

    def deco(fn: Rule) -> Rule:
        text = note if note is not None else (fn.__doc__ or "").strip().split("\n")[0]
        for t in op_types:
            if t in table:
                raise ValueError(f"op type {t!r} already has a rule")
            cls = compute_class or COMPUTE_CLASS_OF.get(t if op_set == TENSORFLOW else shares, "")
            table[t] = RuleEntry(t, kind, fn, text, shares, cls)
        return fn

    return deco


def name_table(op_set: str = TENSORFLOW) -> Mapping[str, RuleEntry]:
    """Every rule of ``op_set``, by op type, the rule modules loaded; ValueError for an unknown op set."""
    if not _loaded:
        _load_rules()
    return _table(op_set)


def rule_for(op_type: str, op_set: str = TENSORFLOW) -> RuleEntry:
    """The rule that counts ``op_type`` of ``op_set``; :data:`NO_RULE` (kind ``uncovered``) if none. O(1)."""
    # name_table's check, inlined: callers look up every op of a graph.
    if not _loaded:
        _load_rules()
    return _table(op_set).get(op_type, NO_RULE)


def op_compute_class(entry: RuleEntry, attrs: Mapping[str, Any]) -> str:
    """The compute class of an op counted by ``entry``, with attributes ``attrs``: the rule's,
    except that a depthwise convolution (ONNX ``Conv``'s ``group`` > 1, an aten convolution's
    ``attrs["_args"]["groups"]`` > 1, with one input channel per group, or an unknown weight
    shape) runs at ``depthwise``'s rate; one of N > 1 channels per group (RegNet's, ResNeXt's)
    is ``grouped/N`` (:meth:`~baechi_cli.core.devices.Device.flops_for`). O(1).

    >>> conv = rule_for("Conv", ONNX)
    >>> op_compute_class(conv, {}), op_compute_class(conv, {"group": 32})
    ('conv', 'depthwise')
    >>> op_compute_class(conv, {"group": 4, "_input_shapes": [(8, 32, 14, 14), (32, 8, 3, 3)]})
    'grouped/8'
    """
    if entry.op_type in TRAINING_NORMS and _norm_in_training(entry.op_type, attrs):
        return NORM
    groups = max(int(attrs.get("group", 1) or 1), int((attrs.get("_args") or {}).get("groups", 1) or 1))
    if entry.compute_class != CONV or groups == 1:
        return entry.compute_class
    per_group = _channels_per_group(attrs)
    return DEPTHWISE if per_group in (1, None) else f"grouped/{per_group}"


#: Batch norms (forward and gradient, every op set) that run at ``norm``'s rate when in training
#: mode: with batch statistics they make two more passes over the data, which a CPU runs far
#: below its bandwidth (``baechi devices calibrate`` measures ``efficiency.norm``).
TRAINING_NORMS = frozenset(
    {
        "FusedBatchNorm",
        "FusedBatchNormV2",
        "FusedBatchNormV3",
        "FusedBatchNormGrad",
        "FusedBatchNormGradV2",
        "FusedBatchNormGradV3",
        "BatchNormalization",
        "aten.native_batch_norm",
        "aten._native_batch_norm_legit",
        "aten._native_batch_norm_legit_functional",
        "aten._batch_norm_with_update",
        "aten._batch_norm_with_update_functional",
        "aten.native_batch_norm_backward",
        "aten.batch_norm_backward",
    }
)


def _norm_in_training(op_type: str, attrs: Mapping[str, Any]) -> bool:
    """Whether a batch norm op runs in training mode: TensorFlow's ``is_training`` (default true),
    ONNX's ``training_mode``, aten's ``training``/``train`` argument (with-update ops always)."""
    if op_type.startswith("Fused"):
        return bool(attrs.get("is_training", True))
    if op_type == "BatchNormalization":
        return bool(attrs.get("training_mode", 0))
    if op_type.startswith("aten._batch_norm_with_update"):
        return True
    args = attrs.get("_args") or {}
    return bool(args.get("training", args.get("train", False)))


def _channels_per_group(attrs: Mapping[str, Any]) -> int | None:
    """A convolution's input channels per group: its weight's dim 1 (ONNX and aten alike put the
    weight second); None when its shape is not known."""
    shapes = attrs.get("_input_shapes") or ()
    weight = shapes[1] if len(shapes) > 1 else None
    return int(weight[1]) if weight is not None and len(weight) > 1 else None


def rule_table(op_set: str = TENSORFLOW) -> list[tuple[str, str, str]]:
    """``(op type, kind, note)`` for every rule of ``op_set``, by kind then op type."""
    order = {k: i for i, k in enumerate(KINDS)}
    rows = sorted(name_table(op_set).values(), key=lambda r: (order[r.kind], r.op_type))
    return [(r.op_type, r.kind, r.note) for r in rows]


def rules_markdown(op_set: str = TENSORFLOW) -> str:
    """The rule table of ``op_set`` as Markdown, one row per (kind, rule); COVERAGE.md embeds both.

    An ONNX op type counted by a TensorFlow op's rule under another name is
    listed with that name in parentheses: ``Add (AddV2)``.
    """
    table = name_table(op_set)
    groups: dict[tuple[str, str], list[str]] = {}
    for op_type, kind, note in rule_table(op_set):
        shares = table[op_type].shares
        groups.setdefault((kind, note), []).append(
            f"{op_type} ({shares})" if shares not in ("", op_type) else op_type
        )
    lines = ["| rule | what is counted | op types |", "|---|---|---|"]
    lines += [f"| {kind} | {note} | {', '.join(types)} |" for (kind, note), types in groups.items()]
    return "\n".join(lines) + "\n"


# --- helpers shared by the rule modules -------------------------------------------

_ITEMSIZE = {
    "bfloat16": 2,
    "half": 2,
    "qint8": 1,
    "quint8": 1,
    "qint16": 2,
    "quint16": 2,
    "qint32": 4,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int4": 1,
    "uint4": 1,
    # Handles and opaque values: their storage is not the tensor's to count.
    "resource": 0,
    "variant": 0,
    "string": 0,
}


def dtype_size(dtype: str) -> int:
    """Bytes per element of a numpy-style dtype name (``float32_ref`` as ``float32``); 0 if unknown."""
    name = dtype.removesuffix("_ref")
    size = _ITEMSIZE.get(name)
    if size is None:
        try:
            size = np.dtype(name).itemsize
        except TypeError:
            size = 0
        _ITEMSIZE[name] = size
    return size


def is_handle(dtype: str) -> bool:
    """A resource handle: its bytes are not the variable's, so reading it moves nothing."""
    return dtype == "resource"


def is_state(dtype: str) -> bool:
    """A variable passed by handle or by reference (an update writes it in place)."""
    return dtype == "resource" or dtype.endswith("_ref")


def known(shape: Shape | None) -> bool:
    return shape is not None and (not shape or min(shape) >= 0)


def has_input(view: OpView, i: int) -> bool:
    """Whether optional input ``i`` is there (ONNX marks an omitted one with dtype "")."""
    return i < len(view.input_dtypes) and bool(view.input_dtypes[i])


def known_shape(shapes: Sequence[Shape | None], i: int, what: str) -> Shape:
    """Shape ``i`` of ``shapes``, fully known, or :class:`CannotCount`."""
    s = shapes[i] if i < len(shapes) else None
    if not known(s):
        raise CannotCount(f"{what} shape unknown")
    return s  # type: ignore[return-value]


def numel(shape: Shape) -> int:
    return math.prod(shape)


def data_bytes_read(view: OpView) -> int:
    """Bytes of the data inputs, resource handles excluded."""
    if "resource" not in view.input_dtypes:
        return sum(view.input_bytes)
    return sum(b for b, dt in zip(view.input_bytes, view.input_dtypes, strict=True) if not is_handle(dt))


def bytes_only(view: OpView) -> OpCount:
    """memory-bound: reads its data inputs (handles excluded), writes its outputs"""
    return OpCount(0.0, data_bytes_read(view), sum(view.output_bytes))


def no_kernel(view: OpView) -> OpCount:
    """no kernel: no FLOPs, no bytes moved"""
    return OpCount()


# What :func:`rule_for` gives an op type that has no rule.
NO_RULE = RuleEntry("", UNCOVERED, bytes_only, "no rule: bytes only")

# What a rule raises when it cannot count an op: a missing shape or attr
# (CannotCount), or malformed attrs in the input graph (a stride of 0, a list
# where an int belongs). The op is then counted by bytes only.
RULE_FAILURES = (CannotCount, IndexError, TypeError, ValueError, ZeroDivisionError)


def count_view(rule: RuleEntry, view: OpView) -> tuple[OpCount, bool]:
    """``rule``'s count of ``view`` and False; :func:`bytes_only` and True where the rule
    raises one of :data:`RULE_FAILURES`. The caller reports the op as a fallback."""
    try:
        return rule.fn(view), False
    except RULE_FAILURES:
        return bytes_only(view), True


def with_flops(view: OpView, flops: float) -> OpCount:
    """``flops``, with the bytes of :func:`bytes_only`."""
    return OpCount(float(flops), data_bytes_read(view), sum(view.output_bytes))


def out_or_in_numel(view: OpView) -> int:
    """Elements of output 0, else of input 0 (elementwise ops keep the shape)."""
    if view.output_shapes and known(view.output_shapes[0]):
        return numel(view.output_shapes[0])  # type: ignore[arg-type]
    return numel(known_shape(view.input_shapes, 0, "input 0"))


def per_element(table: Mapping[str, tuple[int, str]]) -> Rule:
    """The rule counting ``table[op type][0]`` FLOPs per element of output 0 (of input 0 if unknown)."""

    def count(view: OpView) -> OpCount:
        return with_flops(view, table[view.op_type][0] * out_or_in_numel(view))

    return count
