"""``baechi verify`` on a GraphDef: the static check, then optionally the run, as one report.

:func:`verify_graph` is the entry the CLI calls: it runs
:func:`~baechi_cli.verify.static.static_check` and, with ``run``,
:func:`~baechi_cli.verify.run.verify_placed_graph`, and returns a
:class:`VerifyReport`, whose :meth:`~VerifyReport.to_json` is the
``baechi.verify/v1`` document of ``baechi verify --json``
(:func:`baechi_cli.cli.render.verify.render_report` prints it for humans).
Problems the checks find are in the report (``ok`` is the verdict); bad input
raises :class:`~baechi_cli.core.errors.InputError` and a ``run`` without
TensorFlow :class:`~baechi_cli.core.errors.MissingDependencyError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baechi_cli.core.errors import InputError
from baechi_cli.io.sidecar import default_sidecar
from baechi_cli.io.tfsupport import require_tensorflow
from baechi_cli.verify.run import NEEDS_TENSORFLOW, VerifyResult, verify_placed_graph
from baechi_cli.verify.static import StaticResult, static_check

REPORT_SCHEMA = "baechi.verify/v1"


@dataclass
class VerifyReport:
    """What ``baechi verify`` found: the static check and, with ``--run``, the run."""

    static: StaticResult
    run: VerifyResult | None = None

    @property
    def ok(self) -> bool:
        return self.static.ok and (self.run is None or self.run.ok)

    def problems(self) -> list[str]:
        return self.static.problems() + (self.run.problems() if self.run is not None else [])

    def problems_count(self) -> int:
        run = len(self.run.problems()) if self.run is not None else 0
        return self.static.problems_count() + run

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "ok": self.ok,
            "placed": self.static.placed,
            "original": self.static.original,
            "static": self.static.to_json(),
            "run": self.run.to_json() if self.run is not None else None,
        }


def verify_graph(
    placed: str,
    *,
    original: str | None = None,
    run: bool = False,
    sidecar: str | None = None,
    num_devices: int | None = None,
    steps: int = 1,
    reference_loss: list[float] | None = None,
) -> VerifyReport:
    """The static check, then with ``run`` the TensorFlow run (``baechi verify``).

    Run defaults: the sidecar from :func:`default_sidecar`, as many devices as
    the placed graph uses; ``reference_loss`` as in :func:`verify_placed_graph`.
    Raises InputError for bad input (including fewer ``num_devices`` than the
    placement uses) and MissingDependencyError when ``run`` needs TensorFlow
    and it is not installed.
    """
    if run:
        require_tensorflow(NEEDS_TENSORFLOW)  # before the static check: fail fast
    static = static_check(placed, original)
    if not run:
        return VerifyReport(static)
    sidecar = sidecar if sidecar is not None else default_sidecar(placed, original)
    needed = max(static.num_devices, 1)
    if num_devices is None:
        num_devices = needed
    elif num_devices < needed:
        raise InputError(
            f"the placement uses {needed} devices (up to index {needed - 1}) but --devices is {num_devices}",
            path=placed,
        )
    result = verify_placed_graph(
        placed, sidecar, num_devices, steps=steps, original_path=original, reference_loss=reference_loss
    )
    return VerifyReport(static, result)
