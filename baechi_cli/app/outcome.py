"""What ``baechi place`` returns: the prepared model, the chosen candidate and every other one."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.graph import OpGraph
from baechi_cli.evaluator.placement import Placement
from baechi_cli.evaluator.sim import SimResult
from baechi_cli.io.formats import FORMATS
from baechi_cli.search.candidates import Candidate, Prepared

if TYPE_CHECKING:
    from baechi_cli.search.auto import Search


@dataclass
class PlaceOutcome:
    prepared: Prepared
    chosen: Candidate
    candidates: list[Candidate]
    timings: dict[str, float]
    notes: list[str]
    search: Search | None = None  # what --algo auto did

    # Shortcuts used by the CLI and the report.
    @property
    def path(self) -> str:
        return self.prepared.path

    @property
    def graph(self) -> OpGraph:
        return self.prepared.graph

    @property
    def devices(self) -> DeviceSpec:
        return self.prepared.devices

    @property
    def algorithm(self) -> str:
        return self.chosen.algorithm

    @property
    def placement(self) -> Placement:
        assert self.chosen.placement is not None
        return self.chosen.placement

    @property
    def sim(self) -> SimResult:
        assert self.chosen.sim is not None
        return self.chosen.sim

    @property
    def lower_bound_us(self) -> float:
        return self.prepared.lower_bound_us

    @functools.cached_property
    def module_map(self) -> Any:
        """The PyTorch module map of the chosen placement (None unless an ONNX model has module paths)."""
        if not FORMATS[self.prepared.input_format].module_paths:
            return None
        from baechi_cli.io.onnx import module_map_of

        names = self.devices.names
        return module_map_of(self.graph, self.prepared.model_ops, [names[d] for d in self.sim.device_of])

    @property
    def single_device(self) -> SimResult | None:
        return self.prepared.single_device
