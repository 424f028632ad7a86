"""The placer contract and the registry every command reads placers from.

A placer is a function ``place(graph, devices, options) -> Placement``:

* ``graph`` is what the passes left (fused nodes, colocation groups in
  ``graph.group``); ``devices`` the device spec; ``options`` an instance of
  the placer's own options dataclass (:attr:`PlacerSpec.options`).
* It returns which device each node runs on and, when it planned one, the
  order it committed nodes in (:attr:`Placement.sequence`, a topological
  order). It never judges itself: the pipeline expands the placement onto
  the ops and :func:`baechi_cli.evaluator.evaluate.evaluate` decides its step time,
  memory and feasibility, for every placer alike.
* It honours colocation groups (a whole group on one device) and, when
  :attr:`PlacerSpec.respects_memory`, returns only placements within device
  memory as the evaluator counts it on ``graph`` (m-TOPO, m-ETF and m-SCT:
  :func:`~baechi_cli.placers.memory.place_in_memory`), raising
  :class:`~baechi_cli.core.errors.InfeasibleError` (what does not fit where, and
  by how much) when it finds none.

Adding a placer is one module with a ``place`` function plus one
:func:`register` call (see docs/DESIGN.md, "Adding a placer"). The CLI's
``--algo`` choices, ``--algo auto``, ``baechi compare`` and the report all
read :data:`REGISTRY`.

Example:
    >>> spec = get("etf")
    >>> spec.title, spec.auto, spec.options
    ('m-ETF', True, <class 'baechi_cli.placers.NoOptions'>)
    >>> names()
    ('topo', 'etf', 'sct', 'single', 'exact', 'pipeline')
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from baechi_cli.core.errors import InputError
from baechi_cli.evaluator.placement import Placement

if TYPE_CHECKING:
    from baechi_cli.core.devices import DeviceSpec
    from baechi_cli.core.graph import OpGraph


@dataclass(frozen=True)
class NoOptions:
    """The options of a placer that takes none."""


PlaceFn = Callable[["OpGraph", "DeviceSpec", Any], Placement]


@dataclass(frozen=True)
class PlacerSpec:
    """Everything the tool knows about one placer.

    ``module`` names the module whose ``place`` implements it, imported on
    first use so ``baechi --help`` stays fast. ``auto`` says whether
    ``--algo auto`` tries it, and ``auto_max_nodes`` up to how many nodes
    (what the placers see after the passes); above that auto lists it as
    skipped with ``auto_skip_reason``. ``respects_memory`` is the placer's
    promise never to exceed device memory: the evaluator finding it over
    memory is then a bug, not the model's infeasibility. ``budget_retries``:
    the placer keeps within a memory model of its own that counts less than
    the evaluator's (the pipeline splitter counts an op's persistent bytes), so
    when the evaluator finds it over memory it is run again on devices whose
    memory is cut by the excess, as a placer that respects memory is.
    """

    name: str  # the --algo value
    title: str  # what the summary calls it
    summary: str  # one line for --help and the docs
    module: str
    options: type = NoOptions
    auto: bool = True
    auto_max_nodes: int | None = None
    auto_skip_reason: str = ""
    # Among candidates with equal step times auto keeps the lowest; also the order
    # auto lists its candidates in.
    auto_priority: int = 100
    respects_memory: bool = True
    budget_retries: bool = False
    # The placer proves things about the schedule of the graph it sees, so it must
    # see every edge: it places the graph without forward-only placement's contraction.
    needs_every_edge: bool = False
    # Much of its time goes to a native solver that lets go of Python's GIL (OR-Tools'
    # LP): auto runs it in a second thread beside the others, which proceed meanwhile.
    native_solver: bool = False

    def place(self, graph: OpGraph, devices: DeviceSpec, options: Any = None) -> Placement:
        """Run the placer; ``options`` defaults to its options dataclass's defaults."""
        fn: PlaceFn = importlib.import_module(self.module).place
        return fn(graph, devices, self.options() if options is None else options)

    def make_options(self, values: dict[str, Any]) -> Any:
        """The placer's options from ``values``, taking only the fields it has."""
        own = {f.name for f in fields(self.options)}
        return self.options(**{k: v for k, v in values.items() if k in own})


REGISTRY: dict[str, PlacerSpec] = {}


def register(spec: PlacerSpec) -> PlacerSpec:
    """Add ``spec`` to the registry; ValueError when its name or title is taken or reserved."""
    if spec.name in REGISTRY or spec.name == "auto":
        raise ValueError(f"a placer named {spec.name!r} is already registered")
    if any(s.title == spec.title for s in REGISTRY.values()):
        raise ValueError(f"a placer titled {spec.title!r} is already registered")
    REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a placer (tests that register an example placer clean up with this)."""
    del REGISTRY[name]


def names() -> tuple[str, ...]:
    """Registered placer names, in registration order."""
    return tuple(REGISTRY)


def auto_candidates(nodes: int) -> list[tuple[PlacerSpec, bool]]:
    """What ``--algo auto`` considers on a graph of ``nodes`` nodes: (spec, skipped), by priority."""
    specs = sorted((s for s in REGISTRY.values() if s.auto), key=lambda s: s.auto_priority)
    return [(s, s.auto_max_nodes is not None and nodes > s.auto_max_nodes) for s in specs]


def get(name: str) -> PlacerSpec:
    """The placer called ``name``; an unknown name is an InputError listing the known ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise InputError(f"unknown algorithm '{name}' (choose from auto, {', '.join(REGISTRY)})") from None


def title(name: str) -> str:
    """The placer's title, or the name itself for one that is not registered (never a KeyError)."""
    spec = REGISTRY.get(name)
    return spec.title if spec is not None else name


@dataclass(frozen=True)
class SCTOptions:
    """m-SCT's options: the LP's time limit (seconds, None: none), the rounding threshold, and the
    LP's work limit (seconds by the cost model of :func:`~baechi_cli.placers.sct_lp.iteration_limit`,
    deterministic; None: none; auto sets it from its budget)."""

    solver_time_limit: float | None = 60.0
    # sct_lp.DEFAULT_THRESHOLD (not imported: the registry loads with `baechi --help`; a test keeps them equal)
    sct_threshold: float = 0.5
    lp_work_limit: float | None = None


register(
    PlacerSpec(
        "topo",
        "m-TOPO",
        "m-TOPO: topological order, devices filled in turn up to an equal share of compute",
        "baechi_cli.placers.topo",
        auto_priority=3,
    )
)
register(
    PlacerSpec(
        "etf",
        "m-ETF",
        "m-ETF: earliest task first with memory filter and co-adjusted colocation",
        "baechi_cli.placers.etf",
        auto_priority=1,
    )
)
register(
    PlacerSpec(
        "sct",
        "m-SCT",
        "m-SCT: favorite-child LP (OR-Tools) rounded, then list scheduling that keeps favorites together",
        "baechi_cli.placers.sct",
        options=SCTOptions,
        # Its LP alone takes seconds at 5k nodes and tens of seconds at 20k
        # (bench/lp_backends.md), against a promise of placement in about a second.
        auto_max_nodes=5000,
        auto_skip_reason="its LP would take tens of seconds",
        auto_priority=2,
        native_solver=True,
    )
)
register(
    PlacerSpec(
        "single",
        "single device",
        "everything on one device (the largest)",
        "baechi_cli.placers.single",
        auto_priority=0,  # a split that only ties one device is not worth its transfers
        respects_memory=False,
    )
)


@dataclass(frozen=True)
class ExactOptions:
    """exact's options: CP-SAT's time limit per model (seconds, None: none), the largest graph it
    takes (nodes after fusion), and CP-SAT's workers (1: reproducible; more: its parallel portfolio)."""

    time_limit: float | None = 10.0
    # exact.DEFAULT_MAX_NODES (not imported: the registry loads with `baechi --help`; a test keeps them equal)
    max_nodes: int = 200
    workers: int = 1


register(
    PlacerSpec(
        "exact",
        "exact (CP-SAT)",
        "exact: placement and order by constraint programming (OR-Tools CP-SAT), optimal on small graphs",
        "baechi_cli.placers.exact",
        options=ExactOptions,
        auto=False,  # auto calls exact.solve() itself on small graphs
        respects_memory=True,
        needs_every_edge=True,
    )
)


@dataclass(frozen=True)
class PipelineOptions:
    """pipeline's options: microbatches per minibatch (None: Tarnawski's max-load of an endless
    stream), the schedule that runs them, CPU cores beside the devices, and how many sets the
    exact search may enumerate (:mod:`baechi_cli.pipeline.throughput`)."""

    objective: str = (
        "throughput"  # or "latency": one sample's time through the calls (baechi_cli.pipeline.latency)
    )
    microbatches: int | None = None
    schedule: str = "auto"  # auto: the faster of 1f1b and interleaved
    cpus: int = 0
    # throughput.DEFAULT_MAX_SETS (not imported: the registry loads with `baechi --help`)
    max_sets: int = 150_000


register(
    PlacerSpec(
        "pipeline",
        "pipeline split",
        "pipeline: stages for throughput or latency, Tarnawski et al.'s objectives solved exactly "
        "(--objective throughput|latency)",
        "baechi_cli.pipeline.placer",
        options=PipelineOptions,
        auto=False,  # a different objective: --objective throughput picks it
        # The model counts an op's own bytes (weights; a workload's `size`), not the
        # activations and received copies the evaluator adds: a split over memory is reported.
        respects_memory=False,
        budget_retries=True,
        needs_every_edge=True,
    )
)
