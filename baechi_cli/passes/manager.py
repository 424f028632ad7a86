"""The pass manager: run the graph passes, record what each did, and make the placement graph.

:func:`constraint_passes` applies what the input format imposes (a GraphDef's
colocation and control flow); :func:`optimization_passes` makes the graph the
placers see under one :class:`PassOptions` (forward-only placement,
co-placement, fusion), as a :class:`Variant`. Every pass leaves a
:class:`PassRecord` (ops, edges and groups before and after, seconds) for the
report.
"""

from __future__ import annotations

import functools
import importlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.errors import BaechiError, InputError
from baechi_cli.core.graph import OpGraph, own_bytes
from baechi_cli.core.registry import Registry
from baechi_cli.io.formats import FORMATS

# Co-placement grows a group up to this fraction of the model's memory per
# device (the placers' memory measure): chains and pairs merge, but no group
# grows big enough to commit a placer, at its first op, to a large part of
# the model (measured on Inception-V3: bench/history/placement.md).
COPLACE_GROUPS_PER_DEVICE = 256


class PassError(RuntimeError):
    """A pass raised something other than a one-line :class:`~baechi_cli.core.errors.BaechiError`: a bug,
    reported with the pass's name."""


@dataclass
class PassRecord:
    name: str
    ops_before: int
    ops_after: int
    edges_before: int
    edges_after: int
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PassSpec:
    """One graph pass as the manager runs it.

    ``module:function`` is the pass, ``function(graph, **arguments) -> graph``, imported on first
    use. ``stage`` is ``constraint`` (what an input format imposes, named by
    :attr:`~baechi_cli.io.formats.InputFormat.constraint_passes`; always run) or ``optimization``
    (switched by the :class:`PassOptions` field of the same name). ``after`` names the passes
    that must run first when both run; :func:`ordered` sorts by it. ``arguments(graph, devices,
    value)`` gives the call's keyword arguments from the op graph, the devices and the option's
    value (for the report too). ``off`` is what the record says when the option is off.
    ``contracts_only`` is False for a pass that drops edges, whose node sequences do not expand
    into op sequences.
    """

    name: str
    module: str
    function: str
    stage: str  # constraint | optimization
    after: tuple[str, ...] = ()
    arguments: Callable[[OpGraph, DeviceSpec, Any], dict[str, Any]] | None = None
    off: str = ""
    contracts_only: bool = True

    def load(self) -> Callable[..., OpGraph]:
        """The pass function."""
        return getattr(importlib.import_module(self.module), self.function)


#: Every pass by name, in registration order (the tie-break of :func:`ordered`).
REGISTRY: Registry[PassSpec] = Registry("pass")


def register(spec: PassSpec) -> PassSpec:
    """Add ``spec`` to :data:`REGISTRY`; ValueError for a taken name or an unknown ``after``."""
    if spec.stage not in ("constraint", "optimization"):
        raise ValueError(f"pass {spec.name}: unknown stage {spec.stage!r}")
    unknown = [name for name in spec.after if name not in REGISTRY]
    if unknown:
        raise ValueError(f"pass {spec.name} runs after unknown passes: {', '.join(unknown)}")
    return REGISTRY.add(spec.name, spec)


def ordered(stage: str) -> list[PassSpec]:
    """The passes of ``stage`` in an order that honours every ``after``, registration order on ties.

    Registration only names passes already registered, so the order always exists. O(P^2).

    >>> [spec.name for spec in ordered("optimization")]
    ['forward_only', 'coplace', 'fusion']
    """
    specs = [s for s in REGISTRY.values() if s.stage == stage]
    done: set[str] = set()
    out: list[PassSpec] = []
    while len(out) < len(specs):
        spec = next(
            s
            for s in specs
            if s.name not in done and all(a in done or REGISTRY[a].stage != stage for a in s.after)
        )
        out.append(spec)
        done.add(spec.name)
    return out


def _coplace_arguments(graph: OpGraph, devices: DeviceSpec, groups_per_device: int) -> dict[str, Any]:
    """Co-placement's bound: the model's memory (the placers' measure) / (groups per device · devices)."""
    return {"max_group_bytes": sum(own_bytes(graph)) // (groups_per_device * devices.count)}


register(PassSpec("colocation", "baechi_cli.passes.colocation", "colocate", "constraint"))
register(
    PassSpec(
        "control_flow", "baechi_cli.passes.control_flow", "control_flow", "constraint", after=("colocation",)
    )
)
register(
    PassSpec(
        "forward_only",
        "baechi_cli.passes.forward_only",
        "forward_only",
        "optimization",
        contracts_only=False,
    )
)
register(
    PassSpec(
        "coplace",
        "baechi_cli.passes.coplace",
        "coplace",
        "optimization",
        after=("forward_only",),
        arguments=_coplace_arguments,
        off="--no-coplace",
    )
)
register(
    PassSpec(
        "fusion", "baechi_cli.passes.fusion", "fuse", "optimization", after=("coplace",), off="--no-fusion"
    )
)


def run_pass(name: str, fn: Callable[[OpGraph], OpGraph], graph: OpGraph) -> tuple[OpGraph, PassRecord]:
    """Apply one pass and record what it did (ops, edges and groups before and after)."""
    t0 = time.perf_counter()
    try:
        out = fn(graph)
    except BaechiError:
        raise  # a one-line error about the graph, naming its ops
    except Exception as err:
        raise PassError(f"pass {name} failed: {type(err).__name__}: {err}") from err
    seconds = time.perf_counter() - t0
    record = PassRecord(name, graph.num_ops, out.num_ops, graph.num_edges, out.num_edges, seconds)
    record.details = {
        "enabled": True,
        "groups_before": _count_groups(graph),
        "groups_after": _count_groups(out),
    }
    return out, record


def _count_groups(graph: OpGraph) -> int:
    return len(set(graph.group))


def skipped_pass(name: str, graph: OpGraph, reason: str) -> PassRecord:
    """The record of a pass that did not run, with the reason."""
    groups = _count_groups(graph)
    record = PassRecord(name, graph.num_ops, graph.num_ops, graph.num_edges, graph.num_edges, 0.0)
    record.details = {"enabled": False, "reason": reason, "groups_before": groups, "groups_after": groups}
    return record


def constraint_passes(graph: OpGraph, fmt: str, path: str) -> tuple[OpGraph, list[PassRecord]]:
    """Colocation and control flow (GraphDef): what TensorFlow imposes, so always run.

    A bad graph (a cycle, a colocation conflict) is an InputError naming ``path``.
    """
    records: list[PassRecord] = []
    try:
        wanted = set(FORMATS[fmt].constraint_passes)
        for spec in ordered("constraint"):
            if spec.name in wanted:
                graph, record = run_pass(spec.name, spec.load(), graph)
                records.append(record)
        graph.topo_order()  # every later stage needs the order; a cycle fails here, once
    except InputError as err:
        raise err.with_path(path) from None
    return graph, records


class PassOptions(NamedTuple):
    """One setting of the optimization passes: a point of ``--algo auto``'s search space."""

    forward_only: bool
    coplace: int | None  # co-placement's bound, in groups per device of the model's memory; None: off
    fusion: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "forward_only": self.forward_only,
            "coplace": self.coplace is not None,
            "coplace_groups_per_device": self.coplace,
            "fusion": self.fusion,
        }

    def differences(self, base: PassOptions) -> str:
        """How this setting differs from ``base``, for labels: ``no forward-only, co-placement/32``."""
        out = []
        if self.forward_only != base.forward_only:
            out.append("forward-only" if self.forward_only else "no forward-only")
        if self.coplace != base.coplace:
            out.append("no co-placement" if self.coplace is None else f"co-placement/{self.coplace}")
        if self.fusion != base.fusion:
            out.append("fusion" if self.fusion else "no fusion")
        return ", ".join(out)


@dataclass
class Variant:
    """The placement graph of one :class:`PassOptions`: what the placers see under that setting."""

    options: PassOptions
    placement_graph: OpGraph  # nodes with ``members`` when ops were contracted
    records: list[PassRecord]
    # True when placement_graph only contracts the op graph (no edge dropped), so a
    # placer's node sequence expands into a valid op sequence; forward-only
    # placement drops the backward ops' edges, and then the evaluator orders ops.
    expands_sequence: bool = True
    # Set when forward-only placement contracted the graph: the placement graph
    # without it (same other options), for when a placement made under
    # forward-only's premise (every device holds the whole model) does not fit.
    without_forward_only: Callable[[], OpGraph] | None = field(default=None, repr=False)

    @functools.cached_property
    def fingerprint(self) -> int:
        """Equal for variants whose placers would see the same graph (auto runs one of them)."""
        g = self.placement_graph
        members = None if g.members is None else tuple(tuple(m) for m in g.members)
        return hash((members, tuple(g.group), g.num_edges, self.expands_sequence))


def optimization_passes(
    graph: OpGraph, devices: DeviceSpec, options: PassOptions, reasons: Mapping[str, str]
) -> Variant:
    """The optimization passes, in :func:`ordered` order, as ``options`` say (see :class:`Variant`).

    ``reasons[name]`` is what a pass's record says about why it ran or not (forward-only
    placement's premise); a pass without one that is off is recorded with its ``off``. The
    placement graph's nodes carry ``members`` when a pass contracted ops.
    """
    records: list[PassRecord] = []
    current = graph
    expands_sequence = True
    for spec in ordered("optimization"):
        value = getattr(options, spec.name)
        if value is None or value is False:
            reason = reasons[spec.name] if spec.name in reasons else (spec.off or "off")
            records.append(skipped_pass(spec.name, current, reason))
            continue
        arguments = spec.arguments(graph, devices, value) if spec.arguments is not None else {}
        fn = spec.load()
        current, record = run_pass(spec.name, functools.partial(fn, **arguments), current)
        record.details.update(arguments)
        if spec.name in reasons:
            record.details["reason"] = reasons[spec.name]
        records.append(record)
        expands_sequence = expands_sequence and spec.contracts_only
    variant = Variant(options, current, records, expands_sequence=expands_sequence)
    if options.forward_only:
        fine = options._replace(forward_only=False)

        @functools.cache
        def without_forward_only() -> OpGraph:
            return optimization_passes(graph, devices, fine, {"forward_only": ""}).placement_graph

        variant.without_forward_only = without_forward_only
    return variant
