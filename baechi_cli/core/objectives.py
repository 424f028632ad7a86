"""What a plan is optimised for: the registry of objectives ``--objective`` chooses from.

An objective names what the plan minimises and which placer optimises it: ``makespan`` (one
training or inference step's time) is every placer's and the evaluator scores it; ``throughput``
(a pipeline's time per minibatch, or per sample on an endless stream) and ``latency`` (one
sample's time through the stages) are the pipeline placer's, which scores them with its own model
of the stages. A new objective is one :class:`Objective` plus one :func:`register` call; the CLI's
choices, ``place``'s checks and the evaluator read this table.

>>> get("throughput").placer, get("throughput").microbatches, get("makespan").placer
('pipeline', True, None)
>>> names()
('makespan', 'throughput', 'latency')
"""

from __future__ import annotations

from dataclasses import dataclass

from baechi_cli.core.registry import Registry


@dataclass(frozen=True)
class Objective:
    """One objective: its name, what it minimises, and what it needs."""

    name: str
    minimises: str  # what it minimises, for --objective's help
    placer: str | None = None  # the one placer that optimises it; None: any placer, scored by the evaluator
    microbatches: bool = False  # whether --microbatches (a pipeline's microbatches) applies
    # Whether a workload JSON's own device counts (maxGPUs, maxCPUs) may stand in for --devices.
    devices_from_workload: bool = False


#: Every objective by name; the first is the default.
REGISTRY: Registry[Objective] = Registry("objective")


def register(objective: Objective) -> Objective:
    """Add ``objective`` to :data:`REGISTRY` (ValueError for a name taken)."""
    return REGISTRY.add(objective.name, objective)


register(Objective("makespan", "one training step's time"))
register(
    Objective(
        "throughput",
        "pipeline stages for a stream of samples (Tarnawski et al.'s max-load, solved exactly; "
        "with --microbatches, the schedule's throughput)",
        placer="pipeline",
        microbatches=True,
        devices_from_workload=True,
    )
)
register(
    Objective(
        "latency",
        "one sample's time through one call per device (their inference-latency objective)",
        placer="pipeline",
        devices_from_workload=True,
    )
)


def get(name: str) -> Objective:
    """The objective called ``name``; InputError naming the known ones otherwise."""
    return REGISTRY.find(name)


def names() -> tuple[str, ...]:
    """Every objective's name, the default first."""
    return tuple(REGISTRY)
