"""What a report's pipeline plan asks the runtime to build: stages, their ranks, the schedule.

Contract. :func:`read_plan` reads a ``baechi.report/v1`` document (a dict, parsed as JSON by the
caller: nothing in it runs) with a ``pipeline`` section made with ``--microbatches`` and returns a
:class:`Plan`: the stage count, each stage's rank (the devices the stages use, in device order,
numbered from 0), the schedule and the microbatch count, and where each node goes:

* a plan made on a PyTorch program (a ``.pt2``, or in-process) names the program's nodes:
  ``pipeline.graph_stages`` is ``{node: stage}`` and the runtime cuts exactly there;
* a plan made on an ONNX export of a PyTorch model names module boundaries:
  ``module_map.pipeline.split_points`` is ``{module: "beginning"}`` and a stage begins at the
  first node, in program order, that runs inside each named module (:func:`stages_from_modules`).

Anything else (no pipeline section, a latency plan, a split torch cannot cut) is an InputError
naming what is missing. O(nodes).

Example:
    >>> report = {"schema": "baechi.report/v1", "pipeline": {"objective": "throughput",
    ...     "stages": [{"device": 0}, {"device": 2}], "graph_stages": {"mm": 0, "relu": 1},
    ...     "schedule": {"name": "1f1b", "microbatches": 4, "devices": None}}}
    >>> plan = read_plan(report)
    >>> plan.stage_rank, plan.schedule, plan.microbatches, plan.cut_by
    ([0, 1], '1f1b', 4, 'program nodes')
    >>> stages_from_modules(["", "a", "a.fc", "b", "b.fc"], ["b"])
    [0, 0, 0, 1, 1]
    >>> stages_from_modules(["", "inner.a", "inner.b.fc"], ["b"])  # the model wrapped in a loss
    [0, 0, 1]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from baechi_cli.core.errors import InputError
from baechi_cli.pipeline.schedules import REGISTRY, stage_devices

#: torch.distributed.pipelining's schedule class for each of baechi's schedules.
TORCH_SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
    "zbv": "ScheduleZBVZeroBubble",
}


@dataclass(frozen=True)
class Plan:
    """A pipeline plan as the runtime builds it."""

    num_stages: int
    stage_rank: list[int]  # stage -> rank (0 .. ranks-1)
    schedule: str
    microbatches: int
    graph_stages: dict[str, int] | None  # program node -> stage (a plan on the program)
    split_points: list[str] | None  # modules a stage begins at (a plan on an ONNX export)
    graph_untraced: tuple[str, ...] = ()  # program nodes the traced step ran as no op: unplaced
    graph_devices: dict[str, int] | None = None  # a makespan plan: program node -> device
    module_devices: dict[str, int] | None = None  # a makespan plan of an ONNX export: module -> device
    # program nodes whose traced ops the plan put elsewhere than the node (they run with it)
    graph_split: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        return "makespan" if self.graph_devices is not None or self.module_devices else "pipeline"

    @property
    def ranks(self) -> int:
        return max(self.stage_rank) + 1 if self.stage_rank else 0

    @property
    def cut_by(self) -> str:
        if self.module_devices or (self.graph_stages is None and self.graph_devices is None):
            return "module boundaries"
        return "program nodes"

    @property
    def torch_schedule(self) -> str:
        return TORCH_SCHEDULES.get(self.schedule, "baechi makespan runs")


def read_plan(report: Mapping[str, Any]) -> Plan:
    """The pipeline plan of ``report`` (module docstring)."""
    if not isinstance(report, Mapping) or report.get("schema") != "baechi.report/v1":
        raise InputError("not a baechi report (no schema baechi.report/v1)")
    pipeline = report.get("pipeline")
    devices_of = report.get("graph_devices")
    if not isinstance(pipeline, Mapping) and isinstance(devices_of, Mapping):
        # a makespan plan on a PyTorch program: its runs are found when it is cut
        return _makespan_plan(
            graph_untraced=tuple(str(n) for n in report.get("graph_untraced") or ()),
            graph_devices={str(k): int(v) for k, v in devices_of.items()},
            graph_split=tuple(str(n) for n in report.get("graph_split") or ()),
        )
    modules = (report.get("module_map") or {}).get("modules")
    if not isinstance(pipeline, Mapping) and isinstance(modules, Mapping) and modules:
        # a makespan plan of an ONNX export: run at the module boundaries it names
        names = [str(d.get("name")) for d in report.get("devices") or []]
        index = {name: i for i, name in enumerate(names)}
        return _makespan_plan(module_devices={str(m): index.get(str(d), 0) for m, d in modules.items()})
    if not isinstance(pipeline, Mapping):
        raise InputError(
            "the report has no plan the runtime builds: a pipeline plan (--objective throughput "
            "--microbatches M) or a makespan plan of a PyTorch program (.pt2)"
        )
    if pipeline.get("objective") != "throughput":
        raise InputError(f"a {pipeline.get('objective')} plan has no schedule to run: need a throughput plan")
    schedule = pipeline.get("schedule")
    if not isinstance(schedule, Mapping):
        raise InputError("the pipeline plan has no schedule: place with --microbatches M")
    name = str(schedule.get("name"))
    if name not in TORCH_SCHEDULES or name not in REGISTRY:
        raise InputError(f"schedule {name!r} has no torch schedule to run it")
    stages = pipeline.get("stages") or []
    devices = [int(s["device"]) for s in stages]
    if not devices:
        raise InputError("the pipeline plan has no stages")
    rank = {d: r for r, d in enumerate(sorted(set(devices)))}
    stage_rank = [rank[d] for d in devices]
    if REGISTRY.find(name).stages_per_device > 1:  # the schedule's own placement of stages
        expected = stage_devices(name, len(devices), len(rank))
        if expected != stage_rank:
            raise InputError(f"the plan's stages sit on ranks {stage_rank}, not where {name} runs them")
    graph_stages = pipeline.get("graph_stages")
    split = (report.get("module_map") or {}).get("pipeline", {}).get("split_points")
    if graph_stages is None and split is None:
        raise InputError(
            "the plan names neither program nodes (pipeline.graph_stages: plan a .pt2) nor module "
            "boundaries (module_map.pipeline.split_points: an ONNX export from PyTorch)"
        )
    if graph_stages is not None:
        graph_stages = {str(k): int(v) for k, v in graph_stages.items()}
    return Plan(
        num_stages=len(devices),
        stage_rank=stage_rank,
        schedule=name,
        microbatches=int(schedule["microbatches"]),
        graph_stages=graph_stages,
        split_points=None if split is None else list(split),
        graph_untraced=tuple(str(n) for n in pipeline.get("graph_untraced") or ()),
        graph_split=tuple(str(n) for n in pipeline.get("graph_split") or ()),
    )


def _makespan_plan(**placed: Any) -> Plan:
    """A makespan plan: one step, its runs (stages) found when the program is cut."""
    return Plan(
        num_stages=0,
        stage_rank=[],
        schedule="makespan",
        microbatches=1,
        graph_stages=None,
        split_points=None,
        **placed,
    )


def stages_from_modules(paths: Sequence[str], split_points: Sequence[str]) -> list[int]:
    """Each node's stage when a stage begins at the first node inside each of ``split_points``.

    ``paths[i]`` is the deepest module path of node i in program order ("" the root); a node
    is inside module M when its path is M or starts with ``M + "."``. Stages are numbered in
    program order; a split module no node runs in is an InputError. When the model was wrapped
    after the plan was made (a loss module around it), the wrapper's attribute prefixes every
    module (``inner.layers.1``). O(nodes x depth).
    """
    first: dict[str, int] = {}
    for i, path in enumerate(paths):
        parts = path.split(".") if path else []
        for k in range(1, len(parts) + 1):
            first.setdefault(".".join(parts[:k]), i)
    prefix = _wrapper_prefix(first, split_points)
    missing = [m for m in split_points if prefix + m not in first]
    if missing:
        raise InputError(
            f"the plan begins a stage at module {missing[0]!r}, which runs no node of this program"
        )
    starts = sorted({first[prefix + m] for m in split_points})
    stage, out = 0, []
    for i in range(len(paths)):
        while stage < len(starts) and starts[stage] <= i:
            stage += 1
        out.append(stage)
    return out


def _wrapper_prefix(first: Mapping[str, int], modules: Sequence[str]) -> str:
    """``""``, or the shortest ``P.`` under which every one of ``modules`` is a module path."""
    if not modules or all(m in first for m in modules):
        return ""
    m = modules[0]
    prefixes = sorted((k[: -len(m)] for k in first if k.endswith("." + m)), key=len)
    return next((p for p in prefixes if all(p + x in first for x in modules)), "")
