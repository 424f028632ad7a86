"""``baechi compare``: every algorithm on one prepared model, and the regression gate.

:func:`compare_model` prepares the model once and runs each placer of
``algos`` on it (``auto``: the search ``baechi place`` runs by default, its
row the plan it chooses); every placement is judged by the one evaluator, as
in ``baechi place``. :func:`regressions` compares a ``baechi.compare/v1``
document with a baseline of the same schema (``--baseline``).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from baechi_cli import __version__, placers
from baechi_cli.app.place import STAGES, prepare
from baechi_cli.app.report import comm_json, devices_json, input_json, result_json
from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.errors import BaechiError, InputError
from baechi_cli.io.formats import check_writable
from baechi_cli.search.candidates import Candidate, PlaceOptions, Prepared, choose, run_candidate

# Placement-time regressions smaller than this are timer noise, not regressions.
COMPARE_SCHEMA = "baechi.compare/v1"
PLACE_TIME_NOISE_S = 0.05
AUTO = "auto"  # not a placer: the search over placers and passes that `baechi place` runs by default


@dataclass
class CompareOutcome:
    prepared: Prepared
    algos: list[str]  # the rows' names, as --algos gave them
    candidates: list[Candidate]  # each row's plan (auto's: the one it chose)
    timings: dict[str, float]

    def titles(self) -> list[str]:
        """What the table calls each row: the placer's title; auto's names the plan it chose."""
        return [
            (f"auto: {c.label}" if c.ok else "auto") if algo == AUTO else placers.title(algo)
            for algo, c in zip(self.algos, self.candidates)
        ]


def parse_algos(text: str) -> list[str]:
    """``topo,etf,sct`` -> names; an unknown name is an InputError listing the registered ones."""
    known = [AUTO, *placers.names()]
    algos = [a.strip() for a in text.split(",") if a.strip()]
    if not algos:
        raise InputError(f"--algos is empty (choose from {', '.join(known)})")
    for a in algos:
        if a not in known:
            raise InputError(f"unknown algorithm '{a}' in --algos (choose from {', '.join(known)})")
    return list(dict.fromkeys(algos))


def compare_model(
    path: str,
    devices: DeviceSpec,
    algos: list[str],
    options: PlaceOptions,
    *,
    trace_path: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> CompareOutcome:
    """Run every algorithm of ``algos`` on one prepared model."""
    step = progress or (lambda stage: None)
    if trace_path is not None:
        check_writable(trace_path)
    t_start = time.perf_counter()
    prepared = prepare(path, devices, options, step)
    timings = dict.fromkeys(STAGES, 0.0) | prepared.timings
    step("place")
    # Import every row's modules first, so that the first row's seconds are not the imports it shares.
    for algo in algos:
        importlib.import_module("baechi_cli.search.auto" if algo == AUTO else placers.get(algo).module)
    candidates = [
        auto_candidate(prepared, options)
        if algo == AUTO
        else run_candidate(prepared, placers.get(algo), options)
        for algo in algos
    ]
    timings["place"] = sum(c.place_seconds for c in candidates)
    outcome = CompareOutcome(prepared, algos, candidates, timings)
    step("write")
    if trace_path is not None:
        from baechi_cli.io.trace import build_trace, merge_traces, write_trace

        traces = [
            build_trace(prepared.graph, prepared.devices, c.sim, title=algo)
            for algo, c in zip(algos, candidates)
            if c.sim is not None
        ]
        write_trace(trace_path, merge_traces(traces))
    timings["total"] = time.perf_counter() - t_start
    return outcome


def auto_candidate(prepared: Prepared, options: PlaceOptions) -> Candidate:
    """auto's search on the prepared model: the plan it chooses, timed as a whole (search,
    refinement and exact), or why there is none."""
    from baechi_cli.search.auto import auto_search

    t0 = time.perf_counter()
    search = auto_search(prepared, options)
    seconds = time.perf_counter() - t0
    try:
        return replace(choose(search.candidates), place_seconds=seconds)
    except BaechiError as err:
        return Candidate(AUTO, seconds, error=err.with_path(prepared.path))


def load_baseline(path: str) -> dict[str, Any]:
    """A previous ``baechi compare --json`` output; another schema is an InputError."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise InputError("baseline file not found", path=path) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"baseline is not JSON: {err}", path=path) from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema != COMPARE_SCHEMA:
        raise InputError(
            f"baseline has schema {schema!r}, expected '{COMPARE_SCHEMA}' (make it with baechi compare --json)",
            path=path,
        )
    if not isinstance(doc.get("results"), list):
        raise InputError("baseline has no 'results' list", path=path)
    return doc


def regressions(current: dict[str, Any], baseline: dict[str, Any], max_regression: float) -> list[str]:
    """Each algorithm whose step or placement time got worse than the baseline by more than the threshold.

    Algorithms missing on either side are not compared; an algorithm that
    placed in the baseline and fails now is a regression. Placement-time
    differences under ``PLACE_TIME_NOISE_S`` are ignored as timer noise.
    """
    before = {r.get("algorithm"): r for r in baseline["results"] if isinstance(r, dict)}
    found = []
    for r in current["results"]:
        old = before.get(r["algorithm"])
        if old is None:
            continue
        name = r["algorithm"]
        old_step, new_step = old.get("step_time_us"), r.get("step_time_us")
        if old_step is not None and new_step is None:
            found.append(f"{name}: placed in the baseline, fails now ({r.get('error')})")
            continue
        if old_step and new_step is not None and new_step > old_step * (1 + max_regression):
            found.append(
                f"{name}: step time {new_step:.1f} us vs {old_step:.1f} us "
                f"(+{new_step / old_step - 1:.1%} > {max_regression:.1%})"
            )
        old_t, new_t = old.get("place_seconds"), r.get("place_seconds")
        if (
            isinstance(old_t, (int, float))
            and new_t is not None
            and new_t > old_t * (1 + max_regression)
            and new_t - old_t > PLACE_TIME_NOISE_S
        ):
            found.append(
                f"{name}: placement time {new_t:.3f} s vs {old_t:.3f} s "
                f"(+{(new_t / old_t - 1) if old_t else float('inf'):.1%} > {max_regression:.1%})"
            )
    return found


def compare_json(outcome: CompareOutcome) -> dict[str, Any]:
    """``baechi.compare/v1``: one entry per algorithm with the ``result`` fields."""
    prepared = outcome.prepared
    results = []
    for algo, title, c in zip(outcome.algos, outcome.titles(), outcome.candidates):
        entry: dict[str, Any] = {
            "algorithm": algo,
            "title": title,
            "place_seconds": round(c.place_seconds, 6),
        }
        if c.sim is not None:
            entry.update(result_json(prepared, c.sim))
            entry["peak_bytes"] = c.sim.peak_bytes
        else:
            entry.update(
                {
                    "step_time_us": None,
                    "lower_bound_us": prepared.lower_bound_us,
                    "single_device_us": (
                        prepared.single_device.step_time_us if prepared.single_device else None
                    ),
                    "comm_bytes": None,
                    "transfers": None,
                    "feasible": False,
                    "peak_bytes": None,
                }
            )
        entry["error"] = c.problem
        if c.placement is not None and c.placement.info:
            entry["info"] = c.placement.info
        results.append(entry)
    return {
        "schema": COMPARE_SCHEMA,
        "tool": {"name": "baechi", "version": __version__},
        "input": input_json(prepared),
        "devices": devices_json(prepared.devices),
        "comm": comm_json(prepared.devices),
        "lower_bound_us": prepared.lower_bound_us,
        "single_device_us": prepared.single_device.step_time_us if prepared.single_device else None,
        "results": results,
    }
