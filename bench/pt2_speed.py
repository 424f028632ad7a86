"""pt2 speed: reading and planning GPT-2 124M's training step from its ``torch.export`` archive,
against the same model's ONNX export (issue 38: "within 2x the ONNX path's time").

The model is framework.py's ``gpt2`` case at full size (``GPT2LMHeadModel(GPT2Config())``, eager
attention, no dropout, random weights made distinct; 2x128 tokens), exported once into
``--cache`` (bench/cache/pt2_speed/, git-ignored, reused when present) by framework.py's
``export_onnx`` (README.md's export) and zoo.py's ``export_pt2`` (``torch.export`` of the model in
``train()`` mode). Each file is then placed as the CLI places it, ``baechi place FILE --training
--devices 4x8GB --report R`` (``python -m baechi_cli``, a fresh process per run, the default
``--algo auto``), the files in turn (pt2, onnx, pt2, onnx, ...: a drift in the machine's speed
reaches both) for ``--rounds`` rounds after one warm-up run each. The ``.pt2`` is timed twice:
with the traced-step cache off (``BAECHI_CACHE_DIR=``: traced every run) and on (a fresh cache
folder its warm-up run fills: a model placed before). Recorded per run: wall seconds,
the child's own CPU seconds (``os.wait4``) and the report's seconds per stage. The ``.pt2`` path
imports torch and traces autograd's step (docs/DESIGN.md); the ONNX one synthesizes the backward
from per-op rules and never imports torch.

Writes ``--output`` (bench/pt2_speed.md) and bench/pt2_speed.json: per file, the min and median
of wall and CPU seconds and the median report stages; the ratio of the medians and the median of
the per-round ratios; whether the ``.pt2`` median is within 2x the ONNX one; the load average
before and after. ``--before DIR`` also times the ``.pt2`` file with the ``baechi_cli`` package of
another checkout (``PYTHONPATH=DIR``; in the same rounds, so the two share the machine's load).
Times on a shared machine vary from run to run: quote the medians with the load. Needs torch and
transformers (``pip install -e '.[bench]'``); without them it says so and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import framework as fw
import zoo
from benchlib import BENCH, Run, log, rel, table, write_json, write_text

TARGET = 2.0  # issue 38: the .pt2 path within 2x the ONNX path's time
ROUNDS = 5
DEVICES = "4x8GB"
RUN_TIMEOUT_S = 600
STAGES = ("load", "profile", "passes", "place", "total")


def export(cache: str) -> dict[str, str]:
    """The two files (exported now unless both are in ``cache``): {"pt2": path, "onnx": path}."""
    paths = {"pt2": os.path.join(cache, "gpt2.pt2"), "onnx": os.path.join(cache, "gpt2.onnx")}
    if all(os.path.exists(p) for p in paths.values()):
        log(f"reusing {rel(paths['pt2'])} and {rel(paths['onnx'])}")
        return paths
    os.makedirs(cache, exist_ok=True)
    model, x = fw.build(fw.CASE_BY_NAME["gpt2"], quick=False)
    log("exporting GPT-2 124M to ONNX")
    fw.export_onnx(model, x, paths["onnx"])
    log("exporting GPT-2 124M with torch.export")
    zoo.export_pt2(model, fw.inputs_of(x), paths["pt2"])
    return paths


def place_once(path: str, devices: str, root: str | None, workdir: str, cache: str = "") -> dict[str, Any]:
    """One ``baechi place PATH --training`` in a fresh process, with ``BAECHI_CACHE_DIR=cache``
    (empty: the step traced every time): wall and CPU seconds, the report's stage seconds and step
    time (or ``error``)."""
    report = os.path.join(workdir, "report.json")
    if os.path.exists(report):
        os.remove(report)
    argv = [sys.executable, "-m", "baechi_cli", "place", path, "--training", "--devices", devices]
    argv += ["--report", report]
    env = {**os.environ, "BAECHI_CACHE_DIR": cache, **({} if root is None else {"PYTHONPATH": root})}
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=workdir, env=env)
    try:
        _, errors = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": f"no result within {RUN_TIMEOUT_S} s"}
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {
            "error": f"exit {proc.returncode}: " + " ".join(errors.decode(errors="replace").split())[:200]
        }
    with open(report) as f:
        doc = json.load(f)
    return {
        "wall_s": wall,
        "timings_s": {k: doc["timings_s"].get(k) for k in STAGES},
        "step_time_us": doc["result"]["step_time_us"],
        "ops": doc["input"].get("ops"),
    }


class Timed:
    """Runs commands one at a time and attributes to each the growth of RUSAGE_CHILDREN's CPU
    seconds while it ran (one child at a time, so the growth is that child's)."""

    def __init__(self, devices: str, workdir: str) -> None:
        self.devices, self.workdir = devices, workdir

    def run(self, path: str, root: str | None, cache: str = "") -> dict[str, Any]:
        import resource

        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        record = place_once(path, self.devices, root, self.workdir, cache)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if "error" not in record:
            record["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return record


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in runs if "error" not in r]
    if not good:
        return {"runs": len(runs), "errors": [r["error"] for r in runs]}
    out: dict[str, Any] = {"runs": len(good), "errors": [r["error"] for r in runs if "error" in r]}
    for key in ("wall_s", "cpu_s"):
        values = [r[key] for r in good]
        out[key] = {"min": min(values), "median": statistics.median(values), "max": max(values)}
    out["stages_median_s"] = {
        k: statistics.median(r["timings_s"][k] for r in good if r["timings_s"].get(k) is not None)
        for k in STAGES
    }
    out["step_time_us"] = good[0]["step_time_us"]
    return out


def pairwise(a: list[dict[str, Any]], b: list[dict[str, Any]], key: str) -> float | None:
    ratios = [x[key] / y[key] for x, y in zip(a, b, strict=True) if "error" not in x and "error" not in y]
    return statistics.median(ratios) if ratios else None


def render(results: dict[str, Any]) -> str:
    s = results["summary"]
    lines = [
        "# Reading and planning GPT-2 124M's training step: `.pt2` against ONNX",
        "",
        "Issue 38's target: reading and planning a 100M-parameter decoder's training graph from its "
        f"`torch.export` archive within {TARGET:g}x the ONNX path's time. Written by `bench/pt2_speed.py` "
        "(its docstring says how); every run is `baechi place FILE --training --devices "
        f"{results['devices']} --report R` in a fresh process, whole-process seconds.",
        "",
        f"- model: {results['model']}; {results['date']}, {results['cores']} cores, "
        f"{results['rounds']} rounds after one warm-up run per file, the files in turn",
        f"- load: {results['load']} (1-, 5-, 15-minute load averages before the runs; after: "
        f"{results['load_after']}); on a loaded machine both paths slow down, so read the ratio",
        "",
    ]
    header = ["input", "ops read", "wall min s", "wall median s", "CPU min s", "CPU median s"]
    header += [f"{k} s (report, median)" for k in STAGES]
    rows = []
    for key, title in results["titles"].items():
        e = s[key]
        if "wall_s" not in e:
            rows.append([title, "-", *["error"] * (len(header) - 2)])
            continue
        rows.append(
            [
                title,
                str(results["ops"].get(key, "-")),
                f"{e['wall_s']['min']:.2f}",
                f"{e['wall_s']['median']:.2f}",
                f"{e['cpu_s']['min']:.2f}",
                f"{e['cpu_s']['median']:.2f}",
                *[f"{e['stages_median_s'][k]:.2f}" for k in STAGES],
            ]
        )
    lines += table(header, rows)
    lines.append("")
    r = results["ratios"]

    def verdict(ratio: float) -> str:
        return f"{'within' if ratio <= TARGET else 'not within'} {TARGET:g}x"

    if r.get("wall_median") is not None:
        lines += [
            f"**`.pt2` / ONNX: {r['wall_median']:.2f}x by the medians of wall time "
            f"({r['wall_pairwise']:.2f}x the median of the per-round ratios; CPU time "
            f"{r['cpu_median']:.2f}x): {verdict(r['wall_median'])}.**",
            "",
        ]
    if r.get("cached_wall_median") is not None:
        lines += [
            f"**A `.pt2` placed before (its traced step in `baechi_cli/io/pt2_cache.py`'s cache, torch "
            f"not imported) / ONNX: {r['cached_wall_median']:.2f}x by the medians of wall time "
            f"({r['cached_wall_pairwise']:.2f}x per round): {verdict(r['cached_wall_median'])}.**",
            "",
        ]
    if "before" in s and "wall_s" in s["before"] and "wall_s" in s["pt2"]:
        lines += [
            f"`.pt2` now against `{os.path.basename(results['before_root'])}` in the same rounds: "
            f"{r['now_vs_before_wall']:.2f}x the wall time, {r['now_vs_before_cpu']:.2f}x the CPU time "
            "(medians of the per-round ratios).",
            "",
        ]
    lines += [
        "What the `.pt2` path's `load` stage holds that the ONNX one does not: importing torch "
        "and running the step on meta tensors while the ops autograd dispatches are recorded "
        "(`baechi_cli/io/pt2_joint.py`; `torch._dynamo`, which torch's Python meta kernels "
        "would import, is stood in for). The two files are the same model, but their graphs "
        "differ (autograd's step against the synthesized one), so the step times differ too.",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"timed runs per file (default {ROUNDS})")
    parser.add_argument("--devices", default=DEVICES, help=f"the device spec (default {DEVICES})")
    parser.add_argument("--cache", default=os.path.join(BENCH, "cache", "pt2_speed"), help="exports go here")
    parser.add_argument("--before", help="another checkout whose baechi_cli also places the .pt2 file")
    parser.add_argument("--output", default=os.path.join(BENCH, "pt2_speed.md"), help="the table")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        log(f"bench/pt2_speed.py: {' and '.join(missing)} not installed, nothing measured; {fw.INSTALL_HINT}")
        return 0
    paths = export(args.cache)
    commands = [
        ("pt2", paths["pt2"], None),
        ("pt2_cached", paths["pt2"], None),
        ("onnx", paths["onnx"], None),
    ]
    if args.before:
        commands.append(("before", paths["pt2"], os.path.abspath(args.before)))
    caches: dict[str, str] = {}  # per command, its BAECHI_CACHE_DIR (none but pt2_cached's)
    run = Run()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    runs: dict[str, list[dict[str, Any]]] = {key: [] for key, _, _ in commands}
    with tempfile.TemporaryDirectory() as workdir:
        caches["pt2_cached"] = os.path.join(workdir, "cache")  # its warm-up run fills it
        timed = Timed(args.devices, workdir)
        for key, path, root in commands:
            log(f"warm-up: {key}")
            timed.run(path, root, caches.get(key, ""))
        for i in range(args.rounds):
            for key, path, root in commands:
                record = timed.run(path, root, caches.get(key, ""))
                runs[key].append(record)
                shown = record.get("error") or f"{record['wall_s']:.2f} s wall, {record['cpu_s']:.2f} s CPU"
                log(f"round {i + 1}/{args.rounds} {key}: {shown}")
    run.stop()
    summaries = {key: summary(r) for key, r in runs.items()}
    ratios: dict[str, Any] = {}
    if "wall_s" in summaries["pt2"] and "wall_s" in summaries["onnx"]:
        ratios = {
            "wall_median": summaries["pt2"]["wall_s"]["median"] / summaries["onnx"]["wall_s"]["median"],
            "cpu_median": summaries["pt2"]["cpu_s"]["median"] / summaries["onnx"]["cpu_s"]["median"],
            "wall_pairwise": pairwise(runs["pt2"], runs["onnx"], "wall_s"),
        }
    if "wall_s" in summaries["pt2_cached"] and "wall_s" in summaries["onnx"]:
        ratios["cached_wall_median"] = (
            summaries["pt2_cached"]["wall_s"]["median"] / summaries["onnx"]["wall_s"]["median"]
        )
        ratios["cached_wall_pairwise"] = pairwise(runs["pt2_cached"], runs["onnx"], "wall_s")
    if args.before:
        ratios["now_vs_before_wall"] = pairwise(runs["pt2"], runs["before"], "wall_s")
        ratios["now_vs_before_cpu"] = pairwise(runs["pt2"], runs["before"], "cpu_s")
    titles = {
        "pt2": "`.pt2` (torch.export), step traced",
        "pt2_cached": "`.pt2`, step from the cache (placed before)",
        "onnx": "ONNX (TorchScript exporter)",
    }
    if args.before:
        titles["before"] = f"`.pt2`, the `baechi_cli` of `{os.path.basename(os.path.abspath(args.before))}`"
    results = {
        "model": "GPT2LMHeadModel(GPT2Config()), 2x128 tokens (framework.py's gpt2)",
        "devices": args.devices,
        "date": time.strftime("%Y-%m-%d"),
        "cores": os.cpu_count(),
        "rounds": args.rounds,
        "load": load,
        "load_after": ", ".join(f"{x:.1f}" for x in os.getloadavg()),
        "before_root": args.before and os.path.abspath(args.before),
        "titles": titles,
        "ops": {k: next((r.get("ops") for r in v if r.get("ops")), None) for k, v in runs.items()},
        "summary": summaries,
        "ratios": ratios,
        "within_target": bool(ratios.get("wall_median") is not None and ratios["wall_median"] <= TARGET),
        "within_target_cached": bool(
            ratios.get("cached_wall_median") is not None and ratios["cached_wall_median"] <= TARGET
        ),
        "runs": runs,
        **run.facts(),
    }
    write_json(os.path.splitext(args.output)[0] + ".json", results)
    write_text(args.output, render(results))
    log(f"wrote {rel(args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
