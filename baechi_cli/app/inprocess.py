"""Place a PyTorch model from Python, in process: an ``nn.Module`` with example inputs, or an
``ExportedProgram``, planned as ``baechi place model.pt2`` plans the saved file.

Contract. :func:`place_program` reads a ``torch.export.ExportedProgram`` (or its JSON,
:func:`baechi_cli.io.pt2.program_json`) as the ``.pt2`` reader reads a saved one, nothing written
to disk, and places it with ``options`` as ``baechi place`` does; :func:`place_module` exports
``model`` on ``args`` with ``torch.export.export`` first (a model torch cannot export is an
InputError with torch's reason, in one line). Both return the report ``baechi place --report``
writes, whose plan :func:`baechi_cli.runtime.launch.verify_torch` runs; its input is named
``name`` and its sha256 is the program JSON's. Same program, same options: same report, timings
aside. Needs torch. Time: torch's export, then as ``baechi place``.

Example:
    >>> import torch
    >>> from baechi_cli.core.devices import parse_devices
    >>> from baechi_cli.search.candidates import PlaceOptions
    >>> model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    >>> options = PlaceOptions(training=True, objective="throughput", microbatches=4)
    >>> report = place_module(model, (torch.randn(32, 64),), parse_devices("2x1GB"), options)
    >>> report["input"]["format"], report["pipeline"]["schedule"]["microbatches"]
    ('pt2', 4)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.search.candidates import PlaceOptions


def place_program(
    program: Any,
    devices: DeviceSpec,
    options: PlaceOptions,
    *,
    name: str = "<program>",
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The report of placing ``program`` (module docstring); ``progress(stage)`` as stages start."""
    from baechi_cli.app.place import checked_options, place_prepared, prepare_program
    from baechi_cli.app.report import build_report

    step = progress or (lambda stage: None)
    options = checked_options(options)
    outcome = place_prepared(prepare_program(program, devices, options, step, name), options, step)
    return build_report(outcome, options)


def place_module(
    model: Any,
    args: tuple[Any, ...],
    devices: DeviceSpec,
    options: PlaceOptions,
    *,
    name: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The report of placing ``model`` run on ``args``, exported by ``torch.export`` (module
    docstring); ``name`` defaults to the model's class name."""
    from baechi_cli.io.pt2 import export

    program = export(model, tuple(args))
    return place_program(
        program, devices, options, name=name or f"<{type(model).__name__}>", progress=progress
    )
