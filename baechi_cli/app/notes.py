"""The notes a summary and a report carry: what a user would otherwise read as a bug.

A split slower than one device, devices left idle, op types without a cost
rule: each gets a sentence that says why. Pure functions of what the
pipeline computed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from baechi_cli import placers
from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.graph import OpGraph
from baechi_cli.evaluator.sim import SimResult

if TYPE_CHECKING:
    from baechi_cli.search.candidates import Candidate
    from baechi_cli.verify.races import Race

# Device names a note lists in full; beyond, the first and last few.
NAMES_LISTED = 8


def uncovered_note(uncovered: dict[str, int]) -> str:
    """The warning for op types without a cost rule: which, how many, what they were costed as."""
    listed = ", ".join(f"{t} ({n})" for t, n in sorted(uncovered.items(), key=lambda kv: (-kv[1], kv[0])))
    ops = sum(uncovered.values())
    return (
        f"{ops} op{'s' if ops != 1 else ''} of {len(uncovered)} type{'s' if len(uncovered) != 1 else ''} "
        f"without a cost rule, costed by the bytes they move: {listed}"
    )


def race_note(races: list[Race], sidecar: str) -> str:
    """The warning for a training step that leaves variable accesses unordered (non-empty ``races``)."""
    more = f" (and {len(races) - 1} more)" if len(races) > 1 else ""
    return (
        f"the training step ({sidecar}) has {len(races)} race{'s' if len(races) != 1 else ''} on "
        f"variables: {races[0].message()}{more}; it can train differently run to run on any devices, "
        "so baechi keeps those ops on their variable's device, where one device would run them; "
        "a control dependency between them fixes it"
    )


def pipeline_notes(pipeline: dict[str, Any]) -> list[str]:
    """What a pipeline plan holds beyond its stages (the report's ``pipeline``): weights copied
    into several stages, whose gradients the runtime sums."""
    notes = []
    for tied in pipeline.get("tied_weights") or []:
        if tied["allreduce_us"] > 0:
            notes.append(
                f"stages {', '.join(map(str, tied['stages']))} each hold a copy of the weight "
                f"{tied['weight']} reads ({tied['bytes']:,} bytes), their gradients summed before the "
                "optimizer steps (baechi verify --torch builds both)"
            )
    return notes


def placement_notes(
    graph: OpGraph,
    devices: DeviceSpec,
    algo: str,
    sim: SimResult,
    single: SimResult | None,
    candidates: list[Candidate] | None = None,
) -> list[str]:
    """Explain what users would read as a bug: a split slower than one device, an idle device.

    ``algo`` is the placer whose plan was kept, or ``refine`` / ``exact`` for
    auto's later stages.
    """
    notes = []
    if candidates and len(candidates) > 1 and algo == "single":
        splits = [c for c in candidates if c.ok and c.algorithm != "single"]
        best = min(splits, key=lambda c: c.sim.step_time_us, default=None)
        why = "the model fits one device and no split beats it"
        if best is not None:
            why += (
                f" (the best, {placers.title(best.algorithm)}, takes {_ms(best.sim.step_time_us)}: "
                "communication costs more than the parallelism gains)"
            )
        idle = [d.name for i, d in enumerate(devices.devices) if not sim.order[i]]
        if not idle:  # one device given
            return [f"auto kept one device: {why}."]
        return [f"auto kept one device: {why}; {_names(idle)} stay idle."]
    if algo == "pipeline":
        # Its objective is a pipeline's max-load or one sample's latency, not this step's time:
        # one device's step says nothing about it, and the stages say why a device is idle.
        idle = [devices.devices[d].name for d in range(devices.count) if not sim.order[d]]
        if not idle:
            return notes
        verb = "runs" if len(idle) == 1 else "run"
        return [
            f"{_names(idle)} {verb} no ops: the split's objective is best with fewer stages than devices "
            "(a stage more would cost more in transfers, or contiguity and memory leave no better cut)"
        ]
    if single is not None and algo != "single" and single.step_time_us < sim.step_time_us:
        notes.append(
            f"the model fits one device, where it runs in {_ms(single.step_time_us)}: "
            f"{sim.step_time_us / single.step_time_us:.2f}x faster than this split "
            "(--algo single places it there)"
        )
    idle = [devices.devices[d].name for d in range(devices.count) if not sim.order[d]]
    if not idle:
        return notes
    which = _names(idle)
    verb, it = ("runs", "it") if len(idle) == 1 else ("run", "them")
    if algo == "single":
        why = "--algo single puts every op on one device"
        if single is not None:
            why += f" ({_ms(single.step_time_us)} step)"
        return [*notes, f"{which} {verb} no ops: {why}."]
    groups = graph.group_members()
    total = sum(graph.compute_us) or 1.0
    share = max(sum(graph.compute_us[v] for v in ops) for ops in groups.values()) / total
    if len(groups) < devices.count:
        why = f"the graph has only {len(groups)} colocation groups, and each group must stay on one device"
    elif share > 1 / devices.count:
        why = (
            f"one colocation group holds {share:.0%} of the compute and cannot be split, "
            "so the rest fits on fewer devices"
        )
    elif algo == "topo":
        why = (
            "m-TOPO fills devices in topological order up to an equal share of compute, "
            "and the earlier devices took all of it"
        )
    elif algo == "refine":
        why = f"refinement found no move of a group onto {it} that shortens the step"
    elif algo == "exact":
        why = f"the exact solver's plan is no faster with {it}"
    else:
        why = (
            f"{placers.title(algo)} never found an op that could start earlier there, "
            "once the transfer of its inputs is counted, than on a device that already held them"
        )
    return [*notes, f"{which} {verb} no ops: {why}."]


def _names(names: list[str]) -> str:
    """``names`` joined by commas; past :data:`NAMES_LISTED` the first and last few and the count,
    so that a note stays a sentence on 65,536 devices.

    >>> _names(["a", "b"]), _names([f"d{i}" for i in range(100)])
    ('a, b', 'd0, d1, d2, d3, ..., d96, d97, d98, d99 (100 devices)')
    """
    if len(names) <= NAMES_LISTED:
        return ", ".join(names)
    half = NAMES_LISTED // 2
    return f"{', '.join(names[:half])}, ..., {', '.join(names[-half:])} ({len(names):,} devices)"


def _ms(us: float) -> str:
    return f"{us / 1000:.3f} ms"
